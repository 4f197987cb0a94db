//! The quantized collectives on device memory queued on the caller's stream (NCCL's and
//! torch's semantics): stream programs (`comm::device_program`) with every collective numbered
//! at the call (the agreement's header exchange, the records' all-gather, each reduce-scatter
//! hop's exchange). Where the arguments are sound and the device's kernels route the scheme,
//! the kernels encode and decode on PCCL's stream and only the records cross to the host
//! (`quantized_encoded`); otherwise (and with `PCCL_QUANT_ENCODE=host`) the host section here
//! copies the caller's data to pinned host memory, runs the host form there and copies the
//! result back. Nothing here waits for the device or a peer; a refusal met while running is
//! the communicator's asynchronous error. The blocking forms are in `quantized_device`; the
//! host parts the host-encoded sections run (`Communicator::all_gather_quantized_as`,
//! `reduce_scatter_quantized_as`) are here, after them.

use super::quantized::{decode_all, encode_shard};
use super::quantized_agreement::Mine;
use super::quantized_halving::QuantScheme;
use super::quantized_members::Hop;
use super::Communicator;
use crate::comm::device_program::{InCopy, OutCopy, Program};
use crate::comm::device_queue::Kind;
use crate::comm::nccl_level::NcclLevel;
use crate::device::api::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::{Quant, QuantFloat};

/// Whether this process's queued quantized calls encode on the host even where the device's
/// kernels could (`PCCL_QUANT_ENCODE=host`; `device`, the default, lets them): to compare the
/// two forms, or to keep the kernels out of the way. Read once. Ranks may differ: the forms
/// take the same collective numbers and agreement.
fn encode_on_host() -> bool {
    static HOST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HOST.get_or_init(|| {
        std::env::var("PCCL_QUANT_ENCODE").is_ok_and(|v| v.trim().eq_ignore_ascii_case("host"))
    })
}

impl<D: Device> Program<'_, D> {
    /// Queues [`Communicator::all_gather_quantized`] of `count` elements of `T` per rank
    /// (device buffers `send` and `recv`) as a host section on `comm` as its collectives
    /// `seqs` (the header exchange, then the records), both taken at the call: the shard
    /// copied to a pinned buffer, encoded, exchanged and decoded there by the host's kernels
    /// (bit-identical to the device's), every rank's block copied to `recv`. `unsound`: this
    /// rank's arguments' problem, found at the call; the agreement then fails the call on
    /// every rank, naming it. A refusal (NaN, a disagreeing rank) is then the communicator's
    /// asynchronous error: `recv` is not written and the stream stays held.
    ///
    /// # Safety
    /// `send` must be device memory of the stream's device holding `count` elements of `T`
    /// and, unless `unsound`, `recv` `count × size()`, until the program's end event
    /// completed.
    pub(crate) unsafe fn all_gather_quantized<T: QuantFloat>(
        &mut self,
        comm: Communicator,
        seqs: (u32, u32),
        (send, recv): (u64, u64),
        (count, q): (usize, Quant),
        unsound: Option<String>,
    ) -> Result<()> {
        let p = comm.size();
        let what = format!("all_gather_quantized #{} ({count} x {})", seqs.0, T::DTYPE);
        let refusers = vec![(comm.handle(), seqs.0), (comm.handle(), seqs.1)];
        let run = move |input: *mut u8, output: *mut u8| {
            // SAFETY: the pinned buffer holds the shard at `input` and room for every rank's
            // block at `output` (sized by `quantized_section`), not reused before the end.
            let (input, output) = unsafe {
                (
                    std::slice::from_raw_parts(input as *const T, count),
                    std::slice::from_raw_parts_mut(output as *mut T, count * p),
                )
            };
            comm.all_gather_quantized_as::<T>(input, output, q, seqs, unsound)
        };
        // SAFETY: forwarded from the caller.
        unsafe {
            self.quantized_section::<T>(what, (send, count), (recv, count * p), refusers, run)
        }
    }

    /// Queues [`Communicator::reduce_scatter_quantized_with`] of `count` elements per rank
    /// (device buffers `send`: `count × size()` elements, `recv`: `count`) as a host section,
    /// as [`Program::all_gather_quantized`] does: the header exchange on `comm` as its
    /// collective `header`, then each hop among its members as the collective taken with it
    /// ([`Communicator::queued_hops`]).
    ///
    /// # Safety
    /// As [`Program::all_gather_quantized`], for `count × size()` elements at `send` and
    /// `count` at `recv`.
    pub(crate) unsafe fn reduce_scatter_quantized<T: QuantFloat>(
        &mut self,
        comm: Communicator,
        (header, hops): (u32, Vec<Hop>),
        (send, recv): (u64, u64),
        (count, how): (usize, (Quant, bool, QuantScheme)),
        unsound: Option<String>,
    ) -> Result<()> {
        let p = comm.size();
        let what = format!(
            "reduce_scatter_quantized #{header} ({count} x {})",
            T::DTYPE
        );
        let refusers: Vec<(Communicator, u32)> = std::iter::once(header)
            .chain(hops.iter().map(|h| h.1))
            .map(|seq| (comm.handle(), seq))
            .collect();
        let run = move |input: *mut u8, output: *mut u8| {
            // SAFETY: the pinned buffer holds every rank's block at `input` and room for the
            // result at `output` (sized by `quantized_section`), not reused before the end.
            let (input, output) = unsafe {
                (
                    std::slice::from_raw_parts(input as *const T, count * p),
                    std::slice::from_raw_parts_mut(output as *mut T, count),
                )
            };
            comm.reduce_scatter_quantized_as::<T>(input, output, how, header, &hops, unsound)
        };
        // SAFETY: forwarded from the caller.
        unsafe {
            self.quantized_section::<T>(what, (send, count * p), (recv, count), refusers, run)
        }
    }

    /// The host section of a queued quantized call: `ins` elements of `T` at `send` copied to
    /// a pinned buffer, `run(input, output)` on the progress thread with the pinned input and
    /// room for `outs` elements after it, those copied to `recv`; every collective of
    /// `refusers` refused when it will not run.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of the stream's device holding `ins` and
    /// `outs` elements of `T` until the program's end event completed (`recv` is written
    /// only when `run` succeeded).
    unsafe fn quantized_section<T: QuantFloat>(
        &mut self,
        what: String,
        (send, ins): (u64, usize),
        (recv, outs): (u64, usize),
        refusers: Vec<(Communicator, u32)>,
        run: impl FnOnce(*mut u8, *mut u8) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let bytes = |n: usize| n.checked_mul(std::mem::size_of::<T>());
        let (Some(ib), Some(ob)) = (bytes(ins), bytes(outs)) else {
            return Err(Error::invalid(format!("{what}: the buffers overflow")));
        };
        let out_at = ib.next_multiple_of(8);
        let total = out_at
            .checked_add(ob)
            .ok_or_else(|| Error::invalid(format!("{what}: the buffers overflow")))?;
        let what2 = what.clone();
        let refuse = Box::new(move |e: Error| {
            for (c, seq) in &refusers {
                c.refuse_seq(*seq, &what2, e.clone());
            }
        });
        let run = Box::new(move |b: *mut u8| {
            // SAFETY: the pinned buffer holds `total >= out_at` bytes.
            let out = unsafe { b.add(out_at) };
            run(b, out)
        });
        let d2h: Vec<InCopy> = (ib > 0).then_some((send, ib, 0)).into_iter().collect();
        let h2d: Vec<OutCopy> = (ob > 0).then_some((out_at, recv, ob)).into_iter().collect();
        // SAFETY: forwarded from the caller.
        unsafe { self.section(what, total, &d2h, &h2d, run, refuse) }
    }
}

impl Communicator {
    /// [`Communicator::all_gather_quantized_on`] ordered on `dev`'s stream without blocking
    /// the caller, as [`Communicator::enqueue_on`] orders a collective: on PCCL's stream of
    /// the device, after the work queued on `dev`'s stream, which then waits (an event) for
    /// its end. The shard is encoded by the device's kernels (or, with unsound arguments or
    /// `PCCL_QUANT_ENCODE=host`, copied to pinned memory and encoded by the host's,
    /// bit-identical), the ranks' headers and records exchanged on the progress thread, and
    /// every record decoded into `recv`. Nothing here waits
    /// for the device or a peer. A refusal met while running (NaN or infinity in a rank's
    /// shard, a rank that disagrees or passed an unsound buffer) is the same error on every
    /// rank, found before any record moves, and is then this communicator's asynchronous
    /// error (NCCL's): `recv` is not written, the stream stays held and every later device
    /// call fails with it until the communicator is aborted. Where calls are not queued
    /// (`PCCL_DEVICE_ASYNC=0`, ranks sharing a GPU, one rank) it is
    /// [`Communicator::all_gather_quantized_on`].
    ///
    /// # Safety
    /// As [`Communicator::all_gather_quantized_on`], until `dev`'s stream has passed the call.
    pub unsafe fn enqueue_all_gather_quantized_on<T: QuantFloat, D: Device>(
        &self,
        dev: &D,
        (send, recv): (u64, u64),
        (count, recv_elems): (usize, usize),
        q: Quant,
    ) -> Result<()> {
        let call = "all_gather_quantized";
        let blocking = |comm: &Communicator| {
            // SAFETY: forwarded from the caller.
            unsafe {
                comm.all_gather_quantized_on::<T, D>(dev, (send, recv), (count, recv_elems), q)
            }
        };
        if self.size() == 1 {
            return blocking(self);
        }
        let p = self.size();
        let unsound = Mine::checked(call, q, (count, p), ("output", recv_elems), true).unsound;
        let build = |prog: &mut Program<'_, D>, seq: u32| {
            // The records' exchange is a collective of its own, numbered now as the header
            // exchange was, so that calls made meanwhile keep every rank's numbering.
            let records = self.take_tag();
            if unsound.is_none() && !encode_on_host() {
                // SAFETY: forwarded from the caller: sound buffers, valid until the
                // program's end.
                return unsafe {
                    prog.all_gather_quantized_encoded::<T>(
                        self.handle(),
                        (seq, records),
                        (send, recv),
                        (count, q),
                    )
                }
                .map(|()| true);
            }
            // SAFETY: forwarded from the caller: the buffers stay valid until the program's
            // end; `recv` is never written (this rank's arguments are unsound).
            unsafe {
                prog.all_gather_quantized::<T>(
                    self.handle(),
                    (seq, records),
                    (send, recv),
                    (count, q),
                    unsound,
                )
            }
            .map(|()| false)
        };
        self.queue_quantized(dev, (call, count, T::DTYPE), build, blocking)
    }

    /// [`Communicator::reduce_scatter_quantized_on`] ordered on `dev`'s stream without
    /// blocking the caller, as [`Communicator::enqueue_all_gather_quantized_on`] is: the
    /// header exchange and each hop numbered at the call; encoded by the device's kernels for
    /// the one-hop and two-hop schemes, by the host's (bit-identical) for the halving scheme
    /// and the per-level one with groups. Every scheme queues, the first call included: the
    /// hops address their members on this communicator's transport (`quantized_members`)
    /// instead of splitting sub-communicators. It blocks instead (it is
    /// [`Communicator::reduce_scatter_quantized_on`]) only where calls are not queued.
    ///
    /// # Safety
    /// As [`Communicator::reduce_scatter_quantized_on`], until `dev`'s stream has passed the
    /// call.
    pub unsafe fn enqueue_reduce_scatter_quantized_on<T: QuantFloat, D: Device>(
        &self,
        dev: &D,
        (send, recv): (u64, u64),
        (count, send_elems): (usize, usize),
        (q, average, scheme): (Quant, bool, QuantScheme),
    ) -> Result<()> {
        let call = "reduce_scatter_quantized";
        let how = (q, average, scheme);
        let blocking = |comm: &Communicator| {
            // SAFETY: forwarded from the caller.
            unsafe {
                comm.reduce_scatter_quantized_on::<T, D>(
                    dev,
                    (send, recv),
                    (count, send_elems),
                    how,
                )
            }
        };
        if self.size() == 1 {
            return blocking(self);
        }
        let p = self.size();
        let mut mine = Mine::checked(call, q, (count, p), ("input", send_elems), true);
        let topo = self.topology();
        // The schemes the device's kernels route (their hops and pieces those of the blocking
        // device form); the others are encoded on the host.
        let encodable = scheme == QuantScheme::TwoHop
            || (scheme == QuantScheme::PerLevel
                && !topo.has_groups()
                && crate::plan::two_hop::applies(topo.nodes()));
        let build = |prog: &mut Program<'_, D>, seq: u32| {
            let hops = self.queued_hops(scheme);
            if encodable && mine.unsound.is_none() && !encode_on_host() {
                // SAFETY: forwarded from the caller: sound buffers, valid until the program's
                // end.
                return unsafe {
                    prog.reduce_scatter_quantized_encoded::<T>(
                        self.handle(),
                        (seq, hops),
                        (send, recv),
                        (count, how),
                    )
                }
                .map(|()| true);
            }
            // SAFETY: forwarded from the caller: the buffers stay valid until the program's
            // end; `recv` is written only when every rank's arguments were sound.
            unsafe {
                prog.reduce_scatter_quantized::<T>(
                    self.handle(),
                    (seq, hops),
                    (send, recv),
                    (count, how),
                    mine.unsound.take(),
                )
            }
            .map(|()| false)
        };
        self.queue_quantized(dev, (call, count, T::DTYPE), build, blocking)
    }

    /// Queues the program of quantized call `call` (`count` elements of `dtype` per rank) on
    /// PCCL's stream of `dev`'s device after `dev`'s stream, which then waits for its end:
    /// `build` adds its kernels and host sections given the call's (first) collective number
    /// and says whether the device encodes; `blocking` runs it instead where calls are not
    /// queued. A stream capturing a graph is refused on
    /// every rank.
    fn queue_quantized<D: Device>(
        &self,
        dev: &D,
        (call, count, dtype): (&str, usize, DType),
        build: impl FnOnce(&mut Program<'_, D>, u32) -> Result<bool>,
        blocking: impl FnOnce(&Communicator) -> Result<()>,
    ) -> Result<()> {
        self.refuse_capture(dev, call)?;
        let what = |seq: u32| format!("{call} #{seq} ({count} x {dtype})");
        let on_device = std::cell::Cell::new(false);
        let path = |_: Option<&NcclLevel<D>>| {
            let by = if on_device.get() { "device" } else { "host" };
            format!("host-staged records, encoded by the {by}")
        };
        let build = |prog: &mut Program<'_, D>, _: Option<&mut NcclLevel<D>>, _: &D, seq| {
            build(prog, seq).map(|d| on_device.set(d))
        };
        let end = self.queue_program(dev, Kind::Collective, &what, path, build, blocking)?;
        if let Some(end) = end {
            dev.wait_on(&end)?;
        }
        Ok(())
    }

    /// [`Communicator::all_gather_quantized`] as the collectives `seqs` (the header
    /// exchange, then the records), taken when the call was queued: the host part of a
    /// queued device call, run on the progress thread on pinned copies of the caller's
    /// buffers (`comm::device_program`). `unsound`: this rank's arguments' problem found
    /// when the call was queued (its agreement header says so). A refusal (NaN, a
    /// disagreeing rank, unsound arguments) is the same error on every rank, found before the
    /// records move.
    pub(crate) fn all_gather_quantized_as<T: QuantFloat>(
        &self,
        input: &[T],
        output: &mut [T],
        q: Quant,
        seqs: (u32, u32),
        unsound: Option<String>,
    ) -> Result<()> {
        let (p, n) = (self.size(), input.len());
        let call = "all_gather_quantized";
        let mut m = Mine::of(call, q, (n, p), ("output", output.len()), input);
        if unsound.is_some() {
            m.unsound = unsound;
        }
        self.agree_quantized_as(m, seqs.0)?;
        let (mine, mut records, words) = encode_shard(&q, input, p)?;
        // SAFETY: `mine` holds `words` words and `records` `words × p`, distinct buffers.
        unsafe {
            self.host_collective_as::<u64>(
                crate::RawCollective::AllGather,
                mine.as_ptr(),
                records.as_mut_ptr(),
                words,
                seqs.1,
            )?
        };
        decode_all(&q, &records, words, output, n)
    }

    /// [`Communicator::reduce_scatter_quantized_with`] as collectives numbered when the call
    /// was queued: the header exchange `header` on this communicator, then the scheme's hops
    /// among their members ([`Communicator::queued_hops`]); the host part of a queued device
    /// call, as [`Communicator::all_gather_quantized_as`].
    pub(crate) fn reduce_scatter_quantized_as<T: QuantFloat>(
        &self,
        input: &[T],
        output: &mut [T],
        (q, average, scheme): (Quant, bool, QuantScheme),
        header: u32,
        hops: &[Hop],
        unsound: Option<String>,
    ) -> Result<()> {
        let (p, n) = (self.size(), output.len());
        let call = "reduce_scatter_quantized";
        let mut m = Mine::of(call, q, (n, p), ("input", input.len()), input);
        m.scheme = scheme;
        if unsound.is_some() {
            m.unsound = unsound;
        }
        self.agree_quantized_as(m, header)?;
        let mut sum = self.hops_sum(scheme, input, n, q, hops)?;
        if average {
            let k = 1.0 / p as f32;
            sum.iter_mut().for_each(|v| *v *= k);
        }
        T::from_f32_slice(&sum, output);
        Ok(())
    }
}
