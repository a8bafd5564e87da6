/* tmpfsmap: a file mapped shared whose descriptor is closed at once, written in steps.
 *
 * Creates DIR/data (one page), maps it MAP_SHARED, closes the descriptor (only the mapping
 * holds the file), then writes the step number into it every step. At the end the page must
 * hold the last step and the file, read through a new descriptor, the same: PASS, or FAIL and
 * why. On tmpfs (/dev/shm) the checkpoint keeps the file's contents in the image.
 *
 * Usage: tmpfsmap DIR [SECONDS=3]
 */
#include "common.h"
#include <fcntl.h>
#include <sys/mman.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: tmpfsmap DIR [SECONDS]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 3);
    char path[4096];
    snprintf(path, sizeof path, "%s/data", argv[1]);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, 4096) != 0) {
        printf("FAIL create %s: %s\n", path, strerror(errno));
        return 1;
    }
    volatile uint64_t *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (page == MAP_FAILED) {
        printf("FAIL mmap: %s\n", strerror(errno));
        return 1;
    }
    start_marker();
    for (long i = 1; i <= steps; i++) {
        page[0] = (uint64_t)i;
        sleep_ms(STEP_MS);
    }
    uint64_t on_disk = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || pread(fd, &on_disk, sizeof on_disk, 0) != sizeof on_disk) {
        printf("FAIL reread %s: %s\n", path, strerror(errno));
        return 1;
    }
    if (page[0] != (uint64_t)steps || on_disk != (uint64_t)steps)
        fail("page holds %llu, file %llu, want %ld", (unsigned long long)page[0], (unsigned long long)on_disk, steps);
    return finish(mix64(page[0] ^ (on_disk << 32)));
}
