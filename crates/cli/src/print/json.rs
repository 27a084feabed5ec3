//! The machine-readable printers: `perf --json` (one document) and
//! `--json-stream` (one JSON object per line), and the format versions of
//! every `--json` output (docs/JSON.md).

use longhaul_engine::sink::Reporter;
use longhaul_proto::report::{IntervalReport, Setup, Summary};
use serde_json::json;

/// Version of the JSON output format; bumped on any incompatible change.
pub const JSON_FORMAT_VERSION: u32 = 1;

/// Version of `cp`/`sync --json` (`longhaul-cp`): 2 since `would_send`
/// says where each file lands (`ENTRY -> WHERE`).
pub const CP_JSON_FORMAT_VERSION: u32 = 2;

fn out(line: &str) {
    crate::print::out(format_args!("{line}"));
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
}

impl JsonDoc {
    /// Prints the document; `error` is set when the run failed.
    pub fn finish(&self, error: Option<(&str, i32)>) {
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
}

impl JsonStream {
    pub fn error(message: &str, code: i32) {
        line("error", json!({"message": message, "exit_code": code}));
    }
}
