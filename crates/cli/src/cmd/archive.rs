//! `history`, `show`, `where`: the archive, read.

use super::Outcome;
use crate::args::{ArchiveArgs, HistoryArgs, ShowArgs, WhereArgs};

/// `longhaul history`.
pub fn history(_a: HistoryArgs, _archive: &ArchiveArgs) -> Outcome {
    Err(super::usage("history: not built yet"))
}

/// `longhaul show`.
pub fn show(_a: ShowArgs, _archive: &ArchiveArgs) -> Outcome {
    Err(super::usage("show: not built yet"))
}

/// `longhaul where`.
pub fn where_(_a: WhereArgs, _archive: &ArchiveArgs) -> Outcome {
    Err(super::usage("where: not built yet"))
}
