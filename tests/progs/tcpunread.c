/* tcpunread: bytes a peer outside the job sent, and the program had not read at the
 * checkpoint, are still the program's to read after a restart that brings the connection back
 * reset (a connection to the outside does, without --tcp-established): first the bytes, then
 * the reset. (zdtm's socket-tcp-reseted read ECONNRESET in place of its bytes.)
 *
 * Connects to 127.0.0.1:PORT, whose server sends MESSAGE at once and keeps the connection
 * open; prints START once the bytes are there, unread; sleeps SECONDS in steps (the checkpoint,
 * the kill and the restart come then); then reads without waiting: the whole message (FAIL if
 * short or different), then one more read, which says "AFTER RESET" (ECONNRESET), "AFTER
 * CONNECTED" (nothing more yet: an uninterrupted run) or "AFTER EOF". PASS when the message
 * was read whole.
 *
 * Usage: tcpunread PORT [SECONDS=2]
 */
#include "common.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define MESSAGE "sent before the checkpoint, read after the restart"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: tcpunread PORT [SECONDS]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 2);
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s < 0 || connect(s, (struct sockaddr *)&to, sizeof to) != 0) {
        printf("FAIL connect to port %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    struct pollfd p = {.fd = s, .events = POLLIN};
    if (poll(&p, 1, 10000) != 1) {
        printf("FAIL the server's bytes did not come\n");
        return 1;
    }
    start_marker();
    for (long i = 0; i < steps; i++)
        sleep_ms(STEP_MS);
    char got[sizeof MESSAGE];
    size_t have = 0;
    while (have < sizeof MESSAGE - 1) {
        ssize_t n = recv(s, got + have, sizeof MESSAGE - 1 - have, MSG_DONTWAIT);
        if (n <= 0) {
            printf("FAIL after %zu bytes of %zu: %s\n", have, sizeof MESSAGE - 1, n == 0 ? "end of stream" : strerror(errno));
            return 1;
        }
        have += (size_t)n;
    }
    if (memcmp(got, MESSAGE, sizeof MESSAGE - 1) != 0) {
        printf("FAIL the bytes read are not the message\n");
        return 1;
    }
    char more;
    ssize_t n = recv(s, &more, 1, MSG_DONTWAIT);
    if (n < 0 && errno == ECONNRESET)
        printf("AFTER RESET\n");
    else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        printf("AFTER CONNECTED\n");
    else if (n == 0)
        printf("AFTER EOF\n");
    else
        printf("AFTER %s\n", n > 0 ? "more bytes" : strerror(errno));
    return finish(mix64(have));
}
