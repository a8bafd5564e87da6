/* ipcns: an IPC namespace the job made (unshare --ipc, a container runtime inside the job) must
 * come back with its System V objects and POSIX message queues, shared by the processes that
 * were in it, while the job's own namespace keeps its objects of the same keys and names.
 *
 * The main process creates, in the job's namespace, a segment of key KEY (4096 bytes, holding
 * "job segment") and a queue /ckpt-ipcns holding one message "job", and forks A. A detaches
 * the segment and closes the queue, makes an IPC namespace (first a user namespace where it is
 * root, as an ordinary user must: unshare -Uri; as root, the IPC namespace alone) and creates there a segment of the same key (8192 bytes), a
 * semaphore set (a mutex and a constant 42), a System V message queue and a POSIX queue of the
 * same name /ckpt-ipcns, then forks B, which stays in it. At every step A adds 1 to a counter in
 * its segment under the mutex and sends step message number n on both queues; B receives the
 * next one from each (they must come in order, none lost or twice) and reads the counter, which
 * must never go back and must keep changing (a copy of the segment would freeze it). B looks
 * the key up at every step: it must name A's segment. The main process checks at every step
 * that the key names its own segment, with its contents, and that A's semaphore set is not
 * seen. At the end: A's constant semaphore is 42, the job's queue still holds "job". Prints
 * PASS or FAIL <what>.
 *
 * Usage: ipcns [SECONDS=5]
 */
#include "common.h"
#include "userns.h"

#include <fcntl.h>
#include <mqueue.h>
#include <sched.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/wait.h>

/* A key and a queue name of this run's own (set first thing in main): runs side by side (the
 * reference in the machine's namespace, the suite run as root and as a user at once) must not
 * meet. */
static key_t key_base;
static char queue_name[64];
#define KEY key_base
#define QUEUE queue_name
#define JOB_TEXT "job segment"

union semun {
    int val;
    struct semid_ds *buf;
    unsigned short *array;
};

struct msg {
    long mtype;
    char text[32];
};

static void sem_step(int semid, short by)
{
    struct sembuf op = {.sem_num = 0, .sem_op = by, .sem_flg = 0};
    while (semop(semid, &op, 1) != 0)
        if (errno != EINTR) {
            printf("FAIL semop: %s\n", strerror(errno));
            exit(1);
        }
}

/* The size of the segment a key names in the caller's namespace, or -1. */
static long segment_size(int *id)
{
    *id = shmget(KEY, 0, 0);
    struct shmid_ds ds;
    if (*id < 0 || shmctl(*id, IPC_STAT, &ds) != 0)
        return -1;
    return (long)ds.shm_segsz;
}

/* B: receives every message in order, watches the counter, for `steps` steps. */
static int run_b(long steps, volatile long *counter, int a_shm, int msqid, mqd_t q)
{
    long next_msg = 0, next_mq = 0, last = -1, changed_at = 0;
    for (long step = 0; step < steps; step++) {
        int id;
        if (segment_size(&id) != 8192 || id != a_shm)
            fail("B step %ld: the key names segment %d, not A's %d", step, id, a_shm);
        struct msg m;
        if (msgrcv(msqid, &m, sizeof m.text, 0, IPC_NOWAIT) >= 0) {
            long n = -1;
            if (sscanf(m.text, "a%ld", &n) != 1 || n != next_msg)
                fail("B step %ld: System V message %s, want a%ld", step, m.text, next_msg);
            next_msg = n + 1;
        } else if (errno != ENOMSG && errno != EINTR)
            fail("B step %ld: msgrcv: %s", step, strerror(errno));
        char text[65];
        ssize_t got = mq_receive(q, text, sizeof text - 1, NULL);
        if (got > 0) {
            long n = -1;
            text[got] = 0;
            if (sscanf(text, "q%ld", &n) != 1 || n != next_mq)
                fail("B step %ld: POSIX message %s, want q%ld", step, text, next_mq);
            next_mq = n + 1;
        } else if (errno != EAGAIN && errno != EINTR)
            fail("B step %ld: mq_receive: %s", step, strerror(errno));
        long c = *counter;
        if (c < last)
            fail("B step %ld: the counter went back from %ld to %ld", step, last, c);
        else if (c != last) {
            last = c;
            changed_at = step;
        }
        if (step - changed_at == 100)
            fail("B step %ld: the counter has not changed since step %ld: B does not share A's segment", step, changed_at);
        sleep_ms(STEP_MS);
    }
    if (next_msg == 0 || next_mq == 0)
        fail("B received no message (%ld System V, %ld POSIX)", next_msg, next_mq);
    return failures ? 1 : 0;
}

/* A: leaves the job's objects (a queue and a mapping of the job's namespace would come back in
 * its own: ckpt refuses them), makes the namespace and its objects, works until B has ended. */
static int run_a(long steps, char *job_segment, mqd_t job_queue)
{
    if (shmdt(job_segment) != 0 || mq_close(job_queue) != 0)
        return printf("FAIL set-up: leave the job's objects: %s\n", strerror(errno)), 1;
    if (geteuid() != 0)
        unshare_as_root(0);
    if (unshare(CLONE_NEWIPC) != 0)
        return printf("FAIL set-up: unshare(CLONE_NEWIPC): %s\n", strerror(errno)), 1;
    int shm = shmget(KEY, 8192, IPC_CREAT | IPC_EXCL | 0600);
    int semid = semget(KEY + 1, 2, IPC_CREAT | IPC_EXCL | 0600);
    int msqid = msgget(KEY + 2, IPC_CREAT | IPC_EXCL | 0600);
    struct mq_attr attr = {.mq_maxmsg = 8, .mq_msgsize = 64};
    mqd_t q = mq_open(QUEUE, O_CREAT | O_EXCL | O_RDWR | O_NONBLOCK, 0600, &attr);
    if (shm < 0 || semid < 0 || msqid < 0 || q == (mqd_t)-1)
        return printf("FAIL set-up: A's objects (the job's leaked into A's namespace?): %s\n", strerror(errno)), 1;
    volatile long *counter = shmat(shm, NULL, 0);
    if (counter == (void *)-1)
        return printf("FAIL set-up: shmat: %s\n", strerror(errno)), 1;
    unsigned short values[2] = {1, 42};
    if (semctl(semid, 0, SETALL, (union semun){.array = values}) != 0)
        return printf("FAIL set-up: SETALL: %s\n", strerror(errno)), 1;
    pid_t b = fork();
    if (b == 0)
        exit(run_b(steps, counter, shm, msqid, q));
    long sent_msg = 0, sent_mq = 0;
    for (long step = 1;; step++) {
        int status;
        pid_t done = waitpid(b, &status, WNOHANG);
        if (done == b) {
            int v = semctl(semid, 1, GETVAL);
            if (v != 42)
                fail("A: the constant semaphore is %d, not 42", v);
            return WIFEXITED(status) && WEXITSTATUS(status) == 0 && failures == 0 ? 0 : 1;
        }
        sem_step(semid, -1);
        *counter += 1;
        sem_step(semid, 1);
        struct msg m = {.mtype = 1};
        snprintf(m.text, sizeof m.text, "a%ld", sent_msg);
        if (msgsnd(msqid, &m, sizeof m.text, IPC_NOWAIT) == 0)
            sent_msg++;
        else if (errno != EAGAIN && errno != EINTR)
            fail("A step %ld: msgsnd: %s", step, strerror(errno));
        char text[64];
        int len = snprintf(text, sizeof text, "q%ld", sent_mq);
        if (mq_send(q, text, (size_t)len, 0) == 0)
            sent_mq++;
        else if (errno != EAGAIN && errno != EINTR)
            fail("A step %ld: mq_send: %s", step, strerror(errno));
        sleep_ms(STEP_MS);
    }
}

int main(int argc, char **argv)
{
    start_marker();
    uint64_t tag = mix64((uint64_t)now_ns(CLOCK_REALTIME) ^ (uint64_t)getpid());
    key_base = (key_t)(0x5e000000 | (tag & 0xffff) << 4);
    snprintf(queue_name, sizeof queue_name, "/ckpt-ipcns-%016llx", (unsigned long long)tag);
    long steps = steps_arg(argc, argv, 1, 5.0);
    /* What a run killed midway left (the reference run is in the machine's namespace). */
    int left = shmget(KEY, 0, 0);
    if (left >= 0)
        shmctl(left, IPC_RMID, NULL);
    mq_unlink(QUEUE);
    int shm = shmget(KEY, 4096, IPC_CREAT | IPC_EXCL | 0600);
    char *mine = shm < 0 ? (void *)-1 : shmat(shm, NULL, 0);
    struct mq_attr attr = {.mq_maxmsg = 4, .mq_msgsize = 32};
    mqd_t q = mq_open(QUEUE, O_CREAT | O_EXCL | O_RDWR | O_NONBLOCK, 0600, &attr);
    if (mine == (void *)-1 || q == (mqd_t)-1 || mq_send(q, "job", 3, 0) != 0)
        return printf("FAIL set-up: the job's objects: %s\n", strerror(errno)), 1;
    strcpy(mine, JOB_TEXT);
    pid_t a = fork();
    if (a == 0)
        exit(run_a(steps, mine, q));
    uint64_t result = 0;
    for (long step = 0; step < steps; step++) {
        int id;
        long size = segment_size(&id);
        if (size != 4096 || id != shm)
            fail("step %ld: the key names segment %d of %ld bytes, not the job's %d of 4096", step, id, size, shm);
        if (strcmp(mine, JOB_TEXT) != 0)
            fail("step %ld: the job's segment holds %.20s", step, mine);
        if (semget(KEY + 1, 0, 0) >= 0)
            fail("step %ld: A's semaphore set is seen from the job's namespace", step);
        result = mix64(result ^ (uint64_t)step);
        sleep_ms(STEP_MS);
    }
    int status;
    if (waitpid(a, &status, 0) != a || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("A ended with status %#x", status);
    char text[64];
    ssize_t got = mq_receive(q, text, sizeof text, NULL);
    if (got != 3 || memcmp(text, "job", 3) != 0)
        fail("the job's queue gave %zd bytes, not \"job\"", got);
    mq_unlink(QUEUE);
    shmctl(shm, IPC_RMID, NULL);
    return finish(result);
}
