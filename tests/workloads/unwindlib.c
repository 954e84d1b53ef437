/* Loaded by the unwind workload at run time (dlopen), built with -O2 -fomit-frame-pointer:
 * lib_entry -> lib_middle -> lib_leaf, a frameless leaf doing the work. */
#include <time.h>

static long long cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

__attribute__((noinline)) unsigned long lib_leaf(unsigned long seed) {
    unsigned long acc = seed;
    for (unsigned long i = 0; i < 1000000; i++) {
        acc = acc * 2862933555777941757UL + i;
        __asm__ volatile("" : "+r"(acc));
    }
    return acc;
}

__attribute__((noinline)) unsigned long lib_middle(unsigned long seed) {
    volatile unsigned long scratch[16];
    for (int i = 0; i < 16; i++) scratch[i] = seed + i;
    unsigned long r = lib_leaf(scratch[seed % 16]);
    return r + scratch[7];
}

/* Works for `seconds` of the thread's CPU time; returns the rounds done. */
long long lib_entry(double seconds) {
    long long end = cpu_ns() + (long long)(seconds * 1e9), rounds = 0;
    static volatile unsigned long sink;
    while (cpu_ns() < end) {
        sink += lib_middle((unsigned long)rounds);
        rounds++;
    }
    return rounds;
}
