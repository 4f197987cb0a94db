// Runs PCCL's device kernel sources (csrc/reduce.cu + csrc/quant.cu, compiled as one module as
// on the GPU, through their HIP branch: clang builtins instead of PTX) on the CPU, one thread
// block at a time with its threads as std::threads meeting at __syncthreads: the kernels'
// indexing, tails, shared-memory reductions and grid strides are exercised without a GPU
// (tests/cuda_emu.rs compares them with the host kernels bit for bit). Not a performance model.

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <mutex>
#include <thread>
#include <vector>

#define __HIP__ 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
};
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static pthread_barrier_t block_barrier;
static void __syncthreads() { pthread_barrier_wait(&block_barrier); }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fmul_rn(float a, float b) { return a * b; }
static float __fdiv_rn(float a, float b) { return a / b; }
static double __dadd_rn(double a, double b) { return a + b; }
static double __dmul_rn(double a, double b) { return a * b; }
static double __ddiv_rn(double a, double b) { return a / b; }

#define PCCL_UNROLL 4
#include "../../csrc/reduce.cu"
#include "../../csrc/quant.cu"

// Launches share the grid, the barrier and the __shared__ arrays: one at a time.
static std::mutex launch_lock;

// Runs `kernel` on `grid` blocks of `threads` threads, block after block.
template <class F> static void launch(unsigned grid, unsigned threads, F kernel) {
    std::lock_guard<std::mutex> one_at_a_time(launch_lock);
    gridDim = {grid, 1, 1};
    blockDim = {threads, 1, 1};
    for (unsigned b = 0; b < grid; b++) {
        pthread_barrier_init(&block_barrier, nullptr, threads);
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; t++) {
            ts.emplace_back([=] {
                threadIdx = {t, 0, 0};
                blockIdx = {b, 0, 0};
                kernel();
            });
        }
        for (auto& th : ts) th.join();
        pthread_barrier_destroy(&block_barrier);
    }
}

#define DISPATCH(DT, BODY)                                                \
    if (!strcmp(dt, "f32")) { typedef float T; BODY; return 0; }         \
    if (!strcmp(dt, "f64")) { typedef double T; BODY; return 0; }        \
    if (!strcmp(dt, "f16")) { typedef f16 T; BODY; return 0; }           \
    if (!strcmp(dt, "bf16")) { typedef bf16 T; BODY; return 0; }         \
    return 1;

template <typename T, int BITS> static void quantize_kernel(const T* x, u8* rec, u64 n, u32 block, u64 rb) {
    quantize_body<T, BITS>(x, rec, n, block, rb);
}

extern "C" int emu_quantize(const char* dt, int bits, const void* x, void* rec, uint64_t n, uint32_t block,
                            uint64_t rec_bytes, unsigned grid, unsigned threads) {
    DISPATCH(dt, launch(grid, threads, [=] {
        if (bits == 8) quantize_kernel<T, 8>((const T*)x, (u8*)rec, n, block, rec_bytes);
        else quantize_kernel<T, 4>((const T*)x, (u8*)rec, n, block, rec_bytes);
    }))
}

extern "C" int emu_dequantize(const char* dt, int bits, const void* rec, void* out, uint64_t n, uint32_t block,
                              unsigned grid, unsigned threads) {
    if (!strcmp(dt, "add")) {
        launch(grid, threads, [=] {
            if (bits == 8) pccl_dequantize_add_8((const u8*)rec, (float*)out, n, block);
            else pccl_dequantize_add_4((const u8*)rec, (float*)out, n, block);
        });
        return 0;
    }
    DISPATCH(dt, launch(grid, threads, [=] {
        if (bits == 8) dequantize_body<T, 8>((const u8*)rec, (T*)out, n, block);
        else dequantize_body<T, 4>((const u8*)rec, (T*)out, n, block);
    }))
}

// The batched decodes: `count` records `stride` bytes apart, into `count` blocks of `out`.
extern "C" int emu_dequantize_many(const char* dt, int bits, const void* recs, void* out, uint64_t n,
                                   uint32_t block, uint64_t stride, uint32_t count, unsigned grid,
                                   unsigned threads) {
    DISPATCH(dt, launch(grid, threads, [=] {
        if (bits == 8) dequantize_many_body<T, 8>((const u8*)recs, (T*)out, n, block, stride, count);
        else dequantize_many_body<T, 4>((const u8*)recs, (T*)out, n, block, stride, count);
    }))
}

// ... or summed in record order into f32 sums (the first stored unless add_first).
extern "C" int emu_dequantize_sum(int bits, const void* recs, float* acc, uint64_t n, uint32_t block,
                                  uint64_t stride, uint32_t count, uint32_t add_first, unsigned grid,
                                  unsigned threads) {
    launch(grid, threads, [=] {
        if (bits == 8) pccl_dequantize_sum_8((const u8*)recs, acc, n, block, stride, count, add_first);
        else pccl_dequantize_sum_4((const u8*)recs, acc, n, block, stride, count, add_first);
    });
    return 0;
}

extern "C" int emu_from_f32(const char* dt, const float* src, void* dst, uint64_t n, float mul, unsigned grid,
                            unsigned threads) {
    DISPATCH(dt, launch(grid, threads, [=] { from_f32_body<T>(src, (T*)dst, n, mul); }))
}
