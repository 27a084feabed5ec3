//! The outcome of a copy: one type for what `cp` prints, its `--json`
//! (JSON.md), the archive's record and what a third-party copy's source
//! relays to the ordering client (PROTOCOL.md 13.9 `done`).
//!
//! What crosses the wire is the report less what only the ordering
//! client knows ([`CopyReport::relayed`]); the fields that never cross
//! are `skip_deserializing`, so a peer cannot set them.

use serde::{Deserialize, Serialize};

use super::{compress::CompressReport, is_zero, CpuStages, Failure};
use crate::report::Opened;
use crate::tune::{TransferInterval, TransferLimit, TuningReport};
use crate::window::{PathRecord, WindowPlan};

/// The outcome of a `cp` (and of `sync`, a fleet rank's share, a job's
/// attempt, a third-party copy).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CopyReport {
    pub files: u64,
    pub bytes: u64,
    /// Symbolic links created as links (never followed), or already there
    /// pointing the same way; with `--dry-run`, that would be, or are.
    #[serde(default)]
    pub links: u64,
    /// Of `links`, those already there pointing the same way: left alone.
    #[serde(default)]
    pub links_up_to_date: u64,
    /// Files that changed while they were read and were sent again (each
    /// is verified against what was read the last time).
    #[serde(default)]
    pub resent_changed: u64,
    /// Bytes sent a second time because the stream carrying them stalled
    /// at the transfer's end (the end game; the first verified copy is
    /// kept, the other discarded).
    #[serde(default)]
    pub resent_bytes: u64,
    pub seconds: f64,
    /// The bytes this run sent: `bytes` less `resumed_bytes`.
    pub sent_bytes: u64,
    /// `sent_bytes` over `seconds`: what this run moved over the network.
    pub bits_per_second: f64,
    /// True only if every file was verified at the destination.
    pub verified: bool,
    pub failed: Vec<Failure>,
    pub skipped: u64,
    pub resumed_bytes: u64,
    pub streams: u16,
    /// `TLS1.3 <cipher suite>`, or `none` (plaintext).
    pub encryption: String,
    /// Rates of each stage on its own: what it did over the time it was busy.
    #[serde(default)]
    pub source_read_bps: f64,
    #[serde(skip_deserializing)]
    pub network_bps: f64,
    #[serde(default)]
    pub dest_write_bps: f64,
    /// Where each end's CPU went, by stage (an end that did not say, an
    /// older server, is absent).
    #[serde(skip_deserializing, skip_serializing_if = "CpuStages::is_empty")]
    pub cpu_stages: CpuStages,
    pub attempts: u32,
    /// How the streams were sized for the path.
    #[serde(skip_deserializing)]
    pub path: Option<PathTuning>,
    /// What the source's tuner chose (streams, chunk size, files in flight).
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<TuningReport>,
    /// The sender's intervals, each with what limited it.
    #[serde(skip_deserializing, skip_serializing_if = "Vec::is_empty")]
    pub intervals: Vec<TransferInterval>,
    /// What limited the transfer: the limit of most of its intervals
    /// (`rate_cap` when `--rate` held it, as asked).
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<TransferLimit>,
    /// Conditions that bound the transfer, with the fix (window caps).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// A third-party copy: what the ordering client's own connections
    /// carried.
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub third_party: Option<ThirdPartyUse>,
    /// Over ssh: which side opened the connections to the far end, and
    /// why.
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub connections: Option<Opened>,
    /// `sync --delete`: destination paths removed (or, with --dry-run, that would be).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted: Vec<String>,
    /// `--dry-run`: the files that would be sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub would_send: Vec<String>,
    /// `--dry-run`: the bytes of the files that would be sent.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub would_send_bytes: u64,
    /// `--dry-run`: nothing was sent, written or deleted; `files`, `bytes`
    /// and `verified` say nothing was moved.
    #[serde(skip_deserializing, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// With several paths (`--bind`, `--via`): each path's streams and the
    /// bytes that crossed it (TCP payload, TLS records included).
    #[serde(skip_deserializing, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathUse>,
    /// `-z`: the source's account of compression (raw and wire bytes,
    /// whether and why it was turned off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<CompressReport>,
}

impl CopyReport {
    /// What a third-party copy's source relays of its report (PROTOCOL.md
    /// 13.9 `done`): the report less what only a client that ran the
    /// streams itself knows (the path, the tuner, the intervals, the
    /// connections), which the ordering client does not print as its own.
    pub fn relayed(&self) -> CopyReport {
        CopyReport {
            network_bps: 0.0,
            cpu_stages: CpuStages::default(),
            path: None,
            tuning: None,
            intervals: Vec::new(),
            verdict: None,
            third_party: None,
            connections: None,
            dry_run: false,
            paths: Vec::new(),
            ..self.clone()
        }
    }
}

/// One path of a transfer's data streams.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PathUse {
    /// This host's address and the server's.
    pub local: String,
    pub remote: String,
    pub streams: u16,
    pub bytes: u64,
}

/// The path as measured and the settings chosen for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathTuning {
    #[serde(flatten)]
    pub window: WindowPlan,
    /// The sending side's congestion control (on a pull, as requested).
    pub congestion: String,
    /// Each stream's pacing cap, bytes/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pacing: Option<u64>,
    /// The doctor's measurement of this path the streams were sized for
    /// (with [`crate::window::HEADROOM`]), when there was one and no `--rate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remembered: Option<PathRecord>,
}

/// What the ordering client's own connections carried in a third-party
/// copy: the measure that the data did not pass through it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ThirdPartyUse {
    /// The source and destination servers as named.
    pub source: String,
    pub dest: String,
    /// Bytes this client's sockets carried, both control connections, both
    /// ways (the kernel's `tcpi_bytes_acked` plus `tcpi_bytes_received`,
    /// TLS included).
    pub control_bytes: u64,
    /// Which end opened the data's connections: `source` (it dialled the
    /// destination, as usual) or `dest` (it connected back to the source,
    /// with `reason`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_connections: Option<Opened>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> CopyReport {
        CopyReport {
            files: 3,
            bytes: 10,
            links: 1,
            links_up_to_date: 6,
            resent_changed: 2,
            seconds: 1.5,
            sent_bytes: 9,
            bits_per_second: 48.0,
            verified: true,
            failed: vec![Failure {
                path: "p".into(),
                error: "e".into(),
            }],
            skipped: 4,
            resumed_bytes: 1,
            streams: 5,
            encryption: "TLS1.3 x".into(),
            source_read_bps: 11.0,
            network_bps: 13.0,
            dest_write_bps: 12.0,
            attempts: 2,
            intervals: vec![TransferInterval::default()],
            verdict: Some(TransferLimit::default()),
            dry_run: true,
            paths: vec![PathUse::default()],
            deleted: vec!["d".into()],
            would_send: vec!["w".into()],
            would_send_bytes: 7,
            warnings: vec!["x".into()],
            compression: Some(CompressReport {
                level: 3,
                raw_bytes: 10,
                wire_bytes: 5,
                ..Default::default()
            }),
            ..CopyReport::default()
        }
    }

    /// What a source relays comes back whole at the ordering client.
    #[test]
    fn a_relayed_report_crosses_the_wire_and_comes_back_whole() {
        let relayed = full().relayed();
        let wire = serde_json::to_vec(&relayed).unwrap();
        let back: CopyReport = serde_json::from_slice(&wire).unwrap();
        assert_eq!(back, relayed);
        assert_eq!(back.files, 3);
        assert_eq!(back.would_send_bytes, 7);
    }

    /// The attacker is a source server: what only the ordering client
    /// knows of its own run (its streams, intervals, verdict, dry run) is
    /// not taken from the wire.
    #[test]
    fn attacker_a_source_cannot_set_what_only_the_client_knows() {
        let mut sent = serde_json::to_value(full()).unwrap();
        sent["third_party"] = serde_json::json!({"source": "x", "dest": "y", "control_bytes": 0});
        let back: CopyReport = serde_json::from_value(sent).unwrap();
        assert_eq!(back, full().relayed());
    }

    /// A source from before the fields that may be left out still reports.
    #[test]
    fn an_older_sources_report_is_read() {
        let old = serde_json::json!({
            "files": 1, "bytes": 2, "seconds": 0.5, "sent_bytes": 2,
            "bits_per_second": 32.0, "verified": true, "failed": [],
            "skipped": 0, "resumed_bytes": 0, "streams": 1,
            "encryption": "none", "attempts": 1
        });
        let r: CopyReport = serde_json::from_value(old).unwrap();
        assert_eq!((r.files, r.links, r.would_send_bytes), (1, 0, 0));
    }
}
