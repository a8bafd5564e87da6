/* savefiles: a file changed in place (not appended to) is restored as it was at the checkpoint
 * when the job runs with --save-files.
 *
 * WORKDIR/data.bin is 64 KiB, open read-write. Every step writes one 1 KiB record in place
 * (record (i * 37) % 64, filled from i) and keeps the same bytes in memory; then reads the whole
 * file back and compares it with the copy in memory. A restart that did not put the file back
 * (the job wrote on after the checkpoint, then crashed) shows records the restored memory never
 * wrote: FAIL. RESULT is a hash of the final contents.
 *
 * Usage: savefiles WORKDIR [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <unistd.h>

#define SIZE 65536
#define REC 1024

static unsigned char shadow[SIZE], back[SIZE];

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: savefiles WORKDIR [SECONDS]\n");
        return 2;
    }
    long n = steps_arg(argc, argv, 2, 4.0);
    char path[4096];
    snprintf(path, sizeof path, "%s/data.bin", argv[1]);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || pwrite(fd, shadow, SIZE, 0) != SIZE) {
        perror(path);
        return 2;
    }
    long bad = 0;
    for (long i = 0; i < n; i++) {
        long r = (i * 37) % (SIZE / REC);
        unsigned char rec[REC];
        for (int k = 0; k < REC; k++)
            rec[k] = (unsigned char)mix64((uint64_t)i * REC + k);
        memcpy(shadow + r * REC, rec, REC);
        if (pwrite(fd, rec, REC, r * REC) != REC) {
            fail("pwrite: %s", strerror(errno));
            break;
        }
        if (pread(fd, back, SIZE, 0) != SIZE || memcmp(back, shadow, SIZE) != 0) {
            if (bad++ < 3) {
                long first = 0;
                while (first < SIZE && back[first] == shadow[first])
                    first++;
                fail("step %ld: the file differs from what this program wrote, from byte %ld",
                     i, first);
            }
            memcpy(shadow, back, SIZE); /* report each difference once */
        }
        sleep_ms(STEP_MS);
    }
    uint64_t h = 0;
    for (int k = 0; k < SIZE; k += 8) {
        uint64_t w;
        memcpy(&w, shadow + k, 8);
        h = mix64(h ^ w);
    }
    return finish(h);
}
