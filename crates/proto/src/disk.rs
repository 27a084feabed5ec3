//! What a storage benchmark measured (`longhaul bench disk`, and the
//! server's side of `longhaul doctor`, which sends it in a
//! [`ProbeResult`](crate::disk::ProbeResult)). Plain data: the engine
//! measures, this crate only carries it.

use serde::{Deserialize, Serialize};

use crate::doctor::HostSettings;

/// A sequential read or write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SeqResult {
    pub bytes: u64,
    pub seconds: f64,
    pub bytes_per_second: f64,
}

/// Small files created or read, one after another, as a LOSF transfer does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct FilesResult {
    pub files: u64,
    /// Bytes in each file.
    pub file_size: u64,
    pub seconds: f64,
    pub files_per_second: f64,
}

/// One run of the storage benchmark on one directory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiskReport {
    pub path: String,
    /// The file system's type (`ext4`, `tmpfs`, ...), from statfs.
    pub filesystem: String,
    /// True if the sequential tests bypassed the page cache (O_DIRECT).
    pub direct: bool,
    pub block_size: u64,
    pub threads: u32,
    pub file_size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<SeqResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<SeqResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<FilesResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_read: Option<FilesResult>,
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// Which storage tests a probe runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeTests {
    pub write: bool,
    pub read: bool,
    pub create: bool,
}

/// `longhaul doctor` asks a server to measure the storage behind an export:
/// sequential write (or read) and small-file creates, in a scratch
/// directory it makes under `path` and removes afterwards. Writing needs a
/// writable export and a credential that may write to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeRequest {
    pub export: String,
    pub path: String,
    pub tests: ProbeTests,
    /// Upper bounds the server may lower (it caps both).
    pub max_bytes: u64,
    pub max_files: u64,
    pub max_millis: u64,
    /// Also send this host's settings ([`HostSettings`]).
    #[serde(default)]
    pub host: bool,
    /// Remove this scratch directory (made by an earlier file-to-file run
    /// of the doctor) under `path`; only names starting `.longhaul-doctor-`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove: Option<String>,
}

/// The server's answer to a [`ProbeRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    pub report: DiskReport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostSettings>,
    /// The directory measured, within the export: the path asked for, or
    /// the nearest directory above it when it does not exist yet. Scratch
    /// data of the doctor's copy goes there too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

/// The prefix of scratch directories a doctor may ask a server to remove.
pub const DOCTOR_SCRATCH_PREFIX: &str = ".longhaul-doctor-";

/// What a server does at most for one probe, whatever is asked.
pub const PROBE_MAX_BYTES: u64 = 1 << 30;
pub const PROBE_MAX_FILES: u64 = 20_000;
pub const PROBE_MAX_MILLIS: u64 = 10_000;
