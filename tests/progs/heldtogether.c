/* heldtogether: a child made by clone(2) with CLONE_FILES (`files`) or CLONE_FS (`fs`) and
 * without CLONE_THREAD, which holds its parent's descriptor table, or its working directory,
 * root and umask, together with it. A restart could not make them held together again, so a
 * checkpoint must be refused and the job go on. At the end of the run the parent changes what
 * they hold (opens descriptor 100, or sets its umask to 077), and the child must see it: it
 * ends with status 0 once it does, 1 if it has not after a second. Prints START once the child
 * runs, PASS when the child saw the change.
 *
 * Usage: heldtogether files|fs [SECONDS=3]
 */
#define _GNU_SOURCE
#include "common.h"

#include <sched.h>
#include <sys/stat.h>

#define SEEN_FD 100

static int by_files;

/* Whether the parent's change is visible here. */
static int sees_the_change(void)
{
    if (by_files)
        return fcntl(SEEN_FD, F_GETFD) >= 0;
    mode_t now = umask(0);
    umask(now);
    return now == 077;
}

static int child_main(void *arg)
{
    long waits = *(long *)arg;
    for (long i = 0; i < waits; i++) {
        if (sees_the_change())
            return 0;
        sleep_ms(STEP_MS);
    }
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "files") && strcmp(argv[1], "fs"))) {
        fprintf(stderr, "usage: heldtogether files|fs [SECONDS]\n");
        return 2;
    }
    by_files = !strcmp(argv[1], "files");
    long steps = steps_arg(argc, argv, 2, 3.0);
    long waits = steps + 100;
    static char stack[256 << 10];
    umask(022);
    pid_t child = clone(child_main, stack + sizeof stack, (by_files ? CLONE_FILES : CLONE_FS) | SIGCHLD, &waits);
    if (child < 0)
        return printf("FAIL set-up: clone: %s\n", strerror(errno)), 1;
    start_marker();
    for (long s = 0; s < steps; s++)
        sleep_ms(STEP_MS);
    if (by_files) {
        int fd = open("/dev/null", O_RDONLY);
        if (fd < 0 || dup2(fd, SEEN_FD) < 0)
            fail("open: %s", strerror(errno));
    } else {
        umask(077);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child did not see its parent's change (status %#x)", status);
    return finish(0);
}
