/* Row-invariant bf16 projections on AMX tiles (the deterministic mode's prompt rows, kernels/amx_linear.py):
 * out[m, n] = bf16(sum over k of x[m, k] * W[n, k] + bias[n]), x [M, K] bf16 row-major, W packed by
 * kernels/amx_linear.py into tiles of 16 outputs x 32 inputs in AMX's pair layout.
 *
 * Each output element sums its inputs in one order whatever M is: 32 inputs per TDPBF16PS, blocks of 32
 * ascending, in fp32; the bias is added and the sum rounded to bf16 (nearest even) once. Rows are worked
 * on 32 at a time (a last partial block copied into zero rows); which rows share a block, which thread
 * computes which outputs and how many rows the call has change none of a row's operations. So a row gets
 * the same bits alone, in a chunk of any length or in any step: oneDNN's products give that only for one
 * fixed row count. Columns are spread over OpenMP threads; each thread keeps a pair of weight tiles'
 * worth of columns hot while it runs through every row block.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "prefill_fixed.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>

/* Tiles 0-1: two blocks of 16 rows x 32 inputs of x; 2-3: two tiles of 32 inputs x 16 outputs of W;
 * 4-7: the four 16 x 16 fp32 sums. */
static void configure(void) {
    struct __attribute__((packed)) {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } config = {.palette = 1};
    for (int t = 0; t < 8; t++) config.colsb[t] = 64, config.rows[t] = 16;
    _tile_loadconfig(&config);
}

/* Rows [0, 32) of `rows` (a row block, row stride `ld` elements) times the column pair starting at output
 * column block nb (16 outputs each; `pair` 1 or 2 blocks), into out. */
static inline void block(const uint16_t *rows, size_t ld, int real_rows, int k, const uint32_t *w, int nb, int pair,
                         const float *bias, uint16_t *out, int n, float *sums) {
    const int kb = k / 32;
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    const uint32_t *w0 = w + (size_t)nb * kb * 256, *w1 = w0 + (size_t)kb * 256;
    for (int b = 0; b < kb; b++) {
        _tile_loadd(0, rows + (size_t)b * 32, ld * 2);
        _tile_loadd(1, rows + 16 * ld + (size_t)b * 32, ld * 2);
        _tile_loadd(2, w0 + (size_t)b * 256, 64);
        _tile_dpbf16ps(4, 0, 2);
        _tile_dpbf16ps(6, 1, 2);
        if (pair == 2) {
            _tile_loadd(3, w1 + (size_t)b * 256, 64);
            _tile_dpbf16ps(5, 0, 3);
            _tile_dpbf16ps(7, 1, 3);
        }
    }
    _tile_stored(4, sums, 128);
    _tile_stored(6, sums + 16 * 32, 128);
    if (pair == 2) {
        _tile_stored(5, sums + 16, 128);
        _tile_stored(7, sums + 16 * 32 + 16, 128);
    }
    for (int r = 0; r < real_rows; r++)
        for (int c = 0; c < pair; c++) {
            const int col = (nb + c) * 16;
            __m512 v = _mm512_load_ps(sums + r * 32 + c * 16);
            if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + col));
            _mm256_storeu_si256((__m256i *)(out + (size_t)r * n + col), (__m256i)_mm512_cvtneps_pbh(v));
        }
}

int gemm_amx_bf16(const uint16_t *x, int m, int k, const uint32_t *w, int n, const float *bias, uint16_t *out,
                  int num_threads) {
    if (m < 0 || k <= 0 || n <= 0 || k % 32 || n % 16) return -1;
    if (!prefill_amx_ready()) return -3;
    if (m == 0) return 0;
    if (num_threads < 1) num_threads = 1;
    const int pairs = (n / 16 + 1) / 2, full = m / 32, tail = m % 32;
    uint16_t *padded = NULL;
    if (tail) {
        padded = calloc((size_t)32 * k, sizeof(uint16_t));
        if (!padded) return -2;
        memcpy(padded, x + (size_t)full * 32 * k, (size_t)tail * k * sizeof(uint16_t));
    }
#pragma omp parallel num_threads(num_threads) if (pairs > 1)
    {
        float sums[32 * 32] __attribute__((aligned(64)));
        configure();
#pragma omp for schedule(static)
        for (int p = 0; p < pairs; p++) {
            const int nb = 2 * p, pair = nb + 1 < n / 16 ? 2 : 1;
            for (int b = 0; b < full; b++)
                block(x + (size_t)b * 32 * k, (size_t)k, 32, k, w, nb, pair, bias, out + (size_t)b * 32 * n, n, sums);
            if (tail) block(padded, (size_t)k, tail, k, w, nb, pair, bias, out + (size_t)full * 32 * n, n, sums);
        }
        _tile_release();
    }
    free(padded);
    return 0;
}

#else

int gemm_amx_bf16(const uint16_t *x, int m, int k, const uint32_t *w, int n, const float *bias, uint16_t *out,
                  int num_threads) {
    (void)x, (void)m, (void)k, (void)w, (void)n, (void)bias, (void)out, (void)num_threads;
    return -3;
}

#endif

/* out = x @ W.T (+ bias) as above. Returns 0, or having written nothing: -1 a shape it does not take (K a
 * multiple of 32, N of 16), -2 out of memory, -3 no AMX here (not compiled for it, or refused by the OS). */
