/* deletedlib: a library upgraded (deleted) under a running program must come back with every
 * page it had, the pages never read before the checkpoint too: with nothing left to map them
 * from at restart, they are the job's memory.
 *
 * The program copies bin/libckptdel.so to DIR, loads it (dlopen), deletes the copy, and at every
 * step calls the library's function on a word of a page of its table not read before (one page
 * a step, then around again), checking the value it returns.
 * Prints PASS or FAIL <what>.
 *
 * Usage: deletedlib DIR [SECONDS=5]
 */
#include "common.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <libgen.h>
#include <sys/stat.h>

#pragma GCC diagnostic ignored "-Wformat-truncation"

#define TABLE_WORDS 65536
#define TABLE_VALUE 0x5a17ab1e0ddba11ULL
#define WORDS_PER_PAGE 512

static int copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    char buf[65536];
    ssize_t n;
    if (in < 0 || out < 0)
        return -1;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, n) != n)
            return -1;
    close(in);
    return close(out);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: deletedlib DIR [SECONDS]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 5.0);
    char self[512], lib[512], copy[512];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    snprintf(lib, sizeof lib, "%s/libckptdel.so", dirname(self));
    mkdir(argv[1], 0755);
    snprintf(copy, sizeof copy, "%s/libckptdel.so", argv[1]);
    if (copy_file(lib, copy) != 0)
        return printf("FAIL set-up: copy %s to %s\n", lib, copy), 1;
    void *h = dlopen(copy, RTLD_NOW);
    if (!h)
        return printf("FAIL set-up: dlopen: %s\n", dlerror()), 1;
    uint64_t (*word)(unsigned long) = (uint64_t (*)(unsigned long))dlsym(h, "ckpt_lib_word");
    if (!word || unlink(copy) != 0)
        return printf("FAIL set-up: dlsym or unlink\n"), 1;

    uint64_t result = 0;
    for (long step = 0; step < steps; step++) {
        unsigned long i = (unsigned long)step * WORDS_PER_PAGE + 7;
        uint64_t got = word(i);
        if (got != (TABLE_VALUE ^ (uint64_t)i))
            fail("step %ld: word %lu of the deleted library's table reads %#llx", step, i % TABLE_WORDS, (unsigned long long)(got ^ i));
        result = mix64(result ^ got);
        sleep_ms(STEP_MS);
    }
    return finish(result);
}
