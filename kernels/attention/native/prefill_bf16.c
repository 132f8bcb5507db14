/* The prompt kernel's bf16 path (prefill_fixed.c): a bf16 cache, a head dim that is a multiple of 64 and
 * a compiler that targets AVX512-BF16. Otherwise prefill_bf16_serves says no and prefill_fp32.c runs.
 *
 * Per tile of 16 slots, for the item's rows 16 at a time (a lane per row, one query head of one query):
 * - scores: the bf16 dot product of the row's query and each slot's key in fp32 sums over the dims in
 *   order, then times the scale: on AMX tiles (TDPBF16PS, 32 dims each) where the CPU and the kernel allow
 *   them (prefill_amx_ready), else one VDPBF16PS per pair of dims;
 * - the online softmax in fp32 with the max and sums across slots taken lane by lane (no shuffles), the
 *   weights of slots past the row's length zero;
 * - P.V: per row, the accumulator times alpha, then the weights rounded to bf16 (as torch's bf16 flash
 *   attention does) times V, in fp32 sums over the tile's pairs of slots in order: on AMX tiles for rows
 *   that attend the whole tile, else (and without AMX) one VDPBF16PS per pair of slots, whose last pair
 *   takes a zero for a slot past the row's end, so that what the slot holds never reaches the row.
 * Every operation on a row is the same whatever shares its 16 lanes or its tiles, and a process uses AMX
 * for every row or for none, so a row's bits do not depend on the other rows of the step.
 */
#include <math.h>
#include <string.h>

#include "prefill_fixed.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

#define PAIRS (PF_TILE / 2)

int prefill_bf16_serves(const PCtx *c) { return c->is_bf16 && c->head_dim % 64 == 0; }

static const uint16_t zero_row[PF_MAX_HEAD_DIM] __attribute__((aligned(64)));

static inline const uint16_t *cache_row(const PCtx *c, const int32_t *table, int h, int pos, int is_v) {
    return (const uint16_t *)c->kv + cache_index(c, table, h, pos, is_v);
}

/* The tile's K rows as pairs of dims [slot][dim / 2], and its V as pairs of slots [PAIRS][dim]: element d of
 * pair j holds slot 2j's dim d in its low half and slot 2j + 1's in its high half. Zeros past slots. */
static inline __attribute__((always_inline)) void load_tile(const PCtx *c, Scratch *s, const int32_t *table, int h,
                                                            int t0, int slots, const int dim) {
    uint32_t *k2 = (uint32_t *)s->kt, *v2 = (uint32_t *)s->v;
    const __m512i low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                         37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
    for (int t = 0; t < PF_TILE; t++)
        memcpy(k2 + (size_t)t * (dim / 2), t < slots ? cache_row(c, table, h, t0 + t, 0) : zero_row, 2 * (size_t)dim);
    for (int j = 0; j < PAIRS; j++) {
        const uint16_t *a = 2 * j < slots ? cache_row(c, table, h, t0 + 2 * j, 1) : zero_row;
        const uint16_t *b = 2 * j + 1 < slots ? cache_row(c, table, h, t0 + 2 * j + 1, 1) : zero_row;
        for (int d = 0; d < dim; d += 32) {
            const __m512i x = _mm512_loadu_si512(a + d), y = _mm512_loadu_si512(b + d);
            _mm512_store_si512(v2 + (size_t)j * dim + d, _mm512_permutex2var_epi16(x, low, y));
            _mm512_store_si512(v2 + (size_t)j * dim + d + 16, _mm512_permutex2var_epi16(x, high, y));
        }
    }
}

/* The dot products of rows [r, r + 16) (lanes) with the tile's keys, one VDPBF16PS per pair of dims. */
static inline __attribute__((always_inline)) void scores_dpbf16(const Scratch *s, int r, __m512 score[PF_TILE],
                                                                const int dim) {
    const uint32_t *k2 = (const uint32_t *)s->kt, *q2 = (const uint32_t *)s->q;
#pragma GCC unroll 16
    for (int t = 0; t < PF_TILE; t++) score[t] = _mm512_setzero_ps();
    for (int dp = 0; dp < dim / 2; dp++) {
        const __m512bh q = (__m512bh)_mm512_loadu_si512(q2 + (size_t)dp * s->stride + r);
#pragma GCC unroll 16
        for (int t = 0; t < PF_TILE; t++)
            score[t] = _mm512_dpbf16_ps(score[t], q, (__m512bh)_mm512_set1_epi32((int)k2[(size_t)t * (dim / 2) + dp]));
    }
}

/* The softmax of rows [r, r + 16) (lanes) over the tile, from their dot products (score[t]: slot t); their
 * weights go to the pairs array as bf16 pairs of slots. */
static inline __attribute__((always_inline)) void softmax_chunk(const PCtx *c, Scratch *s, int r,
                                                                __m512 score[PF_TILE]) {
    const __m512i valid = _mm512_loadu_si512(s->valid + r);
    const __m512 scale = _mm512_set1_ps(c->scale), minus_inf = _mm512_set1_ps(-INFINITY);
    __mmask16 lanes[PF_TILE];
    __m512 tile_max = minus_inf;
#pragma GCC unroll 16
    for (int t = 0; t < PF_TILE; t++) {
        lanes[t] = _mm512_cmpgt_epi32_mask(valid, _mm512_set1_epi32(t));
        score[t] = _mm512_mask_mov_ps(minus_inf, lanes[t], _mm512_mul_ps(score[t], scale));
        tile_max = _mm512_max_ps(tile_max, score[t]);
    }
    const __m512 old = _mm512_loadu_ps(s->max + r), m = _mm512_max_ps(old, tile_max);
    const __m512 alpha = exp2_512(_mm512_sub_ps(old, m)); /* tiny on the first tile (acc, sum 0) */
    __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(s->sum + r), alpha);
    uint32_t *p2 = (uint32_t *)s->scores;
    const __m512i interleave = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                                38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
#pragma GCC unroll 8
    for (int j = 0; j < PAIRS; j++) {
        const __m512 p0 = _mm512_maskz_mov_ps(lanes[2 * j], exp2_512(_mm512_sub_ps(score[2 * j], m)));
        const __m512 p1 = _mm512_maskz_mov_ps(lanes[2 * j + 1], exp2_512(_mm512_sub_ps(score[2 * j + 1], m)));
        sum = _mm512_add_ps(_mm512_add_ps(sum, p0), p1);
        const __m512i a = _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(p0));
        const __m512i b = _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(p1));
        _mm512_storeu_si512(p2 + (size_t)j * s->stride + r, _mm512_permutex2var_epi16(a, interleave, b));
    }
    _mm512_storeu_ps(s->max + r, m);
    _mm512_storeu_ps(s->sum + r, sum);
    _mm512_storeu_ps(s->alpha + r, alpha);
}

/* P.V of rows [r, r + n), n <= 4, all attending `valid` slots of the tile: acc = acc * alpha, then one
 * VDPBF16PS per pair of slots in order, 64 dims at a time in registers; the rows share each load of V. */
static inline __attribute__((always_inline)) void pv_block(Scratch *s, int r, const int n, int valid, const int dim) {
    const uint32_t *p2 = (const uint32_t *)s->scores, *v2 = (const uint32_t *)s->v;
    const int pairs = (valid + 1) / 2;
    const __m512i keep_even = valid % 2 ? _mm512_set1_epi32(0xffff) : _mm512_set1_epi32(-1);
    for (int d = 0; d < dim; d += 64) {
        __m512 a[4][4];
        acc_load_scaled(s, r, n, d, dim, a);
        for (int j = 0; j < pairs; j++) {
            const uint32_t *vj = v2 + (size_t)j * dim + d;
            __m512i v[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                v[k] = _mm512_load_si512(vj + 16 * k);
                if (j == pairs - 1) v[k] = _mm512_and_si512(v[k], keep_even);
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                if (i < n) {
                    const __m512bh w = (__m512bh)_mm512_set1_epi32((int)p2[(size_t)j * s->stride + r + i]);
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) a[i][k] = _mm512_dpbf16_ps(a[i][k], w, (__m512bh)v[k]);
                }
        }
        acc_store(s, r, n, d, dim, a);
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>

/* Linux hands a process the AMX tile state only on request (once per process; the answer is kept). */
int prefill_amx_ready(void) {
    static int state = -1;
    if (state < 0) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return state;
}

/* Tiles 0-2: scores (A: 16 slots x 32 dims of K, B: 16 pairs of dims x 16 rows of Q, C: 16 slots x 16 rows);
 * tiles 3-5: P.V (A: 16 rows x 8 pairs of slots of weights, B: 8 pairs of slots x 16 dims of V, C: 16 rows x
 * 16 dims of the accumulators). Loaded per work item: other code (oneDNN) configures the tiles its own way. */
static void amx_release(void) { _tile_release(); } /* the tiles as found: unconfigured */

static void amx_configure(void) {
    TileConfig config = {.palette = 1};
    for (int t = 0; t < 6; t++) config.colsb[t] = 64, config.rows[t] = 16;
    config.colsb[3] = 32;
    config.rows[4] = PAIRS;
    _tile_loadconfig(&config);
}

/* The dot products of rows [r, r + 16) with the tile's keys, 32 dims per TDPBF16PS in order; score[t]:
 * slot t, a lane per row. */
static inline __attribute__((always_inline)) void scores_amx(Scratch *s, int r, __m512 score[PF_TILE], const int dim) {
    const uint32_t *k2 = (const uint32_t *)s->kt, *q2 = (const uint32_t *)s->q;
    float dots[PF_TILE * 16] __attribute__((aligned(64)));
    _tile_zero(2);
    for (int d = 0; d < dim; d += 32) {
        _tile_loadd(0, k2 + d / 2, (size_t)dim * 2);
        _tile_loadd(1, q2 + (size_t)(d / 2) * s->stride + r, (size_t)s->stride * 4);
        _tile_dpbf16ps(2, 0, 1);
    }
    _tile_stored(2, dots, 64);
#pragma GCC unroll 16
    for (int t = 0; t < PF_TILE; t++) score[t] = _mm512_load_ps(dots + 16 * t);
}

/* P.V of the item's rows in [r, r + 16), before `rows`: acc = acc * alpha, then one TDPBF16PS per 16 dims
 * over the tile's 8 pairs of slots. A row whose length ends inside the tile keeps its accumulator as it was
 * (saved and put back) and takes pv_block's path, which never reads the slots past its end. */
static inline __attribute__((always_inline)) void pv_amx(Scratch *s, int r, int rows, const int dim) {
    const uint32_t *p2 = (const uint32_t *)s->scores, *v2 = (const uint32_t *)s->v;
    const int n = rows - r < 16 ? rows - r : 16;
    uint32_t weights[16 * PAIRS] __attribute__((aligned(64)));
    float saved[16 * PF_MAX_HEAD_DIM] __attribute__((aligned(64)));
    int partial[16], num_partial = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < PAIRS; j++) weights[i * PAIRS + j] = p2[(size_t)j * s->stride + r + i];
    for (int i = 0; i < n; i++) {
        float *acc = s->acc + (size_t)(r + i) * dim;
        if (s->valid[r + i] < PF_TILE) {
            memcpy(saved + (size_t)num_partial * dim, acc, sizeof(float) * dim);
            partial[num_partial++] = i;
        } else if (s->alpha[r + i] != 1.0f) {
            const __m512 alpha = _mm512_set1_ps(s->alpha[r + i]);
            for (int d = 0; d < dim; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), alpha));
        }
    }
    _tile_loadd(3, weights, PAIRS * 4);
    for (int d = 0; d < dim; d += 16) {
        _tile_loadd(5, s->acc + (size_t)r * dim + d, (size_t)dim * 4);
        _tile_loadd(4, v2 + d, (size_t)dim * 4);
        _tile_dpbf16ps(5, 3, 4);
        _tile_stored(5, s->acc + (size_t)r * dim + d, (size_t)dim * 4);
    }
    for (int k = 0; k < num_partial; k++) {
        const int i = partial[k];
        memcpy(s->acc + (size_t)(r + i) * dim, saved + (size_t)k * dim, sizeof(float) * dim);
        pv_block(s, r + i, 1, s->valid[r + i], dim);
    }
}
#else
int prefill_amx_ready(void) { return 0; }
static void amx_configure(void) {}
static void amx_release(void) {}
static inline void scores_amx(Scratch *s, int r, __m512 score[PF_TILE], const int dim) {
    (void)s, (void)r, (void)score, (void)dim;
}
static inline void pv_amx(Scratch *s, int r, int rows, const int dim) { (void)s, (void)r, (void)rows, (void)dim; }
#endif

static inline __attribute__((always_inline)) void attend_item(const PCtx *c, Scratch *s, int first, int count,
                                                              void *out, const int dim, const int amx) {
    const int group = c->group, rows = count * group;
    const int32_t *table = c->tables + (size_t)c->query_seq[first] * c->max_blocks;
    uint32_t *q2 = (uint32_t *)s->q;
    const int longest = item_longest(c, first, count);
    for (int r = rows; r < s->stride; r++) s->valid[r] = 0; /* lanes past the item's rows */
    if (amx) amx_configure();
    for (int h = 0; h < c->num_kv_heads; h++) {
        for (int i = 0; i < count; i++)
            for (int g = 0; g < group; g++) {
                const int r = i * group + g;
                const uint32_t *row = (const uint32_t *)((const uint16_t *)c->q +
                                                         ((size_t)(first + i) * c->num_heads + (size_t)h * group + g) * dim);
                for (int dp = 0; dp < dim / 2; dp++) q2[(size_t)dp * s->stride + r] = row[dp];
                memset(s->acc + (size_t)r * dim, 0, sizeof(float) * dim);
            }
        for (int r = 0; r < s->stride; r++) s->max[r] = -INFINITY, s->sum[r] = 0.0f;
        for (int t0 = 0; t0 < longest; t0 += PF_TILE) {
            load_tile(c, s, table, h, t0, longest - t0 < PF_TILE ? longest - t0 : PF_TILE, dim);
            const int active = mark_tile(c, s, first, count, t0);
            if (amx) {
                for (int r = active * group; r < rows; r += 16) {
                    __m512 score[PF_TILE];
                    scores_amx(s, r, score, dim);
                    softmax_chunk(c, s, r, score);
                    pv_amx(s, r, rows, dim);
                }
                continue;
            }
            for (int r = active * group; r < rows; r += 16) {
                __m512 score[PF_TILE];
                scores_dpbf16(s, r, score, dim);
                softmax_chunk(c, s, r, score);
            }
            for (int r = active * group; r < rows;) {
                int n = 1;
                while (n < 4 && r + n < rows && s->valid[r + n] == s->valid[r]) n++;
                if (n == 4)
                    pv_block(s, r, 4, s->valid[r], dim);
                else
                    for (int i = 0; i < n; i++) pv_block(s, r + i, 1, s->valid[r], dim);
                r += n;
            }
        }
        for (int i = 0; i < count; i++)
            for (int g = 0; g < group; g++) {
                const int r = i * group + g;
                uint16_t *dst = (uint16_t *)out + ((size_t)(first + i) * c->num_heads + (size_t)h * group + g) * dim;
                const __m512 weight = _mm512_set1_ps(1.0f / s->sum[r]);
                for (int d = 0; d < dim; d += 16)
                    _mm256_storeu_si256((__m256i *)(dst + d),
                                        (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(
                                            _mm512_loadu_ps(s->acc + (size_t)r * dim + d), weight)));
            }
    }
    if (amx) amx_release();
}

void prefill_item_bf16(const PCtx *c, Scratch *s, int first, int count, void *out) {
    if (c->amx && c->head_dim == 64)
        attend_item(c, s, first, count, out, 64, 1);
    else if (c->amx)
        attend_item(c, s, first, count, out, c->head_dim, 1);
    else if (c->head_dim == 64)
        attend_item(c, s, first, count, out, 64, 0);
    else if (c->head_dim == 128)
        attend_item(c, s, first, count, out, 128, 0);
    else
        attend_item(c, s, first, count, out, c->head_dim, 0);
}

#else

int prefill_amx_ready(void) { return 0; }

int prefill_bf16_serves(const PCtx *c) {
    (void)c;
    return 0;
}

void prefill_item_bf16(const PCtx *c, Scratch *s, int first, int count, void *out) {
    (void)c, (void)s, (void)first, (void)count, (void)out;
}

#endif
