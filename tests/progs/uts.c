/* uts: a UTS namespace the job made (unshare --uts, apptainer --hostname) must come back with
 * its names, shared by the processes that were in it, while the job's own keeps the machine's.
 *
 * The main process reads the machine's host and domain names and forks A. A makes a UTS
 * namespace (first a user namespace where it is root, as an ordinary user must: unshare -Uru;
 * as root, the UTS namespace alone), sets the domain name "ckpt.example" and, at every step,
 * the host name "ckpt-a-<its step>", after checking that the names are still those it set last.
 * A's child B, in the same namespace, reads the host name A sets: it must be A's, and must keep
 * changing (a copy of the namespace would freeze it). The main process checks at every step
 * that its own names are the machine's. A goes on until B has ended, then ends with B's
 * status; the main process waits for A. Prints PASS or FAIL <what>.
 *
 * Usage: uts [SECONDS=5]
 */
#include "common.h"
#include "userns.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/utsname.h>
#include <sys/wait.h>

#define DOMAIN "ckpt.example"

static void names(struct utsname *u)
{
    if (uname(u) != 0) {
        printf("FAIL uname: %s\n", strerror(errno));
        exit(1);
    }
}

/* B: reads A's host name for `steps` steps; it must be A's and keep changing. */
static int run_b(long steps)
{
    long last = -1, changed_at = 0;
    for (long step = 0; step < steps; step++) {
        struct utsname u;
        names(&u);
        long n;
        if (sscanf(u.nodename, "ckpt-a-%ld", &n) != 1 || strcmp(u.domainname, DOMAIN) != 0)
            fail("B step %ld: names %s %s, not A's", step, u.nodename, u.domainname);
        else if (n < last)
            fail("B step %ld: A's step went back from %ld to %ld", step, last, n);
        else if (n != last) {
            last = n;
            changed_at = step;
        }
        /* A changes the name every step for as long as B runs. */
        if (step - changed_at == 100)
            fail("B step %ld: the host name has not changed since step %ld: B is not in A's namespace", step, changed_at);
        sleep_ms(STEP_MS);
    }
    return failures ? 1 : 0;
}

/* A: makes the namespace, sets its names every step until B has ended. */
static int run_a(long steps)
{
    if (geteuid() != 0)
        unshare_as_root(0);
    if (unshare(CLONE_NEWUTS) != 0)
        return printf("FAIL set-up: unshare(CLONE_NEWUTS): %s\n", strerror(errno)), 1;
    if (setdomainname(DOMAIN, strlen(DOMAIN)) != 0 || sethostname("ckpt-a-0", 8) != 0)
        return printf("FAIL set-up: set the names: %s\n", strerror(errno)), 1;
    pid_t b = fork();
    if (b == 0)
        exit(run_b(steps));
    char set[64] = "ckpt-a-0";
    for (long step = 1;; step++) {
        int status;
        pid_t done = waitpid(b, &status, WNOHANG);
        if (done == b)
            return WIFEXITED(status) && WEXITSTATUS(status) == 0 && failures == 0 ? 0 : 1;
        struct utsname u;
        names(&u);
        if (strcmp(u.nodename, set) != 0 || strcmp(u.domainname, DOMAIN) != 0)
            fail("A step %ld: names %s %s, set %s %s", step, u.nodename, u.domainname, set, DOMAIN);
        snprintf(set, sizeof set, "ckpt-a-%ld", step);
        if (sethostname(set, strlen(set)) != 0)
            fail("A step %ld: sethostname: %s", step, strerror(errno));
        sleep_ms(STEP_MS);
    }
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    struct utsname machine;
    names(&machine);
    pid_t a = fork();
    if (a == 0)
        exit(run_a(steps));
    uint64_t result = 0;
    for (long step = 0; step < steps; step++) {
        struct utsname u;
        names(&u);
        if (strcmp(u.nodename, machine.nodename) != 0 || strcmp(u.domainname, machine.domainname) != 0)
            fail("step %ld: the job's names are %s %s, the machine's %s %s", step, u.nodename, u.domainname, machine.nodename, machine.domainname);
        result = mix64(result ^ (uint64_t)step);
        sleep_ms(STEP_MS);
    }
    int status;
    if (waitpid(a, &status, 0) != a || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("A ended with status %#x", status);
    return finish(result);
}
