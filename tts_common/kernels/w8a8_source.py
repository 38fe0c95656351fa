"""C source of the int8-weights, int8-activations GEMV, ``gemv_i8a8``, on AVX-512 VNNI or AVX2
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
weights and no widening. On AVX2, VPMADDUBSW and VPMADDWD take 32 products in 4 instructions
per row (4 rows a pass, for AVX2's 16 registers), against the FMA kernel's 8 FMAs per 16 weights.

VPDPBUSD multiplies unsigned by signed bytes: the weights are stored offset by 128
(``w + 128`` in [1, 255], :func:`.gemv.pack_w8a8`) and the activations are the signed operand;
``128 * sum_k q_k`` (one integer per row) is subtracted from every output's sum. VPMADDUBSW
would saturate its 16-bit pair sums on offset weights (up to 255 * 127 * 2), so AVX2 takes the
offset back off each 32 weights (one XOR for all rows) and multiplies ``|q|`` by ``w * sign(q)``
(pair sums at most 127 * 127 * 2). The sums stay
exact for up to :data:`.gemv.A8_MAX_IN_FEATURES` input features (``255 * 127`` per product).
The packed layout is the AMX-INT8 kernel's quads of k (``[Kp/4][16][4]`` per group of 16
outputs, ``Kp`` = K rounded up to 64, zero-padded before the offset): one 64-byte load is 16
outputs x 4 k, one instruction's operand.

A row with a non-finite value gives NaN outputs; a row whose step underflows to zero (all
``|x| < 127 * 2^-149``) gives the bias. Compiled after :mod:`.gemv_source` (``G``, ``RB``) and
:mod:`.vec_source` (the 16-lane vector); an AVX-512 build without VNNI (Skylake-SP) has no
kernel: ``has_w8a8`` returns 0 there.
"""

SOURCE = r"""
#include <math.h>   /* NAN */

#ifndef A8_PREFETCH
#define A8_PREFETCH 256 /* k ahead (4 KiB of a group), as the FMA kernel's PREFETCH */
#endif

#if VEC_AVX512 && defined(__AVX512VNNI__)
#define HAS_W8A8 1
/* 16 integral floats in [-127, 127] as int8. */
static inline void store_i8_16(int8_t* p, v16 v) {
    _mm_storeu_si128((__m128i*)p, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
}
/* A reordering barrier: the bias add rounds on its own, as in the reference (no FMA contraction). */
#define V16_KEEP(v) __asm__("" : "+v"(v))

/* One group's sums for up to RB rows, one accumulator per row (an integer sum: its order changes
   nothing): each quad of k is one 64-byte line of weights, one load for the rows' instructions,
   the row's 4 activation bytes broadcast to every lane. (Two accumulators per row compiled to
   register copies and a spill: the talker's 8-row step took 120 ms against 83, medians of 5
   turns of bench/talker_ab.py on a Zen 4.) */
static inline __attribute__((always_inline))
void group_a8(const int32_t* quads, long stride, const uint8_t* wg, int rows, const int32_t* offset, v16 out[RB]) {
    __m512i acc[RB];
    for (int r = 0; r < RB; ++r) acc[r] = _mm512_setzero_si512();
    for (long i = 0; i < stride; ++i) {
        _mm_prefetch((const char*)(wg + (4 * i + A8_PREFETCH) * G), _MM_HINT_T0);
        __m512i w = _mm512_loadu_si512((const void*)(wg + 4 * i * G));
        for (int r = 0; r < rows; ++r)
            acc[r] = _mm512_dpbusd_epi32(acc[r], w, _mm512_set1_epi32(quads[r * stride + i]));
    }
    for (int r = 0; r < rows; ++r)
        out[r] = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r], _mm512_set1_epi32(offset[r])));
}

#elif !VEC_AVX512
#define HAS_W8A8 1
static inline void store_i8_16(int8_t* p, v16 v) {
    __m256i w = _mm256_packs_epi32(_mm256_cvtps_epi32(v.lo), _mm256_cvtps_epi32(v.hi)); /* lanes interleaved */
    w = _mm256_permute4x64_epi64(w, _MM_SHUFFLE(3, 1, 2, 0));
    _mm_storeu_si128((__m128i*)p, _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}
#define V16_KEEP(v) __asm__("" : "+x"((v).lo), "+x"((v).hi))
#define A8_ROWS_AVX2 4 /* rows a pass: 8 accumulators, 2 weights, the broadcasts and products fill 15 */

/* Up to 4 rows: each half line (8 outputs x 4 k) un-offset once (XOR), then per row
   |q| * (w * sign(q)) in 16-bit pairs and the pairs summed in 32 bits. */
static inline __attribute__((always_inline))
void group_a8_pass(const int32_t* quads, long stride, const uint8_t* wg, int rows, v16* out) {
    __m256i acc[A8_ROWS_AVX2][2];
    for (int r = 0; r < A8_ROWS_AVX2; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    for (long i = 0; i < stride; ++i) {
        _mm_prefetch((const char*)(wg + (4 * i + A8_PREFETCH) * G), _MM_HINT_T0);
        __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(wg + 4 * i * G)), flip);
        __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(wg + 4 * i * G + 32)), flip);
        for (int r = 0; r < rows; ++r) {
            __m256i qb = _mm256_set1_epi32(quads[r * stride + i]);
            __m256i qa = _mm256_abs_epi8(qb);
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(w0, qb)), ones));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(w1, qb)), ones));
        }
    }
    for (int r = 0; r < rows; ++r) {
        out[r].lo = _mm256_cvtepi32_ps(acc[r][0]);
        out[r].hi = _mm256_cvtepi32_ps(acc[r][1]);
    }
}
static inline __attribute__((always_inline))
void group_a8(const int32_t* quads, long stride, const uint8_t* wg, int rows, const int32_t* offset, v16 out[RB]) {
    (void)offset; /* the weights are un-offset here */
    for (int r0 = 0; r0 < rows; r0 += A8_ROWS_AVX2) {
        int n = rows - r0 < A8_ROWS_AVX2 ? rows - r0 : A8_ROWS_AVX2;
        group_a8_pass(quads + r0 * stride, stride, wg, n, out + r0);
    }
}
#else
#define HAS_W8A8 0
#endif

#if HAS_W8A8
typedef struct { const int8_t* q; const float* step; const int32_t* offset; int Kp; } a8_input;

int has_w8a8(void) { return 1; }

/* Each row r of x [R][K]: q [r][Kp] (zero past K), step[r] (0: a zero row, NaN: a non-finite
   value) and offset[r] = 128 * sum_k q. On the calling thread (R x K is small beside the
   weights). */
static void quantize_rows(const float* x, int8_t* q, float* step, int32_t* offset, int R, int K, int Kp) {
    for (int r = 0; r < R; ++r) {
        const float* xr = x + (long)r * K;
        int8_t* qr = q + (long)r * Kp;
        v16 m = v16_zero(), nonfinite = v16_zero();
        for (int k = 0; k < K; k += 16) {
            v16 v = v16_load(tail_mask(K - k), xr + k);
            nonfinite = v16_add(nonfinite, v16_sub(v, v)); /* NaN from an inf or a NaN */
            m = v16_max(m, v16_max(v, v16_sub(v16_zero(), v)));
        }
        float lanes[16], largest = 0.0f;
        v16_store(lanes, tail_mask(16), m);
        for (int i = 0; i < 16; ++i) largest = lanes[i] > largest ? lanes[i] : largest;
        float s = largest / 127.0f;
        int bad = v16_reduce_add(nonfinite) != 0.0f;
        if (bad || s == 0.0f) {
            step[r] = bad ? NAN : 0.0f;
            offset[r] = 0;
            memset(qr, 0, (size_t)Kp);
            continue;
        }
        step[r] = s;
        v16 vs = v16_set1(s), lo = v16_set1(-127.0f), hi = v16_set1(127.0f), sum = v16_zero();
        for (int k = 0; k < Kp; k += 16) {
            /* x / step rounded to nearest, ties to even, as torch.round */
            v16 t = v16_min(v16_max(v16_round(v16_div(v16_load(tail_mask(K - k), xr + k), vs)), lo), hi);
            sum = v16_add(sum, t); /* exact: integers below 2^24 */
            store_i8_16(qr + k, t);
        }
        offset[r] = 128 * (int32_t)v16_reduce_add(sum);
    }
}

static void i8a8_groups(const gemv_args* a, int begin, int end) {
    const a8_input* in = a->x; const uint8_t* w = a->w; int R = a->R, N = a->N, Kp = in->Kp;
    const int32_t* quads = (const int32_t*)in->q; /* row r's quad i at quads[r Kp/4 + i] */
    long stride = Kp / 4;
    for (int g = begin; g < end; ++g) {
        const uint8_t* wg = w + (long)g * Kp * G;
        m16 m = tail_mask(N - g * G);
        v16 s = a->scale ? v16_load(m, a->scale + g * G) : v16_set1(1.0f);
        v16 b = a->bias ? v16_load(m, a->bias + g * G) : v16_zero();
        for (int r0 = 0; r0 < R; r0 += RB) {
            int rows = R - r0 < RB ? R - r0 : RB;
            v16 out[RB];
            const int32_t* qb = quads + r0 * stride;
            const int32_t* off = in->offset + r0;
            /* A constant row count per call: the accumulators stay in registers. */
            switch (rows) {
                case 8: group_a8(qb, stride, wg, 8, off, out); break;
                case 7: group_a8(qb, stride, wg, 7, off, out); break;
                case 6: group_a8(qb, stride, wg, 6, off, out); break;
                case 5: group_a8(qb, stride, wg, 5, off, out); break;
                case 4: group_a8(qb, stride, wg, 4, off, out); break;
                case 3: group_a8(qb, stride, wg, 3, off, out); break;
                case 2: group_a8(qb, stride, wg, 2, off, out); break;
                default: group_a8(qb, stride, wg, 1, off, out); break;
            }
            for (int r = 0; r < rows; ++r) {
                v16 v = v16_mul(out[r], v16_mul(v16_set1(in->step[r0 + r]), s));
                V16_KEEP(v);
                if (a->bias) v = v16_add(v, b);
                v16_store(a->y + (long)(r0 + r) * N + g * G, m, v);
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
int has_w8a8(void) { return 0; }
#endif
"""
