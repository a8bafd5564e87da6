/* mounts: a job that mounts file systems of its own, as a container runtime inside a job does,
 * must find them after a restart: the same mounts at the same places with the same flags, a
 * tmpfs with every file it held at the checkpoint (contents, modes, owners, times, links, FIFOs),
 * binds, and its processes in the mount namespace they were in.
 *
 * With "ns" (the default) the program makes a mount namespace of its own (unshare --mount) and
 * mounts there; with "here" it mounts in the job's own namespace. Either way it needs
 * CAP_SYS_ADMIN (root). With "userns" it makes a user namespace first, where it is root (its
 * uid and gid mapped to 0, setgroups denied: unshare -Urm), as an ordinary user can; there it
 * cannot mount a proc file system (the job's PID namespace is not its namespace's), and it
 * checks that it is still root in that namespace, with the same maps, and owns its files. It sets up, in DIR (which it creates):
 *   a/       a tmpfs (size=8m, mode 0751) holding d/ (0700) with f ("hello"), a symbolic link
 *            link -> d/f, a FIFO, a hard link hard to d/f, a file old with a fixed mtime, and
 *            count, where the program writes its step counter at every step
 *   b/       a bind of a/d, made read-only
 *   c/       a bind of the directory host/ (outside the tmpfs), holding h ("host")
 *   p/       a proc file system of its own
 *   under/   unmounted again after being mounted (it must stay a plain directory)
 * Then a child (forked: born in the namespace) and a grandchild adopted by the job's init (its
 * parent exits: it must be put back in the namespace, not born there) check the same things
 * at every step. The main process keeps a descriptor open on a/d/f and on a/count, and maps
 * a/mapped shared, where it writes its counter too.
 *
 * (The helpers' marks a/child-done and a/adopted-done tell the main process they ended.)
 *
 * Every step checks what the program sees against what it set up, and that a/count holds the
 * counter the program has in memory (the tmpfs's contents are those of the checkpoint, not
 * older or newer). Prints PASS, and CHILD-OK twice (each helper at its end), or FAIL <what>.
 *
 * Usage: mounts DIR [SECONDS=5] [ns|here|userns]
 */
#include "common.h"

/* Paths here are short; a longer DIR fails the checks, not memory. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char A[512], B[512], C[512], P[512], U[512], H[512];
static int in_userns;
static char uid_map[256], gid_map[256];

static void path(char *out, const char *dir, const char *name)
{
    snprintf(out, 512, "%s/%s", dir, name);
}

static void must(int ok, const char *what)
{
    if (!ok) {
        printf("FAIL set-up: %s: %s\n", what, strerror(errno));
        exit(1);
    }
}

static void write_file(const char *p, const char *text)
{
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    must(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text) && close(fd) == 0, p);
}

static int read_file(const char *p, char *buf, size_t len)
{
    int fd = open(p, O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    return (int)n;
}

/* The mountinfo line of the topmost mount at `at`, or "" if none. */
static void mount_line(const char *at, char *out, size_t len)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    char line[4096];
    out[0] = 0;
    while (f && fgets(line, sizeof line, f)) {
        char where[1024];
        if (sscanf(line, "%*s %*s %*s %*s %1023s", where) == 1 && strcmp(where, at) == 0)
            snprintf(out, len, "%s", line);
    }
    if (f)
        fclose(f);
}

/* Every check of what the mounts show; `who` names the checking process in messages. */
static void check_mounts(const char *who)
{
    char buf[4096], p[600];
    struct stat st, st2;
    mount_line(A, buf, sizeof buf);
    if (!strstr(buf, " - tmpfs "))
        fail("%s: no tmpfs at %s (%s)", who, A, buf);
    if (stat(A, &st) != 0 || (st.st_mode & 07777) != 0751)
        fail("%s: %s mode %o", who, A, st.st_mode & 07777);
    path(p, A, "d");
    if (stat(p, &st) != 0 || (st.st_mode & 07777) != 0700)
        fail("%s: %s mode %o", who, p, st.st_mode & 07777);
    path(p, A, "d/f");
    if (read_file(p, buf, sizeof buf) < 0 || strcmp(buf, "hello\n") != 0)
        fail("%s: %s holds %s", who, p, buf);
    path(p, A, "link");
    ssize_t n = readlink(p, buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = 0;
    if (strcmp(buf, "d/f") != 0)
        fail("%s: %s points to %s", who, p, buf);
    path(p, A, "fifo");
    if (lstat(p, &st) != 0 || !S_ISFIFO(st.st_mode))
        fail("%s: %s is not a FIFO", who, p);
    path(p, A, "hard");
    char f[600];
    path(f, A, "d/f");
    if (stat(p, &st) != 0 || stat(f, &st2) != 0 || st.st_ino != st2.st_ino || st.st_nlink != 2)
        fail("%s: %s is not a second name of d/f", who, p);
    path(p, A, "old");
    if (stat(p, &st) != 0 || st.st_mtime != 1234567890)
        fail("%s: %s mtime %ld", who, p, (long)st.st_mtime);
    path(p, B, "f");
    if (read_file(p, buf, sizeof buf) < 0 || strcmp(buf, "hello\n") != 0)
        fail("%s: %s (the bind of a/d) holds %s", who, p, buf);
    path(p, B, "new");
    int fd = open(p, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0 || errno != EROFS)
        fail("%s: %s could be created in the read-only bind (%s)", who, p, strerror(errno));
    if (fd >= 0)
        close(fd);
    mount_line(B, buf, sizeof buf);
    char opts[256] = "";
    if (sscanf(buf, "%*s %*s %*s %*s %*s %255s", opts) != 1 || strncmp(opts, "ro", 2) != 0)
        fail("%s: %s is not mounted read-only (%s)", who, B, buf);
    path(p, C, "h");
    if (read_file(p, buf, sizeof buf) < 0 || strcmp(buf, "host\n") != 0)
        fail("%s: %s (the bind of host/) holds %s", who, p, buf);
    if (!in_userns) {
        path(p, P, "self/status");
        if (access(p, R_OK) != 0)
            fail("%s: no proc at %s", who, P);
    } else {
        if (getuid() != 0 || geteuid() != 0 || getgid() != 0)
            fail("%s: not root in its user namespace (uid %d euid %d gid %d)", who, (int)getuid(), (int)geteuid(), (int)getgid());
        if (read_file("/proc/self/uid_map", buf, sizeof buf) < 0 || strcmp(buf, uid_map) != 0)
            fail("%s: uid_map %s, was %s", who, buf, uid_map);
        if (read_file("/proc/self/gid_map", buf, sizeof buf) < 0 || strcmp(buf, gid_map) != 0)
            fail("%s: gid_map %s, was %s", who, buf, gid_map);
        if (read_file("/proc/self/setgroups", buf, sizeof buf) < 0 || strcmp(buf, "deny\n") != 0)
            fail("%s: setgroups %s", who, buf);
    }
    path(p, A, "d/f");
    if (stat(p, &st) != 0 || st.st_uid != getuid() || st.st_gid != getgid())
        fail("%s: %s is owned by %d:%d", who, p, (int)st.st_uid, (int)st.st_gid);
    mount_line(U, buf, sizeof buf);
    if (buf[0])
        fail("%s: %s is mounted again (%s)", who, U, buf);
}

/* A helper process: checks the mounts at every step, then prints CHILD-OK. */
static void helper(const char *who, long steps)
{
    for (long i = 0; i < steps; i++) {
        check_mounts(who);
        sleep_ms(STEP_MS);
    }
    if (!failures)
        printf("CHILD-OK %s\n", who);
    char done[600], tmp[640];
    snprintf(done, sizeof done, "%s/%s-done", A, who);
    snprintf(tmp, sizeof tmp, "%s.tmp", done);
    write_file(tmp, failures ? "fail\n" : "ok\n");
    must(rename(tmp, done) == 0, done); /* whole, or not there: the main process polls for it */
    exit(failures ? 1 : 0);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: mounts DIR [SECONDS] [ns|here|userns]\n");
        return 2;
    }
    const char *dir = argv[1];
    long steps = steps_arg(argc, argv, 2, 5.0);
    int own_ns = argc < 4 || strcmp(argv[3], "here") != 0;
    in_userns = argc >= 4 && strcmp(argv[3], "userns") == 0;
    mkdir(dir, 0755);
    path(A, dir, "a");
    path(B, dir, "b");
    path(C, dir, "c");
    path(P, dir, "p");
    path(U, dir, "under");
    path(H, dir, "host");
    char p[600];
    const char *dirs[] = {A, B, C, P, U, H};
    for (int i = 0; i < 6; i++)
        must(mkdir(dirs[i], 0755) == 0 || errno == EEXIST, dirs[i]);
    path(p, H, "h");
    write_file(p, "host\n");

    if (in_userns) {
        uid_t uid = getuid();
        gid_t gid = getgid();
        must(unshare(CLONE_NEWUSER) == 0, "unshare(CLONE_NEWUSER)");
        snprintf(uid_map, sizeof uid_map, "%10u %10u %10u\n", 0u, (unsigned)uid, 1u);
        snprintf(gid_map, sizeof gid_map, "%10u %10u %10u\n", 0u, (unsigned)gid, 1u);
        write_file("/proc/self/setgroups", "deny");
        write_file("/proc/self/uid_map", uid_map);
        write_file("/proc/self/gid_map", gid_map);
    }
    if (own_ns) {
        must(unshare(CLONE_NEWNS) == 0, "unshare(CLONE_NEWNS)");
        must(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0, "make / private");
    }
    must(mount("ckpt-test", A, "tmpfs", 0, "size=8m,mode=0751") == 0, "mount tmpfs");
    path(p, A, "d");
    must(mkdir(p, 0700) == 0, p);
    path(p, A, "d/f");
    write_file(p, "hello\n");
    char f[600];
    path(f, A, "link");
    must(symlink("d/f", f) == 0, f);
    path(f, A, "fifo");
    must(mkfifo(f, 0640) == 0, f);
    path(f, A, "hard");
    must(link(p, f) == 0, f);
    path(f, A, "old");
    write_file(f, "old\n");
    struct timespec times[2] = {{1234567890, 0}, {1234567890, 0}};
    must(utimensat(AT_FDCWD, f, times, 0) == 0, f);
    path(f, A, "d");
    must(mount(f, B, NULL, MS_BIND, NULL) == 0, "bind a/d");
    must(mount(NULL, B, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) == 0, "remount b read-only");
    must(mount(H, C, NULL, MS_BIND, NULL) == 0, "bind host");
    if (!in_userns)
        must(mount("proc", P, "proc", 0, NULL) == 0, "mount proc");
    must(mount("ckpt-gone", U, "tmpfs", 0, NULL) == 0 && umount(U) == 0, "mount and unmount under/");

    int held = open(p, O_RDWR);
    path(f, A, "count");
    int count_fd = open(f, O_RDWR | O_CREAT, 0600);
    must(held >= 0 && count_fd >= 0, "open a/d/f and a/count");
    must(pwrite(count_fd, "0\n", 2, 0) == 2, "write a/count");
    /* A file of the tmpfs mapped shared: its pages are the file's. */
    path(f, A, "mapped");
    int map_fd = open(f, O_RDWR | O_CREAT, 0600);
    must(map_fd >= 0 && ftruncate(map_fd, 4096) == 0, f);
    volatile uint64_t *mapped = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, map_fd, 0);
    must(mapped != MAP_FAILED, "mmap a/mapped");
    close(map_fd);

    pid_t child = fork();
    if (child == 0)
        helper("child", steps);
    pid_t middle = fork();
    if (middle == 0) {
        if (fork() == 0)
            helper("adopted", steps);
        _exit(0);
    }
    waitpid(middle, NULL, 0);

    uint64_t counter = 0, result = 0;
    for (long i = 0; i < steps; i++) {
        check_mounts("main");
        char buf[64];
        ssize_t n = pread(count_fd, buf, sizeof buf - 1, 0);
        buf[n > 0 ? n : 0] = 0;
        if ((uint64_t)strtoull(buf, NULL, 10) != counter)
            fail("a/count holds %s, the program counted %llu", buf, (unsigned long long)counter);
        if (*mapped != counter)
            fail("a/mapped holds %llu, the program counted %llu", (unsigned long long)*mapped, (unsigned long long)counter);
        n = pread(held, buf, sizeof buf - 1, 0);
        buf[n > 0 ? n : 0] = 0;
        if (strcmp(buf, "hello\n") != 0)
            fail("the descriptor on a/d/f reads %s", buf);
        counter++;
        int len = snprintf(buf, sizeof buf, "%llu\n", (unsigned long long)counter);
        if (pwrite(count_fd, buf, len, 0) != len || ftruncate(count_fd, len) != 0)
            fail("write a/count: %s", strerror(errno));
        *mapped = counter;
        result = mix64(result ^ counter);
        sleep_ms(STEP_MS);
    }
    /* The adopted helper is not ours to wait for: its mark in the tmpfs says it ended. */
    path(f, A, "adopted-done");
    for (int i = 0; i < 1000 && access(f, F_OK) != 0; i++)
        sleep_ms(STEP_MS);
    char mark[16] = "";
    if (read_file(f, mark, sizeof mark) < 0)
        fail("the adopted helper did not end");
    else if (strcmp(mark, "ok\n") != 0)
        fail("the adopted helper failed");
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child failed");
    return finish(result);
}
