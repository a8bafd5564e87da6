/* bigheap: 4 threads over a large heap, plus an output file written one line per step.
 *
 * Checks that a large heap with never-touched parts, all-zero parts and data parts survives
 * checkpoint/restart, and that a file open for writing continues at the right offset. The heap
 * is cut into 16 segments; of each 4 consecutive segments (one group per thread) the first is
 * never touched, the second is written with zeros, the other two are filled (one with random
 * words, one with regular ones, which compress) and then updated,
 * one 64 KiB block per step, by their thread, which keeps a running sum of them. The main thread
 * writes "step N <hash>" lines to OUTFILE (write(2), no O_APPEND), which the test compares with
 * an uninterrupted run's file. RESULT is a checksum of the whole heap; PASS if untouched and
 * zero segments are all zero and every running sum matches memory.
 *
 * Usage: bigheap OUTFILE [SECONDS=5] [MIB=256]
 */
#include "common.h"
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#define NTHREADS 4
#define NSEG (4 * NTHREADS)
#define BLOCK (64 * 1024)

static uint64_t *heap;
static size_t seg_words;
static long steps;

struct worker {
    pthread_t thread;
    long t;
    uint64_t sum; /* running sum of this thread's two data segments */
};

static uint64_t *segment(long i) { return heap + (size_t)i * seg_words; }

static void *worker(void *arg)
{
    struct worker *w = arg;
    memset(segment(4 * w->t + 1), 0, seg_words * sizeof(uint64_t));
    for (long d = 2; d < 4; d++) {
        uint64_t *s = segment(4 * w->t + d);
        for (size_t i = 0; i < seg_words; i++) {
            /* The first data segment is random, the second regular (it compresses well). */
            uint64_t tag = (uint64_t)(4 * w->t + d) << 48;
            s[i] = d == 2 ? mix64(tag ^ i) : tag ^ (i / 64);
            w->sum += s[i];
        }
    }
    size_t block_words = BLOCK / sizeof(uint64_t);
    size_t nblocks = seg_words / block_words;
    for (long st = 0; st < steps; st++) {
        for (long d = 2; d < 4; d++) {
            uint64_t *b = segment(4 * w->t + d) + ((size_t)st * 37 % nblocks) * block_words;
            for (size_t i = 0; i < block_words; i++) {
                uint64_t nw = mix64(b[i] ^ (uint64_t)st ^ ((uint64_t)w->t << 32));
                w->sum += nw - b[i];
                b[i] = nw;
            }
        }
        sleep_ms(STEP_MS);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: bigheap OUTFILE [SECONDS=5] [MIB=256]\n");
        return 2;
    }
    steps = steps_arg(argc, argv, 2, 5.0);
    size_t mib = argc > 3 ? (size_t)atol(argv[3]) : 256;
    size_t bytes = mib << 20;
    seg_words = bytes / NSEG / sizeof(uint64_t);
    heap = malloc(bytes); /* large: glibc maps it, untouched pages stay untouched */
    if (!heap || seg_words * sizeof(uint64_t) < BLOCK) {
        fprintf(stderr, "bigheap: cannot allocate %zu MiB\n", mib);
        return 2;
    }
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        perror(argv[1]);
        return 2;
    }

    struct worker w[NTHREADS];
    for (long t = 0; t < NTHREADS; t++) {
        w[t] = (struct worker){.t = t};
        if (pthread_create(&w[t].thread, NULL, worker, &w[t]) != 0)
            return 2;
    }

    uint64_t h = 0;
    char line[64];
    for (long st = 0; st < steps; st++) {
        h = mix64(h ^ (uint64_t)st);
        int len = snprintf(line, sizeof line, "step %ld %016llx\n", st, (unsigned long long)h);
        if (write_full(fd, line, (size_t)len) != 0) {
            perror("write");
            return 2;
        }
        sleep_ms(STEP_MS);
    }
    close(fd);

    for (int t = 0; t < NTHREADS; t++)
        pthread_join(w[t].thread, NULL);

    uint64_t result = h;
    for (long i = 0; i < NSEG; i++) {
        uint64_t *s = segment(i), sum = 0, nonzero = 0;
        for (size_t j = 0; j < seg_words; j++) {
            sum += s[j];
            nonzero |= s[j];
            result = mix64(result ^ s[j]);
        }
        if (i % 4 < 2 && nonzero)
            fail("segment %ld should be all zero", i);
        if (i % 4 == 3) {
            uint64_t both = sum;
            for (size_t j = 0; j < seg_words; j++)
                both += segment(i - 1)[j];
            if (both != w[i / 4].sum)
                fail("thread %ld: running sum %016llx != memory %016llx", i / 4,
                     (unsigned long long)w[i / 4].sum, (unsigned long long)both);
        }
    }
    return finish(result);
}
