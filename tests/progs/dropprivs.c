/* dropprivs: a daemon's start: it opens its files as root, then runs as another user.
 *
 * Started by root, it makes WORKDIR/secret (root's, 0600, known contents) and WORKDIR/held.log
 * (root's, 0600), opens the secret read-only, maps it shared, opens held.log for appending, and
 * then drops to UID/GID for good (supplementary groups cleared, real, effective and saved ids,
 * its filesystem group id GID + 1: set apart, as a file server does, before the user ids),
 * with lower soft limits of its own (descriptors, stack, message queues, as a daemon sets them).
 * Each step it reads the secret through its descriptor and its mapping (both must hold the known
 * contents), appends one line to held.log, and checks that it cannot open the secret anew (it
 * really runs as the other user). A restart must give it back what it opened with root's rights,
 * although it no longer has them, and its limits (which root may fail to read with prlimit(2)
 * where it lacks CAP_SYS_RESOURCE, as in a container). RESULT hashes what it read; held.log gets
 * one line per step.
 *
 * Usage: dropprivs WORKDIR UID GID [SECONDS=5]
 */
#include "common.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/fsuid.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#define WORDS 1024 /* the secret: 8 KiB */

static uint64_t want[WORDS], got[WORDS];

/* The limits lowered before the drop, and what each soft one became. */
static const int lowered[] = {RLIMIT_NOFILE, RLIMIT_STACK, RLIMIT_MSGQUEUE};
#define LOWERED (sizeof lowered / sizeof lowered[0])
static rlim_t soft[LOWERED];

static void check_limits(long step)
{
    for (size_t k = 0; k < LOWERED; k++) {
        struct rlimit r;
        if (getrlimit(lowered[k], &r) != 0 || r.rlim_cur != soft[k])
            fail("step %ld: soft limit %d is %llu, was %llu", step, lowered[k], (unsigned long long)r.rlim_cur,
                 (unsigned long long)soft[k]);
    }
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 4) {
        fprintf(stderr, "usage: dropprivs WORKDIR UID GID [SECONDS]\n");
        return 2;
    }
    uid_t uid = (uid_t)atol(argv[2]);
    gid_t gid = (gid_t)atol(argv[3]);
    long steps = steps_arg(argc, argv, 4, 5.0);
    if (geteuid() != 0) {
        fprintf(stderr, "dropprivs must be started by root\n");
        return 2;
    }
    char secret[4096], held[4096];
    snprintf(secret, sizeof secret, "%s/secret", argv[1]);
    snprintf(held, sizeof held, "%s/held.log", argv[1]);
    for (int k = 0; k < WORDS; k++)
        want[k] = mix64((uint64_t)k * 7 + 1);
    int w = open(secret, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (w < 0 || fchmod(w, 0600) != 0 || write_full(w, want, sizeof want) != 0) {
        perror(secret);
        return 2;
    }
    close(w);
    int rd = open(secret, O_RDONLY);
    int app = open(held, O_WRONLY | O_APPEND | O_CREAT | O_TRUNC, 0600);
    if (rd < 0 || app < 0 || fchmod(app, 0600) != 0) {
        perror("open as root");
        return 2;
    }
    const uint64_t *map = mmap(NULL, sizeof want, PROT_READ, MAP_SHARED, rd, 0);
    if (map == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    for (size_t k = 0; k < LOWERED; k++) {
        struct rlimit r;
        if (getrlimit(lowered[k], &r) != 0 || r.rlim_cur < 2 || r.rlim_cur == RLIM_INFINITY)
            r.rlim_cur = 4096;
        r.rlim_cur = lowered[k] == RLIMIT_NOFILE ? 700 : r.rlim_cur - 1;
        if (setrlimit(lowered[k], &r) != 0) {
            perror("lower a limit");
            return 2;
        }
        soft[k] = r.rlim_cur;
    }
    /* Its filesystem group id set apart from the others while it may (zdtm's pid00): after
     * setresuid it no longer could, and a restart must set it in that order too. */
    gid_t fs_gid = gid + 1;
    if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0) {
        perror("drop to the other group");
        return 2;
    }
    setfsgid(fs_gid);
    if ((gid_t)setfsgid(-1) != fs_gid || setresuid(uid, uid, uid) != 0) {
        perror("drop to the other user");
        return 2;
    }
    printf("DROPPED %d %d\n", (int)geteuid(), (int)getegid());
    fflush(stdout);

    uint64_t h = 0;
    char line[64];
    for (long i = 0; i < steps; i++) {
        long at = (i * 131) % WORDS;
        errno = 0;
        if (pread(rd, got, sizeof got, 0) != (ssize_t)sizeof got || memcmp(got, want, sizeof want) != 0)
            fail("step %ld: reading the secret through the descriptor opened as root: %s", i,
                 errno ? strerror(errno) : "other contents");
        if (map[at] != want[at])
            fail("step %ld: the secret's mapping holds other contents at word %ld", i, at);
        snprintf(line, sizeof line, "%ld\n", i);
        if (write_full(app, line, strlen(line)) != 0)
            fail("step %ld: appending to held.log through the descriptor opened as root: %s", i, strerror(errno));
        int again = open(secret, O_RDONLY);
        if (again >= 0) {
            fail("step %ld: the secret opens anew: the program runs as uid %d, not %d", i, (int)geteuid(), (int)uid);
            close(again);
        }
        check_limits(i);
        if ((gid_t)setfsgid(-1) != fs_gid)
            fail("step %ld: the filesystem group id is %d, not %d", i, (int)setfsgid(-1), (int)fs_gid);
        h = mix64(h ^ got[at] ^ map[(at + 1) % WORDS]);
        if (failures > 5)
            break;
        sleep_ms(STEP_MS);
    }
    return finish(h);
}
