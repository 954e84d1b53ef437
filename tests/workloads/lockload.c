/* Lock contention with known truth: THREADS threads take one shared global mutex for ~1 ms at a
 * time (critical_section), timing their own waits around pthread_mutex_lock, and take a private
 * mutex of their own many times, never contended.
 *
 *   lockload THREADS SECONDS [MIN_WAIT_SECONDS]
 *                                   (and on past SECONDS until the threads' waits for the shared
 *                                   lock add up to MIN_WAIT_SECONDS: as much contention on a busy
 *                                   machine, where descheduled threads contend less)
 *   lockload loop N                 N uncontended lock/unlock pairs, one thread (benchmarks)
 *   lockload contend N THREADS      N acquisitions of one mutex over THREADS threads, held 2 us
 *   lockload mmap THREADS SECONDS   threads mapping, touching and unmapping memory: contention on
 *                                   the kernel's mmap lock (no user-space lock at all)
 *   lockload reuse SECONDS          a heap mutex contended (first_use), destroyed and freed; then
 *                                   an rwlock in the same memory contended (second_use). Prints
 *                                   TRUTH pid= first=<addr> second=<addr> wait1_ns= wait2_ns=
 *                                   held1_ns= held2_ns=
 *
 *   lockload stuck SECONDS          the main thread holds stuck_lock for SECONDS; stuck_early blocks on
 *                                   it at once, stuck_late once SIGUSR2 arrives (a thread stuck on a
 *                                   lock from before a run and one from within it). Prints TRUTH
 *                                   pid= lock=<address> at exit.
 *
 * SIGUSR1 ends THREADS SECONDS early (the workers finish their round): a test that needs its target
 * to exit in the middle of a run says when. The benchmark modes print ELAPSED=<ns>.
 * Prints at exit: TRUTH pid=<pid> shared=<address> wait_ns=<sum of every thread's waits for the
 * shared lock> hold_ns=<sum of its holds> acquisitions=<n> held_while_waited_ns=<see below>
 * private0=<address> private1=... (decimal addresses)
 *
 * With LOCKLOAD_WAITS set in the environment it also prints, before TRUTH, `CLOCK mono=<ns>
 * real=<ns>` (the two clocks read together) and one `WAIT <from> <to>` line per contended wait for
 * the shared lock (over 1 us, monotonic ns): the truth per interval, for windows.
 *
 * held_while_waited_ns (held1_ns, held2_ns for reuse) is the truth for what a profiler charges to
 * the holders: the part of every wait during which another thread held the lock. The rest of a
 * wait is the hand-over (released, the woken waiter not yet running), which on one CPU can be
 * most of it.
 */
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;

enum { MAX_THREADS = 16 };
static double seconds;
static volatile unsigned long sink;
static volatile sig_atomic_t stop_early;
static void on_stop(int sig) { (void)sig; stop_early = 1; }

/* When a thread waited for or held one lock, from its own clock. */
struct span {
    long long from, to;
};
struct spans {
    struct span *at;
    size_t n, cap;
};

static void spans_add(struct spans *s, long long from, long long to) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->at = realloc(s->at, s->cap * sizeof *s->at);
        if (!s->at) abort();
    }
    s->at[s->n++] = (struct span){from, to};
}

static int by_start(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    return (x->from > y->from) - (x->from < y->from);
}

/* The time the waits overlap the holds. Holds of one exclusive lock never overlap each other, and
 * a thread never waits while it holds, so each wait overlaps only other threads' holds. */
static long long held_while_waited(struct spans *waits, struct spans *holds) {
    qsort(holds->at, holds->n, sizeof *holds->at, by_start);
    long long total = 0;
    for (size_t i = 0; i < waits->n; i++) {
        struct span w = waits->at[i];
        /* The first hold that ends after the wait begins. */
        size_t lo = 0, hi = holds->n;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (holds->at[mid].to <= w.from) lo = mid + 1;
            else hi = mid;
        }
        for (size_t j = lo; j < holds->n && holds->at[j].from < w.to; j++) {
            long long from = holds->at[j].from > w.from ? holds->at[j].from : w.from;
            long long to = holds->at[j].to < w.to ? holds->at[j].to : w.to;
            if (to > from) total += to - from;
        }
    }
    return total;
}

struct worker {
    pthread_t thread;
    struct spans waits, holds;
    pthread_mutex_t private_lock;
    long long wait_ns;
    long long hold_ns;
    long long acquisitions;
};

/* Holds the shared lock for 1 ms: its waiters' stacks and the releasing stack both name it. */
__attribute__((noinline)) void critical_section(struct worker *w) {
    long long before = now_ns();
    pthread_mutex_lock(&shared_lock);
    long long taken = now_ns();
    __atomic_fetch_add(&w->wait_ns, taken - before, __ATOMIC_RELAXED);
    spin_for(1000000);
    /* 1 ms of spinning, longer when the holder is preempted (a busy machine) */
    long long releasing = now_ns();
    w->hold_ns += releasing - taken;
    pthread_mutex_unlock(&shared_lock);
    spans_add(&w->waits, before, taken);
    spans_add(&w->holds, taken, releasing);
    /* After the unlock, so that it is a call, not a tail jump: the releasing stack keeps this
     * function. */
    w->acquisitions++;
}

/* Never contended: only its own thread takes it. */
__attribute__((noinline)) void private_work(struct worker *w) {
    for (int i = 0; i < 100; i++) {
        pthread_mutex_lock(&w->private_lock);
        sink++;
        pthread_mutex_unlock(&w->private_lock);
    }
    spin_for(200000);
}

static struct worker *all_workers;
static int worker_count;
static long long min_wait_ns;

static long long total_wait_ns(void) {
    long long total = 0;
    for (int i = 0; i < worker_count; i++) total += __atomic_load_n(&all_workers[i].wait_ns, __ATOMIC_RELAXED);
    return total;
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    long long end = now_ns() + (long long)(seconds * 1e9);
    while (!stop_early && (now_ns() < end || total_wait_ns() < min_wait_ns)) {
        critical_section(w);
        private_work(w);
    }
    return NULL;
}

static long long contend_left;
static pthread_mutex_t contend_lock = PTHREAD_MUTEX_INITIALIZER;

static void *contender(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&contend_lock);
        int done = contend_left <= 0;
        contend_left--;
        spin_for(2000);
        pthread_mutex_unlock(&contend_lock);
        if (done) return NULL;
        spin_for(2000);
    }
}

static void *mapper(void *arg) {
    (void)arg;
    long long end = now_ns() + (long long)(seconds * 1e9);
    while (now_ns() < end) {
        char *p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) abort();
        for (int i = 0; i < 1 << 16; i += 4096) p[i] = 1;
        munmap(p, 1 << 16);
    }
    return NULL;
}

/* One lock's memory, used twice. */
union reused {
    pthread_mutex_t mutex;
    pthread_rwlock_t rwlock;
};
static union reused *reused;
static long long reuse_wait[2];
static struct spans reuse_waits[2], reuse_holds[2];
static pthread_mutex_t reuse_count = PTHREAD_MUTEX_INITIALIZER;
/* Held 5 ms: long against what a probe adds to each wait on the workload's own clock (tens of us
 * in an emulated CPU), which is not lock waiting and not in the profiler's figure. */
enum { REUSE_HOLD_NS = 5000000 };

static void reuse_record(int use, long long before, long long taken, long long releasing) {
    pthread_mutex_lock(&reuse_count);
    reuse_wait[use] += taken - before;
    spans_add(&reuse_waits[use], before, taken);
    spans_add(&reuse_holds[use], taken, releasing);
    pthread_mutex_unlock(&reuse_count);
}

__attribute__((noinline)) void first_use(void) {
    long long before = now_ns();
    pthread_mutex_lock(&reused->mutex);
    long long taken = now_ns();
    spin_for(REUSE_HOLD_NS);
    long long releasing = now_ns();
    pthread_mutex_unlock(&reused->mutex);
    reuse_record(0, before, taken, releasing);
}

__attribute__((noinline)) void second_use(void) {
    long long before = now_ns();
    pthread_rwlock_wrlock(&reused->rwlock);
    long long taken = now_ns();
    spin_for(REUSE_HOLD_NS);
    long long releasing = now_ns();
    pthread_rwlock_unlock(&reused->rwlock);
    reuse_record(1, before, taken, releasing);
}

static void *reuser(void *arg) {
    void (*use)(void) = (void (*)(void))arg;
    long long end = now_ns() + (long long)(seconds * 1e9 / 2);
    while (now_ns() < end) use();
    return NULL;
}

static void run_phase(void (*use)(void)) {
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, reuser, (void *)use);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
}

static pthread_mutex_t stuck_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile sig_atomic_t late_wanted;

__attribute__((noinline)) void *stuck_early(void *arg) {
    pthread_mutex_lock(&stuck_lock);
    pthread_mutex_unlock(&stuck_lock);
    return arg;
}

__attribute__((noinline)) void *stuck_late(void *arg) {
    pthread_mutex_lock(&stuck_lock);
    pthread_mutex_unlock(&stuck_lock);
    return arg;
}

static void on_late(int sig) {
    (void)sig;
    late_wanted = 1;
}

static int stuck(double secs) {
    signal(SIGUSR2, on_late);
    pthread_mutex_lock(&stuck_lock);
    pthread_t early, late;
    int late_started = 0;
    pthread_create(&early, NULL, stuck_early, NULL);
    long long end = now_ns() + (long long)(secs * 1e9);
    while (now_ns() < end) {
        if (late_wanted && !late_started) late_started = pthread_create(&late, NULL, stuck_late, NULL) == 0;
        usleep(1000);
    }
    pthread_mutex_unlock(&stuck_lock);
    pthread_join(early, NULL);
    if (late_started) pthread_join(late, NULL);
    printf("TRUTH pid=%d lock=%lu\n", (int)getpid(), (unsigned long)&stuck_lock);
    return 0;
}

static int special(int argc, char **argv) {
    if (strcmp(argv[1], "stuck") == 0) return stuck(atof(argv[2]));
    if (strcmp(argv[1], "mmap") == 0 && argc > 3) {
        int threads = atoi(argv[2]);
        seconds = atof(argv[3]);
        pthread_t t[MAX_THREADS];
        for (int i = 0; i < threads && i < MAX_THREADS; i++) pthread_create(&t[i], NULL, mapper, NULL);
        for (int i = 0; i < threads && i < MAX_THREADS; i++) pthread_join(t[i], NULL);
        printf("TRUTH pid=%d\n", (int)getpid());
        return 0;
    }
    if (strcmp(argv[1], "reuse") == 0) {
        seconds = atof(argv[2]);
        reused = malloc(sizeof *reused);
        pthread_mutex_init(&reused->mutex, NULL);
        unsigned long first = (unsigned long)reused;
        run_phase(first_use);
        pthread_mutex_destroy(&reused->mutex);
        free(reused);
        reused = malloc(sizeof *reused);
        pthread_rwlock_init(&reused->rwlock, NULL);
        unsigned long second = (unsigned long)reused;
        run_phase(second_use);
        printf("TRUTH pid=%d first=%lu second=%lu wait1_ns=%lld wait2_ns=%lld held1_ns=%lld held2_ns=%lld\n",
               (int)getpid(), first, second, reuse_wait[0], reuse_wait[1],
               held_while_waited(&reuse_waits[0], &reuse_holds[0]),
               held_while_waited(&reuse_waits[1], &reuse_holds[1]));
        return 0;
    }
    return 2;
}

static int bench(int argc, char **argv) {
    long long n = atoll(argv[2]);
    long long start = now_ns();
    if (strcmp(argv[1], "loop") == 0) {
        pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
        for (long long i = 0; i < n; i++) {
            pthread_mutex_lock(&lock);
            sink++;
            pthread_mutex_unlock(&lock);
        }
    } else if (argc > 3) {
        int threads = atoi(argv[3]);
        pthread_t t[MAX_THREADS];
        contend_left = n;
        for (int i = 0; i < threads && i < MAX_THREADS; i++) pthread_create(&t[i], NULL, contender, NULL);
        for (int i = 0; i < threads && i < MAX_THREADS; i++) pthread_join(t[i], NULL);
    } else {
        return 2;
    }
    printf("ELAPSED=%lld\n", now_ns() - start);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && (strcmp(argv[1], "mmap") == 0 || strcmp(argv[1], "reuse") == 0 || strcmp(argv[1], "stuck") == 0))
        return special(argc, argv);
    if (argc >= 3 && (strcmp(argv[1], "loop") == 0 || strcmp(argv[1], "contend") == 0)) return bench(argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: %s THREADS SECONDS\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    if (threads < 1 || threads > MAX_THREADS) return 2;
    seconds = atof(argv[2]);
    if (argc > 3) min_wait_ns = (long long)(atof(argv[3]) * 1e9);
    signal(SIGUSR1, on_stop);
    static struct worker workers[MAX_THREADS];
    all_workers = workers;
    worker_count = threads;
    for (int i = 0; i < threads; i++) {
        pthread_mutex_init(&workers[i].private_lock, NULL);
        pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]);
    }
    long long wait_ns = 0, hold_ns = 0, acquisitions = 0;
    struct spans waits = {0}, holds = {0};
    for (int i = 0; i < threads; i++) {
        pthread_join(workers[i].thread, NULL);
        wait_ns += workers[i].wait_ns;
        hold_ns += workers[i].hold_ns;
        acquisitions += workers[i].acquisitions;
        for (size_t j = 0; j < workers[i].waits.n; j++)
            spans_add(&waits, workers[i].waits.at[j].from, workers[i].waits.at[j].to);
        for (size_t j = 0; j < workers[i].holds.n; j++)
            spans_add(&holds, workers[i].holds.at[j].from, workers[i].holds.at[j].to);
    }
    if (getenv("LOCKLOAD_WAITS")) {
        struct timespec real;
        long long mono = now_ns();
        clock_gettime(CLOCK_REALTIME, &real);
        printf("CLOCK mono=%lld real=%lld\n", mono, real.tv_sec * 1000000000LL + real.tv_nsec);
        for (size_t j = 0; j < waits.n; j++)
            if (waits.at[j].to - waits.at[j].from > 1000) printf("WAIT %lld %lld\n", waits.at[j].from, waits.at[j].to);
    }
    printf("TRUTH pid=%d shared=%lu wait_ns=%lld hold_ns=%lld acquisitions=%lld held_while_waited_ns=%lld",
           (int)getpid(), (unsigned long)&shared_lock, wait_ns, hold_ns, acquisitions,
           held_while_waited(&waits, &holds));
    for (int i = 0; i < threads; i++)
        printf(" private%d=%lu", i, (unsigned long)&workers[i].private_lock);
    printf("\n");
    return 0;
}
