//! Quantized all-gather (ZeRO++'s qwZ): each rank encodes its shard once
//! ([`crate::quant`]: INT8 or INT4, one `f32` scale per block), every plan of the
//! communicator's all-gather (flat, hierarchical, overlapped; the tuner's or `PCCL_ALGO`'s)
//! moves the records, and every rank decodes them into the output's type.
//!
//! Before a byte of data moves, the ranks exchange one small header each (bit width, block,
//! count, whether the shard is finite, whether the call's arguments are sound): a rank that
//! disagrees, a bad argument or a NaN / infinity anywhere ends the call with the same error on
//! every rank, naming the ranks, and no rank falls out of step.

use super::Communicator;
use crate::error::{Error, Result};
use crate::quant::{self, Quant, QuantFloat};

/// The header's fields, one `u64` each.
const BITS: usize = 0;
const BLOCK: usize = 1;
const COUNT: usize = 2;
const FINITE: usize = 3;
const ALLOW: usize = 4;
const SOUND: usize = 5;
const FIELDS: usize = 6;

fn alloc_words(n: usize, what: &str) -> Result<Vec<u64>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| Error::system(format!("cannot allocate {n} words for {what}")))?;
    v.resize(n, 0);
    Ok(v)
}

fn ranks_where(all: &[u64], p: usize, f: impl Fn(&[u64]) -> bool) -> Vec<usize> {
    (0..p)
        .filter(|&r| f(&all[r * FIELDS..(r + 1) * FIELDS]))
        .collect()
}

fn list(r: &[usize]) -> String {
    r.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Communicator {
    /// All-gathers `input` (this rank's shard) into `output` (`input.len() × size()`
    /// elements, rank `r`'s shard at block `r`) with the data quantized on the wire: each
    /// element comes back within half its block's step (`max |x| / 127` for INT8, `/ 7` for
    /// INT4), zeros exactly. NaN or infinities in any rank's shard are refused on every rank
    /// before any data moves, unless `q.allow_nonfinite` (their blocks then come back NaN).
    /// Every rank must pass the same `q` and count; a rank that does not fails the call on
    /// every rank, named.
    ///
    /// Wire bytes per element: 1 (INT8) or ½ (INT4) plus 4 per block of scales, against 2
    /// for `bf16` and 4 for `f32`.
    pub fn all_gather_quantized<T: QuantFloat>(
        &self,
        input: &[T],
        output: &mut [T],
        q: Quant,
    ) -> Result<()> {
        let p = self.size();
        let n = input.len();
        let valid = q.validate();
        let sound = valid.is_ok() && n.checked_mul(p) == Some(output.len());
        let mut header = [0u64; FIELDS];
        header[BITS] = u64::from(q.bits);
        header[BLOCK] = q.block as u64;
        header[COUNT] = n as u64;
        header[FINITE] = u64::from(quant::all_finite(input));
        header[ALLOW] = u64::from(q.allow_nonfinite);
        header[SOUND] = u64::from(sound);
        let mut all = [0u64; FIELDS].repeat(p);
        self.all_gather(&header, &mut all)?;

        // Every rank reads the same headers and so reaches the same verdict.
        let unsound = ranks_where(&all, p, |h| h[SOUND] == 0);
        if !unsound.is_empty() {
            let mine = match valid {
                Err(e) => format!(" (here: {})", e.message()),
                Ok(()) if !sound => {
                    format!(" (here: output of {} elements for {n} x {p})", output.len())
                }
                Ok(()) => String::new(),
            };
            return Err(Error::invalid(format!(
                "all_gather_quantized: rank(s) {} passed unsound arguments (bits 8 or 4, a \
                 power-of-two block of 32…8192, an output of count × ranks elements){mine}",
                list(&unsound)
            )));
        }
        let differ = ranks_where(&all, p, |h| {
            h[BITS] != all[BITS]
                || h[BLOCK] != all[BLOCK]
                || h[COUNT] != all[COUNT]
                || h[ALLOW] != all[ALLOW]
        });
        if !differ.is_empty() {
            let show = |r: usize| {
                let h = &all[r * FIELDS..(r + 1) * FIELDS];
                format!(
                    "rank {r}: {} bits, block {}, count {}, nonfinite {}",
                    h[BITS],
                    h[BLOCK],
                    h[COUNT],
                    if h[ALLOW] == 1 { "allowed" } else { "refused" }
                )
            };
            return Err(Error::invalid(format!(
                "all_gather_quantized: the ranks disagree on the encoding or the count ({}; {}): \
                 every rank must pass the same bits, block, count and nonfinite choice",
                show(0),
                differ
                    .iter()
                    .map(|&r| show(r))
                    .collect::<Vec<_>>()
                    .join("; ")
            )));
        }
        let nonfinite = ranks_where(&all, p, |h| h[FINITE] == 0);
        if !nonfinite.is_empty() && !q.allow_nonfinite {
            return Err(Error::invalid(format!(
                "all_gather_quantized: the shard of rank(s) {} holds NaN or infinity, which \
                 block quantization cannot encode; nothing was sent (pass allow_nonfinite to \
                 send those blocks as NaN)",
                list(&nonfinite)
            )));
        }

        let words = q.record_bytes(n) / 8;
        let mut mine = alloc_words(words, "this rank's quantized shard")?;
        quant::quantize(&q, input, bytemuck::cast_slice_mut(&mut mine))?;
        let total = words
            .checked_mul(p)
            .ok_or_else(|| Error::invalid("the quantized records overflow the address space"))?;
        let mut records = alloc_words(total, "the quantized records")?;
        self.all_gather(&mine, &mut records)?;
        if n > 0 {
            for (r, out) in output.chunks_mut(n).enumerate() {
                let rec = &records[r * words..(r + 1) * words];
                quant::dequantize(&q, bytemuck::cast_slice(rec), out)?;
            }
        }
        Ok(())
    }
}
