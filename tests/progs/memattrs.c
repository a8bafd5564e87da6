/* memattrs: locked memory, madvise flags and membarrier registrations survive checkpoint/restart.
 *
 * At start the program forks two children, then maps a region of 11 parts of 4 pages, each
 * filled with its own pattern, and gives them, in order: mlock; mlock2(MLOCK_ONFAULT); nothing;
 * MADV_DONTFORK; MADV_WIPEONFORK; MADV_DONTDUMP; MADV_HUGEPAGE; MADV_NOHUGEPAGE;
 * MADV_SEQUENTIAL; MADV_RANDOM; MADV_MERGEABLE (nothing on a kernel without KSM). Then
 * mlockall(MCL_FUTURE), and membarrier
 * registrations for private expedited, private expedited sync-core and global expedited
 * barriers. The first child instead does mlockall(MCL_FUTURE | MCL_ONFAULT) and registers for
 * private expedited rseq barriers only. The second locks one range, then lowers its soft
 * RLIMIT_MEMLOCK to 0 (it keeps what it locked; an ordinary user could not lock it again under
 * that limit), and registers for nothing.
 *
 * Every step both check that the membarrier commands registered for work, the others fail with
 * EPERM, and MEMBARRIER_CMD_GET_REGISTRATIONS says what it said at start, and that a fresh
 * mapping is faulted in at once (MCL_FUTURE) or not (MCL_ONFAULT); the parent checks its parts'
 * contents and forks a short-lived child that checks that the MADV_WIPEONFORK part reads as
 * zeros there and the MADV_DONTFORK part is not mapped. Every CHECK_EVERY steps both also check,
 * from /proc/self/smaps, that each part has exactly its flags (lo lf dc wf dd hg nh sr rr) and
 * that the fresh mapping is locked (lo, and lf on fault). Not every step: a checkpoint that finds
 * a /proc file open makes the restart refuse it (the file's inode differs), and reading smaps
 * keeps it open a while.
 *
 * Usage: memattrs [SECONDS=5]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define PART_PAGES 4
#define PARTS 11
#define CHECK_EVERY 8

#define MB_GLOBAL_EXPEDITED_REG (1 << 2)
#define MB_PRIVATE_EXPEDITED (1 << 3)
#define MB_PRIVATE_EXPEDITED_REG (1 << 4)
#define MB_SYNC_CORE (1 << 5)
#define MB_SYNC_CORE_REG (1 << 6)
#define MB_RSEQ (1 << 7)
#define MB_RSEQ_REG (1 << 8)
#define MB_GET_REGISTRATIONS (1 << 9)

#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif
#ifndef MCL_ONFAULT
#define MCL_ONFAULT 4
#endif

/* (The last part's "mg" is taken out at the set-up on a kernel without KSM.) */
static const char *part_flags[PARTS] = {"lo", "lo lf", "", "dc", "wf", "dd", "hg", "nh", "sr", "rr", "mg"};
static const char *const checked[] = {"lo", "lf", "dc", "wf", "dd", "hg", "nh", "sr", "rr", "mg"};

static long page;
static unsigned char *region;

static long membarrier(int cmd)
{
    return syscall(SYS_membarrier, cmd, 0, 0);
}

static unsigned char *part(int i)
{
    return region + (size_t)i * PART_PAGES * (size_t)page;
}

static size_t part_len(void)
{
    return (size_t)PART_PAGES * (size_t)page;
}

static unsigned char pattern(int i, size_t off)
{
    return (unsigned char)(0x40 + i * 7 + off % 13);
}

#include "smaps.h"

/* The mapping at addr has exactly the checked flags listed in `want`. */
static void check_flags(const char *who, long step, const char *what, const void *addr, const char *want)
{
    char buf[256];
    const char *flags = flags_at(addr, buf, sizeof buf);
    if (!flags) {
        fail("%s step %ld: %s at %p is not in smaps", who, step, what, addr);
        return;
    }
    for (size_t k = 0; k < sizeof checked / sizeof checked[0]; k++) {
        int wanted = has_flag(want, checked[k]);
        if (has_flag(flags, checked[k]) != wanted)
            fail("%s step %ld: %s at %p %s flag %s (VmFlags:%s)", who, step, what, addr,
                 wanted ? "lacks" : "has", checked[k], flags);
    }
}

/* A fresh mapping is locked the way mlockall said: its page faulted in at once unless on fault;
 * with `smaps`, also "lo" (and "lf" with MCL_ONFAULT) and the parts' flags (parent). */
static void check_mappings(const char *who, long step, int on_fault, int smaps)
{
    void *fresh = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fresh == MAP_FAILED) {
        fail("%s step %ld: mmap: %s", who, step, strerror(errno));
        return;
    }
    unsigned char resident = 0;
    mincore(fresh, (size_t)page, &resident);
    if ((resident & 1) == on_fault)
        fail("%s step %ld: a fresh mapping is %sfaulted in (mlockall%s)", who, step, on_fault ? "" : "not ",
             on_fault ? " MCL_ONFAULT" : "");
    if (smaps && read_smaps() != 0) {
        fail("%s step %ld: cannot read /proc/self/smaps", who, step);
    } else if (smaps) {
        check_flags(who, step, "a fresh mapping", fresh, on_fault ? "lo lf" : "lo");
        for (int p = 0; region && p < PARTS; p++) {
            char what[32];
            snprintf(what, sizeof what, "part %d", p);
            check_flags(who, step, what, part(p), part_flags[p]);
            check_flags(who, step, what, part(p) + part_len() - 1, part_flags[p]);
        }
    }
    munmap(fresh, (size_t)page);
}

static void check_membarrier(const char *who, long step, long query, int registered, long registrations)
{
    static const int cmds[] = {MB_PRIVATE_EXPEDITED, MB_SYNC_CORE, MB_RSEQ};
    static const int regs[] = {MB_PRIVATE_EXPEDITED_REG, MB_SYNC_CORE_REG, MB_RSEQ_REG};
    for (int k = 0; k < 3; k++) {
        if (!(query & cmds[k]))
            continue;
        long r = membarrier(cmds[k]);
        int want = (registered & regs[k]) != 0;
        if (want && r != 0)
            fail("%s step %ld: membarrier(%#x) registered but fails: %s", who, step, cmds[k], strerror(errno));
        if (!want && !(r == -1 && errno == EPERM))
            fail("%s step %ld: membarrier(%#x) not registered but gives %ld", who, step, cmds[k], r);
    }
    if (query & MB_GET_REGISTRATIONS) {
        long r = membarrier(MB_GET_REGISTRATIONS);
        if (r != registrations)
            fail("%s step %ld: membarrier registrations %#lx, were %#lx", who, step, r, registrations);
    }
}

/* The first long-lived child: mlockall(MCL_FUTURE | MCL_ONFAULT), rseq barriers only. */
static int onfault_child(long steps, long query)
{
    int reg = query & MB_RSEQ_REG;
    if (mlockall(MCL_FUTURE | MCL_ONFAULT) != 0 || (reg && membarrier(reg) != 0)) {
        printf("FAIL child setup: %s\n", strerror(errno));
        return 2;
    }
    long registrations = (query & MB_GET_REGISTRATIONS) ? membarrier(MB_GET_REGISTRATIONS) : 0;
    for (long i = 0; i < steps; i++) {
        check_mappings("child", i, 1, i % CHECK_EVERY == 0 || i == steps - 1);
        check_membarrier("child", i, query, reg, registrations);
        sleep_ms(STEP_MS);
    }
    return failures ? 1 : 0;
}

/* The second: a locked range, and a soft RLIMIT_MEMLOCK of 0 since. */
static int limit_child(long steps, long query)
{
    unsigned char *locked = mmap(NULL, part_len(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct rlimit lim;
    if (locked == MAP_FAILED || mlock(locked, part_len()) != 0 || getrlimit(RLIMIT_MEMLOCK, &lim) != 0) {
        printf("FAIL limit child setup: %s\n", strerror(errno));
        return 2;
    }
    lim.rlim_cur = 0;
    if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0) {
        printf("FAIL limit child setup: setrlimit: %s\n", strerror(errno));
        return 2;
    }
    memset(locked, 0x5a, part_len());
    for (long i = 0; i < steps; i++) {
        if (i % CHECK_EVERY == 0 || i == steps - 1) {
            if (read_smaps() != 0)
                fail("limit child step %ld: cannot read /proc/self/smaps", i);
            else
                check_flags("limit child", i, "the locked range", locked, "lo");
        }
        if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0 || lim.rlim_cur != 0)
            fail("limit child step %ld: soft RLIMIT_MEMLOCK %llu, was 0", i, (unsigned long long)lim.rlim_cur);
        if (locked[part_len() - 1] != 0x5a)
            fail("limit child step %ld: its locked range changed", i);
        check_membarrier("limit child", i, query, 0, 0);
        sleep_ms(STEP_MS);
    }
    return failures ? 1 : 0;
}

/* In a fork of the parent: the WIPEONFORK part reads as zeros, the DONTFORK part is gone. */
static int fork_check(void)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        unsigned char vec[PART_PAGES];
        int bad = 0;
        for (size_t off = 0; off < part_len(); off++)
            if (part(4)[off] != 0) {
                bad |= 1;
                break;
            }
        if (!(mincore(part(3), part_len(), vec) == -1 && errno == ENOMEM))
            bad |= 2;
        if (part(5)[0] != pattern(5, 0)) /* an ordinary part is copied */
            bad |= 4;
        _exit(bad);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    page = sysconf(_SC_PAGESIZE);
    long query = membarrier(0);
    if (query < 0)
        query = 0;

    pid_t children[2];
    for (int c = 0; c < 2; c++) {
        children[c] = fork();
        if (children[c] < 0) {
            printf("setup failed: fork: %s\n", strerror(errno));
            return 2;
        }
        if (children[c] == 0)
            _exit(c == 0 ? onfault_child(steps, query) : limit_child(steps, query));
    }

    region = mmap(NULL, PARTS * part_len(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) {
        printf("setup failed: mmap: %s\n", strerror(errno));
        return 2;
    }
    for (int i = 0; i < PARTS; i++)
        for (size_t off = 0; off < part_len(); off++)
            part(i)[off] = pattern(i, off);
    static const int advice[PARTS] = {-1, -1, -1, MADV_DONTFORK, MADV_WIPEONFORK, MADV_DONTDUMP,
                                      MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_SEQUENTIAL, MADV_RANDOM, MADV_MERGEABLE};
    int reg = query & (MB_PRIVATE_EXPEDITED_REG | MB_SYNC_CORE_REG | MB_GLOBAL_EXPEDITED_REG);
    int ok = mlock(part(0), part_len()) == 0 && syscall(SYS_mlock2, part(1), part_len(), MLOCK_ONFAULT) == 0;
    for (int i = 0; ok && i < PARTS; i++) {
        ok = advice[i] < 0 || madvise(part(i), part_len(), advice[i]) == 0;
        if (!ok && advice[i] == MADV_MERGEABLE && errno == EINVAL) {
            part_flags[i] = "";
            ok = 1;
        }
    }
    ok = ok && mlockall(MCL_FUTURE) == 0;
    for (int bit = 1; ok && bit <= MB_RSEQ_REG; bit <<= 1)
        ok = !(reg & bit) || membarrier(bit) == 0;
    if (!ok) {
        printf("setup failed: %s\n", strerror(errno));
        return 2;
    }
    long registrations = (query & MB_GET_REGISTRATIONS) ? membarrier(MB_GET_REGISTRATIONS) : 0;

    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        check_mappings("main", i, 0, i % CHECK_EVERY == 0 || i == steps - 1);
        for (int p = 0; p < PARTS; p++)
            for (size_t off = 0; off < part_len(); off += 97)
                if (part(p)[off] != pattern(p, off)) {
                    fail("step %ld: part %d changed at offset %zu", i, p, off);
                    break;
                }
        check_membarrier("main", i, query, reg, registrations);
        int bad = fork_check();
        if (bad & 1)
            fail("step %ld: the MADV_WIPEONFORK part is not zero in a child", i);
        if (bad & 2)
            fail("step %ld: the MADV_DONTFORK part is mapped in a child", i);
        if (bad & ~3)
            fail("step %ld: the fork check failed (%d)", i, bad);
        h = mix64(h ^ (uint64_t)i);
        sleep_ms(STEP_MS);
    }
    for (int c = 0; c < 2; c++) {
        int status;
        while (waitpid(children[c], &status, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail("child %d ended with status %#x", c, status);
    }
    return finish(h);
}
