/* pidfd: a parent holds a pidfd of its child (pidfd_open) and a non-blocking one of itself
 * across checkpoint/restart, and learns of the child's exit through it.
 *
 * The child runs 60% of the run in steps, then exits with status 42. The parent polls the
 * child's pidfd (timeout 0) every step: it must not be readable while the child runs (before 80% of
 * its steps), must become readable within n/5 steps of the child's last step, and waitid(P_PIDFD) on it must give status
 * 42. pidfd_send_signal(.., 0) must work on both pidfds while their processes live, and the
 * self pidfd must keep O_NONBLOCK. Two more children are reaped at the start, the parent keeping
 * two pidfds of the first (opened apart) and one of the second, as an event loop does until it
 * closes them: every step each must poll readable and refuse a signal (ESRCH before a restart,
 * EINVAL after one: the process standing for them ended outside the job's PID namespace); where pidfds
 * are files of their own (pidfs, Linux 6.9), the first's two share an inode and the second's
 * differs. RESULT depends only on the step count and the checks.
 *
 * Usage: pidfd [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

static int pidfd_open(pid_t pid, unsigned flags)
{
    return (int)syscall(SYS_pidfd_open, pid, flags);
}

static int pidfd_signal(int fd, int sig)
{
    return (int)syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
}

int main(int argc, char **argv)
{
    start_marker();
    long n = steps_arg(argc, argv, 1, 4.0);
    long child_steps = n * 6 / 10;
    pid_t child = fork();
    if (child == 0) {
        for (long i = 0; i < child_steps; i++)
            sleep_ms(STEP_MS);
        _exit(42);
    }
    /* The reaped ones: [0] and [1] of the first, [2] of the second. */
    int reaped[3];
    for (int k = 0; k < 2; k++) {
        pid_t gone = fork();
        if (gone == 0)
            _exit(0);
        reaped[k == 0 ? 0 : 2] = pidfd_open(gone, 0);
        if (k == 0)
            reaped[1] = pidfd_open(gone, 0);
        if (waitpid(gone, NULL, 0) != gone) {
            perror("waitpid");
            return 2;
        }
    }
    int cfd = pidfd_open(child, 0);
    int sfd = pidfd_open(getpid(), O_NONBLOCK); /* PIDFD_NONBLOCK */
    if (cfd < 0 || sfd < 0) {
        perror("pidfd_open");
        return 2;
    }
    long seen_at = -1, bad = 0;
    for (long i = 0; i < n; i++) {
        sleep_ms(STEP_MS);
        for (int k = 0; k < 3; k++) {
            struct pollfd g = {.fd = reaped[k], .events = POLLIN};
            if (poll(&g, 1, 0) != 1 || !(g.revents & POLLIN) || pidfd_signal(reaped[k], 0) == 0 || (errno != ESRCH && errno != EINVAL)) {
                if (bad++ < 3)
                    fail("step %ld: the pidfd %d of a reaped process: not readable, or a signal went (%s)", i, k, strerror(errno));
            }
        }
        if (seen_at >= 0)
            continue;
        struct pollfd p = {.fd = cfd, .events = POLLIN};
        int r = poll(&p, 1, 0);
        if (r < 0 && errno == EINTR) {
            i--;
            continue;
        }
        if (r < 0 || (p.revents & ~POLLIN)) {
            if (bad++ < 3)
                fail("poll on the child's pidfd: r=%d revents=%#x errno=%s", r, p.revents,
                     strerror(errno));
            continue;
        }
        if (r == 1) {
            seen_at = i;
            continue;
        }
        if (pidfd_signal(cfd, 0) != 0 && bad++ < 3)
            fail("pidfd_send_signal to the running child: %s", strerror(errno));
        if (pidfd_signal(sfd, 0) != 0 && bad++ < 3)
            fail("pidfd_send_signal to itself: %s", strerror(errno));
    }
    if (seen_at < 0)
        fail("the child's exit never showed on its pidfd");
    else if (seen_at < child_steps * 8 / 10 || seen_at > child_steps + n / 5)
        fail("the child's exit showed at step %ld, it ran %ld steps", seen_at, child_steps);
    siginfo_t si = {0};
    if (waitid((idtype_t)P_PIDFD, (id_t)cfd, &si, WEXITED) != 0)
        fail("waitid(P_PIDFD): %s", strerror(errno));
    else if (si.si_pid != child || si.si_code != CLD_EXITED || si.si_status != 42)
        fail("waitid(P_PIDFD) gave pid %d code %d status %d, expected %d exited 42", si.si_pid,
             si.si_code, si.si_status, child);
    struct stat st[3];
    struct statfs fs;
    for (int k = 0; k < 3; k++)
        if (fstat(reaped[k], &st[k]))
            fail("fstat of a reaped process's pidfd: %s", strerror(errno));
    if (fstatfs(reaped[0], &fs) == 0 && fs.f_type == 0x50494446 /* PID_FS_MAGIC */ &&
        (st[0].st_ino != st[1].st_ino || st[0].st_ino == st[2].st_ino))
        fail("the reaped processes' pidfds: inodes %lu %lu (one process) and %lu (another)", (unsigned long)st[0].st_ino,
             (unsigned long)st[1].st_ino, (unsigned long)st[2].st_ino);
    if (!(fcntl(sfd, F_GETFL) & O_NONBLOCK))
        fail("the self pidfd lost PIDFD_NONBLOCK");
    return finish(mix64((uint64_t)n ^ mix64((uint64_t)si.si_status)));
}
