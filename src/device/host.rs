//! Host reduction kernels, written so that the compiler vectorises them.
//!
//! Integers wrap on overflow (as NCCL and MPI do). Half-precision types are widened to
//! `f32` in small stack tiles, combined, and rounded back once per operation.

use crate::dtype::{DType, Element, ReduceOp};
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

/// A half-precision type, widened to f32 for arithmetic and rounded back once.
trait Half: Copy {
    fn widen(self) -> f32;
    fn narrow(v: f32) -> Self;
}

/// All ones where `c`, else zero: a select the vectoriser always accepts.
#[inline(always)]
fn mask(c: bool) -> u32 {
    (c as u32).wrapping_neg()
}

#[inline(always)]
fn select(m: u32, a: u32, b: u32) -> u32 {
    (a & m) | (b & !m)
}

/// f16 -> f32 without branches (exact for every input), so the compiler vectorises it: the
/// exponent is rebiased by an add, subnormals renormalised by a float subtraction.
#[inline(always)]
fn f16_widen(h: f16) -> f32 {
    let h = u32::from(h.to_bits());
    let shifted = (h & 0x7fff) << 13;
    let exp = shifted & (0x7c00 << 13);
    let normal = shifted + ((127 - 15) << 23);
    let infnan = normal + ((128 - 16) << 23);
    let sub = (f32::from_bits(normal + (1 << 23)) - f32::from_bits(113 << 23)).to_bits();
    let bits = select(
        mask(exp == 0x7c00 << 13),
        infnan,
        select(mask(exp == 0), sub, normal),
    );
    f32::from_bits(bits | ((h & 0x8000) << 16))
}

/// f32 -> f16, round to nearest even, without branches; NaNs become quiet NaNs.
#[inline(always)]
fn f16_narrow(v: f32) -> f16 {
    const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
    let x = v.to_bits();
    let sign = x & 0x8000_0000;
    let a = x ^ sign;
    let big = select(mask(a > 255 << 23), 0x7e00, 0x7c00);
    let sub = (f32::from_bits(a) + f32::from_bits(DENORM_MAGIC))
        .to_bits()
        .wrapping_sub(DENORM_MAGIC);
    let normal = a.wrapping_add(0xC800_0FFF + ((a >> 13) & 1)) >> 13;
    let o = select(
        mask(a >= (127 + 16) << 23),
        big,
        select(mask(a < 113 << 23), sub, normal),
    );
    f16::from_bits((o | (sign >> 16)) as u16)
}

/// bf16 -> f32: a bf16 is the top half of an f32.
#[inline(always)]
fn bf16_widen(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// f32 -> bf16, round to nearest even; NaNs stay (quiet) NaNs. Branch-free.
#[inline(always)]
fn bf16_narrow(v: f32) -> bf16 {
    let b = v.to_bits();
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet = ((b >> 16) as u16) | 0x0040;
    bf16::from_bits(if nan { quiet } else { rounded })
}

impl Half for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f16_widen(self)
    }
    #[inline(always)]
    fn narrow(v: f32) -> Self {
        f16_narrow(v)
    }
}

impl Half for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        bf16_widen(self)
    }
    #[inline(always)]
    fn narrow(v: f32) -> Self {
        bf16_narrow(v)
    }
}

/// Fused half-precision kernels: widen, combine in f32 and round once, in one pass that the
/// compiler vectorises (the conversions are branch-free).
fn fused3<T: Half>(op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
    let it = dst.iter_mut().zip(a.iter().zip(b));
    match op {
        ReduceOp::Sum | ReduceOp::Avg => {
            it.for_each(|(d, (x, y))| *d = T::narrow(x.widen() + y.widen()))
        }
        ReduceOp::Prod => it.for_each(|(d, (x, y))| *d = T::narrow(x.widen() * y.widen())),
        ReduceOp::Min => it.for_each(|(d, (x, y))| *d = T::narrow(x.widen().min(y.widen()))),
        ReduceOp::Max => it.for_each(|(d, (x, y))| *d = T::narrow(x.widen().max(y.widen()))),
    }
}

fn fused_into<T: Half>(op: ReduceOp, dst: &mut [T], b: &[T]) {
    let it = dst.iter_mut().zip(b);
    match op {
        ReduceOp::Sum | ReduceOp::Avg => {
            it.for_each(|(d, y)| *d = T::narrow(d.widen() + y.widen()))
        }
        ReduceOp::Prod => it.for_each(|(d, y)| *d = T::narrow(d.widen() * y.widen())),
        ReduceOp::Min => it.for_each(|(d, y)| *d = T::narrow(d.widen().min(y.widen()))),
        ReduceOp::Max => it.for_each(|(d, y)| *d = T::narrow(d.widen().max(y.widen()))),
    }
}

macro_rules! half_element {
    ($t:ty, $dt:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                let n = dst.len().min(src.len());
                fused_into(op, &mut dst[..n], &src[..n])
            }
            fn reduce3(op: ReduceOp, dst: &mut [Self], x: &[Self], y: &[Self]) {
                let n = dst.len().min(x.len()).min(y.len());
                fused3(op, &mut dst[..n], &x[..n], &y[..n])
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
        let n = 2051;
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
        let out: Vec<bf16> = vals.iter().map(|v| bf16_narrow(*v)).collect();
        for (v, o) in vals.iter().zip(out) {
            assert_eq!(o.to_bits(), bf16::from_f32(*v).to_bits(), "{v}");
        }
        assert!(bf16_narrow(f32::NAN).is_nan());
    }

    #[test]
    fn f16_widening_is_exact_for_every_value() {
        for b in 0..=u16::MAX {
            let h = f16::from_bits(b);
            let (ours, theirs) = (f16_widen(h), h.to_f32());
            if h.is_nan() {
                assert!(ours.is_nan(), "{b:#x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{b:#x}");
            }
        }
    }

    #[test]
    fn f16_narrowing_rounds_like_the_half_crate() {
        // Every f16 value, every midpoint between neighbours, and a sweep of f32 bit patterns.
        let mut vals: Vec<f32> = (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect();
        for b in 0..u16::MAX {
            let (x, y) = (f16::from_bits(b).to_f64(), f16::from_bits(b + 1).to_f64());
            vals.push(((x + y) / 2.0) as f32);
        }
        vals.extend((0..u32::MAX).step_by(4099).map(f32::from_bits));
        vals.extend([
            65504.0,
            65519.0,
            65520.0,
            1e9,
            -1e-9,
            5.960_464_5e-8,
            2.980_232_2e-8,
            f32::MAX,
            f32::MIN_POSITIVE,
        ]);
        for v in vals {
            let (ours, theirs) = (f16_narrow(v), f16::from_f32(v));
            if v.is_nan() {
                assert!(ours.is_nan(), "{v}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{v} ({:#x})", v.to_bits());
            }
        }
    }

    #[test]
    fn float_divide_averages() {
        let mut d = [4.0f32, 8.0];
        <f32 as Element>::divide(&mut d, 4);
        assert_eq!(d, [1.0, 2.0]);
    }
}
