/* detach.h: the classic way a server becomes a daemon, for the test programs that check a
 * daemon's session, group and parent across a restart (daemon.c, daemonize.c).
 *
 * Called in a child of the launched process: it calls setsid(), forks the daemon and exits;
 * only the daemon returns, once it has been adopted (its parent, the middle process, gone).
 * Returns the session (the middle process's pid, which no process has any more) and sets
 * *adopted_by to the daemon's new parent.
 */
#ifndef CKPT_TEST_DETACH_H
#define CKPT_TEST_DETACH_H

#include <unistd.h>

static pid_t detach_as_daemon(pid_t *adopted_by)
{
    pid_t sid = setsid();
    if (sid < 0)
        _exit(2);
    pid_t b = fork();
    if (b != 0)
        _exit(b < 0 ? 2 : 0);
    while (getppid() == sid)
        sleep_ms(1);
    *adopted_by = getppid();
    return sid;
}

#endif
