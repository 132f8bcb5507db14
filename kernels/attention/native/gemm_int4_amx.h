/* The AMX path of gemm_int4.c, included there only where the compiler targets AMX (not a header of its own:
 * it uses that file's Int4Weight, Grid, codes_pair, group_scale/offset, accumulate_with and store_row).
 *
 * Per pair of output blocks (32 outputs) a thread turns the codes of every group into bf16 tiles once
 * (`strip`), then runs the rows 32 at a time: per group one TDPBF16PS of the rows' grid inputs with the
 * codes (a fresh sum tile per group: the group's exact dot D), stored into `panel`; then per row and output
 * the groups in ascending order through `accumulate_with`, as the AVX path does. A block of at most 16 rows
 * alternates two sets of sum tiles, so that a group's products need not wait for the last one's store. */

/* Per thread: the strip [2][k / 32][16 x 16 pairs] and the panel [k / 32][32 rows][32 outputs]. */
#define AMX_SCRATCH(k) ((size_t)2 * ((k) / 32) * 1024 + (size_t)((k) / 32) * 32 * 32 * sizeof(float))

/* A weight tile's codes as the tiles' bf16 integers 0..15 (a table lookup per pair of inputs). */
static inline void codes_to_bf16(const uint16_t *codes, __m512i *tile) {
    const __m512i integers = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x4170, 0x4160, 0x4150,
                                              0x4140, 0x4130, 0x4120, 0x4110, 0x4100, 0x40e0, 0x40c0, 0x40a0, 0x4080,
                                              0x4040, 0x4000, 0x3f80, 0x0000); /* bf16 of 15 .. 0 */
    for (int i = 0; i < 16; i++) _mm512_store_si512(tile + i, _mm512_permutexvar_epi16(codes_pair(codes, i), integers));
}

/* Tiles 0-1: 16 rows x 32 grid inputs; 2-3: 16 pairs of inputs x 16 outputs of codes; 4-7: sums. */
static void int4_tiles_configure(void) {
    TileConfig config = {.palette = 1};
    for (int t = 0; t < 8; t++) config.colsb[t] = 64, config.rows[t] = 16;
    _tile_loadconfig(&config);
}

/* Rows tile A times the codes into sum tiles C0 (tile 2's outputs) and C1 (tile 3's), stored at `out`. */
#define INT4_PRODUCTS(C0, C1, A, out)           \
    do {                                        \
        _tile_zero(C0);                         \
        _tile_dpbf16ps(C0, A, 2);               \
        _tile_stored(C0, (out), 128);           \
        if (pair == 2) {                        \
            _tile_zero(C1);                     \
            _tile_dpbf16ps(C1, A, 3);           \
            _tile_stored(C1, (out) + 16, 128);  \
        }                                       \
    } while (0)

/* One group's products for a row block (`two`: more than 16 rows) and one or two output blocks (`pair`), into
 * `sum` ([32 rows][32 outputs]); `odd` groups of a small block use the second set of sum tiles. */
static inline void int4_tiles_group(const uint16_t *a, size_t ld, const __m512i *codes0, const __m512i *codes1,
                                    int pair, int two, int odd, float *sum) {
    _tile_loadd(0, a, ld * 2);
    _tile_loadd(2, codes0, 64);
    if (pair == 2) _tile_loadd(3, codes1, 64);
    if (!two && odd) {
        INT4_PRODUCTS(6, 7, 0, sum);
        return;
    }
    INT4_PRODUCTS(4, 5, 0, sum);
    if (two) {
        _tile_loadd(1, a + 16 * ld, ld * 2);
        INT4_PRODUCTS(6, 7, 1, sum + 16 * 32);
    }
}
#undef INT4_PRODUCTS

/* R rows (`sums`: their dots, row stride 32 floats, group stride 1024; `group_sums`: their S, row stride
 * k / 32) through output block nb: per group the scales and offsets read once for the R rows, then
 * `accumulate_with` per row, groups in ascending order, as the AVX path does. */
static inline __attribute__((always_inline)) void epilogue(const int R, const Int4Weight *w, int nb, const float *sums,
                                                           const float *group_sums, uint16_t *out) {
    const int kb = w->k / 32;
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < kb; b++) {
        const uint16_t *params = w->params + ((size_t)nb * kb + b) * 32;
        const __m512 scale = group_scale(params), offset = group_offset(params);
        for (int r = 0; r < R; r++)
            acc[r] = accumulate_with(acc[r], _mm512_load_ps(sums + (size_t)b * 1024 + r * 32), scale, offset,
                                     group_sums[(size_t)r * kb + b]);
    }
    for (int r = 0; r < R; r++) store_row(acc[r], w, nb * 16, out + (size_t)r * w->n);
}

/* Every output block for every row (grid padded with zero rows to a multiple of 32); called inside the
 * parallel region, the pairs of output blocks shared out by `omp for`. */
static void amx_columns(const Int4Weight *w, const Grid *grid, int m, char *scratch, uint16_t *out) {
    const int k = w->k, kb = k / 32, blocks = w->n / 16, pairs = (blocks + 1) / 2;
    __m512i *strip = (__m512i *)scratch;
    float *panel = (float *)(scratch + (size_t)2 * kb * 1024);
    int configured = 0;
#pragma omp for schedule(static)
    for (int p = 0; p < pairs; p++) {
        const int nb = 2 * p, pair = nb + 1 < blocks ? 2 : 1;
        if (!configured) int4_tiles_configure(), configured = 1;
        for (int c = 0; c < pair; c++)
            for (int b = 0; b < kb; b++)
                codes_to_bf16(w->codes + ((size_t)(nb + c) * kb + b) * 128, strip + ((size_t)c * kb + b) * 16);
        for (int first = 0; first < m; first += 32) {
            const int rows = m - first < 32 ? m - first : 32;
            for (int b = 0; b < kb; b++)
                int4_tiles_group(grid->values + (size_t)first * k + b * 32, (size_t)k, strip + (size_t)b * 16,
                                 strip + ((size_t)kb + b) * 16, pair, rows > 16, b % 2, panel + (size_t)b * 1024);
            for (int c = 0; c < pair; c++)
                for (int r0 = 0; r0 < rows; r0 += 8) {
                    const float *sums = panel + c * 16 + r0 * 32;
                    const float *group_sums = grid->sums + (size_t)(first + r0) * kb;
                    uint16_t *rows_out = out + (size_t)(first + r0) * w->n;
                    switch (rows - r0 < 8 ? rows - r0 : 8) {
#define EPILOGUE_ROWS(R)                                                          \
    case R: epilogue(R, w, nb + c, sums, group_sums, rows_out); \
        break;
                        EPILOGUE_ROWS(1) EPILOGUE_ROWS(2) EPILOGUE_ROWS(3) EPILOGUE_ROWS(4)
                        EPILOGUE_ROWS(5) EPILOGUE_ROWS(6) EPILOGUE_ROWS(7) EPILOGUE_ROWS(8)
#undef EPILOGUE_ROWS
                    }
                }
        }
    }
    if (configured) _tile_release();
}
