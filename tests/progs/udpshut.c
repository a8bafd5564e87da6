/* udpshut: UDP sockets shut down with shutdown(2) stay shut through checkpoint/restart (zdtm's
 * socket_udp_shutdown).
 *
 *  - A pair on 127.0.0.1 connected to each other: A shut for sending, B for receiving. Every
 *    step B sends A a datagram, which A must read (a socket shut for receiving still sends, and
 *    one shut for sending still receives), and A's own send must fail with EPIPE.
 *  - An unconnected socket C shut both ways (shutdown says ENOTCONN but marks it): its sends
 *    must fail with EPIPE too.
 * RESULT hashes the datagrams A read; PASS when every check held.
 *
 * Usage: udpshut [SECONDS=4]
 */
#include "common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    int a = socket(AF_INET, SOCK_DGRAM, 0), b = socket(AF_INET, SOCK_DGRAM, 0), c = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in at_a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)}, at_b = at_a;
    socklen_t len = sizeof at_a;
    if (a < 0 || b < 0 || c < 0 || bind(a, (struct sockaddr *)&at_a, sizeof at_a) || getsockname(a, (struct sockaddr *)&at_a, &len) ||
        bind(b, (struct sockaddr *)&at_b, sizeof at_b) || (len = sizeof at_b, getsockname(b, (struct sockaddr *)&at_b, &len)) ||
        connect(a, (struct sockaddr *)&at_b, sizeof at_b) || connect(b, (struct sockaddr *)&at_a, sizeof at_a) || shutdown(a, SHUT_WR) ||
        shutdown(b, SHUT_RD)) {
        printf("setup: %s\n", strerror(errno));
        return 2;
    }
    if (shutdown(c, SHUT_RDWR) == 0 || errno != ENOTCONN) {
        printf("setup: shutdown of an unconnected socket: %s\n", strerror(errno));
        return 2;
    }
    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        uint64_t out = mix64((uint64_t)i), in = 0;
        if (send(b, &out, sizeof out, 0) != sizeof out) {
            fail("step %ld: B, shut for receiving only, could not send: %s", i, strerror(errno));
            break;
        }
        if (recv(a, &in, sizeof in, 0) != sizeof in || in != out) {
            fail("step %ld: A, shut for sending only, did not receive B's datagram: %s", i, strerror(errno));
            break;
        }
        h = mix64(h ^ in);
        if (send(a, &out, sizeof out, MSG_DONTWAIT) >= 0 || errno != EPIPE) {
            fail("step %ld: A, shut for sending, sent (%s)", i, strerror(errno));
            break;
        }
        if (sendto(c, &out, sizeof out, MSG_DONTWAIT, (struct sockaddr *)&at_a, sizeof at_a) >= 0 || errno != EPIPE) {
            fail("step %ld: C, shut both ways, sent (%s)", i, strerror(errno));
            break;
        }
        sleep_ms(STEP_MS);
    }
    return finish(h);
}
