/* fanotify: a fanotify group keeps its marks, their masks, ignore masks and flags, across
 * checkpoint/restart.
 *
 * In DIR, a group that reports file handles (FAN_CLASS_NOTIF | FAN_REPORT_FID, which an
 * ordinary user may make since Linux 5.13) marks:
 *  - the directory watched/ for FAN_CREATE of its entries (FAN_EVENT_ON_CHILD, FAN_ONDIR);
 *  - the file log for FAN_MODIFY and FAN_CLOSE_WRITE, ignoring FAN_OPEN (surviving modify);
 *  - as root, the mount DIR is on for FAN_CLOSE_WRITE too (a mount mark), which makes every
 *    close after writing in it reported.
 * Every step checks the marks in /proc/self/fdinfo, creates (and then removes) watched/f<s>
 * and appends to log;
 * the events must arrive at once, for the right object (its file handle) and with the right
 * mask (the step's events are read before it sleeps, so none is queued at a checkpoint).
 * RESULT hashes the events' masks.
 *
 * Usage: fanotify DIR [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/fanotify.h>
#include <sys/stat.h>
#include <unistd.h>

static int fan;
static uint64_t h;

/* The file handle of a path, as fanotify reports it (struct file_handle's bytes). */
static int handle_of(const char *path, unsigned char *out, size_t room)
{
    struct file_handle *fh = (struct file_handle *)out;
    fh->handle_bytes = room - sizeof *fh < MAX_HANDLE_SZ ? (unsigned)(room - sizeof *fh) : MAX_HANDLE_SZ;
    int mnt;
    return name_to_handle_at(AT_FDCWD, path, fh, &mnt, 0) == 0 ? (int)(sizeof *fh + fh->handle_bytes) : -1;
}

/* Reads every queued event; returns the union of the masks of those about the object whose
 * handle is `want` (`wlen` bytes), and counts the others in *others. */
static uint64_t read_events(const unsigned char *want, int wlen, uint64_t *all_masks)
{
    char buf[8192] __attribute__((aligned(8)));
    uint64_t mask = 0;
    *all_masks = 0;
    for (;;) {
        ssize_t len = read(fan, buf, sizeof buf);
        if (len <= 0)
            return mask;
        for (struct fanotify_event_metadata *m = (void *)buf; FAN_EVENT_OK(m, len); m = FAN_EVENT_NEXT(m, len)) {
            *all_masks |= m->mask;
            struct fanotify_event_info_fid *fid = (void *)(m + 1);
            if ((char *)fid + sizeof *fid > (char *)m + m->event_len)
                continue;
            struct file_handle *fh = (struct file_handle *)fid->handle;
            int flen = (int)(sizeof *fh + fh->handle_bytes);
            if (flen == wlen && !memcmp(fh, want, (size_t)wlen))
                mask |= m->mask;
        }
    }
}

/* Waits a little for events about `want`; returns their masks. */
static uint64_t events_about(const unsigned char *want, int wlen, uint64_t *all_masks)
{
    uint64_t got = 0, all = 0, more;
    for (int look = 0; look < 100; look++) {
        got |= read_events(want, wlen, &more);
        all |= more;
        if (got)
            break;
        sleep_ms(1);
    }
    /* The rest of the step's events, now that the first came. */
    got |= read_events(want, wlen, &more);
    *all_masks = all | more;
    return got;
}

/* The marks' lines of /proc/self/fdinfo/FAN: checks that there are `want` of them. */
static void check_marks(int want, long step)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fan);
    int fd = open(path, O_RDONLY);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (fd >= 0)
        close(fd);
    if (n <= 0) {
        fail("step %ld: read %s", step, path);
        return;
    }
    buf[n] = 0;
    int marks = 0;
    for (char *p = buf; (p = strstr(p, "fanotify ")); p++)
        marks += strncmp(p, "fanotify flags:", 15) != 0;
    if (marks != want)
        fail("step %ld: %d marks in fdinfo, not %d:\n%s", step, marks, want, buf);
    if (!strstr(buf, "mflags:40 mask:a ignored_mask:20"))
        fail("step %ld: log's mark is not FAN_MODIFY|FAN_CLOSE_WRITE ignoring FAN_OPEN (surviving modify):\n%s", step, buf);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: fanotify DIR [SECONDS=4]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    if (chdir(argv[1]) != 0 || mkdir("watched", 0755)) {
        perror(argv[1]);
        return 2;
    }
    int log = open("log", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    close(log);
    fan = fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_FID | FAN_NONBLOCK | FAN_CLOEXEC, O_RDONLY);
    if (fan < 0) {
        fail("fanotify_init: %s", strerror(errno));
        return finish(0);
    }
    int marks = 2;
    if (fanotify_mark(fan, FAN_MARK_ADD, FAN_CREATE | FAN_EVENT_ON_CHILD | FAN_ONDIR, AT_FDCWD, "watched") ||
        fanotify_mark(fan, FAN_MARK_ADD, FAN_MODIFY | FAN_CLOSE_WRITE, AT_FDCWD, "log") ||
        fanotify_mark(fan, FAN_MARK_ADD | FAN_MARK_IGNORED_MASK | FAN_MARK_IGNORED_SURV_MODIFY, FAN_OPEN, AT_FDCWD, "log")) {
        fail("fanotify_mark: %s", strerror(errno));
        return finish(0);
    }
    if (geteuid() == 0) {
        if (fanotify_mark(fan, FAN_MARK_ADD | FAN_MARK_MOUNT, FAN_CLOSE_WRITE, AT_FDCWD, ".") == 0)
            marks++;
        else
            fail("fanotify_mark of the mount, as root: %s", strerror(errno));
    }
    unsigned char dir_handle[256], log_handle[256];
    int dlen = handle_of("watched", dir_handle, sizeof dir_handle), llen = handle_of("log", log_handle, sizeof log_handle);
    if (dlen < 0 || llen < 0) {
        fail("name_to_handle_at: %s", strerror(errno));
        return finish(0);
    }
    for (long s = 0; s < steps && !failures; s++) {
        check_marks(marks, s);
        char name[64];
        snprintf(name, sizeof name, "watched/f%ld", s);
        /* Left by the run a crash ended, past the checkpoint: a deletion is not marked. */
        unlink(name);
        /* Made without a descriptor: a checkpoint that caught one open on it for writing would
         * have the restart find the file, gone since (the crash round runs on), and refuse. */
        if (mknod(name, S_IFREG | 0644, 0)) {
            fail("step %ld: create %s: %s", s, name, strerror(errno));
            break;
        }
        uint64_t all;
        uint64_t created = events_about(dir_handle, dlen, &all);
        if (created != (FAN_CREATE))
            fail("step %ld: the directory's events are %#llx, not FAN_CREATE (all: %#llx)", s, (unsigned long long)created, (unsigned long long)all);
        /* As root the mount mark reports closes after writing on the mount too (the log's, other
         * programs'); nothing else may come. */
        uint64_t allowed = FAN_CREATE | (marks == 3 ? FAN_CLOSE_WRITE : 0);
        if (all & ~allowed)
            fail("step %ld: events %#llx beyond %#llx", s, (unsigned long long)all, (unsigned long long)allowed);
        int fd = open("log", O_WRONLY | O_APPEND);
        if (fd < 0 || write(fd, "x\n", 2) != 2 || close(fd)) {
            fail("step %ld: append to log: %s", s, strerror(errno));
            break;
        }
        uint64_t logged = events_about(log_handle, llen, &all);
        if (logged != (FAN_MODIFY | FAN_CLOSE_WRITE))
            fail("step %ld: log's events are %#llx, not FAN_MODIFY|FAN_CLOSE_WRITE (an ignored FAN_OPEN must not come; all: %#llx)", s,
                 (unsigned long long)logged, (unsigned long long)all);
        if (unlink(name))
            fail("step %ld: remove %s: %s", s, name, strerror(errno));
        h = mix64(h ^ created ^ (logged << 32));
        sleep_ms(STEP_MS);
    }
    return finish(h);
}
