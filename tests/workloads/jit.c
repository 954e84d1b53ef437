/* JIT code as a runtime makes it, with a perf map naming it:
 *   jit MS    writes a counting loop's machine code into anonymous memory made executable, names
 *             it `jitted_spin` in /tmp/perf-PID.map (as node --perf-basic-prof and the JVM's
 *             agents do), then for MS milliseconds alternates calls of it with native_spin (C)
 *             in the shares 60/40 by its own clock; prints the time each took (TRUTH
 *             jitted_spin=NS native_spin=NS anon=NS). A second, unnamed copy of the
 *             loop (`[anon]`) runs a little too, and the map has a garbage line. SIGUSR1 ends it
 *             early (at the end of the current round), its truth printed as usual.
 * x86-64 and AArch64. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "clock.h"

/* `n` trips of a loop, then return: x86-64 `dec rdi; jnz .-3; ret`; AArch64 `subs x0, x0, #1;
 * b.ne .-4; ret`. */
#if defined(__x86_64__)
static const unsigned char loop_code[] = {0x48, 0xff, 0xcf, 0x75, 0xfb, 0xc3};
#elif defined(__aarch64__)
static const unsigned int loop_code[] = {0xf1000400, 0x54ffffe1, 0xd65f03c0};
#else
#error "x86-64 or AArch64"
#endif

typedef void (*loop_fn)(long);

static loop_fn jit(unsigned char *page, size_t at) {
    memcpy(page + at, loop_code, sizeof loop_code);
    __builtin___clear_cache((char *)page + at, (char *)page + at + sizeof loop_code);
    return (loop_fn)(page + at);
}

static volatile long native_sink;
static volatile sig_atomic_t stop_early;
static void on_stop(int sig) { (void)sig; stop_early = 1; }

static __attribute__((noinline)) void native_spin(long n) {
    for (long i = 0; i < n; i++) native_sink++;
}

int main(int argc, char **argv) {
    long ms = argc > 1 ? atol(argv[1]) : 2000;
    signal(SIGUSR1, on_stop);
    unsigned char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return 1;
    loop_fn named = jit(page, 0), unnamed = jit(page, 256);
    if (mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0) return 1;
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    FILE *map = fopen(path, "w");
    if (!map) return 1;
    fprintf(map, "%lx %zx jitted_spin\nnot a line\n", (unsigned long)named, sizeof loop_code);
    fclose(map);

    long long jitted = 0, native = 0, anon = 0, end = now_ns() + ms * 1000000LL;
    while (now_ns() < end && !stop_early) {
        long long t0 = now_ns();
        named(3000000);
        long long t1 = now_ns();
        native_spin(1000000);
        long long t2 = now_ns();
        unnamed(100000);
        long long t3 = now_ns();
        jitted += t1 - t0;
        native += t2 - t1;
        anon += t3 - t2;
    }
    printf("TRUTH pid=%d jitted_spin=%lld native_spin=%lld anon=%lld\n", getpid(), jitted, native, anon);
    return 0;
}
