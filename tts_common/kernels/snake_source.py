"""C source of the decoder's SnakeBeta activation in one pass (see :mod:`tts_common.kernels.snake`).

``y = x + inv_beta[c] * sin(x * alpha[c])^2`` in float32 for float32 or bfloat16 ``x`` (bf16 read
widened exactly, the result rounded to bf16 as torch's ``.to(bfloat16)`` does). Torch runs it as
five element-wise passes over the activations (with two more for the bf16 casts), each a round
trip through memory; here each value is read once and written once.

``sin`` is evaluated as Cephes' ``sinf``/``cosf`` do: ``t`` reduced by the nearest multiple ``j``
of pi/2 in three parts (Cody-Waite, exact products for ``|j| < 2^15``), then the sine or the
cosine polynomial of the remainder by ``j``'s parity; the sign is dropped by the square. A row
holding some ``|t|`` beyond :data:`LIMIT` is computed again lane by lane with the reduction in
double precision. Within a few float32 ulps of torch's ``sin`` (SLEEF), so the activation is not
torch's bit for bit (property-tested, ``tests/unit/common/test_snake.py``), but it is one function
of the value and its channel: a row's result never depends on its batch, its chunk or its
neighbours, so streamed audio still equals the whole-utterance decode.

Compiled after :mod:`.vec_source` and :mod:`.pool_source` (``v16``, ``share``).
"""

LIMIT = 8192.0
"""Largest ``|x * alpha|`` the three-part reduction in float32 takes (beyond it, double)."""

SOURCE = (
    f"""
/* ================= SnakeBeta (tts_common.kernels.snake_source) ================= */
#define SNAKE_LIMIT {LIMIT:.1f}f
"""
    + r"""
/* sin(t)^2 on 16 lanes (|t| <= SNAKE_LIMIT) */
static inline v16 sin_squared16(v16 t) {
    v16 j = v16_round(v16_mul(t, v16_set1(0.636619772367581343f)));
    v16 r = v16_fnmadd(j, v16_set1(1.5703125f), t);
    r = v16_fnmadd(j, v16_set1(4.837512969970703125e-4f), r);
    r = v16_fnmadd(j, v16_set1(7.54978995489188216e-8f), r);
    v16 z = v16_mul(r, r);
    v16 s = v16_fmadd(z, v16_set1(-1.9515295891e-4f), v16_set1(8.3321608736e-3f));
    s = v16_fmadd(z, s, v16_set1(-1.6666654611e-1f));
    s = v16_fmadd(v16_mul(z, s), r, r);
    v16 c = v16_fmadd(z, v16_set1(2.443315711809948e-5f), v16_set1(-1.388731625493765e-3f));
    c = v16_fmadd(z, c, v16_set1(4.166664568298827e-2f));
    c = v16_fmadd(v16_mul(z, z), c, v16_fnmadd(z, v16_set1(0.5f), v16_set1(1.0f)));
    /* odd = 1 where j is odd, else 0 (exact): the cosine's square there, the sine's elsewhere,
       each product by 0 or 1 exact and one of the two terms zero */
    v16 half = v16_mul(j, v16_set1(0.5f));
    v16 odd = v16_sub(half, v16_round(half));
    odd = v16_mul(odd, odd);
    odd = v16_add(odd, odd);
    odd = v16_add(odd, odd); /* (+-0.5)^2 * 4 = 1 */
    v16 s2 = v16_mul(s, s), c2 = v16_mul(c, c);
    return v16_fmadd(odd, c2, v16_mul(v16_sub(v16_set1(1.0f), odd), s2));
}

/* sin(t)^2 for one value, the reduction in double (any |t| whose multiple of pi/2 fits) */
static float sin_squared_wide(float t) {
    double q = (double)t * 0.63661977236758134308;
    if (!(q > -9.0e15 && q < 9.0e15)) return t - t; /* inf or NaN: NaN, as sin */
    long long j = (long long)(q >= 0 ? q + 0.5 : q - 0.5);
    double r = ((double)t - (double)j * 1.5707963267948966) - (double)j * 6.123233995736766e-17;
    double z = r * r;
    double v = (j & 1)
        ? 1 - z / 2 * (1 - z / 12 * (1 - z / 30 * (1 - z / 56 * (1 - z / 90 * (1 - z / 132)))))
        : r * (1 - z / 6 * (1 - z / 20 * (1 - z / 42 * (1 - z / 72 * (1 - z / 110 * (1 - z / 156))))));
    return (float)v * (float)v;
}

/* rows of n contiguous values, per_batch rows a batch item: x's rows x_row values apart and its
   items x_batch apart, y's likewise; the coefficients by the row within its item (channel-major)
   or by the column (time-major) */
typedef struct {
    const void* x; void* y; const float* alpha; const float* inv_beta;
    long n, x_row, x_batch, y_row, y_batch; int per_batch, bf16, per_column;
} snake_args;

static inline v16 snake_load(const snake_args* s, long i, m16 m) {
    return s->bf16 ? v16_load_bf16(m, (const uint16_t*)s->x + i) : v16_load(m, (const float*)s->x + i);
}
static inline void snake_store(const snake_args* s, long i, m16 m, v16 v) {
    if (s->bf16) v16_store_bf16((uint16_t*)s->y + i, m, round_bf16(v));
    else v16_store((float*)s->y + i, m, v);
}
static inline float snake_value(const snake_args* s, long i) {
    if (!s->bf16) return ((const float*)s->x)[i];
    uint32_t u = (uint32_t)((const uint16_t*)s->x)[i] << 16; float f; memcpy(&f, &u, 4); return f;
}

static void snake_rows(const gemv_args* a, int begin, int end) {
    const snake_args* s = (const snake_args*)a->x;
    long n = s->n;
    for (int r = begin; r < end; ++r) {
        int row = r % s->per_batch, item = r / s->per_batch;
        long base = item * s->x_batch + row * s->x_row, out = item * s->y_batch + row * s->y_row;
        v16 big = v16_zero();
        for (long i = 0; i < n; i += 16) {
            m16 m = tail_mask(n - i);
            v16 x = snake_load(s, base + i, m);
            v16 al = s->per_column ? v16_load(m, s->alpha + i) : v16_set1(s->alpha[row]);
            v16 ib = s->per_column ? v16_load(m, s->inv_beta + i) : v16_set1(s->inv_beta[row]);
            v16 t = v16_mul(x, al);
            /* a |t| past the limit leaves a lane of big above it (a NaN t needs no second pass:
               its vector result is already NaN, as torch's) */
            big = v16_max(big, v16_max(t, v16_sub(v16_zero(), t)));
            snake_store(s, out + i, m, v16_add(v16_mul(sin_squared16(t), ib), x));
        }
        float lanes[16];
        v16_store(lanes, 16, big);
        int wide = 0;
        for (int l = 0; l < 16; ++l) wide |= !(lanes[l] <= SNAKE_LIMIT);
        if (!wide) continue;
        for (long i = 0; i < n; ++i) {
            float x = snake_value(s, base + i);
            float t = x * (s->per_column ? s->alpha[i] : s->alpha[row]);
            if (t >= -SNAKE_LIMIT && t <= SNAKE_LIMIT) continue;
            float y = sin_squared_wide(t) * (s->per_column ? s->inv_beta[i] : s->inv_beta[row]) + x;
            if (s->bf16) { /* rounded to the nearest bf16, ties to even (round_bf16) */
                uint32_t b; memcpy(&b, &y, 4);
                b += 0x7FFF + ((b >> 16) & 1);
                ((uint16_t*)s->y)[out + i] = (uint16_t)(b >> 16);
            } else {
                ((float*)s->y)[out + i] = y;
            }
        }
    }
}

/* y = x + inv_beta * sin(x * alpha)^2 over batch x per_batch rows of n; returns 0 */
int snake_beta(const void* x, void* y, const float* alpha, const float* inv_beta, int batch, int per_batch,
               long n, long x_row, long x_batch, long y_row, long y_batch, int bf16, int per_column,
               int nthreads) {
    snake_args s = {x, y, alpha, inv_beta, n, x_row, x_batch, y_row, y_batch, per_batch, bf16, per_column};
    int rows = batch * per_batch;
    gemv_args a = {&s, NULL, NULL, NULL, NULL, rows, 0, 0};
    share(snake_rows, &a, rows, n >= 4096 ? 1 : (int)(4096 / (n > 0 ? n : 1)), nthreads);
    return 0;
}
"""
)
