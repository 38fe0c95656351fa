"""C source of the GEMV kernels on AMX-BF16 tiles (see :mod:`tts_common.kernels.gemv`).

``gemv_bf16amx`` (bf16 ``x`` and ``w``) and ``gemv_i8amx`` (float32 ``x`` split exactly into
three bf16, int8 ``w`` widened to bf16) run the bf16 dot product's packed layout (pairs of k,
:mod:`.gemv_source`) on AMX-BF16 tiles, where the CPU has them and the OS grants the tile state
(``has_amx_bf16``): a tile instruction takes up to 16 rows at once, so 8 rows cost about what
one does. Compiled after :mod:`.gemv_source` (``G``, ``store_group``) and :mod:`.pool_source`
(``share``); where the build lacks AMX only ``has_amx_bf16`` (returning 0) is defined.
"""

SOURCE = r"""
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
/* AMX-BF16 on the bf16 dot product's packed layout (``gemv-bf16amx``): a pair-row of a group is
   64 bytes ([16][2] bf16), so 16 pairs (32 k) of a group are one 16 x 64-byte B tile, read as
   they lie; up to 16 rows of x (32 k each) are the A tile; TDPBF16PS adds their products into a
   16 rows x 16 outputs float32 tile. Each output sums its k blocks in increasing order into its
   own tile element (a K % 32 tail from a zero-padded copy of x last), whatever the rows: a tile
   element depends only on its own row of A, so the row count (the tile's configured rows) never
   changes a bit. Two groups per pass (two accumulator tiles, one A tile) so that two TDPBF16PS
   chains are in flight. Why: the instruction does 16 rows of a 1 KiB weight block in one go, so
   8 rows cost about what one does (the weights are read once), where the AVX-512 dot product
   pays an instruction per row. */
#include <sys/syscall.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

#define AMX_ROWS 16
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* The OS must grant the process AMX's tile state (Linux >= 5.16); torch may have done it. */
int has_amx_bf16(void) {
    static atomic_int state; /* 0 not asked, 1 granted, -1 refused */
    int s = atomic_load(&state);
    if (s == 0) {
        s = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        atomic_store(&state, s);
    }
    return s > 0;
}

/* Tiles: 0, 1 accumulators (two groups); 2 the A block; 3, 4 the groups' B blocks; 5-7 the same
   for the K tail of tail_pairs pairs (none where K % 32 == 0). */
static void amx_configure(int rows, int tail_pairs) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 3; ++t) { c.rows[t] = (uint8_t)rows; c.colsb[t] = 64; }
    for (int t = 3; t < 5; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
    if (tail_pairs) {
        c.rows[5] = (uint8_t)rows; c.colsb[5] = (uint16_t)(4 * tail_pairs);
        for (int t = 6; t < 8; ++t) { c.rows[t] = (uint8_t)tail_pairs; c.colsb[t] = 64; }
    }
    _tile_loadconfig(&c);
}

/* The accumulator tiles 0 (and 1 when ``two``) of groups g, g + 1 for rows r0..r0+rows-1 into y,
   scaled and biased (both AMX kernels' epilogue). */
static inline void amx_store_groups(const gemv_args* a, float acc[2][AMX_ROWS * G], int two, int g,
                                    int r0, int rows) {
    _tile_stored(0, acc[0], 64);
    if (two) _tile_stored(1, acc[1], 64);
    for (int i = 0; i <= two; ++i)
        for (int r = 0; r < rows; ++r) {
            __m512 v = _mm512_load_ps(acc[i] + r * G);
            store_group(a->y + (long)(r0 + r) * a->N, a->N, (g + i) * G, 1, &v, a->scale, a->bias);
        }
}

static void bf16amx_groups(const gemv_args* a, int begin, int end) {
    const uint16_t* x = a->x; const uint16_t* w = a->w; int R = a->R, K = a->K;
    long gstride = (long)((K + 1) / 2) * 2 * G;
    int kfull = K & ~31, tail_pairs = (K - kfull + 1) / 2;
    uint16_t xtail[AMX_ROWS * 32] __attribute__((aligned(64)));
    float acc[2][AMX_ROWS * G] __attribute__((aligned(64)));
    int configured = 0;
    /* The tile configuration is loaded per call (not cached per thread): other code on this
       thread (oneDNN) may have loaded its own since. */
    for (int r0 = 0; r0 < R; r0 += AMX_ROWS) {
        int rows = R - r0 < AMX_ROWS ? R - r0 : AMX_ROWS;
        if (rows != configured) { amx_configure(rows, tail_pairs); configured = rows; }
        const uint16_t* xb = x + (long)r0 * K;
        if (tail_pairs) {
            memset(xtail, 0, sizeof xtail);
            for (int r = 0; r < rows; ++r)
                memcpy(xtail + r * 32, xb + (long)r * K + kfull, (size_t)(K - kfull) * 2);
        }
        for (int g = begin; g < end; g += 2) {
            int two = g + 1 < end;
            const uint16_t* w0 = w + (long)g * gstride;
            const uint16_t* w1 = w0 + gstride;
            _tile_zero(0);
            _tile_zero(1);
            for (int k = 0; k < kfull; k += 32) {
                _tile_loadd(2, xb + k, 2 * K);
                _tile_loadd(3, w0 + (long)k * G, 64);
                _tile_dpbf16ps(0, 2, 3);
                if (two) {
                    _tile_loadd(4, w1 + (long)k * G, 64);
                    _tile_dpbf16ps(1, 2, 4);
                }
            }
            if (tail_pairs) {
                _tile_loadd(5, xtail, 64);
                _tile_loadd(6, w0 + (long)kfull * G, 64);
                _tile_dpbf16ps(0, 5, 6);
                if (two) {
                    _tile_loadd(7, w1 + (long)kfull * G, 64);
                    _tile_dpbf16ps(1, 5, 7);
                }
            }
            amx_store_groups(a, acc, two, g, r0, rows);
        }
    }
    _tile_release(); /* the tile state back to init: no 8 KiB to save at a context switch */
}

void gemv_bf16amx(const uint16_t* x, const uint16_t* w, const float* scale, const float* bias, float* y,
                  int R, int K, int N, int nthreads) {
    gemv_args a = {x, w, scale, bias, y, R, K, N};
    share(bf16amx_groups, &a, (N + G - 1) / G, 2, nthreads);
}

/* Tiles of the int8 kernel: 0, 1 accumulators (two groups); 2-4 x's h, m, l blocks; 5, 6 the
   groups' widened B blocks. */
static void amx_configure_i8(int rows) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 5; ++t) { c.rows[t] = (uint8_t)rows; c.colsb[t] = 64; }
    for (int t = 5; t < 7; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
    _tile_loadconfig(&c);
}

/* int8 weights with float32 activations on AMX-BF16 tiles (``gemv-int8amx``), exactly: each x
   is split into three bf16, x = h + m + l (h = bf16(x), m = bf16(x - h), l = x - h - m: 8 + 8 + 8
   significant bits, exact but for values below 2^-110 that the conversion flushes), and an int8
   weight is a bf16 exactly, so every product is exact and TDPBF16PS sums them in float32: the
   same precision as the FMA kernel (float32 sums of exact products: float32 rounding apart).
   Weights are packed in pairs of k ([ceil(K/2)][16][2] int8 per group, zero-padded) and widened
   block by block (16 pairs x 16 outputs, 512 weights) into a 1 KiB B tile on the stack. Per
   output: k blocks of 32 in increasing order, each adding h's products, then m's, then l's, into
   its tile element; x is zero-padded to whole blocks. Rows never share a tile element, so the
   row count never changes a bit. Why: at 8 rows the FMA kernel issues 8 FMAs per 16 weights
   (compute-bound near the memory floor on a busy host); here 8 rows cost the widening plus three
   tile products per block, as one row does. */
static void split_x(const float* x, uint16_t* xs, int R, int K, int Kp) {
    long plane = (long)R * Kp;
    for (int r = 0; r < R; ++r)
        for (int k = 0; k < Kp; k += 16) {
            __m512 v = _mm512_maskz_loadu_ps(tail_mask(K - k), x + (long)r * K + k);
            __m256i parts[3];
            for (int i = 0; i < 3; ++i) {
                parts[i] = (__m256i)_mm512_cvtneps_pbh(v);
                __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(parts[i]), 16));
                v = _mm512_sub_ps(v, back);
                _mm256_storeu_si256((__m256i*)(xs + i * plane + (long)r * Kp + k), parts[i]);
            }
        }
}

/* 16 pair-rows of int8 ([16][2] each, 32 bytes) widened to bf16 (64 bytes each); pairs past
   ``pairs`` are zero. */
static inline void widen_block_i8(const int8_t* wb, int pairs, uint16_t* out) {
    for (int q = 0; q < 16; ++q) {
        __m512i v;
        if (q < pairs) {
            v = (__m512i)_mm512_cvtne2ps_pbh(load_w16_i8(wb + q * 32 + 16), load_w16_i8(wb + q * 32));
        } else {
            v = _mm512_setzero_si512();
        }
        _mm512_store_si512(out + q * 32, v);
    }
}

static void i8amx_groups(const gemv_args* a, int begin, int end) {
    const uint16_t* xs = a->x; const int8_t* w = a->w; int R = a->R, K = a->K;
    int P = (K + 1) / 2, Kp = (K + 31) & ~31;
    long gstride = (long)P * 2 * G, plane = (long)R * Kp;
    uint16_t wbuf[2][16 * 32] __attribute__((aligned(64)));
    float acc[2][AMX_ROWS * G] __attribute__((aligned(64)));
    int configured = 0;
    for (int r0 = 0; r0 < R; r0 += AMX_ROWS) {
        int rows = R - r0 < AMX_ROWS ? R - r0 : AMX_ROWS;
        if (rows != configured) { amx_configure_i8(rows); configured = rows; }
        const uint16_t* xh = xs + (long)r0 * Kp;
        for (int g = begin; g < end; g += 2) {
            int two = g + 1 < end;
            const int8_t* w0 = w + (long)g * gstride;
            const int8_t* w1 = w0 + gstride;
            _tile_zero(0);
            _tile_zero(1);
            for (int k = 0; k < Kp; k += 32) {
                int pairs = P - k / 2 < 16 ? P - k / 2 : 16;
                _tile_loadd(2, xh + k, 2 * Kp);
                _tile_loadd(3, xh + plane + k, 2 * Kp);
                _tile_loadd(4, xh + 2 * plane + k, 2 * Kp);
                widen_block_i8(w0 + (long)k * G, pairs, wbuf[0]);
                _tile_loadd(5, wbuf[0], 64);
                _tile_dpbf16ps(0, 2, 5);
                _tile_dpbf16ps(0, 3, 5);
                _tile_dpbf16ps(0, 4, 5);
                if (two) {
                    widen_block_i8(w1 + (long)k * G, pairs, wbuf[1]);
                    _tile_loadd(6, wbuf[1], 64);
                    _tile_dpbf16ps(1, 2, 6);
                    _tile_dpbf16ps(1, 3, 6);
                    _tile_dpbf16ps(1, 4, 6);
                }
            }
            amx_store_groups(a, acc, two, g, r0, rows);
        }
    }
    _tile_release();
}

/* Returns 0, or -1 (y untouched) where the split activations' buffer cannot be allocated. */
int gemv_i8amx(const float* x, const int8_t* w, const float* scale, const float* bias, float* y,
               int R, int K, int N, int nthreads) {
    int Kp = (K + 31) & ~31;
    uint16_t* xs = aligned_alloc(64, ((size_t)3 * R * Kp * 2 + 63) & ~(size_t)63);
    if (!xs) return -1;
    split_x(x, xs, R, K, Kp);
    gemv_args a = {xs, w, scale, bias, y, R, K, N};
    share(i8amx_groups, &a, (N + G - 1) / G, 2, nthreads);
    free(xs);
    return 0;
}
#else
int has_amx_bf16(void) { return 0; }
#endif
"""
