/* A stand-in for libamdhip64 + libhiprtc + librccl that executes on the CPU, for testing
 * PCCL's ROCm path without an AMD GPU (see docs/DEVICE.md). Device memory is host memory,
 * every stream operation runs at once (so streams and events are always complete), and
 * hipModuleLaunchKernel dispatches by kernel name to C versions of csrc/reduce.cu and
 * csrc/transpose.cu with the arithmetic of PCCL's host kernels. RCCL runs worlds of thread
 * ranks of this process (see the RCCL section).
 *
 * Environment: FAKE_HIP_DEVICES (default 2) devices, each with a distinct UUID;
 * FAKE_HIP_FAIL_LAUNCH_AFTER=N makes every kernel launch after the N-th fail with
 * hipErrorLaunchFailure (719), to check that runtime errors surface as errors. */
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
E hipStreamCreate(void** s) { *s = malloc(sizeof(int)); **(int**)s = current; return 0; }
E hipStreamGetDevice(void* s, int* d) { if (!s) return 1; *d = *(int*)s; return 0; }
E hipStreamDestroy(void* s) { free(s); return 0; }
E hipStreamSynchronize(void* s) { return 0; }
E hipStreamWaitEvent(void* s, void* e, unsigned f) { return f == 0 ? 0 : 1; }
E hipMalloc(void** p, size_t n) { *p = aligned_alloc(256, (n + 255) / 256 * 256); return *p ? 0 : 2; }
E hipFree(void* p) { free(p); return 0; }
E hipHostMalloc(void** p, size_t n, unsigned f) { *p = aligned_alloc(64, (n + 63) / 64 * 64); return *p ? 0 : 2; }
E hipHostFree(void* p) { free(p); return 0; }
E hipMemcpyAsync(void* d, const void* s, size_t n, int k, void* st) {
    if (k < 1 || k > 3) return 1;
    memmove(d, s, n);
    return 0;
}
E hipMemsetAsync(void* d, int v, size_t n, void* st) { memset(d, v, n); return 0; }
E hipModuleLoadData(void** m, const void* img) { *m = (void*)img; return memcmp(img, "CODE", 4) ? 1 : 0; }
E hipModuleGetFunction(void** f, void* m, const char* name) { *f = strdup(name); return 0; }
const char* hipGetErrorString(E e) { return e == 719 ? "fake launch failure" : "fake HIP error"; }
E hipEventCreate(void** e) { *e = malloc(1); return 0; }
E hipEventRecord(void* e, void* s) { return 0; }
E hipEventSynchronize(void* e) { return 0; }
E hipEventQuery(void* e) { return 0; }
E hipEventElapsedTime(float* ms, void* a, void* b) { *ms = 0.25f; return 0; }
E hipEventDestroy(void* e) { free(e); return 0; }

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

E hipModuleLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned smem, void* st, void** a, void** extra) {
    const char* k = (const char*)f;
    const char* fail = getenv("FAKE_HIP_FAIL_LAUNCH_AFTER");
    long seen = __atomic_add_fetch(&launches, 1, __ATOMIC_SEQ_CST);
    if (fail && *fail && seen > atol(fail)) return 719;
    if (gx == 0 || bx == 0 || bx > 1024 || extra) return 1;
    if (!strncmp(k, "pccl_reduce_", 12)) {
        char dt[8] = {0};
        const char* us = strchr(k + 12, '_');
        if (!us || us - (k + 12) >= 8) return 98;
        memcpy(dt, k + 12, us - (k + 12));
        char op = !strcmp(us + 1, "sum") ? 's' : !strcmp(us + 1, "prod") ? 'p'
                : !strcmp(us + 1, "min") ? 'n' : !strcmp(us + 1, "max") ? 'x' : 0;
        if (!op) return 98;
        return reduce(dt, op, *(void**)a[0], *(void**)a[1], *(void**)a[2], *(uint64_t*)a[3]);
    }
    if (!strncmp(k, "pccl_divide_", 12))
        return divide(k + 12, *(void**)a[0], *(uint64_t*)a[1], a[3]);
    if (!strncmp(k, "pccl_transpose_", 15)) {
        int tile = k[15] == 't';
        size_t u = (size_t)atoi(strrchr(k, '_') + 1);
        const char* s = *(const char**)a[0]; char* d = *(char**)a[1];
        uint64_t M = *(uint64_t*)a[2], N = *(uint64_t*)a[3];
        uint64_t kk = tile ? *(uint32_t*)a[4] : *(uint64_t*)a[4];
        if (tile && (*(uint32_t*)a[5] == 0 || *(uint32_t*)a[6] == 0 || smem == 0)) return 1;
        size_t b = kk * u;
        for (uint64_t i = 0; i < M; i++)
            for (uint64_t j = 0; j < N; j++) memcpy(d + (j * M + i) * b, s + (i * N + j) * b, b);
        return 0;
    }
    return 98;
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
 * last communicator is destroyed) and waits until all its ranks joined. A collective is
 * blocking: every rank posts its send buffer, waits at a barrier, computes its own result from
 * the posted buffers into a temporary, waits until every rank has read, then writes it out
 * (so in-place calls are safe). FAKE_RCCL_FAIL_RANK=r makes rank r's collectives fail
 * (ncclSystemError) and breaks the world: the other ranks' calls return ncclRemoteError
 * instead of waiting. A barrier gives up after FAKE_RCCL_TIMEOUT_S (default 60) seconds. */
#include <pthread.h>
#include <time.h>
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
static E leave(void* c) {
    Comm* cm = c;
    World* w = cm->w;
    pthread_mutex_lock(&worlds_mu);
    w->taken[cm->rank] = 0;
    if (--w->refs == 0) {
        World** p = &worlds;
        while (*p != w) p = &(*p)->next;
        *p = w->next;
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
    }
    pthread_mutex_unlock(&worlds_mu);
    free(cm);
    return 0;
}
E ncclCommDestroy(void* c) { return leave(c); }
E ncclCommAbort(void* c) { return leave(c); }
E ncclCommGetAsyncError(void* c, E* r) { *r = ((Comm*)c)->w->broken ? 6 : 0; return 0; }

enum { AG, RS, AR, BC };
static E collective(int kind, const void* s, void* d, size_t n, int t, int op, int root, void* c) {
    Comm* cm = c;
    World* w = cm->w;
    int N = w->n, me = cm->rank;
    if (t < 0 || t > 9 || op < 0 || op > 4 || (kind == BC && (root < 0 || root >= N))) return 4;
    if (op == 4 && t < 6) return 5; /* the fake averages floating-point types only */
    const char* fail = getenv("FAKE_RCCL_FAIL_RANK");
    if (fail && *fail && atoi(fail) == me) {
        pthread_mutex_lock(&w->mu);
        w->broken = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        return 2;
    }
    size_t es = esz[t], out = (kind == AG ? n * N : n) * es;
    w->send[me] = s;
    E r = barrier(w);
    if (r) return r;
    char* tmp = malloc(out ? out : 1);
    char opc = op == 1 ? 'p' : op == 2 ? 'x' : op == 3 ? 'n' : 's';
    if (kind == AG)
        for (int q = 0; q < N; q++) memcpy(tmp + q * n * es, w->send[q], n * es);
    else if (kind == BC)
        memcpy(tmp, w->send[root], out);
    else {
        size_t off = kind == RS ? me * n * es : 0;
        memcpy(tmp, (const char*)w->send[0] + off, out);
        for (int q = 1; q < N && !r; q++) r = reduce(dtn[t], opc, tmp, tmp, (const char*)w->send[q] + off, n);
        if (!r && op == 4) {
            double dd = N; float df = (float)N;
            r = divide(dtn[t], tmp, n, t == 8 ? (void*)&dd : (void*)&df);
        }
    }
    E b = barrier(w);
    if (!r && !b) memcpy(d, tmp, out);
    free(tmp);
    return r ? 4 : b;
}
E ncclAllGather(const void* s, void* d, size_t n, int t, void* c, void* st) { return collective(AG, s, d, n, t, 0, 0, c); }
E ncclReduceScatter(const void* s, void* d, size_t n, int t, int op, void* c, void* st) { return collective(RS, s, d, n, t, op, 0, c); }
E ncclAllReduce(const void* s, void* d, size_t n, int t, int op, void* c, void* st) { return collective(AR, s, d, n, t, op, 0, c); }
E ncclBroadcast(const void* s, void* d, size_t n, int t, int root, void* c, void* st) { return collective(BC, s, d, n, t, 0, root, c); }
