/* fakegpu: a program that computes on a "GPU" that tests/progs/fakecuda.c drives as NVIDIA's
 * driver drives a real one, for the tests of ckpt's CUDA support on machines without a GPU
 * (tests/tests/gpu.rs).
 *
 * The "device" is the file DEVICE, mapped shared: its memory is the GPU's, which the program
 * changes only inside a "CUDA call" (a step under the driver's lock, as CUDA calls are). A
 * thread of its own plays the driver's part inside the process (CUDA's restore thread): it
 * takes commands queued to the process (SIGRTMIN+3, with a value) by the stand-in library, and
 * answers in DEVICE.state ("STAMP STATE", the stamp new at every answer: the file is outside the
 * process, and a restarted one answers again from where its checkpoint was):
 *   1 lock (value >> 8: timeout in ms): waits for the call under way, then holds new ones;
 *   2 checkpoint: copies the device memory into the program's own memory, unmaps and closes
 *     the device (the process then holds no device, as a real checkpointed CUDA process);
 *   3 restore: opens DEVICE afresh (truncated: a new GPU holds nothing) and copies the memory
 *     back;
 *   4 unlock: calls go on.
 * The program keeps a shadow copy of what the device must hold and compares it at every step:
 * device memory that did not come back as it was at the checkpoint (a restart that did not go
 * through the driver maps the file as it is, newer than the process) prints FAIL.
 *
 * --worker: once the device is open, forks a child that uses no GPU (as PyTorch's DataLoader
 * workers do): it keeps the device's descriptor it inherited, and one of its two mappings (the
 * memory is MADV_DONTFORK; a page of "control" is not, as some of the real driver's mappings
 * are not: seen on an H200), which it never touches, and its command line no longer names the
 * device (the stand-in driver does not know it). It computes on the CPU; its result, read
 * through a pipe, goes into RESULT.
 *
 * Usage: fakegpu DEVICE [SECONDS=5] [--worker]
 */
#include "common.h"
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define WORDS 8192 /* 64 KiB of device memory */
#define CMD_SIGNAL (SIGRTMIN + 3)

static const char *device;
static uint64_t *dev;       /* the device's memory, while the process holds the GPU */
static uint64_t *host_copy; /* where the checkpoint put it */
static void *control;       /* a page of the device that a fork copies */
static uint64_t shadow[WORDS];
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int locked, in_call;

static void say_state(const char *state)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s.state", device);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fail("cannot write %s: %s", tmp, strerror(errno));
        return;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    fprintf(f, "%lld.%09ld %s\n", (long long)now.tv_sec, now.tv_nsec, state);
    fclose(f);
    rename(tmp, path);
}

static uint64_t *open_device(int truncate)
{
    int fd = open(device, O_RDWR | O_CREAT | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0600);
    if (fd < 0 || ftruncate(fd, WORDS * 8) != 0) {
        printf("FAIL open %s: %s\n", device, strerror(errno));
        exit(1);
    }
    void *p = mmap(NULL, WORDS * 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED || madvise(p, WORDS * 8, MADV_DONTFORK) != 0) {
        printf("FAIL mmap %s: %s\n", device, strerror(errno));
        exit(1);
    }
    /* A page the driver maps without MADV_DONTFORK: a forked child inherits it. */
    control = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
    if (control == MAP_FAILED) {
        printf("FAIL mmap %s: %s\n", device, strerror(errno));
        exit(1);
    }
    /* The fd stays open, as the driver's do. */
    return p;
}

static void close_device(void)
{
    munmap(dev, WORDS * 8);
    munmap(control, 4096);
    dev = NULL;
    /* Every descriptor of the device: the one open_device left open. */
    char link[64], target[4096];
    for (int fd = 3; fd < 1024; fd++) {
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0) {
            target[n] = 0;
            if (strcmp(target, device) == 0)
                close(fd);
        }
    }
}

static void *driver_thread(void *arg)
{
    (void)arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, CMD_SIGNAL);
    for (;;) {
        siginfo_t si;
        if (sigwaitinfo(&set, &si) < 0)
            continue;
        int cmd = si.si_value.sival_int & 0xff, timeout_ms = si.si_value.sival_int >> 8;
        pthread_mutex_lock(&m);
        switch (cmd) {
        case 1: {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += timeout_ms / 1000;
            until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
            until.tv_sec += until.tv_nsec / 1000000000L;
            until.tv_nsec %= 1000000000L;
            int rc = 0;
            while (in_call && rc == 0)
                rc = pthread_cond_timedwait(&cond, &m, &until);
            if (in_call) {
                say_state("error timeout");
            } else {
                locked = 1;
                say_state("locked");
            }
            break;
        }
        case 2:
            if (!locked || !dev) {
                say_state("error illegal-state");
                break;
            }
            host_copy = malloc(WORDS * 8);
            memcpy(host_copy, dev, WORDS * 8);
            close_device();
            say_state("checkpointed");
            break;
        case 3:
            if (dev || !host_copy) {
                say_state("error illegal-state");
                break;
            }
            dev = open_device(1);
            memcpy(dev, host_copy, WORDS * 8);
            free(host_copy);
            host_copy = NULL;
            say_state("locked");
            break;
        case 4:
            if (!locked || !dev) {
                say_state("error illegal-state");
                break;
            }
            locked = 0;
            pthread_cond_broadcast(&cond);
            say_state("running");
            break;
        default:
            say_state("error unknown-command");
        }
        pthread_mutex_unlock(&m);
    }
    return NULL;
}

static char *device_arg;

/* In the worker: its command line no longer names the device. */
static void forget_the_device(void) { memset(device_arg, 'x', strlen(device_arg)); }

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: fakegpu DEVICE [SECONDS]\n");
        return 2;
    }
    device = argv[1];
    device_arg = argv[1];
    long steps = steps_arg(argc, argv, 2, 5);
    int worker = argc > 3 && strcmp(argv[3], "--worker") == 0;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, CMD_SIGNAL);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    dev = open_device(1);
    for (int i = 0; i < WORDS; i++)
        dev[i] = shadow[i] = mix64(i);
    say_state("running");
    int worker_fd = -1;
    pid_t child = worker ? cpu_worker_start(steps, &worker_fd, forget_the_device) : -1;
    pthread_t t;
    pthread_create(&t, NULL, driver_thread, NULL);
    start_marker();
    long mismatches = 0;
    for (long s = 0; s < steps; s++) {
        /* A CUDA call: waits while the driver holds calls. */
        pthread_mutex_lock(&m);
        while (locked)
            pthread_cond_wait(&cond, &m);
        in_call = 1;
        pthread_mutex_unlock(&m);
        int at = (int)(mix64(s) % WORDS);
        if (memcmp(dev, shadow, sizeof shadow) != 0 && mismatches++ == 0)
            fail("step %ld: the device memory is not what the program wrote", s);
        dev[at] = shadow[at] = mix64(shadow[at] ^ (uint64_t)s);
        pthread_mutex_lock(&m);
        in_call = 0;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&m);
        sleep_ms(STEP_MS);
    }
    uint64_t h = 0;
    for (int i = 0; i < WORDS; i++)
        h = mix64(h ^ shadow[i]);
    if (worker)
        h = mix64(h ^ cpu_worker_result(child, worker_fd));
    return finish(h);
}
