//! Pure argument validation of the HIP device calls (unit-tested without a device).

use super::*;

/// A device buffer as the validation sees it: its address and length in bytes.
pub(crate) type Span = (u64, usize);

/// Validates `dst = a op b` over the first `n` elements of `dtype` of three buffers; returns
/// the launch's element count and head, or `None` when there is nothing to do.
pub(crate) fn plan_reduce(
    op: ReduceOp,
    dtype: DType,
    n: usize,
    dst: Span,
    a: Span,
    b: Span,
) -> Result<Option<Elementwise>> {
    dtype.check_op(op)?;
    let bytes = check_count(
        dtype,
        n,
        &[
            ("destination", dst.1),
            ("first input", a.1),
            ("second input", b.1),
        ],
    )?;
    if bytes == 0 {
        return Ok(None);
    }
    launch::check_elementwise(dtype, [dst.0, a.0, b.0], bytes).map(Some)
}

/// Bytes of `n` elements of `dtype`, checking for overflow and that every named buffer
/// length holds them.
pub(crate) fn check_count(dtype: DType, n: usize, lens: &[(&str, usize)]) -> Result<usize> {
    let bytes = n.checked_mul(dtype.size()).ok_or_else(|| {
        Error::invalid(format!(
            "{n} elements of {dtype} overflow the address space"
        ))
    })?;
    for (what, len) in lens {
        if *len < bytes {
            return Err(Error::invalid(format!(
                "{n} {dtype} elements need {bytes} bytes, the {what} buffer holds {len}"
            )));
        }
    }
    Ok(bytes)
}

/// Validates a transpose of `m` x `n` blocks of `block_bytes` bytes from `src` to `dst`
/// with `threads` threads per block: sizes, overflow, overlap. Returns the bytes moved and
/// the plan, or `None` when there is nothing to do.
pub(crate) fn plan_transpose_spans(
    src: Span,
    dst: Span,
    m: usize,
    n: usize,
    block_bytes: usize,
    threads: u32,
) -> Result<Option<(usize, TransposePlan)>> {
    let total = launch::transpose_total(src.1, dst.1, m, n, block_bytes)?;
    if total == 0 {
        return Ok(None);
    }
    let plan = launch::plan_transpose(src.0, dst.0, m, n, block_bytes, total, threads)?;
    Ok(Some((total, plan)))
}

/// Checks a host slice of `len` bytes against a device buffer of `buf` bytes for an exact
/// copy (`upload_into`).
pub(crate) fn check_same_len(what: &str, len: usize, buf: usize) -> Result<()> {
    if len != buf {
        return Err(Error::invalid(format!(
            "{what} of {len} bytes into a device buffer of {buf} bytes"
        )));
    }
    Ok(())
}

/// Checks that a device buffer of `len` bytes holds whole elements of `dtype` (`download`).
pub(crate) fn check_whole_elements(len: usize, dtype: DType) -> Result<()> {
    if len % dtype.size() != 0 {
        return Err(Error::invalid(format!(
            "device buffer of {len} bytes is not a whole number of {dtype} elements"
        )));
    }
    Ok(())
}
