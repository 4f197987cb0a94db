//! The block-quantization kernels (`csrc/quant.cu`) on a [`HipDevice`]'s stream; the
//! [`crate::device::api::Device`] methods `quantize`, `dequantize` and `convert_f32`, with the
//! spans checked (their device, lengths, alignment) by [`crate::device::quant_launch`].

use super::HipDevice;
use crate::device::api::{Batch, DevSpan, Device};
use crate::device::quant_launch;
use crate::dtype::DType;
use crate::error::Result;
use crate::quant::Quant;
use std::ffi::c_void;

impl HipDevice {
    /// Encodes the elements of `dtype` in `elems` into the record `rec` (`decode` None), or
    /// decodes the record into them (`Some(false)`) or adds it to their `f32` sums
    /// (`Some(true)`), queued on this handle's stream: [`Device::quantize`] and
    /// [`Device::dequantize`].
    ///
    /// # Safety
    /// Both spans must stay valid until the kernel has completed, untouched by other work
    /// meanwhile.
    pub(crate) unsafe fn quant_spans(
        &self,
        dtype: DType,
        q: &Quant,
        decode: Option<bool>,
        elems: DevSpan,
        rec: DevSpan,
    ) -> Result<()> {
        let at = (Self::VENDOR, self.ordinal());
        let l = quant_launch::check_spans(at, (dtype, q), decode, elems, rec)?;
        let (elems, rec) = (elems.addr(), rec.addr());
        if l.n == 0 {
            return Ok(());
        }
        let (mut e, mut r, mut n, mut block, mut rb) = (elems, rec, l.n, l.block, l.rec_bytes);
        match decode {
            None => {
                let grid = self.shape.grid_blocks(l.blocks, self.shared.compute_units);
                let mut args: [*mut c_void; 5] = [
                    (&mut e as *mut u64).cast(),
                    (&mut r as *mut u64).cast(),
                    (&mut n as *mut u64).cast(),
                    (&mut block as *mut u32).cast(),
                    (&mut rb as *mut u64).cast(),
                ];
                // SAFETY: `pccl_quantize_<dt>_<bits>(const T* x, u8* rec, u64 n, u32 block,
                // u64 rec_bytes)`; the buffers were checked above and are kept valid by the
                // caller.
                unsafe { self.launch(&l.kernel, grid, 0, &mut args) }
            }
            Some(_) => {
                let grid = self.shape.grid_blocks(
                    n.div_ceil(u64::from(self.shape.threads)),
                    self.shared.compute_units,
                );
                let mut args: [*mut c_void; 4] = [
                    (&mut r as *mut u64).cast(),
                    (&mut e as *mut u64).cast(),
                    (&mut n as *mut u64).cast(),
                    (&mut block as *mut u32).cast(),
                ];
                // SAFETY: `pccl_dequantize[_add]_...(const u8* rec, T* out, u64 n, u32
                // block)`; as above.
                unsafe { self.launch(&l.kernel, grid, 0, &mut args) }
            }
        }
    }

    /// Decodes `count` records end to end in `recs` into `elems` in one launch, queued on
    /// this handle's stream: [`Device::dequantize_batch`].
    ///
    /// # Safety
    /// As [`HipDevice::quant_spans`].
    pub(crate) unsafe fn batch_spans(
        &self,
        (dtype, q): (DType, &Quant),
        (count, how): (usize, Batch),
        elems: DevSpan,
        recs: DevSpan,
    ) -> Result<()> {
        let at = (Self::VENDOR, self.ordinal());
        let l = quant_launch::check_batch_spans(at, (dtype, q), (count, how), elems, recs)?;
        if l.work == 0 {
            return Ok(());
        }
        let (mut r, mut e, mut n, mut block) = (recs.addr(), elems.addr(), l.n, l.block);
        let (mut stride, mut count, mut add_first) = (l.stride, l.count, l.add_first);
        let grid = self.shape.grid_blocks(
            l.work.div_ceil(u64::from(self.shape.threads)),
            self.shared.compute_units,
        );
        let mut args: [*mut c_void; 7] = [
            (&mut r as *mut u64).cast(),
            (&mut e as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
            (&mut block as *mut u32).cast(),
            (&mut stride as *mut u64).cast(),
            (&mut count as *mut u32).cast(),
            (&mut add_first as *mut u32).cast(),
        ];
        let used = match how {
            Batch::Store => 6,
            Batch::Sum { .. } => 7,
        };
        // SAFETY: `pccl_dequantize_many_<dt>_<bits>(const u8* recs, T* out, u64 n, u32
        // block, u64 stride, u32 count)` takes the first six, `pccl_dequantize_sum_<bits>`
        // all seven; the buffers were checked above and are kept valid by the caller.
        unsafe { self.launch(&l.kernel, grid, 0, &mut args[..used]) }
    }

    /// `dst = src × mul` rounded to `dtype` (`src` float32 sums), queued on the stream:
    /// [`Device::convert_f32`].
    ///
    /// # Safety
    /// As [`HipDevice::quant_spans`].
    pub(crate) unsafe fn convert_spans(
        &self,
        dtype: DType,
        src: DevSpan,
        dst: DevSpan,
        mul: f32,
    ) -> Result<()> {
        let at = (Self::VENDOR, self.ordinal());
        let (kernel, n) = quant_launch::check_convert_spans(at, dtype, src, dst)?;
        let (src, dst) = (src.addr(), dst.addr());
        if n == 0 {
            return Ok(());
        }
        let (mut s, mut d, mut n, mut mul) = (src, dst, n, mul);
        let grid = self.shape.grid_blocks(
            n.div_ceil(u64::from(self.shape.threads)),
            self.shared.compute_units,
        );
        let mut args: [*mut c_void; 4] = [
            (&mut s as *mut u64).cast(),
            (&mut d as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
            (&mut mul as *mut f32).cast(),
        ];
        // SAFETY: `pccl_from_f32_<dt>(const float* src, T* dst, u64 n, float mul)`; both
        // buffers were checked above and are kept valid by the caller.
        unsafe { self.launch(&kernel, grid, 0, &mut args) }
    }
}
