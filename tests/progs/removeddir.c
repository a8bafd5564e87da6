/* removeddir: directories removed while the program holds them open (zdtm's rmdir_open) must
 * come back removed and held: fstat on each descriptor shows a directory with no link and its
 * mode, /proc/self/fd a path " (deleted)", and nothing can be made in it.
 *
 * The program makes WORKDIR/d/sub (mode 0750) and WORKDIR/kept/sub, opens both subs, then
 * removes d/sub and d, and kept/sub (kept stays), which it entered first: its working directory
 * is the removed kept/sub that its descriptor holds (zdtm's cwd02). Every step checks both
 * descriptors; the one whose directory stayed must show its old path, the other some path
 * " (deleted)" (its directory is gone); and the working directory must be the very directory
 * the descriptor holds (same device and inode). A child enters /proc/PID of a process of its
 * own and ends that process (zdtm's unhashed_proc): at every step its getcwd must fail with
 * ENOENT. RESULT depends on the steps only. Prints PASS or FAIL <what>.
 *
 * Usage: removeddir WORKDIR [SECONDS=4]
 */
#include "common.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* The child whose working directory is /proc/PID of a process gone: exits 0 if getcwd failed
 * with ENOENT at every step. */
static int unhashed_child(long steps)
{
    pid_t gone = fork();
    if (gone == 0) {
        pause();
        _exit(0);
    }
    char p[64];
    snprintf(p, sizeof p, "/proc/%d", (int)gone);
    int entered = chdir(p) == 0;
    kill(gone, SIGKILL);
    waitpid(gone, NULL, 0);
    if (!entered) {
        printf("FAIL set-up: chdir %s: %s\n", p, strerror(errno));
        return 2;
    }
    int bad = 0;
    for (long s = 0; s < steps; s++) {
        char buf[256];
        if ((getcwd(buf, sizeof buf) != NULL || errno != ENOENT) && bad++ < 3)
            fail("step %ld: the working directory in /proc of a process gone: getcwd gave %s", s,
                 errno == ENOENT ? "a path" : strerror(errno));
        sleep_ms(STEP_MS);
    }
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: removeddir WORKDIR [SECONDS]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    const char *names[2] = {"d", "kept"};
    int fds[2];
    char subs[2][4200];
    for (int i = 0; i < 2; i++) {
        char d[4096];
        snprintf(d, sizeof d, "%s/%s", argv[1], names[i]);
        snprintf(subs[i], sizeof subs[i], "%s/sub", d);
        if (mkdir(d, 0700) != 0 || mkdir(subs[i], 0700) != 0 || chmod(subs[i], 0750) != 0) {
            printf("FAIL set-up: make %s: %s\n", subs[i], strerror(errno));
            return 1;
        }
        fds[i] = open(subs[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fds[i] < 0 || (i == 1 && chdir(subs[i]) != 0) || rmdir(subs[i]) != 0 || (i == 0 && rmdir(d) != 0)) {
            printf("FAIL set-up: open and remove %s: %s\n", subs[i], strerror(errno));
            return 1;
        }
    }
    pid_t unhashed = fork();
    if (unhashed == 0)
        _exit(unhashed_child(steps));
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        for (int i = 0; i < 2; i++) {
            struct stat st;
            if (fstat(fds[i], &st) != 0 || !S_ISDIR(st.st_mode) || st.st_nlink != 0 || (st.st_mode & 07777) != 0750)
                fail("step %ld: %s: the descriptor holds mode %o with %lu links, not a removed directory of mode 750", s, subs[i],
                     (unsigned)st.st_mode, (unsigned long)st.st_nlink);
            if (s % 50)
                continue;
            char link[64], got[8600], want[8600];
            snprintf(link, sizeof link, "/proc/self/fd/%d", fds[i]);
            snprintf(want, sizeof want, "%s (deleted)", subs[i]);
            ssize_t n = readlink(link, got, sizeof got - 1);
            got[n < 0 ? 0 : n] = 0;
            size_t len = strlen(got);
            int deleted = len > 10 && strcmp(got + len - 10, " (deleted)") == 0;
            if (i == 1 ? strcmp(got, want) != 0 : !deleted)
                fail("step %ld: /proc/self/fd says %s for %s", s, got, subs[i]);
            int in = openat(fds[i], "new", O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
            if (in >= 0 || errno != ENOENT)
                fail("step %ld: a file could be made in the removed %s (%s)", s, subs[i], in >= 0 ? "made" : strerror(errno));
            if (in >= 0)
                close(in);
        }
        struct stat cwd, held;
        if (stat(".", &cwd) != 0 || fstat(fds[1], &held) != 0 || cwd.st_dev != held.st_dev || cwd.st_ino != held.st_ino)
            fail("step %ld: the working directory is not the removed %s that fd %d holds", s, subs[1], fds[1]);
        h = mix64(h ^ (uint64_t)s);
        sleep_ms(STEP_MS);
    }
    int st;
    if (waitpid(unhashed, &st, 0) != unhashed || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("the child in /proc of a process gone found its working directory wrong (status %#x)", st);
    return finish(mix64(h ^ (uint64_t)st));
}
