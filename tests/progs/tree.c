/* tree: a process tree survives checkpoint/restart.
 *
 * The parent forks three children: A computes and exits with a code derived from its result,
 * B starts its own session (setsid) and forks a grandchild that computes and exits, C starts
 * its own process group, exits at once and stays a zombie until the parent reaps it at the end;
 * D and E are zombies too, killed at once by SIGKILL and by SIGUSR1 (a restart remakes a
 * zombie by ending a process the same way, and SIGKILL's action cannot be set).
 * Every process keeps computing in steps until the end, so a checkpoint finds the whole tree
 * alive (and C a zombie). The parent checks, after the run: each child's exit status arrives
 * through waitpid, getppid() of the children is the parent, session and group ids are as set,
 * and the pids are the ones it started with.
 *
 * Usage: tree [SECONDS=4]
 */
#include "common.h"

#include <sys/wait.h>
#include <unistd.h>

static uint64_t work(uint64_t seed, long steps, pid_t expect_parent)
{
    uint64_t h = seed;
    for (long i = 0; i < steps; i++) {
        for (int k = 0; k < 2000; k++)
            h = mix64(h + (uint64_t)k);
        if (getppid() != expect_parent) {
            fail("pid %d: parent is %d, expected %d", getpid(), getppid(), expect_parent);
            return 0;
        }
        sleep_ms(STEP_MS);
    }
    return h;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    pid_t me = getpid();

    pid_t a = fork();
    if (a == 0)
        _exit((int)(work(1, steps, me) & 0x7f));

    pid_t b = fork();
    if (b == 0) {
        pid_t b_self = getpid();
        if (setsid() != b_self)
            _exit(100);
        pid_t g = fork();
        if (g == 0)
            _exit((int)(work(2, steps, b_self) & 0x7f));
        uint64_t h = work(3, steps, me);
        int st = 0;
        if (waitpid(g, &st, 0) != g || !WIFEXITED(st))
            _exit(101);
        if (getsid(0) != b_self)
            _exit(102);
        _exit((int)((h ^ (uint64_t)WEXITSTATUS(st)) & 0x7f));
    }

    pid_t c = fork();
    if (c == 0) {
        setpgid(0, 0);
        _exit(42);
    }

    pid_t d = fork();
    if (d == 0) {
        kill(getpid(), SIGKILL);
        _exit(103);
    }
    pid_t e = fork();
    if (e == 0) {
        signal(SIGUSR1, SIG_DFL);
        kill(getpid(), SIGUSR1);
        _exit(104);
    }

    uint64_t h = work(4, steps, getppid());
    if (getpid() != me)
        fail("pid changed from %d to %d", me, getpid());

    int st;
    uint64_t result = h;
    pid_t killed[2] = {d, e};
    int by[2] = {SIGKILL, SIGUSR1};
    for (int i = 0; i < 2; i++) {
        if (waitpid(killed[i], &st, 0) != killed[i])
            fail("waitpid(%d) failed", killed[i]);
        else if (!WIFSIGNALED(st) || WTERMSIG(st) != by[i])
            fail("child %d: status %#x, expected killed by signal %d", killed[i], st, by[i]);
    }
    pid_t kids[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        if (waitpid(kids[i], &st, 0) != kids[i]) {
            fail("waitpid(%d) failed", kids[i]);
            continue;
        }
        if (!WIFEXITED(st)) {
            fail("child %d did not exit normally (status %#x)", kids[i], st);
            continue;
        }
        result = mix64(result ^ (uint64_t)WEXITSTATUS(st));
    }
    if (WEXITSTATUS(st) != 42)
        fail("zombie child exit code %d, expected 42", WEXITSTATUS(st));
    return finish(result);
}
