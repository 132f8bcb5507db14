/* Paged decode attention on CPU: one query token per sequence, K and V read straight from the paged
 * cache [num_blocks, 2, block_size, num_kv_heads, head_dim] (contiguous), with no gather copy.
 *
 * A work item is one sequence, or a contiguous range of its blocks when there are too few sequences
 * to keep every thread busy (split-KV; the partial results are merged at the end). Items are spread
 * over OpenMP threads. An item walks its blocks once, prefetching the next block while it works on
 * the current one; for each KV head it scores up to 16 slots of the block at a time against the G
 * query heads that share that KV head (GQA: each K and V row is read once), updates the online
 * softmax in fp32 (base-2 exponentials, the scale folded into the scores) and accumulates P.V into
 * fp32 rows. Slots past a sequence's length and blocks past its last are never read, so whatever
 * they hold (NaN included) cannot reach the result. The step's new K/V row of each sequence is stored
 * into its block just before that block is read (it has been prefetched by then).
 *
 * Options of a layer: a sliding window (a query at position p sees positions p-W+1..p only: blocks before
 * the window are never read, nor the slots before it in its first block), a logit softcap (each scaled
 * score s becomes cap * tanh(s / cap) before the softmax; Gemma 2) and attention sinks (a logit per query
 * head that joins the softmax's sum with no value, added when the rows are normalised; GPT-OSS).
 *
 * Two inner loops: portable C (OpenMP simd; any compiler and CPU, any head dim) and, where the
 * compiler targets AVX-512 and the head dim is a multiple of 32, intrinsics: bf16 dot products with
 * VDPBF16PS (when AVX512-BF16 is there), one transposing reduction for 16 dot products, an AVX-512
 * exp2, a branch-free softmax update with per-lane sums, and P.V with the accumulators in registers.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "numerics.h"

#define TILE 16              /* slots scored at once; also the lanes of a partial sum */
#define MAX_HEAD_DIM 512
#define MAX_GROUP 64         /* query heads per KV head */
#define MAX_HEADS 256        /* query heads */
#define MAX_STATE 16384      /* num_heads * head_dim */
#define MIN_SPLIT_TOKENS 128 /* a split-KV range holds at least this many slots */

enum { PD_OK = 0, PD_UNSUPPORTED = -1, PD_NO_MEMORY = -2 };

typedef struct {
    const void *q;
    const void *k_new, *v_new; /* [num_seqs, num_kv_heads, head_dim]: the token each sequence adds */
    const int64_t *new_rows;   /* K row (cache viewed as [-1, num_kv_heads, head_dim]) of that token */
    void *kv;
    const int32_t *block_tables;
    const int32_t *seq_lens;
    int max_blocks, num_heads, num_kv_heads, head_dim, block_size, group, splits, is_bf16;
    int fast;          /* AVX-512 tiles; with bf16 their accumulators hold even dims, then odd, per 32 */
    size_t row_stride; /* elements from one slot of a block to the next: num_kv_heads * head_dim */
    float scale;       /* softmax scale * log2(e): scores live in the base-2 domain */
    float softcap;     /* the logit softcap * log2(e) (the base-2 domain's); 0: none */
    const float *sinks; /* [num_heads] natural-log sink logits; NULL: none */
    int window;        /* sliding window in positions; 0: none */
} Ctx;

/* The first position sequence seq attends to. */
static inline int window_start(const Ctx *c, int seq) {
    const int seq_len = c->seq_lens[seq];
    return c->window > 0 && seq_len > c->window ? seq_len - c->window : 0;
}

/* cap * tanh(s / cap), s and cap in the base-2 domain (the ratio is the natural domain's). */
static inline float soft_capped(float s, float cap) { return cap * tanhf(s / cap); }

typedef struct { /* online-softmax state of every query head of one item, not normalised */
    float acc[MAX_STATE] __attribute__((aligned(64))); /* [num_heads][head_dim] */
    float q_scaled[MAX_STATE] __attribute__((aligned(64))); /* portable path: q * scale in fp32 */
    float sum[MAX_HEADS][TILE] __attribute__((aligned(64))); /* partial sums per lane */
    float max[MAX_HEADS];
} State;

static inline float lane_total(const float *lanes) {
    float total = 0.0f;
    for (int i = 0; i < TILE; i++) total += lanes[i];
    return total;
}

/* Portable tile: q_scaled holds the group's query rows in fp32, already multiplied by c->scale. */
static void tile_portable(const Ctx *c, const float *q_scaled, size_t k_index, size_t v_index, int rows,
                          float *max, float (*sum)[TILE], float *acc) {
    const int dim = c->head_dim, group = c->group, is_bf16 = c->is_bf16;
    float s[MAX_GROUP * TILE];
    float row[MAX_HEAD_DIM] __attribute__((aligned(64)));
    for (int t = 0; t < rows; t++) {
        const size_t at = k_index + t * c->row_stride;
#pragma omp simd
        for (int d = 0; d < dim; d++) row[d] = load_f32(c->kv, at + d, is_bf16);
        for (int g = 0; g < group; g++) {
            const float *qg = q_scaled + (size_t)g * dim;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int d = 0; d < dim; d++) dot += qg[d] * row[d];
            s[g * TILE + t] = c->softcap > 0.0f ? soft_capped(dot, c->softcap) : dot;
        }
    }
    for (int g = 0; g < group; g++) {
        float *sg = s + g * TILE;
        float tile_max = sg[0];
        for (int t = 1; t < rows; t++) tile_max = sg[t] > tile_max ? sg[t] : tile_max;
        if (tile_max > max[g]) {
            const float alpha = exp2f(max[g] - tile_max);
            sum[g][0] *= alpha;
            float *ag = acc + (size_t)g * dim;
#pragma omp simd
            for (int d = 0; d < dim; d++) ag[d] *= alpha;
            max[g] = tile_max;
        }
        const float m = max[g];
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int t = 0; t < rows; t++) {
            const float p = exp2_nonpos(sg[t] - m);
            sg[t] = p;
            total += p;
        }
        sum[g][0] += total;
    }
    for (int t = 0; t < rows; t++) {
        const size_t at = v_index + t * c->row_stride;
#pragma omp simd
        for (int d = 0; d < dim; d++) row[d] = load_f32(c->kv, at + d, is_bf16);
        for (int g = 0; g < group; g++) {
            const float p = s[g * TILE + t];
            float *ag = acc + (size_t)g * dim;
#pragma omp simd
            for (int d = 0; d < dim; d++) ag[d] += p * row[d];
        }
    }
}

#if defined(__AVX512F__)
static inline __m512 load16(const void *base, size_t index, int is_bf16) {
    if (is_bf16) return bf16x16_to_f32((const uint16_t *)base + index);
    return _mm512_loadu_ps((const float *)base + index);
}

/* 32 cache elements as two fp32 vectors. bf16 comes out de-interleaved (even elements, then odd ones:
 * a shift and a mask, no lane crossing); accumulators of the bf16 path keep that order per 32 dims. */
static inline void load32(const void *base, size_t index, int is_bf16, __m512 *first, __m512 *second) {
    if (is_bf16) {
        const __m512i raw = _mm512_loadu_si512((const uint16_t *)base + index);
        *first = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
        *second = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32((int)0xffff0000u)));
    } else {
        *first = _mm512_loadu_ps((const float *)base + index);
        *second = _mm512_loadu_ps((const float *)base + index + 16);
    }
}

/* r[t] = sum of the 16 lanes of v[t], for 16 vectors at once (45 shuffles and adds, not 16 reductions). */
static inline __m512 transpose_sum16(const __m512 v[TILE]) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] */
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) { /* per 128-bit lane: partial sums of 4 consecutive rows */
        __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

/* cap * tanh(x / cap) per lane, as 1 - 2 / (e^(2x/cap) + 1) (|error| < 1e-6 * cap; saturates to +-cap). */
static inline __m512 soft_capped512(__m512 x, float cap) {
    const __m512 e = exp2_512(_mm512_mul_ps(x, _mm512_set1_ps(2.0f * (float)LOG2E / cap)));
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 t = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
    return _mm512_mul_ps(t, _mm512_set1_ps(cap));
}

static inline __m512 max_all_lanes(__m512 x) {
    x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E));
    x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1));
    x = _mm512_max_ps(x, _mm512_permute_ps(x, 0x4E));
    return _mm512_max_ps(x, _mm512_permute_ps(x, 0xB1));
}

/* Scores of one query head against the tile's slots, unscaled: q_raw is the head's row as stored. */
static inline __attribute__((always_inline)) __m512 tile_scores(const Ctx *c, const void *q_raw, size_t k_index,
                                                                 const int rows, const int dim) {
    __m512 v[TILE];
#pragma GCC unroll 16
    for (int t = 0; t < TILE; t++) {
        __m512 dot = _mm512_setzero_ps();
        if (t < rows) {
            const size_t at = k_index + t * c->row_stride;
#if defined(__AVX512BF16__)
            if (c->is_bf16) {
                const uint16_t *k = (const uint16_t *)c->kv + at, *q = (const uint16_t *)q_raw;
                for (int d = 0; d < dim; d += 32)
                    dot = _mm512_dpbf16_ps(dot, (__m512bh)_mm512_loadu_si512(q + d),
                                           (__m512bh)_mm512_loadu_si512(k + d));
            } else
#endif
                for (int d = 0; d < dim; d += 16)
                    dot = _mm512_fmadd_ps(load16(q_raw, d, c->is_bf16), load16(c->kv, at + d, c->is_bf16), dot);
        }
        v[t] = dot;
    }
    return transpose_sum16(v);
}

/* AVX-512 tile (head_dim % 32 == 0): q_raw points at the group's first query row as stored. While it
 * works, it prefetches `pf_lines` cache lines from pf (part of the next block), a few per row. */
static inline __attribute__((always_inline)) void tile_avx512(const Ctx *c, const void *q_raw, size_t k_index,
                                                               size_t v_index, const int rows, float *max,
                                                               float (*sum)[TILE], float *acc, const char *pf,
                                                               int pf_lines, const int dim) {
    const int group = c->group, is_bf16 = c->is_bf16;
    const size_t elem = is_bf16 ? 2 : 4;
    const __mmask16 valid = rows >= TILE ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1u);
    const __m512 scale = _mm512_set1_ps(c->scale), minus_inf = _mm512_set1_ps(-INFINITY);
    float p[MAX_GROUP * TILE] __attribute__((aligned(64)));
    float alpha[MAX_GROUP];
    /* Softmax update without branches or horizontal sums: the max is broadcast over the lanes, the
     * running sum stays per lane, the accumulators are rescaled (by 1 mostly) on their way to P.V. */
    for (int g = 0; g < group; g++) {
        const void *qg = (const char *)q_raw + (size_t)g * dim * elem;
        const __m512 dots = tile_scores(c, qg, k_index, rows, dim);
        __m512 scaled = _mm512_mul_ps(dots, scale);
        if (c->softcap > 0.0f) scaled = soft_capped512(scaled, c->softcap);
        const __m512 s = _mm512_mask_mov_ps(minus_inf, valid, scaled);
        const __m512 old = _mm512_set1_ps(max[g]);
        const __m512 m = _mm512_max_ps(old, max_all_lanes(s));
        const __m512 a = exp2_512(_mm512_sub_ps(old, m));
        const __m512 w = _mm512_maskz_mov_ps(valid, exp2_512(_mm512_sub_ps(s, m)));
        _mm512_store_ps(sum[g], _mm512_fmadd_ps(_mm512_load_ps(sum[g]), a, w));
        _mm512_store_ps(p + g * TILE, w);
        max[g] = _mm512_cvtss_f32(m);
        alpha[g] = _mm512_cvtss_f32(a);
    }
    /* P.V with up to 4 heads x 64 dims of accumulators in registers. */
    const int span = dim % 64 == 0 ? 64 : 32, pf_per_row = (pf_lines + rows - 1) / rows;
    for (int g0 = 0; g0 < group; g0 += 4) {
        const int heads = group - g0 < 4 ? group - g0 : 4;
        for (int d = 0; d < dim; d += span) {
            __m512 a[4][4] = {{_mm512_setzero_ps()}};
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
                for (int k = 0; k < span / 16; k++)
                    if (i < heads)
                        a[i][k] = _mm512_mul_ps(_mm512_loadu_ps(acc + (size_t)(g0 + i) * dim + d + 16 * k),
                                                _mm512_set1_ps(alpha[g0 + i]));
            for (int t = 0; t < rows; t++) {
                if (g0 == 0 && d == 0 && pf)
                    for (int l = t * pf_per_row; l < (t + 1) * pf_per_row && l < pf_lines; l++)
                        __builtin_prefetch(pf + 64 * (size_t)l, 0, 2);
                const size_t at = v_index + t * c->row_stride + d;
                __m512 x[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
                load32(c->kv, at, is_bf16, &x[0], &x[1]);
                if (span == 64) load32(c->kv, at + 32, is_bf16, &x[2], &x[3]);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
                    if (i < heads) {
                        const __m512 w = _mm512_set1_ps(p[(g0 + i) * TILE + t]);
#pragma GCC unroll 4
                        for (int k = 0; k < span / 16; k++) a[i][k] = _mm512_fmadd_ps(w, x[k], a[i][k]);
                    }
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
                for (int k = 0; k < span / 16; k++)
                    if (i < heads) _mm512_storeu_ps(acc + (size_t)(g0 + i) * dim + d + 16 * k, a[i][k]);
        }
    }
}

#define TILE_AVX512(ROWS, DIM) tile_avx512(c, q_raw, k_index, v_index, ROWS, max, sum, acc, pf, pf_lines, DIM)

static void tile_avx512_any(const Ctx *c, const void *q_raw, size_t k_index, size_t v_index, int rows, float *max,
                            float (*sum)[TILE], float *acc, const char *pf, int pf_lines) {
    /* Copies for full tiles and common head dims, so that their loops unroll completely. */
    if (rows == TILE && c->head_dim == 64)
        TILE_AVX512(TILE, 64);
    else if (rows == TILE && c->head_dim == 128)
        TILE_AVX512(TILE, 128);
    else
        TILE_AVX512(rows, c->head_dim);
}
#endif

static inline void prefetch_lines(const char *start, int lines) {
#if defined(__GNUC__)
    for (int l = 0; l < lines; l++) __builtin_prefetch(start + 64 * (size_t)l, 0, 3);
#else
    (void)start, (void)lines;
#endif
}

/* Attends blocks [first, last) of sequence seq for every query head, into st (not normalised), from its
 * window's first position on. The next block is prefetched while the current one is worked on, a share per
 * (KV head, tile). */
static void attend_range(const Ctx *c, int seq, int first, int last, State *st) {
    const int dim = c->head_dim, group = c->group, bs = c->block_size;
    const int seq_len = c->seq_lens[seq], start = window_start(c, seq);
    const int32_t *table = c->block_tables + (size_t)seq * c->max_blocks;
    const size_t q_row = (size_t)seq * c->num_heads * dim, elem = c->is_bf16 ? 2 : 4;
    const size_t block_elems = 2 * (size_t)bs * c->row_stride;
    const int block_lines = (int)((block_elems * elem + 63) / 64), tiles = (bs + TILE - 1) / TILE;
    const int share_lines = (block_lines + c->num_kv_heads * tiles - 1) / (c->num_kv_heads * tiles);
    for (int h = 0; h < c->num_heads; h++) st->max[h] = -INFINITY;
    memset(st->sum, 0, sizeof(st->sum[0]) * c->num_heads);
    memset(st->acc, 0, sizeof(float) * c->num_heads * dim);
    if (!c->fast)
        for (int i = 0; i < c->num_heads * dim; i++)
            st->q_scaled[i] = load_f32(c->q, q_row + i, c->is_bf16) * c->scale;
    if (first < last) prefetch_lines((const char *)c->kv + table[first] * block_elems * elem, block_lines);
    for (int j = first; j < last; j++) {
        const size_t block_index = (size_t)table[j] * block_elems;
        if (j == (seq_len - 1) / bs && c->k_new) { /* the new token's block, prefetched by now */
            const size_t row = (size_t)c->new_rows[seq] * c->row_stride, bytes = c->row_stride * elem;
            memcpy((char *)c->kv + row * elem, (const char *)c->k_new + seq * bytes, bytes);
            memcpy((char *)c->kv + (row + bs * c->row_stride) * elem, (const char *)c->v_new + seq * bytes, bytes);
        }
        const char *next = j + 1 < last ? (const char *)c->kv + table[j + 1] * block_elems * elem : NULL;
        const int slots = seq_len - j * bs < bs ? seq_len - j * bs : bs;
        const int from_slot = j == start / bs ? start % bs : 0; /* the window's first slot */
        for (int h = 0; h < c->num_kv_heads; h++) {
            const int g0 = h * group;
            for (int t0 = from_slot, tile = 0; t0 < slots; t0 += TILE, tile++) {
                const int rows = slots - t0 < TILE ? slots - t0 : TILE;
                const size_t k_index = block_index + t0 * c->row_stride + (size_t)h * dim;
                const size_t v_index = k_index + bs * c->row_stride;
                float *max = st->max + g0, (*sum)[TILE] = st->sum + g0, *acc = st->acc + (size_t)g0 * dim;
                const int share = h * tiles + tile, from = share * share_lines;
                const int lines = !next || from >= block_lines
                                      ? 0
                                      : (block_lines - from < share_lines ? block_lines - from : share_lines);
                const char *pf = lines ? next + 64 * (size_t)from : NULL;
#if defined(__AVX512F__)
                if (c->fast) {
                    const void *q = (const char *)c->q + (q_row + (size_t)g0 * dim) * elem;
                    tile_avx512_any(c, q, k_index, v_index, rows, max, sum, acc, pf, lines);
                    continue;
                }
#endif
                prefetch_lines(pf, lines);
                tile_portable(c, st->q_scaled + (size_t)g0 * dim, k_index, v_index, rows, max, sum, acc);
            }
        }
    }
}

/* out row = acc * weight, in the output dtype and the natural order of dims. */
static void store_row(const Ctx *c, void *out, size_t index, const float *acc, float weight) {
    if (c->is_bf16) {
        uint16_t *dst = (uint16_t *)out + index;
        if (c->fast) /* per 32 dims, acc holds the even ones, then the odd ones */
            for (int d = 0; d < c->head_dim; d++)
                dst[d] = f32_to_bf16(acc[(d & ~31) + (d & 1) * 16 + (d & 31) / 2] * weight);
        else
            for (int d = 0; d < c->head_dim; d++) dst[d] = f32_to_bf16(acc[d] * weight);
    } else {
        float *dst = (float *)out + index;
#pragma omp simd
        for (int d = 0; d < c->head_dim; d++) dst[d] = acc[d] * weight;
    }
}

/* The weight of head h's accumulators (taken relative to max, their sum sum): 1 / sum, or with a sink, whose
 * exp joins the sum with no value, their share of the larger total. */
static float row_weight(const Ctx *c, int h, float max, float sum) {
    if (c->sinks) {
        const float sink = c->sinks[h] * (float)LOG2E, top = max > sink ? max : sink, rescale = exp2f(max - top);
        sum = sum * rescale + exp2f(sink - top);
        return sum > 0.0f ? rescale / sum : 0.0f;
    }
    return sum > 0.0f ? 1.0f / sum : 0.0f;
}

static void store_seq(const Ctx *c, int seq, const State *st, void *out) {
    for (int h = 0; h < c->num_heads; h++)
        store_row(c, out, ((size_t)seq * c->num_heads + h) * c->head_dim, st->acc + (size_t)h * c->head_dim,
                  row_weight(c, h, st->max[h], lane_total(st->sum[h])));
}

/* Combines the splits' partial states of sequence seq into its output rows. */
static void merge_splits(const Ctx *c, int seq, const State *parts, void *out) {
    const int dim = c->head_dim;
    float row[MAX_HEAD_DIM];
    for (int h = 0; h < c->num_heads; h++) {
        float max = -INFINITY, sum = 0.0f;
        for (int k = 0; k < c->splits; k++) max = parts[k].max[h] > max ? parts[k].max[h] : max;
        memset(row, 0, sizeof(float) * dim);
        for (int k = 0; k < c->splits; k++) {
            const float part_sum = lane_total(parts[k].sum[h]);
            if (part_sum == 0.0f) continue;
            const float w = exp2f(parts[k].max[h] - max);
            sum += part_sum * w;
            const float *acc = parts[k].acc + (size_t)h * dim;
            for (int d = 0; d < dim; d++) row[d] += acc[d] * w;
        }
        store_row(c, out, ((size_t)seq * c->num_heads + h) * dim, row, row_weight(c, h, max, sum));
    }
}

/* 1 when the kernels serve this shape, else 0. */
int paged_decode_supports(int num_heads, int num_kv_heads, int head_dim, int block_size) {
    if (num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads || head_dim <= 0 || block_size <= 0) return 0;
    return num_heads / num_kv_heads <= MAX_GROUP && num_heads <= MAX_HEADS && head_dim <= MAX_HEAD_DIM &&
           (size_t)num_heads * head_dim <= MAX_STATE;
}

static int run(Ctx *c, void *out, int num_seqs, int num_threads, int fixed_order) {
    if (!paged_decode_supports(c->num_heads, c->num_kv_heads, c->head_dim, c->block_size)) return PD_UNSUPPORTED;
    if (num_seqs <= 0) return PD_OK;
    if (num_threads < 1) num_threads = 1;
    c->group = c->num_heads / c->num_kv_heads;
    c->row_stride = (size_t)c->num_kv_heads * c->head_dim;
#if defined(__AVX512F__)
    c->fast = c->head_dim % 32 == 0;
#endif
    c->scale *= LOG2E;
    c->softcap *= LOG2E;
    /* Split-KV only when there are fewer than two sequences per thread. */
    int longest = 0;
    for (int i = 0; i < num_seqs; i++) {
        const int seen = c->seq_lens[i] - window_start(c, i);
        longest = seen > longest ? seen : longest;
    }
    const int wanted = (2 * num_threads + num_seqs - 1) / num_seqs, cap = longest / MIN_SPLIT_TOKENS;
    c->splits = wanted < cap ? wanted : cap;
    c->splits = c->splits < 1 || fixed_order ? 1 : c->splits;
    const int items = num_seqs * c->splits;
    /* One state per item when splitting (merged afterwards), else one per thread. */
    State *states = aligned_alloc(64, sizeof(State) * (c->splits > 1 ? items : num_threads));
    if (!states) return PD_NO_MEMORY;
#pragma omp parallel num_threads(num_threads) if (items > 1)
    {
#if defined(_OPENMP)
        State *own = states + omp_get_thread_num();
#else
        State *own = states;
#endif
#pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < items; item++) {
            const int seq = item / c->splits, split = item % c->splits;
            const int blocks = (c->seq_lens[seq] + c->block_size - 1) / c->block_size;
            const int lowest = window_start(c, seq) / c->block_size; /* the window's first block */
            if (c->splits > 1) {
                const int per = (blocks - lowest + c->splits - 1) / c->splits;
                const int first = lowest + split * per < blocks ? lowest + split * per : blocks;
                const int last = first + per < blocks ? first + per : blocks;
                attend_range(c, seq, first, last, states + item);
            } else {
                attend_range(c, seq, lowest, blocks, own);
                store_seq(c, seq, own, out);
            }
        }
        if (c->splits > 1) {
#pragma omp for schedule(static)
            for (int seq = 0; seq < num_seqs; seq++) merge_splits(c, seq, states + (size_t)seq * c->splits, out);
        }
    }
    free(states);
    return PD_OK;
}

#define DEFINE_DECODE(NAME, T, IS_BF16)                                                                         \
    int NAME(const T *q, const T *k_new, const T *v_new, const int64_t *new_rows, T *kv_cache,                   \
             const int32_t *block_tables, const int32_t *seq_lens, int num_seqs, int max_blocks, int num_heads,  \
             int num_kv_heads, int head_dim, int block_size, float scale, T *out, int num_threads,               \
             int fixed_order, const float *sinks, float softcap, int window) {                                  \
        Ctx c = {.q = q, .k_new = k_new, .v_new = v_new, .new_rows = new_rows, .kv = kv_cache,                   \
                 .block_tables = block_tables, .seq_lens = seq_lens,                                             \
                 .max_blocks = max_blocks, .num_heads = num_heads, .num_kv_heads = num_kv_heads,                 \
                 .head_dim = head_dim, .block_size = block_size, .is_bf16 = IS_BF16, .scale = scale,             \
                 .softcap = softcap > 0.0f ? softcap : 0.0f, .sinks = sinks, .window = window > 0 ? window : 0};  \
        return run(&c, out, num_seqs, num_threads, fixed_order);                                                \
    }

/* out[s, h, :] = softmax(scale * q[s, h] . K[s]) V[s] over the first seq_lens[s] >= 1 slots of sequence
 * s, whose slot p lives in block block_tables[s * max_blocks + p / block_size] at offset
 * p % block_size; query head h reads KV head h / (num_heads / num_kv_heads). q and out are
 * [num_seqs, num_heads, head_dim], contiguous. Unless k_new is NULL, first stores each sequence's new
 * token (k_new[s], v_new[s]: [num_seqs, num_kv_heads, head_dim], contiguous) at K row new_rows[s] of
 * the cache viewed as [-1, num_kv_heads, head_dim] (its V row is block_size further); that slot must
 * be position seq_lens[s] - 1. Runs on up to num_threads OpenMP threads. Unless fixed_order is 0, a
 * sequence is never split across threads (split-KV): each query then sums its slots in one order, blocks
 * and tiles ascending, whatever the number of sequences and threads (the deterministic mode; a step's
 * prefill rows may be passed as sequences of their own, k_new NULL). A layer's options: sinks (NULL: none)
 * holds each query head's sink logit, whose exp joins its softmax's sum with no value; softcap > 0 caps each
 * scaled score s at softcap * tanh(s / softcap); window > 0 lets a sequence see only its last window slots.
 * Returns 0, or a negative code having touched nothing: -1 unsupported shape (see paged_decode_supports),
 * -2 out of memory. */
DEFINE_DECODE(paged_decode_bf16, uint16_t, 1)
DEFINE_DECODE(paged_decode_f32, float, 0)
