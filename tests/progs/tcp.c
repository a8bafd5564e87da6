/* tcp: TCP connections and UDP sockets between the job's processes survive checkpoint/restart.
 *
 * - Stream A (IPv4 loopback): a child sends numbered, checksummed records as fast as the
 *   connection takes them, each in two writes (records half written at checkpoints); the parent
 *   reads slowly in odd-sized pieces from a non-blocking socket with a small receive buffer
 *   (buffers full, records half read at checkpoints).
 * - Stream B (IPv6 loopback, half-closed): the parent writes a block of records to a second child
 *   and shuts its sending side down at once; the child reads them slowly, must see end of file
 *   right after the last one, and answers with their hash on the same connection.
 * - A listening socket (SO_REUSEADDR) whose connection from a third child waits in the backlog
 *   until a quarter of the run, then is accepted; the child sends records on it and exits at once,
 *   while the parent reads them only at the end (its end holds them, then end of file, with no
 *   process at the other end).
 * - Stream C (IPv4 loopback, both ends the parent's): idle, one end shut for writing at once;
 *   at the end the other must read end of file and send a message the shut end receives.
 * - UDP: the first child sends datagrams of varying length early from a connected socket; the
 *   parent reads them at the end, each once, in order, from the right sender.
 * - Socket options (buffer sizes, TCP_NODELAY, SO_KEEPALIVE and TCP_KEEPIDLE, SO_REUSEADDR,
 *   O_NONBLOCK) are checked at the end.
 * RESULT hashes everything received; PASS if nothing was lost, repeated, damaged or changed.
 *
 * With --peer PORT, it talks instead to an echo server outside the job, on 127.0.0.1:PORT: one
 * record per step, each checked when it comes back. If the connection is reset it prints
 * "PEER RESET" and exits with status 3 (expected after a restart without --tcp-established).
 *
 * Usage: tcp WORKDIR [SECONDS=4]
 *        tcp --peer PORT [SECONDS=4]
 */
#define RECORD_WORDS 6
#include "common.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static void make_rec(struct rec *r, uint64_t seq, uint64_t salt)
{
    r->seq = seq;
    for (int k = 0; k < 6; k++)
        r->payload[k] = mix64(seq * 13 + (uint64_t)k + salt);
    r->sum = rec_sum(r);
}

static int getint(int fd, int level, int name)
{
    int v = -1;
    socklen_t l = sizeof v;
    if (getsockopt(fd, level, name, &v, &l))
        return -1;
    return v;
}

static int setint(int fd, int level, int name, int v)
{
    return setsockopt(fd, level, name, &v, sizeof v);
}

/* A listening socket on the loopback address of `family`, on a port the kernel picks. */
static int listen_on(int family, struct sockaddr_storage *addr, socklen_t *len)
{
    int s = socket(family, SOCK_STREAM, 0);
    if (s < 0)
        return -1;
    memset(addr, 0, sizeof *addr);
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)addr;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        *len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)addr;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        *len = sizeof *a;
    }
    setint(s, SOL_SOCKET, SO_REUSEADDR, 1);
    if (bind(s, (struct sockaddr *)addr, *len) || listen(s, 4) || getsockname(s, (struct sockaddr *)addr, len)) {
        close(s);
        return -1;
    }
    return s;
}

static int connect_to(const struct sockaddr_storage *addr, socklen_t len)
{
    int c = socket(addr->ss_family, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (const struct sockaddr *)addr, len))
        return -1;
    return c;
}

#define DGRAMS 8
#define LATE_RECS 64
#define B_RECS 1000

static size_t dgram_len(int i)
{
    return 1 + (size_t)(mix64((uint64_t)i + 99) % 1200);
}

/* --peer: records to an echo server outside the job and back. */
static int peer_main(int port, long steps)
{
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof sa)) {
        perror("connect to the peer");
        return 2;
    }
    setint(c, IPPROTO_TCP, TCP_NODELAY, 1);
    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        struct rec r, back;
        make_rec(&r, (uint64_t)i, 4);
        if (io_full(c, &r, sizeof r, 1) || io_full(c, &back, sizeof back, 0)) {
            if (errno == ECONNRESET || errno == EPIPE) {
                printf("PEER RESET at record %ld (%s)\n", i, strerror(errno));
                fflush(stdout);
                return 3;
            }
            fail("record %ld: %s", i, strerror(errno));
            break;
        }
        if (memcmp(&r, &back, sizeof r)) {
            fail("record %ld came back changed", i);
            break;
        }
        h = mix64(h ^ back.sum);
        sleep_ms(STEP_MS);
    }
    close(c);
    return finish(h);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc >= 3 && !strcmp(argv[1], "--peer"))
        return peer_main(atoi(argv[2]), steps_arg(argc, argv, 3, 4.0));
    if (argc < 2) {
        fprintf(stderr, "usage: tcp WORKDIR [SECONDS=4]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    long per_step = 40;
    long total = steps * per_step;

    struct sockaddr_storage la, lb;
    socklen_t la_len, lb_len;
    int listen_a = listen_on(AF_INET, &la, &la_len);
    int listen_b = listen_on(AF_INET6, &lb, &lb_len);
    if (listen_b < 0) /* no IPv6 here: the same over IPv4 */
        listen_b = listen_on(AF_INET, &lb, &lb_len);
    if (listen_a < 0 || listen_b < 0) {
        perror("listen");
        return 2;
    }

    /* UDP: the parent receives on u_recv; the first child sends from u_send, connected to it. */
    struct sockaddr_in ua = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_in usa = ua;
    socklen_t ul = sizeof ua;
    int u_recv = socket(AF_INET, SOCK_DGRAM, 0);
    int u_send = socket(AF_INET, SOCK_DGRAM, 0);
    if (u_recv < 0 || u_send < 0 || bind(u_recv, (struct sockaddr *)&ua, ul) || getsockname(u_recv, (struct sockaddr *)&ua, &ul) ||
        bind(u_send, (struct sockaddr *)&usa, ul) || getsockname(u_send, (struct sockaddr *)&usa, &ul) ||
        connect(u_send, (struct sockaddr *)&ua, ul)) {
        perror("udp");
        return 2;
    }

    int bye_pipe[2];
    if (pipe(bye_pipe))
        return 2;

    /* Child 1: stream A sender, and the UDP datagrams. */
    pid_t sender = fork();
    if (sender == 0) {
        close(u_recv);
        int c = connect_to(&la, la_len);
        if (c < 0)
            _exit(3);
        setint(c, IPPROTO_TCP, TCP_NODELAY, 1);
        setint(c, SOL_SOCKET, SO_SNDBUF, 96 * 1024);
        int sndbuf = getint(c, SOL_SOCKET, SO_SNDBUF);
        for (long i = 0; i < total; i++) {
            struct rec r;
            make_rec(&r, (uint64_t)i, 1);
            size_t cut = 1 + (size_t)(i % (sizeof r - 1));
            if (io_full(c, &r, cut, 1) || io_full(c, (char *)&r + cut, sizeof r - cut, 1))
                _exit(4);
            if (i == total / 10) {
                for (int d = 0; d < DGRAMS; d++) {
                    char m[1300];
                    size_t len = dgram_len(d);
                    memset(m, d, len);
                    m[0] = (char)d;
                    if (send(u_send, m, len, 0) != (ssize_t)len)
                        _exit(5);
                }
            }
        }
        /* Wait for the parent to have read everything, then check the options. */
        char b;
        if (io_full(c, &b, 1, 0) || b != 'b')
            _exit(6);
        if (getint(c, IPPROTO_TCP, TCP_NODELAY) != 1 || getint(c, SOL_SOCKET, SO_SNDBUF) != sndbuf)
            _exit(7);
        _exit(0);
    }
    close(u_send);
    int a = accept(listen_a, NULL, NULL);

    /* Child 2: stream B reader (the parent shuts its side down). */
    pid_t reader = fork();
    if (reader == 0) {
        close(bye_pipe[1]);
        close(a);
        close(listen_a);
        close(u_recv);
        int c = connect_to(&lb, lb_len);
        if (c < 0)
            _exit(3);
        uint64_t h = 0;
        for (long i = 0; i < B_RECS; i++) {
            struct rec r;
            if (io_full(c, &r, 29, 0) || io_full(c, (char *)&r + 29, sizeof r - 29, 0))
                _exit(4);
            if (r.seq != (uint64_t)i || r.sum != rec_sum(&r))
                _exit(5);
            h = mix64(h ^ r.sum);
            if (i % 3 == 2)
                sleep_ms(STEP_MS);
        }
        char extra;
        if (read(c, &extra, 1) != 0) /* end of file, right after the last record */
            _exit(6);
        if (io_full(c, &h, sizeof h, 1))
            _exit(7);
        char b;
        if (io_full(bye_pipe[0], &b, 1, 0))
            _exit(8);
        _exit(0);
    }
    close(bye_pipe[0]);
    int b = accept(listen_b, NULL, NULL);

    /* Child 3: connects now, waits in the listener's backlog until the parent accepts it. */
    pid_t late = fork();
    if (late == 0) {
        close(a);
        close(b);
        close(listen_b);
        close(u_recv);
        close(bye_pipe[1]);
        int c = connect_to(&la, la_len);
        if (c < 0)
            _exit(3);
        char q;
        if (io_full(c, &q, 1, 0) || q != 'q')
            _exit(4);
        for (long i = 0; i < LATE_RECS; i++) {
            struct rec r;
            make_rec(&r, (uint64_t)i, 3);
            if (io_full(c, &r, sizeof r, 1))
                _exit(5);
        }
        _exit(0);
    }

    if (a < 0 || b < 0) {
        perror("accept");
        return 2;
    }
    /* Stream C (IPv4 loopback, both ends the parent's): nothing sent on it before the end, one
     * end shut for writing at once (the other in CLOSE_WAIT through the checkpoints): such an
     * end's window has never moved since the handshake. */
    struct sockaddr_storage lc;
    socklen_t lc_len;
    int listen_c = listen_on(AF_INET, &lc, &lc_len);
    int c_shut = listen_c < 0 ? -1 : connect_to(&lc, lc_len);
    int c_open = c_shut < 0 ? -1 : accept(listen_c, NULL, NULL);
    if (c_open < 0 || shutdown(c_shut, SHUT_WR)) {
        perror("stream C");
        return 2;
    }
    close(listen_c);
    setint(a, SOL_SOCKET, SO_RCVBUF, 48 * 1024);
    fcntl(a, F_SETFL, fcntl(a, F_GETFL) | O_NONBLOCK);
    int rcvbuf_a = getint(a, SOL_SOCKET, SO_RCVBUF);
    setint(b, SOL_SOCKET, SO_KEEPALIVE, 1);
    setint(b, IPPROTO_TCP, TCP_KEEPIDLE, 77);

    /* Stream B: everything at once, then no more sending. */
    uint64_t hb = 0;
    for (long i = 0; i < B_RECS; i++) {
        struct rec r;
        make_rec(&r, (uint64_t)i, 2);
        hb = mix64(hb ^ r.sum);
        if (io_full(b, &r, sizeof r, 1)) {
            fail("stream B: write record %ld", i);
            break;
        }
    }
    if (shutdown(b, SHUT_WR))
        fail("shutdown: %s", strerror(errno));

    uint64_t h = 0;
    int late_c = -1;
    /* Stream A, slowly, in odd-sized pieces. */
    for (long i = 0; i < total; i++) {
        struct rec r;
        size_t cut = 1 + (size_t)((i * 7) % (sizeof r - 1));
        if (io_full(a, &r, cut, 0) || io_full(a, (char *)&r + cut, sizeof r - cut, 0)) {
            fail("stream A closed early at record %ld", i);
            break;
        }
        if (r.seq != (uint64_t)i || r.sum != rec_sum(&r)) {
            fail("stream A record %ld arrived as %llu (or damaged)", i, (unsigned long long)r.seq);
            break;
        }
        h = mix64(h ^ r.sum);
        if (i % per_step == 0)
            sleep_ms(STEP_MS);
        if (i == total / 4) {
            late_c = accept(listen_a, NULL, NULL);
            char q = 'q';
            if (late_c < 0 || io_full(late_c, &q, 1, 1))
                fail("the connection waiting in the backlog: %s", strerror(errno));
        }
    }

    /* The late connection's records. */
    for (long i = 0; late_c >= 0 && i < LATE_RECS; i++) {
        struct rec r;
        if (io_full(late_c, &r, sizeof r, 0) || r.seq != (uint64_t)i || r.sum != rec_sum(&r)) {
            fail("late connection: record %ld", i);
            break;
        }
        h = mix64(h ^ r.sum);
    }
    char k;
    if (late_c >= 0 && read(late_c, &k, 1) != 0)
        fail("late connection: no end of file after the last record");

    /* Stream B's answer: the hash of what the reader got, after its end of file. */
    uint64_t got_hb = 0;
    if (io_full(b, &got_hb, sizeof got_hb, 0) || got_hb != hb)
        fail("stream B: the reader's hash %016llx, expected %016llx", (unsigned long long)got_hb, (unsigned long long)hb);
    h = mix64(h ^ hb);

    /* The datagrams, queued since early in the run. */
    for (int d = 0; d < DGRAMS; d++) {
        char m[1300];
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(u_recv, m, sizeof m, MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
        if (n != (ssize_t)dgram_len(d) || m[0] != (char)d || from.sin_port != usa.sin_port) {
            fail("datagram %d: %zd bytes, first byte %d, from port %d", d, n, n > 0 ? m[0] : -1, ntohs(from.sin_port));
            break;
        }
        h = mix64(h ^ (uint64_t)n);
    }
    char extra[8];
    if (recv(u_recv, extra, sizeof extra, MSG_DONTWAIT) >= 0)
        fail("an extra datagram");

    char cbuf[4];
    if (read(c_open, cbuf, 1) != 0)
        fail("stream C: no end of file where the other end shut its side");
    if (write(c_open, "idle", 4) != 4 || io_full(c_shut, cbuf, 4, 0) || memcmp(cbuf, "idle", 4))
        fail("stream C: the open end's message did not come");

    /* Options as they were set. */
    if (getint(a, SOL_SOCKET, SO_RCVBUF) != rcvbuf_a || !(fcntl(a, F_GETFL) & O_NONBLOCK))
        fail("stream A: receive buffer %d (was %d) or O_NONBLOCK lost", getint(a, SOL_SOCKET, SO_RCVBUF), rcvbuf_a);
    if (getint(b, SOL_SOCKET, SO_KEEPALIVE) != 1 || getint(b, IPPROTO_TCP, TCP_KEEPIDLE) != 77)
        fail("stream B: keepalive options lost");
    if (getint(listen_a, SOL_SOCKET, SO_REUSEADDR) != 1 || getint(listen_a, SOL_SOCKET, SO_ACCEPTCONN) != 1)
        fail("listening socket: options lost");

    char bye = 'b';
    if (io_full(a, &bye, 1, 1) || io_full(bye_pipe[1], &bye, 1, 1))
        fail("bye");
    int st;
    pid_t kids[3] = {sender, reader, late};
    const char *names[3] = {"sender", "reader", "late client"};
    for (int i = 0; i < 3; i++)
        if (waitpid(kids[i], &st, 0) != kids[i] || !WIFEXITED(st) || WEXITSTATUS(st))
            fail("%s status %#x", names[i], st);
    return finish(h);
}
