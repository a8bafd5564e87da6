/* dgramkinds: IP datagram sockets other than UDP survive checkpoint/restart.
 *
 *  - UDP-Lite: a receiver R bound on 127.0.0.1 with UDPLITE_RECV_CSCOV 20, a sender S with
 *    UDPLITE_SEND_CSCOV 20; S sends one datagram a step and R reads one, two more staying
 *    queued across the checkpoints; each must arrive once, in order, from S.
 *  - A ping socket (ICMP echo without privilege: net.ipv4.ping_group_range must let this
 *    group, which the test sees to, else FAIL), bound to its identifier and connected to 127.0.0.1: an echo
 *    before the checkpoints and one after must both be answered, to the same identifier.
 *  - As root, a raw ICMP socket with ICMP_FILTER letting through echo replies alone: after the
 *    restarts, the ping's echo must reach it as a reply and not as a request (of the packets
 *    with the ping socket's identifier: a raw socket sees every program's).
 *  - A second ping socket, never bound nor used (the kernel's table of ping sockets lists none
 *    such): after the restarts, connected to 127.0.0.1, its echo must be answered.
 *  - A UDP socket bound with IP_FREEBIND to an address no machine has (192.0.2.1, TEST-NET-1),
 *    IP_FREEBIND turned off since: it must come back bound there, IP_FREEBIND off.
 *  - As root, a raw IPv6 socket of protocol UDP (which the kernel counts as bound to its
 *    protocol: IPV6_V6ONLY is refused on it) with IPV6_RECVPKTINFO on and a filter that drops
 *    every packet: it must come back of that kind with that option.
 * Every step reads the options back. RESULT hashes the datagrams received; PASS when every
 * check held.
 *
 * Usage: dgramkinds [SECONDS=4]
 */
#include "common.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/icmp.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <sys/socket.h>

#ifndef IPPROTO_UDPLITE
#define IPPROTO_UDPLITE 136
#endif
#define UDPLITE_SEND_CSCOV 10
#define UDPLITE_RECV_CSCOV 11
#define AHEAD 2

static int getint(int fd, int level, int name)
{
    int v = -1;
    socklen_t len = sizeof v;
    return getsockopt(fd, level, name, &v, &len) ? -1000 - errno : v;
}

/* One echo through the ping socket: sends sequence `seq`, waits for its reply. Returns 0 if
 * it came back. */
static int echo(int ping, uint16_t seq)
{
    struct icmphdr req = {.type = ICMP_ECHO, .un.echo.sequence = htons(seq)};
    if (send(ping, &req, sizeof req, 0) != sizeof req)
        return -1;
    struct pollfd p = {.fd = ping, .events = POLLIN};
    if (poll(&p, 1, 2000) != 1)
        return -2;
    struct icmphdr rep;
    if (recv(ping, &rep, sizeof rep, 0) < (ssize_t)sizeof rep || rep.type != ICMP_ECHOREPLY || ntohs(rep.un.echo.sequence) != seq)
        return -3;
    return 0;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);

    int r = socket(AF_INET, SOCK_DGRAM, IPPROTO_UDPLITE), s = socket(AF_INET, SOCK_DGRAM, IPPROTO_UDPLITE);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof at;
    int cscov = 20;
    if (r < 0 || s < 0 || bind(r, (struct sockaddr *)&at, sizeof at) || getsockname(r, (struct sockaddr *)&at, &len) ||
        setsockopt(r, IPPROTO_UDPLITE, UDPLITE_RECV_CSCOV, &cscov, sizeof cscov) ||
        setsockopt(s, IPPROTO_UDPLITE, UDPLITE_SEND_CSCOV, &cscov, sizeof cscov) || connect(s, (struct sockaddr *)&at, sizeof at)) {
        printf("setup: UDP-Lite: %s\n", strerror(errno));
        return 2;
    }
    struct sockaddr_in from_s;
    len = sizeof from_s;
    getsockname(s, (struct sockaddr *)&from_s, &len);

    int ping = socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP), unused_ping = socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP);
    struct sockaddr_in ping_at = {.sin_family = AF_INET};
    if (ping < 0) {
        /* The test lets every group make them: a machine where it could not fails here. */
        fail("ping sockets are not allowed to this group (net.ipv4.ping_group_range): %s", strerror(errno));
    } else {
        struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        len = sizeof ping_at;
        if (connect(ping, (struct sockaddr *)&lo, sizeof lo) || echo(ping, 1) || getsockname(ping, (struct sockaddr *)&ping_at, &len)) {
            printf("setup: ping: %s\n", strerror(errno));
            return 2;
        }
    }

    int raw = geteuid() == 0 ? socket(AF_INET, SOCK_RAW, IPPROTO_ICMP) : -1;
    /* ICMP_FILTER: a bit set blocks its type; all but echo reply (0). */
    uint32_t mask = ~(1u << ICMP_ECHOREPLY);
    if (raw >= 0 && setsockopt(raw, SOL_RAW, ICMP_FILTER, &mask, sizeof mask))
        return 2;
    /* Every echo reply on the machine reaches a raw socket, those of other programs' pings too
     * (the reference run's, a second before a checkpoint, left it a packet that the capture
     * refuses): a classic filter keeps only replies to our ping socket, by its identifier. */
    if (raw >= 0) {
        uint16_t id = ping >= 0 ? ntohs(ping_at.sin_port) : 0;
        struct sock_filter ours[] = {
            BPF_STMT(BPF_LDX | BPF_B | BPF_MSH, 0),            /* x = the IP header's length */
            BPF_STMT(BPF_LD | BPF_H | BPF_IND, 4),             /* the ICMP echo identifier */
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, id, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, 0xffff),
            BPF_STMT(BPF_RET | BPF_K, 0),
        };
        struct sock_fprog prog = {.len = sizeof ours / sizeof ours[0], .filter = ours};
        if (ping < 0)
            prog.filter = ours + 4, prog.len = 1; /* nothing of ours to see: drop all */
        if (setsockopt(raw, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog)) {
            printf("setup: SO_ATTACH_FILTER: %s\n", strerror(errno));
            return 2;
        }
    }
    int freed = socket(AF_INET, SOCK_DGRAM, 0), on = 1, off = 0;
    struct sockaddr_in nowhere = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0xc0000201)};
    if (freed < 0 || setsockopt(freed, IPPROTO_IP, IP_FREEBIND, &on, sizeof on) ||
        bind(freed, (struct sockaddr *)&nowhere, sizeof nowhere) || setsockopt(freed, IPPROTO_IP, IP_FREEBIND, &off, sizeof off) ||
        getsockname(freed, (struct sockaddr *)&nowhere, &(socklen_t){sizeof nowhere})) {
        printf("setup: the freely bound socket: %s\n", strerror(errno));
        return 2;
    }
    int raw6 = geteuid() == 0 ? socket(AF_INET6, SOCK_RAW, IPPROTO_UDP) : -1;
    if (raw6 >= 0) {
        struct sock_filter none[] = {BPF_STMT(BPF_RET | BPF_K, 0)};
        struct sock_fprog drop = {.len = 1, .filter = none};
        if (setsockopt(raw6, SOL_SOCKET, SO_ATTACH_FILTER, &drop, sizeof drop) ||
            setsockopt(raw6, IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof on)) {
            printf("setup: the raw IPv6 socket: %s\n", strerror(errno));
            return 2;
        }
    }
    /* The echo of the setup reached it: taken out, so it holds nothing at the checkpoints. */
    char drain[256];
    while (raw >= 0 && recv(raw, drain, sizeof drain, MSG_DONTWAIT) > 0)
        ;

    uint64_t h = 0;
    long sent = 0, got = 0;
    for (; sent < AHEAD; sent++) {
        char msg[32];
        int n = snprintf(msg, sizeof msg, "L%ld", sent);
        if (send(s, msg, (size_t)n, 0) != n)
            fail("send %s: %s", msg, strerror(errno));
    }
    for (long step = 0; step < steps; step++) {
        char msg[32];
        int n = snprintf(msg, sizeof msg, "L%ld", sent++);
        if (send(s, msg, (size_t)n, 0) != n)
            fail("step %ld: send: %s", step, strerror(errno));
        sleep_ms(STEP_MS);
        char buf[64];
        struct sockaddr_in from;
        len = sizeof from;
        ssize_t k = recvfrom(r, buf, sizeof buf - 1, MSG_DONTWAIT, (struct sockaddr *)&from, &len);
        if (k < 0) {
            fail("step %ld: nothing arrived: %s", step, strerror(errno));
            break;
        }
        buf[k] = 0;
        char want[32];
        snprintf(want, sizeof want, "L%ld", got++);
        if (strcmp(buf, want) || from.sin_port != from_s.sin_port)
            fail("step %ld: got \"%s\" from port %d, not \"%s\" from %d", step, buf, ntohs(from.sin_port), want, ntohs(from_s.sin_port));
        h = mix64(h ^ (uint64_t)k ^ (uint64_t)buf[1]);
        if (getint(r, IPPROTO_UDPLITE, UDPLITE_RECV_CSCOV) != 20 || getint(s, IPPROTO_UDPLITE, UDPLITE_SEND_CSCOV) != 20) {
            fail("step %ld: the checksum coverage is %d and %d, not 20", step, getint(r, IPPROTO_UDPLITE, UDPLITE_RECV_CSCOV), getint(s, IPPROTO_UDPLITE, UDPLITE_SEND_CSCOV));
            break;
        }
    }
    if (got + AHEAD != sent)
        fail("%ld datagrams read of %ld sent", got, sent);

    if (ping >= 0) {
        struct sockaddr_in now;
        len = sizeof now;
        if (getsockname(ping, (struct sockaddr *)&now, &len) || now.sin_port != ping_at.sin_port)
            fail("the ping socket's identifier is %d, not %d", ntohs(now.sin_port), ntohs(ping_at.sin_port));
        int e = echo(ping, 2);
        if (e)
            fail("the echo after the restarts was not answered (%d)", e);
        struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (connect(unused_ping, (struct sockaddr *)&lo, sizeof lo) || (e = echo(unused_ping, 3)))
            fail("the ping socket unused until now: connect, or its echo (%d): %s", e, strerror(errno));
    }
    struct sockaddr_in bound;
    len = sizeof bound;
    if (getsockname(freed, (struct sockaddr *)&bound, &len) || bound.sin_addr.s_addr != nowhere.sin_addr.s_addr ||
        bound.sin_port != nowhere.sin_port || getint(freed, IPPROTO_IP, IP_FREEBIND) != 0)
        fail("the freely bound socket is at %s:%d with IP_FREEBIND %d, not 192.0.2.1:%d with 0", inet_ntoa(bound.sin_addr),
             ntohs(bound.sin_port), getint(freed, IPPROTO_IP, IP_FREEBIND), ntohs(nowhere.sin_port));
    if (raw6 >= 0 && (getint(raw6, SOL_SOCKET, SO_DOMAIN) != AF_INET6 || getint(raw6, SOL_SOCKET, SO_TYPE) != SOCK_RAW ||
                      getint(raw6, SOL_SOCKET, SO_PROTOCOL) != IPPROTO_UDP || getint(raw6, IPPROTO_IPV6, IPV6_RECVPKTINFO) != 1))
        fail("the raw IPv6 socket came back as domain %d type %d protocol %d, IPV6_RECVPKTINFO %d",
             getint(raw6, SOL_SOCKET, SO_DOMAIN), getint(raw6, SOL_SOCKET, SO_TYPE), getint(raw6, SOL_SOCKET, SO_PROTOCOL),
             getint(raw6, IPPROTO_IPV6, IPV6_RECVPKTINFO));
    if (raw >= 0) {
        uint32_t m = 0;
        len = sizeof m;
        if (getsockopt(raw, SOL_RAW, ICMP_FILTER, &m, &len) || m != mask)
            fail("the raw socket's ICMP_FILTER is %#x, not %#x", m, mask);
        if (ping >= 0) {
            int replies = 0, others = 0;
            struct pollfd p = {.fd = raw, .events = POLLIN};
            while (poll(&p, 1, 200) == 1) {
                char pkt[256];
                ssize_t k = recv(raw, pkt, sizeof pkt, 0);
                if (k < (ssize_t)(sizeof(struct iphdr) + sizeof(struct icmphdr)))
                    break;
                struct icmphdr *ic = (struct icmphdr *)(pkt + ((struct iphdr *)pkt)->ihl * 4);
                /* Another program's echoes pass too (a raw socket sees the machine's): ours only. */
                if (ic->un.echo.id != ping_at.sin_port)
                    continue;
                if (ic->type == ICMP_ECHOREPLY)
                    replies++;
                else
                    others++;
            }
            if (replies != 1 || others)
                fail("the raw socket saw %d replies and %d other packets, not the one reply", replies, others);
        }
    }
    return finish(h);
}
