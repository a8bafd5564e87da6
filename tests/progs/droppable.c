/* droppable: MAP_DROPPABLE memory (where glibc keeps its vDSO getrandom state) and
 * MADV_WIPEONFORK memory across checkpoint/restart (as CRIU's zdtm maps11 expects).
 *
 * D is 4 pages of MAP_DROPPABLE memory, W 4 pages of private anonymous memory given
 * MADV_WIPEONFORK, each filled with its own pattern. A child forked at the start checks every
 * step that its D and W read as zeros (a fork wipes both), after restarts too.
 *
 * The parent, every step: each page of D is its pattern or all zeros (the kernel may drop it
 * at any moment); a D found dropped is noted and written again. W keeps its pattern. Every
 * CHECK_EVERY steps (not every step: a checkpoint that finds a /proc file open makes the restart
 * refuse it) it reads smaps (D is still "dp", W still "wf") and its own start time from
 * /proc/self/stat: a start time that changed means the process was restarted since the last
 * look, and then D must have been found dropped since: a restart that brought D's old bytes
 * back would give two restarts of one image the same random state. It also forks a child that
 * checks its D and W read as zeros.
 *
 * RESULT depends on W's pattern and the steps only. Prints PASS or FAIL <what>.
 *
 * Usage: droppable [SECONDS=5]
 */
#include "common.h"

#include <sys/mman.h>
#include <sys/wait.h>

#include "smaps.h"

#define PAGES 4
#define PG 4096
#define CHECK_EVERY 8
#ifndef MAP_DROPPABLE
#define MAP_DROPPABLE 0x08
#endif

static uint8_t pat(uint64_t salt, size_t i)
{
    return (uint8_t)(mix64(salt * 7919ULL + i / 8) >> (8 * (i % 8)));
}

static void fill(uint8_t *m, uint64_t salt)
{
    for (size_t i = 0; i < PAGES * PG; i++)
        m[i] = pat(salt, i);
}

static int page_is_zero(const uint8_t *p)
{
    for (size_t i = 0; i < PG; i++)
        if (p[i])
            return 0;
    return 1;
}

/* Checks that D and W read as zeros (a forked child's view). */
static void check_wiped(const char *who, long step, const uint8_t *d, const uint8_t *w)
{
    for (int page = 0; page < PAGES; page++) {
        if (!page_is_zero(d + (size_t)page * PG))
            fail("%s step %ld: page %d of the droppable memory is not zero after the fork", who, step, page);
        if (!page_is_zero(w + (size_t)page * PG))
            fail("%s step %ld: page %d of the wiped-on-fork memory is not zero after the fork", who, step, page);
    }
}

/* The process's start time, field 22 of /proc/self/stat; 0 if it cannot be read. */
static unsigned long long start_time(void)
{
    char buf[1024];
    if (read_small_file("/proc/self/stat", buf, sizeof buf) <= 0)
        return 0;
    char *p = strrchr(buf, ')');
    unsigned long long t = 0;
    /* After the name: state (field 3) ... starttime (field 22). */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &t) != 1)
        return 0;
    return t;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    uint8_t *d = mmap(NULL, PAGES * PG, PROT_READ | PROT_WRITE, MAP_DROPPABLE | MAP_ANONYMOUS, -1, 0);
    uint8_t *w = mmap(NULL, PAGES * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (d == MAP_FAILED || w == MAP_FAILED || madvise(w, PAGES * PG, MADV_WIPEONFORK) != 0) {
        printf("FAIL set-up: map the memory: %s\n", strerror(errno));
        return 1;
    }
    fill(d, 1);
    fill(w, 2);
    pid_t child = fork();
    if (child == 0) {
        for (long step = 0; step < steps; step++) {
            check_wiped("the child", step, d, w);
            sleep_ms(STEP_MS);
        }
        exit(failures ? 1 : 0);
    }

    unsigned long long started = start_time();
    long dropped = 0, restarts = 0;
    int dropped_since_look = 0;
    uint64_t result = 0;
    for (long step = 0; step < steps; step++) {
        int zero = 0;
        for (int page = 0; page < PAGES; page++) {
            const uint8_t *p = d + (size_t)page * PG;
            if (page_is_zero(p)) {
                zero++;
                continue;
            }
            for (size_t i = 0; i < PG; i++)
                if (p[i] != pat(1, (size_t)page * PG + i)) {
                    fail("step %ld: page %d of the droppable memory is neither its bytes nor dropped (byte %zu: %#x)", step, page, i, p[i]);
                    break;
                }
        }
        if (zero) {
            dropped++;
            dropped_since_look = 1;
            fill(d, 1);
        }
        for (size_t i = 0; i < PAGES * PG; i++)
            if (w[i] != pat(2, i)) {
                fail("step %ld: the wiped-on-fork memory changed at byte %zu", step, i);
                break;
            }
        if (step % CHECK_EVERY == 0) {
            unsigned long long now = start_time();
            if (now == 0 || started == 0)
                fail("step %ld: read the start time in /proc/self/stat", step);
            else if (now != started) {
                restarts++;
                if (!dropped_since_look)
                    fail("step %ld: restarted, and the droppable memory came back with its old bytes", step);
                started = now;
            }
            dropped_since_look = 0;
            char buf[256];
            const char *flags = read_smaps() == 0 ? flags_at(d, buf, sizeof buf) : NULL;
            if (!flags || !has_flag(flags, "dp"))
                fail("step %ld: the droppable memory is not droppable (VmFlags:%s)", step, flags ? flags : "?");
            flags = flags ? flags_at(w, buf, sizeof buf) : NULL;
            if (!flags || !has_flag(flags, "wf"))
                fail("step %ld: the wiped-on-fork memory is not wiped on fork (VmFlags:%s)", step, flags ? flags : "?");
            fflush(stdout);
            pid_t c = fork();
            if (c == 0) {
                failures = 0; /* its own checks only */
                check_wiped("a new child", step, d, w);
                fflush(stdout);
                _exit(failures ? 1 : 0);
            }
            int status;
            if (c < 0 || waitpid(c, &status, 0) != c || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
                fail("step %ld: a new child found its memory not wiped", step);
        }
        result = mix64(result ^ (uint64_t)step ^ w[(size_t)step % (PAGES * PG)]);
        sleep_ms(STEP_MS);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the first child ended with status %#x", status);
    fprintf(stderr, "droppable: found dropped %ld times, restarted %ld times\n", dropped, restarts);
    return finish(result);
}
