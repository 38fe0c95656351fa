"""C source of the int8 GEMV on AMX-INT8 tiles, ``gemv_i8x4amx`` (see :mod:`tts_common.kernels.gemv`).

int8 weights times float32 activations written as four int8 digits each: per row a power-of-two
scale ``s`` (from the row's largest magnitude) and digits ``d0..d3`` in [-127, 127] with
``x = s * (d0 + d1 2^-7 + d2 2^-14 + d3 2^-21) + e``, ``|e| < s 2^-21 <= max|x_row| 2^-27``:
each digit is the truncated integer part of what is left, scaled by 2^7 (exact in float32). A
tile instruction (TDPBSSD) sums int8 products into int32 exactly; an output's four digit sums
are joined in int64 (exact) and rounded to float32 once, then scaled by ``s`` (exact) and the
channel's scale. So the sum itself is exact and the only error is the digits' truncation, below
float32's own rounding of the largest activations.

Why: at 8 rows the AVX-512 int8 kernel widens each weight and issues 8 FMAs per 16 weights, and
the AMX-BF16 one (``gemv_i8amx``) widens each weight to bf16 on the way to its tiles; here the
packed weights go straight from memory into the tiles, and four digits of up to 4 rows fill one
16-row tile (8 rows two), so 8 rows cost about 1.2x one row (measured at load on the dev Xeon;
the FMA kernel's cost 1.7-1.9x) and one row costs the read. The int32 sums are exact up to
2^31 / 127^2 input features; callers stay within :data:`.gemv.X4_MAX_IN_FEATURES`.

Weights are packed in quads of k (``[Kp/4][16][4]`` int8 per group of 16 outputs, ``Kp`` = K
rounded up to 64, zero-padded: :func:`.gemv.pack_weight` with ``k_group=4``), so 64 k of a group
are one 16 x 64-byte B tile read as it lies. Each output sums its k blocks in increasing order in
its own tile element, which depends only on its own rows of A: the row count never changes a
bit. A row with a non-finite value gives NaN outputs (its digits would mean nothing).

Compiled after :mod:`.amx_source` (its tile configuration type and ``has_amx_bf16``, which asks
the OS for the tile state AMX-INT8 shares), :mod:`.gemv_source` (``G``, ``store_group``) and
:mod:`.vec_source` (``tail_mask``);
where the build lacks AMX-INT8 only ``has_amx_int8`` (returning 0) is defined.
"""

SOURCE = r"""
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AMX_INT8__)
#include <math.h> /* NAN */

#define DIGITS 4
#define DIGIT_BITS 7
#define X4_ROWS 8  /* rows per pass: their 32 digit rows are two A tiles */
#ifndef X4_PREFETCH
#define X4_PREFETCH 128 /* k ahead (2 KiB of a group): best of 0/64/128/256/512, side by side */
#endif

typedef struct { const int8_t* digits; const int* exponent; int Kp; } x4_input;

int has_amx_int8(void) { return has_amx_bf16(); }

/* x [R][K] as digits into xd[(DIGITS r + i) Kp + k] (zero past K) and each row's scale
   exponent: x = 2^exponent * sum_i d_i 2^(-7 i) + e, |e| < 2^(exponent - 21). exponent = INT_MIN
   marks a row with a non-finite value (its digits zero). On the calling thread: shared between
   threads it was no faster (side by side). */
static void x_digits(const float* x, int8_t* xd, int* exponent, int R, int K, int Kp) {
    for (int r = 0; r < R; ++r) {
        const float* xr = x + (long)r * K;
        int8_t* dr = xd + (long)DIGITS * r * Kp;
        __m512 m = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int k = 0; k < K; k += 16) {
            __m512 v = _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(K - k), xr + k));
            bad |= _mm512_cmp_ps_mask(v, _mm512_set1_ps(3.4028235e38f), _CMP_NLE_UQ); /* inf, NaN */
            m = _mm512_max_ps(m, v);
        }
        float largest = _mm512_reduce_max_ps(m);
        if (bad || largest == 0.0f) {
            exponent[r] = bad ? INT_MIN : 0;
            memset(dr, 0, (size_t)DIGITS * Kp);
            continue;
        }
        /* largest = f 2^e with f in [0.5, 1) (getexp: floor(log2), subnormals too), so
           |x| 2^(7 - e) < 128 */
        int e = (int)_mm_cvtss_f32(_mm_getexp_ss(_mm_setzero_ps(), _mm_set_ss(largest))) + 1;
        exponent[r] = e - DIGIT_BITS;
        __m512 up = _mm512_set1_ps((float)(DIGIT_BITS - e)), shift = _mm512_set1_ps((float)DIGIT_BITS);
        for (int k = 0; k < Kp; k += 16) {
            __m512 t = _mm512_scalef_ps(_mm512_maskz_loadu_ps(tail_mask(K - k), xr + k), up);
            for (int i = 0; i < DIGITS; ++i) {
                __m512 d = _mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                _mm_storeu_si128((__m128i*)(dr + (long)i * Kp + k), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(d)));
                t = _mm512_scalef_ps(_mm512_sub_ps(t, d), shift); /* the fraction, exact */
            }
        }
    }
}

/* Tiles: 0, 1 rows 0-3's digits times groups g, g + 1; 2, 3 rows 4-7's; 4, 5 the two A tiles
   (rows 0-3, 4-7); 6, 7 the groups' B tiles. */
static void amx_configure_x4(int rows) {
    int a0 = DIGITS * (rows < 4 ? rows : 4), a1 = DIGITS * rows - a0;
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; ++t) { c.rows[t] = (uint8_t)a0; c.colsb[t] = 64; }
    c.rows[4] = (uint8_t)a0; c.colsb[4] = 64;
    if (a1) {
        for (int t = 2; t < 4; ++t) { c.rows[t] = (uint8_t)a1; c.colsb[t] = 64; }
        c.rows[5] = (uint8_t)a1; c.colsb[5] = 64;
    }
    for (int t = 6; t < 8; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
    _tile_loadconfig(&c);
}

/* One output lane set (16 outputs) of one row from its four digit rows of an int32 tile:
   sum_i d_i 2^(21 - 7 i) in int64 (exact: |sum| < 2^14 Kp 2^22), one rounding to float32, times
   2^(exponent - 21). */
static inline __m512 join_digits(const int32_t* c, int exponent) {
    __m256 halves[2];
    for (int h = 0; h < 2; ++h) {
        __m512i s = _mm512_setzero_si512();
        for (int i = 0; i < DIGITS; ++i) {
            __m512i v = _mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i*)(c + i * 16 + 8 * h)));
            s = _mm512_add_epi64(s, _mm512_slli_epi64(v, DIGIT_BITS * (DIGITS - 1 - i)));
        }
        halves[h] = _mm512_cvtepi64_ps(s);
    }
    __m512 v = _mm512_insertf32x8(_mm512_castps256_ps512(halves[0]), halves[1], 1);
    if (exponent == INT_MIN) return _mm512_set1_ps(NAN);
    return _mm512_scalef_ps(v, _mm512_set1_ps((float)(exponent - DIGIT_BITS * (DIGITS - 1))));
}

static void i8x4amx_groups(const gemv_args* a, int begin, int end) {
    const x4_input* in = a->x; const int8_t* w = a->w; int R = a->R, Kp = in->Kp;
    long gstride = (long)Kp * G;
    int32_t acc[4][16 * 16] __attribute__((aligned(64)));
    int configured = 0;
    for (int r0 = 0; r0 < R; r0 += X4_ROWS) {
        int rows = R - r0 < X4_ROWS ? R - r0 : X4_ROWS, second = rows > 4;
        if (rows != configured) { amx_configure_x4(rows); configured = rows; }
        const int8_t* xa = in->digits + (long)DIGITS * r0 * Kp;
        const int8_t* xb = xa + 16L * Kp;
        for (int g = begin; g < end; g += 2) {
            int two = g + 1 < end;
            const int8_t* w0 = w + (long)g * gstride;
            const int8_t* w1 = w0 + gstride;
            _tile_zero(0); _tile_zero(1);
            if (second) { _tile_zero(2); _tile_zero(3); }
            for (long k = 0; k < Kp; k += 64) {
                for (int l = 0; l < 1024; l += 64) { /* the block 2 KiB on, line by line */
                    _mm_prefetch((const char*)(w0 + (k + X4_PREFETCH) * G) + l, _MM_HINT_T0);
                    if (two) _mm_prefetch((const char*)(w1 + (k + X4_PREFETCH) * G) + l, _MM_HINT_T0);
                }
                _tile_loadd(4, xa + k, Kp);
                _tile_loadd(6, w0 + k * G, 64);
                _tile_dpbssd(0, 4, 6);
                if (second) { _tile_loadd(5, xb + k, Kp); _tile_dpbssd(2, 5, 6); }
                if (two) {
                    _tile_loadd(7, w1 + k * G, 64);
                    _tile_dpbssd(1, 4, 7);
                    if (second) _tile_dpbssd(3, 5, 7);
                }
            }
            _tile_stored(0, acc[0], 64);
            if (two) _tile_stored(1, acc[1], 64);
            if (second) { _tile_stored(2, acc[2], 64); if (two) _tile_stored(3, acc[3], 64); }
            for (int i = 0; i <= two; ++i)
                for (int r = 0; r < rows; ++r) {
                    const int32_t* c = acc[i + 2 * (r >= 4)] + DIGITS * (r & 3) * 16;
                    __m512 v = join_digits(c, in->exponent[r0 + r]);
                    store_group(a->y + (long)(r0 + r) * a->N, a->N, (g + i) * G, 1, &v, a->scale, a->bias);
                }
        }
    }
    _tile_release();
}

/* Returns 0, or -1 (y untouched) where the digits' buffer cannot be allocated. */
int gemv_i8x4amx(const float* x, const int8_t* w, const float* scale, const float* bias, float* y,
                 int R, int K, int N, int nthreads) {
    int Kp = (K + 63) & ~63;
    size_t digit_bytes = ((size_t)DIGITS * R * Kp + 63) & ~(size_t)63;
    int8_t* buf = aligned_alloc(64, digit_bytes + (((size_t)R * sizeof(int) + 63) & ~(size_t)63));
    if (!buf) return -1;
    int* exponent = (int*)(buf + digit_bytes);
    x_digits(x, buf, exponent, R, K, Kp);
    x4_input in = {buf, exponent, Kp};
    gemv_args a = {&in, w, scale, bias, y, R, K, N};
    share(i8x4amx_groups, &a, (N + G - 1) / G, 2, nthreads);
    free(buf);
    return 0;
}
#else
int has_amx_int8(void) { return 0; }
#endif
"""
