/* ctty: a session whose controlling terminal is a pty it holds only through its master and
 * /dev/tty, as a program does that took the terminal and closed the slave (zdtm's pty03, pty00).
 *
 * A child leads a session of its own: it opens a pty, takes the slave as its controlling
 * terminal, closes the slave, opens /dev/tty and keeps that descriptor. Every step it types a
 * numbered line into the master and must read it back through /dev/tty, and /dev/tty must open
 * anew (it does not without a controlling terminal: ENXIO) and name this session. A second
 * child leads a session whose terminal's master only the parent holds (zdtm's tty00): it holds
 * no end at all, yet /dev/tty must open every step, and when the parent closes the master at
 * the end the hangup must reach it (SIGHUP). The parent also holds the slave of a pty whose
 * master it closed (hung up, as a terminal whose ssh session went): after the restarts its
 * settings must still fail with EIO and a read must find the end. The parent checks both
 * children's exits. RESULT
 * hashes the lines read; PASS when every check held.
 *
 * Usage: ctty [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <signal.h>
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

static volatile sig_atomic_t hung_up;

static void on_hangup(int sig)
{
    (void)sig;
    hung_up = 1;
}

/* The second child: `slave` names the pty whose master the parent holds. */
static int bare_child(long steps, const char *slave_name, int ready)
{
    signal(SIGHUP, on_hangup);
    if (setsid() < 0)
        return 2;
    int slave = open(slave_name, O_RDWR);
    if (slave < 0 || ioctl(slave, TIOCSCTTY, 0))
        return 2;
    close(slave);
    if (write(ready, "r", 1) != 1)
        return 2;
    close(ready);
    for (long i = 0; i < steps && !hung_up; i++) {
        int tty = open("/dev/tty", O_RDWR | O_NOCTTY);
        if (tty < 0)
            fail("bare step %ld: /dev/tty does not open: %s", i, strerror(errno));
        else
            close(tty);
        if (failures > 5)
            break;
        sleep_ms(STEP_MS);
    }
    /* The parent closes the master once its own steps are done. */
    for (int i = 0; i < 500 && !hung_up; i++)
        sleep_ms(10);
    if (!hung_up)
        fail("bare: no SIGHUP when the terminal's master was closed");
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
    int gone = posix_openpt(O_RDWR | O_NOCTTY), hung = -1;
    if (gone < 0 || grantpt(gone) || unlockpt(gone) || (hung = open(ptsname(gone), O_RDWR | O_NOCTTY)) < 0)
        return 2;
    close(gone);
    int master = posix_openpt(O_RDWR | O_NOCTTY), ready[2];
    if (master < 0 || grantpt(master) || unlockpt(master) || pipe(ready))
        return 2;
    char slave_name[64];
    snprintf(slave_name, sizeof slave_name, "%s", ptsname(master));
    pid_t bare = fork();
    if (bare == 0) {
        close(master);
        close(ready[0]);
        close(p[0]);
        _exit(bare_child(steps, slave_name, ready[1]));
    }
    close(ready[1]);
    char r;
    if (read(ready[0], &r, 1) != 1)
        fail("the second child did not take its terminal");
    close(ready[0]);
    uint64_t h = 0;
    if (read_full(p[0], &h, sizeof h) != 0)
        fail("the child sent no result");
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child ended with status %#x", status);
    struct termios t;
    char c;
    if (tcgetattr(hung, &t) == 0 || errno != EIO || read(hung, &c, 1) > 0)
        fail("the hung-up terminal answers: tcgetattr %s, or a read found a byte", strerror(errno));
    close(master);
    if (waitpid(bare, &status, 0) != bare || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the second child ended with status %#x", status);
    return finish(h);
}
