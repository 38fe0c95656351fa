"""C source of the AVX-512 weight-streaming GEMV/small-GEMM (see :mod:`tts_common.kernels.gemv`).

Kept as a string so the package needs no package-data and the build hashes exactly what it
compiles. ``y[r, n] = scale[n] * sum_k x[r, k] * w[n, k] + bias[n]`` with fp32 ``x``/``y`` and
int8 or bfloat16 ``w`` (``scale`` only for int8). Each output row's sum always runs in the same
order (four 16-lane accumulators over k in steps of 64, a tail of 16-lane steps, a scalar tail,
then a fixed reduction), whatever the number of rows: a row's result never depends on its batch.
Rows are taken four at a time so a weight row read from memory serves every row of the batch
from L1; the output channels are handed to OpenMP threads sixteen at a time (dynamic: on a
shared machine a thread that is descheduled does not hold the whole call back; each output is
computed alone, so the split never changes a bit).
"""

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define RB 4

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

#define DEFINE_KERNEL(NAME, WT, LOAD16, SCALAR)                                              \
static void NAME##_block(const float* x, const WT* w, int rows, int K, float out[RB]) {       \
    __m512 acc[RB][4];                                                                        \
    for (int r = 0; r < RB; ++r)                                                              \
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();                          \
    int k = 0;                                                                                \
    for (; k + 64 <= K; k += 64) {                                                            \
        __m512 w0 = LOAD16(w + k), w1 = LOAD16(w + k + 16);                                   \
        __m512 w2 = LOAD16(w + k + 32), w3 = LOAD16(w + k + 48);                              \
        for (int r = 0; r < rows; ++r) {                                                      \
            const float* xr = x + (long)r * K + k;                                            \
            acc[r][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc[r][0]);                  \
            acc[r][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc[r][1]);             \
            acc[r][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xr + 32), acc[r][2]);             \
            acc[r][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xr + 48), acc[r][3]);             \
        }                                                                                     \
    }                                                                                         \
    for (; k + 16 <= K; k += 16) {                                                            \
        __m512 w0 = LOAD16(w + k);                                                            \
        for (int r = 0; r < rows; ++r)                                                        \
            acc[r][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (long)r * K + k), acc[r][0]); \
    }                                                                                         \
    for (int r = 0; r < rows; ++r) {                                                          \
        __m512 s = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]),                         \
                                 _mm512_add_ps(acc[r][2], acc[r][3]));                        \
        float t = _mm512_reduce_add_ps(s);                                                    \
        for (int kk = k; kk < K; ++kk) t += SCALAR(w, kk) * x[(long)r * K + kk];              \
        out[r] = t;                                                                           \
    }                                                                                         \
}                                                                                             \
void NAME(const float* x, const WT* w, const float* scale, const float* bias, float* y,       \
          int R, int K, int N, int nthreads) {                                                \
    _Pragma("omp parallel for num_threads(nthreads) schedule(dynamic, 16)")                        \
    for (int n = 0; n < N; ++n) {                                                             \
        const WT* wn = w + (long)n * K;                                                       \
        float s = scale ? scale[n] : 1.0f, b = bias ? bias[n] : 0.0f;                         \
        for (int r0 = 0; r0 < R; r0 += RB) {                                                  \
            int rows = R - r0 < RB ? R - r0 : RB;                                             \
            float out[RB];                                                                    \
            NAME##_block(x + (long)r0 * K, wn, rows, K, out);                                 \
            for (int r = 0; r < rows; ++r) y[(long)(r0 + r) * N + n] = out[r] * s + b;        \
        }                                                                                     \
    }                                                                                         \
}

DEFINE_KERNEL(gemv_i8, int8_t, load_w16_i8, w_scalar_i8)
DEFINE_KERNEL(gemv_bf16, uint16_t, load_w16_bf16, w_scalar_bf16)

#ifdef __AVX512BF16__
/* bfloat16 weights AND activations with the bf16 dot-product instruction (vdpbf16ps: pairs of
   exact bf16 products accumulated in float32, twice the multiply-adds of an fp32 FMA): the
   multi-row case, compute-bound with float32 FMAs, gets the headroom a batch needs. */
static void gemv_bf16dp_block(const uint16_t* x, const uint16_t* w, int rows, int K, float out[RB]) {
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
            gemv_bf16dp_block(x + (long)r0 * K, wn, rows, K, out);
            for (int r = 0; r < rows; ++r) y[(long)(r0 + r) * N + n] = out[r] * s + b;
        }
    }
}
int has_bf16dp(void) { return 1; }
#else
int has_bf16dp(void) { return 0; }
#endif
"""
