/* Row-invariant 4-bit projections (the deterministic mode's output rows, kernels/int4_fixed.py):
 * out[m, n] = bf16(sum over groups g of (scale[n, g] * D + offset[n, g] * S) + bias[n]), where the weight is
 * W = scale * code + offset per group of 32 inputs (a Q4_1 file's codes 0..15), D the group's dot of the
 * row's inputs with the integer codes and S the sum of those inputs.
 *
 * The inputs first go on a grid, per row and group: 2^(E - 14), E the IEEE exponent of the group's largest
 * |x| (largest in [2^E, 2^(E+1))), rounded to nearest even. An input within 2^7 of that largest one is
 * unchanged (bf16 has 8 significant bits); a smaller one loses what lies below 2^-15 of the largest. A group
 * whose largest |x| is below 2^-100 is taken as zero. On that grid every product with a code and every
 * partial sum of D and S is an integer multiple of the grid below 2^24 of it, exact in fp32 and int32, so D
 * and S are the same in ANY order of summation: the AMX tiles (TDPBF16PS on the grid's bf16 values, whose
 * internal order is not documented and is not VDPBF16PS's) and the AVX path (VPDPWSSD on the int16
 * multiples) give the same D. The groups then go in ascending order through the same two FMAs in both paths
 * (`accumulate_with`), the bias is added and the sum rounded to bf16 once.
 *
 * So a row's bits depend on its values only: not on how many rows the call has, which path ran it (calls of
 * at most `avx_max_rows` rows take the AVX path, bound by streaming the codes; larger ones the tiles, which
 * turn each weight tile's codes into a bf16 tile once for every row), nor on the thread. The guarantee
 * holds for finite inputs whose group maxima are below 2^100; a NaN or an infinity in a row makes every
 * output of that row NaN, on either path.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "prefill_fixed.h"

typedef struct {
    const uint16_t *codes;  /* [n / 16][k / 32][4][32]: see kernels/int4_fixed.py (4 codes per word) */
    const uint16_t *params; /* fp16 [n / 16][k / 32][2][16]: the group's 16 scales, then its 16 offsets */
    const float *bias;      /* [n] or NULL */
    int n, k;
} Int4Weight;

/* A call's rows on their groups' grids: as bf16 values (the tiles' inputs) or as int16 multiples of the grid
 * (the AVX path's), each group's grid step (`unit`) and its sum S (exact). */
typedef struct {
    uint16_t *values; /* [rows][k]: bf16 values, or int16 multiples of the group's unit */
    float *unit, *sums; /* [m][k / 32] */
} Grid;

#if defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#include <immintrin.h>

/* Each row's inputs on its groups' grids: bf16 values (`as_bf16`) or int16 multiples of the unit. */
static void to_grid(const uint16_t *x, int m, int k, int as_bf16, Grid *grid) {
    for (int r = 0; r < m; r++)
        for (int b = 0; b < k / 32; b++) {
            const size_t at = (size_t)r * k + b * 32, group = (size_t)r * (k / 32) + b;
            __m512 lo = bf16x16_to_f32(x + at), hi = bf16x16_to_f32(x + at + 16);
            const __m512 infinity = _mm512_set1_ps(INFINITY);
            const int finite = !(_mm512_cmp_ps_mask(_mm512_abs_ps(lo), infinity, _CMP_NLT_UQ) |
                                 _mm512_cmp_ps_mask(_mm512_abs_ps(hi), infinity, _CMP_NLT_UQ));
            const float largest = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
            float unit = 1.0f;
            if (!finite || !(largest >= 0x1p-100f)) { /* a NaN or inf: S = NaN makes every output of the row NaN */
                lo = hi = _mm512_setzero_ps();
            } else {
                int e;
                frexpf(largest, &e); /* largest in [2^(e-1), 2^e): multiples of the unit below 2^15 */
                unit = ldexpf(1.0f, e - 15);
                const __m512 down = _mm512_set1_ps(ldexpf(1.0f, 15 - e));
                lo = _mm512_roundscale_ps(_mm512_mul_ps(lo, down), _MM_FROUND_TO_NEAREST_INT);
                hi = _mm512_roundscale_ps(_mm512_mul_ps(hi, down), _MM_FROUND_TO_NEAREST_INT);
            }
            const __m512 up = _mm512_set1_ps(unit);
            grid->unit[group] = unit;
            grid->sums[group] = finite ? _mm512_reduce_add_ps(_mm512_add_ps(lo, hi)) * unit : NAN;
            uint16_t *out = grid->values + at;
            if (as_bf16) {
                _mm256_storeu_si256((__m256i *)out, (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(lo, up)));
                _mm256_storeu_si256((__m256i *)(out + 16), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(hi, up)));
            } else {
                _mm256_storeu_si256((__m256i *)out, _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(lo)));
                _mm256_storeu_si256((__m256i *)(out + 16), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(hi)));
            }
        }
}

/* One group's exact dot D (`scale`, `offset`: the group's for 16 outputs, `sum`: S) into a row's 16
 * accumulators: the same operations on both paths (D + 0 would make a -0 from the tiles the AVX path's +0). */
static inline __m512 accumulate_with(__m512 acc, __m512 dot, __m512 scale, __m512 offset, float sum) {
    acc = _mm512_fmadd_ps(_mm512_add_ps(dot, _mm512_setzero_ps()), scale, acc);
    return _mm512_fmadd_ps(offset, _mm512_set1_ps(sum), acc);
}

/* A group's scales and offsets for 16 outputs (`params`: fp16, 16 scales then 16 offsets). */
static inline __m512 group_scale(const uint16_t *params) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)params));
}

static inline __m512 group_offset(const uint16_t *params) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(params + 16)));
}

static inline void store_row(__m512 acc, const Int4Weight *w, int col, uint16_t *out) {
    if (w->bias) acc = _mm512_add_ps(acc, _mm512_loadu_ps(w->bias + col));
    _mm256_storeu_si256((__m256i *)(out + col), (__m256i)_mm512_cvtneps_pbh(acc));
}

/* Pair of inputs i (0..15) of a weight tile: 32 int16 codes, output c's pair in dword c (even input low). */
static inline __m512i codes_pair(const uint16_t *tile, int i) {
    const __m512i words = _mm512_loadu_si512(tile + 32 * (i / 4)); /* any alignment the caller's buffer has */
    const int shift = 4 * (i % 4);
    return shift == 12 ? _mm512_srli_epi16(words, 12)
                       : _mm512_and_si512(_mm512_srli_epi16(words, shift), _mm512_set1_epi16(15));
}

/* AVX path: R rows of one group through CB consecutive weight tiles (16 outputs each), int16 multiples of
 * the rows' units times the codes in int32 (VPDPWSSD: exact). A row's pair of inputs is broadcast once for
 * the CB tiles; the R x CB sums are independent chains. */
static inline __attribute__((always_inline)) void avx_group(const int R, const int CB, const uint32_t *pairs,
                                                            size_t ld, const uint16_t *tile, size_t tile_stride,
                                                            __m512i *dot) {
    for (int j = 0; j < R * CB; j++) dot[j] = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        __m512i codes[4];
        for (int c = 0; c < CB; c++) codes[c] = codes_pair(tile + c * tile_stride, i);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512i x = _mm512_set1_epi32((int)pairs[r * ld + i]);
            for (int c = 0; c < CB; c++) dot[r * CB + c] = _mm512_dpwssd_epi32(dot[r * CB + c], x, codes[c]);
        }
    }
}

/* Output blocks nb .. nb + CB - 1 (16 outputs each) for rows r0 .. r0 + R - 1 on the AVX path, the R x CB
 * sums in registers; per group the scales and offsets are read once for the R rows. */
static inline __attribute__((always_inline)) void avx_columns(const int R, const int CB, const Int4Weight *w, int nb,
                                                              const Grid *grid, int r0, uint16_t *out) {
    const int kb = w->k / 32;
    const size_t ld = (size_t)w->k / 2;
    const uint32_t *pairs = (const uint32_t *)grid->values + (size_t)r0 * ld;
    __m512 sum[16];
    for (int j = 0; j < R * CB; j++) sum[j] = _mm512_setzero_ps();
    for (int b = 0; b < kb; b++) {
        __m512i dot[16];
        avx_group(R, CB, pairs + b * 16, ld, w->codes + ((size_t)nb * kb + b) * 128, (size_t)kb * 128, dot);
        for (int c = 0; c < CB; c++) {
            const uint16_t *params = w->params + ((size_t)(nb + c) * kb + b) * 32;
            const __m512 scale = group_scale(params), offset = group_offset(params);
            for (int r = 0; r < R; r++) {
                const size_t group = (size_t)(r0 + r) * kb + b;
                const __m512 exact = _mm512_mul_ps(_mm512_cvtepi32_ps(dot[r * CB + c]), _mm512_set1_ps(grid->unit[group]));
                sum[r * CB + c] = accumulate_with(sum[r * CB + c], exact, scale, offset, grid->sums[group]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < CB; c++)
            store_row(sum[r * CB + c], w, (nb + c) * 16, out + (size_t)(r0 + r) * w->n);
}

/* Every row through output blocks nb .. nb + 3 (fewer at the end): rows 4 at a time, then 2, then 1. */
static void avx_quad(const Int4Weight *w, int nb, const Grid *grid, int m, uint16_t *out) {
    const int cb = w->n / 16 - nb < 4 ? w->n / 16 - nb : 4;
    int r0 = 0;
    for (; r0 + 4 <= m; r0 += 4)
        for (int c = 0; c < cb; c++) avx_columns(4, 1, w, nb + c, grid, r0, out);
    for (; r0 + 2 <= m; r0 += 2) {
        if (cb == 4) avx_columns(2, 4, w, nb, grid, r0, out);
        else
            for (int c = 0; c < cb; c++) avx_columns(2, 1, w, nb + c, grid, r0, out);
    }
    if (r0 < m) {
        if (cb == 4) avx_columns(1, 4, w, nb, grid, r0, out);
        else
            for (int c = 0; c < cb; c++) avx_columns(1, 1, w, nb + c, grid, r0, out);
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define AMX_PATH 1
#include "gemm_int4_amx.h"
#else
#define AMX_PATH 0
#endif

static int run(const uint16_t *x, int m, const Int4Weight *w, uint16_t *out, int num_threads, int avx_max_rows) {
    /* the tiles where the OS allows them (else the AVX path: the same bits) */
    const int k = w->k, kb = k / 32, blocks = w->n / 16, amx = AMX_PATH && m > avx_max_rows && prefill_amx_ready();
    const int padded_rows = amx ? (m + 31) / 32 * 32 : m;
    Grid grid = {aligned_alloc(64, (size_t)padded_rows * k * sizeof(uint16_t)), malloc(sizeof(float) * (size_t)m * kb),
                 malloc(sizeof(float) * (size_t)m * kb)};
    const size_t per_thread = amx ? AMX_SCRATCH(k) : 64; /* the AVX path keeps its sums in registers */
    char *scratch = aligned_alloc(64, (size_t)num_threads * per_thread);
    if (!grid.values || !grid.unit || !grid.sums || !scratch) {
        free(grid.values), free(grid.unit), free(grid.sums), free(scratch);
        return -2;
    }
    to_grid(x, m, k, amx, &grid);
    memset(grid.values + (size_t)m * k, 0, (size_t)(padded_rows - m) * k * sizeof(uint16_t));
#pragma omp parallel num_threads(num_threads) if (blocks > 1)
    {
#if defined(_OPENMP)
        const int thread = omp_get_thread_num();
#else
        const int thread = 0;
#endif
        if (amx) {
#if AMX_PATH
            amx_columns(w, &grid, m, scratch + (size_t)thread * per_thread, out);
#endif
        } else {
#pragma omp for schedule(static)
            for (int quad = 0; quad < (blocks + 3) / 4; quad++) avx_quad(w, 4 * quad, &grid, m, out);
        }
    }
    free(grid.values), free(grid.unit), free(grid.sums), free(scratch);
    return 0;
}
#endif

/* out = x @ W.T (+ bias) as above; x [m, k] bf16 row-major, out [m, n] bf16. Returns 0, or having written
 * nothing: -1 a shape it does not take (k a multiple of 32, n of 16), -2 out of memory, -3 no AVX512-BF16 and
 * VNNI here. An empty call (m = 0) checks the shape only. */
int gemm_int4_fixed(const uint16_t *x, int m, int k, const uint16_t *codes, const uint16_t *params, int n,
                    const float *bias, uint16_t *out, int num_threads, int avx_max_rows) {
    if (m < 0 || k <= 0 || n <= 0 || k % 32 || n % 16) return -1;
#if defined(__AVX512BF16__) && defined(__AVX512VNNI__)
    if (m == 0) return 0;
    const Int4Weight w = {codes, params, bias, n, k};
    return run(x, m, &w, out, num_threads < 1 ? 1 : num_threads, avx_max_rows);
#else
    (void)x, (void)codes, (void)params, (void)bias, (void)out, (void)num_threads, (void)avx_max_rows;
    return -3;
#endif
}
