/* heldtree: one process tree holding at once what the breadth issue's held-out tree holds, each
 * part checked after every checkpoint, crash and restart.
 *
 * The program (P) is a child subreaper (PR_SET_CHILD_SUBREAPER), and adopts:
 *  - an orphaned session: a child calls setsid, forks D and exits; D is P's, in a session and
 *    group named after a pid no process has;
 *  - an orphaned process group in a living session: a child L calls setsid and forks G, which
 *    makes a group, forks M and exits; M is P's, in G's group (no leader) and L's session.
 * D and M check at every step that their parent, group and session are the ones they had, and
 * report at the end. L lives until the end, and must find no child and no SIGCHLD it did not
 * have.
 * P also holds:
 *  - a stopped child (SIGSTOP), which must still be stopped at the end and run on after
 *    SIGCONT;
 *  - a pipe's read end in flight over SCM_RIGHTS on a socket pair, the pipe holding data: P
 *    receives it at the end, reads the data and what it writes after;
 *  - an unlinked file with a hole: 4 KiB of data at 0 and at 8 MiB, the rest a hole that
 *    SEEK_HOLE and SEEK_DATA must still find;
 *  - a datagram socket bound to DIR/dgram.sock, holding a datagram from a sender closed since;
 *  - a read lease on DIR/lease.dat;
 *  - and the child subreaper flag itself.
 * RESULT depends only on the number of steps and the data; PASS when every part held.
 *
 * Usage: heldtree DIR [SECONDS=5]
 */
#include "common.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#define HOLE_AT (8L << 20)
#define BLOCK 4096

static volatile sig_atomic_t got_chld;

static void on_chld(int sig)
{
    (void)sig;
    got_chld++;
}

/* What an adopted member reports: how many steps found its place in the tree changed. */
static void member(long steps, pid_t parent, int out)
{
    pid_t pgid = getpgid(0), sid = getsid(0);
    long bad = 0;
    for (long i = 0; i < steps + 20; i++) {
        if (getppid() != parent || getpgid(0) != pgid || getsid(0) != sid)
            bad++;
        sleep_ms(STEP_MS);
    }
    if (io_full(out, &bad, sizeof bad, 1))
        _exit(3);
    _exit(0);
}

/* Waits until `pid` is P's (the process between has ended). */
static void adopted(pid_t self)
{
    while (getppid() != self)
        sleep_ms(1);
}

static void fill(unsigned char *buf, size_t len, uint64_t seed)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (unsigned char)mix64(seed + i);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: heldtree DIR [SECONDS]\n");
        return 2;
    }
    start_marker();
    const char *dir = argv[1];
    long steps = steps_arg(argc, argv, 2, 5.0);
    pid_t self = getpid();
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        return 2;
    int reports[2];
    if (pipe(reports))
        return 2;

    /* The orphaned session: D, adopted by P. */
    pid_t a = fork();
    if (a == 0) {
        setsid();
        if (fork() == 0) {
            adopted(self);
            member(steps, self, reports[1]);
        }
        _exit(0);
    }
    waitpid(a, NULL, 0);

    /* The orphaned group in L's living session: M, adopted by P. */
    int ready[2];
    if (pipe(ready))
        return 2;
    pid_t l = fork();
    if (l == 0) {
        setsid();
        pid_t g = fork();
        if (g == 0) {
            setpgid(0, 0);
            if (fork() == 0) {
                adopted(self);
                char c = 1;
                if (write(ready[1], &c, 1) != 1)
                    _exit(4);
                member(steps, self, reports[1]);
            }
            _exit(0);
        }
        waitpid(g, NULL, 0);
        struct sigaction sa = {.sa_handler = on_chld};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGCHLD, &sa, NULL);
        sleep_ms((steps + 40) * STEP_MS);
        if (got_chld)
            _exit(5);
        if (waitpid(-1, NULL, __WALL | WNOHANG) != -1 || errno != ECHILD)
            _exit(6);
        _exit(0);
    }
    char c;
    if (read(ready[0], &c, 1) != 1)
        return 2;

    /* The stopped child. */
    pid_t stopped = fork();
    if (stopped == 0) {
        for (;;)
            pause();
    }
    kill(stopped, SIGSTOP);
    int status;
    if (waitpid(stopped, &status, WUNTRACED) != stopped || !WIFSTOPPED(status))
        return 2;

    /* The pipe in flight. */
    int pair[2], data[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) || pipe(data))
        return 2;
    unsigned char first[1000], second[1000], buf[BLOCK];
    fill(first, sizeof first, 1);
    fill(second, sizeof second, 2);
    if (write_full(data[1], first, sizeof first))
        return 2;
    {
        char tag = 'p';
        struct iovec iov = {.iov_base = &tag, .iov_len = 1};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } ctl;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &data[0], sizeof(int));
        if (sendmsg(pair[0], &msg, 0) != 1)
            return 2;
        close(data[0]);
    }

    /* The unlinked file with a hole. */
    char path[4096];
    snprintf(path, sizeof path, "%s/holey.bin", dir);
    int holey = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (holey < 0)
        return 2;
    fill(buf, BLOCK, 3);
    if (pwrite(holey, buf, BLOCK, 0) != BLOCK)
        return 2;
    fill(buf, BLOCK, 4);
    if (pwrite(holey, buf, BLOCK, HOLE_AT) != BLOCK)
        return 2;
    unlink(path);

    /* The datagram from a sender closed since. */
    snprintf(path, sizeof path, "%s/dgram.sock", dir);
    unlink(path);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sun.sun_path) {
        fprintf(stderr, "%s: too long for a socket's name\n", path);
        return 2;
    }
    memcpy(sun.sun_path, path, strlen(path) + 1);
    int rx = socket(AF_UNIX, SOCK_DGRAM, 0), tx = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (rx < 0 || tx < 0 || bind(rx, (struct sockaddr *)&sun, sizeof sun))
        return 2;
    const char datagram[] = "from a sender gone";
    if (sendto(tx, datagram, sizeof datagram, 0, (struct sockaddr *)&sun, sizeof sun) != sizeof datagram)
        return 2;
    close(tx);

    /* The read lease. */
    snprintf(path, sizeof path, "%s/lease.dat", dir);
    int lf = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (lf < 0)
        return 2;
    close(lf);
    int lease = open(path, O_RDONLY);
    if (lease < 0 || fcntl(lease, F_SETLEASE, F_RDLCK))
        return 2;

    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        h = mix64(h ^ (uint64_t)i);
        sleep_ms(STEP_MS);
    }

    /* Every part, after the checkpoints and restarts. */
    int flag = 0;
    if (prctl(PR_GET_CHILD_SUBREAPER, &flag) != 0 || flag != 1)
        fail("the child subreaper flag is %d", flag);
    if (fcntl(lease, F_GETLEASE) != F_RDLCK)
        fail("the read lease is %d, not F_RDLCK", fcntl(lease, F_GETLEASE));

    char state[64], line[512] = "";
    snprintf(state, sizeof state, "/proc/%d/stat", (int)stopped);
    FILE *f = fopen(state, "r");
    if (!f || !fgets(line, sizeof line, f))
        fail("cannot read the stopped child's state");
    if (f)
        fclose(f);
    char *st = strrchr(line, ')');
    for (int look = 0; st && st[2] != 'T' && st[2] != 't' && look < 2000; look++) {
        /* Let go by a checkpoint, it runs in the kernel on its way back, for as long as a loaded
         * machine makes it wait for a CPU (stopped.c saw over 50 ms): stopped again within 2 s. */
        sleep_ms(1);
        if ((f = fopen(state, "r"))) {
            if (!fgets(line, sizeof line, f))
                line[0] = 0;
            fclose(f);
        }
        st = strrchr(line, ')');
    }
    if (!st || (st[2] != 'T' && st[2] != 't'))
        fail("the stopped child is not stopped (%s)", line);
    kill(stopped, SIGKILL);
    while (waitpid(stopped, &status, 0) == stopped && !WIFSIGNALED(status))
        ;

    {
        char tag = 0;
        int got = -1;
        struct iovec iov = {.iov_base = &tag, .iov_len = 1};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } ctl;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
        struct cmsghdr *cm;
        if (recvmsg(pair[1], &msg, MSG_DONTWAIT) != 1 || tag != 'p' || !(cm = CMSG_FIRSTHDR(&msg)) || cm->cmsg_type != SCM_RIGHTS) {
            fail("the pipe in flight did not arrive");
        } else {
            memcpy(&got, CMSG_DATA(cm), sizeof got);
            unsigned char back[sizeof first];
            if (write_full(data[1], second, sizeof second))
                fail("cannot write to the pipe after the restarts");
            if (read_full(got, back, sizeof back) || memcmp(back, first, sizeof first))
                fail("the pipe in flight lost what it held");
            else if (read_full(got, back, sizeof back) || memcmp(back, second, sizeof second))
                fail("the pipe in flight is not the one written to");
            h = mix64(h ^ back[0] ^ back[999]);
        }
    }

    unsigned char want[BLOCK];
    fill(want, BLOCK, 3);
    if (pread(holey, buf, BLOCK, 0) != BLOCK || memcmp(buf, want, BLOCK))
        fail("the unlinked file's first block changed");
    fill(want, BLOCK, 4);
    if (pread(holey, buf, BLOCK, HOLE_AT) != BLOCK || memcmp(buf, want, BLOCK))
        fail("the unlinked file's block after the hole changed");
    off_t hole = lseek(holey, 0, SEEK_HOLE), after = lseek(holey, BLOCK, SEEK_DATA);
    if (hole != BLOCK || after != HOLE_AT)
        fail("the unlinked file's hole is not kept: hole at %lld, data again at %lld", (long long)hole, (long long)after);
    struct stat sb;
    if (fstat(holey, &sb) || sb.st_nlink != 0 || sb.st_size != HOLE_AT + BLOCK)
        fail("the unlinked file has %ld links and %lld bytes", (long)sb.st_nlink, (long long)sb.st_size);
    h = mix64(h ^ (uint64_t)sb.st_size);

    char dgram[64];
    struct sockaddr_un from;
    socklen_t fromlen = sizeof from;
    ssize_t n = recvfrom(rx, dgram, sizeof dgram, MSG_DONTWAIT, (struct sockaddr *)&from, &fromlen);
    if (n != (ssize_t)sizeof datagram || memcmp(dgram, datagram, sizeof datagram))
        fail("the datagram from the closed sender is gone (%zd bytes)", n);
    if (recv(rx, dgram, sizeof dgram, MSG_DONTWAIT) != -1 || errno != EAGAIN)
        fail("the datagram socket holds more than it did");

    close(reports[1]);
    for (int k = 0; k < 2; k++) {
        long bad = -1;
        if (io_full(reports[0], &bad, sizeof bad, 0))
            fail("an adopted member did not report");
        else if (bad)
            fail("an adopted member found its parent, group or session changed %ld times", bad);
    }
    if (waitpid(l, &status, 0) != l || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the living session's leader found a child or SIGCHLD it never had (status %#x)", status);
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    return finish(h);
}
