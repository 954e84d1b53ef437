/* The workloads' clock: monotonic nanoseconds, the time base of the figures they print as their
 * own ground truth, and a busy wait on it. */
#ifndef WORKLOAD_CLOCK_H
#define WORKLOAD_CLOCK_H

#include <time.h>

static volatile unsigned long spin_sink;

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* On the CPU for `ns`, as a critical section or a unit of work is. */
static inline void spin_for(long long ns) {
    long long end = now_ns() + ns;
    while (now_ns() < end) spin_sink++;
}

#endif
