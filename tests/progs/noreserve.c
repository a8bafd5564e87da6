/* noreserve: the mmap flags that stay with a mapping survive checkpoint/restart: MAP_NORESERVE
 * on a reservation far larger than the machine's memory, and MAP_GROWSDOWN on a mapping of the
 * program's own.
 *
 * At start the program maps GIB GiB (256) of private anonymous memory, readable and writable,
 * with MAP_NORESERVE, as a JVM or Go reserves its heap or a sanitizer its shadow memory, and
 * writes a pattern into SPOTS pages scattered over it. The kernel's overcommit heuristic
 * (vm.overcommit_memory=0) refuses the same mapping without MAP_NORESERVE on a machine with
 * less RAM and swap: the program tries it first, and prints a NOTE when it is not refused (the
 * run then shows less; under vm.overcommit_memory=2 MAP_NORESERVE is ignored and the setup
 * fails). It also maps a region of GROW_START pages with MAP_GROWSDOWN at the top of a 2 MiB
 * hole whose lower half a PROT_NONE mapping holds (so nothing else is mapped within the kernel's
 * stack guard gap below it).
 *
 * Every step it checks that the scattered pages hold their pattern and that the pages beside
 * them and the reservation's last page read zero. Every CHECK_EVERY steps it also checks, from
 * /proc/self/status, that its page tables stay small (VmPTE under MAX_PTE_KIB: tracking the
 * writes to the whole reservation would give it 2 MiB of page tables per GiB), and, from
 * /proc/self/smaps, that the reservation has the flag nr and the region gd, and then, if gd is
 * there, writes into the page just below the region (up to GROW_MAX pages): the kernel extends
 * the region (without gd that would be a SIGSEGV), whose pages are checked every step. Not every
 * step: a checkpoint that finds a /proc file open makes the restart reopen it, and reading smaps
 * keeps it open a while (see memattrs.c).
 *
 * Usage: noreserve [SECONDS=5] [GIB=256]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>

#define SPOTS 64
#define CHECK_EVERY 8
#define GROW_START 4
#define GROW_MAX 128
#define HOLE (2UL << 20)
#define MAX_PTE_KIB (32L << 10)

static long page;
static unsigned char *reserved;
static size_t reserved_len;
static unsigned char *grow_top; /* the end of the grow-down region */
static long grown;              /* pages written below its first ones */

/* The scattered pages: their indexes in the reservation (never the last page). */
static size_t spot(int i)
{
    size_t pages = reserved_len / (size_t)page;
    return (size_t)(mix64((uint64_t)i) % (pages - 1));
}

static uint64_t word(uint64_t where, size_t k)
{
    return mix64(where * 4096 + k);
}

static void fill(void *at, uint64_t where)
{
    uint64_t *w = at;
    for (size_t k = 0; k < (size_t)page / 8; k++)
        w[k] = word(where, k);
}

/* 0 if the page at `at` holds the pattern of `where`. */
static int holds(const void *at, uint64_t where)
{
    const uint64_t *w = at;
    for (size_t k = 0; k < (size_t)page / 8; k++)
        if (w[k] != word(where, k))
            return -1;
    return 0;
}

static int reads_zero(const void *at)
{
    const uint64_t *w = at;
    for (size_t k = 0; k < (size_t)page / 8; k++)
        if (w[k] != 0)
            return 0;
    return 1;
}

static int is_spot(size_t p)
{
    for (int i = 0; i < SPOTS; i++)
        if (spot(i) == p)
            return 1;
    return 0;
}

/* The grow-down region's page `n` below its top (0 is the highest). */
static unsigned char *grow_page(long n)
{
    return grow_top - (size_t)(n + 1) * (size_t)page;
}

#include "smaps.h"

/* The process's page tables in KiB (VmPTE), or -1. */
static long page_tables_kib(void)
{
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    const char *at = strstr(buf, "\nVmPTE:");
    return at ? atol(at + 8) : -1;
}

/* The mapping at addr has flag f; records a failure if not. */
static int check_flag(long step, const char *what, const void *addr, const char *f)
{
    char buf[256];
    const char *flags = flags_at(addr, buf, sizeof buf);
    if (!flags) {
        fail("step %ld: %s at %p is not in smaps", step, what, addr);
        return 0;
    }
    if (!has_flag(flags, f)) {
        fail("step %ld: %s at %p lacks flag %s (VmFlags:%s)", step, what, addr, f, flags);
        return 0;
    }
    return 1;
}

static void check_memory(long step)
{
    for (int i = 0; i < SPOTS; i++) {
        size_t p = spot(i);
        if (holds(reserved + p * (size_t)page, p) != 0)
            fail("step %ld: reserved page %zu lost its pattern", step, p);
        if (!is_spot(p + 1) && !reads_zero(reserved + (p + 1) * (size_t)page))
            fail("step %ld: reserved page %zu, never written, is not zero", step, p + 1);
    }
    if (!reads_zero(reserved + reserved_len - (size_t)page))
        fail("step %ld: the reservation's last page, never written, is not zero", step);
    for (long n = 0; n < GROW_START + grown; n++)
        if (holds(grow_page(n), (uint64_t)1 << 40 | (uint64_t)n) != 0)
            fail("step %ld: page %ld of the grow-down region lost its pattern", step, n);
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    long gib = argc > 2 ? atol(argv[2]) : 256;
    page = sysconf(_SC_PAGESIZE);
    reserved_len = (size_t)gib << 30;

    void *plain = mmap(NULL, reserved_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (plain != MAP_FAILED) {
        printf("NOTE a mapping of %ld GiB without MAP_NORESERVE is not refused here: this run does not show that "
               "MAP_NORESERVE is kept\n", gib);
        munmap(plain, reserved_len);
    }
    reserved = mmap(NULL, reserved_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserved == MAP_FAILED) {
        printf("setup failed: mmap %ld GiB MAP_NORESERVE: %s\n", gib, strerror(errno));
        return 2;
    }
    for (int i = 0; i < SPOTS; i++)
        fill(reserved + spot(i) * (size_t)page, spot(i));

    unsigned char *hole = mmap(NULL, HOLE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (hole == MAP_FAILED || munmap(hole + HOLE / 2, HOLE / 2) != 0) {
        printf("setup failed: the hole below the grow-down region: %s\n", strerror(errno));
        return 2;
    }
    grow_top = hole + HOLE;
    size_t grow_len = (size_t)GROW_START * (size_t)page;
    if (mmap(grow_top - grow_len, grow_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_GROWSDOWN | MAP_FIXED,
             -1, 0) == MAP_FAILED) {
        printf("setup failed: mmap MAP_GROWSDOWN: %s\n", strerror(errno));
        return 2;
    }
    for (long n = 0; n < GROW_START; n++)
        fill(grow_page(n), (uint64_t)1 << 40 | (uint64_t)n);

    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        check_memory(i);
        if (i % CHECK_EVERY == 0 || i == steps - 1) {
            long pte = page_tables_kib();
            if (pte < 0 || pte > MAX_PTE_KIB)
                fail("step %ld: page tables of %ld KiB (VmPTE), more than %ld for %d pages written", i, pte, MAX_PTE_KIB, SPOTS);
            if (read_smaps() != 0) {
                fail("step %ld: cannot read /proc/self/smaps", i);
            } else {
                check_flag(i, "the reservation", reserved, "nr");
                check_flag(i, "the reservation's end", reserved + reserved_len - 1, "nr");
                int grows = check_flag(i, "the grow-down region", grow_page(GROW_START + grown - 1), "gd");
                if (grows && GROW_START + grown < GROW_MAX) {
                    fill(grow_page(GROW_START + grown), (uint64_t)1 << 40 | (uint64_t)(GROW_START + grown));
                    grown++;
                }
            }
        }
        h = mix64(h ^ (uint64_t)i);
        sleep_ms(STEP_MS);
    }
    h = mix64(h ^ (uint64_t)grown);
    return finish(h);
}
