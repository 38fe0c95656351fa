"""C source of the library's 16-lane float vector (``v16``), on AVX-512 or on AVX2 with FMA.

Compiled first in the library (:data:`.gemv.LIBRARY_SOURCE`): the GEMV kernels
(:mod:`.gemv_source`) and the fused stack (:mod:`.stack_source`) are written once on ``v16`` and
its operations, so one source builds for either instruction set (``-march=native`` picks which).

Why two: AVX2-only CPUs (the first EPYC generations, many cloud hosts) had no library at all, so
every decode step ran torch's kernels there (``torch._weight_int8pack_mm`` for int8 weights),
well off the bandwidth floor.

* AVX-512 (AVX512F, BW and VL): ``v16`` is ``__m512``, a mask ``m16`` is ``__mmask16``, and every
  operation is the one intrinsic it names, so the kernels compile to the code they had before
  this layer existed.
* AVX2 with FMA: ``v16`` is two ``__m256`` and ``m16`` the number of leading lanes; a partial
  load or store goes through a 16-lane buffer (only a row's last, partial vector takes it).
  Each lane computes the same operations in the same order as on AVX-512 (the sum of a vector's
  lanes, :func:`v16_reduce_add`, is the tree gcc's ``_mm512_reduce_add_ps`` uses; ``v16_scalef``
  multiplies by an exact power of two), so both builds give the same bits.

The AVX-512-only kernels (the bf16 dot product, AMX) keep their own ``__m512`` code under their
instruction sets' macros; ``VEC_AVX512`` is 1 where this layer is AVX-512.
"""

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define VEC_AVX512 1
typedef __m512 v16;
typedef __mmask16 m16;   /* the lanes a load or store touches */

/* Lanes 0..n-1 of 16 (none for n <= 0, all for n >= 16): the masked tail of a row of values. */
static inline m16 tail_mask(long n) {
    return n >= 16 ? (m16)0xFFFF : n <= 0 ? (m16)0 : (m16)((1u << n) - 1u);
}
static inline v16 v16_zero(void) { return _mm512_setzero_ps(); }
static inline v16 v16_set1(float f) { return _mm512_set1_ps(f); }
static inline v16 v16_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
static inline v16 v16_sub(v16 a, v16 b) { return _mm512_sub_ps(a, b); }
static inline v16 v16_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
static inline v16 v16_div(v16 a, v16 b) { return _mm512_div_ps(a, b); }
static inline v16 v16_min(v16 a, v16 b) { return _mm512_min_ps(a, b); }
static inline v16 v16_max(v16 a, v16 b) { return _mm512_max_ps(a, b); }
static inline v16 v16_fmadd(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
static inline v16 v16_fnmadd(v16 a, v16 b, v16 c) { return _mm512_fnmadd_ps(a, b, c); }
static inline v16 v16_round(v16 a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline v16 v16_scalef(v16 a, v16 n) { return _mm512_scalef_ps(a, n); }
static inline float v16_first(v16 a) { return _mm512_cvtss_f32(a); }
static inline float v16_reduce_add(v16 a) { return _mm512_reduce_add_ps(a); }
static inline v16 v16_load(m16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
static inline void v16_store(float* p, m16 m, v16 v) { _mm512_mask_storeu_ps(p, m, v); }
static inline v16 v16_maskz(m16 m, v16 v) { return _mm512_maskz_mov_ps(m, v); }
/* Round to the nearest bfloat16 (ties to even, torch's conversion for finite values), kept in
   float32. */
static inline v16 round_bf16(v16 v) {
    __m512i b = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    b = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    return _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32((int)0xFFFF0000u)));
}
/* 16 weights as float32: float32 as they are, int8 (exact) or bfloat16 (exact) widened */
static inline v16 load_w16_f32(const float* p) { return _mm512_loadu_ps(p); }
static inline v16 load_w16_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
static inline v16 load_w16_bf16(const uint16_t* p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
/* The lanes m of 16 bfloat16 values widened (exactly), the others zero. */
static inline v16 v16_load_bf16(m16 m, const uint16_t* p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
/* The lanes m of v (bf16 values: the top 16 bits of each float) stored as bfloat16. */
static inline void v16_store_bf16(uint16_t* p, m16 m, v16 v) {
    __m512i b = _mm512_srli_epi32(_mm512_castps_si512(v), 16);
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(b));
}

#elif defined(__AVX2__) && defined(__FMA__)
#define VEC_AVX512 0
typedef struct { __m256 lo, hi; } v16;
typedef int m16;         /* the number of leading lanes a load or store touches, 0..16 */

static inline m16 tail_mask(long n) { return n >= 16 ? 16 : n <= 0 ? 0 : (m16)n; }
#define V16_MAP1(EXPR_LO, EXPR_HI) { v16 r; r.lo = EXPR_LO; r.hi = EXPR_HI; return r; }
static inline v16 v16_zero(void) V16_MAP1(_mm256_setzero_ps(), _mm256_setzero_ps())
static inline v16 v16_set1(float f) V16_MAP1(_mm256_set1_ps(f), _mm256_set1_ps(f))
static inline v16 v16_add(v16 a, v16 b) V16_MAP1(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi))
static inline v16 v16_sub(v16 a, v16 b) V16_MAP1(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi))
static inline v16 v16_mul(v16 a, v16 b) V16_MAP1(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi))
static inline v16 v16_div(v16 a, v16 b) V16_MAP1(_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi))
static inline v16 v16_min(v16 a, v16 b) V16_MAP1(_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi))
static inline v16 v16_max(v16 a, v16 b) V16_MAP1(_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi))
static inline v16 v16_fmadd(v16 a, v16 b, v16 c)
    V16_MAP1(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi))
static inline v16 v16_fnmadd(v16 a, v16 b, v16 c)
    V16_MAP1(_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi))
#define V16_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline v16 v16_round(v16 a) V16_MAP1(_mm256_round_ps(a.lo, V16_NEAREST), _mm256_round_ps(a.hi, V16_NEAREST))
/* a * 2^n for integral n in [-126, 127] (exp16's range): one exactly rounded product, as
   _mm512_scalef_ps computes it. */
static inline __m256 pow2_8(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline v16 v16_scalef(v16 a, v16 n) V16_MAP1(_mm256_mul_ps(a.lo, pow2_8(n.lo)), _mm256_mul_ps(a.hi, pow2_8(n.hi)))
static inline float v16_first(v16 a) { return _mm256_cvtss_f32(a.lo); }
/* gcc's _mm512_reduce_add_ps tree: halves, then 128-bit halves, then pairs {0,2}+{1,3}... */
static inline float v16_reduce_add(v16 a) {
    __m256 t = _mm256_add_ps(a.hi, a.lo);
    __m128 q = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    __m128 s = _mm_add_ps(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(s) + _mm_cvtss_f32(_mm_shuffle_ps(s, s, 1));
}
static inline v16 v16_load(m16 m, const float* p) {
    if (m == 16) V16_MAP1(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8))
    float t[16] = {0};
    memcpy(t, p, sizeof(float) * (m > 0 ? m : 0));
    V16_MAP1(_mm256_loadu_ps(t), _mm256_loadu_ps(t + 8))
}
static inline void v16_store(float* p, m16 m, v16 v) {
    if (m == 16) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); return; }
    float t[16];
    _mm256_storeu_ps(t, v.lo); _mm256_storeu_ps(t + 8, v.hi);
    memcpy(p, t, sizeof(float) * (m > 0 ? m : 0));
}
static inline v16 v16_maskz(m16 m, v16 v) {
    if (m == 16) return v;
    float t[16] = {0};
    v16_store(t, m, v);
    return v16_load(16, t);
}
static inline __m256 round_bf16_8(__m256 v) {
    __m256i b = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    b = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    return _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32((int)0xFFFF0000u)));
}
static inline v16 round_bf16(v16 v) V16_MAP1(round_bf16_8(v.lo), round_bf16_8(v.hi))
static inline __m256 widen_i8_8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
static inline v16 load_w16_f32(const float* p) V16_MAP1(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8))
static inline v16 load_w16_i8(const int8_t* p) V16_MAP1(widen_i8_8(p), widen_i8_8(p + 8))
static inline __m256 widen_bf16_8(const uint16_t* p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
static inline v16 load_w16_bf16(const uint16_t* p) V16_MAP1(widen_bf16_8(p), widen_bf16_8(p + 8))
static inline v16 v16_load_bf16(m16 m, const uint16_t* p) {
    if (m == 16) return load_w16_bf16(p);
    uint16_t t[16] = {0};
    memcpy(t, p, sizeof(uint16_t) * (m > 0 ? m : 0));
    return load_w16_bf16(t);
}
static inline void v16_store_bf16(uint16_t* p, m16 m, v16 v) {
    /* the top halves, packed: packus interleaves 128-bit lanes, the permute puts them in order */
    __m256i lo = _mm256_srli_epi32(_mm256_castps_si256(v.lo), 16);
    __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(v.hi), 16);
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
    if (m == 16) { _mm256_storeu_si256((__m256i*)p, packed); return; }
    uint16_t t[16];
    _mm256_storeu_si256((__m256i*)t, packed);
    memcpy(p, t, sizeof(uint16_t) * (m > 0 ? m : 0));
}

#else
#error "the kernel library needs AVX-512 (F, BW, VL) or AVX2 with FMA"
#endif
"""
