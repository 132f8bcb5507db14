/* Fixed-order paged attention for the prompt rows of a step (the deterministic mode), K and V read
 * straight from the paged cache [num_blocks, 2, block_size, num_kv_heads, head_dim] (contiguous).
 *
 * A query row (a prompt position p of its sequence) attends the slots 0..p of its sequence. Its result
 * depends on its row and those slots only: slots are taken in tiles of 16 aligned to slot 0, ascending;
 * per tile and query head the scores, the online softmax (fp32, base-2 exponentials) and P.V over the
 * tile's slots in order. Up to PF_QUERIES consecutive queries of one sequence form a work item and share
 * each tile's K and V, laid out once per tile; which queries share an item, where the prompt's chunk
 * starts, how many rows the step holds and which thread runs the item change none of a query's
 * operations. So a prompt row gets the same bits however its prompt is chunked, after any prefix hit,
 * whatever shares its step. Slots past a query's length are masked out of its scores (a select, not a
 * product) and never enter its P.V, so whatever they hold cannot reach it.
 *
 * This file is the driver (work items, threads, memory). The inner loops: prefill_bf16.c for a bf16 cache
 * where the CPU has AVX512-BF16 and the head dim is a multiple of 64 (bf16 dot products, the weights
 * rounded to bf16 for P.V), else prefill_fp32.c (fp32 arithmetic; AVX-512 or portable C). A process runs
 * one of them for every prompt row, so its rows are invariant either way.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "prefill_fixed.h"

/* 1 when the kernel serves this shape, else 0. */
int prefill_fixed_supports(int num_heads, int num_kv_heads, int head_dim, int block_size) {
    if (num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads || head_dim <= 0 || block_size <= 0) return 0;
    return num_heads / num_kv_heads <= PF_MAX_GROUP && head_dim <= PF_MAX_HEAD_DIM;
}

static int run(PCtx *c, void *out, int n, int num_threads) {
    if (!prefill_fixed_supports(c->num_heads, c->num_kv_heads, c->head_dim, c->block_size)) return PF_UNSUPPORTED;
    if (n <= 0) return PF_OK;
    for (int i = 0; i < n; i++)
        if (c->query_len[i] < 1) return PF_UNSUPPORTED;
    if (num_threads < 1) num_threads = 1;
    c->group = c->num_heads / c->num_kv_heads;
    c->row_stride = (size_t)c->num_kv_heads * c->head_dim;
    c->scale *= LOG2E;
    /* Work items: runs of at most PF_QUERIES consecutive queries of one sequence. */
    int *starts = malloc(sizeof(int) * ((size_t)n + 1));
    if (!starts) return PF_NO_MEMORY;
    int items = 0;
    for (int i = 0; i < n; i++)
        if (i == 0 || c->query_seq[i] != c->query_seq[i - 1] || i - starts[items - 1] == PF_QUERIES)
            starts[items++] = i;
    starts[items] = n;
    const int bf16 = prefill_bf16_serves(c);
    c->amx = bf16 && prefill_amx_ready();
    const size_t rows = ((size_t)PF_QUERIES * c->group + 15) / 16 * 16 + 16, state = rows * c->head_dim;
    const size_t floats = 2 * state + rows * PF_TILE + 3 * rows; /* a multiple of 16: 64-byte aligned parts */
    Scratch *scratch = aligned_alloc(64, sizeof(Scratch) * (size_t)num_threads);
    float *buffers = aligned_alloc(64, sizeof(float) * (size_t)num_threads * floats + 64);
    int *valid = malloc(sizeof(int) * (size_t)num_threads * rows);
    if (!scratch || !buffers || !valid) {
        free(starts), free(scratch), free(buffers), free(valid);
        return PF_NO_MEMORY;
    }
    for (int k = 0; k < num_threads; k++) {
        float *own = buffers + (size_t)k * floats;
        scratch[k].scores = own; /* first: 64-byte aligned (floats is a multiple of 16) */
        scratch[k].q = own + rows * PF_TILE;
        scratch[k].acc = scratch[k].q + state;
        scratch[k].max = scratch[k].acc + state;
        scratch[k].sum = scratch[k].max + rows;
        scratch[k].alpha = scratch[k].sum + rows;
        scratch[k].valid = valid + (size_t)k * rows;
        scratch[k].stride = (int)rows;
    }
#pragma omp parallel num_threads(num_threads) if (items > 1)
    {
#if defined(_OPENMP)
        Scratch *s = scratch + omp_get_thread_num();
#else
        Scratch *s = scratch;
#endif
#pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < items; item++)
            if (bf16)
                prefill_item_bf16(c, s, starts[item], starts[item + 1] - starts[item], out);
            else
                prefill_item_fp32(c, s, starts[item], starts[item + 1] - starts[item], out);
    }
    free(starts), free(scratch), free(buffers), free(valid);
    return PF_OK;
}

#define DEFINE_PREFILL(NAME, T, IS_BF16)                                                                        \
    int NAME(const T *q, const T *kv_cache, const int32_t *block_tables, const int32_t *query_seq,               \
             const int32_t *query_len, int n, int max_blocks, int num_heads, int num_kv_heads, int head_dim,     \
             int block_size, float scale, T *out, int num_threads) {                                             \
        PCtx c = {.q = q, .kv = kv_cache, .tables = block_tables, .query_seq = query_seq,                        \
                  .query_len = query_len, .max_blocks = max_blocks, .num_heads = num_heads,                      \
                  .num_kv_heads = num_kv_heads, .head_dim = head_dim, .block_size = block_size,                  \
                  .is_bf16 = IS_BF16, .scale = scale};                                                           \
        return run(&c, out, n, num_threads);                                                                     \
    }

/* out[i, h, :] = softmax(scale * q[i, h] . K) V over the first query_len[i] >= 1 slots of the sequence
 * whose block table is row query_seq[i] of block_tables ([num_seqs, max_blocks]); query head h reads KV
 * head h / (num_heads / num_kv_heads). q and out are [n, num_heads, head_dim], contiguous; the slots
 * must hold their K/V already. Queries of one sequence should be consecutive (they then share tiles). Runs
 * on up to num_threads OpenMP threads. Returns 0, or a negative code having written nothing: -1
 * unsupported shape or a query_len below 1, -2 out of memory. Block ids are not bound-checked here. */
DEFINE_PREFILL(prefill_fixed_bf16, uint16_t, 1)
DEFINE_PREFILL(prefill_fixed_f32, float, 0)
