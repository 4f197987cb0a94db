/* A stand-in for libamdhip64 + libhiprtc + librccl that executes on the CPU, for testing
 * PCCL's ROCm path without an AMD GPU (see docs/DEVICE.md). Device memory is host memory,
 * every stream operation runs at once (so streams and events are always complete), and
 * hipModuleLaunchKernel dispatches by kernel name to C versions of csrc/reduce.cu and
 * csrc/transpose.cu with the arithmetic of PCCL's host kernels. RCCL supports a world of
 * one rank (its collectives are copies).
 *
 * Environment: FAKE_HIP_DEVICES (default 2) devices, each with a distinct UUID;
 * FAKE_HIP_FAIL_LAUNCH_AFTER=N makes every kernel launch after the N-th fail with
 * hipErrorLaunchFailure (719), to check that runtime errors surface as errors. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
E hipStreamCreate(void** s) { *s = malloc(1); return 0; }
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

/* ---- RCCL: a world of one rank ----------------------------------------------------------- */
typedef struct { char internal[128]; } Id;
static const size_t esz[10] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
E ncclGetVersion(int* v) { *v = 21804; return 0; }
E ncclGetUniqueId(Id* id) { memset(id, 0, sizeof *id); strcpy(id->internal, "fake-rccl"); return 0; }
E ncclCommInitRank(void** c, int n, Id id, int r) {
    if (n != 1 || r != 0) return 5; /* ncclInvalidUsage: the fake has one rank */
    if (strcmp(id.internal, "fake-rccl")) return 4;
    *c = malloc(1); return 0;
}
E ncclCommDestroy(void* c) { free(c); return 0; }
E ncclCommAbort(void* c) { free(c); return 0; }
E ncclCommGetAsyncError(void* c, E* r) { *r = 0; return 0; }
const char* ncclGetErrorString(E e) { return "fake RCCL error"; }
static E copy1(const void* s, void* d, size_t n, int t) {
    if (t < 0 || t > 9) return 4;
    if (s != d) memmove(d, s, n * esz[t]);
    return 0;
}
E ncclAllGather(const void* s, void* d, size_t n, int t, void* c, void* st) { return copy1(s, d, n, t); }
E ncclReduceScatter(const void* s, void* d, size_t n, int t, int op, void* c, void* st) { return copy1(s, d, n, t); }
E ncclAllReduce(const void* s, void* d, size_t n, int t, int op, void* c, void* st) { return copy1(s, d, n, t); }
E ncclBroadcast(const void* s, void* d, size_t n, int t, int root, void* c, void* st) { return root ? 4 : copy1(s, d, n, t); }
