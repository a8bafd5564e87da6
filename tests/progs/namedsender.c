/* namedsender: a datagram socket bound to an abstract name holds, unread across the checkpoints,
 * datagrams from senders of every kind, interleaved; each must come back in order, with its
 * bytes and the address recvfrom reports for its sender:
 * - A: bound to an abstract name, open all along;
 * - B: bound to a path name (in WORKDIR), open all along;
 * - C: bound to an abstract name, closed once it has sent;
 * - D: bound to a path name, closed once it has sent, its socket file removed;
 * - E: bound to an abstract name and connected to the receiver (not connected back), open;
 * - U: unbound (recvfrom reports no address), closed once it has sent.
 * Some messages carry a pipe's read end (SCM_RIGHTS); the receiver checks it is that pipe.
 * The receiver reads one message every few steps, some before the checkpoints and the rest
 * after, then expects nothing more. Afterwards A, B and E still work: each sends one more
 * datagram (E with send(), to the socket it is connected to), which must come from its name, and
 * receives a reply sent to its name; C's name is free to
 * bind again and D's path is gone (the restart's own sockets left nothing behind).
 * RESULT hashes every byte read; PASS if everything checked out.
 *
 * Usage: namedsender WORKDIR [SECONDS=5]
 */
#include "common.h"

#include <fcntl.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

/* A receiver not connected back takes at most net.unix.max_dgram_qlen + 1 (10 + 1 by default)
 * datagrams before its senders block. */
#define MSGS 10

enum { A, B, C, D, E, U, NSENDERS };
static const char *who[NSENDERS] = {"A", "B", "C", "D", "E", "U"};
static struct sockaddr_un names[NSENDERS];
static socklen_t name_lens[NSENDERS];
static int senders[NSENDERS];

/* The sender of message k, and whether it carries the pipe. */
static int sender_of(int k)
{
    static const int order[MSGS] = {U, A, B, E, C, U, D, B, C, E};
    return order[k];
}

static int carries(int k)
{
    return k == 1 || k == 3 || k == 4 || k == 5 || k == 7;
}

static int msg_text(int k, char *buf, size_t len)
{
    return snprintf(buf, len, "message %d from %s (%d)", k, who[sender_of(k)], k * 7919 % 1000);
}

/* Tells apart the abstract names of jobs that run at once: each job's pid may be the same (its
 * own pid namespace) while the network namespace, and so the abstract names, are shared. */
static uint64_t run_tag;

static socklen_t abstract_name(struct sockaddr_un *a, const char *what)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "ckpt-namedsender-%s-%d-%016llx", what, (int)getpid(), (unsigned long long)run_tag);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a->sun_path + 1));
}

static socklen_t path_name(struct sockaddr_un *a, const char *dir, const char *what)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    if ((size_t)snprintf(a->sun_path, sizeof a->sun_path, "%s/ns-%s-%d", dir, what, (int)getpid()) >= sizeof a->sun_path) {
        fprintf(stderr, "the work directory's path is too long for a socket name\n");
        exit(2);
    }
    unlink(a->sun_path);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(a->sun_path) + 1);
}

/* Whether the address recvfrom gave (`from`, `len` bytes) is sender s's name. */
static int from_is(const struct sockaddr_un *from, socklen_t len, int s)
{
    if (s == U)
        return len <= sizeof(sa_family_t);
    return len == name_lens[s] && memcmp(from->sun_path, names[s].sun_path, len - offsetof(struct sockaddr_un, sun_path)) == 0;
}

static void show(const struct sockaddr_un *a, socklen_t len, char *out, size_t size)
{
    size_t n = len > sizeof(sa_family_t) ? len - sizeof(sa_family_t) : 0;
    size_t o = 0;
    for (size_t i = 0; i < n && o + 2 < size; i++)
        out[o++] = a->sun_path[i] ? a->sun_path[i] : '@';
    out[o] = 0;
}

/* The pipe whose read end some messages carry; the program keeps its write end. */
static int pipe_w = -1;

/* Receives one datagram on `sock`, expecting `want` from sender s (and the pipe's read end when
 * `piped`: a byte written to the pipe is read from it); hashes its bytes. */
static void receive(int sock, const char *what, const char *want, int s, int piped, uint64_t *hash)
{
    char m[128];
    struct sockaddr_un from;
    uint64_t cbuf[8];
    struct iovec iov = {.iov_base = m, .iov_len = sizeof m};
    struct msghdr h = {.msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    memset(&from, 0, sizeof from);
    ssize_t n = recvmsg(sock, &h, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    int fds = 0, fd = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            fds += (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            memcpy(&fd, CMSG_DATA(c), sizeof fd);
        }
    if (n != (ssize_t)strlen(want) || memcmp(m, want, strlen(want)) != 0) {
        fail("%s: read %zd bytes (%.*s), not \"%s\"", what, n, n > 0 ? (int)n : 0, m, want);
    } else if (!from_is(&from, h.msg_namelen, s)) {
        char got[128], exp[128];
        show(&from, h.msg_namelen, got, sizeof got);
        show(&names[s], name_lens[s], exp, sizeof exp);
        fail("%s: from \"%s\" (%u bytes), not %s \"%s\"", what, got, (unsigned)h.msg_namelen, who[s], s == U ? "" : exp);
    }
    if (piped) {
        unsigned char b = (unsigned char)n, got = 0;
        if (fds != 1 || fcntl(fd, F_SETFL, O_NONBLOCK) != 0 || write(pipe_w, &b, 1) != 1 || read(fd, &got, 1) != 1 || got != b)
            fail("%s: carries %d descriptors, not the pipe's read end (%s)", what, fds, strerror(errno));
    } else if (fds != 0) {
        fail("%s: carries %d descriptors, none sent", what, fds);
    }
    if (fd >= 0)
        close(fd);
    for (ssize_t b = 0; b < n; b++)
        *hash = mix64(*hash ^ (uint8_t)m[b]);
}

static void send_from(int s, int sock, const struct sockaddr_un *to, socklen_t to_len, const char *m, int pass)
{
    struct iovec iov = {.iov_base = (void *)m, .iov_len = strlen(m)};
    union {
        struct cmsghdr c;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr h = {.msg_name = (void *)to, .msg_namelen = to_len, .msg_iov = &iov, .msg_iovlen = 1};
    if (pass >= 0) {
        h.msg_control = u.buf;
        h.msg_controllen = sizeof u.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&h);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pass, sizeof pass);
    }
    if (sendmsg(sock, &h, 0) != (ssize_t)strlen(m)) {
        fprintf(stderr, "sendmsg from %s: %s\n", who[s], strerror(errno));
        exit(2);
    }
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: namedsender WORKDIR [SECONDS]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 5.0);
    for (const char *c = argv[1]; *c; c++)
        run_tag = mix64(run_tag ^ (uint8_t)*c);

    struct sockaddr_un recv_name;
    socklen_t recv_len = abstract_name(&recv_name, "recv");
    int recv_sock = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (recv_sock < 0 || bind(recv_sock, (struct sockaddr *)&recv_name, recv_len) != 0) {
        perror("the receiver");
        return 2;
    }
    name_lens[A] = abstract_name(&names[A], "a");
    name_lens[B] = path_name(&names[B], argv[1], "b");
    name_lens[C] = abstract_name(&names[C], "c");
    name_lens[D] = path_name(&names[D], argv[1], "d");
    name_lens[E] = abstract_name(&names[E], "e");
    for (int s = 0; s < NSENDERS; s++) {
        senders[s] = socket(AF_UNIX, SOCK_DGRAM, 0);
        if (senders[s] < 0 || (s != U && bind(senders[s], (struct sockaddr *)&names[s], name_lens[s]) != 0)) {
            fprintf(stderr, "sender %s: %s\n", who[s], strerror(errno));
            return 2;
        }
    }
    if (connect(senders[E], (struct sockaddr *)&recv_name, recv_len) != 0) {
        perror("connect E");
        return 2;
    }
    int pipefd[2];
    if (pipe(pipefd) != 0) {
        perror("pipe");
        return 2;
    }
    for (int k = 0; k < MSGS; k++) {
        char m[64];
        msg_text(k, m, sizeof m);
        send_from(sender_of(k), senders[sender_of(k)], &recv_name, recv_len, m, carries(k) ? pipefd[0] : -1);
    }
    /* Only the messages hold the read end; C, D and U are gone (D's socket file too). */
    close(pipefd[0]);
    pipe_w = pipefd[1];
    close(senders[C]);
    close(senders[D]);
    close(senders[U]);
    unlink(names[D].sun_path);

    long every = steps / (MSGS + 4);
    if (every < 1)
        every = 1;
    uint64_t hash = 0;
    int next = 0;
    for (long step = 1; step <= steps && next < MSGS; step++) {
        if (step % every == 0) {
            char want[64], what[32];
            msg_text(next, want, sizeof want);
            snprintf(what, sizeof what, "message %d", next);
            receive(recv_sock, what, want, sender_of(next), carries(next), &hash);
            next++;
        }
        sleep_ms(STEP_MS);
    }
    if (next < MSGS)
        fail("%d messages read of %d", next, MSGS);
    char m[64];
    ssize_t extra = recv(recv_sock, m, sizeof m, MSG_DONTWAIT);
    if (extra != -1 || errno != EAGAIN)
        fail("a read after the last message returned %zd (%s), expected EAGAIN", extra, extra < 0 ? strerror(errno) : "-");

    /* The live senders still work, both ways. */
    static const int live[] = {A, B, E};
    for (size_t i = 0; i < sizeof live / sizeof live[0]; i++) {
        int s = live[i];
        char want[64], what[32];
        snprintf(want, sizeof want, "more from %s", who[s]);
        if (s == E) {
            if (send(senders[E], want, strlen(want), MSG_DONTWAIT) != (ssize_t)strlen(want))
                fail("E: send to the socket it is connected to: %s", strerror(errno));
        } else {
            send_from(s, senders[s], &recv_name, recv_len, want, -1);
        }
        snprintf(what, sizeof what, "afterwards, %s", who[s]);
        receive(recv_sock, what, want, s, 0, &hash);
        snprintf(want, sizeof want, "reply to %s", who[s]);
        if (sendto(recv_sock, want, strlen(want), 0, (struct sockaddr *)&names[s], name_lens[s]) != (ssize_t)strlen(want))
            fail("reply to %s: %s", who[s], strerror(errno));
        ssize_t n = recv(senders[s], m, sizeof m, MSG_DONTWAIT);
        if (n != (ssize_t)strlen(want) || memcmp(m, want, (size_t)n) != 0)
            fail("%s: the reply read %zd bytes, not \"%s\"", who[s], n, want);
        for (ssize_t b = 0; b < n; b++)
            hash = mix64(hash ^ (uint8_t)m[b]);
    }
    int again = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (bind(again, (struct sockaddr *)&names[C], name_lens[C]) != 0)
        fail("C's name cannot be bound again: %s", strerror(errno));
    close(again);
    if (access(names[D].sun_path, F_OK) == 0 || errno != ENOENT)
        fail("D's path %s is there after its sender closed and removed it", names[D].sun_path);
    unlink(names[B].sun_path);
    return finish(hash);
}
