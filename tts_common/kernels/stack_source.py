"""C source of the fused decoder-stack forward (see :mod:`tts_common.kernels.fused_stack`).

Compiled into the same library as the GEMV (:mod:`.gemv_source`, appended after it): the stack
calls ``gemv_i8`` directly and shares its worker pool (``share``), so a process has one library
and one pool.

``stack_forward_f32`` runs every layer and the final norm of a Qwen3 decoder stack for ``R = B*S``
new tokens with float32 activations and a float32 KV cache ``[layers, slots, kv_heads, max_len,
head_dim]``; token ``(b, s)`` sits at cache position ``positions[b*S + s]`` of slot ``slots[b]``
and attends keys ``[0, position]`` of that slot (written by this call first, for all its tokens,
then read). Per layer: RMSNorm -> fused q/k/v GEMV -> per-head q/k RMSNorm -> RoPE (the caller's
cos/sin rows) -> K/V written -> attention over keys 0..position (float32 online softmax in blocks
of ``KB`` keys) -> o GEMV + residual -> RMSNorm -> fused gate/up GEMV -> SiLU(gate) * up -> down
GEMV + residual; then the final RMSNorm into ``out``.

Every token's values are computed from its own row alone, in an order that does not depend on
the other rows or on which thread runs it, so a row's bits never depend on its batch. Attention
runs one (token, kv head) pair per chunk, all the query heads of that kv head together (its keys
and values stream once), on the shared workers when there is enough of it (``ATTN_MIN_WORK``).
"""

SOURCE = r"""
/* ================= fused decoder stack (tts_common.kernels.stack_source) ================= */
#include <math.h> /* INFINITY only: no libm calls */

enum {
    P_IN_NORM, P_QKV_W, P_QKV_SCALE, P_QKV_BIAS, P_Q_NORM, P_K_NORM, P_O_W, P_O_SCALE, P_O_BIAS,
    P_POST_NORM, P_GU_W, P_GU_SCALE, P_DOWN_W, P_DOWN_SCALE, P_COUNT
};

typedef struct {
    int layers, hidden, heads, kv_heads, head_dim, inter;
    float eps, scaling;
    const void* const* params;   /* [layers][P_COUNT]: see the enum; scales/biases may be NULL */
    const float* final_norm;
} stack_desc;

#define KB 64          /* keys per softmax block */
#define ATTN_MIN_WORK 32768L  /* key-dims below which attention stays on the calling thread */

/* exp on 16 lanes (Cephes expf polynomial, ~1 ulp on [-87, 88]; the softmax's and SiLU's
   arguments): 2^n * p(r), x = n ln2 + r. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

static inline __mmask16 tail_mask(int n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }

/* sum of a[i] * b[i], 16 lanes then one fixed reduction */
static inline float dot_f32(const float* a, const float* b, int n) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* y = w * (x * rsqrt(mean(x^2) + eps)), float32 (x and y may alias) */
static void rms_norm_f32(const float* x, const float* w, float* y, int n, float eps) {
    float inv = 1.0f / _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(dot_f32(x, x, n) / (float)n + eps)));
    __m512 s = _mm512_set1_ps(inv);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), v));
    }
}

/* x[0:hd] <- rope(x): x * cos + rotate_half(x) * sin (rotate_half = [-x2, x1]) */
static void rope_f32(float* x, const float* cos_row, const float* sin_row, int hd) {
    int half = hd / 2;
    float tmp[1024];
    for (int i = 0; i < half; ++i) {
        float a = x[i] * cos_row[i], b = -x[i + half] * sin_row[i];
        tmp[i] = a + b;
    }
    for (int i = half; i < hd; ++i) {
        float a = x[i] * cos_row[i], b = x[i - half] * sin_row[i];
        tmp[i] = a + b;
    }
    memcpy(x, tmp, sizeof(float) * hd);
}

typedef struct {
    const stack_desc* d; int layer;
    const float* qkv;        /* [R][(heads + 2 kv) * hd] (q, k, v) after norm and RoPE */
    const float* k_cache; const float* v_cache;
    const int64_t* positions; const int64_t* slots;
    int S, num_slots, max_len;
    float* out;              /* [R][heads * hd] */
} attn_ctx;

/* One token and one kv head, for each query head h of its group: softmax(q_h . k_j * scaling)
   over keys j = 0..position, times v_j; online softmax over blocks of KB keys (running max,
   rescaled sum and accumulator per head). The group's heads take each block in turn while its
   keys and values are in cache, so the slot's K/V stream from memory once per group, not once
   per query head. Each head's sums run in the same order whatever the group or the thread. */
static void attend_group(const attn_ctx* c, int task) {
    const stack_desc* d = c->d;
    int hd = d->head_dim, heads = d->heads, kv = d->kv_heads, group = heads / kv;
    int r = task / kv, kvh = task % kv;
    int qkv_w = (heads + 2 * kv) * hd;
    const float* q0 = c->qkv + (long)r * qkv_w + (long)kvh * group * hd;
    long pos = c->positions[r];
    long slot = c->slots[r / c->S];
    long base = ((((long)c->layer * c->num_slots + slot) * kv + kvh) * c->max_len) * hd;
    const float* K = c->k_cache + base;
    const float* V = c->v_cache + base;
    float acc[group * hd], m[group], l[group];
    for (int i = 0; i < group * hd; ++i) acc[i] = 0.0f;
    for (int g = 0; g < group; ++g) { m[g] = -INFINITY; l[g] = 0.0f; }
    float s[KB];
    for (long j0 = 0; j0 <= pos; j0 += KB) {
        int n = pos + 1 - j0 < KB ? (int)(pos + 1 - j0) : KB;
        for (int g = 0; g < group; ++g) {
            const float* q = q0 + (long)g * hd;
            float* a_g = acc + (long)g * hd;
            float bm = -INFINITY;
            for (int j = 0; j < n; ++j) {
                s[j] = dot_f32(q, K + (j0 + j) * hd, hd) * d->scaling;
                if (s[j] > bm) bm = s[j];
            }
            float nm = bm > m[g] ? bm : m[g];
            float rescale = m[g] == -INFINITY ? 0.0f : _mm512_cvtss_f32(exp16(_mm512_set1_ps(m[g] - nm)));
            __m512 vnm = _mm512_set1_ps(nm);
            float bl = 0.0f;
            for (int j = 0; j < n; j += 16) {
                __mmask16 mk = tail_mask(n - j);
                __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), vnm));
                e = _mm512_maskz_mov_ps(mk, e);
                _mm512_mask_storeu_ps(s + j, mk, e);
                bl += _mm512_reduce_add_ps(e);
            }
            l[g] = l[g] * rescale + bl;
            m[g] = nm;
            for (int i = 0; i < hd; i += 16) {
                __mmask16 mk = tail_mask(hd - i);
                __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, a_g + i), _mm512_set1_ps(rescale));
                for (int j = 0; j < n; ++j)
                    a = _mm512_fmadd_ps(_mm512_set1_ps(s[j]), _mm512_maskz_loadu_ps(mk, V + (j0 + j) * hd + i), a);
                _mm512_mask_storeu_ps(a_g + i, mk, a);
            }
        }
    }
    for (int g = 0; g < group; ++g) {
        float* o = c->out + (long)r * heads * hd + (long)(kvh * group + g) * hd;
        float inv = 1.0f / l[g];
        for (int i = 0; i < hd; ++i) o[i] = acc[(long)g * hd + i] * inv;
    }
}

static void attend_range(const gemv_args* a, int begin, int end) {
    /* share() hands its range function a gemv_args: the attention context rides in ``x``. */
    const attn_ctx* c = (const attn_ctx*)a->x;
    for (int t = begin; t < end; ++t) attend_group(c, t);
}

static void linear_i8(const float* x, const void* w, const void* scale, const void* bias, float* y,
                      int R, int K, int N, int nthreads) {
    gemv_i8(x, (const int8_t*)w, (const float*)scale, (const float*)bias, y, R, K, N, nthreads);
}

/* silu(gate) * up: gu [R][2I] (gate then up) -> act [R][I] */
static void silu_mul_f32(const float* gu, float* act, int R, int I) {
    for (int r = 0; r < R; ++r) {
        const float* g = gu + (long)r * 2 * I;
        const float* u = g + I;
        float* o = act + (long)r * I;
        for (int i = 0; i < I; i += 16) {
            __mmask16 m = tail_mask(I - i);
            __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
            __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            __m512 sv = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
            _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(m, u + i)));
        }
    }
}

static void add_f32(float* x, const float* y, long n) {
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i > 16 ? 16 : (int)(n - i));
        _mm512_mask_storeu_ps(x + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* Floats of workspace stack_forward_f32 needs for R tokens. */
long stack_workspace_f32(const stack_desc* d, int R) {
    long H = d->hidden, A = (long)d->heads * d->head_dim, QKV = A + 2L * d->kv_heads * d->head_dim;
    return (long)R * (3 * H + QKV + A + 3L * d->inter);
}

/* Returns 0, or 1 for a position outside [0, max_len), 2 for a slot outside [0, num_slots), 3 for
   a head_dim over 1024, query heads not a multiple of the kv heads or more than 64 to a kv head
   (checked before anything is written). */
int stack_forward_f32(const stack_desc* d, const float* x_in, float* out, const float* cos_t, const float* sin_t,
                      const int64_t* positions, const int64_t* slots, int B, int S,
                      float* k_cache, float* v_cache, int num_slots, int max_len, float* work, int nthreads) {
    int R = B * S, H = d->hidden, hd = d->head_dim, heads = d->heads, kv = d->kv_heads, I = d->inter;
    if (hd > 1024 || heads % kv || heads / kv > 64) return 3;
    for (int r = 0; r < R; ++r) if (positions[r] < 0 || positions[r] >= max_len) return 1;
    for (int b = 0; b < B; ++b) if (slots[b] < 0 || slots[b] >= num_slots) return 2;
    int A = heads * hd, QKV = A + 2 * kv * hd;
    float* x = work;
    float* h = x + (long)R * H;
    float* tmp = h + (long)R * H;
    float* qkv = tmp + (long)R * H;
    float* attn = qkv + (long)R * QKV;
    float* gu = attn + (long)R * A;
    float* act = gu + (long)R * 2 * I;
    memcpy(x, x_in, sizeof(float) * (long)R * H);
    long work_keys = 0;
    for (int r = 0; r < R; ++r) work_keys += (positions[r] + 1) * (long)hd * heads;
    for (int layer = 0; layer < d->layers; ++layer) {
        const void* const* p = d->params + (long)layer * P_COUNT;
        for (int r = 0; r < R; ++r) rms_norm_f32(x + (long)r * H, p[P_IN_NORM], h + (long)r * H, H, d->eps);
        linear_i8(h, p[P_QKV_W], p[P_QKV_SCALE], p[P_QKV_BIAS], qkv, R, H, QKV, nthreads);
        for (int r = 0; r < R; ++r) {
            float* row = qkv + (long)r * QKV;
            const float* c = cos_t + (long)r * hd;
            const float* s = sin_t + (long)r * hd;
            for (int hh = 0; hh < heads; ++hh) {
                rms_norm_f32(row + (long)hh * hd, p[P_Q_NORM], row + (long)hh * hd, hd, d->eps);
                rope_f32(row + (long)hh * hd, c, s, hd);
            }
            long slot = slots[r / S], pos = positions[r];
            for (int kh = 0; kh < kv; ++kh) {
                float* k = row + A + (long)kh * hd;
                rms_norm_f32(k, p[P_K_NORM], k, hd, d->eps);
                rope_f32(k, c, s, hd);
                long at = ((((long)layer * num_slots + slot) * kv + kh) * max_len + pos) * hd;
                memcpy(k_cache + at, k, sizeof(float) * hd);
                memcpy(v_cache + at, row + A + (long)kv * hd + (long)kh * hd, sizeof(float) * hd);
            }
        }
        attn_ctx ctx = {d, layer, qkv, k_cache, v_cache, positions, slots, S, num_slots, max_len, attn};
        gemv_args a = {&ctx, NULL, NULL, NULL, NULL, 0, 0, 0};
        share(attend_range, &a, R * kv, 1, work_keys >= ATTN_MIN_WORK ? nthreads : 1);
        linear_i8(attn, p[P_O_W], p[P_O_SCALE], p[P_O_BIAS], tmp, R, A, H, nthreads);
        add_f32(x, tmp, (long)R * H);
        for (int r = 0; r < R; ++r) rms_norm_f32(x + (long)r * H, p[P_POST_NORM], h + (long)r * H, H, d->eps);
        linear_i8(h, p[P_GU_W], p[P_GU_SCALE], NULL, gu, R, H, 2 * I, nthreads);
        silu_mul_f32(gu, act, R, I);
        linear_i8(act, p[P_DOWN_W], p[P_DOWN_SCALE], NULL, tmp, R, I, H, nthreads);
        add_f32(x, tmp, (long)R * H);
    }
    for (int r = 0; r < R; ++r) rms_norm_f32(x + (long)r * H, d->final_norm, out + (long)r * H, H, d->eps);
    return 0;
}
"""
