//! The quantized collectives on device memory, any [`Device`] back end: the same encoding,
//! agreement and routing as the host forms ([`super::quantized`]), with the encoding and the
//! decoding done by the device's kernels (`csrc/quant.cu`, bit-identical to the host's) and
//! the records moved by the device collectives ([`Communicator::collective_on`],
//! [`Communicator::enqueue_rooted_on`]).
//!
//! A call blocks the host: each rank encodes its data first and reads back the blocks' scales
//! (NaN marks a block holding NaN or infinity) so that every rank knows, before any record
//! moves, whether every rank's data can be encoded. Everything else stays on the device.

use super::quantized_agreement::Mine;
use super::quantized_halving::QuantScheme;
use super::Communicator;
use crate::device::api::{Batch, DevSpan, Device};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::{Quant, QuantFloat};
use crate::{RawCollective, RawRooted};

/// `n` elements of `T` as bytes, or an error naming `what`.
fn bytes_of<T>(n: usize, what: &str) -> Result<usize> {
    n.checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| Error::invalid(format!("{what}: {n} elements overflow the address space")))
}

/// Device memory of `bytes` bytes (zeroed) and its exact span.
fn scratch<D: Device>(dev: &D, bytes: usize) -> Result<(D::Memory, DevSpan)> {
    let mem = dev.alloc_zeroed(bytes)?;
    let span = dev.span_of(&mem).sub(0, bytes)?;
    Ok((mem, span))
}

/// Encodes `pieces` consecutive pieces of `len` elements of `dtype` at `src` into as many
/// records at `recs` (each [`Quant::record_bytes`]`(len)`), reads their scales back and
/// returns whether every block was finite (no NaN scale). Blocks the host.
///
/// # Safety
/// The spans must be device memory of `dev` valid for the pieces and records.
unsafe fn encode_pieces<D: Device>(
    dev: &D,
    (dtype, q): (DType, &Quant),
    src: DevSpan,
    recs: DevSpan,
    (pieces, len): (usize, usize),
) -> Result<bool> {
    // SAFETY: forwarded from the caller.
    unsafe { quantize_pieces(dev, (dtype, q), src, recs, (pieces, len))? };
    let rb = q.record_bytes(len);
    let sb = 4 * q.blocks(len);
    let mut scales = vec![0u8; sb * pieces];
    for d in 0..pieces {
        // SAFETY: `scales` holds `sb` bytes at `d * sb` and outlives the synchronisation
        // below.
        unsafe { dev.copy_dtoh(None, scales[d * sb..].as_mut_ptr(), recs.sub(d * rb, sb)?)? };
    }
    dev.synchronize()?;
    Ok(scales
        .chunks_exact(4)
        .all(|s| !f32::from_le_bytes([s[0], s[1], s[2], s[3]]).is_nan()))
}

/// Queues the encoding of `pieces` consecutive pieces of `len` elements of `dtype` at `src`
/// into as many records at `recs` (each [`Quant::record_bytes`]`(len)`), on `dev`'s stream.
///
/// # Safety
/// The spans must be device memory of `dev` valid for the pieces and records.
pub(super) unsafe fn quantize_pieces<D: Device>(
    dev: &D,
    (dtype, q): (DType, &Quant),
    src: DevSpan,
    recs: DevSpan,
    (pieces, len): (usize, usize),
) -> Result<()> {
    let (rb, eb) = (q.record_bytes(len), len * dtype.size());
    for d in (0..pieces).filter(|_| len > 0) {
        // SAFETY: forwarded from the caller; the spans are cut inside theirs.
        unsafe { dev.quantize(dtype, q, src.sub(d * eb, eb)?, recs.sub(d * rb, rb)?)? };
    }
    Ok(())
}

/// How [`decode_pieces`] writes what it decodes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Decode {
    /// Record `d` into block `d`, as elements of the type given.
    Blocks(DType),
    /// Every record added, in member order, into `f32` sums that hold zeros already.
    AddToZeros,
    /// Every record summed in member order into `f32` sums, the first written, not added.
    Sum,
}

/// Queues the decoding of `pieces` records of `len` elements at `recs` into `dst` as `how`
/// says, on `dev`'s stream (sums in the host form's order: its result bit for bit).
///
/// # Safety
/// The spans must be device memory of `dev` valid for the records and what `how` writes.
pub(super) unsafe fn decode_pieces<D: Device>(
    dev: &D,
    q: &Quant,
    recs: DevSpan,
    dst: DevSpan,
    (pieces, len): (usize, usize),
    how: Decode,
) -> Result<()> {
    if pieces == 0 || len == 0 {
        return Ok(());
    }
    // One launch for every record (an all-gather has one per rank).
    let recs = recs.sub(0, pieces * q.record_bytes(len))?;
    let (dtype, dst, batch) = match how {
        Decode::Blocks(dt) => (dt, dst.sub(0, pieces * len * dt.size())?, Batch::Store),
        Decode::AddToZeros => (DType::F32, dst, Batch::Sum { add_first: true }),
        Decode::Sum => (DType::F32, dst, Batch::Sum { add_first: false }),
    };
    // SAFETY: forwarded from the caller; the spans are cut inside theirs.
    unsafe { dev.dequantize_batch(dtype, q, recs, dst, (pieces, batch)) }
}

/// Queues the copies that arrange `input` (block `r` for rank `r`, `eb` bytes each) into
/// `units` in the order the two-hop scheme's first hop sends it: unit `j` holds the blocks
/// of the ranks of local index `j` on every node, in node order (the host form's
/// arrangement, `crate::plan::two_hop::hop1_piece`).
///
/// # Safety
/// The spans must be device memory of `dev` holding every rank's block.
pub(super) unsafe fn arrange_units<D: Device>(
    dev: &D,
    nodes: &[Vec<usize>],
    (input, units): (DevSpan, DevSpan),
    eb: usize,
) -> Result<()> {
    let nn = nodes.len();
    for j in 0..nodes.first().map_or(0, Vec::len) {
        for (k, r) in crate::plan::two_hop::hop1_piece(nodes, j)
            .into_iter()
            .enumerate()
        {
            // SAFETY: block `r` of the input into slot (j, k) of the units.
            unsafe { dev.copy_dtod(units.sub((j * nn + k) * eb, eb)?, input.sub(r * eb, eb)?)? };
        }
    }
    Ok(())
}

/// What a rank prepared before the agreement: its scratch, and whether its data encodes.
struct Prepared<D: Device> {
    finite: bool,
    /// The scratch buffers, freed when the call ends (after the device has finished).
    held: Vec<D::Memory>,
    spans: Vec<DevSpan>,
}

impl Communicator {
    /// Runs `prepare` (checks, scratch, encoding: no rank waits on another), takes part in the
    /// agreement of a quantized call with what it found (its error, if any, becomes this
    /// rank's unsound arguments: every rank then fails alike), then runs `exchange`; an error
    /// there revokes the communicator so that the peers fail at once instead of waiting.
    fn device_quantized<D: Device>(
        &self,
        dev: &D,
        mine: impl FnOnce(bool) -> Mine<'static>,
        prepare: impl FnOnce() -> Result<Prepared<D>>,
        exchange: impl FnOnce(&[DevSpan]) -> Result<()>,
    ) -> Result<()> {
        let prepared = prepare();
        let finite = prepared.as_ref().map_or(true, |p| p.finite);
        let mut m = mine(finite);
        if let (Err(e), None) = (&prepared, &m.unsound) {
            m.unsound = Some(e.message().to_string());
        }
        let call = m.call;
        self.agree_quantized(m)?;
        let prepared = prepared?;
        let ran = exchange(&prepared.spans).and_then(|()| dev.synchronize());
        if let Err(e) = &ran {
            self.inner_transport().abort(&format!(
                "its {call} on device memory failed: {}",
                e.message()
            ));
        }
        drop(prepared.held);
        ran
    }

    /// [`Communicator::all_gather_quantized`] on device memory of `dev` (CUDA or HIP):
    /// `send` holds `count` elements of `T`, `recv` `recv_elems`, which must be `count ×
    /// size()` (checked in the agreement: a rank whose buffer does not fit fails the call on
    /// every rank). Ordered after the work queued on `dev`'s stream; returns when the result
    /// is in `recv` (it blocks the host: every rank learns whether every rank's data is
    /// finite before any record moves). The encoding is the host's, bit for bit. Same
    /// refusals as the host form, on every rank.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of `dev` valid for those counts, not
    /// overlapping, untouched by other work until the call returns.
    pub unsafe fn all_gather_quantized_on<T: QuantFloat, D: Device>(
        &self,
        dev: &D,
        (send, recv): (u64, u64),
        (count, recv_elems): (usize, usize),
        q: Quant,
    ) -> Result<()> {
        let (p, n, dt) = (self.size(), count, T::DTYPE);
        // A bad encoding (a block of 0) has no record size: the agreement refuses it.
        let rb = if q.validate().is_ok() {
            q.record_bytes(n)
        } else {
            0
        };
        let call = "all_gather_quantized";
        let prepare = || -> Result<Prepared<D>> {
            q.validate()?;
            let eb = bytes_of::<T>(n, call)?;
            let ob = eb
                .checked_mul(p)
                .ok_or_else(|| Error::invalid(format!("{call}: the output overflows")))?;
            let all = rb.checked_mul(p).ok_or_else(|| {
                Error::invalid("the quantized records overflow the address space")
            })?;
            // SAFETY: the caller's buffers, of these lengths.
            let (input, output) = unsafe {
                (
                    DevSpan::new(send, eb, dev.ordinal())?,
                    DevSpan::new(recv, ob, dev.ordinal())?,
                )
            };
            let (m1, mine) = scratch(dev, rb)?;
            let (m2, records) = scratch(dev, all)?;
            // SAFETY: `input` is the caller's, `mine` ours.
            let finite = unsafe { encode_pieces(dev, (dt, &q), input, mine, (1, n))? };
            Ok(Prepared {
                finite,
                held: vec![m1, m2],
                spans: vec![output, mine, records],
            })
        };
        let exchange = |s: &[DevSpan]| -> Result<()> {
            let (output, mine, records) = (s[0], s[1], s[2]);
            if n == 0 {
                return Ok(());
            }
            // SAFETY: both records are our scratch, of `rb` and `p × rb` bytes.
            unsafe {
                self.collective_on::<u64, D>(
                    dev,
                    RawCollective::AllGather,
                    mine.addr(),
                    records.addr(),
                    rb / 8,
                )?
            };
            // SAFETY: our records into the caller's output, a block per rank.
            unsafe { decode_pieces(dev, &q, records, output, (p, n), Decode::Blocks(dt)) }
        };
        let mine = |finite| Mine::checked(call, q, (n, p), ("output", recv_elems), finite);
        self.device_quantized(dev, mine, prepare, exchange)
    }

    /// [`Communicator::reduce_scatter_quantized`] (the two-hop scheme) on device memory of
    /// `dev`: `send` holds `send_elems` elements of `T` (which must be `count × size()`,
    /// checked as the all-gather checks its output), `recv` `count`. Partial sums in
    /// `f32` on the device, added in the host form's order, so the result is the host's bit
    /// for bit. The halving scheme and the per-level scheme where the topology has groups
    /// run the host form on host copies of the buffers (`reduce_scatter_quantized_staged`).
    /// Blocks the host as [`Communicator::all_gather_quantized_on`] does.
    ///
    /// # Safety
    /// As [`Communicator::all_gather_quantized_on`].
    pub unsafe fn reduce_scatter_quantized_on<T: QuantFloat, D: Device>(
        &self,
        dev: &D,
        (send, recv): (u64, u64),
        (count, send_elems): (usize, usize),
        (q, average, scheme): (Quant, bool, QuantScheme),
    ) -> Result<()> {
        let (p, n, dt) = (self.size(), count, T::DTYPE);
        let call = "reduce_scatter_quantized";
        if scheme == QuantScheme::Halving
            || (scheme == QuantScheme::PerLevel && self.topology().has_groups())
        {
            // SAFETY: forwarded from the caller.
            return unsafe {
                self.reduce_scatter_quantized_staged::<T, D>(
                    dev,
                    (send, recv),
                    (count, send_elems),
                    (q, average, scheme),
                )
            };
        }
        let nodes = self.topology().nodes().to_vec();
        let two_hops = crate::plan::two_hop::applies(&nodes);
        let (nn, m) = (nodes.len(), nodes.first().map_or(0, Vec::len));
        // The first hop: `s1` pieces of `len1` elements (to the node's ranks, or to all).
        let (s1, len1) = if two_hops { (m, nn * n) } else { (p, n) };
        let valid = q.validate().is_ok();
        let rb = |len: usize| if valid { q.record_bytes(len) } else { 0 };
        let (rb1, rb2) = (rb(len1), rb(n));
        let prepare = || -> Result<Prepared<D>> {
            q.validate()?;
            let eb = bytes_of::<T>(n, call)?;
            let ib = eb
                .checked_mul(p)
                .ok_or_else(|| Error::invalid(format!("{call}: the input overflows")))?;
            // SAFETY: the caller's buffers, of these lengths.
            let (input, output) = unsafe {
                (
                    DevSpan::new(send, ib, dev.ordinal())?,
                    DevSpan::new(recv, eb, dev.ordinal())?,
                )
            };
            let mut held = Vec::new();
            let mut take = |bytes: usize| -> Result<DevSpan> {
                let (mem, span) = scratch(dev, bytes)?;
                held.push(mem);
                Ok(span)
            };
            let over = || Error::invalid("the quantized pieces overflow the address space");
            // The first hop's pieces in order: unit j holds the blocks of the ranks of local
            // index j on every node, in node order (as the host form arranges them).
            let units = if two_hops {
                let units = take(ib)?;
                // SAFETY: the caller's input into our scratch of the same size.
                unsafe { arrange_units(dev, &nodes, (input, units), eb)? };
                units
            } else {
                input
            };
            let send1 = take(rb1.checked_mul(s1).ok_or_else(over)?)?;
            let recv1 = take(rb1.checked_mul(s1).ok_or_else(over)?)?;
            let acc1 = take(len1.checked_mul(4).ok_or_else(over)?)?;
            let (send2, recv2, acc2) = if two_hops {
                let b = rb2.checked_mul(nn).ok_or_else(over)?;
                (take(b)?, take(b)?, take(n * 4)?)
            } else {
                (acc1, acc1, acc1)
            };
            // SAFETY: `units` (the input, or our copy of it) and our records.
            let finite = unsafe { encode_pieces(dev, (dt, &q), units, send1, (s1, len1))? };
            Ok(Prepared {
                finite,
                held,
                spans: vec![output, send1, recv1, acc1, send2, recv2, acc2],
            })
        };
        let exchange = |s: &[DevSpan]| -> Result<()> {
            let [output, send1, recv1, acc1, send2, recv2, acc2] = s
                .try_into()
                .map_err(|_| Error::internal("quantized reduce-scatter: scratch spans missing"))?;
            if n == 0 {
                return Ok(());
            }
            let sum = if two_hops {
                self.with_levels(|intra, inter| {
                    device_hop(intra, dev, &q, (send1, recv1, acc1), (s1, len1))?;
                    // Hop 2: to node k, the partial sum of its rank of this local index.
                    // SAFETY: our scratch, `nn` pieces of `n` sums into `nn` records.
                    unsafe {
                        for k in 0..nn {
                            let piece = acc1.sub(k * n * 4, n * 4)?;
                            dev.quantize(DType::F32, &q, piece, send2.sub(k * rb2, rb2)?)?;
                        }
                    }
                    device_hop(inter, dev, &q, (send2, recv2, acc2), (nn, n))
                })?;
                acc2
            } else {
                device_hop(self, dev, &q, (send1, recv1, acc1), (s1, len1))?;
                acc1
            };
            let mul = if average { 1.0 / p as f32 } else { 1.0 };
            // SAFETY: our sums into the caller's output.
            unsafe { dev.convert_f32(dt, sum, output, mul) }
        };
        let mine = |finite| {
            let mut m = Mine::checked(call, q, (n, p), ("input", send_elems), finite);
            m.scheme = scheme;
            m
        };
        self.device_quantized(dev, mine, prepare, exchange)
    }
}

impl Communicator {
    /// [`Communicator::reduce_scatter_quantized_on`] by the host form on host copies of the
    /// device buffers (the schemes the device's kernels do not route: halving, per level with
    /// groups): the input copied down, [`Communicator::reduce_scatter_quantized_with`], the
    /// result copied up. A rank whose buffers cannot be copied or held still takes part in
    /// the agreement, so the call fails on every rank, naming it.
    ///
    /// # Safety
    /// As [`Communicator::reduce_scatter_quantized_on`].
    unsafe fn reduce_scatter_quantized_staged<T: QuantFloat, D: Device>(
        &self,
        dev: &D,
        (send, recv): (u64, u64),
        (count, send_elems): (usize, usize),
        (q, average, scheme): (Quant, bool, QuantScheme),
    ) -> Result<()> {
        let call = "reduce_scatter_quantized";
        let mut mine = Mine::checked(call, q, (count, self.size()), ("input", send_elems), true);
        mine.scheme = scheme;
        let staged = || -> Result<(Vec<T>, Vec<T>, DevSpan)> {
            let (ib, ob) = (
                bytes_of::<T>(send_elems, call)?,
                bytes_of::<T>(count, call)?,
            );
            // SAFETY: the caller's buffers, of these lengths.
            let (input, output) = unsafe {
                (
                    DevSpan::new(send, ib, dev.ordinal())?,
                    DevSpan::new(recv, ob, dev.ordinal())?,
                )
            };
            let zeros = |n: usize, what: &str| -> Result<Vec<T>> {
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| {
                    Error::system(format!(
                        "{call}: cannot hold {n} elements of {what} on the host"
                    ))
                })?;
                v.resize(n, T::from_f32(0.0));
                Ok(v)
            };
            let mut host_in = zeros(send_elems, "the input")?;
            dev.synchronize()?;
            // SAFETY: `host_in` holds `ib` bytes; the copy completes before the sync returns.
            unsafe { dev.copy_dtoh(None, host_in.as_mut_ptr() as *mut u8, input)? };
            dev.synchronize()?;
            Ok((host_in, zeros(count, "the output")?, output))
        };
        let (input, mut output, out_span) = match mine.unsound.is_none().then(staged) {
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                mine.unsound = Some(e.message().to_string());
                return self.agree_quantized(mine);
            }
            None => return self.agree_quantized(mine),
        };
        self.reduce_scatter_quantized_with(&input, &mut output, q, average, scheme)?;
        // SAFETY: `output` holds the span's bytes until the sync below.
        unsafe { dev.copy_htod(out_span, output.as_ptr() as *const u8)? };
        dev.synchronize()
    }
}

/// One quantized all-to-all on `comm` on the device: `records` (send, receive: `s` records
/// of `len` elements each) exchanged, every received one decoded and added, in member order,
/// into the zeroed `f32` sums `acc` (`len` of them).
fn device_hop<D: Device>(
    comm: &Communicator,
    dev: &D,
    q: &Quant,
    (send, recv, acc): (DevSpan, DevSpan, DevSpan),
    (s, len): (usize, usize),
) -> Result<()> {
    let rb = q.record_bytes(len);
    // SAFETY: our scratch: `s` records each way.
    unsafe {
        comm.enqueue_rooted_on::<u64, D>(
            dev,
            RawRooted::AllToAll,
            send.addr(),
            recv.addr(),
            rb / 8,
        )?;
        decode_pieces(dev, q, recv, acc, (s, len), Decode::AddToZeros)?;
    }
    Ok(())
}
