//! A run of the test matrix (`longhaul matrix`, issue 30) in the archive:
//! one run of kind [`KIND`] whose summary is the command's own
//! `longhaul-matrix` document (docs/JSON.md section 15), every cell in it.
//! No table of its own: the run is a row like any other (older builds list
//! it and show its summary), and readers take the cells out of the
//! document with [`Matrix::of`], which keeps what it knows and skips the
//! rest, so a later version of the document still reads.
//!
//! - [`Recorder`]: the run, begun when the matrix starts (a matrix killed
//!   half way reads as `interrupted`) and given its document at the end.
//! - [`Matrix`], [`Cell`]: the cells as the readers see them (`show`,
//!   `plot`, the dashboard's matrix page).
//! - [`matrix_runs`], [`cell_history`]: the archived matrices, newest
//!   first, and each cell's rate over them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::model::{HistoryFilter, NewRun, RunDetail, RunRow};
use crate::store::{Archive, ArchiveError};
use crate::writer::{Finisher, RunEnd, RunResult, Writer};

/// The kind of a matrix run.
pub const KIND: &str = "matrix";

/// The `format` of the document a matrix run keeps as its summary.
pub const FORMAT: &str = "longhaul-matrix";

/// Matrix runs the history of a cell looks back over, at most.
pub const HISTORY_MAX: usize = 200;

/// A cell's rate: the median of its runs and their spread.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Rate {
    pub median_bytes_per_second: f64,
    pub min_bytes_per_second: f64,
    pub max_bytes_per_second: f64,
    pub median_bits_per_second: f64,
}

/// A cell's CPU seconds, on the client and the server (mean of its runs,
/// each end read from a cgroup of its own); None where it could not be
/// measured (shown `?`, never 0).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Cpu {
    pub client_seconds: Option<f64>,
    pub server_seconds: Option<f64>,
}

/// One cell: a tool at one settings, on one path, one workload, one
/// direction (`put` or `get`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Cell {
    pub tool: String,
    pub settings: String,
    pub path: String,
    pub workload: String,
    pub direction: String,
    pub rate: Option<Rate>,
    pub cpu_seconds: Option<Cpu>,
    /// true: every run's destination equalled the source; false: one did
    /// not; null: nothing to verify (memory to memory) or nothing ran.
    pub verified: Option<bool>,
    pub error: Option<String>,
    pub note: Option<String>,
    /// The settings' arguments as run (for `best`, the sweep's winner on
    /// this path and workload); None in documents from before they were kept.
    pub args: Option<Vec<String>>,
    /// What of the tree the tool did not keep and does not claim to
    /// (`empty directories`, `symbolic links`, `permission bits`).
    pub not_kept: Vec<String>,
    /// Runs that succeeded (and verified), of those planned; None in older documents.
    pub runs_succeeded: Option<u32>,
    pub runs_planned: Option<u32>,
}

/// Which cell, whatever the run: what its history is kept by.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct CellKey {
    pub tool: String,
    pub settings: String,
    pub path: String,
    pub workload: String,
    pub direction: String,
}

impl Cell {
    pub fn key(&self) -> CellKey {
        CellKey {
            tool: self.tool.clone(),
            settings: self.settings.clone(),
            path: self.path.clone(),
            workload: self.workload.clone(),
            direction: self.direction.clone(),
        }
    }

    /// The median in bits per second, when the cell has a rate.
    /// Whether every planned run succeeded: the only cells a ratio may use.
    pub fn whole(&self) -> bool {
        self.rate.is_some()
            && self.verified != Some(false)
            && match (self.runs_succeeded, self.runs_planned) {
                (Some(ok), Some(n)) => ok == n,
                _ => self.error.is_none(),
            }
    }

    pub fn bits_per_second(&self) -> Option<f64> {
        self.rate
            .as_ref()
            .map(|r| r.median_bits_per_second)
            .filter(|b| b.is_finite() && *b >= 0.0)
    }
}

/// The physical limits measured in the same run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// The best memory-to-memory cell on each path.
    pub mem_to_mem_bytes_per_second: BTreeMap<String, f64>,
    /// A local copy of each file workload.
    pub local_copy_bytes_per_second: BTreeMap<String, f64>,
    /// Writing the elephant's size to the destination, synced.
    pub destination_write_bytes_per_second: Option<f64>,
    /// Each emulated path's rate (its bottleneck).
    pub path_bytes_per_second: BTreeMap<String, f64>,
}

/// A tool of the matrix, and whether it was there to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolRow {
    pub name: String,
    pub settings: Vec<String>,
    pub installed: bool,
    pub note: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PathRow {
    name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Params {
    workloads: Vec<String>,
}

/// The document as stored; what [`Matrix`] reads of it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Doc {
    format: String,
    format_version: u32,
    params: Params,
    tools: Vec<ToolRow>,
    paths: Vec<PathRow>,
    cells: Vec<Cell>,
    limits: Limits,
    interrupted: bool,
}

/// A matrix as its readers see it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Matrix {
    pub format_version: u32,
    /// In the order the matrix ran them.
    pub workloads: Vec<String>,
    pub paths: Vec<String>,
    pub tools: Vec<ToolRow>,
    pub cells: Vec<Cell>,
    pub limits: Limits,
    /// Stopped before every cell ran (Ctrl-C).
    pub interrupted: bool,
}

impl Matrix {
    /// The matrix in a `longhaul-matrix` document; None when it is not one.
    pub fn from_doc(doc: &serde_json::Value) -> Option<Matrix> {
        let d: Doc = serde_json::from_value(doc.clone()).ok()?;
        if d.format != FORMAT {
            return None;
        }
        let mut workloads = d.params.workloads;
        let mut paths: Vec<String> = d.paths.into_iter().map(|p| p.name).collect();
        // Whatever the header lists, every cell has its place.
        for c in &d.cells {
            if !workloads.contains(&c.workload) {
                workloads.push(c.workload.clone());
            }
            if !paths.contains(&c.path) {
                paths.push(c.path.clone());
            }
        }
        Some(Matrix {
            format_version: d.format_version,
            workloads,
            paths,
            tools: d.tools,
            cells: d.cells,
            limits: d.limits,
            interrupted: d.interrupted,
        })
    }

    /// The matrix of an archived run; None when the run is not a matrix or
    /// its document cannot be read.
    pub fn of(detail: &RunDetail) -> Option<Matrix> {
        if detail.run.kind != KIND {
            return None;
        }
        Matrix::from_doc(detail.summary.as_ref()?)
    }

    /// The rows of a table: each tool and settings that has a cell, in the
    /// order the cells came.
    pub fn rows(&self) -> Vec<(String, String)> {
        let mut rows: Vec<(String, String)> = Vec::new();
        for c in &self.cells {
            let r = (c.tool.clone(), c.settings.clone());
            if !rows.contains(&r) {
                rows.push(r);
            }
        }
        rows
    }

    /// Whether every file cell that ran verified: None without file cells.
    pub fn verified(&self) -> Option<bool> {
        let v: Vec<bool> = self.cells.iter().filter_map(|c| c.verified).collect();
        (!v.is_empty()).then(|| v.iter().all(|&x| x))
    }
}

/// A matrix run: the run's row and its matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MatrixRun {
    pub run: RunRow,
    pub matrix: Matrix,
}

/// The archived matrix runs that kept a document, newest first, at most
/// `limit` (at most [`HISTORY_MAX`]).
pub fn matrix_runs(a: &Archive, limit: usize) -> Result<Vec<MatrixRun>, ArchiveError> {
    let rows = a.history(&HistoryFilter {
        kind: Some(KIND.into()),
        limit: limit.clamp(1, HISTORY_MAX),
        ..HistoryFilter::default()
    })?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let detail = a.run(r.id)?;
        if let Some(matrix) = Matrix::of(&detail) {
            out.push(MatrixRun {
                run: detail.run,
                matrix,
            });
        }
    }
    Ok(out)
}

/// One archived value of a cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    pub run: i64,
    pub started_at: f64,
    /// The median; None when the cell did not give a rate that time.
    pub bits_per_second: Option<f64>,
    pub verified: Option<bool>,
}

/// A cell over the archived matrices, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellHistory {
    #[serde(flatten)]
    pub key: CellKey,
    pub points: Vec<Point>,
}

/// Every cell of `runs` (newest first, as [`matrix_runs`] gives them)
/// with its values, oldest first.
pub fn cell_history(runs: &[MatrixRun]) -> Vec<CellHistory> {
    let mut by: BTreeMap<CellKey, Vec<Point>> = BTreeMap::new();
    for m in runs.iter().rev() {
        for c in &m.matrix.cells {
            by.entry(c.key()).or_default().push(Point {
                run: m.run.id,
                started_at: m.run.started_at,
                bits_per_second: c.bits_per_second(),
                verified: c.verified,
            });
        }
    }
    by.into_iter()
        .map(|(key, points)| CellHistory { key, points })
        .collect()
}

/// A matrix run being recorded: begun as it starts, ended with its
/// document.
pub struct Recorder {
    writer: Writer,
    finisher: Finisher,
    started: Instant,
}

impl Recorder {
    /// Opens the archive at `path` and records `run` (its kind made
    /// [`KIND`]) as running. Runs of this host left `running` by a process
    /// that is gone are marked interrupted first.
    pub fn start(path: &Path, run: &NewRun) -> Result<Recorder, ArchiveError> {
        let archive = Archive::open(path)?;
        if let Err(e) = archive.settle_orphans() {
            tracing::warn!("{e}");
        }
        let run = NewRun {
            kind: KIND.into(),
            ..run.clone()
        };
        let id = archive.begin_run(&run)?;
        let (writer, finisher) = Writer::start(archive, id);
        Ok(Recorder {
            writer,
            finisher,
            started: Instant::now(),
        })
    }

    /// The run's id.
    pub fn run(&self) -> i64 {
        self.writer.run()
    }

    /// Ends the run with its document (`doc`, a `longhaul-matrix`) and how
    /// it ended; waits until both are written. What could not be kept.
    pub fn finish(self, doc: Option<serde_json::Value>, end: RunEnd) -> crate::model::Loss {
        let matrix = doc.as_ref().and_then(Matrix::from_doc);
        self.writer.result(RunResult {
            summary: doc,
            seconds: Some(self.started.elapsed().as_secs_f64()),
            verified: matrix.as_ref().and_then(Matrix::verified),
            ..RunResult::default()
        });
        self.writer.end(end);
        drop(self.writer);
        self.finisher.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_document_reads_with_what_it_lacks_and_more_than_it_knows() {
        let doc = json!({
            "format": FORMAT, "format_version": 1,
            "params": {"workloads": ["mem"], "runs": 3},
            "paths": [{"name": "loopback", "rtt_ms": 0.0}],
            "cells": [
                {"tool": "a", "settings": "s", "path": "loopback", "workload": "mem",
                 "direction": "put", "rate": {"median_bytes_per_second": 1e9,
                 "min_bytes_per_second": 9e8, "max_bytes_per_second": 1.1e9,
                 "median_bits_per_second": 8e9}, "verified": null, "runs": [], "later": 1},
                {"tool": "b", "settings": "s", "path": "lan", "workload": "tree", "direction": "get",
                 "verified": false}
            ],
            "limits": {},
            "added_later": true
        });
        let m = Matrix::from_doc(&doc).unwrap();
        assert_eq!(m.workloads, ["mem", "tree"]);
        assert_eq!(m.paths, ["loopback", "lan"]);
        assert_eq!(m.cells[0].bits_per_second(), Some(8e9));
        assert_eq!(m.cells[1].bits_per_second(), None);
        assert_eq!(m.verified(), Some(false));
        assert_eq!(
            m.rows(),
            [("a".into(), "s".into()), ("b".into(), "s".into())]
        );
        assert!(Matrix::from_doc(&json!({"format": "longhaul-perf"})).is_none());
        assert!(Matrix::from_doc(&json!([1, 2])).is_none());
        assert!(Matrix::from_doc(&json!({"format": FORMAT, "cells": "x"})).is_none());
    }
}
