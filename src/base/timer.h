/* timer.h — monotonic wall time in seconds, for --stats and benchmarks (never in tests). */
#ifndef DF_BASE_TIMER_H
#define DF_BASE_TIMER_H

#include <time.h>

static inline double timer_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
