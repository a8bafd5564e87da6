/* slicewrite: a program whose memory changes a little between checkpoints, so that an
 * incremental generation stores only what it wrote and refers to earlier generations for the
 * rest.
 *
 * A heap of MIB MiB of incompressible words (written once at the start) is divided into 16
 * slices; each step rewrites one 1 MiB block of the current slice, and the current slice moves
 * on every SLICE_STEPS steps (1.5 s), through the whole heap in turn. Between two checkpoints a
 * second apart it writes one or two slices: at most 1/8 of the heap. A running sum of the
 * heap's words is kept in a variable: PASS when, at the end, it matches the heap (every page
 * restored from whichever generation holds it), and RESULT hashes every word.
 *
 * Usage: slicewrite SECONDS [MIB]   (MIB a multiple of 16, default 256)
 */
#include "common.h"

#define BLOCK_WORDS ((1 << 20) / 8)
#define SLICE_STEPS 150

int main(int argc, char **argv)
{
    long seconds = argc > 1 ? atol(argv[1]) : 5;
    long mib = argc > 2 ? atol(argv[2]) : 256;
    long steps = seconds * 1000 / STEP_MS;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (mib < 16 || mib % 16) {
        printf("FAIL the heap must be a multiple of 16 MiB\n");
        return 1;
    }
    long slice_mib = mib / 16;
    size_t words = (size_t)mib * BLOCK_WORDS;
    uint64_t *heap = malloc(words * sizeof *heap);
    if (!heap) {
        printf("FAIL malloc\n");
        return 1;
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < words; i++) {
        heap[i] = mix64(i ^ 0x5eed);
        sum += heap[i];
    }
    printf("START\n");
    for (long step = 0; step < steps; step++) {
        long slice = (step / SLICE_STEPS) % 16;
        uint64_t *block = heap + (size_t)(slice * slice_mib + step % slice_mib) * BLOCK_WORDS;
        for (size_t i = 0; i < BLOCK_WORDS; i++) {
            uint64_t v = mix64((uint64_t)step * BLOCK_WORDS + i);
            sum += v - block[i];
            block[i] = v;
        }
        sleep_ms(STEP_MS);
    }
    uint64_t check = 0, h = 0;
    for (size_t i = 0; i < words; i++) {
        check += heap[i];
        h = mix64(h ^ heap[i]);
    }
    printf("RESULT %016llx\n", (unsigned long long)h);
    if (check != sum) {
        printf("FAIL the heap does not match its running sum (a page restored from the wrong generation?)\n");
        return 1;
    }
    printf("PASS\n");
    return 0;
}
