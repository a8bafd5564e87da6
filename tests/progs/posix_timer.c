/* posix_timer: POSIX timers (timer_create) keep their ids, clocks, signals, sigev values,
 * remaining time and intervals across checkpoint/restart, and fire on time after it.
 *
 *  - A: CLOCK_MONOTONIC every 20 ms, SIGRTMIN+2 with sigev value 0xC0FFEE: the program's clock.
 *    The run is N of A's expirations (signals plus their overruns), each taken with
 *    sigtimedwait; each wait must end within 1 s, A may never fire faster than time allows, and
 *    every signal must carry A's value and A's timer id.
 *  - A filler timer is created and deleted between A and B, so B's id is not A's + 1.
 *  - B: CLOCK_MONOTONIC one-shot due at half the run, SIGRTMIN+3 with value 0xB0B: fires once,
 *    within N/5 expirations of A of N/2, with B's id.
 *  - C: CLOCK_BOOTTIME, SIGEV_NONE, one-shot due at 10 times the run: never fires, and at the
 *    end has between 8 and 10 runs left.
 * RESULT depends only on N and on which checks held.
 *
 * Usage: posix_timer [SECONDS=4]
 */
#include "common.h"

#include <signal.h>
#include <unistd.h>

#define A_MS 20

static struct timespec ts_ms(int64_t ms)
{
    return (struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
}

static timer_t make(clockid_t clock, int notify, int signo, int value, int64_t first_ms,
                    int64_t every_ms)
{
    struct sigevent se = {.sigev_notify = notify, .sigev_signo = signo};
    se.sigev_value.sival_int = value;
    timer_t t;
    struct itimerspec it = {.it_interval = ts_ms(every_ms), .it_value = ts_ms(first_ms)};
    if (timer_create(clock, &se, &t) != 0 || timer_settime(t, 0, &it, NULL) != 0) {
        perror("timer");
        exit(2);
    }
    return t;
}

int main(int argc, char **argv)
{
    start_marker();
    (void)sleep_ms; /* the timers pace this program */
    long n = steps_arg(argc, argv, 1, 4.0) * STEP_MS / A_MS;
    int64_t run_ms = n * A_MS;
    int sig_a = SIGRTMIN + 2, sig_b = SIGRTMIN + 3;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig_a);
    sigaddset(&set, sig_b);
    sigprocmask(SIG_BLOCK, &set, NULL);

    timer_t a = make(CLOCK_MONOTONIC, SIGEV_SIGNAL, sig_a, 0xC0FFEE, A_MS, A_MS);
    timer_t filler = make(CLOCK_MONOTONIC, SIGEV_NONE, 0, 0, 0, 0);
    timer_t b = make(CLOCK_MONOTONIC, SIGEV_SIGNAL, sig_b, 0xB0B, run_ms / 2, 0);
    timer_delete(filler);
    timer_t c = make(CLOCK_BOOTTIME, SIGEV_NONE, 0, 0, run_ms * 10, 0);
    int id_a = (int)(intptr_t)a, id_b = (int)(intptr_t)b;
    int64_t start = now_ns(CLOCK_MONOTONIC);

    uint64_t a_total = 0;
    long b_fired = 0, late_waits = 0, bad = 0;
    uint64_t b_at = 0;
    while (a_total < (uint64_t)n && late_waits < 3) {
        siginfo_t si;
        struct timespec one = {.tv_sec = 1};
        int s = sigtimedwait(&set, &si, &one);
        if (s < 0 && errno == EINTR)
            continue; /* a restart may end a waiting call */
        if (s < 0) {
            fail("no timer signal within 1 s (after %llu of A's %ld expirations)",
                 (unsigned long long)a_total, n);
            late_waits++;
            continue;
        }
        if (si.si_code != SI_TIMER) {
            if (bad++ < 3)
                fail("signal %d with si_code %d, not from a timer", s, si.si_code);
            continue;
        }
        if (s == sig_a) {
            if ((si.si_value.sival_int != 0xC0FFEE || si.si_timerid != id_a) && bad++ < 3)
                fail("A's signal carries value %#x and timer id %d, expected %#x and %d",
                     si.si_value.sival_int, si.si_timerid, 0xC0FFEE, id_a);
            a_total += 1 + (uint64_t)si.si_overrun;
        } else if (s == sig_b) {
            if ((si.si_value.sival_int != 0xB0B || si.si_timerid != id_b) && bad++ < 3)
                fail("B's signal carries value %#x and timer id %d, expected %#x and %d",
                     si.si_value.sival_int, si.si_timerid, 0xB0B, id_b);
            b_fired++;
            b_at = a_total;
        }
        if (fired_too_fast("A", a_total, A_MS, start))
            break;
    }

    check_fired_midway("B", b_fired, b_at, n);
    struct itimerspec cur;
    if (timer_gettime(a, &cur) != 0 || cur.it_interval.tv_sec != 0 ||
        cur.it_interval.tv_nsec != A_MS * 1000000L)
        fail("A is no longer armed every %d ms", A_MS);
    int64_t c_left = 0;
    if (timer_gettime(c, &cur) != 0)
        fail("C is gone: %s", strerror(errno));
    else
        c_left = (int64_t)cur.it_value.tv_sec * 1000 + cur.it_value.tv_nsec / 1000000;
    if (c_left < run_ms * 8 || c_left > run_ms * 10)
        fail("C has %lld ms left, expected between %lld and %lld", (long long)c_left,
             (long long)run_ms * 8, (long long)run_ms * 10);
    if (id_b == id_a + 1)
        fail("B got id %d right after A's: the filler did not take one", id_b);

    return finish(mix64((uint64_t)n ^ mix64((uint64_t)b_fired)));
}
