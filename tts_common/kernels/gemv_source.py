"""C source of the AVX-512 weight-streaming GEMV/small-GEMM (see :mod:`tts_common.kernels.gemv`).

Kept as a string so the package needs no package-data and the build hashes exactly what it
compiles. ``y[r, n] = scale[n] * sum_k x[r, k] * w[n, k] + bias[n]`` with fp32 ``x``/``y`` and
int8 or bfloat16 ``w`` (``scale`` only for int8), or bf16 ``x`` and ``w`` with the bf16 dot
product. Each output's sum always runs in the same order (for int8 and bf16 weights with fp32
activations one 16-lane accumulator over k in vector steps; for the bf16 dot product four over
k in steps of 128; then a fixed 16-lane reduction and a scalar tail), whatever the number of
rows or which outputs share its tile: a row's result never depends on its batch.

int8 / bf16 weights with fp32 activations go in tiles of 4 output channels x 4 rows: per vector step, 4 weight vectors are loaded (and widened)
once and each row's activations once, for 16 multiply-adds, so a weight row read from memory
serves every row of the batch and the loads do not bound the multi-row case. Output tiles go to
OpenMP threads dynamically, a few at a time (on a shared machine a descheduled thread does not
hold the whole call back; each output is computed alone, so the split never changes a bit).
"""

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define RB 4
#define NB 4

static inline __m512 load_w16_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
static inline __m512 load_w16_bf16(const uint16_t* p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
static inline float w_scalar_i8(const int8_t* p, int k) { return (float)p[k]; }
static inline float w_scalar_bf16(const uint16_t* p, int k) {
    uint32_t u = ((uint32_t)p[k]) << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline float x_scalar_f32(const float* p, int k) { return p[k]; }

/* TILE(x, w, rows, nb, K, out): out[r][j] = sum_k x[r, k] * w[j, k] for rows x nb outputs. */
#define DEFINE_TILE(NAME, XT, WT, STEP, LOADW, LOADX, MADD, WSCALAR, XSCALAR)                 \
static inline __attribute__((always_inline))                                                  \
void NAME(const XT* x, const WT* w, int rows, int nb, int K, float out[RB][NB]) {             \
    __m512 acc[RB][NB];                                                                       \
    for (int r = 0; r < RB; ++r)                                                              \
        for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_ps();                         \
    int k = 0;                                                                                \
    for (; k + STEP <= K; k += STEP) {                                                        \
        __typeof__(LOADW(w)) wv[NB];                                                          \
        for (int j = 0; j < nb; ++j) wv[j] = LOADW(w + (long)j * K + k);                      \
        for (int r = 0; r < rows; ++r) {                                                      \
            __typeof__(LOADX(x)) xv = LOADX(x + (long)r * K + k);                             \
            for (int j = 0; j < nb; ++j) acc[r][j] = MADD(acc[r][j], xv, wv[j]);              \
        }                                                                                     \
    }                                                                                         \
    for (int r = 0; r < rows; ++r)                                                            \
        for (int j = 0; j < nb; ++j) {                                                        \
            float t = _mm512_reduce_add_ps(acc[r][j]);                                        \
            for (int kk = k; kk < K; ++kk)                                                    \
                t += WSCALAR(w + (long)j * K, kk) * XSCALAR(x + (long)r * K, kk);             \
            out[r][j] = t;                                                                    \
        }                                                                                     \
}

#define FMA_F32(acc, xv, wv) _mm512_fmadd_ps(wv, xv, acc)
#define LOADX_F32(p) _mm512_loadu_ps(p)
DEFINE_TILE(tile_i8, float, int8_t, 16, load_w16_i8, LOADX_F32, FMA_F32, w_scalar_i8, x_scalar_f32)
DEFINE_TILE(tile_bf16, float, uint16_t, 16, load_w16_bf16, LOADX_F32, FMA_F32, w_scalar_bf16, x_scalar_f32)

/* Constant rows and nb per call, so the accumulators stay in registers. */
#define CALL_TILE(TILE, xb, wn, rows, nb, K, out)                                             \
    do {                                                                                      \
        if ((nb) == NB) {                                                                     \
            switch (rows) {                                                                   \
                case 4: TILE(xb, wn, 4, NB, K, out); break;                                   \
                case 3: TILE(xb, wn, 3, NB, K, out); break;                                   \
                case 2: TILE(xb, wn, 2, NB, K, out); break;                                   \
                default: TILE(xb, wn, 1, NB, K, out); break;                                  \
            }                                                                                 \
        } else {                                                                              \
            switch (rows) {                                                                   \
                case 4: TILE(xb, wn, 4, 1, K, out); break;                                    \
                case 3: TILE(xb, wn, 3, 1, K, out); break;                                    \
                case 2: TILE(xb, wn, 2, 1, K, out); break;                                    \
                default: TILE(xb, wn, 1, 1, K, out); break;                                   \
            }                                                                                 \
        }                                                                                     \
    } while (0)

#define DEFINE_KERNEL(NAME, TILE, XT, WT)                                                     \
void NAME(const XT* x, const WT* w, const float* scale, const float* bias, float* y,          \
          int R, int K, int N, int nthreads) {                                                \
    int tiles = (N + NB - 1) / NB;                                                            \
    _Pragma("omp parallel for num_threads(nthreads) schedule(dynamic, 4)")                    \
    for (int t = 0; t < tiles; ++t) {                                                         \
        int n0 = t * NB, nend = n0 + NB < N ? n0 + NB : N;                                    \
        int nb = nend - n0 == NB ? NB : 1;                                                    \
        for (int n = n0; n < nend; n += nb) {                                                 \
            const WT* wn = w + (long)n * K;                                                   \
            for (int r0 = 0; r0 < R; r0 += RB) {                                              \
                int rows = R - r0 < RB ? R - r0 : RB;                                         \
                float out[RB][NB];                                                            \
                CALL_TILE(TILE, x + (long)r0 * K, wn, rows, nb, K, out);                      \
                for (int j = 0; j < nb; ++j) {                                                \
                    float s = scale ? scale[n + j] : 1.0f, b = bias ? bias[n + j] : 0.0f;     \
                    for (int r = 0; r < rows; ++r)                                            \
                        y[(long)(r0 + r) * N + n + j] = out[r][j] * s + b;                    \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
}

DEFINE_KERNEL(gemv_i8, tile_i8, float, int8_t)
DEFINE_KERNEL(gemv_bf16, tile_bf16, float, uint16_t)

#ifdef __AVX512BF16__
/* bfloat16 weights AND activations with the bf16 dot-product instruction (vdpbf16ps: pairs of
   exact bf16 products accumulated in float32, twice the multiply-adds of an fp32 FMA). One
   output at a time, four accumulators over k in steps of 128 (fixed order, any row count): on
   the dev EPYC this beat the 4x4 tile above by 2x at one row and matched it at 4 and 8. */
static inline __attribute__((always_inline)) void gemv_bf16dp_block(const uint16_t* x, const uint16_t* w, int rows, int K, float out[RB]) {
    __m512 acc[RB][4];
    for (int r = 0; r < RB; ++r)
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
        for (int kk = k; kk < K; ++kk) t += w_scalar_bf16(w, kk) * w_scalar_bf16(x + (long)r * K, kk);
        out[r] = t;
    }
}

void gemv_bf16dp(const uint16_t* x, const uint16_t* w, const float* scale, const float* bias, float* y,
                 int R, int K, int N, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 16)
    for (int n = 0; n < N; ++n) {
        const uint16_t* wn = w + (long)n * K;
        float s = scale ? scale[n] : 1.0f, b = bias ? bias[n] : 0.0f;
        for (int r0 = 0; r0 < R; r0 += RB) {
            int rows = R - r0 < RB ? R - r0 : RB;
            float out[RB];
            const uint16_t* xb = x + (long)r0 * K;
            /* A constant row count per call: the accumulators stay in registers. */
            switch (rows) {
                case 4: gemv_bf16dp_block(xb, wn, 4, K, out); break;
                case 3: gemv_bf16dp_block(xb, wn, 3, K, out); break;
                case 2: gemv_bf16dp_block(xb, wn, 2, K, out); break;
                default: gemv_bf16dp_block(xb, wn, 1, K, out); break;
            }
            for (int r = 0; r < rows; ++r) y[(long)(r0 + r) * N + n] = out[r] * s + b;
        }
    }
}
int has_bf16dp(void) { return 1; }
#else
int has_bf16dp(void) { return 0; }
#endif
"""
