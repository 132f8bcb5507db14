/* The prompt kernel's general path (prefill_fixed.c): float32 caches, any head dim, any x86 or other CPU.
 * Lanes are a tile's slots: per row (one query head of one query) 16 scores as fp32 multiply-adds over the
 * dims in order, the online softmax of the row, then P.V over the row's slots in order. AVX-512 intrinsics
 * where the compiler targets AVX-512 and the head dim is a multiple of 64, else portable C (OpenMP simd). */
#include <math.h>

#include "prefill_fixed.h"

/* Each row's online softmax over the tile's scores: its weights replace the scores, its max, sum and the
 * factor its accumulator must take (alpha) are updated. Slots from `valid` on are masked out. */
static inline void softmax_rows(Scratch *s, int r0, int r1) {
    for (int r = r0; r < r1; r++) {
        float *sc = s->scores + (size_t)r * PF_TILE;
        const int valid = s->valid[r];
#if defined(__AVX512F__)
        const __mmask16 lanes = valid >= PF_TILE ? (__mmask16)0xffff : (__mmask16)((1u << valid) - 1u);
        const __m512 x = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), lanes, _mm512_load_ps(sc));
        const float tile_max = _mm512_reduce_max_ps(x);
        const float m = tile_max > s->max[r] ? tile_max : s->max[r];
        const __m512 p = _mm512_maskz_mov_ps(lanes, exp2_512(_mm512_sub_ps(x, _mm512_set1_ps(m))));
        _mm512_store_ps(sc, p);
        const float total = _mm512_reduce_add_ps(p);
#else
        float tile_max = -INFINITY, total = 0.0f;
        for (int t = 0; t < valid; t++) tile_max = sc[t] > tile_max ? sc[t] : tile_max;
        const float m = tile_max > s->max[r] ? tile_max : s->max[r];
#pragma omp simd reduction(+ : total)
        for (int t = 0; t < PF_TILE; t++) {
            sc[t] = t < valid ? exp2_nonpos(sc[t] - m) : 0.0f;
            total += sc[t];
        }
#endif
        s->alpha[r] = exp2_nonpos(s->max[r] - m); /* tiny on the first tile (acc, sum 0), 1 while the max holds */
        s->sum[r] = s->sum[r] * s->alpha[r] + total;
        s->max[r] = m;
    }
}

#if defined(__AVX512F__)
/* Scores of rows [r, r + n), n <= 8, against the tile: per row and slot, fp32 multiply-adds over the dims
 * in order. The rows share each load of K; a row's operations are the same for any n. */
static inline __attribute__((always_inline)) void scores_block(Scratch *s, int r, const int n, const int dim) {
    __m512 dot[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) dot[j] = _mm512_setzero_ps();
    for (int d = 0; d < dim; d++) {
        const __m512 k = _mm512_load_ps(s->kt + (size_t)d * PF_TILE);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            if (j < n) dot[j] = _mm512_fmadd_ps(_mm512_set1_ps(s->q[(size_t)(r + j) * dim + d]), k, dot[j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        if (j < n) _mm512_store_ps(s->scores + (size_t)(r + j) * PF_TILE, dot[j]);
}

/* P.V of rows [r, r + n), n <= 4, which attend the same `valid` slots: acc = acc * alpha, then one
 * multiply-add per slot in order, 64 dims at a time in registers. The rows share each load of V. */
static inline __attribute__((always_inline)) void pv_block(Scratch *s, int r, const int n, int valid, const int dim) {
    for (int d = 0; d < dim; d += 64) {
        __m512 a[4][4];
        acc_load_scaled(s, r, n, d, dim, a);
        for (int t = 0; t < valid; t++) {
            const float *vt = s->v + (size_t)t * dim + d;
            const __m512 v0 = _mm512_load_ps(vt), v1 = _mm512_load_ps(vt + 16), v2 = _mm512_load_ps(vt + 32),
                         v3 = _mm512_load_ps(vt + 48);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                if (j < n) {
                    const __m512 w = _mm512_set1_ps(s->scores[(size_t)(r + j) * PF_TILE + t]);
                    a[j][0] = _mm512_fmadd_ps(w, v0, a[j][0]);
                    a[j][1] = _mm512_fmadd_ps(w, v1, a[j][1]);
                    a[j][2] = _mm512_fmadd_ps(w, v2, a[j][2]);
                    a[j][3] = _mm512_fmadd_ps(w, v3, a[j][3]);
                }
        }
        acc_store(s, r, n, d, dim, a);
    }
}
#endif

/* Rows [r0, r1) through one tile: scores, softmax, P.V. */
static inline __attribute__((always_inline)) void tile_rows(Scratch *s, int r0, int r1, const int dim) {
#if defined(__AVX512F__)
    if (dim % 64 == 0) {
        int r = r0;
        for (; r + 8 <= r1; r += 8) scores_block(s, r, 8, dim);
        for (; r < r1; r++) scores_block(s, r, 1, dim);
        softmax_rows(s, r0, r1);
        for (r = r0; r < r1;) {
            int n = 1;
            while (n < 4 && r + n < r1 && s->valid[r + n] == s->valid[r]) n++;
            if (n == 4)
                pv_block(s, r, 4, s->valid[r], dim);
            else
                for (int j = 0; j < n; j++) pv_block(s, r + j, 1, s->valid[r], dim);
            r += n;
        }
        return;
    }
#endif
    for (int r = r0; r < r1; r++) {
        float *sc = s->scores + (size_t)r * PF_TILE;
        const float *q = s->q + (size_t)r * dim;
#pragma omp simd
        for (int t = 0; t < PF_TILE; t++) sc[t] = 0.0f;
        for (int d = 0; d < dim; d++) {
            const float qd = q[d], *kd = s->kt + (size_t)d * PF_TILE;
#pragma omp simd
            for (int t = 0; t < PF_TILE; t++) sc[t] += qd * kd[t];
        }
    }
    softmax_rows(s, r0, r1);
    for (int r = r0; r < r1; r++) {
        float *acc = s->acc + (size_t)r * dim;
        const float alpha = s->alpha[r], *p = s->scores + (size_t)r * PF_TILE;
#pragma omp simd
        for (int d = 0; d < dim; d++) acc[d] *= alpha;
        for (int t = 0; t < s->valid[r]; t++) {
            const float pt = p[t], *vt = s->v + (size_t)t * dim;
#pragma omp simd
            for (int d = 0; d < dim; d++) acc[d] += pt * vt[d];
        }
    }
}

/* The tile of slots [t0, t0 + slots) of KV head h into the scratch (zeros past slots). */
static inline __attribute__((always_inline)) void load_tile(const PCtx *c, Scratch *s, const int32_t *table,
                                                            int h, int t0, int slots, const int dim) {
    for (int t = 0; t < PF_TILE; t++) {
        if (t < slots) {
            const int pos = t0 + t;
            const size_t k_at = cache_index(c, table, h, pos, 0), v_at = cache_index(c, table, h, pos, 1);
            for (int d = 0; d < dim; d++) s->kt[(size_t)d * PF_TILE + t] = load_f32(c->kv, k_at + d, c->is_bf16);
#pragma omp simd
            for (int d = 0; d < dim; d++) s->v[(size_t)t * dim + d] = load_f32(c->kv, v_at + d, c->is_bf16);
        } else {
            for (int d = 0; d < dim; d++) s->kt[(size_t)d * PF_TILE + t] = 0.0f;
#pragma omp simd
            for (int d = 0; d < dim; d++) s->v[(size_t)t * dim + d] = 0.0f;
        }
    }
}

/* Queries [first, first + count) of one sequence, every query head. Row i * group + g is query i's head
 * h * group + g while KV head h is worked on. The queries are in position order, so those still attending
 * a tile are a suffix of the item. */
static inline __attribute__((always_inline)) void attend_item(const PCtx *c, Scratch *s, int first, int count,
                                                              void *out, const int dim) {
    const int group = c->group;
    const int32_t *table = c->tables + (size_t)c->query_seq[first] * c->max_blocks;
    const int longest = item_longest(c, first, count);
    for (int h = 0; h < c->num_kv_heads; h++) {
        for (int i = 0; i < count; i++)
            for (int g = 0; g < group; g++) {
                const size_t at = ((size_t)(first + i) * c->num_heads + (size_t)h * group + g) * dim;
                const size_t own = ((size_t)i * group + g) * dim;
                for (int d = 0; d < dim; d++) {
                    s->q[own + d] = load_f32(c->q, at + d, c->is_bf16) * c->scale;
                    s->acc[own + d] = 0.0f;
                }
                s->max[i * group + g] = -INFINITY;
                s->sum[i * group + g] = 0.0f;
            }
        for (int t0 = 0; t0 < longest; t0 += PF_TILE) {
            load_tile(c, s, table, h, t0, longest - t0 < PF_TILE ? longest - t0 : PF_TILE, dim);
            const int active = mark_tile(c, s, first, count, t0);
            tile_rows(s, active * group, count * group, dim);
        }
        for (int i = 0; i < count; i++)
            for (int g = 0; g < group; g++) {
                const size_t own = (size_t)i * group + g;
                const size_t at = ((size_t)(first + i) * c->num_heads + (size_t)h * group + g) * dim;
                const float weight = 1.0f / s->sum[own], *acc = s->acc + own * dim;
                if (c->is_bf16)
                    for (int d = 0; d < dim; d++) ((uint16_t *)out)[at + d] = f32_to_bf16(acc[d] * weight);
                else
                    for (int d = 0; d < dim; d++) ((float *)out)[at + d] = acc[d] * weight;
            }
    }
}

void prefill_item_fp32(const PCtx *c, Scratch *s, int first, int count, void *out) {
    if (c->head_dim == 64)
        attend_item(c, s, first, count, out, 64);
    else if (c->head_dim == 128)
        attend_item(c, s, first, count, out, 128);
    else
        attend_item(c, s, first, count, out, c->head_dim);
}
