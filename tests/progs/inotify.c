/* inotify: an inotify instance keeps its watches, at the same watch descriptors, across
 * checkpoint/restart.
 *
 * In DIR: a directory watched/ (IN_CREATE|IN_DELETE, wd 1), a directory gone/ whose watch (wd 2)
 * is removed at once, and a file log watched for IN_MODIFY (wd 3: the restart must skip wd 2).
 * Each step creates and deletes watched/f<s>, and every third step appends to log; the events
 * must arrive at once, with the right wd, mask and name, and nothing else (the step's events
 * are read before it sleeps, so none is queued at a checkpoint). At the end a new watch must
 * get wd 4, and removing wd 1 must report IN_IGNORED for it. RESULT hashes the events.
 *
 * With GO_FILE, the program is caught with an event unread once: at step 20 it creates the file,
 * prints PENDING and reads the event only once GO_FILE exists, as a checkpoint comes.
 *
 * Usage: inotify DIR [SECONDS=4] [GO_FILE]
 */
#include "common.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t h;
static int in;

/* Reads every queued event (non-blocking); returns how many were read. */
static int drain(void)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    int n = 0;
    for (;;) {
        ssize_t len = read(in, buf, sizeof buf);
        if (len <= 0)
            return n;
        for (char *p = buf; p < buf + len; p += sizeof(struct inotify_event) + ((struct inotify_event *)p)->len)
            n++;
    }
}

/* Reads one event, which must be (wd, mask, name). */
static void expect(int wd, uint32_t mask, const char *name, const char *what)
{
    char buf[sizeof(struct inotify_event) + NAME_MAX + 1]
        __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t len = read(in, buf, sizeof(struct inotify_event) + (name ? NAME_MAX + 1 : 0));
    if (len < (ssize_t)sizeof(struct inotify_event)) {
        fail("%s: no event (%s)", what, len < 0 ? strerror(errno) : "short read");
        return;
    }
    struct inotify_event *e = (struct inotify_event *)buf;
    const char *got = e->len ? e->name : "";
    if (e->wd != wd || e->mask != mask || strcmp(got, name ? name : ""))
        fail("%s: event wd %d mask %#x name '%s', expected wd %d mask %#x name '%s'", what, e->wd,
             e->mask, got, wd, mask, name ? name : "");
    h = mix64(h ^ (uint64_t)e->wd ^ ((uint64_t)e->mask << 8) ^ e->len);
}

static void touch(const char *path, int flags)
{
    int fd = open(path, flags, 0644);
    if (fd < 0 || (flags & O_APPEND && write(fd, "x\n", 2) != 2) || close(fd) != 0)
        fail("%s: %s", path, strerror(errno));
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: inotify DIR [SECONDS=4]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    const char *go = argc > 3 ? argv[3] : NULL;
    if (chdir(argv[1]) != 0 || mkdir("watched", 0755) || mkdir("gone", 0755)) {
        perror(argv[1]);
        return 2;
    }
    touch("log", O_WRONLY | O_CREAT | O_TRUNC);
    in = inotify_init1(IN_NONBLOCK);
    int w1 = inotify_add_watch(in, "watched", IN_CREATE | IN_DELETE);
    int w2 = inotify_add_watch(in, "gone", IN_ALL_EVENTS);
    inotify_rm_watch(in, w2);
    int w3 = inotify_add_watch(in, "log", IN_MODIFY);
    if (in < 0 || w1 != 1 || w2 != 2 || w3 != 3) {
        fprintf(stderr, "inotify set-up: wds %d %d %d\n", w1, w2, w3);
        return 2;
    }
    drain(); /* the IN_IGNORED of wd 2 */

    for (long s = 0; s < steps; s++) {
        char name[32], path[64];
        snprintf(name, sizeof name, "f%ld", s);
        snprintf(path, sizeof path, "watched/%s", name);
        /* Left over by a run that went on past the checkpoint and crashed: not this run's. */
        unlink(path);
        drain();
        /* Made without a descriptor: a checkpoint that caught one open on it for writing would
         * have the restart find the file, gone since (the crash round runs on), and refuse. */
        if (mknod(path, S_IFREG | 0644, 0) != 0)
            fail("mknod %s: %s", path, strerror(errno));
        if (go && s == 20) {
            printf("PENDING\n");
            fflush(stdout);
            while (access(go, F_OK) != 0)
                sleep_ms(5);
        }
        expect(w1, IN_CREATE, name, "create");
        if (unlink(path) != 0)
            fail("unlink %s", path);
        expect(w1, IN_DELETE, name, "delete");
        if (s % 3 == 0) {
            touch("log", O_WRONLY | O_APPEND);
            expect(w3, IN_MODIFY, NULL, "append");
        }
        int extra = drain();
        if (extra)
            fail("step %ld: %d unexpected events", s, extra);
        sleep_ms(STEP_MS);
    }

    int w4 = inotify_add_watch(in, ".", IN_ATTRIB);
    if (w4 != 4)
        fail("a new watch got wd %d, expected 4", w4);
    if (inotify_rm_watch(in, w1) != 0)
        fail("inotify_rm_watch(%d): %s", w1, strerror(errno));
    expect(w1, IN_IGNORED, NULL, "remove wd 1");
    if (inotify_rm_watch(in, 2) == 0 || errno != EINVAL)
        fail("wd 2 exists after the restart");
    return finish(h);
}
