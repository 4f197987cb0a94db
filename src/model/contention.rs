//! Links shared by messages: a fluid model with max-min fair sharing.
//!
//! Every resource (a NIC direction, an intra-node link, a node's memory bus, the global
//! network) has a capacity in bytes per second; every active flow crosses a few resources
//! and gets the max-min fair rate (progressive filling: the most loaded resource's fair share
//! is given to its flows, which are then frozen, and so on). Rates change only when a flow
//! starts or ends, so a simulation is a sequence of such events.

/// A message in flight through some resources.
#[derive(Clone, Debug)]
pub struct Flow {
    /// Bytes left to move.
    pub left: f64,
    /// Resources it crosses (indices into the capacity table).
    pub res: smallvec::SmallVec<[u32; 4]>,
    /// Current rate (bytes per second).
    pub rate: f64,
}

/// The active flows over a fixed set of resources.
#[derive(Clone, Debug, Default)]
pub struct Fluid {
    caps: Vec<f64>,
    flows: Vec<Option<Flow>>,
    free: Vec<usize>,
    active: usize,
    dirty: bool,
    /// Bytes each resource has carried so far.
    served: Vec<f64>,
    // Scratch of the rate computation.
    load: Vec<u32>,
    rem: Vec<f64>,
}

/// Bytes below which a flow counts as finished (rounding of rate × time).
const EPS_BYTES: f64 = 1e-6;

impl Fluid {
    /// Resources of the given capacities (bytes per second; `f64::INFINITY` for none).
    pub fn new(caps: Vec<f64>) -> Self {
        let n = caps.len();
        Fluid {
            caps,
            served: vec![0.0; n],
            load: vec![0; n],
            rem: vec![0.0; n],
            ..Default::default()
        }
    }

    /// Adds a flow of `bytes` across `res`; returns its id.
    pub fn add(&mut self, bytes: f64, res: &[u32]) -> usize {
        let f = Flow {
            left: bytes.max(0.0),
            res: res.iter().copied().collect(),
            rate: 0.0,
        };
        self.dirty = true;
        self.active += 1;
        match self.free.pop() {
            Some(i) => {
                self.flows[i] = Some(f);
                i
            }
            None => {
                self.flows.push(Some(f));
                self.flows.len() - 1
            }
        }
    }

    /// Capacity of resource `r` (bytes per second).
    pub fn cap(&self, r: u32) -> f64 {
        self.caps[r as usize]
    }

    /// Bytes resource `r` has carried since the fluid was made.
    pub fn served(&self, r: u32) -> f64 {
        self.served[r as usize]
    }

    /// Flows in flight.
    pub fn active(&self) -> usize {
        self.active
    }

    fn rates(&mut self) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        self.load.iter_mut().for_each(|x| *x = 0);
        self.rem.clone_from(&self.caps);
        let mut open: Vec<usize> = Vec::with_capacity(self.active);
        for (i, f) in self.flows.iter_mut().enumerate() {
            if let Some(f) = f {
                f.rate = f64::INFINITY;
                open.push(i);
                for &r in &f.res {
                    self.load[r as usize] += 1;
                }
            }
        }
        // Progressive filling.
        while !open.is_empty() {
            let mut best = f64::INFINITY;
            let mut best_r = usize::MAX;
            for (r, &l) in self.load.iter().enumerate() {
                if l > 0 {
                    let share = self.rem[r] / l as f64;
                    if share < best {
                        best = share;
                        best_r = r;
                    }
                }
            }
            if best_r == usize::MAX {
                // Flows crossing no finite resource: infinitely fast.
                break;
            }
            let mut still = Vec::with_capacity(open.len());
            for &i in &open {
                let f = self.flows[i].as_mut().expect("open flow");
                if f.res.contains(&(best_r as u32)) {
                    f.rate = best;
                    for &r in &f.res {
                        self.rem[r as usize] -= best;
                        self.load[r as usize] -= 1;
                    }
                } else {
                    still.push(i);
                }
            }
            // Guard against rounding leaving a loaded resource slightly negative.
            for x in self.rem.iter_mut() {
                if *x < 0.0 {
                    *x = 0.0;
                }
            }
            open = still;
        }
    }

    /// Seconds until the next flow ends at the current rates (`INFINITY` when none is active).
    pub fn next_finish(&mut self) -> f64 {
        self.rates();
        self.flows
            .iter()
            .flatten()
            .map(|f| {
                if f.left <= EPS_BYTES {
                    0.0
                } else {
                    f.left / f.rate
                }
            })
            .fold(f64::INFINITY, f64::min)
    }

    /// Moves every flow forward by `dt` seconds; returns the ids of the flows that ended.
    pub fn advance(&mut self, dt: f64) -> Vec<usize> {
        self.rates();
        let mut done = Vec::new();
        for (i, slot) in self.flows.iter_mut().enumerate() {
            if let Some(f) = slot {
                // Due now (up to rounding): done, whatever residue the subtraction leaves.
                let moved =
                    if f.rate.is_infinite() || f.left <= f.rate * dt * (1.0 + 1e-9) + EPS_BYTES {
                        done.push(i);
                        f.left
                    } else {
                        f.rate * dt
                    };
                f.left -= moved;
                for &r in &f.res {
                    self.served[r as usize] += moved;
                }
            }
        }
        for &i in &done {
            self.flows[i] = None;
            self.free.push(i);
        }
        if !done.is_empty() {
            self.active -= done.len();
            self.dirty = true;
        }
        done
    }
}

/// Runs flows that start at given times to completion; returns each one's end time.
/// `flows`: (start time, bytes, resources).
pub fn run_batch(caps: &[f64], flows: &[(f64, f64, Vec<u32>)]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..flows.len()).collect();
    order.sort_by(|&a, &b| flows[a].0.total_cmp(&flows[b].0));
    let mut fl = Fluid::new(caps.to_vec());
    let mut ends = vec![0.0; flows.len()];
    let mut id_of = Vec::new(); // fluid id -> flow index
    let mut next = 0;
    let mut now = flows
        .get(order.first().copied().unwrap_or(0))
        .map_or(0.0, |f| f.0);
    while next < order.len() || fl.active() > 0 {
        while next < order.len() && flows[order[next]].0 <= now {
            let k = order[next];
            let id = fl.add(flows[k].1, &flows[k].2);
            if id_of.len() <= id {
                id_of.resize(id + 1, 0);
            }
            id_of[id] = k;
            next += 1;
        }
        let fin = fl.next_finish();
        let arrive = order.get(next).map_or(f64::INFINITY, |&k| flows[k].0 - now);
        let dt = fin.min(arrive);
        if !dt.is_finite() {
            break;
        }
        for id in fl.advance(dt) {
            ends[id_of[id]] = now + dt;
        }
        now += dt;
    }
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_flows_through_one_nic_each_get_half() {
        // Resource 0: a 10 B/s NIC; both flows of 10 bytes end at 2 s, not 1 s.
        let ends = run_batch(&[10.0], &[(0.0, 10.0, vec![0]), (0.0, 10.0, vec![0])]);
        assert_eq!(ends, vec![2.0, 2.0]);
    }

    #[test]
    fn a_flow_gets_the_bandwidth_another_leaves_when_it_ends() {
        // 5 and 15 bytes share 10 B/s: the short one ends at 1 s (5 B/s each), the long one
        // has 10 left and runs alone at 10 B/s: 2 s.
        let ends = run_batch(&[10.0], &[(0.0, 5.0, vec![0]), (0.0, 15.0, vec![0])]);
        assert!(
            (ends[0] - 1.0).abs() < 1e-12 && (ends[1] - 2.0).abs() < 1e-12,
            "{ends:?}"
        );
    }

    #[test]
    fn max_min_gives_the_unconstrained_flow_the_rest() {
        // Flows A (res 0, 1) and B (res 1): res 0 = 2 B/s caps A at 2; B gets 10 − 2 = 8.
        let mut f = Fluid::new(vec![2.0, 10.0]);
        let a = f.add(100.0, &[0, 1]);
        let b = f.add(100.0, &[1]);
        f.next_finish();
        assert_eq!(f.flows[a].as_ref().unwrap().rate, 2.0);
        assert_eq!(f.flows[b].as_ref().unwrap().rate, 8.0);
    }

    #[test]
    fn late_start_shares_from_its_start() {
        // A starts at 0 (20 B), B at 1 s (5 B); 10 B/s: A alone 1 s (10 left), then both at 5:
        // B ends at 2 s, A has 5 left, alone at 10 B/s: 2.5 s.
        let ends = run_batch(&[10.0], &[(0.0, 20.0, vec![0]), (1.0, 5.0, vec![0])]);
        assert!(
            (ends[0] - 2.5).abs() < 1e-12 && (ends[1] - 2.0).abs() < 1e-12,
            "{ends:?}"
        );
    }
}
