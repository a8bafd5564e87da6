/* exiters: a program that starts short multithreaded programs all the time (as a build or a
 * pipeline of threaded tools does), each ending while its threads run: half by returning from
 * main (exit_group from the main thread), half by exit from another thread. A checkpoint often
 * seizes one of them as it exits: its threads' ends wait for the checkpoint (their tracer) to
 * collect them, and its main thread's end for theirs. Before, the freeze could wait for such a
 * main thread for ever, and checkpoints failed ("PTRACE_SETSIGMASK: No such process").
 *
 * Each step starts two children of 3 spinning threads and waits for each; the parent checks
 * every exit status and folds them into RESULT.
 *
 * Usage: exiters [SECONDS=4]
 */
#include "common.h"

#include <pthread.h>
#include <sys/wait.h>

#define THREADS 3

static int status_of_child;

static void *spin(void *arg)
{
    (void)arg;
    for (volatile unsigned long i = 0;; i++)
        ;
    return NULL;
}

static void *ender(void *arg)
{
    (void)arg;
    usleep(300);
    exit(status_of_child);
}

/* The child: threads spinning, then the end, from main or from a thread. */
static void child(int status, int from_thread)
{
    status_of_child = status;
    pthread_t t;
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t, NULL, spin, NULL))
            _exit(100);
    if (from_thread) {
        if (pthread_create(&t, NULL, ender, NULL))
            _exit(101);
        for (;;)
            pause();
    }
    usleep(300);
    exit(status);
}

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        for (int k = 0; k < 2; k++) {
            int want = (int)((i * 2 + k) % 50);
            pid_t pid = fork();
            if (pid < 0) {
                fail("step %ld: fork: %s", i, strerror(errno));
                return finish(h);
            }
            if (pid == 0)
                child(want, k);
            int status;
            if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != want)
                fail("step %ld: child %d ended with status %#x, not exit %d", i, k, status, want);
            h = mix64(h ^ (uint64_t)status);
        }
        sleep_ms(STEP_MS);
    }
    return finish(h);
}
