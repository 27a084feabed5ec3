//! [`ServedArchive`]: what a server (`longhaul serve`) served, archived as
//! runs of kind `served`: one per perf test and per transfer (push or
//! pull), with the client's address as `remote_host`, the export, the
//! grant, the request in `params` (`kind`, `direction`, ...), and at the
//! end its bytes, files, seconds, rate and status. Listings (`ls`) move no
//! data and are not archived.
//!
//! Served runs are short and can be many at once, so the serving threads
//! never touch SQLite: they hand each start and end to one thread that
//! holds the one connection and writes what arrived together in one
//! transaction. The channel is bounded; when it is full (the disk stalls)
//! an event is dropped and counted, and the serving goes on.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use longhaul_engine::server::observe::{Outcome, RunKind, ServeObserver, ServedRun};
use rusqlite::params;

use crate::model::NewRun;
use crate::store::{unix_now, Archive, ArchiveError};

/// The kind served runs have in the archive.
pub const KIND: &str = crate::model::SERVED;

/// Starts and ends the channel holds before events are dropped.
const CHANNEL: usize = 4096;

/// Events written in one transaction at most.
const BATCH: usize = 512;

enum Event {
    Started(ServedRun),
    Finished(ServedRun),
}

/// Archives what a server served; see the module's documentation.
pub struct ServedArchive {
    tx: Option<SyncSender<Event>>,
    dropped: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl ServedArchive {
    /// Opens (or makes) the archive at `path` on this thread, so that a
    /// file that cannot be used is the caller's error, and starts the
    /// thread that writes to it.
    pub fn open(path: &Path) -> Result<ServedArchive, ArchiveError> {
        let archive = Archive::open(path)?;
        // Runs a killed server left `running` become `interrupted`.
        if let Err(e) = archive.settle_orphans() {
            tracing::warn!("{e}");
        }
        let (tx, rx) = mpsc::sync_channel(CHANNEL);
        let dropped = Arc::new(AtomicU64::new(0));
        let d = dropped.clone();
        let thread = std::thread::Builder::new()
            .name("lh-served-archive".into())
            .spawn(move || write_loop(archive, &rx, &d))
            .map_err(|e| ArchiveError::Io {
                path: path.to_path_buf(),
                why: format!("cannot start the archive thread: {e}"),
            })?;
        Ok(ServedArchive {
            tx: Some(tx),
            dropped,
            thread: Some(thread),
        })
    }

    /// Events dropped because the writer fell behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn offer(&self, e: Event) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(e) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        "archive: the writer falls behind (or stopped); served runs go unrecorded"
                    );
                }
            }
        }
    }

    fn take(&self, r: &ServedRun) {
        // A listing moves nothing worth a run in the history.
        if r.kind != RunKind::List {
            let e = match r.result {
                Outcome::Running => Event::Started(r.clone()),
                _ => Event::Finished(r.clone()),
            };
            self.offer(e);
        }
    }
}

impl Drop for ServedArchive {
    /// Writes what is queued before the archive closes.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl ServeObserver for ServedArchive {
    fn test_started(&self, r: &ServedRun) {
        self.take(r);
    }
    fn test_finished(&self, r: &ServedRun) {
        self.take(r);
    }
    fn transfer_started(&self, r: &ServedRun) {
        self.take(r);
    }
    fn transfer_finished(&self, r: &ServedRun) {
        self.take(r);
    }
}

/// The row a served run starts as.
pub fn new_run(r: &ServedRun) -> NewRun {
    let mut params = match &r.params {
        serde_json::Value::Object(m) => m.clone(),
        serde_json::Value::Null => serde_json::Map::new(),
        other => {
            let mut m = serde_json::Map::new();
            m.insert("request".into(), other.clone());
            m
        }
    };
    params.insert("kind".into(), r.kind.as_str().into());
    params.insert(
        "direction".into(),
        match r.kind {
            RunKind::Push => "in",
            RunKind::Pull => "out",
            RunKind::Perf | RunKind::List => "both",
        }
        .into(),
    );
    let export = r.export.as_deref();
    let path = |key: &str| {
        r.params
            .get(key)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let (source, dest) = match r.kind {
        RunKind::Push => (None, path("dest").map(|d| at(export, &d))),
        RunKind::Pull => (
            r.params.get("sources").and_then(|v| v.as_array()).map(|s| {
                s.iter()
                    .filter_map(|p| p.as_str())
                    .map(|p| at(export, p))
                    .collect::<Vec<_>>()
                    .join(" ")
            }),
            None,
        ),
        RunKind::Perf | RunKind::List => (None, None),
    };
    NewRun {
        kind: KIND.into(),
        command: format!("serve: {} from {}", r.kind.as_str(), r.client),
        remote_host: Some(r.client.clone()),
        export: r.export.clone(),
        grant: Some(r.grant.clone()),
        source,
        dest,
        params: Some(serde_json::Value::Object(params)),
    }
}

fn at(export: Option<&str>, path: &str) -> String {
    match export {
        Some(e) => format!("{e}:{path}"),
        None => path.to_string(),
    }
}

/// The status a finished served run is archived with.
pub fn status(o: Outcome) -> &'static str {
    match o {
        Outcome::Running => "running",
        Outcome::Ok => "ok",
        Outcome::Partial => "partial",
        Outcome::Failed => "failed",
        Outcome::Aborted => "interrupted",
    }
}

fn write_loop(mut archive: Archive, rx: &Receiver<Event>, dropped: &AtomicU64) {
    // Served run id -> archive run id, while it runs.
    let mut rows: HashMap<u64, i64> = HashMap::new();
    let mut failing = false;
    loop {
        let first = match rx.recv_timeout(Duration::from_secs(3600)) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(e) => batch.push(e),
                Err(_) => break,
            }
        }
        match write_batch(&mut archive, &mut rows, &batch) {
            Ok(()) => failing = false,
            Err(e) => {
                dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                // Once per spell of failures, not once per run.
                if !failing {
                    tracing::warn!(
                        "archive {}: served runs not recorded: {e}",
                        archive.path().display()
                    );
                }
                failing = true;
            }
        }
    }
}

fn write_batch(
    archive: &mut Archive,
    rows: &mut HashMap<u64, i64>,
    batch: &[Event],
) -> Result<(), ArchiveError> {
    let path = archive.path().to_path_buf();
    let io = |e: rusqlite::Error| ArchiveError::Io {
        path: path.clone(),
        why: e.to_string(),
    };
    archive.conn().execute_batch("BEGIN").map_err(io)?;
    let mut added = Vec::new();
    let result = (|| {
        for e in batch {
            match e {
                Event::Started(r) => {
                    let id = archive.begin_run(&new_run(r))?;
                    rows.insert(r.id, id);
                    added.push(r.id);
                }
                Event::Finished(r) => {
                    let id = match rows.remove(&r.id) {
                        Some(id) => id,
                        // Its start was dropped: the run is recorded whole now.
                        None => archive.begin_run(&new_run(r))?,
                    };
                    finish(archive, id, r).map_err(io)?;
                }
            }
        }
        Ok(())
    })();
    match result {
        Ok(()) => archive.conn().execute_batch("COMMIT").map_err(io),
        Err(e) => {
            let _ = archive.conn().execute_batch("ROLLBACK");
            for id in added {
                rows.remove(&id);
            }
            Err(e)
        }
    }
}

fn finish(archive: &mut Archive, id: i64, r: &ServedRun) -> rusqlite::Result<()> {
    let summary = serde_json::json!({
        "kind": r.kind.as_str(),
        "result": r.result.as_str(),
        "bytes": r.bytes,
        "files": r.files,
        "seconds": r.seconds,
        "bits_per_second": r.bits_per_second,
    });
    let files = (r.kind != RunKind::Perf).then_some(r.files as i64);
    archive.conn().execute(
        "UPDATE runs SET status = ?2, ended_at = ?3, updated_at = ?3, error = ?4, summary = ?5,
           bytes = ?6, files = ?7, seconds = ?8, bits_per_second = ?9,
           live_bytes = ?6, live_files = coalesce(?7, 0) WHERE id = ?1",
        params![
            id,
            status(r.result),
            unix_now(),
            r.error,
            summary.to_string(),
            r.bytes as i64,
            files,
            r.seconds,
            r.bits_per_second,
        ],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::HistoryFilter;

    fn run(id: u64, kind: RunKind, result: Outcome) -> ServedRun {
        ServedRun {
            id,
            kind,
            client: "192.0.2.9:5000".into(),
            grant: "7e570000".into(),
            export: Some("data".into()),
            params: serde_json::json!({ "dest": "in/", "sources": [] }),
            bytes: 1000,
            files: 2,
            seconds: 0.5,
            bits_per_second: 16000.0,
            result,
            error: None,
        }
    }

    #[test]
    fn served_runs_are_archived_with_export_grant_and_totals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let a = ServedArchive::open(&path).unwrap();
        a.transfer_started(&run(1, RunKind::Push, Outcome::Running));
        a.transfer_started(&run(2, RunKind::List, Outcome::Running));
        a.transfer_finished(&run(2, RunKind::List, Outcome::Ok));
        a.transfer_finished(&run(1, RunKind::Push, Outcome::Ok));
        // Only an end (its start dropped) still makes a whole run.
        let mut r = run(3, RunKind::Perf, Outcome::Aborted);
        r.error = Some("gone".into());
        a.test_finished(&r);
        drop(a);
        let ro = Archive::open_read_only(&path).unwrap();
        let h = ro.history(&HistoryFilter::default()).unwrap();
        assert_eq!(h.len(), 2, "{h:?}");
        let perf = &h[0];
        assert_eq!(perf.kind, "served");
        assert_eq!(perf.status, "interrupted");
        assert_eq!(perf.error.as_deref(), Some("gone"));
        assert_eq!(perf.files, None);
        let push = &h[1];
        assert_eq!(push.kind, "served");
        assert_eq!(push.status, "ok");
        assert_eq!(push.export.as_deref(), Some("data"));
        assert_eq!(push.grant.as_deref(), Some("7e570000"));
        assert_eq!(push.remote_host.as_deref(), Some("192.0.2.9:5000"));
        assert_eq!(push.dest.as_deref(), Some("data:in/"));
        assert_eq!(push.bytes, Some(1000));
        assert_eq!(push.files, Some(2));
        let d = ro.run(push.id).unwrap();
        let p = d.params.unwrap();
        assert_eq!(p["kind"], "push");
        assert_eq!(p["direction"], "in");
    }

    #[test]
    fn an_unusable_archive_is_an_error_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not.db");
        std::fs::write(&path, vec![b'x'; 4096]).unwrap();
        let e = ServedArchive::open(&path).err().unwrap();
        assert!(e.to_string().contains("not.db"), "{e}");
    }
}
