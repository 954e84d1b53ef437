/* Contention and waiting for events side by side, each timed by the workload itself:
 *
 * - two workers take a `static` mutex (a local symbol, `b` in nm) for 1 ms at a time in
 *   update_table: contention;
 * - two consumers wait on one condition variable that a producer signals every 2 ms
 *   (wait_for_work): waiting for an event, not contention (glibc's waiters sleep on either of its
 *   two `__g_signals` words: still one condition variable);
 * - the main thread joins the workers right after starting them: waiting for a thread's exit. It
 *   is the process's first futex wait, begun before a profiler can have read its memory map.
 *
 *   waits SECONDS
 *
 * Prints at exit: TRUTH pid=<pid> table_lock=<address> wait_ns=<the workers' waits for
 * table_lock> ready=<the condition variable's address> cond_wait_ns=<the consumers' time in
 * pthread_cond_wait> join_ns=<the main thread's time in pthread_join>
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t ready_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready = PTHREAD_COND_INITIALIZER;
static int work_items;
static int done;
static double seconds;
static volatile unsigned long sink;
static long long wait_ns, cond_wait_ns;

__attribute__((noinline)) void update_table(void) {
    long long before = now_ns();
    pthread_mutex_lock(&table_lock);
    __atomic_fetch_add(&wait_ns, now_ns() - before, __ATOMIC_RELAXED);
    spin_for(1000000);
    pthread_mutex_unlock(&table_lock);
    sink++;
}

static void *worker(void *arg) {
    (void)arg;
    long long end = now_ns() + (long long)(seconds * 1e9);
    while (now_ns() < end) {
        update_table();
        spin_for(100000);
    }
    return NULL;
}

__attribute__((noinline)) int wait_for_work(void) {
    pthread_mutex_lock(&ready_lock);
    while (work_items == 0 && !done) {
        long long before = now_ns();
        pthread_cond_wait(&ready, &ready_lock);
        __atomic_fetch_add(&cond_wait_ns, now_ns() - before, __ATOMIC_RELAXED);
    }
    int got = work_items > 0;
    if (got) work_items--;
    pthread_mutex_unlock(&ready_lock);
    return got;
}

static void *consumer(void *arg) {
    (void)arg;
    while (wait_for_work()) sink++;
    return NULL;
}

static void *producer(void *arg) {
    (void)arg;
    long long end = now_ns() + (long long)(seconds * 1e9);
    while (now_ns() < end) {
        struct timespec pause = {0, 2000000};
        nanosleep(&pause, NULL);
        pthread_mutex_lock(&ready_lock);
        work_items++;
        pthread_cond_signal(&ready);
        pthread_mutex_unlock(&ready_lock);
    }
    pthread_mutex_lock(&ready_lock);
    done = 1;
    pthread_cond_broadcast(&ready);
    pthread_mutex_unlock(&ready_lock);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: waits SECONDS\n");
        return 2;
    }
    seconds = atof(argv[1]);
    pthread_t workers[2], cons[2], prod;
    for (int i = 0; i < 2; i++) pthread_create(&cons[i], NULL, consumer, NULL);
    pthread_create(&prod, NULL, producer, NULL);
    for (int i = 0; i < 2; i++) pthread_create(&workers[i], NULL, worker, NULL);
    long long before = now_ns();
    for (int i = 0; i < 2; i++) pthread_join(workers[i], NULL);
    pthread_join(prod, NULL);
    for (int i = 0; i < 2; i++) pthread_join(cons[i], NULL);
    long long join_ns = now_ns() - before;
    printf("TRUTH pid=%d table_lock=%lu wait_ns=%lld ready=%lu cond_wait_ns=%lld join_ns=%lld\n",
           (int)getpid(), (unsigned long)&table_lock, wait_ns, (unsigned long)&ready, cond_wait_ns,
           join_ns);
    return 0;
}
