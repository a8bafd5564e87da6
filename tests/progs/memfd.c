/* memfd: memfd descriptors keep their name, contents, seals and identity across
 * checkpoint/restart.
 *
 *  - m1 "ckpt-test" (MFD_ALLOW_SEALING, sealed against shrinking) holds 200 KiB of a known
 *    pattern; m1r is a second description of it (opened through /proc/self/fd) that reads the
 *    pattern 64 bytes a step; m1 writes one record a step from PARENT_AT on (its offset moves);
 *  - a child opens its own description of m1 and writes one record a step from CHILD_AT on
 *    (pwrite): after the restart it must still reach the same memfd as the parent;
 *  - m2 "plain" (no sealing: F_SEAL_SEAL, mode 0642 as zdtm's memfd00 gives it), m3 "sealed"
 *    (shrink, grow, write and seal);
 *  - m4 "mapped", also mapped shared (and so in the child too): each step writes a word through
 *    the mapping and reads it through the descriptor, and the other way round; the child writes
 *    through its inherited mapping. Descriptor and mappings must stay one object.
 *  - m5 "script", a shell script ("#!/bin/true") that is executed through its descriptor
 *    (execveat, as runc and fileless launchers do) at the end: a description reopened through
 *    /proc counts as a writer of the file, which the exec refuses (ETXTBSY).
 * At the end: every record of both processes is read through m1r, the names and seals are as
 * they were, and the seals hold (shrinking m1, writing m3 fail). RESULT hashes what was read.
 *
 * Usage: memfd [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIZE (200 * 1024)
#define PARENT_AT (SIZE + 0)
#define CHILD_AT (SIZE + 64 * 1024)
#define CHUNK 64
#define MAP_SIZE 8192
#define CHILD_WORD 512

static uint8_t byte_at(size_t i) { return (uint8_t)(mix64(i / 8 + 5) >> (8 * (i % 8))); }

static void record(long s, uint64_t salt, uint64_t out[2])
{
    out[0] = (uint64_t)s;
    out[1] = mix64((uint64_t)s ^ salt);
}

static void check_name(int fd, const char *name)
{
    char link[64], target[256], want[256];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    target[n > 0 ? n : 0] = 0;
    snprintf(want, sizeof want, "/memfd:%s (deleted)", name);
    if (strcmp(target, want) != 0)
        fail("fd %d is %s, expected %s", fd, target, want);
}

static void check_seals(int fd, int want, const char *name)
{
    int got = fcntl(fd, F_GET_SEALS);
    if (got != want)
        fail("%s has seals %#x, expected %#x", name, got, want);
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);

    static uint8_t buf[SIZE];
    for (size_t i = 0; i < SIZE; i++)
        buf[i] = byte_at(i);
    int m1 = memfd_create("ckpt-test", MFD_ALLOW_SEALING | MFD_CLOEXEC);
    int m5 = memfd_create("script", 0);
    if (m5 < 0 || write_full(m5, "#!/bin/true\n", 12) != 0) {
        printf("setup: memfd script: %s\n", strerror(errno));
        return 2;
    }
    int m2 = memfd_create("plain", 0);
    int m3 = memfd_create("sealed", MFD_ALLOW_SEALING);
    if (m1 < 0 || m2 < 0 || m3 < 0 || write(m1, buf, SIZE) != SIZE || write(m2, "plain", 5) != 5 ||
        write(m3, "sealed!", 7) != 7) {
        perror("memfd");
        return 2;
    }
    if (fchmod(m2, 0642) != 0) {
        perror("fchmod");
        return 2;
    }
    int seals3 = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
    if (fcntl(m1, F_ADD_SEALS, F_SEAL_SHRINK) || fcntl(m3, F_ADD_SEALS, seals3)) {
        perror("F_ADD_SEALS");
        return 2;
    }
    int m4 = memfd_create("mapped", MFD_CLOEXEC);
    uint64_t *map4 = MAP_FAILED;
    if (m4 >= 0 && ftruncate(m4, MAP_SIZE) == 0)
        map4 = mmap(NULL, MAP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, m4, 0);
    if (map4 == MAP_FAILED) {
        perror("mapped memfd");
        return 2;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", m1);
    int m1r = open(path, O_RDONLY);
    if (m1r < 0 || lseek(m1, PARENT_AT, SEEK_SET) != PARENT_AT) {
        perror(path);
        return 2;
    }

    pid_t child = fork();
    if (child == 0) {
        int own = open(path, O_RDWR);
        if (own < 0)
            _exit(3);
        for (long s = 0; s < steps; s++) {
            uint64_t r[2];
            record(s, 0xc41dULL, r);
            if (pwrite(own, r, sizeof r, CHILD_AT + s * 16) != sizeof r)
                _exit(4);
            map4[CHILD_WORD + s % 64] = r[1];
            sleep_ms(STEP_MS);
        }
        _exit(0);
    }

    uint64_t h = 0;
    size_t pos = 0;
    for (long s = 0; s < steps; s++) {
        uint8_t chunk[CHUNK];
        if (read(m1r, chunk, CHUNK) != CHUNK) {
            fail("step %ld: short read of the memfd", s);
            break;
        }
        for (size_t i = 0; i < CHUNK; i++)
            if (chunk[i] != byte_at(pos + i)) {
                fail("step %ld: byte %zu of the memfd is wrong", s, pos + i);
                break;
            }
        h = mix64(h ^ chunk[7]);
        pos += CHUNK;
        uint64_t r[2];
        record(s, 0xfa7eULL, r);
        if (write(m1, r, sizeof r) != sizeof r)
            fail("step %ld: write to the memfd", s);
        uint64_t word = r[1], back = 0;
        long at = s % 64;
        map4[at] = word;
        if (pread(m4, &back, 8, at * 8) != 8 || back != word)
            fail("step %ld: a word written through the mapping is not read through the fd", s);
        word = mix64(word);
        if (pwrite(m4, &word, 8, (64 + at) * 8) != 8 || map4[64 + at] != word)
            fail("step %ld: a word written through the fd is not seen in the mapping", s);
        sleep_ms(STEP_MS);
    }
    int st;
    if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("child status %#x", st);

    for (long s = 0; s < steps; s++) {
        uint64_t want[2], got[2];
        record(s, 0xfa7eULL, want);
        if (pread(m1r, got, sizeof got, PARENT_AT + s * 16) != sizeof got || memcmp(want, got, 16)) {
            fail("the parent's record %ld is not in the memfd", s);
            break;
        }
        record(s, 0xc41dULL, want);
        if (pread(m1r, got, sizeof got, CHILD_AT + s * 16) != sizeof got || memcmp(want, got, 16)) {
            fail("the child's record %ld is not in the memfd (the child's memfd is another one?)", s);
            break;
        }
        h = mix64(h ^ got[1]);
    }
    for (long s = steps - 64 > 0 ? steps - 64 : 0; s < steps; s++) {
        uint64_t want[2], got = 0;
        record(s, 0xc41dULL, want);
        if (pread(m4, &got, 8, (CHILD_WORD + s % 64) * 8) != 8 || got != want[1]) {
            fail("the child's word %ld is not in the mapped memfd", s);
            break;
        }
    }
    check_name(m4, "mapped");
    struct stat a, b;
    if (fstat(m1, &a) || fstat(m1r, &b) || a.st_ino != b.st_ino)
        fail("m1 and m1r are different memfds");
    check_name(m1, "ckpt-test");
    check_name(m2, "plain");
    struct stat m2st;
    if (fstat(m2, &m2st) || (m2st.st_mode & 07777) != 0642)
        fail("plain has mode %o, not 642", (unsigned)(m2st.st_mode & 07777));
    check_name(m3, "sealed");
    check_seals(m1, F_SEAL_SHRINK, "ckpt-test");
    check_seals(m2, F_SEAL_SEAL, "plain");
    check_seals(m3, seals3, "sealed");
    if (ftruncate(m1, 10) == 0 || errno != EPERM)
        fail("ckpt-test could be shrunk");
    if (pwrite(m3, "x", 1, 0) != -1 || errno != EPERM)
        fail("sealed could be written");
    char s3[8] = {0};
    if (pread(m3, s3, 7, 0) != 7 || strcmp(s3, "sealed!"))
        fail("sealed holds %s", s3);
    if (!(fcntl(m1, F_GETFD) & FD_CLOEXEC) || (fcntl(m2, F_GETFD) & FD_CLOEXEC))
        fail("close-on-exec changed");
    pid_t runner = fork();
    if (runner == 0) {
        char *args[] = {"true", NULL}, *env[] = {NULL};
        syscall(SYS_execveat, m5, "", args, env, AT_EMPTY_PATH);
        printf("FAIL execveat of the memfd script: %s\n", strerror(errno));
        fflush(stdout);
        _exit(1);
    }
    int ran;
    if (runner < 0 || waitpid(runner, &ran, 0) != runner || !WIFEXITED(ran) || WEXITSTATUS(ran) != 0)
        fail("the memfd script did not run (status %#x)", ran);
    return finish(h);
}
