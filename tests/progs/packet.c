/* packet: a packet socket held across checkpoints must come back as it was: a SOCK_DGRAM
 * socket for IPv4 bound to lo, with PACKET_AUXDATA on, lo in promiscuous mode through one of
 * its memberships, and a classic filter that keeps only UDP datagrams to the program's own
 * port; still receiving what the program sends itself. Needs root (CAP_NET_RAW).
 *
 * The program binds a UDP socket to 127.0.0.1 on a port the kernel picks. At every step it
 * sends "packet <pid> <step>" there and reads packets from the packet socket until that one's
 * IP packet comes (lo shows each packet twice, going out and coming in; a packet not seen
 * within a second, as one a checkpoint let go, is sent again); the filter lets nothing else in,
 * so anything else it reads is a FAIL. It also checks at every step the socket's interface and
 * protocol (getsockname), PACKET_AUXDATA, the filter's length (SO_GET_FILTER) and that lo is
 * promiscuous (the membership holds it so). Two SOCK_PACKET sockets beside it (the obsolete
 * interface, zdtm's packet_sock_spkt), one bound to lo by name and one not bound, must come back
 * so (getsockname); protocol 0, so that nothing queues on them. Prints PASS or FAIL <what>.
 *
 * Usage: packet [SECONDS=5]
 */
#include "common.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#ifndef SO_GET_FILTER
#define SO_GET_FILTER SO_ATTACH_FILTER
#endif

static void must(int ok, const char *what)
{
    if (!ok) {
        printf("FAIL set-up: %s: %s\n", what, strerror(errno));
        exit(1);
    }
}

/* Whether lo is in promiscuous mode: the device's own flags (sysfs), where a packet socket's
 * membership counts (SIOCGIFFLAGS shows only the flags set with SIOCSIFFLAGS). */
static int lo_promiscuous(void)
{
    char buf[32] = "";
    FILE *f = fopen("/sys/class/net/lo/flags", "r");
    if (!f)
        return 0;
    int ok = fgets(buf, sizeof buf, f) != NULL && (strtoul(buf, NULL, 0) & IFF_PROMISC);
    fclose(f);
    return ok;
}

/* Sends "packet <pid> <step>" to `to` from `udp`, and reads the packet socket until its IP
 * packet comes. */
static void one_step(int pkt, int udp, const struct sockaddr_in *to, long step)
{
    char want[64];
    int len = snprintf(want, sizeof want, "packet %d %ld", (int)getpid(), step);
    for (int tries = 0; tries < 10; tries++) {
        if (sendto(udp, want, (size_t)len, 0, (const struct sockaddr *)to, sizeof *to) != len) {
            fail("step %ld: sendto: %s", step, strerror(errno));
            return;
        }
        for (;;) {
            struct pollfd p = {.fd = pkt, .events = POLLIN};
            int r = poll(&p, 1, 1000);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break; /* send again */
            unsigned char buf[2048];
            ssize_t n = recv(pkt, buf, sizeof buf, 0);
            if (n < 0) {
                if (errno == EINTR || errno == EAGAIN)
                    continue;
                fail("step %ld: recv on the packet socket: %s", step, strerror(errno));
                return;
            }
            /* An IPv4 header of 20 bytes, a UDP header of 8, the payload. */
            if (n < 28 || buf[0] != 0x45 || buf[9] != IPPROTO_UDP) {
                fail("step %ld: a packet the filter should have dropped (%zd bytes, first %#x)", step, n, buf[0]);
                return;
            }
            char got[64] = "";
            size_t plen = (size_t)n - 28 < sizeof got - 1 ? (size_t)n - 28 : sizeof got - 1;
            memcpy(got, buf + 28, plen);
            if (strcmp(got, want) == 0) {
                char drain[64];
                while (recv(udp, drain, sizeof drain, MSG_DONTWAIT) > 0) {
                }
                return;
            }
            /* An earlier step's second copy, or one sent again: fine. */
        }
    }
    fail("step %ld: the packet socket never showed %s", step, want);
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t tolen = sizeof to;
    must(udp >= 0 && bind(udp, (struct sockaddr *)&to, sizeof to) == 0 && getsockname(udp, (struct sockaddr *)&to, &tolen) == 0, "the UDP socket");
    unsigned lo = if_nametoindex("lo");
    must(lo > 0, "if_nametoindex(lo)");

    int pkt = socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, htons(ETH_P_IP));
    must(pkt >= 0, "socket(AF_PACKET)");
    /* Keep only UDP to our port: protocol at 9, destination port at 22 (no IP options). */
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 9),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_UDP, 0, 3),
        BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 22),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ntohs(to.sin_port), 0, 1),
        BPF_STMT(BPF_RET | BPF_K, 0xffff),
        BPF_STMT(BPF_RET | BPF_K, 0),
    };
    struct sock_fprog prog = {.len = 6, .filter = code};
    must(setsockopt(pkt, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) == 0, "SO_ATTACH_FILTER");
    /* What was queued before the filter was attached goes. */
    char junk[2048];
    while (recv(pkt, junk, sizeof junk, MSG_DONTWAIT) > 0) {
    }
    struct sockaddr_ll at = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IP), .sll_ifindex = (int)lo};
    must(bind(pkt, (struct sockaddr *)&at, sizeof at) == 0, "bind to lo");
    int on = 1;
    must(setsockopt(pkt, SOL_PACKET, PACKET_AUXDATA, &on, sizeof on) == 0, "PACKET_AUXDATA");
    struct packet_mreq mr = {.mr_ifindex = (int)lo, .mr_type = PACKET_MR_PROMISC};
    must(setsockopt(pkt, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr) == 0, "PACKET_ADD_MEMBERSHIP");

    int spkt = socket(AF_PACKET, SOCK_PACKET | SOCK_CLOEXEC, 0);
    struct sockaddr by_name = {.sa_family = AF_PACKET};
    strcpy(by_name.sa_data, "lo");
    must(spkt >= 0 && bind(spkt, &by_name, sizeof by_name) == 0, "a SOCK_PACKET socket bound to lo");
    int spkt_unbound = socket(AF_PACKET, SOCK_PACKET | SOCK_CLOEXEC, 0);
    must(spkt_unbound >= 0, "a SOCK_PACKET socket");

    uint64_t result = 0;
    for (long step = 0; step < steps; step++) {
        struct sockaddr named;
        socklen_t nlen = sizeof named;
        memset(&named, 0, sizeof named);
        if (getsockname(spkt, &named, &nlen) != 0 || named.sa_family != AF_PACKET || strcmp(named.sa_data, "lo") != 0)
            fail("step %ld: the SOCK_PACKET socket is bound to \"%.14s\", not lo", step, named.sa_data);
        nlen = sizeof named;
        memset(&named, 0, sizeof named);
        if (getsockname(spkt_unbound, &named, &nlen) != 0 || named.sa_data[0] != 0)
            fail("step %ld: the unbound SOCK_PACKET socket is bound to \"%.14s\"", step, named.sa_data);
        struct sockaddr_ll got;
        socklen_t glen = sizeof got;
        if (getsockname(pkt, (struct sockaddr *)&got, &glen) != 0 || got.sll_ifindex != (int)lo || got.sll_protocol != htons(ETH_P_IP))
            fail("step %ld: bound to interface %d protocol %#x, not lo (%u) and IPv4", step, got.sll_ifindex, ntohs(got.sll_protocol), lo);
        int aux = 0;
        socklen_t alen = sizeof aux;
        if (getsockopt(pkt, SOL_PACKET, PACKET_AUXDATA, &aux, &alen) != 0 || aux != 1)
            fail("step %ld: PACKET_AUXDATA is %d", step, aux);
        socklen_t count = 0;
        if (getsockopt(pkt, SOL_SOCKET, SO_GET_FILTER, NULL, &count) != 0 || count != 6)
            fail("step %ld: the filter has %u instructions, not 6", step, (unsigned)count);
        if (!lo_promiscuous())
            fail("step %ld: lo is not promiscuous: the membership is gone", step);
        one_step(pkt, udp, &to, step);
        result = mix64(result ^ (uint64_t)step);
        sleep_ms(STEP_MS);
    }
    return finish(result);
}
