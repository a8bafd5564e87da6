/* aio: Linux AIO contexts (io_setup, as libaio uses them) must come back usable at the same
 * ids: each step submits a read of a file through each of two contexts (of 64 and of 1000
 * events), reaps it with io_getevents, and checks the bytes; the ring libaio reads directly
 * (at the context's id) must show its magic and as many events reaped as completed.
 * Prints PASS or FAIL <what>.
 *
 * Usage: aio DIR [SECONDS=5]
 */
#include "common.h"

#include <fcntl.h>
#include <linux/aio_abi.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#pragma GCC diagnostic ignored "-Wformat-truncation"

#define RING_MAGIC 0xa10a10a1

struct ring {
    unsigned id, nr, head, tail, magic, compat, incompat, header_length;
};

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: aio DIR [SECONDS]\n");
        return 2;
    }
    long steps = steps_arg(argc, argv, 2, 5.0);
    mkdir(argv[1], 0755);
    char path[512];
    snprintf(path, sizeof path, "%s/data", argv[1]);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    char block[4096];
    for (int i = 0; i < 4096; i++)
        block[i] = (char)(i * 7);
    if (fd < 0 || write(fd, block, sizeof block) != (ssize_t)sizeof block)
        return printf("FAIL set-up: write %s\n", path), 1;
    aio_context_t ctx[2] = {0, 0};
    unsigned sizes[2] = {64, 1000};
    for (int c = 0; c < 2; c++)
        if (syscall(SYS_io_setup, sizes[c], &ctx[c]) != 0)
            return printf("FAIL set-up: io_setup(%u): %s\n", sizes[c], strerror(errno)), 1;
    aio_context_t ids[2] = {ctx[0], ctx[1]};

    uint64_t result = 0;
    for (long step = 0; step < steps; step++) {
        for (int c = 0; c < 2; c++) {
            if (ctx[c] != ids[c])
                fail("step %ld: context %d changed id", step, c);
            struct ring *r = (struct ring *)ctx[c];
            if (r->magic != RING_MAGIC || r->head != r->tail)
                fail("step %ld: ring %d: magic %#x, head %u, tail %u", step, c, r->magic, r->head, r->tail);
            char buf[64];
            memset(buf, 0, sizeof buf);
            long off = (step * 61 + c * 17) % (4096 - 64);
            struct iocb cb;
            memset(&cb, 0, sizeof cb);
            cb.aio_fildes = fd;
            cb.aio_lio_opcode = IOCB_CMD_PREAD;
            cb.aio_buf = (uint64_t)(uintptr_t)buf;
            cb.aio_nbytes = sizeof buf;
            cb.aio_offset = off;
            cb.aio_data = (uint64_t)step;
            struct iocb *cbs[1] = {&cb};
            long submitted = syscall(SYS_io_submit, ctx[c], 1, cbs);
            struct io_event ev;
            memset(&ev, 0, sizeof ev);
            long got = submitted == 1 ? syscall(SYS_io_getevents, ctx[c], 1, 1, &ev, NULL) : -1;
            if (submitted != 1 || got != 1 || ev.res != (long)sizeof buf || ev.data != (uint64_t)step) {
                fail("step %ld: context %d: submitted %ld, reaped %ld, res %lld: %s", step, c, submitted, got, (long long)ev.res, strerror(errno));
                continue;
            }
            if (memcmp(buf, block + off, sizeof buf) != 0)
                fail("step %ld: context %d read other bytes", step, c);
            result = mix64(result ^ (uint64_t)buf[step % 64]);
        }
        sleep_ms(STEP_MS);
    }
    for (int c = 0; c < 2; c++)
        if (syscall(SYS_io_destroy, ctx[c]) != 0)
            fail("io_destroy %d: %s", c, strerror(errno));
    return finish(result);
}
