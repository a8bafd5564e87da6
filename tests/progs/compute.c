/* compute: single-threaded computation over a big heap array.
 *
 * Checks that anonymous heap memory and registers survive checkpoint/restart: a 64 MiB array
 * (malloc) is updated one slice per step; a running sum of the array is kept in a variable and
 * compared at the end with the sum recomputed from memory (PASS/FAIL); RESULT is a checksum of
 * the final array, equal to an uninterrupted run's.
 *
 * Usage: compute [SECONDS=5] [MIB=64]
 */
#include "common.h"

#define SLICES 64

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 64;
    size_t n = (mib << 20) / sizeof(uint64_t);
    size_t slice = n / SLICES;

    uint64_t *a = malloc(n * sizeof(uint64_t));
    if (!a) {
        perror("malloc");
        return 2;
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        a[i] = mix64(i);
        sum += a[i];
    }

    for (long s = 0; s < steps; s++) {
        size_t base = (size_t)(s % SLICES) * slice;
        for (size_t j = 0; j < slice; j++) {
            size_t i = base + j;
            uint64_t old = a[i];
            uint64_t nw = mix64(old ^ a[(i + (size_t)s * 7919 + 1) % n] ^ (uint64_t)s);
            a[i] = nw;
            sum += nw - old;
        }
        sleep_ms(STEP_MS);
    }

    uint64_t check = 0, h = 0;
    for (size_t i = 0; i < n; i++) {
        check += a[i];
        h = mix64(h ^ a[i]);
    }
    if (check != sum)
        fail("running sum %016llx != sum of memory %016llx", (unsigned long long)sum,
             (unsigned long long)check);
    free(a);
    return finish(h ^ (uint64_t)steps);
}
