/* pty: a parent and a child talking through a pseudo-terminal.
 *
 * The parent holds the master, the child the slave (as its stdin and stdout, in raw mode but with
 * output processing on, so "\n" reaches the master as "\r\n"); the child leads a session of its
 * own whose controlling terminal is the pty, with itself in the foreground. Every step the parent types one
 * numbered line into the terminal and the child writes one numbered, checksummed line back; the
 * parent reads the output only every few steps and the child reads its input only every other
 * step, so a checkpoint finds bytes waiting in both directions. At the end the child reports the
 * checksum of everything it was typed, and the parent checks every line arrived once, in order,
 * with the terminal's settings and window size as they were set. The child's stdin and stdout
 * stay open across an exec and a third descriptor of the slave does not (a shell that lost its
 * terminal at its next exec hung up tmux's pane). The slave's mode is 0604, and as root its owner
 * 65534:65534 (what login and sshd do: the terminal given to its user), and must stay so.
 *
 *   pty SECONDS
 */
#include "common.h"
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#define ROWS 33
#define COLS 101

/* Reads what was typed, checking the lines "in N" come once each and in order. */
struct typed {
    char acc[4096];
    size_t have;
    long next, bytes, bad;
};

static void take_input(struct typed *in)
{
    ssize_t r;
    while ((r = read(0, in->acc + in->have, sizeof in->acc - in->have - 1)) > 0) {
        in->bytes += r;
        in->have += (size_t)r;
        char *start = in->acc, *eol;
        while ((eol = memchr(start, '\n', (size_t)(in->acc + in->have - start))) != NULL) {
            long k;
            if (sscanf(start, "in %ld", &k) != 1 || k != in->next)
                in->bad++;
            in->next++;
            start = eol + 1;
        }
        memmove(in->acc, start, (size_t)(in->acc + in->have - start));
        in->have = (size_t)(in->acc + in->have - start);
    }
}

static void child(long steps)
{
    int fl = fcntl(0, F_GETFL);
    fcntl(0, F_SETFL, fl | O_NONBLOCK);
    int closed_at_exec = fcntl(0, F_DUPFD_CLOEXEC, 7);
    static struct typed in;
    for (long s = 0; s < steps; s++) {
        char line[128];
        int n = snprintf(line, sizeof line, "out %ld %016llx\n", s, (unsigned long long)mix64((uint64_t)s));
        if (write(1, line, (size_t)n) != n)
            _exit(3);
        if (s % 2 == 1)
            take_input(&in);
        sleep_ms(STEP_MS);
    }
    /* The parent stops typing 20 steps before the end: everything has arrived by now. */
    sleep_ms(100);
    take_input(&in);
    /* Still the session's controlling terminal, this process's group in the foreground. */
    int ctty_ok = tcgetpgrp(0) == getpgrp();
    int exec_flags_ok = 1 + (fcntl(0, F_GETFD) != 0) * 2 + (fcntl(1, F_GETFD) != 0) * 4 + (fcntl(closed_at_exec, F_GETFD) != FD_CLOEXEC) * 8;
    char line[128];
    int n = snprintf(line, sizeof line, "done %ld %ld %d %d\n", in.bytes, in.bad, ctty_ok, exec_flags_ok);
    if (write(1, line, (size_t)n) != n)
        _exit(3);
    sleep_ms(200); /* let the parent read it before the slave closes */
    _exit(0);
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master)) {
        printf("FAIL posix_openpt: %s\n", strerror(errno));
        return 1;
    }
    struct winsize ws = { .ws_row = ROWS, .ws_col = COLS };
    ioctl(master, TIOCSWINSZ, &ws);
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    uid_t owner = geteuid() == 0 ? 65534 : geteuid();
    gid_t group = geteuid() == 0 ? 65534 : getegid();
    if (slave < 0 || fchmod(slave, 0604) || (geteuid() == 0 && fchown(slave, owner, group))) {
        printf("FAIL the slave's owner and mode: %s\n", strerror(errno));
        return 1;
    }
    struct termios t;
    tcgetattr(slave, &t);
    cfmakeraw(&t);
    t.c_oflag |= OPOST | ONLCR;
    t.c_cc[VMIN] = 1;
    tcsetattr(slave, TCSANOW, &t);

    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        if (ioctl(slave, TIOCSCTTY, 0) != 0)
            _exit(4);
        close(master);
        dup2(slave, 0);
        dup2(slave, 1);
        close(slave);
        child(steps);
    }
    close(slave);
    fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);

    /* The parent's view of the output stream: lines "out N HASH\r\n", then "done TOTAL\r\n". */
    static char acc[1 << 16];
    size_t have = 0;
    long next = 0, typed_total = 0, done_total = -1;
    uint64_t result = 0;
    int finished = 0;
    for (long s = 0; !finished; s++) {
        if (s < steps - 20) {
            char line[64];
            int n = snprintf(line, sizeof line, "in %ld\n", s);
            if (write(master, line, (size_t)n) != n)
                fail("typing line %ld: %s", s, strerror(errno));
            typed_total += n;
        }
        if (s % 5 == 4 || s >= steps) {
            ssize_t r;
            while (have < sizeof acc && (r = read(master, acc + have, sizeof acc - have)) > 0)
                have += (size_t)r;
            char *start = acc, *eol;
            while ((eol = memchr(start, '\n', (size_t)(acc + have - start))) != NULL) {
                *eol = 0;
                long k;
                unsigned long long h;
                long total, bad;
                int ctty_ok, exec_flags_ok;
                if (sscanf(start, "out %ld %llx", &k, &h) == 2) {
                    if (eol == start || eol[-1] != '\r')
                        fail("line %ld did not end in \\r\\n: output processing was lost", k);
                    if (k != next)
                        fail("line %ld arrived when %ld was due", k, next);
                    if (h != (unsigned long long)mix64((uint64_t)k))
                        fail("line %ld has a wrong checksum", k);
                    next = k + 1;
                    result = mix64(result ^ h);
                } else if (sscanf(start, "done %ld %ld %d %d", &total, &bad, &ctty_ok, &exec_flags_ok) == 4) {
                    done_total = total;
                    if (exec_flags_ok != 1)
                        fail("the child's terminal descriptors lost their close-on-exec flags (0 and 1 must stay open at an exec, its F_DUPFD_CLOEXEC copy must close): code %d", exec_flags_ok);
                    if (!ctty_ok)
                        fail("the pty is no longer the child's controlling terminal with its group in the foreground");
                    if (bad)
                        fail("the child found %ld typed lines missing, repeated or out of order", bad);
                    finished = 1;
                } else {
                    fail("unexpected output: %s", start);
                }
                start = eol + 1;
            }
            memmove(acc, start, (size_t)(acc + have - start));
            have = (size_t)(acc + have - start);
        }
        if (s > steps + 1000) {
            fail("the child never said done");
            break;
        }
        sleep_ms(STEP_MS);
    }
    int status;
    waitpid(pid, &status, 0);
    if (next != steps)
        fail("%ld lines arrived, %ld were written", next, steps);
    if (done_total != typed_total)
        fail("the child read %ld bytes of input, %ld were typed", done_total, typed_total);
    struct winsize now;
    ioctl(master, TIOCGWINSZ, &now);
    if (now.ws_row != ROWS || now.ws_col != COLS)
        fail("window size %dx%d, set %dx%d", now.ws_row, now.ws_col, ROWS, COLS);
    struct stat st;
    int peer = ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY);
    if (peer < 0 || fstat(peer, &st))
        fail("open the slave again: %s", strerror(errno));
    else if ((st.st_mode & 0777) != 0604 || (geteuid() == 0 && (st.st_uid != owner || st.st_gid != group)))
        fail("the slave is %o %d:%d, was 604 %d:%d", st.st_mode & 0777, (int)st.st_uid, (int)st.st_gid, (int)owner, (int)group);
    struct termios cur;
    tcgetattr(master, &cur);
    if ((cur.c_lflag & (ICANON | ECHO)) || !(cur.c_oflag & ONLCR))
        fail("terminal settings changed: lflag %o oflag %o", cur.c_lflag, cur.c_oflag);
    return finish(mix64(result ^ (uint64_t)typed_total));
}
