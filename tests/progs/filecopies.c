/* filecopies: a program whose private file mappings hold its own copies of the file's pages,
 * changing a little between checkpoints, so that an incremental generation stores only the
 * copies written since its base (and refers to earlier generations for the others) while the
 * file's own pages are never stored.
 *
 * DIR/filecopies.dat (MIB MiB of words that depend on their place) is mapped twice, privately:
 *  - the whole file, read-write: every even page is written at the start (a private copy of
 *    its own), odd pages are left the file's;
 *  - its first 65 pages again, the first 64 written whole at the start then made read-only,
 *    which leaves them a read-only mapping just before a writable one of the same file: what
 *    the dynamic loader does to a library's relocated data (RELRO).
 * Each step then picks one page of the first mapping and, by its number modulo 4: writes new
 * words into it (a copy made or rewritten); writes zeros into it (a copy of zeros, which must
 * not come back as the file's bytes); drops it with MADV_DONTNEED (a copy dropped reads as the
 * file again); or only reads it. What each page should hold is kept in a small table; at the
 * end every page of both mappings is checked against it, and the file against its words (the
 * copies never reach the file): PASS, or FAIL naming the first wrong page. RESULT hashes both
 * mappings.
 *
 * Usage: filecopies DIR [SECONDS=4] [MIB=32]
 */
#include "common.h"
#include <sys/mman.h>

#define PAGE 4096
#define WORDS (PAGE / 8)
#define RELRO_PAGES 64

enum { FROM_FILE = 0, COPY, ZEROS };

static uint64_t file_word(size_t page, size_t i) { return mix64(((uint64_t)page * WORDS + i) ^ 0xf11eULL); }
static uint64_t copy_word(size_t page, size_t i, long step) { return mix64(((uint64_t)page * WORDS + i) ^ ((uint64_t)(step + 7) << 40)); }
static uint64_t relro_word(size_t page, size_t i) { return mix64(((uint64_t)page * WORDS + i) ^ 0x4e140ULL); }

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        printf("FAIL usage: filecopies DIR [SECONDS] [MIB]\n");
        return 1;
    }
    long steps = steps_arg(argc, argv, 2, 4);
    long mib = argc > 3 ? atol(argv[3]) : 32;
    size_t pages = (size_t)mib * 256;
    if (pages <= RELRO_PAGES) {
        printf("FAIL at least 1 MiB\n");
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/filecopies.dat", argv[1]);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        printf("FAIL open %s: %s\n", path, strerror(errno));
        return 1;
    }
    uint64_t *buf = malloc(PAGE);
    for (size_t p = 0; p < pages; p++) {
        for (size_t i = 0; i < WORDS; i++)
            buf[i] = file_word(p, i);
        if (pwrite(fd, buf, PAGE, (off_t)(p * PAGE)) != PAGE) {
            printf("FAIL write %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    uint64_t *data = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    uint64_t *relro = mmap(NULL, (RELRO_PAGES + 1) * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED || relro == MAP_FAILED) {
        printf("FAIL mmap: %s\n", strerror(errno));
        return 1;
    }
    /* What each page of `data` holds: the file's words, a copy written at step `when`, zeros. */
    unsigned char *kind = calloc(pages, 1);
    long *when = calloc(pages, sizeof *when);
    for (size_t p = 0; p < pages; p += 2) {
        for (size_t i = 0; i < WORDS; i++)
            data[p * WORDS + i] = copy_word(p, i, -1);
        kind[p] = COPY;
        when[p] = -1;
    }
    for (size_t p = 0; p < RELRO_PAGES; p++)
        for (size_t i = 0; i < WORDS; i++)
            relro[p * WORDS + i] = relro_word(p, i);
    if (mprotect(relro, RELRO_PAGES * PAGE, PROT_READ) != 0) {
        printf("FAIL mprotect: %s\n", strerror(errno));
        return 1;
    }
    printf("START\n");
    volatile uint64_t seen = 0;
    for (long step = 0; step < steps; step++) {
        size_t p = ((size_t)step * 7919) % pages;
        uint64_t *page = data + p * WORDS;
        switch (p % 4) {
        case 0:
            for (size_t i = 0; i < WORDS; i++)
                page[i] = copy_word(p, i, step);
            kind[p] = COPY;
            when[p] = step;
            break;
        case 1:
            memset(page, 0, PAGE);
            kind[p] = ZEROS;
            break;
        case 2:
            if (madvise(page, PAGE, MADV_DONTNEED) != 0) {
                printf("FAIL madvise: %s\n", strerror(errno));
                return 1;
            }
            kind[p] = FROM_FILE;
            break;
        default:
            seen += page[step % WORDS];
        }
        sleep_ms(STEP_MS);
    }
    uint64_t h = 0;
    long bad = -1;
    for (size_t p = 0; p < pages; p++) {
        for (size_t i = 0; i < WORDS; i++) {
            uint64_t want = kind[p] == COPY ? copy_word(p, i, when[p]) : kind[p] == ZEROS ? 0 : file_word(p, i);
            uint64_t got = data[p * WORDS + i];
            h = mix64(h ^ got);
            if (got != want && bad < 0)
                bad = (long)p;
        }
    }
    if (bad >= 0) {
        printf("FAIL page %ld of the private mapping holds other words than its %s\n", bad,
               kind[bad] == COPY ? "copy" : kind[bad] == ZEROS ? "copy of zeros" : "file's");
        return 1;
    }
    for (size_t p = 0; p < RELRO_PAGES; p++) {
        for (size_t i = 0; i < WORDS; i++) {
            h = mix64(h ^ relro[p * WORDS + i]);
            if (relro[p * WORDS + i] != relro_word(p, i)) {
                printf("FAIL page %zu of the read-only copy holds other words\n", p);
                return 1;
            }
        }
    }
    for (size_t p = 0; p < pages; p++) {
        if (pread(fd, buf, PAGE, (off_t)(p * PAGE)) != PAGE) {
            printf("FAIL read %s: %s\n", path, strerror(errno));
            return 1;
        }
        for (size_t i = 0; i < WORDS; i++) {
            if (buf[i] != file_word(p, i)) {
                printf("FAIL page %zu of the file changed (a copy reached it)\n", p);
                return 1;
            }
        }
    }
    printf("RESULT %016llx\n", (unsigned long long)h);
    printf("PASS\n");
    return 0;
}
