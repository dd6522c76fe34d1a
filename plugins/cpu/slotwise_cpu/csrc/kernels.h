/*
 * The C kernels' entry points, as csrc/ops.cpp calls them; small_gemm.c and paged_decode.c
 * include this header too, so that the compiler checks their definitions against it.
 * Each returns 0, or a nonzero status naming what it refused (ops.cpp raises).
 */
#ifndef SLOTWISE_CPU_KERNELS_H
#define SLOTWISE_CPU_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[m, n] = x[m, k] @ weight[n, k]^T (+ bias[n]), for m of at most 16 rows (small_gemm.c). */
int slotwise_small_gemm(const void *x, int64_t x_stride, const void *weight, const void *bias,
                        void *out, int64_t out_stride, int64_t m, int64_t n, int64_t k,
                        int dtype, int num_threads);

/* The most rows of ``dtype`` it serves faster than torch's GEMM: none without AVX-512 or
 * AVX2; 16 with AVX2 alone; with AVX-512 16, but for bfloat16 16 only where the CPU has
 * AMX tiles (and the process may use them) or AVX512-BF16 without AMX, else 4
 * (small_gemm.c).  Inner sizes that are not whole 32s, which no model here has, run its
 * vector code at any rows. */
int slotwise_small_gemm_rows(int dtype);

/* Decode attention of one query token per request over its paged cache (paged_decode.c);
 * the caches' strides, in elements, are those of their blocks, of a block's tokens and of
 * a token's heads (each head's elements contiguous). */
int slotwise_paged_decode(const void *q, int64_t q_stride_seq, int64_t q_stride_head,
                          void *key_cache, void *value_cache, int64_t num_blocks,
                          int64_t block_stride, int64_t token_stride, int64_t head_stride,
                          const int32_t *block_table, int64_t table_stride,
                          int64_t table_width, const int32_t *seq_lens, void *out,
                          int64_t out_stride_seq, int64_t out_stride_head, int64_t num_seqs,
                          int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                          int64_t block_size, float scale, int dtype, int num_threads,
                          const void *new_keys, int64_t new_key_stride,
                          const void *new_values, int64_t new_value_stride,
                          const int64_t *slot_mapping, int64_t num_new);

#ifdef __cplusplus
}
#endif

#endif
