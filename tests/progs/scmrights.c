/* scmrights: messages carrying descriptors (SCM_RIGHTS) left unread in Unix sockets survive
 * checkpoint/restart: every message arrives once, in order, and the descriptors it carries work.
 *
 * A child sends, at the start, twelve messages to its parent over three socketpairs (stream,
 * datagram, seqpacket), a fourth (stream) whose end the child then closes, and an unbound datagram
 * socket, closed after, to the parent's datagram socket bound to an abstract name; eight carry
 * descriptors:
 * - the read end of a data pipe, which the child then closes (in flight only, until the parent
 *   receives it) and keeps writing numbered records into, before and after the checkpoints;
 * - a regular file opened at offset FILE_POS, which the child then closes: the copies in four
 *   messages are one open file description, so the offset the parent moves by one at each receipt
 *   is seen by the next copy;
 * - the write end of a back pipe, which the child keeps too: the parent writes a token into it
 *   when it receives it, and the child checks the tokens arrive, in order.
 * The parent reads one message every few steps, in a fixed order across the sockets (most after
 * the checkpoints), and checks its bytes, the kinds of the descriptors it carries, and what they
 * do (a message from the unbound sender must show no sender address); once all are read, every
 * socket must be empty (the one whose peer is closed at end of file). The data pipe must deliver
 * every record once and in order, then end of file when the child exits.
 * RESULT hashes everything received; PASS if everything checked out.
 *
 * With `eventfd`: one process sends itself an eventfd (counter 7) over a datagram socketpair,
 * closes it, and receives it only at the end: a kind a checkpoint refuses in flight when no
 * process holds it; the program must go on as if nothing happened.
 *
 * Usage: scmrights WORKDIR [SECONDS=5] [eventfd]
 */
#include "common.h"

#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#define FILE_LEN 4096
#define FILE_POS 1000
#define RECORD_EVERY 10 /* steps between the data pipe's records */

enum carried { NONE, DATA, FILE_, BACK };
/* GONE: a stream pair whose other end the child closes; NAMED: the bound datagram socket. */
enum { STREAM, DGRAM, SEQPACKET, GONE, NAMED, NSOCK };
static const char *sock_names[NSOCK] = {"stream", "datagram", "seqpacket", "stream whose peer is closed", "bound datagram"};

struct msg {
    int sock;
    const char *text;
    enum carried fds[2];
};

/* In the order the child sends them (per socket, this is the order they are queued). */
static const struct msg msgs[] = {
    {STREAM, "S0: the data pipe", {DATA, NONE}},
    {STREAM, "S1: the file and the back pipe", {FILE_, BACK}},
    {DGRAM, "D0: nothing", {NONE, NONE}},
    {DGRAM, "D1: the file", {FILE_, NONE}},
    {DGRAM, "D2: nothing again", {NONE, NONE}},
    {DGRAM, "D3: the back pipe and the data pipe", {BACK, DATA}},
    {SEQPACKET, "Q0: the file", {FILE_, NONE}},
    {SEQPACKET, "Q1: nothing", {NONE, NONE}},
    {SEQPACKET, "Q2: the data pipe", {DATA, NONE}},
    {GONE, "G0: the data pipe and the file, from a closed end", {DATA, FILE_}},
    {NAMED, "N0: the back pipe, from an unbound sender", {BACK, NONE}},
    {NAMED, "N1: nothing, from an unbound sender", {NONE, NONE}},
};
#define NMSGS (int)(sizeof msgs / sizeof msgs[0])

/* The order the parent reads them in (indexes into msgs), each socket's in its queue order. */
static const int read_order[NMSGS] = {2, 6, 3, 7, 0, 9, 4, 10, 1, 8, 11, 5};
/* The tokens the back pipe must deliver: the messages carrying it, in the order read. */
static const uint64_t tokens_expected[] = {10, 1, 5};
#define NTOKENS (int)(sizeof tokens_expected / sizeof tokens_expected[0])

static unsigned char file_byte(size_t k)
{
    return (unsigned char)mix64(k * 7919 + 3);
}

static int send_msg(int s, const struct msg *m, const int *fds_of)
{
    int fds[2], n = 0;
    for (int k = 0; k < 2; k++)
        if (m->fds[k] != NONE)
            fds[n++] = fds_of[m->fds[k]];
    struct iovec iov = {(void *)m->text, strlen(m->text)};
    union {
        char buf[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } control;
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n > 0) {
        h.msg_control = control.buf;
        h.msg_controllen = CMSG_SPACE(n * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&h);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(n * sizeof(int));
        memcpy(CMSG_DATA(c), fds, n * sizeof(int));
    }
    return sendmsg(s, &h, 0) == (ssize_t)iov.iov_len ? 0 : -1;
}

/* The child: sends the messages, then writes the data pipe's records and reads the tokens. */
static int child(const char *path, int socks[NSOCK], const struct sockaddr_un *name, socklen_t name_len, int ready, long steps)
{
    int data[2], back[2];
    if (pipe(data) || pipe2(back, O_NONBLOCK)) {
        perror("pipe");
        return 2;
    }
    int file = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    unsigned char content[FILE_LEN];
    for (size_t k = 0; k < FILE_LEN; k++)
        content[k] = file_byte(k);
    if (file < 0 || write(file, content, FILE_LEN) != FILE_LEN || lseek(file, FILE_POS, SEEK_SET) != FILE_POS) {
        perror(path);
        return 2;
    }
    int fds_of[4] = {-1, data[0], file, back[1]};
    /* An unbound socket connected to the parent's name sends to it. */
    socks[NAMED] = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (socks[NAMED] < 0 || connect(socks[NAMED], (const struct sockaddr *)name, name_len)) {
        perror("connect to the bound datagram socket");
        return 2;
    }
    for (int i = 0; i < NMSGS; i++)
        if (send_msg(socks[msgs[i].sock], &msgs[i], fds_of)) {
            fprintf(stderr, "send message %d: %s\n", i, strerror(errno));
            return 2;
        }
    /* In flight only from now on: the data pipe's read end and the file. */
    close(data[0]);
    close(file);
    close(socks[GONE]);
    close(socks[NAMED]);
    if (write(ready, "r", 1) != 1)
        return 2;
    close(ready);

    uint64_t seq = 0;
    int tokens = 0;
    for (long step = 1; step <= steps; step++) {
        if (step % RECORD_EVERY == 0) {
            if (write_full(data[1], &seq, sizeof seq)) {
                fail("child: write record %llu into the data pipe: %s", (unsigned long long)seq, strerror(errno));
                return 1;
            }
            seq++;
        }
        uint64_t token;
        ssize_t n = read(back[0], &token, sizeof token);
        if (n == (ssize_t)sizeof token) {
            uint64_t want = tokens < NTOKENS ? tokens_expected[tokens] : ~0ULL;
            if (token != want)
                fail("child: token %d from the back pipe is %llu, expected %llu", tokens, (unsigned long long)token, (unsigned long long)want);
            tokens++;
        } else if (n >= 0 || errno != EAGAIN) {
            fail("child: read the back pipe: returned %zd (%s)", n, n < 0 ? strerror(errno) : "short");
        }
        sleep_ms(STEP_MS);
    }
    if (tokens != NTOKENS)
        fail("child: %d tokens came through the back pipe, expected %d", tokens, NTOKENS);
    close(data[1]);
    return failures ? 1 : 0;
}

/* What the parent holds and checks of the descriptors it received. */
struct state {
    int data;          /* the data pipe's read end, once received */
    uint64_t next_seq; /* the next record the data pipe must deliver */
    int ended;         /* the data pipe gave end of file */
    int files;         /* copies of the file received */
    uint64_t hash;      /* the messages and the file's bytes, in the order read */
    uint64_t data_hash; /* the data pipe's records, apart: when they are read is up to timing */
};

static void check_fd(struct state *st, const char *what, enum carried kind, int fd, int msg_index)
{
    struct stat sb, held;
    if (fstat(fd, &sb)) {
        fail("%s: fstat: %s", what, strerror(errno));
        return;
    }
    switch (kind) {
    case DATA:
        if (!S_ISFIFO(sb.st_mode) || (fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDONLY) {
            fail("%s: not a pipe's read end (mode %o)", what, (unsigned)sb.st_mode);
        } else if (st->data < 0) {
            st->data = fd;
            fcntl(fd, F_SETFL, O_NONBLOCK);
            return;
        } else if (fstat(st->data, &held) || sb.st_ino != held.st_ino) {
            /* (A restart makes the pipe anew: its inode number is not what it was.) */
            fail("%s: another pipe than the data pipe received before", what);
        } else if (!(fcntl(fd, F_GETFL) & O_NONBLOCK)) {
            fail("%s: not the open file description received before (not O_NONBLOCK)", what);
        }
        break;
    case FILE_: {
        off_t want = FILE_POS + st->files;
        off_t pos = lseek(fd, 0, SEEK_CUR);
        if (!S_ISREG(sb.st_mode) || sb.st_size != FILE_LEN)
            fail("%s: not the file (mode %o, size %lld)", what, (unsigned)sb.st_mode, (long long)sb.st_size);
        else if (pos != want)
            fail("%s: the file's offset is %lld, expected %lld (one description, moved by one per copy)", what, (long long)pos, (long long)want);
        unsigned char got[64];
        size_t at = (size_t)(st->files * 997) % (FILE_LEN - sizeof got);
        if (pread(fd, got, sizeof got, (off_t)at) != (ssize_t)sizeof got) {
            fail("%s: pread: %s", what, strerror(errno));
        } else {
            for (size_t k = 0; k < sizeof got; k++)
                if (got[k] != file_byte(at + k)) {
                    fail("%s: byte %zu of the file is wrong", what, at + k);
                    break;
                }
            for (size_t k = 0; k < sizeof got; k++)
                st->hash = mix64(st->hash ^ got[k]);
        }
        lseek(fd, 1, SEEK_CUR);
        st->files++;
        break;
    }
    case BACK: {
        uint64_t token = (uint64_t)msg_index;
        if (!S_ISFIFO(sb.st_mode) || (fcntl(fd, F_GETFL) & O_ACCMODE) != O_WRONLY)
            fail("%s: not a pipe's write end", what);
        else if (write(fd, &token, sizeof token) != (ssize_t)sizeof token)
            fail("%s: write a token: %s", what, strerror(errno));
        break;
    }
    case NONE:
        break;
    }
    close(fd);
}

/* Reads message msgs[i] from its socket and checks it and what it carries. */
static void receive(struct state *st, int socks[NSOCK], int i)
{
    const struct msg *m = &msgs[i];
    char buf[128];
    size_t len = strlen(m->text);
    union {
        char buf[CMSG_SPACE(8 * sizeof(int))];
        struct cmsghdr align;
    } control;
    int stream = m->sock == STREAM || m->sock == GONE;
    struct iovec iov = {buf, stream ? len : sizeof buf};
    struct sockaddr_un from;
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf, .msg_controllen = sizeof control.buf};
    if (m->sock == NAMED) {
        h.msg_name = &from;
        h.msg_namelen = sizeof from;
    }
    ssize_t n;
    do
        n = recvmsg(socks[m->sock], &h, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)len || memcmp(buf, m->text, len) != 0) {
        fail("%s message %d: read %zd bytes (%s), expected \"%s\"", sock_names[m->sock], i, n, n < 0 ? strerror(errno) : "other bytes", m->text);
        return;
    }
    if (h.msg_flags & (MSG_CTRUNC | MSG_TRUNC))
        fail("%s message %d: truncated (flags %#x)", sock_names[m->sock], i, h.msg_flags);
    if (m->sock == NAMED && h.msg_namelen > sizeof(sa_family_t))
        fail("\"%s\": from an address of %u bytes, not an unbound sender", m->text, (unsigned)h.msg_namelen);
    int fds[8], nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int j = 0; j < k && nfds < 8; j++)
            memcpy(&fds[nfds++], CMSG_DATA(c) + j * sizeof(int), sizeof(int));
    }
    int want = (m->fds[0] != NONE) + (m->fds[1] != NONE);
    if (nfds != want) {
        fail("\"%s\": %d descriptors arrived, expected %d", m->text, nfds, want);
        for (int j = 0; j < nfds; j++)
            close(fds[j]);
        return;
    }
    for (int j = 0; j < nfds; j++) {
        char what[96];
        snprintf(what, sizeof what, "\"%s\", descriptor %d", m->text, j);
        check_fd(st, what, m->fds[j], fds[j], i);
    }
    for (size_t k = 0; k < len; k++)
        st->hash = mix64(st->hash ^ (unsigned char)buf[k] ^ ((uint64_t)want << 40));
}

/* Reads what the data pipe holds now; at the end, until end of file. */
static void drain_data(struct state *st, int to_end)
{
    if (st->data < 0 || st->ended)
        return;
    for (;;) {
        uint64_t seq;
        ssize_t n = read(st->data, &seq, sizeof seq);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            if (!to_end)
                return;
            struct pollfd p = {.fd = st->data, .events = POLLIN};
            poll(&p, 1, 1000);
            continue;
        }
        if (n == 0) {
            /* The child closes its end once it has written every record (the count is checked
             * at the end). */
            st->ended = 1;
            return;
        }
        if (n != (ssize_t)sizeof seq) {
            fail("the data pipe: read %zd bytes (%s)", n, n < 0 ? strerror(errno) : "a piece of a record");
            return;
        }
        if (seq != st->next_seq) {
            fail("the data pipe delivered record %llu where %llu was expected", (unsigned long long)seq, (unsigned long long)st->next_seq);
            st->next_seq = seq;
        }
        st->next_seq++;
        st->data_hash = mix64(st->data_hash ^ seq ^ 0xda7a);
    }
}

/* The `eventfd` mode: an eventfd only a message holds, received at the end. */
static int eventfd_in_flight(long steps)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv)) { /* 3 receives, 4 sends */
        perror("socketpair");
        return 2;
    }
    int efd = eventfd(7, 0);
    if (efd < 0) {
        perror("eventfd");
        return 2;
    }
    int fds_of[4] = {-1, efd, -1, -1};
    struct msg m = {DGRAM, "an eventfd", {DATA, NONE}};
    if (send_msg(sv[1], &m, fds_of)) {
        perror("send the eventfd");
        return 2;
    }
    close(efd);
    for (long step = 1; step <= steps; step++)
        sleep_ms(STEP_MS);
    char buf[32];
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {buf, sizeof buf};
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf, .msg_controllen = sizeof control.buf};
    ssize_t n = recvmsg(sv[0], &h, MSG_DONTWAIT);
    struct cmsghdr *c = CMSG_FIRSTHDR(&h);
    uint64_t count = 0;
    int got = -1;
    if (n == (ssize_t)strlen(m.text) && c && c->cmsg_type == SCM_RIGHTS)
        memcpy(&got, CMSG_DATA(c), sizeof got);
    if (got < 0 || read(got, &count, sizeof count) != (ssize_t)sizeof count || count != 7)
        fail("the eventfd in flight: message of %zd bytes, descriptor %d, counter %llu (expected 7)", n, got, (unsigned long long)count);
    return finish(count);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: scmrights WORKDIR [SECONDS=5]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 5.0);
    signal(SIGPIPE, SIG_IGN);
    if (argc > 3 && strcmp(argv[3], "eventfd") == 0)
        return eventfd_in_flight(steps);
    char path[4096];
    snprintf(path, sizeof path, "%s/scm-file", argv[1]);

    int pairs[NSOCK][2];
    int types[NSOCK] = {SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET, SOCK_STREAM};
    for (int s = 0; s < NAMED; s++)
        if (socketpair(AF_UNIX, types[s], 0, pairs[s])) {
            perror("socketpair");
            return 2;
        }
    struct sockaddr_un name = {.sun_family = AF_UNIX};
    /* Its pid and a tag of the run: a pid alone is not the run's own (a job's pid namespace
     * numbers from 1, and the suite's runs share the machine's namespace). */
    snprintf(name.sun_path + 1, sizeof name.sun_path - 1, "ckpt-scmrights-%d-%016llx", (int)getpid(),
             (unsigned long long)mix64((uint64_t)now_ns(CLOCK_REALTIME) ^ (uint64_t)getpid()));
    socklen_t name_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name.sun_path + 1));
    pairs[NAMED][0] = socket(AF_UNIX, SOCK_DGRAM, 0);
    pairs[NAMED][1] = -1;
    if (pairs[NAMED][0] < 0 || bind(pairs[NAMED][0], (struct sockaddr *)&name, name_len)) {
        perror("bind the datagram socket");
        return 2;
    }
    /* The child sends before the parent reads anything: its messages are queued at once. */
    int ready[2];
    if (pipe(ready)) {
        perror("pipe");
        return 2;
    }
    pid_t pid = fork();
    if (pid == 0) {
        int socks[NSOCK];
        for (int s = 0; s < NSOCK; s++) {
            close(pairs[s][0]);
            socks[s] = pairs[s][1];
        }
        close(ready[0]);
        int rc = child(path, socks, &name, name_len, ready[1], steps);
        _exit(rc);
    }
    int socks[NSOCK];
    for (int s = 0; s < NSOCK; s++) {
        if (pairs[s][1] >= 0)
            close(pairs[s][1]);
        socks[s] = pairs[s][0];
    }
    close(ready[1]);
    char r;
    if (read(ready[0], &r, 1) != 1) {
        fprintf(stderr, "the child did not send its messages\n");
        return 2;
    }
    close(ready[0]);

    struct state st = {.data = -1};
    /* One message each `every` steps, the last well before the end. */
    long every = steps / (NMSGS + 2);
    if (every < 1)
        every = 1;
    int next = 0;
    for (long step = 1; step <= steps; step++) {
        if (step % every == 0 && next < NMSGS)
            receive(&st, socks, read_order[next++]);
        if (next == NMSGS) {
            next++;
            for (int s = 0; s < NSOCK; s++) {
                char b[8];
                ssize_t n = recv(socks[s], b, sizeof b, MSG_DONTWAIT);
                if (s == GONE ? n != 0 : n != -1 || errno != EAGAIN)
                    fail("%s: a read after the last message returned %zd (%s), expected %s", sock_names[s], n, n < 0 ? strerror(errno) : "a message more", s == GONE ? "0, end of file" : "EAGAIN");
            }
        }
        drain_data(&st, 0);
        sleep_ms(STEP_MS);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child failed (status %#x)", status);
    drain_data(&st, 1);
    uint64_t records = (uint64_t)(steps / RECORD_EVERY);
    if (st.data < 0)
        fail("the data pipe never arrived");
    else if (st.next_seq != records)
        fail("the data pipe delivered %llu records, expected %llu", (unsigned long long)st.next_seq, (unsigned long long)records);
    if (st.files != 4)
        fail("%d copies of the file arrived, expected 4", st.files);
    return finish(mix64(st.hash ^ st.data_hash));
}
