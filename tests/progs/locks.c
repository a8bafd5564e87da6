/* locks: file locks are held again after checkpoint/restart.
 *
 * In DIR the program takes
 *  - an exclusive flock(2) lock on flock.dat, through a description a child shares (fork);
 *  - POSIX record locks on posix.dat: write on bytes 10..29, read from 100 to the end;
 *  - an OFD read lock on bytes 0..4 of ofd.dat;
 *  - a read lease (F_SETLEASE) on lease.dat, held by the parent alone, which F_GETLEASE must
 *    report at every step;
 *  - a write lease on breaking.dat, through a description the child shares and the parent holds
 *    twice (dup), being broken: the parent's own open for writing (O_NONBLOCK) started the
 *    break. At every step F_GETLEASE must say what it breaks to (none), its fdinfo must show it
 *    BREAKING (the kernel ends the break only after /proc/sys/fs/lease-break-time, 45 s by
 *    default; checked longer than the run), and exactly one SIGIO must have come, the break's:
 *    a restart must neither end the break nor signal it again. The child checks its fdinfo too.
 * Every step probes them through descriptions of its own, opened once (closing a descriptor of
 * a file would drop the process's POSIX locks on it), which the program's locks conflict with:
 * flock(LOCK_EX|LOCK_NB) must fail, and F_OFD_GETLK must report each POSIX lock (with this
 * process as its owner), the OFD lock, and no lock on the bytes between. The child probes the
 * same at the end. RESULT folds each step's probes and the lease read: the same as an
 * uninterrupted run's only where every lock was found held.
 *
 * Usage: locks DIR [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

static int open_rw(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) {
        perror(path);
        exit(2);
    }
    return fd;
}

static volatile sig_atomic_t sigios;
static void on_sigio(int sig)
{
    (void)sig;
    sigios++;
}

/* Whether the descriptor's fdinfo shows a lease being broken to none. */
static int breaking(int fd)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    FILE *f = fopen(path, "r");
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        found |= strstr(line, "LEASE") && strstr(line, "BREAKING") && strstr(line, "UNLCK");
    if (f)
        fclose(f);
    return found;
}

/* The probing descriptions. */
static int probe_fl, probe_px, probe_ofd;

/* What an OFD write lock on [start, start+len) through the probing description `fd` would
 * conflict with: F_UNLCK if nothing. `pid` gets the owner (-1 for an OFD lock). */
static int conflict(int fd, off_t start, off_t len, pid_t *pid)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
        return -1;
    *pid = fl.l_pid;
    return fl.l_type;
}

/* Probes every lock; returns how many are not as they should be (and says which). */
static int probe(const char *who, pid_t owner)
{
    int bad = 0;
    if (flock(probe_fl, LOCK_EX | LOCK_NB) == 0 || errno != EWOULDBLOCK) {
        fail("%s: flock.dat is not locked", who);
        bad++;
    }
    pid_t pid = 0;
    int t = conflict(probe_px, 15, 5, &pid);
    if (t != F_WRLCK || pid != owner) {
        fail("%s: posix.dat 15..19: lock type %d owner %d, expected a write lock of %d", who, t,
             (int)pid, (int)owner);
        bad++;
    }
    t = conflict(probe_px, 1000, 1, &pid);
    if (t != F_RDLCK || pid != owner) {
        fail("%s: posix.dat 1000: lock type %d owner %d, expected a read lock of %d", who, t,
             (int)pid, (int)owner);
        bad++;
    }
    t = conflict(probe_px, 30, 70, &pid);
    if (t != F_UNLCK) {
        fail("%s: posix.dat 30..99: lock type %d, expected none", who, t);
        bad++;
    }
    t = conflict(probe_ofd, 0, 5, &pid);
    if (t != F_RDLCK || pid != -1) {
        fail("%s: ofd.dat 0..4: lock type %d owner %d, expected an OFD read lock", who, t,
             (int)pid);
        bad++;
    }
    t = conflict(probe_ofd, 5, 0, &pid);
    if (t != F_UNLCK) {
        fail("%s: ofd.dat from 5: lock type %d, expected none", who, t);
        bad++;
    }
    return bad;
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: locks DIR [SECONDS=4]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    if (chdir(argv[1]) != 0) {
        perror(argv[1]);
        return 2;
    }
    int fl = open_rw("flock.dat");
    int px = open_rw("posix.dat");
    int ofd = open_rw("ofd.dat");
    struct flock w = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 10, .l_len = 20};
    struct flock r = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 100, .l_len = 0};
    struct flock o = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 5};
    if (flock(fl, LOCK_EX) || fcntl(px, F_SETLK, &w) || fcntl(px, F_SETLK, &r) ||
        fcntl(ofd, F_OFD_SETLK, &o)) {
        perror("lock");
        return 2;
    }
    pid_t me = getpid();
    probe_fl = open_rw("flock.dat");
    probe_px = open_rw("posix.dat");
    probe_ofd = open_rw("ofd.dat");

    close(open_rw("breaking.dat"));
    int brk = open("breaking.dat", O_RDWR);
    if (brk < 0 || fcntl(brk, F_SETLEASE, F_WRLCK) != 0) {
        perror("breaking.dat: lease");
        return 2;
    }
    int brk_dup = dup(brk);

    pid_t child = fork();
    if (child == 0) {
        for (long s = 0; s < steps; s++)
            sleep_ms(STEP_MS);
        /* The child shares the flock and OFD descriptions; the POSIX locks are its parent's. */
        int bad = probe("child", me);
        if (!breaking(brk)) {
            fail("child: breaking.dat: its fdinfo shows no lease being broken");
            bad++;
        }
        _exit(bad ? 1 : 0);
    }
    signal(SIGIO, on_sigio);
    if (open("breaking.dat", O_WRONLY | O_NONBLOCK) >= 0 || errno != EWOULDBLOCK) {
        perror("breaking.dat: the open that breaks the lease");
        return 2;
    }
    /* After the fork: the parent's alone. */
    close(open_rw("lease.dat"));
    int lease = open("lease.dat", O_RDONLY);
    if (lease < 0 || fcntl(lease, F_SETLEASE, F_RDLCK) != 0) {
        perror("lease");
        return 2;
    }

    long bad_steps = 0;
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        int bad = probe("parent", me);
        int held = fcntl(lease, F_GETLEASE);
        h = mix64(h ^ (uint64_t)s ^ ((uint64_t)bad << 32) ^ ((uint64_t)(unsigned)held << 40));
        if (held != F_RDLCK) {
            fail("parent: lease.dat: lease %d, expected a read lease (%d)", held, F_RDLCK);
            bad++;
        }
        int to = fcntl(brk, F_GETLEASE), shown = breaking(brk) + breaking(brk_dup);
        h = mix64(h ^ ((uint64_t)(unsigned)to << 8) ^ ((uint64_t)shown << 16) ^ ((uint64_t)sigios << 20));
        if (to != F_UNLCK || shown != 2 || sigios != 1) {
            fail("parent: breaking.dat: lease %d (expected none, %d, while broken), shown being broken by %d of 2 descriptors, %d SIGIO (expected the break's one)",
                 to, F_UNLCK, shown, (int)sigios);
            bad++;
        }
        if (bad && ++bad_steps > 3)
            break;
        sleep_ms(STEP_MS);
    }
    int st;
    if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("the child found the locks wrong (status %#x)", st);
    return finish(mix64(h ^ (uint64_t)st));
}
