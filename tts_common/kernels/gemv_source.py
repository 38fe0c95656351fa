"""C source of our AVX-512 weight-streaming GEMV/small-GEMM (see :mod:`tts_common.kernels.gemv`).

Kept as a string so the package needs no package-data and the build hashes exactly what it
compiles. ``y[r, n] = scale[n] * sum_k x[r, k] * w[n, k] + bias[n]`` with fp32 ``x``/``y`` and
int8 or bfloat16 ``w`` (``scale`` only for int8), or bf16 ``x`` and ``w`` with the bf16 dot
product.

Packed layout (``gemv_i8``, ``gemv_bf16``, ``gemv_bf16dp``): the weight is pre-packed at load in
groups of 16 output channels, k-major, one vector lane per channel (:func:`.gemv.pack_weight`).
A step loads 16 channels' weights for one k (two for the dot product) and multiplies them by that
k's activation broadcast, so no horizontal reduction is needed, each thread streams contiguous
memory, and one weight load (and widening) serves up to 8 rows (``RB``). Why: at one row the
earlier row-wise kernel spent its time in the per-output reductions and the short 1 KiB rows,
reading int8 weights at 10-17 GB/s on the dev EPYC; packed, 22-28 GB/s (``bench/gemv_bench.py``);
and with 4 rows a pass, 8 rows read the weights twice and cost about twice one row on the dev Xeon.

Each output sums in one order whatever the rows: two accumulators by k mod 2 (pairs of k for the
dot product), then ``a0 + a1``; the scale and bias are applied after. So a row's result never
depends on its batch or which rows share its pass. Groups are shared, two at a time, between the
calling thread and our own workers, without a join barrier (see the comment above ``share``;
each output is computed alone, so the split never changes a bit).

``gemv_bf16dp_rows`` keeps the row-wise dot-product kernel (weights as given): on the dev EPYC it
reads bf16 weights faster at one row and slower at eight; the kernel choice measures both.

``gemv_bf16amx`` (bf16 ``x`` and ``w``) and ``gemv_i8amx`` (float32 ``x``, int8 ``w``) run the
dot product's packed layout (pairs of k) on AMX-BF16 tiles, where the CPU has them and the OS
grants the tile state (``has_amx_bf16``): a tile instruction takes up to 16 rows at once, so 8
rows cost about what one does. Internals other C code may call: ``group_i8``, ``group_bf16``,
``group_bf16dp`` (one group, up to ``RB`` rows), ``store_group`` and ``share`` (work sharing).
"""

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

#define G 16   /* outputs per packed group: one vector lane each */
#define RB 8   /* rows per pass over a group: 8 rows x 2 accumulators fill 16 of the 32 registers */
#define PREFETCH 256  /* k steps ahead (4 KiB of int8): measured best of 0/64/256/512 at 8 rows */

static inline __m512 load_w16_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
static inline __m512 load_w16_bf16(const uint16_t* p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* Packed weights: group g holds outputs 16g..16g+15 as [K][16] (k-major, one lane per output;
   missing outputs of the last group are zero). acc[r][j] sums the k = j (mod 2) in increasing
   order, then a0 + a1: one order per output, for any row count.
   Two accumulators (not four) so that all 8 rows of a pass stay in registers: one weight load and
   widening then serves 8 FMAs, and 8 rows cost one pass over the weights; at one row two chains
   of FMAs still retire 16 weights every 2 cycles, above what memory delivers. Lines are
   prefetched one by one (the bf16 stream has two per 4 k). */
#define DEFINE_GROUP(NAME, WT, LOADW)                                                          \
static inline __attribute__((always_inline))                                                   \
void NAME(const float* x, const WT* wg, int rows, int K, __m512 out[RB]) {                      \
    __m512 acc[RB][2];                                                                         \
    for (int r = 0; r < RB; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();                  \
    int k = 0;                                                                                 \
    for (; k + 4 <= K; k += 4) {                                                               \
        for (int l = 0; l < (int)(4 * G * sizeof(WT)); l += 64)                                \
            _mm_prefetch((const char*)(wg + (long)(k + PREFETCH) * G) + l, _MM_HINT_T0);       \
        for (int j = 0; j < 4; ++j) {                                                          \
            __m512 w = LOADW(wg + (long)(k + j) * G);                                          \
            for (int r = 0; r < rows; ++r)                                                     \
                acc[r][j & 1] = _mm512_fmadd_ps(_mm512_set1_ps(x[(long)r * K + k + j]), w, acc[r][j & 1]); \
        }                                                                                      \
    }                                                                                          \
    for (; k < K; ++k) {                                                                       \
        __m512 w = LOADW(wg + (long)k * G);                                                    \
        for (int r = 0; r < rows; ++r)                                                         \
            acc[r][k & 1] = _mm512_fmadd_ps(_mm512_set1_ps(x[(long)r * K + k]), w, acc[r][k & 1]); \
    }                                                                                          \
    for (int r = 0; r < rows; ++r) out[r] = _mm512_add_ps(acc[r][0], acc[r][1]);               \
}

DEFINE_GROUP(group_i8, int8_t, load_w16_i8)
DEFINE_GROUP(group_bf16, uint16_t, load_w16_bf16)

/* Two adjacent groups at once for one or two rows, each output summed exactly as DEFINE_GROUP
   sums it (so a row's bits do not depend on which path ran it): four or eight chains of FMAs
   instead of two, as at one row two chains held the int8 kernel to ~80% of the four-chain
   kernel's speed on weights in cache (the code predictor's layers stay in a large L3). */
#define DEFINE_GROUP_PAIR(NAME, WT, LOADW)                                                     \
static inline __attribute__((always_inline))                                                   \
void NAME(const float* x, const WT* wg, long gstride, int rows, int K, __m512 out[2][2]) {      \
    __m512 acc[2][2][2];                                                                       \
    for (int i = 0; i < 2; ++i)                                                                \
        for (int r = 0; r < 2; ++r) acc[i][r][0] = acc[i][r][1] = _mm512_setzero_ps();        \
    int k = 0;                                                                                 \
    for (; k + 4 <= K; k += 4) {                                                               \
        for (int l = 0; l < (int)(4 * G * sizeof(WT)); l += 64) {                              \
            _mm_prefetch((const char*)(wg + (long)(k + PREFETCH) * G) + l, _MM_HINT_T0);       \
            _mm_prefetch((const char*)(wg + gstride + (long)(k + PREFETCH) * G) + l, _MM_HINT_T0); \
        }                                                                                      \
        for (int j = 0; j < 4; ++j) {                                                          \
            __m512 w0 = LOADW(wg + (long)(k + j) * G), w1 = LOADW(wg + gstride + (long)(k + j) * G); \
            for (int r = 0; r < rows; ++r) {                                                   \
                __m512 xv = _mm512_set1_ps(x[(long)r * K + k + j]);                            \
                acc[0][r][j & 1] = _mm512_fmadd_ps(xv, w0, acc[0][r][j & 1]);                  \
                acc[1][r][j & 1] = _mm512_fmadd_ps(xv, w1, acc[1][r][j & 1]);                  \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    for (; k < K; ++k) {                                                                       \
        __m512 w0 = LOADW(wg + (long)k * G), w1 = LOADW(wg + gstride + (long)k * G);           \
        for (int r = 0; r < rows; ++r) {                                                       \
            __m512 xv = _mm512_set1_ps(x[(long)r * K + k]);                                    \
            acc[0][r][k & 1] = _mm512_fmadd_ps(xv, w0, acc[0][r][k & 1]);                      \
            acc[1][r][k & 1] = _mm512_fmadd_ps(xv, w1, acc[1][r][k & 1]);                      \
        }                                                                                      \
    }                                                                                          \
    for (int i = 0; i < 2; ++i)                                                                \
        for (int r = 0; r < rows; ++r) out[i][r] = _mm512_add_ps(acc[i][r][0], acc[i][r][1]);  \
}

DEFINE_GROUP_PAIR(group_pair_i8, int8_t, load_w16_i8)
DEFINE_GROUP_PAIR(group_pair_bf16, uint16_t, load_w16_bf16)

static inline void store_group(float* y, long N, int n0, int rows, const __m512* out,
                               const float* scale, const float* bias) {
    int valid = N - n0 < G ? (int)(N - n0) : G;
    __mmask16 m = (__mmask16)((1u << valid) - 1u);
    __m512 s = scale ? _mm512_maskz_loadu_ps(m, scale + n0) : _mm512_set1_ps(1.0f);
    __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + n0) : _mm512_setzero_ps();
    for (int r = 0; r < rows; ++r) {
        __m512 v = _mm512_mul_ps(out[r], s);
        if (bias) v = _mm512_add_ps(v, b);
        _mm512_mask_storeu_ps(y + (long)r * N + n0, m, v);
    }
}


/* ---- Work sharing without a join barrier ----
   OpenMP ends every parallel region at a barrier that waits for every thread, even one that got
   no work: with passive waiting (the stack's setting on shared hosts) a sleeping thread takes
   50-90 us to wake on the dev VM, as long as a whole GEMV; with active waiting a thread the OS
   descheduled holds every call back (seconds per step on a busy shared host). Here the calling
   thread starts at once and the workers help with what is left: chunks are claimed from an atomic
   counter, the caller waits only for chunks a worker has claimed, and a worker that wakes after
   the last chunk was claimed finds nothing to do. Workers spin briefly, then sleep on a futex.
   Each output is computed alone, so who computes a chunk never changes a bit. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
    const void* x; const void* w; const float* scale; const float* bias; float* y;
    int R, K, N;
} gemv_args;
typedef void (*range_fn)(const gemv_args* a, int begin, int end);

#define MAX_WORKERS 63
#define SPIN 4000 /* pause loops (~100-250 us) before a worker sleeps: the gap between calls */

typedef struct {
    range_fn fn; gemv_args args; int count, chunk;
    atomic_int next, done, busy;
} task_t;

static task_t tasks[2];              /* generation g uses tasks[g & 1] */
static atomic_int generation;
static atomic_int sleepers;
static int workers;
static pthread_mutex_t workers_lock = PTHREAD_MUTEX_INITIALIZER;

static void run_task(task_t* t) {
    int chunks = (t->count + t->chunk - 1) / t->chunk;
    for (;;) {
        int c = atomic_fetch_add(&t->next, 1);
        if (c >= chunks) return;
        int begin = c * t->chunk, end = begin + t->chunk < t->count ? begin + t->chunk : t->count;
        t->fn(&t->args, begin, end);
        atomic_fetch_add(&t->done, 1);
    }
}

static void* worker_main(void* unused) {
    (void)unused;
    int seen = atomic_load(&generation);
    for (;;) {
        int g, spins = 0;
        while ((g = atomic_load(&generation)) == seen) {
            if (++spins < SPIN) { _mm_pause(); continue; }
            atomic_fetch_add(&sleepers, 1);
            syscall(SYS_futex, &generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
            atomic_fetch_sub(&sleepers, 1);
            spins = 0;
        }
        seen = g;
        task_t* t = &tasks[g & 1];
        atomic_fetch_add(&t->busy, 1);
        /* Only while g is current: the caller rewrites tasks[g & 1] for g + 2, after g + 1. */
        if (atomic_load(&generation) == g) run_task(t);
        atomic_fetch_sub(&t->busy, 1);
    }
    return NULL;
}

static int ensure_workers(int n) {
    if (n > MAX_WORKERS) n = MAX_WORKERS;
    if (workers >= n) return workers;
    pthread_mutex_lock(&workers_lock);
    while (workers < n) {
        pthread_t th;
        if (pthread_create(&th, NULL, worker_main, NULL) != 0) break;
        pthread_detach(th);
        ++workers;
    }
    pthread_mutex_unlock(&workers_lock);
    return workers;
}

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;

/* fn over [0, count) in chunks, on the calling thread and up to nthreads - 1 workers. */
static void share(range_fn fn, const gemv_args* a, int count, int chunk, int nthreads) {
    if (nthreads <= 1 || count <= chunk || ensure_workers(nthreads - 1) == 0) {
        fn(a, 0, count);
        return;
    }
    pthread_mutex_lock(&call_lock); /* one call at a time shares the workers */
    int g = atomic_load(&generation) + 1;
    task_t* t = &tasks[g & 1];
    while (atomic_load(&t->busy)) _mm_pause(); /* a late worker still looking at g - 1 */
    t->fn = fn; t->args = *a; t->count = count; t->chunk = chunk;
    atomic_store(&t->next, 0); atomic_store(&t->done, 0);
    atomic_store(&generation, g);
    if (atomic_load(&sleepers)) syscall(SYS_futex, &generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    run_task(t);
    int chunks = (count + chunk - 1) / chunk;
    while (atomic_load(&t->done) < chunks) _mm_pause(); /* only chunks a worker claimed */
    pthread_mutex_unlock(&call_lock);
}

#define DEFINE_KERNEL(NAME, GROUP, GROUP_PAIR, WT)                                             \
static void NAME##_groups(const gemv_args* a, int begin, int end) {                            \
    const float* x = a->x; const WT* w = a->w; int R = a->R, K = a->K, N = a->N;               \
    int g = begin;                                                                             \
    for (; R <= 2 && g + 2 <= end; g += 2) {                                                   \
        __m512 out[2][2];                                                                      \
        const WT* wg = w + (long)g * K * G;                                                    \
        if (R == 2) GROUP_PAIR(x, wg, (long)K * G, 2, K, out);                                 \
        else GROUP_PAIR(x, wg, (long)K * G, 1, K, out);                                        \
        store_group(a->y, N, g * G, R, out[0], a->scale, a->bias);                             \
        store_group(a->y, N, (g + 1) * G, R, out[1], a->scale, a->bias);                       \
    }                                                                                          \
    for (; g < end; ++g) {                                                                     \
        const WT* wg = w + (long)g * K * G;                                                    \
        for (int r0 = 0; r0 < R; r0 += RB) {                                                   \
            int rows = R - r0 < RB ? R - r0 : RB;                                              \
            __m512 out[RB];                                                                    \
            const float* xb = x + (long)r0 * K;                                                \
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
void NAME(const float* x, const WT* w, const float* scale, const float* bias, float* y,        \
          int R, int K, int N, int nthreads) {                                                 \
    gemv_args a = {x, w, scale, bias, y, R, K, N};                                             \
    share(NAME##_groups, &a, (N + G - 1) / G, 2, nthreads);                                    \
}

DEFINE_KERNEL(gemv_i8, group_i8, group_pair_i8, int8_t)
DEFINE_KERNEL(gemv_bf16, group_bf16, group_pair_bf16, uint16_t)

#ifdef __AVX512BF16__
/* bf16 x and w, the dot-product instruction: group g is [ceil(K/2)][16][2] (pairs of k per
   lane; a missing k is zero). acc[r][j] sums pairs p = 4i + j, the tail into acc[r][0], then
   (a0 + a1) + (a2 + a3). Four rows a pass (DP_RB), four accumulators each: two accumulators and
   8 rows a pass (as DEFINE_GROUP) ran one row at 60% of this speed on weights in cache and 8
   rows no faster; at 8 rows the AMX kernel (gemv_bf16amx) is the fast one. */
#define DP_RB 4
static inline __m512i x_pair(const uint16_t* xr, int k, int K) {
    uint32_t lo = xr[k], hi = k + 1 < K ? xr[k + 1] : 0;
    return _mm512_set1_epi32((int)(lo | (hi << 16)));
}
static inline __attribute__((always_inline))
void group_bf16dp_pass(const uint16_t* x, const uint16_t* wg, int rows, int K, __m512* out) {
    __m512 acc[DP_RB][4];
    for (int r = 0; r < DP_RB; ++r)
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
    int P = (K + 1) / 2, p = 0;
    for (; p + 4 <= P && 2 * p + 8 <= K; p += 4) {
        /* Every line of the stream, 8 KiB ahead: measured best at 8 rows of 0/1-in-4/all lines at
           2-16 KiB ahead, and within noise of none at one row. */
        for (int q = 0; q < 4; ++q) _mm_prefetch((const char*)(wg + (long)(p + 128 + q) * 2 * G), _MM_HINT_T0);
        for (int j = 0; j < 4; ++j) {
            __m512bh w = (__m512bh)_mm512_loadu_si512(wg + (long)(p + j) * 2 * G);
            for (int r = 0; r < rows; ++r) {
                const uint16_t* xr = x + (long)r * K;
                int xi; memcpy(&xi, xr + 2 * (p + j), 4);
                __m512i xv = _mm512_set1_epi32(xi);
                acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)xv, w);
            }
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
/* Up to RB rows, in passes of DP_RB. */
static inline __attribute__((always_inline))
void group_bf16dp(const uint16_t* x, const uint16_t* wg, int rows, int K, __m512 out[RB]) {
    for (int r0 = 0; r0 < rows; r0 += DP_RB)
        group_bf16dp_pass(x + (long)r0 * K, wg, rows - r0 < DP_RB ? rows - r0 : DP_RB, K, out + r0);
}

static void bf16dp_groups(const gemv_args* a, int begin, int end) {
    const uint16_t* x = a->x; const uint16_t* w = a->w; int R = a->R, K = a->K, N = a->N;
    long gstride = (long)((K + 1) / 2) * 2 * G;
    for (int g = begin; g < end; ++g) {
        const uint16_t* wg = w + (long)g * gstride;
        for (int r0 = 0; r0 < R; r0 += RB) {
            int rows = R - r0 < RB ? R - r0 : RB;
            __m512 out[RB];
            const uint16_t* xb = x + (long)r0 * K;
            switch (rows) {
                case 8: group_bf16dp(xb, wg, 8, K, out); break;
                case 7: group_bf16dp(xb, wg, 7, K, out); break;
                case 6: group_bf16dp(xb, wg, 6, K, out); break;
                case 5: group_bf16dp(xb, wg, 5, K, out); break;
                case 4: group_bf16dp(xb, wg, 4, K, out); break;
                case 3: group_bf16dp(xb, wg, 3, K, out); break;
                case 2: group_bf16dp(xb, wg, 2, K, out); break;
                default: group_bf16dp(xb, wg, 1, K, out); break;
            }
            store_group(a->y + (long)r0 * N, N, g * G, rows, out, a->scale, a->bias);
        }
    }
}

void gemv_bf16dp(const uint16_t* x, const uint16_t* w, const float* scale, const float* bias, float* y,
                 int R, int K, int N, int nthreads) {
    gemv_args a = {x, w, scale, bias, y, R, K, N};
    share(bf16dp_groups, &a, (N + G - 1) / G, 2, nthreads);
}
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
int has_bf16dp(void) { return 1; }
#else
int has_bf16dp(void) { return 0; }
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
/* AMX-BF16 on the bf16 dot product's packed layout (``gemv-bf16amx``): a pair-row of a group is
   64 bytes ([16][2] bf16), so 16 pairs (32 k) of a group are one 16 x 64-byte B tile, read as
   they lie; up to 16 rows of x (32 k each) are the A tile; TDPBF16PS adds their products into a
   16 rows x 16 outputs float32 tile. Each output sums its k blocks in increasing order into its
   own tile element (a K % 32 tail from a zero-padded copy of x last), whatever the rows: a tile
   element depends only on its own row of A, so the row count (the tile's configured rows) never
   changes a bit. Two groups per pass (two accumulator tiles, one A tile) so that two TDPBF16PS
   chains are in flight. Why: the instruction does 16 rows of a 1 KiB weight block in one go, so
   8 rows cost about what one does (the weights are read once), where the AVX-512 dot product
   pays an instruction per row. */
#include <sys/syscall.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

#define AMX_ROWS 16
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* The OS must grant the process AMX's tile state (Linux >= 5.16); torch may have done it. */
int has_amx_bf16(void) {
    static atomic_int state; /* 0 not asked, 1 granted, -1 refused */
    int s = atomic_load(&state);
    if (s == 0) {
        s = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        atomic_store(&state, s);
    }
    return s > 0;
}

/* Tiles: 0, 1 accumulators (two groups); 2 the A block; 3, 4 the groups' B blocks; 5-7 the same
   for the K tail of tail_pairs pairs (none where K % 32 == 0). */
static void amx_configure(int rows, int tail_pairs) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 3; ++t) { c.rows[t] = (uint8_t)rows; c.colsb[t] = 64; }
    for (int t = 3; t < 5; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
    if (tail_pairs) {
        c.rows[5] = (uint8_t)rows; c.colsb[5] = (uint16_t)(4 * tail_pairs);
        for (int t = 6; t < 8; ++t) { c.rows[t] = (uint8_t)tail_pairs; c.colsb[t] = 64; }
    }
    _tile_loadconfig(&c);
}

/* The accumulator tiles 0 (and 1 when ``two``) of groups g, g + 1 for rows r0..r0+rows-1 into y,
   scaled and biased (both AMX kernels' epilogue). */
static inline void amx_store_groups(const gemv_args* a, float acc[2][AMX_ROWS * G], int two, int g,
                                    int r0, int rows) {
    _tile_stored(0, acc[0], 64);
    if (two) _tile_stored(1, acc[1], 64);
    for (int i = 0; i <= two; ++i)
        for (int r = 0; r < rows; ++r) {
            __m512 v = _mm512_load_ps(acc[i] + r * G);
            store_group(a->y + (long)(r0 + r) * a->N, a->N, (g + i) * G, 1, &v, a->scale, a->bias);
        }
}

static void bf16amx_groups(const gemv_args* a, int begin, int end) {
    const uint16_t* x = a->x; const uint16_t* w = a->w; int R = a->R, K = a->K;
    long gstride = (long)((K + 1) / 2) * 2 * G;
    int kfull = K & ~31, tail_pairs = (K - kfull + 1) / 2;
    uint16_t xtail[AMX_ROWS * 32] __attribute__((aligned(64)));
    float acc[2][AMX_ROWS * G] __attribute__((aligned(64)));
    int configured = 0;
    /* The tile configuration is loaded per call (not cached per thread): other code on this
       thread (oneDNN) may have loaded its own since. */
    for (int r0 = 0; r0 < R; r0 += AMX_ROWS) {
        int rows = R - r0 < AMX_ROWS ? R - r0 : AMX_ROWS;
        if (rows != configured) { amx_configure(rows, tail_pairs); configured = rows; }
        const uint16_t* xb = x + (long)r0 * K;
        if (tail_pairs) {
            memset(xtail, 0, sizeof xtail);
            for (int r = 0; r < rows; ++r)
                memcpy(xtail + r * 32, xb + (long)r * K + kfull, (size_t)(K - kfull) * 2);
        }
        for (int g = begin; g < end; g += 2) {
            int two = g + 1 < end;
            const uint16_t* w0 = w + (long)g * gstride;
            const uint16_t* w1 = w0 + gstride;
            _tile_zero(0);
            _tile_zero(1);
            for (int k = 0; k < kfull; k += 32) {
                _tile_loadd(2, xb + k, 2 * K);
                _tile_loadd(3, w0 + (long)k * G, 64);
                _tile_dpbf16ps(0, 2, 3);
                if (two) {
                    _tile_loadd(4, w1 + (long)k * G, 64);
                    _tile_dpbf16ps(1, 2, 4);
                }
            }
            if (tail_pairs) {
                _tile_loadd(5, xtail, 64);
                _tile_loadd(6, w0 + (long)kfull * G, 64);
                _tile_dpbf16ps(0, 5, 6);
                if (two) {
                    _tile_loadd(7, w1 + (long)kfull * G, 64);
                    _tile_dpbf16ps(1, 5, 7);
                }
            }
            amx_store_groups(a, acc, two, g, r0, rows);
        }
    }
    _tile_release(); /* the tile state back to init: no 8 KiB to save at a context switch */
}

void gemv_bf16amx(const uint16_t* x, const uint16_t* w, const float* scale, const float* bias, float* y,
                  int R, int K, int N, int nthreads) {
    gemv_args a = {x, w, scale, bias, y, R, K, N};
    share(bf16amx_groups, &a, (N + G - 1) / G, 2, nthreads);
}

/* Tiles of the int8 kernel: 0, 1 accumulators (two groups); 2-4 x's h, m, l blocks; 5, 6 the
   groups' widened B blocks. */
static void amx_configure_i8(int rows) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 5; ++t) { c.rows[t] = (uint8_t)rows; c.colsb[t] = 64; }
    for (int t = 5; t < 7; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
    _tile_loadconfig(&c);
}

/* int8 weights with float32 activations on AMX-BF16 tiles (``gemv-int8amx``), exactly: each x
   is split into three bf16, x = h + m + l (h = bf16(x), m = bf16(x - h), l = x - h - m: 8 + 8 + 8
   significant bits, exact but for values below 2^-110 that the conversion flushes), and an int8
   weight is a bf16 exactly, so every product is exact and TDPBF16PS sums them in float32: the
   same precision as the FMA kernel (float32 sums of exact products: float32 rounding apart).
   Weights are packed in pairs of k ([ceil(K/2)][16][2] int8 per group, zero-padded) and widened
   block by block (16 pairs x 16 outputs, 512 weights) into a 1 KiB B tile on the stack. Per
   output: k blocks of 32 in increasing order, each adding h's products, then m's, then l's, into
   its tile element; x is zero-padded to whole blocks. Rows never share a tile element, so the
   row count never changes a bit. Why: at 8 rows the FMA kernel issues 8 FMAs per 16 weights
   (compute-bound near the memory floor on a busy host); here 8 rows cost the widening plus three
   tile products per block, as one row does. */
static void split_x(const float* x, uint16_t* xs, int R, int K, int Kp) {
    long plane = (long)R * Kp;
    for (int r = 0; r < R; ++r)
        for (int k = 0; k < Kp; k += 16) {
            int valid = K - k >= 16 ? 16 : K - k > 0 ? K - k : 0;
            __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << valid) - 1u), x + (long)r * K + k);
            __m256i parts[3];
            for (int i = 0; i < 3; ++i) {
                parts[i] = (__m256i)_mm512_cvtneps_pbh(v);
                __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(parts[i]), 16));
                v = _mm512_sub_ps(v, back);
                _mm256_storeu_si256((__m256i*)(xs + i * plane + (long)r * Kp + k), parts[i]);
            }
        }
}

/* 16 pair-rows of int8 ([16][2] each, 32 bytes) widened to bf16 (64 bytes each); pairs past
   ``pairs`` are zero. */
static inline void widen_block_i8(const int8_t* wb, int pairs, uint16_t* out) {
    for (int q = 0; q < 16; ++q) {
        __m512i v;
        if (q < pairs) {
            v = (__m512i)_mm512_cvtne2ps_pbh(load_w16_i8(wb + q * 32 + 16), load_w16_i8(wb + q * 32));
        } else {
            v = _mm512_setzero_si512();
        }
        _mm512_store_si512(out + q * 32, v);
    }
}

static void i8amx_groups(const gemv_args* a, int begin, int end) {
    const uint16_t* xs = a->x; const int8_t* w = a->w; int R = a->R, K = a->K;
    int P = (K + 1) / 2, Kp = (K + 31) & ~31;
    long gstride = (long)P * 2 * G, plane = (long)R * Kp;
    uint16_t wbuf[2][16 * 32] __attribute__((aligned(64)));
    float acc[2][AMX_ROWS * G] __attribute__((aligned(64)));
    int configured = 0;
    for (int r0 = 0; r0 < R; r0 += AMX_ROWS) {
        int rows = R - r0 < AMX_ROWS ? R - r0 : AMX_ROWS;
        if (rows != configured) { amx_configure_i8(rows); configured = rows; }
        const uint16_t* xh = xs + (long)r0 * Kp;
        for (int g = begin; g < end; g += 2) {
            int two = g + 1 < end;
            const int8_t* w0 = w + (long)g * gstride;
            const int8_t* w1 = w0 + gstride;
            _tile_zero(0);
            _tile_zero(1);
            for (int k = 0; k < Kp; k += 32) {
                int pairs = P - k / 2 < 16 ? P - k / 2 : 16;
                _tile_loadd(2, xh + k, 2 * Kp);
                _tile_loadd(3, xh + plane + k, 2 * Kp);
                _tile_loadd(4, xh + 2 * plane + k, 2 * Kp);
                widen_block_i8(w0 + (long)k * G, pairs, wbuf[0]);
                _tile_loadd(5, wbuf[0], 64);
                _tile_dpbf16ps(0, 2, 5);
                _tile_dpbf16ps(0, 3, 5);
                _tile_dpbf16ps(0, 4, 5);
                if (two) {
                    widen_block_i8(w1 + (long)k * G, pairs, wbuf[1]);
                    _tile_loadd(6, wbuf[1], 64);
                    _tile_dpbf16ps(1, 2, 6);
                    _tile_dpbf16ps(1, 3, 6);
                    _tile_dpbf16ps(1, 4, 6);
                }
            }
            amx_store_groups(a, acc, two, g, r0, rows);
        }
    }
    _tile_release();
}

/* Returns 0, or -1 (y untouched) where the split activations' buffer cannot be allocated. */
int gemv_i8amx(const float* x, const int8_t* w, const float* scale, const float* bias, float* y,
               int R, int K, int N, int nthreads) {
    int Kp = (K + 31) & ~31;
    uint16_t* xs = aligned_alloc(64, ((size_t)3 * R * Kp * 2 + 63) & ~(size_t)63);
    if (!xs) return -1;
    split_x(x, xs, R, K, Kp);
    gemv_args a = {xs, w, scale, bias, y, R, K, N};
    share(i8amx_groups, &a, (N + G - 1) / G, 2, nthreads);
    free(xs);
    return 0;
}
#else
int has_amx_bf16(void) { return 0; }
#endif
"""
