// PCCL block-quantization kernels (ZeRO++'s qwZ / qgZ on device memory), compiled with the
// reductions: src/device/{cuda,hip} append this file to csrc/reduce.cu, whose storage types
// (f16, bf16), conversions (Elem<T>) and integer names it uses.
//
//   pccl_quantize_<dtype>_<bits>(const T* x, u8* rec, u64 n, u32 block, u64 rec_bytes)
//   pccl_dequantize_<dtype>_<bits>(const u8* rec, T* out, u64 n, u32 block)
//   pccl_dequantize_add_<bits>(const u8* rec, float* acc, u64 n, u32 block)
//   pccl_dequantize_many_<dtype>_<bits>(const u8* recs, T* out, u64 n, u32 block, u64 stride,
//                                       u32 count)
//   pccl_dequantize_sum_<bits>(const u8* recs, float* acc, u64 n, u32 block, u64 stride,
//                              u32 count, u32 add_first)
//   pccl_from_f32_<dtype>(const float* src, T* dst, u64 n, float mul)
//
// dtype is f32, f64, f16 or bf16; bits 8 or 4. A record (src/quant/mod.rs) holds ceil(n/block)
// f32 scales, then the codes (INT8: one byte each; INT4: two per byte, low nibble first, two's
// complement), then zero padding to rec_bytes (a multiple of 8). The arithmetic is the host's,
// so results are bit-identical: the element is read as f32; a block's scale is
// max|x| / qmax (IEEE division; qmax 127 or 7); a code is rint(clamp(x * (1 / scale))) (ties
// to even); a block holding NaN or infinity gets scale NaN and codes 0 (it decodes as NaN); a
// decoded element is code * scale in f32, rounded once to T; the accumulating form adds it to
// acc in f32 (no fused multiply-add, as on the host).
//
// Quantize: one thread block per quantization block (grid-stride over the blocks), its threads
// sharing the block's maximum through shared memory, each element read once (below).
// Dequantize: element-wise, grid-stride. The batched forms take `count` records of `n`
// elements each, `stride` bytes apart (one launch where a call has a record per rank):
// `many` decodes record d into out[d * n ..], `sum` adds them to acc in record order (the
// first stored, or added when add_first), so each element sees the same f32 additions in the
// same order as `count` launches of the single forms.

#define PCCL_QUANT_MAX_THREADS 1024

__device__ __forceinline__ float q_rint(float x) {
#if defined(__HIP__)
    return __builtin_rintf(x);
#else
    return rintf(x);
#endif
}

__device__ __forceinline__ float q_nan() { return bits_f32(0x7fc00000u); }

// Any T as f32 (double rounds to nearest, as `f64 as f32` on the host).
template <typename T> __device__ __forceinline__ float q_load(T x) { return (float)Elem<T>::load(x); }
template <typename T> __device__ __forceinline__ T q_store(float v) { return Elem<T>::store(v); }
template <> __device__ __forceinline__ double q_store<double>(float v) { return (double)v; }

// The code of v in a block with reciprocal step inv (0 for an all-zero or non-finite block).
__device__ __forceinline__ int q_code(float v, float inv, float qmax, bool finite) {
    if (!finite) {
        return 0;
    }
    const float x = __fmul_rn(v, inv);
    if (x != x) {
        // 0 × inf, where the step is so small that its reciprocal overflows: code 0, as on
        // the host (fmaxf would make it -qmax).
        return 0;
    }
    return (int)q_rint(fminf(fmaxf(x, -qmax), qmax));
}

// Each thread takes units of 4 consecutive elements (unit u = thread + k * blockDim.x) and
// keeps the first PCCL_QUANT_UNITS of them in registers between finding the block's maximum
// and encoding, so an element is read from memory once (blocks of up to 4 x 4 x blockDim.x
// elements: 8192 at 512 threads); units beyond are read again.
#define PCCL_QUANT_UNITS 4

template <typename T, int BITS>
__device__ __forceinline__ void store_unit(u8* codes, u64 base, u64 u, u64 len, const float* v, float inv,
                                           float qmax, bool finite) {
    const u64 e = 4 * u;
    int c[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        c[j] = e + j < len ? q_code(v[j], inv, qmax, finite) : 0;
    }
    if (BITS == 8) {
        if (e + 4 <= len) {
            // codes + base + e is 4-byte aligned: the scales before it are 4-byte words and
            // base, e are multiples of 4.
            *reinterpret_cast<u32*>(codes + base + e) =
                (u32)(u8)c[0] | ((u32)(u8)c[1] << 8) | ((u32)(u8)c[2] << 16) | ((u32)(u8)c[3] << 24);
        } else {
            for (u64 j = 0; e + j < len; j++) {
                codes[base + e + j] = (u8)(i8)c[j];
            }
        }
    } else {
        const u8 lo = (u8)((c[0] & 0xf) | ((c[1] & 0xf) << 4));
        const u8 hi = (u8)((c[2] & 0xf) | ((c[3] & 0xf) << 4));
        u8* at = codes + base / 2 + e / 2;
        if (e + 4 <= len) {
            *reinterpret_cast<u16*>(at) = (u16)lo | ((u16)hi << 8);
        } else {
            at[0] = lo;
            if (e + 2 < len) {
                at[1] = hi;
            }
        }
    }
}

template <typename T>
__device__ __forceinline__ void load_unit(const T* x, u64 base, u64 u, u64 len, float* v, float& m, int& bad) {
    const u64 e = 4 * u;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        v[j] = e + j < len ? q_load(x[base + e + j]) : 0.0f;
        // NaN and infinities fail `|v| <= FLT_MAX`; fmaxf skips NaN, as f32::max does.
        bad |= !(fabsf(v[j]) <= 3.402823466e38f);
        m = fmaxf(m, fabsf(v[j]));
    }
}

template <typename T, int BITS>
__device__ __forceinline__ void quantize_body(const T* x, u8* rec, u64 n, u32 block, u64 rec_bytes) {
    __shared__ float s_max[PCCL_QUANT_MAX_THREADS];
    __shared__ int s_bad[PCCL_QUANT_MAX_THREADS];
    const float qmax = BITS == 8 ? 127.0f : 7.0f;
    const u64 nb = (n + block - 1) / block;
    float* scales = reinterpret_cast<float*>(rec);
    u8* codes = rec + 4 * nb;
    const u32 t = threadIdx.x;
    u32 top = 1;
    while (top < blockDim.x) {
        top <<= 1;
    }
    for (u64 b = blockIdx.x; b < nb; b += gridDim.x) {
        const u64 base = b * block;
        const u64 len = n - base < block ? n - base : block;
        const u64 units = (len + 3) / 4;
        float m = 0.0f;
        int bad = 0;
        float v[PCCL_QUANT_UNITS][4];
#pragma unroll
        for (int k = 0; k < PCCL_QUANT_UNITS; k++) {
            const u64 u = t + (u64)k * blockDim.x;
            if (u < units) {
                load_unit(x, base, u, len, v[k], m, bad);
            }
        }
        for (u64 u = t + (u64)PCCL_QUANT_UNITS * blockDim.x; u < units; u += blockDim.x) {
            float w[4];
            load_unit(x, base, u, len, w, m, bad);
        }
        s_max[t] = m;
        s_bad[t] = bad;
        __syncthreads();
        for (u32 s = top / 2; s > 0; s >>= 1) {
            if (t < s && t + s < blockDim.x) {
                s_max[t] = fmaxf(s_max[t], s_max[t + s]);
                s_bad[t] |= s_bad[t + s];
            }
            __syncthreads();
        }
        const bool finite = s_bad[0] == 0;
        const float scale = finite ? __fdiv_rn(s_max[0], qmax) : q_nan();
        const float inv = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
        if (t == 0) {
            scales[b] = scale;
        }
#pragma unroll
        for (int k = 0; k < PCCL_QUANT_UNITS; k++) {
            const u64 u = t + (u64)k * blockDim.x;
            if (u < units) {
                store_unit<T, BITS>(codes, base, u, len, v[k], inv, qmax, finite);
            }
        }
        for (u64 u = t + (u64)PCCL_QUANT_UNITS * blockDim.x; u < units; u += blockDim.x) {
            float w[4];
            float m2 = 0.0f;
            int bad2 = 0;
            load_unit(x, base, u, len, w, m2, bad2);
            store_unit<T, BITS>(codes, base, u, len, w, inv, qmax, finite);
        }
        // s_max / s_bad are rewritten by the next block.
        __syncthreads();
    }
    if (blockIdx.x == 0) {
        const u64 used = 4 * nb + (BITS == 8 ? n : (n + 1) / 2);
        for (u64 i = used + t; i < rec_bytes; i += blockDim.x) {
            rec[i] = 0;
        }
    }
}

template <int BITS> __device__ __forceinline__ float q_decode(const u8* rec, u64 nb, u64 i, u32 block) {
    const float s = reinterpret_cast<const float*>(rec)[i / block];
    const u8* codes = rec + 4 * nb;
    int c;
    if (BITS == 8) {
        c = (int)(i8)codes[i];
    } else {
        const int nib = (codes[i >> 1] >> ((i & 1) * 4)) & 0xf;
        c = (nib ^ 8) - 8;
    }
    return __fmul_rn((float)c, s);
}

template <typename T, int BITS>
__device__ __forceinline__ void dequantize_body(const u8* rec, T* out, u64 n, u32 block) {
    const u64 nb = (n + block - 1) / block;
    const u64 nthreads = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += nthreads) {
        out[i] = q_store<T>(q_decode<BITS>(rec, nb, i, block));
    }
}

template <int BITS>
__device__ __forceinline__ void dequantize_add_body(const u8* rec, float* acc, u64 n, u32 block) {
    const u64 nb = (n + block - 1) / block;
    const u64 nthreads = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += nthreads) {
        acc[i] = __fadd_rn(acc[i], q_decode<BITS>(rec, nb, i, block));
    }
}

template <typename T, int BITS>
__device__ __forceinline__ void dequantize_many_body(const u8* recs, T* out, u64 n, u32 block,
                                                     u64 stride, u32 count) {
    const u64 nb = (n + block - 1) / block;
    const u64 total = n * (u64)count;
    const u64 nthreads = (u64)gridDim.x * blockDim.x;
    // Element e is element i of record d; both step without a division per element.
    const u64 dq = nthreads / n, dr = nthreads - dq * n;
    u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 d = e / n, i = e - d * n;
    for (; e < total; e += nthreads) {
        out[e] = q_store<T>(q_decode<BITS>(recs + d * stride, nb, i, block));
        d += dq;
        i += dr;
        if (i >= n) {
            i -= n;
            d++;
        }
    }
}

template <int BITS>
__device__ __forceinline__ void dequantize_sum_body(const u8* recs, float* acc, u64 n, u32 block,
                                                    u64 stride, u32 count, u32 add_first) {
    const u64 nb = (n + block - 1) / block;
    const u64 nthreads = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += nthreads) {
        const float first = q_decode<BITS>(recs, nb, i, block);
        float a = add_first ? __fadd_rn(acc[i], first) : first;
        for (u32 d = 1; d < count; d++) {
            a = __fadd_rn(a, q_decode<BITS>(recs + (u64)d * stride, nb, i, block));
        }
        acc[i] = a;
    }
}

template <typename T> __device__ __forceinline__ void from_f32_body(const float* src, T* dst, u64 n, float mul) {
    const u64 nthreads = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += nthreads) {
        dst[i] = q_store<T>(__fmul_rn(src[i], mul));
    }
}

#define PCCL_QUANT(T, NAME, BITS)                                                                     \
    extern "C" __global__ void pccl_quantize_##NAME##_##BITS(const T* x, u8* rec, u64 n, u32 block,  \
                                                             u64 rec_bytes) {                         \
        quantize_body<T, BITS>(x, rec, n, block, rec_bytes);                                          \
    }                                                                                                 \
    extern "C" __global__ void pccl_dequantize_##NAME##_##BITS(const u8* rec, T* out, u64 n, u32 block) { \
        dequantize_body<T, BITS>(rec, out, n, block);                                                 \
    }                                                                                                 \
    extern "C" __global__ void pccl_dequantize_many_##NAME##_##BITS(const u8* recs, T* out, u64 n,   \
                                                                    u32 block, u64 stride, u32 count) { \
        dequantize_many_body<T, BITS>(recs, out, n, block, stride, count);                            \
    }

#define PCCL_QUANT_BOTH(T, NAME) \
    PCCL_QUANT(T, NAME, 8)       \
    PCCL_QUANT(T, NAME, 4)       \
    extern "C" __global__ void pccl_from_f32_##NAME(const float* src, T* dst, u64 n, float mul) { \
        from_f32_body<T>(src, dst, n, mul);                                                       \
    }

PCCL_QUANT_BOTH(float, f32)
PCCL_QUANT_BOTH(double, f64)
PCCL_QUANT_BOTH(f16, f16)
PCCL_QUANT_BOTH(bf16, bf16)

extern "C" __global__ void pccl_dequantize_add_8(const u8* rec, float* acc, u64 n, u32 block) {
    dequantize_add_body<8>(rec, acc, n, block);
}
extern "C" __global__ void pccl_dequantize_add_4(const u8* rec, float* acc, u64 n, u32 block) {
    dequantize_add_body<4>(rec, acc, n, block);
}
extern "C" __global__ void pccl_dequantize_sum_8(const u8* recs, float* acc, u64 n, u32 block,
                                                 u64 stride, u32 count, u32 add_first) {
    dequantize_sum_body<8>(recs, acc, n, block, stride, count, add_first);
}
extern "C" __global__ void pccl_dequantize_sum_4(const u8* recs, float* acc, u64 n, u32 block,
                                                 u64 stride, u32 count, u32 add_first) {
    dequantize_sum_body<4>(recs, acc, n, block, stride, count, add_first);
}
