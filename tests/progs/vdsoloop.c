/* vdsoloop: a program that spends its time in the vdso, as programs reading the clock in a loop
 * do, for restarts on a kernel whose vdso differs from the one it started with.
 *
 * A second thread calls clock_gettime (CLOCK_MONOTONIC and CLOCK_REALTIME), gettimeofday, time
 * and getcpu without pause, so that a checkpoint often finds it stopped inside the vdso's code
 * (the capture steps it out). glibc calls these through the addresses of the vdso functions it
 * read at start, which a restart on another kernel keeps valid with jumps at the old place.
 * The main thread does the same once a step. A FAIL line says when CLOCK_MONOTONIC went back,
 * when CLOCK_REALTIME, gettimeofday and time disagree by more than MAX_SKEW_MS, or when getcpu
 * names a CPU the machine does not have.
 *
 * At the end it prints "VDSO same" when /proc/self/maps shows [vdso] where AT_SYSINFO_EHDR said
 * it was at start, "VDSO moved" otherwise (the new kernel's vdso parked elsewhere).
 *
 * RESULT depends only on the number of steps.
 *
 * Usage: vdsoloop [SECONDS=5]
 */
#include "common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/auxv.h>
#include <sys/time.h>

#define MAX_SKEW_MS 2000
#define MAX_REPORTS 10

static atomic_int done;
static atomic_long spins;
static atomic_int reports;
static long cpus;

#define report(...)                                                                                \
    do {                                                                                           \
        if (atomic_fetch_add(&reports, 1) < MAX_REPORTS)                                           \
            fail(__VA_ARGS__);                                                                     \
        else                                                                                       \
            failures++;                                                                            \
    } while (0)

/* One round of every vdso call; `last_mono` is the caller's previous CLOCK_MONOTONIC. */
static void one_round(const char *who, int64_t *last_mono)
{
    struct timespec mono, real;
    struct timeval tv;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    clock_gettime(CLOCK_REALTIME, &real);
    gettimeofday(&tv, NULL);
    time_t t = time(NULL);
    int cpu = sched_getcpu();

    int64_t mono_ns = (int64_t)mono.tv_sec * 1000000000LL + mono.tv_nsec;
    if (mono_ns < *last_mono)
        report("%s: CLOCK_MONOTONIC went back by %lld ns", who, (long long)(*last_mono - mono_ns));
    *last_mono = mono_ns;
    int64_t real_ms = (int64_t)real.tv_sec * 1000LL + real.tv_nsec / 1000000LL;
    int64_t tod_ms = (int64_t)tv.tv_sec * 1000LL + tv.tv_usec / 1000LL;
    if (llabs(tod_ms - real_ms) > MAX_SKEW_MS)
        report("%s: gettimeofday and CLOCK_REALTIME differ by %lld ms", who, (long long)(tod_ms - real_ms));
    if (llabs((int64_t)t * 1000LL - real_ms) > MAX_SKEW_MS)
        report("%s: time() and CLOCK_REALTIME differ by %lld ms", who, (long long)((int64_t)t * 1000LL - real_ms));
    if (cpu < 0 || cpu >= cpus)
        report("%s: getcpu says CPU %d of %ld", who, cpu, cpus);
}

static void *spinner(void *arg)
{
    (void)arg;
    int64_t last = 0;
    while (!atomic_load(&done)) {
        one_round("spinner", &last);
        atomic_fetch_add(&spins, 1);
    }
    return NULL;
}

/* The start of the [vdso] mapping /proc/self/maps shows now; 0 if none. */
static unsigned long vdso_now(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    unsigned long start = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "[vdso]"))
            start = strtoul(line, NULL, 16);
    if (f)
        fclose(f);
    return start;
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    cpus = sysconf(_SC_NPROCESSORS_CONF);
    unsigned long vdso_at_start = getauxval(AT_SYSINFO_EHDR);

    pthread_t th;
    if (pthread_create(&th, NULL, spinner, NULL) != 0) {
        perror("pthread_create");
        return 2;
    }
    int64_t last = 0;
    for (long s = 0; s < steps; s++) {
        sleep_ms(STEP_MS);
        one_round("main", &last);
    }
    atomic_store(&done, 1);
    pthread_join(th, NULL);
    if (atomic_load(&spins) == 0)
        report("the spinning thread never ran");

    printf("VDSO %s\n", vdso_now() == vdso_at_start ? "same" : "moved");
    return finish(mix64((uint64_t)steps));
}
