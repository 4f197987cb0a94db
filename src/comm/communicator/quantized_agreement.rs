//! The agreement of a quantized call: before a byte of data moves, the ranks exchange one
//! small header each (bit width, block, count, whether the data is finite, whether the call's
//! arguments are sound), and every rank reaches the same verdict from the same headers: a
//! rank that disagrees, a bad argument or a NaN / infinity anywhere ends the call with the
//! same error on every rank, naming the ranks, and no rank falls out of step.

use super::quantized_halving::QuantScheme;
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
const SCHEME: usize = 6;
const FIELDS: usize = 7;

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

/// What a rank brings to a quantized call's agreement.
pub(super) struct Mine<'a> {
    pub(super) call: &'a str,
    q: Quant,
    count: usize,
    finite: bool,
    /// The arguments' problem on this rank (reported on every rank), if any.
    pub(super) unsound: Option<String>,
    /// The reduce-scatter's scheme (the all-gather's: the default).
    pub(super) scheme: QuantScheme,
}

impl<'a> Mine<'a> {
    /// The header this rank sends in the agreement.
    fn header(&self) -> [u64; FIELDS] {
        let mut h = [0u64; FIELDS];
        h[BITS] = u64::from(self.q.bits);
        h[BLOCK] = self.q.block as u64;
        h[COUNT] = self.count as u64;
        h[FINITE] = u64::from(self.finite);
        h[ALLOW] = u64::from(self.q.allow_nonfinite);
        h[SOUND] = u64::from(self.unsound.is_none());
        h[SCHEME] = self.scheme.code();
        h
    }

    /// This rank's part of `call` with `count` elements per rank: `q` checked, the buffer
    /// that holds every rank's block (`name`, `whole` elements) checked against `count × p`,
    /// the data that goes on the wire (`data`) checked for NaN and infinities.
    pub(super) fn of<T: QuantFloat>(
        call: &'a str,
        q: Quant,
        (count, p): (usize, usize),
        (name, whole): (&str, usize),
        data: &[T],
    ) -> Self {
        Self::checked(call, q, (count, p), (name, whole), quant::all_finite(data))
    }

    /// [`Mine::of`] with the data's finiteness found by the caller (device data: from the
    /// scales of its records).
    pub(super) fn checked(
        call: &'a str,
        q: Quant,
        (count, p): (usize, usize),
        (name, whole): (&str, usize),
        finite: bool,
    ) -> Self {
        let unsound = match q.validate() {
            Err(e) => Some(e.message().to_string()),
            Ok(()) if count.checked_mul(p) != Some(whole) => {
                Some(format!("{name} of {whole} elements for {count} x {p}"))
            }
            Ok(()) => None,
        };
        Mine {
            call,
            q,
            count,
            finite,
            unsound,
            scheme: QuantScheme::default(),
        }
    }
}

/// The verdict every rank reaches from the same headers `all` (`p` ranks' [`Mine::header`]):
/// an error naming the ranks (unsound arguments, a disagreement, NaN or infinity that may not
/// be sent), or go.
fn verdict(m: Mine<'_>, all: &[u64], p: usize) -> Result<()> {
    let call = m.call;
    // Every rank reads the same headers and so reaches the same verdict.
    let unsound = ranks_where(all, p, |h| h[SOUND] == 0);
    if !unsound.is_empty() {
        let here = m.unsound.map_or(String::new(), |w| format!(" (here: {w})"));
        return Err(Error::invalid(format!(
            "{call}: rank(s) {} passed unsound arguments (bits 8 or 4, a power-of-two \
             block of 32…8192, buffers of count and count × ranks elements){here}",
            list(&unsound)
        )));
    }
    let differ = ranks_where(all, p, |h| {
        h[BITS] != all[BITS]
            || h[BLOCK] != all[BLOCK]
            || h[COUNT] != all[COUNT]
            || h[ALLOW] != all[ALLOW]
            || h[SCHEME] != all[SCHEME]
    });
    if !differ.is_empty() {
        let show = |r: usize| {
            let h = &all[r * FIELDS..(r + 1) * FIELDS];
            format!(
                "rank {r}: {} bits, block {}, count {}, nonfinite {}, scheme {}",
                h[BITS],
                h[BLOCK],
                h[COUNT],
                if h[ALLOW] == 1 { "allowed" } else { "refused" },
                match h[SCHEME] {
                    1 => "halving",
                    2 => "per-level",
                    _ => "two-hop",
                }
            )
        };
        return Err(Error::invalid(format!(
            "{call}: the ranks disagree on the encoding or the count ({}; {}): every rank \
             must pass the same bits, block, count, nonfinite choice and scheme",
            show(0),
            differ
                .iter()
                .map(|&r| show(r))
                .collect::<Vec<_>>()
                .join("; ")
        )));
    }
    let nonfinite = ranks_where(all, p, |h| h[FINITE] == 0);
    if !nonfinite.is_empty() && !m.q.allow_nonfinite {
        return Err(Error::invalid(format!(
            "{call}: the data of rank(s) {} holds NaN or infinity, which block \
             quantization cannot encode; nothing was sent (pass allow_nonfinite to send \
             those blocks as NaN)",
            list(&nonfinite)
        )));
    }
    Ok(())
}

impl Communicator {
    /// The header exchange of a quantized call: every rank learns every rank's encoding,
    /// count, finiteness and soundness, and all reach the same verdict (an error naming the
    /// ranks, or go) before any data moves.
    pub(super) fn agree_quantized(&self, m: Mine<'_>) -> Result<()> {
        let mut all = [0u64; FIELDS].repeat(self.size());
        self.all_gather(&m.header(), &mut all)?;
        verdict(m, &all, self.size())
    }

    /// [`Communicator::agree_quantized`] as collective `seq`, numbered when the call was
    /// queued (the host part of a queued device call).
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(super) fn agree_quantized_as(&self, m: Mine<'_>, seq: u32) -> Result<()> {
        let p = self.size();
        let header = m.header();
        let mut all = [0u64; FIELDS].repeat(p);
        // SAFETY: `header` holds FIELDS words and `all` FIELDS × p, distinct buffers.
        unsafe {
            self.host_collective_as::<u64>(
                crate::RawCollective::AllGather,
                header.as_ptr(),
                all.as_mut_ptr(),
                FIELDS,
                seq,
            )?
        };
        verdict(m, &all, p)
    }
}
