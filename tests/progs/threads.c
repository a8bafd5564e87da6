/* threads: 8 threads sharing a bounded queue (one mutex, two condition variables).
 *
 * Checks that threads blocked in futex waits (pthread_cond_wait), in sleeps and running survive
 * checkpoint/restart, and that pthread_join still works afterwards (clear_child_tid). 4 producers
 * push deterministic items, 4 consumers pop them and sum a hash of each; the total does not depend
 * on scheduling, so RESULT equals an uninterrupted run's; PASS if it equals the total computed
 * directly by the main thread and every item was consumed exactly once.
 *
 * Usage: threads [SECONDS=5]
 */
#include "common.h"
#include <pthread.h>

#define NPROD 4
#define NCONS 4
#define QCAP 16

static struct {
    pthread_mutex_t lock;
    pthread_cond_t not_full, not_empty;
    uint64_t buf[QCAP];
    int head, count;
    long taken, total;
} q = {.lock = PTHREAD_MUTEX_INITIALIZER,
       .not_full = PTHREAD_COND_INITIALIZER,
       .not_empty = PTHREAD_COND_INITIALIZER};

static long items_per_producer;

static uint64_t item(long p, long k) { return mix64(((uint64_t)p << 40) ^ (uint64_t)k); }

static uint64_t work(uint64_t v)
{
    for (int r = 0; r < 200; r++)
        v = mix64(v);
    return v;
}

static void push(uint64_t v)
{
    pthread_mutex_lock(&q.lock);
    while (q.count == QCAP)
        pthread_cond_wait(&q.not_full, &q.lock);
    q.buf[(q.head + q.count) % QCAP] = v;
    q.count++;
    pthread_cond_signal(&q.not_empty);
    pthread_mutex_unlock(&q.lock);
}

/* Returns 0 when every item has been taken. */
static int pop(uint64_t *v)
{
    pthread_mutex_lock(&q.lock);
    while (q.count == 0 && q.taken < q.total)
        pthread_cond_wait(&q.not_empty, &q.lock);
    if (q.count == 0) {
        pthread_mutex_unlock(&q.lock);
        return 0;
    }
    *v = q.buf[q.head];
    q.head = (q.head + 1) % QCAP;
    q.count--;
    q.taken++;
    if (q.taken == q.total)
        pthread_cond_broadcast(&q.not_empty); /* wake the other consumers: done */
    pthread_cond_signal(&q.not_full);
    pthread_mutex_unlock(&q.lock);
    return 1;
}

static void *producer(void *arg)
{
    long p = (long)arg;
    for (long k = 0; k < items_per_producer; k++) {
        push(item(p, k));
        sleep_ms(STEP_MS);
    }
    return NULL;
}

struct consumer {
    pthread_t thread;
    long index, count;
    uint64_t sum;
};

static void *consumer(void *arg)
{
    struct consumer *c = arg;
    uint64_t v;
    while (pop(&v)) {
        c->sum += work(v);
        c->count++;
        sleep_ms(2 + 3 * (unsigned)c->index); /* consumers run at different paces */
    }
    return NULL;
}

int main(int argc, char **argv)
{
    start_marker();
    items_per_producer = steps_arg(argc, argv, 1, 5.0);
    q.total = items_per_producer * NPROD;

    pthread_t prod[NPROD];
    struct consumer cons[NCONS];
    for (long c = 0; c < NCONS; c++) {
        cons[c] = (struct consumer){.index = c};
        if (pthread_create(&cons[c].thread, NULL, consumer, &cons[c]) != 0)
            return 2;
    }
    for (long p = 0; p < NPROD; p++)
        if (pthread_create(&prod[p], NULL, producer, (void *)p) != 0)
            return 2;

    for (int p = 0; p < NPROD; p++)
        pthread_join(prod[p], NULL);
    uint64_t total = 0;
    long count = 0;
    for (int c = 0; c < NCONS; c++) {
        pthread_join(cons[c].thread, NULL);
        total += cons[c].sum;
        count += cons[c].count;
    }

    uint64_t expect = 0;
    for (long p = 0; p < NPROD; p++)
        for (long k = 0; k < items_per_producer; k++)
            expect += work(item(p, k));
    if (count != q.total)
        fail("consumed %ld items, expected %ld", count, q.total);
    if (total != expect)
        fail("consumers' total %016llx != expected %016llx", (unsigned long long)total,
             (unsigned long long)expect);
    return finish(mix64(total ^ (uint64_t)count));
}
