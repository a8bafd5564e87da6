/* eventfd: eventfd counters and their flags survive checkpoint/restart.
 *
 *  - counter (EFD_NONBLOCK|EFD_CLOEXEC): step s adds s+1; every 8th step one read must return
 *    the sum added since the last read (so the count at a checkpoint is rarely zero);
 *  - semaphore (EFD_SEMAPHORE, blocking, starts at 3): each step adds 2 and reads once, which
 *    must return 1; at the end 3+steps reads drain it, one at a time;
 *  - big: a count above 2^32, written at the start and read at the end;
 *  - shared with a child: the child adds k at its step k; the parent reads until it has
 *    n(n+1)/2 in all (each wait bounded, so a lost counter fails rather than hangs).
 * The flags (O_NONBLOCK, FD_CLOEXEC) are checked after the run. RESULT hashes what was read.
 *
 * Usage: eventfd [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIG 0xfffffffffffffff0ULL

static uint64_t h;

static int read_count(int fd, uint64_t *v)
{
    for (;;) {
        ssize_t n = read(fd, v, sizeof *v);
        if (n == sizeof *v)
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        return -1;
    }
}

static void add(int fd, uint64_t v)
{
    while (write(fd, &v, sizeof v) != sizeof v)
        if (errno != EINTR) {
            fail("write %llu to an eventfd: %s", (unsigned long long)v, strerror(errno));
            return;
        }
}

/* Whether fd becomes readable within `ms`. */
static int readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (;;) {
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR)
            continue;
        return r == 1 && (p.revents & POLLIN);
    }
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);

    int counter = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int sem = eventfd(3, EFD_SEMAPHORE);
    int big = eventfd(0, 0);
    int shared = eventfd(0, 0);
    if (counter < 0 || sem < 0 || big < 0 || shared < 0) {
        perror("eventfd");
        return 2;
    }
    add(big, BIG);

    pid_t child = fork();
    if (child == 0) {
        for (long k = 1; k <= steps; k++) {
            add(shared, (uint64_t)k);
            sleep_ms(STEP_MS);
        }
        _exit(failures ? 1 : 0);
    }
    uint64_t shared_want = (uint64_t)steps * (uint64_t)(steps + 1) / 2, shared_got = 0;

    uint64_t added = 0;
    for (long s = 0; s < steps; s++) {
        add(counter, (uint64_t)s + 1);
        added += (uint64_t)s + 1;
        if (s % 8 == 7) {
            uint64_t v = 0;
            if (read_count(counter, &v) || v != added)
                fail("step %ld: counter read %llu, expected %llu", s, (unsigned long long)v,
                     (unsigned long long)added);
            h = mix64(h ^ v);
            added = 0;
        }
        add(sem, 2);
        uint64_t one = 0;
        if (!readable(sem, 1000))
            fail("step %ld: the semaphore is empty (count lost?)", s);
        else if (read_count(sem, &one) || one != 1)
            fail("step %ld: semaphore read %llu, expected 1", s, (unsigned long long)one);
        while (shared_got < shared_want && readable(shared, 0)) {
            uint64_t v = 0;
            if (read_count(shared, &v) == 0)
                shared_got += v;
        }
        sleep_ms(STEP_MS);
    }

    /* counter: what is left since the last read, then nothing (EAGAIN: still non-blocking) */
    uint64_t v = 0;
    if (added && (read_count(counter, &v) || v != added))
        fail("counter: final read %llu, expected %llu", (unsigned long long)v,
             (unsigned long long)added);
    if (read(counter, &v, sizeof v) != -1 || errno != EAGAIN)
        fail("counter: an empty non-blocking eventfd did not say EAGAIN (O_NONBLOCK lost?)");
    h = mix64(h ^ v);

    /* semaphore: 3 + steps reads of 1, then empty */
    long reads = 0;
    while (readable(sem, 0)) {
        if (read_count(sem, &v) || v != 1) {
            fail("semaphore: read %llu, expected 1 (EFD_SEMAPHORE lost?)", (unsigned long long)v);
            break;
        }
        reads++;
    }
    if (reads != 3 + steps)
        fail("semaphore: %ld reads at the end, expected %ld", reads, 3 + steps);

    if (read_count(big, &v) || v != BIG)
        fail("big counter read %#llx, expected %#llx", (unsigned long long)v,
             (unsigned long long)BIG);

    while (shared_got < shared_want) {
        if (!readable(shared, 2000)) {
            fail("shared: no more from the child after %llu of %llu",
                 (unsigned long long)shared_got, (unsigned long long)shared_want);
            break;
        }
        if (read_count(shared, &v) == 0)
            shared_got += v;
    }
    if (shared_got != shared_want)
        fail("shared: %llu in all, expected %llu", (unsigned long long)shared_got,
             (unsigned long long)shared_want);
    int st;
    if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("child status %#x", st);

    if (!(fcntl(counter, F_GETFL) & O_NONBLOCK) || (fcntl(sem, F_GETFL) & O_NONBLOCK))
        fail("O_NONBLOCK changed");
    if (!(fcntl(counter, F_GETFD) & FD_CLOEXEC) || (fcntl(sem, F_GETFD) & FD_CLOEXEC))
        fail("FD_CLOEXEC changed");

    h = mix64(h ^ (uint64_t)reads ^ shared_got);
    return finish(h);
}
