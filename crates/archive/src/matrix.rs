//! A run of the test matrix (`longhaul matrix`, issue 30) in the archive:
//! one run of kind [`KIND`] whose summary is the command's own
//! `longhaul-matrix` document (docs/JSON.md section 15), every cell in it.
//! No table of its own: the run is a row like any other (older builds list
//! it and show its summary).
//!
//! - [`Document`]: the document, one type for the command that writes it
//!   (`--json`, `--resume`, the archive) and for its readers (`show`,
//!   `plot`, the dashboard's matrix page), which read it with
//!   [`Document::of`]: what it knows is kept, the rest skipped, so a later
//!   version of the document still reads.
//! - [`Recorder`]: the run, begun when the matrix starts (a matrix killed
//!   half way reads as `interrupted`) and given its document at the end.
//! - [`CellRuns`], [`Cell`]: a cell with its runs, and what a cell says
//!   without them.
//! - [`matrix_runs`], [`cell_history`]: the archived matrices, newest
//!   first, and each cell's rate over them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::model::{HistoryFilter, NewRun, RunDetail, RunRow};
use crate::store::{Archive, ArchiveError};
use crate::writer::{Finisher, RunEnd, Writer};

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
    /// A local copy of each file workload: its fastest run.
    pub local_copy_bytes_per_second: BTreeMap<String, f64>,
    /// Writing the elephant's size to the destination, synced.
    pub destination_write_bytes_per_second: Option<f64>,
    /// Each emulated path's rate (its bottleneck).
    pub path_bytes_per_second: BTreeMap<String, f64>,
    /// Each emulated path's two hosts as tuned for it (absent from older
    /// documents and for loopback and far paths).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub host_tuning: BTreeMap<String, HostTuning>,
}

/// An emulated path's two hosts tuned as data transfer nodes: the TCP
/// autotuning maxima set in both network namespaces, which every tool
/// left to autotuning gets; the net.core caps on an explicit setting are
/// not per namespace and stay the host's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostTuning {
    /// The third number of net.ipv4.tcp_wmem in both hosts, bytes.
    pub tcp_wmem_max: u64,
    /// The third number of net.ipv4.tcp_rmem in both hosts, bytes.
    pub tcp_rmem_max: u64,
    /// The path's bandwidth-delay product they were sized from, bytes.
    pub bdp_bytes: u64,
    /// net.core.wmem_max and rmem_max, the host's, bytes.
    pub wmem_max: Option<u64>,
    pub rmem_max: Option<u64>,
}

/// A tool of the matrix, and whether it was there to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolRow {
    pub name: String,
    pub settings: Vec<String>,
    pub installed: bool,
    pub note: Option<String>,
    /// What its version command(s) said (escaped), run once on this host;
    /// absent in older documents and for a tool without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// One path: loopback, an emulated WAN or a far host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PathSpec {
    pub name: String,
    pub rtt_ms: f64,
    pub loss: f64,
    /// Bits per second; none on loopback and `far`.
    pub rate_bps: Option<u64>,
    /// `far`: the host (`--far`) the path reaches by ssh.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub far: Option<String>,
}

/// One run of a cell.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunResult {
    pub bytes_per_second: Option<f64>,
    pub seconds: f64,
    /// CPU seconds of each end, from its cgroup; None: not measurable.
    pub cpu_client_seconds: Option<f64>,
    pub cpu_server_seconds: Option<f64>,
    pub verified: Option<bool>,
    /// What of the tree the tool did not keep (and does not claim to).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_kept: Vec<String>,
    /// The tool's own report of its rate, for reference (rsync --stats,
    /// globus-url-copy -vb); the cell's rate is the wall clock's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported_bytes_per_second: Option<f64>,
    /// The host's one-minute load average as the run started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loadavg_1m: Option<f64>,
    pub error: Option<String>,
}

impl RunResult {
    /// The run succeeded and what it copied verified.
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.verified != Some(false) && self.bytes_per_second.is_some()
    }
}

/// One cell with its runs, as the document has it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CellRuns {
    #[serde(flatten)]
    pub cell: Cell,
    #[serde(default)]
    pub runs: Vec<RunResult>,
}

impl std::ops::Deref for CellRuns {
    type Target = Cell;
    fn deref(&self) -> &Cell {
        &self.cell
    }
}

impl CellRuns {
    /// Planned with no runs: its tool cannot run on its path (the note says why).
    pub fn not_run(&self) -> bool {
        self.runs_planned == Some(0)
    }

    /// Still to run.
    pub fn pending(&self) -> bool {
        self.runs.is_empty() && !self.not_run()
    }
}

impl std::ops::DerefMut for CellRuns {
    fn deref_mut(&mut self) -> &mut Cell {
        &mut self.cell
    }
}

/// The median of some figures (None for none).
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// One candidate of a sweep: its warm-up, its rounds, and why it stopped
/// early if it did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Tried {
    pub args: Vec<String>,
    /// The median of its rounds (before any round: its warm-up's).
    pub bytes_per_second: Option<f64>,
    /// The median of its rounds' seconds (its warm-up's before any).
    pub seconds: f64,
    pub error: Option<String>,
    /// The warm-up run's rate: run, not counted in the median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_bytes_per_second: Option<f64>,
    /// Each round's rate, in the order run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub round_seconds: Vec<f64>,
    /// Why it ran no more rounds though it did not fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pruned: Option<String>,
}

/// One run of a candidate, as the sweep needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub bytes_per_second: Option<f64>,
    pub seconds: f64,
    /// Failed or did not verify: the candidate runs no more.
    pub error: Option<String>,
}

impl Tried {
    pub fn new(args: Vec<String>) -> Tried {
        Tried {
            args,
            ..Tried::default()
        }
    }

    /// Still in the sweep: no run failed and it was not pruned.
    pub fn alive(&self) -> bool {
        self.error.is_none() && self.pruned.is_none()
    }

    /// Records a run: round 0 is the warm-up.
    pub fn record(&mut self, round: u32, o: Outcome) {
        let rate = match (o.error, o.bytes_per_second) {
            (Some(e), _) => {
                self.error = Some(e);
                return;
            }
            (None, None) => {
                self.error = Some("no figure".into());
                return;
            }
            (None, Some(r)) => r,
        };
        if round == 0 {
            self.warmup_bytes_per_second = Some(rate);
            self.bytes_per_second = Some(rate);
            self.seconds = o.seconds;
            return;
        }
        self.rounds.push(rate);
        self.round_seconds.push(o.seconds);
        self.bytes_per_second = median(&self.rounds);
        self.seconds = median(&self.round_seconds).unwrap_or(o.seconds);
    }

    /// Every figure it has so far, the warm-up's included.
    pub fn seen(&self) -> impl Iterator<Item = f64> + '_ {
        self.warmup_bytes_per_second
            .iter()
            .chain(&self.rounds)
            .copied()
    }

    /// Its rounds' slowest and fastest.
    pub fn spread(&self) -> Option<(f64, f64)> {
        let lo = self.rounds.iter().copied().min_by(f64::total_cmp)?;
        let hi = self.rounds.iter().copied().max_by(f64::total_cmp)?;
        Some((lo, hi))
    }

    /// `-v`: how it did, rounds and spread.
    pub fn said(&self) -> String {
        if let Some(e) = &self.error {
            return format!(
                "failed{}: {e}",
                match self.rounds.len() {
                    0 if self.warmup_bytes_per_second.is_none() => String::new(),
                    0 => " after its warm-up".into(),
                    n => format!(" after {n} round(s)"),
                }
            );
        }
        let figure = match (self.bytes_per_second, self.spread()) {
            (Some(m), Some((lo, hi))) => format!(
                "{} MB/s, median of {} round(s) ({}-{})",
                mb(m),
                self.rounds.len(),
                mb(lo),
                mb(hi)
            ),
            (Some(m), None) => format!("{} MB/s, one run", mb(m)),
            (None, _) => "-".into(),
        };
        match &self.pruned {
            Some(why) => format!("{figure}; {why}"),
            None => figure,
        }
    }
}

impl Tried {
    /// The warm-up's seconds, when it ran and no round has.
    pub fn warmup_seconds(&self) -> Option<&f64> {
        (self.rounds.is_empty() && self.warmup_bytes_per_second.is_some()).then_some(&self.seconds)
    }
}

/// MB/s as the sweep's lines show them: whole above 10, one decimal below.
pub fn mb(bytes_per_second: f64) -> String {
    let v = bytes_per_second / 1e6;
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A tool's sweep on one path and workload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Swept {
    pub tool: String,
    pub path: String,
    pub workload: String,
    /// The winner's arguments (as in the grid: the path's values filled,
    /// the run's own placeholders not); None when no candidate ran.
    pub winner: Option<Vec<String>>,
    pub candidates: Vec<Tried>,
    /// Taken from an earlier matrix (`--quick`, `--resume`): its date.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remembered: Option<String>,
}

impl Swept {
    /// The candidates that may win: none of their runs failed, not
    /// pruned, and as many rounds as the most any ran.
    pub fn contenders(&self) -> impl Iterator<Item = &Tried> {
        let most = self
            .candidates
            .iter()
            .filter(|c| c.alive())
            .map(|c| c.rounds.len())
            .max()
            .unwrap_or(0);
        self.candidates
            .iter()
            .filter(move |c| c.alive() && c.rounds.len() == most)
            .filter(|c| c.bytes_per_second.is_some())
    }

    /// Picks the candidate with the highest median; of equal medians, the
    /// one whose slowest round was faster, then the earlier one.
    pub fn decide(&mut self) {
        let key = |c: &Tried| {
            (
                c.bytes_per_second.unwrap_or(0.0),
                c.spread().map_or(0.0, |s| s.0),
            )
        };
        let mut best: Option<&Tried> = None;
        for c in self.contenders() {
            if best.is_none_or(|b| key(c) > key(b)) {
                best = Some(c);
            }
        }
        self.winner = best.map(|c| c.args.clone());
    }

    pub fn won(&self) -> Option<&Tried> {
        let w = self.winner.as_ref()?;
        self.candidates.iter().find(|c| &c.args == w)
    }

    /// How the winner was found, for the line under the table: the
    /// candidates, rounds, pruned and failed ones, the winner's median and
    /// spread, and the runner-up's (or how many were within its spread).
    pub fn summary(&self) -> String {
        let n = self.candidates.len();
        let pruned = self
            .candidates
            .iter()
            .filter(|c| c.pruned.is_some())
            .count();
        let failed = self.candidates.iter().filter(|c| c.error.is_some()).count();
        let rounds = self
            .candidates
            .iter()
            .map(|c| c.rounds.len())
            .max()
            .unwrap_or(0);
        let legacy = self
            .candidates
            .iter()
            .all(|c| c.warmup_bytes_per_second.is_none() && c.error.is_none());
        if rounds == 0 && legacy {
            return format!("of {n} swept, one run each");
        }
        let mut s = format!("of {n} swept, {rounds} round(s) each after a warm-up");
        if pruned > 0 {
            s.push_str(&format!(", {pruned} pruned after round 1"));
        }
        if failed > 0 {
            s.push_str(&format!(", {failed} failed"));
        }
        let Some(w) = self.won() else {
            return s;
        };
        let fig = |c: &Tried| match (c.bytes_per_second, c.spread()) {
            (Some(m), Some((lo, hi))) => format!("{} ({}-{})", mb(m), mb(lo), mb(hi)),
            (Some(m), None) => mb(m),
            (None, _) => "-".into(),
        };
        s.push_str(&format!(": {} MB/s", fig(w)));
        let lo = w.spread().map_or(0.0, |x| x.0);
        let others: Vec<&Tried> = self.contenders().filter(|c| c.args != w.args).collect();
        let within = others
            .iter()
            .filter(|c| c.bytes_per_second.is_some_and(|m| m >= lo))
            .count();
        let next = others.iter().max_by(|a, b| {
            a.bytes_per_second
                .unwrap_or(0.0)
                .total_cmp(&b.bytes_per_second.unwrap_or(0.0))
        });
        if let Some(next) = next {
            s.push_str(&format!(", the next {}", fig(next)));
        }
        if within > 0 {
            s.push_str(&format!(" ({within} within its spread: a tie)"));
        }
        s
    }
}

/// /proc/loadavg when the matrix started and when it ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Load {
    pub start: String,
    pub end: String,
}

/// A piece a document was merged from (`--merge FILE`): its file's name,
/// its load average as it ran, and each tool's version as it said it
/// there (by tool name), so that a document of pieces measured by other
/// builds says which.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Piece {
    pub file: String,
    pub load: Load,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub versions: std::collections::BTreeMap<String, String>,
}

/// What the matrix was asked to run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Params {
    pub runs: u32,
    pub elephant_bytes: u64,
    pub small_files: u32,
    pub mem_seconds: f64,
    pub workloads: Vec<String>,
    /// `--cold`: the page cache was dropped before every timed run.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cold: bool,
    /// The file workloads whose data was found in the work directory (a
    /// tree of the user's), not made by the matrix.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub given: Vec<String>,
}

/// The `longhaul-matrix` document (docs/JSON.md section 15).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Document {
    pub format: String,
    pub format_version: u32,
    pub params: Params,
    pub tools: Vec<ToolRow>,
    pub paths: Vec<PathSpec>,
    pub cells: Vec<CellRuns>,
    /// Each tool's sweep on each path and workload: every candidate's
    /// figure and the winner its `best` cells ran with.
    pub sweeps: Vec<Swept>,
    pub limits: Limits,
    pub load: Load,
    /// The pieces it was merged from (`--merge`), whose cells (and so its
    /// limits and loads) they measured; empty for a matrix run whole.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub merged: Vec<Piece>,
    /// Stopped before every cell ran (Ctrl-C).
    pub interrupted: bool,
}

impl Document {
    /// The matrix in a `longhaul-matrix` document; None when it is not one.
    pub fn from_doc(doc: &serde_json::Value) -> Option<Document> {
        let d: Document = serde_json::from_value(doc.clone()).ok()?;
        (d.format == FORMAT).then_some(d)
    }

    /// The document in `text` (a `--resume` file), or why it is not one.
    pub fn from_text(text: &str) -> Result<Document, String> {
        let d: Document = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if d.format != FORMAT {
            return Err(format!("its format is {:?}", d.format));
        }
        Ok(d)
    }

    /// The matrix of an archived run; None when the run is not a matrix or
    /// its document cannot be read.
    pub fn of(detail: &RunDetail) -> Option<Document> {
        if detail.run.kind != KIND {
            return None;
        }
        Document::from_doc(detail.summary.as_ref()?)
    }

    /// The workloads in the order the matrix ran them: whatever the header
    /// lists, every cell has its place.
    pub fn workloads(&self) -> Vec<String> {
        let mut out = self.params.workloads.clone();
        for c in &self.cells {
            if !out.contains(&c.workload) {
                out.push(c.workload.clone());
            }
        }
        out
    }

    /// The paths' names, every cell's among them.
    pub fn path_names(&self) -> Vec<String> {
        let mut out: Vec<String> = self.paths.iter().map(|p| p.name.clone()).collect();
        for c in &self.cells {
            if !out.contains(&c.path) {
                out.push(c.path.clone());
            }
        }
        out
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

    /// What the dashboard's matrix page shows of it (JSON.md section 15:
    /// the cells without their runs, the paths by name).
    pub fn view(&self) -> serde_json::Value {
        let cells: Vec<&Cell> = self.cells.iter().map(|c| &c.cell).collect();
        serde_json::json!({
            "format_version": self.format_version,
            "workloads": self.workloads(),
            "paths": self.path_names(),
            "tools": self.tools,
            "cells": cells,
            "limits": self.limits,
            "interrupted": self.interrupted,
        })
    }

    /// The same-run limits, from whole cells only: the best memory-to-memory
    /// cell of each path, each emulated path's rate, the local copy of each
    /// file workload. The local copy's is its fastest run (put or get, both
    /// the same copy): what the storage did at best in this run. Its median
    /// on a contended disk fell below peers' (`cp -a` of 200 small files at
    /// 7 MB/s, 17 in its fastest run), so a "limit" a transfer beat.
    pub fn finish_limits(&mut self) {
        for p in &self.paths {
            if let (Some(r), true) = (p.rate_bps, p.name != "loopback") {
                self.limits
                    .path_bytes_per_second
                    .insert(p.name.clone(), r as f64 / 8.0);
            }
        }
        for c in self.cells.iter().filter(|c| c.whole()) {
            let Some(r) = &c.rate else { continue };
            if c.workload == "mem" {
                let e = self
                    .limits
                    .mem_to_mem_bytes_per_second
                    .entry(c.path.clone())
                    .or_insert(0.0);
                *e = e.max(r.median_bytes_per_second);
            } else if c.tool == "cp" {
                let fastest = c
                    .runs
                    .iter()
                    .filter(|r| r.ok())
                    .filter_map(|r| r.bytes_per_second)
                    .fold(r.median_bytes_per_second, f64::max);
                let e = self
                    .limits
                    .local_copy_bytes_per_second
                    .entry(c.workload.clone())
                    .or_insert(0.0);
                *e = e.max(fastest);
            }
        }
    }
}

/// The mean of the runs' values where every run has one; None otherwise
/// (one end whose CPU could not be read makes the cell's unknown).
fn mean_all(v: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Option<Vec<f64>> = v.collect();
    let v = v.filter(|v| !v.is_empty())?;
    Some(v.iter().sum::<f64>() / v.len() as f64)
}

impl CellRuns {
    /// The cell's median, spread, CPU and verdict from its runs: the rate
    /// of the runs that ran, how many succeeded (and verified) of those
    /// planned, what the tool did not keep.
    pub fn summarise(&mut self, planned: u32) {
        let succeeded = self.runs.iter().filter(|r| r.ok()).count();
        // A copy that did not verify still moved: its rate is shown, marked.
        let ran: Vec<&RunResult> = self
            .runs
            .iter()
            .filter(|r| r.error.is_none() && r.bytes_per_second.is_some())
            .collect();
        let mut rates: Vec<f64> = ran.iter().filter_map(|r| r.bytes_per_second).collect();
        rates.sort_by(f64::total_cmp);
        let c = &mut self.cell;
        if let Some(e) = self.runs.iter().find_map(|r| r.error.clone()) {
            c.error = Some(e);
        }
        c.runs_succeeded = Some(succeeded as u32);
        c.runs_planned = Some(planned);
        if !rates.is_empty() {
            let n = rates.len();
            let med = median(&rates).unwrap_or(0.0);
            c.rate = Some(Rate {
                median_bytes_per_second: med,
                min_bytes_per_second: rates[0],
                max_bytes_per_second: rates[n - 1],
                median_bits_per_second: med * 8.0,
            });
            c.cpu_seconds = Some(Cpu {
                client_seconds: mean_all(ran.iter().map(|r| r.cpu_client_seconds)),
                server_seconds: mean_all(ran.iter().map(|r| r.cpu_server_seconds)),
            });
        }
        let v: Vec<bool> = self.runs.iter().filter_map(|r| r.verified).collect();
        c.verified = (!v.is_empty()).then(|| v.iter().all(|&x| x));
        let mut not_kept: Vec<String> = self.runs.iter().flat_map(|r| r.not_kept.clone()).collect();
        not_kept.sort();
        not_kept.dedup();
        c.not_kept = not_kept;
    }
}

/// A matrix run: the run's row and its matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MatrixRun {
    pub run: RunRow,
    pub matrix: Document,
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
        if let Some(matrix) = Document::of(&detail) {
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
        let matrix = doc.as_ref().and_then(Document::from_doc);
        self.writer.result(crate::writer::RunResult {
            summary: doc,
            seconds: Some(self.started.elapsed().as_secs_f64()),
            verified: matrix.as_ref().and_then(Document::verified),
            ..crate::writer::RunResult::default()
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
            "tools": [{"name": "a", "settings": ["s"], "installed": true, "note": null}],
            "limits": {},
            "added_later": true
        });
        let m = Document::from_doc(&doc).unwrap();
        assert_eq!(m.tools[0].version, None);
        let mut again = m.clone();
        again.tools[0].version = Some("a 1.0".into());
        let text = serde_json::to_string(&again).unwrap();
        assert_eq!(
            Document::from_text(&text).unwrap().tools[0]
                .version
                .as_deref(),
            Some("a 1.0")
        );
        assert_eq!(m.workloads(), ["mem", "tree"]);
        assert_eq!(m.path_names(), ["loopback", "lan"]);
        assert_eq!(m.cells[0].bits_per_second(), Some(8e9));
        assert_eq!(m.cells[1].bits_per_second(), None);
        assert_eq!(m.verified(), Some(false));
        assert_eq!(
            m.rows(),
            [("a".into(), "s".into()), ("b".into(), "s".into())]
        );
        assert!(Document::from_doc(&json!({"format": "longhaul-perf"})).is_none());
        assert!(Document::from_doc(&json!([1, 2])).is_none());
        assert!(Document::from_doc(&json!({"format": FORMAT, "cells": "x"})).is_none());
    }
}
