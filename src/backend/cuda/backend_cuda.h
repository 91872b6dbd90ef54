/* backend_cuda.h — what the CUDA backend (backend_cuda.c, backend.h's backend_cuda) tells beyond
 * the seam: its expert cache's figures, for tests and statistics. */
#ifndef DF_BACKEND_CUDA_BACKEND_CUDA_H
#define DF_BACKEND_CUDA_BACKEND_CUDA_H

#include <stdint.h>

/* dev: an engine's backend state (be_dev) on --device cuda. Streamed experts found in the VRAM
 * cache, copied into it, its slots (0 when every expert was copied at open), and whether the
 * weight source's host memory is registered (1: the copies run asynchronously from pinned memory). */
void backend_cuda_stats(const void *dev, uint64_t *hits, uint64_t *misses, int *slots, int *pinned);

#endif
