/* unlinked: what a job holds after its name was removed must come back nameless: a FIFO
 * unlinked while open (with bytes in flight, its ends held by two processes) and a working
 * directory that was removed.
 *
 * Every step reads from the FIFO the number it wrote at the step before and writes the next
 * (so a number is always in flight), checks that the working directory is still the removed one
 * (getcwd fails with ENOENT, "." has no links) and that no name came back in DIR. A child holds
 * both ends of the FIFO too, and its own removed working directory, and checks the same.
 * Prints PASS or FAIL <what>.
 *
 * Usage: unlinked DIR [SECONDS=5]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>

#pragma GCC diagnostic ignored "-Wformat-truncation"

static const char *dir;

static void check_cwd(const char *who, long step)
{
    char buf[512];
    struct stat st;
    if (getcwd(buf, sizeof buf) != NULL || errno != ENOENT)
        fail("%s step %ld: the working directory is reachable again (%s)", who, step, buf);
    if (stat(".", &st) != 0 || !S_ISDIR(st.st_mode) || st.st_nlink != 0)
        fail("%s step %ld: the working directory is not a removed directory", who, step);
}

static void check_no_names(const char *who, long step)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            fail("%s step %ld: %s/%s is there again", who, step, dir, e->d_name);
    if (d)
        closedir(d);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: unlinked DIR [SECONDS]\n");
        return 2;
    }
    dir = argv[1];
    long steps = steps_arg(argc, argv, 2, 5.0);
    char p[512];
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return printf("FAIL set-up: mkdir %s\n", dir), 1;
    snprintf(p, sizeof p, "%s/fifo", dir);
    if (mkfifo(p, 0600) != 0)
        return printf("FAIL set-up: mkfifo\n"), 1;
    int r = open(p, O_RDONLY | O_NONBLOCK), w = open(p, O_WRONLY);
    if (r < 0 || w < 0 || unlink(p) != 0)
        return printf("FAIL set-up: open and unlink the FIFO\n"), 1;
    uint64_t last = 0;
    if (write(w, &last, sizeof last) != sizeof last)
        return printf("FAIL set-up: write\n"), 1;

    int ready[2];
    if (pipe(ready) != 0)
        return printf("FAIL set-up: pipe\n"), 1;
    pid_t child = fork();
    const char *who = child == 0 ? "child" : "main";
    snprintf(p, sizeof p, "%s/cwd-%s", dir, who);
    if (mkdir(p, 0700) != 0 || chdir(p) != 0 || rmdir(p) != 0)
        return printf("FAIL set-up: %s: a removed working directory\n", who), 1;
    if (child == 0) {
        /* Its directory is gone: the main process may look at DIR now. */
        if (write(ready[1], "", 1) != 1)
            _exit(1);
        /* Holds both ends; checks only its own state, so that the numbers stay the main's. */
        for (long i = 0; i < steps; i++) {
            check_cwd(who, i);
            if (fcntl(r, F_GETFL) < 0 || fcntl(w, F_GETFL) < 0)
                fail("child step %ld: lost an end of the FIFO", i);
            sleep_ms(STEP_MS);
        }
        _exit(failures ? 1 : 0);
    }

    char c;
    if (read(ready[0], &c, 1) != 1)
        return printf("FAIL set-up: the child did not get ready\n"), 1;
    close(ready[0]);
    close(ready[1]);
    uint64_t result = 0;
    for (long i = 0; i < steps; i++) {
        uint64_t got = ~0ULL;
        ssize_t n = read(r, &got, sizeof got);
        if (n != sizeof got || got != last)
            fail("step %ld: the FIFO gave %zd bytes, %llu, instead of %llu", i, n, (unsigned long long)got, (unsigned long long)last);
        last = mix64(last + (uint64_t)i);
        if (write(w, &last, sizeof last) != sizeof last)
            fail("step %ld: write to the FIFO: %s", i, strerror(errno));
        check_cwd(who, i);
        check_no_names(who, i);
        result = mix64(result ^ last);
        sleep_ms(STEP_MS);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child failed");
    return finish(result);
}
