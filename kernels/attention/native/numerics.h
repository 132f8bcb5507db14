/* Scalar numerics shared by the native attention kernels (included by each source). */
#ifndef PDSERVE_NUMERICS_H
#define PDSERVE_NUMERICS_H

#include <stdint.h>
#include <string.h>

#define LOG2E 1.4426950408889634f

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Element `index` of a bf16 or fp32 array, as fp32. */
static inline float load_f32(const void *base, size_t index, int is_bf16) {
    return is_bf16 ? bf16_to_f32(((const uint16_t *)base)[index]) : ((const float *)base)[index];
}

/* 2^x for x <= 0: Cephes exp2f polynomial on [-0.5, 0.5] (relative error < 2e-7). */
#pragma omp declare simd notinbranch
static inline float exp2_nonpos(float x) {
    x = x < -126.0f ? -126.0f : x;
    int32_t biased = (int32_t)(x + 127.5f); /* round(x) + 127; x + 127.5 > 0, so truncation floors */
    float f = x - (float)(biased - 127);
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    uint32_t bits = (uint32_t)biased << 23;
    float power;
    memcpy(&power, &bits, sizeof power);
    return p * power;
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* 16 bf16 values as fp32 (exact). */
static inline __m512 bf16x16_to_f32(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* 2^x per lane, the same polynomial; x <= 0 where it matters; -inf gives 2^-126; NaN stays NaN. */
static inline __m512 exp2_512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-126.0f), x);
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif

#endif
