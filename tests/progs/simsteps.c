/* simsteps: the commonest shape of a simulation's output: a log held open for appending, and a
 * new file written every step in the working directory.
 *
 * The program changes to WORKDIR, opens sim.log for appending once and keeps it; each step it
 * advances its state, writes out_NNNN.dat (open, write, close: between steps it holds none of
 * them), appends one line "step NNNN STATE" to the log and prints "step NNNN". A crash after a
 * checkpoint leaves files of steps after it, which the restarted program writes again. At the
 * end it reads every out_NNNN.dat and the log back by name: each file must hold what its step
 * wrote, and the log one line per step, in order (none lost, none twice). RESULT hashes the
 * files and the log.
 *
 * Usage: simsteps WORKDIR [SECONDS=5]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/stat.h>

#define WORDS 512      /* one out file: 4 KiB */
#define STEP_WAIT 5    /* steps of STEP_MS per simulation step */

static uint64_t words[WORDS], back[WORDS];

static void fill(uint64_t state)
{
    for (int k = 0; k < WORDS; k++)
        words[k] = mix64(state ^ (uint64_t)k);
}

static void log_line(char *buf, size_t size, long step, uint64_t state)
{
    snprintf(buf, size, "step %04ld %016llx\n", step, (unsigned long long)state);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: simsteps WORKDIR [SECONDS]\n");
        return 2;
    }
    if (chdir(argv[1]) != 0) {
        perror(argv[1]);
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 5.0) / STEP_WAIT;
    if (steps < 1)
        steps = 1;
    int log = open("sim.log", O_WRONLY | O_APPEND | O_CREAT | O_TRUNC, 0644);
    if (log < 0) {
        perror("sim.log");
        return 2;
    }
    uint64_t state = 0;
    char name[64], line[64];
    for (long i = 1; i <= steps; i++) {
        state = mix64(state ^ (uint64_t)i);
        fill(state);
        snprintf(name, sizeof name, "out_%04ld.dat", i);
        int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write_full(fd, words, sizeof words) != 0) {
            fail("write %s: %s", name, strerror(errno));
            return finish(0);
        }
        close(fd);
        log_line(line, sizeof line, i, state);
        if (write_full(log, line, strlen(line)) != 0) {
            fail("append to sim.log: %s", strerror(errno));
            return finish(0);
        }
        printf("step %04ld\n", i);
        sleep_ms(STEP_WAIT * STEP_MS);
    }
    close(log);

    /* Read everything back and recompute it. */
    uint64_t h = 0, s = 0;
    for (long i = 1; i <= steps; i++) {
        s = mix64(s ^ (uint64_t)i);
        fill(s);
        snprintf(name, sizeof name, "out_%04ld.dat", i);
        int fd = open(name, O_RDONLY);
        if (fd < 0 || read_full(fd, back, sizeof back) != 0 || memcmp(back, words, sizeof words) != 0) {
            fail("%s does not hold what step %ld wrote", name, i);
        }
        if (fd >= 0)
            close(fd);
        for (int k = 0; k < WORDS; k++)
            h = mix64(h ^ back[k]);
    }
    FILE *f = fopen("sim.log", "r");
    if (!f) {
        fail("open sim.log: %s", strerror(errno));
        return finish(h);
    }
    char got[256];
    long n = 0;
    s = 0;
    while (fgets(got, sizeof got, f)) {
        n++;
        s = mix64(s ^ (uint64_t)n);
        log_line(line, sizeof line, n, s);
        if (strcmp(got, line) != 0) {
            got[strcspn(got, "\n")] = line[strcspn(line, "\n")] = 0;
            fail("sim.log line %ld is \"%.40s\", expected \"%.40s\" (a step lost or logged twice)", n, got, line);
            break;
        }
        for (char *c = got; *c; c++)
            h = mix64(h ^ (uint64_t)(unsigned char)*c);
    }
    fclose(f);
    if (n != steps && failures == 0)
        fail("sim.log has %ld lines for %ld steps", n, steps);
    return finish(h);
}
