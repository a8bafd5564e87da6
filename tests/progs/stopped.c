/* stopped: a child stopped by SIGSTOP (as a shell's job is by ^Z) must stay stopped through
 * checkpoints and restarts, and go on where it was when it is continued.
 *
 * The child counts in memory it shares with the parent. The parent stops it, takes its stop
 * report, notes the count, and for SECONDS checks at every step that the child is still stopped
 * (state T in /proc) and its count has not moved. Then it continues the child (SIGCONT), which
 * counts on to a fixed end and exits with status 7. RESULT hashes the counts the parent saw;
 * PASS when the child never ran while stopped, ran again once continued, and ended as it should.
 *
 * With "again", the parent then sends the stopped child SIGSTOP twice more, with kill and with
 * tgkill (as CRIU's zdtm stopped01, 02 and 12 do): those stay pending in a stopped process (the
 * SIGCONT that continues it discards them), and must neither fail a checkpoint, whose calls in
 * the child would take them, nor keep the child stopped once it is continued.
 *
 * With "tstp", the child is stopped by SIGTSTP instead (as a terminal's ^Z does), in a process
 * group of its own (a stop signal of the terminal's kind is dropped in an orphaned one): a
 * restart must stop it again by that signal, as zdtm's stopped03 checks. In both modes, a stop
 * reported to the parent (a restart stops the child anew) must name the signal that stopped it.
 *
 * Usage: stopped [SECONDS=5] [again|tstp]
 */
#include "common.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define COUNT_TO 300000000ULL

/* The state letter of a process in /proc/PID/stat; '?' if it cannot be read. */
static char state_of(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    volatile uint64_t *count = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (count == MAP_FAILED)
        return 2;
    pid_t child = fork();
    if (child < 0)
        return 2;
    if (child == 0) {
        while (*count < COUNT_TO)
            (*count)++;
        _exit(7);
    }
    int tstp = argc > 2 && strcmp(argv[2], "tstp") == 0;
    int stop_signal = tstp ? SIGTSTP : SIGSTOP;
    if (tstp && setpgid(child, child)) {
        fail("setpgid: %s", strerror(errno));
        return finish(0);
    }
    while (*count < 1000)
        sleep_ms(1);
    kill(child, stop_signal);
    int status;
    if (waitpid(child, &status, WUNTRACED) != child || !WIFSTOPPED(status) || WSTOPSIG(status) != stop_signal) {
        fail("the child did not report its stop by signal %d (status %#x)", stop_signal, status);
        return finish(0);
    }
    if (argc > 2 && strcmp(argv[2], "again") == 0) {
        kill(child, SIGSTOP);
        syscall(SYS_tgkill, child, child, SIGSTOP);
    }
    uint64_t stopped_at = *count;
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        sleep_ms(STEP_MS);
        if (*count != stopped_at) {
            fail("step %ld: the stopped child counted from %llu to %llu", s, (unsigned long long)stopped_at, (unsigned long long)*count);
            break;
        }
        /* Seized and let go by a checkpoint, a stopped process runs in the kernel on its way to
         * the tracer's stop and back to its own (state R, none of its own code: the count above
         * is the check that it ran nothing). How long it waits for a CPU depends on the
         * machine's load (a CI run went over 50 ms), so stopped means stopped again within 2 s. */
        char st = state_of(child);
        for (int look = 0; look < 2000 && st != 'T' && st != 't'; look++) {
            sleep_ms(1);
            st = state_of(child);
        }
        if (st != 'T' && st != 't') {
            fail("step %ld: the child is in state %c, not stopped", s, st);
            break;
        }
        siginfo_t report = {0};
        if (waitid(P_PID, (id_t)child, &report, WSTOPPED | WNOHANG | WNOWAIT) == 0 && report.si_pid == child && report.si_code == CLD_STOPPED &&
            report.si_status != stop_signal) {
            fail("step %ld: the child's stop is reported as by signal %d, not %d", s, report.si_status, stop_signal);
            break;
        }
        h = mix64(h ^ (uint64_t)s);
    }
    if (*count != stopped_at)
        fail("the stopped child counted from %llu to %llu at the end", (unsigned long long)stopped_at, (unsigned long long)*count);
    kill(child, SIGCONT);
    /* Its stop may be reported again (a restart stops it anew): only its end counts. */
    while (waitpid(child, &status, 0) == child && !WIFEXITED(status) && !WIFSIGNALED(status))
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 7)
        fail("the continued child ended with status %#x, not exit 7", status);
    if (*count != COUNT_TO)
        fail("the continued child counted to %llu, not %llu", (unsigned long long)*count, COUNT_TO);
    return finish(mix64(h ^ *count));
}
