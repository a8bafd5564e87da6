/* lazytouch: a program that, right after a lazy restart, does to its memory everything a page
 * server must follow while it still fills it: the kernel reads and writes pages not filled yet
 * (a pipe between two parts of the heap), children fork and read the heap, pages are dropped
 * (MADV_DONTNEED: they must read as zeros, not as the image's), a region moves (mremap), and
 * another is unmapped and mapped again (fresh zeros).
 *
 * A heap of MIB MiB of incompressible words is written at the start, a region that moves and
 * one that is remade. Every step (10 ms): 64 KiB of one heap block go through a
 * pipe into another block (write(2) reads the heap, read(2) writes it); the last 64 KiB of a
 * third block are dropped, checked to read zeros and written again; every 5 steps a child
 * hashes a 1 MiB block and the parent checks the child saw what it sees; every 4 steps the
 * 4 MiB moving region changes place and its hash is checked; every 6 steps the 2 MiB remade
 * region is unmapped, mapped again, checked to read zeros and written again. The blocks each step uses
 * depend on the step only. At the end: RESULT hashes the heap and the moving region; PASS
 * unless a check failed (FAIL says which).
 *
 * Usage: lazytouch SECONDS [MIB]   (MIB at least 8, default 256)
 */
#include "common.h"
#include <sys/mman.h>
#include <sys/wait.h>

#define BLOCK (1 << 20)
#define PIECE (64 << 10)
#define MOVING (4 << 20)
#define REMADE (2 << 20)

static uint64_t hash_words(const uint64_t *p, size_t n)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++)
        h = mix64(h ^ p[i]);
    return h;
}

static void fill_words(uint64_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = mix64(i ^ seed);
}

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

static void *map_anon(void *at, size_t len, int flags)
{
    void *p = mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (p == MAP_FAILED) {
        printf("FAIL mmap: %s\n", strerror(errno));
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    long seconds = argc > 1 ? atol(argv[1]) : 5;
    long mib = argc > 2 ? atol(argv[2]) : 256;
    long steps = seconds * 1000 / STEP_MS;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (mib < 8) {
        printf("FAIL the heap must be at least 8 MiB\n");
        return 1;
    }
    size_t blocks = (size_t)mib;
    unsigned char *heap = map_anon(NULL, blocks * BLOCK, 0);
    fill_words((uint64_t *)heap, blocks * BLOCK / 8, 0x1a2);
    /* Two places for the moving region, reserved together so that nothing else lands there:
     * the one it is not in stays mapped PROT_NONE. */
    unsigned char *places = map_anon(NULL, 2 * MOVING, 0);
    mprotect(places + MOVING, MOVING, PROT_NONE);
    unsigned char *moving = places;
    fill_words((uint64_t *)moving, MOVING / 8, 0x30f);
    uint64_t moving_hash = hash_words((uint64_t *)moving, MOVING / 8);
    unsigned char *remade = map_anon(NULL, REMADE, 0);
    fill_words((uint64_t *)remade, REMADE / 8, 0x4e);
    int fds[2];
    if (pipe(fds) != 0) {
        printf("FAIL pipe: %s\n", strerror(errno));
        return 1;
    }
    printf("START\n");
    for (long step = 0; step < steps; step++) {
        size_t from = (size_t)(step * 7) % blocks, to = (size_t)(step * 7 + blocks / 2) % blocks;
        if (from == to)
            to = (to + 1) % blocks;
        /* The kernel reads one part of the heap and writes another. */
        ssize_t n = write(fds[1], heap + from * BLOCK, PIECE);
        if (n != PIECE) {
            printf("FAIL write from the heap: %zd (%s)\n", n, n < 0 ? strerror(errno) : "short");
            return 1;
        }
        for (ssize_t got = 0; got < PIECE;) {
            n = read(fds[0], heap + to * BLOCK + got, PIECE - got);
            if (n <= 0) {
                printf("FAIL read into the heap: %zd (%s)\n", n, n < 0 ? strerror(errno) : "end of file");
                return 1;
            }
            got += n;
        }
        /* Dropped pages read as zeros. */
        size_t dropped = (size_t)(step * 13 + 3) % blocks;
        unsigned char *tail = heap + dropped * BLOCK + BLOCK - PIECE;
        if (madvise(tail, PIECE, MADV_DONTNEED) != 0 || !all_zero(tail, PIECE)) {
            printf("FAIL pages dropped at step %ld do not read as zeros\n", step);
            return 1;
        }
        fill_words((uint64_t *)tail, PIECE / 8, (uint64_t)step);
        /* A child sees the heap as its parent does. */
        if (step % 5 == 0) {
            size_t seen = (size_t)(step * 11 + 5) % blocks;
            uint64_t expect = hash_words((uint64_t *)(heap + seen * BLOCK), BLOCK / 8);
            int report[2];
            if (pipe(report) != 0)
                return 2;
            pid_t child = fork();
            if (child < 0) {
                printf("FAIL fork: %s\n", strerror(errno));
                return 1;
            }
            if (child == 0) {
                uint64_t h = hash_words((uint64_t *)(heap + seen * BLOCK), BLOCK / 8);
                _exit(write(report[1], &h, sizeof h) == sizeof h ? 0 : 1);
            }
            close(report[1]);
            uint64_t got = 0;
            int status;
            if (read(report[0], &got, sizeof got) != sizeof got || waitpid(child, &status, 0) != child || got != expect) {
                printf("FAIL a child saw block %zu otherwise than its parent at step %ld\n", seen, step);
                return 1;
            }
            close(report[0]);
        }
        /* The moving region changes place and keeps its bytes. */
        if (step % 4 == 0) {
            unsigned char *other = moving == places ? places + MOVING : places;
            void *moved = mremap(moving, MOVING, MOVING, MREMAP_MAYMOVE | MREMAP_FIXED, other);
            if (moved != other) {
                printf("FAIL mremap: %s\n", strerror(errno));
                return 1;
            }
            if (mmap(moving, MOVING, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != moving) {
                printf("FAIL mmap over the moving region's old place: %s\n", strerror(errno));
                return 1;
            }
            moving = other;
            if (hash_words((uint64_t *)moving, MOVING / 8) != moving_hash) {
                printf("FAIL the moving region changed when it moved at step %ld\n", step);
                return 1;
            }
            ((uint64_t *)moving)[(step / 4) % (MOVING / 8)] ^= (uint64_t)step;
            moving_hash = hash_words((uint64_t *)moving, MOVING / 8);
        }
        /* A region unmapped and mapped again is new memory. */
        if (step % 6 == 0) {
            munmap(remade, REMADE);
            unsigned char *again = map_anon(remade, REMADE, MAP_FIXED_NOREPLACE);
            if (again != remade || !all_zero(remade, REMADE)) {
                printf("FAIL a region mapped again at step %ld does not read as zeros\n", step);
                return 1;
            }
            fill_words((uint64_t *)remade, REMADE / 8, (uint64_t)step);
        }
        sleep_ms(STEP_MS);
    }
    uint64_t h = mix64(hash_words((uint64_t *)heap, blocks * BLOCK / 8) ^ moving_hash);
    h = mix64(h ^ hash_words((uint64_t *)remade, REMADE / 8));
    printf("RESULT %016llx\n", (unsigned long long)h);
    printf("PASS\n");
    return 0;
}
