/* mmaps: kinds of memory mappings that must survive checkpoint/restart.
 *
 * Regions (each checked at the end, PASS or one "FAIL <reason>" line per broken region):
 *  - shared anonymous (MAP_SHARED|MAP_ANONYMOUS), written every step;
 *  - private file mapping of DIR/mmaps-private.dat, written every step (copy-on-write: even
 *    pages modified, odd pages must still read the file, the file itself must be unchanged);
 *  - shared file mapping of DIR/mmaps-shared.dat, written every step (file == mapping);
 *  - a PROT_NONE guard region (still PROT_NONE, same size);
 *  - a region filled then made PROT_NONE (contents kept: made readable again at the end);
 *  - a region filled then mprotected read-only (contents and protection kept);
 *  - a read-only shared mapping of DIR/mmaps-shared.dat (opened for writing): at the end it can
 *    still be made writable (mprotect), and what is written through it reaches the file (zdtm's
 *    maps_file_prot);
 *  - a 1 GiB sparse anonymous region with 16 pages touched (contents kept; untouched pages 0);
 *  - the stack: the whole step loop runs at the bottom of a 1000-deep recursion whose frames
 *    (2 KiB each) are checked as it unwinds.
 * Every step writes whole pages with values that depend only on the step number, so the final
 * contents (and RESULT, a checksum of them) equal an uninterrupted run's.
 *
 * Usage: mmaps DIR [SECONDS=4]
 */
#include "common.h"
#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096
#define WORDS (PAGE / 8)
#define NPAGES 64                 /* pages in the shared anon and file regions */
#define SMALL 16                  /* pages in guard, hidden, read-only regions */
#define SPARSE_SIZE (1UL << 30)   /* 1 GiB reserved */
#define SPARSE_TOUCHED 16         /* pages touched in it */
#define DEPTH 1000

enum { K_ANON = 1, K_PRIV, K_SHARED, K_SPARSE, K_HIDDEN, K_RO, K_FILEINIT };

static long steps;
static uint64_t *anon, *priv, *shared, *ro, *hidden, *sparse;
static char *guard;
static long bad_frames;

static uint64_t val(int kind, long s, size_t i)
{
    return mix64(((uint64_t)kind << 56) ^ ((uint64_t)s << 16) ^ i);
}

/* The last step that wrote page p of a region of n pages written round-robin, or -1. */
static long last_step(long p, long n)
{
    if (steps <= p)
        return -1;
    return p + n * ((steps - 1 - p) / n);
}

static uint64_t *sparse_page(long k)
{
    return sparse + (k * (SPARSE_SIZE / SPARSE_TOUCHED) + (size_t)k * PAGE) / 8;
}

static void *map(size_t len, int prot, int flags, int fd)
{
    void *p = mmap(NULL, len, prot, flags, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    return p;
}

static int make_file(const char *name)
{
    int fd = open(name, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror(name);
        exit(2);
    }
    for (long p = 0; p < NPAGES; p++) {
        uint64_t page[WORDS];
        for (size_t i = 0; i < WORDS; i++)
            page[i] = val(K_FILEINIT, p, i);
        if (write(fd, page, PAGE) != PAGE) {
            perror(name);
            exit(2);
        }
    }
    return fd;
}

/* Is [addr, addr+len) inside one line of /proc/self/maps with these permissions? */
static int maps_has(const void *addr, size_t len, const char *perms)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int ok = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char pr[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, pr) == 3 && lo <= (unsigned long)addr &&
            (unsigned long)addr < hi) {
            ok = (unsigned long)addr + len <= hi && strcmp(pr, perms) == 0;
            if (!ok)
                fail("maps: %p+%zu is in %s", addr, len, strtok(line, "\n"));
            break;
        }
    }
    if (f)
        fclose(f);
    return ok;
}

static uint64_t run_steps(void)
{
    for (long s = 0; s < steps; s++) {
        long p = s % NPAGES;
        for (size_t i = 0; i < WORDS; i++) {
            anon[p * WORDS + i] = val(K_ANON, s, i);
            if (p % 2 == 0)
                priv[p * WORDS + i] = val(K_PRIV, s, i);
            shared[p * WORDS + i] = val(K_SHARED, s, i);
        }
        sparse_page(s % SPARSE_TOUCHED)[0] = val(K_SPARSE, s, 0);
        sleep_ms(STEP_MS);
    }
    return 0;
}

static uint64_t recurse(int depth)
{
    volatile uint64_t frame[256];
    for (size_t i = 0; i < 256; i++)
        frame[i] = mix64(((uint64_t)depth << 16) ^ i);
    uint64_t r = depth == 0 ? run_steps() : recurse(depth - 1);
    for (size_t i = 0; i < 256; i++)
        if (frame[i] != mix64(((uint64_t)depth << 16) ^ i))
            bad_frames++;
    return r + frame[depth % 256];
}

/* Check n pages of region r against expect(page, word); hash them into *h. */
static void check_region(const char *name, const uint64_t *r, long n,
                         uint64_t (*expect)(long, size_t), uint64_t *h)
{
    long bad = 0;
    for (long p = 0; p < n; p++)
        for (size_t i = 0; i < WORDS; i++) {
            uint64_t v = r[p * WORDS + i];
            if (v != expect(p, i))
                bad++;
            *h = mix64(*h ^ v);
        }
    if (bad)
        fail("%s: %ld words differ", name, bad);
}

static uint64_t expect_anon(long p, size_t i)
{
    long s = last_step(p, NPAGES);
    return s < 0 ? 0 : val(K_ANON, s, i);
}
static uint64_t expect_priv(long p, size_t i)
{
    long s = p % 2 ? -1 : last_step(p, NPAGES);
    return s < 0 ? val(K_FILEINIT, p, i) : val(K_PRIV, s, i);
}
static uint64_t expect_file(long p, size_t i) { return val(K_FILEINIT, p, i); }
static uint64_t expect_shared(long p, size_t i)
{
    long s = last_step(p, NPAGES);
    return s < 0 ? val(K_FILEINIT, p, i) : val(K_SHARED, s, i);
}
static uint64_t expect_hidden(long p, size_t i) { return val(K_HIDDEN, p, i); }
static uint64_t expect_ro(long p, size_t i) { return val(K_RO, p, i); }

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2 || chdir(argv[1]) != 0) {
        fprintf(stderr, "usage: mmaps DIR [SECONDS=4]\n");
        return 2;
    }
    steps = steps_arg(argc, argv, 2, 4.0);
    size_t len = NPAGES * PAGE, small = SMALL * PAGE;

    anon = map(len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1);
    int pfd = make_file("mmaps-private.dat");
    priv = map(len, PROT_READ | PROT_WRITE, MAP_PRIVATE, pfd);
    int sfd = make_file("mmaps-shared.dat");
    shared = map(len, PROT_READ | PROT_WRITE, MAP_SHARED, sfd);
    uint64_t *shared_ro = map(PAGE, PROT_READ, MAP_SHARED, sfd);
    guard = map(small, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
    hidden = map(small, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
    ro = map(small, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
    for (long p = 0; p < SMALL; p++)
        for (size_t i = 0; i < WORDS; i++) {
            hidden[p * WORDS + i] = val(K_HIDDEN, p, i);
            ro[p * WORDS + i] = val(K_RO, p, i);
        }
    mprotect(hidden, small, PROT_NONE);
    mprotect(ro, small, PROT_READ);
    sparse = map(SPARSE_SIZE, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1);
    for (long k = 0; k < SPARSE_TOUCHED; k++)
        sparse_page(k)[1] = val(K_SPARSE, k, 1);

    uint64_t r = recurse(DEPTH);
    if (bad_frames)
        fail("stack: %ld words of recursion frames changed", bad_frames);

    uint64_t h = r;
    check_region("shared anonymous", anon, NPAGES, expect_anon, &h);
    check_region("private file mapping", priv, NPAGES, expect_priv, &h);
    check_region("shared file mapping", shared, NPAGES, expect_shared, &h);
    check_region("read-only region", ro, SMALL, expect_ro, &h);

    static uint64_t file[NPAGES * WORDS];
    if (pread(pfd, file, len, 0) != (ssize_t)len)
        fail("cannot read mmaps-private.dat");
    uint64_t ignore = 0;
    check_region("mmaps-private.dat on disk (must be unchanged)", file, NPAGES, expect_file, &ignore);
    if (pread(sfd, file, len, 0) != (ssize_t)len)
        fail("cannot read mmaps-shared.dat");
    check_region("mmaps-shared.dat on disk", file, NPAGES, expect_shared, &ignore);

    maps_has(anon, len, "rw-s");
    maps_has(priv, len, "rw-p");
    maps_has(shared, len, "rw-s");
    maps_has(shared_ro, PAGE, "r--s");
    if (mprotect(shared_ro, PAGE, PROT_READ | PROT_WRITE) != 0) {
        fail("the read-only shared file mapping cannot be made writable: %s", strerror(errno));
    } else {
        uint64_t word = 0;
        shared_ro[WORDS - 1] = 0x5eed;
        if (msync(shared_ro, PAGE, MS_SYNC) != 0 || pread(sfd, &word, 8, PAGE - 8) != 8 || word != 0x5eed)
            fail("a write through the read-only shared file mapping made writable did not reach the file");
    }
    maps_has(guard, small, "---p");
    maps_has(hidden, small, "---p");
    maps_has(ro, small, "r--p");
    maps_has(sparse, SPARSE_SIZE, "rw-p");

    mprotect(hidden, small, PROT_READ);
    check_region("PROT_NONE region", hidden, SMALL, expect_hidden, &h);

    long bad = 0;
    for (long k = 0; k < SPARSE_TOUCHED; k++) {
        long s = last_step(k, SPARSE_TOUCHED);
        uint64_t *pg = sparse_page(k);
        if (pg[0] != (s < 0 ? 0 : val(K_SPARSE, s, 0)) || pg[1] != val(K_SPARSE, k, 1))
            bad++;
        if (sparse[(k * (SPARSE_SIZE / SPARSE_TOUCHED) + SPARSE_SIZE / SPARSE_TOUCHED / 2) / 8])
            bad++; /* an untouched page in the middle of each 64 MiB stretch */
        h = mix64(h ^ pg[0] ^ pg[1]);
    }
    if (bad)
        fail("sparse region: %ld pages wrong", bad);

    return finish(h);
}
