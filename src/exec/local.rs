//! The local steps of a phase (`Copy`, `Average`), written once for the host and the device
//! executors over a [`LocalTarget`].

use super::segments::{segments, total, zip_segments, Seg};
use crate::error::{Error, Result};
use crate::plan::{Phase, Span, Step};
use std::ops::Range;

/// Where the local steps of a phase run: the host buffers or a device's.
pub(crate) trait LocalTarget {
    /// The elements span `s` covers.
    fn elems(&self, s: Span) -> Range<usize>;
    /// Copies `src` onto `dst` (same length); equal positions are the in-place form, skipped.
    fn copy(&self, src: Seg, dst: Seg) -> Result<()>;
    /// Divides the elements of `seg` by `ranks` (the end of an average).
    fn divide(&self, seg: Seg, ranks: usize) -> Result<()>;
}

/// Runs the `Copy` and `Average` steps of `phase` on `t`. The plan guarantees that their
/// targets are touched by no other step of the phase and that distinct blocks do not overlap.
pub(crate) fn local_steps(phase: &Phase, nranks: usize, t: &impl LocalTarget) -> Result<()> {
    for step in &phase.steps {
        match step {
            Step::Copy { src, dst } => {
                let s = segments(src, |sp| t.elems(sp));
                let d = segments(dst, |sp| t.elems(sp));
                if total(&s) != total(&d) {
                    return Err(Error::internal("copy between spans of different sizes"));
                }
                for (_, a, b) in zip_segments(&s, &d) {
                    t.copy(a, b)?;
                }
            }
            Step::Average { dst } => {
                for s in segments(dst, |sp| t.elems(sp)) {
                    t.divide(s, nranks)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}
