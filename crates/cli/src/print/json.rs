//! The machine-readable printers, all on stdout: `perf --json` (one
//! document) and `--json-stream` (one JSON object per line), and [`Json`],
//! the one document of every other command. Each document names its
//! `format` and carries its `format_version`, documented in docs/JSON.md;
//! a version is bumped on any incompatible change.

use longhaul_engine::doctor::DoctorReport;
use longhaul_engine::report::Reporter;
use longhaul_engine::results::{CommandReporter, WanHosts};
use longhaul_engine::wan::LinkStats;
use longhaul_proto::disk::DiskReport;
use longhaul_proto::report::{IntervalReport, Setup, Summary};
use longhaul_proto::tune::TransferInterval;
use longhaul_proto::xfer::report::CopyReport;
use longhaul_proto::xfer::ListEntry;
use serde_json::{json, Value};

/// Version of `perf --json` and `--json-stream` (`longhaul-perf`).
pub const JSON_FORMAT_VERSION: u32 = 2;

/// Version of `cp`/`sync --json` (`longhaul-cp`): 2 since `would_send`
/// says where each file lands (`ENTRY -> WHERE`).
pub const CP_JSON_FORMAT_VERSION: u32 = 2;

/// Version of `ls --json` (`longhaul-ls`).
pub const LS_JSON_FORMAT_VERSION: u32 = 1;

/// Version of `doctor --json` (`longhaul-doctor`).
pub const DOCTOR_JSON_FORMAT_VERSION: u32 = 1;

/// Version of `bench disk --json` (`longhaul-disk`).
pub const DISK_JSON_FORMAT_VERSION: u32 = 1;

/// Version of `wan up --json` (`longhaul-wan`).
pub const WAN_JSON_FORMAT_VERSION: u32 = 1;

/// Version of `id --json` (`longhaul-id`).
pub const ID_JSON_FORMAT_VERSION: u32 = 1;

/// Version of `cp --ranks ... --json` (`longhaul-fleet`): the one result of a fleet.
pub const FLEET_JSON_FORMAT_VERSION: u32 = 1;

/// A fleet's one result (docs/JSON.md section 14), one line on stdout.
pub fn fleet(s: &longhaul_fleet::run::FleetSummary) {
    let mut v = serde_json::to_value(s).expect("a summary serializes");
    if let Some(o) = v.as_object_mut() {
        o.insert("format".into(), "longhaul-fleet".into());
        o.insert("format_version".into(), FLEET_JSON_FORMAT_VERSION.into());
    }
    out(&v.to_string());
}

fn out(line: &str) {
    crate::print::out_json(line);
}

/// `--json`: collects everything, prints one document at the end.
#[derive(Default)]
pub struct JsonDoc {
    setup: Option<serde_json::Value>,
    intervals: Vec<serde_json::Value>,
    warnings: Vec<String>,
    summary: Option<serde_json::Value>,
}

impl Reporter for JsonDoc {
    fn setup(&mut self, s: &Setup) {
        self.setup = serde_json::to_value(s).ok();
    }
    fn interval(&mut self, r: &IntervalReport) {
        if let Ok(v) = serde_json::to_value(r) {
            self.intervals.push(v);
        }
    }
    fn summary(&mut self, s: &Summary) {
        self.summary = serde_json::to_value(s).ok();
    }
    fn warning(&mut self, m: &str) {
        self.warnings.push(m.to_string());
    }
    fn end(&mut self, failure: Option<(&str, i32)>) {
        self.finish(failure);
    }
}

impl JsonDoc {
    /// Prints the document; `error` is set when the run failed.
    fn finish(&self, error: Option<(&str, i32)>) {
        let doc = json!({
            "format": "longhaul-perf",
            "format_version": JSON_FORMAT_VERSION,
            "start": self.setup,
            "intervals": self.intervals,
            "warnings": self.warnings,
            "summary": self.summary,
            "error": error.map(|(m, code)| json!({"message": m, "exit_code": code})),
        });
        out(&serde_json::to_string_pretty(&doc).unwrap_or_default());
    }
}

/// `--json-stream`: one line per event as it happens.
pub struct JsonStream;

fn line(event: &str, body: serde_json::Value) {
    let mut v = json!({"event": event, "format_version": JSON_FORMAT_VERSION});
    if let (Some(o), serde_json::Value::Object(b)) = (v.as_object_mut(), body) {
        o.extend(b);
    }
    out(&v.to_string());
}

impl Reporter for JsonStream {
    fn setup(&mut self, s: &Setup) {
        line("start", serde_json::to_value(s).unwrap_or_default());
    }
    fn interval(&mut self, r: &IntervalReport) {
        line("interval", serde_json::to_value(r).unwrap_or_default());
    }
    fn summary(&mut self, s: &Summary) {
        line("summary", serde_json::to_value(s).unwrap_or_default());
    }
    fn warning(&mut self, m: &str) {
        line("warning", json!({ "message": m }));
    }
    fn end(&mut self, failure: Option<(&str, i32)>) {
        if let Some((message, code)) = failure {
            line("error", json!({"message": message, "exit_code": code}));
        }
    }
}

/// `--json` of every command but perf: one document with the command's
/// outcome, printed when it ends.
pub struct Json {
    format: &'static str,
    version: u32,
    /// On a failure, print `{format, format_version, error}` (cp and sync
    /// do; the others print their failure on stderr only).
    error_document: bool,
    /// cp --intervals: a line per interval of the transfer, to stderr.
    intervals: bool,
}

impl Json {
    /// `cp --json`, `sync --json`; with `intervals`, the interval lines
    /// for people still go to stderr.
    pub fn transfer(intervals: bool) -> Self {
        Self {
            format: "longhaul-cp",
            version: CP_JSON_FORMAT_VERSION,
            error_document: true,
            intervals,
        }
    }

    pub fn ls() -> Self {
        Self::new("longhaul-ls", LS_JSON_FORMAT_VERSION)
    }

    pub fn doctor() -> Self {
        Self::new("longhaul-doctor", DOCTOR_JSON_FORMAT_VERSION)
    }

    pub fn disk() -> Self {
        Self::new("longhaul-disk", DISK_JSON_FORMAT_VERSION)
    }

    pub fn wan() -> Self {
        Self::new("longhaul-wan", WAN_JSON_FORMAT_VERSION)
    }

    pub fn id() -> Self {
        Self::new("longhaul-id", ID_JSON_FORMAT_VERSION)
    }

    fn new(format: &'static str, version: u32) -> Self {
        Self {
            format,
            version,
            error_document: false,
            intervals: false,
        }
    }

    /// `body` (an object) with `format` and `format_version` added.
    fn document(&self, body: Value) -> Value {
        let mut v = match body {
            Value::Object(o) => Value::Object(o),
            other => json!({ "value": other }),
        };
        v["format"] = self.format.into();
        v["format_version"] = self.version.into();
        v
    }

    fn print_pretty(&self, body: Value) {
        out(&serde_json::to_string_pretty(&self.document(body)).unwrap_or_default());
    }
}

impl Reporter for Json {
    fn warning(&mut self, message: &str) {
        // Not part of the document (a transfer's are in its summary): for
        // the person who started the command.
        errln!("longhaul: warning: {message}");
    }
    fn transfer_interval(&mut self, i: &TransferInterval) {
        if self.intervals {
            errln!("{}", super::human::transfer_interval_line(i));
        }
    }
    fn end(&mut self, failure: Option<(&str, i32)>) {
        if let (Some((message, code)), true) = (failure, self.error_document) {
            let body = json!({"error": {"message": message, "exit_code": code}});
            out(&self.document(body).to_string());
        }
    }
}

impl CommandReporter for Json {
    fn transfer_summary(&mut self, s: &CopyReport) {
        self.print_pretty(serde_json::to_value(s).unwrap_or_default());
    }
    fn listing(&mut self, entries: &[ListEntry]) {
        self.print_pretty(json!({ "entries": entries }));
    }
    fn doctor(&mut self, r: &DoctorReport) {
        self.print_pretty(serde_json::to_value(r).unwrap_or_default());
    }
    fn disk(&mut self, r: &DiskReport) {
        self.print_pretty(serde_json::to_value(r).unwrap_or_default());
    }
    fn identity(&mut self, fingerprint: &str) {
        out(&self
            .document(json!({ "fingerprint": fingerprint }))
            .to_string());
    }
    fn wan_up(&mut self, h: &WanHosts) {
        // One line: a script reads it as the sign that the link is up.
        let body = json!({"hosts": {"a": h.a.to_string(), "b": h.b.to_string()}});
        out(&self.document(body).to_string());
    }
    fn wan_down(&mut self, ab: &LinkStats, ba: &LinkStats) {
        super::human::print_wan_down(ab, ba);
    }
}

/// perf's printers take perf's events only; no command result reaches them.
impl CommandReporter for JsonDoc {}
impl CommandReporter for JsonStream {}
