/*
 * out = x @ weight^T (+ bias) for the few rows of a decode step: x [M, K], weight [N, K]
 * row-major, out [M, N], all of one dtype (float32, bfloat16 or float16), float32
 * accumulation, one rounding to the output dtype at the end.
 *
 * At decode sizes (M of 1 to 16) the product reads every weight once and does little
 * arithmetic on it, so its speed is the speed of streaming the weight.  Each thread
 * takes a contiguous range of weight rows and streams it front to back against every
 * row of x, so each weight byte is loaded from memory once whatever M is: one row at a
 * time up to a few rows of x (a single sequential stream, what the hardware prefetcher
 * follows best), ROWS rows at a time above (fewer loads per multiply-add, for the
 * arithmetic that more rows of x bring).
 * bfloat16 weights meet bfloat16 activations in AVX512-BF16's dot-product instruction
 * (products exact, sums in float32) where the CPU has it, and from AMX_MIN_M rows on in
 * AMX tile products where the CPU has those (see amx_gemm).  A CPU with AVX2 but not
 * AVX-512 runs eight-lane float32 code on the same plan (see the AVX2 inner steps).
 */
#define _GNU_SOURCE /* syscall(), for amx.h */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "kernels.h"
#include "lane_sums.h"
#include "scalars.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum { STATUS_OK = 0, STATUS_BAD_ARGUMENT = 1, STATUS_NO_MEMORY = 2 };
/* Most rows of x served in one pass over the weight; up to ONE_ROW_MAX_M rows (float32)
 * or ONE_ROW_MAX_M_HALF (bfloat16, float16: half the bytes per multiply-add), one weight
 * row at a time (dot_row, which prefetches ROW_PREFETCH_BYTES ahead, but for float32
 * under AVX2), above ROWS weight rows per inner step (dot_block; under AVX2, dot_tile for
 * the 2-byte dtypes), their weight prefetched PREFETCH_GROUPS such steps ahead.  The
 * limits are where dot_block caught up in the measurements of dot_row's comment; with
 * AVX2 alone, float32 blocks win from two rows (AMD EPYC, Zen 3, the small preset's
 * weights, two threads, two runs: 1.05x to 1.12x at 2 and 3 rows). */
enum {
    MAX_M = 16,
#ifdef __AVX512F__
    ONE_ROW_MAX_M = 3,
#else
    ONE_ROW_MAX_M = 1,
#endif
    ONE_ROW_MAX_M_HALF = 4,
    ROWS = 4,
    PREFETCH_GROUPS = 2,
    ROW_PREFETCH_BYTES = 2048
};

typedef struct {
    const char *x, *weight, *bias;
    char *out;
    int64_t m, n, k, x_stride, out_stride, elem;
    int dtype;
} Problem;

/* The portable inner step: sums[r][i] = x[i] . weight[row + r] for r < rows, i < m. */
static inline void dot_rows_scalar(const Problem *p, int64_t row, int64_t rows,
                                   float sums[ROWS][MAX_M]) {
    for (int64_t r = 0; r < rows; r++) {
        const char *w = p->weight + (row + r) * p->k * p->elem;
        for (int64_t i = 0; i < p->m; i++) {
            const char *x = p->x + i * p->x_stride * p->elem;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < p->k; j++)
                sum += load_scalar(w, j, p->dtype) * load_scalar(x, j, p->dtype);
            sums[r][i] = sum;
        }
    }
}

/* The rows of x a block reads, x[i] for i < count; the rest point at the first, unread. */
static inline void x_rows(const Problem *p, int64_t first, int64_t count, int64_t elem,
                          const char *x[4]) {
    for (int64_t i = 0; i < 4; i++)
        x[i] = p->x + (first + (i < count ? i : 0)) * p->x_stride * elem;
}

/* The vector code's dot_block and dot_row with constant sizes and dtype, so that their
 * accumulators live in registers: FUNCTION_DTYPE(p, row, first, count, sums) for counts
 * of 1 to 4 rows of x (SPECIALISE), and a table of them indexed by dtype code,
 * FUNCTION_for (DTYPE_TABLE). */
typedef void (*DotFunction)(const Problem *, int64_t, int64_t, int64_t, float[ROWS][MAX_M]);
#define SPECIALISE(FUNCTION, DTYPE)                                                       \
    static void FUNCTION##_##DTYPE(const Problem *p, int64_t row, int64_t first,          \
                                   int64_t count, float sums[ROWS][MAX_M]) {              \
        switch (count) {                                                                  \
        case 1: FUNCTION(p, row, first, 1, DTYPE, sums); break;                           \
        case 2: FUNCTION(p, row, first, 2, DTYPE, sums); break;                           \
        case 3: FUNCTION(p, row, first, 3, DTYPE, sums); break;                           \
        default: FUNCTION(p, row, first, 4, DTYPE, sums); break;                          \
        }                                                                                 \
    }
#define DTYPE_TABLE(FUNCTION)                                                             \
    static const DotFunction FUNCTION##_for[3] = {                                        \
        FUNCTION##_DTYPE_FLOAT32, FUNCTION##_DTYPE_BFLOAT16, FUNCTION##_DTYPE_FLOAT16};
#define SPECIALISE_ALL(FUNCTION)                                                          \
    SPECIALISE(FUNCTION, DTYPE_FLOAT32)                                                   \
    SPECIALISE(FUNCTION, DTYPE_BFLOAT16)                                                  \
    SPECIALISE(FUNCTION, DTYPE_FLOAT16)                                                   \
    DTYPE_TABLE(FUNCTION)

/* ``dot`` (one of the above) against every row of x, ``per_call`` rows at a time. */
static inline void dot_x_rows(const Problem *p, int64_t row, const DotFunction dot,
                              int64_t per_call, float sums[ROWS][MAX_M]) {
    for (int64_t first = 0; first < p->m; first += per_call)
        dot(p, row, first, p->m - first < per_call ? p->m - first : per_call, sums);
}

#ifdef __AVX512F__
/* 16 elements of ``dtype`` as float32, those outside ``mask`` zero. */
static inline __m512 load16(const char *p, __mmask16 mask, int dtype) {
    if (dtype == DTYPE_FLOAT32) return _mm512_maskz_loadu_ps(mask, p);
    const __m256i half = _mm256_maskz_loadu_epi16(mask, p);
    if (dtype == DTYPE_FLOAT16) return _mm512_cvtph_ps(half);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* The weight rows PREFETCH_GROUPS groups further on are asked for while this group is
 * read: with several rows streamed at once the hardware prefetcher falls behind
 * (measured: bfloat16 11 -> 16 GB/s on one core).  A prefetch past the end is harmless. */
static inline __attribute__((always_inline)) void prefetch_ahead(const char *const w[ROWS],
                                                                 int64_t ahead, int64_t byte) {
    for (int64_t r = 0; r < ROWS; r++) __builtin_prefetch(w[r] + ahead + byte, 0, 3);
}

/* The accumulators of a block, one per weight row r and row i of x: named variables, not
 * an array, so that the compiler keeps all sixteen in registers (an array of vectors it
 * also stored to the stack on every step along k, which halved the kernel's speed). */
#define ACCUMULATORS(OP) \
    OP(0, 0) OP(0, 1) OP(0, 2) OP(0, 3) OP(1, 0) OP(1, 1) OP(1, 2) OP(1, 3) \
    OP(2, 0) OP(2, 1) OP(2, 2) OP(2, 3) OP(3, 0) OP(3, 1) OP(3, 2) OP(3, 3)
#define DECLARE(r, i) __m512 a##r##i = _mm512_setzero_ps();

/* sums[r][first + i] = the sum of acc[r][i]'s lanes, for all four i, reduced together
 * (lane_sums.h): the columns past the block's rows of x get its zero accumulators
 * (first + 3 < MAX_M, and store_rows reads only the rows of x).  Measured on an AMD EPYC
 * (Zen 5) with the small preset's 33 matrices in memory, two threads, interleaved, against
 * 16 separate reductions: 1.07x to 1.16x at 16 rows in bfloat16, 1.03x in float32 (see
 * dot_block's keep_loaded for the rest), 1.00x at 4 rows. */
static inline __attribute__((always_inline)) void store_block_sums(float sums[ROWS][MAX_M],
                                                                   int64_t first,
                                                                   const __m512 acc[ROWS][4]) {
    const __m512 all = lane_sums16(&acc[0][0]); /* lane 4 r + i: acc[r][i] */
    _mm_storeu_ps(sums[0] + first, _mm512_extractf32x4_ps(all, 0));
    _mm_storeu_ps(sums[1] + first, _mm512_extractf32x4_ps(all, 1));
    _mm_storeu_ps(sums[2] + first, _mm512_extractf32x4_ps(all, 2));
    _mm_storeu_ps(sums[3] + first, _mm512_extractf32x4_ps(all, 3));
}

/* One step along k, ``lanes`` elements loaded under ``mask`` (all ones but at the end of a
 * row): x row i (i < count) against the ROWS weight rows, each vector loaded once. */
#ifdef __AVX512BF16__
#define LOAD_X_BF16(i) \
    const __m512bh x##i = i < count ? (__m512bh)_mm512_maskz_loadu_epi16(mask, x[i] + byte) \
                                    : (__m512bh)_mm512_setzero_si512();
#define FMA_BF16(r, i) if (i < count) a##r##i = _mm512_dpbf16_ps(a##r##i, w##r, x##i);
#define LOAD_W_BF16(r) \
    const __m512bh w##r = (__m512bh)_mm512_maskz_loadu_epi16(mask, w[r] + byte);
#endif
#define LOAD_X(i)                                                                     \
    __m512 x##i = i < count ? load16(x[i] + byte, (__mmask16)mask, dtype)             \
                            : _mm512_setzero_ps();                                    \
    if (keep_loaded) __asm__("" : "+v"(x##i)); /* held in a register (see dot_block) */
#define LOAD_W(r)                                                                     \
    __m512 w##r = load16(w[r] + byte, (__mmask16)mask, dtype);                        \
    if (keep_loaded) __asm__("" : "+v"(w##r));
#define FMA(r, i) if (i < count) a##r##i = _mm512_fmadd_ps(w##r, x##i, a##r##i);

#ifdef __AVX512BF16__
#define DOT_STEP(mask_value)                                                   \
    do {                                                                       \
        const __mmask32 mask = (mask_value);                                   \
        if (dtype == DTYPE_BFLOAT16) {                                         \
            LOAD_X_BF16(0) LOAD_X_BF16(1) LOAD_X_BF16(2) LOAD_X_BF16(3)        \
            LOAD_W_BF16(0) LOAD_W_BF16(1) LOAD_W_BF16(2) LOAD_W_BF16(3)        \
            ACCUMULATORS(FMA_BF16)                                             \
        } else {                                                               \
            LOAD_X(0) LOAD_X(1) LOAD_X(2) LOAD_X(3)                            \
            LOAD_W(0) LOAD_W(1) LOAD_W(2) LOAD_W(3)                            \
            ACCUMULATORS(FMA)                                                  \
        }                                                                      \
    } while (0)
#else
#define DOT_STEP(mask_value)                                                   \
    do {                                                                       \
        const __mmask32 mask = (mask_value);                                   \
        LOAD_X(0) LOAD_X(1) LOAD_X(2) LOAD_X(3)                                \
        LOAD_W(0) LOAD_W(1) LOAD_W(2) LOAD_W(3)                                \
        ACCUMULATORS(FMA)                                                      \
    } while (0)
#endif

/* Elements of ``dtype`` per step along k: 32 bfloat16 for AVX512-BF16's dot product, else
 * 16 (converted to float32). */
static inline int64_t step_lanes(int dtype) {
#ifdef __AVX512BF16__
    return dtype == DTYPE_BFLOAT16 ? 32 : 16;
#else
    (void)dtype;
    return 16;
#endif
}

/* sums[r][i] = x[i] . weight[row + r] for i in [first, first + count), count <= 4, so
 * the accumulators stay in registers; the weight rows come from the L1 cache after the
 * first such call.  Whole steps along k run without masks, the last partial one with.
 * ``keep_loaded`` (for more than four rows of x) keeps every float vector loaded in a
 * register: GCC otherwise folds the loads of x into the multiply-adds, loading each x
 * vector once per weight row, four loads per step where one would do (bfloat16's dot
 * products it leaves alone).  Measured as for store_block_sums, float32 at 16 rows:
 * 1.10x with it, 1.03x without; at 4 rows (one pass, the weight streaming from memory)
 * 0.93x to 0.97x, so those keep the folded loads.  Both changes together against the
 * kernel before them: float32 1.11x to 1.19x at 16 rows and 1.03x to 1.04x at 8,
 * bfloat16 1.06x to 1.08x and 1.03x, float16 1.07x to 1.08x and 1.06x to 1.09x, 4 rows
 * unchanged; the outputs are the same bits at 1 to 16 rows in all three dtypes. */
static inline __attribute__((always_inline)) void dot_block(
    const Problem *p, int64_t row, int64_t first, const int64_t count, const int dtype,
    float sums[ROWS][MAX_M], const int keep_loaded) {
    const int64_t k = p->k, elem = dtype == DTYPE_FLOAT32 ? 4 : 2, lanes = step_lanes(dtype);
    const char *w[ROWS], *x[4];
    for (int64_t r = 0; r < ROWS; r++) w[r] = p->weight + (row + r) * k * elem;
    x_rows(p, first, count, elem, x);
    const int64_t ahead = PREFETCH_GROUPS * ROWS * k * elem;
    ACCUMULATORS(DECLARE)
    int64_t j = 0;
    for (; j + lanes <= k; j += lanes) {
        const int64_t byte = j * elem;
        prefetch_ahead(w, ahead, byte);
        DOT_STEP(lanes == 32 ? (__mmask32)0xffffffffu : (__mmask32)0xffffu);
    }
    if (j < k) {
        const int64_t byte = j * elem;
        DOT_STEP((__mmask32)((1ull << (k - j)) - 1u));
    }
    const __m512 acc[ROWS][4] = {
        {a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
    store_block_sums(sums, first, acc);
}

/* dot_block for products of at most four rows of x (one block), and of more. */
#define DOT_BLOCK_KEEPING(NAME, KEEP)                                                      \
    static inline __attribute__((always_inline)) void NAME(                               \
        const Problem *p, int64_t row, int64_t first, const int64_t count, const int dtype, \
        float sums[ROWS][MAX_M]) {                                                        \
        dot_block(p, row, first, count, dtype, sums, KEEP);                               \
    }
DOT_BLOCK_KEEPING(dot_block_few, 0)
DOT_BLOCK_KEEPING(dot_block_many, 1)
#undef DOT_BLOCK_KEEPING
#undef DOT_STEP
#undef FMA
#undef LOAD_W
#undef LOAD_X
#undef FMA_BF16
#undef LOAD_W_BF16
#undef LOAD_X_BF16
#undef DECLARE
#undef ACCUMULATORS

/* The accumulators of dot_row, one per phase (a step along k modulo the phases) and row
 * i of x: two phases for one row of x, so that two sums are in flight, one otherwise. */
#define ROW_ACCUMULATORS(OP) OP(0, 0) OP(0, 1) OP(0, 2) OP(0, 3) OP(1, 0)
#define ROW_DECLARE(ph, i) __m512 a##ph##i = _mm512_setzero_ps();
#define ROW_SUM(ph, i) \
    if (ph < phases && i < count) total[i] = _mm512_add_ps(total[i], a##ph##i);
#ifdef __AVX512BF16__
#define ROW_FMA(ph, i)                                                                   \
    if (ph < active && i < count) {                                                      \
        if (dtype == DTYPE_BFLOAT16)                                                     \
            a##ph##i = _mm512_dpbf16_ps(                                                 \
                a##ph##i, (__m512bh)_mm512_maskz_loadu_epi16(mask, w + byte + ph * step), \
                (__m512bh)_mm512_maskz_loadu_epi16(mask, x[i] + byte + ph * step));      \
        else                                                                             \
            a##ph##i = _mm512_fmadd_ps(load16(w + byte + ph * step, (__mmask16)mask, dtype), \
                                       load16(x[i] + byte + ph * step, (__mmask16)mask, dtype), \
                                       a##ph##i);                                        \
    }
#else
#define ROW_FMA(ph, i)                                                                   \
    if (ph < active && i < count)                                                        \
        a##ph##i = _mm512_fmadd_ps(load16(w + byte + ph * step, (__mmask16)mask, dtype), \
                                   load16(x[i] + byte + ph * step, (__mmask16)mask, dtype), \
                                   a##ph##i);
#endif

/* sums[0][first + i] = x[first + i] . weight[row] for i < count <= 4: one weight row read
 * front to back, the only stream of its thread.  Where the rows of x are few, the weight
 * is read at memory speed and the hardware prefetcher does best with one sequential
 * stream.  Measured on an AMD EPYC (Zen 4) over the small preset's weights, two threads,
 * against dot_block's four interleaved rows in the same process: one row of x 1.57x in
 * float32 and 1.61x in bfloat16 (31 and 27 GB/s, 0.9 of a plain read of the same
 * matrices), three rows of float32 1.22x, four of bfloat16 1.25x and of float16 1.14x;
 * four rows of float32 0.85x to 0.9x.  The weight vector is loaded once per row of x
 * (from L1 after the first), which is why dot_block serves more rows.
 * The stream is also asked for ROW_PREFETCH_BYTES ahead (past the row's end: the next
 * row of the thread's range, or a harmless prefetch past the weight): on an Intel Xeon
 * (AVX512-BF16 and AMX) the hardware prefetcher alone left the one stream at 21 to 27
 * GB/s with the weights in memory, 0.9 of a plain read of the same matrices; the
 * prefetch made it 1.14x to 1.23x faster at 1 to 3 rows in both dtypes, as fast as the
 * plain read or faster (2,048 bytes ahead beat 512, 1,024 and 4,096 in bfloat16 at one
 * row). */
static inline __attribute__((always_inline)) void dot_row(const Problem *p, int64_t row,
                                                          int64_t first, const int64_t count,
                                                          const int dtype,
                                                          float sums[ROWS][MAX_M]) {
    const int64_t k = p->k, elem = dtype == DTYPE_FLOAT32 ? 4 : 2, lanes = step_lanes(dtype);
    const int64_t phases = count == 1 ? 2 : 1, step = lanes * elem;
    const __mmask32 full = lanes == 32 ? (__mmask32)0xffffffffu : (__mmask32)0xffffu;
    const char *w = p->weight + row * k * elem, *x[4];
    x_rows(p, first, count, elem, x);
    ROW_ACCUMULATORS(ROW_DECLARE)
    int64_t j = 0;
    for (; j + phases * lanes <= k; j += phases * lanes) {
        const int64_t byte = j * elem;
        const __mmask32 mask = full;
        const int64_t active = phases;
        for (int64_t line = 0; line < phases * step; line += 64)
            __builtin_prefetch(w + byte + line + ROW_PREFETCH_BYTES, 0, 3);
        ROW_ACCUMULATORS(ROW_FMA)
    }
    for (; j < k; j += lanes) { /* the last steps, in phase 0, the very last masked */
        const int64_t byte = j * elem;
        const __mmask32 mask = k - j >= lanes ? full : (__mmask32)((1ull << (k - j)) - 1u);
        const int64_t active = 1;
        ROW_ACCUMULATORS(ROW_FMA)
    }
    __m512 total[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps()};
    ROW_ACCUMULATORS(ROW_SUM)
    for (int64_t i = 0; i < count; i++) sums[0][first + i] = _mm512_reduce_add_ps(total[i]);
}
#undef ROW_FMA
#undef ROW_SUM
#undef ROW_DECLARE
#undef ROW_ACCUMULATORS

SPECIALISE_ALL(dot_block_few)
SPECIALISE_ALL(dot_block_many)
SPECIALISE_ALL(dot_row)

/* sums[r][i] = x[i] . weight[row + r]: ROWS weight rows against every row of x. */
static inline void dot_rows(const Problem *p, int64_t row, float sums[ROWS][MAX_M]) {
    dot_x_rows(p, row, (p->m > 4 ? dot_block_many_for : dot_block_few_for)[p->dtype], 4, sums);
}

/* sums[0][i] = x[i] . weight[row]: one weight row against every row of x. */
static inline void dot_one_row(const Problem *p, int64_t row, float sums[ROWS][MAX_M]) {
    dot_x_rows(p, row, dot_row_for[p->dtype], 4, sums);
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* The AVX2 inner steps (AMD's Zen 2 and Zen 3, Intel before AVX-512): eight float32
 * lanes, no masks, no bfloat16 arithmetic.  A step takes 16 elements along k as two
 * float32 vectors, ``lo`` and ``hi``; bfloat16 needs no conversion instruction for that:
 * a bfloat16 is the top half of its float32, so the 32-bit lanes of 16 loaded bfloat16
 * shifted left by 16 are the even elements and masked to their top half the odd ones.
 * x and the weight split alike, so the products pair up as they must; the sums are
 * float32 as everywhere, added in another order.  The last k % 16 elements are added by
 * tail_dot.  The blocks of 2-byte dtypes read x converted to float32 instead (dot_tile). */
enum { STEP = 16, X_BLOCK = 2 };

typedef struct {
    __m256 lo, hi;
} Step;

static inline __attribute__((always_inline)) Step load_step(const char *p, int dtype) {
    if (dtype == DTYPE_FLOAT32)
        return (Step){_mm256_loadu_ps((const float *)p), _mm256_loadu_ps((const float *)p + 8)};
    if (dtype == DTYPE_FLOAT16)
        return (Step){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                      _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p + 1))};
    const __m256i pairs = _mm256_loadu_si256((const __m256i *)p);
    return (Step){_mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)),
                  _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(-65536)))};
}

static inline __attribute__((always_inline)) __m256 fma_step(Step w, Step x, __m256 acc) {
    return _mm256_fmadd_ps(w.hi, x.hi, _mm256_fmadd_ps(w.lo, x.lo, acc));
}

/* x . w over the elements the vector steps left, from ``j`` on. */
static inline float tail_dot(const char *w, const char *x, int64_t j, int64_t k, int dtype) {
    float sum = 0.0f;
    for (; j < k; j++) sum += load_scalar(w, j, dtype) * load_scalar(x, j, dtype);
    return sum;
}

/* sums[0][first + i] = x[first + i] . weight[row] for i < count <= 4: one weight row
 * streamed front to back (see the AVX-512 dot_row for why one stream).  For one or two
 * rows of x, each has four accumulators, one per vector of the two steps a pass takes;
 * for three or four, two, each adding a whole step, as the registers hold.  With two, the
 * latency of their chained multiply-adds set the pace of one row of bfloat16 (AMD EPYC,
 * Zen 3, the small preset's weights, two threads, interleaved: four are 1.03x to 1.07x
 * at one and two rows).  bfloat16 and float16 rows are asked for ROW_PREFETCH_BYTES
 * ahead; float32 rows are left to the hardware prefetcher, which streams them faster
 * alone (same host, one row of x: 1.06x to 1.14x without the prefetches, while bfloat16
 * lost 0.77x to 0.92x without them). */
static inline __attribute__((always_inline)) void dot_row(const Problem *p, int64_t row,
                                                          int64_t first, const int64_t count,
                                                          const int dtype,
                                                          float sums[ROWS][MAX_M]) {
    const int64_t k = p->k, elem = dtype == DTYPE_FLOAT32 ? 4 : 2, steps = k / STEP;
    const char *w = p->weight + row * k * elem, *x[4];
    x_rows(p, first, count, elem, x);
    __m256 acc[4][4];
    for (int64_t i = 0; i < 4; i++)
        for (int64_t j = 0; j < 4; j++) acc[i][j] = _mm256_setzero_ps();
    int64_t s = 0;
    for (; s + 2 <= steps; s += 2) {
        const char *at = w + s * STEP * elem;
        if (dtype != DTYPE_FLOAT32) {
            __builtin_prefetch(at + ROW_PREFETCH_BYTES, 0, 3);
            __builtin_prefetch(at + ROW_PREFETCH_BYTES + 64, 0, 3);
        }
        const Step w0 = load_step(at, dtype), w1 = load_step(at + STEP * elem, dtype);
        for (int64_t i = 0; i < count; i++) {
            const Step x0 = load_step(x[i] + s * STEP * elem, dtype),
                       x1 = load_step(x[i] + (s + 1) * STEP * elem, dtype);
            if (count <= 2) {
                acc[i][0] = _mm256_fmadd_ps(w0.lo, x0.lo, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(w0.hi, x0.hi, acc[i][1]);
                acc[i][2] = _mm256_fmadd_ps(w1.lo, x1.lo, acc[i][2]);
                acc[i][3] = _mm256_fmadd_ps(w1.hi, x1.hi, acc[i][3]);
            } else {
                acc[i][0] = fma_step(w0, x0, acc[i][0]);
                acc[i][1] = fma_step(w1, x1, acc[i][1]);
            }
        }
    }
    for (; s < steps; s++) {
        const Step w0 = load_step(w + s * STEP * elem, dtype);
        for (int64_t i = 0; i < count; i++)
            acc[i][0] = fma_step(w0, load_step(x[i] + s * STEP * elem, dtype), acc[i][0]);
    }
    for (int64_t i = 0; i < count; i++)
        sums[0][first + i] = lane_sum8(_mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]),
                                                     _mm256_add_ps(acc[i][2], acc[i][3]))) +
                             tail_dot(w, x[i], steps * STEP, k, dtype);
}

/* sums[r][first + i] = x[first + i] . weight[row + r] for r < ROWS, i < count <= X_BLOCK:
 * eight accumulators, which with the loaded vectors fill AVX2's sixteen registers; the
 * weight rows come from the cache after the first block of x rows, and the rows
 * PREFETCH_GROUPS groups on are asked for meanwhile (see the AVX-512 prefetch_ahead), one
 * row per block of x rows (row r in block r, or in every block r modulo the blocks when
 * there are fewer blocks than rows) rather than every row in every block, which asked
 * for each line once per block of x rows and took load slots from the loads that feed
 * the multiply-adds: float32 1.07x at 3 rows, 1.18x to 1.23x at 4 to 16 rows, bfloat16
 * 1.01x to 1.04x (AMD EPYC, Zen 3, the small preset's weights, two threads, interleaved). */
static inline __attribute__((always_inline)) void dot_block(const Problem *p, int64_t row,
                                                            int64_t first,
                                                            const int64_t count,
                                                            const int dtype,
                                                            float sums[ROWS][MAX_M]) {
    const int64_t k = p->k, elem = dtype == DTYPE_FLOAT32 ? 4 : 2, steps = k / STEP;
    const int64_t ahead = PREFETCH_GROUPS * ROWS * k * elem;
    const int64_t blocks = (p->m + X_BLOCK - 1) / X_BLOCK, block = first / X_BLOCK;
    const char *w[ROWS], *x[4];
    for (int64_t r = 0; r < ROWS; r++) w[r] = p->weight + (row + r) * k * elem;
    x_rows(p, first, count, elem, x);
    __m256 acc[ROWS][X_BLOCK];
    for (int64_t r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t s = 0; s < steps; s++) {
        const int64_t byte = s * STEP * elem;
        Step xs[X_BLOCK];
        for (int64_t i = 0; i < count; i++) {
            xs[i] = load_step(x[i] + byte, dtype);
            /* Held in registers: GCC otherwise folds the loads of x into the multiply-adds,
             * once per weight row (float32 at 16 rows, Zen 3: 1.2x to 1.3x with this). */
            __asm__("" : "+x"(xs[i].lo), "+x"(xs[i].hi));
        }
        for (int64_t r = 0; r < ROWS; r++) {
            if (r % blocks == block) __builtin_prefetch(w[r] + ahead + byte, 0, 3);
            const Step ws = load_step(w[r] + byte, dtype);
            for (int64_t i = 0; i < count; i++) acc[r][i] = fma_step(ws, xs[i], acc[r][i]);
        }
    }
    for (int64_t r = 0; r < ROWS; r++)
        for (int64_t i = 0; i < count; i++)
            sums[r][first + i] =
                lane_sum8(acc[r][i]) + tail_dot(w[r], x[i], steps * STEP, k, dtype);
}

/* dot_block for float32, one row of x or X_BLOCK. */
static void dot_block_float32(const Problem *p, int64_t row, int64_t first, int64_t count,
                              float sums[ROWS][MAX_M]) {
    if (count == 1)
        dot_block(p, row, first, 1, DTYPE_FLOAT32, sums);
    else
        dot_block(p, row, first, X_BLOCK, DTYPE_FLOAT32, sums);
}

/* 8 elements of a bfloat16 or float16 weight row as float32, in order. */
static inline __attribute__((always_inline)) __m256 load8_as_float(const char *p, int dtype) {
    const __m128i half = _mm_loadu_si128((const __m128i *)p);
    if (dtype == DTYPE_FLOAT16) return _mm256_cvtph_ps(half);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

/* The blocks of 2-byte dtypes (more than ONE_ROW_MAX_M_HALF rows of x), in tiles:
 * sums[r][first + i] = x[first + i] . weight[row + r] for r < 2, i < count <= 6, with x
 * as float32 rows (converted once per call by x_as_float; p->x points at them) and each
 * weight vector converted once per tile.  Every accumulator takes one multiply-add per 8
 * elements, twelve independent chains at six rows of x, and a step's vectors of x are
 * each loaded once; dot_block's accumulators take two chained multiply-adds a step (eight
 * chains of two, at the edge of what the latency allows) and it converts each weight
 * vector once per two rows of x.  The weight rows PREFETCH_GROUPS groups on are asked for
 * a line at a time, the lines spread over the tiles of x rows (line l in tile l modulo
 * ``tiles``).  Against dot_block (AMD EPYC, Zen 3, bfloat16): one thread, a 128 x 512
 * weight in L2, 1.07x to 1.46x at 5 to 16 rows; the small preset's 33 weights from
 * memory, two threads, interleaved: 1.12x and 1.14x at 5 rows, 1.10x at 12, 1.08x to
 * 1.13x at 16, 0.97x to 1.01x at 8.  float32 keeps dot_block: from memory these tiles
 * were 0.93x to 1.00x at 16 rows and 0.76x to 0.81x at 8, though faster in L2. */
static inline __attribute__((always_inline)) void dot_tile(const Problem *p, int64_t row,
                                                           int64_t first, const int64_t count,
                                                           const int dtype, int64_t tile,
                                                           int64_t tiles,
                                                           float (*sums)[MAX_M]) {
    const int64_t k = p->k, whole = k / 8 * 8, ahead = PREFETCH_GROUPS * ROWS * k * 2;
    const char *w[2] = {p->weight + row * k * 2, p->weight + (row + 1) * k * 2};
    const float *x[6];
    for (int64_t i = 0; i < count; i++) x[i] = (const float *)p->x + (first + i) * p->x_stride;
    __m256 acc[2][6];
    for (int64_t r = 0; r < 2; r++)
        for (int64_t i = 0; i < count; i++) acc[r][i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < whole; j += 8) {
        if (j % 32 == 0 && (j / 32) % tiles == tile) { /* one 64-byte line of each row */
            __builtin_prefetch(w[0] + ahead + 2 * j, 0, 3);
            __builtin_prefetch(w[1] + ahead + 2 * j, 0, 3);
        }
        const __m256 w0 = load8_as_float(w[0] + 2 * j, dtype),
                     w1 = load8_as_float(w[1] + 2 * j, dtype);
        for (int64_t i = 0; i < count; i++) {
            __m256 xs = _mm256_loadu_ps(x[i] + j);
            __asm__("" : "+x"(xs)); /* loaded once, not folded into both multiply-adds */
            acc[0][i] = _mm256_fmadd_ps(w0, xs, acc[0][i]);
            acc[1][i] = _mm256_fmadd_ps(w1, xs, acc[1][i]);
        }
    }
    for (int64_t r = 0; r < 2; r++)
        for (int64_t i = 0; i < count; i++) {
            float tail = 0.0f;
            for (int64_t j = whole; j < k; j++) tail += load_scalar(w[r], j, dtype) * x[i][j];
            sums[r][first + i] = lane_sum8(acc[r][i]) + tail;
        }
}

/* dot_tile over the ROWS weight rows of a group, two at a time, and every row of x, in
 * tiles of as even a size as six rows allow: of 3 to 6 rows, as the tiles take more than
 * ONE_ROW_MAX_M_HALF (4) rows of x. */
static inline __attribute__((always_inline)) void dot_tiles(const Problem *p, int64_t row,
                                                            const int dtype,
                                                            float sums[ROWS][MAX_M]) {
    const int64_t m = p->m, tiles = (m + 5) / 6, per = (m + tiles - 1) / tiles;
    for (int64_t tile = 0; tile < tiles; tile++) {
        const int64_t first = tile * per, count = m - first < per ? m - first : per;
        for (int64_t pair = 0; pair < ROWS; pair += 2) {
#define TILE_OF(COUNT) \
    dot_tile(p, row + pair, first, COUNT, dtype, tile, tiles, sums + pair)
            switch (count) {
            case 3: TILE_OF(3); break;
            case 4: TILE_OF(4); break;
            case 5: TILE_OF(5); break;
            default: TILE_OF(6); break;
            }
#undef TILE_OF
        }
    }
}

static void dot_tiles_bfloat16(const Problem *p, int64_t row, float sums[ROWS][MAX_M]) {
    dot_tiles(p, row, DTYPE_BFLOAT16, sums);
}

static void dot_tiles_float16(const Problem *p, int64_t row, float sums[ROWS][MAX_M]) {
    dot_tiles(p, row, DTYPE_FLOAT16, sums);
}

/* x as float32 rows of k elements, for dot_tile; NULL when out of memory. */
static float *x_as_float(const Problem *p) {
    float *rows = malloc((size_t)(p->m * p->k) * sizeof(float));
    if (rows == NULL) return NULL;
    for (int64_t i = 0; i < p->m; i++) {
        const char *x = p->x + i * p->x_stride * 2;
        float *row = rows + i * p->k;
        if (p->dtype == DTYPE_BFLOAT16) /* separate loops, so that each vectorises */
            for (int64_t j = 0; j < p->k; j++) row[j] = load_scalar(x, j, DTYPE_BFLOAT16);
        else
            for (int64_t j = 0; j < p->k; j++) row[j] = load_scalar(x, j, DTYPE_FLOAT16);
    }
    return rows;
}

/* dot_rows reads x as float32 (x_as_float) for the 2-byte dtypes. */
#define X_AS_FLOAT 1

SPECIALISE_ALL(dot_row)

/* sums[r][i] = x[i] . weight[row + r]: ROWS weight rows against every row of x. */
static inline void dot_rows(const Problem *p, int64_t row, float sums[ROWS][MAX_M]) {
    if (p->dtype == DTYPE_BFLOAT16)
        dot_tiles_bfloat16(p, row, sums);
    else if (p->dtype == DTYPE_FLOAT16)
        dot_tiles_float16(p, row, sums);
    else
        dot_x_rows(p, row, dot_block_float32, X_BLOCK, sums);
}

/* sums[0][i] = x[i] . weight[row]: one weight row against every row of x. */
static inline void dot_one_row(const Problem *p, int64_t row, float sums[ROWS][MAX_M]) {
    dot_x_rows(p, row, dot_row_for[p->dtype], 4, sums);
}
#else
static inline void dot_rows(const Problem *p, int64_t row, float sums[ROWS][MAX_M]) {
    dot_rows_scalar(p, row, ROWS, sums);
}

static inline void dot_one_row(const Problem *p, int64_t row, float sums[ROWS][MAX_M]) {
    dot_rows_scalar(p, row, 1, sums);
}
#endif
#undef SPECIALISE_ALL
#undef DTYPE_TABLE
#undef SPECIALISE

static inline void store_rows(const Problem *p, int64_t row, int64_t rows,
                              float sums[ROWS][MAX_M]) {
    for (int64_t r = 0; r < rows; r++) {
        const float bias = p->bias ? load_scalar(p->bias, row + r, p->dtype) : 0.0f;
        for (int64_t i = 0; i < p->m; i++)
            store_scalar(p->out + i * p->out_stride * p->elem, row + r, sums[r][i] + bias,
                         p->dtype);
    }
}

#ifdef HAVE_AMX
/* bfloat16 products of AMX_MIN_M to MAX_M rows on AMX tiles.  With more than a few rows
 * the vector code is bound by arithmetic (AVX512-BF16's dot product runs at about 40
 * GMAC/s a core here, half the float32 FMA's rate), and oneDNN's GEMM at these shapes
 * streams the weights at 11 to 14 GB/s; a tile product does 8,192 multiply-adds in one
 * instruction, so the weights stream at memory speed whatever the rows (over the small
 * preset's weights, two threads, one run: 1.08x the vector code at 3 rows, 1.26x at 4,
 * 1.81x at 8, 2.71x at 16, and 1.8x to 2.4x oneDNN; at 1 and 2 rows the vector code is as
 * fast or faster).  Each block of 16 weight rows is the tile product
 * out^T = weight[rows] @ x^T: the weight tile (16 rows of 32 elements) is read in place,
 * x is paired once per call as the right-hand operand wants. */
enum { AMX_MIN_M = 3, TILE_ROWS = 16, TILE_K = 32 };

/* x as AMX's right-hand operand: element j of row i at pairs[j / 2][i][j % 2], i.e. the
 * 32-bit pairs of each row, transposed. */
static void pair_rows(const Problem *p, uint32_t *pairs) {
    for (int64_t i = 0; i < p->m; i++) {
        const char *row = p->x + i * p->x_stride * 2;
        for (int64_t j = 0; j < p->k / 2; j++) memcpy(pairs + j * p->m + i, row + j * 4, 4);
    }
}

/* 16 floats rounded to bfloat16 as float_to_bf16 rounds them (nearest even, NaN quiet). */
static inline __m256i round_to_bf16(__m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

/* out[:, row:row + 16] from one block of 16 weight rows.  Consecutive tile products go
 * to two accumulator tiles (tiles 0 and 1, from weight tiles 2 and 3 and x tiles 4 and 5),
 * so that neither waits for the one before; the next block's rows are prefetched as this
 * block's are read (16 rows streamed at once outrun the hardware prefetcher). */
static void amx_block(const Problem *p, const uint32_t *pairs, int64_t row,
                      float c0[TILE_ROWS * 16], float c1[TILE_ROWS * 16]) {
    const int64_t stride = p->k * 2, steps = p->k / TILE_K, pair_stride = p->m * 4;
    const int64_t chunk = TILE_K / 2 * pair_stride; /* bytes of pairs per tile product */
    const char *w = p->weight + row * stride, *next = w + TILE_ROWS * stride;
    const char *b = (const char *)pairs;
    _tile_zero(0);
    _tile_zero(1);
    int64_t s = 0;
    for (; s + 2 <= steps; s += 2) {
        for (int64_t r = 0; r < TILE_ROWS; r++) {
            __builtin_prefetch(next + r * stride + s * 64, 0, 3);
            __builtin_prefetch(next + r * stride + s * 64 + 64, 0, 3);
        }
        _tile_loadd(2, w + s * 64, stride);
        _tile_loadd(4, b + s * chunk, pair_stride);
        _tile_dpbf16ps(0, 2, 4);
        _tile_loadd(3, w + s * 64 + 64, stride);
        _tile_loadd(5, b + (s + 1) * chunk, pair_stride);
        _tile_dpbf16ps(1, 3, 5);
    }
    if (s < steps) {
        _tile_loadd(2, w + s * 64, stride);
        _tile_loadd(4, b + s * chunk, pair_stride);
        _tile_dpbf16ps(0, 2, 4);
    }
    _tile_stored(0, c0, 64);
    _tile_stored(1, c1, 64);
    /* Output row i's 16 values are column i of the tiles: gathered, summed, rounded. */
    const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8,
                                                               7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    const __m512 bias = p->bias ? load16(p->bias + row * 2, 0xffff, DTYPE_BFLOAT16)
                                : _mm512_setzero_ps();
    for (int64_t i = 0; i < p->m; i++) {
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_i32gather_ps(column, c0 + i, 4),
                                                       _mm512_i32gather_ps(column, c1 + i, 4)),
                                         bias);
        _mm256_storeu_si256((__m256i *)(p->out + (i * p->out_stride + row) * 2),
                            round_to_bf16(sum));
    }
}

/* The weight rows it computed on AMX tiles (whole blocks of 16 from row 0), or 0 where
 * it does not apply: not bfloat16, fewer than AMX_MIN_M rows, fewer than 16 weight rows,
 * k not whole tiles, the process not allowed the tiles, or no memory for the pairs. */
static int64_t amx_gemm(const Problem *p, int num_threads) {
    if (p->dtype != DTYPE_BFLOAT16 || p->m < AMX_MIN_M || p->n < TILE_ROWS ||
        p->k % TILE_K || !amx_permitted())
        return 0;
    uint32_t *pairs = malloc((size_t)(p->k / 2 * p->m) * sizeof(uint32_t));
    if (pairs == NULL) return 0;
    pair_rows(p, pairs);
    const int64_t blocks = p->n / TILE_ROWS;
    const uint16_t x_bytes = (uint16_t)(p->m * 4);
    const uint16_t bytes_per_row[8] = {x_bytes, x_bytes, 64, 64, x_bytes, x_bytes, 0, 0};
#pragma omp parallel num_threads(num_threads)
    {
        float c0[TILE_ROWS * 16], c1[TILE_ROWS * 16];
        load_tile_config(bytes_per_row);
#pragma omp for schedule(static)
        for (int64_t block = 0; block < blocks; block++)
            amx_block(p, pairs, block * TILE_ROWS, c0, c1);
        _tile_release();
    }
    free(pairs);
    return blocks * TILE_ROWS;
}
#endif

/* The most rows of x the kernel serves faster than torch's GEMM, by dtype.
 *
 * With AVX-512, float32 and float16 up to its limit of 16 rows.  bfloat16: where
 * AVX512-BF16's dot product is the CPU's fast path, with no AMX (AMD's Zen 4), the vector
 * code beats torch's GEMM at every row count (over the small preset's weights, two
 * threads: 1.79x at 8 rows, 1.60x at 16); where the CPU has AMX tiles but the process was
 * refused them, the same instruction is slow from a few rows on (see amx_gemm).
 * With AVX2 only, every dtype up to 16 rows: on an AMD EPYC (Zen 3, two threads, the
 * small preset's weights, one run) torch's float32 GEMM streamed them at 5 to 11 GB/s and
 * its bfloat16 GEMM at 12 GB/s at one row down to 1.1 at 16; the AVX2 code took 0.54x
 * (float32) and 0.59x (bfloat16) of torch's time at one row, 0.59x and 0.18x at 16.
 * With neither, only the scalar loop, 4x to 25x torch's time there: no rows. */
int slotwise_small_gemm_rows(int dtype) {
#if defined(__AVX512F__)
    if (dtype != DTYPE_BFLOAT16) return MAX_M;
#ifdef HAVE_AMX
    return amx_permitted() ? MAX_M : 4;
#elif defined(__AVX512BF16__)
    return MAX_M;
#else
    return 4;
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    (void)dtype;
    return MAX_M;
#else
    (void)dtype;
    return 0;
#endif
}

/* Returns STATUS_OK, STATUS_BAD_ARGUMENT for sizes it does not serve (m > MAX_M), or
 * STATUS_NO_MEMORY when x's float32 copy (x_as_float) could not be allocated. */
int slotwise_small_gemm(const void *x, int64_t x_stride, const void *weight, const void *bias,
                        void *out, int64_t out_stride, int64_t m, int64_t n, int64_t k,
                        int dtype, int num_threads) {
    if (dtype < DTYPE_FLOAT32 || dtype > DTYPE_FLOAT16 || m < 0 || m > MAX_M || n < 0 ||
        k < 1 || num_threads < 1)
        return STATUS_BAD_ARGUMENT;
    const Problem p = {(const char *)x, (const char *)weight, (const char *)bias, (char *)out,
                       m, n, k, x_stride, out_stride, dtype == DTYPE_FLOAT32 ? 4 : 2, dtype};
    int64_t done = 0; /* weight rows computed */
#ifdef HAVE_AMX
    done = amx_gemm(&p, num_threads);
#endif
    if (m <= (dtype == DTYPE_FLOAT32 ? ONE_ROW_MAX_M : ONE_ROW_MAX_M_HALF)) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n - done > 1)
        for (int64_t row = done; row < n; row++) {
            float sums[ROWS][MAX_M];
            dot_one_row(&p, row, sums);
            store_rows(&p, row, 1, sums);
        }
        return STATUS_OK;
    }
    const int64_t groups = (n - done) / ROWS;
    /* The problem dot_rows reads: p, or p with x as float32 (see x_as_float). */
    const Problem *blocks = &p;
#ifdef X_AS_FLOAT
    Problem converted;
    float *x_float = NULL;
    if (groups > 0 && dtype != DTYPE_FLOAT32) {
        x_float = x_as_float(&p);
        if (x_float == NULL) return STATUS_NO_MEMORY;
        converted = p;
        converted.x = (const char *)x_float;
        converted.x_stride = k;
        blocks = &converted;
    }
#endif
#pragma omp parallel for schedule(static) num_threads(num_threads) if (groups > 1)
    for (int64_t g = 0; g < groups; g++) {
        float sums[ROWS][MAX_M];
        dot_rows(blocks, done + g * ROWS, sums);
        store_rows(&p, done + g * ROWS, ROWS, sums);
    }
#ifdef X_AS_FLOAT
    free(x_float);
#endif
    done += groups * ROWS;
    if (done < n) { /* the last rows, fewer than ROWS */
        float sums[ROWS][MAX_M];
        dot_rows_scalar(&p, done, n - done, sums);
        store_rows(&p, done, n - done, sums);
    }
    return STATUS_OK;
}
