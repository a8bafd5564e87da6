/* deletedexe: a program whose executable is deleted while it runs (rebuilt by make, upgraded
 * by the package manager) must come back running with /proc/self/exe on a copy of the same
 * bytes, as it was: deleted, with the same permission bits.
 *
 * The program copies its own executable to DIR/prog, runs the copy (exec) with a mark, and the
 * copy deletes itself; then it forks a child that runs the same executable. At every step each
 * process checks that /proc/self/exe names DIR/prog " (deleted)", that its bytes hash to what
 * they hashed to at the start, and that it is executable as before; the main process computes a
 * result as compute does and waits for the child. The main process also holds a descriptor on
 * its executable for the whole run (as a program that reads resources from its own file does),
 * which must stay on the same file as /proc/self/exe. Prints PASS or FAIL <what>.
 *
 * With "rebuilt", a new version takes the name at once (as make or an upgrade leaves it): the
 * executable may then come back without its name (DIR/#INODE " (deleted)": the name is
 * taken), in the same directory, and the new version must stay as it was.
 *
 * With "memfd", the program runs from a memfd instead (fexecve, as runtimes that run a binary
 * from memory do): /proc/self/exe must name "/memfd:ckpt-exe (deleted)".
 *
 * Usage: deletedexe DIR [SECONDS=5] [rebuilt|memfd]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char copy_path[600];
static int rebuilt, in_memfd;
static const char new_version[] = "#!/bin/sh\necho the new version\n";

/* The bytes of the file at `path`, hashed; 0 if it cannot be read. */
static uint64_t hash_file(const char *path, mode_t *mode)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return 0;
    }
    *mode = st.st_mode & 07777;
    uint64_t h = 0;
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < n; i++)
            h = mix64(h ^ (uint64_t)(unsigned char)buf[i]);
    close(fd);
    return n < 0 ? 0 : h;
}

/* Checks this process's executable against what it was at the start. */
static void check_exe(const char *who, long step, uint64_t want, mode_t want_mode)
{
    char link[700], expect[700];
    ssize_t n = readlink("/proc/self/exe", link, sizeof link - 1);
    link[n < 0 ? 0 : n] = 0;
    snprintf(expect, sizeof expect, "%s (deleted)", in_memfd ? "/memfd:ckpt-exe" : copy_path);
    /* Without its name: DIR/#INODE (deleted). */
    size_t dir_len = strrchr(copy_path, '/') - copy_path + 1;
    int unnamed = rebuilt && strncmp(link, copy_path, dir_len) == 0 && link[dir_len] == '#' && strstr(link, " (deleted)") != NULL;
    if (strcmp(link, expect) != 0 && !unnamed)
        fail("%s step %ld: /proc/self/exe is %s, not %s", who, step, link, expect);
    if (rebuilt) {
        char buf[sizeof new_version];
        int fd = open(copy_path, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf);
        if (fd >= 0)
            close(fd);
        if (n != (ssize_t)strlen(new_version) || memcmp(buf, new_version, (size_t)n) != 0)
            fail("%s step %ld: the new version at %s was changed", who, step, copy_path);
    }
    mode_t mode = 0;
    uint64_t h = hash_file("/proc/self/exe", &mode);
    if (h != want)
        fail("%s step %ld: the executable's bytes changed (hash %016llx, was %016llx)", who, step, (unsigned long long)h, (unsigned long long)want);
    if (mode != want_mode)
        fail("%s step %ld: the executable's mode is %o, was %o", who, step, (unsigned)mode, (unsigned)want_mode);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: deletedexe DIR [SECONDS]\n");
        return 2;
    }
    snprintf(copy_path, sizeof copy_path, "%s/prog", argv[1]);
    if (argc < 4 || strncmp(argv[3], "copied", 6) != 0) {
        /* The original: copy the executable, run the copy. */
        int in_memory = argc > 3 && strcmp(argv[3], "memfd") == 0;
        int in = open("/proc/self/exe", O_RDONLY);
        int out = in_memory ? memfd_create("ckpt-exe", MFD_CLOEXEC) : open(copy_path, O_WRONLY | O_CREAT | O_TRUNC, 0755);
        if (in < 0 || out < 0)
            return printf("FAIL set-up: copy the executable to %s: %s\n", copy_path, strerror(errno)), 1;
        char buf[65536];
        ssize_t n;
        while ((n = read(in, buf, sizeof buf)) > 0)
            if (write_full(out, buf, (size_t)n) != 0)
                return printf("FAIL set-up: write %s\n", copy_path), 1;
        close(in);
        if (in_memory) {
            char *args[] = {copy_path, argv[1], argc > 2 ? argv[2] : "5", "copied-memfd", NULL};
            extern char **environ;
            fexecve(out, args, environ);
            return printf("FAIL set-up: run the memfd: %s\n", strerror(errno)), 1;
        }
        close(out);
        int rebuild = argc > 3 && strcmp(argv[3], "rebuilt") == 0;
        char *args[] = {copy_path, argv[1], argc > 2 ? argv[2] : "5", rebuild ? "copied-rebuilt" : "copied", NULL};
        execv(copy_path, args);
        return printf("FAIL set-up: run %s: %s\n", copy_path, strerror(errno)), 1;
    }
    start_marker();
    long steps = steps_arg(argc, argv, 2, 5.0);
    mode_t mode = 0;
    uint64_t want = hash_file("/proc/self/exe", &mode);
    in_memfd = strcmp(argv[3], "copied-memfd") == 0;
    if (want == 0 || (!in_memfd && unlink(copy_path) != 0))
        return printf("FAIL set-up: read and delete %s: %s\n", copy_path, strerror(errno)), 1;
    rebuilt = strcmp(argv[3], "copied-rebuilt") == 0;
    if (rebuilt) {
        int fd = open(copy_path, O_WRONLY | O_CREAT | O_EXCL, 0755);
        if (fd < 0 || write_full(fd, new_version, strlen(new_version)) != 0)
            return printf("FAIL set-up: write the new version at %s: %s\n", copy_path, strerror(errno)), 1;
        close(fd);
    }
    int self_fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (self_fd < 0)
        return printf("FAIL set-up: open /proc/self/exe: %s\n", strerror(errno)), 1;
    pid_t child = fork();
    if (child == 0) {
        close(self_fd);
        for (long step = 0; step < steps; step++) {
            check_exe("the child", step, want, mode);
            sleep_ms(STEP_MS);
        }
        exit(failures ? 1 : 0);
    }
    uint64_t result = 0;
    for (long step = 0; step < steps; step++) {
        check_exe("main", step, want, mode);
        struct stat held, exe;
        if (fstat(self_fd, &held) != 0 || stat("/proc/self/exe", &exe) != 0)
            fail("main step %ld: stat the executable: %s", step, strerror(errno));
        else if (held.st_dev != exe.st_dev || held.st_ino != exe.st_ino)
            fail("main step %ld: the descriptor on the executable holds another file (inode %llu, the executable's %llu)", step,
                 (unsigned long long)held.st_ino, (unsigned long long)exe.st_ino);
        result = mix64(result ^ (uint64_t)step);
        sleep_ms(STEP_MS);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child ended with status %#x", status);
    return finish(result);
}
