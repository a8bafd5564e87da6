/* common.h: helpers shared by the C test programs.
 *
 * Every program is deterministic: the amount of work is a fixed number of steps computed from
 * its arguments (never from the clock), and each step ends with a short sleep so that a
 * checkpoint lands mid-computation. The sleep tolerates EINTR (signals, restart) by recomputing
 * its deadline, and never sleeps longer than one step even if the clock jumped across a restart.
 *
 * Output protocol (stdout, line-buffered so nothing printed before a checkpoint is printed again
 * after a restart): "START" once at the very beginning, "RESULT <hex>" at the end (the same value
 * as an uninterrupted run), and "PASS" or "FAIL <reason>" when the program checks its own state.
 */
#ifndef CKPT_TEST_COMMON_H
#define CKPT_TEST_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <poll.h>
#include <unistd.h>
#include <sys/wait.h>

/* Length of one step's sleep, in milliseconds. */
#define STEP_MS 10

/* splitmix64 finalizer: a cheap, well-mixing, deterministic hash of one 64-bit word. */
static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Sleep about `ms` milliseconds; restartable. On EINTR the deadline is recomputed: kept if it is
 * still within one step of now, otherwise (the clock moved across a restart) reset to now + ms. */
static void sleep_ms(unsigned ms)
{
    struct timespec now, deadline;
    clock_gettime(CLOCK_MONOTONIC, &now);
    deadline = now;
    deadline.tv_nsec += (long)ms * 1000000L;
    deadline.tv_sec += deadline.tv_nsec / 1000000000L;
    deadline.tv_nsec %= 1000000000L;
    for (;;) {
        int rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, NULL);
        if (rc == 0)
            return;
        if (rc != EINTR)
            return; /* should not happen; a short step is harmless */
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t left_ns = (int64_t)(deadline.tv_sec - now.tv_sec) * 1000000000LL +
                          (deadline.tv_nsec - now.tv_nsec);
        if (left_ns > (int64_t)ms * 1000000LL) {
            deadline = now;
            deadline.tv_nsec += (long)ms * 1000000L;
            deadline.tv_sec += deadline.tv_nsec / 1000000000L;
            deadline.tv_nsec %= 1000000000L;
        }
    }
}

/* Number of steps for a run of `seconds` (as a command-line argument, default `def`). */
static long steps_arg(int argc, char **argv, int index, double def)
{
    double secs = argc > index ? atof(argv[index]) : def;
    long steps = (long)(secs * 1000.0 / STEP_MS);
    return steps > 0 ? steps : 1;
}

/* Reads a small file (a /proc file of this process) whole into `buf`, NUL-terminated, with one
 * read and no memory allocated; returns its length, or -1. */
__attribute__((unused)) static ssize_t read_small_file(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, len - 1);
    if (fd >= 0)
        close(fd);
    buf[n > 0 ? n : 0] = 0;
    return n;
}

/* Line-buffer stdout (even to a file) and print the start marker. Call first thing in main. */
static void start_marker(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("START\n");
    fflush(stdout);
}

static int failures;

/* Record a failed self-check: prints "FAIL <reason>". */
__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    failures++;
}

/* Print the result line and PASS (no failed check) or a final FAIL; returns the exit status. */
static int finish(uint64_t result)
{
    printf("RESULT %016llx\n", (unsigned long long)result);
    if (failures == 0)
        printf("PASS\n");
    else
        printf("FAIL %d check(s) failed\n", failures);
    fflush(stdout);
    return failures == 0 ? 0 : 1;
}

/* A child that uses no GPU, as PyTorch's DataLoader workers (gpu tests): forked by a process
 * that started using the GPU, it computes `steps` steps on the CPU and sends its result through
 * a pipe. `in_child` (may be NULL) runs first in the child. Returns the child; `*result_fd` is
 * the pipe's end to read. */
static inline int io_full(int fd, void *buf, size_t len, int writing);
__attribute__((unused)) static pid_t cpu_worker_start(long steps, int *result_fd, void (*in_child)(void))
{
    int fds[2];
    if (pipe(fds) != 0) {
        fail("pipe: %s", strerror(errno));
        return -1;
    }
    pid_t child = fork();
    if (child == 0) {
        if (in_child)
            in_child();
        close(fds[0]);
        uint64_t h = 7;
        for (long s = 0; s < steps; s++) {
            for (int i = 0; i < 1000; i++)
                h = mix64(h ^ (uint64_t)i);
            sleep_ms(STEP_MS);
        }
        io_full(fds[1], &h, sizeof h, 1);
        _exit(0);
    }
    close(fds[1]);
    *result_fd = fds[0];
    return child;
}

/* The result of a cpu_worker_start child, once it has ended well (a failed check otherwise). */
__attribute__((unused)) static uint64_t cpu_worker_result(pid_t child, int fd)
{
    uint64_t w = 0;
    if (io_full(fd, &w, sizeof w, 0) != 0)
        fail("the worker's result did not come");
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the worker ended with status %#x", status);
    return w;
}

/* Reads or writes exactly len bytes; retries after EINTR, and polls a non-blocking descriptor
 * that is not ready. Returns 0, or -1 on end of file or an error. */
static inline int io_full(int fd, void *buf, size_t len, int writing)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = writing ? write(fd, (char *)buf + done, len - done) : read(fd, (char *)buf + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = (short)(writing ? POLLOUT : POLLIN)};
            poll(&p, 1, 1000);
            continue;
        }
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

static inline int read_full(int fd, void *buf, size_t len)
{
    return io_full(fd, buf, len, 0);
}

static inline int write_full(int fd, const void *buf, size_t len)
{
    return io_full(fd, (void *)buf, len, 1);
}

static inline int64_t now_ns(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Timer tests: a periodic timer of period_ms that has fired `total` times since `start_ns`
 * (CLOCK_MONOTONIC) must not run fast (a restart must not fire missed expirations early).
 * Records a failure and returns 1 if it did. */
static inline int fired_too_fast(const char *name, uint64_t total, int period_ms, int64_t start_ns)
{
    int64_t elapsed_ms = (now_ns(CLOCK_MONOTONIC) - start_ns) / 1000000LL;
    if ((int64_t)total * period_ms <= elapsed_ms + 100)
        return 0;
    fail("%s fired %llu times in %lld ms: faster than every %d ms", name, (unsigned long long)total,
         (long long)elapsed_ms, period_ms);
    return 1;
}

/* Timer tests: a one-shot timer armed for the middle of a run of n periods fired once, near the
 * middle (`at`: the periods counted when it fired); a restart must keep its remaining time. */
static inline void check_fired_midway(const char *name, long fired, uint64_t at, long n)
{
    if (fired != 1)
        fail("%s fired %ld times, expected once", name, fired);
    else if (at + (uint64_t)n / 5 < (uint64_t)n / 2 || at > (uint64_t)n / 2 + (uint64_t)n / 5)
        fail("%s fired after %llu periods, expected about %ld (remaining time lost?)", name,
             (unsigned long long)at, n / 2);
}

#ifdef RECORD_WORDS
/* A numbered, checksummed record of the data-in-flight tests (pipes, FIFOs, sockets). Each
 * program picks RECORD_WORDS so that records straddle its channel's buffer boundaries. */
struct rec {
    uint64_t seq;
    uint64_t payload[RECORD_WORDS];
    uint64_t sum;
};

static inline uint64_t rec_sum(const struct rec *r)
{
    uint64_t h = r->seq;
    for (int i = 0; i < RECORD_WORDS; i++)
        h = mix64(h ^ r->payload[i]);
    return h;
}
#endif

#endif
