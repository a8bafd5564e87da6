/* creds: credentials survive checkpoint/restart unchanged, in every thread.
 *
 * At start the main thread and a second thread each note their real/effective/saved uid and gid,
 * their supplementary groups and their capability sets (effective, permitted, inheritable,
 * bounding, ambient, from /proc/thread-self/status); every step both check that nothing changed
 * (a restart must not leave the restorer's credentials or capabilities behind). The program also
 * makes WORKDIR/owned.txt anew at every step (the test checks who owns it) and prints its ids once
 * ("IDS uid gid"), so the test can compare them with the user it ran as.
 *
 * Usage: creds WORKDIR [SECONDS=5]
 */
#include "common.h"

#include <grp.h>
#include <pthread.h>
#include <sys/types.h>

struct creds {
    uid_t ruid, euid, suid;
    gid_t rgid, egid, sgid;
    int ngroups;
    gid_t groups[64];
    char caps[5][32]; /* CapInh, CapPrm, CapEff, CapBnd, CapAmb lines */
};

static void read_creds(struct creds *c)
{
    memset(c, 0, sizeof *c);
    getresuid(&c->ruid, &c->euid, &c->suid);
    getresgid(&c->rgid, &c->egid, &c->sgid);
    c->ngroups = getgroups(64, c->groups);
    FILE *f = fopen("/proc/thread-self/status", "r");
    if (!f) {
        fail("open /proc/thread-self/status: %s", strerror(errno));
        return;
    }
    static const char *names[5] = {"CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"};
    char line[256];
    while (fgets(line, sizeof line, f)) {
        for (int i = 0; i < 5; i++) {
            if (strncmp(line, names[i], strlen(names[i])) == 0) {
                snprintf(c->caps[i], sizeof c->caps[i], "%s", line + strlen(names[i]));
            }
        }
    }
    fclose(f);
}

static void compare(const char *who, long step, const struct creds *want)
{
    struct creds now;
    read_creds(&now);
    if (now.ruid != want->ruid || now.euid != want->euid || now.suid != want->suid)
        fail("%s step %ld: uids %d/%d/%d, were %d/%d/%d", who, step, now.ruid, now.euid, now.suid, want->ruid, want->euid, want->suid);
    if (now.rgid != want->rgid || now.egid != want->egid || now.sgid != want->sgid)
        fail("%s step %ld: gids %d/%d/%d, were %d/%d/%d", who, step, now.rgid, now.egid, now.sgid, want->rgid, want->egid, want->sgid);
    if (now.ngroups != want->ngroups || memcmp(now.groups, want->groups, sizeof now.groups) != 0)
        fail("%s step %ld: supplementary groups changed (%d, were %d)", who, step, now.ngroups, want->ngroups);
    for (int i = 0; i < 5; i++)
        if (strcmp(now.caps[i], want->caps[i]) != 0)
            fail("%s step %ld: capability set %d is %.18s, was %.18s", who, step, i, now.caps[i], want->caps[i]);
}

static long steps;
static volatile int stop;

static void *second_thread(void *arg)
{
    (void)arg;
    struct creds mine;
    read_creds(&mine);
    for (long i = 0; !stop; i++) {
        compare("thread", i, &mine);
        sleep_ms(STEP_MS);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    start_marker();
    if (argc < 2) {
        fprintf(stderr, "usage: creds WORKDIR [SECONDS]\n");
        return 2;
    }
    const char *dir = argv[1];
    steps = steps_arg(argc, argv, 2, 5.0);
    struct creds mine;
    read_creds(&mine);
    printf("IDS %d %d\n", (int)mine.euid, (int)mine.egid);
    fflush(stdout);
    pthread_t t;
    pthread_create(&t, NULL, second_thread, NULL);
    char path[4096];
    snprintf(path, sizeof path, "%s/owned.txt", dir);
    uint64_t h = 0;
    for (long i = 0; i < steps; i++) {
        compare("main", i, &mine);
        h = mix64(h ^ (uint64_t)i);
        /* A new file each step: its owner is who the process is now (a rewrite would keep the
         * first owner). */
        unlink(path);
        FILE *f = fopen(path, "w");
        if (!f) {
            fail("create %s: %s", path, strerror(errno));
        } else {
            fprintf(f, "%ld\n", i);
            fclose(f);
        }
        sleep_ms(STEP_MS);
    }
    stop = 1;
    pthread_join(t, NULL);
    return finish(h);
}
