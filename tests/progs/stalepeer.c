/* stalepeer: Unix sockets whose peer every process has closed survive checkpoint/restart: the
 * messages still queued come back, then what the kernel gives a socket whose peer is gone.
 *
 * For each type (stream, seqpacket, datagram) a socketpair; MSGS messages are sent to end 0,
 * then end 1 is closed (as DMTCP's stale-fd test does). A second stream pair also sends to end 1
 * before it is closed, so the kernel marks end 0 as reset (ECONNRESET once the queue is read).
 * The program reads one message of every socket every few steps, some before the checkpoints and
 * the rest after, and checks at every step what poll says; after the last message it expects:
 * - stream and seqpacket: read 0 (end of file) exactly after the last byte, POLLIN|POLLHUP|
 *   POLLRDHUP, a write failing with EPIPE (SIGPIPE is ignored); the reset stream first fails a
 *   read with ECONNRESET (poll showing POLLERR until then), once.
 * - datagram: nothing to read (EAGAIN) and no POLLHUP, a send failing with ECONNREFUSED, once,
 *   then with ENOTCONN (the kernel disconnects the socket).
 * And a datagram socket bound to an abstract name, holding MSGS datagrams an unbound socket sent
 * it before it was closed: each must come back in order, from an unbound sender (recvfrom gives
 * no address), then nothing more.
 * RESULT hashes every byte read; PASS if everything checked out.
 *
 * Usage: stalepeer [SECONDS=5]
 */
#include "common.h"

#include <signal.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

#define MSGS 8

struct sock {
    const char *name;
    int type;
    int reset; /* the closed end had data unread */
    int fd;
    int next; /* messages read so far */
};

static struct sock socks[] = {
    {"stream", SOCK_STREAM, 0, -1, 0},
    {"seqpacket", SOCK_SEQPACKET, 0, -1, 0},
    {"datagram", SOCK_DGRAM, 0, -1, 0},
    {"reset stream", SOCK_STREAM, 1, -1, 0},
};
#define NSOCKS (sizeof socks / sizeof socks[0])

/* Message i of socket s: 1 + (i * 37 + s * 11) % 200 bytes, each derived from (s, i, offset). */
static size_t msg_len(size_t s, int i)
{
    return 1 + (size_t)(i * 37 + s * 11) % 200;
}

static void msg_fill(size_t s, int i, unsigned char *buf)
{
    for (size_t k = 0; k < msg_len(s, i); k++)
        buf[k] = (unsigned char)mix64(s * 1000003 + (uint64_t)i * 1009 + k);
}

static short revents(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLOUT | POLLRDHUP};
    if (poll(&p, 1, 0) < 0)
        return -1;
    return p.revents;
}

/* What poll must say of socket s now. */
static void check_poll(struct sock *s, int step)
{
    short r = revents(s->fd);
    if (s->type == SOCK_DGRAM) {
        short want = (s->next < MSGS ? POLLIN : 0) | POLLOUT;
        if (r != want)
            fail("%s at step %d (%d messages read): poll says %#x, expected %#x", s->name, step, s->next, r, want);
        return;
    }
    short want = POLLIN | POLLOUT | POLLHUP | POLLRDHUP | (s->reset ? POLLERR : 0);
    if (r != want)
        fail("%s at step %d (%d messages read): poll says %#x, expected %#x", s->name, step, s->next, r, want);
}

/* Reads the next message of socket s into the hash. */
static void read_next(size_t i, uint64_t *hash)
{
    struct sock *s = &socks[i];
    unsigned char want[256], got[256];
    size_t len = msg_len(i, s->next);
    msg_fill(i, s->next, want);
    ssize_t n;
    if (s->type == SOCK_STREAM) {
        n = read_full(s->fd, got, len) == 0 ? (ssize_t)len : -1;
    } else {
        do
            n = recv(s->fd, got, sizeof got, MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
    }
    if (n != (ssize_t)len || memcmp(got, want, len) != 0) {
        fail("%s: message %d: read %zd bytes (%s), expected %zu as sent", s->name, s->next, n, n < 0 ? strerror(errno) : "-", len);
        s->next = MSGS;
        return;
    }
    for (size_t k = 0; k < len; k++)
        *hash = mix64(*hash ^ got[k] ^ ((uint64_t)i << 56));
    s->next++;
}

static void expect_errno(const char *name, const char *what, ssize_t n, int want)
{
    if (n != -1 || errno != want)
        fail("%s: %s returned %zd (%s), expected %s", name, what, n, n < 0 ? strerror(errno) : "-", strerror(want));
}

/* After the last message: what a socket whose peer is gone does. */
static void check_end(struct sock *s, uint64_t *hash)
{
    char b[16];
    ssize_t n;
    if (s->type == SOCK_DGRAM) {
        n = recv(s->fd, b, sizeof b, MSG_DONTWAIT);
        expect_errno(s->name, "a read after the last message", n, EAGAIN);
        n = send(s->fd, "x", 1, MSG_DONTWAIT);
        expect_errno(s->name, "the first send", n, ECONNREFUSED);
        n = send(s->fd, "x", 1, MSG_DONTWAIT);
        expect_errno(s->name, "the second send", n, ENOTCONN);
        *hash = mix64(*hash ^ 0xd6);
        return;
    }
    if (s->reset) {
        n = recv(s->fd, b, sizeof b, MSG_DONTWAIT);
        expect_errno(s->name, "the read after the last byte", n, ECONNRESET);
        if (revents(s->fd) & POLLERR)
            fail("%s: poll still says POLLERR after the reset was read", s->name);
    }
    for (int k = 0; k < 2; k++) {
        n = recv(s->fd, b, sizeof b, MSG_DONTWAIT);
        if (n != 0)
            fail("%s: read %d after the last byte returned %zd (%s), expected 0 (end of file)", s->name, k, n, n < 0 ? strerror(errno) : "-");
    }
    n = write(s->fd, "x", 1);
    expect_errno(s->name, "a write", n, EPIPE);
    short r = revents(s->fd);
    if (r != (POLLIN | POLLOUT | POLLHUP | POLLRDHUP))
        fail("%s: poll says %#x at the end, expected POLLIN|POLLOUT|POLLHUP|POLLRDHUP", s->name, r);
    *hash = mix64(*hash ^ (uint64_t)s->type);
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    signal(SIGPIPE, SIG_IGN);

    for (size_t i = 0; i < NSOCKS; i++) {
        struct sock *s = &socks[i];
        int sv[2];
        if (socketpair(AF_UNIX, s->type, 0, sv) < 0) {
            perror("socketpair");
            return 2;
        }
        for (int m = 0; m < MSGS; m++) {
            unsigned char buf[256];
            msg_fill(i, m, buf);
            if (send(sv[1], buf, msg_len(i, m), 0) != (ssize_t)msg_len(i, m)) {
                perror("send");
                return 2;
            }
        }
        if (s->reset && send(sv[0], "unread", 6, 0) != 6) {
            perror("send");
            return 2;
        }
        close(sv[1]);
        s->fd = sv[0];
    }

    /* The bound datagram socket and its closed sender. */
    int bound = socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un name = {.sun_family = AF_UNIX};
    /* Its pid and a tag of the run: a pid alone is not the run's own (a job's pid namespace
     * numbers from 1, and the suite's runs share the machine's namespace). */
    snprintf(name.sun_path + 1, sizeof name.sun_path - 1, "ckpt-stalepeer-%d-%016llx", (int)getpid(),
             (unsigned long long)mix64((uint64_t)now_ns(CLOCK_REALTIME) ^ (uint64_t)getpid()));
    socklen_t name_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name.sun_path + 1));
    int sender = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (bound < 0 || sender < 0 || bind(bound, (struct sockaddr *)&name, name_len) != 0) {
        perror("bound datagram socket");
        return 2;
    }
    for (int k = 0; k < MSGS; k++) {
        char m[32];
        int len = snprintf(m, sizeof m, "from a closed sender %d", k);
        if (sendto(sender, m, (size_t)len, 0, (struct sockaddr *)&name, name_len) != len) {
            perror("sendto");
            return 2;
        }
    }
    close(sender);
    int bound_next = 0;

    /* One message of every socket each `every` steps, the last well before the end. */
    long every = steps / (MSGS + 2);
    if (every < 1)
        every = 1;
    uint64_t hash = 0;
    for (long step = 1; step <= steps; step++) {
        for (size_t i = 0; i < NSOCKS; i++) {
            struct sock *s = &socks[i];
            if (s->next < MSGS)
                check_poll(s, (int)step);
            if (step % every == 0 && s->next < MSGS) {
                read_next(i, &hash);
                if (s->next == MSGS)
                    check_end(s, &hash);
            }
        }
        if (step % every == 0 && bound_next < MSGS) {
            char m[64], want[32];
            struct sockaddr_un from;
            socklen_t from_len = sizeof from;
            ssize_t n = recvfrom(bound, m, sizeof m, MSG_DONTWAIT, (struct sockaddr *)&from, &from_len);
            int want_len = snprintf(want, sizeof want, "from a closed sender %d", bound_next);
            if (n != want_len || memcmp(m, want, (size_t)want_len) != 0)
                fail("bound datagram %d: read %zd bytes, not \"%s\"", bound_next, n, want);
            else if (from_len > sizeof(sa_family_t))
                fail("bound datagram %d: from an address of %u bytes, not an unbound sender", bound_next, (unsigned)from_len);
            for (ssize_t b = 0; b < n; b++)
                hash = mix64(hash ^ (uint8_t)m[b]);
            if (++bound_next == MSGS)
                expect_errno("bound datagram", "a read after the last message", recv(bound, m, sizeof m, MSG_DONTWAIT), EAGAIN);
        }
        sleep_ms(STEP_MS);
    }
    if (bound_next < MSGS)
        fail("bound datagram: %d messages read of %d", bound_next, MSGS);
    for (size_t i = 0; i < NSOCKS; i++)
        if (socks[i].next < MSGS)
            fail("%s: %d messages read of %d", socks[i].name, socks[i].next, MSGS);
    return finish(hash);
}
