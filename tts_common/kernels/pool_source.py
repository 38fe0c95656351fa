"""C source of the library's work sharing: ``share`` runs a kernel's chunks on the calling
thread and our own worker threads, without a join barrier (see the comment in the source).

Compiled first in the library (:data:`.gemv.LIBRARY_SOURCE`): the GEMV kernels
(:mod:`.gemv_source`), the AMX kernels (:mod:`.amx_source`) and the fused stack
(:mod:`.stack_source`) all share one pool per process. ``gemv_args`` is the argument block every
kernel's range function receives.
"""

SOURCE = r"""
#include <immintrin.h> /* _mm_pause */
/* ---- Work sharing without a join barrier ----
   OpenMP ends every parallel region at a barrier that waits for every thread, even one that got
   no work: with passive waiting (the stack's setting on shared hosts) a sleeping thread takes
   50-90 us to wake on the dev VM, as long as a whole GEMV; with active waiting a thread the OS
   descheduled holds every call back (seconds per step on a busy shared host). Here the calling
   thread starts at once and the workers help with what is left: chunks are claimed atomically,
   the caller waits only for chunks a worker has claimed, and a worker that wakes after the last
   chunk was claimed finds nothing to do. Workers spin briefly, then sleep on a futex.
   Each output is computed alone, so who computes a chunk never changes a bit.
   Each thread owns a contiguous run of chunks (the caller the first) and claims them from its
   front; a thread done with its own takes the others' from their backs. So each thread streams
   one contiguous stretch of weights, which the hardware prefetchers follow best: 7-12% more GB/s
   at 1 and 8 rows than one shared counter (threads interleaved every chunk) for the int8 and
   bf16 dot-product kernels on the dev EPYC (Zen 4, side by side in one process). */
#include <limits.h>
#include <stdint.h>
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

#define MAX_PARTS (MAX_WORKERS + 1)
typedef struct {
    range_fn fn; gemv_args args; int count, chunk, parts;
    atomic_int done, busy;
    _Atomic uint64_t runs[MAX_PARTS]; /* thread p's chunks still unclaimed: [low 32 bits, high) */
} task_t;

static task_t tasks[2];              /* generation g uses tasks[g & 1] */
static atomic_int generation;
static atomic_int sleepers;
static int workers;
static pthread_mutex_t workers_lock = PTHREAD_MUTEX_INITIALIZER;

/* Claims the first (back = 0) or the last chunk left in a run: 1 and *c, or 0 where none is. */
static int take(_Atomic uint64_t* run, int back, int* c) {
    uint64_t v = atomic_load(run);
    for (;;) {
        uint32_t front = (uint32_t)v, end = (uint32_t)(v >> 32);
        if (front >= end) return 0;
        uint64_t claimed = back ? ((uint64_t)(end - 1) << 32 | front) : ((uint64_t)end << 32 | (front + 1));
        if (atomic_compare_exchange_weak(run, &v, claimed)) {
            *c = (int)(back ? end - 1 : front);
            return 1;
        }
    }
}
/* Thread p's share (p = 0: the caller; a worker numbered past the runs only takes others'). */
static void run_task(task_t* t, int p) {
    for (;;) {
        int c = -1;
        if (p < t->parts) take(&t->runs[p], 0, &c);
        for (int i = 1; c < 0 && i <= t->parts; ++i) {
            int q = (p + i) % t->parts;
            if (q != p) take(&t->runs[q], 1, &c);
        }
        if (c < 0) return;
        int begin = c * t->chunk, end = begin + t->chunk < t->count ? begin + t->chunk : t->count;
        t->fn(&t->args, begin, end);
        atomic_fetch_add(&t->done, 1);
    }
}

static void* worker_main(void* number) {
    int p = (int)(long)number; /* 1, 2, ...: its run of chunks */
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
        if (atomic_load(&generation) == g) run_task(t, p);
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
        if (pthread_create(&th, NULL, worker_main, (void*)(long)(workers + 1)) != 0) break;
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
    int chunks = (count + chunk - 1) / chunk, parts = nthreads < workers + 1 ? nthreads : workers + 1;
    t->fn = fn; t->args = *a; t->count = count; t->chunk = chunk; t->parts = parts;
    for (int p = 0; p < parts; ++p) {
        uint64_t begin = (uint64_t)chunks * p / parts, end = (uint64_t)chunks * (p + 1) / parts;
        atomic_store(&t->runs[p], end << 32 | begin);
    }
    atomic_store(&t->done, 0);
    atomic_store(&generation, g);
    if (atomic_load(&sleepers)) syscall(SYS_futex, &generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    run_task(t, 0);
    while (atomic_load(&t->done) < chunks) _mm_pause(); /* only chunks a worker claimed */
    pthread_mutex_unlock(&call_lock);
}

"""
