/* unixsock: Unix domain sockets with data in flight survive checkpoint/restart.
 *
 * - A stream socketpair: a child sends numbered, checksummed records as fast as the socket takes
 *   them; the parent reads them slowly in odd-sized pieces (half-read records at checkpoints).
 * - A datagram socketpair and a seqpacket socketpair: a child sends numbered messages whose
 *   length depends on their number, every fourth of them empty (zero bytes, a message all the
 *   same); the parent checks every message arrives once, in order, with its boundaries.
 * - A listening socket bound to WORKDIR/sock (re-bound at restart over the stale socket file), with
 *   a connection left waiting in its backlog until the end of the run, then accepted and used.
 * - A stream and a seqpacket socket bound to abstract names and neither connected nor listening
 *   through the run (zdtm's sk-unix-unconn); at the end each listens and takes a connection.
 * RESULT hashes everything received; PASS if nothing was lost, repeated, damaged or merged.
 *
 * Usage: unixsock WORKDIR [SECONDS=4]
 */
#define RECORD_WORDS 5
#include "common.h"

#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static size_t msg_len(long i)
{
    return i % 4 == 3 ? 0 : 8 + (size_t)(mix64((uint64_t)i) % 700);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: unixsock WORKDIR [SECONDS=4]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    long total = steps * 30;
    /* Few enough datagrams to stay under the receive queue's limit (net.unix.max_dgram_qlen, 10
     * by default): they are sent early and read only at the end, so checkpoints find them queued. */
    long msgs = 8;

    int st_pair[2], dg_pair[2], sp_pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, st_pair) || socketpair(AF_UNIX, SOCK_DGRAM, 0, dg_pair) ||
        socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp_pair))
        return 2;

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s/sock", argv[1]);
    unlink(addr.sun_path);
    int listener = socket(AF_UNIX, SOCK_STREAM, 0);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 4)) {
        perror("listener");
        return 2;
    }

    /* Bound, never connected nor listening until the end. */
    int unconn[2];
    struct sockaddr_un unconn_addr[2];
    socklen_t unconn_len[2];
    for (int k = 0; k < 2; k++) {
        unconn_addr[k] = (struct sockaddr_un){.sun_family = AF_UNIX};
        snprintf(unconn_addr[k].sun_path + 1, sizeof unconn_addr[k].sun_path - 1, "unixsock-unconn-%d-%d", (int)getpid(), k);
        unconn_len[k] = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(unconn_addr[k].sun_path + 1));
        unconn[k] = socket(AF_UNIX, k ? SOCK_SEQPACKET : SOCK_STREAM, 0);
        if (unconn[k] < 0 || bind(unconn[k], (struct sockaddr *)&unconn_addr[k], unconn_len[k])) {
            perror("unconnected socket");
            return 2;
        }
    }

    pid_t sender = fork();
    if (sender == 0) {
        close(st_pair[0]);
        close(dg_pair[0]);
        close(sp_pair[0]);
        long next_msg = 0;
        for (long i = 0; i < total; i++) {
            struct rec r = {.seq = (uint64_t)i};
            for (int k = 0; k < 5; k++)
                r.payload[k] = mix64((uint64_t)i * 11 + (uint64_t)k);
            r.sum = rec_sum(&r);
            if (io_full(st_pair[1], &r, sizeof r, 1))
                _exit(3);
            if (i >= total / 8 && i % 7 == 0 && next_msg < msgs) {
                char m[800];
                size_t len = msg_len(next_msg);
                memset(m, (int)(next_msg & 0xff), len);
                if (len)
                    memcpy(m, &next_msg, sizeof next_msg);
                if (send(dg_pair[1], m, len, 0) != (ssize_t)len || send(sp_pair[1], m, len, 0) != (ssize_t)len)
                    _exit(4);
                next_msg++;
            }
        }
        _exit(0);
    }
    close(st_pair[1]);
    close(dg_pair[1]);
    close(sp_pair[1]);

    pid_t client = fork();
    if (client == 0) {
        int c = socket(AF_UNIX, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&addr, sizeof addr))
            _exit(5);
        char b;
        if (io_full(c, &b, 1, 0) || b != 'q')
            _exit(6);
        b = 'a';
        if (io_full(c, &b, 1, 1))
            _exit(7);
        _exit(0);
    }

    uint64_t h = 0;
    long got_msgs = 0;
    for (long i = 0; i < total; i++) {
        struct rec r;
        if (io_full(st_pair[0], &r, 11, 0) || io_full(st_pair[0], (char *)&r + 11, sizeof r - 11, 0)) {
            fail("stream closed early at record %ld", i);
            break;
        }
        if (r.seq != (uint64_t)i || r.sum != rec_sum(&r)) {
            fail("stream record %ld arrived as %llu (or damaged)", i, (unsigned long long)r.seq);
            break;
        }
        h = mix64(h ^ r.sum);
        if (i % 30 == 0)
            sleep_ms(STEP_MS);
    }
    /* The messages queued since early in the run, each exactly once, with its boundaries. */
    for (; got_msgs < msgs; got_msgs++) {
        for (int s = 0; s < 2; s++) {
            char m[800];
            ssize_t n = recv(s == 0 ? dg_pair[0] : sp_pair[0], m, sizeof m, MSG_DONTWAIT);
            long seq = got_msgs;
            if (n >= (ssize_t)sizeof seq)
                memcpy(&seq, m, sizeof seq);
            if (n != (ssize_t)msg_len(got_msgs) || seq != got_msgs) {
                fail("%s message %ld: %zd bytes, seq %ld", s ? "seqpacket" : "datagram", got_msgs, n, seq);
                got_msgs = msgs;
                break;
            }
            h = mix64(h ^ (uint64_t)n);
        }
    }
    int extra;
    if (recv(dg_pair[0], &extra, sizeof extra, MSG_DONTWAIT) >= 0)
        fail("an extra datagram");

    for (int k = 0; k < 2; k++) {
        int l = unconn[k], c = socket(AF_UNIX, k ? SOCK_SEQPACKET : SOCK_STREAM, 0), a = -1;
        char u = 'u';
        if (listen(l, 1) || connect(c, (struct sockaddr *)&unconn_addr[k], unconn_len[k]) || (a = accept(l, NULL, NULL)) < 0 || write(c, &u, 1) != 1 ||
            read(a, &u, 1) != 1)
            fail("the never connected %s socket could not listen and take a connection (%s)", k ? "seqpacket" : "stream", strerror(errno));
        close(c);
        close(a);
    }

    int conn = accept(listener, NULL, NULL);
    char b = 'q';
    if (conn < 0 || io_full(conn, &b, 1, 1) || io_full(conn, &b, 1, 0) || b != 'a')
        fail("the connection waiting in the backlog did not work (%s)", strerror(errno));

    int st;
    if (waitpid(sender, &st, 0) != sender || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("sender status %#x", st);
    if (waitpid(client, &st, 0) != client || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("client status %#x", st);
    unlink(addr.sun_path);
    return finish(h);
}
