/* chroot: a process that changed its root directory (chroot, as build tools and simple
 * sandboxes do) must come back under the same root, with the files it opened before it
 * entered it still open.
 *
 * It makes DIR/root (holding "inside") and DIR/outside, opens DIR/outside, enters DIR/root
 * (first a user namespace where it is root, as an ordinary user must: unshare -Ur chroot),
 * goes to "/", and forks a child. At every step both check that "/inside" reads "chrooted",
 * that "/outside" is not there (the old root is out of reach), that the working directory is
 * "/", and that the descriptor opened before reads "outside". Prints PASS or FAIL <what>.
 *
 * Usage: chroot DIR [SECONDS=5]
 */
#include "common.h"
#include "userns.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>

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

static void check(const char *who, long step, int outside)
{
    char buf[32] = {0};
    int fd = open("/inside", O_RDONLY);
    if (fd < 0 || read(fd, buf, sizeof buf - 1) != 9 || strcmp(buf, "chrooted\n") != 0)
        fail("%s step %ld: /inside reads %s (%s)", who, step, buf, strerror(errno));
    if (fd >= 0)
        close(fd);
    if (access("/outside", F_OK) == 0)
        fail("%s step %ld: /outside is in reach: not under the root it entered", who, step);
    char cwd[256];
    if (!getcwd(cwd, sizeof cwd) || strcmp(cwd, "/") != 0)
        fail("%s step %ld: working directory %s", who, step, cwd);
    memset(buf, 0, sizeof buf);
    if (pread(outside, buf, sizeof buf - 1, 0) != 8 || strcmp(buf, "outside\n") != 0)
        fail("%s step %ld: the descriptor opened before reads %s", who, step, buf);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: chroot DIR [SECONDS]\n");
        return 2;
    }
    start_marker();
    long steps = steps_arg(argc, argv, 2, 5.0);
    char root[512], p[600];
    snprintf(root, sizeof root, "%s/root", argv[1]);
    must(mkdir(root, 0755) == 0 || errno == EEXIST, root);
    snprintf(p, sizeof p, "%s/inside", root);
    write_file(p, "chrooted\n");
    snprintf(p, sizeof p, "%s/outside", argv[1]);
    write_file(p, "outside\n");
    int outside = open(p, O_RDONLY);
    must(outside >= 0, p);
    if (geteuid() != 0)
        unshare_as_root(0);
    must(chroot(root) == 0, "chroot");
    must(chdir("/") == 0, "chdir /");
    pid_t child = fork();
    if (child == 0) {
        for (long step = 0; step < steps; step++) {
            check("the child", step, outside);
            sleep_ms(STEP_MS);
        }
        exit(failures ? 1 : 0);
    }
    uint64_t result = 0;
    for (long step = 0; step < steps; step++) {
        check("main", step, outside);
        result = mix64(result ^ (uint64_t)step);
        sleep_ms(STEP_MS);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child ended with status %#x", status);
    return finish(result);
}
