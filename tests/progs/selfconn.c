/* selfconn: datagram sockets connected to themselves (bound, then connect(2) to their own name,
 * as zdtm's sockets_dgram does: a loopback queue a program posts to and reads from), one bound
 * to a path in WORKDIR, one to an abstract name. Each step sends the next numbered datagram to
 * itself and reads the oldest one back, keeping QUEUED datagrams in each queue all along, so
 * that every checkpoint finds some in flight. Every datagram must come back once, in order,
 * with its bytes, and getpeername must stay the socket's own name. RESULT hashes the numbers
 * read; PASS if everything checked out.
 *
 * Usage: selfconn WORKDIR [SECONDS=4]
 */
#include "common.h"

#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

#define QUEUED 4
#define NSOCKS 2

static int socks[NSOCKS];
static struct sockaddr_un names[NSOCKS];
static socklen_t name_lens[NSOCKS];
static uint64_t sent[NSOCKS], got[NSOCKS];

static void send_next(int k)
{
    uint64_t msg[4] = {sent[k], mix64(sent[k]), (uint64_t)k, ~sent[k]};
    if (send(socks[k], msg, sizeof msg, MSG_DONTWAIT) != (ssize_t)sizeof msg) {
        fail("socket %d: send %llu: %s", k, (unsigned long long)sent[k], strerror(errno));
        return;
    }
    sent[k]++;
}

static uint64_t read_oldest(int k)
{
    uint64_t msg[4];
    ssize_t n = recv(socks[k], msg, sizeof msg, MSG_DONTWAIT);
    if (n != (ssize_t)sizeof msg) {
        fail("socket %d: expected datagram %llu, read %zd (%s)", k, (unsigned long long)got[k], n, n < 0 ? strerror(errno) : "short");
        return 0;
    }
    if (msg[0] != got[k] || msg[1] != mix64(got[k]) || msg[2] != (uint64_t)k || msg[3] != ~got[k])
        fail("socket %d: expected datagram %llu, read %llu", k, (unsigned long long)got[k], (unsigned long long)msg[0]);
    return got[k]++;
}

static void check_peer(long step, int k)
{
    struct sockaddr_un peer;
    socklen_t len = sizeof peer;
    if (getpeername(socks[k], (struct sockaddr *)&peer, &len) != 0)
        fail("step %ld: socket %d: getpeername: %s", step, k, strerror(errno));
    else if (len != name_lens[k] || memcmp(&peer, &names[k], len) != 0)
        fail("step %ld: socket %d is connected to another name than its own", step, k);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: selfconn WORKDIR [SECONDS]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    for (int k = 0; k < NSOCKS; k++) {
        names[k].sun_family = AF_UNIX;
        if (k == 0)
            snprintf(names[k].sun_path, sizeof names[k].sun_path, "%s/self.sock", argv[1]);
        else
            snprintf(names[k].sun_path + 1, sizeof names[k].sun_path - 1, "ckpt-selfconn-%d", (int)getpid());
        name_lens[k] = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (k == 0 ? strlen(names[k].sun_path) + 1
                                                                                     : 1 + strlen(names[k].sun_path + 1)));
        socks[k] = socket(AF_UNIX, SOCK_DGRAM, 0);
        if (socks[k] < 0 || bind(socks[k], (struct sockaddr *)&names[k], name_lens[k]) != 0 ||
            connect(socks[k], (struct sockaddr *)&names[k], name_lens[k]) != 0) {
            printf("FAIL set-up: socket %d: %s\n", k, strerror(errno));
            return 1;
        }
        for (int q = 0; q < QUEUED; q++)
            send_next(k);
    }
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        for (int k = 0; k < NSOCKS; k++) {
            send_next(k);
            h = mix64(h ^ read_oldest(k));
            if (s % 50 == 0)
                check_peer(s, k);
        }
        sleep_ms(STEP_MS);
    }
    for (int k = 0; k < NSOCKS; k++) {
        for (int q = 0; q < QUEUED; q++)
            h = mix64(h ^ read_oldest(k));
        char extra;
        if (recv(socks[k], &extra, 1, MSG_DONTWAIT) >= 0)
            fail("socket %d: a datagram more than was sent", k);
    }
    unlink(names[0].sun_path);
    return finish(h);
}
