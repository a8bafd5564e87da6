/* epollmoved: an epoll instance keeps watching files whose descriptor number it knows them by
 * is closed or holds another file, across checkpoint/restart.
 *
 * The kernel keys each watch by the file and the number it was added with, and keeps it while
 * the file is open anywhere. So:
 *  - an eventfd E is watched as fd N (data DATA_E), then dup'ed to fd M and N closed: the
 *    watch stays, under N, and the program uses E through M;
 *  - a pipe is made next, its read end taking number N, and watched too (data DATA_P): two
 *    files under the one number N.
 * Each step writes to E on even steps and into the pipe every third step, sleeps (the
 * checkpoint lands there), then epoll_wait must report exactly those ready, with their data,
 * and the reads clear them. At the end the keys must be the kernel's as they were:
 * EPOLL_CTL_MOD of M fails with ENOENT (E is known as N, not M), EPOLL_CTL_DEL of N removes the
 * pipe's watch (the file at N now), after which E's watch still reports.
 * RESULT hashes the events seen.
 *
 * Usage: epollmoved [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#define DATA_E 0x1234000000005678ULL
#define DATA_P 0x9abc00000000def0ULL

static void watch(int ep, int fd, uint64_t data)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = data};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        perror("epoll_ctl");
        exit(2);
    }
}

/* What epoll_wait reports now: bit 0 for DATA_E, bit 1 for DATA_P, bit 2 for anything else. */
static int ready(int ep)
{
    struct epoll_event evs[8];
    int n = epoll_wait(ep, evs, 8, 0);
    int bits = 0;
    for (int i = 0; i < n; i++)
        bits |= evs[i].data.u64 == DATA_E ? 1 : evs[i].data.u64 == DATA_P ? 2 : 4;
    return n < 0 ? -1 : bits;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int n = eventfd(0, EFD_NONBLOCK);
    if (ep < 0 || n < 0)
        return 2;
    watch(ep, n, DATA_E);
    int m = fcntl(n, F_DUPFD, 20);
    close(n);
    int p[2];
    if (m < 0 || pipe2(p, O_NONBLOCK))
        return 2;
    if (p[0] != n) {
        printf("setup: the pipe took fd %d, not %d\n", p[0], n);
        return 2;
    }
    watch(ep, p[0], DATA_P);

    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        int want = 0;
        if (s % 2 == 0) {
            uint64_t one = 1;
            if (write(m, &one, sizeof one) != sizeof one)
                fail("step %ld: write the eventfd", s);
            want |= 1;
        }
        if (s % 3 == 0) {
            char c = (char)s;
            if (write(p[1], &c, 1) != 1)
                fail("step %ld: write the pipe", s);
            want |= 2;
        }
        sleep_ms(STEP_MS);
        int got = ready(ep);
        if (got != want) {
            fail("step %ld: epoll reports %d, not %d", s, got, want);
            break;
        }
        uint64_t v;
        char c;
        if (want & 1 && read(m, &v, sizeof v) != sizeof v)
            fail("step %ld: read the eventfd", s);
        if (want & 2 && read(p[0], &c, 1) != 1)
            fail("step %ld: read the pipe", s);
        h = mix64(h ^ (uint64_t)(s * 4 + got));
    }

    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = DATA_E};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, m, &ev) == 0 || errno != ENOENT)
        fail("EPOLL_CTL_MOD of fd %d found a watch: the eventfd's is not under fd %d any more", m, n);
    if (epoll_ctl(ep, EPOLL_CTL_DEL, n, NULL) != 0)
        fail("EPOLL_CTL_DEL of fd %d: %s", n, strerror(errno));
    char c = 'x';
    uint64_t one = 1;
    if (write(p[1], &c, 1) != 1 || write(m, &one, sizeof one) != sizeof one)
        fail("the last writes");
    if (ready(ep) != 1)
        fail("after the pipe's watch was removed, epoll reports %d, not the eventfd alone", ready(ep));
    return finish(h);
}
