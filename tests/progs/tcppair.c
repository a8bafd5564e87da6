/* tcppair: two processes talking over loopback TCP, as a user's job does, each a server of the
 * other: every listener without SO_REUSEADDR (most programs do not set it).
 *
 * The parent makes two listeners on 127.0.0.1, on ports the kernel picks ("PORTS p1 p2"), and
 * forks: the parent keeps the first, the child the second; each connects to the other's and
 * accepts the other's connection; the listeners stay open. Each step, on each connection, the
 * connecting side sends a numbered, checksummed record; the accepting side checks it (in order,
 * none lost, none twice, undamaged) and answers with a hash of it, which the sender checks.
 * Whichever process a crash ends first, its ends go to TIME-WAIT, and one of them is on a
 * listener's port: the restart must listen there again. Every 20 steps the parent prints
 * "PROGRESS n" (the test times a restart by the first one after it). At the end the child sends
 * the hash of everything it saw, which must equal the parent's. RESULT is that hash.
 *
 * Usage: tcppair [SECONDS=6]
 */
#define RECORD_WORDS 6
#include "common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

static void make_rec(struct rec *r, uint64_t seq, uint64_t salt)
{
    r->seq = seq;
    for (int k = 0; k < RECORD_WORDS; k++)
        r->payload[k] = mix64(seq * 31 + (uint64_t)k + salt);
    r->sum = rec_sum(r);
}

static uint64_t answer_to(const struct rec *r)
{
    return mix64(r->sum ^ r->seq);
}

static const char *why(void)
{
    return errno ? strerror(errno) : "end of file";
}

/* Sends record `i` on `fd` and checks the answer; folds the answer into *h. */
static int send_one(const char *who, int fd, long i, uint64_t salt, uint64_t *h)
{
    struct rec r;
    uint64_t answer;
    make_rec(&r, (uint64_t)i, salt);
    errno = 0;
    if (write_full(fd, &r, sizeof r) != 0 || read_full(fd, &answer, sizeof answer) != 0) {
        fail("%s: connection lost sending record %ld: %s", who, i, why());
        return -1;
    }
    if (answer != answer_to(&r))
        fail("%s: wrong answer to record %ld", who, i);
    *h = mix64(*h ^ answer);
    return 0;
}

/* Receives record `i` on `fd`, checks it and answers; folds the answer into *h. */
static int answer_one(const char *who, int fd, long i, uint64_t salt, uint64_t *h)
{
    struct rec r, want;
    make_rec(&want, (uint64_t)i, salt);
    errno = 0;
    if (read_full(fd, &r, sizeof r) != 0) {
        fail("%s: connection lost at record %ld: %s", who, i, why());
        return -1;
    }
    if (memcmp(&r, &want, sizeof r) != 0)
        fail("%s: record %ld came as %llu%s", who, i, (unsigned long long)r.seq, r.sum != rec_sum(&r) ? ", damaged" : "");
    uint64_t answer = answer_to(&r);
    if (write_full(fd, &answer, sizeof answer) != 0) {
        fail("%s: cannot answer record %ld: %s", who, i, strerror(errno));
        return -1;
    }
    *h = mix64(*h ^ answer);
    return 0;
}

static int listen_local(struct sockaddr_in *at)
{
    socklen_t len = sizeof *at;
    *at = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || bind(s, (struct sockaddr *)at, sizeof *at) != 0 || listen(s, 1) != 0 ||
        getsockname(s, (struct sockaddr *)at, &len) != 0) {
        perror("listen");
        exit(2);
    }
    return s;
}

/* Connects to the other's listener and accepts the other's connection. */
static void pair_up(const char *who, int listener, const struct sockaddr_in *theirs, int *out, int *in)
{
    *out = socket(AF_INET, SOCK_STREAM, 0);
    if (*out < 0 || connect(*out, (const struct sockaddr *)theirs, sizeof *theirs) != 0) {
        fprintf(stderr, "%s: connect: %s\n", who, strerror(errno));
        exit(2);
    }
    do
        *in = accept(listener, NULL, NULL);
    while (*in < 0 && errno == EINTR);
    if (*in < 0) {
        fprintf(stderr, "%s: accept: %s\n", who, strerror(errno));
        exit(2);
    }
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 6.0);
    signal(SIGPIPE, SIG_IGN); /* a lost connection is reported, not fatal */

    struct sockaddr_in at1, at2;
    int l1 = listen_local(&at1), l2 = listen_local(&at2);
    printf("PORTS %d %d\n", ntohs(at1.sin_port), ntohs(at2.sin_port));
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 2;
    }
    uint64_t h = 0;
    int out, in;
    if (child == 0) {
        close(l1);
        pair_up("child", l2, &at1, &out, &in);
        for (long i = 0; i < steps; i++) {
            if (send_one("child", out, i, 1, &h) || answer_one("child", in, i, 2, &h))
                break;
            sleep_ms(STEP_MS);
        }
        char ack;
        errno = 0;
        if (failures == 0 && (write_full(out, &h, sizeof h) != 0 || read_full(out, &ack, 1) != 0))
            fail("child: connection lost at the end: %s", why());
        fflush(stdout);
        _exit(failures ? 1 : 0);
    }
    close(l2);
    pair_up("parent", l1, &at2, &out, &in);
    for (long i = 0; i < steps; i++) {
        if (answer_one("parent", in, i, 1, &h) || send_one("parent", out, i, 2, &h))
            break;
        if ((i + 1) % 20 == 0) {
            printf("PROGRESS %ld\n", i + 1);
            fflush(stdout);
        }
        if (failures > 5)
            break;
    }
    uint64_t theirs = 0;
    if (failures == 0) {
        errno = 0;
        if (read_full(in, &theirs, sizeof theirs) != 0)
            fail("parent: no final hash from the child: %s", why());
        else if (theirs != h)
            fail("parent: the child's hash of the answers differs from the parent's");
        write_full(in, "k", 1);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child ended with status %#x", status);
    return finish(h);
}
