/* Loaded by the unwind workload at run time (dlopen), built with -O2 -fomit-frame-pointer:
 * lib_entry -> lib_middle -> lib_leaf, a frameless leaf doing the work; lib_wait ->
 * lib_futex_wait, a futex wait whose system call is made here, not in libc. */
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>

#include "clock.h"

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

/* FUTEX_WAIT on `word` (which nobody changes) for at most `timeout`, by a system call made
 * here: the wait's innermost frame is in this library. */
__attribute__((noinline)) long lib_futex_wait(int *word, const struct timespec *timeout) {
#if defined(__x86_64__)
    long ret;
    register long r10 __asm__("r10") = (long)timeout;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"((long)SYS_futex), "D"(word), "S"((long)FUTEX_WAIT_PRIVATE), "d"(0L), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = SYS_futex;
    register long x0 __asm__("x0") = (long)word;
    register long x1 __asm__("x1") = FUTEX_WAIT_PRIVATE;
    register long x2 __asm__("x2") = 0;
    register long x3 __asm__("x3") = (long)timeout;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
    return x0;
#else
#error "lib_futex_wait: x86-64 and AArch64 only"
#endif
}

/* Waits `ms` milliseconds in one futex wait made in this library; returns the ns waited. */
long long lib_wait(int ms) {
    static int word;
    struct timespec timeout = {ms / 1000, (ms % 1000) * 1000000L};
    long long start = now_ns();
    lib_futex_wait(&word, &timeout);
    return now_ns() - start;
}
