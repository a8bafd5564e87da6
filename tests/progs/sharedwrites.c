/* sharedwrites: shared memory written without pause while checkpoints copy it before the freeze
 * comes back exactly as it was at the freeze, never as it was at the copy.
 *
 * Three shared objects of 16 MiB: MAP_SHARED|MAP_ANONYMOUS memory, POSIX shared memory
 * (shm_open under /dev/shm) and a memfd. Each has a part written once at the start and never
 * again (which a checkpoint refers to its copy), and a ring of pages rewritten in turn: at step
 * c the ring's next pages get the value c. A child writes the first two objects through its
 * mapping; the parent writes the memfd, one step through its mapping, the next with pwrite(2)
 * (which changes the file's times, not any page table). Before overwriting a page, the writer
 * checks that it holds what the writer last put there, which its private step counter says: a
 * restart whose shared pages are older than its private memory (a page written between the
 * copy and the freeze, restored as the copy had it) fails there, or in the full check at the
 * end. A second child, forked and ended at every step of the first third of the run, writes
 * a word of the anonymous object through its own mapping, which no one else maps anew: a page a
 * process wrote that was gone by the freeze. The parent also maps the POSIX object read-only
 * from a read-only descriptor (as Open MPI's ranks map their launcher's PMIx store): a mapping
 * nothing can be written through, which must not keep the object from being copied ahead, and
 * which must show the writer's last step at the end.
 *
 * Usage: sharedwrites WORKDIR [SECONDS=4]
 */
#include "common.h"

#include <sys/mman.h>
#include <sys/stat.h>

#define OBJECT_LEN (16u << 20)
#define PAGE 4096u
/* The first half of each object is the ring, the second the part written once. */
#define RING_PAGES (OBJECT_LEN / PAGE / 2)
#define PAGES_PER_STEP 64u

static uint64_t static_value(unsigned object, unsigned page)
{
    return mix64(((uint64_t)object << 32) | page);
}

/* What the ring's page `page` holds once step `c` is written. */
static uint64_t ring_value(uint64_t c, unsigned page)
{
    /* Step s writes the slot (s - 1) mod steps_per_turn: pages [slot, slot + 1) * PAGES_PER_STEP. */
    uint64_t steps_per_turn = RING_PAGES / PAGES_PER_STEP;
    uint64_t slot = page / PAGES_PER_STEP;
    if (c == 0 || c - 1 < slot)
        return 0;
    return c - (c - 1 - slot) % steps_per_turn;
}

static int check_page(const unsigned char *obj, unsigned page, uint64_t want, const char *name, uint64_t step)
{
    const uint64_t *w = (const uint64_t *)(obj + (size_t)page * PAGE);
    if (w[0] != want || w[PAGE / 8 - 1] != want) {
        fail("%s: ring page %u holds %llu/%llu at step %llu, %llu written there last", name, page,
             (unsigned long long)w[0], (unsigned long long)w[PAGE / 8 - 1], (unsigned long long)step,
             (unsigned long long)want);
        return -1;
    }
    return 0;
}

/* Writes step `c` of the ring of `obj`, checking each page before: through the mapping, or with
 * pwrite into `fd` when fd >= 0. */
static int write_step(unsigned char *obj, int fd, uint64_t c, const char *name)
{
    uint64_t steps_per_turn = RING_PAGES / PAGES_PER_STEP;
    unsigned first = (unsigned)(((c - 1) % steps_per_turn) * PAGES_PER_STEP);
    static uint64_t page_buf[PAGE / 8];
    for (unsigned p = first; p < first + PAGES_PER_STEP; p++) {
        if (check_page(obj, p, ring_value(c - 1, p), name, c))
            return -1;
        if (fd >= 0) {
            for (unsigned i = 0; i < PAGE / 8; i++)
                page_buf[i] = c;
            if (pwrite(fd, page_buf, PAGE, (off_t)p * PAGE) != (ssize_t)PAGE) {
                fail("%s: pwrite: %s", name, strerror(errno));
                return -1;
            }
        } else {
            uint64_t *w = (uint64_t *)(obj + (size_t)p * PAGE);
            for (unsigned i = 0; i < PAGE / 8; i++)
                w[i] = c;
        }
    }
    return 0;
}

static int check_all(const unsigned char *obj, unsigned object, uint64_t c, const char *name)
{
    for (unsigned p = 0; p < RING_PAGES; p++)
        if (check_page(obj, p, ring_value(c, p), name, c))
            return -1;
    for (unsigned p = RING_PAGES; p < OBJECT_LEN / PAGE; p++) {
        const uint64_t *w = (const uint64_t *)(obj + (size_t)p * PAGE);
        if (w[1] != static_value(object, p)) {
            fail("%s: page %u written once holds %#llx", name, p, (unsigned long long)w[1]);
            return -1;
        }
    }
    return 0;
}

static uint64_t digest(const unsigned char *obj)
{
    uint64_t h = 0;
    for (size_t i = 0; i < OBJECT_LEN; i += 8)
        h = mix64(h ^ *(const uint64_t *)(obj + i));
    return h;
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: sharedwrites WORKDIR [SECONDS=4]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    char name[64];
    uint64_t tag = 0;
    for (const char *c = argv[1]; *c; c++)
        tag = mix64(tag ^ (uint64_t)(unsigned char)*c);
    snprintf(name, sizeof name, "/ckpt-sharedwrites-%016llx", (unsigned long long)tag);
    int shm = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    int mfd = memfd_create("ckpt-sharedwrites", 0);
    if (shm < 0 || mfd < 0 || ftruncate(shm, OBJECT_LEN) || ftruncate(mfd, OBJECT_LEN)) {
        perror("setup");
        return 2;
    }
    unsigned char *obj[3];
    obj[0] = mmap(NULL, OBJECT_LEN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    obj[1] = mmap(NULL, OBJECT_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
    obj[2] = mmap(NULL, OBJECT_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    close(shm);
    int shm_ro = shm_open(name, O_RDONLY, 0);
    const unsigned char *read_only = shm_ro < 0 ? MAP_FAILED : mmap(NULL, OBJECT_LEN, PROT_READ, MAP_SHARED, shm_ro, 0);
    if (read_only == MAP_FAILED) {
        perror("the read-only view");
        return 2;
    }
    close(shm_ro);
    const char *names[3] = {"MAP_SHARED|MAP_ANONYMOUS", "POSIX shm", "memfd"};
    for (unsigned k = 0; k < 3; k++) {
        if (obj[k] == MAP_FAILED) {
            perror("mmap");
            return 2;
        }
        for (unsigned p = RING_PAGES; p < OBJECT_LEN / PAGE; p++)
            ((uint64_t *)(obj[k] + (size_t)p * PAGE))[1] = static_value(k, p);
    }
    /* The word the short-lived children write: the last page of the anonymous object's
     * written-once part, its first word (the check reads the second). */
    volatile uint64_t *ended_children = (uint64_t *)(obj[0] + OBJECT_LEN - PAGE);

    pid_t writer = fork();
    if (writer == 0) {
        for (uint64_t c = 1; c <= (uint64_t)steps; c++) {
            if (write_step(obj[0], -1, c, names[0]) || write_step(obj[1], -1, c, names[1]))
                _exit(1);
            sleep_ms(STEP_MS);
        }
        _exit(check_all(obj[0], 0, (uint64_t)steps, names[0]) || check_all(obj[1], 1, (uint64_t)steps, names[1]) ? 1 : 0);
    }
    for (uint64_t c = 1; c <= (uint64_t)steps; c++) {
        if (write_step(obj[2], c % 2 ? mfd : -1, c, names[2]))
            break;
        if (c <= (uint64_t)steps / 3) {
            pid_t brief = fork();
            if (brief == 0) {
                *ended_children += 1;
                _exit(0);
            }
            int st;
            if (waitpid(brief, &st, 0) != brief || !WIFEXITED(st) || WEXITSTATUS(st))
                fail("short-lived child %llu status %#x", (unsigned long long)c, st);
            if (*ended_children != c) {
                fail("after %llu short-lived children, their count is %llu", (unsigned long long)c,
                     (unsigned long long)*ended_children);
                break;
            }
        }
        sleep_ms(STEP_MS);
    }
    int st;
    if (waitpid(writer, &st, 0) != writer || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("the writer's status %#x", st);
    check_all(obj[2], 2, (uint64_t)steps, names[2]);
    check_all(read_only, 1, (uint64_t)steps, "POSIX shm, seen through a read-only mapping");
    shm_unlink(name);
    uint64_t result = 0;
    for (unsigned k = 0; k < 3; k++)
        result = mix64(result ^ digest(obj[k]));
    return finish(result);
}
