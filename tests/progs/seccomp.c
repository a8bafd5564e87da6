/* seccomp: threads in seccomp sandboxes, as OpenSSH's privilege-separated child, browsers and
 * container runtimes put theirs, for the tests of ckpt's seccomp support (objects/seccomp.rs).
 *
 * - The main thread and a second thread share two filters, one installed before the thread was
 *   made, one after with SECCOMP_FILTER_FLAG_TSYNC: uname fails with EPERM, getpriority with
 *   ESRCH, in both.
 * - A child forked first runs in strict mode (read, write, _exit, sigreturn only): it answers
 *   each byte sent to it with the byte's square.
 * - A second child (forked with the two filters) has a thread with a third filter of its own:
 *   getpgid fails with EACCES in that thread, and works in the child's main thread.
 *
 * Each step checks every sandbox (the calls' errors, /proc's Seccomp and Seccomp_filters lines)
 * and prints FAIL for one that is not as it was. At the end: a filter installed with TSYNC
 * reaches the second thread (the threads still share their filters: a TSYNC fails where they do
 * not), and the strict child is killed by the kernel for a call strict mode forbids. RESULT
 * hashes the steps and what every check saw.
 *
 * Usage: seccomp [SECONDS=5]
 */
#include "common.h"

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>

/* A filter that makes system call `nr` fail with `err`. */
static int deny(int nr, int err, unsigned flags)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (unsigned)err),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = 4, .filter = f};
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
}

/* The errno of a call (0 when it worked). */
static int err_of_uname(void)
{
    struct utsname u;
    errno = 0;
    return uname(&u) == 0 ? 0 : errno;
}

static int err_of_getpriority(void)
{
    errno = 0;
    return syscall(SYS_getpriority, PRIO_PROCESS, 0) >= 0 ? 0 : errno;
}

static int err_of_getpgid(void)
{
    errno = 0;
    return syscall(SYS_getpgid, 0) >= 0 ? 0 : errno;
}

/* This thread's "Seccomp" and "Seccomp_filters" from /proc. */
static void own_sandbox(int *mode, int *filters)
{
    char buf[8192];
    *mode = *filters = -1;
    if (read_small_file("/proc/thread-self/status", buf, sizeof buf) < 0)
        return;
    char *at = strstr(buf, "\nSeccomp:");
    if (at)
        *mode = atoi(at + 9);
    at = strstr(buf, "\nSeccomp_filters:");
    if (at)
        *filters = atoi(at + 17);
}

/* What a thread under the two shared filters sees of its sandbox. */
struct seen {
    int u, p, mode, filters;
};

static struct seen look(void)
{
    struct seen s;
    own_sandbox(&s.mode, &s.filters);
    s.u = err_of_uname();
    s.p = err_of_getpriority();
    return s;
}

/* Whether it is what the two filters (and `extra` more) give; FAIL if not. A word for RESULT. */
static uint64_t judge(const char *who, struct seen s, int extra)
{
    if (s.u != EPERM || s.p != ESRCH || s.mode != 2 || s.filters != 2 + extra)
        fail("%s: uname gave %d (want EPERM), getpriority %d (want ESRCH), seccomp mode %d filters %d (want 2, %d)", who, s.u, s.p, s.mode, s.filters, 2 + extra);
    return (uint64_t)s.u | (uint64_t)s.p << 8 | (uint64_t)s.mode << 16 | (uint64_t)s.filters << 24;
}

static uint64_t check_shared(const char *who, int extra)
{
    return judge(who, look(), extra);
}

static atomic_long thread_checks, tsync_seen;
static atomic_int stop_thread, go, tsync_coming;
static atomic_uint_fast64_t thread_word;

static void *second_thread(void *arg)
{
    (void)arg;
    /* Until the main thread has added the second filter (TSYNC). */
    while (!atomic_load(&go))
        sleep_ms(1);
    while (!atomic_load(&stop_thread)) {
        /* While the main thread adds its filter (announced before, told after), the count may be
         * either: a look begun before the announcement and ended after it is not judged. */
        long seen_before = atomic_load(&tsync_seen);
        if (atomic_load(&tsync_coming) && seen_before == 0) {
            sleep_ms(1);
            continue;
        }
        struct seen s = look();
        if (seen_before == 0 && atomic_load(&tsync_coming))
            continue;
        uint64_t w = judge("the second thread", s, seen_before != 0);
        if (atomic_load(&tsync_seen) < 0) {
            int g = err_of_getpgid();
            atomic_store(&tsync_seen, g == ECHILD ? 1 : 2);
        }
        atomic_store(&thread_word, w);
        atomic_fetch_add(&thread_checks, 1);
        sleep_ms(STEP_MS);
    }
    return NULL;
}

/* The strict child: a byte in, its square out; 'x' makes a forbidden call. */
static void strict_child(int in, int out)
{
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0)
        syscall(SYS_exit, 3);
    for (;;) {
        unsigned char c;
        if (read(in, &c, 1) != 1)
            syscall(SYS_exit, 0);
        if (c == 'x')
            syscall(SYS_getpid);
        unsigned char r = (unsigned char)(c * c);
        if (write(out, &r, 1) != 1)
            syscall(SYS_exit, 4);
    }
}

static atomic_int own_filter_ok = 1;

static void *own_filter_thread(void *arg)
{
    long steps = *(long *)arg;
    if (deny(SYS_getpgid, EACCES, 0) != 0)
        atomic_store(&own_filter_ok, 0);
    for (long i = 0; i < steps; i++) {
        int mode, filters;
        own_sandbox(&mode, &filters);
        if (err_of_getpgid() != EACCES || err_of_uname() != EPERM || mode != 2 || filters != 3)
            atomic_store(&own_filter_ok, 0);
        sleep_ms(STEP_MS);
    }
    return NULL;
}

/* The second child: its main thread under the two filters, a thread under a third too. */
static int child_with_a_thread_of_its_own(long steps)
{
    pthread_t t;
    if (pthread_create(&t, NULL, own_filter_thread, &steps) != 0)
        return 5;
    int ok = 1;
    for (long i = 0; i < steps; i++) {
        int mode, filters;
        own_sandbox(&mode, &filters);
        if (err_of_getpgid() != 0 || err_of_uname() != EPERM || mode != 2 || filters != 2)
            ok = 0;
        sleep_ms(STEP_MS);
    }
    pthread_join(t, NULL);
    return ok && atomic_load(&own_filter_ok) ? 0 : 1;
}

int main(int argc, char **argv)
{
    long steps = steps_arg(argc, argv, 1, 5.0);
    int to_child[2], from_child[2];
    if (pipe(to_child) || pipe(from_child))
        return 2;
    fflush(stdout);
    pid_t strict = fork();
    if (strict == 0) {
        close(to_child[1]);
        close(from_child[0]);
        strict_child(to_child[0], from_child[1]);
    }
    close(to_child[0]);
    close(from_child[1]);

    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || deny(SYS_uname, EPERM, 0)) {
        printf("FAIL setup: %s\n", strerror(errno));
        return 2;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, second_thread, NULL) != 0 || deny(SYS_getpriority, ESRCH, SECCOMP_FILTER_FLAG_TSYNC) != 0) {
        printf("FAIL setup: %s\n", strerror(errno));
        return 2;
    }
    atomic_store(&go, 1);
    fflush(stdout);
    pid_t own = fork();
    if (own == 0)
        _exit(child_with_a_thread_of_its_own(steps));
    start_marker();

    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        h = mix64(h ^ check_shared("the main thread", 0));
        /* 1 to 100: never the 'x' (120) that ends the strict child. */
        unsigned char c = (unsigned char)(i % 100 + 1), r = 0;
        if (write(to_child[1], &c, 1) != 1 || read(from_child[0], &r, 1) != 1 || r != (unsigned char)(c * c))
            fail("step %ld: the strict child answered %u to %u", i, r, c);
        h = mix64(h ^ r);
        sleep_ms(STEP_MS);
    }
    long seen = atomic_load(&thread_checks);
    /* The second thread checked during the run, and on with the main thread's new filter. */
    atomic_store(&tsync_coming, 1);
    if (deny(SYS_getpgid, ECHILD, SECCOMP_FILTER_FLAG_TSYNC) != 0)
        fail("a filter with TSYNC: %s (the threads no longer share their filters)", strerror(errno));
    atomic_store(&tsync_seen, -1);
    for (int i = 0; i < 500 && atomic_load(&tsync_seen) < 1; i++)
        sleep_ms(STEP_MS);
    if (atomic_load(&tsync_seen) != 1)
        fail("the filter installed with TSYNC did not reach the second thread (%ld)", atomic_load(&tsync_seen));
    atomic_store(&stop_thread, 1);
    pthread_join(t, NULL);
    if (seen < 1)
        fail("the second thread made no check");
    h = mix64(h ^ atomic_load(&thread_word));

    /* The strict child: a forbidden call kills it. */
    unsigned char x = 'x';
    int status = 0;
    if (write(to_child[1], &x, 1) != 1 || waitpid(strict, &status, 0) != strict || !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
        fail("the strict child was not killed for a forbidden call (status %#x)", status);
    if (waitpid(own, &status, 0) != own || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child with a filtered thread saw its sandboxes wrong (status %#x)", status);
    return finish(h);
}
