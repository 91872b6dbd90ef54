/* mem.h — memory faulted in before a hot loop first writes it.
 *
 * A page first written inside a decode step costs that step a page fault: 10.5 us each on this
 * project's VM, against a 0.6 ms pass of the bundled model (bench/results/drafting.md). Buffers a
 * decode fills position by position (attention caches, a drafter's waiting taps) take one every
 * few positions, and rows a verify pass writes first take theirs at the first one. mem_populate
 * asks the kernel for every page of a range at once (MADV_POPULATE_WRITE, Linux 5.14 on: 0.75 us
 * a page there), or writes each page where that is refused. The range's contents do not change.
 * On this VM the hypervisor still maps a page at its first write from the process (5.2 us: it
 * keeps page tables of its own), which only reusing pages avoids (bench/bench_first_touch.c).
 */
#ifndef DF_BASE_MEM_H
#define DF_BASE_MEM_H

#include <stddef.h>

void mem_populate(void *p, size_t bytes);

#endif
