/* The prompt kernel's shared definitions (prefill_fixed.c: the driver; prefill_fp32.c, prefill_bf16.c:
 * the inner loops). */
#ifndef PDSERVE_PREFILL_FIXED_H
#define PDSERVE_PREFILL_FIXED_H

#include <stddef.h>
#include <stdint.h>

#include "numerics.h"

#define PF_TILE 16          /* slots per tile: the lanes of a query head's scores */
#define PF_QUERIES 32       /* queries of one sequence per work item */
#define PF_MAX_HEAD_DIM 256
#define PF_MAX_GROUP 64     /* query heads per KV head */

enum { PF_OK = 0, PF_UNSUPPORTED = -1, PF_NO_MEMORY = -2 };

typedef struct {
    const void *q, *kv;
    const int32_t *tables;    /* [num_seqs, max_blocks] */
    const int32_t *query_seq; /* [n]: the row of tables each query reads */
    const int32_t *query_len; /* [n]: slots each query attends (its position + 1) */
    int max_blocks, num_heads, num_kv_heads, head_dim, block_size, group, is_bf16;
    int amx;                  /* the bf16 path's products on AMX tiles (prefill_amx_ready) */
    size_t row_stride;        /* elements from one slot of a block to the next */
    float scale;              /* softmax scale * log2(e) */
} PCtx;

typedef struct { /* one thread's working memory; a "row" is one query head of one query of the item */
    float kt[PF_MAX_HEAD_DIM * PF_TILE] __attribute__((aligned(64))); /* fp32 path: the tile's K, [dim][slot] */
    float v[PF_TILE * PF_MAX_HEAD_DIM] __attribute__((aligned(64)));  /* fp32 path: the tile's V, [slot][dim] */
    int stride;                     /* rows of the arrays below: the item's rows rounded up, plus 16 */
    float *q, *acc;                 /* [stride][dim]: the query scaled, the unnormalised output */
    float *scores;                  /* [stride][PF_TILE]: scores, then softmax weights */
    float *max, *sum, *alpha;       /* [stride] */
    int *valid;                     /* [stride]: the tile's slots the row attends */
} Scratch;
/* The bf16 path's views of the same memory: the K tile as bf16 pairs [slot][dim / 2] (kt), the V tile as
 * pairs of slots [PF_TILE / 2][dim] (v), the queries as pairs [dim / 2][stride] (q), the softmax weights
 * as bf16 pairs of slots [PF_TILE / 2][stride] (scores). */

#if defined(__AVX512F__)
#include <immintrin.h>

/* The accumulators of rows [r, r + n), n <= 4, dims [d, d + 64), times each row's alpha, into registers. */
static inline __attribute__((always_inline)) void acc_load_scaled(const Scratch *s, int r, const int n, int d,
                                                                  const int dim, __m512 a[4][4]) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            if (i < n)
                a[i][k] = _mm512_mul_ps(_mm512_loadu_ps(s->acc + (size_t)(r + i) * dim + d + 16 * k),
                                        _mm512_set1_ps(s->alpha[r + i]));
}

/* ... and back. */
static inline __attribute__((always_inline)) void acc_store(Scratch *s, int r, const int n, int d, const int dim,
                                                            __m512 a[4][4]) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            if (i < n) _mm512_storeu_ps(s->acc + (size_t)(r + i) * dim + d + 16 * k, a[i][k]);
}
#endif

/* The AMX tile configuration LDTILECFG reads (palette 1): each tile's bytes per row and rows. */
typedef struct __attribute__((packed)) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

void prefill_item_fp32(const PCtx *c, Scratch *s, int first, int count, void *out);
int prefill_bf16_serves(const PCtx *c);
int prefill_amx_ready(void);
void prefill_item_bf16(const PCtx *c, Scratch *s, int first, int count, void *out);

/* Element index of slot `pos`'s K (is_v 0) or V (is_v 1) row of KV head h in the cache, through `table`. */
static inline size_t cache_index(const PCtx *c, const int32_t *table, int h, int pos, int is_v) {
    const int bs = c->block_size;
    return ((size_t)table[pos / bs] * 2 * bs + pos % bs + (size_t)is_v * bs) * c->row_stride + (size_t)h * c->head_dim;
}

/* The longest of queries [first, first + count): how far the item's tiles go. */
static inline int item_longest(const PCtx *c, int first, int count) {
    int longest = 0;
    for (int i = 0; i < count; i++) longest = c->query_len[first + i] > longest ? c->query_len[first + i] : longest;
    return longest;
}

/* Sets the valid slots of the tile at t0 for each row of the queries still attending it, and returns the
 * first such query (the queries are in position order, so those are a suffix of the item). */
static inline int mark_tile(const PCtx *c, Scratch *s, int first, int count, int t0) {
    int active = 0;
    while (c->query_len[first + active] <= t0) active++;
    for (int i = active; i < count; i++) {
        const int len = c->query_len[first + i], valid = len - t0 < PF_TILE ? len - t0 : PF_TILE;
        for (int g = 0; g < c->group; g++) s->valid[i * c->group + g] = valid;
    }
    return active;
}

#endif
