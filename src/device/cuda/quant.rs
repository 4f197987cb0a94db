//! The block-quantization kernels (`csrc/quant.cu`) on a [`CudaDevice`]'s stream; the
//! [`crate::device::api::Device`] methods `quantize`, `dequantize` and `convert_f32`, with the
//! spans checked (their device, lengths, alignment) by [`crate::device::quant_launch`].

use super::CudaDevice;
use crate::device::api::{Batch, DevSpan, Device};
use crate::device::quant_launch;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::Quant;
use cudarc::driver::PushKernelArg;

impl CudaDevice {
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
        let f = self.shared.kernels.get(&l.kernel)?;
        let mut b = self.stream.launch_builder(f);
        let cfg = match decode {
            None => {
                b.arg(&elems)
                    .arg(&rec)
                    .arg(&l.n)
                    .arg(&l.block)
                    .arg(&l.rec_bytes);
                self.config(0, l.blocks)
            }
            Some(_) => {
                b.arg(&rec).arg(&elems).arg(&l.n).arg(&l.block);
                self.config(0, l.n.div_ceil(u64::from(self.shape.threads)))
            }
        };
        // SAFETY: `pccl_quantize_<dt>_<bits>(const T* x, u8* rec, u64 n, u32 block, u64
        // rec_bytes)` and `pccl_dequantize[_add]_...(const u8* rec, T* out, u64 n, u32 block)`
        // take exactly these arguments; the buffers hold `n` aligned elements and the
        // record's `rec_bytes` bytes (checked above), kept valid by the caller.
        unsafe { b.launch(cfg) }
            .map_err(|e| Error::system(format!("CUDA launch of {} failed: {e}", l.kernel)))?;
        Ok(())
    }

    /// Decodes `count` records end to end in `recs` into `elems` in one launch, queued on
    /// this handle's stream: [`Device::dequantize_batch`].
    ///
    /// # Safety
    /// As [`CudaDevice::quant_spans`].
    pub(crate) unsafe fn batch_spans(
        &self,
        (dtype, q): (DType, &Quant),
        (count, how): (usize, Batch),
        elems: DevSpan,
        recs: DevSpan,
    ) -> Result<()> {
        let at = (Self::VENDOR, self.ordinal());
        let l = quant_launch::check_batch_spans(at, (dtype, q), (count, how), elems, recs)?;
        let (elems, recs) = (elems.addr(), recs.addr());
        if l.work == 0 {
            return Ok(());
        }
        let f = self.shared.kernels.get(&l.kernel)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&recs)
            .arg(&elems)
            .arg(&l.n)
            .arg(&l.block)
            .arg(&l.stride)
            .arg(&l.count);
        if let Batch::Sum { .. } = how {
            b.arg(&l.add_first);
        }
        let cfg = self.config(0, l.work.div_ceil(u64::from(self.shape.threads)));
        // SAFETY: `pccl_dequantize_many_<dt>_<bits>(const u8* recs, T* out, u64 n, u32
        // block, u64 stride, u32 count)` and `pccl_dequantize_sum_<bits>(..., u32 add_first)`
        // take exactly these arguments; the records and the output were checked above
        // (lengths, alignment, no overlap) and are kept valid by the caller.
        unsafe { b.launch(cfg) }
            .map_err(|e| Error::system(format!("CUDA launch of {} failed: {e}", l.kernel)))?;
        Ok(())
    }

    /// `dst = src × mul` rounded to `dtype` (`src` float32 sums), queued on the stream:
    /// [`Device::convert_f32`].
    ///
    /// # Safety
    /// As [`CudaDevice::quant_spans`].
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
        let f = self.shared.kernels.get(&kernel)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&src).arg(&dst).arg(&n).arg(&mul);
        let cfg = self.config(0, n.div_ceil(u64::from(self.shape.threads)));
        // SAFETY: `pccl_from_f32_<dt>(const float* src, T* dst, u64 n, float mul)`; both
        // buffers hold `n` aligned elements (checked above), kept valid by the caller.
        unsafe { b.launch(cfg) }
            .map_err(|e| Error::system(format!("CUDA launch of {kernel} failed: {e}")))?;
        Ok(())
    }
}
