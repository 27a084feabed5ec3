//! The matrix's run in the archive ([`longhaul_archive::matrix`]): one
//! run of kind `matrix`, begun before the first cell (a matrix killed half
//! way then reads as `interrupted`) and ended with the document `--json`
//! prints, every cell in it. `--no-archive` keeps nothing; an archive that
//! cannot be opened is said once and the matrix runs all the same.

use longhaul_archive::matrix::Recorder;
use longhaul_archive::model::NewRun;
use longhaul_archive::writer::RunEnd;

use super::{Doc, Params, PathSpec};
use crate::args::ArchiveArgs;
use crate::exit;

/// Records the matrix as running, unless `--no-archive`.
pub(super) fn start(args: &ArchiveArgs, paths: &[PathSpec], params: &Params) -> Option<Recorder> {
    let path = crate::cmd::archive_file(args)?;
    let names: Vec<&str> = paths.iter().map(|p| p.name.as_str()).collect();
    let run = NewRun {
        kind: longhaul_archive::matrix::KIND.into(),
        command: crate::cmd::command_line(),
        remote_host: Some(names.join(",")),
        params: serde_json::to_value(params).ok(),
        ..NewRun::default()
    };
    Recorder::start(&path, &run)
        .map_err(|e| crate::errln!("longhaul: warning: not archiving this matrix: {e}"))
        .ok()
}

/// Ends the run with the document and how the matrix ended: `failed`
/// with the error that stopped it, `interrupted`, `partial` when a cell
/// failed or did not verify, else `ok` (the exit codes the command gives).
pub(super) fn finish(rec: Option<Recorder>, doc: &Doc, failure: Option<&String>) {
    let Some(rec) = rec else { return };
    let bad = doc
        .cells
        .iter()
        .any(|c| c.verified == Some(false) || c.error.is_some());
    let (status, code) = match failure {
        Some(_) => ("failed", exit::FAILED),
        None if doc.interrupted => ("interrupted", exit::INTERRUPTED),
        None if bad => ("partial", exit::PARTIAL),
        None => ("ok", exit::OK),
    };
    let loss = rec.finish(
        serde_json::to_value(doc).ok(),
        RunEnd {
            status: status.into(),
            error: failure.cloned(),
            exit_code: Some(code),
            warnings: Vec::new(),
        },
    );
    if loss.rows > 0 || loss.error.is_some() {
        crate::errln!(
            "longhaul: warning: the archive did not keep this matrix whole{}",
            loss.error
                .map(|e| format!(" ({e}); free space there, or use --archive elsewhere"))
                .unwrap_or_default()
        );
    }
}
