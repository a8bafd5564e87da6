/* copylater: a program that must not notice memory being copied after a checkpoint's release.
 *
 * A checkpoint copies private memory from a copy of the process it forks while the job is
 * frozen, and ends that copy once done. The program must never see it: no SIGCHLD, no child
 * in waitpid(-1) other than its own, no descriptor of its kept open by the copy (it closes the
 * write end of a pipe and expects EOF at the read end at once), and the memory stored must be
 * the memory at the freeze however fast it is rewritten afterwards.
 *
 * It keeps one child of its own (sleeping), a 64 MiB heap rewritten one 1 MiB block per step
 * (each block holds its step number and a hash; a running sum of the heap's words is kept in a
 * variable), and a pipe opened and written each step, closed and drained the next. PASS when, at the end,
 * no SIGCHLD came before it killed its child, waitpid(-1, WNOHANG) never returned another
 * child, every pipe read saw EOF, and the running sum matches the heap.
 *
 * Usage: copylater SECONDS
 */
#include "common.h"
#include <signal.h>
#include <sys/wait.h>

#define HEAP_MIB 64
#define BLOCK_WORDS ((1 << 20) / 8)

static volatile sig_atomic_t sigchld;

static void on_sigchld(int sig)
{
    (void)sig;
    sigchld++;
}

int main(int argc, char **argv)
{
    long seconds = argc > 1 ? atol(argv[1]) : 5;
    long steps = seconds * 1000 / STEP_MS;
    setvbuf(stdout, NULL, _IOLBF, 0);

    struct sigaction sa = { .sa_handler = on_sigchld, .sa_flags = SA_RESTART };
    sigaction(SIGCHLD, &sa, NULL);
    pid_t own = fork();
    if (own == 0) {
        for (;;)
            pause();
    }
    size_t words = (size_t)HEAP_MIB * BLOCK_WORDS;
    uint64_t *heap = calloc(words, sizeof *heap);
    if (!heap) {
        printf("FAIL calloc\n");
        return 1;
    }
    uint64_t sum = 0;
    printf("START\n");
    char *why = NULL;
    int prev[2] = { -1, -1 };
    for (long step = 0; step < steps && !why; step++) {
        uint64_t *block = heap + (size_t)(step % HEAP_MIB) * BLOCK_WORDS;
        for (size_t i = 0; i < BLOCK_WORDS; i++) {
            uint64_t v = mix64((uint64_t)step * BLOCK_WORDS + i);
            sum += v - block[i];
            block[i] = v;
        }
        int status;
        pid_t w = waitpid(-1, &status, WNOHANG);
        if (w != 0)
            why = "waitpid(-1) returned a child that is not its own, or lost its own";
        if (sigchld)
            why = "a SIGCHLD came while its only child lives";
        /* A pipe opened each step, its write end closed the next: a checkpoint always finds
         * one open. Once closed here, no one else holds it: the byte, then EOF at once. */
        int p[2];
        if (pipe(p) != 0) {
            why = "pipe";
            break;
        }
        char c = 'x', got[2];
        if (write(p[1], &c, 1) != 1)
            why = "pipe write";
        if (prev[0] >= 0) {
            close(prev[1]);
            struct pollfd pfd = { .fd = prev[0], .events = POLLIN };
            if (read(prev[0], got, 2) != 1 || poll(&pfd, 1, 0) != 1 || read(prev[0], got, 1) != 0)
                why = "the write end of a pipe it closed was still open elsewhere";
            close(prev[0]);
        }
        prev[0] = p[0];
        prev[1] = p[1];
        sleep_ms(STEP_MS);
    }
    kill(own, SIGKILL);
    int status;
    if (!why && waitpid(own, &status, 0) != own)
        why = "its own child could not be waited for";
    uint64_t check = 0;
    for (size_t i = 0; i < words; i++)
        check += heap[i];
    if (!why && check != sum)
        why = "the heap does not match its running sum (memory copied after the freeze?)";
    uint64_t h = 0;
    for (size_t i = 0; i < words; i += 4096)
        h = mix64(h ^ heap[i]);
    printf("RESULT %016llx\n", (unsigned long long)h);
    if (why)
        printf("FAIL %s\n", why);
    else
        printf("PASS\n");
    return why != NULL;
}
