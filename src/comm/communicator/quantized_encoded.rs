//! The queued quantized collectives encoded by the device's kernels: stream programs whose
//! kernels (`csrc/quant.cu`, bit-identical to the host's) encode on PCCL's stream, whose host
//! sections move only the records (the agreement read from their scales, then the exchange,
//! each numbered at the call), and whose kernels decode and sum after them. What crosses PCIe
//! is the quantized records, not the full-precision data, and the host neither encodes nor
//! decodes: the form used wherever the call's arguments are sound and the device's kernels
//! route its scheme (the all-gather; the reduce-scatter's one-hop and two-hop schemes). The
//! others (arguments the agreement must refuse, the halving scheme, the per-level scheme
//! where the topology has groups) take the host-encoded form of `quantized_queued`; both take
//! the same collective numbers and the same agreement, so ranks on either form meet.

use super::quantized_agreement::Mine;
use super::quantized_device::{arrange_units, decode_pieces, quantize_pieces, Decode};
use super::quantized_halving::QuantScheme;
use super::quantized_members::Hop;
use super::Communicator;
use crate::comm::device_program::{InCopy, OutCopy, Program};
use crate::device::api::{DevSpan, Device};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::{Quant, QuantFloat};
use crate::RawCollective;

/// Whether every block scale at the start of each of `pieces` records of `len` elements in
/// `recs` is a number (a NaN scale marks a block holding NaN or infinity).
pub(super) fn records_finite(q: &Quant, recs: &[u8], (pieces, len): (usize, usize)) -> bool {
    let (rb, sb) = (q.record_bytes(len), 4 * q.blocks(len));
    (0..pieces).all(|d| {
        recs[d * rb..d * rb + sb]
            .chunks_exact(4)
            .all(|s| !f32::from_le_bytes([s[0], s[1], s[2], s[3]]).is_nan())
    })
}

/// What a section of a call encoded by the device runs on the progress thread: the records
/// copied in, and the room for those copied out.
type RecordsRun = dyn FnOnce(&[u8], &mut [u8]) -> Result<()> + Send;

/// `n` times `unit`, or an error naming `what`.
fn times(n: usize, unit: usize, what: &str) -> Result<usize> {
    n.checked_mul(unit)
        .ok_or_else(|| Error::invalid(format!("{what} overflow the address space")))
}

/// A pinned buffer's `len` bytes at `at` as a slice.
///
/// # Safety
/// The buffer must hold `at + len` bytes, untouched by others while the slice lives.
unsafe fn bytes_at<'b>(b: *mut u8, at: usize, len: usize) -> &'b mut [u8] {
    // SAFETY: forwarded from the caller.
    unsafe { std::slice::from_raw_parts_mut(b.add(at), len) }
}

impl<D: Device> Program<'_, D> {
    /// Queues [`Communicator::all_gather_quantized`] of `count` elements of `T` per rank
    /// (device buffers `send`, `recv`; `q` valid and the buffers sound, checked at the call)
    /// encoded by the device: the shard encoded into device scratch, its record copied to a
    /// pinned buffer, the agreement (finite from the record's scales) and the records'
    /// all-gather on `comm` as its collectives `seqs` on the progress thread, every record
    /// copied back and decoded into `recv`.
    ///
    /// # Safety
    /// `send` must be device memory of the stream's device holding `count` elements of `T`
    /// and `recv` `count × size()`, until the program's end event completed.
    pub(crate) unsafe fn all_gather_quantized_encoded<T: QuantFloat>(
        &mut self,
        comm: Communicator,
        seqs: (u32, u32),
        (send, recv): (u64, u64),
        (count, q): (usize, Quant),
    ) -> Result<()> {
        let (p, n, dt) = (comm.size(), count, T::DTYPE);
        let call = "all_gather_quantized";
        let rb = q.record_bytes(n);
        let all = times(rb, p, "the quantized records")?;
        let eb = times(n, dt.size(), "the shard's bytes")?;
        let ord = self.own().ordinal();
        // SAFETY: the caller's buffers, of these lengths.
        let (input, output) = unsafe {
            (
                DevSpan::new(send, eb, ord)?,
                DevSpan::new(recv, times(eb, p, "the output's bytes")?, ord)?,
            )
        };
        let mine = self.device_scratch(rb)?;
        let records = self.device_scratch(all)?;
        // SAFETY: the caller's shard into our scratch, on the program's stream.
        unsafe { quantize_pieces(self.own(), (dt, &q), input, mine, (1, n))? };
        let what = format!("all_gather_quantized #{} ({count} x {dt})", seqs.0);
        let refusers = vec![(comm.handle(), seqs.0), (comm.handle(), seqs.1)];
        let run = move |mine: &[u8], recs: &mut [u8]| {
            let finite = records_finite(&q, mine, (1, n));
            let m = Mine::checked(call, q, (n, p), ("output", n * p), finite);
            comm.agree_quantized_as(m, seqs.0)?;
            // SAFETY: `mine` holds `rb` bytes and `recs` `rb × p`, distinct parts of the
            // buffer; records are whole words (`Quant::record_bytes`).
            unsafe {
                comm.host_collective_as::<u64>(
                    RawCollective::AllGather,
                    mine.as_ptr() as *const u64,
                    recs.as_mut_ptr() as *mut u64,
                    rb / 8,
                    seqs.1,
                )
            }
        };
        // SAFETY: our scratch, of these sizes, until the end event.
        unsafe {
            self.encoded_section(what, ((mine, rb), (records, all)), refusers, Box::new(run))?
        };
        // SAFETY: our records into the caller's output, a block per rank.
        unsafe { decode_pieces(self.own(), &q, records, output, (p, n), Decode::Blocks(dt)) }
    }

    /// Queues [`Communicator::reduce_scatter_quantized_with`] of `count` elements per rank
    /// (device buffers `send`: `count × size()` elements, `recv`: `count`; sound, checked at
    /// the call) for the one-hop and two-hop schemes, encoded by the device: per hop the
    /// pieces encoded into device scratch, their records copied to a pinned buffer and
    /// exchanged among the hop's members ([`Communicator::queued_hops`]; the first section
    /// runs the agreement `header` before), copied back, decoded and summed in `f32` in member
    /// order (the host form's order: the result is the host's bit for bit); the last sums
    /// converted into `recv`.
    ///
    /// # Safety
    /// `send` must be device memory of the stream's device holding `count × size()` elements
    /// of `T` and `recv` `count`, until the program's end event completed.
    pub(crate) unsafe fn reduce_scatter_quantized_encoded<T: QuantFloat>(
        &mut self,
        comm: Communicator,
        (header, hops): (u32, Vec<Hop>),
        (send, recv): (u64, u64),
        (count, (q, average, scheme)): (usize, (Quant, bool, QuantScheme)),
    ) -> Result<()> {
        let (p, n, dt) = (comm.size(), count, T::DTYPE);
        let call = "reduce_scatter_quantized";
        let eb = times(n, dt.size(), "the output's bytes")?;
        let ib = times(eb, p, "the input's bytes")?;
        let ord = self.own().ordinal();
        // SAFETY: the caller's buffers, of these lengths.
        let (input, output) =
            unsafe { (DevSpan::new(send, ib, ord)?, DevSpan::new(recv, eb, ord)?) };
        // The first hop's pieces in the host form's order.
        let mut payload = if hops.len() == 2 {
            let units = self.device_scratch(ib)?;
            // SAFETY: the caller's input into our scratch of the same size.
            unsafe { arrange_units(self.own(), comm.topology().nodes(), (input, units), eb)? };
            (units, dt)
        } else {
            (input, dt)
        };
        let what =
            |i: usize| format!("reduce_scatter_quantized #{header} ({count} x {dt}), hop {i}");
        for (i, hop) in hops.into_iter().enumerate() {
            let (src, sdt) = payload;
            let s = hop.0.len().max(1);
            let len = src.len() / sdt.size() / s;
            let rb = q.record_bytes(len);
            let total = times(rb, s, "the quantized pieces")?;
            let sent = self.device_scratch(total)?;
            let got = self.device_scratch(total)?;
            // SAFETY: the payload's pieces (the caller's input or our sums) into our records.
            unsafe { quantize_pieces(self.own(), (sdt, &q), src, sent, (s, len))? };
            let mut refusers = vec![(comm.handle(), hop.1)];
            if i == 0 {
                refusers.insert(0, (comm.handle(), header));
            }
            let c = comm.handle();
            let run = move |out: &[u8], inb: &mut [u8]| {
                if i == 0 {
                    let finite = records_finite(&q, out, (s, len));
                    let mut m = Mine::checked(call, q, (n, p), ("input", n * p), finite);
                    m.scheme = scheme;
                    c.agree_quantized_as(m, header)?;
                }
                c.all_to_all_among(&hop, out, inb)
            };
            // SAFETY: our scratch, of these sizes, until the end event.
            unsafe {
                self.encoded_section(
                    what(i),
                    ((sent, total), (got, total)),
                    refusers,
                    Box::new(run),
                )?
            };
            let acc = self.device_scratch(times(len, 4, "a hop's sums")?)?;
            // SAFETY: our records summed into our sums.
            unsafe { decode_pieces(self.own(), &q, got, acc, (s, len), Decode::Sum)? };
            payload = (acc, DType::F32);
        }
        if n > 0 {
            let mul = if average { 1.0 / p as f32 } else { 1.0 };
            // SAFETY: our sums (`n` of them after the last hop) into the caller's output.
            unsafe {
                self.own()
                    .convert_f32(dt, payload.0.sub(0, n * 4)?, output, mul)?
            };
        }
        Ok(())
    }

    /// The host section of a queued call encoded by the device: `from` (device scratch,
    /// bytes) copied to a pinned buffer, `run(those bytes, room)` on the progress thread, the
    /// room's bytes copied to `to`; every collective of `refusers` refused when it will not
    /// run.
    ///
    /// # Safety
    /// Both spans must be device memory of the stream's device, valid until the program's
    /// end event completed (`to` is written only when `run` succeeded).
    unsafe fn encoded_section(
        &mut self,
        what: String,
        ((from, ins), (to, outs)): ((DevSpan, usize), (DevSpan, usize)),
        refusers: Vec<(Communicator, u32)>,
        run: Box<RecordsRun>,
    ) -> Result<()> {
        let out_at = ins.next_multiple_of(8);
        let total = out_at
            .checked_add(outs)
            .ok_or_else(|| Error::invalid(format!("{what}: the records overflow")))?;
        let what2 = what.clone();
        let refuse = Box::new(move |e: Error| {
            for (c, seq) in &refusers {
                c.refuse_seq(*seq, &what2, e.clone());
            }
        });
        let run = Box::new(move |b: *mut u8| {
            // SAFETY: the pinned buffer holds `total` bytes: the records copied in at 0, the
            // room at `out_at`, disjoint; nothing else touches it while the section runs.
            let (i, o) = unsafe { (bytes_at(b, 0, ins), bytes_at(b, out_at, outs)) };
            run(i, o)
        });
        let d2h: Vec<InCopy> = (ins > 0)
            .then_some((from.addr(), ins, 0))
            .into_iter()
            .collect();
        let h2d: Vec<OutCopy> = (outs > 0)
            .then_some((out_at, to.addr(), outs))
            .into_iter()
            .collect();
        // SAFETY: forwarded from the caller.
        unsafe { self.section(what, total, &d2h, &h2d, run, refuse) }
    }
}
