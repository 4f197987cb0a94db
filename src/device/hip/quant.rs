//! The block-quantization kernels (`csrc/quant.cu`) on a [`HipDevice`]'s stream; the
//! [`crate::device::api::Device`] methods `quantize`, `dequantize` and `convert_f32` call these
//! after checking the spans' device.

use super::HipDevice;
use crate::device::quant_launch::{self, Decode};
use crate::dtype::DType;
use crate::error::Result;
use crate::quant::Quant;
use std::ffi::c_void;

impl HipDevice {
    /// Encodes `bytes` bytes of `dtype` at `src` into the record of `rec_len` bytes at `rec`
    /// (or, with `decode`, decodes the record into / adds it to the elements), queued on
    /// this handle's stream.
    ///
    /// # Safety
    /// Both ranges must be device memory of this device, valid until the kernel has
    /// completed and untouched by other work meanwhile.
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

    /// `dst = src × mul` rounded to `dtype` (`src` float32 sums), queued on the stream.
    ///
    /// # Safety
    /// As [`HipDevice::quant_raw`].
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
