/* libckpt: see ckpt.h.
 *
 * The request goes to the job's agent on DIR/agent.sock (DIR from CKPT_DIR, which `ckpt launch`
 * gives the program) as a *detached* request: the agent answers with the generation it will
 * commit and waits for us to close the connection before it freezes the job, so that no
 * connection to a process outside the job is part of the checkpoint. We then wait for that
 * generation's MANIFEST; the agent's pid (from a `status` request) tells whether we were
 * restarted meanwhile (a restart has another agent).
 */
#define _GNU_SOURCE
#include "ckpt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static ckpt_hook hook_before, hook_resume, hook_restart;
static void *hook_arg;

int ckpt_register_hooks(ckpt_hook before, ckpt_hook after_resume, ckpt_hook after_restart, void *arg)
{
    hook_before = before;
    hook_resume = after_resume;
    hook_restart = after_restart;
    hook_arg = arg;
    return 0;
}

/* Sends one request line and reads one answer line; -1 if the agent cannot be reached. */
static int ask(const char *request, char *answer, size_t size)
{
    const char *dir = getenv("CKPT_DIR");
    if (!dir || !*dir)
        return -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(addr.sun_path, sizeof addr.sun_path, "%s/agent.sock", dir) >= sizeof addr.sun_path)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        close(fd);
        return -1;
    }
    size_t len = strlen(request), done = 0;
    while (done < len) {
        ssize_t n = write(fd, request + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)n;
    }
    size_t got = 0;
    while (got + 1 < size) {
        ssize_t n = read(fd, answer + got, size - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
        if (memchr(answer, '\n', got))
            break;
    }
    answer[got] = 0;
    close(fd);
    return got > 0 ? 0 : -1;
}

static long long number_after(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    return p ? atoll(p + strlen(key)) : -1;
}

static long long agent_pid(void)
{
    char answer[4096];
    if (ask("{\"op\":\"status\"}\n", answer, sizeof answer) < 0)
        return -1;
    return number_after(answer, "\"launcher_pid\":");
}

int ckpt_is_enabled(void)
{
    return agent_pid() > 0;
}

int ckpt_checkpoint(void)
{
    long long before = agent_pid();
    if (before <= 0) {
        errno = ENOSYS;
        return -1;
    }
    if (hook_before)
        hook_before(hook_arg);
    char answer[4096];
    if (ask("{\"op\":\"checkpoint\",\"detach\":true}\n", answer, sizeof answer) < 0) {
        errno = EIO;
        return -1;
    }
    long long generation = number_after(answer, "\"generation\":");
    if (!strstr(answer, "\"accepted\"") || generation < 0) {
        errno = EIO;
        return -1;
    }
    char manifest[4200];
    snprintf(manifest, sizeof manifest, "%s/gen-%06lld/MANIFEST", getenv("CKPT_DIR"), generation);
    /* The job is frozen and released while we wait here; a restart also lands here. */
    struct stat st;
    for (int waited_ms = 0; stat(manifest, &st) != 0; waited_ms += 5) {
        if (waited_ms > 600000) {
            errno = EIO;
            return -1;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    int restarted = agent_pid() != before;
    if (restarted && hook_restart)
        hook_restart(hook_arg);
    if (!restarted && hook_resume)
        hook_resume(hook_arg);
    return restarted;
}
