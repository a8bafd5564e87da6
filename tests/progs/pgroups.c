/* pgroups: process groups whose leader has exited survive checkpoint/restart, as a shell
 * pipeline whose first command ended leaves its group (bash with job control: `(exit) | sleep`).
 *
 * - In the program's own session: a leader makes a group (setpgid), forks a member into it and
 *   exits; the parent reaps the leader. The group lives on, named after a pid no process has.
 * - In a session whose leader exited too: a child calls setsid, forks a group leader that forks
 *   a member and exits, and the session's leader exits: the member is alone in its group and
 *   session, adopted by the init.
 *
 * Each member checks at every step that its group and session ids are still the ones it was
 * given, and counts the signals sent to its group (kill(-pgid)): the parent sends one every
 * SIGNAL_EVERY steps and checks that the group exists (kill(-pgid, 0)). The signal is a real-time
 * one, which the kernel queues: SIGUSR1 was, and a member that a loaded machine left unscheduled
 * while two came got one (the reference run outside ckpt failed so in a full test run). Once
 * the parent has sent its last, it tells each group to report (SIGRTMIN + 1, delivered after
 * any SIGRTMIN still pending: the lower real-time signal goes first); each member then reports
 * over a pipe how many signals it got and whether every check held; PASS when every report
 * matches what was sent. (Members that reported after a fixed number of steps of their own
 * reported before the parent's last signal where the machine left the parent behind.)
 *
 * With `live`, the other session's leader stays (it waits for the end): a group without its
 * leader in a session whose leader lives, its member adopted by the init while in a session
 * the init is not in.
 *
 * Usage: pgroups [SECONDS=5] [live]
 */
#include "common.h"

#include <signal.h>
#include <sys/wait.h>

#define SIGNAL_EVERY 20

static volatile sig_atomic_t got, report_now;

static void on_signal(int sig)
{
    (void)sig;
    got++;
}

static void on_report(int sig)
{
    (void)sig;
    report_now = 1;
}

struct report {
    long signals;
    long bad_ids;
};

/* A member: runs `steps` steps, checking its ids, then reports on `out` and exits. */
static void member(long steps, pid_t pgid, pid_t sid, int out)
{
    long bad = 0;
    /* Until the parent says (bounded, should it never: the count then tells). */
    for (long i = 0; !report_now && i < 20 * steps + 3000; i++) {
        if (getpgid(0) != pgid || getsid(0) != sid)
            bad++;
        sleep_ms(STEP_MS);
    }
    struct report r = {.signals = got, .bad_ids = bad};
    if (io_full(out, &r, sizeof r, 1))
        _exit(3);
    _exit(0);
}

/* Makes a group whose leader exits, with one member; returns the group's id. */
static pid_t orphan_group(long steps, int out)
{
    int ids[2];
    if (pipe(ids))
        return -1;
    pid_t leader = fork();
    if (leader == 0) {
        setpgid(0, 0);
        pid_t m = fork();
        if (m == 0)
            member(steps, getpgid(0), getsid(0), out);
        /* The member is in the group before its leader goes. */
        pid_t pgid = getpid();
        if (write(ids[1], &pgid, sizeof pgid) != sizeof pgid)
            _exit(4);
        _exit(0);
    }
    pid_t pgid = -1;
    if (io_full(ids[0], &pgid, sizeof pgid, 0))
        pgid = -1;
    waitpid(leader, NULL, 0);
    close(ids[0]);
    close(ids[1]);
    return pgid;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGRTMIN, &sa, NULL);
    struct sigaction report = {.sa_handler = on_report};
    sigemptyset(&report.sa_mask);
    report.sa_flags = SA_RESTART;
    sigaction(SIGRTMIN + 1, &report, NULL);

    int reports[2];
    if (pipe(reports))
        return 2;

    /* The group in our own session. */
    pid_t here = orphan_group(steps, reports[1]);
    /* The group in a session whose leader goes. */
    int ids[2];
    if (pipe(ids))
        return 2;
    int live = argc > 2 && strcmp(argv[2], "live") == 0;
    pid_t session = fork();
    if (session == 0) {
        setsid();
        pid_t g = orphan_group(steps, reports[1]);
        if (write(ids[1], &g, sizeof g) != sizeof g)
            _exit(4);
        if (live) {
            /* Whatever the restart made to make the group and its member again must be gone
             * unseen: no SIGCHLD, no child left (the group's leader was reaped above). */
            struct sigaction chld = {.sa_handler = on_signal};
            sigemptyset(&chld.sa_mask);
            sigaction(SIGCHLD, &chld, NULL);
            got = 0;
            sleep_ms((steps + 40) * STEP_MS);
            if (got)
                _exit(5);
            if (waitpid(-1, NULL, __WALL | WNOHANG) != -1 || errno != ECHILD)
                _exit(6);
        }
        _exit(0);
    }
    pid_t there = -1;
    if (io_full(ids[0], &there, sizeof there, 0))
        there = -1;
    if (!live)
        waitpid(session, NULL, 0);
    close(reports[1]);
    if (here <= 0 || there <= 0) {
        printf("setup failed: groups %d and %d\n", (int)here, (int)there);
        return 2;
    }

    long sent = 0;
    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        if (i % SIGNAL_EVERY == 0) {
            if (kill(-here, 0) != 0)
                fail("step %ld: the group in our session is gone (%s)", i, strerror(errno));
            if (kill(-there, 0) != 0)
                fail("step %ld: the group in the other session is gone (%s)", i, strerror(errno));
            kill(-here, SIGRTMIN);
            kill(-there, SIGRTMIN);
            sent++;
        }
        h = mix64(h ^ (uint64_t)i);
        sleep_ms(STEP_MS);
    }
    kill(-here, SIGRTMIN + 1);
    kill(-there, SIGRTMIN + 1);
    for (int k = 0; k < 2; k++) {
        struct report r;
        if (io_full(reports[0], &r, sizeof r, 0)) {
            fail("a member did not report");
            break;
        }
        if (r.signals != sent)
            fail("a member got %ld of the %ld signals sent to its group", r.signals, sent);
        if (r.bad_ids)
            fail("a member found its group or session changed %ld times", r.bad_ids);
        h = mix64(h ^ (uint64_t)r.signals);
    }
    if (live) {
        int st = 0;
        if (waitpid(session, &st, 0) != session || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail("the living session's leader found a child or SIGCHLD it never had (status %#x)", st);
    }
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    return finish(h);
}
