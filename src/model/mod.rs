//! The α-β-γ cost model and the tuner that picks algorithms from it.

pub mod cost;
pub mod tuner;
