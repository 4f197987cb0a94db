// PCCL block transpose, compiled at run time by NVRTC (see src/device/cuda.rs).
//
// The hierarchical collectives keep an M x N grid of blocks of s bytes. This moves the grid
// stored row-major as [m][n] (block (i, j) at byte (i*N + j)*s) into [n][m] (block (i, j) at
// byte (j*M + i)*s). The inverse is the same call with M and N swapped.
//
// A block is k units of U bytes, U the widest of 16/8/4/2/1 bytes that divides s and both
// base addresses (the host picks it). Two kernels, for each unit width:
//
//   pccl_transpose_copy_<U>(src, dst, M, N, k)
//       large blocks (s >= 256 bytes): every contiguous run of a block is read and written
//       whole, in destination order; a CUDA block handles blockDim.x * PCCL_UNROLL units of
//       consecutive destination blocks (a piece of one large block, or several small ones).
//   pccl_transpose_tile_<U>(src, dst, M, N, k, TM, TN)
//       small blocks, whose runs would leave 32-byte sectors part-used: a TM x TN tile of
//       blocks goes through shared memory, so that global reads run along source rows of
//       TN*s bytes and writes along destination rows of TM*s bytes (one contiguous range when
//       TM = M). Dynamic shared memory: TM * (TN*k + 1) * sizeof(U) bytes (one unit of padding
//       per row against bank conflicts).

#ifndef PCCL_UNROLL
#define PCCL_UNROLL 4
#endif

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

struct alignas(16) Vec16 {
    u32 w[4];
};

template <typename U>
__device__ __forceinline__ void copy_body(const U* __restrict__ src, U* __restrict__ dst, u64 M, u64 N, u64 k) {
    const u64 nblocks = M * N;
    const u64 chunk = (u64)blockDim.x * PCCL_UNROLL;
    if (k >= chunk) {
        // Each work item is one piece of chunk units of one destination block.
        const u64 pieces = (k + chunk - 1) / chunk;
        const u64 total = nblocks * pieces;
        for (u64 w = blockIdx.x; w < total; w += gridDim.x) {
            const u64 blk = w / pieces;
            const u64 piece = w - blk * pieces;
            const u64 j = blk / M;
            const u64 i = blk - j * M;
            const U* s = src + (i * N + j) * k;
            U* d = dst + blk * k;
            const u64 off = piece * chunk + threadIdx.x;
            U r[PCCL_UNROLL];
#pragma unroll
            for (int u = 0; u < PCCL_UNROLL; u++) {
                const u64 x = off + (u64)u * blockDim.x;
                if (x < k) {
                    r[u] = s[x];
                }
            }
#pragma unroll
            for (int u = 0; u < PCCL_UNROLL; u++) {
                const u64 x = off + (u64)u * blockDim.x;
                if (x < k) {
                    d[x] = r[u];
                }
            }
        }
    } else {
        // Each work item is G whole consecutive destination blocks (k < chunk, so k fits u32,
        // and the host guarantees M < 2^31).
        const u32 kk = (u32)k;
        const u32 mm = (u32)M;
        const u32 G = (u32)(chunk / k);
        const u64 total = (nblocks + G - 1) / G;
        for (u64 w = blockIdx.x; w < total; w += gridDim.x) {
            const u64 b0 = w * G;
            const u64 j0 = b0 / M;
            const u32 i0 = (u32)(b0 - j0 * M);
            U r[PCCL_UNROLL];
            u64 so[PCCL_UNROLL];
            u64 dof[PCCL_UNROLL];
            bool ok[PCCL_UNROLL];
#pragma unroll
            for (int u = 0; u < PCCL_UNROLL; u++) {
                const u32 x = (u32)u * blockDim.x + threadIdx.x;
                const u32 bl = x / kk;
                const u32 q = x - bl * kk;
                const u64 blk = b0 + bl;
                ok[u] = bl < G && blk < nblocks;
                const u32 t = i0 + bl;
                const u32 dj = t / mm;
                const u64 i = t - dj * mm;
                const u64 j = j0 + dj;
                so[u] = (i * N + j) * k + q;
                dof[u] = blk * k + q;
                if (ok[u]) {
                    r[u] = src[so[u]];
                }
            }
#pragma unroll
            for (int u = 0; u < PCCL_UNROLL; u++) {
                if (ok[u]) {
                    dst[dof[u]] = r[u];
                }
            }
        }
    }
}

template <typename U>
__device__ __forceinline__ void tile_body(const U* __restrict__ src, U* __restrict__ dst, u64 M, u64 N, u32 k, u32 TM,
                                          u32 TN) {
    extern __shared__ Vec16 smem_raw[];
    U* sh = reinterpret_cast<U*>(smem_raw);
    const u32 stride = TN * k + 1;
    const u64 tiles_m = (M + TM - 1) / TM;
    const u64 tiles_n = (N + TN - 1) / TN;
    const u64 ntiles = tiles_m * tiles_n;
    for (u64 t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const u64 ti = t / tiles_n;
        const u64 tj = t - ti * tiles_n;
        const u64 i0 = ti * TM;
        const u64 j0 = tj * TN;
        const u32 rows = (u32)((M - i0) < TM ? (M - i0) : TM);
        const u32 cols = (u32)((N - j0) < TN ? (N - j0) : TN);
        // Read rows i0..i0+rows of the source: each is cols*k contiguous units.
        const u32 rw = cols * k;
        for (u32 x = threadIdx.x; x < rows * rw; x += blockDim.x) {
            const u32 r = x / rw;
            const u32 c = x - r * rw;
            sh[r * stride + c] = src[((i0 + r) * N + j0) * k + c];
        }
        __syncthreads();
        // Write rows j0..j0+cols of the destination: each is rows*k contiguous units.
        const u32 wr = rows * k;
        for (u32 x = threadIdx.x; x < cols * wr; x += blockDim.x) {
            const u32 jr = x / wr;
            const u32 c = x - jr * wr;
            const u32 i = c / k;
            const u32 q = c - i * k;
            dst[((j0 + jr) * M + i0) * k + c] = sh[i * stride + jr * k + q];
        }
        __syncthreads();
    }
}

#define PCCL_TRANSPOSE(U, NAME)                                                                         \
    extern "C" __global__ void pccl_transpose_copy_##NAME(const U* __restrict__ src, U* __restrict__ dst, \
                                                           u64 M, u64 N, u64 k) {                       \
        copy_body<U>(src, dst, M, N, k);                                                                \
    }                                                                                                   \
    extern "C" __global__ void pccl_transpose_tile_##NAME(const U* __restrict__ src, U* __restrict__ dst, \
                                                           u64 M, u64 N, u32 k, u32 TM, u32 TN) {       \
        tile_body<U>(src, dst, M, N, k, TM, TN);                                                        \
    }

PCCL_TRANSPOSE(u8, 1)
PCCL_TRANSPOSE(u16, 2)
PCCL_TRANSPOSE(u32, 4)
PCCL_TRANSPOSE(u64, 8)
PCCL_TRANSPOSE(Vec16, 16)
