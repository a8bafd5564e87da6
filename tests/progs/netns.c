/* netns: a network namespace the job made, holding only its loopback (unshare -n, bwrap
 * --unshare-net, podman --network none), must come back with lo up and the sockets of its
 * processes inside it, carrying every byte and datagram once, while the job's own namespace
 * keeps the same names and ports apart.
 *
 * The main process binds an abstract Unix datagram name "ckpt-netns-PID-TAG" (its pid, a tag of the run) in the
 * job's namespace and forks A. A makes a network namespace (first a user namespace where it is
 * root, as an ordinary user must: unshare -Urn; as root, the network namespace alone), brings
 * lo up, listens on 127.0.0.1:PORT (TCP), binds 127.0.0.1:PORT (UDP) and the same abstract
 * name, and forks B, which stays in it. At every step B writes two numbers on its TCP
 * connection to A, sends one UDP datagram and one datagram to the abstract name; A reads one
 * number (so that bytes wait in flight), and every fourth step every datagram waiting (so that
 * some are queued). Every number and datagram must come once and in order. A checks that lo is
 * up at every step. The main process sends a datagram to its name at every step (from a socket
 * of no name: a datagram queued from a name two namespaces have is refused) and must get only
 * its own (B's would mean A's name is in the job's namespace), and must find no
 * listener on 127.0.0.1:PORT (A's would mean its namespace was lost). Prints PASS or FAIL
 * <what>.
 *
 * Usage: netns [SECONDS=5]
 */
#include "common.h"
#include "userns.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

/* Below the ephemeral range, where no port another test binds to 0 lands. */
#define PORT 23311

static struct sockaddr_in loopback_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

/* This run's own part of the name below, set first thing in main: a pid alone is not (a job's
 * pid namespace numbers from 1, and the suite's runs share the machine's namespace). */
static unsigned long long run_tag;

/* The abstract name of the job's main process `main_pid`, and its length. */
static socklen_t abstract_name(struct sockaddr_un *a, pid_t main_pid)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "ckpt-netns-%d-%016llx", (int)main_pid, run_tag);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static int lo_is_up(void)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq req = {0};
    strcpy(req.ifr_name, "lo");
    int up = s >= 0 && ioctl(s, SIOCGIFFLAGS, &req) == 0 && (req.ifr_flags & IFF_UP);
    close(s);
    return up;
}

static void set_lo_up(void)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq req = {0};
    strcpy(req.ifr_name, "lo");
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &req) != 0)
        printf("FAIL set-up: SIOCGIFFLAGS: %s\n", strerror(errno)), exit(1);
    req.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &req) != 0)
        printf("FAIL set-up: bring lo up: %s\n", strerror(errno)), exit(1);
    close(s);
}

/* B: two numbers on TCP, a UDP datagram and an abstract one per step; then ends its stream. */
static int run_b(long steps, pid_t main_pid)
{
    struct sockaddr_in at = loopback_port();
    int tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int dgram = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (tcp < 0 || udp < 0 || dgram < 0 || connect(tcp, (struct sockaddr *)&at, sizeof at) != 0)
        return printf("FAIL set-up: B's sockets: %s\n", strerror(errno)), 1;
    struct sockaddr_un name;
    socklen_t name_len = abstract_name(&name, main_pid);
    uint64_t next = 0;
    for (long step = 0; step < steps; step++) {
        uint64_t two[2] = {next, next + 1};
        if (write_full(tcp, two, sizeof two) != 0)
            fail("B step %ld: write: %s", step, strerror(errno));
        next += 2;
        char text[32];
        int len = snprintf(text, sizeof text, "u%ld", step);
        if (sendto(udp, text, (size_t)len, 0, (struct sockaddr *)&at, sizeof at) != len)
            fail("B step %ld: UDP sendto: %s", step, strerror(errno));
        text[0] = 'b';
        if (sendto(dgram, text, (size_t)len, 0, (struct sockaddr *)&name, name_len) != len)
            fail("B step %ld: abstract sendto: %s", step, strerror(errno));
        sleep_ms(STEP_MS);
    }
    shutdown(tcp, SHUT_WR);
    return failures ? 1 : 0;
}

/* Reads every datagram waiting on `s`, each "<tag><n>" with n the next expected. */
static void drain(int s, char tag, long *next, const char *what)
{
    char text[32];
    ssize_t got;
    while ((got = recv(s, text, sizeof text - 1, MSG_DONTWAIT)) > 0) {
        long n = -1;
        text[got] = 0;
        if (text[0] != tag || sscanf(text + 1, "%ld", &n) != 1 || n != *next)
            fail("A: %s datagram %s, want %c%ld", what, text, tag, *next);
        *next = n + 1;
    }
    if (got < 0 && errno != EAGAIN && errno != EINTR)
        fail("A: %s recv: %s", what, strerror(errno));
}

/* A: makes the namespace and its sockets, reads B's numbers and datagrams until B is done. */
static int run_a(long steps, pid_t main_pid)
{
    if (geteuid() != 0)
        unshare_as_root(CLONE_NEWNET);
    else if (unshare(CLONE_NEWNET) != 0)
        return printf("FAIL set-up: unshare(CLONE_NEWNET): %s\n", strerror(errno)), 1;
    if (lo_is_up())
        return printf("FAIL set-up: lo is up in a new namespace\n"), 1;
    set_lo_up();
    struct sockaddr_in at = loopback_port();
    int one = 1;
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int dgram = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un name;
    socklen_t name_len = abstract_name(&name, main_pid);
    if (listener < 0 || udp < 0 || dgram < 0 || setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(listener, (struct sockaddr *)&at, sizeof at) != 0 || listen(listener, 4) != 0 ||
        bind(udp, (struct sockaddr *)&at, sizeof at) != 0 || bind(dgram, (struct sockaddr *)&name, name_len) != 0)
        return printf("FAIL set-up: A's sockets (the job's name or port seen here?): %s\n", strerror(errno)), 1;
    pid_t b = fork();
    if (b == 0)
        exit(run_b(steps, main_pid));
    int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0)
        return printf("FAIL set-up: accept: %s\n", strerror(errno)), 1;
    uint64_t want = 0;
    long next_udp = 0, next_dgram = 0;
    for (long step = 0;; step++) {
        if (!lo_is_up())
            fail("A step %ld: lo is down", step);
        uint64_t v;
        int r = read_full(conn, &v, sizeof v);
        if (r != 0)
            break; /* B's end of stream (or an error, told by the count below) */
        if (v != want)
            fail("A step %ld: number %llu, want %llu", step, (unsigned long long)v, (unsigned long long)want);
        want = v + 1;
        if (step % 4 == 0) {
            drain(udp, 'u', &next_udp, "UDP");
            drain(dgram, 'b', &next_dgram, "abstract");
        }
        /* Half as fast as B writes, until B is done: bytes wait in flight. */
        if (want < 2 * (uint64_t)steps - 2 && step < steps)
            sleep_ms(STEP_MS);
    }
    int status;
    if (waitpid(b, &status, 0) != b || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("B ended with status %#x", status);
    drain(udp, 'u', &next_udp, "UDP");
    drain(dgram, 'b', &next_dgram, "abstract");
    if (want != 2 * (uint64_t)steps)
        fail("A: %llu numbers arrived, not %ld", (unsigned long long)want, 2 * steps);
    if (next_udp != steps || next_dgram != steps)
        fail("A: %ld UDP and %ld abstract datagrams arrived, not %ld", next_udp, next_dgram, steps);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    start_marker();
    run_tag = mix64((uint64_t)now_ns(CLOCK_REALTIME) ^ (uint64_t)getpid());
    long steps = steps_arg(argc, argv, 1, 5.0);
    pid_t me = getpid();
    struct sockaddr_un name;
    socklen_t name_len = abstract_name(&name, me);
    int mine = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int out = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (mine < 0 || out < 0 || bind(mine, (struct sockaddr *)&name, name_len) != 0)
        return printf("FAIL set-up: the job's abstract name: %s\n", strerror(errno)), 1;
    pid_t a = fork();
    if (a == 0)
        exit(run_a(steps, me));
    uint64_t result = 0;
    struct sockaddr_in at = loopback_port();
    for (long step = 0; step < steps; step++) {
        char text[32], got_text[32];
        int len = snprintf(text, sizeof text, "m%ld", step);
        if (sendto(out, text, (size_t)len, 0, (struct sockaddr *)&name, name_len) != len)
            fail("step %ld: sendto the job's name: %s", step, strerror(errno));
        ssize_t got = recv(mine, got_text, sizeof got_text - 1, MSG_DONTWAIT);
        if (got != len || memcmp(got_text, text, (size_t)len) != 0)
            fail("step %ld: the job's name gave %zd bytes (%.*s), not %s", step, got, got > 0 ? (int)got : 0, got_text, text);
        if (step % 10 == 0) {
            int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (connect(probe, (struct sockaddr *)&at, sizeof at) == 0)
                fail("step %ld: a listener on 127.0.0.1:%d in the job's namespace (A's?)", step, PORT);
            close(probe);
        }
        result = mix64(result ^ (uint64_t)step);
        sleep_ms(STEP_MS);
    }
    int status;
    if (waitpid(a, &status, 0) != a || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("A ended with status %#x", status);
    return finish(result);
}
