/*
 * Decode attention straight from the paged KV cache: one query token per request, its
 * keys and values read in place from the blocks of its block table, so a step reads
 * each cached byte once and copies none.  Scores, the softmax and the weighted sum of
 * values are computed in float32 whatever the cache's dtype.
 *
 * Each request's tokens are cut into partitions of PARTITION tokens; a work item is one
 * partition of one request, all heads at once, a block's heads one after the other, so
 * with CPU_SDPA's head-major blocks (each head's rows together) it reads its blocks front
 * to back.  Items run on OpenMP threads; a long request thus spreads over every thread
 * even at batch 1.  An item first scores all its tokens against every query head
 * (reading only keys), takes the softmax of those scores, then sums the values weighted
 * by it (reading only values): each pass reads one stream of memory rather than keys and
 * values in turn (see attend_partition).  It keeps, per query head, the maximum of its
 * scores, the sum of their exponentials and the weighted sum of values; a last pass
 * merges the partitions of each request.
 *
 * Layouts (element strides are passed for q, out and the caches; the rest is contiguous):
 *   q            [num_seqs, num_heads, head_size]
 *   key_cache    blocks of block_size tokens of num_kv_heads heads of head_size elements,
 *                each head's elements contiguous, the other three strides free: CPU_SDPA
 *                passes [num_blocks, num_kv_heads, block_size, head_size] (value_cache
 *                alike)
 *   block_table  int32 [num_seqs, table_stride], of which table_width columns are valid
 *   seq_lens     int32 [num_seqs]: tokens to attend to, the new one included
 *   out          [num_seqs, num_heads, head_size], the dtype of q
 *
 * The hot loops use AVX-512 where the compiler targets it (-march=native on a CPU that
 * has it), else AVX2 where it targets that (the ungrouped loops only), and portable C,
 * which compilers vectorise, elsewhere.
 */
#define _GNU_SOURCE /* syscall(), for amx.h */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "kernels.h"
#include "lane_sums.h"
#include "scalars.h"

/* The AVX2 loops, where the CPU has AVX2 but not AVX-512 (AMD's Zen 2 and Zen 3). */
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define AVX2_LOOPS 1
#endif
#if defined(__AVX512F__) || defined(AVX2_LOOPS)
#include <immintrin.h>
#endif

enum { STATUS_OK = 0, STATUS_BAD_ARGUMENT = 1, STATUS_BAD_BLOCK = 2, STATUS_NO_MEMORY = 3 };
/* Tokens per partition (one work item) and per tile (read from one block at a time).
 * Partitions of 512 rather than 256 tokens: 1.01x to 1.12x in float32 and bfloat16 at
 * 16 x 2,048 tokens, 0.98x to 1.13x at 1 x 2,048 (Zen 4, two threads, interleaved), with
 * the partition's scores of 8 heads (16 KiB) in L1. */
enum { PARTITION = 512, TILE = 16 };

/* Where element d of a head lives in the float32 query and accumulator rows.  bfloat16
 * rows of a multiple of 32 elements are kept "paired" under AVX-512: each 32 elements
 * as their 16 even then their 16 odd ones, the order in which one 512-bit load of
 * bfloat16 splits into two float32 vectors with a shift and a mask; under AVX2 each 16
 * as their 8 even then 8 odd ones, for a 256-bit load. */
#ifdef AVX2_LOOPS
/* Whether the AVX2 loops take rows of ``n`` elements (else the portable ones): whole 16s,
 * as many as the registers hold. */
static inline int avx2_rows(int64_t n) { return n % 16 == 0 && n <= 128; }
#endif

static inline int64_t lane(int64_t d, int64_t n, int dtype) {
#ifdef __AVX512F__
    if (dtype == DTYPE_BFLOAT16 && n % 32 == 0) return (d & ~(int64_t)31) + (d & 1) * 16 + (d & 31) / 2;
#elif defined(AVX2_LOOPS)
    if (dtype == DTYPE_BFLOAT16 && avx2_rows(n))
        return (d & ~(int64_t)15) + (d & 1) * 8 + (d & 15) / 2;
#else
    (void)n;
    (void)dtype;
#endif
    return d;
}

/* 2^f for f in [-0.5, 0.5], as the vector exponentials (exp16, exp8) compute it: a
 * degree-6 polynomial by Horner's rule, its leading coefficient and then each TERM. */
#define EXP2_FIRST 1.5353362e-4f
#define EXP2_TERMS(TERM)                                                                  \
    TERM(1.3398874e-3f) TERM(9.6180370e-3f) TERM(5.5503406e-2f) TERM(2.4022652e-1f)       \
    TERM(6.9314718e-1f) TERM(1.0f)

/* Row t of the next tile (``next``) into L1 and of the tile after it (``after``) into L2,
 * for the loops that ask row by row (the grouped loops, and under AVX2 the others for
 * 2-byte dtypes), which call it as they read row t; either may be NULL (see
 * prefetch_ahead).  prefetcht2 for L2, as in prefetch_tile. */
static inline void prefetch_rows(const char *next, const char *after, int64_t offset,
                                 int64_t bytes) {
    for (int64_t byte = 0; byte < bytes; byte += 64) {
        if (next) __builtin_prefetch(next + offset + byte, 0, 3);
        if (after) __builtin_prefetch(after + offset + byte, 0, 1);
    }
}

/* ``rows`` + ``offset``, or NULL for NULL: the rows of one key/value head in a tile. */
static inline const char *head_rows(const char *rows, int64_t offset) {
    return rows ? rows + offset : NULL;
}

/* The portable loops, which compilers vectorise: on a CPU without AVX-512 or AVX2, and
 * under AVX2 for the rows its loops do not take (see avx2_rows). */
static inline void dot_rows_portable(float *restrict scores, const float *restrict q,
                                     const char *rows, int64_t count, int64_t stride,
                                     int64_t n, int dtype) {
    for (int64_t t = 0; t < count; t++) {
        const char *row = rows + t * stride;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < n; i++) sum += q[i] * load_scalar(row, i, dtype);
        scores[t] = sum;
    }
}

static inline void accumulate_rows_portable(float *restrict acc, const float *restrict weights,
                                            const char *rows, int64_t count, int64_t stride,
                                            int64_t n, int dtype) {
    for (int64_t t = 0; t < count; t++) {
        const float w = weights[t];
        const char *row = rows + t * stride;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) acc[i] += w * load_scalar(row, i, dtype);
    }
}

#ifdef __AVX512F__
/* 32 bfloat16 at ``p`` as float32: the even elements, then the odd ones. */
static inline void load32_paired(const void *p, __m512 *even, __m512 *odd) {
    const __m512i x = _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}

/* 16 elements (or the first ``n`` < 16, the rest zero) of ``dtype`` at ``p`` as floats. */
static inline __m512 load16(const void *p, int64_t n, int dtype) {
    __mmask16 mask = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
    if (dtype == DTYPE_FLOAT32) return _mm512_maskz_loadu_ps(mask, p);
    __m256i half = _mm256_maskz_loadu_epi16(mask, p);
    if (dtype == DTYPE_FLOAT16) return _mm512_cvtph_ps(half);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* scores[t] = q . rows[t] for ``count`` rows ``stride`` bytes apart, ``n`` elements each.
 * Inlined with a constant ``n`` and ``dtype``, the query stays in registers.  ``next`` and
 * ``after`` are NULL here: these loops are given their tiles whole (see prefetch_ahead). */
static inline __attribute__((always_inline)) void dot_rows(float *restrict scores,
                                                           const float *restrict q,
                                                           const char *rows, int64_t count,
                                                           int64_t stride, int64_t n, int dtype,
                                                           const char *next, const char *after) {
    (void)next, (void)after;
    const int64_t elem = dtype == DTYPE_FLOAT32 ? 4 : 2;
    if (dtype == DTYPE_BFLOAT16 && n % 32 == 0) { /* q is paired (see lane) */
        for (int64_t t = 0; t < count; t++) {
            const char *row = rows + t * stride;
            __m512 sum = _mm512_setzero_ps();
            for (int64_t i = 0; i < n; i += 32) {
                __m512 even, odd;
                load32_paired(row + i * 2, &even, &odd);
                sum = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), even, sum);
                sum = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), odd, sum);
            }
            scores[t] = _mm512_reduce_add_ps(sum);
        }
        return;
    }
    for (int64_t t = 0; t < count; t++) {
        const char *row = rows + t * stride;
        __m512 sum = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            __mmask16 mask = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
            sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + i),
                                  load16(row + i * elem, n - i, dtype), sum);
        }
        scores[t] = _mm512_reduce_add_ps(sum);
    }
}

/* acc[0:n] += sum over t of weights[t] * rows[t], accumulating in registers; ``next``
 * and ``after`` as in dot_rows. */
static inline __attribute__((always_inline)) void accumulate_rows(float *restrict acc,
                                                                  const float *restrict weights,
                                                                  const char *rows, int64_t count,
                                                                  int64_t stride, int64_t n,
                                                                  int dtype, const char *next,
                                                                  const char *after) {
    (void)next, (void)after;
    const int64_t elem = dtype == DTYPE_FLOAT32 ? 4 : 2;
    if (dtype == DTYPE_BFLOAT16 && n <= 256 && n % 32 == 0) { /* acc is paired (see lane) */
        __m512 sums[16];
        for (int64_t c = 0; c < n / 16; c++) sums[c] = _mm512_loadu_ps(acc + 16 * c);
        for (int64_t t = 0; t < count; t++) {
            const __m512 w = _mm512_set1_ps(weights[t]);
            for (int64_t c = 0; c < n / 32; c++) {
                __m512 even, odd;
                load32_paired(rows + t * stride + 64 * c, &even, &odd);
                sums[2 * c] = _mm512_fmadd_ps(w, even, sums[2 * c]);
                sums[2 * c + 1] = _mm512_fmadd_ps(w, odd, sums[2 * c + 1]);
            }
        }
        for (int64_t c = 0; c < n / 16; c++) _mm512_storeu_ps(acc + 16 * c, sums[c]);
        return;
    }
    if (n <= 256 && n % 16 == 0) { /* every chunk in a register of its own */
        __m512 sums[16];
        for (int64_t c = 0; c < n / 16; c++) sums[c] = _mm512_loadu_ps(acc + 16 * c);
        for (int64_t t = 0; t < count; t++) {
            const __m512 w = _mm512_set1_ps(weights[t]);
            for (int64_t c = 0; c < n / 16; c++)
                sums[c] = _mm512_fmadd_ps(w, load16(rows + t * stride + 16 * c * elem, 16, dtype),
                                          sums[c]);
        }
        for (int64_t c = 0; c < n / 16; c++) _mm512_storeu_ps(acc + 16 * c, sums[c]);
        return;
    }
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mask = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 sum = _mm512_maskz_loadu_ps(mask, acc + i);
        for (int64_t t = 0; t < count; t++)
            sum = _mm512_fmadd_ps(_mm512_set1_ps(weights[t]),
                                  load16(rows + t * stride + i * elem, n - i, dtype), sum);
        _mm512_mask_storeu_ps(acc + i, mask, sum);
    }
}

/* One cached row of ``n`` elements (a multiple of 16) as n / 16 float vectors, bfloat16
 * rows paired as the query and accumulators are (see lane). */
static inline __attribute__((always_inline)) void load_row(__m512 *row, const char *p,
                                                           int64_t n, int dtype) {
    const int64_t elem = dtype == DTYPE_FLOAT32 ? 4 : 2;
    if (dtype == DTYPE_BFLOAT16 && n % 32 == 0) {
        for (int64_t c = 0; c < n / 16; c += 2) load32_paired(p + 32 * c, &row[c], &row[c + 1]);
        return;
    }
    for (int64_t c = 0; c < n / 16; c++) row[c] = load16(p + 16 * c * elem, 16, dtype);
}

/* For the ``G`` query heads that share one key/value head: scores[j * PARTITION + t] =
 * queries[j] . keys[t] for ``count`` tokens.  Each key row is loaded and converted once for
 * all G heads rather than once per head (accumulate_group does the same for values).
 * With ``next`` and ``after`` (this head's keys in the next two tiles, of as many tokens),
 * row t of each is asked for as row t is scored (see prefetch_tile for why spread out).
 * Called with constant G (at most 4) and ``n`` (a multiple of 16, at most 128) where
 * (G + 1) * n / 16 registers hold a row and G accumulators (see attend). */
static inline __attribute__((always_inline)) void dot_group(
    float *restrict scores, const float *restrict queries, const char *keys, int64_t count,
    int64_t stride, int64_t n, int dtype, const int64_t G, const char *next,
    const char *after) {
    const int64_t chunks = n / 16, row_bytes = n * (dtype == DTYPE_FLOAT32 ? 4 : 2);
    __m512 row[8];
    for (int64_t t = 0; t < count; t++) {
        prefetch_rows(next, after, t * stride, row_bytes);
        load_row(row, keys + t * stride, n, dtype);
        for (int64_t j = 0; j < G; j++) {
            __m512 sum = _mm512_setzero_ps();
            for (int64_t c = 0; c < chunks; c++)
                sum = _mm512_fmadd_ps(_mm512_loadu_ps(queries + j * n + 16 * c), row[c], sum);
            scores[j * PARTITION + t] = _mm512_reduce_add_ps(sum);
        }
    }
}

#ifdef __AVX512BF16__
/* dot_group for bfloat16 keys not scored on AMX tiles, where the CPU has AVX512-BF16: each
 * 32-element chunk of a key row meets the query's, bfloat16 as given (``queries``, G rows
 * of n elements, n a multiple of 32 up to 128), in one pairwise dot product (products
 * exact, sums in float32), instead of two float32 conversions and two fused multiply-adds;
 * the scale is applied to the sum.  On an AMD EPYC (Zen 5): 1.01x to 1.06x per layer,
 * 8 layers' caches of 16 x 2,048 tokens, blocks in order and shuffled, interleaved, outputs
 * identical; the same walk without any arithmetic was 1.04x to 1.09x, so memory still
 * bounds it.
 * One query head at a time, the tile's 16 sums reduced together (lane_sums.h) and stored
 * as one vector, rather than each token's reduced and stored alone: the same bits, fewer
 * instructions (the key rows come from L1 for the group's other heads); on the same host
 * 1.08x to 1.14x with 16 x 256 tokens in the caches, 0.97x to 1.04x from memory. */
static inline __attribute__((always_inline)) void dot_group_bf16(
    float *restrict scores, const uint16_t *restrict queries, const char *keys, int64_t count,
    int64_t stride, int64_t n, const int64_t G, const char *next, const char *after,
    float scale) {
    const int64_t chunks = n / 32;
    const __mmask16 valid = count >= TILE ? (__mmask16)0xffff : (__mmask16)((1u << count) - 1u);
    for (int64_t j = 0; j < G; j++) {
        __m512i query[4];
        for (int64_t c = 0; c < chunks; c++)
            query[c] = _mm512_loadu_si512(queries + j * n + 32 * c);
        __m512 sums[TILE];
#pragma GCC unroll 16
        for (int64_t t = 0; t < TILE; t++) {
            sums[t] = _mm512_setzero_ps();
            if (t >= count) continue;
            if (j == 0) prefetch_rows(next, after, t * stride, n * 2);
            for (int64_t c = 0; c < chunks; c++)
                sums[t] = _mm512_dpbf16_ps(
                    sums[t], (__m512bh)_mm512_loadu_si512(keys + t * stride + 64 * c),
                    (__m512bh)query[c]);
        }
        _mm512_mask_storeu_ps(scores + j * PARTITION, valid,
                              _mm512_mul_ps(lane_sums16(sums), _mm512_set1_ps(scale)));
    }
}
#endif

/* acc[j] += sum over t of weights[j * PARTITION + t] * values[t] for the G heads of a group;
 * ``next`` and ``after`` as in dot_group, for the values. */
static inline __attribute__((always_inline)) void accumulate_group(
    float *restrict acc, const float *restrict weights, const char *values, int64_t count,
    int64_t stride, int64_t n, int dtype, const int64_t G, const char *next,
    const char *after) {
    const int64_t chunks = n / 16, row_bytes = n * (dtype == DTYPE_FLOAT32 ? 4 : 2);
    __m512 sums[4][8], row[8];
    for (int64_t j = 0; j < G; j++)
        for (int64_t c = 0; c < chunks; c++) sums[j][c] = _mm512_loadu_ps(acc + j * n + 16 * c);
    for (int64_t t = 0; t < count; t++) {
        prefetch_rows(next, after, t * stride, row_bytes);
        load_row(row, values + t * stride, n, dtype);
        for (int64_t j = 0; j < G; j++) {
            const __m512 w = _mm512_set1_ps(weights[j * PARTITION + t]);
            for (int64_t c = 0; c < chunks; c++)
                sums[j][c] = _mm512_fmadd_ps(w, row[c], sums[j][c]);
        }
    }
    for (int64_t j = 0; j < G; j++)
        for (int64_t c = 0; c < chunks; c++) _mm512_storeu_ps(acc + j * n + 16 * c, sums[j][c]);
}

/* exp(x) for 16 floats: 2^(x log2 e) as 2^n times a degree-6 polynomial of the rest,
 * within 2 ulp of expf; -inf gives 0. */
static inline __m512 exp16(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f)); /* below: 0 after the final scaling */
    __m512 t = _mm512_mul_ps(x, log2e);
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n); /* in [-0.5, 0.5] */
    __m512 p = _mm512_set1_ps(EXP2_FIRST);
#define TERM(c) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    EXP2_TERMS(TERM)
#undef TERM
    return _mm512_scalef_ps(p, n);
}

/* scores[0:count] <- exp(scores - maximum); returns their sum. */
static inline float exp_and_sum(float *scores, int64_t count, float maximum) {
    __mmask16 mask = count >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << count) - 1u);
    __m512 s = _mm512_maskz_loadu_ps(mask, scores);
    __m512 e = exp16(_mm512_sub_ps(s, _mm512_set1_ps(maximum)));
    e = _mm512_maskz_mov_ps(mask, e);
    _mm512_mask_storeu_ps(scores, mask, e);
    return _mm512_reduce_add_ps(e);
}
#elif defined(AVX2_LOOPS)
/* 16 bfloat16 at ``p`` as float32: the even elements, then the odd ones (see lane). */
static inline void load16_paired(const void *p, __m256 *even, __m256 *odd) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)p);
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
}

/* 8 elements of ``dtype`` at ``p`` as floats. */
static inline __m256 load8(const void *p, int dtype) {
    if (dtype == DTYPE_FLOAT32) return _mm256_loadu_ps((const float *)p);
    const __m128i half = _mm_loadu_si128((const __m128i *)p);
    if (dtype == DTYPE_FLOAT16) return _mm256_cvtph_ps(half);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

/* Lanes below ``count`` (at most 8) set. */
static inline __m256i first_lanes(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The first ``count`` lanes of ``v`` stored at ``p``; masked only for fewer than eight,
 * as a masked store is slow on AMD's cores.  Unmasked where full, here and in
 * exp_and_sum: 1.02x to 1.12x per layer at 16 x 2,048 (Zen 3, interleaved). */
static inline void store_first(float *p, __m256 v, int64_t count) {
    if (count >= 8)
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, first_lanes(count), v);
}

/* scores[t] = q . rows[t] for ``count`` rows ``stride`` bytes apart, ``n`` elements each,
 * eight rows at a time, their sums reduced together (lane_sums8).  With ``next`` and
 * ``after`` (the same head's rows in the next two tiles, of as many tokens), row t of
 * each is asked for as row t is read (see prefetch_ahead). */
static inline __attribute__((always_inline)) void dot_rows(float *restrict scores,
                                                           const float *restrict q,
                                                           const char *rows, int64_t count,
                                                           int64_t stride, int64_t n, int dtype,
                                                           const char *next, const char *after) {
    if (!avx2_rows(n)) {
        dot_rows_portable(scores, q, rows, count, stride, n, dtype);
        return;
    }
    const int64_t elem = dtype == DTYPE_FLOAT32 ? 4 : 2;
    for (int64_t first = 0; first < count; first += 8) {
        __m256 sums[8];
#pragma GCC unroll 8
        for (int64_t t = 0; t < 8; t++) {
            sums[t] = _mm256_setzero_ps();
            if (first + t >= count) continue;
            const char *row = rows + (first + t) * stride;
            prefetch_rows(next, after, (first + t) * stride, n * elem);
            if (dtype == DTYPE_BFLOAT16) {
                for (int64_t c = 0; c < n / 8; c += 2) {
                    __m256 even, odd;
                    load16_paired(row + 16 * c, &even, &odd);
                    sums[t] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), even, sums[t]);
                    sums[t] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c + 8), odd, sums[t]);
                }
            } else {
                for (int64_t c = 0; c < n / 8; c++)
                    sums[t] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c),
                                              load8(row + 8 * c * elem, dtype), sums[t]);
            }
        }
        store_first(scores + first, lane_sums8(sums), count - first);
    }
}

/* acc[0:n] += sum over t of weights[t] * rows[t], accumulating in registers; ``next``
 * and ``after`` as in dot_rows.  Here and in dot_rows each 16 elements of a row are
 * converted as they are multiplied, not the whole row first: a row's vectors then need no
 * registers of their own, where for bfloat16 values the eight accumulators, the row's
 * eight vectors, the weight and the mask did not fit AVX2's sixteen and two vectors went
 * through the stack each token (AMD EPYC, Zen 3, one thread, a request's 512 tokens in
 * L2: 1.17x in bfloat16; 8 layers of 16 x 2,048 tokens from memory, two threads: 0.97x to
 * 1.06x; float32 unchanged; outputs identical). */
static inline __attribute__((always_inline)) void accumulate_rows(float *restrict acc,
                                                                  const float *restrict weights,
                                                                  const char *rows, int64_t count,
                                                                  int64_t stride, int64_t n,
                                                                  int dtype, const char *next,
                                                                  const char *after) {
    if (!avx2_rows(n)) {
        accumulate_rows_portable(acc, weights, rows, count, stride, n, dtype);
        return;
    }
    const int64_t elem = dtype == DTYPE_FLOAT32 ? 4 : 2;
    __m256 sums[16];
    for (int64_t c = 0; c < n / 8; c++) sums[c] = _mm256_loadu_ps(acc + 8 * c);
    for (int64_t t = 0; t < count; t++) {
        const __m256 w = _mm256_set1_ps(weights[t]);
        const char *row = rows + t * stride;
        prefetch_rows(next, after, t * stride, n * elem);
        if (dtype == DTYPE_BFLOAT16) {
            for (int64_t c = 0; c < n / 8; c += 2) {
                __m256 even, odd;
                load16_paired(row + 16 * c, &even, &odd);
                sums[c] = _mm256_fmadd_ps(w, even, sums[c]);
                sums[c + 1] = _mm256_fmadd_ps(w, odd, sums[c + 1]);
            }
        } else {
            for (int64_t c = 0; c < n / 8; c++)
                sums[c] = _mm256_fmadd_ps(w, load8(row + 8 * c * elem, dtype), sums[c]);
        }
    }
    for (int64_t c = 0; c < n / 8; c++) _mm256_storeu_ps(acc + 8 * c, sums[c]);
}

/* exp(x) for 8 floats, as exp16 under AVX-512 computes it: 2^(x log2 e) as 2^n times a
 * degree-6 polynomial of the rest, 2^n built in the exponent bits. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f)); /* 2^n stays a normal float */
    const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(t, n); /* in [-0.5, 0.5] */
    __m256 p = _mm256_set1_ps(EXP2_FIRST);
#define TERM(c) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
    EXP2_TERMS(TERM)
#undef TERM
    const __m256i two_n =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

/* scores[0:count] <- exp(scores - maximum); returns their sum. */
static inline float exp_and_sum(float *scores, int64_t count, float maximum) {
    __m256 total = _mm256_setzero_ps();
    for (int64_t t = 0; t < count; t += 8) {
        const __m256i mask = first_lanes(count - t);
        const __m256 s = count - t >= 8 ? _mm256_loadu_ps(scores + t)
                                        : _mm256_maskload_ps(scores + t, mask);
        const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(s, _mm256_set1_ps(maximum))),
                                       _mm256_castsi256_ps(mask));
        store_first(scores + t, e, count - t);
        total = _mm256_add_ps(total, e);
    }
    return lane_sum8(total);
}
#else
/* ``next`` and ``after`` are NULL here, as under AVX-512. */
static inline void dot_rows(float *restrict scores, const float *restrict q, const char *rows,
                            int64_t count, int64_t stride, int64_t n, int dtype,
                            const char *next, const char *after) {
    (void)next, (void)after;
    dot_rows_portable(scores, q, rows, count, stride, n, dtype);
}

static inline void accumulate_rows(float *restrict acc, const float *restrict weights,
                                   const char *rows, int64_t count, int64_t stride, int64_t n,
                                   int dtype, const char *next, const char *after) {
    (void)next, (void)after;
    accumulate_rows_portable(acc, weights, rows, count, stride, n, dtype);
}

static inline float exp_and_sum(float *scores, int64_t count, float maximum) {
    float sum = 0.0f;
    for (int64_t t = 0; t < count; t++) {
        scores[t] = expf(scores[t] - maximum);
        sum += scores[t];
    }
    return sum;
}
#endif

typedef struct {
    const char *q, *key_cache, *value_cache;
    const int32_t *block_table, *seq_lens;
    char *out;
    int64_t q_stride_seq, q_stride_head, table_stride, table_width, out_stride_seq,
        out_stride_head, num_blocks, num_heads, num_kv_heads, head_size, block_size, elem;
    /* Bytes between the caches' blocks, a block's tokens and a token's heads (see the
     * layouts at the top). */
    int64_t block_bytes, token_bytes, head_bytes;
    float scale;
    int dtype, amx; /* amx: bfloat16 keys scored on AMX tiles (see amx_scores) */
} Problem;

/* The tile of tokens [start, start + *count) of a request: as many as fit in TILE, in
 * the block that holds ``start`` and before ``end``.  Returns the byte offset of its first
 * row in the key (and value) cache, or -1 for a block id outside the cache. */
static inline int64_t find_tile(const Problem *p, const int32_t *blocks, int64_t start,
                                int64_t end, int64_t *count) {
    const int64_t offset = start % p->block_size;
    *count = p->block_size - offset;
    if (*count > TILE) *count = TILE;
    if (*count > end - start) *count = end - start;
    const int64_t block = blocks[start / p->block_size];
    if (block < 0 || block >= p->num_blocks) return -1;
    return block * p->block_bytes + offset * p->token_bytes;
}

/* Asks for the rows of ``cache`` (keys or values) of the tile that starts at token
 * ``next`` (if before ``end``) while the current one is computed.  Each tile is one block
 * of the cache, somewhere else in memory than the last, so the hardware prefetcher starts
 * afresh on every tile; measured with the caches in memory (8 layers, 16 x 2,048 tokens), 1.18x in
 * float32 and 1.32x in bfloat16 per layer on an Intel Xeon.  A block id outside the cache
 * is left to the caller, which refuses it when it gets there.
 *
 * All at once, the requests fill the core's miss buffers and the loop waits for them, so
 * fetching and computing take turns; the grouped loops instead ask for the next tile's
 * rows one by one as they compute the current tile's (next_tile_rows): on an AMD EPYC
 * (Zen 4), same caches, interleaved, outputs identical, 1.09x to 1.15x with two threads
 * in both dtypes and 1.19x with one.  One tile ahead is too late for memory there, so
 * they also ask for the tile after it into L2 (``to_l2``): all at once, 1.13x to 1.24x
 * more with two threads (float32 and bfloat16, with and without huge pages), 1.30x with
 * one; with prefetcht1, prefetchnta or more tiles ahead, less.  The grouped loops now ask
 * for that tile row by row too, as for the next: on an AMD EPYC (Zen 5), same caches,
 * interleaved, outputs identical, three runs: bfloat16 1.03x to 1.10x, blocks in order and
 * shuffled; float32 1.02x to 1.09x shuffled, 0.94x to 1.00x in order.  A plain read of the
 * same layout with a few multiply-adds per line lost as much to the burst (0.89x), which
 * likely fills the miss buffers that the loads then wait for.  The ungrouped loops (8
 * key/value heads for 8 query heads) ask for it at once: 1.07x in bfloat16, 1.01x in
 * float32 on Zen 4.  The AMX path was measured on the Xeon only and keeps one tile ahead.
 * Under AVX2 (Zen 3, 8 layers' caches of 16 x 2,048 tokens, interleaved), the ungrouped
 * loops ask for bfloat16 rows row by row, by the first query head of each group: 1.06x
 * to 1.21x against the bursts.  float32 rows, read front to back from head-major blocks,
 * are left to the hardware prefetcher (``ahead`` off): the bursts were 0.80x to 0.97x
 * against none, row by row 0.92x to 1.09x (docs/benchmarks.md). */
static inline __attribute__((always_inline)) void prefetch_tile(const Problem *p,
                                                                const char *cache,
                                                                const int32_t *blocks,
                                                                int64_t next, int64_t end,
                                                                const int to_l2) {
    if (next >= end) return;
    int64_t count;
    const int64_t first = find_tile(p, blocks, next, end, &count);
    if (first < 0) return;
    /* From the tile's first row to its last head's last row. */
    const int64_t span = (count - 1) * p->token_bytes + (p->num_kv_heads - 1) * p->head_bytes +
                         p->head_size * p->elem;
    for (int64_t byte = 0; byte < span; byte += 64) {
        if (to_l2) /* prefetcht2: not into L1, where the two tiles in use live */
            __builtin_prefetch(cache + first + byte, 0, 1);
        else
            __builtin_prefetch(cache + first + byte, 0, 3);
    }
}

/* The first row in ``cache`` of the next tile, if it starts at ``next`` < ``end`` and
 * holds ``count`` tokens, as the current one; else NULL (prefetch_tile then serves it). */
static inline const char *next_tile_rows(const Problem *p, const char *cache,
                                         const int32_t *blocks, int64_t next, int64_t end,
                                         int64_t count) {
    if (next >= end) return NULL;
    int64_t next_count;
    const int64_t first = find_tile(p, blocks, next, end, &next_count);
    return first < 0 || next_count != count ? NULL : cache + first;
}

/* Asks for what follows the tile of ``count`` tokens at ``start`` in ``cache``, unless
 * ``ahead`` is off: the next tile and, except on the AMX path, the tile after it, into
 * L2 (see prefetch_tile).  For the loops that ask row by row (``row_by_row``: the
 * grouped ones, and under AVX2 the others for 2-byte rows), each of the two tiles that
 * holds as many tokens is returned for them to ask for row by row (the next one's first
 * row, and the one after in ``*after``); the others, and every tile for the other
 * loops, are asked for whole here.  Returns the next tile's first row or NULL. */
static inline __attribute__((always_inline)) const char *prefetch_ahead(
    const Problem *p, const char *cache, const int32_t *blocks, int64_t start, int64_t count,
    int64_t end, const int ahead, const int row_by_row, const int amx, const char **after) {
    *after = NULL;
    if (!ahead) return NULL;
    const int64_t next_start = start + count, after_start = start + 2 * count;
    const char *next =
        row_by_row ? next_tile_rows(p, cache, blocks, next_start, end, count) : NULL;
    if (row_by_row && !amx) *after = next_tile_rows(p, cache, blocks, after_start, end, count);
    if (next == NULL) prefetch_tile(p, cache, blocks, next_start, end, 0);
    if (!amx && *after == NULL) /* whole (or part of it, when the next one is shorter) */
        prefetch_tile(p, cache, blocks, after_start, end, 1);
    return next;
}

#ifdef HAVE_AMX
/* bfloat16 keys on AMX tiles (amx.h): the scores of a tile of 16 tokens against every
 * query head are one tile product per 32 elements of the head size, keys (16 tokens x
 * 32 elements, read in place) times the queries (32 elements x H heads, paired as AMX
 * wants), products exact and sums in float32.  One product serves all the query heads;
 * the scores of those that read another key/value head are ignored.  Tile registers (the
 * intrinsics take literal numbers): 0 and 1 scores, 2 and 3 keys, 4 to 7 the queries.
 * Measured against the vector loop (16 x 2,048 tokens, 8 layers' caches in memory,
 * interleaved): 1.03x with two threads, 1.06x with one; memory, not arithmetic, is what
 * bounds the kernel there (docs/benchmarks.md). */

/* The query of every head as AMX's right-hand operand: pairs[d / 2][h][d % 2] = q[h][d],
 * then loaded into the query tiles, 32 elements of the head size per tile. */
static inline __attribute__((always_inline)) void load_query_tiles(const Problem *p,
                                                                   const uint16_t *q,
                                                                   uint16_t *pairs,
                                                                   const int64_t D) {
    const int64_t H = p->num_heads;
    for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < D; d++)
            pairs[((d / 2) * H + h) * 2 + d % 2] = q[h * p->q_stride_head + d];
    const int64_t stride = H * 4, chunk = 16 * H * 2;
    _tile_loadd(4, pairs, stride);
    if (D > 32) _tile_loadd(5, pairs + chunk, stride);
    if (D > 64) _tile_loadd(6, pairs + 2 * chunk, stride);
    if (D > 96) _tile_loadd(7, pairs + 3 * chunk, stride);
}

/* One key/value head's keys (``keys``, 16 rows ``stride`` bytes apart) times the query
 * tiles, into score tile C, stored as [16 tokens][H] floats at ``out``. */
#define KEY_SCORES(C, keys, stride, out, D)                                         \
    do {                                                                            \
        _tile_zero(C);                                                              \
        _tile_loadd(2, (keys), (stride));                                           \
        _tile_dpbf16ps(C, 2, 4);                                                    \
        if ((D) > 32) {                                                             \
            _tile_loadd(3, (keys) + 64, (stride));                                  \
            _tile_dpbf16ps(C, 3, 5);                                                \
        }                                                                           \
        if ((D) > 64) {                                                             \
            _tile_loadd(2, (keys) + 128, (stride));                                 \
            _tile_dpbf16ps(C, 2, 6);                                                \
        }                                                                           \
        if ((D) > 96) {                                                             \
            _tile_loadd(3, (keys) + 192, (stride));                                 \
            _tile_dpbf16ps(C, 3, 7);                                                \
        }                                                                           \
        _tile_stored(C, (out), p->num_heads * 4);                                   \
    } while (0)

/* scores[h * PARTITION + t] = scale * (q[h] . keys[t]) for a tile of 16 tokens (rows past
 * ``count`` are read, from the same block, and their scores ignored). */
static inline __attribute__((always_inline)) void amx_scores(const Problem *p, float *scores,
                                                             float *products, const char *keys,
                                                             int64_t count, int64_t stride,
                                                             const int64_t D) {
    const int64_t H = p->num_heads, KV = p->num_kv_heads, group = H / KV;
    for (int64_t g = 0; g < KV; g += 2) { /* two score tiles in flight */
        KEY_SCORES(0, keys + g * p->head_bytes, stride, products + g * TILE * H, D);
        if (g + 1 < KV)
            KEY_SCORES(1, keys + (g + 1) * p->head_bytes, stride,
                       products + (g + 1) * TILE * H, D);
    }
    for (int64_t h = 0; h < H; h++) {
        const float *column = products + (h / group) * TILE * H + h;
        for (int64_t t = 0; t < count; t++) scores[h * PARTITION + t] = column[t * H] * p->scale;
    }
}
#undef KEY_SCORES
#endif

/* One partition, tokens [begin, end) of request ``seq``: per query head, the scaled
 * queries go to ``query`` [H][D], the maximum score to ``maxes`` [H], the sum of
 * exponentials to ``sums`` [H] and the unnormalised weighted values to ``acc`` [H][D];
 * ``scores`` [H][PARTITION] and ``products`` [num_kv_heads][TILE][H] are scratch.  Returns
 * STATUS_BAD_BLOCK for a block id outside the cache.  Inlined into one copy per common
 * head size, dtype and grouped-query ratio (``D``, ``dtype``, ``G`` constants), so the
 * inner loops unroll and keep their vectors in registers; ``G`` > 0 (the query heads per
 * key/value head) reads each key and value row once per group, 0 once per query head;
 * ``amx`` scores bfloat16 keys on AMX tiles (``query`` then holds the paired queries;
 * for dot_group_bf16, the bfloat16 queries as given).
 *
 * Two passes over the partition's tiles, keys then values, rather than one that reads a
 * tile's keys and then its values: on an AMD EPYC (Zen 4) a core streams one region of
 * memory much faster than two in turn (8 layers' caches of 16 x 2,048 tokens, two
 * threads, interleaved, blocks in order or shuffled: 1.10x to 1.20x in float32, 1.15x to
 * 1.56x in bfloat16; the scores of a partition stay in L1 or L2 between the passes).
 * The softmax is then taken once per partition instead of rescaled once per tile. */
static inline __attribute__((always_inline)) int attend_partition(
    const Problem *p, int64_t seq, int64_t begin, int64_t end, float *restrict query,
    float *restrict maxes, float *restrict sums, float *restrict acc, float *restrict scores,
    float *restrict products, const int64_t D, const int dtype, const int64_t G,
    const int amx) {
    const int64_t H = p->num_heads, group = H / p->num_kv_heads, elem = dtype ? 2 : 4;
    const char *q = p->q + seq * p->q_stride_seq * elem;
#ifdef HAVE_AMX
    if (amx) load_query_tiles(p, (const uint16_t *)q, (uint16_t *)query, D);
#else
    (void)products;
#endif
#ifdef __AVX512BF16__
    /* bfloat16 scores by dot_group_bf16, which reads the query as given, in ``query``. */
    const int bf16_dots = dtype == DTYPE_BFLOAT16 && G > 0 && !amx && D % 32 == 0 && D <= 128;
#else
    const int bf16_dots = 0;
#endif
    for (int64_t h = 0; h < H; h++) {
        if (bf16_dots)
            memcpy((uint16_t *)query + h * D, q + h * p->q_stride_head * 2, (size_t)D * 2);
        else if (!amx)
            for (int64_t d = 0; d < D; d++)
                query[h * D + lane(d, D, dtype)] =
                    load_scalar(q, h * p->q_stride_head + d, dtype) * p->scale;
        memset(acc + h * D, 0, (size_t)D * sizeof(float));
    }
    const int32_t *blocks = p->block_table + seq * p->table_stride;
    const int64_t token_bytes = p->token_bytes, head_bytes = p->head_bytes;
#ifdef AVX2_LOOPS /* see prefetch_ahead */
    (void)G; /* 0: the grouped loops are AVX-512's */
    const int ahead = dtype != DTYPE_FLOAT32;
    const int row_by_row = ahead && avx2_rows(D);
#else
    const int ahead = 1;
    const int row_by_row = G > 0 && !amx;
#endif
    for (int64_t start = begin; start < end;) { /* pass 1: scores[h][start - begin + t] */
        int64_t count;
        const int64_t first = find_tile(p, blocks, start, end, &count);
        if (first < 0) return STATUS_BAD_BLOCK;
        const char *keys = p->key_cache + first;
        const char *after;
        const char *next = prefetch_ahead(p, p->key_cache, blocks, start, count, end, ahead,
                                          row_by_row, amx, &after);
        float *tile_scores = scores + (start - begin);
#ifdef HAVE_AMX
        if (amx)
            amx_scores(p, tile_scores, products, keys, count, token_bytes, D);
        else
#endif
#ifdef __AVX512BF16__
        if (bf16_dots) {
            for (int64_t g = 0; g < p->num_kv_heads; g++)
                dot_group_bf16(tile_scores + g * G * PARTITION,
                               (const uint16_t *)query + g * G * D, keys + g * head_bytes, count,
                               token_bytes, D, G,
                               head_rows(next, g * head_bytes), head_rows(after, g * head_bytes),
                               p->scale);
        } else
#endif
#ifdef __AVX512F__
        if (G > 0) {
            for (int64_t g = 0; g < p->num_kv_heads; g++)
                dot_group(tile_scores + g * G * PARTITION, query + g * G * D,
                          keys + g * head_bytes, count, token_bytes, D, dtype, G,
                          head_rows(next, g * head_bytes), head_rows(after, g * head_bytes));
        } else
#endif
            for (int64_t h = 0; h < H; h++) { /* a group's first head asks for its rows */
                const int64_t offset = (h / group) * head_bytes;
                dot_rows(tile_scores + h * PARTITION, query + h * D, keys + offset, count,
                         token_bytes, D, dtype, h % group ? NULL : head_rows(next, offset),
                         h % group ? NULL : head_rows(after, offset));
            }
        start += count;
    }
    if (ahead) { /* the first values are fetched while the softmax runs */
        int64_t first_count;
        find_tile(p, blocks, begin, end, &first_count);
        prefetch_tile(p, p->value_cache, blocks, begin, end, 0);
        prefetch_tile(p, p->value_cache, blocks, begin + first_count, end, 1);
    }
    const int64_t n = end - begin;
    for (int64_t h = 0; h < H; h++) {
        float *s = scores + h * PARTITION, maximum = -INFINITY, total = 0.0f;
        /* in vectors (the same maximum): 1.00x to 1.04x per layer on Zen 3, interleaved */
#pragma omp simd reduction(max : maximum)
        for (int64_t t = 0; t < n; t++) maximum = s[t] > maximum ? s[t] : maximum;
        for (int64_t t = 0; t < n; t += TILE)
            total += exp_and_sum(s + t, n - t < TILE ? n - t : TILE, maximum);
        maxes[h] = maximum;
        sums[h] = total;
    }
    for (int64_t start = begin; start < end;) { /* pass 2: acc[h] += weights . values */
        int64_t count;
        /* pass 1 has checked the block ids */
        const char *values = p->value_cache + find_tile(p, blocks, start, end, &count);
        const char *after;
        const char *next = prefetch_ahead(p, p->value_cache, blocks, start, count, end, ahead,
                                          row_by_row, amx, &after);
        const float *weights = scores + (start - begin);
#ifdef __AVX512F__
        if (G > 0) {
            for (int64_t g = 0; g < p->num_kv_heads; g++)
                accumulate_group(acc + g * G * D, weights + g * G * PARTITION,
                                 values + g * head_bytes, count, token_bytes, D, dtype, G,
                                 head_rows(next, g * head_bytes),
                                 head_rows(after, g * head_bytes));
        } else
#endif
            for (int64_t h = 0; h < H; h++) {
                const int64_t offset = (h / group) * head_bytes;
                accumulate_rows(acc + h * D, weights + h * PARTITION, values + offset, count,
                                token_bytes, D, dtype, h % group ? NULL : head_rows(next, offset),
                                h % group ? NULL : head_rows(after, offset));
            }
        start += count;
    }
    return STATUS_OK;
}

/* attend_partition for this problem's head size, dtype and grouped-query ratio,
 * specialised where common (grouped: the ratios whose row and accumulators fit the
 * registers, for head sizes 64 and 128). */
static int attend(const Problem *p, int64_t seq, int64_t begin, int64_t end, float *query,
                  float *maxes, float *sums, float *acc, float *scores, float *products) {
#define ATTEND_WITH(D, DTYPE, G, AMX) \
    attend_partition(p, seq, begin, end, query, maxes, sums, acc, scores, products, D, DTYPE, \
                     G, AMX)
#define ATTEND(D, DTYPE, G) ATTEND_WITH(D, DTYPE, G, 0)
#define FOR_DTYPES(D, G)                                                          \
    {                                                                             \
        if (p->dtype == DTYPE_FLOAT32) return ATTEND(D, DTYPE_FLOAT32, G);        \
        if (p->dtype == DTYPE_BFLOAT16) return ATTEND(D, DTYPE_BFLOAT16, G);      \
        return ATTEND(D, DTYPE_FLOAT16, G);                                       \
    }
    const int64_t group = p->num_heads / p->num_kv_heads;
#ifdef HAVE_AMX
    if (p->amx && p->head_size == 64 && group == 2) return ATTEND_WITH(64, DTYPE_BFLOAT16, 2, 1);
    if (p->amx && p->head_size == 64 && group == 4) return ATTEND_WITH(64, DTYPE_BFLOAT16, 4, 1);
    if (p->amx && p->head_size == 128 && group == 2) return ATTEND_WITH(128, DTYPE_BFLOAT16, 2, 1);
    if (p->amx && p->head_size == 64) return ATTEND_WITH(64, DTYPE_BFLOAT16, 0, 1);
    if (p->amx && p->head_size == 128) return ATTEND_WITH(128, DTYPE_BFLOAT16, 0, 1);
    if (p->amx) return ATTEND_WITH(p->head_size, DTYPE_BFLOAT16, 0, 1);
#endif
#ifdef __AVX512F__
    if (p->head_size == 64 && group == 2) FOR_DTYPES(64, 2)
    if (p->head_size == 64 && group == 4) FOR_DTYPES(64, 4)
    if (p->head_size == 128 && group == 2) FOR_DTYPES(128, 2)
#endif
    (void)group;
    if (p->head_size == 64) FOR_DTYPES(64, 0)
    if (p->head_size == 128) FOR_DTYPES(128, 0)
#undef FOR_DTYPES
    return ATTEND(p->head_size, p->dtype, 0);
#undef ATTEND
#undef ATTEND_WITH
}

/* Request ``seq``'s output for one head: its partitions, each rescaled to the largest
 * maximum, summed in ``value`` [D] (scratch) and normalised. */
static void merge(const Problem *p, int64_t seq, int64_t head, int64_t parts, const float *first,
                  int64_t item_floats, float *value) {
    const int64_t H = p->num_heads, D = p->head_size;
    char *out = p->out + (seq * p->out_stride_seq + head * p->out_stride_head) * p->elem;
    float maximum = -INFINITY, total = 0.0f;
    for (int64_t i = 0; i < parts; i++) {
        const float m = first[i * item_floats + head];
        maximum = m > maximum ? m : maximum;
    }
    memset(value, 0, (size_t)D * sizeof(float));
    for (int64_t i = 0; i < parts; i++) {
        const float *item = first + i * item_floats;
        const float weight = expf(item[head] - maximum);
        total += weight * item[H + head];
        const float *acc = item + 2 * H + head * D;
        for (int64_t d = 0; d < D; d++) value[d] += weight * acc[d];
    }
    const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
    for (int64_t d = 0; d < D; d++)
        store_scalar(out, d, value[lane(d, D, p->dtype)] * inverse, p->dtype);
}

/* Stores ``count`` tokens' keys and values (rows ``key_stride`` and ``value_stride``
 * elements apart, heads contiguous) at cache slots ``slots``; STATUS_BAD_BLOCK for a
 * slot outside the cache. */
static int write_tokens(const Problem *p, const char *keys, int64_t key_stride,
                        const char *values, int64_t value_stride, const int64_t *slots,
                        int64_t count) {
    const int64_t head = p->head_size * p->elem;
    for (int64_t i = 0; i < count; i++) {
        if (slots[i] < 0 || slots[i] >= p->num_blocks * p->block_size) return STATUS_BAD_BLOCK;
        const int64_t slot = (slots[i] / p->block_size) * p->block_bytes +
                             (slots[i] % p->block_size) * p->token_bytes;
        for (int64_t g = 0; g < p->num_kv_heads; g++) {
            memcpy((char *)p->key_cache + slot + g * p->head_bytes,
                   keys + i * key_stride * p->elem + g * head, (size_t)head);
            memcpy((char *)p->value_cache + slot + g * p->head_bytes,
                   values + i * value_stride * p->elem + g * head, (size_t)head);
        }
    }
    return STATUS_OK;
}

/* Whether bfloat16 keys are scored on AMX tiles: the CPU has them (and this build targets
 * them), the process may use them, and the shapes fit: a tile's 16 columns hold every
 * query head, a head is whole 32-element chunks (at most four), and 16-token tiles never
 * straddle blocks. */
static int use_amx(int dtype, int64_t num_heads, int64_t head_size, int64_t block_size) {
#ifdef HAVE_AMX
    return dtype == DTYPE_BFLOAT16 && num_heads <= 16 && head_size % 32 == 0 &&
           head_size <= 128 && block_size % TILE == 0 && amx_permitted();
#else
    (void)dtype, (void)num_heads, (void)head_size, (void)block_size;
    return 0;
#endif
}

/* Returns STATUS_OK, or the STATUS_* code of what it refused (the caller raises).  With
 * ``num_new`` > 0, first stores the step's new keys and values at ``slot_mapping``, so a
 * decode step needs no separate cache write. */
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
                          const int64_t *slot_mapping, int64_t num_new) {
    if (dtype < DTYPE_FLOAT32 || dtype > DTYPE_FLOAT16 || head_size < 1 || block_size < 1 ||
        num_kv_heads < 1 || num_heads % num_kv_heads || num_threads < 1 || num_seqs < 0 ||
        num_new < 0)
        return STATUS_BAD_ARGUMENT;
    const int64_t elem = dtype == DTYPE_FLOAT32 ? 4 : 2;
    const Problem p = {(const char *)q, (const char *)key_cache, (const char *)value_cache,
                       block_table, seq_lens, (char *)out, q_stride_seq, q_stride_head,
                       table_stride, table_width, out_stride_seq, out_stride_head, num_blocks,
                       num_heads, num_kv_heads, head_size, block_size, elem,
                       block_stride * elem, token_stride * elem, head_stride * elem, scale,
                       dtype, use_amx(dtype, num_heads, head_size, block_size)};
    if (num_new > 0) {
        const int status =
            write_tokens(&p, (const char *)new_keys, new_key_stride, (const char *)new_values,
                         new_value_stride, slot_mapping, num_new);
        if (status != STATUS_OK) return status;
    }
    /* Request r owns items first_item[r] .. first_item[r + 1] - 1, one per partition. */
    int64_t items = 0;
    for (int64_t r = 0; r < num_seqs; r++) {
        if (seq_lens[r] < 0 || seq_lens[r] > table_width * block_size) return STATUS_BAD_BLOCK;
        items += (seq_lens[r] + PARTITION - 1) / PARTITION;
    }
    const int64_t H = num_heads, D = head_size;
    /* Per item: maxes [H], sums [H], acc [H][D]; per thread: query [H][D], scores
     * [H][PARTITION] and, for AMX, products [num_kv_heads][TILE][H]. */
    const int64_t item_floats = H * (2 + D),
                  scratch_floats = H * (D + PARTITION + num_kv_heads * TILE);
    int64_t *index = malloc((size_t)(num_seqs + 1 + 2 * items) * sizeof(int64_t));
    float *work = malloc((size_t)(items * item_floats + num_threads * scratch_floats) *
                         sizeof(float));
    if (index == NULL || work == NULL) {
        free(index);
        free(work);
        return STATUS_NO_MEMORY;
    }
    int64_t *first_item = index, *item_seq = index + num_seqs + 1, *item_part = item_seq + items;
    first_item[0] = 0;
    for (int64_t r = 0; r < num_seqs; r++) {
        const int64_t parts = (seq_lens[r] + PARTITION - 1) / PARTITION;
        for (int64_t i = 0; i < parts; i++) {
            item_seq[first_item[r] + i] = r;
            item_part[first_item[r] + i] = i;
        }
        first_item[r + 1] = first_item[r] + parts;
    }
    int status = STATUS_OK;
    /* No more threads than items: waking a thread costs more than a short request's
     * attention (a batch-1 step of a short context is one item). */
    const int team = items < num_threads ? (items > 0 ? (int)items : 1) : num_threads;
#pragma omp parallel num_threads(team) if (team > 1)
    {
        float *scratch = work + items * item_floats + omp_get_thread_num() * scratch_floats;
#ifdef HAVE_AMX
        if (p.amx) { /* see amx_scores */
            const uint16_t heads = (uint16_t)(H * 4);
            const uint16_t bytes_per_row[8] = {heads, heads, 64, 64, heads, heads, heads, heads};
            load_tile_config(bytes_per_row);
        }
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; item++) {
            const int64_t seq = item_seq[item], begin = item_part[item] * PARTITION;
            const int64_t end = begin + PARTITION < seq_lens[seq] ? begin + PARTITION
                                                                  : seq_lens[seq];
            float *maxes = work + item * item_floats;
            int result = attend(&p, seq, begin, end, scratch, maxes, maxes + H, maxes + 2 * H,
                                scratch + H * D, scratch + H * (D + PARTITION));
            if (result != STATUS_OK) {
#pragma omp atomic write
                status = result;
            }
        }
#ifdef HAVE_AMX
        if (p.amx) _tile_release();
#endif
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < num_seqs * H; pair++) {
            const int64_t seq = pair / H;
            merge(&p, seq, pair % H, first_item[seq + 1] - first_item[seq],
                  work + first_item[seq] * item_floats, item_floats, scratch);
        }
    }
    free(index);
    free(work);
    return status;
}
