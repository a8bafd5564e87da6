/* sysvipc: System V shared memory, semaphores and message queues keep their ids, keys, modes
 * and contents across checkpoint/restart.
 *
 * The parent creates a segment (key 0x5eed0001, mode 0640), a set of 3 semaphores (key
 * 0x5eed0002: a mutex, 7, 1234) and a message queue (key 0x5eed0003), plus a private segment it
 * fills with a pattern and removes (IPC_RMID) while still attached. A child is forked. Both add
 * 1 to a counter in the shared segment N times under the semaphore mutex, one step at a time;
 * the child also sends a message per step (type 1 + i % 3, text "m<i>"), which the parent
 * receives only every other step, so messages wait in the queue at any checkpoint. At the end:
 * the counter is 2N, every message arrived once and in order, the keys still name the same ids,
 * modes and the other two semaphores are as set, and the removed segment still holds its
 * pattern in both processes. RESULT depends only on N and the checks.
 *
 * Usage: sysvipc [SECONDS=4]
 */
#include "common.h"

#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <unistd.h>

/* Keys of this run's own (set first thing in main): runs side by side (the reference in the
 * machine's namespace, the suite run as root and as a user at once) must not meet. */
static key_t key_base;
#define KEY_SHM (key_base + 1)
#define KEY_SEM (key_base + 2)
#define KEY_MSG (key_base + 3)

union semun {
    int val;
    struct semid_ds *buf;
    unsigned short *array;
};

struct msg {
    long mtype;
    char text[32];
};

static int semid;

static void sem_add(int d)
{
    struct sembuf op = {.sem_num = 0, .sem_op = (short)d};
    while (semop(semid, &op, 1) != 0)
        if (errno != EINTR) {
            perror("semop");
            exit(2);
        }
}

static int pattern_ok(const unsigned char *p)
{
    for (int i = 0; i < 8192; i++)
        if (p[i] != (unsigned char)(i * 7 + 3))
            return 0;
    return 1;
}

int main(int argc, char **argv)
{
    start_marker();
    key_base = (key_t)(0x5e000000 | (mix64((uint64_t)now_ns(CLOCK_REALTIME) ^ (uint64_t)getpid()) & 0xffff) << 4);
    long n = steps_arg(argc, argv, 1, 4.0);
    /* Objects left by an earlier run that died (outside ckpt, in the machine's namespace). */
    shmctl(shmget(KEY_SHM, 0, 0), IPC_RMID, NULL);
    semctl(semget(KEY_SEM, 0, 0), 0, IPC_RMID);
    msgctl(msgget(KEY_MSG, 0), IPC_RMID, NULL);
    int shmid = shmget(KEY_SHM, 65536, IPC_CREAT | IPC_EXCL | 0640);
    semid = semget(KEY_SEM, 3, IPC_CREAT | IPC_EXCL | 0640);
    int msqid = msgget(KEY_MSG, IPC_CREAT | IPC_EXCL | 0640);
    int privid = shmget(IPC_PRIVATE, 8192, IPC_CREAT | 0600);
    if (shmid < 0 || semid < 0 || msqid < 0 || privid < 0) {
        perror("create IPC objects (is there one left from an earlier run?)");
        return 2;
    }
    unsigned short init[3] = {1, 7, 1234};
    semctl(semid, 0, SETALL, (union semun){.array = init});
    volatile uint64_t *counter = shmat(shmid, NULL, 0);
    unsigned char *priv = shmat(privid, NULL, 0);
    if (counter == (void *)-1 || priv == (void *)-1) {
        perror("shmat");
        return 2;
    }
    for (int i = 0; i < 8192; i++)
        priv[i] = (unsigned char)(i * 7 + 3);
    shmctl(privid, IPC_RMID, NULL);

    pid_t child = fork();
    int is_child = child == 0;
    for (long i = 0; i < n; i++) {
        sem_add(-1);
        uint64_t v = *counter;
        sleep_ms(1); /* hold the mutex a while, so a checkpoint can land inside */
        *counter = v + 1;
        sem_add(1);
        if (is_child) {
            struct msg m = {.mtype = 1 + i % 3};
            snprintf(m.text, sizeof m.text, "m%ld", i);
            while (msgsnd(msqid, &m, sizeof m.text, 0) != 0 && errno == EINTR)
                ;
        } else if (i % 2 == 1) {
            for (int k = 0; k < 2; k++) {
                static long next;
                struct msg m;
                ssize_t r;
                while ((r = msgrcv(msqid, &m, sizeof m.text, 0, 0)) < 0 && errno == EINTR)
                    ;
                char want[32];
                snprintf(want, sizeof want, "m%ld", next);
                if (r != sizeof m.text || m.mtype != 1 + next % 3 || strcmp(m.text, want) != 0)
                    fail("message %ld: type %ld text %.31s, expected type %ld %s", next, m.mtype,
                         m.text, 1 + next % 3, want);
                next++;
            }
        }
        sleep_ms(STEP_MS);
    }
    if (!pattern_ok(priv))
        fail("%s: the removed segment lost its contents", is_child ? "child" : "parent");
    if (is_child)
        _exit(failures ? 1 : 0);

    int status;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the child failed (status %#x)", status);
    if (*counter != (uint64_t)(2 * n))
        fail("counter is %llu, expected %ld", (unsigned long long)*counter, 2 * n);
    if (shmget(KEY_SHM, 0, 0) != shmid || semget(KEY_SEM, 0, 0) != semid ||
        msgget(KEY_MSG, 0) != msqid)
        fail("the keys name other ids now (%d %d %d, expected %d %d %d)", shmget(KEY_SHM, 0, 0),
             semget(KEY_SEM, 0, 0), msgget(KEY_MSG, 0), shmid, semid, msqid);
    unsigned short now[3] = {0};
    semctl(semid, 0, GETALL, (union semun){.array = now});
    if (now[0] != 1 || now[1] != 7 || now[2] != 1234)
        fail("semaphores are %u %u %u, expected 1 7 1234", now[0], now[1], now[2]);
    struct shmid_ds ds;
    struct msqid_ds mq;
    if (shmctl(shmid, IPC_STAT, &ds) != 0 || (ds.shm_perm.mode & 0777) != 0640 ||
        ds.shm_segsz != 65536)
        fail("segment %d: mode %o size %zu, expected 640 and 65536", shmid,
             ds.shm_perm.mode & 0777, (size_t)ds.shm_segsz);
    if (msgctl(msqid, IPC_STAT, &mq) != 0 || mq.msg_qnum != 0)
        fail("message queue: %lu messages left, expected none", (unsigned long)mq.msg_qnum);
    /* The objects are the job's: remove them, so the next run can create them again. */
    shmctl(shmid, IPC_RMID, NULL);
    semctl(semid, 0, IPC_RMID);
    msgctl(msqid, IPC_RMID, NULL);
    return finish(mix64((uint64_t)n ^ mix64(*counter)));
}
