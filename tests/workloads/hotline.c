/* One deliberately hot source line, for --annotate.
 *
 *   hotline SECONDS
 *
 * hot_loop() spends nearly all of its time on one line: a chain of dependent divisions (each
 * waits for the one before). Its other lines run once per 100000 of those, except the inner loop's
 * count and branch: the hot line has more instructions than they (two divisions and an add), so
 * it is hot on an emulated CPU too, where every instruction takes the same time. Prints
 *   TRUTH pid=<pid> hot_line=<the line's number>
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile double sink;
static int hot_line;

/* The thread's CPU time: SECONDS of it, however busy the machine is. */
static long long cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

__attribute__((noinline)) double hot_loop(double seconds) {
    long long end = cpu_ns() + (long long)(seconds * 1e9);
    double x = 1.0;
    long rounds = 0;
    hot_line = __LINE__ + 3; /* the division's line, below */
    while (cpu_ns() < end) {
        for (int i = 0; i < 100000; i++)
            x = x / 1.0000001 / 1.0000002 + 1e-9;
        rounds++;
    }
    sink = x;
    return (double)rounds;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SECONDS\n", argv[0]);
        return 2;
    }
    double rounds = hot_loop(atof(argv[1]));
    printf("TRUTH pid=%d hot_line=%d rounds=%.0f\n", (int)getpid(), hot_line, rounds);
    return 0;
}
