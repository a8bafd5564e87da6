/* unixgone: Unix sockets whose names' files and directories are gone, and one whose directory
 * a restart may find gone (zdtm's sk-unix01):
 *  - a datagram server bound to WORKDIR/dg/srv, a client connected to it by that name, its
 *    socket file removed, a second server bound to the same name and a second client connected
 *    to it, then that file and the directory removed: each step each client sends a number and
 *    its own server reads it;
 *  - a stream listener bound to WORKDIR/st/lst with a connection it accepted, then the socket
 *    file and the directory removed: each step a number goes each way on the connection;
 *  - a datagram server bound to WORKDIR/fifo-at with a client connected to it by that name, its
 *    socket file then replaced by a FIFO the program holds open (zdtm's fifo_upon_unix_socket00):
 *    each step the client sends a number to the server, a byte goes through the FIFO, and the
 *    path must still be the FIFO;
 *  - a datagram server bound to WORKDIR/kept/srv, whose file stays: each step a fresh socket
 *    sends to that path and the server reads it (the test may remove WORKDIR/kept while the job
 *    is down: a restart must make the directory again for the name to work).
 * Every step also checks that WORKDIR/dg and WORKDIR/st are still gone (a restart must not leave
 * behind the files it binds the names with) and that each server still has its name
 * (getsockname). RESULT hashes the steps; PASS if everything checked out.
 *
 * Usage: unixgone WORKDIR [SECONDS=4]
 */
#include "common.h"

#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

static struct sockaddr_un name_of(const char *dir, const char *sub, const char *file)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/%s/%s", dir, sub, file);
    return a;
}

static int has_name(int s, const struct sockaddr_un *want)
{
    struct sockaddr_un got;
    socklen_t len = sizeof got;
    return getsockname(s, (struct sockaddr *)&got, &len) == 0 && strcmp(got.sun_path, want->sun_path) == 0;
}

static int bound(int type, const struct sockaddr_un *a)
{
    int s = socket(AF_UNIX, type, 0);
    if (s < 0 || bind(s, (const struct sockaddr *)a, sizeof *a) != 0)
        return -1;
    return s;
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: unixgone WORKDIR [SECONDS]\n");
        return 2;
    }
    const char *work = argv[1];
    long steps = steps_arg(argc, argv, 2, 4.0);
    char dir[4096];
    for (const char *sub = "dg"; sub; sub = !strcmp(sub, "dg") ? "st" : !strcmp(sub, "st") ? "kept" : NULL) {
        snprintf(dir, sizeof dir, "%s/%s", work, sub);
        if (mkdir(dir, 0755) != 0)
            return printf("FAIL set-up: mkdir %s: %s\n", dir, strerror(errno)), 1;
    }
    struct sockaddr_un dg = name_of(work, "dg", "srv"), st = name_of(work, "st", "lst"), kept = name_of(work, "kept", "srv");
    int dg_server = bound(SOCK_DGRAM, &dg), dg_client = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (dg_server < 0 || dg_client < 0 || connect(dg_client, (struct sockaddr *)&dg, sizeof dg) != 0 || unlink(dg.sun_path) != 0)
        return printf("FAIL set-up: the first datagram server: %s\n", strerror(errno)), 1;
    int dg_server2 = bound(SOCK_DGRAM, &dg), dg_client2 = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (dg_server2 < 0 || dg_client2 < 0 || connect(dg_client2, (struct sockaddr *)&dg, sizeof dg) != 0)
        return printf("FAIL set-up: the second datagram server: %s\n", strerror(errno)), 1;
    int listener = bound(SOCK_STREAM, &st), st_client = socket(AF_UNIX, SOCK_STREAM, 0);
    int kept_server = bound(SOCK_DGRAM, &kept);
    struct sockaddr_un at_fifo = {.sun_family = AF_UNIX};
    snprintf(at_fifo.sun_path, sizeof at_fifo.sun_path, "%s/fifo-at", work);
    int fifo_server = bound(SOCK_DGRAM, &at_fifo), fifo_client = socket(AF_UNIX, SOCK_DGRAM, 0), fifo = -1;
    if (fifo_server < 0 || fifo_client < 0 || connect(fifo_client, (struct sockaddr *)&at_fifo, sizeof at_fifo) != 0 ||
        unlink(at_fifo.sun_path) != 0 || mkfifo(at_fifo.sun_path, 0600) != 0 || (fifo = open(at_fifo.sun_path, O_RDWR)) < 0)
        return printf("FAIL set-up: a FIFO where a socket's name was: %s\n", strerror(errno)), 1;
    if (listener < 0 || st_client < 0 || kept_server < 0 || listen(listener, 4) != 0 || connect(st_client, (struct sockaddr *)&st, sizeof st) != 0)
        return printf("FAIL set-up: sockets: %s\n", strerror(errno)), 1;
    int st_served = accept(listener, NULL, NULL);
    if (st_served < 0)
        return printf("FAIL set-up: accept: %s\n", strerror(errno)), 1;
    for (const char *sub = "dg"; sub; sub = !strcmp(sub, "dg") ? "st" : NULL) {
        char file[4200];
        snprintf(dir, sizeof dir, "%s/%s", work, sub);
        snprintf(file, sizeof file, "%s/%s", dir, !strcmp(sub, "dg") ? "srv" : "lst");
        if (unlink(file) != 0 || rmdir(dir) != 0)
            return printf("FAIL set-up: remove %s: %s\n", dir, strerror(errno)), 1;
    }
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        uint64_t n = mix64((uint64_t)s), got = 0;
        if (send(dg_client, &n, sizeof n, 0) != (ssize_t)sizeof n || recv(dg_server, &got, sizeof got, MSG_DONTWAIT) != (ssize_t)sizeof got || got != n)
            fail("step %ld: the datagram to the first server whose name is gone did not come to it", s);
        got = 0;
        if (send(dg_client2, &n, sizeof n, 0) != (ssize_t)sizeof n || recv(dg_server2, &got, sizeof got, MSG_DONTWAIT) != (ssize_t)sizeof got || got != n)
            fail("step %ld: the datagram to the second server of that name did not come to it", s);
        got = 0;
        if (write(st_client, &n, sizeof n) != (ssize_t)sizeof n || read(st_served, &got, sizeof got) != (ssize_t)sizeof got || got != n ||
            write(st_served, &n, sizeof n) != (ssize_t)sizeof n || read(st_client, &got, sizeof got) != (ssize_t)sizeof got || got != n)
            fail("step %ld: the connection accepted by the listener whose name is gone does not carry bytes", s);
        got = 0;
        uint8_t byte = (uint8_t)s, back = 0;
        struct stat fifo_st;
        if (send(fifo_client, &n, sizeof n, 0) != (ssize_t)sizeof n || recv(fifo_server, &got, sizeof got, MSG_DONTWAIT) != (ssize_t)sizeof got || got != n)
            fail("step %ld: the datagram to the server whose name is now a FIFO's did not come", s);
        if (write(fifo, &byte, 1) != 1 || read(fifo, &back, 1) != 1 || back != byte)
            fail("step %ld: the FIFO at the socket's old name does not carry bytes", s);
        if (lstat(at_fifo.sun_path, &fifo_st) != 0 || !S_ISFIFO(fifo_st.st_mode))
            fail("step %ld: %s is no longer the FIFO", s, at_fifo.sun_path);
        int fresh = socket(AF_UNIX, SOCK_DGRAM, 0);
        got = 0;
        if (fresh < 0 || sendto(fresh, &n, sizeof n, 0, (struct sockaddr *)&kept, sizeof kept) != (ssize_t)sizeof n ||
            recv(kept_server, &got, sizeof got, 0) != (ssize_t)sizeof got || got != n)
            fail("step %ld: a datagram sent to %s did not come: %s", s, kept.sun_path, strerror(errno));
        if (fresh >= 0)
            close(fresh);
        struct stat st_buf;
        for (const char *sub = "dg"; sub; sub = !strcmp(sub, "dg") ? "st" : NULL) {
            snprintf(dir, sizeof dir, "%s/%s", work, sub);
            if (lstat(dir, &st_buf) == 0)
                fail("step %ld: %s is there again", s, dir);
        }
        if (!has_name(dg_server, &dg) || !has_name(dg_server2, &dg) || !has_name(listener, &st) || !has_name(kept_server, &kept) ||
            !has_name(fifo_server, &at_fifo))
            fail("step %ld: a server lost its name", s);
        h = mix64(h ^ n);
        sleep_ms(STEP_MS);
    }
    unlink(kept.sun_path);
    unlink(at_fifo.sun_path);
    snprintf(dir, sizeof dir, "%s/kept", work);
    rmdir(dir);
    return finish(h);
}
