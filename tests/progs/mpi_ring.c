/* mpi_ring: ring and collective traffic between MPI ranks.
 *
 * Each step every rank passes a token to the next rank around the ring (MPI_Sendrecv), mixes it
 * into its state, and every 8 steps all ranks agree on a sum (MPI_Allreduce) and a broadcast
 * (MPI_Bcast) and check that the sum is the one each can predict. Rank 0 prints START, then RESULT
 * with a hash of everything, and PASS when every rank's checks held.
 *
 *   mpi_ring SECONDS [KIB [progress | log=DIR]]    (KIB: per-rank working memory, default 1024)
 *
 * With "progress", rank 0 also prints "STEP s UNIX_MS" every 16 steps (the wall clock, which a
 * restart does not turn back): bench/node-loss.sh times from them how long a recovered job takes
 * to get back to where it was when a node was lost.
 * With "log=DIR", every rank keeps DIR/rank-N.log open for appending and writes the number of
 * each eighth step to it: the job's output beside whatever else is in DIR.
 */
#include <fcntl.h>
#include <mpi.h>
#include "common.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == 0)
        start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    size_t words = (size_t)(argc > 2 ? atol(argv[2]) : 1024) * 1024 / 8;
    int progress = rank == 0 && argc > 3 && strcmp(argv[3], "progress") == 0;
    int log = -1;
    if (argc > 3 && strncmp(argv[3], "log=", 4) == 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/rank-%d.log", argv[3] + 4, rank);
        log = open(path, O_WRONLY | O_APPEND | O_CREAT | O_TRUNC, 0644);
        if (log < 0) {
            perror(path);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    uint64_t *mem = malloc(words * 8);
    for (size_t i = 0; i < words; i++)
        mem[i] = mix64(i * 131 + (uint64_t)rank);

    uint64_t state = mix64((uint64_t)rank + 1), token = 0, agreed = 0;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    int bad = 0;
    for (long s = 0; s < steps; s++) {
        uint64_t out = mix64(state ^ (uint64_t)s), in = 0;
        MPI_Sendrecv(&out, 1, MPI_UINT64_T, next, 7, &in, 1, MPI_UINT64_T, prev, 7, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        token ^= in;
        size_t slot = (size_t)(in % words);
        mem[slot] = mix64(mem[slot] ^ in);
        state = mix64(state + mem[slot]);
        if (s % 8 == 7) {
            uint64_t mine = (uint64_t)rank + (uint64_t)s, sum = 0;
            MPI_Allreduce(&mine, &sum, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
            uint64_t want = (uint64_t)size * (uint64_t)(size - 1) / 2 + (uint64_t)size * (uint64_t)s;
            if (sum != want)
                bad++;
            uint64_t root = rank == 0 ? state : 0;
            MPI_Bcast(&root, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
            agreed = mix64(agreed ^ root);
        }
        if (log >= 0 && s % 8 == 7) {
            char line[32];
            snprintf(line, sizeof line, "%ld\n", s);
            if (write_full(log, line, strlen(line)) != 0)
                bad++;
        }
        if (progress && s % 16 == 15)
            printf("STEP %ld %lld\n", s + 1, (long long)(now_ns(CLOCK_REALTIME) / 1000000));
        sleep_ms(STEP_MS);
    }
    uint64_t digest = mix64(state ^ token), all = 0;
    for (size_t i = 0; i < words; i += 97)
        digest = mix64(digest ^ mem[i]);
    MPI_Reduce(&digest, &all, 1, MPI_UINT64_T, MPI_BXOR, 0, MPI_COMM_WORLD);
    int bad_all = 0;
    MPI_Reduce(&bad, &bad_all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("RESULT %016llx\n", (unsigned long long)mix64(all ^ agreed));
        if (bad_all)
            printf("FAIL %d collective sums were wrong\n", bad_all);
        else
            printf("PASS\n");
    }
    free(mem);
    MPI_Finalize();
    return 0;
}
