/* Scheduling test workload with its own ground truth from the kernel.
 *
 *   schedload SECONDS BUSY_THREADS
 *
 * Starts BUSY_THREADS threads that spin (more than there are CPUs, so they wait in the run
 * queue) and one thread that sleeps 1 ms at a time in sleep_known(): thousands of short runs, as
 * a latency-sensitive server thread has. Before exiting, every thread reads its own
 * /proc/self/task/<tid>/schedstat and prints:
 *   TASK tid=<tid> role=busy|sleeper run_delay=<ns> pcount=<n> oncpu=<ns> slept=<ns>
 * where slept is the sleeper's time asleep in sleep_known() by the kernel's accounting (not the
 * wall time of its sleeps, which on a busy machine also holds the waits for a CPU after each).
 *
 *   schedload reuse
 *
 * A thread sleeps 50 x 2 ms and exits; then threads are created until one gets the same thread id,
 * and that one sleeps 600 x 2 ms. Both print their TASK line (role=first, role=second); prints
 * NOREUSE and exits 3 if the id never came back.
 *
 *   schedload naps SECONDS BUSY_THREADS
 *
 * As the first form, but the sleeper sleeps 2.5 s at a time (each sleep spans two or three of a
 * profiler's one-second drains) and also prints NAPS tid=<tid> from=<ns> to=<ns>: the wall-clock
 * (CLOCK_REALTIME) span of its sleeps, during which it is asleep but for microseconds.
 *
 *   schedload crowd SECONDS
 *
 * As the first form with three busy threads, each thread pinned: one busy thread and the sleeper
 * on the first CPU it may use, two busy threads on the last (they queue behind each other), main
 * on the first (on a machine of one CPU, all on it). Every TASK line then says cpu=<the CPU>, and main prints one too (role=main, read after
 * the others exited), and early=<its run_delay as it first ran its own code>: glibc pins a new
 * thread after creating it, so its first waits may end on its creator's CPU.
 *
 *   schedload pingpong ROUND_TRIPS
 *
 * Two threads pass a byte back and forth over two pipes (two context switches per round trip);
 * prints ELAPSED=<ns>. The switch-heavy workload of the sched benchmark.
 *
 *   schedload pingpong ROUND_TRIPS CPU
 *
 * The same, the process pinned to CPU first; also prints TRUTH ping=<tid> pong=<tid>.
 *
 *   schedload twins ROUNDS
 *
 * The main thread sleeps in sleep_known() from two callers, twin_a (2 ms a sleep) and twin_b
 * (1 ms), each twice in turn (a, a, b, b), ROUNDS times: at every sleep the same user registers,
 * the stacks different only in return addresses (into each twin, and from each into the loop).
 * Prints TWINS tid=<tid> a=<ns> b=<ns>: its time asleep in each twin's sleeps, as sleeper's.
 *
 *   schedload twins ROUNDS A_NS B_NS
 *
 * The same with sleeps of A_NS in twin_a and B_NS in twin_b (thousands a second when short).
 *
 *   schedload hop HOPS
 *
 * A thread moves itself between CPUs 0 and 1 (sched_setaffinity), spinning 2 ms on each, HOPS
 * times; prints TRUTH tid=<tid> hops=<n> (the moves that took: the CPU it then ran on changed).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

static double seconds;
static volatile unsigned long sink;

/* Filled by each thread as its last act and printed by main after the joins: anything a thread
 * did after reading its schedstat (a contended print lock, a pipe write) would add waits that the
 * reading does not contain. */
struct result {
    const char *role;
    long long tid, slept;
    unsigned long long oncpu, delay, pcount;
    int cpu; /* pinned to (crowd), else -1 */
    unsigned long long early; /* crowd: its run_delay as it first ran its own code (on its CPU) */
};
static struct result results[66];
/* Everyone stops working before anyone reads: a read taken while others still compete for the
 * CPUs would miss waits the thread still has ahead of it (its exit). Then main lets the threads
 * read one at a time (`turn`), each after the one before has exited, so no thread of the workload
 * is runnable beside one between its read and its exit. */
static pthread_barrier_t done;
static sem_t turn[65];

long long sleep_known(long long ns);

/* This thread's schedstat: on-CPU ns, run-queue wait ns, timeslices. */
static void schedstat(unsigned long long *oncpu, unsigned long long *delay, unsigned long long *pcount) {
    char path[96], buf[128];
    snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat", (long)syscall(SYS_gettid));
    FILE *f = fopen(path, "r");
    if (f && fgets(buf, sizeof buf, f)) sscanf(buf, "%llu %llu %llu", oncpu, delay, pcount);
    if (f) fclose(f);
}

static void report(struct result *r, const char *role, long long slept) {
    r->role = role;
    r->slept = slept;
    r->tid = syscall(SYS_gettid);
    schedstat(&r->oncpu, &r->delay, &r->pcount);
}

/* Sleeps of `ns` in sleep_known() until `end` (wall clock); returns the time the thread spent
 * asleep in them by the kernel's own accounting: elapsed time less the time on a CPU and the
 * time runnable, waiting for one (after each wake-up, longer on a busy machine). */
static long long sleep_until(long long end, long long ns) {
    unsigned long long oncpu0, delay0, n0, oncpu1, delay1, n1;
    long long t0 = now_ns();
    schedstat(&oncpu0, &delay0, &n0);
    while (now_ns() < end) sleep_known(ns);
    schedstat(&oncpu1, &delay1, &n1);
    return now_ns() - t0 - (long long)(oncpu1 - oncpu0) - (long long)(delay1 - delay0);
}

/* Stop with the others, then wait for main to say it is this thread's turn to read. */
static void wait_turn(struct result *r) {
    pthread_barrier_wait(&done);
    sem_wait(&turn[r - results]);
}

/* A pinned thread's waits before its code first runs (glibc sets a new thread's affinity after
 * creating it: its first wait may end on its creator's CPU). */
static void note_early(struct result *r) {
    unsigned long long oncpu, pcount;
    if (r->cpu >= 0) schedstat(&oncpu, &r->early, &pcount);
}

/* One sleep of `ns` in sleep_known(); the time asleep in it, as sleep_until counts it. */
__attribute__((noinline)) static long long asleep(long long ns) {
    unsigned long long oncpu0, delay0, n0, oncpu1, delay1, n1;
    long long t0 = now_ns();
    schedstat(&oncpu0, &delay0, &n0);
    sleep_known(ns);
    schedstat(&oncpu1, &delay1, &n1);
    return now_ns() - t0 - (long long)(oncpu1 - oncpu0) - (long long)(delay1 - delay0);
}

static long long twin_slept[2];

static long long twin_ns[2] = {2000000, 1000000};

__attribute__((noinline)) void twin_a(void) { twin_slept[0] += asleep(twin_ns[0]); }

__attribute__((noinline)) void twin_b(void) { twin_slept[1] += asleep(twin_ns[1]); }

/* Two calls of a twin from one call site: a bound the compiler cannot unroll by. */
static volatile int pair = 2;

static int twins(long rounds) {
    for (long i = 0; i < rounds; i++) {
        for (int j = 0; j < pair; j++) twin_a();
        for (int j = 0; j < pair; j++) twin_b();
    }
    printf("TWINS tid=%ld a=%lld b=%lld\n", (long)syscall(SYS_gettid), twin_slept[0], twin_slept[1]);
    return 0;
}

static void *busy(void *arg) {
    note_early(arg);
    long long end = now_ns() + (long long)(seconds * 1e9);
    while (now_ns() < end)
        for (int i = 0; i < 100000; i++) sink += i;
    wait_turn(arg);
    report(arg, "busy", 0);
    return NULL;
}

/* The nanosleep system call made from this function itself (not through libc, which has no frame
 * pointers), so the off-CPU stack's innermost user frame is this function. */
__attribute__((noinline)) long long sleep_known(long long ns) {
    struct timespec ts = {ns / 1000000000, ns % 1000000000};
    long long t0 = now_ns();
#if defined(__x86_64__)
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "0"(SYS_nanosleep), "D"(&ts), "S"(0) : "rcx", "r11", "memory");
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = SYS_nanosleep;
    register long x0 __asm__("x0") = (long)&ts;
    register long x1 __asm__("x1") = 0;
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1) : "memory");
#else
#error "sleep_known: x86-64 and AArch64 only"
#endif
    return now_ns() - t0;
}

static long long nap_ns = 1000000;
static struct timespec naps_from, naps_to;

static void *sleeper(void *arg) {
    note_early(arg);
    clock_gettime(CLOCK_REALTIME, &naps_from);
    long long slept = sleep_until(now_ns() + (long long)(seconds * 1e9), nap_ns);
    clock_gettime(CLOCK_REALTIME, &naps_to);
    wait_turn(arg);
    report(arg, "sleeper", slept);
    return NULL;
}

static int pipes[2][2];
static long round_trips;

static void *pong(void *arg) {
    (void)arg;
    char c;
    for (long i = 0; i < round_trips; i++) {
        if (read(pipes[0][0], &c, 1) != 1 || write(pipes[1][1], &c, 1) != 1) break;
    }
    return NULL;
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static long long pong_tid;

static void *pinned_pong(void *arg) {
    pong_tid = syscall(SYS_gettid);
    return pong(arg);
}

static int pingpong(long n, int cpu) {
    pthread_t t;
    char c = 'x';
    if (cpu >= 0) pin(cpu);
    round_trips = n;
    if (pipe(pipes[0]) || pipe(pipes[1])) return 1;
    pthread_create(&t, NULL, cpu >= 0 ? pinned_pong : pong, NULL);
    long long t0 = now_ns();
    for (long i = 0; i < n; i++) {
        if (write(pipes[0][1], &c, 1) != 1 || read(pipes[1][0], &c, 1) != 1) return 1;
    }
    long long elapsed = now_ns() - t0;
    pthread_join(t, NULL);
    printf("ELAPSED=%lld\n", elapsed);
    if (cpu >= 0) printf("TRUTH ping=%ld pong=%lld\n", (long)syscall(SYS_gettid), pong_tid);
    return 0;
}

static int hop(long hops) {
    long moved = 0;
    int last = -1;
    for (long i = 0; i < hops; i++) {
        pin(i % 2);
        long long until = now_ns() + 2000000;
        while (now_ns() < until) {
        }
        int cpu = sched_getcpu();
        moved += last >= 0 && cpu != last;
        last = cpu;
    }
    printf("TRUTH tid=%ld hops=%ld\n", (long)syscall(SYS_gettid), moved);
    return 0;
}

static long long reuse_target;

static void *first_life(void *arg) {
    long long slept = 0;
    for (int i = 0; i < 50; i++) slept += sleep_known(2000000);
    report(arg, "first", slept);
    return NULL;
}

/* Most of these exit at once; the one that got the first thread's id lives a second life. */
static void *maybe_second_life(void *arg) {
    if (syscall(SYS_gettid) != reuse_target) return NULL;
    long long slept = 0;
    for (int i = 0; i < 600; i++) slept += sleep_known(2000000);
    report(arg, "second", slept);
    return arg;
}

static int reuse(void) {
    pthread_t t;
    void *ret = NULL;
    pthread_create(&t, NULL, first_life, &results[0]);
    pthread_join(t, NULL);
    reuse_target = results[0].tid;
    for (long attempt = 0; attempt < 1000000 && ret == NULL; attempt++) {
        if (pthread_create(&t, NULL, maybe_second_life, &results[1])) return 1;
        pthread_join(t, &ret);
    }
    if (ret == NULL) {
        printf("NOREUSE\n");
        return 3;
    }
    for (int i = 0; i < 2; i++)
        printf("TASK tid=%lld role=%s run_delay=%llu pcount=%llu oncpu=%llu slept=%lld\n", results[i].tid,
               results[i].role, results[i].delay, results[i].pcount, results[i].oncpu, results[i].slept);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && argv[1][0] == 'r') return reuse();
    if (argc == 3 && argv[1][0] == 'p') return pingpong(atol(argv[2]), -1);
    if (argc == 4 && argv[1][0] == 'p') return pingpong(atol(argv[2]), atoi(argv[3]));
    if (argc == 3 && argv[1][0] == 'h') return hop(atol(argv[2]));
    if (argc == 3 && argv[1][0] == 't') return twins(atol(argv[2]));
    if (argc == 5 && argv[1][0] == 't') {
        twin_ns[0] = atoll(argv[3]);
        twin_ns[1] = atoll(argv[4]);
        return twins(atol(argv[2]));
    }
    int naps = argc == 4 && argv[1][0] == 'n';
    if (naps) {
        nap_ns = 2500000000LL;
        argv++;
        argc--;
    }
    int crowd = argc == 3 && argv[1][0] == 'c';
    if (crowd) {
        static char three[] = "3";
        argv[1] = argv[2];
        argv[2] = three;
    }
    if (argc != 3) {
        fprintf(stderr, "usage: %s [naps] SECONDS BUSY_THREADS | crowd SECONDS\n", argv[0]);
        return 2;
    }
    seconds = atof(argv[1]);
    int n = atoi(argv[2]);
    pthread_t tids[65];
    if (n < 1 || n > 64) return 2;
    pthread_barrier_init(&done, NULL, n + 2);
    for (int i = 0; i <= n; i++) sem_init(&turn[i], 0, 0);
    /* The first and last CPU this process may use. */
    cpu_set_t allowed;
    int first_cpu = -1, last_cpu = -1;
    if (sched_getaffinity(0, sizeof allowed, &allowed)) return 4;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed)) {
            if (first_cpu < 0) first_cpu = c;
            last_cpu = c;
        }
    for (int i = 0; i <= n + 1; i++) results[i].cpu = !crowd ? -1 : i == 1 || i == 2 ? last_cpu : first_cpu;
    if (crowd) pin(first_cpu);
    for (int i = 0; i <= n; i++) {
        /* Pinned from birth: every wait of the thread is on its CPU. */
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(results[i].cpu, &set);
        if (crowd && pthread_attr_setaffinity_np(&attr, sizeof set, &set)) return 4;
        if (pthread_create(&tids[i], &attr, i < n ? busy : sleeper, &results[i])) {
            fprintf(stderr, "schedload: thread %d not started\n", i);
            return 4;
        }
        pthread_attr_destroy(&attr);
    }
    pthread_barrier_wait(&done);
    for (int i = 0; i <= n; i++) {
        sem_post(&turn[i]);
        pthread_join(tids[i], NULL);
    }
    if (crowd) report(&results[n + 1], "main", 0);
    for (int i = 0; i <= n + crowd; i++) {
        printf("TASK tid=%lld role=%s run_delay=%llu pcount=%llu oncpu=%llu slept=%lld", results[i].tid,
               results[i].role, results[i].delay, results[i].pcount, results[i].oncpu, results[i].slept);
        if (results[i].cpu >= 0) printf(" cpu=%d early=%llu", results[i].cpu, results[i].early);
        printf("\n");
    }
    if (naps)
        printf("NAPS tid=%lld from=%lld to=%lld\n", results[n].tid,
               naps_from.tv_sec * 1000000000LL + naps_from.tv_nsec, naps_to.tv_sec * 1000000000LL + naps_to.tv_nsec);
    return 0;
}
