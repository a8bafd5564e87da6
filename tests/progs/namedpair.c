/* namedpair: datagram sockets bound to names and then connected to each other (both ways), as
 * two peers that know each other's address do, must come back named and connected:
 * - P and Q, path names in WORKDIR, P held by the main process, Q by a child;
 * - R and S, abstract names, both held by the main process.
 * Each holds datagrams from its peer, unread across the checkpoints, sent at the start. At every
 * step each end checks its own name (getsockname) and its peer's (getpeername); it reads one
 * queued datagram every few steps, which must be the next one, from its peer's name (the
 * address recvfrom reports); and a bound outsider's datagram to its name must still be refused
 * (EPERM: it takes datagrams from its peer only). At the end each end sends one more datagram
 * to its peer and reads the peer's.
 * RESULT hashes every byte read; PASS if everything checked out.
 *
 * Usage: namedpair WORKDIR [SECONDS=5]
 */
#include "common.h"

#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#define QUEUED 6

enum { P, Q, R, S, OUT, N };
static const char *who[N] = {"P", "Q", "R", "S", "outsider"};
static struct sockaddr_un names[N];
static socklen_t lens[N];
static int socks[N];

/* Each job's abstract names apart from another's that runs at once (same pids, shared names). */
static uint64_t run_tag;

static void name_of(int i, const char *dir)
{
    struct sockaddr_un *a = &names[i];
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    if (i == R || i == S || i == OUT) {
        snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "ckpt-namedpair-%s-%016llx", who[i], (unsigned long long)run_tag);
        lens[i] = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a->sun_path + 1));
    } else {
        snprintf(a->sun_path, sizeof a->sun_path, "%s/np-%s", dir, who[i]);
        unlink(a->sun_path);
        lens[i] = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(a->sun_path) + 1);
    }
}

static int is_name(const struct sockaddr_un *a, socklen_t len, int i)
{
    return len == lens[i] && memcmp(a->sun_path, names[i].sun_path, len - offsetof(struct sockaddr_un, sun_path)) == 0;
}

static int peer_of(int i)
{
    return i == P ? Q : i == Q ? P : i == R ? S : R;
}

/* Checks end i's names and that the outsider is refused. */
static void check_end(int i)
{
    struct sockaddr_un a;
    socklen_t len = sizeof a;
    if (getsockname(socks[i], (struct sockaddr *)&a, &len) != 0 || !is_name(&a, len, i))
        fail("%s: getsockname does not give its name", who[i]);
    len = sizeof a;
    if (getpeername(socks[i], (struct sockaddr *)&a, &len) != 0 || !is_name(&a, len, peer_of(i)))
        fail("%s: getpeername does not give %s's name (%s)", who[i], who[peer_of(i)], strerror(errno));
    if (sendto(socks[OUT], "x", 1, MSG_DONTWAIT, (struct sockaddr *)&names[i], lens[i]) >= 0 || errno != EPERM)
        fail("%s: an outsider's datagram was not refused with EPERM (%s)", who[i], strerror(errno));
}

/* Reads end i's next datagram, expecting message k from its peer (waiting for it when `wait`:
 * the last one, which the peer sends at its end). */
static void receive(int i, int k, int wait, uint64_t *hash)
{
    char m[64], want[64];
    struct sockaddr_un from;
    socklen_t len = sizeof from;
    snprintf(want, sizeof want, "%s to %s, %d", who[peer_of(i)], who[i], k);
    ssize_t n = recvfrom(socks[i], m, sizeof m, wait ? 0 : MSG_DONTWAIT, (struct sockaddr *)&from, &len);
    if (n != (ssize_t)strlen(want) || memcmp(m, want, (size_t)n) != 0)
        fail("%s: read %zd bytes (%.*s), not \"%s\"", who[i], n, n > 0 ? (int)n : 0, m, want);
    else if (!is_name(&from, len, peer_of(i)))
        fail("%s: message %d does not come from %s's name", who[i], k, who[peer_of(i)]);
    for (ssize_t b = 0; b < n; b++)
        *hash = mix64(*hash ^ (uint8_t)m[b]);
}

static void make(int i)
{
    socks[i] = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (socks[i] < 0 || bind(socks[i], (struct sockaddr *)&names[i], lens[i]) != 0) {
        printf("FAIL set-up: bind %s: %s\n", who[i], strerror(errno));
        exit(1);
    }
}

static void join(int i)
{
    int p = peer_of(i);
    if (connect(socks[i], (struct sockaddr *)&names[p], lens[p]) != 0) {
        printf("FAIL set-up: connect %s to %s: %s\n", who[i], who[p], strerror(errno));
        exit(1);
    }
}

static void send_msg(int i, int k)
{
    char m[64];
    int n = snprintf(m, sizeof m, "%s to %s, %d", who[i], who[peer_of(i)], k);
    if (send(socks[i], m, (size_t)n, 0) != n)
        fail("%s: send %d: %s", who[i], k, strerror(errno));
}

/* The steps of the ends in `mine` (two of them); returns the hash of what they read. */
static uint64_t run(const int *mine, int count, long steps)
{
    uint64_t hash = 0;
    int read_so_far = 0;
    long every = steps / (QUEUED + 1) > 0 ? steps / (QUEUED + 1) : 1;
    for (long s = 0; s < steps; s++) {
        for (int m = 0; m < count; m++)
            check_end(mine[m]);
        if (s % every == every - 1 && read_so_far < QUEUED) {
            for (int m = 0; m < count; m++)
                receive(mine[m], read_so_far, 0, &hash);
            read_so_far++;
        }
        sleep_ms(STEP_MS);
    }
    for (; read_so_far < QUEUED; read_so_far++)
        for (int m = 0; m < count; m++)
            receive(mine[m], read_so_far, 0, &hash);
    return hash;
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: namedpair WORKDIR [SECONDS]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 5.0);
    run_tag = (uint64_t)now_ns(CLOCK_REALTIME) ^ ((uint64_t)getppid() << 32);
    for (int i = 0; i < N; i++) {
        name_of(i, argv[1]);
        make(i);
    }
    for (int i = P; i <= S; i++)
        join(i);
    for (int k = 0; k < QUEUED; k++)
        for (int i = P; i <= S; i++)
            send_msg(i, k);
    /* The child takes Q; the main process keeps P, R and S (and the outsider, both have it). */
    int to_parent[2];
    if (pipe(to_parent) != 0)
        return 1;
    pid_t child = fork();
    if (child == 0) {
        close(socks[P]), close(socks[R]), close(socks[S]);
        int mine[] = {Q};
        uint64_t h = run(mine, 1, steps);
        send_msg(Q, QUEUED);
        receive(Q, QUEUED, 1, &h);
        if (write(to_parent[1], &h, sizeof h) != sizeof h)
            return 1;
        return failures ? 1 : 0;
    }
    close(socks[Q]);
    int mine[] = {P, R, S};
    uint64_t h = run(mine, 3, steps);
    for (int i = 0; i < 3; i++)
        send_msg(mine[i], QUEUED);
    for (int i = 0; i < 3; i++)
        receive(mine[i], QUEUED, 1, &h);
    uint64_t child_hash = 0;
    if (read(to_parent[0], &child_hash, sizeof child_hash) != sizeof child_hash)
        fail("the child sent no hash");
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child failed");
    unlink(names[P].sun_path);
    unlink(names[Q].sun_path);
    return finish(mix64(h ^ child_hash));
}
