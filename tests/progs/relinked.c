/* relinked: a file open under a name that was unlinked while another name of it, in the same
 * directory, lives on (a hard link made first, as zdtm's unlink_fstat03 makes it, or a delivery
 * that links a file into place and removes its first name). /proc shows the descriptor's file as
 * deleted; it is not: after a restart the descriptor must hold that same file, the one the
 * other name leads to, not a copy. Each step the program appends a record through the
 * descriptor and reads it back through the other name (a fresh open), and checks that the
 * descriptor's file is the other name's (device and inode) with one link. RESULT hashes the
 * records; PASS if everything checked out.
 *
 * Usage: relinked DIR [SECONDS=4]
 */
#include "common.h"

#include <sys/stat.h>

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: relinked DIR [SECONDS]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    if (chdir(argv[1]) != 0)
        return printf("FAIL set-up: chdir %s: %s\n", argv[1], strerror(errno)), 1;
    int fd = open("first", O_RDWR | O_CREAT | O_EXCL | O_APPEND, 0640);
    if (fd < 0 || link("first", "kept") != 0 || unlink("first") != 0)
        return printf("FAIL set-up: first and kept: %s\n", strerror(errno)), 1;
    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        uint64_t record[2] = {(uint64_t)s, mix64((uint64_t)s)};
        if (write(fd, record, sizeof record) != (ssize_t)sizeof record)
            fail("step %ld: append: %s", s, strerror(errno));
        struct stat held, named;
        if (fstat(fd, &held) != 0 || stat("kept", &named) != 0)
            fail("step %ld: stat: %s", s, strerror(errno));
        else if (held.st_dev != named.st_dev || held.st_ino != named.st_ino || named.st_nlink != 1)
            fail("step %ld: the descriptor holds another file than \"kept\" (inode %lu, %lu there, %lu links)", s, (unsigned long)held.st_ino,
                 (unsigned long)named.st_ino, (unsigned long)named.st_nlink);
        int again = open("kept", O_RDONLY);
        uint64_t back[2] = {0, 0};
        if (again < 0 || pread(again, back, sizeof back, (off_t)(s * sizeof record)) != (ssize_t)sizeof back || back[0] != record[0] ||
            back[1] != record[1])
            fail("step %ld: the record appended is not in \"kept\"", s);
        if (again >= 0)
            close(again);
        h = mix64(h ^ back[1]);
        sleep_ms(STEP_MS);
    }
    unlink("kept");
    return finish(h);
}
