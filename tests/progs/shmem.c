/* shmem: memory shared between processes, and a log they all append to, survive
 * checkpoint/restart.
 *
 * The parent maps three shared regions before forking two workers: MAP_SHARED|MAP_ANONYMOUS,
 * POSIX shared memory (shm_open under /dev/shm) and a memfd. Each region holds a process-shared
 * mutex and a counter; the workers add to every counter in steps, under the mutex, and append a
 * line per step to an O_APPEND log opened once by the parent (one open file description shared
 * by all three processes). At the end the parent checks every counter (so the regions were still
 * shared after restart) and RESULT hashes the counters; the test compares the log with an
 * uninterrupted run's (every line present exactly once).
 *
 * Usage: shmem WORKDIR [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

struct region {
    pthread_mutex_t lock;
    uint64_t counter;
    uint64_t hash;
};

static struct region *setup(void *mem)
{
    struct region *r = mem;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&r->lock, &a);
    r->counter = 0;
    r->hash = 0;
    return r;
}

static void add(struct region *r, uint64_t v)
{
    pthread_mutex_lock(&r->lock);
    r->counter += v;
    r->hash ^= mix64(v);
    pthread_mutex_unlock(&r->lock);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: shmem WORKDIR [SECONDS=4]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    size_t len = 4 << 20;

    void *anon = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    /* A name unique to this work directory: concurrent runs must not share the object. */
    char name[64];
    uint64_t tag = 0;
    for (const char *c = argv[1]; *c; c++)
        tag = mix64(tag ^ (uint64_t)(unsigned char)*c);
    snprintf(name, sizeof name, "/ckpt-shmem-%016llx", (unsigned long long)tag);
    int shm = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    int mfd = memfd_create("ckpt-test", 0);
    if (anon == MAP_FAILED || shm < 0 || mfd < 0 || ftruncate(shm, (off_t)len) || ftruncate(mfd, (off_t)len)) {
        perror("setup");
        return 2;
    }
    /* A second POSIX object with all its space allocated ahead (as PostgreSQL allocates its
     * segments, so that a write never meets a full /dev/shm), one page of it written: its
     * space must come back allocated. */
    char alloc_name[80];
    snprintf(alloc_name, sizeof alloc_name, "%s-alloc", name);
    size_t alloc_len = 1 << 20;
    int alloc_fd = shm_open(alloc_name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (alloc_fd < 0 || ftruncate(alloc_fd, (off_t)alloc_len) || posix_fallocate(alloc_fd, 0, (off_t)alloc_len)) {
        perror("setup allocated object");
        return 2;
    }
    unsigned char *allocated = mmap(NULL, alloc_len, PROT_READ | PROT_WRITE, MAP_SHARED, alloc_fd, 0);
    close(alloc_fd);
    if (allocated == MAP_FAILED) {
        perror("mmap allocated object");
        return 2;
    }
    allocated[4096] = 0xa5;
    void *posix = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    close(shm);
    close(mfd);
    struct region *regions[3] = {setup(anon), setup(posix), setup(mem)};
    /* The POSIX object's last page is written, the pages between are holes: both must come back
     * as they were (a checkpoint that stored the holes as zeros gave the object all 4 MiB). */
    memset((char *)posix + len - 4096, 0x5a, 4096);

    char log_path[4096];
    snprintf(log_path, sizeof log_path, "%s/log.txt", argv[1]);
    int log = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (log < 0) {
        perror(log_path);
        return 2;
    }

    pid_t kids[2];
    for (int w = 0; w < 2; w++) {
        kids[w] = fork();
        if (kids[w] == 0) {
            for (long i = 0; i < steps; i++) {
                for (int k = 0; k < 3; k++)
                    add(regions[k], (uint64_t)(w + 1) * 1000 + (uint64_t)i);
                char line[64];
                int n = snprintf(line, sizeof line, "worker %d step %ld\n", w, i);
                if (write(log, line, (size_t)n) != n)
                    _exit(3);
                sleep_ms(STEP_MS);
            }
            _exit(0);
        }
    }
    int st;
    for (int w = 0; w < 2; w++)
        if (waitpid(kids[w], &st, 0) != kids[w] || !WIFEXITED(st) || WEXITSTATUS(st))
            fail("worker %d status %#x", w, st);

    uint64_t expect = 0;
    for (int w = 0; w < 2; w++)
        for (long i = 0; i < steps; i++)
            expect += (uint64_t)(w + 1) * 1000 + (uint64_t)i;
    uint64_t result = 0;
    const char *names[3] = {"MAP_SHARED|MAP_ANONYMOUS", "POSIX shm", "memfd"};
    for (int k = 0; k < 3; k++) {
        if (regions[k]->counter != expect)
            fail("%s counter %llu, expected %llu", names[k], (unsigned long long)regions[k]->counter,
                 (unsigned long long)expect);
        result = mix64(result ^ regions[k]->counter ^ regions[k]->hash);
    }
    for (size_t i = len - 4096; i < len; i++)
        if (((unsigned char *)posix)[i] != 0x5a) {
            fail("the POSIX object's last page changed at byte %zu", i);
            break;
        }
    struct stat sb;
    int ro = shm_open(name, O_RDONLY, 0);
    if (ro < 0 || fstat(ro, &sb))
        fail("shm_open %s again: %s", name, strerror(errno));
    else if ((uint64_t)sb.st_blocks * 512 > len / 2)
        fail("the POSIX object holds %llu bytes of its %zu: the holes between its pages were filled",
             (unsigned long long)sb.st_blocks * 512, len);
    if (ro >= 0)
        close(ro);
    shm_unlink(name);
    if (allocated[4096] != 0xa5)
        fail("the allocated object's written byte is %#x", allocated[4096]);
    ro = shm_open(alloc_name, O_RDONLY, 0);
    if (ro < 0 || fstat(ro, &sb))
        fail("shm_open %s again: %s", alloc_name, strerror(errno));
    else if ((uint64_t)sb.st_blocks * 512 < alloc_len)
        fail("the allocated object holds %llu bytes of its %zu: its allocation was lost",
             (unsigned long long)sb.st_blocks * 512, alloc_len);
    if (ro >= 0)
        close(ro);
    shm_unlink(alloc_name);

    /* Every line of the log exactly once (the workers' lines interleave in any order). */
    FILE *f = fopen(log_path, "r");
    int *seen = calloc((size_t)(2 * steps), sizeof(int));
    char line[128];
    long lines = 0;
    while (f && fgets(line, sizeof line, f)) {
        int w;
        long i;
        lines++;
        if (sscanf(line, "worker %d step %ld", &w, &i) != 2 || w < 0 || w > 1 || i < 0 || i >= steps) {
            fail("log line %ld is garbled: %s", lines, line);
            break;
        }
        seen[w * steps + i]++;
    }
    for (long k = 0; k < 2 * steps; k++)
        if (seen[k] != 1) {
            fail("log has worker %ld step %ld %d times", k / steps, k % steps, seen[k]);
            break;
        }
    if (f)
        fclose(f);
    return finish(result);
}
