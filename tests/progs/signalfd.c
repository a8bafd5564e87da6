/* signalfd: blocked signals are read through signalfds after checkpoint/restart, each by the
 * signalfd whose mask holds it, with its value, in order.
 *
 * SIGUSR1, SIGUSR2 and SIGRTMIN+3 are blocked. `sfd` (non-blocking) reads SIGUSR1 and
 * SIGRTMIN+3; `sfd2` (blocking, close-on-exec) reads SIGUSR2 only.
 *  - step s queues SIGRTMIN+3 to the process with value s, and reads one from sfd from step 5
 *    on, which must carry the value s-5 (so five are always pending at a checkpoint);
 *  - every 10th step raises SIGUSR1 (thread-directed), read at once (it comes first: lower
 *    numbers are read first);
 *  - at the end: the five left are read in order, then sfd says EAGAIN; SIGUSR2 raised then is
 *    not read by sfd (not in its mask) but by sfd2.
 * RESULT hashes the values read.
 *
 * Usage: signalfd [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#define LAG 5

static uint64_t h;

/* One signal from a signalfd; signo 0 if none is there. */
static struct signalfd_siginfo take(int fd)
{
    struct signalfd_siginfo si;
    for (;;) {
        ssize_t r = read(fd, &si, sizeof si);
        if (r == sizeof si)
            return si;
        if (r < 0 && errno == EINTR)
            continue;
        memset(&si, 0, sizeof si);
        return si;
    }
}

static void expect(int fd, int signo, int value, const char *what)
{
    struct signalfd_siginfo si = take(fd);
    if ((int)si.ssi_signo != signo)
        fail("%s: read signal %u, expected %d", what, si.ssi_signo, signo);
    else if (value >= 0 && si.ssi_int != value)
        fail("%s: signal %d carries %d, expected %d", what, signo, si.ssi_int, value);
    h = mix64(h ^ ((uint64_t)si.ssi_signo << 32) ^ (uint32_t)si.ssi_int);
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    int rt = SIGRTMIN + 3;

    sigset_t blocked, m1, m2;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGUSR1);
    sigaddset(&blocked, SIGUSR2);
    sigaddset(&blocked, rt);
    sigprocmask(SIG_BLOCK, &blocked, NULL);
    sigemptyset(&m1);
    sigaddset(&m1, SIGUSR1);
    sigaddset(&m1, rt);
    sigemptyset(&m2);
    sigaddset(&m2, SIGUSR2);
    int sfd = signalfd(-1, &m1, SFD_NONBLOCK);
    int sfd2 = signalfd(-1, &m2, SFD_CLOEXEC);
    if (sfd < 0 || sfd2 < 0) {
        perror("signalfd");
        return 2;
    }

    for (long s = 0; s < steps; s++) {
        if (sigqueue(getpid(), rt, (union sigval){.sival_int = (int)s}) != 0)
            fail("sigqueue: %s", strerror(errno));
        if (s % 10 == 0) {
            raise(SIGUSR1);
            expect(sfd, SIGUSR1, -1, "SIGUSR1");
        }
        if (s >= LAG)
            expect(sfd, rt, (int)(s - LAG), "queued signal");
        sleep_ms(STEP_MS);
    }
    for (long s = steps - LAG; s < steps; s++)
        expect(sfd, rt, (int)s, "queued signal at the end");
    struct signalfd_siginfo none = take(sfd);
    if (none.ssi_signo != 0)
        fail("sfd read signal %u after the last (duplicated?)", none.ssi_signo);
    else if (errno != EAGAIN)
        fail("sfd did not say EAGAIN when empty (O_NONBLOCK lost?)");

    raise(SIGUSR2);
    none = take(sfd);
    if (none.ssi_signo != 0)
        fail("sfd read signal %u, which is not in its mask", none.ssi_signo);
    struct pollfd p = {.fd = sfd2, .events = POLLIN};
    if (poll(&p, 1, 1000) != 1)
        fail("sfd2 does not see SIGUSR2 (mask lost?)");
    else
        expect(sfd2, SIGUSR2, -1, "SIGUSR2 through sfd2");
    if (!(fcntl(sfd2, F_GETFD) & FD_CLOEXEC) || (fcntl(sfd2, F_GETFL) & O_NONBLOCK))
        fail("sfd2's flags changed");

    return finish(h);
}
