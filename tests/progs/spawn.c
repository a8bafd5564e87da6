/* spawn: a program that starts other programs all the time, the way make, shells and
 * Python's subprocess do, is checkpointed between any two of its instructions.
 *
 * Each step starts six short programs and waits for each: with posix_spawn (glibc's runs the
 * child with clone(CLONE_VM|CLONE_VFORK)), with vfork + execve, and with fork + execve; half of
 * them are /bin/true, half /bin/false. A checkpoint often lands while a child of vfork has not yet
 * exec'd (the vfork child here closes descriptors first, as a shell would, which widens that
 * moment): the parent then waits in the kernel, and holding the child stopped would hold the
 * checkpoint forever. The program checks every exit status and every pid it waited for, and
 * folds them into its result.
 *
 * Usage: spawn [SECONDS=4]
 */
#include "common.h"

#include <spawn.h>
#include <sys/wait.h>

extern char **environ;

static pid_t start(int how, int ok)
{
    char *path = ok ? "/bin/true" : "/bin/false";
    char *argv[] = {path, NULL};
    pid_t pid = -1;
    switch (how) {
    case 0:
        if (posix_spawn(&pid, path, NULL, NULL, argv, environ) != 0)
            return -1;
        return pid;
    case 1:
        pid = vfork();
        if (pid == 0) {
            /* What a shell does between vfork and exec (redirections, signal dispositions),
             * drawn out so that checkpoints often find the child here. */
            for (int fd = 1000; fd < 3000; fd++)
                close(fd);
            execve(path, argv, environ);
            _exit(127);
        }
        return pid;
    default:
        pid = fork();
        if (pid == 0) {
            execve(path, argv, environ);
            _exit(127);
        }
        return pid;
    }
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        for (int k = 0; k < 6; k++) {
            int ok = (i + k) % 2;
            pid_t pid = start(k % 3, ok);
            if (pid < 0) {
                fail("step %ld: cannot start a program: %s", i, strerror(errno));
                return finish(h);
            }
            int st = 0;
            pid_t got;
            while ((got = waitpid(pid, &st, 0)) == -1 && errno == EINTR)
                ;
            if (got != pid) {
                fail("step %ld: waitpid(%d) returned %d: %s", i, pid, got, strerror(errno));
                return finish(h);
            }
            if (!WIFEXITED(st) || WEXITSTATUS(st) != (ok ? 0 : 1)) {
                fail("step %ld: %s ended with status %#x", i, ok ? "/bin/true" : "/bin/false", st);
                return finish(h);
            }
            h = mix64(h ^ (uint64_t)(k * 2 + WEXITSTATUS(st)));
        }
        sleep_ms(2);
    }
    return finish(h);
}
