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

/// Widens / narrows tiles of a half-precision type.
trait Tile: Sized {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
}

impl Tile for f16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        // half picks F16C instructions at run time where the CPU has them.
        src.convert_to_f32_slice(dst)
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src)
    }
}

impl Tile for bf16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        // A bf16 is the top half of an f32: a shift, which the compiler vectorises.
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = bf16_widen(*s));
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        // Round to nearest even, NaNs stay (quiet) NaNs; branch-free so it vectorises.
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = bf16_narrow(*s));
    }
}

#[inline(always)]
fn bf16_widen(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

#[inline(always)]
fn bf16_narrow(v: f32) -> bf16 {
    let b = v.to_bits();
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet = ((b >> 16) as u16) | 0x0040;
    bf16::from_bits(if nan { quiet } else { rounded })
}

/// Fused bf16 kernels: widen, combine and round in one pass, which the compiler vectorises.
fn bf16_apply(op: ReduceOp, dst: &mut [bf16], a: &[bf16], b: &[bf16]) {
    let it = dst.iter_mut().zip(a.iter().zip(b));
    match op {
        ReduceOp::Sum | ReduceOp::Avg => {
            it.for_each(|(d, (x, y))| *d = bf16_narrow(bf16_widen(*x) + bf16_widen(*y)))
        }
        ReduceOp::Prod => {
            it.for_each(|(d, (x, y))| *d = bf16_narrow(bf16_widen(*x) * bf16_widen(*y)))
        }
        ReduceOp::Min => {
            it.for_each(|(d, (x, y))| *d = bf16_narrow(bf16_widen(*x).min(bf16_widen(*y))))
        }
        ReduceOp::Max => {
            it.for_each(|(d, (x, y))| *d = bf16_narrow(bf16_widen(*x).max(bf16_widen(*y))))
        }
    }
}

fn bf16_apply_into(op: ReduceOp, dst: &mut [bf16], b: &[bf16]) {
    let it = dst.iter_mut().zip(b);
    match op {
        ReduceOp::Sum | ReduceOp::Avg => {
            it.for_each(|(d, y)| *d = bf16_narrow(bf16_widen(*d) + bf16_widen(*y)))
        }
        ReduceOp::Prod => it.for_each(|(d, y)| *d = bf16_narrow(bf16_widen(*d) * bf16_widen(*y))),
        ReduceOp::Min => it.for_each(|(d, y)| *d = bf16_narrow(bf16_widen(*d).min(bf16_widen(*y)))),
        ReduceOp::Max => it.for_each(|(d, y)| *d = bf16_narrow(bf16_widen(*d).max(bf16_widen(*y)))),
    }
}

fn tiled_into<T: Tile + Copy>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    let n = dst.len().min(src.len());
    let mut a = [0f32; TILE];
    let mut b = [0f32; TILE];
    for (d, s) in dst[..n].chunks_mut(TILE).zip(src[..n].chunks(TILE)) {
        let k = d.len();
        T::widen(d, &mut a[..k]);
        T::widen(s, &mut b[..k]);
        combine_f32(op, &mut a[..k], &b[..k]);
        T::narrow(&a[..k], d);
    }
}

fn tiled3<T: Tile + Copy>(op: ReduceOp, dst: &mut [T], x: &[T], y: &[T]) {
    let n = dst.len().min(x.len()).min(y.len());
    let mut a = [0f32; TILE];
    let mut b = [0f32; TILE];
    for ((d, xs), ys) in dst[..n]
        .chunks_mut(TILE)
        .zip(x[..n].chunks(TILE))
        .zip(y[..n].chunks(TILE))
    {
        let k = d.len();
        T::widen(xs, &mut a[..k]);
        T::widen(ys, &mut b[..k]);
        combine_f32(op, &mut a[..k], &b[..k]);
        T::narrow(&a[..k], d);
    }
}

macro_rules! half_element {
    ($t:ty, $dt:expr, $into:path, $three:path) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                let n = dst.len().min(src.len());
                $into(op, &mut dst[..n], &src[..n])
            }
            fn reduce3(op: ReduceOp, dst: &mut [Self], x: &[Self], y: &[Self]) {
                let n = dst.len().min(x.len()).min(y.len());
                $three(op, &mut dst[..n], &x[..n], &y[..n])
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

// f16 goes through f32 tiles (F16C conversions); bf16 widens with a shift, fused in one pass.
half_element!(f16, DType::F16, tiled_into, tiled3);
half_element!(bf16, DType::BF16, bf16_apply_into, bf16_apply);

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
    fn bf16_narrowing_matches_half_crate_rounding() {
        let vals = [
            0.0f32,
            -0.0,
            1.0,
            1.0 + 1.0 / 256.0,
            1.0078125,
            2.75,
            -2.5e-38,
            1e38,
            3.4e38,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.0 + 1.0 / 256.0 + 1.0 / 512.0,
        ];
        let mut out = [bf16::ZERO; 12];
        <bf16 as Tile>::narrow(&vals, &mut out);
        for (v, o) in vals.iter().zip(out) {
            assert_eq!(o.to_bits(), bf16::from_f32(*v).to_bits(), "{v}");
        }
        let mut nan = [bf16::ZERO];
        <bf16 as Tile>::narrow(&[f32::NAN], &mut nan);
        assert!(nan[0].is_nan());
    }

    #[test]
    fn float_divide_averages() {
        let mut d = [4.0f32, 8.0];
        <f32 as Element>::divide(&mut d, 4);
        assert_eq!(d, [1.0, 2.0]);
    }
}
