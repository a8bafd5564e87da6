/* shobjects: pages of shared memory objects that no process has mapped survive
 * checkpoint/restart.
 *
 * The parent maps four objects shared, then forks a writer: MAP_SHARED|MAP_ANONYMOUS, a memfd,
 * POSIX shared memory unlinked at once ("/dev/shm/... (deleted)") and a file on disk in WORKDIR
 * that is filled with write(), evicted from the page cache (POSIX_FADV_DONTNEED) and unlinked,
 * then mapped 64 pages long over its 40 (the mapping runs past the end of the file). Each step
 * the writer mixes the step into one page of each object (now and then clears it instead) and
 * drops it from its own page tables (MADV_DONTNEED), so the object alone holds it: a checkpoint
 * must read the objects, not the processes' page tables. The parent also maps the second half of
 * the memfd a second time, PROT_NONE. At the end the parent checks that view against the memfd
 * and RESULT hashes every page of every object (the disk file's 40).
 *
 * Usage: shobjects WORKDIR [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096
#define PAGES 256
#define FILE_PAGES 40
#define FILE_MAP_PAGES 64

/* Mixes `seed` into every word of the page (so the page's value depends on every earlier
 * step that wrote it), or with seed 0 clears the page. */
static void fill_page(uint8_t *p, uint64_t seed)
{
    uint64_t *w = (uint64_t *)p;
    for (int k = 0; k < PAGE / 8; k++)
        w[k] = seed ? mix64(w[k] ^ seed ^ (uint64_t)k) : 0;
}

static uint64_t hash_pages(const uint8_t *p, size_t pages, uint64_t h)
{
    const uint64_t *w = (const uint64_t *)p;
    for (size_t k = 0; k < pages * PAGE / 8; k++)
        h = mix64(h ^ w[k] ^ k);
    return h;
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: shobjects WORKDIR [SECONDS=4]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    size_t len = PAGES * PAGE;
    int prot = PROT_READ | PROT_WRITE;

    uint8_t *anon = mmap(NULL, len, prot, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int mfd = memfd_create("shobjects", 0);
    char name[64];
    uint64_t tag = 0;
    for (const char *c = argv[1]; *c; c++)
        tag = mix64(tag ^ (uint64_t)(unsigned char)*c);
    snprintf(name, sizeof name, "/ckpt-shobjects-%016llx", (unsigned long long)tag);
    int shm = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    char path[4096];
    snprintf(path, sizeof path, "%s/shobjects.dat", argv[1]);
    int dfd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    /* Unlinked at once: a checkpoint during the setup below (its fsync may wait long on a busy
     * disk) would find them named, and the crash round, running on, unlinks them. */
    shm_unlink(name);
    unlink(path);
    if (anon == MAP_FAILED || mfd < 0 || shm < 0 || dfd < 0 || ftruncate(mfd, (off_t)len) || ftruncate(shm, (off_t)len)) {
        perror("setup");
        return 2;
    }
    uint8_t page[PAGE];
    for (int k = 0; k < FILE_PAGES; k++) {
        memset(page, 0, sizeof page);
        fill_page(page, 0xd15c0000u + (uint64_t)k);
        if (write_full(dfd, page, PAGE)) {
            perror(path);
            return 2;
        }
    }
    fsync(dfd);
    posix_fadvise(dfd, 0, 0, POSIX_FADV_DONTNEED);
    uint8_t *memfd = mmap(NULL, len, prot, MAP_SHARED, mfd, 0);
    uint8_t *view = mmap(NULL, len / 2, PROT_NONE, MAP_SHARED, mfd, (off_t)(len / 2));
    uint8_t *posix = mmap(NULL, len, prot, MAP_SHARED, shm, 0);
    uint8_t *disk = mmap(NULL, FILE_MAP_PAGES * PAGE, prot, MAP_SHARED, dfd, 0);
    if (memfd == MAP_FAILED || view == MAP_FAILED || posix == MAP_FAILED || disk == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    close(mfd);
    close(shm);
    close(dfd);
    uint8_t *objects[3] = {anon, memfd, posix};

    pid_t writer = fork();
    if (writer == 0) {
        for (long i = 0; i < steps; i++) {
            size_t at = (size_t)(i * 37 % PAGES) * PAGE;
            uint64_t seed = i % 5 == 4 ? 0 : 0x5eed0000u + (uint64_t)i;
            for (int o = 0; o < 3; o++) {
                fill_page(objects[o] + at, seed ? seed ^ (uint64_t)o << 40 : 0);
                madvise(objects[o] + at, PAGE, MADV_DONTNEED);
            }
            if (i % 2 == 0) {
                size_t d = (size_t)(i * 3 % FILE_PAGES) * PAGE;
                fill_page(disk + d, 0xd15c5eedu + (uint64_t)i);
                madvise(disk + d, PAGE, MADV_DONTNEED);
            }
            sleep_ms(STEP_MS);
        }
        _exit(0);
    }
    int st;
    if (waitpid(writer, &st, 0) != writer || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("writer status %#x", st);

    mprotect(view, len / 2, PROT_READ);
    if (memcmp(view, memfd + len / 2, len / 2))
        fail("the second view of the memfd differs from the memfd");
    uint64_t result = 0;
    for (int o = 0; o < 3; o++)
        result = hash_pages(objects[o], PAGES, result);
    result = hash_pages(disk, FILE_PAGES, result);
    return finish(result);
}
