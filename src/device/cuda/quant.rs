//! The block-quantization kernels (`csrc/quant.cu`) on a [`CudaDevice`]'s stream; the
//! [`crate::device::api::Device`] methods `quantize`, `dequantize` and `convert_f32` call these
//! after checking the spans' device.

use super::CudaDevice;
use crate::device::quant_launch::{self, Decode};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::Quant;
use cudarc::driver::PushKernelArg;

impl CudaDevice {
    /// Encodes `bytes` bytes of `dtype` at `src` into the record of `rec_len` bytes at `rec`
    /// (or, with `decode`, decodes the record into / adds it to the elements), queued on
    /// this handle's stream.
    ///
    /// # Safety
    /// Both ranges must be device memory of this handle's context, valid until the kernel
    /// has completed and untouched by other work meanwhile.
    pub(crate) unsafe fn quant_raw(
        &self,
        dtype: DType,
        q: &Quant,
        decode: Option<Decode>,
        (elems, bytes): (u64, usize),
        (rec, rec_len): (u64, usize),
    ) -> Result<()> {
        let l = quant_launch::check_quant(dtype, q, decode, (elems, bytes), (rec, rec_len))?;
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

    /// `dst = src × mul` rounded to `dtype` (`src` float32 sums), queued on the stream.
    ///
    /// # Safety
    /// As [`CudaDevice::quant_raw`].
    pub(crate) unsafe fn convert_f32_raw(
        &self,
        dtype: DType,
        (src, src_len): (u64, usize),
        (dst, dst_len): (u64, usize),
        mul: f32,
    ) -> Result<()> {
        let (kernel, n) = quant_launch::check_from_f32(dtype, (src, src_len), (dst, dst_len))?;
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
