//! Launch arithmetic shared by the GPU back ends (`cuda` and `hip`): kernel names, argument
//! validation, the vector head of the element-wise kernels and the block-transpose plan.
//!
//! Everything here is pure (device addresses are plain `u64` values), so it compiles without
//! any feature and is unit-tested without a GPU. The kernels these numbers describe live in
//! `csrc/reduce.cu` (with `csrc/quant.cu`, see [`super::quant_launch`]) and `csrc/transpose.cu`.

// Only the GPU back ends call into this module; a build with neither (the unit tests of the
// default features) leaves parts of it unused.
#![cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]

use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};

/// Independent 16-byte accesses per thread per input in the kernels (`PCCL_UNROLL`).
pub(crate) const UNROLL: u32 = 4;
/// Blocks of at least this many bytes are transposed by whole-run copies (a run of 256 bytes
/// or more wastes at most one partly used 32-byte sector at each end); smaller ones through
/// shared-memory tiles.
pub(crate) const TILE_BELOW_BYTES: usize = 256;
/// A destination row of a tile holds about this many bytes (`TM * s`) at most.
const TILE_ROW_BYTES: usize = 512;
/// The most source rows (`TM`) in a tile.
const TILE_MAX_ROWS: usize = 64;
/// A tile holds about this many bytes (`TM * TN * s`).
const TILE_BYTES: usize = 16 << 10;
/// The most source columns (`TN`) in a tile.
const TILE_MAX_COLS: usize = 4096;

/// Threads per block and the grid cap the kernels are launched with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchShape {
    /// Threads per block (a multiple of 32, at most 1024).
    pub threads: u32,
    /// Grid cap: at most this many blocks per multiprocessor (compute unit on AMD GPUs), the
    /// kernels looping over the rest of the work with a grid stride. 0, the default, means no
    /// cap: one block per piece of work (on an H100 this ran 3 to 5% faster than one resident
    /// wave, see docs/BENCHMARKS-GPU.md).
    pub blocks_per_sm: u32,
}

impl Default for LaunchShape {
    fn default() -> Self {
        LaunchShape {
            threads: 512,
            blocks_per_sm: 0,
        }
    }
}

impl LaunchShape {
    /// Checks the thread count: a multiple of 32 in `32..=1024`.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.threads == 0 || self.threads > 1024 || self.threads % 32 != 0 {
            return Err(Error::invalid(format!(
                "threads per block must be a multiple of 32 in 32..=1024, not {}",
                self.threads
            )));
        }
        Ok(())
    }

    /// Blocks in the grid for `work_items` independent pieces of work of one block each, on
    /// a device of `sms` multiprocessors.
    pub(crate) fn grid_blocks(&self, work_items: u64, sms: u32) -> u32 {
        let cap = match self.blocks_per_sm {
            0 => i32::MAX as u64,
            n => (sms as u64 * n as u64).clamp(1, i32::MAX as u64),
        };
        work_items.clamp(1, cap) as u32
    }

    /// Work pieces of an element-wise kernel over `n` elements, `head` of them scalar.
    pub(crate) fn elementwise_work(&self, n: u64, head: u64, esize: usize) -> u64 {
        let w = (16 / esize) as u64;
        let nvec = (n - head.min(n)) / w;
        let scalars = n - nvec * w;
        let threads = self.threads as u64;
        nvec.div_ceil(threads * UNROLL as u64)
            .max(scalars.div_ceil(threads))
    }
}

/// Fails unless device address `ptr` is a multiple of `align`.
pub(crate) fn check_aligned(what: &str, ptr: u64, align: usize) -> Result<()> {
    if ptr % align as u64 != 0 {
        return Err(Error::invalid(format!(
            "{what} buffer at {ptr:#x} is not aligned to its element size ({align} bytes)"
        )));
    }
    Ok(())
}

/// True when the `len`-byte ranges at `a` and `b` share a byte.
pub(crate) fn overlaps(a: u64, b: u64, len: usize) -> bool {
    let len = len as u64;
    a < b.saturating_add(len) && b < a.saturating_add(len)
}

/// Elements before the first 16-byte boundary shared by all pointers (all of them when the
/// pointers are aligned differently: the kernel then runs scalar).
pub(crate) fn vector_head(ptrs: &[u64], n: usize, esize: usize) -> u64 {
    let mis = ptrs[0] % 16;
    if ptrs.iter().any(|p| p % 16 != mis) {
        return n as u64;
    }
    (((16 - mis) % 16) / esize as u64).min(n as u64)
}

/// The reduction kernel for `op` on `dtype` (`Avg` sums; the division comes last).
pub(crate) fn reduce_kernel(op: ReduceOp, dtype: DType) -> String {
    let op = if op == ReduceOp::Avg {
        ReduceOp::Sum
    } else {
        op
    };
    format!("pccl_reduce_{}_{}", dtype.name(), op.name())
}

/// The division kernel for a floating-point `dtype`.
pub(crate) fn divide_kernel(dtype: DType) -> String {
    format!("pccl_divide_{}", dtype.name())
}

/// Every kernel the two modules define: reductions and divisions, quantization, transposes.
pub(crate) fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for d in DType::ALL {
        for op in ["sum", "prod", "min", "max"] {
            v.push(format!("pccl_reduce_{}_{}", d.name(), op));
        }
        if d.is_float() {
            v.push(divide_kernel(d));
        }
    }
    v.extend(super::quant_launch::kernel_names());
    for u in [1, 2, 4, 8, 16] {
        v.push(format!("pccl_transpose_copy_{u}"));
        v.push(format!("pccl_transpose_tile_{u}"));
    }
    v
}

/// The block-quantization kernels: compiled in the reduction module, whose types and
/// conversions they use.
pub(crate) const QUANT_SOURCE: &str = include_str!("../../csrc/quant.cu");

/// The source of the reduction module: `reduce` (`csrc/reduce.cu`), then `csrc/quant.cu`
/// with its own line numbers.
pub(crate) fn reduce_module_source(reduce: &str) -> String {
    format!("{reduce}\n#line 1 \"quant.cu\"\n{QUANT_SOURCE}")
}

/// Checks that reduction buffers of byte lengths `lens` are equally long and hold whole
/// elements of `dtype`; returns the common length.
pub(crate) fn check_lengths(dtype: DType, lens: &[usize]) -> Result<usize> {
    let bytes = lens[0];
    if lens.iter().any(|&l| l != bytes) {
        return Err(Error::invalid(format!(
            "reduction buffers differ in length: {lens:?} bytes"
        )));
    }
    if bytes % dtype.size() != 0 {
        return Err(Error::invalid(format!(
            "reduction buffers of {bytes} bytes are not a whole number of {dtype} elements"
        )));
    }
    Ok(bytes)
}

/// Element count and scalar head of one element-wise launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Elementwise {
    /// Elements.
    pub n: u64,
    /// Elements before the shared 16-byte boundary (see [`vector_head`]).
    pub head: u64,
}

/// Validates a reduction `dst = a op b` over `bytes` bytes of `dtype` at device addresses
/// `ptrs = [dst, a, b]`: each aligned to the element size, and `dst` either equal to an input
/// or disjoint from it.
pub(crate) fn check_elementwise(dtype: DType, ptrs: [u64; 3], bytes: usize) -> Result<Elementwise> {
    let esize = dtype.size();
    for (what, p) in ["destination", "first input", "second input"]
        .iter()
        .zip(ptrs)
    {
        check_aligned(what, p, esize)?;
    }
    if ptrs[0] != ptrs[1] && overlaps(ptrs[0], ptrs[1], bytes)
        || ptrs[0] != ptrs[2] && overlaps(ptrs[0], ptrs[2], bytes)
    {
        return Err(Error::invalid(
            "reduction destination partly overlaps an input: it must be the same buffer or disjoint",
        ));
    }
    Ok(Elementwise {
        n: (bytes / esize) as u64,
        head: vector_head(&ptrs, bytes / esize, esize),
    })
}

/// Validates the destination of a division over `bytes` bytes of `dtype` at `dst`.
pub(crate) fn check_divide(dtype: DType, dst: u64, bytes: usize) -> Result<Elementwise> {
    let esize = dtype.size();
    check_aligned("destination", dst, esize)?;
    Ok(Elementwise {
        n: (bytes / esize) as u64,
        head: vector_head(&[dst], bytes / esize, esize),
    })
}

/// Validates the sizes of a transpose of `m` x `n` blocks of `block_bytes` bytes between
/// buffers of `src_len` and `dst_len` bytes; returns the bytes moved, `m * n * block_bytes`.
pub(crate) fn transpose_total(
    src_len: usize,
    dst_len: usize,
    m: usize,
    n: usize,
    block_bytes: usize,
) -> Result<usize> {
    let total = m
        .checked_mul(n)
        .and_then(|x| x.checked_mul(block_bytes))
        .ok_or_else(|| {
            Error::invalid(format!(
                "transpose of {m} x {n} blocks of {block_bytes} bytes overflows"
            ))
        })?;
    if src_len < total || dst_len < total {
        return Err(Error::invalid(format!(
            "transpose of {m} x {n} blocks of {block_bytes} bytes needs {total} bytes, \
             buffers hold {src_len} (source) and {dst_len} (destination)"
        )));
    }
    if m >= i32::MAX as usize || n >= i32::MAX as usize {
        return Err(Error::invalid(format!(
            "transpose grid {m} x {n} is too large (each side < 2^31)"
        )));
    }
    Ok(total)
}

/// How a (validated, non-empty) block transpose runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TransposePlan {
    /// One side is 1: the layout does not change, a plain copy of all the bytes.
    Copy,
    /// `pccl_transpose_copy_<unit>(src, dst, M, N, k)` over `work` pieces of one block each.
    Runs {
        /// Bytes per access (16, 8, 4, 2 or 1).
        unit: usize,
        /// Units per block.
        k: u64,
        /// Work pieces (blocks of the grid, before the cap).
        work: u64,
    },
    /// `pccl_transpose_tile_<unit>(src, dst, M, N, k, TM, TN)` over `tiles` tiles.
    Tiles {
        /// Bytes per access.
        unit: usize,
        /// Units per block.
        k: u64,
        /// Source rows per tile.
        tm: u32,
        /// Source columns per tile.
        tn: u32,
        /// Tiles (blocks of the grid, before the cap).
        tiles: u64,
        /// Dynamic shared memory, bytes.
        smem: u32,
    },
}

impl TransposePlan {
    /// The kernel this plan launches, if any.
    pub(crate) fn kernel(&self) -> Option<String> {
        match self {
            TransposePlan::Copy => None,
            TransposePlan::Runs { unit, .. } => Some(format!("pccl_transpose_copy_{unit}")),
            TransposePlan::Tiles { unit, .. } => Some(format!("pccl_transpose_tile_{unit}")),
        }
    }
}

/// Plans the transpose of `m` x `n` blocks of `block_bytes` bytes from device address `ps` to
/// `pd`, `total` (from [`transpose_total`], non-zero) bytes each, with `threads` threads per
/// block. Fails when the two ranges overlap.
pub(crate) fn plan_transpose(
    ps: u64,
    pd: u64,
    m: usize,
    n: usize,
    block_bytes: usize,
    total: usize,
    threads: u32,
) -> Result<TransposePlan> {
    if overlaps(ps, pd, total) {
        return Err(Error::invalid("transpose source and destination overlap"));
    }
    if m == 1 || n == 1 {
        return Ok(TransposePlan::Copy);
    }
    let unit = [16usize, 8, 4, 2, 1]
        .into_iter()
        .find(|&u| block_bytes % u == 0 && ps % u as u64 == 0 && pd % u as u64 == 0)
        .unwrap_or(1);
    let k = (block_bytes / unit) as u64;
    let (mm, nn) = (m as u64, n as u64);
    if block_bytes >= TILE_BELOW_BYTES {
        let chunk = threads as u64 * UNROLL as u64;
        let work = if k >= chunk {
            mm * nn * k.div_ceil(chunk)
        } else {
            (mm * nn).div_ceil(chunk / k)
        };
        Ok(TransposePlan::Runs { unit, k, work })
    } else {
        let tm = m.min((TILE_ROW_BYTES / block_bytes).clamp(1, TILE_MAX_ROWS));
        let tn = n.min((TILE_BYTES / (tm * block_bytes)).clamp(1, TILE_MAX_COLS));
        let tiles = mm.div_ceil(tm as u64) * nn.div_ceil(tn as u64);
        let smem = tm * (tn * k as usize + 1) * unit;
        Ok(TransposePlan::Tiles {
            unit,
            k,
            tm: tm as u32,
            tn: tn as u32,
            tiles,
            smem: smem as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn alignment_and_overlap() {
        assert!(check_aligned("x", 0x1000, 8).is_ok());
        let e = check_aligned("destination", 0x1002, 4).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("0x1002"), "{e}");
        assert!(overlaps(100, 150, 64));
        assert!(overlaps(150, 100, 64));
        assert!(!overlaps(100, 164, 64));
        assert!(!overlaps(164, 100, 64));
        assert!(!overlaps(u64::MAX - 8, 0, 16));
    }

    #[test]
    fn vector_heads() {
        assert_eq!(vector_head(&[0x1000, 0x2000, 0x3000], 100, 4), 0);
        assert_eq!(vector_head(&[0x1004, 0x2004, 0x3004], 100, 4), 3);
        assert_eq!(vector_head(&[0x1004, 0x2008, 0x3004], 100, 4), 100);
        assert_eq!(vector_head(&[0x1004], 2, 4), 2);
    }

    #[test]
    fn elementwise_checks() {
        let ok = check_elementwise(DType::F32, [0x1000, 0x1000, 0x2000], 64).unwrap();
        assert_eq!(ok, Elementwise { n: 16, head: 0 });
        let mis = check_elementwise(DType::F32, [0x1000, 0x1001, 0x2000], 64).unwrap_err();
        assert!(mis.message().contains("first input"), "{mis}");
        let part = check_elementwise(DType::F32, [0x1000, 0x1010, 0x2000], 64).unwrap_err();
        assert!(part.message().contains("partly overlaps"), "{part}");
        assert!(check_divide(DType::F64, 0x1004, 8).is_err());
        assert_eq!(
            check_lengths(DType::I32, &[8, 8, 4]).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert!(check_lengths(DType::I32, &[6, 6]).is_err());
        assert_eq!(check_lengths(DType::I32, &[8, 8]).unwrap(), 8);
    }

    #[test]
    fn kernel_name_set() {
        let names = kernel_names();
        assert_eq!(names.len(), 10 * 4 + 4 + 32 + 10);
        assert_eq!(
            reduce_kernel(ReduceOp::Avg, DType::BF16),
            "pccl_reduce_bf16_sum"
        );
        assert_eq!(
            reduce_kernel(ReduceOp::Min, DType::U8),
            "pccl_reduce_u8_min"
        );
        assert!(names.contains(&divide_kernel(DType::F16)));
        assert!(names.iter().all(|n| n.starts_with("pccl_")));
    }

    #[test]
    fn transpose_plans() {
        assert!(transpose_total(0, 0, usize::MAX, 2, 1)
            .unwrap_err()
            .message()
            .contains("overflows"));
        assert!(transpose_total(100, 1000, 4, 4, 16)
            .unwrap_err()
            .message()
            .contains("needs 256 bytes"));
        assert!(transpose_total(1 << 40, 1 << 40, 1 << 31, 1, 1).is_err());
        assert_eq!(transpose_total(256, 256, 4, 4, 16).unwrap(), 256);
        assert!(plan_transpose(0x1000, 0x1080, 4, 4, 16, 256, 512).is_err());
        assert_eq!(
            plan_transpose(0x1000, 0x2000, 1, 4, 16, 64, 512).unwrap(),
            TransposePlan::Copy
        );
        let runs = plan_transpose(0x1000, 0x9000, 4, 4, 256, 4096, 512).unwrap();
        assert_eq!(
            runs,
            TransposePlan::Runs {
                unit: 16,
                k: 16,
                work: 1
            }
        );
        assert_eq!(runs.kernel().unwrap(), "pccl_transpose_copy_16");
        let tiles = plan_transpose(0x1001, 0x9000, 8, 8, 12, 768, 512).unwrap();
        match tiles {
            TransposePlan::Tiles {
                unit, k, tm, tn, ..
            } => {
                assert_eq!((unit, k, tm, tn), (1, 12, 8, 8));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(tiles.kernel().unwrap(), "pccl_transpose_tile_1");
    }

    #[test]
    fn shapes() {
        let s = LaunchShape::default();
        assert!(s.validate().is_ok());
        assert!(LaunchShape {
            threads: 48,
            blocks_per_sm: 0
        }
        .validate()
        .is_err());
        assert_eq!(s.grid_blocks(0, 100), 1);
        assert_eq!(s.grid_blocks(1 << 40, 100), i32::MAX as u32);
        let capped = LaunchShape {
            threads: 256,
            blocks_per_sm: 2,
        };
        assert_eq!(capped.grid_blocks(1000, 100), 200);
        assert_eq!(s.elementwise_work(4096, 0, 4), 1);
        assert_eq!(s.elementwise_work(10, 10, 4), 1);
    }
}
