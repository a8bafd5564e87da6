/* multicast: the multicast groups a socket joined survive checkpoint/restart, each with its
 * source filter.
 *
 * Receivers, each a UDP socket on a port of its own with IP_MULTICAST_ALL off (so it gets only
 * what its own memberships let in), all on the loopback device:
 *  - ANY joins 239.7.7.1 from any source (MCAST_JOIN_GROUP);
 *  - ONLY joins 232.7.7.2 from 127.0.0.1 alone (MCAST_JOIN_SOURCE_GROUP: INCLUDE mode);
 *  - BLOCKS joins 239.7.7.3 and blocks 127.0.0.1 (MCAST_BLOCK_SOURCE: EXCLUDE with a source);
 *  - V6 joins ff15::7 (if the machine has IPv6 on loopback: else skipped, said on stdout, or
 *    a FAIL with `v6`, which the test gives where loopback has an IPv6 address);
 *    datagrams reach it only where a route lets them through loopback (said on stdout).
 * A sender S on 127.0.0.1 sends through loopback (IP_MULTICAST_IF, loop on). Every step reads
 * each receiver's filter back (MCAST_MSFILTER: mode and sources) and sends one datagram to each
 * group: ANY, ONLY and V6 must receive theirs; BLOCKS must not, and gets instead the one a
 * second sender on 127.0.0.2 sends after it. RESULT hashes what was received;
 * PASS when every check held.
 *
 * Usage: multicast [SECONDS=4] [v6]
 */
#include "common.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

/* struct group_filter (netinet/in.h) with room for one source. */
struct one_source_filter {
    uint32_t gf_interface;
    struct sockaddr_storage gf_group;
    uint32_t gf_fmode;
    uint32_t gf_numsrc;
    struct sockaddr_storage gf_slist[1];
};

static unsigned lo;

static struct sockaddr_storage v4(const char *ip, uint16_t port)
{
    struct sockaddr_storage ss = {0};
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    inet_pton(AF_INET, ip, &a->sin_addr);
    return ss;
}

static struct sockaddr_storage v6(const char *ip, uint16_t port)
{
    struct sockaddr_storage ss = {0};
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    inet_pton(AF_INET6, ip, &a->sin6_addr);
    return ss;
}

/* A UDP socket of `family` bound to a port of its own, multicast from other groups off. */
static int receiver(int family, uint16_t *port)
{
    int fd = socket(family, SOCK_DGRAM, 0), off = 0;
    if (fd < 0)
        return -1;
    struct sockaddr_storage any = family == AF_INET ? v4("0.0.0.0", 0) : v6("::", 0);
    socklen_t len = sizeof any;
    if (family == AF_INET ? setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &off, sizeof off) : setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_ALL, &off, sizeof off))
        return close(fd), -1;
    if (bind(fd, (struct sockaddr *)&any, family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)) || getsockname(fd, (struct sockaddr *)&any, &len))
        return close(fd), -1;
    *port = ntohs(((struct sockaddr_in *)&any)->sin_port);
    return fd;
}

static int join(int fd, int level, struct sockaddr_storage group)
{
    struct group_req r = {.gr_interface = lo, .gr_group = group};
    return setsockopt(fd, level, MCAST_JOIN_GROUP, &r, sizeof r);
}

static int with_source(int fd, int level, int op, struct sockaddr_storage group, struct sockaddr_storage source)
{
    struct group_source_req r = {.gsr_interface = lo, .gsr_group = group, .gsr_source = source};
    return setsockopt(fd, level, op, &r, sizeof r);
}

/* Checks the socket's filter on `group`: `mode`, and `source` as its one source if given. */
static void check_filter(const char *name, int fd, int level, struct sockaddr_storage group, uint32_t mode, const char *source, long step)
{
    struct one_source_filter f = {.gf_interface = lo, .gf_group = group, .gf_numsrc = 1};
    socklen_t len = sizeof f;
    if (getsockopt(fd, level, MCAST_MSFILTER, &f, &len)) {
        fail("step %ld: %s: read its filter: %s (not a member any more?)", step, name, strerror(errno));
        return;
    }
    uint32_t want_n = source ? 1 : 0;
    if (f.gf_fmode != mode || f.gf_numsrc != want_n) {
        fail("step %ld: %s: filter mode %u with %u sources, not %u with %u", step, name, f.gf_fmode, f.gf_numsrc, mode, want_n);
        return;
    }
    if (source) {
        struct sockaddr_in *s = (struct sockaddr_in *)&f.gf_slist[0];
        char got[64];
        inet_ntop(AF_INET, &s->sin_addr, got, sizeof got);
        if (s->sin_family != AF_INET || strcmp(got, source))
            fail("step %ld: %s: filter's source is %s, not %s", step, name, got, source);
    }
}

/* Sends `n` to `group` (with `port`) from `s`. */
static int send_to_group(int s, struct sockaddr_storage group, uint16_t port, uint64_t n)
{
    ((struct sockaddr_in *)&group)->sin_port = htons(port);
    socklen_t len = group.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    return sendto(s, &n, sizeof n, 0, (struct sockaddr *)&group, len) == sizeof n ? 0 : -1;
}

/* Receives one datagram on `fd` within `ms`; returns its value, or -1 if none came. */
static int64_t receive(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint64_t n;
    if (poll(&p, 1, ms) != 1 || recv(fd, &n, sizeof n, MSG_DONTWAIT) != sizeof n)
        return -1;
    return (int64_t)n;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    lo = if_nametoindex("lo");
    uint16_t p_any, p_only, p_blocks, p_v6 = 0;
    int any = receiver(AF_INET, &p_any), only = receiver(AF_INET, &p_only), blocks = receiver(AF_INET, &p_blocks);
    int s = socket(AF_INET, SOCK_DGRAM, 0), s2 = socket(AF_INET, SOCK_DGRAM, 0), one = 1;
    struct ip_mreqn via_lo = {.imr_ifindex = (int)lo};
    /* Bound to 127.0.0.1: else the kernel gives a multicast through loopback another device's
     * address as its source (loopback's is of host scope). */
    struct sockaddr_storage local = v4("127.0.0.1", 0), other = v4("127.0.0.2", 0);
    if (!lo || any < 0 || only < 0 || blocks < 0 || s < 0 || s2 < 0 || bind(s, (struct sockaddr *)&local, sizeof(struct sockaddr_in)) ||
        bind(s2, (struct sockaddr *)&other, sizeof(struct sockaddr_in)) || setsockopt(s2, IPPROTO_IP, IP_MULTICAST_IF, &via_lo, sizeof via_lo) ||
        setsockopt(s, IPPROTO_IP, IP_MULTICAST_IF, &via_lo, sizeof via_lo) ||
        setsockopt(s, IPPROTO_IP, IP_MULTICAST_LOOP, &one, sizeof one)) {
        fail("set up the sockets: %s", strerror(errno));
        return finish(0);
    }
    struct sockaddr_storage g_any = v4("239.7.7.1", 0), g_only = v4("232.7.7.2", 0), g_blocks = v4("239.7.7.3", 0), g_v6 = v6("ff15::7", 0);
    if (join(any, IPPROTO_IP, g_any) || with_source(only, IPPROTO_IP, MCAST_JOIN_SOURCE_GROUP, g_only, local) || join(blocks, IPPROTO_IP, g_blocks) ||
        with_source(blocks, IPPROTO_IP, MCAST_BLOCK_SOURCE, g_blocks, local)) {
        fail("join the groups: %s", strerror(errno));
        return finish(0);
    }
    /* IPv6: the membership is kept whatever the machine's routes; datagrams go through
     * loopback only where a route lets them (ff00::/8 is usually routed to other devices). */
    int r6 = receiver(AF_INET6, &p_v6), s6 = socket(AF_INET6, SOCK_DGRAM, 0);
    int have_v6 = r6 >= 0 && s6 >= 0 && !join(r6, IPPROTO_IPV6, g_v6);
    int v6_traffic = have_v6 && !setsockopt(s6, IPPROTO_IPV6, IPV6_MULTICAST_IF, &lo, sizeof lo) &&
                     !setsockopt(s6, IPPROTO_IPV6, IPV6_MULTICAST_LOOP, &one, sizeof one) && !send_to_group(s6, g_v6, p_v6, 0) && receive(r6, 1000) == 0;
    if (!have_v6 && argc > 2 && strcmp(argv[2], "v6") == 0)
        fail("IPv6 multicast on loopback: %s", strerror(errno));
    else if (!have_v6)
        printf("IPv6 multicast on loopback: not on this machine (%s), skipped\n", strerror(errno));
    else if (!v6_traffic)
        printf("IPv6 multicast through loopback: not routed here (%s), its membership checked alone\n", strerror(errno));

    uint64_t h = 0;
    for (long step = 0; step < steps; step++) {
        check_filter("ANY", any, IPPROTO_IP, g_any, MCAST_EXCLUDE, NULL, step);
        check_filter("ONLY", only, IPPROTO_IP, g_only, MCAST_INCLUDE, "127.0.0.1", step);
        check_filter("BLOCKS", blocks, IPPROTO_IP, g_blocks, MCAST_EXCLUDE, "127.0.0.1", step);
        if (have_v6)
            check_filter("V6", r6, IPPROTO_IPV6, g_v6, MCAST_EXCLUDE, NULL, step);
        uint64_t n = (uint64_t)step + 1;
        if (send_to_group(s, g_any, p_any, n) || send_to_group(s, g_only, p_only, n) || send_to_group(s, g_blocks, p_blocks, n) || (v6_traffic && send_to_group(s6, g_v6, p_v6, n)))
            fail("step %ld: send to the groups: %s", step, strerror(errno));
        int64_t got_any = receive(any, 2000), got_only = receive(only, 2000), got_v6 = v6_traffic ? receive(r6, 2000) : (int64_t)n;
        if (got_any != (int64_t)n || got_only != (int64_t)n || got_v6 != (int64_t)n)
            fail("step %ld: sent %llu to each group, received ANY %lld, ONLY %lld, V6 %lld", step, (unsigned long long)n, (long long)got_any, (long long)got_only, (long long)got_v6);
        /* Then one from 127.0.0.2, which BLOCKS lets in: it comes after the blocked one would. */
        uint64_t marker = n | (1ULL << 40);
        if (send_to_group(s2, g_blocks, p_blocks, marker))
            fail("step %ld: send from 127.0.0.2: %s", step, strerror(errno));
        int64_t got_blocked = receive(blocks, 2000);
        if (got_blocked != (int64_t)marker)
            fail("step %ld: BLOCKS received %lld first, not %llu from 127.0.0.2 (%llu came from the source it blocks)", step, (long long)got_blocked,
                 (unsigned long long)marker, (unsigned long long)n);
        if (failures)
            break;
        h = mix64(h ^ (uint64_t)got_any ^ ((uint64_t)got_only << 20));
        sleep_ms(STEP_MS);
    }
    return finish(h);
}
