"""C source of the fused decoder-stack forward (see :mod:`tts_common.kernels.fused_stack`).

Compiled into the same library as the GEMV (:mod:`.gemv_source`, appended after it): the stack
calls ``gemv_f32``/``gemv_i8``/``gemv_bf16``/``gemv_bf16dp``/``gemv_i8dp``, the AMX kernels and
``gemv_i8a8`` (:mod:`.w8a8_source`) directly and shares their worker pool (``share``), so a process has one library and one pool.

``stack_forward`` runs every layer and the final norm of a Qwen3 decoder stack for ``R = B*S``
new tokens, float32 or bfloat16 activations (held as float32, rounded to bf16 wherever the torch
path stores a bf16 tensor) and a KV cache of the same dtype ``[layers, slots, kv_heads, max_len,
head_dim]``; token ``(b, s)`` sits at cache position ``positions[b*S + s]`` of slot ``slots[b]``
and attends keys ``[0, position]`` of that slot (written by this call first, for all its tokens,
then read). Per layer: RMSNorm -> q/k/v GEMV (one fused call, or one per part where the
kernel choice kept different kernels for their shapes; each linear runs its own kernel) ->
per-head q/k RMSNorm -> RoPE (the caller's
cos/sin rows) -> K/V written -> attention over keys 0..position (float32 online softmax in blocks
of ``KB`` keys) -> o GEMV + residual -> RMSNorm -> gate/up GEMV (fused or per part) -> SiLU(gate) * up -> down
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
    P_POST_NORM, P_GU_W, P_GU_SCALE, P_DOWN_W, P_DOWN_SCALE,
    /* q/k/v or gate/up not fused into one call (their parts' kernels differ): P_QKV_* is q,
       P_GU_* is gate, and these the other parts; P_K_W / P_UP_W NULL where fused */
    P_K_W, P_K_SCALE, P_K_BIAS, P_V_W, P_V_SCALE, P_V_BIAS, P_UP_W, P_UP_SCALE, P_COUNT
};
enum { K_I8 = 0, K_BF16 = 1, K_BF16DP = 2, K_I8AMX = 3, K_BF16AMX = 4, K_I8X4AMX = 5, K_I8DP = 6, K_F32 = 7, K_I8A8 = 8 };

typedef struct {
    int layers, hidden, heads, kv_heads, head_dim, inter;
    int bf16;   /* activations and KV cache in bfloat16 (values rounded where torch stores them) */
    const int* kinds;  /* [layers][KINDS_PER_LAYER]: the GEMV of q/k/v (or q), o, gate/up (or
                          gate), down, k, v, up (K_*: each linear runs the kernel the choice kept
                          for its shape) */
    float eps, scaling;
    const void* const* params;   /* [layers][P_COUNT]: see the enum; scales/biases may be NULL;
                                    norm weights float32 */
    const float* final_norm;
} stack_desc;

#define KINDS_PER_LAYER 7
#define KB 64          /* keys per softmax block */
#define ATTN_MIN_WORK 32768L  /* key-dims below which attention stays on the calling thread */

/* exp on 16 lanes (Cephes expf polynomial, ~1 ulp on [-87, 88]; the softmax's and SiLU's
   arguments): 2^n * p(r), x = n ln2 + r. */
static inline v16 exp16(v16 x) {
    x = v16_min(v16_max(x, v16_set1(-87.3f)), v16_set1(88.3f));
    v16 n = v16_round(v16_mul(x, v16_set1(1.44269504088896341f)));
    v16 r = v16_fnmadd(n, v16_set1(0.693359375f), x);
    r = v16_fnmadd(n, v16_set1(-2.12194440e-4f), r);
    v16 p = v16_set1(1.9875691500e-4f);
    p = v16_fmadd(p, r, v16_set1(1.3981999507e-3f));
    p = v16_fmadd(p, r, v16_set1(8.3334519073e-3f));
    p = v16_fmadd(p, r, v16_set1(4.1665795894e-2f));
    p = v16_fmadd(p, r, v16_set1(1.6666665459e-1f));
    p = v16_fmadd(p, r, v16_set1(5.0000001201e-1f));
    p = v16_fmadd(v16_mul(p, r), r, v16_add(r, v16_set1(1.0f)));
    return v16_scalef(p, n);
}

/* round_bf16 (:mod:`.vec_source`) only for bf16 activations */
static inline v16 rnd(v16 v, int bf16) { return bf16 ? round_bf16(v) : v; }

/* 16 cache values as float32 (a bf16 cache widened exactly) */
static inline v16 load_kv(m16 m, const void* base, long i, int bf16) {
    if (!bf16) return v16_load(m, (const float*)base + i);
    return v16_load_bf16(m, (const uint16_t*)base + i);
}

/* sum of a[i] * b[i], 16 lanes then one fixed reduction (b from the cache) */
static inline float dot_kv(const float* a, const void* b, long at, int n, int bf16) {
    v16 acc = v16_zero();
    for (int i = 0; i < n; i += 16) {
        m16 m = tail_mask(n - i);
        acc = v16_fmadd(v16_load(m, a + i), load_kv(m, b, at + i, bf16), acc);
    }
    return v16_reduce_add(acc);
}

/* y = w * round(x * rsqrt(mean(x^2) + eps)), rounded (x and y may alias): torch's RMSNorm */
static void rms_norm(const float* x, const float* w, float* y, int n, float eps, int bf16) {
    float ss = dot_kv(x, x, 0, n, 0);
    float inv = 1.0f / _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(ss / (float)n + eps)));
    v16 s = v16_set1(inv);
    for (int i = 0; i < n; i += 16) {
        m16 m = tail_mask(n - i);
        v16 v = rnd(v16_mul(v16_load(m, x + i), s), bf16);
        v16_store(y + i, m, rnd(v16_mul(v16_load(m, w + i), v), bf16));
    }
}

/* x[0:hd] <- x * cos + rotate_half(x) * sin (rotate_half = [-x2, x1]), each product and the sum
   rounded as torch stores them */
static void rope(float* x, const float* cos_row, const float* sin_row, int hd, int bf16) {
    int half = hd / 2;
    float tmp[1024];
    for (int i = 0; i < half; i += 16) {
        m16 m = tail_mask(half - i);
        v16 x1 = v16_load(m, x + i), x2 = v16_load(m, x + half + i);
        v16 c1 = v16_load(m, cos_row + i), s1 = v16_load(m, sin_row + i);
        v16 c2 = v16_load(m, cos_row + half + i), s2 = v16_load(m, sin_row + half + i);
        v16 neg_x2 = v16_sub(v16_zero(), x2);
        v16 o1 = v16_add(rnd(v16_mul(x1, c1), bf16), rnd(v16_mul(neg_x2, s1), bf16));
        v16 o2 = v16_add(rnd(v16_mul(x2, c2), bf16), rnd(v16_mul(x1, s2), bf16));
        v16_store(tmp + i, m, rnd(o1, bf16));
        v16_store(tmp + half + i, m, rnd(o2, bf16));
    }
    memcpy(x, tmp, sizeof(float) * hd);
}

/* n float32 values holding bf16 values (already rounded: the top 16 bits are the value) as bf16 */
static void store_bf16_values(uint16_t* dst, const float* v, long n) {
    for (long i = 0; i < n; i += 16) {
        m16 m = tail_mask(n - i);
        v16_store_bf16(dst + i, m, v16_load(m, v + i));
    }
}

/* n values into the cache (bf16: already rounded) */
static void store_kv(void* cache, long at, const float* v, int n, int bf16) {
    if (!bf16) { memcpy((float*)cache + at, v, sizeof(float) * n); return; }
    store_bf16_values((uint16_t*)cache + at, v, n);
}

typedef struct {
    const stack_desc* d; int layer;
    const float* qkv;        /* [R][(heads + 2 kv) * hd] (q, k, v) after norm and RoPE */
    const void* k_cache; const void* v_cache;
    const int64_t* positions; const int64_t* slots;
    int S, num_slots, max_len;
    float* out;              /* [R][heads * hd] */
} attn_ctx;

/* One token and one kv head, for each query head h of its group: softmax(q_h . k_j * scaling)
   over keys j = 0..position, times v_j; online softmax over blocks of KB keys (running max,
   rescaled sum and accumulator per head). The group's heads take each block in turn while its
   keys and values are in cache, so the slot's K/V stream from memory once per group, not once
   per query head. Each head's sums run in the same order whatever the group or the thread.
   bf16: the probabilities are rounded to bf16 before they weight the values (as torch's CPU
   flash attention does), the output rounded. */
static void attend_group(const attn_ctx* c, int task) {
    const stack_desc* d = c->d;
    int hd = d->head_dim, heads = d->heads, kv = d->kv_heads, group = heads / kv, bf16 = d->bf16;
    int r = task / kv, kvh = task % kv;
    int qkv_w = (heads + 2 * kv) * hd;
    const float* q0 = c->qkv + (long)r * qkv_w + (long)kvh * group * hd;
    long pos = c->positions[r];
    long slot = c->slots[r / c->S];
    long base = ((((long)c->layer * c->num_slots + slot) * kv + kvh) * c->max_len) * hd;
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
                s[j] = dot_kv(q, c->k_cache, base + (j0 + j) * hd, hd, bf16) * d->scaling;
                if (s[j] > bm) bm = s[j];
            }
            float nm = bm > m[g] ? bm : m[g];
            float rescale = m[g] == -INFINITY ? 0.0f : v16_first(exp16(v16_set1(m[g] - nm)));
            v16 vnm = v16_set1(nm);
            float bl = 0.0f;
            for (int j = 0; j < n; j += 16) {
                m16 mk = tail_mask(n - j);
                v16 e = v16_maskz(mk, exp16(v16_sub(v16_load(mk, s + j), vnm)));
                bl += v16_reduce_add(e);
                v16_store(s + j, mk, rnd(e, bf16));
            }
            l[g] = l[g] * rescale + bl;
            m[g] = nm;
            for (int i = 0; i < hd; i += 16) {
                m16 mk = tail_mask(hd - i);
                v16 a = v16_mul(v16_load(mk, a_g + i), v16_set1(rescale));
                for (int j = 0; j < n; ++j)
                    a = v16_fmadd(v16_set1(s[j]), load_kv(mk, c->v_cache, base + (j0 + j) * hd + i, bf16), a);
                v16_store(a_g + i, mk, a);
            }
        }
    }
    for (int g = 0; g < group; ++g) {
        float* o = c->out + (long)r * heads * hd + (long)(kvh * group + g) * hd;
        v16 inv = v16_set1(1.0f / l[g]);
        for (int i = 0; i < hd; i += 16) {
            m16 mk = tail_mask(hd - i);
            v16_store(o + i, mk, rnd(v16_mul(v16_load(mk, acc + (long)g * hd + i), inv), bf16));
        }
    }
}

static void attend_range(const gemv_args* a, int begin, int end) {
    /* share() hands its range function a gemv_args: the attention context rides in ``x``. */
    const attn_ctx* c = (const attn_ctx*)a->x;
    for (int t = begin; t < end; ++t) attend_group(c, t);
}

static void round_rows(float* y, long n, int bf16) {
    if (!bf16) return;
    for (long i = 0; i < n; i += 16) {
        m16 m = tail_mask(n - i);
        v16_store(y + i, m, round_bf16(v16_load(m, y + i)));
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define STACK_HAS_AMX 1
#else
#define STACK_HAS_AMX 0
#endif
#if STACK_HAS_AMX && defined(__AMX_INT8__)
#define STACK_HAS_AMX_INT8 1
#else
#define STACK_HAS_AMX_INT8 0
#endif

/* y = x @ W.T (* scale) (+ bias) with the stack's GEMV, rounded for bf16 activations; ``xb``:
   room for x as bf16 (the dot-product and bf16 AMX kernels' input). Returns 0, 4 where the
   kernel is not in this build, or 5 where an allocating int8 kernel (AMX-INT8, w8a8) could not allocate. */
static int linear(const stack_desc* d, int kind, const float* x, uint16_t* xb, const void* w, const void* scale,
                  const void* bias, float* y, int R, int K, int N, int nthreads) {
    const float* sc = (const float*)scale;
    const float* bi = (const float*)bias;
    if (kind == K_F32) {
        gemv_f32(x, (const float*)w, sc, bi, y, R, K, N, nthreads);
    } else if (kind == K_I8) {
        gemv_i8(x, (const int8_t*)w, sc, bi, y, R, K, N, nthreads);
    } else if (kind == K_BF16) {
        gemv_bf16(x, (const uint16_t*)w, sc, bi, y, R, K, N, nthreads);
    } else if (kind == K_I8AMX) {
#if STACK_HAS_AMX
        if (gemv_i8amx(x, (const int8_t*)w, sc, bi, y, R, K, N, nthreads)) return 5;
#else
        return 4;
#endif
    } else if (kind == K_I8X4AMX) {
#if STACK_HAS_AMX_INT8
        if (gemv_i8x4amx(x, (const int8_t*)w, sc, bi, y, R, K, N, nthreads)) return 5;
#else
        return 4;
#endif
    } else if (kind == K_I8A8) {
#if HAS_W8A8
        if (gemv_i8a8(x, (const int8_t*)w, sc, bi, y, R, K, N, nthreads)) return 5;
#else
        return 4;
#endif
    } else {
#ifdef __AVX512BF16__
        store_bf16_values(xb, x, (long)R * K); /* x holds bf16 values */
        if (kind == K_BF16DP) {
            gemv_bf16dp(xb, (const uint16_t*)w, sc, bi, y, R, K, N, nthreads);
        } else if (kind == K_I8DP) {
            gemv_i8dp(xb, (const int8_t*)w, sc, bi, y, R, K, N, nthreads);
        } else {
#if STACK_HAS_AMX
            gemv_bf16amx(xb, (const uint16_t*)w, sc, bi, y, R, K, N, nthreads);
#else
            return 4;
#endif
        }
#else
        (void)xb;
        return 4;
#endif
    }
    round_rows(y, (long)R * N, d->bf16);
    return 0;
}

/* out [R][sum of n] = the parts' outputs side by side: one call where they are fused (parts = 1,
   n[0] then ignored: the weight's whole width), else one call per part (param slots w[i], kind
   index k[i], width n[i]) through ``scratch`` [R][max n] */
static int project(const stack_desc* d, const void* const* p, const int* kind, const int* w, const int* k,
                   const int* n, int parts, const float* x, uint16_t* xb, float* out, float* scratch, int R,
                   int K, int nthreads) {
    int total = 0;
    for (int i = 0; i < (parts == 1 ? 0 : parts); ++i) total += n[i];
    if (parts == 1) {
        for (int i = 0; i < (w[0] == P_QKV_W ? 3 : 2); ++i) total += n[i];
        return linear(d, kind[k[0]], x, xb, p[w[0]], p[w[0] + 1], w[0] == P_QKV_W ? p[w[0] + 2] : NULL, out, R, K, total, nthreads);
    }
    int off = 0;
    for (int i = 0; i < parts; ++i) {
        const void* bias = w[i] == P_UP_W || w[i] == P_GU_W ? NULL : p[w[i] + 2];
        int rc = linear(d, kind[k[i]], x, xb, p[w[i]], p[w[i] + 1], bias, scratch, R, K, n[i], nthreads);
        if (rc) return rc;
        for (int r = 0; r < R; ++r) memcpy(out + (long)r * total + off, scratch + (long)r * n[i], sizeof(float) * n[i]);
        off += n[i];
    }
    return 0;
}

/* round(round(silu(gate)) * up): gu [R][2I] (gate then up) -> act [R][I] */
static void silu_mul(const float* gu, float* act, int R, int I, int bf16) {
    for (int r = 0; r < R; ++r) {
        const float* g = gu + (long)r * 2 * I;
        const float* u = g + I;
        float* o = act + (long)r * I;
        for (int i = 0; i < I; i += 16) {
            m16 m = tail_mask(I - i);
            v16 gv = v16_load(m, g + i);
            v16 e = exp16(v16_sub(v16_zero(), gv));
            v16 sv = rnd(v16_div(gv, v16_add(v16_set1(1.0f), e)), bf16);
            v16_store(o + i, m, rnd(v16_mul(sv, v16_load(m, u + i)), bf16));
        }
    }
}

/* x = round(x + y) */
static void add_rows(float* x, const float* y, long n, int bf16) {
    for (long i = 0; i < n; i += 16) {
        m16 m = tail_mask(n - i);
        v16 v = v16_add(v16_load(m, x + i), v16_load(m, y + i));
        v16_store(x + i, m, rnd(v, bf16));
    }
}

static long max3(long a, long b, long c) { long m = a > b ? a : b; return m > c ? m : c; }

/* Floats of workspace stack_forward needs for R tokens. */
long stack_workspace(const stack_desc* d, int R) {
    long H = d->hidden, A = (long)d->heads * d->head_dim, QKV = A + 2L * d->kv_heads * d->head_dim;
    return (long)R * (3 * H + QKV + A + 3L * d->inter + (A > d->inter ? A : d->inter) + max3(H, A, d->inter));
}

/* The stack's forward for B rows of S tokens: x_in/out [R][hidden] float32 (bf16 values for bf16
   activations), cos/sin [R][head_dim], caches [layers][num_slots][kv][max_len][head_dim] (float32
   or bf16). Returns 0, or 1 for a position outside [0, max_len), 2 for a slot outside
   [0, num_slots), 3 for a head_dim over 1024, query heads not a multiple of the kv heads or more
   than 64 to a kv head (all checked before anything is written), 4 for a kernel not built here,
   5 where an allocating int8 kernel could not allocate (the cache may then hold this call's first
   layers' K/V, which the next write at these positions replaces). */
int stack_forward(const stack_desc* d, const float* x_in, float* out, const float* cos_t, const float* sin_t,
                  const int64_t* positions, const int64_t* slots, int B, int S,
                  void* k_cache, void* v_cache, int num_slots, int max_len, float* work, int nthreads) {
    int R = B * S, H = d->hidden, hd = d->head_dim, heads = d->heads, kv = d->kv_heads, I = d->inter;
    int bf16 = d->bf16, rc;
    if (hd > 1024 || heads % kv || heads / kv > 64) return 3;
    for (int i = 0; i < d->layers * KINDS_PER_LAYER; ++i) {
        int kind = d->kinds[i];
        if (kind < K_I8 || kind > K_I8A8) return 4;
#ifndef __AVX512BF16__
        if (kind == K_BF16DP || kind == K_I8DP) return 4;
#endif
        if (!STACK_HAS_AMX && (kind == K_I8AMX || kind == K_BF16AMX)) return 4;
        if (!STACK_HAS_AMX_INT8 && kind == K_I8X4AMX) return 4;
        if (!HAS_W8A8 && kind == K_I8A8) return 4;
    }
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
    float* scratch = act + (long)R * I;
    uint16_t* xb = (uint16_t*)(scratch + (long)R * (A > I ? A : I));
    memcpy(x, x_in, sizeof(float) * (long)R * H);
    long work_keys = 0;
    for (int r = 0; r < R; ++r) work_keys += (positions[r] + 1) * (long)hd * heads;
    for (int layer = 0; layer < d->layers; ++layer) {
        const void* const* p = d->params + (long)layer * P_COUNT;
        for (int r = 0; r < R; ++r) rms_norm(x + (long)r * H, p[P_IN_NORM], h + (long)r * H, H, d->eps, bf16);
        const int* kind = d->kinds + (long)layer * KINDS_PER_LAYER;
        {
            const int w[3] = {P_QKV_W, P_K_W, P_V_W}, k[3] = {0, 4, 5}, n[3] = {A, kv * hd, kv * hd};
            if ((rc = project(d, p, kind, w, k, n, p[P_K_W] ? 3 : 1, h, xb, qkv, scratch, R, H, nthreads))) return rc;
        }
        for (int r = 0; r < R; ++r) {
            float* row = qkv + (long)r * QKV;
            const float* c = cos_t + (long)r * hd;
            const float* s = sin_t + (long)r * hd;
            for (int hh = 0; hh < heads; ++hh) {
                rms_norm(row + (long)hh * hd, p[P_Q_NORM], row + (long)hh * hd, hd, d->eps, bf16);
                rope(row + (long)hh * hd, c, s, hd, bf16);
            }
            long slot = slots[r / S], pos = positions[r];
            for (int kh = 0; kh < kv; ++kh) {
                float* k = row + A + (long)kh * hd;
                rms_norm(k, p[P_K_NORM], k, hd, d->eps, bf16);
                rope(k, c, s, hd, bf16);
                long at = ((((long)layer * num_slots + slot) * kv + kh) * max_len + pos) * hd;
                store_kv(k_cache, at, k, hd, bf16);
                store_kv(v_cache, at, row + A + (long)kv * hd + (long)kh * hd, hd, bf16);
            }
        }
        attn_ctx ctx = {d, layer, qkv, k_cache, v_cache, positions, slots, S, num_slots, max_len, attn};
        gemv_args a = {&ctx, NULL, NULL, NULL, NULL, 0, 0, 0};
        share(attend_range, &a, R * kv, 1, work_keys >= ATTN_MIN_WORK ? nthreads : 1);
        if ((rc = linear(d, kind[1], attn, xb, p[P_O_W], p[P_O_SCALE], p[P_O_BIAS], tmp, R, A, H, nthreads))) return rc;
        add_rows(x, tmp, (long)R * H, bf16);
        for (int r = 0; r < R; ++r) rms_norm(x + (long)r * H, p[P_POST_NORM], h + (long)r * H, H, d->eps, bf16);
        {
            const int w[2] = {P_GU_W, P_UP_W}, k[2] = {2, 6}, n[2] = {I, I};
            if ((rc = project(d, p, kind, w, k, n, p[P_UP_W] ? 2 : 1, h, xb, gu, scratch, R, H, nthreads))) return rc;
        }
        silu_mul(gu, act, R, I, bf16);
        if ((rc = linear(d, kind[3], act, xb, p[P_DOWN_W], p[P_DOWN_SCALE], NULL, tmp, R, I, H, nthreads))) return rc;
        add_rows(x, tmp, (long)R * H, bf16);
    }
    for (int r = 0; r < R; ++r) rms_norm(x + (long)r * H, d->final_norm, out + (long)r * H, H, d->eps, bf16);
    return 0;
}
"""
