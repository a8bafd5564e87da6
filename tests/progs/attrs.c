/* attrs: process and thread attributes survive checkpoint/restart.
 *
 * At start the program sets what an ordinary user may set: nice 3, SCHED_BATCH, oom_score_adj
 * 345, THP disabled, a timer slack of 123456 ns, a thread name, a parent-death signal (SIGUSR2),
 * a personality flag (UNAME26), umask 027, a lower soft RLIMIT_NOFILE, no_new_privs, the
 * child-subreaper flag, and CPU affinity to CPU 0 only, and as root its audit login id (4242,
 * /proc/self/loginuid, which only CAP_AUDIT_CONTROL may write); a second thread sets its own nice (7),
 * timer slack and name. Every step both threads check that nothing changed. With `trap-ignored`
 * it also ignores SIGTRAP, which keeps the capture from asking it in one stop (ptrace/batch.rs):
 * it is asked one call at a time, and SIGTRAP must still be ignored after a restart. With `mdwe`
 * it denies itself memory both writable and executable (prctl PR_SET_MDWE, as systemd's
 * MemoryDenyWriteExecute does; Linux 6.3): every step it must still be denied, and a writable
 * page must not become executable.
 *
 * Usage: attrs [SECONDS=5] [trap-ignored | mdwe]
 */
#include "common.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <signal.h>

/* The audit login id, or -1 where the kernel has none (4294967295, unset, reads as such). */
static long read_loginuid(void)
{
    char buf[32];
    if (read_small_file("/proc/self/loginuid", buf, sizeof buf) <= 0)
        return -1;
    return strtol(buf, NULL, 10);
}

static int read_oom(void)
{
    FILE *f = fopen("/proc/self/oom_score_adj", "r");
    int v = -9999;
    if (f) {
        if (fscanf(f, "%d", &v) != 1)
            v = -9999;
        fclose(f);
    }
    return v;
}

static void check_thread(const char *who, long step, int nice, unsigned long slack, const char *name)
{
    int n = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    if (n != nice)
        fail("%s step %ld: nice %d, was %d", who, step, n, nice);
    long s = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if ((unsigned long)s != slack)
        fail("%s step %ld: timer slack %ld, was %lu", who, step, s, slack);
    char buf[16] = {0};
    prctl(PR_GET_NAME, buf, 0, 0, 0);
    if (strcmp(buf, name) != 0)
        fail("%s step %ld: name %s, was %s", who, step, buf, name);
    int policy = sched_getscheduler(0);
    if (policy != SCHED_BATCH)
        fail("%s step %ld: scheduling policy %d, was SCHED_BATCH", who, step, policy);
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof set, &set);
    if (CPU_COUNT(&set) != 1 || !CPU_ISSET(0, &set))
        fail("%s step %ld: affinity is not CPU 0 alone", who, step);
    int sig = -1;
    prctl(PR_GET_PDEATHSIG, &sig, 0, 0, 0);
    if (sig != SIGUSR2)
        fail("%s step %ld: parent-death signal %d, was %d", who, step, sig, SIGUSR2);
}

static volatile int stop;

static void *second_thread(void *arg)
{
    (void)arg;
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 7);
    prctl(PR_SET_TIMERSLACK, 222222UL, 0, 0, 0);
    prctl(PR_SET_NAME, "attrs-second", 0, 0, 0);
    prctl(PR_SET_PDEATHSIG, SIGUSR2, 0, 0, 0);
    for (long i = 0; !stop; i++) {
        check_thread("thread", i, 7, 222222UL, "attrs-second");
        sleep_ms(STEP_MS);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    signal(SIGUSR2, SIG_IGN); /* the parent-death signal must not end us if init goes first */
    int trap_ignored = argc > 2 && strcmp(argv[2], "trap-ignored") == 0;
    if (trap_ignored)
        signal(SIGTRAP, SIG_IGN);
    int mdwe = argc > 2 && strcmp(argv[2], "mdwe") == 0;
    /* PR_SET_MDWE 65, PR_GET_MDWE 66, PR_MDWE_REFUSE_EXEC_GAIN 1 */
    if (mdwe && prctl(65, 1UL, 0UL, 0UL, 0UL)) {
        printf("setup failed: PR_SET_MDWE: %s\n", strerror(errno));
        return 2;
    }
    char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) {
        printf("setup failed: mmap\n");
        return 2;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    struct sched_param p = {0};
    if (sched_setaffinity(0, sizeof one, &one) || sched_setscheduler(0, SCHED_BATCH, &p) ||
        setpriority(PRIO_PROCESS, 0, 3) || prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) ||
        prctl(PR_SET_TIMERSLACK, 123456UL, 0, 0, 0) || prctl(PR_SET_NAME, "attrs-main", 0, 0, 0) ||
        prctl(PR_SET_PDEATHSIG, SIGUSR2, 0, 0, 0) || personality(PER_LINUX | UNAME26) < 0 ||
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) {
        printf("setup failed: %s\n", strerror(errno));
        return 2;
    }
    FILE *oom = fopen("/proc/self/oom_score_adj", "w");
    if (!oom || fprintf(oom, "345\n") < 0 || fclose(oom) != 0) {
        printf("setup failed: oom_score_adj\n");
        return 2;
    }
    /* (Unset first: with loginuid_immutable a set id cannot change.) */
    int loginuid = geteuid() == 0 ? 4242 : -1;
    if (loginuid > 0 && read_loginuid() >= 0) {
        FILE *l = fopen("/proc/self/loginuid", "w");
        if (!l || fprintf(l, "%d", loginuid) < 0 || fclose(l) != 0) {
            printf("setup failed: loginuid: %s\n", strerror(errno));
            return 2;
        }
    } else {
        loginuid = -1;
    }
    umask(027);
    struct rlimit lim;
    getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = 777;
    setrlimit(RLIMIT_NOFILE, &lim);
    pthread_t t;
    pthread_create(&t, NULL, second_thread, NULL);
    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        check_thread("main", i, 3, 123456UL, "attrs-main");
        if (read_oom() != 345)
            fail("step %ld: oom_score_adj %d, was 345", i, read_oom());
        if (loginuid > 0 && read_loginuid() != loginuid)
            fail("step %ld: loginuid %ld, was %d", i, read_loginuid(), loginuid);
        if (prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) != 1)
            fail("step %ld: THP no longer disabled", i);
        if ((personality(0xffffffff) & UNAME26) == 0)
            fail("step %ld: personality lost UNAME26", i);
        if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1)
            fail("step %ld: no_new_privs lost", i);
        int sub = 0;
        prctl(PR_GET_CHILD_SUBREAPER, &sub, 0, 0, 0);
        if (!sub)
            fail("step %ld: no longer a child subreaper", i);
        mode_t m = umask(027);
        if (m != 027)
            fail("step %ld: umask %03o, was 027", i, m);
        getrlimit(RLIMIT_NOFILE, &lim);
        if (lim.rlim_cur != 777)
            fail("step %ld: RLIMIT_NOFILE %llu, was 777", i, (unsigned long long)lim.rlim_cur);
        int denied = prctl(66, 0UL, 0UL, 0UL, 0UL); /* -1 before Linux 6.3 */
        if (mdwe ? denied != 1 : denied > 0)
            fail("step %ld: PR_GET_MDWE %d, was %d", i, denied, mdwe);
        if (mdwe && mprotect(page, 4096, PROT_READ | PROT_EXEC) == 0)
            fail("step %ld: a writable page became executable under MDWE", i);
        struct sigaction trap;
        sigaction(SIGTRAP, NULL, &trap);
        if ((trap.sa_handler == SIG_IGN) != trap_ignored)
            fail("step %ld: SIGTRAP %s", i, trap_ignored ? "no longer ignored" : "ignored");
        h = mix64(h ^ (uint64_t)i);
        sleep_ms(STEP_MS);
    }
    stop = 1;
    pthread_join(t, NULL);
    return finish(h);
}
