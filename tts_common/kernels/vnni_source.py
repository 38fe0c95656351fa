"""C source of the int8-weights, int8-activations GEMV on AVX-512 VNNI, ``gemv_i8a8``
(``--quantization w8a8``; see :mod:`tts_common.kernels.gemv`).

Each row of ``x`` is quantized on the fly to int8 with its own step (symmetric, per token:
``step = max|x_row| / 127``, ``q = round_half_even(x / step)`` in [-127, 127]), and each output
is ``float32(sum_k q_k w_k) * (step * scale_n)``, then ``+ bias_n`` (two roundings: the sum
itself is exact in int32, so neither the order of the k, nor the rows sharing a pass, nor the
threads change a bit). :func:`.gemv.w8a8_reference` computes the same bits with torch.

Why: at 8 rows the weight-only int8 kernels are bound by arithmetic, not memory, on a CPU
without AMX: the FMA kernel widens 16 weights and issues 8 FMAs per 16 weights, the bf16
dot-product one widens 32 weights (5 instructions) for 8 dot products; on a Zen 4 EPYC both read
10-16 GB/s at 8 rows against 25-33 at one row (``bench/gemv_bench.py``). VPDPBUSD takes 64 int8
products per instruction straight from the packed weights: 8 rows cost 8 instructions per 64
weights and no widening.

The instruction multiplies unsigned by signed bytes: the weights are stored offset by 128
(``w + 128`` in [1, 255], :func:`.gemv.pack_w8a8`) and the activations are the signed operand;
``128 * sum_k q_k`` (one integer per row) is subtracted from every output's sum. The sums stay
exact for up to :data:`.gemv.A8_MAX_IN_FEATURES` input features (``255 * 127`` per product).
The packed layout is the AMX-INT8 kernel's quads of k (``[Kp/4][16][4]`` per group of 16
outputs, ``Kp`` = K rounded up to 64, zero-padded before the offset): one 64-byte load is 16
outputs x 4 k, one instruction's operand.

A row with a non-finite value gives NaN outputs; a row whose step underflows to zero (all
``|x| < 127 * 2^-149``) gives the bias. Compiled after :mod:`.gemv_source` (``G``, ``RB``, ``row_largest_magnitude``) and
:mod:`.vec_source` (``tail_mask``); where the build lacks AVX-512 VNNI only ``has_vnni``
(returning 0) is defined.
"""

SOURCE = r"""
#if VEC_AVX512 && defined(__AVX512VNNI__)
#include <math.h>   /* NAN */
#include <string.h> /* memset */

#ifndef A8_PREFETCH
#define A8_PREFETCH 256 /* k ahead (4 KiB of a group), as the FMA kernel's PREFETCH */
#endif

typedef struct { const int8_t* q; const float* step; const int32_t* offset; int Kp; } a8_input;

int has_vnni(void) { return 1; }

/* Each row r of x [R][K]: q [r][Kp] (zero past K), step[r] (0: a zero row, NaN: a non-finite
   value) and offset[r] = 128 * sum_k q. On the calling thread (R x K is small beside the
   weights). */
static void quantize_rows(const float* x, int8_t* q, float* step, int32_t* offset, int R, int K, int Kp) {
    for (int r = 0; r < R; ++r) {
        const float* xr = x + (long)r * K;
        int8_t* qr = q + (long)r * Kp;
        int bad;
        float s = row_largest_magnitude(xr, K, &bad) / 127.0f;
        if (bad || s == 0.0f) {
            step[r] = bad ? NAN : 0.0f;
            offset[r] = 0;
            memset(qr, 0, (size_t)Kp);
            continue;
        }
        step[r] = s;
        __m512 vs = _mm512_set1_ps(s);
        __m512i sum = _mm512_setzero_si512(), lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
        for (int k = 0; k < Kp; k += 16) {
            /* x / step rounded to nearest, ties to even (the default rounding mode), as torch.round */
            __m512i i = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_maskz_loadu_ps(tail_mask(K - k), xr + k), vs));
            i = _mm512_min_epi32(_mm512_max_epi32(i, lo), hi);
            sum = _mm512_add_epi32(sum, i);
            _mm_storeu_si128((__m128i*)(qr + k), _mm512_cvtepi32_epi8(i));
        }
        offset[r] = 128 * _mm512_reduce_add_epi32(sum);
    }
}

/* One group's int32 sums for up to RB rows, one accumulator per row (an integer sum: its
   order changes nothing): each quad of k is one 64-byte line of weights, one load for the rows'
   instructions, the row's 4 activation bytes broadcast to every lane. (Two accumulators per row
   compiled to register copies and a spill: 1.4x slower at 8 rows on a Zen 4.) */
static inline __attribute__((always_inline))
void group_a8(const int8_t* q, int Kp, const uint8_t* wg, int rows, __m512i out[RB]) {
    __m512i acc[RB];
    for (int r = 0; r < RB; ++r) acc[r] = _mm512_setzero_si512();
    const int32_t* quads = (const int32_t*)q; /* row r's quad i at quads[r Kp/4 + i] */
    long stride = Kp / 4;
    for (long i = 0; i < stride; ++i) {
        _mm_prefetch((const char*)(wg + (4 * i + A8_PREFETCH) * G), _MM_HINT_T0);
        __m512i w = _mm512_loadu_si512((const void*)(wg + 4 * i * G));
        for (int r = 0; r < rows; ++r)
            acc[r] = _mm512_dpbusd_epi32(acc[r], w, _mm512_set1_epi32(quads[r * stride + i]));
    }
    for (int r = 0; r < rows; ++r) out[r] = acc[r];
}

static void i8a8_groups(const gemv_args* a, int begin, int end) {
    const a8_input* in = a->x; const uint8_t* w = a->w; int R = a->R, N = a->N, Kp = in->Kp;
    for (int g = begin; g < end; ++g) {
        const uint8_t* wg = w + (long)g * Kp * G;
        __mmask16 m = tail_mask(N - g * G);
        __m512 s = a->scale ? _mm512_maskz_loadu_ps(m, a->scale + g * G) : _mm512_set1_ps(1.0f);
        __m512 b = a->bias ? _mm512_maskz_loadu_ps(m, a->bias + g * G) : _mm512_setzero_ps();
        for (int r0 = 0; r0 < R; r0 += RB) {
            int rows = R - r0 < RB ? R - r0 : RB;
            __m512i out[RB];
            const int8_t* qb = in->q + (long)r0 * Kp;
            /* A constant row count per call: the accumulators stay in registers. */
            switch (rows) {
                case 8: group_a8(qb, Kp, wg, 8, out); break;
                case 7: group_a8(qb, Kp, wg, 7, out); break;
                case 6: group_a8(qb, Kp, wg, 6, out); break;
                case 5: group_a8(qb, Kp, wg, 5, out); break;
                case 4: group_a8(qb, Kp, wg, 4, out); break;
                case 3: group_a8(qb, Kp, wg, 3, out); break;
                case 2: group_a8(qb, Kp, wg, 2, out); break;
                default: group_a8(qb, Kp, wg, 1, out); break;
            }
            for (int r = 0; r < rows; ++r) {
                __m512i t = _mm512_sub_epi32(out[r], _mm512_set1_epi32(in->offset[r0 + r]));
                __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(_mm512_set1_ps(in->step[r0 + r]), s));
                /* the bias add rounds on its own, as in the reference (no fused multiply-add) */
                __asm__("" : "+v"(v));
                if (a->bias) v = _mm512_add_ps(v, b);
                _mm512_mask_storeu_ps(a->y + (long)(r0 + r) * N + g * G, m, v);
            }
        }
    }
}

/* Returns 0, or -1 (y untouched) where the quantized rows' buffer cannot be allocated. */
int gemv_i8a8(const float* x, const int8_t* w, const float* scale, const float* bias, float* y,
              int R, int K, int N, int nthreads) {
    int Kp = (K + 63) & ~63;
    size_t q_bytes = ((size_t)R * Kp + 63) & ~(size_t)63;
    size_t row_bytes = ((size_t)R * (sizeof(float) + sizeof(int32_t)) + 63) & ~(size_t)63;
    int8_t* buf = aligned_alloc(64, q_bytes + row_bytes);
    if (!buf) return -1;
    float* step = (float*)(buf + q_bytes);
    int32_t* offset = (int32_t*)(step + R);
    quantize_rows(x, buf, step, offset, R, K, Kp);
    a8_input in = {buf, step, offset, Kp};
    gemv_args a = {&in, w, scale, bias, y, R, K, N};
    share(i8a8_groups, &a, (N + G - 1) / G, 2, nthreads);
    free(buf);
    return 0;
}
#else
int has_vnni(void) { return 0; }
#endif
"""
