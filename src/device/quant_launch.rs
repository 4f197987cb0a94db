//! The block-quantization kernels of `csrc/quant.cu` as the GPU back ends launch them: their
//! names, and the checks of their arguments (pure arithmetic on device addresses, unit-tested
//! without a GPU). The record layout is [`crate::quant`]'s.

#![cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]

use super::launch::check_aligned;
#[cfg(any(feature = "cuda", feature = "rocm"))]
use crate::device::api::{check_device, Batch, DevSpan};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::Quant;

/// The element types the quantization kernels read and write.
pub(crate) const QUANT_DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Every kernel of `csrc/quant.cu`.
pub(crate) fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for d in QUANT_DTYPES {
        for bits in [8, 4] {
            v.push(format!("pccl_quantize_{}_{bits}", d.name()));
            v.push(format!("pccl_dequantize_{}_{bits}", d.name()));
            v.push(format!("pccl_dequantize_many_{}_{bits}", d.name()));
        }
        v.push(format!("pccl_from_f32_{}", d.name()));
    }
    for bits in [8, 4] {
        v.push(format!("pccl_dequantize_add_{bits}"));
        v.push(format!("pccl_dequantize_sum_{bits}"));
    }
    v
}

fn check_dtype(dtype: DType) -> Result<()> {
    if QUANT_DTYPES.contains(&dtype) {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "quantization takes float32, float64, float16 or bfloat16 elements, not {dtype}"
    )))
}

/// A checked quantize or dequantize: its kernel and the scalar arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QuantLaunch {
    /// The kernel's name.
    pub kernel: String,
    /// Elements.
    pub n: u64,
    /// Elements per scale.
    pub block: u32,
    /// Bytes of the record (the quantize kernel zeroes its padding).
    pub rec_bytes: u64,
    /// Quantization blocks: the quantize kernel's work items (one thread block each).
    pub blocks: u64,
}

/// What a dequantize does with the decoded values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decode {
    /// Writes them as the element type.
    Store,
    /// Adds them to `f32` sums.
    Accumulate,
}

/// Checks a quantize (`decode` `None`) or dequantize of the elements of `dtype` at
/// `(elems, elem_bytes)` to or from the record at `(rec, rec_len)`: a known encoding, a float
/// element type (`f32` when accumulating), whole elements aligned to their size, a record of
/// exactly [`Quant::record_bytes`] whose scales are 4-byte aligned, and no overlap.
pub(crate) fn check_quant(
    dtype: DType,
    q: &Quant,
    decode: Option<Decode>,
    (elems, elem_bytes): (u64, usize),
    (rec, rec_len): (u64, usize),
) -> Result<QuantLaunch> {
    q.validate()?;
    check_dtype(dtype)?;
    if decode == Some(Decode::Accumulate) && dtype != DType::F32 {
        return Err(Error::internal(format!(
            "quantized pieces accumulate into float32 sums, not {dtype}"
        )));
    }
    let es = dtype.size();
    if elem_bytes % es != 0 {
        return Err(Error::invalid(format!(
            "a device buffer of {elem_bytes} bytes is not a whole number of {dtype} elements"
        )));
    }
    check_aligned("quantized data", elems, es)?;
    check_aligned("quantization record", rec, 4)?;
    let n = elem_bytes / es;
    if rec_len != q.record_bytes(n) {
        return Err(Error::internal(format!(
            "a record of {rec_len} bytes for {n} elements (needs {})",
            q.record_bytes(n)
        )));
    }
    let (e_end, r_end) = (elems + elem_bytes as u64, rec + rec_len as u64);
    if elem_bytes > 0 && elems < r_end && rec < e_end {
        return Err(Error::internal(
            "a quantization record overlaps the data it encodes",
        ));
    }
    let kernel = match decode {
        None => format!("pccl_quantize_{}_{}", dtype.name(), q.bits),
        Some(Decode::Store) => format!("pccl_dequantize_{}_{}", dtype.name(), q.bits),
        Some(Decode::Accumulate) => format!("pccl_dequantize_add_{}", q.bits),
    };
    Ok(QuantLaunch {
        kernel,
        n: n as u64,
        block: q.block as u32,
        rec_bytes: rec_len as u64,
        blocks: q.blocks(n) as u64,
    })
}

/// A checked batched dequantize: its kernel, elements per record, the records' stride and
/// count, and the elements the launch covers (`n × count` stored, `n` summed).
#[cfg(any(feature = "cuda", feature = "rocm"))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BatchLaunch {
    /// The kernel's name.
    pub kernel: String,
    /// Elements per record.
    pub n: u64,
    /// Elements per scale.
    pub block: u32,
    /// Bytes from one record to the next ([`Quant::record_bytes`] of `n`).
    pub stride: u64,
    /// Records.
    pub count: u32,
    /// Output elements: the threads' work items.
    pub work: u64,
    /// [`Batch::Sum`]'s `add_first` as the kernel takes it.
    pub add_first: u32,
}

/// Checks a batched dequantize of `count` records at `(recs, recs_len)` into the elements of
/// `dtype` at `(elems, elem_bytes)`: [`check_quant`]'s rules for each record, which must all
/// hold the same number of elements, end to end; at least one record; `f32` sums for
/// [`Batch::Sum`].
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub(crate) fn check_batch(
    (dtype, q): (DType, &Quant),
    (count, how): (usize, Batch),
    (elems, elem_bytes): (u64, usize),
    (recs, recs_len): (u64, usize),
) -> Result<BatchLaunch> {
    let count32 = u32::try_from(count)
        .ok()
        .filter(|&c| c > 0)
        .ok_or_else(|| Error::internal(format!("a batched dequantize of {count} records")))?;
    let per_elems = match how {
        Batch::Store if elem_bytes % count != 0 => {
            return Err(Error::internal(format!(
                "{elem_bytes} bytes of output do not split into {count} equal blocks"
            )))
        }
        Batch::Store => elem_bytes / count,
        Batch::Sum { .. } => elem_bytes,
    };
    if recs_len % count != 0 {
        return Err(Error::internal(format!(
            "{recs_len} bytes of records do not split into {count} equal records"
        )));
    }
    let decode = match how {
        Batch::Store => Decode::Store,
        Batch::Sum { .. } => Decode::Accumulate,
    };
    // The first record and its block stand for all (equal lengths, one alignment).
    let one = check_quant(
        dtype,
        q,
        Some(decode),
        (elems, per_elems),
        (recs, recs_len / count),
    )?;
    let (e_end, r_end) = (elems + elem_bytes as u64, recs + recs_len as u64);
    if elem_bytes > 0 && elems < r_end && recs < e_end {
        return Err(Error::internal(
            "quantization records overlap the data they decode into",
        ));
    }
    let (kernel, work, add_first) = match how {
        Batch::Store => (
            format!("pccl_dequantize_many_{}_{}", dtype.name(), q.bits),
            one.n * u64::from(count32),
            0,
        ),
        Batch::Sum { add_first } => (
            format!("pccl_dequantize_sum_{}", q.bits),
            one.n,
            u32::from(add_first),
        ),
    };
    Ok(BatchLaunch {
        kernel,
        n: one.n,
        block: one.block,
        stride: one.rec_bytes,
        count: count32,
        work,
        add_first,
    })
}

/// [`check_batch`] on spans of the device `ordinal` of a `vendor` handle.
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub(crate) fn check_batch_spans(
    (vendor, ordinal): (&str, usize),
    (dtype, q): (DType, &Quant),
    (count, how): (usize, Batch),
    elems: DevSpan,
    recs: DevSpan,
) -> Result<BatchLaunch> {
    check_device(vendor, ordinal, &[elems, recs])?;
    check_batch(
        (dtype, q),
        (count, how),
        (elems.addr(), elems.len()),
        (recs.addr(), recs.len()),
    )
}

/// [`check_quant`] on spans of the device `ordinal` of a `vendor` handle: `elems` (the data)
/// and `rec` (the record) must be on it. `accumulate` picks the dequantize that adds.
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub(crate) fn check_spans(
    (vendor, ordinal): (&str, usize),
    (dtype, q): (DType, &Quant),
    decode: Option<bool>,
    elems: DevSpan,
    rec: DevSpan,
) -> Result<QuantLaunch> {
    check_device(vendor, ordinal, &[elems, rec])?;
    let decode = decode.map(|add| {
        if add {
            Decode::Accumulate
        } else {
            Decode::Store
        }
    });
    let e = (elems.addr(), elems.len());
    check_quant(dtype, q, decode, e, (rec.addr(), rec.len()))
}

/// [`check_from_f32`] on spans of the device `ordinal` of a `vendor` handle.
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub(crate) fn check_convert_spans(
    (vendor, ordinal): (&str, usize),
    dtype: DType,
    src: DevSpan,
    dst: DevSpan,
) -> Result<(String, u64)> {
    check_device(vendor, ordinal, &[src, dst])?;
    check_from_f32(dtype, (src.addr(), src.len()), (dst.addr(), dst.len()))
}

/// Checks `dst (dtype) = src (f32) × mul` over `n` elements: the kernel and `n`.
pub(crate) fn check_from_f32(
    dtype: DType,
    (src, src_len): (u64, usize),
    (dst, dst_len): (u64, usize),
) -> Result<(String, u64)> {
    check_dtype(dtype)?;
    if src_len % 4 != 0 || dst_len % dtype.size() != 0 || src_len / 4 != dst_len / dtype.size() {
        return Err(Error::internal(format!(
            "float32 sums of {src_len} bytes do not match {dst_len} bytes of {dtype}"
        )));
    }
    check_aligned("float32 sums", src, 4)?;
    check_aligned("converted", dst, dtype.size())?;
    Ok((
        format!("pccl_from_f32_{}", dtype.name()),
        (src_len / 4) as u64,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_launches_are_checked() {
        let q = Quant {
            bits: 4,
            block: 32,
            allow_nonfinite: false,
        };
        let rb = q.record_bytes(100);
        let l = check_quant(DType::BF16, &q, None, (0x1000, 200), (0x2000, rb)).unwrap();
        assert_eq!(l.kernel, "pccl_quantize_bf16_4");
        assert_eq!((l.n, l.block, l.blocks), (100, 32, 4));
        let d = Some(Decode::Accumulate);
        assert_eq!(
            check_quant(DType::F32, &q, d, (0x1000, 400), (0x2000, rb))
                .unwrap()
                .kernel,
            "pccl_dequantize_add_4"
        );
        // Accumulating into bf16, a wrong record length, misalignment, overlap, integers.
        assert!(check_quant(DType::BF16, &q, d, (0x1000, 200), (0x2000, rb)).is_err());
        assert!(check_quant(DType::BF16, &q, None, (0x1000, 200), (0x2000, rb + 8)).is_err());
        assert!(check_quant(DType::BF16, &q, None, (0x1001, 200), (0x2000, rb)).is_err());
        assert!(check_quant(DType::BF16, &q, None, (0x1000, 200), (0x2002, rb)).is_err());
        assert!(check_quant(DType::BF16, &q, None, (0x1000, 200), (0x1010, rb)).is_err());
        assert!(check_quant(DType::I32, &q, None, (0x1000, 400), (0x2000, rb)).is_err());
        let bad = Quant { bits: 5, ..q };
        assert!(check_quant(DType::F32, &bad, None, (0x1000, 400), (0x2000, rb)).is_err());
        assert_eq!(
            check_from_f32(DType::F16, (0x1000, 40), (0x2000, 20)).unwrap(),
            ("pccl_from_f32_f16".to_string(), 10)
        );
        assert!(check_from_f32(DType::F16, (0x1000, 40), (0x2000, 22)).is_err());
        let names = kernel_names();
        assert_eq!(names.len(), 4 * 7 + 4);
        assert!(names.iter().all(|n| n.starts_with("pccl_")));
    }

    #[cfg(any(feature = "cuda", feature = "rocm"))]
    #[test]
    fn batched_dequantize_launches_are_checked() {
        let q = Quant {
            bits: 8,
            block: 64,
            allow_nonfinite: false,
        };
        let rb = q.record_bytes(100);
        let l = check_batch(
            (DType::BF16, &q),
            (3, Batch::Store),
            (0x10000, 3 * 200),
            (0x20000, 3 * rb),
        )
        .unwrap();
        assert_eq!(l.kernel, "pccl_dequantize_many_bf16_8");
        assert_eq!((l.n, l.stride, l.count, l.work), (100, rb as u64, 3, 300));
        let sum = Batch::Sum { add_first: true };
        let l = check_batch(
            (DType::F32, &q),
            (4, sum),
            (0x10000, 400),
            (0x20000, 4 * rb),
        )
        .unwrap();
        assert_eq!(l.kernel, "pccl_dequantize_sum_8");
        assert_eq!((l.n, l.count, l.work, l.add_first), (100, 4, 100, 1));
        // No records, unequal splits, a record of the wrong length, sums in bf16, overlap.
        let e = (0x10000, 400);
        assert!(check_batch((DType::F32, &q), (0, sum), e, (0x20000, 0)).is_err());
        assert!(check_batch((DType::F32, &q), (3, sum), e, (0x20000, 4 * rb)).is_err());
        assert!(check_batch((DType::F32, &q), (4, sum), e, (0x20000, 4 * rb + 32)).is_err());
        let bf = (0x10000, 200);
        assert!(check_batch((DType::BF16, &q), (4, sum), bf, (0x20000, 4 * rb)).is_err());
        assert!(check_batch(
            (DType::F32, &q),
            (3, Batch::Store),
            (0x10000, 7),
            (0x20000, 3 * rb)
        )
        .is_err());
        assert!(check_batch((DType::F32, &q), (4, sum), e, (0x10100, 4 * rb)).is_err());
    }
}
