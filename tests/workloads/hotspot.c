/* Test workload with a known split of CPU time, measured by itself.
 *
 *   hotspot split SECONDS     burn_a 60%, burn_b 30%, burn_c 10% of thread CPU time
 *   hotspot syscalls SECONDS  read(2) from /dev/zero in a loop (kernel-heavy)
 *   hotspot fixed ITERATIONS THREADS
 *                             fixed CPU work on THREADS threads; prints ELAPSED=<ns> (benchmarks)
 *
 * Built with frame pointers. Prints one ground-truth line at exit:
 *   TRUTH pid=<pid> burn_a=<ns> burn_b=<ns> burn_c=<ns> reads=<n>
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;
static long long spent_a, spent_b, spent_c, reads;

static long long thread_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The loop body is inlined in each burn function so that samples land in it, not in a helper. */
#define BURN(budget_ns, spent)                                        \
    do {                                                              \
        long long t0 = thread_ns(), t;                                \
        do {                                                          \
            for (unsigned long i = 0; i < 400000; i++) sink += i * 2654435761u; \
            t = thread_ns();                                          \
        } while (t - t0 < (budget_ns));                               \
        spent += t - t0;                                              \
    } while (0)

__attribute__((noinline)) void burn_a(long long budget) { BURN(budget, spent_a); }
__attribute__((noinline)) void burn_b(long long budget) { BURN(budget, spent_b); }
__attribute__((noinline)) void burn_c(long long budget) { BURN(budget, spent_c); }

__attribute__((noinline)) void phase_ab(void) {
    burn_a(30000000);
    burn_b(15000000);
}

__attribute__((noinline)) void run_split(double seconds) {
    long long end = wall_ns() + (long long)(seconds * 1e9);
    while (wall_ns() < end) {
        phase_ab();
        burn_c(5000000);
    }
}

__attribute__((noinline)) void do_reads(int fd, char *buf, size_t len) {
    for (int i = 0; i < 64; i++) {
        if (read(fd, buf, len) > 0) reads++;
    }
}

__attribute__((noinline)) void run_syscalls(double seconds) {
    static char buf[1 << 16];
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0) { perror("/dev/zero"); exit(1); }
    long long end = wall_ns() + (long long)(seconds * 1e9);
    while (wall_ns() < end) do_reads(fd, buf, sizeof buf);
    close(fd);
}

__attribute__((noinline)) void *burn_fixed(void *arg) {
    unsigned long iterations = *(unsigned long *)arg, acc = 0;
    for (unsigned long i = 0; i < iterations; i++) {
        acc += i * 2654435761u;
        __asm__ volatile("" : "+r"(acc));
    }
    sink += acc;
    return NULL;
}

static int run_fixed(unsigned long iterations, int threads) {
    pthread_t tids[64];
    if (threads < 1 || threads > 64) return 2;
    long long t0 = wall_ns();
    for (int i = 0; i < threads; i++) pthread_create(&tids[i], NULL, burn_fixed, &iterations);
    for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    printf("ELAPSED=%lld\n", wall_ns() - t0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "fixed") == 0)
        return run_fixed(strtoul(argv[2], NULL, 10), atoi(argv[3]));
    if (argc != 3) {
        fprintf(stderr, "usage: %s split|syscalls SECONDS\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[2]);
    if (strcmp(argv[1], "split") == 0) run_split(seconds);
    else if (strcmp(argv[1], "syscalls") == 0) run_syscalls(seconds);
    else { fprintf(stderr, "unknown mode %s\n", argv[1]); return 2; }
    printf("TRUTH pid=%d burn_a=%lld burn_b=%lld burn_c=%lld reads=%lld\n",
           (int)getpid(), spent_a, spent_b, spent_c, reads);
    return 0;
}
