/* synsent: a TCP connection caught being established (its SYN sent, no answer yet), as a client
 * retrying a server that is slow to accept. The program listens on 127.0.0.1 with a backlog of
 * 0 and fills the queue with one connection (A) it does not accept: the kernel drops the next
 * SYN, so a second client (B, non-blocking, SOCK_NONBLOCK) stays in SYN_SENT, resending its SYN
 * now and then. For the first 60 % of the run each step checks that A is still queued and B
 * still being established (TCP_INFO); then the program accepts A, waits (poll, 20 s at most)
 * for B to connect on one of its SYNs, accepts it, and sends a number each way on both
 * connections. After a restart B must still be a connection being established, to the same
 * listener, and must complete once there is room. RESULT hashes the steps; PASS if everything
 * checked out.
 *
 * Usage: synsent [SECONDS=4]
 */
#include "common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static int tcp_state(int s)
{
    struct tcp_info info;
    socklen_t len = sizeof info;
    if (getsockopt(s, IPPROTO_TCP, TCP_INFO, &info, &len) != 0)
        return -1;
    return info.tcpi_state;
}

/* Sends a number on `from` and reads it on `to`; 1 if it came through. */
static int carries(int from, int to, uint32_t n)
{
    uint32_t got = 0;
    struct pollfd p = {.fd = to, .events = POLLIN};
    return write(from, &n, sizeof n) == (ssize_t)sizeof n && poll(&p, 1, 5000) == 1 && read(to, &got, sizeof got) == (ssize_t)sizeof got &&
           got == n;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof at;
    if (listener < 0 || bind(listener, (struct sockaddr *)&at, sizeof at) != 0 || listen(listener, 0) != 0 ||
        getsockname(listener, (struct sockaddr *)&at, &len) != 0)
        return printf("FAIL set-up: listener: %s\n", strerror(errno)), 1;
    int a = socket(AF_INET, SOCK_STREAM, 0);
    if (a < 0 || connect(a, (struct sockaddr *)&at, sizeof at) != 0)
        return printf("FAIL set-up: the first connection: %s\n", strerror(errno)), 1;
    int b = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (b < 0 || connect(b, (struct sockaddr *)&at, sizeof at) == 0 || errno != EINPROGRESS)
        return printf("FAIL set-up: the second connection did not wait: %s\n", strerror(errno)), 1;
    sleep_ms(50);
    if (tcp_state(b) != TCP_SYN_SENT)
        return printf("FAIL set-up: the second connection is in state %d, not SYN_SENT\n", tcp_state(b)), 1;
    uint64_t h = 0;
    long waiting_steps = steps * 6 / 10;
    for (long s = 0; s < waiting_steps; s++) {
        if (tcp_state(b) != TCP_SYN_SENT)
            fail("step %ld: the second connection is in state %d, not SYN_SENT", s, tcp_state(b));
        if (tcp_state(a) != TCP_ESTABLISHED)
            fail("step %ld: the first connection is in state %d, not ESTABLISHED", s, tcp_state(a));
        if (fcntl(b, F_GETFL) < 0 || !(fcntl(b, F_GETFL) & O_NONBLOCK))
            fail("step %ld: the second connection's socket is not O_NONBLOCK", s);
        h = mix64(h ^ (uint64_t)s);
        sleep_ms(STEP_MS);
    }
    int served_a = accept(listener, NULL, NULL);
    if (served_a < 0)
        fail("accept the first connection: %s", strerror(errno));
    /* The SYN is sent again 1, 3, 7, 15 s after the first: one gets through now. */
    struct pollfd p = {.fd = b, .events = POLLOUT};
    int err = -1;
    socklen_t elen = sizeof err;
    if (poll(&p, 1, 20000) != 1 || getsockopt(b, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err != 0)
        fail("the second connection did not complete once there was room (poll, SO_ERROR %d: %s)", err, strerror(err > 0 ? err : errno));
    struct sockaddr_in peer, own;
    socklen_t plen = sizeof peer, olen = sizeof own;
    if (getpeername(b, (struct sockaddr *)&peer, &plen) != 0 || peer.sin_port != at.sin_port)
        fail("the second connection is connected to another port than the listener's");
    int served_b = accept(listener, NULL, NULL);
    if (served_b < 0 || getsockname(b, (struct sockaddr *)&own, &olen) != 0)
        fail("accept the second connection: %s", strerror(errno));
    int flags = fcntl(b, F_GETFL);
    fcntl(b, F_SETFL, flags & ~O_NONBLOCK);
    if (served_a >= 0 && (!carries(a, served_a, 1) || !carries(served_a, a, 2)))
        fail("the first connection does not carry bytes");
    if (served_b >= 0 && (!carries(b, served_b, 3) || !carries(served_b, b, 4)))
        fail("the second connection does not carry bytes");
    return finish(h);
}
