/* pipes: data in flight in pipes survives checkpoint/restart, every byte exactly once.
 *
 * A writer child sends numbered, checksummed records into a pipe as fast as the pipe takes them
 * (so the pipe is usually full at a checkpoint); the parent reads them slowly, in odd-sized reads
 * (so a record is often half read), and checks every record's number and checksum. A second pipe,
 * from the parent to a second child, holds a fixed message written at the start and read only at
 * the end. RESULT is a checksum of everything received; PASS if no record was lost, repeated or
 * damaged, and the children's statuses arrive.
 *
 * Usage: pipes [SECONDS=4]
 */
#define RECORD_WORDS 6
#include "common.h"

#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    long per_step = 40;
    long total = steps * per_step;

    int data[2], note[2];
    if (pipe(data) || pipe(note))
        return 2;

    pid_t writer = fork();
    if (writer == 0) {
        close(data[0]);
        close(note[0]);
        close(note[1]);
        for (long i = 0; i < total; i++) {
            struct rec r = {.seq = (uint64_t)i};
            for (int k = 0; k < 6; k++)
                r.payload[k] = mix64((uint64_t)i * 7 + (uint64_t)k);
            r.sum = rec_sum(&r);
            const char *p = (const char *)&r;
            size_t left = sizeof r;
            while (left) {
                ssize_t n = write(data[1], p, left);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0)
                    _exit(3);
                p += n;
                left -= (size_t)n;
            }
        }
        _exit(0);
    }
    close(data[1]);

    const char msg[] = "the note written at the start, read at the end";
    pid_t noter = fork();
    if (noter == 0) {
        close(note[1]);
        close(data[0]);
        char buf[sizeof msg];
        if (read_full(note[0], buf, sizeof msg) || memcmp(buf, msg, sizeof msg))
            _exit(4);
        _exit(0);
    }
    close(note[0]);
    /* Written now, but the child only reads it once we close our end... after the run. */

    uint64_t h = 0;
    for (long i = 0; i < total; i++) {
        struct rec r;
        /* Odd-sized reads: the record arrives in two pieces. */
        if (read_full(data[0], &r, 13) || read_full(data[0], (char *)&r + 13, sizeof r - 13)) {
            fail("pipe closed early at record %ld", i);
            break;
        }
        if (r.seq != (uint64_t)i) {
            fail("record %ld arrived as %llu", i, (unsigned long long)r.seq);
            break;
        }
        if (r.sum != rec_sum(&r)) {
            fail("record %ld damaged", i);
            break;
        }
        h = mix64(h ^ r.sum);
        if (i % per_step == 0)
            sleep_ms(STEP_MS);
        if (i == total / 4) {
            if (write(note[1], msg, sizeof msg) != (ssize_t)sizeof msg)
                fail("note write failed");
        }
    }
    char extra;
    if (read(data[0], &extra, 1) != 0)
        fail("data after the last record");
    close(note[1]);
    int st;
    if (waitpid(writer, &st, 0) != writer || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("writer status %#x", st);
    if (waitpid(noter, &st, 0) != noter || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("note reader status %#x", st);
    return finish(h);
}
