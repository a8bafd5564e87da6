/* userns.h: a user namespace of the program's own, for the test programs that make namespaces
 * of other kinds and must run as an ordinary user too. Include after common.h. */
#ifndef CKPT_TEST_USERNS_H
#define CKPT_TEST_USERNS_H

#include <fcntl.h>
#include <sched.h>

/* Writes `text` to a file of /proc/self (a user namespace's maps); exits with FAIL on an error. */
static inline void write_proc_self(const char *name, const char *text)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/%s", name);
    int fd = open(path, O_WRONLY);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        printf("FAIL set-up: write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    close(fd);
}

/* As `unshare -Ur` does: makes a user namespace where the caller is root, its uid and gid mapped
 * to the caller's own, setgroups denied; `also` (other CLONE_NEW* flags) are made with it. An
 * ordinary user must, to make namespaces of other kinds. Exits with FAIL on an error. */
static inline void unshare_as_root(int also)
{
    char map[64];
    unsigned uid = (unsigned)getuid(), gid = (unsigned)getgid();
    if (unshare(CLONE_NEWUSER | also) != 0) {
        printf("FAIL set-up: unshare(CLONE_NEWUSER | %#x): %s\n", (unsigned)also, strerror(errno));
        exit(1);
    }
    write_proc_self("setgroups", "deny");
    snprintf(map, sizeof map, "0 %u 1\n", uid);
    write_proc_self("uid_map", map);
    snprintf(map, sizeof map, "0 %u 1\n", gid);
    write_proc_self("gid_map", map);
}

#endif
