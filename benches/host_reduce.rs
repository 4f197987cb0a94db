//! Host reduction kernels against memcpy on 64 MiB arrays. Throughput counts every byte
//! moved: a copy reads n and writes n (2n); `dst += src` reads 2n and writes n (3n);
//! `dst = a + b` the same. The target: reductions move bytes at >= 70% of memcpy's rate.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use half::{bf16, f16};
use pccl::{Element, ReduceOp};

const BYTES: usize = 64 << 20;

fn kernels(c: &mut Criterion) {
    let n = BYTES / 4;
    let src: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let a: Vec<f32> = (0..n).map(|i| (i % 5) as f32).collect();
    let mut dst: Vec<f32> = vec![1.0; n];
    let mut g = c.benchmark_group("host_64MiB");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(2 * BYTES as u64));
    g.bench_function("memcpy_f32", |b| {
        b.iter(|| dst.copy_from_slice(black_box(&src)))
    });
    g.throughput(Throughput::Bytes(3 * BYTES as u64));
    g.bench_function("sum_into_f32", |b| {
        b.iter(|| f32::reduce_into(ReduceOp::Sum, &mut dst, black_box(&src)))
    });
    g.bench_function("sum3_f32", |b| {
        b.iter(|| f32::reduce3(ReduceOp::Sum, &mut dst, black_box(&a), black_box(&src)))
    });
    g.bench_function("max_into_f32", |b| {
        b.iter(|| f32::reduce_into(ReduceOp::Max, &mut dst, black_box(&src)))
    });
    let hn = BYTES / 2;
    let hs: Vec<bf16> = (0..hn).map(|i| bf16::from_f32((i % 7) as f32)).collect();
    let mut hd: Vec<bf16> = vec![bf16::ONE; hn];
    g.bench_function("sum_into_bf16", |b| {
        b.iter(|| bf16::reduce_into(ReduceOp::Sum, &mut hd, black_box(&hs)))
    });
    let fs: Vec<f16> = (0..hn).map(|i| f16::from_f32((i % 7) as f32)).collect();
    let mut fd: Vec<f16> = vec![f16::ONE; hn];
    g.bench_function("sum_into_f16", |b| {
        b.iter(|| f16::reduce_into(ReduceOp::Sum, &mut fd, black_box(&fs)))
    });
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
