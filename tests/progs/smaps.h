/* smaps.h: /proc/self/smaps read whole into a static buffer, and the VmFlags of the mapping
 * holding an address, for the test programs that check mapping flags (memattrs, noreserve).
 * The buffer is static so that reading smaps maps nothing new (a program under mlockall counts
 * its locked memory). */
#ifndef CKPT_TEST_SMAPS_H
#define CKPT_TEST_SMAPS_H

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static char smaps[1 << 18];

static int read_smaps(void)
{
    int fd = open("/proc/self/smaps", O_RDONLY | O_CLOEXEC);
    size_t n = 0;
    ssize_t r = 1;
    while (fd >= 0 && n < sizeof smaps - 1 && (r = read(fd, smaps + n, sizeof smaps - 1 - n)) > 0)
        n += (size_t)r;
    if (fd >= 0)
        close(fd);
    smaps[n] = 0;
    return fd < 0 || r < 0 || n == sizeof smaps - 1 ? -1 : 0;
}

/* The VmFlags of the mapping that holds `addr` (in the smaps text read last), or NULL. */
static const char *flags_at(const void *addr, char *out, size_t outlen)
{
    uintptr_t a = (uintptr_t)addr;
    int inside = 0;
    for (char *line = smaps; *line;) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        unsigned long s, e;
        if (sscanf(line, "%lx-%lx ", &s, &e) == 2 && line[0] != 'V')
            inside = s <= a && a < e;
        else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            size_t n = len - 8 < outlen - 1 ? len - 8 : outlen - 1;
            memcpy(out, line + 8, n);
            out[n] = 0;
            return out;
        }
        line += len + (end ? 1 : 0);
    }
    return NULL;
}

static int has_flag(const char *flags, const char *f)
{
    size_t n = strlen(f);
    for (const char *p = flags; (p = strstr(p, f)) != NULL; p += n)
        if ((p == flags || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0 || p[n] == '\n'))
            return 1;
    return 0;
}

#endif
