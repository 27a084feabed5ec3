//! The rows of the archive as Rust values: what is written and what the
//! queries give back (`history`, `show`, `where`, the dashboard, plots).

use serde::Serialize;

/// The kinds of run the archive keeps.
pub const KINDS: &[&str] = &[
    "perf",
    "cp",
    "sync",
    "doctor",
    "bench-disk",
    "served",
    "matrix",
    "job",
];

/// The kind of the runs a server archives for what it served
/// ([`crate::served`]).
pub const SERVED: &str = "served";

/// A run as it starts.
#[derive(Debug, Clone, Default)]
pub struct NewRun {
    pub kind: String,
    pub command: String,
    pub remote_host: Option<String>,
    pub export: Option<String>,
    pub grant: Option<String>,
    pub source: Option<String>,
    pub dest: Option<String>,
    pub params: Option<serde_json::Value>,
}

/// One line of `history`: a run without its intervals and files.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunRow {
    pub id: i64,
    pub kind: String,
    /// `running`, `ok`, `partial`, `failed` or `interrupted`.
    pub status: String,
    /// Unix seconds.
    pub started_at: f64,
    pub ended_at: Option<f64>,
    pub updated_at: f64,
    pub command: String,
    pub local_host: String,
    pub remote_host: Option<String>,
    pub export: Option<String>,
    pub grant: Option<String>,
    pub source: Option<String>,
    pub dest: Option<String>,
    pub bytes: Option<u64>,
    pub files: Option<u64>,
    pub seconds: Option<f64>,
    pub bits_per_second: Option<f64>,
    pub verified: Option<bool>,
    pub verdict: Option<String>,
    /// While it runs: bytes and files so far, and the latest rate.
    pub live_bytes: u64,
    pub live_files: u64,
    pub live_bps: Option<f64>,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    /// Rows (intervals, files) the archive could not keep for this run.
    pub lost: u64,
    /// `sync -n`: what would have been done, nothing was.
    pub dry_run: bool,
}

/// An archived attempt of a job (a run of kind `job`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobRun {
    #[serde(flatten)]
    pub run: RunRow,
    /// The job's id.
    pub job: String,
    /// The attempt, and (a recurring job's) the run it belongs to.
    pub attempt: u32,
    pub run_number: u32,
}

/// One interval of a run: a stream's, or (`stream == -1`) a direction's total.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IntervalRow {
    pub idx: u32,
    /// perf: `up` or `down`; cp/sync: `send`.
    pub direction: String,
    /// The stream, or -1 for all streams of the direction.
    pub stream: i32,
    pub start_s: f64,
    pub end_s: f64,
    pub bytes: u64,
    pub bits_per_second: f64,
    pub retransmits: Option<u64>,
    pub rtt_us: Option<u32>,
    pub cwnd_bytes: Option<u64>,
    /// cp/sync: streams carrying chunks.
    pub streams: Option<u32>,
    /// What limited the interval (`cwnd`, `receiver_window`, `storage_read`, ...).
    pub limit: Option<String>,
    /// perf: inside `--omit`, not counted in the summary.
    pub omitted: bool,
}

/// One file a cp or sync moved.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FileRow {
    /// The file as the transfer named it (relative to its root).
    pub path: String,
    pub source: String,
    pub dest: String,
    pub size: u64,
    pub mtime_ns: Option<i64>,
    /// The file's BLAKE3 (hex, what `b3sum` prints), as `--digests` writes it.
    pub digest: Option<String>,
    pub verified: bool,
}

/// `where`: a file some run moved, with the run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FileHit {
    pub run: i64,
    pub kind: String,
    pub started_at: f64,
    pub status: String,
    #[serde(flatten)]
    pub file: FileRow,
}

/// `show`: a run whole.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunRow,
    pub params: Option<serde_json::Value>,
    pub summary: Option<serde_json::Value>,
    pub warnings: Vec<String>,
    pub intervals: Vec<IntervalRow>,
    /// Files in the catalogue for this run (the rows: [`crate::Archive::files`]).
    pub file_count: u64,
}

/// Which runs `history` lists.
#[derive(Debug, Clone, Default)]
pub struct HistoryFilter {
    pub kind: Option<String>,
    /// Matches the remote host (a substring).
    pub host: Option<String>,
    /// Unix seconds: runs started at or after.
    pub since: Option<f64>,
    pub export: Option<String>,
    pub status: Option<String>,
    /// At most this many, newest first (0: all).
    pub limit: usize,
}

/// What the writer could not keep, told when a run ends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Loss {
    pub rows: u64,
    /// The first error, when there was one.
    pub error: Option<String>,
}
