/* Work whose counts of software events are known, for sampling and counting on any event:
 *   events pages N      touch N fresh pages (N minor faults), then print them and the kernel's
 *                       own count of this process's minor faults (getrusage)
 *   events split N      alpha_pages touches 70% of N fresh pages, beta_pages 30%
 *   events naps N       napper sleeps N times (N voluntary context switches; preempted=K: the
 *                       involuntary ones meanwhile, which may land in a nap's own kernel path)
 *   events insns N      a loop of exactly 2 instructions run N times (2N instructions retired)
 *   events writes N     N write(2) calls of one byte to /dev/null (and one more: the TRUTH line)
 *   events mallocs N    N malloc calls, from alpha_alloc (64 bytes) or beta_alloc (4096 bytes),
 *                       picked 70/30 by a fixed pseudo-random sequence (no pattern a sampling
 *                       period could fall in step with); prints each one's calls and bytes
 * Each prints one `TRUTH key=value ...` line at exit. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include <time.h>

#define PAGE 4096

/* Fresh pages from the kernel: each first write faults once. */
static __attribute__((noinline)) void touch(long pages) {
    char *p = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    for (long i = 0; i < pages; i++) ((volatile char *)p)[i * PAGE] = 1;
    munmap(p, pages * PAGE);
}

/* noipa: two functions with one body must stay two (GCC would fold them into one). */
static __attribute__((noipa)) void alpha_pages(long pages) { touch(pages); }
static __attribute__((noipa)) void beta_pages(long pages) { touch(pages); }

/* Each keeps its frame under malloc (built without sibling calls) and is counted by its caller. */
static void *volatile last;
static __attribute__((noipa)) void alpha_alloc(size_t bytes) { last = malloc(bytes); free(last); }
static __attribute__((noipa)) void beta_alloc(size_t bytes) { last = malloc(bytes); free(last); }

static void mallocs(long n) {
    long calls[2] = {0, 0};
    unsigned long long bytes[2] = {0, 0}, state = 42;
    for (long i = 0; i < n; i++) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        int beta = (state >> 33) % 100 >= 70;
        size_t size = beta ? 4096 : 64;
        if (beta)
            beta_alloc(size);
        else
            alpha_alloc(size);
        calls[beta]++;
        bytes[beta] += size;
    }
    printf("TRUTH pid=%d alpha_calls=%ld beta_calls=%ld alpha_bytes=%llu beta_bytes=%llu\n", getpid(), calls[0],
           calls[1], bytes[0], bytes[1]);
}

static __attribute__((noinline)) void napper(long naps) {
    struct timespec nap = {0, 200000};
    for (long i = 0; i < naps; i++) nanosleep(&nap, NULL);
}

/* Two instructions an iteration, whatever the compiler: a counted loop in assembly. */
static __attribute__((noinline)) void spin_insns(long n) {
#if defined(__aarch64__)
    __asm__ volatile("1: subs %0, %0, #1\n\tb.ne 1b" : "+r"(n) : : "cc");
#elif defined(__x86_64__)
    __asm__ volatile("1: dec %0\n\tjnz 1b" : "+r"(n) : : "cc");
#endif
}

static long minor_faults(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_minflt;
}

/* Times this thread was switched out against its will (preempted): the kernel's own count. */
static long preemptions(void) {
    struct rusage usage;
    getrusage(RUSAGE_THREAD, &usage);
    return usage.ru_nivcsw;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s pages|split|naps N\n", argv[0]);
        return 2;
    }
    long n = atol(argv[2]);
    if (strcmp(argv[1], "pages") == 0) {
        touch(n);
        printf("TRUTH pid=%d pages=%ld minflt=%ld\n", getpid(), n, minor_faults());
    } else if (strcmp(argv[1], "split") == 0) {
        long alpha = n * 7 / 10, beta = n - alpha;
        for (int round = 0; round < 10; round++) {
            alpha_pages(alpha / 10);
            beta_pages(beta / 10);
        }
        printf("TRUTH pid=%d alpha_pages=%ld beta_pages=%ld\n", getpid(), alpha / 10 * 10, beta / 10 * 10);
    } else if (strcmp(argv[1], "insns") == 0) {
        spin_insns(n);
        printf("TRUTH pid=%d loop_instructions=%ld\n", getpid(), 2 * n);
    } else if (strcmp(argv[1], "writes") == 0) {
        int fd = open("/dev/null", O_WRONLY);
        for (long i = 0; i < n; i++) {
            if (write(fd, "x", 1) != 1) return 1;
        }
        printf("TRUTH pid=%d writes=%ld\n", getpid(), n);
    } else if (strcmp(argv[1], "mallocs") == 0) {
        mallocs(n);
    } else if (strcmp(argv[1], "naps") == 0) {
        long before = preemptions();
        napper(n);
        printf("TRUTH pid=%d naps=%ld preempted=%ld\n", getpid(), n, preemptions() - before);
    } else {
        return 2;
    }
    return 0;
}
