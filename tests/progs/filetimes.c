/* filetimes: the access and modification times of the files a job holds are as the job left
 * them after checkpoints and restarts: the checkpoint and the restart read and map what the job
 * holds, and recreate what it deleted, without a trace in those times.
 *
 * In DIR the program makes, and gives each the times ATIME < MTIME (so that under relatime any
 * read would move the access time):
 *  - held.dat, open for reading and writing, untouched after;
 *  - mapped.dat, mapped shared and writable, written through the mapping before its times are
 *    set (the checkpoint sums such a file, and the restart maps it again);
 *  - small.dat and large.dat (4 KiB, and 3 MiB with a hole), open and then deleted: the restart
 *    makes them again.
 * At the end every file must still have those times (fstat through its descriptor).
 * RESULT depends only on the number of steps.
 *
 * Usage: filetimes DIR [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define ATIME 978307200L  /* 2001-01-01 */
#define MTIME 1009843200L /* 2002-01-01 */

struct held {
    const char *name;
    size_t size;
    int unlinked;
    int fd;
};

static struct held files[] = {
    {"held.dat", 65536, 0, -1},
    {"mapped.dat", 65536, 0, -1},
    {"small.dat", 4096, 1, -1},
    {"large.dat", 3 << 20, 1, -1},
};
#define NFILES (sizeof files / sizeof files[0])

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: filetimes DIR [SECONDS]\n");
        return 2;
    }
    start_marker();
    long steps = steps_arg(argc, argv, 2, 4.0);
    char path[4096];
    static char block[65536];
    memset(block, 0x5a, sizeof block);
    for (size_t i = 0; i < NFILES; i++) {
        snprintf(path, sizeof path, "%s/%s", argv[1], files[i].name);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            return 2;
        /* Its first 64 KiB at most; the large one its last 64 KiB too, a hole between. */
        size_t head = files[i].size < sizeof block ? files[i].size : sizeof block;
        if (pwrite(fd, block, head, 0) != (ssize_t)head)
            return 2;
        if (files[i].size > sizeof block && pwrite(fd, block, sizeof block, (off_t)(files[i].size - sizeof block)) != (ssize_t)sizeof block)
            return 2;
        files[i].fd = fd;
    }
    char *map = mmap(NULL, files[1].size, PROT_READ | PROT_WRITE, MAP_SHARED, files[1].fd, 0);
    if (map == MAP_FAILED)
        return 2;
    map[100] = 1;
    map[40000] = 2;
    for (size_t i = 0; i < NFILES; i++) {
        struct timespec t[2] = {{ATIME, 0}, {MTIME, 0}};
        if (futimens(files[i].fd, t))
            return 2;
        if (files[i].unlinked) {
            snprintf(path, sizeof path, "%s/%s", argv[1], files[i].name);
            unlink(path);
        }
    }

    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        h = mix64(h ^ (uint64_t)s);
        sleep_ms(STEP_MS);
    }

    for (size_t i = 0; i < NFILES; i++) {
        struct stat st;
        if (fstat(files[i].fd, &st)) {
            fail("%s: fstat: %s", files[i].name, strerror(errno));
            continue;
        }
        if (st.st_atime != ATIME || st.st_mtime != MTIME)
            fail("%s: access time %ld and modification time %ld, not %ld and %ld", files[i].name, (long)st.st_atime, (long)st.st_mtime, ATIME, MTIME);
        if ((size_t)st.st_size != files[i].size || (files[i].unlinked && st.st_nlink != 0))
            fail("%s: %lld bytes and %ld links", files[i].name, (long long)st.st_size, (long)st.st_nlink);
        h = mix64(h ^ (uint64_t)st.st_size);
    }
    if (map[100] != 1 || map[40000] != 2)
        fail("mapped.dat lost what was written through the mapping");
    return finish(h);
}
