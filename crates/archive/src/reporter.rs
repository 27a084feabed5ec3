//! [`ArchiveReporter`]: a command's events, as rows of the archive. It is
//! one more reporter beside the printers: perf's intervals (every stream
//! and each direction's total), a transfer's progress and intervals, each
//! command's result and how it ended. Rows go to the [`Writer`] thread, so
//! reporting never waits on the database.

use std::path::Path;
use std::time::Instant;

use longhaul_engine::doctor::DoctorReport;
use longhaul_engine::report::{Reporter, TransferProgress};
use longhaul_engine::results::CommandReporter;
use longhaul_engine::xfer::{Catalogue, Landed};
use longhaul_proto::disk::DiskReport;
use longhaul_proto::report::{IntervalReport, Setup, Summary, TcpReport};
use longhaul_proto::tune::TransferInterval;
use longhaul_proto::xfer::report::CopyReport;

use crate::model::{IntervalRow, Loss, NewRun};
use crate::store::{Archive, ArchiveError};
use crate::writer::{Finisher, RunEnd, RunResult, Writer};

/// Warnings kept per run, at most.
const MAX_WARNINGS: usize = 100;

/// How often a transfer's live counters are written (the writer commits
/// every 250 ms anyway).
const LIVE_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Archives one run of a command.
pub struct ArchiveReporter {
    writer: Option<Writer>,
    finisher: Option<Finisher>,
    path: std::path::PathBuf,
    warnings: Vec<String>,
    /// Set by a result that says the run was only partly done.
    partial: bool,
    /// perf: bytes so far, summed from the intervals.
    perf_bytes: u64,
    /// A transfer's last live sample: when, and the bytes then.
    live_at: Option<(Instant, u64)>,
    live_rate: Option<f64>,
    /// What the run lost, once it ended.
    loss: Option<Loss>,
}

fn json<T: serde::Serialize>(v: &T) -> Option<serde_json::Value> {
    serde_json::to_value(v).ok()
}

fn name_of<T: serde::Serialize>(v: &T) -> Option<String> {
    match serde_json::to_value(v).ok()? {
        serde_json::Value::String(s) => Some(s),
        _ => None,
    }
}

impl ArchiveReporter {
    /// Opens the archive at `path` and records `run` as started. Runs of
    /// this host left `running` by a process that is gone are marked
    /// interrupted first.
    pub fn start(path: &Path, run: &NewRun) -> Result<ArchiveReporter, ArchiveError> {
        let archive = Archive::open(path)?;
        if let Err(e) = archive.settle_orphans() {
            tracing::warn!("{e}");
        }
        let id = archive.begin_run(run)?;
        let (writer, finisher) = Writer::start(archive, id);
        Ok(ArchiveReporter {
            writer: Some(writer),
            finisher: Some(finisher),
            path: path.to_path_buf(),
            warnings: Vec::new(),
            partial: false,
            perf_bytes: 0,
            live_at: None,
            live_rate: None,
            loss: None,
        })
    }

    /// The run's id.
    pub fn run(&self) -> Option<i64> {
        self.writer.as_ref().map(Writer::run)
    }

    /// The archive file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where a cp or sync tells the files that landed: into this run's
    /// catalogue.
    pub fn catalogue(&self) -> Option<Catalogue> {
        let w = self.writer.clone()?;
        Some(std::sync::Arc::new(move |l: Landed| w.landed(l)))
    }

    /// What the archive could not keep, once the run has ended.
    pub fn loss(&self) -> Option<&Loss> {
        self.loss.as_ref()
    }

    fn with(&self, f: impl FnOnce(&Writer)) {
        if let Some(w) = &self.writer {
            f(w);
        }
    }
}

fn tcp_fields(row: &mut IntervalRow, tcp: Option<&TcpReport>) {
    if let Some(t) = tcp {
        row.retransmits = Some(t.retransmits);
        row.rtt_us = Some(t.rtt_us);
        row.cwnd_bytes = Some(t.cwnd_bytes);
    }
}

/// perf: one interval as rows, each direction's total and every stream.
pub fn perf_rows(r: &IntervalReport) -> Vec<IntervalRow> {
    let base = |direction: &str, stream: i32, bytes: u64, bps: f64| IntervalRow {
        idx: r.index,
        direction: direction.to_string(),
        stream,
        start_s: r.start_s,
        end_s: r.end_s,
        bytes,
        bits_per_second: bps,
        retransmits: None,
        rtt_us: None,
        cwnd_bytes: None,
        streams: None,
        limit: None,
        omitted: r.omitted,
    };
    let mut rows = Vec::with_capacity(r.directions.len() + r.streams.len());
    for d in &r.directions {
        let dir = name_of(&d.direction).unwrap_or_default();
        let mut row = base(&dir, -1, d.bytes, d.bits_per_second);
        tcp_fields(&mut row, d.tcp.as_ref());
        row.streams = Some(
            r.streams
                .iter()
                .filter(|s| s.direction == d.direction)
                .count() as u32,
        );
        row.limit = name_of(&d.limit.kind);
        rows.push(row);
    }
    for s in &r.streams {
        let dir = name_of(&s.direction).unwrap_or_default();
        let mut row = base(&dir, i32::from(s.stream), s.bytes, s.bits_per_second);
        tcp_fields(&mut row, s.tcp.as_ref());
        rows.push(row);
    }
    rows
}

/// cp, sync: one interval of the sending side as a row.
pub fn transfer_row(i: &TransferInterval) -> IntervalRow {
    IntervalRow {
        idx: i.index,
        direction: "send".into(),
        stream: -1,
        start_s: i.start_s,
        end_s: i.end_s,
        bytes: i.bytes,
        bits_per_second: i.bits_per_second,
        retransmits: Some(i.retransmits),
        rtt_us: Some(i.rtt_us),
        cwnd_bytes: None,
        streams: Some(u32::from(i.active_streams)),
        limit: name_of(&i.limit),
        omitted: false,
    }
}

impl Reporter for ArchiveReporter {
    fn setup(&mut self, setup: &Setup) {
        if let Some(v) = json(setup) {
            self.with(|w| w.params(v));
        }
    }

    fn interval(&mut self, report: &IntervalReport) {
        let bps: f64 = report.directions.iter().map(|d| d.bits_per_second).sum();
        self.perf_bytes += report.directions.iter().map(|d| d.bytes).sum::<u64>();
        let bytes = self.perf_bytes;
        self.with(|w| {
            for row in perf_rows(report) {
                w.interval(row);
            }
            w.live(bytes, 0, Some(bps));
        });
    }

    fn summary(&mut self, s: &Summary) {
        let result = RunResult {
            summary: json(s),
            bytes: Some(s.bytes),
            files: None,
            seconds: Some(s.seconds),
            bits_per_second: Some(s.bits_per_second),
            verified: None,
            verdict: name_of(&s.limit.kind),
        };
        self.with(|w| w.result(result));
    }

    fn warning(&mut self, message: &str) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(message.to_string());
        }
    }

    fn transfer_progress(&mut self, p: &TransferProgress) {
        let now = Instant::now();
        match self.live_at {
            Some((at, _)) if now.duration_since(at) < LIVE_EVERY => return,
            Some((at, bytes)) => {
                let secs = now.duration_since(at).as_secs_f64();
                self.live_rate = Some(p.bytes.saturating_sub(bytes) as f64 * 8.0 / secs);
            }
            None => {}
        }
        self.live_at = Some((now, p.bytes));
        let rate = self.live_rate;
        self.with(|w| w.live(p.bytes, p.files, rate));
    }

    fn transfer_interval(&mut self, i: &TransferInterval) {
        self.with(|w| w.interval(transfer_row(i)));
    }

    fn end(&mut self, failure: Option<(&str, i32)>) {
        let Some(w) = self.writer.take() else {
            return;
        };
        let status = match failure {
            None if self.partial => "partial",
            None => "ok",
            Some((_, 130)) => "interrupted",
            Some(_) => "failed",
        };
        w.end(RunEnd {
            status: status.into(),
            error: failure.map(|(m, _)| m.to_string()),
            exit_code: Some(failure.map_or(if self.partial { 6 } else { 0 }, |(_, c)| c)),
            warnings: std::mem::take(&mut self.warnings),
        });
        drop(w);
        if let Some(f) = self.finisher.take() {
            self.loss = Some(f.finish());
        }
    }
}

impl CommandReporter for ArchiveReporter {
    fn transfer_summary(&mut self, s: &CopyReport) {
        self.partial = !s.failed.is_empty();
        // The intervals are rows already; the rest is the summary.
        let mut summary = json(s);
        if let Some(serde_json::Value::Object(m)) = summary.as_mut() {
            m.remove("intervals");
        }
        for w in &s.warnings {
            self.warning(w);
        }
        // A dry run moved and verified nothing: what it would do is in
        // its summary (`would_send`, `deleted`), the run says `dry_run`.
        let result = RunResult {
            summary,
            bytes: Some(s.bytes),
            files: Some(s.files),
            seconds: Some(s.seconds),
            bits_per_second: Some(s.bits_per_second),
            verified: (!s.dry_run).then_some(s.verified),
            verdict: s.verdict.map(|v| v.name().to_string()),
        };
        let (bytes, files) = (s.bytes, s.files);
        self.with(|w| {
            w.live(bytes, files, None);
            w.result(result);
        });
    }

    fn doctor(&mut self, r: &DoctorReport) {
        let result = RunResult {
            summary: json(r),
            seconds: Some(r.seconds),
            bits_per_second: r.verdict.as_ref().map(|v| v.ceiling_bps),
            verdict: r.verdict.as_ref().and_then(|v| name_of(&v.stage)),
            ..RunResult::default()
        };
        self.with(|w| w.result(result));
    }

    fn disk(&mut self, r: &DiskReport) {
        let result = RunResult {
            summary: json(r),
            bits_per_second: r
                .write
                .as_ref()
                .or(r.read.as_ref())
                .map(|s| s.bytes_per_second * 8.0),
            ..RunResult::default()
        };
        self.with(|w| w.result(result));
    }
}
