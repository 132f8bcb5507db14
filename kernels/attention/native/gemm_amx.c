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

/* Tiles 0-1: two blocks of up to 16 rows x 32 inputs of x (as many rows as the row block has: a block of one
 * row moves one row through the tiles); 2-3: two tiles of 32 inputs x 16 outputs of W; 4-7: the four sums,
 * rows as tiles 0 and 1. Loaded when a block's row count differs from the last one's (`*configured`). */
static void configure(int rows, int *configured) {
    if (rows == *configured) return;
    TileConfig config = {.palette = 1};
    const int first = rows < 16 ? rows : 16, second = rows > 16 ? rows - 16 : first;
    for (int t = 0; t < 8; t++) config.colsb[t] = 64;
    config.rows[0] = config.rows[4] = config.rows[5] = (uint8_t)first;
    config.rows[1] = config.rows[6] = config.rows[7] = (uint8_t)second;
    config.rows[2] = config.rows[3] = 16;
    _tile_loadconfig(&config);
    *configured = rows;
}

/* Rows [0, real_rows) of `rows` (a row block of at most 32, row stride `ld` elements) times the column pair
 * starting at output column block nb (16 outputs each; `pair` 1 or 2 blocks), into out. A block of at most
 * 16 rows uses one row tile; each row's sums are the same either way. */
static inline void block(const uint16_t *rows, size_t ld, int real_rows, int k, const uint32_t *w, int nb, int pair,
                         const float *bias, uint16_t *out, int n, float *sums, int *configured) {
    const int kb = k / 32, two = real_rows > 16;
    configure(real_rows, configured);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    const uint32_t *w0 = w + (size_t)nb * kb * 256, *w1 = w0 + (size_t)kb * 256;
    for (int b = 0; b < kb; b++) {
        _tile_loadd(0, rows + (size_t)b * 32, ld * 2);
        _tile_loadd(2, w0 + (size_t)b * 256, 64);
        _tile_dpbf16ps(4, 0, 2);
        if (two) {
            _tile_loadd(1, rows + 16 * ld + (size_t)b * 32, ld * 2);
            _tile_dpbf16ps(6, 1, 2);
        }
        if (pair == 2) {
            _tile_loadd(3, w1 + (size_t)b * 256, 64);
            _tile_dpbf16ps(5, 0, 3);
            if (two) _tile_dpbf16ps(7, 1, 3);
        }
    }
    _tile_stored(4, sums, 128);
    _tile_stored(5, sums + 16, 128);
    if (two) {
        _tile_stored(6, sums + 16 * 32, 128);
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
    if (tail) { /* the tiles read 16 or 32 rows' worth of stride: a copy, so that none is read past x */
        padded = calloc((size_t)32 * k, sizeof(uint16_t));
        if (!padded) return -2;
        memcpy(padded, x + (size_t)full * 32 * k, (size_t)tail * k * sizeof(uint16_t));
    }
#pragma omp parallel num_threads(num_threads) if (pairs > 1)
    {
        float sums[32 * 32] __attribute__((aligned(64)));
        int configured = 0;
#pragma omp for schedule(static)
        for (int p = 0; p < pairs; p++) {
            const int nb = 2 * p, pair = nb + 1 < n / 16 ? 2 : 1;
            for (int b = 0; b < full; b++)
                block(x + (size_t)b * 32 * k, (size_t)k, 32, k, w, nb, pair, bias, out + (size_t)b * 32 * n, n, sums,
                      &configured);
            if (tail)
                block(padded, (size_t)k, tail, k, w, nb, pair, bias, out + (size_t)full * 32 * n, n, sums, &configured);
        }
        if (configured) _tile_release();
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
