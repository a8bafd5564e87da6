/* orphans: a launched program that starts two workers and exits first, leaving them in its
 * session and process group (DMTCP's shared-fd2 does this; so do batch scripts that end with
 * background jobs they never wait for). The workers share a pipe the launched process made:
 * the producer writes the numbers 0..STEPS-1, one per step, and exits; the consumer hashes
 * what it reads until end of file, then prints RESULT and PASS (or FAIL when a number came
 * out of order or twice, or when its session, group or parent changed: they must be the
 * launched process's (which makes itself a session leader, as a login shell is, where it can),
 * and the process that adopted it). The launched process prints START and exits 3.
 *
 * Under `ckpt launch --until all` the job must go on with the workers after the launched
 * process ends, and end with its status (3) when the last worker does. Without it, the
 * workers end with the launched process, as a terminal's jobs end with the shell.
 *
 * Usage: orphans SECONDS
 */
#include "common.h"
#include <signal.h>

int main(int argc, char **argv)
{
    long seconds = argc > 1 ? atol(argv[1]) : 5;
    long steps = seconds * 1000 / STEP_MS;
    setvbuf(stdout, NULL, _IOLBF, 0);
    pid_t leader = getpid();
    setsid(); /* fails harmlessly where it already leads a group */
    pid_t sid = getsid(0), pgid = getpgid(0);
    int fds[2];
    if (pipe(fds) != 0)
        return 2;
    pid_t producer = fork();
    if (producer < 0)
        return 2;
    if (producer == 0) {
        close(fds[0]);
        for (long s = 0; s < steps; s++) {
            uint64_t n = (uint64_t)s;
            if (write(fds[1], &n, sizeof n) != sizeof n) {
                printf("FAIL producer: write: %s\n", strerror(errno));
                return 1;
            }
            sleep_ms(STEP_MS);
        }
        return 0;
    }
    pid_t consumer = fork();
    if (consumer < 0)
        return 2;
    if (consumer == 0) {
        close(fds[1]);
        while (getppid() == leader)
            sleep_ms(1);
        pid_t adopted_by = getppid();
        uint64_t h = 0, expected = 0, n;
        for (;;) {
            ssize_t got = read(fds[0], &n, sizeof n);
            if (got == 0)
                break;
            if (got < 0 && errno == EINTR)
                continue;
            if (got != sizeof n) {
                printf("FAIL consumer: read returned %zd (%s)\n", got, got < 0 ? strerror(errno) : "short");
                return 1;
            }
            if (n != expected) {
                printf("FAIL consumer: read %llu, expected %llu\n", (unsigned long long)n, (unsigned long long)expected);
                return 1;
            }
            expected++;
            h = mix64(h ^ n);
        }
        printf("RESULT %016llx\n", (unsigned long long)h);
        if (expected != (uint64_t)steps)
            printf("FAIL consumer: %llu numbers, expected %ld\n", (unsigned long long)expected, steps);
        else if (getsid(0) != sid || getpgid(0) != pgid)
            printf("FAIL session %d and group %d, expected %d and %d\n", getsid(0), getpgid(0), sid, pgid);
        else if (getppid() != adopted_by)
            printf("FAIL parent %d, expected %d\n", getppid(), adopted_by);
        else
            printf("PASS\n");
        return 0;
    }
    close(fds[0]);
    close(fds[1]);
    printf("START\n");
    return 3;
}
