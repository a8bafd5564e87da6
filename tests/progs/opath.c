/* opath: descriptors opened with O_PATH (they name a place and read nothing, as container
 * runtimes and systemd hold them) must come back naming the same things: a directory (used as
 * the base of openat), a regular file (reopened for reading through /proc/self/fd), a FIFO
 * (not opened as a pipe), a socket file and a symbolic link itself (O_NOFOLLOW); and a second
 * link held so and then removed (zdtm's symlink01), which must stay a link, without a name, that
 * leads to "../elsewhere/target" (readlinkat of the descriptor).
 *
 * At every step each descriptor must still be O_PATH and name the inode its path names (fstat
 * against lstat of the path), the directory must serve openat, the file must read "data", and
 * reading the descriptor itself must fail with EBADF, as O_PATH descriptors do.
 * Prints PASS or FAIL <what>.
 *
 * Usage: opath DIR [SECONDS=5]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#pragma GCC diagnostic ignored "-Wformat-truncation"

struct held {
    const char *name;
    int flags;
    int fd;
    char path[512];
};

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: opath DIR [SECONDS]\n");
        return 2;
    }
    const char *dir = argv[1];
    long steps = steps_arg(argc, argv, 2, 5.0);
    mkdir(dir, 0755);
    char p[512];
    snprintf(p, sizeof p, "%s/file", dir);
    FILE *f = fopen(p, "w");
    if (!f || fputs("data", f) < 0 || fclose(f) != 0)
        return printf("FAIL set-up: %s\n", p), 1;
    snprintf(p, sizeof p, "%s/fifo", dir);
    if (mkfifo(p, 0600) != 0)
        return printf("FAIL set-up: mkfifo\n"), 1;
    snprintf(p, sizeof p, "%s/link", dir);
    if (symlink("file", p) != 0)
        return printf("FAIL set-up: symlink\n"), 1;
    /* A socket file: bound, then the socket closed (the file stays). */
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%s/sock", dir);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&sun, sizeof sun) != 0)
        return printf("FAIL set-up: bind %s\n", sun.sun_path), 1;
    close(s);

    struct held held[] = {
        {"", O_DIRECTORY, -1, ""},
        {"file", 0, -1, ""},
        {"fifo", 0, -1, ""},
        {"sock", 0, -1, ""},
        {"link", O_NOFOLLOW, -1, ""},
    };
    int n = sizeof held / sizeof held[0];
    for (int i = 0; i < n; i++) {
        snprintf(held[i].path, sizeof held[i].path, "%s/%s", dir, held[i].name);
        held[i].fd = open(held[i].path, O_PATH | held[i].flags);
        if (held[i].fd < 0)
            return printf("FAIL set-up: open %s O_PATH: %s\n", held[i].path, strerror(errno)), 1;
    }

    char gone_path[512];
    snprintf(gone_path, sizeof gone_path, "%s/gone-link", dir);
    if (symlink("../elsewhere/target", gone_path) != 0)
        return printf("FAIL set-up: symlink gone-link\n"), 1;
    int gone = open(gone_path, O_PATH | O_NOFOLLOW);
    if (gone < 0 || unlink(gone_path) != 0)
        return printf("FAIL set-up: open and remove %s\n", gone_path), 1;

    uint64_t result = 0;
    for (long step = 0; step < steps; step++) {
        struct stat st, named;
        char to[64] = "";
        ssize_t len = readlinkat(gone, "", to, sizeof to - 1);
        int has_name = lstat(gone_path, &named) == 0;
        if (fstatat(gone, "", &st, AT_EMPTY_PATH) != 0 || !S_ISLNK(st.st_mode) || st.st_nlink != 0 || len < 0 ||
            strcmp(to, "../elsewhere/target") != 0 || has_name)
            fail("step %ld: the removed link: a link %d, links %ld, leads to \"%s\", its name %s", step, S_ISLNK(st.st_mode),
                 (long)st.st_nlink, to, has_name ? "back" : "gone");
        result = mix64(result ^ (uint64_t)len);
        for (int i = 0; i < n; i++) {
            struct held *h = &held[i];
            struct stat by_fd, by_path;
            int fl = fcntl(h->fd, F_GETFL);
            if (fl < 0 || !(fl & O_PATH))
                fail("step %ld: %s: not O_PATH any more (flags %#x)", step, h->path, fl);
            if (fstatat(h->fd, "", &by_fd, AT_EMPTY_PATH) != 0 || lstat(h->path, &by_path) != 0)
                fail("step %ld: %s: stat: %s", step, h->path, strerror(errno));
            else if (by_fd.st_ino != by_path.st_ino || by_fd.st_dev != by_path.st_dev)
                fail("step %ld: %s: the descriptor names another inode", step, h->path);
            char c;
            if (read(h->fd, &c, 1) != -1 || errno != EBADF)
                fail("step %ld: %s: a read did not fail with EBADF", step, h->path);
            result = mix64(result ^ (uint64_t)(by_fd.st_mode & S_IFMT));
        }
        int in = openat(held[0].fd, "file", O_RDONLY);
        char buf[8] = "";
        if (in < 0 || read(in, buf, sizeof buf - 1) != 4 || strcmp(buf, "data") != 0)
            fail("step %ld: openat on the directory's descriptor: %s", step, in < 0 ? strerror(errno) : buf);
        if (in >= 0)
            close(in);
        snprintf(p, sizeof p, "/proc/self/fd/%d", held[1].fd);
        in = open(p, O_RDONLY);
        memset(buf, 0, sizeof buf);
        if (in < 0 || read(in, buf, sizeof buf - 1) != 4 || strcmp(buf, "data") != 0)
            fail("step %ld: reopening the file's descriptor: %s", step, in < 0 ? strerror(errno) : buf);
        if (in >= 0)
            close(in);
        sleep_ms(STEP_MS);
    }
    return finish(result);
}
