/* ctty: a session whose controlling terminal is a pty it holds only through its master and
 * /dev/tty, as a program does that took the terminal and closed the slave (zdtm's pty03, pty00).
 *
 * A child leads a session of its own: it opens a pty, takes the slave as its controlling
 * terminal, closes the slave, opens /dev/tty and keeps that descriptor. Every step it types a
 * numbered line into the master and must read it back through /dev/tty, and /dev/tty must open
 * anew (it does not without a controlling terminal: ENXIO) and name this session. The parent
 * checks the child's exit. RESULT hashes the lines read; PASS when every check held.
 *
 * Usage: ctty [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>

static int child(long steps, int report)
{
    if (setsid() < 0)
        return 2;
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master))
        return 2;
    int slave = open(ptsname(master), O_RDWR);
    if (slave < 0 || ioctl(slave, TIOCSCTTY, 0))
        return 2;
    struct termios t;
    tcgetattr(slave, &t);
    t.c_lflag &= ~(tcflag_t)ECHO; /* the master reads nothing back */
    tcsetattr(slave, TCSANOW, &t);
    close(slave);
    int tty = open("/dev/tty", O_RDWR);
    if (tty < 0)
        return 2;
    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        char line[32], got[32];
        int n = snprintf(line, sizeof line, "line %ld\n", i);
        if (write(master, line, (size_t)n) != n)
            fail("step %ld: type into the master: %s", i, strerror(errno));
        ssize_t k = read(tty, got, sizeof got);
        if (k != n || memcmp(got, line, (size_t)n))
            fail("step %ld: /dev/tty read %zd bytes, not \"line %ld\" (%s)", i, k, i, k < 0 ? strerror(errno) : "other bytes");
        int again = open("/dev/tty", O_RDWR);
        if (again < 0)
            fail("step %ld: /dev/tty does not open: %s", i, strerror(errno));
        else if (tcgetsid(again) != getsid(0))
            fail("step %ld: /dev/tty is the terminal of session %d, not %d", i, (int)tcgetsid(again), (int)getsid(0));
        if (again >= 0)
            close(again);
        h = mix64(h ^ (uint64_t)k ^ (uint64_t)got[5]);
        if (failures > 5)
            break;
        sleep_ms(STEP_MS);
    }
    if (write(report, &h, sizeof h) != sizeof h)
        return 2;
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    int p[2];
    if (pipe(p))
        return 2;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        _exit(child(steps, p[1]));
    }
    close(p[1]);
    uint64_t h = 0;
    if (read_full(p[0], &h, sizeof h) != 0)
        fail("the child sent no result");
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child ended with status %#x", status);
    return finish(h);
}
