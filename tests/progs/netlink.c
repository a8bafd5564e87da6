/* netlink: netlink sockets held across checkpoints must come back as they were: a routing
 * socket (NETLINK_ROUTE) bound to its port id, in the multicast groups it joined, with its
 * options, still answering a dump of the links; and a second one left unbound.
 *
 * At every step each socket must show its port id (getsockname), the routing socket its groups
 * (NETLINK_LIST_MEMBERSHIPS: the IPv4 and IPv6 rule groups, which nothing on a test machine
 * changes, so no event waits in the queue) and NETLINK_NO_ENOBUFS; every tenth step it asks for
 * the links (RTM_GETLINK dump, sequence number = step) and reads the reply to its end, which
 * must carry that sequence number and name the loopback device. Prints PASS or FAIL <what>.
 *
 * Beside them, user-to-user sockets (NETLINK_USERSOCK, which ordinary users may send on): a
 * receiver bound to a port id the kernel chose, a listener in multicast group 5, and two senders
 * connected (connect(2)) to the receiver's port id and to group 5; every tenth step each sender
 * sends with send(), no address, and the receiver and the listener must each get that message,
 * and getpeername must name what each sender was connected to (zdtm's sk-netlink). Joining a
 * user-to-user group needs root: an ordinary user's run has the receiver and its sender only.
 *
 * With GO_FILE, the program is caught in the middle of a dump once: at step 25 it reads the
 * reply's first part, prints MIDDUMP and leaves the rest (the kernel's closing message) unread
 * until GO_FILE exists, as a checkpoint comes.
 *
 * Usage: netlink [SECONDS=5] [GO_FILE]
 */
#include "common.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>

#ifndef NETLINK_LIST_MEMBERSHIPS
#define NETLINK_LIST_MEMBERSHIPS 9
#endif

static uint32_t port_of(int s)
{
    struct sockaddr_nl a;
    socklen_t len = sizeof a;
    if (getsockname(s, (struct sockaddr *)&a, &len) != 0)
        return ~0u;
    return a.nl_pid;
}

/* Asks for the links and reads the whole reply; returns 1 if it named "lo" under `seq`. With
 * `wait_for`, stops after the reply's first part until that file exists. */
static int dump_links(int s, uint32_t seq, const char *wait_for)
{
    struct {
        struct nlmsghdr h;
        struct ifinfomsg i;
    } req = {
        .h = {.nlmsg_len = sizeof req, .nlmsg_type = RTM_GETLINK, .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP, .nlmsg_seq = seq},
        .i = {.ifi_family = AF_UNSPEC},
    };
    if (send(s, &req, sizeof req, 0) != (ssize_t)sizeof req)
        return 0;
    static char buf[65536];
    int saw_lo = 0;
    for (;;) {
        ssize_t n = recv(s, buf, sizeof buf, 0);
        if (n <= 0)
            return 0;
        if (wait_for) {
            printf("MIDDUMP\n");
            fflush(stdout);
            while (access(wait_for, F_OK) != 0)
                sleep_ms(5);
            wait_for = NULL;
        }
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_seq != seq)
                continue; /* not ours */
            if (h->nlmsg_type == NLMSG_DONE)
                return saw_lo;
            if (h->nlmsg_type == NLMSG_ERROR)
                return 0;
            if (h->nlmsg_type != RTM_NEWLINK)
                continue;
            struct ifinfomsg *ifi = NLMSG_DATA(h);
            int len = IFLA_PAYLOAD(h);
            for (struct rtattr *a = IFLA_RTA(ifi); RTA_OK(a, len); a = RTA_NEXT(a, len))
                if (a->rta_type == IFLA_IFNAME && strcmp(RTA_DATA(a), "lo") == 0)
                    saw_lo = 1;
        }
    }
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    const char *go_file = argc > 2 ? argv[2] : NULL;
    int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    int idle = socket(AF_NETLINK, SOCK_DGRAM, NETLINK_ROUTE);
    struct sockaddr_nl a = {.nl_family = AF_NETLINK};
    if (s < 0 || idle < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0)
        return printf("FAIL set-up: netlink sockets: %s\n", strerror(errno)), 1;
    int groups[] = {RTNLGRP_IPV4_RULE, RTNLGRP_IPV6_RULE};
    for (int i = 0; i < 2; i++)
        if (setsockopt(s, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, &groups[i], sizeof groups[i]) != 0)
            return printf("FAIL set-up: join group %d: %s\n", groups[i], strerror(errno)), 1;
    int on = 1;
    if (setsockopt(s, SOL_NETLINK, NETLINK_NO_ENOBUFS, &on, sizeof on) != 0)
        return printf("FAIL set-up: NETLINK_NO_ENOBUFS\n"), 1;
    uint32_t port = port_of(s);
    uint32_t idle_port = port_of(idle);

    /* The user-to-user sockets: receiver, listener, and the senders connected to them. */
    int recv_s = socket(AF_NETLINK, SOCK_RAW, NETLINK_USERSOCK), listen_s = socket(AF_NETLINK, SOCK_RAW, NETLINK_USERSOCK);
    int to_port = socket(AF_NETLINK, SOCK_RAW, NETLINK_USERSOCK), to_group = socket(AF_NETLINK, SOCK_RAW, NETLINK_USERSOCK);
    struct sockaddr_nl any = {.nl_family = AF_NETLINK}, in_group = {.nl_family = AF_NETLINK, .nl_groups = 1u << 4};
    if (recv_s < 0 || listen_s < 0 || to_port < 0 || to_group < 0 || bind(recv_s, (struct sockaddr *)&any, sizeof any) != 0)
        return printf("FAIL set-up: user-to-user netlink sockets: %s\n", strerror(errno)), 1;
    /* Only root may join a user-to-user group: an ordinary user's run has the port part only. */
    int with_group = geteuid() == 0;
    if (with_group && bind(listen_s, (struct sockaddr *)&in_group, sizeof in_group) != 0)
        return printf("FAIL set-up: join group 5: %s\n", strerror(errno)), 1;
    struct sockaddr_nl at_port = {.nl_family = AF_NETLINK, .nl_pid = port_of(recv_s)};
    if (connect(to_port, (struct sockaddr *)&at_port, sizeof at_port) != 0 ||
        (with_group && connect(to_group, (struct sockaddr *)&in_group, sizeof in_group) != 0))
        return printf("FAIL set-up: connect user-to-user netlink sockets: %s\n", strerror(errno)), 1;
    int senders[2] = {to_port, to_group}, receivers[2] = {recv_s, listen_s};
    /* This run's messages, told from other runs' in a group. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t run_tag = mix64((uint64_t)now.tv_nsec ^ ((uint64_t)getpid() << 32));
    struct sockaddr_nl peers[2] = {at_port, in_group};

    uint64_t result = 0;
    for (long step = 0; step < steps; step++) {
        for (int k = 0; k < 1 + with_group && step % 10 == 0; k++) {
            struct sockaddr_nl peer;
            socklen_t plen = sizeof peer;
            if (getpeername(senders[k], (struct sockaddr *)&peer, &plen) != 0 || peer.nl_pid != peers[k].nl_pid || peer.nl_groups != peers[k].nl_groups)
                fail("step %ld: sender %d is connected to port %u groups %#x, was port %u groups %#x", step, k, peer.nl_pid, peer.nl_groups,
                     peers[k].nl_pid, peers[k].nl_groups);
            struct {
                struct nlmsghdr h;
                uint64_t body;
            } msg = {.h = {.nlmsg_len = sizeof msg, .nlmsg_type = 0x1234, .nlmsg_seq = (uint32_t)step}, .body = mix64(run_tag ^ (uint64_t)step)}, got;
            /* A send to a group goes to the kernel's port 0 too, which no user-to-user socket
             * has: ECONNREFUSED once the group has it. */
            if (send(senders[k], &msg, sizeof msg, 0) != (ssize_t)sizeof msg && !(k == 1 && errno == ECONNREFUSED))
                fail("step %ld: sender %d: send: %s", step, k, strerror(errno));
            else {
                /* A group is the network namespace's: other runs' messages may be queued
                 * too (the test's reference run beside the job), each with its own tag. */
                int found = 0;
                while (!found && recv(receivers[k], &got, sizeof got, MSG_DONTWAIT) == (ssize_t)sizeof got)
                    found = got.h.nlmsg_seq == (uint32_t)step && got.body == msg.body;
                if (!found)
                    fail("step %ld: what sender %d sent did not reach its %s", step, k, k ? "group's listener" : "receiver");
            }
        }
        if (port_of(s) != port)
            fail("step %ld: port id %u, was %u", step, port_of(s), port);
        if (port_of(idle) != idle_port)
            fail("step %ld: the unbound socket's port id %u, was %u", step, port_of(idle), idle_port);
        uint32_t bits[4] = {0};
        socklen_t len = sizeof bits;
        if (getsockopt(s, SOL_NETLINK, NETLINK_LIST_MEMBERSHIPS, bits, &len) != 0)
            fail("step %ld: NETLINK_LIST_MEMBERSHIPS: %s", step, strerror(errno));
        for (int i = 0; i < 2; i++)
            if (!(bits[(groups[i] - 1) / 32] & (1u << ((groups[i] - 1) % 32))))
                fail("step %ld: not in group %d any more", step, groups[i]);
        int v = 0;
        len = sizeof v;
        if (getsockopt(s, SOL_NETLINK, NETLINK_NO_ENOBUFS, &v, &len) != 0 || !v)
            fail("step %ld: NETLINK_NO_ENOBUFS is off", step);
        int type = 0;
        len = sizeof type;
        if (getsockopt(idle, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_DGRAM)
            fail("step %ld: the second socket's type is %d", step, type);
        if ((step % 10 == 0 || step == 25) && !dump_links(s, (uint32_t)step + 1, step == 25 ? go_file : NULL))
            fail("step %ld: the links' dump did not name lo", step);
        result = mix64(result ^ (uint64_t)step);
        sleep_ms(STEP_MS);
    }
    return finish(result);
}
