/* test_kern.h — test_kernels.c's checks of one kernel table against the scalar reference, shared
 * with the GPU's tests (tests/cuda/test_cuda.c), which put the CUDA kernels behind a kern_ops
 * table. Each is a test body: it records the first difference (memcmp) and returns; k == NULL
 * marks the test skipped. */
#ifndef DF_TESTS_TEST_KERN_H
#define DF_TESTS_TEST_KERN_H

#include <stdint.h>

#include "kernels/kern.h"

/* matmul at T = 1 .. 70 over every format, odd shapes and strides, row ranges and batch
 * invariance; dot and decode_rows */
void kern_test_matches_scalar(const kern_ops *k);
/* one case of those: k's matmul of a random rows x cols matrix of format fmt and T tokens against
 * the scalar table's (with its row range and T = 1 checks); 1 when the same bits */
int kern_test_matmul_case(const kern_ops *k, int fmt, int rows, int cols, int T, uint64_t seed);
/* axpy, dot_rows, axpy_rows, kda_step, glu, exp_sub and softmax_rows */
void kern_test_elementwise(const kern_ops *k);

#endif
