/* clocks: CLOCK_MONOTONIC and CLOCK_BOOTTIME go on across checkpoints and restarts as if the job
 * had never stopped, however long it was down (a restarted job runs in a time namespace whose
 * offsets continue them from the checkpoint).
 *
 * Every step (~10 ms) reads both clocks twice: through the vdso (clock_gettime, as programs do)
 * and by the system call itself (syscall(SYS_clock_gettime)). A FAIL line says when, from one
 * step to the next, a reading went back or moved on by more than MAX_GAP_MS (a freeze or a
 * restart takes far less), or when the vdso and the system call disagree about a clock by more
 * than MAX_SKEW_MS (the vdso reading the machine's clock in a time namespace).
 *
 * A timerfd on CLOCK_MONOTONIC with an absolute deadline (TFD_TIMER_ABSTIME) 70% into the run
 * must fire once, not before its deadline and not more than MAX_GAP_MS after it: a deadline
 * that a restart moved fires early, late or never.
 *
 * RESULT folds each step's outcome (right or not) and the timer's firings: the same as an
 * uninterrupted run's only where every check held.
 *
 * Usage: clocks [SECONDS=5]
 */
#include "common.h"

#include <sys/syscall.h>
#include <sys/timerfd.h>

#define MAX_GAP_MS 3000
#define MAX_SKEW_MS 1000
/* FAIL lines printed at most; the rest are only counted. */
#define MAX_REPORTS 10

enum { MONO_VDSO, MONO_SYSCALL, BOOT_VDSO, BOOT_SYSCALL, READINGS };
static const char *const names[READINGS] = {
    "CLOCK_MONOTONIC (vdso)",
    "CLOCK_MONOTONIC (system call)",
    "CLOCK_BOOTTIME (vdso)",
    "CLOCK_BOOTTIME (system call)",
};

static int reports;

#define report(...)                                                                                \
    do {                                                                                           \
        if (reports++ < MAX_REPORTS)                                                               \
            fail(__VA_ARGS__);                                                                     \
        else                                                                                       \
            failures++;                                                                            \
    } while (0)

static int64_t syscall_ns(clockid_t clock)
{
    struct timespec t;
    if (syscall(SYS_clock_gettime, clock, &t) != 0) {
        perror("clock_gettime system call");
        exit(2);
    }
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void read_clocks(int64_t r[READINGS])
{
    r[MONO_VDSO] = now_ns(CLOCK_MONOTONIC);
    r[MONO_SYSCALL] = syscall_ns(CLOCK_MONOTONIC);
    r[BOOT_VDSO] = now_ns(CLOCK_BOOTTIME);
    r[BOOT_SYSCALL] = syscall_ns(CLOCK_BOOTTIME);
}

static void check_clocks(long step, const int64_t prev[READINGS], const int64_t cur[READINGS])
{
    for (int i = 0; i < READINGS; i++) {
        int64_t moved_ms = (cur[i] - prev[i]) / 1000000LL;
        if (cur[i] < prev[i])
            report("step %ld: %s went back by %lld ns", step, names[i], (long long)(prev[i] - cur[i]));
        else if (moved_ms > MAX_GAP_MS)
            report("step %ld: %s jumped by %lld ms in one step", step, names[i], (long long)moved_ms);
    }
    for (int i = 0; i < READINGS; i += 2) {
        int64_t skew_ms = llabs(cur[i + 1] - cur[i]) / 1000000LL;
        if (skew_ms > MAX_SKEW_MS)
            report("step %ld: %s and %s differ by %lld ms", step, names[i], names[i + 1], (long long)skew_ms);
    }
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);

    int64_t deadline = now_ns(CLOCK_MONOTONIC) + (int64_t)steps * STEP_MS * 1000000LL * 7 / 10;
    int timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct itimerspec at = {.it_value = {.tv_sec = deadline / 1000000000LL, .tv_nsec = deadline % 1000000000LL}};
    if (timer < 0 || timerfd_settime(timer, TFD_TIMER_ABSTIME, &at, NULL) != 0) {
        perror("timerfd");
        return 2;
    }
    uint64_t fired = 0;

    int64_t prev[READINGS], cur[READINGS];
    uint64_t h = 0;
    read_clocks(prev);
    for (long s = 0; s < steps; s++) {
        sleep_ms(STEP_MS);
        read_clocks(cur);
        int before = failures;
        check_clocks(s, prev, cur);
        h = mix64(h ^ (uint64_t)s ^ ((uint64_t)(failures != before) << 40));
        memcpy(prev, cur, sizeof cur);

        uint64_t n;
        if (read(timer, &n, sizeof n) == sizeof n) {
            int64_t late_ms = (now_ns(CLOCK_MONOTONIC) - deadline) / 1000000LL;
            if (late_ms < 0)
                report("step %ld: the absolute timer fired %lld ms before its deadline", s, (long long)-late_ms);
            else if (late_ms > MAX_GAP_MS)
                report("step %ld: the absolute timer fired %lld ms after its deadline", s, (long long)late_ms);
            fired += n;
        }
    }
    if (fired != 1)
        report("the absolute timer fired %llu times, expected once", (unsigned long long)fired);

    return finish(mix64(h ^ fired));
}
