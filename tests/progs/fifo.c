/* fifo: named pipes keep their data in flight across checkpoint/restart, every byte once.
 *
 *  - DIR/data.fifo: a child opens it for writing and sends numbered, checksummed records as
 *    fast as it takes them (so it is usually full at a checkpoint); the parent opens it for
 *    reading and reads them slowly, in odd-sized pieces, checking each;
 *  - DIR/note.fifo: the parent opens it read-write and writes a note at the start, and opens it
 *    again read-only, non-blocking (a second description of the same FIFO); at the end the note
 *    is read through the second one, exactly once (then EAGAIN: it was not put back twice).
 * Each FIFO descriptor must still be the FIFO at its path. RESULT hashes what was received.
 *
 * Usage: fifo DIR [SECONDS=4]
 */
#define RECORD_WORDS 5
#include "common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void same_fifo(int fd, const char *path)
{
    struct stat a, b;
    if (fstat(fd, &a) != 0 || stat(path, &b) != 0 || !S_ISFIFO(a.st_mode) || a.st_ino != b.st_ino ||
        a.st_dev != b.st_dev)
        fail("fd %d is no longer the FIFO %s", fd, path);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: fifo DIR [SECONDS=4]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    long per_step = 30, total = steps * per_step;
    if (chdir(argv[1]) != 0) {
        perror(argv[1]);
        return 2;
    }
    if (mkfifo("data.fifo", 0600) != 0 || mkfifo("note.fifo", 0600) != 0) {
        perror("mkfifo");
        return 2;
    }

    pid_t writer = fork();
    if (writer == 0) {
        int w = open("data.fifo", O_WRONLY);
        if (w < 0)
            _exit(3);
        for (long i = 0; i < total; i++) {
            struct rec r = {.seq = (uint64_t)i};
            for (int k = 0; k < 5; k++)
                r.payload[k] = mix64((uint64_t)i * 5 + (uint64_t)k);
            r.sum = rec_sum(&r);
            const char *p = (const char *)&r;
            size_t left = sizeof r;
            while (left) {
                ssize_t n = write(w, p, left);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0)
                    _exit(4);
                p += n;
                left -= (size_t)n;
            }
        }
        _exit(0);
    }
    int data = open("data.fifo", O_RDONLY);
    int note = open("note.fifo", O_RDWR);
    int note_r = open("note.fifo", O_RDONLY | O_NONBLOCK);
    if (data < 0 || note < 0 || note_r < 0) {
        perror("open a FIFO");
        return 2;
    }
    const char msg[] = "a note left in a named pipe at the start, read at the end";
    if (write(note, msg, sizeof msg) != (ssize_t)sizeof msg)
        fail("note write");

    uint64_t h = 0;
    for (long i = 0; i < total; i++) {
        struct rec r;
        if (read_full(data, &r, 11) || read_full(data, (char *)&r + 11, sizeof r - 11)) {
            fail("data.fifo closed early at record %ld", i);
            break;
        }
        if (r.seq != (uint64_t)i || r.sum != rec_sum(&r)) {
            fail("record %ld arrived as %llu%s", i, (unsigned long long)r.seq,
                 r.sum != rec_sum(&r) ? " (damaged)" : "");
            break;
        }
        h = mix64(h ^ r.sum);
        if (i % per_step == 0)
            sleep_ms(STEP_MS);
    }
    char extra;
    if (read(data, &extra, 1) != 0)
        fail("data after the last record");
    same_fifo(data, "data.fifo");
    same_fifo(note, "note.fifo");
    same_fifo(note_r, "note.fifo");

    char buf[sizeof msg + 16];
    ssize_t n = read(note_r, buf, sizeof buf);
    if (n != (ssize_t)sizeof msg || memcmp(buf, msg, sizeof msg) != 0)
        fail("note: read %zd bytes, expected the %zu of the note", n, sizeof msg);
    if (read(note_r, buf, sizeof buf) != -1 || errno != EAGAIN)
        fail("note: more after the note (put back twice?), or O_NONBLOCK lost");
    h = mix64(h ^ (uint64_t)n);

    int st;
    if (waitpid(writer, &st, 0) != writer || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("writer status %#x", st);
    return finish(h);
}
