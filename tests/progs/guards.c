/* guards: memory with guard regions (madvise MADV_GUARD_INSTALL, Linux 6.13: pages no access may
 * pass, which glibc 2.42 puts at the end of every thread stack; zdtm's maps12). A 16-page heap
 * of known contents gets guards on its pages 3 and 10-11, and a thread runs on a stack of its own
 * whose lowest page is a guard; with DIR, a private writable mapping of DIR/guards.dat (4 pages,
 * its page 0 written: a copy) gets a guard on its page 2. Each step the program checks every
 * page that is not a guard (and the thread its stack's pattern), and writes one word of a
 * changing page. The guards are never touched until the end, where a write into each must fault
 * (SIGSEGV) and a write beside each must not: a restart that gave them back as ordinary pages
 * fails here. Where the kernel has no guard regions (EINVAL), the program says NOGUARDS and runs
 * without them.
 *
 * Usage: guards [SECONDS=4] [DIR]
 */
#include "common.h"

#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

#define PAGE 4096
#define PAGES 16
#define STACK_PAGES 64

static uint8_t *heap;
static uint8_t *file_map;
static volatile int stop;
static sigjmp_buf on_fault;
static volatile long thread_failures;

static int guarded(int page)
{
    return page == 3 || page == 10 || page == 11;
}

static void *thread_main(void *arg)
{
    (void)arg;
    volatile uint8_t pattern[8192];
    for (size_t i = 0; i < sizeof pattern; i++)
        pattern[i] = (uint8_t)(i * 7);
    while (!stop) {
        for (size_t i = 0; i < sizeof pattern; i++)
            if (pattern[i] != (uint8_t)(i * 7))
                thread_failures++;
        sleep_ms(STEP_MS);
    }
    return NULL;
}

static void fault_handler(int sig)
{
    (void)sig;
    siglongjmp(on_fault, 1);
}

/* Whether a write to *at faults (SIGSEGV); the byte is put back where it does not. */
static int write_faults(volatile uint8_t *at)
{
    struct sigaction sa = {.sa_handler = fault_handler}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old);
    int faulted = 1;
    if (sigsetjmp(on_fault, 1) == 0) {
        uint8_t was = *at;
        *at = (uint8_t)(was + 1);
        *at = was;
        faulted = 0;
    }
    sigaction(SIGSEGV, &old, NULL);
    return faulted;
}

static void check_guard(const char *what, uint8_t *at, int guard)
{
    if (write_faults(at) != guard)
        fail("%s at %p: a write %s", what, (void *)at, guard ? "passed: the guard is gone" : "faulted beside a guard");
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    heap = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *stack = mmap(NULL, STACK_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (heap == MAP_FAILED || stack == MAP_FAILED)
        return printf("FAIL set-up: mmap\n"), 1;
    for (int p = 0; p < PAGES; p++)
        memset(heap + p * PAGE, p + 1, PAGE);
    int have_guards = madvise(heap + 3 * PAGE, PAGE, MADV_GUARD_INSTALL) == 0;
    if (!have_guards && errno != EINVAL)
        return printf("FAIL set-up: MADV_GUARD_INSTALL: %s\n", strerror(errno)), 1;
    if (have_guards && (madvise(heap + 10 * PAGE, 2 * PAGE, MADV_GUARD_INSTALL) != 0 || madvise(stack, PAGE, MADV_GUARD_INSTALL) != 0))
        return printf("FAIL set-up: MADV_GUARD_INSTALL: %s\n", strerror(errno)), 1;
    if (have_guards && argc > 2) {
        if (chdir(argv[2]) != 0)
            return printf("FAIL set-up: chdir %s\n", argv[2]), 1;
        int fd = open("guards.dat", O_RDWR | O_CREAT | O_TRUNC, 0644);
        uint8_t page[PAGE];
        for (int p = 0; p < 4; p++) {
            memset(page, 0x40 + p, PAGE);
            if (fd < 0 || write(fd, page, PAGE) != PAGE)
                return printf("FAIL set-up: guards.dat\n"), 1;
        }
        file_map = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        close(fd);
        if (file_map == MAP_FAILED)
            return printf("FAIL set-up: mmap guards.dat\n"), 1;
        memset(file_map, 0x7e, PAGE);
        if (madvise(file_map + 2 * PAGE, PAGE, MADV_GUARD_INSTALL) != 0)
            return printf("FAIL set-up: MADV_GUARD_INSTALL on a file mapping: %s\n", strerror(errno)), 1;
    }
    if (!have_guards)
        printf("NOGUARDS\n");
    pthread_attr_t attr;
    pthread_t thread;
    pthread_attr_init(&attr);
    if (pthread_attr_setstack(&attr, stack, STACK_PAGES * PAGE) != 0 || pthread_create(&thread, &attr, thread_main, NULL) != 0)
        return printf("FAIL set-up: thread\n"), 1;
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        for (int p = 0; p < PAGES; p++) {
            if (guarded(p) && have_guards)
                continue;
            uint8_t want = (uint8_t)(p + 1);
            for (int i = 0; i < PAGE; i += 64)
                if (heap[p * PAGE + i] != want && !(p == 5 && i == 0)) {
                    fail("step %ld: page %d byte %d holds %d, not %d", s, p, i, heap[p * PAGE + i], want);
                    break;
                }
        }
        heap[5 * PAGE] = (uint8_t)s;
        h = mix64(h ^ heap[5 * PAGE] ^ heap[7 * PAGE]);
        if (file_map) {
            static const uint8_t want[4] = {0x7e, 0x41, 0, 0x43};
            for (int p = 0; p < 4; p++)
                if (p != 2 && file_map[p * PAGE + 100] != want[p])
                    fail("step %ld: page %d of the file mapping holds %d, not %d", s, p, file_map[p * PAGE + 100], want[p]);
        }
        sleep_ms(STEP_MS);
    }
    stop = 1;
    pthread_join(thread, NULL);
    if (thread_failures)
        fail("the thread's stack lost its pattern (%ld bytes)", thread_failures);
    if (have_guards) {
        for (int p = 2; p <= 12; p++)
            check_guard("heap page", heap + p * PAGE, guarded(p));
        check_guard("the thread stack's lowest page", stack, 1);
        check_guard("the thread stack's next page", stack + PAGE, 0);
        for (int p = 0; file_map && p < 4; p++)
            check_guard("file mapping page", file_map + p * PAGE, p == 2);
    }
    return finish(h);
}
