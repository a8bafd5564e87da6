/* aslimit: a process whose address space is at its RLIMIT_AS, so that no new mapping can be
 * made in it. A checkpoint maps a page in each process for its calls there, which fails here:
 * the checkpoint fails, and the process must go on exactly where it was, not at one of the
 * checkpoint's calls.
 *
 * The program lowers its RLIMIT_AS to its present size, checks that a new mapping is refused,
 * then computes in steps as compute does, checking at every step that its sum so far is the
 * one it computes again from the start. RESULT depends on the steps only. Prints PASS or
 * FAIL <what>.
 *
 * Usage: aslimit [SECONDS=4]
 */
#include "common.h"

#include <sys/mman.h>
#include <sys/resource.h>

/* VmSize of this process in bytes, from /proc/self/status; 0 if it cannot be read. */
static unsigned long long vm_size(void)
{
    char buf[4096];
    if (read_small_file("/proc/self/status", buf, sizeof buf) <= 0)
        return 0;
    const char *p = strstr(buf, "VmSize:");
    return p ? strtoull(p + 7, NULL, 10) * 1024 : 0;
}

static uint64_t sum_to(long step)
{
    uint64_t h = 0;
    for (long s = 0; s <= step; s++)
        h = mix64(h ^ (uint64_t)s);
    return h;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    unsigned long long size = vm_size();
    struct rlimit at_size = {size, size};
    if (size == 0 || setrlimit(RLIMIT_AS, &at_size) != 0) {
        printf("FAIL set-up: set RLIMIT_AS to %llu: %s\n", size, strerror(errno));
        return 1;
    }
    void *more = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (more != MAP_FAILED) {
        printf("FAIL set-up: a new mapping was made under RLIMIT_AS %llu\n", size);
        return 1;
    }
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        h = mix64(h ^ (uint64_t)s);
        if (s % 50 == 0 && h != sum_to(s))
            fail("step %ld: the sum so far is %016llx, computed again %016llx", s, (unsigned long long)h, (unsigned long long)sum_to(s));
        sleep_ms(STEP_MS);
    }
    return finish(h);
}
