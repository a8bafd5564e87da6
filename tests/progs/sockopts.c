/* sockopts: the options a program sets on its IP sockets survive checkpoint/restart, each
 * checked by what it does where it can be, else by getsockopt.
 *
 *  - A UDP socket R on 127.0.0.1, bound to the device lo (SO_BINDTODEVICE), with a classic BPF
 *    filter that keeps only datagrams whose first byte is 'A', locked (SO_LOCK_FILTER), and
 *    IP_PKTINFO and SO_TIMESTAMPNS on: each step a sender S sends it "A..." and "B..." and R
 *    must receive the "A" ones alone, each with its IP_PKTINFO and SCM_TIMESTAMPNS messages.
 *    Some datagrams are left queued across the checkpoints. At the end the filter must still be
 *    locked (SO_DETACH_FILTER fails with EPERM).
 *  - S has IP_TOS 0x10, IP_TTL 9, IP_MULTICAST_TTL 3, IP_MULTICAST_LOOP 0, IP_RECVERR 1,
 *    SO_PRIORITY 2; R has IP_RECVTTL on, so each datagram's TTL, 9, is seen at R.
 *  - A TCP connection (both ends in the program) with IP_TOS 0x08 and SO_PRIORITY 1 on one end,
 *    IP_FREEBIND and SO_RCVLOWAT 4 on the other; as root, SO_MARK 7 too.
 *  - Two TCP listeners sharing a port with SO_REUSEPORT, the first of which turned it off once
 *    both listened (as zdtm's socket-tcp-reuseport): at the end both must still listen there,
 *    the first without SO_REUSEPORT and the second with it, and a connection must be accepted.
 *  - An IPv6 UDP socket with IPV6_TCLASS 0x20, IPV6_UNICAST_HOPS 5 and IPV6_RECVPKTINFO 1.
 * Every step reads every option back. RESULT hashes the datagrams received; PASS when every
 * check held.
 *
 * Usage: sockopts [SECONDS=4]
 */
#include "common.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#define QUEUED 3

struct opt {
    const char *what;
    int *fd;
    int level, name, value;
};

static int r, s, t1, t2, u6;

static int getint(int fd, int level, int name)
{
    int v = -1;
    socklen_t len = sizeof v;
    if (getsockopt(fd, level, name, &v, &len))
        return -1000 - errno;
    return v;
}

static void setint(int fd, int level, int name, int v, const char *what)
{
    if (setsockopt(fd, level, name, &v, sizeof v)) {
        printf("setup: %s: %s\n", what, strerror(errno));
        exit(2);
    }
}

/* Sends one datagram from S to R. */
static void send_one(struct sockaddr_in *to, char first, long step)
{
    char msg[32];
    int n = snprintf(msg, sizeof msg, "%c%ld", first, step);
    if (sendto(s, msg, (size_t)n, 0, (struct sockaddr *)to, sizeof *to) != n)
        fail("send %s: %s", msg, strerror(errno));
}

/* Receives one datagram at R; checks its control messages. Returns its bytes' hash, or 0 if
 * nothing was there. */
static uint64_t receive_one(long step)
{
    char buf[64], ctl[512];
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf - 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(r, &msg, MSG_DONTWAIT);
    if (n < 0)
        return 0;
    buf[n] = 0;
    if (buf[0] != 'A')
        fail("step %ld: the filter let \"%s\" through", step, buf);
    int pktinfo = 0, stamp = 0, ttl = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO)
            pktinfo = 1;
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS)
            stamp = 1;
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL)
            memcpy(&ttl, CMSG_DATA(c), sizeof ttl);
    }
    if (!pktinfo || !stamp)
        fail("step %ld: \"%s\" came without %s", step, buf, !pktinfo ? "IP_PKTINFO" : "SCM_TIMESTAMPNS");
    if (ttl != 9)
        fail("step %ld: \"%s\" came with TTL %d, not the sender's 9", step, buf, ttl);
    uint64_t h = 0;
    for (ssize_t i = 0; i < n; i++)
        h = mix64(h ^ (uint8_t)buf[i]);
    return h | 1;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    int root = geteuid() == 0;

    r = socket(AF_INET, SOCK_DGRAM, 0);
    s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (setsockopt(r, SOL_SOCKET, SO_BINDTODEVICE, "lo", 3)) {
        printf("setup: SO_BINDTODEVICE lo: %s\n", strerror(errno));
        return 2;
    }
    socklen_t len = sizeof at;
    if (bind(r, (struct sockaddr *)&at, sizeof at) || getsockname(r, (struct sockaddr *)&at, &len))
        return 2;
    /* ldb [8] (the first byte after the UDP header); jeq 'A' ? keep all : drop. */
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 8),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 'A', 0, 1),
        BPF_STMT(BPF_RET | BPF_K, 0xffff),
        BPF_STMT(BPF_RET | BPF_K, 0),
    };
    struct sock_fprog prog = {.len = 4, .filter = code};
    if (setsockopt(r, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog))
        return 2;
    setint(r, SOL_SOCKET, SO_LOCK_FILTER, 1, "SO_LOCK_FILTER");
    setint(r, IPPROTO_IP, IP_PKTINFO, 1, "IP_PKTINFO");
    setint(r, SOL_SOCKET, SO_TIMESTAMPNS, 1, "SO_TIMESTAMPNS");
    setint(r, IPPROTO_IP, IP_RECVTTL, 1, "IP_RECVTTL");
    setint(s, IPPROTO_IP, IP_TOS, 0x10, "IP_TOS");
    setint(s, IPPROTO_IP, IP_TTL, 9, "IP_TTL");
    setint(s, IPPROTO_IP, IP_MULTICAST_TTL, 3, "IP_MULTICAST_TTL");
    setint(s, IPPROTO_IP, IP_MULTICAST_LOOP, 0, "IP_MULTICAST_LOOP");
    setint(s, IPPROTO_IP, IP_RECVERR, 1, "IP_RECVERR");
    setint(s, SOL_SOCKET, SO_PRIORITY, 2, "SO_PRIORITY");

    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in la = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    len = sizeof la;
    if (bind(l, (struct sockaddr *)&la, sizeof la) || listen(l, 1) || getsockname(l, (struct sockaddr *)&la, &len))
        return 2;
    int one = 1, lr[2];
    struct sockaddr_in ra = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int k = 0; k < 2; k++) {
        lr[k] = socket(AF_INET, SOCK_STREAM, 0);
        len = sizeof ra;
        if (lr[k] < 0 || setsockopt(lr[k], SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) || bind(lr[k], (struct sockaddr *)&ra, sizeof ra) ||
            listen(lr[k], 4) || getsockname(lr[k], (struct sockaddr *)&ra, &len))
            return 2;
    }
    if (setsockopt(lr[0], SOL_SOCKET, SO_REUSEPORT, &(int){0}, sizeof(int)))
        return 2;
    t1 = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(t1, (struct sockaddr *)&la, sizeof la))
        return 2;
    t2 = accept(l, NULL, NULL);
    close(l);
    if (t2 < 0)
        return 2;
    setint(t1, IPPROTO_IP, IP_TOS, 0x08, "IP_TOS");
    setint(t1, SOL_SOCKET, SO_PRIORITY, 1, "SO_PRIORITY");
    setint(t2, IPPROTO_IP, IP_FREEBIND, 1, "IP_FREEBIND");
    setint(t2, SOL_SOCKET, SO_RCVLOWAT, 4, "SO_RCVLOWAT");
    if (root)
        setint(t2, SOL_SOCKET, SO_MARK, 7, "SO_MARK");

    u6 = socket(AF_INET6, SOCK_DGRAM, 0);
    if (u6 >= 0) {
        setint(u6, IPPROTO_IPV6, IPV6_TCLASS, 0x20, "IPV6_TCLASS");
        setint(u6, IPPROTO_IPV6, IPV6_UNICAST_HOPS, 5, "IPV6_UNICAST_HOPS");
        setint(u6, IPPROTO_IPV6, IPV6_RECVPKTINFO, 1, "IPV6_RECVPKTINFO");
    }

    struct opt opts[] = {
        {"S IP_TOS", &s, IPPROTO_IP, IP_TOS, 0x10},
        {"S IP_TTL", &s, IPPROTO_IP, IP_TTL, 9},
        {"S IP_MULTICAST_TTL", &s, IPPROTO_IP, IP_MULTICAST_TTL, 3},
        {"S IP_MULTICAST_LOOP", &s, IPPROTO_IP, IP_MULTICAST_LOOP, 0},
        {"S IP_RECVERR", &s, IPPROTO_IP, IP_RECVERR, 1},
        {"S SO_PRIORITY", &s, SOL_SOCKET, SO_PRIORITY, 2},
        {"R IP_PKTINFO", &r, IPPROTO_IP, IP_PKTINFO, 1},
        {"R SO_TIMESTAMPNS", &r, SOL_SOCKET, SO_TIMESTAMPNS, 1},
        {"R SO_LOCK_FILTER", &r, SOL_SOCKET, SO_LOCK_FILTER, 1},
        {"T1 IP_TOS", &t1, IPPROTO_IP, IP_TOS, 0x08},
        {"T1 SO_PRIORITY", &t1, SOL_SOCKET, SO_PRIORITY, 1},
        {"T2 IP_FREEBIND", &t2, IPPROTO_IP, IP_FREEBIND, 1},
        {"T2 SO_RCVLOWAT", &t2, SOL_SOCKET, SO_RCVLOWAT, 4},
        {"T2 SO_MARK", &t2, SOL_SOCKET, SO_MARK, 7},
        {"U6 IPV6_TCLASS", &u6, IPPROTO_IPV6, IPV6_TCLASS, 0x20},
        {"U6 IPV6_UNICAST_HOPS", &u6, IPPROTO_IPV6, IPV6_UNICAST_HOPS, 5},
        {"U6 IPV6_RECVPKTINFO", &u6, IPPROTO_IPV6, IPV6_RECVPKTINFO, 1},
    };

    int reported[sizeof opts / sizeof opts[0]] = {0};
    uint64_t h = 0;
    /* A few "A" datagrams stay queued from one step to the next, across the checkpoints. */
    for (int i = 0; i < QUEUED; i++)
        send_one(&at, 'A', -1 - i);
    for (long step = 0; step < steps; step++) {
        send_one(&at, 'B', step);
        send_one(&at, 'A', step);
        sleep_ms(STEP_MS);
        uint64_t got = receive_one(step);
        if (!got)
            fail("step %ld: nothing arrived", step);
        h = mix64(h ^ got);
        for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
            if (*opts[i].fd < 0 || (opts[i].name == SO_MARK && !root) || reported[i])
                continue;
            int v = getint(*opts[i].fd, opts[i].level, opts[i].name);
            if (v != opts[i].value) {
                fail("step %ld: %s is %d, not %d", step, opts[i].what, v, opts[i].value);
                reported[i] = 1;
            }
        }
        char dev[IFNAMSIZ] = "";
        len = sizeof dev;
        if (getsockopt(r, SOL_SOCKET, SO_BINDTODEVICE, dev, &len) || strcmp(dev, "lo"))
            fail("step %ld: R is bound to the device \"%s\", not lo", step, dev);
    }
    while (receive_one(steps))
        ;
    int zero = 0;
    if (setsockopt(r, SOL_SOCKET, SO_DETACH_FILTER, &zero, sizeof zero) == 0 || errno != EPERM)
        fail("the filter could be detached: it is not locked");
    /* And the TCP connection still carries bytes. */
    if (write(t1, "ping", 4) != 4 || read_full(t2, (char[4]){0}, 4))
        fail("the TCP connection does not carry bytes");
    struct sockaddr_in lat[2];
    for (int k = 0; k < 2; k++) {
        len = sizeof lat[k];
        if (getsockname(lr[k], (struct sockaddr *)&lat[k], &len) || lat[k].sin_port != ra.sin_port || getint(lr[k], SOL_SOCKET, SO_ACCEPTCONN) != 1 ||
            getint(lr[k], SOL_SOCKET, SO_REUSEPORT) != k)
            fail("reuseport listener %d: port %d (was %d), listening %d, SO_REUSEPORT %d (was %d)", k, ntohs(lat[k].sin_port),
                 ntohs(ra.sin_port), getint(lr[k], SOL_SOCKET, SO_ACCEPTCONN), getint(lr[k], SOL_SOCKET, SO_REUSEPORT), k);
        fcntl(lr[k], F_SETFL, O_NONBLOCK);
    }
    int c = socket(AF_INET, SOCK_STREAM, 0), got = -1;
    if (c < 0 || connect(c, (struct sockaddr *)&ra, sizeof ra))
        fail("connect to the reuseport listeners: %s", strerror(errno));
    for (int i = 0; i < 100 && got < 0; i++) {
        got = accept(lr[i % 2], NULL, NULL);
        if (got < 0)
            sleep_ms(5);
    }
    if (got < 0)
        fail("neither reuseport listener accepted the connection");
    return finish(h);
}
