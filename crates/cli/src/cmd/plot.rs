//! `plot`: a run's intervals drawn to SVG or PNG.

use super::Outcome;
use crate::args::{ArchiveArgs, PlotArgs};

/// `longhaul plot`.
pub fn plot(_a: PlotArgs, _archive: &ArchiveArgs) -> Outcome {
    Err(super::usage("plot: not built yet"))
}
