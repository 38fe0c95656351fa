"""C source of our weight-streaming GEMV/small-GEMM (see :mod:`tts_common.kernels.gemv`): the FMA
kernels on the 16-lane vector of :mod:`.vec_source` (AVX-512 or AVX2), the bf16 dot product on
AVX512-BF16 only.

Kept as a string so the package needs no package-data and the build hashes exactly what it
compiles. ``y[r, n] = scale[n] * sum_k x[r, k] * w[n, k] + bias[n]`` with fp32 ``x``/``y`` and
float32, int8 or bfloat16 ``w`` (``scale`` only for int8), or bf16 ``x`` with bf16 or int8 ``w``
and the bf16 dot product.

Packed layout (``gemv_f32``, ``gemv_i8``, ``gemv_bf16``, ``gemv_bf16dp``, ``gemv_i8dp``): the
weight is pre-packed at load in groups of 16 output channels, k-major, one vector lane per channel
(:func:`.gemv.pack_weight`). A step loads 16 channels' weights for one k (two for the dot
product) and multiplies them by that k's activation broadcast, so no horizontal reduction is
needed, each thread streams contiguous memory, and one weight load (and widening) serves up to
8 rows (``RB``). Why: at one row the earlier row-wise kernel spent its time in the per-output
reductions and the short 1 KiB rows, reading int8 weights at 10-17 GB/s on the dev EPYC; packed,
22-28 GB/s (``bench/gemv_bench.py``); and with 4 rows a pass, 8 rows read the weights twice and
cost about twice one row on the dev Xeon.

The float32 kernel (``gemv_f32``) is the same loop on weights that need no widening: where the
model stays in float32 (the default, and ``auto`` on a CPU without bf16 arithmetic) the library
kernels read them at half the machine's bandwidth at one row (oneDNN 14 GB/s, this kernel 26.5
against a 30 GB/s sum on an AVX2 EPYC, Zen 3), and it lets a float32 stack run fused
(:mod:`.fused_stack`).

Each output sums in one order whatever the rows: two accumulators by k mod 2 (pairs of k for the
dot product), then ``a0 + a1``, or on AVX2 for float32 and bf16 weights one accumulator over k in
order (``DEFINE_GROUP_ONE_ACC``); the scale and bias are applied after. So a row's result never
depends on its batch or which rows share its pass. Groups are shared, two at a time, between the
calling thread and our own workers (:mod:`.pool_source`; each output is computed alone, so the
split never changes a bit). A thread runs one group at a time, so it streams one contiguous run
of weights: at one and two rows, two groups at once (more FMA chains) read 10-25% slower on the
dev EPYC (Zen 4), weights in L3 or not (side by side in one process, 15-40 rounds).

``gemv_bf16dp_rows`` keeps the row-wise dot-product kernel (weights as given): on the dev EPYC it
reads bf16 weights faster at one row and slower at eight; the kernel choice measures both.

The AMX kernels on the same packed layout are :mod:`.amx_source`; the work sharing (``share``,
``gemv_args``) is :mod:`.pool_source` and the vector (``v16``, ``tail_mask``) :mod:`.vec_source`,
both compiled before this (:data:`.gemv.LIBRARY_SOURCE`). Internals other C code may call:
``group_f32``, ``group_i8``, ``group_bf16``, ``group_bf16dp``, ``group_i8dp`` (one group, up to
``RB`` rows) and ``store_group``.
"""

SOURCE = r"""
#include <stdlib.h>

#define G 16   /* outputs per packed group: one vector lane each */
#define RB 8   /* rows per call of a group: 8 rows x 2 accumulators fill 16 of AVX-512's 32 registers */
/* Rows per pass over a group's weights: all 8 on AVX-512; on AVX2 (16 registers, a v16 is two;
   int8 only there, see DEFINE_GROUP_ONE_ACC) 3 rows x 2 accumulators x 2 halves, the two halves
   of the weight and the broadcast fill 15. */
#define RB_PASS (VEC_AVX512 ? RB : 3)
#define PREFETCH 256  /* k steps ahead (4 KiB of int8): measured best of 0/64/256/512 at 8 rows */

/* Packed weights: group g holds outputs 16g..16g+15 as [K][16] (k-major, one lane per output;
   missing outputs of the last group are zero). acc[r][j] sums the k = j (mod 2) in increasing
   order, then a0 + a1: one order per output, for any row count or pass.
   Two accumulators (not four) so that all 8 rows of a pass stay in registers: one weight load and
   widening then serves 8 FMAs, and 8 rows cost one pass over the weights; at one row two chains
   of FMAs still retire 16 weights every 2 cycles, above what memory delivers (and more chains,
   two groups at once, measured slower). Lines are prefetched one by one (the bf16 stream has two
   per 4 k). */
/* The lines of weights 4 k of a group take, PREFETCH k ahead of k. */
#define PREFETCH_4K(WG, K, WT)                                                                 \
    for (int l = 0; l < (int)(4 * G * sizeof(WT)); l += 64)                                    \
        _mm_prefetch((const char*)((WG) + (long)((K) + PREFETCH) * G) + l, _MM_HINT_T0)
#define DEFINE_GROUP(NAME, WT, LOADW)                                                          \
static inline __attribute__((always_inline))                                                   \
void NAME##_pass(const float* x, const WT* wg, int rows, int K, v16* out) {                     \
    v16 acc[RB_PASS][2];                                                                       \
    for (int r = 0; r < RB_PASS; ++r) acc[r][0] = acc[r][1] = v16_zero();                      \
    int k = 0;                                                                                 \
    for (; k + 4 <= K; k += 4) {                                                               \
        PREFETCH_4K(wg, k, WT);                                                                \
        for (int j = 0; j < 4; ++j) {                                                          \
            v16 w = LOADW(wg + (long)(k + j) * G);                                             \
            for (int r = 0; r < rows; ++r)                                                     \
                acc[r][j & 1] = v16_fmadd(v16_set1(x[(long)r * K + k + j]), w, acc[r][j & 1]); \
        }                                                                                      \
    }                                                                                          \
    for (; k < K; ++k) {                                                                       \
        v16 w = LOADW(wg + (long)k * G);                                                       \
        for (int r = 0; r < rows; ++r)                                                         \
            acc[r][k & 1] = v16_fmadd(v16_set1(x[(long)r * K + k]), w, acc[r][k & 1]);         \
    }                                                                                          \
    for (int r = 0; r < rows; ++r) out[r] = v16_add(acc[r][0], acc[r][1]);                     \
}                                                                                              \
/* Up to RB rows, in passes of RB_PASS. */                                                     \
static inline __attribute__((always_inline))                                                   \
void NAME(const float* x, const WT* wg, int rows, int K, v16 out[RB]) {                        \
    for (int r0 = 0; r0 < rows; r0 += RB_PASS)                                                 \
        NAME##_pass(x + (long)r0 * K, wg, rows - r0 < RB_PASS ? rows - r0 : RB_PASS, K, out + r0); \
}

#if VEC_AVX512
#define DEFINE_GROUP_ONE_ACC DEFINE_GROUP
#else
/* AVX2, for weights of 2 and 4 bytes: each output sums its k in increasing order in one
   accumulator (one per row and 8-lane half), whatever the rows or pass, so that 6 rows fit a
   pass (12 accumulators, the weight's two halves and the broadcast: 15 registers) and 8 rows
   take two passes (6 + 2) instead of three. Side by side (bench/kernel_ab.py, Zen 3, 10 rounds):
   8 rows read float32 weights at 18.9 GB/s against 14.4, bf16 at 13.5 against 8.8, one row as
   fast as with two accumulators (23.8/24.4 GB/s). Not for int8: at one row its two chains,
   each a k per FMA latency, then read 16 bytes a k too slowly (22.0 against 25.3 GB/s). Each
   pass gets its row count as a constant (the k loop then has no test per row). */
#define RB_PASS_ONE_ACC 6
#define DEFINE_GROUP_ONE_ACC(NAME, WT, LOADW)                                                  \
static inline __attribute__((always_inline))                                                   \
void NAME##_pass(const float* x, const WT* wg, int rows, int K, v16* out) {                     \
    __m256 lo[RB_PASS_ONE_ACC], hi[RB_PASS_ONE_ACC];                                           \
    for (int r = 0; r < RB_PASS_ONE_ACC; ++r) lo[r] = hi[r] = _mm256_setzero_ps();             \
    int k = 0;                                                                                 \
    for (; k + 4 <= K; k += 4) {                                                               \
        PREFETCH_4K(wg, k, WT);                                                                \
        for (int j = 0; j < 4; ++j) {                                                          \
            v16 w = LOADW(wg + (long)(k + j) * G);                                             \
            for (int r = 0; r < rows; ++r) {                                                   \
                __m256 b = _mm256_broadcast_ss(x + (long)r * K + k + j);                       \
                lo[r] = _mm256_fmadd_ps(b, w.lo, lo[r]);                                       \
                hi[r] = _mm256_fmadd_ps(b, w.hi, hi[r]);                                       \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    for (; k < K; ++k) {                                                                       \
        v16 w = LOADW(wg + (long)k * G);                                                       \
        for (int r = 0; r < rows; ++r) {                                                       \
            __m256 b = _mm256_broadcast_ss(x + (long)r * K + k);                               \
            lo[r] = _mm256_fmadd_ps(b, w.lo, lo[r]);                                           \
            hi[r] = _mm256_fmadd_ps(b, w.hi, hi[r]);                                           \
        }                                                                                      \
    }                                                                                          \
    for (int r = 0; r < rows; ++r) { out[r].lo = lo[r]; out[r].hi = hi[r]; }                   \
}                                                                                              \
static inline __attribute__((always_inline))                                                   \
void NAME(const float* x, const WT* wg, int rows, int K, v16 out[RB]) {                        \
    switch (rows) {                                                                            \
        case 8: NAME##_pass(x, wg, 6, K, out); NAME##_pass(x + 6L * K, wg, 2, K, out + 6); break; \
        case 7: NAME##_pass(x, wg, 6, K, out); NAME##_pass(x + 6L * K, wg, 1, K, out + 6); break; \
        case 6: NAME##_pass(x, wg, 6, K, out); break;                                          \
        case 5: NAME##_pass(x, wg, 5, K, out); break;                                          \
        case 4: NAME##_pass(x, wg, 4, K, out); break;                                          \
        case 3: NAME##_pass(x, wg, 3, K, out); break;                                          \
        case 2: NAME##_pass(x, wg, 2, K, out); break;                                          \
        default: NAME##_pass(x, wg, 1, K, out); break;                                         \
    }                                                                                          \
}
#endif

DEFINE_GROUP(group_i8, int8_t, load_w16_i8)
DEFINE_GROUP_ONE_ACC(group_bf16, uint16_t, load_w16_bf16)
DEFINE_GROUP_ONE_ACC(group_f32, float, load_w16_f32)

static inline void store_group(float* y, long N, int n0, int rows, const v16* out,
                               const float* scale, const float* bias) {
    m16 m = tail_mask(N - n0);
    v16 s = scale ? v16_load(m, scale + n0) : v16_set1(1.0f);
    v16 b = bias ? v16_load(m, bias + n0) : v16_zero();
    for (int r = 0; r < rows; ++r) {
        v16 v = v16_mul(out[r], s);
        if (bias) v = v16_add(v, b);
        v16_store(y + (long)r * N + n0, m, v);
    }
}


/* The kernel NAME over packed groups: x of XT, weights of WT, KP x 16 weights a group (KP: K, or
   K rounded up to whole pairs for the dot product). */
#define DEFINE_KERNEL(NAME, GROUP, XT, WT, KP)                                                 \
static void NAME##_groups(const gemv_args* a, int begin, int end) {                            \
    const XT* x = a->x; const WT* w = a->w; int R = a->R, K = a->K, N = a->N;                  \
    for (int g = begin; g < end; ++g) {                                                        \
        const WT* wg = w + (long)g * (KP) * G;                                                 \
        for (int r0 = 0; r0 < R; r0 += RB) {                                                   \
            int rows = R - r0 < RB ? R - r0 : RB;                                              \
            v16 out[RB];                                                                       \
            const XT* xb = x + (long)r0 * K;                                                   \
            /* A constant row count per call: the accumulators stay in registers. */           \
            switch (rows) {                                                                    \
                case 8: GROUP(xb, wg, 8, K, out); break;                                       \
                case 7: GROUP(xb, wg, 7, K, out); break;                                       \
                case 6: GROUP(xb, wg, 6, K, out); break;                                       \
                case 5: GROUP(xb, wg, 5, K, out); break;                                       \
                case 4: GROUP(xb, wg, 4, K, out); break;                                       \
                case 3: GROUP(xb, wg, 3, K, out); break;                                       \
                case 2: GROUP(xb, wg, 2, K, out); break;                                       \
                default: GROUP(xb, wg, 1, K, out); break;                                      \
            }                                                                                  \
            store_group(a->y + (long)r0 * N, N, g * G, rows, out, a->scale, a->bias);          \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
void NAME(const XT* x, const WT* w, const float* scale, const float* bias, float* y,           \
          int R, int K, int N, int nthreads) {                                                 \
    gemv_args a = {x, w, scale, bias, y, R, K, N};                                             \
    share(NAME##_groups, &a, (N + G - 1) / G, 2, nthreads);                                    \
}

DEFINE_KERNEL(gemv_i8, group_i8, float, int8_t, K)
DEFINE_KERNEL(gemv_bf16, group_bf16, float, uint16_t, K)
DEFINE_KERNEL(gemv_f32, group_f32, float, float, K)

#ifdef __AVX512BF16__
/* bf16 x and w, the dot-product instruction: group g is [ceil(K/2)][16][2] (pairs of k per
   lane; a missing k is zero). acc[r][j] sums pairs p = 4i + j, the tail into acc[r][0], then
   (a0 + a1) + (a2 + a3). All rows (up to RB) in one pass, four accumulators each: two
   accumulators (as DEFINE_GROUP) ran one row at 60% of this speed on weights in cache. The 32
   accumulators of 8 rows leave no register for the weights and the broadcast, so the compiler
   spills a few; that still reads 9-21% more GB/s at 8 rows than two passes of 4 rows, which
   streamed each group twice (24.5-25.9 against 20.3-23.3 GB/s), and the same at 1 and 4 rows
   (bench/kernel_ab.py, Zen 4, side by side). With AMX, gemv_bf16amx is the fast one at 8 rows. */
static inline __m512i x_pair(const uint16_t* xr, int k, int K) {
    uint32_t lo = xr[k], hi = k + 1 < K ? xr[k + 1] : 0;
    return _mm512_set1_epi32((int)(lo | (hi << 16)));
}
/* x_pair where k + 1 < K: one dword load, broadcast */
static inline __m512bh x_pair_in(const uint16_t* xr, int k) {
    int xi; memcpy(&xi, xr + k, 4);
    return (__m512bh)_mm512_set1_epi32(xi);
}
static inline __attribute__((always_inline))
void group_bf16dp(const uint16_t* x, const uint16_t* wg, int rows, int K, __m512 out[RB]) {
    __m512 acc[RB][4];
    for (int r = 0; r < RB; ++r)
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
    int P = (K + 1) / 2, p = 0;
    for (; p + 4 <= P && 2 * p + 8 <= K; p += 4) {
        /* Every line of the stream, 8 KiB ahead: measured best at 8 rows of 0/1-in-4/all lines at
           2-16 KiB ahead, and within noise of none at one row. */
        for (int q = 0; q < 4; ++q) _mm_prefetch((const char*)(wg + (long)(p + 128 + q) * 2 * G), _MM_HINT_T0);
        for (int j = 0; j < 4; ++j) {
            __m512bh w = (__m512bh)_mm512_loadu_si512(wg + (long)(p + j) * 2 * G);
            for (int r = 0; r < rows; ++r)
                acc[r][j] = _mm512_dpbf16_ps(acc[r][j], x_pair_in(x + (long)r * K, 2 * (p + j)), w);
        }
    }
    for (; p < P; ++p) {
        __m512bh w = (__m512bh)_mm512_loadu_si512(wg + (long)p * 2 * G);
        for (int r = 0; r < rows; ++r)
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)x_pair(x + (long)r * K, 2 * p, K), w);
    }
    for (int r = 0; r < rows; ++r)
        out[r] = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
}
DEFINE_KERNEL(gemv_bf16dp, group_bf16dp, uint16_t, uint16_t, (K + 1) / 2 * 2)
/* The row-wise layout (``gemvrow-bf16dp``): w as given, [N][K]; one output at a time, four
   accumulators over k in steps of 128, then steps of 32 into the first, a fixed 16-lane
   reduction and a scalar tail. */
#define ROWS_RB 4 /* rows per pass of the row-wise kernel: 4 accumulators each */
static inline float bf16_to_f32(uint16_t v) { uint32_t u = ((uint32_t)v) << 16; float f; memcpy(&f, &u, 4); return f; }
static inline __attribute__((always_inline))
void gemv_bf16dp_block(const uint16_t* x, const uint16_t* w, int rows, int K, float out[ROWS_RB]) {
    __m512 acc[ROWS_RB][4];
    for (int r = 0; r < ROWS_RB; ++r)
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 128 <= K; k += 128) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k), w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
        __m512bh w2 = (__m512bh)_mm512_loadu_si512(w + k + 64), w3 = (__m512bh)_mm512_loadu_si512(w + k + 96);
        for (int r = 0; r < rows; ++r) {
            const uint16_t* xr = x + (long)r * K + k;
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)_mm512_loadu_si512(xr), w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)_mm512_loadu_si512(xr + 32), w1);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], (__m512bh)_mm512_loadu_si512(xr + 64), w2);
            acc[r][3] = _mm512_dpbf16_ps(acc[r][3], (__m512bh)_mm512_loadu_si512(xr + 96), w3);
        }
    }
    for (; k + 32 <= K; k += 32) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k);
        for (int r = 0; r < rows; ++r)
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)_mm512_loadu_si512(x + (long)r * K + k), w0);
    }
    for (int r = 0; r < rows; ++r) {
        __m512 s = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
        float t = _mm512_reduce_add_ps(s);
        for (int kk = k; kk < K; ++kk) t += bf16_to_f32(w[kk]) * bf16_to_f32(x[(long)r * K + kk]);
        out[r] = t;
    }
}

static void bf16dp_rows(const gemv_args* a, int begin, int end) {
    const uint16_t* x = a->x; const uint16_t* w = a->w; int R = a->R, K = a->K, N = a->N;
    for (int n = begin; n < end; ++n) {
        const uint16_t* wn = w + (long)n * K;
        float s = a->scale ? a->scale[n] : 1.0f, b = a->bias ? a->bias[n] : 0.0f;
        for (int r0 = 0; r0 < R; r0 += ROWS_RB) {
            int rows = R - r0 < ROWS_RB ? R - r0 : ROWS_RB;
            float out[ROWS_RB];
            const uint16_t* xb = x + (long)r0 * K;
            /* A constant row count per call: the accumulators stay in registers. */
            switch (rows) {
                case 4: gemv_bf16dp_block(xb, wn, 4, K, out); break;
                case 3: gemv_bf16dp_block(xb, wn, 3, K, out); break;
                case 2: gemv_bf16dp_block(xb, wn, 2, K, out); break;
                default: gemv_bf16dp_block(xb, wn, 1, K, out); break;
            }
            for (int r = 0; r < rows; ++r) a->y[(long)(r0 + r) * N + n] = out[r] * s + b;
        }
    }
}

void gemv_bf16dp_rows(const uint16_t* x, const uint16_t* w, const float* scale, const float* bias, float* y,
                      int R, int K, int N, int nthreads) {
    gemv_args a = {x, w, scale, bias, y, R, K, N};
    share(bf16dp_rows, &a, N, 16, nthreads);
}

/* int8 w with bf16 x, the same dot-product instruction (``gemv-int8dp``): int8 pairs laid out as
   the bf16 ones, [ceil(K/2)][16][2], each 32 widened to bf16 on load (exact: |w| <= 127 has 7
   significant bits), so every product is exact and only the float32 sums round. Eight rows a
   pass, two accumulators each (pairs p = 2i + j into acc[r][j], the tail likewise, then
   a0 + a1): one widening serves 8 rows, where the FMA kernel spends 8 FMAs per 16 weights. */
static inline __m512bh load_w32_i8_bf16(const int8_t* p) {
    /* the first 16 values first: pairs of outputs 0-7, then 8-15 */
    return _mm512_cvtne2ps_pbh(load_w16_i8(p + 16), load_w16_i8(p));
}
static inline __attribute__((always_inline))
void group_i8dp(const uint16_t* x, const int8_t* wg, int rows, int K, __m512 out[RB]) {
    __m512 acc[RB][2];
    for (int r = 0; r < RB; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    int P = (K + 1) / 2, p = 0;
    for (; p + 2 <= P && 2 * p + 4 <= K; p += 2) {
        /* every line, 8 KiB ahead (the FMA kernel's PREFETCH in k pairs; not tuned for this one) */
        _mm_prefetch((const char*)(wg + (long)(p + PREFETCH) * 2 * G), _MM_HINT_T0);
        for (int j = 0; j < 2; ++j) {
            __m512bh w = load_w32_i8_bf16(wg + (long)(p + j) * 2 * G);
            for (int r = 0; r < rows; ++r)
                acc[r][j] = _mm512_dpbf16_ps(acc[r][j], x_pair_in(x + (long)r * K, 2 * (p + j)), w);
        }
    }
    for (; p < P; ++p) {
        __m512bh w = load_w32_i8_bf16(wg + (long)p * 2 * G);
        for (int r = 0; r < rows; ++r)
            acc[r][p & 1] = _mm512_dpbf16_ps(acc[r][p & 1], (__m512bh)x_pair(x + (long)r * K, 2 * p, K), w);
    }
    for (int r = 0; r < rows; ++r) out[r] = _mm512_add_ps(acc[r][0], acc[r][1]);
}

DEFINE_KERNEL(gemv_i8dp, group_i8dp, uint16_t, int8_t, (K + 1) / 2 * 2)
int has_bf16dp(void) { return 1; }
#else
int has_bf16dp(void) { return 0; }
#endif

"""
