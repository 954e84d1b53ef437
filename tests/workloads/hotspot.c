/* Test workload with a known split of CPU time, measured by itself.
 *
 *   hotspot split SECONDS     burn_a 60%, burn_b 30%, burn_c 10% of thread CPU time
 *   hotspot weights A B C SECONDS
 *                             the same in the proportions A:B:C (milliseconds per round)
 *   hotspot syscalls SECONDS  read(2) from /dev/zero in a loop (kernel-heavy)
 *   hotspot faults SECONDS    page faults only in touch_pages(), CPU work without faults in
 *                             burn_a() (half the time each); prints faults=<n> of touch_pages
 *   hotspot remap SECONDS     split, its own text copied to anonymous memory in place (as
 *                             programs that move their code onto huge pages do) and mapped
 *                             back from its file, in turn, before each round; prints remaps=<n>
 *   hotspot fixed ITERATIONS THREADS
 *                             fixed CPU work on THREADS threads; prints ELAPSED=<ns> (benchmarks)
 *
 * SECONDS is the thread's own CPU time: the same work, and as many samples, on a busy machine.
 * SIGUSR1 ends split early (at the end of the current burn), truth printed as usual: a test that
 * needs its target to exit in the middle of a run says when.
 * Built with frame pointers. Prints one ground-truth line at exit:
 *   TRUTH pid=<pid> burn_a=<ns> burn_b=<ns> burn_c=<ns> reads=<n>
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

static volatile unsigned long sink;
static volatile sig_atomic_t stop_early;
static void on_stop(int sig) { (void)sig; stop_early = 1; }
static long long spent_a, spent_b, spent_c, reads;

static long long thread_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
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

static long long budget_a = 30000000, budget_b = 15000000, budget_c = 5000000;

__attribute__((noinline)) void phase_ab(void) {
    burn_a(budget_a);
    burn_b(budget_b);
}

/* The executable's text: where it is mapped, and the open file and offset it comes from. */
static struct { char *at; size_t len; int fd; off_t offset; } text;
static long long remaps;

static void find_own_text(void) {
    char exe[4096], line[4096 + 256];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    FILE *maps = fopen("/proc/self/maps", "r");
    if (n < 0 || !maps) { perror("own text"); exit(1); }
    exe[n] = 0;
    while (fgets(line, sizeof line, maps)) {
        unsigned long start, end, offset;
        char perms[5];
        int path_at = 0;
        if (sscanf(line, "%lx-%lx %4s %lx %*s %*s %n", &start, &end, perms, &offset, &path_at) < 4 || !path_at)
            continue;
        line[strcspn(line, "\n")] = 0;
        if (perms[2] == 'x' && strcmp(line + path_at, exe) == 0) {
            text.at = (char *)start;
            text.len = end - start;
            text.offset = (off_t)offset;
        }
    }
    fclose(maps);
    text.fd = open(exe, O_RDONLY);
    if (!text.at || text.fd < 0) { fprintf(stderr, "no text mapping of %s\n", exe); exit(1); }
}

/* Replace the text, in place, by an anonymous copy (moved over it whole, as huge-page remappers
 * do) or by its file again. The code running this is in the text: both contents are the same. */
static void remap_text(void) {
    if (remaps++ % 2 == 0) {
        char *copy = mmap(NULL, text.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (copy == MAP_FAILED) { perror("mmap"); exit(1); }
        memcpy(copy, text.at, text.len);
        if (mprotect(copy, text.len, PROT_READ | PROT_EXEC) ||
            mremap(copy, text.len, text.len, MREMAP_MAYMOVE | MREMAP_FIXED, text.at) == MAP_FAILED) {
            perror("remapping the text to anonymous memory"); exit(1);
        }
    } else if (mmap(text.at, text.len, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, text.fd, text.offset)
               == MAP_FAILED) {
        perror("mapping the text back"); exit(1);
    }
}

static int remapping;

__attribute__((noinline)) void run_split(double seconds) {
    long long end = thread_ns() + (long long)(seconds * 1e9);
    while (!stop_early && thread_ns() < end) {
        if (remapping) remap_text();
        phase_ab();
        burn_c(budget_c);
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
    long long end = thread_ns() + (long long)(seconds * 1e9);
    while (thread_ns() < end) do_reads(fd, buf, sizeof buf);
    close(fd);
}

static long long faults;

/* A system call made from the calling function itself, not through libc (which has no frame
 * pointers, so a frame-pointer walk from inside it would skip its caller). */
static inline long raw_syscall6(long nr, long a, long b, long c, long d, long e, long f) {
#if defined(__x86_64__)
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall" : "=a"(ret) : "0"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = nr;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
    return x0;
#else
#error "raw_syscall6: x86-64 and AArch64 only"
#endif
}

/* Maps fresh anonymous memory and touches every page: one page fault per page, all here. */
__attribute__((noinline)) void touch_pages(void) {
    const size_t len = 8 << 20;
    char *p = (char *)raw_syscall6(SYS_mmap, 0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if ((unsigned long)p > -4096UL) { fprintf(stderr, "mmap failed\n"); exit(1); }
    for (size_t off = 0; off < len; off += 4096) p[off] = 1;
    faults += len / 4096;
    raw_syscall6(SYS_munmap, (long)p, len, 0, 0, 0, 0);
}

__attribute__((noinline)) void run_faults(double seconds) {
    long long end = thread_ns() + (long long)(seconds * 1e9);
    while (thread_ns() < end) {
        long long t0 = thread_ns();
        while (thread_ns() - t0 < 20000000) touch_pages();
        burn_a(20000000);
    }
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
    long long t0 = now_ns();
    for (int i = 0; i < threads; i++) pthread_create(&tids[i], NULL, burn_fixed, &iterations);
    for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    printf("ELAPSED=%lld\n", now_ns() - t0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "fixed") == 0)
        return run_fixed(strtoul(argv[2], NULL, 10), atoi(argv[3]));
    if (argc == 6 && strcmp(argv[1], "weights") == 0) {
        budget_a = atoll(argv[2]) * 1000000;
        budget_b = atoll(argv[3]) * 1000000;
        budget_c = atoll(argv[4]) * 1000000;
        argv[2] = argv[5];
        argc = 3;
        argv[1] = "split";
    }
    if (argc != 3) {
        fprintf(stderr, "usage: %s split|syscalls SECONDS\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[2]);
    signal(SIGUSR1, on_stop);
    if (strcmp(argv[1], "remap") == 0) {
        find_own_text();
        remapping = 1;
        argv[1] = "split";
    }
    if (strcmp(argv[1], "split") == 0) run_split(seconds);
    else if (strcmp(argv[1], "syscalls") == 0) run_syscalls(seconds);
    else if (strcmp(argv[1], "faults") == 0) run_faults(seconds);
    else { fprintf(stderr, "unknown mode %s\n", argv[1]); return 2; }
    printf("TRUTH pid=%d burn_a=%lld burn_b=%lld burn_c=%lld reads=%lld faults=%lld remaps=%lld\n",
           (int)getpid(), spent_a, spent_b, spent_c, reads, faults, remaps);
    return 0;
}
