/* pivot: a program inside a container that a runtime made in the job, as Charliecloud's ch-run
 * does (and other runtimes without setuid): a user namespace where it is root (as root: the
 * mount namespace alone), a mount namespace whose root is an image directory it pivoted into
 * (pivot_root), the machine's /dev and /proc bound in, a tmpfs at /tmp, the old root gone and
 * the new root read-only. After a restart the program must find that same world.
 *
 * Set-up (outside): in DIR/img it makes bin/, dev/, proc/, tmp/, data/ (with data/hello) and
 * old/, copies its own executable (a static one) to bin/pivot, binds the image onto itself,
 * binds /dev and /proc recursively into it, mounts a tmpfs at tmp/, pivots into it with the old
 * root at /old, detaches the old root and removes /old, remounts / read-only, and runs
 * /bin/pivot inside, in /data. Inside, START; the program keeps /data/hello open, writes its
 * step counter to /tmp/count, and forks a child; at every step both check that / is read-only
 * and /tmp a tmpfs holding the counter the main process has in memory, that /data/hello reads
 * "hello" through the kept descriptor and by name, that the working directory is /data, that
 * /proc/self/exe is /bin/pivot, that /dev/null takes a write and that /old is gone. Prints PASS
 * or FAIL <what>.
 *
 * Usage: pivot DIR [SECONDS=5]   (built static: pivot-static)
 */
#include "common.h"
#include "userns.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define TMPFS_MAGIC 0x01021994

static void must(int ok, const char *what)
{
    if (!ok) {
        printf("FAIL set-up: %s: %s\n", what, strerror(errno));
        exit(1);
    }
}

static void write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    must(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text), path);
    close(fd);
}

static void copy_file(const char *from, const char *to, mode_t mode)
{
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, mode);
    must(in >= 0 && out >= 0, to);
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        must(write_full(out, buf, (size_t)n) == 0, to);
    close(in);
    close(out);
}

/* The mount flags of `path` that a bind remount must keep (the kernel locks them). */
static unsigned long kept_flags(const char *path)
{
    struct statvfs v;
    must(statvfs(path, &v) == 0, path);
    unsigned long f = 0;
    if (v.f_flag & ST_NOSUID)
        f |= MS_NOSUID;
    if (v.f_flag & ST_NODEV)
        f |= MS_NODEV;
    if (v.f_flag & ST_NOEXEC)
        f |= MS_NOEXEC;
    if (v.f_flag & ST_NOATIME)
        f |= MS_NOATIME;
    if (v.f_flag & ST_NODIRATIME)
        f |= MS_NODIRATIME;
    if (v.f_flag & ST_RELATIME)
        f |= MS_RELATIME;
    return f;
}

static void set_up(const char *dir, const char *seconds)
{
    char img[512], p[600];
    snprintf(img, sizeof img, "%s/img", dir);
    if (geteuid() != 0)
        unshare_as_root(CLONE_NEWNS);
    else
        must(unshare(CLONE_NEWNS) == 0, "unshare(CLONE_NEWNS)");
    must(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0, "make / private");
    const char *dirs[] = {"", "/bin", "/dev", "/proc", "/tmp", "/data", "/old"};
    for (int i = 0; i < 7; i++) {
        snprintf(p, sizeof p, "%s%s", img, dirs[i]);
        must(mkdir(p, 0755) == 0 || errno == EEXIST, p);
    }
    snprintf(p, sizeof p, "%s/data/hello", img);
    write_file(p, "hello\n");
    snprintf(p, sizeof p, "%s/bin/pivot", img);
    copy_file("/proc/self/exe", p, 0755);
    must(mount(img, img, NULL, MS_BIND | MS_REC, NULL) == 0, "bind the image onto itself");
    snprintf(p, sizeof p, "%s/dev", img);
    must(mount("/dev", p, NULL, MS_BIND | MS_REC, NULL) == 0, "bind /dev");
    snprintf(p, sizeof p, "%s/proc", img);
    must(mount("/proc", p, NULL, MS_BIND | MS_REC, NULL) == 0, "bind /proc");
    snprintf(p, sizeof p, "%s/tmp", img);
    must(mount("tmpfs", p, "tmpfs", 0, "size=4m,mode=1777") == 0, "mount a tmpfs at /tmp");
    must(chdir(img) == 0, "enter the image");
    must(syscall(SYS_pivot_root, ".", "old") == 0, "pivot_root");
    must(chdir("/") == 0, "chdir /");
    must(umount2("/old", MNT_DETACH) == 0, "detach the old root");
    must(rmdir("/old") == 0, "remove /old");
    must(mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | kept_flags("/"), NULL) == 0, "remount / read-only");
    must(chdir("/data") == 0, "chdir /data");
    execl("/bin/pivot", "pivot", "/", seconds, "inside", (char *)NULL);
    must(0, "run /bin/pivot inside");
}

static long read_count(void)
{
    char buf[32] = {0};
    int fd = open("/tmp/count", O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    return n > 0 ? atol(buf) : -1;
}

static void check(const char *who, long step, int hello, long count)
{
    struct statvfs v;
    if (statvfs("/", &v) != 0 || !(v.f_flag & ST_RDONLY))
        fail("%s step %ld: / is not read-only", who, step);
    struct statfs f;
    if (statfs("/tmp", &f) != 0 || f.f_type != TMPFS_MAGIC)
        fail("%s step %ld: /tmp is not a tmpfs", who, step);
    if (count >= 0 && read_count() != count)
        fail("%s step %ld: /tmp/count holds %ld, not %ld", who, step, read_count(), count);
    char buf[16] = {0};
    if (pread(hello, buf, sizeof buf - 1, 0) != 6 || strcmp(buf, "hello\n") != 0)
        fail("%s step %ld: the kept descriptor of /data/hello reads %s", who, step, buf);
    if (access("/data/hello", R_OK) != 0)
        fail("%s step %ld: /data/hello: %s", who, step, strerror(errno));
    char cwd[256];
    if (!getcwd(cwd, sizeof cwd) || strcmp(cwd, "/data") != 0)
        fail("%s step %ld: working directory %s, not /data", who, step, cwd);
    char exe[256] = {0};
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n < 0 || strcmp(exe, "/bin/pivot") != 0)
        fail("%s step %ld: /proc/self/exe is %s", who, step, exe);
    int null = open("/dev/null", O_WRONLY);
    if (null < 0 || write(null, "x", 1) != 1)
        fail("%s step %ld: /dev/null takes no write", who, step);
    if (null >= 0)
        close(null);
    if (access("/old", F_OK) == 0 || errno != ENOENT)
        fail("%s step %ld: /old is there", who, step);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: pivot DIR [SECONDS]\n");
        return 2;
    }
    if (argc < 4 || strcmp(argv[3], "inside") != 0)
        set_up(argv[1], argc > 2 ? argv[2] : "5");
    start_marker();
    long steps = steps_arg(argc, argv, 2, 5.0);
    int hello = open("/data/hello", O_RDONLY);
    if (hello < 0)
        return printf("FAIL set-up: open /data/hello: %s\n", strerror(errno)), 1;
    pid_t child = fork();
    if (child == 0) {
        for (long step = 0; step < steps; step++) {
            check("the child", step, hello, -1);
            sleep_ms(STEP_MS);
        }
        exit(failures ? 1 : 0);
    }
    uint64_t result = 0;
    for (long step = 0; step < steps; step++) {
        char text[32];
        snprintf(text, sizeof text, "%ld\n", step);
        int fd = open("/tmp/count", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
            fail("step %ld: write /tmp/count: %s", step, strerror(errno));
        if (fd >= 0)
            close(fd);
        check("main", step, hello, step);
        result = mix64(result ^ (uint64_t)step);
        sleep_ms(STEP_MS);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child ended with status %#x", status);
    return finish(result);
}
