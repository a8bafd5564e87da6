/* fown: descriptors that signal their owner when I/O becomes possible (O_ASYNC, F_SETOWN_EX,
 * F_SETSIG), as SIGIO-driven programs and zdtm's file_fown set them, survive checkpoint/restart.
 *
 * The parent owns the read end of pipe A (owner: itself, signal SIGRTMIN+1); the read end of
 * pipe B is owned by the child (owner set by the parent to the child's pid, signal SIGRTMIN+2).
 * Every step the parent writes a byte into each pipe. Each process counts the signals its
 * handler takes, checks that each came for its descriptor (si_fd), that the kernel still names
 * it as the owner with its signal (F_GETOWN_EX, F_GETSIG), and that it took one signal per byte
 * read (the child one more, for the end of file). Prints RESULT and PASS, or FAIL <what>.
 *
 * Usage: fown [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

static volatile sig_atomic_t taken, wrong_fd;
/* The descriptor each signal is for, set before the fork. */
static int sig_a, sig_b, fd_a, fd_b;

static void on_io(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    taken++;
    if (si->si_fd != (sig == sig_a ? fd_a : fd_b))
        wrong_fd++;
}

/* Waits for the signal it owes: RT signals queue, one per write. */
static void settle(long want)
{
    for (int i = 0; i < 200 && taken < want; i++)
        sleep_ms(1);
}

static void check_owner(const char *who, int fd, pid_t owner, int sig, long step)
{
    struct f_owner_ex ex;
    if (fcntl(fd, F_GETOWN_EX, &ex) != 0 || ex.type != F_OWNER_PID || ex.pid != owner)
        fail("%s step %ld: owner of fd %d is type %d pid %d, not pid %d", who, step, fd, ex.type, ex.pid, owner);
    int got = fcntl(fd, F_GETSIG);
    if (got != sig)
        fail("%s step %ld: fd %d signals %d, not %d", who, step, fd, got, sig);
    if (!(fcntl(fd, F_GETFL) & O_ASYNC))
        fail("%s step %ld: fd %d lost O_ASYNC", who, step, fd);
}

static void handle(int sig)
{
    struct sigaction sa = {.sa_sigaction = on_io, .sa_flags = SA_SIGINFO | SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

/* Reads what is there; returns the bytes read. */
static long drain(int fd)
{
    char buf[256];
    long total = 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        total += n;
    return total;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    int a[2], b[2], ready[2];
    if (pipe2(a, O_NONBLOCK) || pipe2(b, O_NONBLOCK) || pipe(ready))
        return 2;
    sig_a = SIGRTMIN + 1;
    sig_b = SIGRTMIN + 2;
    fd_a = a[0];
    fd_b = b[0];
    /* Before the fork: the parent's first write may come before the child has run at all. */
    handle(sig_a);
    handle(sig_b);

    pid_t child = fork();
    if (child == 0) {
        close(a[0]);
        close(a[1]);
        close(b[1]);
        close(ready[1]);
        char go;
        if (read(ready[0], &go, 1) != 1)
            _exit(3);
        long bytes = 0, step = 0;
        /* Until the parent closes its end: every byte it wrote brought a signal. */
        for (;;) {
            sleep_ms(STEP_MS);
            long n = drain(b[0]);
            bytes += n;
            settle(bytes);
            check_owner("child", b[0], getpid(), sig_b, step++);
            char c;
            ssize_t more = n == 0 ? read(b[0], &c, 1) : -1;
            if (more == 0)
                break;
            if (more == 1)
                bytes++;
        }
        /* And one more for the end of file, when the parent closed its end. */
        settle(bytes + 1);
        if (taken != bytes + 1 || wrong_fd)
            fail("child: %ld signals (%ld for another descriptor) for %ld bytes and the end", (long)taken, (long)wrong_fd, bytes);
        if (bytes != steps)
            fail("child: %ld bytes, not %ld", bytes, steps);
        _exit(failures ? 1 : 0);
    }
    close(ready[0]);
    /* A child that ended early shows in its status, not as this process killed by a write. */
    signal(SIGPIPE, SIG_IGN);
    struct f_owner_ex me = {F_OWNER_PID, getpid()}, kid = {F_OWNER_PID, child};
    if (fcntl(a[0], F_SETOWN_EX, &me) || fcntl(a[0], F_SETSIG, sig_a) || fcntl(a[0], F_SETFL, O_NONBLOCK | O_ASYNC))
        fail("set up pipe A: %s", strerror(errno));
    /* B's read end, the child's copy sharing the open file description with this one: owned
     * by the child, set here (another process's pid), then this copy goes. */
    if (fcntl(b[0], F_SETOWN_EX, &kid) || fcntl(b[0], F_SETSIG, sig_b) || fcntl(b[0], F_SETFL, O_NONBLOCK | O_ASYNC))
        fail("set up pipe B: %s", strerror(errno));
    close(b[0]);
    if (write(ready[1], "g", 1) != 1)
        fail("start the child: %s", strerror(errno));
    close(ready[1]);

    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        if (write(a[1], "a", 1) != 1 || write(b[1], "b", 1) != 1)
            fail("step %ld: write: %s", i, strerror(errno));
        long read_a = drain(a[0]);
        settle(i + 1);
        if (read_a != 1 || taken != i + 1 || wrong_fd)
            fail("step %ld: read %ld, %ld signals (%ld for another descriptor)", i, read_a, (long)taken, (long)wrong_fd);
        check_owner("parent", a[0], getpid(), sig_a, i);
        h = mix64(h ^ (uint64_t)taken);
        sleep_ms(STEP_MS);
    }
    close(b[1]);
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child ended with status %#x", status);
    return finish(h);
}
