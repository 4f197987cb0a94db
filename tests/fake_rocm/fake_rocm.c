/* A stand-in for libamdhip64 + libhiprtc + librccl that executes on the CPU, for testing
 * PCCL's ROCm path without an AMD GPU (see docs/DEVICE.md). Device memory is host memory,
 * every stream runs its operations in order on a thread of its own (so the host really runs
 * ahead of the "device"), and hipModuleLaunchKernel dispatches by kernel name to C versions of csrc/reduce.cu,
 * csrc/quant.cu and csrc/transpose.cu with the arithmetic of PCCL's host kernels. RCCL runs worlds of thread
 * ranks of this process (see the RCCL section).
 *
 * Environment: FAKE_HIP_DEVICES (default 2) devices, each with a distinct UUID;
 * FAKE_HIP_FAIL_LAUNCH_AFTER=N makes every kernel launch after the N-th fail with
 * hipErrorLaunchFailure (719), to check that runtime errors surface as errors;
 * FAKE_HIP_STALL_STREAM=N makes every copy or kernel queued on a stream after the N-th one
 * never complete (a hung kernel), until the test hook fake_hip_release_stalls() is called
 * (fake_hip_stall_device_from_now(d) does the same from the call on, for device d or, with
 * d = -1, every device).
 * FAKE_HIP_IMPLICIT_SYNC=1: an allocation (hipMalloc, hipHostMalloc) orders every operation
 * queued afterwards on any stream of its device behind every operation queued on those streams
 * before it, as CUDA's "implicit synchronization" rule does (the cycle behind the FSDP2 hang
 * of 2026-11-26: see src/comm/device_program.rs); the allocation itself returns at once.
 * fake_hip_capture_all(on): every stream reports that it is capturing a graph
 * (hipStreamIsCapturing), for the refusal of collectives during capture. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int E;
static __thread int current;
static long launches;

static int ndev(void) {
    const char* s = getenv("FAKE_HIP_DEVICES");
    return s && *s ? atoi(s) : 2;
}

E hipInit(unsigned f) { return f == 0 ? 0 : 1; }
E hipRuntimeGetVersion(int* v) { *v = 60200000; return 0; }
E hipGetDeviceCount(int* n) { *n = ndev(); return 0; }
E hipSetDevice(int d) { if (d < 0 || d >= ndev()) return 101; current = d; return 0; }
E hipDeviceGet(int* d, int o) { if (o < 0 || o >= ndev()) return 101; *d = o; return 0; }
E hipDeviceGetAttribute(int* v, int a, int d) {
    *v = a == 63 ? 104 : 0;
    return d >= 0 && d < ndev() ? 0 : 101;
}
E hipDeviceGetName(char* s, int len, int d) { strncpy(s, "Fake Instinct", len); return 0; }
E hipGetDevicePropertiesR0600(void* p, int d) {
    memset(p, 0, 1472);
    strcpy((char*)p, "Fake Instinct");
    strcpy((char*)p + 1160, "gfx90a:sramecc+:xnack-");
    return 0;
}
E hipDeviceGetUuid(unsigned char* u, int d) {
    if (d < 0 || d >= ndev()) return 101;
    for (int i = 0; i < 16; i++) u[i] = (unsigned char)(0xA0 + i * 7 + d * 31);
    return 0;
}
/* ---- streams: each runs its operations in order on a worker thread of its own ------------
 * so that work queued on a stream really runs later than the call that queued it (the null
 * stream runs it at once). An operation that fails keeps its error on the stream, returned by
 * the next hipStreamSynchronize. Events complete when the stream reaches their record;
 * hipStreamWaitEvent and hipStreamWaitValue32 hold a stream until an event completes or a
 * host-written counter reaches a value. FAKE_HIP_NO_WAIT_VALUE=1: hipStreamWaitValue32 is
 * unsupported (hipErrorNotSupported, 801), as on devices without stream memory operations. */
#include <pthread.h>
#include <time.h>
typedef struct Op { int (*run)(void*); void* arg; struct Op* next; } Op;
typedef struct Stream {
    int dev, err, quit;
    long queued, done;
    Op *head, *tail;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct Stream* next_all; /* every stream ever made (never freed: see hipStreamDestroy) */
} Stream;
static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static Stream* all_streams;

static void* stream_worker(void* p) {
    Stream* s = p;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->quit) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break;
        Op* o = s->head;
        s->head = o->next;
        if (!s->head) s->tail = 0;
        pthread_mutex_unlock(&s->mu);
        int r = o->run(o->arg);
        free(o->arg);
        free(o);
        pthread_mutex_lock(&s->mu);
        if (r && !s->err) s->err = r;
        s->done++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Queues run(arg) on stream st (arg is malloc'd and freed after the run); on the null stream
 * it runs at once and its error is returned. */
static E enqueue(void* st, int (*run)(void*), void* arg) {
    if (!st) { int r = run(arg); free(arg); return r; }
    Stream* s = st;
    Op* o = malloc(sizeof *o);
    o->run = run; o->arg = arg; o->next = 0;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = o; else s->head = o;
    s->tail = o;
    s->queued++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}
static void nap(void) { struct timespec t = {0, 20000}; nanosleep(&t, 0); }

E hipStreamCreate(void** out) {
    Stream* s = calloc(1, sizeof *s);
    s->dev = current;
    pthread_mutex_init(&s->mu, 0);
    pthread_cond_init(&s->cv, 0);
    pthread_t th;
    if (pthread_create(&th, 0, stream_worker, s)) { free(s); return 2; }
    pthread_detach(th);
    pthread_mutex_lock(&streams_mu);
    s->next_all = all_streams;
    all_streams = s;
    pthread_mutex_unlock(&streams_mu);
    *out = s;
    return 0;
}
static int capture_all;
void fake_hip_capture_all(int on) { __atomic_store_n(&capture_all, on, __ATOMIC_SEQ_CST); }
/* hipStreamCaptureStatusNone (0) or hipStreamCaptureStatusActive (1). */
E hipStreamIsCapturing(void* s, int* status) {
    *status = s && __atomic_load_n(&capture_all, __ATOMIC_SEQ_CST) ? 1 : 0;
    return 0;
}
E hipStreamGetDevice(void* s, int* d) { if (!s) return 1; *d = ((Stream*)s)->dev; return 0; }
/* Returns at once; the worker ends once the stream's queued work has run (as HIP does). The
 * Stream itself is kept (a few bytes) so that device-wide synchronisation can walk every
 * stream without locking against their ends. */
E hipStreamDestroy(void* st) {
    Stream* s = st;
    if (!s) return 1;
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}
E hipStreamSynchronize(void* st) {
    Stream* s = st;
    if (!s) return 0;
    pthread_mutex_lock(&s->mu);
    long want = s->queued;
    while (s->done < want) pthread_cond_wait(&s->cv, &s->mu);
    int r = s->err;
    pthread_mutex_unlock(&s->mu);
    return r;
}

typedef struct { long recorded, done; int refs; pthread_mutex_t mu; pthread_cond_t cv; } Event;
static void event_unref(Event* e) {
    pthread_mutex_lock(&e->mu);
    int last = --e->refs == 0;
    pthread_mutex_unlock(&e->mu);
    if (last) { pthread_mutex_destroy(&e->mu); pthread_cond_destroy(&e->cv); free(e); }
}
/* Events made so far (test hook: fake_hip_events_created). */
static long events_created;
long fake_hip_events_created(void) { return __atomic_load_n(&events_created, __ATOMIC_SEQ_CST); }
E hipEventCreate(void** out) {
    __atomic_add_fetch(&events_created, 1, __ATOMIC_SEQ_CST);
    Event* e = calloc(1, sizeof *e);
    e->refs = 1;
    pthread_mutex_init(&e->mu, 0);
    pthread_cond_init(&e->cv, 0);
    *out = e;
    return 0;
}
E hipEventDestroy(void* e) { if (e) event_unref(e); return 0; }
typedef struct { Event* e; long t; } EvArg;
static int event_fire(void* p) {
    EvArg* a = p;
    pthread_mutex_lock(&a->e->mu);
    if (a->t > a->e->done) a->e->done = a->t;
    pthread_cond_broadcast(&a->e->cv);
    pthread_mutex_unlock(&a->e->mu);
    event_unref(a->e);
    return 0;
}
E hipEventRecord(void* ev, void* st) {
    Event* e = ev;
    EvArg* a = malloc(sizeof *a);
    pthread_mutex_lock(&e->mu);
    a->e = e;
    a->t = ++e->recorded;
    e->refs++;
    pthread_mutex_unlock(&e->mu);
    return enqueue(st, event_fire, a);
}
static void event_wait(Event* e, long t) {
    pthread_mutex_lock(&e->mu);
    while (e->done < t) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}
E hipEventSynchronize(void* ev) {
    Event* e = ev;
    pthread_mutex_lock(&e->mu);
    long t = e->recorded;
    pthread_mutex_unlock(&e->mu);
    event_wait(e, t);
    return 0;
}
E hipEventQuery(void* ev) {
    Event* e = ev;
    pthread_mutex_lock(&e->mu);
    int r = e->done >= e->recorded ? 0 : 600;
    pthread_mutex_unlock(&e->mu);
    return r;
}
static int event_gate(void* p) { EvArg* a = p; event_wait(a->e, a->t); event_unref(a->e); return 0; }
E hipStreamWaitEvent(void* st, void* ev, unsigned f) {
    if (f) return 1;
    Event* e = ev;
    EvArg* a = malloc(sizeof *a);
    pthread_mutex_lock(&e->mu);
    a->e = e;
    a->t = e->recorded;
    e->refs++;
    pthread_mutex_unlock(&e->mu);
    return enqueue(st, event_gate, a);
}
typedef struct { volatile uint32_t* p; uint32_t v, mask; } WaitArg;
static int value_gate(void* p) {
    WaitArg* a = p;
    while ((int32_t)((__atomic_load_n(a->p, __ATOMIC_SEQ_CST) & a->mask) - a->v) < 0) nap();
    return 0;
}
/* hipStreamWaitValueGte (0) only, compared as CUDA's GEQ is: (int32_t)(*p & mask - v) >= 0. */
E hipStreamWaitValue32(void* st, void* ptr, uint32_t v, unsigned flags, uint32_t mask) {
    const char* no = getenv("FAKE_HIP_NO_WAIT_VALUE");
    if (no && *no == '1') return 801;
    if (!ptr || flags != 0) return 1;
    WaitArg* a = malloc(sizeof *a);
    a->p = ptr; a->v = v; a->mask = mask;
    return enqueue(st, value_gate, a);
}

/* Waits for every stream of device d (what hipFree and hipHostFree do implicitly in HIP, so
 * that memory is never freed under queued work). */
static void sync_device(int d) {
    pthread_mutex_lock(&streams_mu);
    Stream* s = all_streams;
    pthread_mutex_unlock(&streams_mu);
    for (; s; s = s->next_all)
        if (s->dev == d) hipStreamSynchronize(s);
}
/* Allocations carry their device in a header in front of the returned address. */
static void* alloc_on(size_t align, size_t n) {
    char* base = aligned_alloc(align, align + (n + align - 1) / align * align);
    if (!base) return 0;
    *(int*)base = current;
    return base + align;
}
static void free_on(void* p, size_t align) {
    if (!p) return;
    char* base = (char*)p - align;
    sync_device(*(int*)base);
    free(base);
}
/* ---- implicit synchronisation (FAKE_HIP_IMPLICIT_SYNC=1) -------------------------------- */
typedef struct { int n; Stream** s; long* upto; } BarrierArg;
static int barrier_run(void* p) {
    BarrierArg* a = p;
    for (int i = 0; i < a->n; i++) {
        Stream* s = a->s[i];
        pthread_mutex_lock(&s->mu);
        while (s->done < a->upto[i] && !s->quit) pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    free(a->s);
    free(a->upto);
    return 0;
}
/* Queues on every stream of device d a barrier that waits for what every other stream of d
 * had queued when the allocation was made. */
static void implicit_sync(int d) {
    const char* on = getenv("FAKE_HIP_IMPLICIT_SYNC");
    if (!on || *on != '1') return;
    pthread_mutex_lock(&streams_mu);
    Stream* all = all_streams;
    pthread_mutex_unlock(&streams_mu);
    int n = 0;
    for (Stream* s = all; s; s = s->next_all) if (s->dev == d && !s->quit) n++;
    Stream** ss = calloc(n + 1, sizeof *ss);
    long* upto = calloc(n + 1, sizeof *upto);
    int k = 0;
    for (Stream* s = all; s && k < n; s = s->next_all) {
        if (s->dev != d || s->quit) continue;
        pthread_mutex_lock(&s->mu);
        ss[k] = s;
        upto[k] = s->queued;
        pthread_mutex_unlock(&s->mu);
        k++;
    }
    for (int i = 0; i < k; i++) {
        BarrierArg* a = malloc(sizeof *a);
        a->n = 0;
        a->s = calloc(k + 1, sizeof *a->s);
        a->upto = calloc(k + 1, sizeof *a->upto);
        for (int j = 0; j < k; j++) {
            if (j == i) continue;
            a->s[a->n] = ss[j];
            a->upto[a->n] = upto[j];
            a->n++;
        }
        enqueue(ss[i], barrier_run, a);
    }
    free(ss);
    free(upto);
}
E hipMalloc(void** p, size_t n) { implicit_sync(current); *p = alloc_on(256, n); return *p ? 0 : 2; }
E hipFree(void* p) { free_on(p, 256); return 0; }
/* Flags: hipHostMallocPortable (1), hipHostMallocMapped (2); mapped memory's device address is
 * its host address. */
E hipHostMalloc(void** p, size_t n, unsigned f) {
    if (f & ~3u) return 1;
    implicit_sync(current);
    *p = alloc_on(64, n);
    return *p ? 0 : 2;
}
E hipHostGetDevicePointer(void** d, void* h, unsigned f) { if (!h || f) return 1; *d = h; return 0; }
E hipHostFree(void* p) { free_on(p, 64); return 0; }
typedef struct { void* d; const void* s; size_t n; int set; } CopyArg;
static int copy_run(void* p) {
    CopyArg* a = p;
    if (a->set >= 0) memset(a->d, a->set, a->n); else memmove(a->d, a->s, a->n);
    return 0;
}
/* ---- stalls: a stream operation that never completes until released ---------------------
 * A stalled copy or kernel is preceded on its stream by an operation that waits for the next
 * release, so everything queued behind it on that stream waits too (as behind a hung kernel). */
static int stall_dev = -2; /* -2: no stall; -1: every device; else that device */
static long stall_ops, release_gen;
void fake_hip_stall_device_from_now(int d) { __atomic_store_n(&stall_dev, d, __ATOMIC_SEQ_CST); }
void fake_hip_release_stalls(void) {
    __atomic_store_n(&stall_dev, -2, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&release_gen, 1, __ATOMIC_SEQ_CST);
}
static int stall_run(void* p) {
    long gen = *(long*)p;
    while (__atomic_load_n(&release_gen, __ATOMIC_SEQ_CST) == gen) nap();
    return 0;
}
/* Queues a stall in front of the next operation on st when a stall is on for its device. */
static void maybe_stall(void* st) {
    if (!st) return; /* the null stream runs operations on the caller's thread: never stalled */
    const char* after = getenv("FAKE_HIP_STALL_STREAM");
    long seen = __atomic_add_fetch(&stall_ops, 1, __ATOMIC_SEQ_CST);
    int d = __atomic_load_n(&stall_dev, __ATOMIC_SEQ_CST);
    int env = after && *after && seen > atol(after) && __atomic_load_n(&release_gen, __ATOMIC_SEQ_CST) == 0;
    if (!env && !(d == -1 || d == ((Stream*)st)->dev)) return;
    long* gen = malloc(sizeof *gen);
    *gen = __atomic_load_n(&release_gen, __ATOMIC_SEQ_CST);
    enqueue(st, stall_run, gen);
}
E hipMemcpyAsync(void* d, const void* s, size_t n, int k, void* st) {
    if (k < 1 || k > 3) return 1;
    maybe_stall(st);
    CopyArg* a = malloc(sizeof *a);
    a->d = d; a->s = s; a->n = n; a->set = -1;
    return enqueue(st, copy_run, a);
}
E hipMemsetAsync(void* d, int v, size_t n, void* st) {
    CopyArg* a = malloc(sizeof *a);
    a->d = d; a->s = 0; a->n = n; a->set = v & 0xff;
    return enqueue(st, copy_run, a);
}
E hipModuleLoadData(void** m, const void* img) { *m = (void*)img; return memcmp(img, "CODE", 4) ? 1 : 0; }
E hipModuleGetFunction(void** f, void* m, const char* name) { *f = strdup(name); return 0; }
const char* hipGetErrorString(E e) { return e == 719 ? "fake launch failure" : "fake HIP error"; }
E hipEventElapsedTime(float* ms, void* a, void* b) { *ms = 0.25f; return 0; }

/* ---- the kernels, on the CPU ------------------------------------------------------------ */

static float bf16_widen(uint16_t x) { uint32_t b = (uint32_t)x << 16; float f; memcpy(&f, &b, 4); return f; }
static uint16_t bf16_narrow(float v) {
    uint32_t b; memcpy(&b, &v, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40);
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
}
static float f16_widen(uint16_t x) { _Float16 h; memcpy(&h, &x, 2); return (float)h; }
static uint16_t f16_narrow(float v) {
    if (isnan(v)) return (uint16_t)(0x7e00 | (signbit(v) ? 0x8000 : 0));
    _Float16 h = (_Float16)v; uint16_t x; memcpy(&x, &h, 2); return x;
}

#define OPS(T, X, Y) (op == 's' ? (T)((X) + (Y)) : op == 'p' ? (T)((X) * (Y)) \
    : op == 'n' ? ((Y) < (X) ? (Y) : (X)) : ((Y) > (X) ? (Y) : (X)))
#define INT_REDUCE(T, U) { T* d = (T*)dp; const T* a = (const T*)ap; const T* b = (const T*)bp; \
    for (uint64_t i = 0; i < n; i++) { U x = (U)a[i], y = (U)b[i]; \
        d[i] = op == 's' ? (T)(U)(x + y) : op == 'p' ? (T)(U)(x * y) \
             : op == 'n' ? (b[i] < a[i] ? b[i] : a[i]) : (b[i] > a[i] ? b[i] : a[i]); } return 0; }
#define FLOAT_REDUCE(T, MIN, MAX) { T* d = (T*)dp; const T* a = (const T*)ap; const T* b = (const T*)bp; \
    for (uint64_t i = 0; i < n; i++) d[i] = op == 's' ? a[i] + b[i] : op == 'p' ? a[i] * b[i] \
        : op == 'n' ? MIN(a[i], b[i]) : MAX(a[i], b[i]); return 0; }
#define HALF_REDUCE(W, N) { uint16_t* d = (uint16_t*)dp; const uint16_t* a = (const uint16_t*)ap; \
    const uint16_t* b = (const uint16_t*)bp; for (uint64_t i = 0; i < n; i++) { \
        float x = W(a[i]), y = W(b[i]); d[i] = N(op == 's' ? x + y : op == 'p' ? x * y \
            : op == 'n' ? fminf(x, y) : fmaxf(x, y)); } return 0; }

static int reduce(const char* dt, char op, void* dp, const void* ap, const void* bp, uint64_t n) {
    if (!strcmp(dt, "i8")) INT_REDUCE(int8_t, uint8_t)
    if (!strcmp(dt, "u8")) INT_REDUCE(uint8_t, uint8_t)
    if (!strcmp(dt, "i32")) INT_REDUCE(int32_t, uint32_t)
    if (!strcmp(dt, "u32")) INT_REDUCE(uint32_t, uint32_t)
    if (!strcmp(dt, "i64")) INT_REDUCE(int64_t, uint64_t)
    if (!strcmp(dt, "u64")) INT_REDUCE(uint64_t, uint64_t)
    if (!strcmp(dt, "f32")) FLOAT_REDUCE(float, fminf, fmaxf)
    if (!strcmp(dt, "f64")) FLOAT_REDUCE(double, fmin, fmax)
    if (!strcmp(dt, "f16")) HALF_REDUCE(f16_widen, f16_narrow)
    if (!strcmp(dt, "bf16")) HALF_REDUCE(bf16_widen, bf16_narrow)
    return 98;
}

static int divide(const char* dt, void* dp, uint64_t n, void* divisor) {
    if (!strcmp(dt, "f64")) { double v = *(double*)divisor; double* d = dp; for (uint64_t i = 0; i < n; i++) d[i] /= v; return 0; }
    float v = *(float*)divisor;
    if (!strcmp(dt, "f32")) { float* d = dp; for (uint64_t i = 0; i < n; i++) d[i] /= v; return 0; }
    if (!strcmp(dt, "f16")) { uint16_t* d = dp; for (uint64_t i = 0; i < n; i++) d[i] = f16_narrow(f16_widen(d[i]) / v); return 0; }
    if (!strcmp(dt, "bf16")) { uint16_t* d = dp; for (uint64_t i = 0; i < n; i++) d[i] = bf16_narrow(bf16_widen(d[i]) / v); return 0; }
    return 98;
}

/* Block quantization (csrc/quant.cu): element i of dtype dt as f32, and back. */
static float qload(const char* dt, const void* x, uint64_t i) {
    if (!strcmp(dt, "f32")) return ((const float*)x)[i];
    if (!strcmp(dt, "f64")) return (float)((const double*)x)[i];
    if (!strcmp(dt, "f16")) return f16_widen(((const uint16_t*)x)[i]);
    return bf16_widen(((const uint16_t*)x)[i]);
}
static void qstore(const char* dt, void* o, uint64_t i, float v) {
    if (!strcmp(dt, "f32")) ((float*)o)[i] = v;
    else if (!strcmp(dt, "f64")) ((double*)o)[i] = (double)v;
    else if (!strcmp(dt, "f16")) ((uint16_t*)o)[i] = f16_narrow(v);
    else ((uint16_t*)o)[i] = bf16_narrow(v);
}
static int qcode(float v, float inv, float qmax, int finite) {
    float x = v * inv;
    return finite && x == x ? (int)rintf(fminf(fmaxf(x, -qmax), qmax)) : 0;
}
static int quantize(const char* dt, int bits, const void* x, unsigned char* rec, uint64_t n,
                    uint64_t block, uint64_t rec_bytes) {
    uint64_t nb = (n + block - 1) / block;
    unsigned char* codes = rec + 4 * nb;
    float qmax = bits == 8 ? 127.0f : 7.0f;
    for (uint64_t b = 0; b < nb; b++) {
        uint64_t base = b * block, len = n - base < block ? n - base : block;
        float m = 0.0f;
        int bad = 0;
        for (uint64_t i = 0; i < len; i++) {
            float v = qload(dt, x, base + i);
            bad |= !(fabsf(v) <= FLT_MAX);
            m = fmaxf(m, fabsf(v));
        }
        float scale = bad ? NAN : m / qmax, inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        memcpy(rec + 4 * b, &scale, 4);
        if (bits == 8) {
            for (uint64_t i = 0; i < len; i++)
                codes[base + i] = (uint8_t)(int8_t)qcode(qload(dt, x, base + i), inv, qmax, !bad);
        } else {
            for (uint64_t k = 0; 2 * k < len; k++) {
                int c0 = qcode(qload(dt, x, base + 2 * k), inv, qmax, !bad);
                int c1 = 2 * k + 1 < len ? qcode(qload(dt, x, base + 2 * k + 1), inv, qmax, !bad) : 0;
                codes[base / 2 + k] = (uint8_t)((c0 & 0xf) | ((c1 & 0xf) << 4));
            }
        }
    }
    uint64_t used = 4 * nb + (bits == 8 ? n : (n + 1) / 2);
    if (rec_bytes > used) memset(rec + used, 0, rec_bytes - used);
    return 0;
}
/* Decodes into dtype dt, or (dt "add") adds to f32 sums. */
static int dequantize(const char* dt, int bits, const unsigned char* rec, void* out, uint64_t n,
                      uint64_t block) {
    uint64_t nb = (n + block - 1) / block;
    const unsigned char* codes = rec + 4 * nb;
    for (uint64_t i = 0; i < n; i++) {
        float s;
        memcpy(&s, rec + 4 * (i / block), 4);
        int c = bits == 8 ? (int)(int8_t)codes[i] : (((codes[i >> 1] >> ((i & 1) * 4)) & 0xf) ^ 8) - 8;
        float v = (float)c * s;
        if (!strcmp(dt, "add")) ((float*)out)[i] += v;
        else qstore(dt, out, i, v);
    }
    return 0;
}

/* The batched decodes: `count` records `stride` bytes apart, record d into out[d * n ..]
 * (dt a dtype), or (dt "sum") added in record order to f32 sums, the first stored unless
 * add_first: as `count` single decodes in that order. */
static int dequantize_batch(const char* dt, int bits, const unsigned char* recs, void* out,
                            uint64_t n, uint64_t block, uint64_t stride, uint32_t count,
                            uint32_t add_first) {
    if (strcmp(dt, "sum")) {
        size_t es = !strcmp(dt, "f32") ? 4 : !strcmp(dt, "f64") ? 8 : 2;
        for (uint32_t d = 0; d < count; d++)
            dequantize(dt, bits, recs + d * stride, (char*)out + d * n * es, n, block);
        return 0;
    }
    for (uint32_t d = 0; d < count; d++) {
        if (d == 0 && !add_first) dequantize("f32", bits, recs, out, n, block);
        else dequantize("add", bits, recs + d * stride, out, n, block);
    }
    return 0;
}

/* A kernel launch, its arguments read when it is queued (as HIP copies them). */
typedef struct {
    int kind; /* 'r' reduce, 'd' divide, 't' transpose, 'q' quantize, 'u' dequantize,
                 'm' batched dequantize, 'c' from f32 */
    char dt[8], op;
    void* d;
    const void *a, *b;
    uint64_t n, M, N;
    size_t blk;
    unsigned char divisor[8];
    int bits;
    uint32_t count, add_first;
} Launch;
static int known_dtype(const char* dt) {
    static const char* all[] = {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "bf16", "f32", "f64"};
    for (int i = 0; i < 10; i++) if (!strcmp(dt, all[i])) return 1;
    return 0;
}
static int launch_run(void* p) {
    Launch* l = p;
    if (l->kind == 'r') return reduce(l->dt, l->op, l->d, l->a, l->b, l->n);
    if (l->kind == 'd') return divide(l->dt, l->d, l->n, l->divisor);
    if (l->kind == 'q') return quantize(l->dt, l->bits, l->a, l->d, l->n, l->blk, l->M);
    if (l->kind == 'u') return dequantize(l->dt, l->bits, l->a, l->d, l->n, l->blk);
    if (l->kind == 'm')
        return dequantize_batch(l->dt, l->bits, l->a, l->d, l->n, l->blk, l->M, l->count, l->add_first);
    if (l->kind == 'c') {
        float mul; memcpy(&mul, l->divisor, 4);
        for (uint64_t i = 0; i < l->n; i++) qstore(l->dt, l->d, i, ((const float*)l->a)[i] * mul);
        return 0;
    }
    const char* s = l->a; char* d = l->d;
    for (uint64_t i = 0; i < l->M; i++)
        for (uint64_t j = 0; j < l->N; j++) memcpy(d + (j * l->M + i) * l->blk, s + (i * l->N + j) * l->blk, l->blk);
    return 0;
}

/* Test hooks (called through dlsym by tests/rocm_fake.rs): from now on every kernel launch
 * fails; from now on rank r's RCCL collectives fail (as FAKE_RCCL_FAIL_RANK). */
static int fail_launches, fail_rank = -1;
/* Batched decodes launched so far (tests/rocm_fake_quantized.rs: one per call, not per rank). */
static long batch_launches;
long fake_hip_batch_launches(void) { return __atomic_load_n(&batch_launches, __ATOMIC_SEQ_CST); }
void fake_hip_fail_launches_from_now(void) { __atomic_store_n(&fail_launches, 1, __ATOMIC_SEQ_CST); }
void fake_rccl_fail_rank_from_now(int r) { __atomic_store_n(&fail_rank, r, __ATOMIC_SEQ_CST); }

E hipModuleLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned smem, void* st, void** a, void** extra) {
    const char* k = (const char*)f;
    const char* fail = getenv("FAKE_HIP_FAIL_LAUNCH_AFTER");
    long seen = __atomic_add_fetch(&launches, 1, __ATOMIC_SEQ_CST);
    if ((fail && *fail && seen > atol(fail)) || __atomic_load_n(&fail_launches, __ATOMIC_SEQ_CST)) return 719;
    if (gx == 0 || bx == 0 || bx > 1024 || extra) return 1;
    Launch l;
    memset(&l, 0, sizeof l);
    if (!strncmp(k, "pccl_reduce_", 12)) {
        const char* us = strchr(k + 12, '_');
        if (!us || us - (k + 12) >= 8) return 98;
        memcpy(l.dt, k + 12, us - (k + 12));
        l.op = !strcmp(us + 1, "sum") ? 's' : !strcmp(us + 1, "prod") ? 'p'
             : !strcmp(us + 1, "min") ? 'n' : !strcmp(us + 1, "max") ? 'x' : 0;
        if (!l.op || !known_dtype(l.dt)) return 98;
        l.kind = 'r';
        l.d = *(void**)a[0]; l.a = *(void**)a[1]; l.b = *(void**)a[2]; l.n = *(uint64_t*)a[3];
    } else if (!strncmp(k, "pccl_divide_", 12)) {
        if (strlen(k + 12) >= 8) return 98;
        strcpy(l.dt, k + 12);
        if (strcmp(l.dt, "f16") && strcmp(l.dt, "bf16") && strcmp(l.dt, "f32") && strcmp(l.dt, "f64")) return 98;
        l.kind = 'd';
        l.d = *(void**)a[0]; l.n = *(uint64_t*)a[1];
        memcpy(l.divisor, a[3], strcmp(l.dt, "f64") ? 4 : 8);
    } else if (!strncmp(k, "pccl_dequantize_many_", 21) || !strncmp(k, "pccl_dequantize_sum_", 20)) {
        int sum = k[16] == 's';
        const char* rest = k + (sum ? 20 : 21);
        if (sum) {
            strcpy(l.dt, "sum");
            l.bits = atoi(rest);
        } else {
            const char* us = strrchr(rest, '_');
            if (!us || us - rest >= 8 || us == rest) return 98;
            memcpy(l.dt, rest, us - rest);
            l.bits = atoi(us + 1);
            if (strcmp(l.dt, "f16") && strcmp(l.dt, "bf16") && strcmp(l.dt, "f32") && strcmp(l.dt, "f64"))
                return 98;
        }
        if (l.bits != 8 && l.bits != 4) return 98;
        l.kind = 'm';
        /* (recs, out, n, block, stride, count[, add_first]) */
        l.a = *(void**)a[0]; l.d = *(void**)a[1]; l.n = *(uint64_t*)a[2]; l.blk = *(uint32_t*)a[3];
        l.M = *(uint64_t*)a[4]; l.count = *(uint32_t*)a[5];
        l.add_first = sum ? *(uint32_t*)a[6] : 0;
        if (l.blk < 32 || (l.blk & (l.blk - 1)) || l.count == 0) return 1;
        __atomic_add_fetch(&batch_launches, 1, __ATOMIC_SEQ_CST);
    } else if (!strncmp(k, "pccl_quantize_", 14) || !strncmp(k, "pccl_dequantize_", 16)) {
        int enc = k[5] == 'q';
        const char* rest = k + (enc ? 14 : 16);
        const char* us = strrchr(rest, '_');
        if (!us || us - rest >= 8 || us == rest) return 98;
        memcpy(l.dt, rest, us - rest);
        l.bits = atoi(us + 1);
        if (l.bits != 8 && l.bits != 4) return 98;
        if (strcmp(l.dt, "f16") && strcmp(l.dt, "bf16") && strcmp(l.dt, "f32") && strcmp(l.dt, "f64")
            && (enc || strcmp(l.dt, "add"))) return 98;
        l.kind = enc ? 'q' : 'u';
        /* quantize(x, rec, n, block, rec_bytes); dequantize(rec, out, n, block) */
        l.a = *(void**)a[0]; l.d = *(void**)a[1]; l.n = *(uint64_t*)a[2]; l.blk = *(uint32_t*)a[3];
        if (enc) l.M = *(uint64_t*)a[4];
        if (l.blk < 32 || (l.blk & (l.blk - 1))) return 1;
    } else if (!strncmp(k, "pccl_from_f32_", 14)) {
        if (strlen(k + 14) >= 8) return 98;
        strcpy(l.dt, k + 14);
        if (strcmp(l.dt, "f16") && strcmp(l.dt, "bf16") && strcmp(l.dt, "f32") && strcmp(l.dt, "f64")) return 98;
        l.kind = 'c';
        l.a = *(void**)a[0]; l.d = *(void**)a[1]; l.n = *(uint64_t*)a[2];
        memcpy(l.divisor, a[3], 4);
    } else if (!strncmp(k, "pccl_transpose_", 15)) {
        int tile = k[15] == 't';
        size_t u = (size_t)atoi(strrchr(k, '_') + 1);
        l.kind = 't';
        l.a = *(const char**)a[0]; l.d = *(char**)a[1];
        l.M = *(uint64_t*)a[2]; l.N = *(uint64_t*)a[3];
        uint64_t kk = tile ? *(uint32_t*)a[4] : *(uint64_t*)a[4];
        if (tile && (*(uint32_t*)a[5] == 0 || *(uint32_t*)a[6] == 0 || smem == 0)) return 1;
        l.blk = kk * u;
    } else {
        return 98;
    }
    Launch* q = malloc(sizeof *q);
    *q = l;
    maybe_stall(st);
    return enqueue(st, launch_run, q);
}

/* ---- hipRTC: "compiles" to a marker the module loader accepts --------------------------- */
static __thread int arch_ok;
E hiprtcCreateProgram(void** p, const char* src, const char* name, int nh, const char** h,
                      const char** hn) {
    *p = malloc(1);
    return strstr(src, "#line 1") && strstr(src, "pccl_") ? 0 : 1;
}
E hiprtcCompileProgram(void* p, int n, const char** o) {
    arch_ok = 0;
    for (int i = 0; i < n; i++) arch_ok |= !strncmp(o[i], "--offload-arch=gfx90a", 21);
    return arch_ok ? 0 : 6;
}
E hiprtcGetProgramLogSize(void* p, size_t* n) { *n = 9; return 0; }
E hiprtcGetProgramLog(void* p, char* s) { strcpy(s, "fake log"); return 0; }
E hiprtcGetCodeSize(void* p, size_t* n) { *n = 4; return 0; }
E hiprtcGetCode(void* p, char* c) { memcpy(c, "CODE", 4); return 0; }
E hiprtcDestroyProgram(void** p) { free(*p); return 0; }
const char* hiprtcGetErrorString(E e) { return "fake hipRTC error"; }

/* ---- RCCL: worlds of thread ranks in this process ------------------------------------------
 * ncclCommInitRank joins the world named by the unique id (made on first join, freed when its
 * last communicator and queued collective is gone) and waits until all its ranks joined. A
 * collective is queued on its stream, where every rank posts its send buffer, waits at a
 * barrier, computes its own result from the posted buffers into a temporary, waits until every
 * rank has read, then writes it out (so in-place calls are safe). FAKE_RCCL_FAIL_RANK=r makes
 * rank r's collectives fail at the call (ncclSystemError) and breaks the world: the other
 * ranks' queued collectives give up and ncclCommGetAsyncError reports ncclRemoteError. A
 * barrier gives up after FAKE_RCCL_TIMEOUT_S (default 60) seconds; ncclCommAbort breaks the
 * world, so a collective stuck waiting for a peer ends. */
#define MAX_RANKS 64
typedef struct { char internal[128]; } Id;
typedef struct World {
    char id[128];
    int n, refs, arrived, broken, taken[MAX_RANKS];
    unsigned long gen;
    const void* send[MAX_RANKS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct World* next;
} World;
typedef struct { World* w; int rank; } Comm;
static pthread_mutex_t worlds_mu = PTHREAD_MUTEX_INITIALIZER;
static World* worlds;
static long ids;
static const size_t esz[10] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
static const char* dtn[10] = {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16"};

E ncclGetVersion(int* v) { *v = 21804; return 0; }
E ncclGetUniqueId(Id* id) {
    memset(id, 0, sizeof *id);
    snprintf(id->internal, 128, "fake-rccl-%d-%ld", (int)getpid(), __atomic_add_fetch(&ids, 1, __ATOMIC_SEQ_CST));
    return 0;
}
const char* ncclGetErrorString(E e) {
    return e == 2 ? "fake RCCL failure (FAKE_RCCL_FAIL_RANK)" : e == 6 ? "fake RCCL peer failed or timed out"
         : e == 5 ? "fake RCCL invalid usage" : "fake RCCL error";
}

/* 0 when every rank arrived; 6 when the world broke or the wait timed out. */
static int barrier(World* w) {
    const char* t = getenv("FAKE_RCCL_TIMEOUT_S");
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += t && *t ? atoi(t) : 60;
    pthread_mutex_lock(&w->mu);
    int r = 0;
    if (w->broken) r = 6;
    else {
        unsigned long g = w->gen;
        if (++w->arrived == w->n) { w->arrived = 0; w->gen++; pthread_cond_broadcast(&w->cv); }
        else {
            while (w->gen == g && !w->broken)
                if (pthread_cond_timedwait(&w->cv, &w->mu, &until)) { w->broken = 1; pthread_cond_broadcast(&w->cv); }
            if (w->gen == g) r = 6;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return r;
}

E ncclCommInitRank(void** c, int n, Id id, int r) {
    if (n < 1 || n > MAX_RANKS || r < 0 || r >= n) return 4;
    if (strncmp(id.internal, "fake-rccl-", 10)) return 4;
    pthread_mutex_lock(&worlds_mu);
    World* w = worlds;
    while (w && memcmp(w->id, id.internal, 128)) w = w->next;
    if (!w) {
        w = calloc(1, sizeof *w);
        memcpy(w->id, id.internal, 128);
        w->n = n;
        pthread_mutex_init(&w->mu, 0);
        pthread_cond_init(&w->cv, 0);
        w->next = worlds;
        worlds = w;
    }
    if (w->n != n || w->taken[r]) { pthread_mutex_unlock(&worlds_mu); return 5; }
    w->taken[r] = 1;
    w->refs++;
    pthread_mutex_unlock(&worlds_mu);
    Comm* cm = malloc(sizeof *cm);
    cm->w = w;
    cm->rank = r;
    *c = cm;
    return barrier(w);
}
/* Drops one reference to a world (a communicator or a queued collective holds one). */
static void world_unref(World* w) {
    pthread_mutex_lock(&worlds_mu);
    if (--w->refs == 0) {
        World** p = &worlds;
        while (*p != w) p = &(*p)->next;
        *p = w->next;
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
    }
    pthread_mutex_unlock(&worlds_mu);
}
static void world_break(World* w) {
    pthread_mutex_lock(&w->mu);
    w->broken = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}
static E leave(void* c, int abort) {
    Comm* cm = c;
    World* w = cm->w;
    if (abort) world_break(w); /* collectives still queued or waiting give up */
    pthread_mutex_lock(&worlds_mu);
    w->taken[cm->rank] = 0;
    pthread_mutex_unlock(&worlds_mu);
    world_unref(w);
    free(cm);
    return 0;
}
E ncclCommDestroy(void* c) { return leave(c, 0); }
E ncclCommAbort(void* c) { return leave(c, 1); }
E ncclCommGetAsyncError(void* c, E* r) { *r = ((Comm*)c)->w->broken ? 6 : 0; return 0; }

enum { AG, RS, AR, BC };
typedef struct { int kind; const void* s; void* d; size_t n; int t, op, root; World* w; int me; } Coll;
static int run_collective(void* p) {
    Coll* a = p;
    World* w = a->w;
    int N = w->n, me = a->me, t = a->t, kind = a->kind;
    size_t n = a->n, es = esz[t], out = (kind == AG ? n * N : n) * es;
    w->send[me] = a->s;
    E r = barrier(w);
    if (!r) {
        char* tmp = malloc(out ? out : 1);
        char opc = a->op == 1 ? 'p' : a->op == 2 ? 'x' : a->op == 3 ? 'n' : 's';
        if (kind == AG)
            for (int q = 0; q < N; q++) memcpy(tmp + q * n * es, w->send[q], n * es);
        else if (kind == BC)
            memcpy(tmp, w->send[a->root], out);
        else {
            size_t off = kind == RS ? me * n * es : 0;
            memcpy(tmp, (const char*)w->send[0] + off, out);
            for (int q = 1; q < N && !r; q++) r = reduce(dtn[t], opc, tmp, tmp, (const char*)w->send[q] + off, n);
            if (!r && a->op == 4) {
                double dd = N; float df = (float)N;
                r = divide(dtn[t], tmp, n, t == 8 ? (void*)&dd : (void*)&df);
            }
            if (r) r = 4;
        }
        E b = barrier(w);
        if (!r && !b) memcpy(a->d, tmp, out);
        free(tmp);
        if (!r) r = b;
    }
    /* As NCCL's: a failure leaves the stream alone and shows in every rank's
     * ncclCommGetAsyncError. */
    if (r) world_break(w);
    world_unref(w);
    return 0;
}
/* Checks the arguments, then queues the collective on stream st (runs it at once on the null
 * stream: then its error is returned). */
static E collective(int kind, const void* s, void* d, size_t n, int t, int op, int root, void* c, void* st) {
    Comm* cm = c;
    World* w = cm->w;
    int N = w->n, me = cm->rank;
    if (t < 0 || t > 9 || op < 0 || op > 4 || (kind == BC && (root < 0 || root >= N))) return 4;
    if (op == 4 && t < 6) return 5; /* the fake averages floating-point types only */
    const char* fail = getenv("FAKE_RCCL_FAIL_RANK");
    if ((fail && *fail && atoi(fail) == me) || __atomic_load_n(&fail_rank, __ATOMIC_SEQ_CST) == me) {
        world_break(w);
        return 2;
    }
    Coll* a = malloc(sizeof *a);
    *a = (Coll){kind, s, d, n, t, op, root, w, me};
    pthread_mutex_lock(&worlds_mu);
    w->refs++;
    pthread_mutex_unlock(&worlds_mu);
    return enqueue(st, run_collective, a);
}
E ncclAllGather(const void* s, void* d, size_t n, int t, void* c, void* st) { return collective(AG, s, d, n, t, 0, 0, c, st); }
E ncclReduceScatter(const void* s, void* d, size_t n, int t, int op, void* c, void* st) { return collective(RS, s, d, n, t, op, 0, c, st); }
E ncclAllReduce(const void* s, void* d, size_t n, int t, int op, void* c, void* st) { return collective(AR, s, d, n, t, op, 0, c, st); }
E ncclBroadcast(const void* s, void* d, size_t n, int t, int root, void* c, void* st) { return collective(BC, s, d, n, t, 0, root, c, st); }
