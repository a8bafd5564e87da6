/* unixshut: Unix socket pairs shut down with shutdown(2) stay shut through checkpoint/restart
 * (zdtm's sockets01).
 *
 *  - Stream pair SU, end 0 shut for receiving: 0 writes to 1, 1 cannot write (EPIPE).
 *  - Stream pair SB, end 0 shut both ways: neither end can write.
 *  - Datagram pair DU, end 0 shut for receiving: 0 sends to 1, 1 cannot send (EPIPE): a
 *    datagram end's shutdown shuts nothing of its peer, unlike a stream end's.
 *  - Datagram pair DB, end 0 shut both ways: neither end can send.
 *  - Datagram pair DD, end 0 sent a datagram, then shut for sending: it cannot send more, and
 *    the datagram is read at the end, whole.
 *  - Stream pair SE and seqpacket pair QE, end 0 shut for receiving before it connected to a
 *    listener whose accept made end 1 (zdtm's sockets03): end 1 is left unshut, yet cannot
 *    write (EPIPE); 0 writes to 1.
 * Every step checks each of these. RESULT hashes what was read; PASS when every check held.
 *
 * Usage: unixshut [SECONDS=4]
 */
#include "common.h"

#include <signal.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

static int pair(int type, int p[2], int how0)
{
    return socketpair(AF_UNIX, type, 0, p) || (how0 >= 0 && shutdown(p[0], how0));
}

/* A pair whose end 0 was shut for receiving before it connected to a listener (an abstract
 * name of this process's), end 1 the accepted connection. */
static int early_pair(int type, int p[2])
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "unixshut-%d-%d", (int)getpid(), type);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a.sun_path + 1));
    int l = socket(AF_UNIX, type, 0);
    p[0] = socket(AF_UNIX, type, 0);
    if (l < 0 || p[0] < 0 || bind(l, (struct sockaddr *)&a, len) || listen(l, 1) || shutdown(p[0], SHUT_RD) ||
        connect(p[0], (struct sockaddr *)&a, len))
        return -1;
    p[1] = accept(l, NULL, NULL);
    close(l);
    return p[1] < 0;
}

/* Whether a send from `fd` fails with EPIPE. */
static int refused(int fd)
{
    char c = 'x';
    return send(fd, &c, 1, MSG_DONTWAIT) < 0 && errno == EPIPE;
}

/* Sends a byte from `from` and reads it at `to`. */
static int carries(int from, int to, uint64_t *h)
{
    char c = 'a' + (char)(*h % 26), got = 0;
    if (send(from, &c, 1, MSG_DONTWAIT) != 1 || recv(to, &got, 1, MSG_DONTWAIT) != 1 || got != c)
        return 0;
    *h = mix64(*h ^ (uint64_t)got);
    return 1;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    signal(SIGPIPE, SIG_IGN);
    int su[2], sb[2], du[2], db[2], dd[2], se[2], qe[2];
    const char msg[] = "sent before the shutdown";
    if (pair(SOCK_STREAM, su, SHUT_RD) || pair(SOCK_STREAM, sb, SHUT_RDWR) || pair(SOCK_DGRAM, du, SHUT_RD) || pair(SOCK_DGRAM, db, SHUT_RDWR) ||
        pair(SOCK_DGRAM, dd, -1) || send(dd[0], msg, sizeof msg, 0) != sizeof msg || shutdown(dd[0], SHUT_WR) ||
        early_pair(SOCK_STREAM, se) || early_pair(SOCK_SEQPACKET, qe)) {
        printf("setup: %s\n", strerror(errno));
        return 2;
    }
    uint64_t h = 0;
    for (long i = 0; i < steps && !failures; i++) {
        if (!carries(su[0], su[1], &h))
            fail("step %ld: SU: end 0, shut for receiving only, could not write to end 1", i);
        if (!refused(su[1]))
            fail("step %ld: SU: end 1 wrote to end 0, which is shut for receiving", i);
        if (!refused(sb[0]) || !refused(sb[1]))
            fail("step %ld: SB: an end of a pair shut both ways wrote", i);
        if (!carries(du[0], du[1], &h))
            fail("step %ld: DU: end 0, shut for receiving only, could not send to end 1", i);
        if (!refused(du[1]))
            fail("step %ld: DU: end 1 sent to end 0, which is shut for receiving", i);
        if (!refused(db[0]) || !refused(db[1]))
            fail("step %ld: DB: an end of a datagram pair shut both ways sent", i);
        if (!refused(dd[0]))
            fail("step %ld: DD: end 0, shut for sending, sent", i);
        if (!carries(se[0], se[1], &h) || !carries(qe[0], qe[1], &h))
            fail("step %ld: SE/QE: end 0, shut for receiving before it connected, could not write to end 1", i);
        if (!refused(se[1]) || !refused(qe[1]))
            fail("step %ld: SE/QE: end 1 wrote to end 0, shut for receiving before it connected", i);
        sleep_ms(STEP_MS);
    }
    char got[sizeof msg] = {0};
    if (recv(dd[1], got, sizeof got, MSG_DONTWAIT) != sizeof msg || memcmp(got, msg, sizeof msg))
        fail("DD: the datagram sent before the shutdown did not arrive whole (%s)", strerror(errno));
    h = mix64(h ^ (uint64_t)got[0]);
    return finish(h);
}
