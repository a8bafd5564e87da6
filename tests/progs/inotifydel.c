/* inotifydel: inotify watches on files deleted while the program holds them open (a log that
 * `tail -f` follows, rotated away) survive checkpoint/restart.
 *
 * In DIR: a.log is watched (wd 1, IN_MODIFY), then deleted, the program keeping it open;
 * b.log is watched (wd 2, IN_MODIFY) and stays. Each step appends to one of them through the
 * program's descriptor and must find exactly one IN_MODIFY event, for that one's wd, and no
 * other. RESULT hashes the events; PASS when each step saw its own.
 *
 * Usage: inotifydel DIR [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/inotify.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: inotifydel DIR [SECONDS]\n");
        return 2;
    }
    start_marker();
    long steps = steps_arg(argc, argv, 2, 4.0);
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/a.log", argv[1]);
    snprintf(b, sizeof b, "%s/b.log", argv[1]);
    int in = inotify_init1(IN_NONBLOCK);
    int fa = open(a, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644), fb = open(b, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (in < 0 || fa < 0 || fb < 0)
        return 2;
    int wa = inotify_add_watch(in, a, IN_MODIFY), wb = inotify_add_watch(in, b, IN_MODIFY);
    if (wa != 1 || wb != 2)
        return 2;
    unlink(a);
    char ev[4096];
    sleep_ms(20);
    while (read(in, ev, sizeof ev) > 0) /* the deletion's IN_ATTRIB is not watched; nothing */
        ;
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        int to = s % 2 ? fb : fa, want = s % 2 ? wb : wa;
        if (write(to, "line\n", 5) != 5)
            fail("step %ld: write", s);
        ssize_t n = read(in, ev, sizeof ev);
        if (n < (ssize_t)sizeof(struct inotify_event)) {
            fail("step %ld: no event for wd %d (%s)", s, want, n < 0 ? strerror(errno) : "short");
            break;
        }
        struct inotify_event *e = (struct inotify_event *)ev;
        if (e->wd != want || !(e->mask & IN_MODIFY) || n != (ssize_t)(sizeof *e + e->len)) {
            fail("step %ld: event wd %d mask %#x (%zd bytes), not one IN_MODIFY for wd %d", s, e->wd, e->mask, n, want);
            break;
        }
        h = mix64(h ^ (uint64_t)(e->wd * 1000 + s));
        sleep_ms(STEP_MS);
    }
    return finish(h);
}
