/* devnodes: descriptors of device nodes made by the job come back as those devices.
 *
 * In DIR the program makes (mknod, root's) and opens
 *  - null.node, a node of /dev/null (1:3), mode 0640, open for reading and writing;
 *  - zero.gone, a node of /dev/zero (1:5), mode 0604, open for reading, then removed;
 *  - console.node, a node of the system console (5:1), mode 0600, open for reading (zdtm's
 *    console test: a daemon holding the console);
 *  - vt.node, a node of a virtual console (4:5, or the next one that is no other session's
 *    terminal: a run beside this one holds one), opened by a child that leads a session of its
 *    own, without O_NOCTTY: its controlling terminal, which /proc/self/stat must name at every
 *    step (zdtm's vt test).
 * At every step each descriptor must still be its device (fstat: a character device of that
 * number, with the node's mode), writes to null.node must be taken and reads give end of file,
 * reads of zero.gone must give zeros; zero.gone must stay removed (no name in DIR). RESULT folds
 * what the steps saw: the same as an uninterrupted run's only where every check held.
 *
 * Usage: devnodes DIR [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#define VT_FIRST 5
#define VT_LAST 40

/* The controlling terminal /proc/self/stat names (its tty_nr), 0 for none. */
static unsigned long controlling_tty(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    /* After the command's closing parenthesis: state ppid pgrp session tty_nr. */
    char *p = strrchr(buf, ')');
    unsigned long tty = 0;
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %lu", &tty) != 1)
        return 0;
    return tty;
}

/* The child holding the virtual console as its controlling terminal: exits 0 if it had it at
 * every step. */
static int vt_child(long steps)
{
    if (setsid() < 0) {
        perror("setsid");
        return 2;
    }
    unsigned long want = 0;
    for (unsigned m = VT_FIRST; m <= VT_LAST && !want; m++) {
        unlink("vt.node");
        if (mknod("vt.node", S_IFCHR | 0600, makedev(4, m)) != 0) {
            perror("vt.node");
            return 2;
        }
        int fd = open("vt.node", O_RDWR);
        if (fd >= 0 && controlling_tty() == makedev(4, m))
            want = makedev(4, m);
        else if (fd >= 0)
            close(fd);
    }
    if (!want) {
        fprintf(stderr, "vt.node: no virtual console from 4:%d to 4:%d became the terminal\n", VT_FIRST, VT_LAST);
        return 2;
    }
    int bad = 0;
    for (long s = 0; s < steps; s++) {
        unsigned long have = controlling_tty();
        if (have != want && bad++ < 3)
            fail("step %ld: the controlling terminal is %lu:%lu, not the console %lu:%lu", s, (unsigned long)major(have),
                 (unsigned long)minor(have), (unsigned long)major(want), (unsigned long)minor(want));
        sleep_ms(STEP_MS);
    }
    return bad ? 1 : 0;
}

struct node {
    const char *name;
    unsigned major, minor;
    mode_t mode;
    int flags;
    int fd;
};

static struct node nodes[] = {
    {"null.node", 1, 3, 0640, O_RDWR, -1},
    {"zero.gone", 1, 5, 0604, O_RDONLY, -1},
    {"console.node", 5, 1, 0600, O_RDONLY | O_NOCTTY, -1},
};
#define NODES (sizeof nodes / sizeof nodes[0])

/* How many checks of step `s` failed; folds what was seen into *h. */
static int check(long s, uint64_t *h)
{
    int bad = 0;
    for (size_t i = 0; i < NODES; i++) {
        struct node *n = &nodes[i];
        struct stat st;
        if (fstat(n->fd, &st) != 0 || !S_ISCHR(st.st_mode) || major(st.st_rdev) != n->major ||
            minor(st.st_rdev) != n->minor || (st.st_mode & 07777) != n->mode) {
            fail("step %ld: %s: not the device %u:%u of mode %o any more (mode %o, %u:%u)", s, n->name,
                 n->major, n->minor, (unsigned)n->mode, (unsigned)st.st_mode, major(st.st_rdev),
                 minor(st.st_rdev));
            bad++;
        }
        *h = mix64(*h ^ ((uint64_t)major(st.st_rdev) << 40) ^ ((uint64_t)minor(st.st_rdev) << 20) ^
                   (st.st_mode & 07777));
    }
    char buf[64];
    memset(buf, 0x5a, sizeof buf);
    if (write(nodes[0].fd, buf, sizeof buf) != sizeof buf || read(nodes[0].fd, buf, sizeof buf) != 0) {
        fail("step %ld: null.node does not take writes or give end of file", s);
        bad++;
    }
    memset(buf, 0x5a, sizeof buf);
    ssize_t got = read(nodes[1].fd, buf, sizeof buf);
    int zeros = got == sizeof buf;
    for (size_t i = 0; zeros && i < sizeof buf; i++)
        zeros = buf[i] == 0;
    if (!zeros) {
        fail("step %ld: zero.gone gives no zeros (%zd bytes)", s, got);
        bad++;
    }
    if (access("zero.gone", F_OK) == 0) {
        fail("step %ld: zero.gone has a name again", s);
        bad++;
    }
    *h = mix64(*h ^ (uint64_t)s ^ ((uint64_t)bad << 32));
    return bad;
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: devnodes DIR [SECONDS=4]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    if (chdir(argv[1]) != 0) {
        perror(argv[1]);
        return 2;
    }
    umask(077); /* the restart must give each node its own mode, not the umask's */
    for (size_t i = 0; i < NODES; i++) {
        struct node *n = &nodes[i];
        unlink(n->name);
        if (mknod(n->name, S_IFCHR | 0600, makedev(n->major, n->minor)) != 0 || chmod(n->name, n->mode) != 0) {
            perror(n->name);
            return 2;
        }
        n->fd = open(n->name, n->flags);
        if (n->fd < 0) {
            perror(n->name);
            return 2;
        }
    }
    if (unlink("zero.gone") != 0) {
        perror("zero.gone");
        return 2;
    }
    pid_t vt = fork();
    if (vt == 0)
        _exit(vt_child(steps));

    uint64_t h = 0;
    long bad_steps = 0;
    for (long s = 0; s < steps; s++) {
        if (check(s, &h) && ++bad_steps > 3)
            break;
        sleep_ms(STEP_MS);
    }
    int st;
    if (waitpid(vt, &st, 0) != vt || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("the child holding the virtual console as its terminal found it wrong (status %#x)", st);
    return finish(mix64(h ^ (uint64_t)st));
}
