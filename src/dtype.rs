//! Element types and reduction operators.

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// The element types PCCL reduces and moves (NCCL's set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// `i8`
    I8,
    /// `u8`
    U8,
    /// `i32`
    I32,
    /// `u32`
    U32,
    /// `i64`
    I64,
    /// `u64`
    U64,
    /// IEEE binary16 (`half::f16`)
    F16,
    /// bfloat16 (`half::bf16`)
    BF16,
    /// `f32`
    F32,
    /// `f64`
    F64,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 10] = [
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    /// True for the floating-point types (the ones that can hold an average).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Short lowercase name, as printed by the benchmark (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Checks that `op` is defined on this dtype: averaging is only defined on
    /// floating-point types, since an integer cannot hold the quotient.
    pub fn check_op(self, op: ReduceOp) -> Result<()> {
        if op == ReduceOp::Avg && !self.is_float() {
            return Err(Error::invalid(format!(
                "op avg is not defined for dtype {}: an integer cannot hold the average; \
                 use sum and divide, or a floating-point dtype",
                self.name()
            )));
        }
        Ok(())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == s.to_ascii_lowercase())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown dtype '{s}': expected one of i8 u8 i32 u32 i64 u64 f16 bf16 f32 f64"
                ))
            })
    }
}

/// Reduction operators (NCCL's set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise product.
    Prod,
    /// Element-wise minimum.
    Min,
    /// Element-wise maximum.
    Max,
    /// Sum divided by the number of ranks (floating-point dtypes only).
    Avg,
}

impl ReduceOp {
    /// Every op, in declaration order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// Lowercase name (`sum`, `prod`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        ReduceOp::ALL
            .iter()
            .copied()
            .find(|o| o.name() == s.to_ascii_lowercase())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown op '{s}': expected one of sum prod min max avg"
                ))
            })
    }
}

/// A type PCCL can move and reduce. Implemented for the ten [`DType`]s.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// `dst[i] = dst[i] op src[i]` (for `Avg` this sums; the division comes last).
    fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]);
    /// `dst[i] = a[i] op b[i]`.
    fn reduce3(op: ReduceOp, dst: &mut [Self], a: &[Self], b: &[Self]);
    /// `dst[i] /= n` (floating-point types; a no-op elsewhere, since avg is rejected there).
    fn divide(dst: &mut [Self], n: usize);
    /// Converts a small integer to this type (tests and benchmark checks).
    fn from_i64(v: i64) -> Self;
}
