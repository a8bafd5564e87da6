/* nsfds: descriptors of namespaces (open("/proc/self/ns/net"), as container runtimes and
 * sandboxes hold them to setns(2) into later; zdtm's proc-self). The program opens its own
 * network, UTS, IPC, mount, PID, cgroup and user namespaces, and forks a child that makes a UTS
 * namespace of its own (in a user namespace of its own first when not root, as an ordinary user
 * must) and sets its host name there; the parent opens the child's UTS namespace too. Every step
 * each descriptor must still be the namespace it was opened on: its inode the one
 * /proc/self/ns/KIND (or /proc/CHILD/ns/uts) shows now, and the child's UTS namespace must hold
 * the child's host name. RESULT hashes the steps; PASS if everything checked out.
 *
 * Usage: nsfds [SECONDS=4]
 */
#define _GNU_SOURCE
#include "common.h"

#include <sched.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/utsname.h>

static const char *kinds[] = {"net", "uts", "ipc", "mnt", "pid", "cgroup", "user"};
#define NKINDS (sizeof kinds / sizeof kinds[0])
#define CHILD_NAME "nsfds-child"

static int same_ns(int fd, const char *path)
{
    struct stat held, now;
    return fstat(fd, &held) == 0 && stat(path, &now) == 0 && held.st_ino == now.st_ino && held.st_dev == now.st_dev;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    int ready[2];
    if (pipe(ready) != 0)
        return printf("FAIL set-up: pipe\n"), 1;
    pid_t child = fork();
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int flags = CLONE_NEWUTS | (geteuid() == 0 ? 0 : CLONE_NEWUSER);
        char c = unshare(flags) == 0 && sethostname(CHILD_NAME, strlen(CHILD_NAME)) == 0 ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    char c = 0;
    if (child < 0 || read(ready[0], &c, 1) != 1 || c != 'y')
        return printf("FAIL set-up: the child's UTS namespace\n"), 1;
    int fds[NKINDS];
    char path[64];
    for (size_t k = 0; k < NKINDS; k++) {
        snprintf(path, sizeof path, "/proc/self/ns/%s", kinds[k]);
        if ((fds[k] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            return printf("FAIL set-up: open %s: %s\n", path, strerror(errno)), 1;
    }
    char child_uts[64];
    snprintf(child_uts, sizeof child_uts, "/proc/%d/ns/uts", (int)child);
    int child_fd = open(child_uts, O_RDONLY);
    if (child_fd < 0)
        return printf("FAIL set-up: open %s: %s\n", child_uts, strerror(errno)), 1;
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        for (size_t k = 0; k < NKINDS; k++) {
            snprintf(path, sizeof path, "/proc/self/ns/%s", kinds[k]);
            if (!same_ns(fds[k], path))
                fail("step %ld: the descriptor of the %s namespace is another namespace than the process's", s, kinds[k]);
        }
        if (!same_ns(child_fd, child_uts))
            fail("step %ld: the descriptor of the child's UTS namespace is another namespace than the child's", s);
        struct stat a, b;
        if (fstat(child_fd, &a) == 0 && fstat(fds[1], &b) == 0 && a.st_ino == b.st_ino)
            fail("step %ld: the child's UTS namespace is the parent's", s);
        h = mix64(h ^ (uint64_t)s);
        sleep_ms(STEP_MS);
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return finish(h);
}
