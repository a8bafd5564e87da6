/* mainexit: a process whose main thread has exited (pthread_exit in main) while another
 * thread runs on. /proc shows such a process as a zombie; a restart cannot make a process
 * whose main thread is gone, so ckpt refuses the checkpoint, naming the process, rather than
 * record a zombie (before, it did, and let the live thread run through the capture). The job
 * goes on and finishes.
 *
 * Usage: mainexit [SECONDS=5]
 */
#include "common.h"

#include <pthread.h>

static long steps;

static void *worker(void *arg)
{
    (void)arg;
    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        h = mix64(h ^ (uint64_t)i);
        sleep_ms(STEP_MS);
    }
    exit(finish(h));
}

int main(int argc, char **argv)
{
    start_marker();
    steps = steps_arg(argc, argv, 1, 5.0);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL)) {
        printf("setup: pthread_create failed\n");
        return 2;
    }
    pthread_exit(NULL);
}
