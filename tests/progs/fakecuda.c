/* fakecuda: a stand-in for NVIDIA's libcuda.so.1 with the driver's checkpoint API, for the tests
 * of ckpt's CUDA support on machines without a GPU (tests/tests/gpu.rs). Built as
 * bin/fakecuda/libcuda.so.1; ckpt loads it as it loads the real one, through LD_LIBRARY_PATH.
 *
 * It drives tests/progs/fakegpu.c: the process's device is the argument of its command line
 * that starts with $CKPT_TEST_GPU_DEVICE; each call queues a command to the process
 * (SIGRTMIN+3 with a value) and waits for its answer in DEVICE.state ("STAMP STATE", a new stamp
 * at every answer).
 *
 * FAKECUDA_FAIL=CALL (lock, checkpoint, restore, unlock) makes that call fail as the driver
 * does for what it does not support (CUDA_ERROR_NOT_SUPPORTED), without doing anything.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
enum {
    OK = 0,
    NOT_INITIALIZED = 3,
    NOT_FOUND = 500,
    ILLEGAL_STATE = 401,
    NOT_SUPPORTED = 801,
    TIMEOUT = 909,
    UNKNOWN = 999,
};
typedef struct {
    unsigned int timeoutMs;
    unsigned int reserved0;
    unsigned long long reserved1[7];
} LockArgs;

static const char *name_of(CUresult r)
{
    switch (r) {
    case NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case ILLEGAL_STATE: return "CUDA_ERROR_ILLEGAL_STATE";
    case NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case TIMEOUT: return "CUDA_ERROR_TIMEOUT";
    case UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: return NULL;
    }
}

CUresult cuGetErrorName(CUresult r, const char **s)
{
    *s = name_of(r);
    return *s ? OK : 1;
}

CUresult cuGetErrorString(CUresult r, const char **s)
{
    *s = r == NOT_SUPPORTED ? "operation not supported (the stand-in driver was told to refuse it)" : name_of(r) ? "stand-in driver error" : NULL;
    return *s ? OK : 1;
}

CUresult cuInit(unsigned int flags) { (void)flags; return OK; }

CUresult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return OK;
}

/* The device named on process `pid`'s command line, into `out`. */
static int device_of(int pid, char *out, size_t len)
{
    const char *prefix = getenv("CKPT_TEST_GPU_DEVICE");
    if (!prefix)
        return -1;
    char path[64], buf[8192];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
        if (strncmp(buf + i, prefix, strlen(prefix)) == 0) {
            snprintf(out, len, "%s", buf + i);
            return 0;
        }
    return -1;
}

/* The process's last answer: its stamp and state. */
static int read_state(const char *device, char *stamp, char *state, size_t len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s.state", device);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[256] = "";
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    char *space = strchr(line, ' ');
    if (!ok || !space)
        return -1;
    *space = 0;
    snprintf(stamp, 64, "%s", line);
    snprintf(state, len, "%s", space + 1);
    state[strcspn(state, "\n")] = 0;
    return 0;
}

static int failing(const char *call)
{
    const char *f = getenv("FAKECUDA_FAIL");
    return f && strcmp(f, call) == 0;
}

/* Sends command `cmd` to `pid` and waits (at most 20 s) for the answer `want`. */
static CUresult command(int pid, int cmd, const char *want)
{
    char device[4096], state[128], before[64], now[64];
    if (device_of(pid, device, sizeof device) != 0 || read_state(device, before, state, sizeof state) != 0)
        return NOT_FOUND;
    union sigval v = { .sival_int = cmd };
    if (sigqueue(pid, SIGRTMIN + 3, v) != 0)
        return errno == ESRCH ? NOT_FOUND : UNKNOWN;
    for (int i = 0; i < 20000; i++) {
        if (read_state(device, now, state, sizeof state) == 0 && strcmp(now, before) != 0) {
            if (strcmp(state, want) == 0)
                return OK;
            return strcmp(state, "error timeout") == 0 ? TIMEOUT : ILLEGAL_STATE;
        }
        struct timespec ms = { 0, 1000000 };
        nanosleep(&ms, NULL);
    }
    return TIMEOUT;
}

CUresult cuCheckpointProcessGetState(int pid, int *out)
{
    char device[4096], state[128], stamp[64];
    /* A process that is no CUDA process: what the real driver answers (seen on an H200, driver
     * 580), for a forked worker of a CUDA process too. */
    if (device_of(pid, device, sizeof device) != 0 || read_state(device, stamp, state, sizeof state) != 0)
        return NOT_INITIALIZED;
    static const char *names[] = { "running", "locked", "checkpointed", "failed" };
    for (int i = 0; i < 4; i++)
        if (strcmp(state, names[i]) == 0) {
            *out = i;
            return OK;
        }
    return ILLEGAL_STATE;
}

CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
    *tid = pid;
    return OK;
}

CUresult cuCheckpointProcessLock(int pid, LockArgs *args)
{
    if (failing("lock"))
        return NOT_SUPPORTED;
    unsigned timeout = args ? args->timeoutMs : 0;
    return command(pid, 1 | (int)(timeout << 8), "locked");
}

CUresult cuCheckpointProcessCheckpoint(int pid, void *args)
{
    (void)args;
    return failing("checkpoint") ? NOT_SUPPORTED : command(pid, 2, "checkpointed");
}

CUresult cuCheckpointProcessRestore(int pid, void *args)
{
    (void)args;
    return failing("restore") ? NOT_SUPPORTED : command(pid, 3, "locked");
}

CUresult cuCheckpointProcessUnlock(int pid, void *args)
{
    (void)args;
    return failing("unlock") ? NOT_SUPPORTED : command(pid, 4, "running");
}
