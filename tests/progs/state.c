/* state: process state that must survive checkpoint/restart.
 *
 * Checks, at the end of a loop of steps (PASS, or one "FAIL <reason>" line per broken item):
 *  - the pid is unchanged;
 *  - a SIGUSR2 handler (sigaction SA_SIGINFO|SA_RESTART|SA_ONSTACK, mask {SIGUSR1}) and its
 *    alternate signal stack are still installed;
 *  - SIGUSR2, raised while blocked, is still pending (thread-directed); unblocking it runs the
 *    handler exactly once, on the alternate stack, with SIGUSR1 blocked and si_code SI_TKILL;
 *  - SIGRTMIN+1, queued to the process with a value while blocked, is still pending (shared
 *    queue) and carries its value;
 *  - an ITIMER_REAL interval timer (20 ms) still fires SIGALRM after restart;
 *  - RLIMIT_NOFILE soft limit 777, umask 027, cwd = DIR;
 *  - thread-local variables of 2 threads keep their values;
 *  - DIR/state-data.bin, opened read-only and read from the middle, 64 bytes per step, continues
 *    from the right offset (each read is compared with the file's known contents);
 *  - /dev/null, /dev/zero, /dev/urandom descriptors still open and working.
 * RESULT is a hash of the data read (equal to an uninterrupted run's).
 *
 * Usage: state DIR [SECONDS=4]
 */
#include "common.h"
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#define DATA_FILE "state-data.bin"
#define DATA_SIZE (1 << 20)
#define READ_START 300000
#define READ_CHUNK 64
#define NOFILE_SOFT 777
#define TIMER_MS 20
#define RT_VALUE 4242

static char altstack[64 * 1024];
static volatile sig_atomic_t usr2_count, usr2_bad_stack, usr2_bad_mask, usr2_bad_info;
static volatile sig_atomic_t alrm_ticks;
static long steps;
static __thread long tls_value;

static uint8_t data_byte(size_t i) { return (uint8_t)(mix64(i / 8) >> (8 * (i % 8))); }

static void on_usr2(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    char here;
    usr2_count++;
    if (&here < altstack || &here >= altstack + sizeof altstack)
        usr2_bad_stack = 1;
    sigset_t cur;
    sigprocmask(SIG_BLOCK, NULL, &cur);
    if (!sigismember(&cur, SIGUSR1))
        usr2_bad_mask = 1;
    if (sig != SIGUSR2 || si->si_signo != SIGUSR2 || si->si_code != SI_TKILL)
        usr2_bad_info = 1;
}

static void on_alrm(int sig) { (void)sig; alrm_ticks++; }

static void *tls_thread(void *arg)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    long mine = 1000 + (long)arg;
    tls_value = mine;
    long bad = 0;
    for (long s = 0; s < steps; s++) {
        if (tls_value != mine)
            bad++;
        sleep_ms(STEP_MS);
    }
    return (void *)(bad + (tls_value != mine));
}

static int open_dev(const char *path, int flags)
{
    int fd = open(path, flags);
    if (fd < 0)
        perror(path);
    return fd;
}

static void check_dev(int fd, const char *path, unsigned maj, unsigned min)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode) || major(st.st_rdev) != maj ||
        minor(st.st_rdev) != min)
        fail("fd %d is no longer %s", fd, path);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: state DIR [SECONDS=4]\n");
        return 2;
    }
    steps = steps_arg(argc, argv, 2, 4.0);
    pid_t pid0 = (pid_t)syscall(SYS_getpid);

    /* cwd, umask, rlimit */
    if (chdir(argv[1]) != 0) {
        perror(argv[1]);
        return 2;
    }
    char cwd0[PATH_MAX];
    if (!getcwd(cwd0, sizeof cwd0))
        return 2;
    umask(027);
    struct rlimit rl0;
    getrlimit(RLIMIT_NOFILE, &rl0);
    struct rlimit rl = {NOFILE_SOFT, rl0.rlim_max};
    if (rl.rlim_max < NOFILE_SOFT)
        rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        perror("setrlimit");

    /* signal handler with alternate stack; SIGUSR2 pending while blocked */
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0)
        perror("sigaltstack");
    struct sigaction sa = {0};
    sa.sa_sigaction = on_usr2;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR1);
    sigaction(SIGUSR2, &sa, NULL);
    struct sigaction alrm = {0};
    alrm.sa_handler = on_alrm;
    alrm.sa_flags = SA_RESTART;
    sigemptyset(&alrm.sa_mask);
    sigaction(SIGALRM, &alrm, NULL);

    sigset_t blocked;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGUSR2);
    sigaddset(&blocked, SIGRTMIN + 1);
    sigprocmask(SIG_BLOCK, &blocked, NULL);
    raise(SIGUSR2);
    sigqueue(getpid(), SIGRTMIN + 1, (union sigval){.sival_int = RT_VALUE});

    /* data file read from the middle; character devices */
    int out = open(DATA_FILE, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    static uint8_t buf[DATA_SIZE];
    for (size_t i = 0; i < DATA_SIZE; i++)
        buf[i] = data_byte(i);
    if (out < 0 || write(out, buf, DATA_SIZE) != DATA_SIZE || close(out) != 0) {
        perror(DATA_FILE);
        return 2;
    }
    int data = open(DATA_FILE, O_RDONLY);
    if (data < 0 || lseek(data, READ_START, SEEK_SET) != READ_START) {
        perror(DATA_FILE);
        return 2;
    }
    int devnull = open_dev("/dev/null", O_WRONLY);
    int devzero = open_dev("/dev/zero", O_RDONLY);
    int devrandom = open_dev("/dev/urandom", O_RDONLY);

    /* thread-local variables in 2 threads (created with SIGUSR2, SIGRTMIN+1 blocked) */
    pthread_t th[2];
    for (long i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, tls_thread, (void *)i);

    struct itimerval it = {{0, TIMER_MS * 1000}, {0, TIMER_MS * 1000}};
    setitimer(ITIMER_REAL, &it, NULL);

    uint64_t h = 0;
    size_t pos = READ_START;
    long bad_reads = 0, lost_pending = 0;
    for (long s = 0; s < steps; s++) {
        uint8_t chunk[READ_CHUNK];
        ssize_t n = read(data, chunk, sizeof chunk);
        if (n != READ_CHUNK)
            bad_reads++;
        for (ssize_t i = 0; i < n; i++) {
            if (chunk[i] != data_byte(pos + (size_t)i))
                bad_reads++;
            h = mix64(h ^ chunk[i]);
        }
        pos += READ_CHUNK;
        sigset_t pend;
        sigpending(&pend);
        if (!sigismember(&pend, SIGUSR2) || !sigismember(&pend, SIGRTMIN + 1))
            lost_pending++;
        sleep_ms(STEP_MS);
    }

    /* checks */
    if ((pid_t)syscall(SYS_getpid) != pid0)
        fail("pid changed from %d to %ld", pid0, (long)syscall(SYS_getpid));
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd) || strcmp(cwd, cwd0) != 0)
        fail("cwd is %s, expected %s", cwd, cwd0);
    mode_t m = umask(0);
    umask(m);
    if (m != 027)
        fail("umask is %03o, expected 027", (unsigned)m);
    struct rlimit rl1;
    getrlimit(RLIMIT_NOFILE, &rl1);
    if (rl1.rlim_cur != rl.rlim_cur || rl1.rlim_max != rl.rlim_max)
        fail("RLIMIT_NOFILE is %llu/%llu, expected %llu/%llu", (unsigned long long)rl1.rlim_cur,
             (unsigned long long)rl1.rlim_max, (unsigned long long)rl.rlim_cur,
             (unsigned long long)rl.rlim_max);
    if (bad_reads)
        fail("data file: %ld bad bytes or short reads (offset not restored?)", bad_reads);
    if (lseek(data, 0, SEEK_CUR) != (off_t)pos)
        fail("data file offset is %lld, expected %zu", (long long)lseek(data, 0, SEEK_CUR), pos);

    struct sigaction sa1;
    sigaction(SIGUSR2, NULL, &sa1);
    if (sa1.sa_sigaction != on_usr2 ||
        (sa1.sa_flags & (SA_SIGINFO | SA_RESTART | SA_ONSTACK)) !=
            (SA_SIGINFO | SA_RESTART | SA_ONSTACK) ||
        !sigismember(&sa1.sa_mask, SIGUSR1) || sigismember(&sa1.sa_mask, SIGTERM))
        fail("SIGUSR2 sigaction changed (flags %#x)", (unsigned)sa1.sa_flags);
    stack_t ss1;
    sigaltstack(NULL, &ss1);
    if (ss1.ss_sp != altstack || ss1.ss_size != sizeof altstack || ss1.ss_flags != 0)
        fail("alternate signal stack changed (sp %p size %zu flags %d)", ss1.ss_sp, ss1.ss_size,
             ss1.ss_flags);

    if (lost_pending)
        fail("blocked signals were not pending during %ld steps", lost_pending);
    sigset_t rt;
    sigemptyset(&rt);
    sigaddset(&rt, SIGRTMIN + 1);
    siginfo_t si;
    struct timespec zero = {0, 0};
    if (sigtimedwait(&rt, &si, &zero) != SIGRTMIN + 1)
        fail("queued SIGRTMIN+1 is no longer pending");
    else if (si.si_code != SI_QUEUE || si.si_value.sival_int != RT_VALUE)
        fail("queued SIGRTMIN+1 lost its siginfo (code %d value %d)", si.si_code,
             si.si_value.sival_int);
    if (usr2_count != 0)
        fail("SIGUSR2 handler ran %d times while blocked", (int)usr2_count);
    sigset_t usr2;
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    sigprocmask(SIG_UNBLOCK, &usr2, NULL); /* the handler runs here */
    if (usr2_count != 1)
        fail("SIGUSR2 handler ran %d times after unblocking, expected once", (int)usr2_count);
    if (usr2_bad_stack)
        fail("SIGUSR2 handler did not run on the alternate stack");
    if (usr2_bad_mask)
        fail("SIGUSR1 was not blocked in the SIGUSR2 handler (sa_mask lost)");
    if (usr2_bad_info)
        fail("SIGUSR2 siginfo is wrong (not SI_TKILL)");

    struct itimerval it1;
    getitimer(ITIMER_REAL, &it1);
    if (it1.it_interval.tv_sec != 0 || it1.it_interval.tv_usec != TIMER_MS * 1000)
        fail("interval timer changed: interval %lds %ldus", (long)it1.it_interval.tv_sec,
             (long)it1.it_interval.tv_usec);
    sig_atomic_t t0 = alrm_ticks;
    for (int i = 0; i < 50 && alrm_ticks - t0 < 3; i++)
        sleep_ms(STEP_MS);
    if (alrm_ticks - t0 < 3)
        fail("SIGALRM interval timer no longer fires (%d ticks in 500 ms)", (int)(alrm_ticks - t0));
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);

    for (int i = 0; i < 2; i++) {
        void *bad;
        pthread_join(th[i], &bad);
        if (bad)
            fail("thread %d: thread-local variable changed", i);
    }

    char z[16];
    memset(z, 1, sizeof z);
    check_dev(devnull, "/dev/null", 1, 3);
    check_dev(devzero, "/dev/zero", 1, 5);
    check_dev(devrandom, "/dev/urandom", 1, 9);
    if (write(devnull, "hello", 5) != 5)
        fail("write to /dev/null failed");
    int zeros = read(devzero, z, sizeof z) == sizeof z;
    for (size_t i = 0; i < sizeof z; i++)
        zeros &= z[i] == 0;
    if (!zeros)
        fail("read from /dev/zero failed");
    if (read(devrandom, z, sizeof z) != sizeof z)
        fail("read from /dev/urandom failed");

    return finish(h ^ (uint64_t)steps);
}
