/* guards: memory with guard regions (madvise MADV_GUARD_INSTALL, Linux 6.13: pages no access may
 * pass, which a C library may put at the end of thread stacks; zdtm's maps12). A 16-page heap
 * of known contents gets guards on its pages 3 and 10-11, and a thread runs on a stack of its own
 * whose lowest page is a guard. Each step the program checks every page that is not a guard
 * (and the thread its stack's pattern), and writes one word of a changing page. The guards are
 * never touched. A restart could not make them guards again: a checkpoint must be refused,
 * naming them, and the job go on (before, the checkpoint failed: EIO reading the memory). Where
 * the kernel has no guard regions (EINVAL), the program says NOGUARDS and runs without them.
 *
 * Usage: guards [SECONDS=4]
 */
#include "common.h"

#include <pthread.h>
#include <sys/mman.h>

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

#define PAGE 4096
#define PAGES 16
#define STACK_PAGES 64

static uint8_t *heap;
static volatile int stop;
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
        sleep_ms(STEP_MS);
    }
    stop = 1;
    pthread_join(thread, NULL);
    if (thread_failures)
        fail("the thread's stack lost its pattern (%ld bytes)", thread_failures);
    return finish(h);
}
