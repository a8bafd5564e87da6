/* daemonize: a server that becomes a daemon and lets the launched program end, as
 * `redis-server --daemonize yes` or nginx do: the launched process forks A and prints START;
 * A calls setsid() and forks B; A exits; the launched process exits 0 at once. B (the daemon)
 * works for SECONDS, keeping a running hash in memory, then prints RESULT and PASS (or FAIL
 * when its session, its group or its parent changed: they must be A's pid, A's pid, and the
 * process that adopted it). Under ckpt the job must go on with B after the launched process
 * ends, and end (with the launched process's status, 0) when B does.
 *
 * Usage: daemonize SECONDS
 */
#include "common.h"
#include "detach.h"
#include <sys/wait.h>

int main(int argc, char **argv)
{
    long seconds = argc > 1 ? atol(argv[1]) : 5;
    long steps = seconds * 1000 / STEP_MS;
    setvbuf(stdout, NULL, _IOLBF, 0);
    pid_t a = fork();
    if (a < 0)
        return 2;
    if (a > 0) {
        int status;
        if (waitpid(a, &status, 0) != a || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("FAIL the middle process did not make the daemon\n");
            return 1;
        }
        printf("START\n");
        return 0;
    }
    pid_t adopted_by;
    pid_t sid = detach_as_daemon(&adopted_by);
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        h = mix64(h ^ (uint64_t)s);
        sleep_ms(STEP_MS);
    }
    printf("RESULT %016llx\n", (unsigned long long)h);
    if (getsid(0) != sid || getpgid(0) != sid)
        printf("FAIL session %d and group %d, expected %d\n", getsid(0), getpgid(0), sid);
    else if (getppid() != adopted_by)
        printf("FAIL parent %d, expected %d\n", getppid(), adopted_by);
    else
        printf("PASS\n");
    return 0;
}
