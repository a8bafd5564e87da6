/* cowsplit: private mappings of objects that others can change, across the copy-on-write split.
 *
 * For each kind of object, NP pages of distinct patterns, mapped MAP_PRIVATE (P) and MAP_SHARED
 * (S) in the same process:
 *  - memfd:   a memfd (the object also changed with pwrite on its descriptor);
 *  - shm:     a POSIX shared memory file under /dev/shm (shm_open; pwrite too), removed at
 *             the end;
 *  - deleted: a file of the work directory, deleted once mapped (changed through S only: its
 *             descriptor is closed);
 *  - file:    a file of the work directory that stays (pwrite too);
 *  - shanon:  MAP_SHARED|MAP_ANONYMOUS memory, P mapped from /proc/self/map_files (as root
 *             only: an ordinary user may not open map_files; the kind is skipped then);
 *  - memfd-fd: a memfd mapped only MAP_PRIVATE, its descriptor the one other way to it (no S:
 *             the object is changed with pwrite and read with pread);
 *  - deleted-fd: the same with a file of the work directory, deleted once mapped (zdtm's
 *             unlink_mmap02);
 *  - deleted-sfd: a deleted file mapped P and S, its descriptor kept (pwrite too).
 * The setup writes pages 0 and 1 through P (P's own copies from then on), then changes pages 1
 * and 2 of the object: P's page 1 must keep its private bytes, its page 2 must show the new
 * ones. At each quarter of the run (event e = 1, 2, 3) P's page 2+e is written and the object's
 * pages 0 and 3+e (and 7, at the last) are changed, alternately through S and with pwrite: a
 * restart must bring back P's copies as they were, and leave P's other pages reading the object,
 * so that a change of the object after the restart shows in them too.
 *
 * Fork variant: a memfd "fork" whose P, written on pages 0 and 1 and changed in the object on
 * page 2, is inherited by a child; the child then writes pages 3 and 4 of its P, the parent
 * pages 4 and 5 of its own, each with its own bytes; the child changes the object's page 6 once.
 *
 * Across processes: a deleted file "dfork" that the parent holds by a descriptor only, and a
 * child maps MAP_PRIVATE after the fork and runs the events on, through the descriptor it
 * inherited; at the end the parent reads the file through its own descriptor and checks it
 * holds the versions the child reports (one file for both processes and the mapping).
 *
 * Every step checks every byte of every page of P (and of the object) against what it expects,
 * printing FAIL naming the kind and the page. RESULT hashes the last check's pages.
 *
 * Usage: cowsplit WORKDIR [SECONDS=4]
 */
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NP 8
#define PG 4096
#define NKINDS 8
/* Private versions start here, so that no private page can match an object page. */
#define PRIV 100

static char shm_name[4096];
static const char *kind_name[NKINDS] = {"memfd", "shm", "deleted", "file", "shanon", "memfd-fd", "deleted-fd", "deleted-sfd"};

struct obj {
    const char *name;
    int fd;                 /* -1: changed through S only */
    uint8_t *p, *s;         /* the private and the shared mapping (NULL: none) */
    int obj_ver[NP];        /* the object's version of each page */
    int priv_ver[NP];       /* P's own copy, or -1: P reads the object */
    uint64_t salt;
};

/* The byte `i` of page `page` of version `ver` of object `salt`. */
static uint8_t pat(uint64_t salt, int page, int ver, size_t i)
{
    return (uint8_t)(mix64(salt * 1000003ULL + (uint64_t)page * 1009ULL + (uint64_t)ver * 7919ULL + i / 8) >> (8 * (i % 8)));
}

static void fill_page(uint8_t *dst, uint64_t salt, int page, int ver)
{
    for (size_t i = 0; i < PG; i++)
        dst[i] = pat(salt, page, ver, i);
}

static void write_private(struct obj *o, int page, int ver)
{
    fill_page(o->p + (size_t)page * PG, o->salt, page, PRIV + ver);
    o->priv_ver[page] = ver;
}

/* Changes the object's page, through S or, where there is a descriptor and `by_fd`, pwrite. */
static void write_object(struct obj *o, int page, int ver, int by_fd)
{
    if ((by_fd || !o->s) && o->fd >= 0) {
        static uint8_t buf[PG];
        fill_page(buf, o->salt, page, ver);
        if (pwrite(o->fd, buf, PG, (off_t)page * PG) != PG)
            fail("%s: pwrite of page %d: %s", o->name, page, strerror(errno));
    } else {
        fill_page(o->s + (size_t)page * PG, o->salt, page, ver);
    }
    o->obj_ver[page] = ver;
}

/* Checks every byte of P and of the object; returns a hash of P. `when` names the moment. */
static uint64_t check(struct obj *o, const char *when)
{
    uint64_t h = o->salt;
    for (int page = 0; page < NP; page++) {
        const uint8_t *got = o->p + (size_t)page * PG;
        int priv = o->priv_ver[page] >= 0;
        int ver = priv ? PRIV + o->priv_ver[page] : o->obj_ver[page];
        for (size_t i = 0; i < PG; i++)
            if (got[i] != pat(o->salt, page, ver, i)) {
                fail("%s: %s: page %d of the private mapping, byte %zu: %#x, expected %s version %d%s", o->name, when, page, i,
                     got[i], priv ? "its private" : "the object's", priv ? o->priv_ver[page] : o->obj_ver[page],
                     got[i] == pat(o->salt, page, o->obj_ver[page], i) ? " (it reads the object's)" : "");
                break;
            }
        static uint8_t read_back[PG];
        const uint8_t *shared = o->s ? o->s + (size_t)page * PG : read_back;
        if (!o->s && pread(o->fd, read_back, PG, (off_t)page * PG) != PG) {
            fail("%s: %s: pread of page %d of the object: %s", o->name, when, page, strerror(errno));
            continue;
        }
        for (size_t i = 0; i < PG; i++)
            if (shared[i] != pat(o->salt, page, o->obj_ver[page], i)) {
                fail("%s: %s: page %d of the object, byte %zu: %#x, expected version %d", o->name, when, page, i, shared[i],
                     o->obj_ver[page]);
                break;
            }
        h = mix64(h ^ got[page * 8] ^ ((uint64_t)got[PG - 1] << 8));
    }
    return h;
}

/* Maps P and S of the object open at `fd` (NP pages from offset 0), and writes version 0. */
static int map_object(struct obj *o, int fd)
{
    if (ftruncate(fd, NP * PG) != 0)
        return -1;
    o->s = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    o->p = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    return o->s == MAP_FAILED || o->p == MAP_FAILED ? -1 : 0;
}

/* Version 0 of every page, read once through P (mapped there from the object), then the
 * split: pages 0 and 1 written through P, pages 1 and 2 of the object changed. */
static void setup(struct obj *o)
{
    for (int page = 0; page < NP; page++) {
        write_object(o, page, 0, 0);
        o->priv_ver[page] = -1;
    }
    volatile uint8_t sink = 0;
    for (int page = 0; page < NP; page += 2)
        sink ^= o->p[(size_t)page * PG];
    (void)sink;
    write_private(o, 0, 0);
    write_private(o, 1, 0);
    write_object(o, 1, 1, 0);
    write_object(o, 2, 1, 1);
}

static int open_kind(int k, const char *work, struct obj *o)
{
    char path[4096];
    int fd = -1;
    o->name = kind_name[k];
    o->salt = (uint64_t)k + 1;
    o->fd = -1;
    o->p = o->s = NULL;
    switch (k) {
    case 0:
        fd = memfd_create("cowsplit", MFD_CLOEXEC);
        break;
    case 1: {
        /* A name of this run's own: the reference and the checkpointed run go side by side. */
        uint64_t h = 0;
        for (const char *c = work; *c; c++)
            h = mix64(h ^ (uint8_t)*c);
        snprintf(path, sizeof path, "/ckpt-cowsplit-%016llx", (unsigned long long)h);
        fd = shm_open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        /* Removed at the end (a file of /dev/shm, not a deleted one, is what this kind is). */
        snprintf(shm_name, sizeof shm_name, "%s", path);
        break;
    }
    case 2:
    case 3:
    case 6:
    case 7:
        snprintf(path, sizeof path, "%s/cowsplit-%s.dat", work, o->name);
        fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0 || k == 3)
            break;
        if (k == 6) {
            if (ftruncate(fd, NP * PG) != 0)
                return -1;
            o->p = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
            if (o->p == MAP_FAILED)
                return -1;
        } else if (map_object(o, fd) != 0) {
            return -1;
        }
        unlink(path);
        if (k == 2)
            close(fd);
        else
            o->fd = fd;
        return 0;
    case 4: {
        o->s = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (o->s == MAP_FAILED)
            return -1;
        snprintf(path, sizeof path, "/proc/self/map_files/%lx-%lx", (unsigned long)o->s, (unsigned long)(o->s + NP * PG));
        int mf = open(path, O_RDWR | O_CLOEXEC);
        if (mf < 0)
            return 1; /* an ordinary user: skipped */
        o->p = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE, mf, 0);
        close(mf);
        return o->p == MAP_FAILED ? -1 : 0;
    }
    case 5:
        fd = memfd_create("cowsplit-fd", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, NP * PG) != 0)
            return -1;
        o->s = NULL;
        o->p = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        o->fd = fd;
        return o->p == MAP_FAILED ? -1 : 0;
    }
    if (fd < 0 || map_object(o, fd) != 0)
        return -1;
    o->fd = fd;
    return 0;
}

/* Event e (1..3) of kind `o`. */
static void event(struct obj *o, int e)
{
    write_private(o, 2 + e, e);
    write_object(o, 0, 1 + e, e % 2);
    write_object(o, 3 + e, 1 + e, e % 2 == 0);
    if (e == 3)
        write_object(o, 7, 4, 1);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: cowsplit WORKDIR [SECONDS]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    struct obj objs[NKINDS];
    int used[NKINDS];
    for (int k = 0; k < NKINDS; k++) {
        int r = open_kind(k, argv[1], &objs[k]);
        if (r < 0) {
            fprintf(stderr, "%s: %s\n", kind_name[k], strerror(errno));
            return 2;
        }
        used[k] = r == 0;
        if (used[k])
            setup(&objs[k]);
    }

    /* The fork variant. */
    struct obj f = {.name = "fork", .salt = 99};
    int ffd = memfd_create("cowsplit-fork", MFD_CLOEXEC);
    if (ffd < 0 || map_object(&f, ffd) != 0) {
        perror("fork memfd");
        return 2;
    }
    f.fd = ffd;
    setup(&f);
    int ready[2];
    if (pipe(ready) != 0)
        return 2;
    pid_t child = fork();
    if (child == 0) {
        /* Its own bytes: versions the parent does not write. */
        f.name = "fork (child)";
        write_private(&f, 3, 50);
        write_private(&f, 4, 51);
        write_object(&f, 6, 7, 0);
        if (write(ready[1], "x", 1) != 1)
            _exit(3);
        for (long s = 0; s < steps; s++) {
            check(&f, "child");
            sleep_ms(STEP_MS);
        }
        check(&f, "child, at the end");
        _exit(failures ? 1 : 0);
    }
    /* Across processes. */
    struct obj d = {.name = "dfork", .salt = 77};
    char dpath[4096];
    snprintf(dpath, sizeof dpath, "%s/cowsplit-dfork.dat", argv[1]);
    d.fd = open(dpath, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int versions[2];
    if (d.fd < 0 || ftruncate(d.fd, NP * PG) != 0 || unlink(dpath) != 0 || pipe(versions) != 0) {
        perror("dfork");
        return 2;
    }
    pid_t dchild = fork();
    if (dchild == 0) {
        d.name = "dfork (child)";
        d.p = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE, d.fd, 0);
        if (d.p == MAP_FAILED)
            _exit(3);
        setup(&d);
        for (long s = 0; s < steps; s++) {
            for (int e = 1; e <= 3; e++)
                if (s == e * steps / 4)
                    event(&d, e);
            check(&d, "child");
            sleep_ms(STEP_MS);
        }
        check(&d, "child, at the end");
        if (write(versions[1], d.obj_ver, sizeof d.obj_ver) != (ssize_t)sizeof d.obj_ver)
            _exit(3);
        _exit(failures ? 1 : 0);
    }
    close(versions[1]);

    char x;
    if (read(ready[0], &x, 1) != 1)
        return 2;
    f.obj_ver[6] = 7;
    write_private(&f, 4, 60);
    write_private(&f, 5, 61);

    uint64_t h = 0;
    for (long s = 0; s < steps; s++) {
        for (int e = 1; e <= 3; e++)
            if (s == e * steps / 4)
                for (int k = 0; k < NKINDS; k++)
                    if (used[k])
                        event(&objs[k], e);
        char when[32];
        snprintf(when, sizeof when, "step %ld", s);
        h = 0;
        for (int k = 0; k < NKINDS; k++)
            if (used[k])
                h = mix64(h ^ check(&objs[k], when));
        h = mix64(h ^ check(&f, when));
        sleep_ms(STEP_MS);
    }
    int st;
    if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("fork: the child's status is %#x", st);
    if (read(versions[0], d.obj_ver, sizeof d.obj_ver) != (ssize_t)sizeof d.obj_ver)
        fail("dfork: the child's versions did not come");
    if (waitpid(dchild, &st, 0) != dchild || !WIFEXITED(st) || WEXITSTATUS(st))
        fail("dfork: the child's status is %#x", st);
    for (int page = 0; page < NP; page++) {
        static uint8_t got[PG];
        if (pread(d.fd, got, PG, (off_t)page * PG) != PG) {
            fail("dfork: pread of page %d: %s", page, strerror(errno));
            continue;
        }
        for (size_t i = 0; i < PG; i++)
            if (got[i] != pat(d.salt, page, d.obj_ver[page], i)) {
                fail("dfork: page %d of the file as the parent reads it, byte %zu: %#x, expected the child's version %d", page, i,
                     got[i], d.obj_ver[page]);
                break;
            }
        h = mix64(h ^ (uint64_t)d.obj_ver[page] ^ got[0]);
    }
    shm_unlink(shm_name);
    return finish(h);
}
