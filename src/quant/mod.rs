//! Block quantization for the quantized collectives (ZeRO++'s qwZ): symmetric INT8 or INT4,
//! one `f32` scale per block of `B` elements.
//!
//! A block's scale is `max |x| / q_max` (`q_max` 127 for INT8, 7 for INT4) and each element
//! travels as `round(x / scale)`, so every element comes back within `scale / 2` of its input
//! (rounding to nearest), zeros exactly, and a block of zeros has scale 0. A rank's shard of
//! `n` elements is one *record*: the `⌈n / B⌉` scales (little-endian `f32`), then the codes
//! (INT8: one byte each; INT4: two per byte, low nibble first, two's complement), padded to a
//! multiple of 8 bytes so records of every rank line up as whole `u64` words.
//!
//! The host kernels here are plain loops over blocks that the compiler vectorises (the
//! block's maximum, then the scaled rounding); the device kernels are not built yet.

use crate::error::{Error, Result};
use half::{bf16, f16};

/// The element types a quantized collective takes and gives back.
pub trait QuantFloat: crate::dtype::Element + Copy {
    /// As `f32` (exact for `f16`, `bf16`; rounded for `f64`).
    fn to_f32(self) -> f32;
    /// From `f32`, rounding to nearest.
    fn from_f32(v: f32) -> Self;
    /// `dst[i] = src[i] as f32` (the `half` types' vectorised conversions).
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
    /// `dst[i] = src[i]` rounded to this type.
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(*s);
        }
    }
}

impl QuantFloat for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
}

impl QuantFloat for f64 {
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn from_f32(v: f32) -> Self {
        f64::from(v)
    }
}

impl QuantFloat for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
}

impl QuantFloat for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) {
        // Exact: a bf16 is the top half of an f32.
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits(u32::from(s.to_bits()) << 16);
        }
    }
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
}

/// 1.5 · 2²³: `x + ROUND_MAGIC` for |x| ≤ 2²² rounds `x` to the nearest integer (ties to
/// even, the FPU's mode) and holds it in the low bits of the sum's mantissa.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// How a quantized collective encodes its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quant {
    /// Bits per element: 8 or 4.
    pub bits: u32,
    /// Elements per scale: a power of two, 32 … 8192.
    pub block: usize,
    /// Encode NaN and infinities anyway (their blocks come back as NaN) instead of refusing.
    pub allow_nonfinite: bool,
}

impl Quant {
    /// INT8 with blocks of 2048 (the default of ZeRO++'s weight all-gather).
    pub const INT8: Quant = Quant {
        bits: 8,
        block: 2048,
        allow_nonfinite: false,
    };

    /// Checks the bit width and the block size.
    pub fn validate(&self) -> Result<()> {
        if self.bits != 8 && self.bits != 4 {
            return Err(Error::invalid(format!(
                "quantization bits = {}: expected 8 or 4",
                self.bits
            )));
        }
        if !self.block.is_power_of_two() || !(32..=8192).contains(&self.block) {
            return Err(Error::invalid(format!(
                "quantization block = {}: expected a power of two from 32 to 8192",
                self.block
            )));
        }
        Ok(())
    }

    /// The largest code: 127 (INT8) or 7 (INT4).
    pub fn q_max(&self) -> f32 {
        if self.bits == 8 {
            127.0
        } else {
            7.0
        }
    }

    /// Scales of a shard of `n` elements.
    pub fn blocks(&self, n: usize) -> usize {
        n.div_ceil(self.block)
    }

    /// Bytes of the codes of `n` elements.
    pub fn code_bytes(&self, n: usize) -> usize {
        if self.bits == 8 {
            n
        } else {
            n.div_ceil(2)
        }
    }

    /// Bytes of a record of `n` elements (scales, codes, padding to 8 bytes).
    pub fn record_bytes(&self, n: usize) -> usize {
        (4 * self.blocks(n) + self.code_bytes(n)).div_ceil(8) * 8
    }
}

/// Whether every element is finite.
pub fn all_finite<T: QuantFloat>(x: &[T]) -> bool {
    x.iter().all(|v| v.to_f32().is_finite())
}

/// A record of `len` bytes must be exactly [`Quant::record_bytes`]`(n)`.
fn check_record(q: &Quant, n: usize, len: usize) -> Result<()> {
    if len == q.record_bytes(n) {
        return Ok(());
    }
    Err(Error::internal(format!(
        "a record of {len} bytes for {n} elements (needs {})",
        q.record_bytes(n)
    )))
}

/// Encodes `x` into `rec` (exactly [`Quant::record_bytes`]`(x.len())` bytes).
pub fn quantize<T: QuantFloat>(q: &Quant, x: &[T], rec: &mut [u8]) -> Result<()> {
    let n = x.len();
    check_record(q, n, rec.len())?;
    let nb = q.blocks(n);
    let (scales, codes) = rec.split_at_mut(4 * nb);
    let qmax = q.q_max();
    let mut tmp = vec![0f32; q.block.min(n.max(1))];
    let mut codes8 = vec![0u8; q.block.min(n.max(1))];
    for (b, chunk) in x.chunks(q.block).enumerate() {
        let t = &mut tmp[..chunk.len()];
        T::to_f32_slice(chunk, t);
        let amax = t.iter().fold(0f32, |m, v| m.max(v.abs()));
        let finite = t.iter().fold(true, |ok, v| ok & v.is_finite());
        // NaN and infinities (when allowed) make the scale NaN: the block decodes as NaN.
        let scale = if finite { amax / qmax } else { f32::NAN };
        scales[4 * b..4 * b + 4].copy_from_slice(&scale.to_le_bytes());
        let c8 = &mut codes8[..t.len()];
        if scale > 0.0 {
            let inv = 1.0 / scale;
            // Adding 1.5 · 2²³ rounds to the nearest integer, ties to even, and leaves it in
            // the low bits of the sum: its low byte is the code in two's complement. Plain
            // SSE2 arithmetic and bit moves, so the loop vectorises.
            for (c, v) in c8.iter_mut().zip(t.iter()) {
                *c = ((v * inv).clamp(-qmax, qmax) + ROUND_MAGIC).to_bits() as u8;
            }
        } else {
            // All zeros, or not finite: every code 0.
            c8.fill(0);
        }
        let base = b * q.block;
        if q.bits == 8 {
            codes[base..base + c8.len()].copy_from_slice(c8);
        } else {
            // `base` is even (blocks are ≥ 32): a block's nibbles start at a byte.
            let out = &mut codes[base / 2..(base + c8.len()).div_ceil(2)];
            let pairs = c8.chunks_exact(2);
            let odd = pairs.remainder().first().copied();
            let whole = pairs.len();
            for (o, pr) in out[..whole].iter_mut().zip(pairs) {
                *o = (pr[0] & 0x0f) | (pr[1] << 4);
            }
            if let Some(last) = odd {
                out[whole] = last & 0x0f;
            }
        }
    }
    // Padding: zeros, so equal shards give equal records.
    let used = q.code_bytes(n);
    codes[used..].fill(0);
    Ok(())
}

/// Decodes a record of `out.len()` elements into `out`.
pub fn dequantize<T: QuantFloat>(q: &Quant, rec: &[u8], out: &mut [T]) -> Result<()> {
    let n = out.len();
    check_record(q, n, rec.len())?;
    let nb = q.blocks(n);
    let (scales, codes) = rec.split_at(4 * nb);
    let mut tmp = vec![0f32; q.block.min(n.max(1))];
    for (b, chunk) in out.chunks_mut(q.block).enumerate() {
        let s = f32::from_le_bytes(scales[4 * b..4 * b + 4].try_into().expect("4 bytes"));
        let base = b * q.block;
        let t = &mut tmp[..chunk.len()];
        if q.bits == 8 {
            for (o, &c) in t.iter_mut().zip(&codes[base..base + chunk.len()]) {
                *o = f32::from(c as i8) * s;
            }
        } else {
            let bytes = &codes[base / 2..(base + chunk.len()).div_ceil(2)];
            let mut pairs = t.chunks_exact_mut(2);
            for (pr, &byte) in (&mut pairs).zip(bytes) {
                // Sign-extend each nibble.
                pr[0] = f32::from(((byte << 4) as i8) >> 4) * s;
                pr[1] = f32::from((byte as i8) >> 4) * s;
            }
            if let Some(last) = pairs.into_remainder().first_mut() {
                *last = f32::from(((bytes[bytes.len() - 1] << 4) as i8) >> 4) * s;
            }
        }
        T::from_f32_slice(t, chunk);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<T: QuantFloat>(q: Quant, x: &[T]) {
        let mut rec = vec![0u8; q.record_bytes(x.len())];
        quantize(&q, x, &mut rec).unwrap();
        let mut y = vec![T::from_f32(0.0); x.len()];
        dequantize(&q, &rec, &mut y).unwrap();
        for (b, (xs, ys)) in x.chunks(q.block).zip(y.chunks(q.block)).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
            let scale = amax / q.q_max();
            for (i, (a, c)) in xs.iter().zip(ys).enumerate() {
                let (a, c) = (a.to_f32(), c.to_f32());
                if a == 0.0 {
                    assert_eq!(c, 0.0, "block {b} element {i}: zero must stay zero");
                }
                // Within half a step, plus the output type's own rounding (2-byte types keep
                // 8 or 11 bits of mantissa).
                let out_rounding = if std::mem::size_of::<T>() == 2 {
                    4e-3
                } else {
                    1e-6
                };
                let tol = scale / 2.0 * 1.0001 + c.abs() * out_rounding;
                assert!(
                    (a - c).abs() <= tol,
                    "bits {} block {} element {}: {a} came back as {c} (scale {scale})",
                    q.bits,
                    q.block,
                    b * q.block + i
                );
            }
        }
    }

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 33) as f32 / (1u64 << 31) as f32 - 0.5;
                match i % 11 {
                    0 => 0.0,
                    1 => u * 1e4, // heavy tail
                    _ => u,
                }
            })
            .collect()
    }

    #[test]
    fn every_element_comes_back_within_half_a_step_for_every_dtype_bits_block_and_shape() {
        for bits in [8, 4] {
            for block in [32usize, 64, 2048, 8192] {
                let q = Quant {
                    bits,
                    block,
                    allow_nonfinite: false,
                };
                for n in [0usize, 1, 31, 33, block, block + 1, 3 * block - 7] {
                    let x = data(n, n as u64 + block as u64);
                    check(q, &x);
                    let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
                    check(q, &h);
                    let b: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
                    check(q, &b);
                    let d: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
                    check(q, &d);
                }
            }
        }
    }

    #[test]
    fn zero_blocks_decode_to_zeros_and_records_are_sized_and_padded() {
        let q = Quant {
            bits: 4,
            block: 32,
            allow_nonfinite: false,
        };
        assert_eq!(q.record_bytes(33), (4 * 2 + 17usize).div_ceil(8) * 8);
        let x = vec![0f32; 33];
        let mut rec = vec![0xffu8; q.record_bytes(33)];
        quantize(&q, &x, &mut rec).unwrap();
        assert!(rec.iter().all(|&b| b == 0), "{rec:?}");
        let mut y = vec![1f32; 33];
        dequantize(&q, &rec, &mut y).unwrap();
        assert!(y.iter().all(|&v| v == 0.0));
        assert!(quantize(&q, &x, &mut [0u8; 3]).is_err());
    }

    #[test]
    fn bad_widths_and_blocks_are_refused_and_nonfinite_blocks_decode_as_nan() {
        for (bits, block) in [(2, 64), (16, 64), (8, 16), (8, 100), (4, 16384)] {
            let q = Quant {
                bits,
                block,
                allow_nonfinite: false,
            };
            assert!(q.validate().is_err(), "{bits} {block}");
        }
        Quant::INT8.validate().unwrap();
        let q = Quant {
            bits: 8,
            block: 32,
            allow_nonfinite: true,
        };
        let mut x = vec![1f32; 64];
        x[3] = f32::INFINITY;
        assert!(!all_finite(&x));
        let mut rec = vec![0u8; q.record_bytes(64)];
        quantize(&q, &x, &mut rec).unwrap();
        let mut y = vec![0f32; 64];
        dequantize(&q, &rec, &mut y).unwrap();
        assert!(y[..32].iter().all(|v| v.is_nan()));
        assert!(y[32..].iter().all(|&v| (v - 1.0).abs() < 1e-6));
    }
}

#[cfg(test)]
mod speed {
    use super::*;
    use std::time::Instant;

    fn time<T: QuantFloat>(bits: u32) {
        let q = Quant {
            bits,
            ..Quant::INT8
        };
        let n = 1 << 22;
        let x: Vec<T> = (0..n)
            .map(|i| T::from_f32(((i * 7) % 1000) as f32 / 500.0 - 1.0))
            .collect();
        let mut rec = vec![0u8; q.record_bytes(n)];
        let mut y = vec![T::from_f32(0.0); n];
        let t = Instant::now();
        for _ in 0..5 {
            quantize(&q, &x, &mut rec).unwrap();
        }
        let tq = t.elapsed().as_secs_f64() / 5.0;
        let t = Instant::now();
        for _ in 0..5 {
            dequantize(&q, &rec, &mut y).unwrap();
        }
        let td = t.elapsed().as_secs_f64() / 5.0;
        println!(
            "{} {bits}-bit: quantize {:.2} GB/s of input, dequantize {:.2} GB/s of output",
            std::any::type_name::<T>(),
            (n * std::mem::size_of::<T>()) as f64 / tq / 1e9,
            (n * std::mem::size_of::<T>()) as f64 / td / 1e9
        );
    }

    #[test]
    #[ignore]
    fn kernel_speed() {
        for bits in [8, 4] {
            time::<f32>(bits);
            time::<bf16>(bits);
            time::<f16>(bits);
        }
    }
}
