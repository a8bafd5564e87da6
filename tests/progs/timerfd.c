/* timerfd: timers keep their clock, remaining time, interval and unread expirations across
 * checkpoint/restart, and fire on time after it.
 *
 *  - A: CLOCK_MONOTONIC, every 20 ms, non-blocking: the program's clock. The run is a fixed
 *    number N of A's expirations; each wait (poll on A, B, D) must end within 1 s, and A may
 *    never have fired more often than the time elapsed allows.
 *  - B: CLOCK_MONOTONIC one-shot, due when A has fired N/2 times: it must fire once, within N/5
 *    expirations of A of that (a restart that lost its remaining time fires it at once or never).
 *  - C: CLOCK_BOOTTIME one-shot at 100 ms, never read until the end: exactly 1 expiration then
 *    (an expired, unread timer; restored through its tick count).
 *  - D: CLOCK_REALTIME, absolute (TFD_TIMER_ABSTIME), due 30% into the run by the wall clock:
 *    fires once, never before its deadline.
 *  - E: CLOCK_MONOTONIC every 50 ms, never read until the end: its expirations must then be
 *    2/5 of A's (within 30%), its interval still 50 ms.
 * RESULT depends only on N and on which checks held.
 *
 * Usage: timerfd [SECONDS=4]
 */
#include "common.h"

#include <poll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define A_MS 20
#define E_MS 50

static struct timespec ts_ms(int64_t ms)
{
    return (struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
}

static int timer(clockid_t clock, int flags, int64_t first_ms, int64_t every_ms)
{
    int fd = timerfd_create(clock, flags);
    struct itimerspec it = {.it_interval = ts_ms(every_ms), .it_value = ts_ms(first_ms)};
    if (fd < 0 || timerfd_settime(fd, 0, &it, NULL) != 0) {
        perror("timerfd");
        exit(2);
    }
    return fd;
}

/* Expirations of a timer: 0 if none (non-blocking read says EAGAIN). */
static uint64_t ticks(int fd)
{
    uint64_t n;
    for (;;) {
        ssize_t r = read(fd, &n, sizeof n);
        if (r == sizeof n)
            return n;
        if (r < 0 && errno == EINTR)
            continue;
        return 0;
    }
}

int main(int argc, char **argv)
{
    start_marker();
    (void)sleep_ms; /* the timers pace this program */
    long n = steps_arg(argc, argv, 1, 4.0) * STEP_MS / A_MS;
    int64_t run_ms = n * A_MS;

    int a = timer(CLOCK_MONOTONIC, TFD_NONBLOCK, A_MS, A_MS);
    int b = timer(CLOCK_MONOTONIC, TFD_NONBLOCK, run_ms / 2, 0);
    int c = timer(CLOCK_BOOTTIME, TFD_NONBLOCK, 100, 0);
    int e = timer(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC, E_MS, E_MS);
    int d = timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK);
    int64_t d_deadline = now_ns(CLOCK_REALTIME) + run_ms * 3 / 10 * 1000000LL;
    struct itimerspec dt = {.it_value = {.tv_sec = d_deadline / 1000000000LL,
                                         .tv_nsec = d_deadline % 1000000000LL}};
    if (d < 0 || timerfd_settime(d, TFD_TIMER_ABSTIME, &dt, NULL) != 0) {
        perror("timerfd D");
        return 2;
    }
    int64_t start = now_ns(CLOCK_MONOTONIC);

    uint64_t a_total = 0;
    long b_fired = 0, d_fired = 0, late_waits = 0;
    uint64_t b_at = 0;
    while (a_total < (uint64_t)n && late_waits < 3) {
        struct pollfd p[3] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN},
                              {.fd = d, .events = POLLIN}};
        int r = poll(p, 3, 1000);
        if (r < 0 && errno == EINTR)
            continue; /* a restart ends a sleeping poll */
        if (r == 0) {
            fail("no timer fired within 1 s (after %llu of A's %ld expirations)",
                 (unsigned long long)a_total, n);
            late_waits++;
            continue;
        }
        if (p[0].revents & POLLIN)
            a_total += ticks(a);
        if (p[1].revents & POLLIN) {
            uint64_t k = ticks(b);
            b_fired += (long)k;
            b_at = a_total;
        }
        if (p[2].revents & POLLIN) {
            uint64_t k = ticks(d);
            d_fired += (long)k;
            int64_t early = d_deadline - now_ns(CLOCK_REALTIME);
            if (k && early > 0)
                fail("D fired %lld us before its deadline", (long long)(early / 1000));
        }
        if (fired_too_fast("A", a_total, A_MS, start))
            break;
    }

    check_fired_midway("B", b_fired, b_at, n);
    if (d_fired != 1)
        fail("D (absolute, realtime) fired %ld times, expected once", d_fired);
    uint64_t c_ticks = ticks(c);
    if (c_ticks != 1)
        fail("C has %llu unread expirations, expected 1", (unsigned long long)c_ticks);
    uint64_t e_ticks = ticks(e), e_want = a_total * A_MS / E_MS;
    if (e_ticks * 10 < e_want * 7 || e_ticks * 10 > e_want * 13 + 30)
        fail("E has %llu unread expirations, expected about %llu", (unsigned long long)e_ticks,
             (unsigned long long)e_want);
    struct itimerspec cur;
    if (timerfd_gettime(e, &cur) != 0 || cur.it_interval.tv_sec != 0 ||
        cur.it_interval.tv_nsec != E_MS * 1000000L || cur.it_value.tv_nsec == 0)
        fail("E is no longer armed every %d ms", E_MS);
    if (timerfd_gettime(c, &cur) != 0 || cur.it_value.tv_sec || cur.it_value.tv_nsec)
        fail("C is armed again");

    return finish(mix64((uint64_t)n ^ mix64((uint64_t)b_fired ^ ((uint64_t)d_fired << 8) ^
                                            (c_ticks << 16))));
}
