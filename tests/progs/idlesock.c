/* idlesock: many idle Unix socketpairs, and a few with data in flight, survive checkpoint/restart:
 * each end still connected to its own peer, with its options, flags and queued messages.
 *
 * - PAIRS socketpairs (stream, datagram and seqpacket in turn), most of them idle; some with
 *   options changed (SO_RCVBUF, SO_SNDBUF, SO_PASSCRED, SO_PASSSEC, O_NONBLOCK, close-on-exec), some stream
 *   pairs with one end shut for writing, some datagram pairs holding a zero-length datagram (which
 *   sock_diag counts as an empty queue), some holding a short message; a flock(2) and a POSIX
 *   lock held through two of them.
 * - One stream pair holding 200 KiB.
 * - A child process with few descriptors holding one end of every tenth pair; it echoes what it
 *   receives. (The parent has hundreds of descriptors and the child a few: capture reads them in
 *   its two ways.)
 * - A second child holding every descriptor of the parent, which ignores SIGTRAP (capture may not
 *   ask it from inside, and reads its many descriptors from /proc).
 * - The parent has a SIGTRAP handler of its own, which must still be there, never called.
 * The program sleeps in steps (checkpoints land there), then checks every pair: options as set,
 * queued data first and whole, then a message each way. RESULT hashes what was received; PASS if
 * everything checked out.
 *
 * Usage: idlesock [SECONDS=4] [PAIRS=400]
 */
#include "common.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIG_LEN (200 * 1024)

struct pair {
    int type;
    int end[2];
    /* What each end showed right after setup: F_GETFD, F_GETFL, SO_RCVBUF, SO_SNDBUF, SO_PASSCRED,
     * SO_PASSSEC. */
    int opts[2][6];
    int child;    /* end[1] is the child's */
    int shut;     /* end[0] shut for writing */
    int empty_dg; /* a zero-length datagram queued at end[0] */
    int queued;   /* a short message queued at end[0] */
};

static int opt(int fd, int name)
{
    int v = -1;
    socklen_t len = sizeof v;
    getsockopt(fd, SOL_SOCKET, name, &v, &len);
    return v;
}

static void options_of(int fd, int out[6])
{
    out[0] = fcntl(fd, F_GETFD);
    out[1] = fcntl(fd, F_GETFL);
    out[2] = opt(fd, SO_RCVBUF);
    out[3] = opt(fd, SO_SNDBUF);
    out[4] = opt(fd, SO_PASSCRED);
    out[5] = opt(fd, SO_PASSSEC);
}

static void set_opt(int fd, int name, int v)
{
    if (setsockopt(fd, SOL_SOCKET, name, &v, sizeof v))
        fail("setsockopt %d: %s", name, strerror(errno));
}

static volatile sig_atomic_t traps;

static void on_trap(int sig)
{
    (void)sig;
    traps++;
}

/* Whether /proc/self/fdinfo/FD lists a lock of this kind ("FLOCK", "POSIX"). */
static int holds_lock(int fd, const char *kind)
{
    char path[64], text[4096];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    int f = open(path, O_RDONLY);
    if (f < 0)
        return 0;
    ssize_t n = read(f, text, sizeof text - 1);
    close(f);
    text[n > 0 ? n : 0] = 0;
    return strstr(text, kind) != NULL;
}

static uint64_t big_byte(size_t i)
{
    return mix64(i / 8) >> (8 * (i % 8));
}

/* The child: echoes every message on its sockets until it reads "quit"; a socket whose options
 * changed echoes the message altered. */
static void echo_forever(struct pair *p, long n)
{
    struct pollfd *fds = calloc((size_t)n, sizeof *fds);
    long *idx = calloc((size_t)n, sizeof *idx);
    nfds_t k = 0;
    for (long i = 0; i < n; i++)
        if (p[i].child) {
            fds[k].fd = p[i].end[1];
            fds[k].events = POLLIN;
            idx[k++] = i;
        }
    for (;;) {
        if (poll(fds, k, -1) < 0) {
            if (errno == EINTR)
                continue;
            _exit(3);
        }
        for (nfds_t j = 0; j < k; j++) {
            if (!(fds[j].revents & POLLIN))
                continue;
            char m[64];
            ssize_t got = recv(fds[j].fd, m, sizeof m, MSG_DONTWAIT);
            if (got < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (got == 4 && !memcmp(m, "quit", 4))
                _exit(0);
            int now[6];
            options_of(fds[j].fd, now);
            if (memcmp(now, p[idx[j]].opts[1], sizeof now) || opt(fds[j].fd, SO_TYPE) != p[idx[j]].type)
                m[0] ^= 1;
            if (got <= 0 || send(fds[j].fd, m, (size_t)got, MSG_NOSIGNAL) != got)
                _exit(4);
        }
    }
}

/* Receives exactly `len` bytes (one message on a datagram or seqpacket socket). */
static ssize_t recv_all(int fd, void *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = recv(fd, (char *)buf + done, len - done, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            poll(&pfd, 1, 1000);
            continue;
        }
        if (n <= 0)
            return n;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    long n = argc > 2 ? atol(argv[2]) : 400;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    struct sigaction trap = {.sa_handler = on_trap};
    sigaction(SIGTRAP, &trap, NULL);

    static const int types[3] = {SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET};
    struct pair *p = calloc((size_t)n, sizeof *p);
    for (long i = 0; i < n; i++) {
        p[i].type = types[i % 3];
        if (socketpair(AF_UNIX, p[i].type | (i % 4 == 0 ? SOCK_CLOEXEC : 0), 0, p[i].end)) {
            fprintf(stderr, "socketpair %ld: %s\n", i, strerror(errno));
            return 2;
        }
        if (i % 7 == 0)
            set_opt(p[i].end[0], SO_RCVBUF, 100000 + (int)i * 8);
        if (i % 6 == 1)
            set_opt(p[i].end[1], SO_SNDBUF, 150000 + (int)i * 8);
        if (i % 11 == 2)
            set_opt(p[i].end[0], SO_PASSCRED, 1);
        if (i % 8 == 3)
            set_opt(p[i].end[1], SO_PASSSEC, 1);
        if (i % 5 == 3)
            fcntl(p[i].end[1], F_SETFL, O_NONBLOCK);
        p[i].shut = p[i].type == SOCK_STREAM && i % 17 == 8;
        p[i].child = i % 10 == 9 && !p[i].shut;
        p[i].empty_dg = p[i].type == SOCK_DGRAM && i % 9 == 4;
        p[i].queued = !p[i].shut && !p[i].empty_dg && i % 13 == 5;
        if (p[i].shut)
            shutdown(p[i].end[0], SHUT_WR);
        if (p[i].empty_dg && send(p[i].end[1], "", 0, 0) != 0)
            fail("zero-length datagram on pair %ld: %s", i, strerror(errno));
        if (p[i].queued) {
            char m[32];
            int len = snprintf(m, sizeof m, "queued %ld", i);
            if (send(p[i].end[1], m, (size_t)len, 0) != len)
                fail("queue on pair %ld: %s", i, strerror(errno));
        }
        options_of(p[i].end[0], p[i].opts[0]);
        options_of(p[i].end[1], p[i].opts[1]);
    }

    struct flock range = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 10};
    if (flock(p[0].end[0], LOCK_EX) || fcntl(p[1].end[0], F_SETLK, &range))
        fail("lock a socket: %s", strerror(errno));

    int big[2];
    int room = 2 * BIG_LEN;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, big) || setsockopt(big[0], SOL_SOCKET, SO_SNDBUF, &room, sizeof room))
        return 2;
    char *buf = malloc(BIG_LEN);
    for (size_t i = 0; i < BIG_LEN; i++)
        buf[i] = (char)big_byte(i);
    if (send(big[0], buf, BIG_LEN, MSG_DONTWAIT) != BIG_LEN) {
        fprintf(stderr, "fill the big pair: %s\n", strerror(errno));
        return 2;
    }

    pid_t holder = fork();
    if (holder == 0) {
        signal(SIGTRAP, SIG_IGN);
        for (;;)
            pause();
    }

    pid_t child = fork();
    if (child == 0) {
        /* Only the child's ends (and stdio) stay open here. */
        for (long i = 0; i < n; i++) {
            close(p[i].end[0]);
            if (!p[i].child)
                close(p[i].end[1]);
        }
        close(big[0]);
        close(big[1]);
        echo_forever(p, n);
    }
    for (long i = 0; i < n; i++)
        if (p[i].child)
            close(p[i].end[1]);

    for (long s = 0; s < steps; s++)
        sleep_ms(STEP_MS);

    uint64_t h = 0;
    /* Options and flags as they were set. */
    for (long i = 0; i < n; i++)
        for (int e = 0; e < 2; e++) {
            if (e == 1 && p[i].child)
                continue;
            int now[6];
            options_of(p[i].end[e], now);
            if (memcmp(now, p[i].opts[e], sizeof now))
                fail("pair %ld end %d: FD %#x FL %#x RCVBUF %d SNDBUF %d PASSCRED %d PASSSEC %d, was %#x %#x %d %d %d %d", i,
                     e, now[0], now[1], now[2], now[3], now[4], now[5], p[i].opts[e][0], p[i].opts[e][1],
                     p[i].opts[e][2], p[i].opts[e][3], p[i].opts[e][4], p[i].opts[e][5]);
            if (opt(p[i].end[e], SO_TYPE) != p[i].type)
                fail("pair %ld end %d: type %d", i, e, opt(p[i].end[e], SO_TYPE));
        }
    if (!holds_lock(p[0].end[0], "FLOCK") || !holds_lock(p[1].end[0], "POSIX"))
        fail("the locks held through sockets are gone");
    /* Queued data first, whole. */
    ssize_t got = recv_all(big[1], buf, BIG_LEN);
    size_t bad = 0;
    for (size_t i = 0; got == BIG_LEN && i < BIG_LEN; i++)
        bad += buf[i] != (char)big_byte(i);
    if (got != BIG_LEN || bad)
        fail("big pair: %zd bytes, %zu wrong", got, bad);
    h = mix64(h ^ (uint64_t)got);
    char extra;
    if (recv(big[1], &extra, 1, MSG_DONTWAIT) != -1)
        fail("big pair: more than was sent");
    for (long i = 0; i < n; i++) {
        char m[64];
        if (p[i].empty_dg) {
            ssize_t r = recv(p[i].end[0], m, sizeof m, MSG_DONTWAIT);
            if (r != 0)
                fail("pair %ld: the zero-length datagram came as %zd (%s)", i, r, r < 0 ? strerror(errno) : "bytes");
        }
        if (p[i].queued) {
            char want[32];
            int len = snprintf(want, sizeof want, "queued %ld", i);
            ssize_t r = recv_all(p[i].end[0], m, (size_t)len);
            if (r != len || memcmp(m, want, (size_t)len))
                fail("pair %ld: queued message came as %zd bytes", i, r);
            h = mix64(h ^ (uint64_t)r);
        }
    }
    /* A message each way: each end is still connected to its own peer. */
    for (long i = 0; i < n; i++) {
        uint64_t token = mix64((uint64_t)i), back = 0;
        for (int dir = 0; dir < 2; dir++) {
            if (dir == 0 && p[i].shut)
                continue;
            if (p[i].child && dir == 1)
                continue;
            int from = p[i].end[dir], to = p[i].end[1 - dir];
            if (send(from, &token, sizeof token, MSG_NOSIGNAL) != sizeof token) {
                fail("pair %ld: send: %s", i, strerror(errno));
                continue;
            }
            /* The child echoes it on the same socket. */
            int at = p[i].child ? from : to;
            back = 0;
            ssize_t r = recv_all(at, &back, sizeof back);
            if (r != sizeof back || back != token)
                fail("pair %ld direction %d: got %zd bytes %llx", i, dir, r, (unsigned long long)back);
            h = mix64(h ^ back);
        }
        if (p[i].shut) {
            ssize_t r = recv(p[i].end[1], &back, sizeof back, MSG_DONTWAIT);
            if (r != 0)
                fail("pair %ld: the end shut for writing did not show end of file (%zd)", i, r);
        }
    }

    struct sigaction now;
    sigaction(SIGTRAP, NULL, &now);
    if (now.sa_handler != on_trap || traps)
        fail("the SIGTRAP handler changed or ran (%d times)", (int)traps);
    kill(holder, SIGTERM);
    int hst;
    if (waitpid(holder, &hst, 0) != holder || !WIFSIGNALED(hst) || WTERMSIG(hst) != SIGTERM)
        fail("holder status %#x", hst);

    int quit_sent = 0;
    for (long i = 0; i < n && !quit_sent; i++)
        if (p[i].child) {
            quit_sent = send(p[i].end[0], "quit", 4, MSG_NOSIGNAL) == 4;
        }
    int st;
    if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("echo child status %#x", st);
    return finish(h);
}
