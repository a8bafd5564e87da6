/* mpich_finalize_progress.so: loaded with LD_PRELOAD into MPICH 4.0.x ranks (ch4:ucx, Hydra's
 * simple PMI), it keeps UCX progressing while MPI_Finalize waits in its PMI barrier.
 *
 * Why: MPICH 4.0.2 (Debian 12) ends MPI_Finalize by closing every UCX endpoint
 * (ucp_disconnect_nb), progressing UCX until its own closes are done, then waiting in a PMI
 * barrier that does not progress UCX. Over UCX's TCP transport a close completes only when the
 * peer acknowledges it (a zero-length PUT request, answered by a PUT ACK from the peer's
 * progress). A rank whose close the peer acknowledged before the peer began its own closes (the
 * peer entered MPI_Finalize later and progressed in between) goes into the barrier and never
 * answers the peer's request: the peer spins in ucp_worker_progress for good, the first rank
 * waits in PMI for good. Without ckpt, the ring of tests/progs hangs so 2 runs in 40, 8 in 40
 * with two jobs at once; MPICH removed the barrier upstream (pmodels/mpich#6596, 2023). The
 * tests of tests/tests/mpich.rs check ckpt, not this race, so their ranks get this library.
 *
 * What it does: once MPICH has begun closing endpoints, a read() on the PMI socket (PMI_FD)
 * waits for data while progressing the rank's UCP worker, so the peer's close is answered.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>

/* The UCP worker the rank made (MPICH makes one per VNI, one by default: the first is kept),
 * until it is destroyed (PMI is read again after that, in PMI_Finalize). */
static void *worker;
/* Set when MPI_Finalize starts closing endpoints: PMI reads before that are left alone. */
static int disconnecting;

int ucp_worker_create(void *context, const void *params, void **worker_p)
{
    int (*real)(void *, const void *, void **) =
        (int (*)(void *, const void *, void **))dlsym(RTLD_NEXT, "ucp_worker_create");
    int status = real(context, params, worker_p);
    if (status == 0 && worker == NULL)
        worker = *worker_p;
    return status;
}

void ucp_worker_destroy(void *w)
{
    void (*real)(void *) = (void (*)(void *))dlsym(RTLD_NEXT, "ucp_worker_destroy");
    if (w == worker)
        worker = NULL;
    real(w);
}

void *ucp_disconnect_nb(void *ep)
{
    void *(*real)(void *) = (void *(*)(void *))dlsym(RTLD_NEXT, "ucp_disconnect_nb");
    disconnecting = 1;
    return real(ep);
}

ssize_t read(int fd, void *buf, size_t count)
{
    static ssize_t (*real)(int, void *, size_t);
    if (real == NULL)
        real = (ssize_t (*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
    const char *pmi = disconnecting && worker != NULL ? getenv("PMI_FD") : NULL;
    if (pmi != NULL && fd == atoi(pmi)) {
        unsigned (*progress)(void *) = (unsigned (*)(void *))dlsym(RTLD_DEFAULT, "ucp_worker_progress");
        struct pollfd p = {.fd = fd, .events = POLLIN};
        /* A millisecond between rounds: the barrier ends when the slowest rank arrives. */
        while (progress != NULL && poll(&p, 1, 1) == 0)
            progress(worker);
    }
    return real(fd, buf, count);
}
