/* Workloads of `ckpt bench` (docs/PERFORMANCE.md). Compiled by the benchmark with gcc -O2.
 *
 *   workload heap MIB rand|comp [NPROC]   NPROC processes (forked; default 1), each with MIB MiB
 *                                         of heap: incompressible (xorshift) or compressible
 *                                         (zstd about 4-8:1; never all-zero pages, which the
 *                                         capture leaves out)
 *   workload maps COUNT PAGES             COUNT separate mappings of PAGES pages each, of
 *                                         alternating protection so that none merge
 *   workload compute MIB ITERS            ITERS passes of arithmetic over 1 MiB blocks of a
 *                                         MIB MiB array; prints "p ITERS CLOCK_MONOTONIC" as it
 *                                         goes and "done SECONDS" at the end
 *   workload calibrate MIB                prints "ITERS_PER_SECOND" of the compute loop
 *   workload sockets PAIRS QUEUED_KIB     PAIRS idle Unix socketpairs (stream, datagram and
 *                                         seqpacket in turn), and with QUEUED_KIB > 0 one more
 *                                         stream pair with that much written and not read
 *   workload slices MIB SLICE_MIB         MIB MiB of incompressible heap, of which the next
 *                                         SLICE_MIB slice in turn is rewritten with fresh
 *                                         random words every 125 ms, forever, without output:
 *                                         with SLICE_MIB = MIB / 128 a sixteenth of the heap a
 *                                         second (issue 14's increment: 64 MiB of 1 GiB)
 *   workload shared MIB private|anon|posix
 *                                         MIB MiB of incompressible memory in a process and its
 *                                         child: private to the first (anonymous), or shared by
 *                                         both (MAP_SHARED|MAP_ANONYMOUS, or POSIX shared memory
 *                                         under /dev/shm, kept by its name); the first then
 *                                         rewrites the next 1 MiB in turn every 125 ms, forever
 *
 * Every mode but calibrate prints "ready ADDR LEN" (address and length of its first data area)
 * once its memory is filled. heap and maps then write "t\n" to stdout every 5 ms, forever:
 * the benchmark times a restart as the time until the first "t" of the restarted job.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t xs = 88172645463325252ull;
static uint64_t next_rand(void)
{
    xs ^= xs << 13;
    xs ^= xs >> 7;
    xs ^= xs << 17;
    return xs;
}

/* Compressible but not trivial: words drawn from a small vocabulary, with slowly changing
 * counters, like the arrays of a simulation or an interpreter's heap. */
static void fill_comp(uint64_t *p, size_t words)
{
    static const uint64_t vocab[16] = {
        0x0000000000000001ull, 0x3ff0000000000000ull, 0x4000000000000000ull, 0x00007f3a12c04000ull,
        0x00007f3a12c04040ull, 0x6c6c6568206f6c6cull, 0x0a646c726f77202cull, 0xffffffffffffffffull,
        0x0000000100000002ull, 0x3fe0000000000000ull, 0x0000557e3c2a1000ull, 0x7461642e6f666e69ull,
        0x0000000000001000ull, 0x00000000deadbeefull, 0x4059000000000000ull, 0x000000000000002aull,
    };
    for (size_t i = 0; i < words; i++) {
        uint64_t r = next_rand();
        if ((r & 7) < 5)
            p[i] = vocab[(r >> 8) & 15];
        else if ((r & 7) < 7)
            p[i] = i >> 4;
        else
            p[i] = r & 0xffff;
    }
}

static void fill_rand(uint64_t *p, size_t words)
{
    for (size_t i = 0; i < words; i++)
        p[i] = next_rand();
}

static void *map_anon(size_t len, int prot)
{
    void *p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return p;
}

static void tick_forever(void)
{
    struct timespec d = {0, 5 * 1000 * 1000};
    for (;;) {
        if (write(1, "t\n", 2) < 0) {
            /* stdout gone: keep the memory alive anyway */
        }
        nanosleep(&d, NULL);
    }
}

static int heap(size_t mib, int comp, int nproc)
{
    size_t len = mib << 20;
    int ready[2];
    if (pipe(ready) < 0)
        return 1;
    for (int k = 1; k < nproc; k++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the main process */
            xs ^= (uint64_t)k * 0x9e3779b97f4a7c15ull;
            uint64_t *p = map_anon(len, PROT_READ | PROT_WRITE);
            (comp ? fill_comp : fill_rand)(p, len / 8);
            if (write(ready[1], "r", 1) != 1)
                _exit(1);
            close(ready[0]);
            close(ready[1]);
            for (;;)
                pause();
        }
    }
    uint64_t *p = map_anon(len, PROT_READ | PROT_WRITE);
    (comp ? fill_comp : fill_rand)(p, len / 8);
    for (int k = 1; k < nproc; k++) {
        char c;
        if (read(ready[0], &c, 1) != 1)
            return 1;
    }
    close(ready[0]);
    close(ready[1]);
    printf("ready %p %zu\n", (void *)p, len);
    fflush(stdout);
    tick_forever();
    return 0;
}

static int maps(long count, long pages)
{
    size_t len = (size_t)pages * 4096;
    void *first = NULL;
    for (long i = 0; i < count; i++) {
        uint64_t *p = map_anon(len, PROT_READ | PROT_WRITE);
        fill_rand(p, len / 8);
        if (i % 2)
            mprotect(p, len, PROT_READ);
        if (!first)
            first = p;
    }
    printf("ready %p %zu\n", first, len);
    fflush(stdout);
    tick_forever();
    return 0;
}

static uint64_t compute_pass(uint64_t *p, size_t words, uint64_t seed)
{
    uint64_t acc = seed;
    for (size_t i = 0; i < words; i++) {
        uint64_t x = p[i] ^ acc;
        x *= 0x9e3779b97f4a7c15ull;
        x ^= x >> 29;
        x *= 0xbf58476d1ce4e5b9ull;
        x ^= x >> 32;
        p[i] = x;
        acc += x;
    }
    return acc;
}

/* One iteration: one pass over the next 1 MiB block of the array. With `progress`, prints
 * "p ITERATIONS CLOCK_MONOTONIC" every 32 iterations, from which the benchmark measures the time
 * lost around each checkpoint against the loop's own speed just before and after it. */
static double run_compute(uint64_t *p, size_t len, long iters, uint64_t *acc, int progress)
{
    size_t block = 1 << 20, blocks = len / block;
    double t0 = now();
    for (long it = 0; it < iters; it++) {
        *acc += compute_pass(p + (it % blocks) * (block / 8), block / 8, *acc);
        if (progress && it % 32 == 31)
            dprintf(1, "p %ld %.6f\n", it + 1, now());
    }
    return now() - t0;
}

static int compute(size_t mib, long iters)
{
    size_t len = mib << 20;
    uint64_t *p = map_anon(len, PROT_READ | PROT_WRITE);
    fill_rand(p, len / 8);
    uint64_t acc = 0;
    printf("ready %p %zu\n", (void *)p, len);
    fflush(stdout);
    double t = run_compute(p, len, iters, &acc, 1);
    printf("done %.6f %llx\n", t, (unsigned long long)acc);
    fflush(stdout);
    return 0;
}

static int calibrate(size_t mib)
{
    size_t len = mib << 20;
    uint64_t *p = map_anon(len, PROT_READ | PROT_WRITE);
    fill_rand(p, len / 8);
    uint64_t acc = 0;
    long iters = 64;
    double t;
    while ((t = run_compute(p, len, iters, &acc, 0)) < 1.0)
        iters *= 2;
    printf("%.1f\n", iters / t);
    return 0;
}

/* Sockets that hold nothing: what draining must not pay for (issue 4). */
static int sockets(long pairs, long queued_kib)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    static const int types[3] = {SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET};
    for (long i = 0; i < pairs; i++) {
        int sv[2];
        if (socketpair(AF_UNIX, types[i % 3], 0, sv) < 0) {
            perror("socketpair (is the descriptor limit high enough?)");
            return 1;
        }
    }
    if (queued_kib > 0) {
        int sv[2];
        size_t len = (size_t)queued_kib << 10;
        /* The sender's buffer bounds what a stream pair can hold unread. */
        int room = (int)(len + (len >> 1) + (64 << 10));
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0 ||
            setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &room, sizeof room) < 0) {
            perror("queued socketpair");
            return 1;
        }
        char *buf = malloc(len);
        fill_rand((uint64_t *)buf, len / 8);
        for (size_t off = 0; off < len;) {
            ssize_t n = send(sv[0], buf + off, len - off, MSG_DONTWAIT);
            if (n <= 0) {
                perror("fill the queued socketpair");
                return 1;
            }
            off += (size_t)n;
        }
        free(buf);
    }
    size_t len = 1 << 20;
    uint64_t *p = map_anon(len, PROT_READ | PROT_WRITE);
    fill_rand(p, len / 8);
    printf("ready %p %zu\n", (void *)p, len);
    fflush(stdout);
    tick_forever();
    return 0;
}

/* Memory that changes at a steady rate, so that an incremental generation has a known amount
 * to store: the rewrites keep to absolute times, so the time one takes, or a freeze, does not
 * slow the rate down. */
/* Rewrites the next `slice` bytes of `p` (of `len`) in turn with fresh random words every
 * 125 ms, forever. */
__attribute__((noreturn)) static void rewrite_slices_forever(uint64_t *p, size_t len, size_t slice)
{
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (size_t off = 0;; off = off + 2 * slice <= len ? off + slice : 0) {
        next.tv_nsec += 125 * 1000 * 1000;
        if (next.tv_nsec >= 1000 * 1000 * 1000) {
            next.tv_sec++;
            next.tv_nsec -= 1000 * 1000 * 1000;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        fill_rand(p + off / 8, slice / 8);
    }
}

static int slices(size_t mib, size_t slice_mib)
{
    size_t len = mib << 20, slice = slice_mib << 20;
    if (slice == 0 || slice > len) {
        fprintf(stderr, "slices: SLICE_MIB must be between 1 and MIB\n");
        return 2;
    }
    uint64_t *p = map_anon(len, PROT_READ | PROT_WRITE);
    fill_rand(p, len / 8);
    printf("ready %p %zu\n", (void *)p, len);
    fflush(stdout);
    rewrite_slices_forever(p, len, slice);
}

static int shared(size_t mib, const char *kind)
{
    size_t len = mib << 20;
    uint64_t *p;
    if (!strcmp(kind, "private")) {
        p = map_anon(len, PROT_READ | PROT_WRITE);
    } else if (!strcmp(kind, "anon")) {
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    } else if (!strcmp(kind, "posix")) {
        char name[64];
        snprintf(name, sizeof name, "/ckpt-bench-%d", (int)getpid());
        int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)len)) {
            perror("shm_open");
            return 1;
        }
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        /* (A checkpoint saves the file by its name: it stays while the job runs; the
         * benchmark removes /dev/shm/ckpt-bench-* when it ends.) */
    } else {
        fprintf(stderr, "shared: KIND is private, anon or posix\n");
        return 2;
    }
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    fill_rand(p, len / 8);
    pid_t child = fork();
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;)
            pause();
    }
    printf("ready %p %zu\n", (void *)p, len);
    fflush(stdout);
    size_t slice = 1 << 20;
    rewrite_slices_forever(p, len, slice);
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "heap"))
        return heap(atol(argv[2]), !strcmp(argv[3], "comp"), argc > 4 ? atoi(argv[4]) : 1);
    if (argc == 4 && !strcmp(argv[1], "maps"))
        return maps(atol(argv[2]), atol(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "compute"))
        return compute(atol(argv[2]), atol(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "sockets"))
        return sockets(atol(argv[2]), atol(argv[3]));
    if (argc == 3 && !strcmp(argv[1], "calibrate"))
        return calibrate(atol(argv[2]));
    if (argc == 4 && !strcmp(argv[1], "slices"))
        return slices(atol(argv[2]), atol(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "shared"))
        return shared(atol(argv[2]), argv[3]);
    fprintf(stderr, "usage: workload heap MIB rand|comp [NPROC] | maps COUNT PAGES | compute MIB ITERS | calibrate MIB"
                    " | sockets PAIRS QUEUED_KIB | slices MIB SLICE_MIB | shared MIB private|anon|posix\n");
    return 2;
}
