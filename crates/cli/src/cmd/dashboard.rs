//! `dashboard`: the web page of live runs, history and run graphs.

use super::Outcome;
use crate::args::{ArchiveArgs, DashboardArgs};

/// `longhaul dashboard`.
pub fn dashboard(_a: DashboardArgs, _archive: &ArchiveArgs) -> Outcome {
    Err(super::usage("dashboard: not built yet"))
}
