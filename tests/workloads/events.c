/* Work whose counts of software events are known, for sampling and counting on any event:
 *   events pages N      touch N fresh pages (N minor faults), then print them and the kernel's
 *                       own count of this process's minor faults (getrusage)
 *   events split N      alpha_pages touches 70% of N fresh pages, beta_pages 30%
 *   events naps N       napper sleeps N times (N voluntary context switches; preempted=K: the
 *                       involuntary ones meanwhile, which may land in a nap's own kernel path;
 *                       switched=S: all of its switches meanwhile, a nap whose timer fired
 *                       before it could block having none)
 *   events insns N      a loop of exactly 2 instructions run N times (2N instructions retired)
 *   events writes N     N write(2) calls of one byte to /dev/null (and one more: the TRUTH line)
 *   events hops N       the same, the process pinned to each of the first two CPUs it may run on
 *                       in turn, one write on each (the TRUTH line on the first's; all on one
 *                       where it may run on only one); prints the writes on each
 *   events sleeps N     a second thread sleeps N times 1 ms, then N/4 times 20 ms (nanosleep);
 *                       prints its tid, each count and duration, how many sleeps took at
 *                       least 2^24 ns (16.8 ms) by its own clock, and where each length's
 *                       timespec is
 *   events mallocs N    N malloc calls, from alpha_alloc (64 bytes) or beta_alloc (4096 bytes),
 *                       picked 70/30 by a fixed pseudo-random sequence (no pattern a sampling
 *                       period could fall in step with); prints each one's calls and bytes
 *   events lines N      the loop of `lines` runs N times; the line marked PROBE-LINE once each time,
 *                       after it stored the iteration's value in the global `line_value`, which
 *                       `step` is also called with (its first argument) and named after (its
 *                       second, the string "step"); prints N, the sum of the values, the
 *                       loop's time by its own clock and the process's CPU time (benchmarks)
 *   events inlined N    the line marked INLINED-LINE, inlined into two functions, runs N times:
 *                       in bump_odd each 4th time, in bump_even the others; prints N, each
 *                       function's count and the sum of `line_value` as the line starts
 *   events usdt N       the USDT probe events:step fires N times from two sites, its four
 *                       arguments an int (-500..499), the global `line_value` in memory, the
 *                       site's number as a constant and the string "usdt-step": site 1 (2 of 3
 *                       steps) has the int in a register, site 2 on the stack. Each step fires
 *                       only while the probe's semaphore is raised (as sys/sdt.h's ENABLED);
 *                       prints N, the fires at each site, each number argument's sum and how
 *                       many ints were negative
 *   events requests N   N requests submitted (request_submit(id), ids 1..N, which returns it), then
 *                       completed in reverse order (request_complete(id)); 200 ms later one
 *                       more, id -(N+1), held 100 ms between its two calls: each request's id is
 *                       the first argument of both, and only the last is held; prints N+1 and
 *                       its id
 *   events offsets N    offset_target, whose instructions are known (nops, then a return: the
 *                       third starts at +2 on x86-64, +8 on AArch64), called N times
 *   events semaphore    watches events:step's semaphore every millisecond until SIGUSR1; prints
 *                       for how many ticks it was raised, its highest value and its value now
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
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>

#include "clock.h"

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

/* One source line run a known number of times, with a global and arguments to fetch there. */
static volatile long line_value;
static __attribute__((noipa)) long step(long value, const char *name) { return value + name[0]; }

/* `hops`: N writes alternately on two CPUs, each pinned to its own. */
static int hops(long n) {
    cpu_set_t allowed, one;
    int cpus[2], found = 0;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return 1;
    for (int cpu = 0; cpu < CPU_SETSIZE && found < 2; cpu++) {
        if (CPU_ISSET(cpu, &allowed)) cpus[found++] = cpu;
    }
    if (found < 2) cpus[1] = cpus[0]; /* one CPU (the arm64 guest's): every write on it */
    int fd = open("/dev/null", O_WRONLY);
    long on[2] = {0, 0};
    for (long i = 0; i < n; i++) {
        CPU_ZERO(&one);
        CPU_SET(cpus[i % 2], &one);
        if (sched_setaffinity(0, sizeof(one), &one) != 0 || write(fd, "x", 1) != 1) return 1;
        on[i % 2]++;
    }
    CPU_ZERO(&one);
    CPU_SET(cpus[0], &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) return 1;
    printf("TRUTH pid=%d writes=%ld first_cpu=%d on_first=%ld second_cpu=%d on_second=%ld\n", getpid(), n, cpus[0],
           on[0], cpus[1], on[1]);
    return 0;
}

static __attribute__((noinline)) void lines(long n) {
    long values = 0, steps = 0;
    long long start = now_ns();
    for (long i = 0; i < n; i++) {
        line_value = (i * 7919) % 1000003;
        steps += step(line_value, "step"); /* PROBE-LINE */
        values += line_value;
    }
    long long elapsed = now_ns() - start;
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    long long cpu = (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000000LL +
                    (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000LL;
    printf("TRUTH pid=%d lines=%ld values_sum=%ld steps=%ld elapsed_ns=%lld cpu_ns=%lld\n", getpid(), n, values,
           steps, elapsed, cpu);
}

/* One source line inlined into two functions: a probe on the line fires in both. */
static inline __attribute__((always_inline)) long bump(long value) {
    line_value = value; /* INLINED-LINE */
    return line_value * 2;
}
static __attribute__((noinline)) long bump_odd(long i) { return bump(2 * i + 1); }
static __attribute__((noinline)) long bump_even(long i) { return bump(2 * i); }

static __attribute__((noinline)) void inlined(long n) {
    long before = 0, odd = 0, even = 0, sum = 0;
    line_value = 0;
    for (long i = 0; i < n; i++) {
        before += line_value;
        if (i % 4 == 0) {
            sum += bump_odd(i);
            odd++;
        } else {
            sum += bump_even(i);
            even++;
        }
    }
    printf("TRUTH pid=%d inlined=%ld odd=%ld even=%ld before_sum=%ld sum=%ld\n", getpid(), n, odd, even,
           before, sum);
}

/* A USDT probe as sys/sdt.h writes one (its header is not on every machine, nor in the arm64
 * cross compiler's path): a nop at the site, and a .note.stapsdt entry giving its address, the
 * base it was linked at, its semaphore, the provider, the name and where each argument is, as
 * the compiler printed its operand (a register, memory, a constant). */
#define USDT_NOTE(provider, name, semaphore, args)                                        \
    "990: nop\n"                                                                         \
    ".pushsection .note.stapsdt,\"\",\"note\"\n"                                     \
    ".balign 4\n"                                                                        \
    ".4byte 992f-991f, 994f-993f, 3\n"                                                   \
    "991: .asciz \"stapsdt\"\n"                                                        \
    "992: .balign 4\n"                                                                   \
    "993: .8byte 990b\n"                                                                 \
    ".8byte _.stapsdt.base\n"                                                            \
    ".8byte " semaphore "\n"                                                             \
    ".asciz \"" provider "\"\n"                                                        \
    ".asciz \"" name "\"\n"                                                            \
    ".asciz \"" args "\"\n"                                                            \
    "994: .balign 4\n"                                                                   \
    ".popsection\n"                                                                      \
    ".ifndef _.stapsdt.base\n"                                                           \
    ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n"          \
    ".weak _.stapsdt.base\n"                                                             \
    ".hidden _.stapsdt.base\n"                                                           \
    "_.stapsdt.base: .space 1\n"                                                         \
    ".size _.stapsdt.base, 1\n"                                                          \
    ".popsection\n"                                                                      \
    ".endif\n"

/* events:step's semaphore: the kernel raises it while a probe is attached at any of its sites. */
volatile unsigned short events_step_semaphore __attribute__((section(".probes"), used));

static __attribute__((noinline)) void usdt_steps(long n) {
    long ints = 0, globals = 0, negatives = 0, fired[3] = {0, 0, 0};
    for (long i = 0; i < n; i++) {
        int value = (int)((i * 7919) % 1000) - 500;
        line_value = i * 3;
        if (!events_step_semaphore) continue;
        if (i % 3 != 0) {
            __asm__ __volatile__(USDT_NOTE("events", "step", "events_step_semaphore",
                                           "-4@%[value] 8@%[global] -4@%[site] 8@%[name]")
                                 :
                                 : [value] "r"(value), [global] "m"(line_value), [site] "i"(1),
                                   [name] "r"("usdt-step"));
            fired[1]++;
        } else {
            __asm__ __volatile__(USDT_NOTE("events", "step", "events_step_semaphore",
                                           "-4@%[value] 8@%[global] -4@%[site] 8@%[name]")
                                 :
                                 : [value] "m"(value), [global] "m"(line_value), [site] "i"(2),
                                   [name] "r"("usdt-step"));
            fired[2]++;
        }
        ints += value;
        negatives += value < 0;
        globals += line_value;
    }
    printf("TRUTH pid=%d usdt=%ld site1=%ld site2=%ld ints_sum=%ld negatives=%ld globals_sum=%ld\n", getpid(),
           n, fired[1], fired[2], ints, negatives, globals);
}

/* `semaphore`: what a tracer did to the USDT semaphore, read until SIGUSR1. */
static volatile sig_atomic_t semaphore_asked;
static void ask_semaphore(int sig) {
    (void)sig;
    semaphore_asked = 1;
}

static void semaphore_watch(void) {
    struct timespec tick = {0, 1000000};
    long raised = 0;
    unsigned short most = 0;
    signal(SIGUSR1, ask_semaphore);
    while (!semaphore_asked) {
        unsigned short now = events_step_semaphore;
        raised += now != 0;
        if (now > most) most = now;
        nanosleep(&tick, NULL);
    }
    printf("TRUTH pid=%d raised_ticks=%ld most=%d semaphore_now=%d\n", getpid(), raised, most, events_step_semaphore);
}

/* A request's two ends, each taking its id (the probes read their first argument); submitting
 * one returns its id too. */
static __attribute__((noipa)) long request_submit(long id) {
    __asm__ volatile("" : : "r"(id));
    return id;
}
static __attribute__((noipa)) void request_complete(long id) { __asm__ volatile("" : : "r"(id)); }

/* `offsets`: a function a probe can name at an offset into it, its instructions known. */
__asm__(".pushsection .text\n"
        ".globl offset_target\n"
        ".type offset_target, %function\n"
        "offset_target:\n"
        "    nop\n"
        "    nop\n"
        "    nop\n"
        "    ret\n"
        ".size offset_target, .-offset_target\n"
        ".popsection\n");
void offset_target(void);

static void requests(long n) {
    struct timespec hold = {0, 100000000}, later = {0, 200000000};
    for (long id = 1; id <= n; id++) request_submit(id);
    for (long id = n; id >= 1; id--) request_complete(id);
    nanosleep(&later, NULL);
    request_submit(-(n + 1));
    nanosleep(&hold, NULL);
    request_complete(-(n + 1));
    printf("TRUTH pid=%d requests=%ld slow_id=%ld\n", getpid(), n + 1, -(n + 1));
}

static __attribute__((noinline)) void napper(long naps) {
    struct timespec nap = {0, 200000};
    for (long i = 0; i < naps; i++) nanosleep(&nap, NULL);
}

/* The sleeps of `sleeps N`, on their own thread: 1 ms N times, then 20 ms N/4 times. */
static long sleeps_short, sleeps_long, sleeper_tid, sleeps_over_2pow24;
/* Where the two lengths of sleep are (each nanosleep's first argument). */
static unsigned long short_nap_at, long_nap_at;

/* One nanosleep, and whether it took at least 2^24 ns (16.8 ms) by this thread's own clock. */
static void timed_nap(const struct timespec *nap) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    nanosleep(nap, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long long ns = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    sleeps_over_2pow24 += ns >= (1LL << 24);
}

static void *sleeper(void *unused) {
    (void)unused;
    sleeper_tid = syscall(SYS_gettid);
    struct timespec short_nap = {0, 1000000}, long_nap = {0, 20000000};
    short_nap_at = (unsigned long)&short_nap;
    long_nap_at = (unsigned long)&long_nap;
    for (long i = 0; i < sleeps_short; i++) timed_nap(&short_nap);
    for (long i = 0; i < sleeps_long; i++) timed_nap(&long_nap);
    return NULL;
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

/* Times this thread was switched out at all (it blocked, or was preempted): the kernel's count. */
static long switches(void) {
    struct rusage usage;
    getrusage(RUSAGE_THREAD, &usage);
    return usage.ru_nvcsw + usage.ru_nivcsw;
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
    } else if (strcmp(argv[1], "offsets") == 0) {
        for (long i = 0; i < n; i++) offset_target();
        printf("TRUTH pid=%d calls=%ld\n", getpid(), n);
    } else if (strcmp(argv[1], "hops") == 0) {
        return hops(n);
    } else if (strcmp(argv[1], "mallocs") == 0) {
        mallocs(n);
    } else if (strcmp(argv[1], "sleeps") == 0) {
        pthread_t thread;
        sleeps_short = n;
        sleeps_long = n / 4;
        if (pthread_create(&thread, NULL, sleeper, NULL) != 0 || pthread_join(thread, NULL) != 0) return 1;
        printf("TRUTH pid=%d sleeper_tid=%ld short=%ld short_ns=1000000 long=%ld long_ns=20000000 over_2pow24=%ld "
               "short_nap_at=%lu long_nap_at=%lu\n",
               getpid(), sleeper_tid, sleeps_short, sleeps_long, sleeps_over_2pow24, short_nap_at, long_nap_at);
    } else if (strcmp(argv[1], "lines") == 0) {
        lines(n);
    } else if (strcmp(argv[1], "inlined") == 0) {
        inlined(n);
    } else if (strcmp(argv[1], "semaphore") == 0) {
        semaphore_watch();
    } else if (strcmp(argv[1], "usdt") == 0) {
        usdt_steps(n);
    } else if (strcmp(argv[1], "requests") == 0) {
        requests(n);
    } else if (strcmp(argv[1], "naps") == 0) {
        long before = preemptions(), switched = switches();
        napper(n);
        switched = switches() - switched;
        printf("TRUTH pid=%d naps=%ld preempted=%ld switched=%ld\n", getpid(), n, preemptions() - before, switched);
    } else {
        return 2;
    }
    return 0;
}
