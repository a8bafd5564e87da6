/* eintr: blocking calls that Linux ends with EINTR when their thread is stopped, even though no
 * signal handler runs (signal(7), "Interruption of system calls and library functions by stop
 * signals"), must not see a checkpoint's freeze or a restart.
 *
 * One thread per call waits, again and again, with a short timeout on something that never
 * comes:
 *  - epoll_wait and epoll_pwait on an idle eventfd;
 *  - semtimedop on a System V semaphore that stays at 0;
 *  - sigtimedwait on a blocked signal nobody sends;
 *  - recv on a socket pair, and accept on a listening socket, each with SO_RCVTIMEO;
 *  - send on a socket pair whose queue is full, with SO_SNDTIMEO.
 * And the calls a restart cannot continue where they were (their remaining time is the old
 * process's kernel state), which must be made again rather than fail:
 *  - nanosleep and clock_nanosleep (relative, CLOCK_MONOTONIC);
 *  - sleeps of 3 s as sleep(3) makes them (the time left written back into the request), each
 *    cut short by several checkpoints: from the second on, the thread is resuming the sleep
 *    (restart_syscall), and a restart caught there must still make it again;
 *  - a futex wait with a timeout on a word that stays 0;
 *  - poll on the idle eventfd.
 * Each expects a timeout (0 or EAGAIN) every time. EINTR, any other error, or a timeout that
 * comes before the time asked for (epoll, semtimedop, sigtimedwait) is counted and printed as a
 * FAIL line. RESULT folds the names of the calls that timed out as they should at least once
 * (every call, in a run that is right); PASS when nothing was counted.
 *
 * Usage: eintr [SECONDS=5]
 */
#include "common.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ipc.h>
#include <sys/sem.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <linux/futex.h>
#include <sys/syscall.h>

#define WAIT_MS 30

static atomic_int stop;
static int epfd, semid, recv_fd, listen_fd, send_fd;
static pthread_mutex_t failing = PTHREAD_MUTEX_INITIALIZER;

static void failed(const char *call, const char *why)
{
    pthread_mutex_lock(&failing);
    fail("%s: %s", call, why);
    pthread_mutex_unlock(&failing);
}

/* The calls that timed out as they should at least once (RESULT folds them). */
static const char *timed_out[16];
static int n_timed_out;

static void timed_out_once(const char *call)
{
    pthread_mutex_lock(&failing);
    int seen = 0;
    for (int i = 0; i < n_timed_out; i++)
        seen |= strcmp(timed_out[i], call) == 0;
    if (!seen && n_timed_out < 16)
        timed_out[n_timed_out++] = call;
    pthread_mutex_unlock(&failing);
}

/* Checks one wait's outcome: `rc` < 0 with errno, or the number of events (0: timed out). */
static void check(const char *call, long rc, int err, int64_t started_ns, int strict_time)
{
    if (rc < 0 && err != EAGAIN && err != ETIMEDOUT) {
        failed(call, strerror(err));
        return;
    }
    if (rc > 0) {
        failed(call, "woken with nothing to wake it");
        return;
    }
    int64_t waited_ns = now_ns(CLOCK_MONOTONIC) - started_ns;
    /* A timeout never comes early; a frozen or restarted thread's waits only get longer. */
    if (strict_time && waited_ns < (int64_t)(WAIT_MS - 1) * 1000000LL) {
        char why[64];
        snprintf(why, sizeof why, "timed out after %lld us of %d ms", (long long)(waited_ns / 1000), WAIT_MS);
        failed(call, why);
        return;
    }
    timed_out_once(call);
}

static void *epoll_waiter(void *arg)
{
    int with_mask = arg != NULL;
    sigset_t mask;
    sigemptyset(&mask);
    while (!atomic_load(&stop)) {
        struct epoll_event ev;
        int64_t t0 = now_ns(CLOCK_MONOTONIC);
        int rc = with_mask ? epoll_pwait(epfd, &ev, 1, WAIT_MS, &mask) : epoll_wait(epfd, &ev, 1, WAIT_MS);
        check(with_mask ? "epoll_pwait" : "epoll_wait", rc, errno, t0, 1);
    }
    return NULL;
}

static void *sem_waiter(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        struct sembuf take = {.sem_num = 0, .sem_op = -1, .sem_flg = 0};
        struct timespec timeout = {.tv_sec = 0, .tv_nsec = WAIT_MS * 1000000L};
        int64_t t0 = now_ns(CLOCK_MONOTONIC);
        int rc = semtimedop(semid, &take, 1, &timeout);
        check("semtimedop", rc, errno, t0, 1);
    }
    return NULL;
}

static void *sig_waiter(void *arg)
{
    (void)arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    while (!atomic_load(&stop)) {
        struct timespec timeout = {.tv_sec = 0, .tv_nsec = WAIT_MS * 1000000L};
        int64_t t0 = now_ns(CLOCK_MONOTONIC);
        int rc = sigtimedwait(&set, NULL, &timeout);
        check("sigtimedwait", rc, errno, t0, 1);
    }
    return NULL;
}

static void *recv_waiter(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        char c;
        int64_t t0 = now_ns(CLOCK_MONOTONIC);
        long rc = recv(recv_fd, &c, 1, 0);
        /* SO_RCVTIMEO counts in jiffies: no sub-millisecond promise on its length. */
        check("recv (SO_RCVTIMEO)", rc, errno, t0, 0);
    }
    return NULL;
}

static void *send_waiter(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        char c = 'x';
        int64_t t0 = now_ns(CLOCK_MONOTONIC);
        long rc = send(send_fd, &c, 1, 0);
        /* The queue is full and nobody reads: a send times out (EAGAIN). A queue put back by
         * a restart holds its bytes in fewer buffers, with room for a few more: a send that
         * goes through is no failure (the next ones wait again). */
        if (rc != 1)
            check("send (SO_SNDTIMEO)", rc, errno, t0, 0);
    }
    return NULL;
}

static void *accept_waiter(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        int64_t t0 = now_ns(CLOCK_MONOTONIC);
        int rc = accept(listen_fd, NULL, NULL);
        check("accept (SO_RCVTIMEO)", rc, errno, t0, 0);
    }
    return NULL;
}

static void *sleeper(void *arg)
{
    int clock_call = arg != NULL;
    while (!atomic_load(&stop)) {
        struct timespec t = {.tv_sec = 0, .tv_nsec = WAIT_MS * 1000000L};
        int64_t t0 = now_ns(CLOCK_MONOTONIC);
        if (clock_call) {
            int rc = clock_nanosleep(CLOCK_MONOTONIC, 0, &t, NULL);
            check("clock_nanosleep", rc ? -1 : 0, rc, t0, 1);
        } else {
            int rc = nanosleep(&t, NULL);
            check("nanosleep", rc, errno, t0, 1);
        }
    }
    return NULL;
}

#define LONG_SLEEP_S 3

static void *long_sleeper(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        struct timespec t = {.tv_sec = LONG_SLEEP_S, .tv_nsec = 0};
        int64_t t0 = now_ns(CLOCK_MONOTONIC);
        if (nanosleep(&t, &t) != 0) {
            failed("nanosleep (long)", strerror(errno));
            continue;
        }
        int64_t waited_ms = (now_ns(CLOCK_MONOTONIC) - t0) / 1000000;
        if (waited_ms < LONG_SLEEP_S * 1000 - 1) {
            char why[64];
            snprintf(why, sizeof why, "slept %lld ms of %d s", (long long)waited_ms, LONG_SLEEP_S);
            failed("nanosleep (long)", why);
        }
    }
    return NULL;
}

static void *futex_waiter(void *arg)
{
    (void)arg;
    static uint32_t word;
    while (!atomic_load(&stop)) {
        struct timespec t = {.tv_sec = 0, .tv_nsec = WAIT_MS * 1000000L};
        int64_t t0 = now_ns(CLOCK_MONOTONIC);
        long rc = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &t, NULL, 0);
        check("futex wait", rc, errno, t0, 1);
    }
    return NULL;
}

static void *poller(void *arg)
{
    int fd = (int)(intptr_t)arg;
    while (!atomic_load(&stop)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int64_t t0 = now_ns(CLOCK_MONOTONIC);
        int rc = poll(&p, 1, WAIT_MS);
        check("poll", rc, errno, t0, 1);
    }
    return NULL;
}

static void set_rcvtimeo(int fd)
{
    struct timeval tv = {.tv_sec = 0, .tv_usec = WAIT_MS * 1000};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) {
        perror("setsockopt SO_RCVTIMEO");
        exit(2);
    }
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);

    /* SIGUSR2 is blocked in every thread: sigtimedwait takes it, were it ever sent. */
    sigset_t usr2;
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &usr2, NULL);

    epfd = epoll_create1(0);
    int idle = eventfd(0, 0);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 1};
    if (epfd < 0 || idle < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, idle, &ev) != 0) {
        perror("epoll");
        return 2;
    }
    semid = semget(IPC_PRIVATE, 1, 0600);
    if (semid < 0) {
        perror("semget");
        return 2;
    }
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) {
        perror("socketpair");
        return 2;
    }
    recv_fd = pair[0];
    set_rcvtimeo(recv_fd);
    listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    /* An abstract name the kernel makes up (autobind: the family alone), unique on the machine
     * (a pid is not: a job's pid namespace numbers from 1), and nothing on the file system to
     * clean up. */
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&addr, sizeof(sa_family_t)) != 0 || listen(listen_fd, 1) != 0) {
        perror("listen");
        return 2;
    }
    set_rcvtimeo(listen_fd);
    /* A pair whose queue is filled (without blocking) and never read. */
    int full[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, full) != 0) {
        perror("socketpair");
        return 2;
    }
    send_fd = full[0];
    char chunk[4096] = {0};
    while (send(send_fd, chunk, sizeof chunk, MSG_DONTWAIT) > 0)
        ;
    while (send(send_fd, chunk, 1, MSG_DONTWAIT) > 0)
        ;
    struct timeval tv = {.tv_sec = 0, .tv_usec = WAIT_MS * 1000};
    if (setsockopt(send_fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
        perror("setsockopt SO_SNDTIMEO");
        return 2;
    }

    void *(*waiters[])(void *) = {epoll_waiter, epoll_waiter, sem_waiter, sig_waiter, recv_waiter, accept_waiter,
                                  sleeper, sleeper, futex_waiter, poller, send_waiter, long_sleeper};
    void *args[] = {NULL, (void *)1, NULL, NULL, NULL, NULL, NULL, (void *)1, NULL, (void *)(intptr_t)idle, NULL, NULL};
    enum { N = sizeof waiters / sizeof waiters[0] };
    pthread_t threads[N];
    for (int i = 0; i < N; i++)
        pthread_create(&threads[i], NULL, waiters[i], args[i]);

    for (long s = 0; s < steps; s++)
        sleep_ms(STEP_MS);
    atomic_store(&stop, 1);
    for (int i = 0; i < N; i++)
        pthread_join(threads[i], NULL);
    semctl(semid, 0, IPC_RMID);

    /* In name order: the threads' first timeouts come in any order. */
    uint64_t h = mix64((uint64_t)N * 1000 + WAIT_MS);
    for (int i = 0; i < n_timed_out; i++)
        for (int j = i + 1; j < n_timed_out; j++)
            if (strcmp(timed_out[j], timed_out[i]) < 0) {
                const char *t = timed_out[i];
                timed_out[i] = timed_out[j];
                timed_out[j] = t;
            }
    for (int i = 0; i < n_timed_out; i++)
        for (const char *c = timed_out[i]; *c; c++)
            h = mix64(h ^ (uint64_t)(unsigned char)*c);
    return finish(h);
}
