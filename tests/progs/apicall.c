/* apicall: a program that asks for its own checkpoint through libckpt (plugins/libckpt/ckpt.h).
 *
 * A third of the way through its computation it calls ckpt_checkpoint(), with hooks registered.
 * Under ckpt it prints "checkpoint: resumed" when it goes on and "checkpoint: restarted" when it
 * is brought back from that checkpoint (and the matching hook ran exactly once); without ckpt,
 * ckpt_is_enabled() is 0 and ckpt_checkpoint() fails with ENOSYS, harmlessly. RESULT is the same
 * either way.
 *
 * Usage: apicall [SECONDS=4]
 */
#include "common.h"

#include "../../plugins/libckpt/ckpt.h"

static int before_calls, resume_calls, restart_calls;

static void before(void *arg) { (void)arg; before_calls++; }
static void resumed(void *arg) { (void)arg; resume_calls++; }
static void restarted(void *arg) { (void)arg; restart_calls++; }

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 4.0);
    int enabled = ckpt_is_enabled();
    printf("ckpt %s\n", enabled ? "enabled" : "disabled");
    fflush(stdout);
    ckpt_register_hooks(before, resumed, restarted, NULL);

    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        for (int k = 0; k < 1000; k++)
            h = mix64(h + (uint64_t)k);
        if (i == steps / 3) {
            int rc = ckpt_checkpoint();
            if (!enabled) {
                if (rc != -1 || errno != ENOSYS)
                    fail("without ckpt, ckpt_checkpoint returned %d (errno %d)", rc, errno);
            } else if (rc == 0) {
                printf("checkpoint: resumed\n");
                if (before_calls != 1 || resume_calls != 1 || restart_calls != 0)
                    fail("hooks ran %d/%d/%d times", before_calls, resume_calls, restart_calls);
            } else if (rc == 1) {
                printf("checkpoint: restarted\n");
                if (before_calls != 1 || resume_calls != 0 || restart_calls != 1)
                    fail("hooks ran %d/%d/%d times", before_calls, resume_calls, restart_calls);
            } else {
                fail("ckpt_checkpoint failed: %s", strerror(errno));
            }
            fflush(stdout);
        }
        sleep_ms(STEP_MS);
    }
    return finish(h);
}
