/* unixgreeting: a client greets a server over a Unix stream connection before the server has
 * accepted it, as a tmux client does (its first messages carry its terminal's descriptors):
 * the greeting waits in the listener's half of the connection, which no process holds yet.
 *
 * The parent listens on WORKDIR/sock; a child connects, sends a greeting with one end of a pipe
 * (SCM_RIGHTS), prints PENDING and waits for the answer. The parent accepts only once GO_FILE
 * exists (a checkpoint comes meanwhile), checks the greeting, writes through the passed pipe end
 * and answers; the child checks the answer and what came through the pipe. Both then run on
 * for SECONDS (a checkpoint taken then is restarted). Prints RESULT and PASS, or FAIL <what>.
 *
 * Usage: unixgreeting WORKDIR GO_FILE [SECONDS=3]
 */
#include "common.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

static const char greeting[] = "hello from the client";
static const char answer[] = "welcome";
static const char through_pipe[] = "through the passed pipe";

static long steps;

static void child(const struct sockaddr_un *addr)
{
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    int p[2];
    if (s < 0 || pipe(p) || connect(s, (const struct sockaddr *)addr, sizeof *addr)) {
        fail("client: connect: %s", strerror(errno));
        _exit(1);
    }
    char control[CMSG_SPACE(sizeof(int))] = {0};
    struct iovec iov = {.iov_base = (void *)greeting, .iov_len = sizeof greeting};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &p[1], sizeof(int));
    if (sendmsg(s, &msg, 0) != (ssize_t)sizeof greeting) {
        fail("client: send the greeting: %s", strerror(errno));
        _exit(1);
    }
    close(p[1]);
    printf("PENDING\n");
    fflush(stdout);
    char got[64] = {0};
    ssize_t n = read(s, got, sizeof got - 1);
    if (n != (ssize_t)sizeof answer || memcmp(got, answer, sizeof answer)) {
        fail("client: the answer is %zd bytes '%s', not '%s'", n, got, answer);
        _exit(1);
    }
    char piped[64] = {0};
    n = read(p[0], piped, sizeof piped - 1);
    if (n != (ssize_t)sizeof through_pipe || memcmp(piped, through_pipe, sizeof through_pipe)) {
        fail("client: the pipe brought %zd bytes '%s', not '%s'", n, piped, through_pipe);
        _exit(1);
    }
    for (long i = 0; i < steps; i++)
        sleep_ms(STEP_MS);
    _exit(0);
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 3) {
        fprintf(stderr, "usage: unixgreeting WORKDIR GO_FILE [SECONDS=3]\n");
        return 2;
    }
    steps = steps_arg(argc, argv, 3, 3.0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s/sock", argv[1]);
    unlink(addr.sun_path);
    int listener = socket(AF_UNIX, SOCK_STREAM, 0);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 4)) {
        perror("listener");
        return 2;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        child(&addr);

    while (access(argv[2], F_OK) != 0)
        sleep_ms(10);
    int s = accept(listener, NULL, NULL);
    if (s < 0) {
        fail("accept: %s", strerror(errno));
        return finish(0);
    }
    char got[64] = {0};
    char control[CMSG_SPACE(sizeof(int))] = {0};
    struct iovec iov = {.iov_base = got, .iov_len = sizeof got - 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    ssize_t n = recvmsg(s, &msg, 0);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (n != (ssize_t)sizeof greeting || memcmp(got, greeting, sizeof greeting))
        fail("the greeting is %zd bytes '%s', not '%s'", n, got, greeting);
    else if (!c || c->cmsg_type != SCM_RIGHTS)
        fail("the greeting came without its descriptor");
    else {
        int fd;
        memcpy(&fd, CMSG_DATA(c), sizeof fd);
        if (write(fd, through_pipe, sizeof through_pipe) != (ssize_t)sizeof through_pipe)
            fail("write through the passed pipe: %s", strerror(errno));
        close(fd);
    }
    if (write(s, answer, sizeof answer) != (ssize_t)sizeof answer)
        fail("answer: %s", strerror(errno));
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the client ended with status %#x", status);
    return finish(mix64((uint64_t)n));
}
