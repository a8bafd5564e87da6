/* seccomp: a process in a seccomp sandbox (an allow-everything filter, installed after
 * no_new_privs). ckpt refuses to checkpoint it rather than bring it back without its sandbox;
 * the job goes on and finishes.
 *
 * Usage: seccomp [SECONDS=5]
 */
#include "common.h"

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>

int main(int argc, char **argv)
{
    start_marker();
    long steps = steps_arg(argc, argv, 1, 5.0);
    struct sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    struct sock_fprog prog = {.len = 1, .filter = allow};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        printf("setup failed: %s\n", strerror(errno));
        return 2;
    }
    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        h = mix64(h ^ (uint64_t)i);
        sleep_ms(STEP_MS);
    }
    return finish(h);
}
