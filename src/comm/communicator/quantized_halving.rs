//! The quantized reduce-scatter by recursive halving ([`QuantScheme::Halving`]): recursive
//! halving inside the node, then between nodes, every message a quantized partial sum —
//! `log2 M + log2 N` messages per rank instead of the two-hop scheme's `(M − 1) + (N − 1)`,
//! about as many bytes (routing: `crate::plan::halving`, proven there for 1–64 members).

use super::quantized::{alloc_f32, node_units};
use super::Communicator;
use crate::error::Result;
use crate::plan::halving::{route, Role};
use crate::quant::{self, Quant, QuantFloat};

/// How a quantized reduce-scatter moves its partial sums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QuantScheme {
    /// ZeRO++'s qgZ: a quantized all-to-all inside the node, then one among the ranks of a
    /// local index across nodes (`N − 1` messages per rank between nodes).
    #[default]
    TwoHop,
    /// Recursive halving inside the node, then between nodes, each partial sum quantized on
    /// the wire (`log2 M + log2 N` messages per rank, about as many bytes); with one node,
    /// one rank per node or nodes of unequal size, recursive halving over every rank.
    Halving,
    /// One quantized all-to-all per level of the topology, innermost first: inside the
    /// group (a GPU pair, a NUMA node: `PCCL_GROUP_SIZE`), among the node's groups, then
    /// between nodes — a third hop where the topology has groups, so the slower links inside
    /// the node carry `1/g` of the data (one more requantization: its half step joins the
    /// error bound). Without groups, exactly [`QuantScheme::TwoHop`].
    PerLevel,
}

impl QuantScheme {
    /// The scheme's code in the agreement header.
    pub(super) fn code(self) -> u64 {
        match self {
            QuantScheme::TwoHop => 0,
            QuantScheme::Halving => 1,
            QuantScheme::PerLevel => 2,
        }
    }
}

/// The blocks `ids` (of `n` floats each) of `data`, packed in order.
fn pack(data: &[f32], ids: &[usize], n: usize) -> Result<Vec<f32>> {
    let mut v = alloc_f32(ids.len() * n, "a halving message")?;
    for (i, &b) in ids.iter().enumerate() {
        v[i * n..(i + 1) * n].copy_from_slice(&data[b * n..(b + 1) * n]);
    }
    Ok(v)
}

/// Moves one message each way between this member and others: `out` (member, bytes) sent and
/// `inb` (member, room) received, both at once (partners exchange without deadlock); either
/// may be absent. A blocking call passes its sub-communicator's group send and receive
/// ([`pair_on`]), a queued one the members' messages on the parent's transport.
pub(super) type Pair<'p> = dyn FnMut(Out<'_>, In<'_>) -> Result<()> + 'p;

/// A [`Pair`]'s message out: the member and the bytes.
pub(super) type Out<'b> = Option<(usize, &'b [u8])>;

/// A [`Pair`]'s message in: the member and the room for exactly its bytes.
pub(super) type In<'b> = Option<(usize, &'b mut [u8])>;

/// [`Pair`] on `comm`: a group of one send and one receive.
pub(super) fn pair_on(comm: &Communicator) -> impl FnMut(Out<'_>, In<'_>) -> Result<()> + '_ {
    move |out, inb| {
        let mut g = comm.group_start();
        if let Some((to, b)) = out {
            g.send(b, to);
        }
        if let Some((from, b)) = inb {
            g.recv(b, from);
        }
        g.end()
    }
}

/// Sends `vals` quantized to `to` and receives `from`'s quantized message of `len` floats,
/// both at once through `pair`; `to` or `from` may be absent.
fn exchange(
    pair: &mut Pair<'_>,
    q: Quant,
    out: Option<(usize, &[f32])>,
    inb: Option<(usize, usize)>,
) -> Result<Option<Vec<f32>>> {
    let mut send = Vec::new();
    if let Some((_, vals)) = out {
        send = vec![0u64; q.record_bytes(vals.len()) / 8];
        quant::quantize(&q, vals, bytemuck::cast_slice_mut(&mut send))?;
    }
    let mut recv = vec![0u64; inb.map_or(0, |(_, len)| q.record_bytes(len) / 8)];
    pair(
        out.map(|(to, _)| (to, bytemuck::cast_slice(&send))),
        inb.map(|(from, _)| (from, bytemuck::cast_slice_mut(&mut recv))),
    )?;
    match inb {
        None => Ok(None),
        Some((_, len)) => {
            let mut vals = alloc_f32(len, "a received partial sum")?;
            quant::dequantize(&q, bytemuck::cast_slice(&recv), &mut vals)?;
            Ok(Some(vals))
        }
    }
}

/// Adds `vals` (blocks `ids` of `n`, packed) into `data`.
fn add_blocks(data: &mut [f32], ids: &[usize], n: usize, vals: &[f32]) {
    for (i, &b) in ids.iter().enumerate() {
        for (a, v) in data[b * n..(b + 1) * n]
            .iter_mut()
            .zip(&vals[i * n..(i + 1) * n])
        {
            *a += v;
        }
    }
}

/// Recursive halving among `s` members, this one `me`, over `data` (one block of `n` floats
/// per member, this member's contribution), messages moved by `pair`; returns the sum of
/// every member's block `me`. Every message is quantized with `q`, except the final block
/// handed back to an extra member (exact: it adds no error). Each ordered pair of members
/// exchanges at most one message (the routing's partners differ at every step).
pub(super) fn halving(
    (s, me): (usize, usize),
    mut data: Vec<f32>,
    n: usize,
    q: Quant,
    pair: &mut Pair<'_>,
) -> Result<Vec<f32>> {
    match route(s, me) {
        Role::Extra { core } => {
            exchange(pair, q, Some((core, &data)), None)?;
            let mut mine = alloc_f32(n, "this rank's block")?;
            pair(None, Some((core, bytemuck::cast_slice_mut(&mut mine))))?;
            Ok(mine)
        }
        Role::Core { extra, steps } => {
            if let Some(e) = extra {
                let all: Vec<usize> = (0..s).collect();
                if let Some(vals) = exchange(pair, q, None, Some((e, s * n)))? {
                    add_blocks(&mut data, &all, n, &vals);
                }
            }
            for x in &steps {
                let out = pack(&data, &x.send, n)?;
                let got = exchange(
                    pair,
                    q,
                    Some((x.partner, &out)),
                    Some((x.partner, x.recv.len() * n)),
                )?;
                if let Some(vals) = got {
                    add_blocks(&mut data, &x.recv, n, &vals);
                }
            }
            if let Some(e) = extra {
                pair(
                    Some((e, bytemuck::cast_slice(&data[e * n..(e + 1) * n]))),
                    None,
                )?;
            }
            Ok(data[me * n..(me + 1) * n].to_vec())
        }
    }
}

impl Communicator {
    /// The halving scheme of [`Communicator::reduce_scatter_quantized_with`] on `input` (block
    /// `r` for rank `r`, `n` each): the sum of every rank's block `rank()`, in `f32`. The input
    /// is converted once, straight into the order the first level sends it in.
    pub(super) fn halving_sum<T: QuantFloat>(
        &self,
        input: &[T],
        n: usize,
        q: Quant,
    ) -> Result<Vec<f32>> {
        let topo = self.topology();
        let nodes = topo.nodes();
        if !crate::plan::two_hop::applies(nodes) {
            let mut all = alloc_f32(input.len(), "this rank's input")?;
            T::to_f32_slice(input, &mut all);
            return halving((self.size(), self.rank()), all, n, q, &mut pair_on(self));
        }
        let payload = node_units(input, nodes, n)?;
        let nn = nodes.len();
        self.with_levels(|intra, inter| {
            let at = |c: &Communicator| (c.size(), c.rank());
            let partial = halving(at(intra), payload, nn * n, q, &mut pair_on(intra))?;
            halving(at(inter), partial, n, q, &mut pair_on(inter))
        })
    }
}
