/* epoll: an epoll instance keeps its interest list (events and data) across checkpoint/restart.
 *
 * The instance is created first, so its descriptor number is below those it watches:
 *  - the read end of a pipe, EPOLLIN, data DATA_PIPE: step s writes s into the pipe on even
 *    steps;
 *  - an eventfd, EPOLLIN, data DATA_EFD: step s adds s+1 on every third step;
 *  - an idle eventfd, EPOLLIN, data DATA_IDLE: never ready;
 *  - an eventfd written once at the start, EPOLLIN|EPOLLONESHOT, data DATA_ONCE: reported by
 *    the first wait only, though it stays readable;
 *  - the write end of the pipe, EPOLLOUT, data DATA_OUT: always ready.
 * Each step writes, sleeps (the checkpoint lands there, with events ready), then epoll_wait
 * must report exactly the expected set with the right data, and the reads the values written.
 * A child holds the same instance and checks at the end that it still reports DATA_OUT.
 * RESULT hashes the events seen.
 *
 * Usage: epoll [SECONDS=4]
 */
#include "common.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#define DATA_PIPE 0x1111222233334444ULL
#define DATA_EFD 0x5555666677778888ULL
#define DATA_IDLE 0x99990000aaaabbbbULL
#define DATA_ONCE 0xccccddddeeeeffffULL
#define DATA_OUT 0x0123456789abcdefULL

static void watch(int ep, int fd, uint32_t events, uint64_t data)
{
    struct epoll_event ev = {.events = events, .data.u64 = data};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        perror("epoll_ctl");
        exit(2);
    }
}

/* The bit of each data value in a set of events. */
static unsigned bit_of(uint64_t data)
{
    switch (data) {
    case DATA_PIPE: return 1;
    case DATA_EFD: return 2;
    case DATA_IDLE: return 4;
    case DATA_ONCE: return 8;
    case DATA_OUT: return 16;
    default: return 32;
    }
}

static unsigned wait_set(int ep, int timeout)
{
    struct epoll_event evs[8];
    int n;
    do
        n = epoll_wait(ep, evs, 8, timeout);
    while (n < 0 && errno == EINTR);
    unsigned set = 0;
    for (int i = 0; i < n; i++) {
        unsigned b = bit_of(evs[i].data.u64);
        if (set & b)
            b = 64; /* reported twice */
        set |= b;
    }
    return set;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);

    int ep = epoll_create1(EPOLL_CLOEXEC);
    int p[2];
    if (ep < 0 || pipe(p) != 0)
        return 2;
    int efd = eventfd(0, EFD_NONBLOCK);
    int idle = eventfd(0, 0);
    int once = eventfd(1, 0);
    watch(ep, p[0], EPOLLIN, DATA_PIPE);
    watch(ep, efd, EPOLLIN, DATA_EFD);
    watch(ep, idle, EPOLLIN, DATA_IDLE);
    watch(ep, once, EPOLLIN | EPOLLONESHOT, DATA_ONCE);
    watch(ep, p[1], EPOLLOUT, DATA_OUT);

    pid_t child = fork();
    if (child == 0) {
        for (long s = 0; s < steps; s++)
            sleep_ms(STEP_MS);
        struct epoll_event ev;
        int n = epoll_wait(ep, &ev, 1, 1000);
        /* Level-triggered and always writable: the child consumes nothing of the parent's. */
        _exit(n == 1 && ev.data.u64 == DATA_OUT ? 0 : 1);
    }

    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        if (s % 2 == 0 && write(p[1], &s, sizeof s) != sizeof s)
            fail("step %ld: pipe write", s);
        uint64_t add = (uint64_t)s + 1;
        if (s % 3 == 0 && write(efd, &add, sizeof add) != sizeof add)
            fail("step %ld: eventfd write", s);
        sleep_ms(STEP_MS);

        unsigned want = 16 | (s % 2 == 0 ? 1 : 0) | (s % 3 == 0 ? 2 : 0) | (s == 0 ? 8 : 0);
        unsigned got = wait_set(ep, 0);
        if (got != want) {
            fail("step %ld: epoll reported set %#x, expected %#x", s, got, want);
            if (failures > 5)
                break;
        }
        h = mix64(h ^ got);
        long v;
        if (s % 2 == 0 && (read(p[0], &v, sizeof v) != sizeof v || v != s))
            fail("step %ld: pipe read %ld", s, v);
        uint64_t c;
        if (s % 3 == 0 && (read(efd, &c, sizeof c) != sizeof c || c != add))
            fail("step %ld: eventfd read %llu", s, (unsigned long long)c);
    }
    unsigned last = wait_set(ep, 0);
    if (last != 16)
        fail("at the end epoll reported set %#x, expected only the pipe's write end", last);

    int st;
    if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("the child's epoll_wait went wrong (status %#x)", st);
    return finish(h);
}
