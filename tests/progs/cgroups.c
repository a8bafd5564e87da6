/* cgroups: processes in cgroups the program made (as zdtm's cgroup00-04, `systemd-run --user
 * --scope` or a container runtime make them): after a restart each process must be in the same
 * cgroups, and each cgroup must hold the settings the program gave it.
 *
 * For each DIR given (a cgroup directory the program may make cgroups in, of any hierarchy: v1
 * controllers, a named v1 hierarchy, cgroup v2), the program makes DIR/pPID/a and DIR/pPID/a/b,
 * gives a and b the settings of the table below whose files exist there, starts a thread, moves
 * itself (the thread with it) into a, and forks a child that moves itself into b. It also makes
 * DIR/pPID/a/spare and DIR/pPID/a/b/spare, empty (zdtm's cgroup01: made for later), the first
 * of mode 0750 with its cgroup.procs of mode 0664, and as root both given to uid and gid 65534
 * with their cgroup.procs (delegated, as a container runtime does; zdtm's cgroup03). Every step
 * each process checks that /proc/self/cgroup shows it there in as many hierarchies as DIRs were
 * given, the parent its thread too, and every 50 steps that each setting reads back as set and
 * that the empty cgroups are there with their owners and modes. The
 * caller removes the cgroups after the run (one holding a process cannot be removed). Prints
 * READY once both processes are in place; RESULT depends on the steps only; PASS or FAIL <what>.
 *
 * Usage: cgroups SECONDS DIR...
 */
#include "common.h"

#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>

/* A setting given to a (value_a) and b (value_b; NULL: left as the kernel made it). */
static const struct {
    const char *file, *value_a, *value_b;
} settings[] = {
    {"pids.max", "50", "20"},                        /* v1 pids; v2 where the controller is given */
    {"memory.limit_in_bytes", "268435456", "134217728"}, /* v1 memory */
    {"memory.soft_limit_in_bytes", "67108864", NULL},
    {"cpu.shares", "512", "256"},                    /* v1 cpu */
    {"cpu.cfs_quota_us", "50000", NULL},
    {"cgroup.max.descendants", "5", "2"},            /* v2, every cgroup has them */
    {"cgroup.max.depth", "3", NULL},
};
#define NSETTINGS (sizeof settings / sizeof settings[0])

static int ndirs;
static char **dirs;
static pid_t maker;
static volatile int stop_thread;
static pid_t thread_tid;

static void path_of(char *out, size_t len, int dir, const char *below, const char *file)
{
    snprintf(out, len, "%s/p%d%s%s%s", dirs[dir], (int)maker, below, file ? "/" : "", file ? file : "");
}

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* Gives cgroup `below` ("/a" or "/a/b") of every DIR its settings (which = 0 for a, 1 for b). */
static void set_up(const char *below, int which)
{
    for (int d = 0; d < ndirs; d++) {
        char path[4400];
        path_of(path, sizeof path, d, below, NULL);
        if (mkdir(path, 0755) != 0) {
            printf("FAIL set-up: make %s: %s\n", path, strerror(errno));
            exit(1);
        }
        for (size_t s = 0; s < NSETTINGS; s++) {
            const char *value = which ? settings[s].value_b : settings[s].value_a;
            path_of(path, sizeof path, d, below, settings[s].file);
            if (value && access(path, F_OK) == 0 && write_file(path, value) != 0) {
                printf("FAIL set-up: write %s to %s: %s\n", value, path, strerror(errno));
                exit(1);
            }
        }
    }
}

/* The empty cgroups: `below` of every DIR, with the owner and mode of the directory and of its
 * cgroup.procs (uid -1: left as made). */
static const struct {
    const char *below;
    mode_t dir_mode, procs_mode;
} spares[] = {
    {"/a/spare", 0750, 0664},
    {"/a/b/spare", 0755, 0644},
};
#define NSPARES (sizeof spares / sizeof spares[0])
#define DELEGATE 65534

static void make_spares(void)
{
    for (int d = 0; d < ndirs; d++) {
        for (size_t i = 0; i < NSPARES; i++) {
            char path[4400], procs[4400];
            path_of(path, sizeof path, d, spares[i].below, NULL);
            path_of(procs, sizeof procs, d, spares[i].below, "cgroup.procs");
            if (mkdir(path, 0700) != 0 || chmod(path, spares[i].dir_mode) != 0 || chmod(procs, spares[i].procs_mode) != 0) {
                printf("FAIL set-up: make %s: %s\n", path, strerror(errno));
                exit(1);
            }
            if (geteuid() == 0 && (chown(procs, DELEGATE, DELEGATE) != 0 || chown(path, DELEGATE, DELEGATE) != 0)) {
                printf("FAIL set-up: give %s to %d: %s\n", path, DELEGATE, strerror(errno));
                exit(1);
            }
        }
    }
}

/* Checks that the empty cgroups are there with their owners and modes. */
static void check_spares(long step)
{
    uid_t owner = geteuid() == 0 ? DELEGATE : geteuid();
    gid_t group = geteuid() == 0 ? DELEGATE : getegid();
    for (int d = 0; d < ndirs; d++) {
        for (size_t i = 0; i < NSPARES; i++) {
            char path[4400], procs[4400];
            struct stat dir, file;
            path_of(path, sizeof path, d, spares[i].below, NULL);
            path_of(procs, sizeof procs, d, spares[i].below, "cgroup.procs");
            if (stat(path, &dir) != 0 || stat(procs, &file) != 0) {
                fail("step %ld: the empty cgroup %s is gone: %s", step, path, strerror(errno));
                continue;
            }
            if ((dir.st_mode & 07777) != spares[i].dir_mode || (file.st_mode & 07777) != spares[i].procs_mode)
                fail("step %ld: %s has mode %o and its cgroup.procs %o, not %o and %o", step, path, dir.st_mode & 07777,
                     file.st_mode & 07777, spares[i].dir_mode, spares[i].procs_mode);
            if (dir.st_uid != owner || dir.st_gid != group || file.st_uid != owner || file.st_gid != group)
                fail("step %ld: %s is owned by %d:%d and its cgroup.procs by %d:%d, not %d:%d", step, path, dir.st_uid, dir.st_gid,
                     file.st_uid, file.st_gid, owner, group);
        }
    }
}

/* Moves the calling process into cgroup `below` of every DIR. */
static void move_into(const char *below)
{
    char path[4400], pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    for (int d = 0; d < ndirs; d++) {
        path_of(path, sizeof path, d, below, "cgroup.procs");
        if (write_file(path, pid) != 0) {
            printf("FAIL set-up: move pid %s into %s: %s\n", pid, path, strerror(errno));
            exit(1);
        }
    }
}

/* Checks that `cgroup_file` (/proc/self/cgroup or a thread's) shows cgroup `below` of pPID in
 * ndirs hierarchies. */
static void check_place(long step, const char *who, const char *cgroup_file, const char *below)
{
    char text[8192], want[64];
    if (read_small_file(cgroup_file, text, sizeof text) <= 0) {
        fail("step %ld: %s: read %s: %s", step, who, cgroup_file, strerror(errno));
        return;
    }
    snprintf(want, sizeof want, "/p%d%s", (int)maker, below);
    int found = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        size_t l = strlen(line), w = strlen(want);
        if (l >= w && strcmp(line + l - w, want) == 0)
            found++;
    }
    if (found != ndirs)
        fail("step %ld: %s is in cgroup .../p%d%s in %d hierarchies, not %d (%s)", step, who, (int)maker, below, found, ndirs,
             cgroup_file);
}

/* Checks that each setting of cgroup `below` reads back as set. */
static void check_settings(long step, const char *below, int which)
{
    for (int d = 0; d < ndirs; d++) {
        for (size_t s = 0; s < NSETTINGS; s++) {
            const char *value = which ? settings[s].value_b : settings[s].value_a;
            char path[4400], got[256];
            path_of(path, sizeof path, d, below, settings[s].file);
            if (!value || access(path, F_OK) != 0)
                continue;
            read_small_file(path, got, sizeof got);
            got[strcspn(got, "\n")] = 0;
            if (strcmp(got, value) != 0)
                fail("step %ld: %s holds %s, not %s", step, path, got, value);
        }
    }
}

static void *thread_main(void *arg)
{
    (void)arg;
    thread_tid = (pid_t)syscall(SYS_gettid);
    while (!stop_thread)
        sleep_ms(STEP_MS);
    return NULL;
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 3) {
        fprintf(stderr, "usage: cgroups SECONDS DIR...\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 1, 4.0);
    ndirs = argc - 2;
    dirs = argv + 2;
    maker = getpid();
    for (int d = 0; d < ndirs; d++) {
        char path[4400];
        snprintf(path, sizeof path, "%s/p%d", dirs[d], (int)maker);
        if (mkdir(path, 0755) != 0) {
            printf("FAIL set-up: make %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    set_up("/a", 0);
    set_up("/a/b", 1);
    make_spares();
    pthread_t thread;
    if (pthread_create(&thread, NULL, thread_main, NULL) != 0) {
        printf("FAIL set-up: pthread_create\n");
        return 1;
    }
    while (!__atomic_load_n(&thread_tid, __ATOMIC_SEQ_CST))
        sleep_ms(1);
    move_into("/a");
    pid_t child = fork();
    if (child < 0) {
        printf("FAIL set-up: fork: %s\n", strerror(errno));
        return 1;
    }
    const char *mine = child == 0 ? "/a/b" : "/a";
    if (child == 0)
        move_into("/a/b");
    else {
        /* Once both are in place (the child's first check waits for nothing). */
        char file[64];
        snprintf(file, sizeof file, "/proc/%d/cgroup", (int)child);
        for (char text[8192]; read_small_file(file, text, sizeof text) > 0 && !strstr(text, "/a/b\n");)
            sleep_ms(1);
        printf("READY\n");
    }
    char task_file[64];
    snprintf(task_file, sizeof task_file, "/proc/self/task/%d/cgroup", (int)thread_tid);
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        check_place(s, child == 0 ? "the child" : "the parent", "/proc/self/cgroup", mine);
        if (child != 0)
            check_place(s, "the parent's thread", task_file, mine);
        if (s % 50 == 0) {
            check_settings(s, mine, child == 0);
            check_spares(s);
        }
        h = mix64(h ^ (uint64_t)s);
        sleep_ms(STEP_MS);
    }
    if (child == 0) {
        fflush(stdout);
        _exit(failures ? 1 : 0);
    }
    stop_thread = 1;
    pthread_join(thread, NULL);
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child's checks failed (status %#x)", status);
    return finish(h);
}
