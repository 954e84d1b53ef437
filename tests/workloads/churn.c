/* Process churn with a known hot function, for the agent's tests and soak.
 *
 *   churn SECONDS PARALLEL CHILD_MS   keep PARALLEL children running for SECONDS: each is this
 *                                     binary exec'd anew, spends CHILD_MS of CPU time in
 *                                     churn_hot_function() and exits
 *   churn child CHILD_MS              (what each child runs)
 *   churn spawn N PROGRAM [ARGS...]   PROGRAM (searched in PATH) started N times, one at a
 *                                     time, each waited for; prints "PIDS <pid> <pid> ..." first
 *
 * Built like most binaries (no frame pointers). Prints at exit:
 *   TRUTH pid=<parent pid> children=<n started> child_cpu_ns=<their CPU time, from wait4>
 */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static volatile unsigned long sink;
static volatile sig_atomic_t stop;

static long long clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

__attribute__((noinline)) void churn_hot_function(long long budget_ns) {
    long long t0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    while (clock_ns(CLOCK_PROCESS_CPUTIME_ID) - t0 < budget_ns)
        for (unsigned long i = 0; i < 20000; i++) sink += i * 2654435761u;
}

static void on_term(int sig) { (void)sig; stop = 1; }

/* Reap one child and add its CPU time; 0 when there is none left. */
static int reap(long long *child_cpu_ns) {
    int status;
    struct rusage ru;
    if (wait4(-1, &status, 0, &ru) <= 0) return 0;
    *child_cpu_ns += (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000LL +
                     (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000LL;
    return 1;
}

/* `churn spawn`: each child's pid as it starts, then the TRUTH line. */
static int spawn_each(int n, char **argv) {
    printf("PIDS");
    for (int i = 0; i < n; i++) {
        pid_t pid;
        int status, err = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);
        if (err != 0) {
            fprintf(stderr, "posix_spawnp %s: %s\n", argv[0], strerror(err));
            return 1;
        }
        printf(" %d", pid);
        waitpid(pid, &status, 0);
    }
    printf("\nTRUTH pid=%d children=%d\n", getpid(), n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "spawn") == 0)
        return spawn_each(atoi(argv[2]), argv + 3);
    if (argc == 3 && strcmp(argv[1], "child") == 0) {
        churn_hot_function(atoll(argv[2]) * 1000000LL);
        return 0;
    }
    if (argc != 4) {
        fprintf(stderr, "usage: churn SECONDS PARALLEL CHILD_MS\n");
        return 2;
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    long long end = clock_ns(CLOCK_MONOTONIC) + (long long)(atof(argv[1]) * 1e9);
    int parallel = atoi(argv[2]), running = 0;
    long long children = 0, child_cpu_ns = 0;
    char *child_argv[] = {"churn", "child", argv[3], NULL};
    while (!stop && clock_ns(CLOCK_MONOTONIC) < end) {
        while (running < parallel) {
            pid_t pid;
            if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, child_argv, environ) != 0) {
                perror("posix_spawn");
                return 1;
            }
            running++;
            children++;
        }
        running -= reap(&child_cpu_ns);
    }
    while (running > 0 && reap(&child_cpu_ns)) running--;
    printf("TRUTH pid=%d children=%lld child_cpu_ns=%lld\n", getpid(), children, child_cpu_ns);
    return 0;
}
