/* Test workload for stack unwinding, built with -O2 -fomit-frame-pointer: no function keeps a
 * frame pointer, as in most distribution binaries (Debian's libc among them).
 *
 *   unwind chain SECONDS   main -> run_chain -> level_one -> level_two -> leaf_work, where
 *                          leaf_work is a frameless leaf doing all the work
 *   unwind qsort SECONDS   main -> run_qsort -> qsort (libc, no frame pointers) -> compare_items
 *   unwind deep SECONDS    main -> run_deep -> recurse x 200 -> leaf_work: deeper than any walk
 *   unwind sleep SECONDS   main -> run_sleep -> nap_outer -> nap_inner -> nanosleep (libc), 1 ms
 *                          naps: off-CPU stacks through libc
 *   unwind dlopen SECONDS LIB [LIB2]
 *                          a quarter of the time in run_qsort, then dlopen(LIB) and the rest in
 *                          main -> run_dlopen -> lib_entry -> lib_middle -> lib_leaf; with LIB2
 *                          (another copy), LIB runs only a twentieth of the time before LIB2 is
 *                          loaded the same way: plugins loaded one after another
 *   unwind dlcycle SECONDS LIB
 *                          main -> run_dlcycle -> lib_entry ..., with LIB loaded and unloaded
 *                          every 20 ms: mappings disappear under the walker
 *   unwind dlwait MS LIB   ten 20 ms futex waits in main (the process's tables are given by
 *                          then), then dlopen(LIB) and one futex wait of MS ms made in it:
 *                          main -> run_dlwait -> lib_wait -> lib_futex_wait; adds
 *                          lib_waited_ns=<its length by the workload's clock> to the TRUTH line
 *   unwind exec SECONDS    a quarter of the time in run_qsort, then exec itself as `chain` for
 *                          the rest (same pid, new image)
 *
 * SECONDS is the thread's CPU time, except in `sleep` (wall-clock time spent napping).
 * Prints at exit: TRUTH pid=<pid> rounds=<n>
 */
#include <dlfcn.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

static volatile unsigned long sink;
static long long rounds;

/* The thread's own CPU time: the busy modes run for SECONDS of it, so they do the same work
 * (and give a profiler the same number of samples) however busy the machine is. */
static long long cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Frameless leaf: no calls, no stack frame; its caller is only found through the return address
 * at the stack pointer. */
__attribute__((noinline)) unsigned long leaf_work(unsigned long seed) {
    unsigned long acc = seed;
    for (unsigned long i = 0; i < 2000000; i++) {
        acc = acc * 6364136223846793005UL + i;
        __asm__ volatile("" : "+r"(acc));
    }
    return acc;
}

/* Callers with stack frames of their own (locals the compiler must keep in memory), so that the
 * canonical frame address moves with the stack pointer by amounts only the unwind table knows. */
__attribute__((noinline)) unsigned long level_two(unsigned long seed) {
    volatile unsigned long scratch[24];
    for (int i = 0; i < 24; i++) scratch[i] = seed + i;
    unsigned long r = leaf_work(scratch[seed % 24]);
    return r + scratch[3];
}

__attribute__((noinline)) unsigned long level_one(unsigned long seed) {
    volatile unsigned long scratch[8];
    for (int i = 0; i < 8; i++) scratch[i] = seed ^ i;
    unsigned long r = level_two(scratch[seed % 8]);
    return r + scratch[5];
}

__attribute__((noinline)) void run_chain(double seconds) {
    long long end = cpu_ns() + (long long)(seconds * 1e9);
    while (cpu_ns() < end) {
        sink += level_one((unsigned long)rounds);
        rounds++;
    }
}

__attribute__((noinline)) int compare_items(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    return (x > y) - (x < y);
}

__attribute__((noinline)) void run_qsort(double seconds) {
    enum { N = 4096 };
    static unsigned long items[N];
    long long end = cpu_ns() + (long long)(seconds * 1e9);
    unsigned long state = 88172645463325252UL;
    while (cpu_ns() < end) {
        for (int i = 0; i < N; i++) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            items[i] = state;
        }
        qsort(items, N, sizeof items[0], compare_items);
        rounds++;
    }
}

/* Not a tail call (it uses the result), and a frame of its own, at every depth: 201 frames. */
__attribute__((noinline)) unsigned long recurse(int depth, unsigned long seed) {
    volatile unsigned long pad = seed;
    if (depth == 0) return leaf_work(pad) + pad;
    unsigned long r = recurse(depth - 1, pad + 1);
    return r + pad;
}

__attribute__((noinline)) void run_deep(double seconds) {
    long long end = cpu_ns() + (long long)(seconds * 1e9);
    while (cpu_ns() < end) {
        sink += recurse(200, (unsigned long)rounds);
        rounds++;
    }
}

__attribute__((noinline)) void nap_inner(void) {
    volatile unsigned long scratch[4];
    scratch[0] = (unsigned long)rounds;
    struct timespec nap = {0, 1000000};
    nanosleep(&nap, NULL);
    sink += scratch[0];
}

__attribute__((noinline)) void nap_outer(void) {
    volatile unsigned long scratch[12];
    scratch[5] = (unsigned long)rounds;
    nap_inner();
    sink += scratch[5];
}

__attribute__((noinline)) void run_sleep(double seconds) {
    long long end = now_ns() + (long long)(seconds * 1e9);
    while (now_ns() < end) {
        nap_outer();
        rounds++;
    }
}

typedef long long (*lib_entry_fn)(double);

static lib_entry_fn load_entry(const char *lib, void **handle) {
    *handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!*handle) {
        fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
        exit(3);
    }
    return (lib_entry_fn)dlsym(*handle, "lib_entry");
}

__attribute__((noinline)) void run_dlopen(double seconds, const char *lib) {
    void *handle;
    lib_entry_fn entry = load_entry(lib, &handle);
    rounds += entry(seconds);
}

__attribute__((noinline)) void run_dlcycle(double seconds, const char *lib) {
    long long end = cpu_ns() + (long long)(seconds * 1e9);
    while (cpu_ns() < end) {
        void *handle;
        lib_entry_fn entry = load_entry(lib, &handle);
        rounds += entry(0.02);
        dlclose(handle);
    }
}

__attribute__((noinline)) long long run_dlwait(int ms, const char *lib) {
    static int word;
    struct timespec nap = {0, 20 * 1000000L};
    for (int i = 0; i < 10; i++) syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &nap);
    void *handle;
    load_entry(lib, &handle);
    long long (*lib_wait)(int) = (long long (*)(int))dlsym(handle, "lib_wait");
    return lib_wait(ms);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s chain|qsort|deep|sleep|exec SECONDS | dlopen SECONDS LIB [LIB2] | dlcycle SECONDS LIB | dlwait MS LIB\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[2]);
    if (strcmp(argv[1], "chain") == 0) run_chain(seconds);
    else if (strcmp(argv[1], "qsort") == 0) run_qsort(seconds);
    else if (strcmp(argv[1], "deep") == 0) run_deep(seconds);
    else if (strcmp(argv[1], "sleep") == 0) run_sleep(seconds);
    else if (strcmp(argv[1], "dlopen") == 0 && argc > 3) {
        run_qsort(seconds / 4);
        if (argc > 4) {
            run_dlopen(seconds / 20, argv[3]);
            run_dlopen(seconds * 7 / 10, argv[4]);
        } else run_dlopen(seconds * 3 / 4, argv[3]);
    } else if (strcmp(argv[1], "dlcycle") == 0 && argc > 3) run_dlcycle(seconds, argv[3]);
    else if (strcmp(argv[1], "dlwait") == 0 && argc > 3) {
        long long waited = run_dlwait(atoi(argv[2]), argv[3]);
        printf("TRUTH pid=%d rounds=0 lib_waited_ns=%lld\n", (int)getpid(), waited);
        return 0;
    }
    else if (strcmp(argv[1], "exec") == 0) {
        run_qsort(seconds / 4);
        char rest[32];
        snprintf(rest, sizeof rest, "%f", seconds * 3 / 4);
        execl("/proc/self/exe", argv[0], "chain", rest, (char *)NULL);
        perror("exec");
        return 3;
    } else return 2;
    printf("TRUTH pid=%d rounds=%lld\n", (int)getpid(), rounds);
    return 0;
}
