/* daemon: a program that becomes a daemon the classic way (fork, setsid, fork again, the middle
 * process exits), so that the daemon's session and process group are named after a process
 * that no longer exists, and its parent is the job's init.
 *
 * The launched process forks A; A calls setsid() and forks B; A exits and is reaped. B (the
 * daemon) forks C, which stays in B's session. B and C each step add to running sums in memory
 * and report them to the launched process over a pipe; the launched process prints the final
 * RESULT. At the end each of B and C checks that its session and process group are still A's
 * pid, that B's parent is still the one that adopted it (the job's init) and C's is B,
 * and reports PASS or the first difference.
 *
 * Usage: daemon SECONDS
 */
#include "common.h"
#include "detach.h"
#include <sys/wait.h>

struct report {
    uint64_t sum;
    char why[120];
};

static void worker(int out, long steps, uint64_t seed, pid_t sid, pid_t want_parent)
{
    uint64_t sum = 0;
    for (long s = 0; s < steps; s++) {
        sum = mix64(sum ^ seed ^ (uint64_t)s);
        sleep_ms(STEP_MS);
    }
    struct report r = { .sum = sum };
    if (getsid(0) != sid)
        snprintf(r.why, sizeof r.why, "pid %d: session %d, expected %d", getpid(), getsid(0), sid);
    else if (getpgid(0) != sid)
        snprintf(r.why, sizeof r.why, "pid %d: process group %d, expected %d", getpid(), getpgid(0), sid);
    else if (getppid() != want_parent)
        snprintf(r.why, sizeof r.why, "pid %d: parent %d, expected %d", getpid(), getppid(), want_parent);
    if (write(out, &r, sizeof r) != sizeof r)
        _exit(3);
}

int main(int argc, char **argv)
{
    long seconds = argc > 1 ? atol(argv[1]) : 5;
    long steps = seconds * 1000 / STEP_MS;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int p[2];
    if (pipe(p) != 0)
        return 2;
    pid_t a = fork();
    if (a == 0) {
        /* A: a session of its own, then the daemon B, then gone; B is adopted (by the job's
         * init, pid 1 of the job, under ckpt). */
        pid_t adopted_by;
        pid_t sid = detach_as_daemon(&adopted_by);
        close(p[0]);
        pid_t c = fork();
        if (c == 0) {
            worker(p[1], steps, 0xc, sid, getppid());
            _exit(0);
        }
        worker(p[1], steps, 0xb, sid, adopted_by);
        waitpid(c, NULL, 0);
        _exit(0);
    }
    close(p[1]);
    int status;
    if (a < 0 || waitpid(a, &status, 0) != a || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("FAIL the middle process did not make the daemon\n");
        return 1;
    }
    printf("START\n");
    uint64_t h = 0;
    const char *why = NULL;
    static struct report r[2];
    for (int i = 0; i < 2; i++) {
        size_t got = 0;
        while (got < sizeof r[i]) {
            ssize_t n = read(p[0], (char *)&r[i] + got, sizeof r[i] - got);
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        if (got != sizeof r[i]) {
            why = "a report of the daemon or its child is missing";
            break;
        }
        h ^= r[i].sum;
        if (r[i].why[0] && !why)
            why = r[i].why;
    }
    printf("RESULT %016llx\n", (unsigned long long)h);
    if (why) {
        printf("FAIL %s\n", why);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
