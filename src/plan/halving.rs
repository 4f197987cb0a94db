//! The routing of a reduce-scatter by recursive halving on any member count, as the
//! quantized reduce-scatter's network level runs it (`Communicator::reduce_scatter_quantized_with`,
//! `QuantScheme::Halving`): `s` members, each with one block per member; member `r` ends with
//! the sum of every member's block `r`.
//!
//! With `q` the largest power of two ≤ `s`, the `s − q` "extra" members `q..s` first hand
//! their whole vector to member `r − q` (which adds it) and take no further part until their
//! own block comes back. Block `b` is then owned by core member `b mod q`; at each of the
//! `log2 q` steps a core member exchanges with `me ^ d` (d = q/2, q/4, …, 1) the blocks owned
//! by the partner's half of the current range and keeps those of its own half. Each message
//! carries a partial sum over a disjoint set of members: [`prove`] checks, symbolically, that
//! every member's block ends holding every member's contribution exactly once.

use crate::error::{Error, Result};

/// One exchange of a core member: send the blocks `send` to `partner`, receive its partial
/// sums of the blocks `recv` (in the same order on both sides) and add them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// The other member.
    pub partner: usize,
    /// Blocks sent (the partner's half), ascending.
    pub send: Vec<usize>,
    /// Blocks received and added (this member's half), ascending.
    pub recv: Vec<usize>,
}

/// What one member does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// An extra member: sends every block to `core`, then receives its own block's sum from it.
    Extra {
        /// The core member that stands in for it.
        core: usize,
    },
    /// A core member: receives the whole vector of `extra` first (adding it), runs `steps`,
    /// then sends block `extra` (its sum) back to it.
    Core {
        /// The extra member it stands in for, if any.
        extra: Option<usize>,
        /// The halving exchanges, in order.
        steps: Vec<Exchange>,
    },
}

/// The largest power of two not above `s` (`s ≥ 1`).
fn core_count(s: usize) -> usize {
    1 << (usize::BITS - 1 - s.leading_zeros())
}

/// The role of member `me` of `s`.
pub fn route(s: usize, me: usize) -> Role {
    let q = core_count(s.max(1));
    if me >= q {
        return Role::Extra { core: me - q };
    }
    let extra = (me + q < s).then_some(me + q);
    // Blocks owned by the core members lo..hi, ascending.
    let owned = |lo: usize, hi: usize| -> Vec<usize> {
        (0..s).filter(|&b| (lo..hi).contains(&(b % q))).collect()
    };
    let mut steps = Vec::new();
    let (mut lo, mut width) = (0, q);
    while width > 1 {
        let d = width / 2;
        let partner = me ^ d;
        let (mine, theirs) = if me - lo < d {
            ((lo, lo + d), (lo + d, lo + width))
        } else {
            ((lo + d, lo + width), (lo, lo + d))
        };
        steps.push(Exchange {
            partner,
            send: owned(theirs.0, theirs.1),
            recv: owned(mine.0, mine.1),
        });
        lo = mine.0;
        width = d;
    }
    Role::Core { extra, steps }
}

/// Checks the routing of `s` members symbolically: every message pairs up (the partner sends
/// what this member expects), and every member's own block ends with each member's
/// contribution exactly once. Returns the first violation.
pub fn prove(s: usize) -> Result<()> {
    prove_with(s, route)
}

/// [`prove`] for the routing `route_of` (member count, member) → role.
pub fn prove_with(s: usize, route_of: impl Fn(usize, usize) -> Role) -> Result<()> {
    let fail = |m: String| Err(Error::internal(format!("halving of {s}: {m}")));
    // holds[r][b][c]: how many times member c's block b is in member r's partial sum of b.
    let mut holds: Vec<Vec<Vec<u32>>> = (0..s)
        .map(|r| {
            (0..s)
                .map(|_| (0..s).map(|c| u32::from(c == r)).collect())
                .collect()
        })
        .collect();
    let roles: Vec<Role> = (0..s).map(|r| route_of(s, r)).collect();
    let add = |holds: &mut Vec<Vec<Vec<u32>>>, to: usize, from: usize, b: usize| {
        let part = holds[from][b].clone();
        for (a, x) in holds[to][b].iter_mut().zip(part) {
            *a += x;
        }
    };
    // Fold-in.
    for (r, role) in roles.iter().enumerate() {
        if let Role::Extra { core } = *role {
            match roles.get(core) {
                Some(Role::Core { extra: Some(e), .. }) if *e == r => {}
                _ => return fail(format!("extra member {r} is not expected by member {core}")),
            }
            for b in 0..s {
                add(&mut holds, core, r, b);
            }
        }
    }
    // The halving steps, all members' step i at once (messages carry the sender's state
    // before the step).
    let depth = roles
        .iter()
        .map(|r| match r {
            Role::Core { steps, .. } => steps.len(),
            Role::Extra { .. } => 0,
        })
        .max()
        .unwrap_or(0);
    for i in 0..depth {
        let before = holds.clone();
        for (r, role) in roles.iter().enumerate() {
            let Role::Core { steps, .. } = role else {
                continue;
            };
            let Some(x) = steps.get(i) else {
                return fail(format!("member {r} has fewer steps than others"));
            };
            let Some(Role::Core { steps: theirs, .. }) = roles.get(x.partner) else {
                return fail(format!(
                    "member {r} exchanges with {} (not a core member)",
                    x.partner
                ));
            };
            match theirs.get(i) {
                Some(y) if y.partner == r && y.send == x.recv && y.recv == x.send => {}
                _ => {
                    return fail(format!(
                        "step {i}: member {r} and member {} do not pair up",
                        x.partner
                    ))
                }
            }
            for &b in &x.recv {
                let part = before[x.partner][b].clone();
                for (a, v) in holds[r][b].iter_mut().zip(part) {
                    *a += v;
                }
            }
        }
    }
    // Fold-out, then the postcondition.
    for (r, role) in roles.iter().enumerate() {
        if let Role::Core { extra: Some(e), .. } = *role {
            holds[e][e] = holds[r][e].clone();
        }
    }
    for (r, h) in holds.iter().enumerate() {
        if let Some(c) = h[r].iter().position(|&n| n != 1) {
            return fail(format!(
                "member {r}'s block holds member {c}'s contribution {} times",
                h[r][c]
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halving_is_exact_for_every_member_count_to_64() {
        for s in 1..=64 {
            prove(s).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn a_wrong_partner_or_a_missing_step_is_caught() {
        // Member 0 of 4 pairs with 2 at the first step: sending it to 1 breaks the pairing.
        let wrong_partner = |s, me| {
            let mut r = route(s, me);
            if let (0, Role::Core { steps, .. }) = (me, &mut r) {
                steps[0].partner = 1;
            }
            r
        };
        assert!(prove_with(4, wrong_partner).is_err());
        // Every member skips the last step: the steps still pair up, but each own block
        // lacks the last partner's contributions.
        let short = |s, me| {
            let mut r = route(s, me);
            if let Role::Core { steps, .. } = &mut r {
                steps.pop();
            }
            r
        };
        assert!(prove_with(6, short).is_err());
    }

    #[test]
    fn steps_are_logarithmic() {
        for s in [2usize, 3, 8, 13, 64] {
            let Role::Core { steps, .. } = route(s, 0) else {
                panic!("member 0 is a core member");
            };
            assert_eq!(
                steps.len(),
                core_count(s).trailing_zeros() as usize,
                "s={s}"
            );
        }
    }
}
