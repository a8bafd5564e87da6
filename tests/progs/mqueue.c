/* mqueue: POSIX message queues keep their messages, priorities, attributes, flags, names (or
 * their absence) and notification registrations across checkpoint/restart.
 *
 * Three queues, named after the parent's pid:
 * - "seq" (8 messages of 64 bytes), opened read-write before the fork: one open description
 *   shared by parent and child. The parent sends N numbered messages "m<i>:<hash>" with
 *   priority prio(i), at most 5 ahead of the child's acknowledgements. The child receives one
 *   only when all 5 it may have are queued, so which comes next is fixed (the highest
 *   priority, then the oldest): it predicts each one and checks it. At least 4 messages of
 *   mixed priorities are queued at any moment.
 * - "ack" (10 messages of 32 bytes): the child opens it by name after the fork and acknowledges
 *   every message there; the parent then unlinks it (both still hold it) and reads it through
 *   an O_NONBLOCK descriptor of its own every other step only, so acknowledgements wait in it.
 *   Once it is unlinked, the parent makes another queue of the same name (the "twin", 2
 *   messages of 16 bytes, holding "twin"): an unlinked queue and a live one of one name.
 * - "note": empty, with a SIGEV_SIGNAL notification (SIGUSR1, value 0) the parent registers at
 *   the start. At the end the child opens it by name, checks that it cannot register (the
 *   parent's registration still holds) and sends a message: the parent's handler must run
 *   once, with si_code SI_MESGQ.
 * At the end the parent checks the attributes and flags of its descriptors and that the name
 * of "ack" is gone. RESULT hashes every acknowledgement in order.
 *
 * Usage: mqueue [SECONDS=4] (N is one message per 20 ms)
 */
#include "common.h"

#include <fcntl.h>
#include <mqueue.h>
#include <signal.h>
#include <sys/wait.h>

#define AHEAD 5

static unsigned prio(long i)
{
    return (unsigned)(mix64((uint64_t)i) % 4) * 3; /* 0, 3, 6 or 9 */
}

static volatile sig_atomic_t notified, notified_code, notified_value;

static void on_usr1(int sig, siginfo_t *si, void *ctx)
{
    (void)sig;
    (void)ctx;
    notified++;
    notified_code = si->si_code;
    notified_value = si->si_value.sival_int;
}

static mqd_t open_or_die(const char *name, int flags, long maxmsg, long msgsize)
{
    struct mq_attr a = {.mq_maxmsg = maxmsg, .mq_msgsize = msgsize};
    mqd_t q = mq_open(name, flags, 0640, maxmsg ? &a : NULL);
    if (q == (mqd_t)-1) {
        perror(name);
        exit(2);
    }
    return q;
}

static long curmsgs(mqd_t q)
{
    struct mq_attr a;
    if (mq_getattr(q, &a) != 0) {
        perror("mq_getattr");
        exit(2);
    }
    return a.mq_curmsgs;
}

static void send_retrying(mqd_t q, const char *text, unsigned p)
{
    while (mq_send(q, text, strlen(text) + 1, p) != 0)
        if (errno != EINTR) {
            perror("mq_send");
            exit(2);
        }
}

static ssize_t receive_retrying(mqd_t q, char *buf, size_t len, unsigned *p)
{
    ssize_t r;
    while ((r = mq_receive(q, buf, len, p)) < 0 && errno == EINTR)
        ;
    return r;
}

static void message(long i, char *out, size_t len)
{
    snprintf(out, len, "m%ld:%016llx", i, (unsigned long long)mix64((uint64_t)i ^ 0x5eed));
}

static int child_main(mqd_t seq, const char *ack_name, const char *note_name, long n)
{
    mqd_t ack = open_or_die(ack_name, O_WRONLY, 0, 0);
    send_retrying(ack, "hello", 1);
    long pending[AHEAD], npending = 0, next_sent = 0;
    for (long r = 0; r < n;) {
        long want = n - r < AHEAD ? n - r : AHEAD;
        if (curmsgs(seq) < want) {
            sleep_ms(STEP_MS);
            continue;
        }
        /* The parent has sent every message up to r + want - 1: predict the next one. */
        while (next_sent < r + want)
            pending[npending++] = next_sent++;
        int best = 0;
        for (int k = 1; k < npending; k++)
            if (prio(pending[k]) > prio(pending[best]))
                best = k; /* equal priorities: the older, listed first */
        long expect = pending[best];
        memmove(&pending[best], &pending[best + 1], (size_t)(npending - best - 1) * sizeof pending[0]);
        npending--;

        char buf[64], text[64];
        unsigned p;
        ssize_t got = receive_retrying(seq, buf, sizeof buf, &p);
        message(expect, text, sizeof text);
        if (got != (ssize_t)strlen(text) + 1 || p != prio(expect) || strcmp(buf, text) != 0)
            fail("child: message %ld: got %.63s at priority %u (%zd bytes), expected %s at %u", r,
                 got > 0 ? buf : "nothing", p, got, text, prio(expect));
        char a[32];
        snprintf(a, sizeof a, "a%ld:%u", expect, p);
        send_retrying(ack, a, 1);
        r++;
        sleep_ms(STEP_MS);
    }
    mqd_t note = open_or_die(note_name, O_WRONLY, 0, 0);
    struct sigevent sev = {.sigev_notify = SIGEV_NONE};
    if (mq_notify(note, &sev) == 0 || errno != EBUSY)
        fail("child: could register on the notified queue (errno %d): the parent's registration is gone", errno);
    send_retrying(note, "ring", 0);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    start_marker();
    /* About two steps per message: a receive, then the parent's read of its acknowledgement. */
    long n = steps_arg(argc, argv, 1, 4.0) / 2;
    /* Names of this run's own: a pid alone is not (a job's pid namespace numbers from 1, and
     * several jobs share the machine's queues). */
    unsigned long long tag = mix64((uint64_t)now_ns(CLOCK_REALTIME) ^ (uint64_t)getpid());
    char seq_name[64], ack_name[64], note_name[64];
    snprintf(seq_name, sizeof seq_name, "/ckpt-mq-seq-%016llx", tag);
    snprintf(ack_name, sizeof ack_name, "/ckpt-mq-ack-%016llx", tag);
    snprintf(note_name, sizeof note_name, "/ckpt-mq-note-%016llx", tag);
    mq_unlink(seq_name);
    mq_unlink(ack_name);
    mq_unlink(note_name);

    struct sigaction sa = {.sa_sigaction = on_usr1, .sa_flags = SA_SIGINFO | SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    mqd_t note = open_or_die(note_name, O_CREAT | O_EXCL | O_RDWR, 4, 16);
    struct sigevent sev = {.sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGUSR1};
    if (mq_notify(note, &sev) != 0) {
        perror("mq_notify");
        return 2;
    }
    mqd_t seq = open_or_die(seq_name, O_CREAT | O_EXCL | O_RDWR, 8, 64);
    mqd_t ack = open_or_die(ack_name, O_CREAT | O_EXCL | O_RDONLY | O_NONBLOCK, 10, 32);

    pid_t child = fork();
    if (child == 0) {
        mq_close(ack);
        mq_close(note);
        _exit(child_main(seq, ack_name, note_name, n));
    }

    /* The child has "ack" open once its hello arrives: then its name can go. */
    char buf[32];
    unsigned p;
    while (receive_retrying(ack, buf, sizeof buf, &p) < 0)
        sleep_ms(STEP_MS);
    if (strcmp(buf, "hello") != 0)
        fail("first acknowledgement %.31s, expected hello", buf);
    mq_unlink(ack_name);
    mqd_t twin = open_or_die(ack_name, O_CREAT | O_EXCL | O_RDWR | O_NONBLOCK, 2, 16);
    send_retrying(twin, "twin", 2);

    uint64_t result = 0;
    long sent = 0, acked = 0;
    for (long step = 0; acked < n; step++) {
        if (step % 2 == 1) {
            ssize_t r;
            while ((r = receive_retrying(ack, buf, sizeof buf, &p)) >= 0) {
                long seqno;
                unsigned pr;
                if (sscanf(buf, "a%ld:%u", &seqno, &pr) != 2 || pr != prio(seqno) || p != 1)
                    fail("acknowledgement %ld: %.31s at priority %u", acked, buf, p);
                result = mix64(result ^ (uint64_t)seqno ^ ((uint64_t)pr << 40));
                acked++;
            }
            if (errno != EAGAIN)
                fail("receive an acknowledgement: errno %d, expected EAGAIN", errno);
        }
        for (char text[64]; sent < n && sent < acked + AHEAD; sent++) {
            message(sent, text, sizeof text);
            send_retrying(seq, text, prio(sent));
        }
        sleep_ms(STEP_MS);
    }

    int status;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child failed (status %#x)", status);
    for (int i = 0; i < 200 && !notified; i++)
        sleep_ms(STEP_MS);
    if (notified != 1 || notified_code != SI_MESGQ || notified_value != 0)
        fail("notification: ran %d times, si_code %d, value %d; expected once, SI_MESGQ (%d), 0",
             (int)notified, (int)notified_code, (int)notified_value, SI_MESGQ);
    if (curmsgs(note) != 1)
        fail("the notified queue holds %ld messages, expected 1", curmsgs(note));

    struct mq_attr a;
    if (mq_getattr(seq, &a) != 0 || a.mq_maxmsg != 8 || a.mq_msgsize != 64 || a.mq_curmsgs != 0 ||
        (a.mq_flags & O_NONBLOCK))
        fail("seq: maxmsg %ld msgsize %ld curmsgs %ld flags %#lx, expected 8 64 0 blocking",
             a.mq_maxmsg, a.mq_msgsize, a.mq_curmsgs, a.mq_flags);
    if (mq_getattr(ack, &a) != 0 || a.mq_maxmsg != 10 || a.mq_msgsize != 32 || !(a.mq_flags & O_NONBLOCK))
        fail("ack: maxmsg %ld msgsize %ld flags %#lx, expected 10 32 non-blocking", a.mq_maxmsg,
             a.mq_msgsize, a.mq_flags);
    mqd_t named = mq_open(ack_name, O_RDONLY | O_NONBLOCK);
    if (named == (mqd_t)-1 || mq_getattr(named, &a) != 0 || a.mq_maxmsg != 2 || a.mq_curmsgs != 1)
        fail("%s is not the twin made after the unlink (errno %d, maxmsg %ld)", ack_name, errno, a.mq_maxmsg);
    if (receive_retrying(twin, buf, sizeof buf, &p) < 0 || strcmp(buf, "twin") != 0 || p != 2)
        fail("the twin queue lost its message");
    mq_unlink(ack_name);
    mqd_t again = mq_open(seq_name, O_RDONLY);
    if (again == (mqd_t)-1 || mq_getattr(again, &a) != 0 || a.mq_maxmsg != 8)
        fail("%s no longer names the queue (errno %d)", seq_name, errno);
    mq_unlink(seq_name);
    mq_unlink(note_name);
    result = mix64(result ^ (uint64_t)acked ^ ((uint64_t)notified << 32));
    return finish(result);
}
