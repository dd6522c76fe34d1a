/*
 * The horizontal sums of sixteen float vectors at once, for the kernels that need one sum
 * per vector (small_gemm.c's blocks of accumulators, paged_decode.c's scores of a tile):
 * each step adds halves of two vectors, 15 steps of two shuffles and an add where sixteen
 * separate reductions take four each, and the sums come out as one vector.  The lanes are
 * added in the order in which GCC's _mm512_reduce_add_ps adds them (lane j with j + 8,
 * then with j + 4, j + 2, j + 1), so each sum is the same bits as that reduction's.
 * For the AVX2 code, the same for eight 8-lane vectors, and the sum of one.
 */
#ifndef SLOTWISE_CPU_LANE_SUMS_H
#define SLOTWISE_CPU_LANE_SUMS_H

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#ifdef __AVX2__
/* The sum of v's eight lanes. */
static inline float lane_sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Lane i of the result: the sum of v[i]'s eight lanes. */
static inline __m256 lane_sums8(const __m256 v[8]) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20),
                         _mm256_permute2f128_ps(a, b, 0x31));
}
#endif

#ifdef __AVX512F__

/* pair_chunks(a, b): a's 128-bit chunks 0 + 2 and 1 + 3 in the low half, b's in the high
 * half; pair_halves of two such: the four vectors' partial sums in chunks 0 to 3;
 * pair_quads and pair_pairs do the same within each chunk. */
static inline __m512 pair_chunks(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
}
static inline __m512 pair_halves(__m512 ab, __m512 cd) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
}
static inline __m512 pair_quads(__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xee));
}
static inline __m512 pair_pairs(__m512 z, __m512 w) {
    return _mm512_add_ps(_mm512_shuffle_ps(z, w, 0x88), _mm512_shuffle_ps(z, w, 0xdd));
}

/* Lane i of the result: the sum of v[i]'s sixteen lanes. */
static inline __attribute__((always_inline)) __m512 lane_sums16(const __m512 v[16]) {
    __m512 quarters[4]; /* chunk c of quarters[i]: four partial sums of v[4 * c + i] */
    for (int i = 0; i < 4; i++)
        quarters[i] =
            pair_halves(pair_chunks(v[i], v[4 + i]), pair_chunks(v[8 + i], v[12 + i]));
    return pair_pairs(pair_quads(quarters[0], quarters[1]),
                      pair_quads(quarters[2], quarters[3]));
}
#endif

#endif
