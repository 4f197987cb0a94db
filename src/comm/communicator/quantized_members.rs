//! The hops of a queued quantized reduce-scatter, run among groups of this communicator's
//! ranks on its own transport — the ranks of this node, those of this local index on every
//! node, the members of one level — each hop a collective number taken at the call.
//!
//! A blocking call splits sub-communicators for its hops on first use. A queued call cannot:
//! a split is a collective of its own that waits for the peers, and a queued call must not
//! block its caller. Addressing the members on the parent's transport needs nothing from the
//! peers beforehand, so every scheme (two hops, per level, halving) queues, the first call
//! included. The routing and its proofs are the blocking forms' (`crate::plan::two_hop`,
//! `crate::plan::halving`); only the way messages travel differs.

use super::quantized::{alloc_f32, node_units, quantized_hop};
use super::quantized_halving::{halving, In, Out, QuantScheme};
use super::Communicator;
use crate::error::{Error, Result};
use crate::exec::executor::abandon;
use crate::plan::two_hop;
use crate::quant::{Quant, QuantFloat};
use crate::transport::faults::{fingerprint, stamp, Tag};
use crate::transport::SendOp;
use std::time::Instant;

/// One hop: the ranks of this communicator taking part, in the hop's member order (this
/// rank among them), and the collective number it runs as.
pub(crate) type Hop = (Vec<usize>, u32);

/// The fingerprint kind of a hop's messages (all-to-all; the halving scheme's pairwise
/// messages are a sparse all-to-all too).
const KIND_ALL_TO_ALL: u32 = 11;

impl Communicator {
    /// The hops of a queued quantized reduce-scatter of `scheme`, innermost first, each with
    /// a collective number taken now. Every rank takes as many numbers whatever scheme it
    /// passed (the most any scheme needs on this topology, which every rank agreed on), so a
    /// disagreement the header exchange refuses leaves the numbering in step.
    pub(crate) fn queued_hops(&self, scheme: QuantScheme) -> Vec<Hop> {
        let members = self.hop_members(scheme);
        let tags = self
            .topology()
            .levels()
            .map_or(2, |radices| radices.len())
            .max(2);
        let seqs: Vec<u32> = (0..tags.max(members.len()))
            .map(|_| self.take_tag())
            .collect();
        members.into_iter().zip(seqs).collect()
    }

    /// The members of each hop of `scheme`, innermost first: with the per-level scheme the
    /// ranks whose coordinates differ only at the level, ordered by it (the blocking form's
    /// split); with two levels the ranks of this node by local index, then the ranks of
    /// this local index by node; otherwise every rank.
    fn hop_members(&self, scheme: QuantScheme) -> Vec<Vec<usize>> {
        let topo = self.topology();
        let (nodes, me, p) = (topo.nodes(), self.rank(), self.size());
        if let (QuantScheme::PerLevel, Some(radices)) = (scheme, topo.levels()) {
            let all: Vec<Vec<usize>> = (0..p)
                .map(|r| two_hop::coords(nodes, &radices, r))
                .collect();
            return two_hop::hop_levels(&radices)
                .into_iter()
                .map(|level| {
                    let mut m: Vec<usize> = (0..p)
                        .filter(|&r| {
                            (0..radices.len()).all(|l| l == level || all[r][l] == all[me][l])
                        })
                        .collect();
                    m.sort_by_key(|&r| all[r][level]);
                    m
                })
                .collect();
        }
        if two_hop::applies(nodes) {
            let (node, local) = topo.position(me);
            return vec![
                nodes[node].clone(),
                nodes.iter().map(|members| members[local]).collect(),
            ];
        }
        vec![(0..p).collect()]
    }

    /// `input` (block `r` for rank `r`, `n` elements each) in `f32`, in the order the first
    /// hop of `scheme` sends it (as the blocking form arranges it).
    fn hop_payload<T: QuantFloat>(
        &self,
        scheme: QuantScheme,
        input: &[T],
        n: usize,
    ) -> Result<Vec<f32>> {
        let topo = self.topology();
        let nodes = topo.nodes();
        if let (QuantScheme::PerLevel, Some(radices)) = (scheme, topo.levels()) {
            let mut payload = alloc_f32(input.len(), "this rank's input")?;
            for (i, &r) in two_hop::level_order(nodes, &radices).iter().enumerate() {
                T::to_f32_slice(&input[r * n..(r + 1) * n], &mut payload[i * n..(i + 1) * n]);
            }
            return Ok(payload);
        }
        if two_hop::applies(nodes) {
            return node_units(input, nodes, n);
        }
        let mut payload = alloc_f32(input.len(), "this rank's input")?;
        T::to_f32_slice(input, &mut payload);
        Ok(payload)
    }

    /// The sum over every rank of block `rank()` of `input` (`n` elements per block), in
    /// `f32`, by `scheme`'s hops `hops` ([`Communicator::queued_hops`]): the host part of
    /// a queued quantized reduce-scatter, after the agreement.
    pub(crate) fn hops_sum<T: QuantFloat>(
        &self,
        scheme: QuantScheme,
        input: &[T],
        n: usize,
        q: Quant,
        hops: &[Hop],
    ) -> Result<Vec<f32>> {
        let mut payload = self.hop_payload(scheme, input, n)?;
        for hop in hops {
            let s = hop.0.len();
            let me = hop
                .0
                .iter()
                .position(|&r| r == self.rank())
                .ok_or_else(|| {
                    Error::internal("a quantized reduce-scatter hop left this rank out")
                })?;
            let len = payload.len() / s;
            payload = if scheme == QuantScheme::Halving {
                let mut pair = |out: Out<'_>, inb: In<'_>| self.pair_among(hop, out, inb);
                halving((s, me), payload, len, q, &mut pair)?
            } else {
                quantized_hop(s, &payload, len, q, |send, recv| {
                    let recv = bytemuck::cast_slice_mut(recv);
                    self.all_to_all_among(hop, bytemuck::cast_slice(send), recv)
                })?
            };
        }
        Ok(payload)
    }

    /// The stamp of hop `hop`'s messages of `bytes` bytes each way (its members' count and
    /// the sizes in the fingerprint: members that disagree fail instead of pairing).
    fn hop_tag(&self, hop: &Hop, bytes: usize) -> Tag {
        stamp(
            hop.1,
            fingerprint(KIND_ALL_TO_ALL, 0, 0, &[hop.0.len() as u64, bytes as u64]),
        )
    }

    /// An all-to-all among `hop`'s members on this communicator's transport: `send` holds one
    /// record per member (in member order, equal sizes), `recv` (as long) gets member `d`'s
    /// record for this rank at record `d`. A failure is made known to every member.
    pub(super) fn all_to_all_among(&self, hop: &Hop, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let members = &hop.0;
        let s = members.len();
        let me = self.rank();
        let at = members.iter().position(|&r| r == me).unwrap_or(0);
        let bytes = send.len() / s.max(1);
        if recv.len() != send.len() {
            return Err(Error::internal(
                "a hop's receive room differs from what it sends",
            ));
        }
        recv[at * bytes..(at + 1) * bytes].copy_from_slice(&send[at * bytes..(at + 1) * bytes]);
        let tr = self.inner_transport();
        let tag = self.hop_tag(hop, bytes);
        let deadline = Instant::now() + self.timeout();
        let r = (|| -> Result<()> {
            tr.faults().check(tag, me)?;
            let mut sends: Vec<Box<dyn SendOp>> = Vec::with_capacity(s);
            let mut first = None;
            // Sends to the members after this one first, receives in the same rotation:
            // every member starts on a different peer.
            for k in 1..s {
                let d = (at + k) % s;
                // SAFETY: `send` outlives every posted send: all are waited for below.
                match unsafe { tr.isend(members[d], tag, send[d * bytes..].as_ptr(), bytes) } {
                    Ok(op) => sends.push(op),
                    Err(e) => {
                        first = Some(e);
                        break;
                    }
                }
            }
            if first.is_none() {
                for k in 1..s {
                    let d = (at + s - k) % s;
                    let dst = &mut recv[d * bytes..(d + 1) * bytes];
                    if let Err(e) = tr.recv_into(members[d], tag, dst, deadline) {
                        first = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = &first {
                abandon(tr.as_ref(), tag, e);
            }
            for op in sends {
                if let Err(e) = op.wait(deadline) {
                    first.get_or_insert(e);
                }
            }
            first.map_or(Ok(()), Err)
        })();
        if let Err(e) = &r {
            abandon(tr.as_ref(), tag, e);
        }
        r
    }

    /// One message each way between this rank and members of `hop` (by member index) on
    /// this communicator's transport (the halving scheme's [`super::quantized_halving::Pair`]):
    /// the send posted first, so partners exchanging at once do not wait on each other.
    fn pair_among(&self, hop: &Hop, out: Out<'_>, inb: In<'_>) -> Result<()> {
        let tr = self.inner_transport();
        let me = self.rank();
        // The halving routing sends every ordered pair of members at most one message per
        // hop, so the hop's number alone tells them apart.
        let tag = self.hop_tag(hop, 0);
        let deadline = Instant::now() + self.timeout();
        let member = |i: usize| {
            hop.0.get(i).copied().ok_or_else(|| {
                Error::internal(format!("halving: member {i} of a hop of {}", hop.0.len()))
            })
        };
        let r = (|| -> Result<()> {
            tr.faults().check(tag, me)?;
            let sent = match out {
                // SAFETY: `b` outlives the send: it is waited for below on every path.
                Some((to, b)) => Some(unsafe { tr.isend(member(to)?, tag, b.as_ptr(), b.len())? }),
                None => None,
            };
            let got = match inb {
                Some((from, b)) => tr.recv_into(member(from)?, tag, b, deadline),
                None => Ok(()),
            };
            if let Err(e) = &got {
                abandon(tr.as_ref(), tag, e);
            }
            let sent = sent.map_or(Ok(()), |op| op.wait(deadline));
            got.and(sent)
        })();
        if let Err(e) = &r {
            abandon(tr.as_ref(), tag, e);
        }
        r
    }
}
