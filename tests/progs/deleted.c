/* deleted: files deleted while open keep their contents and identity across checkpoint/restart.
 *
 *  - DIR/del.bin (256 KiB of a known pattern, mode 0640) is opened twice, read-only and
 *    read-write (two descriptions of one file), then unlinked. Each step reads the next 64
 *    bytes through the read-only descriptor (checked against the pattern), writes a record
 *    past the end through the read-write one (pwrite) and reads it back through the read-only
 *    one: both must still be one file;
 *  - an O_TMPFILE file in DIR, never linked, gets one record per step (write, so its offset
 *    moves) and is read back at the end;
 *  - DIR/gone/deeper/in-gone.bin is opened, unlinked, and both directories removed: a file in a
 *    directory that no longer exists, which gets one record per step (pwrite, pread);
 *  - DIR/big.bin, 96 MiB and sparse (1 MiB of the pattern at 0 and at 64 MiB, holes between and
 *    after), unlinked: larger than a record holds, it is saved by its data only; each step
 *    writes a record at 32 MiB + 4 KiB * step (into the hole). At the end its data and records
 *    are there and it is still sparse (under 16 MiB allocated).
 *  - DIR/holes.bin, 20 KiB with data in its second and fourth 4 KiB blocks only (small enough to
 *    be kept whole in the record), unlinked: its holes must still be holes (SEEK_HOLE finds the
 *    first block and the middle one), as zdtm's ghost_holes checks.
 * As root, del.bin and big.bin are given to another owner and group (1:1) first: a restart must
 * give the copies the owner the files had.
 * At the end: every record is there, the files have no links, their owners are as they were,
 * and DIR is empty (the restart must not leave a name behind). RESULT hashes what was read.
 *
 * Usage: deleted DIR [SECONDS=4]
 */
#include "common.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define SIZE (256 * 1024)
#define BIG_SIZE (96L << 20)
#define BIG_DATA (1L << 20)
#define BIG_SECOND (64L << 20)
#define BIG_RECORDS (32L << 20)
#define READ_START 1000
#define CHUNK 64

static uint8_t byte_at(size_t i) { return (uint8_t)(mix64(i / 8 + 77) >> (8 * (i % 8))); }

static void record(long s, uint64_t out[2])
{
    out[0] = (uint64_t)s;
    out[1] = mix64((uint64_t)s ^ 0xdeadULL);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: deleted DIR [SECONDS=4]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 4.0);
    if (chdir(argv[1]) != 0) {
        perror(argv[1]);
        return 2;
    }
    umask(0);
    static uint8_t buf[SIZE];
    for (size_t i = 0; i < SIZE; i++)
        buf[i] = byte_at(i);
    int rw = open("del.bin", O_RDWR | O_CREAT | O_EXCL, 0640);
    if (rw < 0 || write(rw, buf, SIZE) != SIZE) {
        perror("del.bin");
        return 2;
    }
    /* As root: another owner, which the restart's copy must have too. */
    if (geteuid() == 0 && fchown(rw, 1, 1) != 0) {
        perror("fchown del.bin");
        return 2;
    }
    struct stat owner0;
    if (fstat(rw, &owner0) != 0) {
        perror("fstat del.bin");
        return 2;
    }
    int rd = open("del.bin", O_RDONLY);
    if (rd < 0 || lseek(rd, READ_START, SEEK_SET) != READ_START || unlink("del.bin") != 0) {
        perror("del.bin");
        return 2;
    }
    int tmp = open(".", O_TMPFILE | O_RDWR, 0600);
    if (tmp < 0) {
        perror("O_TMPFILE");
        return 2;
    }
    int gone = -1;
    if (mkdir("gone", 0700) != 0 || mkdir("gone/deeper", 0700) != 0 ||
        (gone = open("gone/deeper/in-gone.bin", O_RDWR | O_CREAT | O_EXCL, 0600)) < 0 ||
        unlink("gone/deeper/in-gone.bin") != 0 || rmdir("gone/deeper") != 0 || rmdir("gone") != 0) {
        perror("gone/deeper/in-gone.bin");
        return 2;
    }

    int big = open("big.bin", O_RDWR | O_CREAT | O_EXCL, 0600);
    if (big < 0 || ftruncate(big, BIG_SIZE) != 0 || (geteuid() == 0 && fchown(big, 1, 1) != 0)) {
        perror("big.bin");
        return 2;
    }
    for (int part = 0; part < 2; part++) {
        off_t base = part ? BIG_SECOND : 0;
        for (off_t at = 0; at < BIG_DATA; at += SIZE)
            if (pwrite(big, buf, SIZE, base + at) != SIZE) {
                perror("big.bin");
                return 2;
            }
    }
    int holes = open("holes.bin", O_RDWR | O_CREAT | O_EXCL, 0600);
    if (holes < 0 || pwrite(holes, "second", 6, 4096) != 6 || pwrite(holes, "fourth", 6, 3 * 4096) != 6 ||
        ftruncate(holes, 5 * 4096) != 0 || unlink("holes.bin") != 0) {
        perror("holes.bin");
        return 2;
    }
    if (unlink("big.bin") != 0) {
        perror("big.bin");
        return 2;
    }

    uint64_t h = 0;
    size_t pos = READ_START;
    for (long s = 0; s < steps; s++) {
        uint8_t chunk[CHUNK];
        if (read(rd, chunk, CHUNK) != CHUNK) {
            fail("step %ld: short read of the deleted file", s);
            break;
        }
        for (size_t i = 0; i < CHUNK; i++)
            if (chunk[i] != byte_at(pos + i)) {
                fail("step %ld: byte %zu of the deleted file is wrong", s, pos + i);
                break;
            }
        h = mix64(h ^ chunk[0] ^ ((uint64_t)chunk[CHUNK - 1] << 8));
        pos += CHUNK;

        uint64_t r[2], back[2];
        record(s, r);
        off_t at = SIZE + s * (off_t)sizeof r;
        if (pwrite(rw, r, sizeof r, at) != sizeof r)
            fail("step %ld: pwrite", s);
        if (pread(rd, back, sizeof back, at) != sizeof back || memcmp(r, back, sizeof r) != 0) {
            fail("step %ld: a record written through one descriptor is not seen through the "
                 "other (two files now?)", s);
            break;
        }
        if (write(tmp, r, sizeof r) != sizeof r)
            fail("step %ld: write to the O_TMPFILE file", s);
        if (pwrite(gone, r, sizeof r, s * 16) != sizeof r || pread(gone, back, sizeof back, s * 16) != sizeof back ||
            memcmp(r, back, sizeof r) != 0)
            fail("step %ld: the file in a removed directory lost a record", s);
        if (pwrite(big, r, sizeof r, BIG_RECORDS + s * 4096L) != sizeof r)
            fail("step %ld: pwrite into the big deleted file", s);
        sleep_ms(STEP_MS);
    }

    struct stat a, b, t;
    if (fstat(rd, &a) || fstat(rw, &b) || fstat(tmp, &t))
        fail("fstat");
    if (a.st_ino != b.st_ino || a.st_dev != b.st_dev)
        fail("the two descriptors of del.bin are different files");
    if (a.st_nlink != 0 || t.st_nlink != 0)
        fail("the deleted files have links (%lu, %lu)", (unsigned long)a.st_nlink,
             (unsigned long)t.st_nlink);
    if (a.st_uid != owner0.st_uid || a.st_gid != owner0.st_gid)
        fail("del.bin is owned by %u:%u, expected %u:%u", (unsigned)a.st_uid, (unsigned)a.st_gid,
             (unsigned)owner0.st_uid, (unsigned)owner0.st_gid);
    if ((a.st_mode & 07777) != 0640)
        fail("del.bin has mode %o, expected 640", (unsigned)(a.st_mode & 07777));
    if (a.st_size != SIZE + steps * 16)
        fail("del.bin has %lld bytes, expected %ld", (long long)a.st_size, SIZE + steps * 16);
    if (lseek(rd, 0, SEEK_CUR) != (off_t)pos)
        fail("read offset is %lld, expected %zu", (long long)lseek(rd, 0, SEEK_CUR), pos);
    if (lseek(tmp, 0, SEEK_CUR) != steps * 16)
        fail("O_TMPFILE offset is %lld, expected %ld", (long long)lseek(tmp, 0, SEEK_CUR),
             steps * 16);
    for (long s = 0; s < steps; s++) {
        uint64_t r[2], x[2], y[2], z[2];
        record(s, r);
        if (pread(rd, x, sizeof x, SIZE + s * 16) != sizeof x || memcmp(r, x, sizeof r) ||
            pread(tmp, y, sizeof y, s * 16) != sizeof y || memcmp(r, y, sizeof r) ||
            pread(gone, z, sizeof z, s * 16) != sizeof z || memcmp(r, z, sizeof r)) {
            fail("record %ld is missing at the end", s);
            break;
        }
        h = mix64(h ^ x[1] ^ y[1]);
    }
    if (pread(rd, buf, SIZE, 0) != SIZE)
        fail("re-read of the deleted file");
    for (size_t i = 0; i < SIZE; i++)
        if (buf[i] != byte_at(i)) {
            fail("byte %zu of the deleted file changed", i);
            break;
        }

    struct stat g;
    if (fstat(big, &g) == 0 && (g.st_uid != owner0.st_uid || g.st_gid != owner0.st_gid))
        fail("big.bin is owned by %u:%u, expected %u:%u", (unsigned)g.st_uid, (unsigned)g.st_gid,
             (unsigned)owner0.st_uid, (unsigned)owner0.st_gid);
    if (fstat(big, &g) != 0 || g.st_size != BIG_SIZE || g.st_nlink != 0)
        fail("big.bin: %lld bytes and %lu links, expected %ld and none", (long long)g.st_size,
             (unsigned long)g.st_nlink, BIG_SIZE);
    else if (g.st_blocks * 512L > (16L << 20))
        fail("big.bin takes %lld bytes on disk: its holes were filled", (long long)g.st_blocks * 512);
    for (int part = 0; part < 2; part++) {
        off_t base = part ? BIG_SECOND : 0;
        for (off_t at = 0; at < BIG_DATA; at += SIZE) {
            static uint8_t back[SIZE];
            if (pread(big, back, SIZE, base + at) != SIZE || memcmp(back, buf, SIZE) != 0) {
                fail("big.bin: the data at %lld changed", (long long)(base + at));
                part = 2;
                break;
            }
        }
    }
    for (long s = 0; s < steps; s++) {
        uint64_t r[2], x[2];
        record(s, r);
        if (pread(big, x, sizeof x, BIG_RECORDS + s * 4096L) != sizeof x || memcmp(r, x, sizeof r)) {
            fail("big.bin: record %ld is missing at the end", s);
            break;
        }
    }
    uint8_t zero[64], want[64] = { 0 };
    if (pread(big, zero, sizeof zero, BIG_SIZE - 64) != sizeof zero || memcmp(zero, want, sizeof zero))
        fail("big.bin: its last bytes are not zero");

    DIR *d = opendir(".");
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            fail("DIR has an entry %s", e->d_name);
    if (d)
        closedir(d);
    char word[6];
    if (lseek(holes, 0, SEEK_HOLE) != 0 || lseek(holes, 4096, SEEK_HOLE) != 2 * 4096 || lseek(holes, 0, SEEK_DATA) != 4096 ||
        pread(holes, word, 6, 3 * 4096) != 6 || memcmp(word, "fourth", 6) != 0)
        fail("holes.bin: holes at %lld and %lld, data at %lld (expected 0, 8192, 4096), or its data lost",
             (long long)lseek(holes, 0, SEEK_HOLE), (long long)lseek(holes, 4096, SEEK_HOLE), (long long)lseek(holes, 0, SEEK_DATA));
    return finish(h);
}
