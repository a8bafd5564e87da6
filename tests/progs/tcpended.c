/* tcpended: TCP connections that ended with bytes the program had not read, or with a reset it
 * had not been told of, come back so (both ends in the program: the peer's end is gone).
 *
 *  - reset: the peer sends "to-reset" and closes with SO_LINGER 0 (a reset); the program must
 *    read the bytes, then fail with ECONNRESET once, then read end of file;
 *  - reset, nothing unread: the read fails with ECONNRESET;
 *  - ended: the peer sends "to-ended" and closes; the program shuts its side too (the connection
 *    is over, in CLOSE, the bytes still queued): it must read the bytes, then end of file, and
 *    a write must fail with EPIPE;
 *  - closed: the peer sends "to-closed" and closes; the program has not shut its side (its end
 *    waits in CLOSE_WAIT, the peer's is gone): it must read the bytes, then end of file.
 * All is set up before the checkpoints and read after. RESULT depends only on the steps; PASS
 * when every check held.
 *
 * Usage: tcpended [SECONDS=4]
 */
#include "common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>

static int lst;

/* A connection: returns the program's end, `*peer` the other. */
static int connection(int *peer)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    getsockname(lst, (struct sockaddr *)&a, &len);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a))
        exit(2);
    *peer = accept(lst, NULL, NULL);
    if (*peer < 0)
        exit(2);
    return c;
}

static int state_of(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    return getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) ? -1 : ti.tcpi_state;
}

/* Reads what is left: the bytes, then the outcome (0 end of file, or -errno). */
static int read_rest(int fd, char *buf, size_t cap, ssize_t *got)
{
    *got = recv(fd, buf, cap, MSG_DONTWAIT);
    if (*got < 0)
        return -errno;
    return 1;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    signal(SIGPIPE, SIG_IGN);
    lst = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lst, (struct sockaddr *)&a, sizeof a) || listen(lst, 8))
        return 2;
    struct linger now = {1, 0};

    int p1, reset = connection(&p1);
    if (write(p1, "to-reset", 8) != 8 || setsockopt(p1, SOL_SOCKET, SO_LINGER, &now, sizeof now))
        return 2;
    close(p1);
    int p2, bare = connection(&p2);
    setsockopt(p2, SOL_SOCKET, SO_LINGER, &now, sizeof now);
    close(p2);
    int p3, ended = connection(&p3);
    if (write(p3, "to-ended", 8) != 8)
        return 2;
    close(p3);
    int p4, closed = connection(&p4);
    if (write(p4, "to-closed", 9) != 9)
        return 2;
    close(p4);
    sleep_ms(50);
    shutdown(ended, SHUT_WR);
    close(lst);
    sleep_ms(50);
    if (state_of(reset) != TCP_CLOSE || state_of(bare) != TCP_CLOSE || state_of(ended) != TCP_CLOSE) {
        printf("setup: states %d %d %d, not all CLOSE\n", state_of(reset), state_of(bare), state_of(ended));
        return 2;
    }
    if (state_of(closed) != TCP_CLOSE_WAIT) {
        printf("setup: the closed connection in state %d, not CLOSE_WAIT\n", state_of(closed));
        return 2;
    }

    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        h = mix64(h ^ (uint64_t)s);
        sleep_ms(STEP_MS);
    }

    char buf[64];
    ssize_t got;
    if (read_rest(reset, buf, sizeof buf, &got) != 1 || got != 8 || memcmp(buf, "to-reset", 8))
        fail("the reset connection's bytes: %zd (%s)", got, strerror(errno));
    int r = read_rest(reset, buf, sizeof buf, &got);
    if (r != -ECONNRESET)
        fail("after its bytes, the reset connection gives %d, not ECONNRESET", r);
    r = read_rest(reset, buf, sizeof buf, &got);
    if (r != 1 || got != 0)
        fail("after the reset, a read gives %d (%zd bytes), not end of file", r, got);
    r = read_rest(bare, buf, sizeof buf, &got);
    if (r != -ECONNRESET)
        fail("the reset connection with nothing unread gives %d, not ECONNRESET", r);
    if (read_rest(ended, buf, sizeof buf, &got) != 1 || got != 8 || memcmp(buf, "to-ended", 8))
        fail("the ended connection's bytes: %zd", got);
    r = read_rest(ended, buf, sizeof buf, &got);
    if (r != 1 || got != 0)
        fail("after its bytes, the ended connection gives %d (%zd bytes), not end of file", r, got);
    if (write(ended, "x", 1) != -1 || errno != EPIPE)
        fail("a write on the ended connection did not fail with EPIPE (%s)", strerror(errno));
    if (read_rest(closed, buf, sizeof buf, &got) != 1 || got != 9 || memcmp(buf, "to-closed", 9))
        fail("the closed connection's bytes: %zd", got);
    r = read_rest(closed, buf, sizeof buf, &got);
    if (r != 1 || got != 0)
        fail("after its bytes, the closed connection gives %d (%zd bytes), not end of file", r, got);
    return finish(h);
}
