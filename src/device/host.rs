//! Host reduction kernels, written so that the compiler vectorises them.
//!
//! Integers wrap on overflow (as NCCL and MPI do). Half-precision types are widened to
//! `f32` in small stack tiles, combined, and rounded back once per operation.

use crate::dtype::{DType, Element, ReduceOp};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

macro_rules! int_element {
    ($t:ty, $dt:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                let n = dst.len().min(src.len());
                let (dst, src) = (&mut dst[..n], &src[..n]);
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => dst
                        .iter_mut()
                        .zip(src)
                        .for_each(|(d, s)| *d = d.wrapping_add(*s)),
                    ReduceOp::Prod => dst
                        .iter_mut()
                        .zip(src)
                        .for_each(|(d, s)| *d = d.wrapping_mul(*s)),
                    ReduceOp::Min => dst.iter_mut().zip(src).for_each(|(d, s)| *d = (*d).min(*s)),
                    ReduceOp::Max => dst.iter_mut().zip(src).for_each(|(d, s)| *d = (*d).max(*s)),
                }
            }
            fn reduce3(op: ReduceOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
                let n = dst.len().min(a.len()).min(b.len());
                let (dst, a, b) = (&mut dst[..n], &a[..n], &b[..n]);
                let it = dst.iter_mut().zip(a.iter().zip(b));
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => {
                        it.for_each(|(d, (x, y))| *d = x.wrapping_add(*y))
                    }
                    ReduceOp::Prod => it.for_each(|(d, (x, y))| *d = x.wrapping_mul(*y)),
                    ReduceOp::Min => it.for_each(|(d, (x, y))| *d = (*x).min(*y)),
                    ReduceOp::Max => it.for_each(|(d, (x, y))| *d = (*x).max(*y)),
                }
            }
            fn divide(_dst: &mut [Self], _n: usize) {}
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}

int_element!(i8, DType::I8);
int_element!(u8, DType::U8);
int_element!(i32, DType::I32);
int_element!(u32, DType::U32);
int_element!(i64, DType::I64);
int_element!(u64, DType::U64);

macro_rules! float_element {
    ($t:ty, $dt:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                let n = dst.len().min(src.len());
                let (dst, src) = (&mut dst[..n], &src[..n]);
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => {
                        dst.iter_mut().zip(src).for_each(|(d, s)| *d += *s)
                    }
                    ReduceOp::Prod => dst.iter_mut().zip(src).for_each(|(d, s)| *d *= *s),
                    ReduceOp::Min => dst.iter_mut().zip(src).for_each(|(d, s)| *d = d.min(*s)),
                    ReduceOp::Max => dst.iter_mut().zip(src).for_each(|(d, s)| *d = d.max(*s)),
                }
            }
            fn reduce3(op: ReduceOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
                let n = dst.len().min(a.len()).min(b.len());
                let (dst, a, b) = (&mut dst[..n], &a[..n], &b[..n]);
                let it = dst.iter_mut().zip(a.iter().zip(b));
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => it.for_each(|(d, (x, y))| *d = *x + *y),
                    ReduceOp::Prod => it.for_each(|(d, (x, y))| *d = *x * *y),
                    ReduceOp::Min => it.for_each(|(d, (x, y))| *d = x.min(*y)),
                    ReduceOp::Max => it.for_each(|(d, (x, y))| *d = x.max(*y)),
                }
            }
            fn divide(dst: &mut [Self], n: usize) {
                let n = n as $t;
                dst.iter_mut().for_each(|d| *d /= n);
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}

float_element!(f32, DType::F32);
float_element!(f64, DType::F64);

/// Elements per stack tile for the half-precision kernels (3 tiles of f32 = 12 KiB).
const TILE: usize = 1024;

fn combine_f32(op: ReduceOp, d: &mut [f32], s: &[f32]) {
    <f32 as Element>::reduce_into(op, d, s)
}

macro_rules! half_element {
    ($t:ty, $dt:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                let n = dst.len().min(src.len());
                let mut a = [0f32; TILE];
                let mut b = [0f32; TILE];
                for (d, s) in dst[..n].chunks_mut(TILE).zip(src[..n].chunks(TILE)) {
                    let k = d.len();
                    d.convert_to_f32_slice(&mut a[..k]);
                    s.convert_to_f32_slice(&mut b[..k]);
                    combine_f32(op, &mut a[..k], &b[..k]);
                    d.convert_from_f32_slice(&a[..k]);
                }
            }
            fn reduce3(op: ReduceOp, dst: &mut [Self], x: &[Self], y: &[Self]) {
                let n = dst.len().min(x.len()).min(y.len());
                let mut a = [0f32; TILE];
                let mut b = [0f32; TILE];
                for ((d, xs), ys) in dst[..n]
                    .chunks_mut(TILE)
                    .zip(x[..n].chunks(TILE))
                    .zip(y[..n].chunks(TILE))
                {
                    let k = d.len();
                    xs.convert_to_f32_slice(&mut a[..k]);
                    ys.convert_to_f32_slice(&mut b[..k]);
                    combine_f32(op, &mut a[..k], &b[..k]);
                    d.convert_from_f32_slice(&a[..k]);
                }
            }
            fn divide(dst: &mut [Self], n: usize) {
                let n = n as f32;
                dst.iter_mut()
                    .for_each(|d| *d = <$t>::from_f32(d.to_f32() / n));
            }
            fn from_i64(v: i64) -> Self {
                <$t>::from_f32(v as f32)
            }
        }
    };
}

half_element!(f16, DType::F16);
half_element!(bf16, DType::BF16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_sum_wraps_instead_of_panicking() {
        let mut d = [i8::MAX, 1];
        <i8 as Element>::reduce_into(ReduceOp::Sum, &mut d, &[1, 1]);
        assert_eq!(d, [i8::MIN, 2]);
    }

    #[test]
    fn half_kernels_match_f32_arithmetic_across_tiles() {
        let n = TILE * 2 + 3;
        let a: Vec<bf16> = (0..n).map(|i| bf16::from_f32((i % 50) as f32)).collect();
        let b: Vec<bf16> = (0..n).map(|i| bf16::from_f32((i % 7) as f32)).collect();
        let mut d = vec![bf16::ZERO; n];
        <bf16 as Element>::reduce3(ReduceOp::Sum, &mut d, &a, &b);
        for (i, x) in d.iter().enumerate() {
            assert_eq!(x.to_f32(), ((i % 50) + (i % 7)) as f32);
        }
        let mut m: Vec<f16> = a.iter().map(|x| f16::from_f32(x.to_f32())).collect();
        let bh: Vec<f16> = b.iter().map(|x| f16::from_f32(x.to_f32())).collect();
        <f16 as Element>::reduce_into(ReduceOp::Max, &mut m, &bh);
        for (i, x) in m.iter().enumerate() {
            assert_eq!(x.to_f32(), ((i % 50).max(i % 7)) as f32);
        }
    }

    #[test]
    fn float_divide_averages() {
        let mut d = [4.0f32, 8.0];
        <f32 as Element>::divide(&mut d, 4);
        assert_eq!(d, [1.0, 2.0]);
    }
}
