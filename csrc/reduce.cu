// PCCL device reductions, compiled at run time by NVRTC (see src/device/cuda.rs) or hipRTC
// (src/device/hip.rs).
//
// Self-contained: no headers, so that any NVRTC finds everything it needs.
//
//   pccl_reduce_<dtype>_<op>(dst, a, b, n, head)  dst[i] = a[i] op b[i], i < n
//   pccl_divide_<dtype>(dst, n, head, divisor)    dst[i] = dst[i] / divisor (floating point)
//
// op is sum, prod, min or max (avg is a sum followed by a divide, as on the host). The
// results are bit-identical to the host kernels in src/device/host.rs: integers wrap,
// f32/f64 use IEEE round-to-nearest arithmetic, and f16/bf16 are widened to f32, combined
// and rounded back to nearest-even once.
//
// Memory layout: elements [0, head) are scalars before the first 16-byte boundary that dst,
// a and b share; then whole 16-byte vectors; then a scalar tail. The host sets head = n when
// the three pointers do not share an alignment, which makes the whole call scalar.
//
// Each thread keeps PCCL_UNROLL independent 16-byte loads of each input in flight before the
// first use; blocks walk the vectors in chunks of blockDim.x * PCCL_UNROLL with a grid stride.

#ifndef PCCL_UNROLL
#define PCCL_UNROLL 4
#endif

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// Raw 16-bit storage of the half-precision types (no cuda_fp16.h needed).
struct f16 {
    u16 bits;
};
struct bf16 {
    u16 bits;
};

struct alignas(16) Vec16 {
    u32 w[4];
};

#if defined(__HIP__)
// hipRTC (src/device/hip.rs): the same conversions with clang builtins instead of PTX.
// _Float16 conversions round to nearest even, as cvt.rn does.
__device__ __forceinline__ float f16_to_f32(u16 h) { return (float)__builtin_bit_cast(_Float16, h); }
__device__ __forceinline__ u16 f32_to_f16(float f) { return __builtin_bit_cast(u16, (_Float16)f); }
__device__ __forceinline__ u32 f32_bits(float f) { return __builtin_bit_cast(u32, f); }
__device__ __forceinline__ float bits_f32(u32 u) { return __builtin_bit_cast(float, u); }
#else
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ u32 f32_bits(float f) {
    u32 u;
    asm("mov.b32 %0, %1;" : "=r"(u) : "f"(f));
    return u;
}

__device__ __forceinline__ float bits_f32(u32 u) {
    float f;
    asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u));
    return f;
}
#endif

__device__ __forceinline__ float bf16_to_f32(u16 h) { return bits_f32(((u32)h) << 16); }

// Round to nearest even; NaNs stay NaN (quiet bit set), as half::bf16::from_f32 does.
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// Storage type T, compute type C, and the conversions between them.
template <typename T> struct Elem {
    typedef T C;
    __device__ __forceinline__ static C load(T x) { return x; }
    __device__ __forceinline__ static T store(C x) { return x; }
};
template <> struct Elem<f16> {
    typedef float C;
    __device__ __forceinline__ static C load(f16 x) { return f16_to_f32(x.bits); }
    __device__ __forceinline__ static f16 store(C x) {
        f16 r;
        r.bits = f32_to_f16(x);
        return r;
    }
};
template <> struct Elem<bf16> {
    typedef float C;
    __device__ __forceinline__ static C load(bf16 x) { return bf16_to_f32(x.bits); }
    __device__ __forceinline__ static bf16 store(C x) {
        bf16 r;
        r.bits = f32_to_bf16(x);
        return r;
    }
};

// Integers wrap: the arithmetic happens in the unsigned type of the same width.
template <typename T> struct Unsigned {
    typedef T t;
};
template <> struct Unsigned<i8> {
    typedef u8 t;
};
template <> struct Unsigned<i32> {
    typedef u32 t;
};
template <> struct Unsigned<i64> {
    typedef u64 t;
};

template <typename C> struct Arith {
    typedef typename Unsigned<C>::t U;
    __device__ __forceinline__ static C add(C a, C b) { return (C)(U)((U)a + (U)b); }
    __device__ __forceinline__ static C mul(C a, C b) { return (C)(U)((U)a * (U)b); }
    __device__ __forceinline__ static C min(C a, C b) { return b < a ? b : a; }
    __device__ __forceinline__ static C max(C a, C b) { return a < b ? b : a; }
};
// IEEE minNum/maxNum: a NaN operand yields the other operand, like Rust's f32::min.
template <> struct Arith<float> {
    __device__ __forceinline__ static float add(float a, float b) { return __fadd_rn(a, b); }
    __device__ __forceinline__ static float mul(float a, float b) { return __fmul_rn(a, b); }
    __device__ __forceinline__ static float min(float a, float b) { return fminf(a, b); }
    __device__ __forceinline__ static float max(float a, float b) { return fmaxf(a, b); }
};
template <> struct Arith<double> {
    __device__ __forceinline__ static double add(double a, double b) { return __dadd_rn(a, b); }
    __device__ __forceinline__ static double mul(double a, double b) { return __dmul_rn(a, b); }
    __device__ __forceinline__ static double min(double a, double b) { return fmin(a, b); }
    __device__ __forceinline__ static double max(double a, double b) { return fmax(a, b); }
};

struct OpSum {
    template <typename C> __device__ __forceinline__ static C apply(C a, C b) { return Arith<C>::add(a, b); }
};
struct OpProd {
    template <typename C> __device__ __forceinline__ static C apply(C a, C b) { return Arith<C>::mul(a, b); }
};
struct OpMin {
    template <typename C> __device__ __forceinline__ static C apply(C a, C b) { return Arith<C>::min(a, b); }
};
struct OpMax {
    template <typename C> __device__ __forceinline__ static C apply(C a, C b) { return Arith<C>::max(a, b); }
};

template <typename T, typename Op> __device__ __forceinline__ T combine(T a, T b) {
    typedef Elem<T> E;
    return E::store(Op::template apply<typename E::C>(E::load(a), E::load(b)));
}

template <typename T> union Lanes {
    Vec16 v;
    T e[16 / sizeof(T)];
};

template <typename T, typename Op>
__device__ __forceinline__ void reduce_body(T* dst, const T* a, const T* b, u64 n, u64 head) {
    const int W = 16 / sizeof(T);
    const u64 nthreads = (u64)gridDim.x * blockDim.x;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (head > n) {
        head = n;
    }
    const u64 nvec = (n - head) / W;
    const u64 tail = head + nvec * W;

    for (u64 i = tid; i < head; i += nthreads) {
        dst[i] = combine<T, Op>(a[i], b[i]);
    }
    for (u64 i = tail + tid; i < n; i += nthreads) {
        dst[i] = combine<T, Op>(a[i], b[i]);
    }

    const Vec16* va = reinterpret_cast<const Vec16*>(a + head);
    const Vec16* vb = reinterpret_cast<const Vec16*>(b + head);
    Vec16* vd = reinterpret_cast<Vec16*>(dst + head);
    const u64 chunk = (u64)blockDim.x * PCCL_UNROLL;
    for (u64 base = (u64)blockIdx.x * chunk + threadIdx.x; base < nvec; base += (u64)gridDim.x * chunk) {
        Lanes<T> x[PCCL_UNROLL];
        Lanes<T> y[PCCL_UNROLL];
#pragma unroll
        for (int u = 0; u < PCCL_UNROLL; u++) {
            const u64 i = base + (u64)u * blockDim.x;
            if (i < nvec) {
                x[u].v = va[i];
                y[u].v = vb[i];
            }
        }
#pragma unroll
        for (int u = 0; u < PCCL_UNROLL; u++) {
            const u64 i = base + (u64)u * blockDim.x;
            if (i < nvec) {
#pragma unroll
                for (int k = 0; k < W; k++) {
                    x[u].e[k] = combine<T, Op>(x[u].e[k], y[u].e[k]);
                }
                vd[i] = x[u].v;
            }
        }
    }
}

template <typename T> __device__ __forceinline__ T divide_one(T x, float d) {
    typedef Elem<T> E;
    return E::store(__fdiv_rn(E::load(x), d));
}
__device__ __forceinline__ double divide_one(double x, double d) { return __ddiv_rn(x, d); }

template <typename T, typename D> __device__ __forceinline__ void divide_body(T* dst, u64 n, u64 head, D d) {
    const int W = 16 / sizeof(T);
    const u64 nthreads = (u64)gridDim.x * blockDim.x;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (head > n) {
        head = n;
    }
    const u64 nvec = (n - head) / W;
    const u64 tail = head + nvec * W;
    for (u64 i = tid; i < head; i += nthreads) {
        dst[i] = divide_one(dst[i], d);
    }
    for (u64 i = tail + tid; i < n; i += nthreads) {
        dst[i] = divide_one(dst[i], d);
    }
    Vec16* vd = reinterpret_cast<Vec16*>(dst + head);
    const u64 chunk = (u64)blockDim.x * PCCL_UNROLL;
    for (u64 base = (u64)blockIdx.x * chunk + threadIdx.x; base < nvec; base += (u64)gridDim.x * chunk) {
        Lanes<T> x[PCCL_UNROLL];
#pragma unroll
        for (int u = 0; u < PCCL_UNROLL; u++) {
            const u64 i = base + (u64)u * blockDim.x;
            if (i < nvec) {
                x[u].v = vd[i];
            }
        }
#pragma unroll
        for (int u = 0; u < PCCL_UNROLL; u++) {
            const u64 i = base + (u64)u * blockDim.x;
            if (i < nvec) {
#pragma unroll
                for (int k = 0; k < W; k++) {
                    x[u].e[k] = divide_one(x[u].e[k], d);
                }
                vd[i] = x[u].v;
            }
        }
    }
}

#define PCCL_REDUCE(T, NAME, OP, OPNAME)                                                              \
    extern "C" __global__ void pccl_reduce_##NAME##_##OPNAME(T* dst, const T* a, const T* b, u64 n, \
                                                             u64 head) {                          \
        reduce_body<T, OP>(dst, a, b, n, head);                                                   \
    }

#define PCCL_REDUCE_ALL_OPS(T, NAME)    \
    PCCL_REDUCE(T, NAME, OpSum, sum)   \
    PCCL_REDUCE(T, NAME, OpProd, prod) \
    PCCL_REDUCE(T, NAME, OpMin, min)   \
    PCCL_REDUCE(T, NAME, OpMax, max)

PCCL_REDUCE_ALL_OPS(i8, i8)
PCCL_REDUCE_ALL_OPS(u8, u8)
PCCL_REDUCE_ALL_OPS(i32, i32)
PCCL_REDUCE_ALL_OPS(u32, u32)
PCCL_REDUCE_ALL_OPS(i64, i64)
PCCL_REDUCE_ALL_OPS(u64, u64)
PCCL_REDUCE_ALL_OPS(f16, f16)
PCCL_REDUCE_ALL_OPS(bf16, bf16)
PCCL_REDUCE_ALL_OPS(float, f32)
PCCL_REDUCE_ALL_OPS(double, f64)

// The divisor is passed as the type the host divides in: f32 for f16, bf16 and f32
// (`n as f32`), f64 for f64 (`n as f64`).
extern "C" __global__ void pccl_divide_f16(f16* dst, u64 n, u64 head, float d) { divide_body(dst, n, head, d); }
extern "C" __global__ void pccl_divide_bf16(bf16* dst, u64 n, u64 head, float d) { divide_body(dst, n, head, d); }
extern "C" __global__ void pccl_divide_f32(float* dst, u64 n, u64 head, float d) { divide_body(dst, n, head, d); }
extern "C" __global__ void pccl_divide_f64(double* dst, u64 n, u64 head, double d) { divide_body(dst, n, head, d); }
