/*
 * The element types the CPU plugin's kernels take, and scalar loads and stores of them
 * in float32 (bfloat16 rounded to nearest even, NaN kept quiet, as torch rounds).
 * The codes match paged_decode.DTYPE_CODES and linear.KERNEL_DTYPES on the Python side.
 */
#ifndef SLOTWISE_CPU_SCALARS_H
#define SLOTWISE_CPU_SCALARS_H

#include <stdint.h>
#include <string.h>

enum { DTYPE_FLOAT32 = 0, DTYPE_BFLOAT16 = 1, DTYPE_FLOAT16 = 2 };

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest even, as torch does */
    return (uint16_t)(bits >> 16);
}

static inline float load_scalar(const void *p, int64_t i, int dtype) {
    if (dtype == DTYPE_FLOAT32) return ((const float *)p)[i];
    if (dtype == DTYPE_BFLOAT16) return bf16_to_float(((const uint16_t *)p)[i]);
    return (float)((const _Float16 *)p)[i];
}

static inline void store_scalar(void *p, int64_t i, float value, int dtype) {
    if (dtype == DTYPE_FLOAT32)
        ((float *)p)[i] = value;
    else if (dtype == DTYPE_BFLOAT16)
        ((uint16_t *)p)[i] = float_to_bf16(value);
    else
        ((_Float16 *)p)[i] = (_Float16)value;
}

#endif
