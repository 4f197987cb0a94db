//! Quantized collectives (ZeRO++'s qwZ and qgZ). The all-gather: each rank encodes its shard
//! once ([`crate::quant`]: INT8 or INT4, one `f32` scale per block), every plan of the
//! communicator's all-gather (flat, hierarchical, overlapped; the tuner's or `PCCL_ALGO`'s)
//! moves the records, and every rank decodes them into the output's type. The
//! reduce-scatter: quantized all-to-alls, inside the node then between nodes, partial sums
//! in `f32` in between (see [`Communicator::reduce_scatter_quantized`]).
//!
//! Before a byte of data moves, the ranks agree (`quantized_agreement`): a rank that
//! disagrees, a bad argument or a NaN / infinity anywhere ends the call with the same error on
//! every rank, naming the ranks, and no rank falls out of step.

use super::quantized_agreement::Mine;
use super::quantized_halving::QuantScheme;
use super::Communicator;
use crate::error::{Error, Result};
use crate::quant::{self, Quant, QuantFloat};

pub(super) fn alloc_words(n: usize, what: &str) -> Result<Vec<u64>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| Error::system(format!("cannot allocate {n} words for {what}")))?;
    v.resize(n, 0);
    Ok(v)
}

/// This rank's shard encoded (`words` words), and room for every rank's record.
pub(super) fn encode_shard<T: QuantFloat>(
    q: &Quant,
    input: &[T],
    p: usize,
) -> Result<(Vec<u64>, Vec<u64>, usize)> {
    let words = q.record_bytes(input.len()) / 8;
    let mut mine = alloc_words(words, "this rank's quantized shard")?;
    quant::quantize(q, input, bytemuck::cast_slice_mut(&mut mine))?;
    let total = words
        .checked_mul(p)
        .ok_or_else(|| Error::invalid("the quantized records overflow the address space"))?;
    let records = alloc_words(total, "the quantized records")?;
    Ok((mine, records, words))
}

/// Every rank's record (`words` words each) decoded into its block of `n` elements.
pub(super) fn decode_all<T: QuantFloat>(
    q: &Quant,
    records: &[u64],
    words: usize,
    output: &mut [T],
    n: usize,
) -> Result<()> {
    if n > 0 {
        for (r, out) in output.chunks_mut(n).enumerate() {
            let rec = &records[r * words..(r + 1) * words];
            quant::dequantize(q, bytemuck::cast_slice(rec), out)?;
        }
    }
    Ok(())
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
        let call = "all_gather_quantized";
        self.agree_quantized(Mine::of(call, q, (n, p), ("output", output.len()), input))?;
        let (mine, mut records, words) = encode_shard(&q, input, p)?;
        self.all_gather(&mine, &mut records)?;
        decode_all(&q, &records, words, output, n)
    }

    /// Reduce-scatter (sum, or average with `average`) with the data quantized on the wire
    /// (ZeRO++'s qgZ): `input` holds `output.len() × size()` elements, block `r` for rank
    /// `r`; `output` gets this rank's block summed over every rank. On nodes of equal size
    /// with more than one node and more than one rank each it takes two hops: inside the node
    /// an all-to-all of quantized pieces (each rank's share for the ranks of its local index
    /// on every node), dequantized and summed in `f32`, requantized; then between the nodes an
    /// all-to-all of those partial sums among the ranks of one local index, dequantized and
    /// summed. Otherwise one all-to-all of quantized blocks. Error bound per element: half a
    /// step of every quantized piece it passed through — `Σ_ranks s₁/2 + Σ_nodes s₂/2`, `s₁`
    /// the step of the contributor's block (its max ÷ 127, or ÷ 7 for INT4), `s₂` the step of
    /// the node's partial-sum block; one hop: `Σ_ranks s₁/2`. Same refusals as
    /// [`Self::all_gather_quantized`] (NaN, disagreement, bad arguments: every rank, named).
    pub fn reduce_scatter_quantized<T: QuantFloat>(
        &self,
        input: &[T],
        output: &mut [T],
        q: Quant,
        average: bool,
    ) -> Result<()> {
        self.reduce_scatter_quantized_with(input, output, q, average, QuantScheme::TwoHop)
    }

    /// [`Communicator::reduce_scatter_quantized`] with the scheme `scheme` (every rank must
    /// pass the same; a rank that does not fails the call on every rank, named).
    /// [`QuantScheme::PerLevel`]: one quantized all-to-all per level of the topology (group,
    /// node, network; routing proven in `crate::plan::two_hop`), error bound per element
    /// `Σ_ranks s₁/2 + Σ_groups s₂/2 + Σ_nodes s₃/2`, one term per hop's quantized pieces.
    /// [`QuantScheme::Halving`]: recursive halving inside the node, then between nodes, every
    /// partial sum quantized on the wire; error bound per element `Σ_steps s/2`, `s` the step
    /// of each quantized partial sum it received (one per halving step, `log2 M + log2 N`,
    /// plus one per level whose member count is not a power of two), sums in `f32`.
    pub fn reduce_scatter_quantized_with<T: QuantFloat>(
        &self,
        input: &[T],
        output: &mut [T],
        q: Quant,
        average: bool,
        scheme: QuantScheme,
    ) -> Result<()> {
        let p = self.size();
        let n = output.len();
        let call = "reduce_scatter_quantized";
        let mut mine = Mine::of(call, q, (n, p), ("input", input.len()), input);
        mine.scheme = scheme;
        self.agree_quantized(mine)?;
        if scheme == QuantScheme::Halving {
            let mut sum = self.halving_sum(input, n, q)?;
            if average {
                let k = 1.0 / p as f32;
                sum.iter_mut().for_each(|v| *v *= k);
            }
            T::from_f32_slice(&sum, output);
            return Ok(());
        }
        let topo = self.topology();
        let nodes = topo.nodes();
        let two_hops = crate::plan::two_hop::applies(nodes);
        let per_level = match (scheme, topo.levels()) {
            (QuantScheme::PerLevel, Some(radices)) if p > 1 => Some(radices),
            _ => None,
        };
        let mut sum = if let Some(radices) = per_level {
            let order = crate::plan::two_hop::level_order(nodes, &radices);
            let mut payload = alloc_f32(p * n, "this rank's input")?;
            for (i, &r) in order.iter().enumerate() {
                T::to_f32_slice(&input[r * n..(r + 1) * n], &mut payload[i * n..(i + 1) * n]);
            }
            self.with_per_level(&radices, |comms| {
                for c in comms {
                    let len = payload.len() / c.size();
                    payload = quantized_hop(c.size(), &payload, len, q, |s, r| c.all_to_all(s, r))?;
                }
                Ok(())
            })?;
            payload
        } else if two_hops {
            let payload = node_units(input, nodes, n)?;
            self.with_levels(|intra, inter| {
                let (m, nn) = (intra.size(), inter.size());
                let partial = quantized_hop(m, &payload, nn * n, q, |s, r| intra.all_to_all(s, r))?;
                // Hop 2: to node k, the partial sum of its rank of this local index.
                quantized_hop(nn, &partial, n, q, |s, r| inter.all_to_all(s, r))
            })?
        } else {
            let mut payload = alloc_f32(p * n, "this rank's input")?;
            T::to_f32_slice(input, &mut payload);
            quantized_hop(p, &payload, n, q, |s, r| self.all_to_all(s, r))?
        };
        if average {
            let k = 1.0 / p as f32;
            sum.iter_mut().for_each(|v| *v *= k);
        }
        T::from_f32_slice(&sum, output);
        Ok(())
    }

    /// Runs `f` on the node's and the network's sub-communicators (ranks of this node by
    /// local index; ranks of this local index by node), split on first use — every rank
    /// reaches this in the same call, after the agreement.
    pub(super) fn with_levels<R>(
        &self,
        f: impl FnOnce(&Communicator, &Communicator) -> Result<R>,
    ) -> Result<R> {
        let mut l = super::lock(&self.inner.levels);
        if l.is_none() {
            let (node, local) = self.topology().position(self.rank());
            let missing = || Error::internal("a split with this rank's colour left it out");
            let intra = self
                .split(Some(node as u32), local as i32)?
                .ok_or_else(missing)?;
            let inter = self
                .split(Some(local as u32), node as i32)?
                .ok_or_else(missing)?;
            *l = Some((intra, inter));
        }
        let (intra, inter) = l.as_ref().expect("split above");
        f(intra, inter)
    }
}

impl Communicator {
    /// Runs `f` on the sub-communicators of the per-level scheme, innermost level first
    /// (`crate::plan::two_hop::hop_levels`): at level `l`, the ranks whose coordinates differ
    /// only at `l`, ordered by it. Split on first use (every rank reaches this in the same
    /// call, after the agreement).
    fn with_per_level<R>(
        &self,
        radices: &[usize],
        f: impl FnOnce(&[Communicator]) -> Result<R>,
    ) -> Result<R> {
        use crate::plan::two_hop::{coords, hop_levels};
        let mut l = super::lock(&self.inner.per_level);
        if l.is_none() {
            let c = coords(self.topology().nodes(), radices, self.rank());
            let mut comms = Vec::new();
            for level in hop_levels(radices) {
                // The colour: the other coordinates, as one mixed-radix number.
                let colour = radices
                    .iter()
                    .zip(&c)
                    .enumerate()
                    .filter(|&(i, _)| i != level)
                    .fold(0u64, |acc, (_, (&r, &d))| acc * r as u64 + d as u64);
                let colour = u32::try_from(colour)
                    .map_err(|_| Error::internal("a per-level colour overflows u32"))?;
                let sub = self.split(Some(colour), c[level] as i32)?.ok_or_else(|| {
                    Error::internal("a split with this rank's colour left it out")
                })?;
                comms.push(sub);
            }
            *l = Some(comms);
        }
        f(l.as_deref().unwrap_or(&[]))
    }
}

/// `n` floats, or an error naming what they were for.
pub(super) fn alloc_f32(n: usize, what: &str) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| Error::system(format!("cannot allocate {n} floats for {what}")))?;
    v.resize(n, 0.0);
    Ok(v)
}

/// `input` (block `r` for rank `r`, `n` each) in `f32`, arranged as the first level inside
/// the node sends it: unit `j` holds the blocks of the ranks of local index `j` on every
/// node, in node order (the routing `crate::plan::two_hop` proves; the network level's member
/// order). Nodes of one size.
pub(super) fn node_units<T: QuantFloat>(
    input: &[T],
    nodes: &[Vec<usize>],
    n: usize,
) -> Result<Vec<f32>> {
    let (nn, m) = (nodes.len(), nodes.first().map_or(0, Vec::len));
    let mut payload = alloc_f32(m * nn * n, "the node's first level")?;
    for j in 0..m {
        for (k, r) in crate::plan::two_hop::hop1_piece(nodes, j)
            .into_iter()
            .enumerate()
        {
            let at = (j * nn + k) * n;
            T::to_f32_slice(&input[r * n..(r + 1) * n], &mut payload[at..at + n]);
        }
    }
    Ok(payload)
}

/// One quantized all-to-all among `s` members: `payload` holds `s` pieces of `len` f32
/// values (piece `d` for member `d`); each is quantized, `exchange(send, recv)` moves them
/// (record `d` of `send` to member `d`, member `d`'s into record `d` of `recv`), and the
/// pieces this rank receives are dequantized and summed in f32.
pub(super) fn quantized_hop(
    s: usize,
    payload: &[f32],
    len: usize,
    q: Quant,
    exchange: impl FnOnce(&[u64], &mut [u64]) -> Result<()>,
) -> Result<Vec<f32>> {
    let words = q.record_bytes(len) / 8;
    let total = words
        .checked_mul(s)
        .ok_or_else(|| Error::invalid("the quantized records overflow the address space"))?;
    let mut send = alloc_words(total, "the quantized pieces")?;
    for d in 0..s {
        let rec = bytemuck::cast_slice_mut(&mut send[d * words..(d + 1) * words]);
        quant::quantize(&q, &payload[d * len..(d + 1) * len], rec)?;
    }
    let mut recv = alloc_words(total, "the quantized pieces received")?;
    exchange(&send, &mut recv)?;
    let mut sum = alloc_f32(len, "a hop's sum")?;
    let mut piece = alloc_f32(len, "a received piece")?;
    for d in 0..s {
        let rec = bytemuck::cast_slice(&recv[d * words..(d + 1) * words]);
        quant::dequantize(&q, rec, &mut piece)?;
        for (a, b) in sum.iter_mut().zip(&piece) {
            *a += b;
        }
    }
    Ok(sum)
}
