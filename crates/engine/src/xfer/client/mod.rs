//! `longhaul cp` and `longhaul ls` on the client: work out which way the
//! data goes, ask the server, open the data streams, run the local side,
//! and retry a lost connection (the sink's journal makes a retry resume).
//!
//! [`cp_with`] retries `once::cp_once`, which takes a `plan::Plan` of the
//! copy, sizes the streams for the path (`path`), opens them (`streams`)
//! and runs the local side of a push or a pull.

mod once;
mod path;
mod plan;
mod streams;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use longhaul_proto::msg::Message;
use longhaul_proto::xfer::*;

use super::filter::Filter;
use crate::end::End;
use crate::net::dial::{open_control, ClientOptions};
use crate::report::{Discard, Reporter, PROGRESS_TICK};
use crate::EngineError;
use once::cp_once;
use plan::plan;

/// What `cp` was asked to do.
#[derive(Clone)]
pub struct CpOptions {
    /// Each read once where it was named (the command line, a job's spec,
    /// an order); an end over ssh is reached
    /// ([`crate::reach::reach_ends`]) before the copy starts, which
    /// refuses it.
    pub sources: Vec<End>,
    pub dest: End,
    pub recursive: bool,
    pub preserve: bool,
    /// Data streams; None sizes them for the path (see [`longhaul_proto::window`]).
    pub streams: Option<u16>,
    /// The path's rate, bits/s, if known: streams are sized for it and
    /// each is paced to its share.
    pub rate: Option<u64>,
    /// Congestion control of the sending side; None: BBR where the sender
    /// has it, else its default.
    pub congestion: Option<String>,
    pub chunk_size: Option<u64>,
    pub force: bool,
    /// With `preserve`: keep setuid, setgid and sticky bits and
    /// world-writable directories (stripped otherwise).
    pub keep_special_modes: bool,
    /// Create missing directories of the destination (rsync's `--mkpath`);
    /// without it a destination whose directory does not exist is refused.
    pub mkpath: bool,
    /// Connection attempts after the first, with backoff, before giving up.
    pub retries: u32,
    pub sync_files: bool,
    /// O_DIRECT for file data on both ends, bypassing the page cache.
    pub direct: bool,
    /// Re-read every file at the destination after writing and compare.
    pub verify: bool,
    /// `sync`: what to compare and whether to delete extraneous files.
    pub sync: Option<SyncOptions>,
    pub dry_run: bool,
    /// rsync's include/exclude rules (`+ PATTERN` / `- PATTERN`, see
    /// [`crate::xfer::filter`]), applied by whichever end is the source
    /// and, with `sync --delete`, by the sink to what it keeps.
    pub filter: Vec<String>,
    /// `-z`: compress chunks with zstd at this level where it pays
    /// ([`longhaul_proto::xfer::compress`]); the server must agree.
    pub compress: Option<i32>,
    /// Tune the streams carrying chunks online (unless `streams` is set),
    /// and the files in flight (unless `files_in_flight` is set).
    pub tune: bool,
    /// Files announced and not yet finished, at most; None sizes the count
    /// for the path and grows it online.
    pub files_in_flight: Option<u64>,
    /// Where `doctor` remembers path rates ([`crate::pathdb`]): without
    /// `rate` or `streams`, a fresh record for this server sizes the
    /// streams. None: not consulted.
    pub path_memory: Option<PathBuf>,
    pub client: ClientOptions,
    /// Write `DIGEST  PATH` per verified file here.
    pub digests_to: Option<PathBuf>,
    /// Tell each file that landed here, named in full (the archive's
    /// file catalogue).
    pub catalogue: Option<super::Catalogue>,
    /// The transfer's counters (and its interrupt flag); [`cp_with`]
    /// samples them for its reporter.
    pub progress: Arc<super::Progress>,
    /// One fleet rank's share of `sources` (push only): these entries
    /// instead of a walk, some of them parts of files.
    pub share: Option<super::source::Share>,
    /// A push whose sources are beneath this directory (a server's
    /// export, in a third-party copy): everything read resolves beneath it.
    pub source_anchor: Option<Arc<super::beneath::Anchor>>,
}

/// The outcome of a `cp` is proto's one copy report.
pub use longhaul_proto::xfer::report::{CopyReport, PathTuning, PathUse};

impl CpOptions {
    /// A recursive copy of `sources` to `dest` with every other setting at
    /// `cp`'s defaults (streams sized for the path, tuned online, files
    /// synced, no retries).
    pub fn new(sources: Vec<End>, dest: End, client: ClientOptions) -> CpOptions {
        CpOptions {
            sources,
            dest,
            recursive: true,
            preserve: false,
            streams: None,
            rate: None,
            congestion: None,
            chunk_size: None,
            force: false,
            mkpath: false,
            keep_special_modes: false,
            retries: 0,
            sync_files: true,
            direct: false,
            verify: false,
            sync: None,
            dry_run: false,
            filter: Vec::new(),
            compress: None,
            tune: true,
            files_in_flight: None,
            path_memory: None,
            digests_to: None,
            catalogue: None,
            progress: Default::default(),
            share: None,
            source_anchor: None,
            client,
        }
    }

    /// `SRC/`: sources named with a trailing slash stand for their
    /// contents, as in rsync (see [`landing`]).
    fn contents(&self) -> bool {
        self.sources.iter().all(End::slashed)
    }

    /// The filter, compiled; None without rules. A bad rule is a usage
    /// error that names it.
    fn filter(&self) -> Result<Option<Arc<Filter>>, EngineError> {
        compile_filter(&self.filter, self.contents()).map_err(EngineError::Usage)
    }
}

/// `rules` compiled (None when there are none), for a transfer whose
/// sources are named as `contents` says.
pub fn compile_filter(rules: &[String], contents: bool) -> Result<Option<Arc<Filter>>, String> {
    if rules.is_empty() {
        return Ok(None);
    }
    Filter::new(rules, contents).map(|f| Some(Arc::new(f)))
}

/// An end over ssh handed on before its far end was started: the
/// caller's to reach first ([`crate::reach::reach_ends`]).
pub(crate) fn unreached(end: &End) -> EngineError {
    EngineError::Usage(format!(
        "'{}' is a path on a host over ssh, which this copy was not started for: its far end must be reached first (run it as `longhaul cp` does)",
        end.arg()
    ))
}

/// Worth another attempt: the network or the peer went away (never a
/// full destination, which space must be freed for first).
fn retryable(e: &EngineError) -> bool {
    if e.to_string().contains(super::DESTINATION_FULL) {
        return false;
    }
    matches!(
        e,
        EngineError::Connect(_)
            | EngineError::Closed(_)
            | EngineError::Io { .. }
            | EngineError::Timeout(_)
    ) || matches!(e, EngineError::Failed(m) if m.contains("data stream failed") || m.contains("closed"))
}

/// Copies, retrying lost connections; each retry resumes. Reports nothing
/// on the way (see [`cp_with`]).
pub fn cp(o: &CpOptions) -> Result<CopyReport, EngineError> {
    cp_with(o, &mut Discard)
}

/// [`cp`], telling `reporter` how it goes: the counters of
/// [`CpOptions::progress`] every [`PROGRESS_TICK`] and once at the end,
/// and each of the sender's intervals as it arrives. The outcome is the
/// caller's to report (it may add to it).
pub fn cp_with(
    o: &CpOptions,
    reporter: &mut (dyn Reporter + Send),
) -> Result<CopyReport, EngineError> {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let ticker = scope.spawn(move || report_progress(&o.progress, &stopped, reporter));
        let r = {
            // Dropped when the transfer ends, however it ends (a panic
            // too): that ends the ticker, which the scope waits for.
            let _stop = stop;
            cp_retrying(o)
        };
        // A reporter that panicked loses its display, not the transfer.
        let _ = ticker.join();
        r
    })
}

/// Samples `p` for `reporter` every [`PROGRESS_TICK`] until `stopped`
/// closes, then once more.
fn report_progress(
    p: &super::Progress,
    stopped: &std::sync::mpsc::Receiver<()>,
    reporter: &mut dyn Reporter,
) {
    use std::sync::mpsc::RecvTimeoutError;
    // Intervals reported so far, counting those trimmed from the front.
    let mut shown: u64 = 0;
    loop {
        let last = !matches!(
            stopped.recv_timeout(PROGRESS_TICK),
            Err(RecvTimeoutError::Timeout)
        );
        let new: Vec<_> = p
            .intervals
            .lock()
            .map(|v| {
                let dropped = p.intervals_dropped.load(Ordering::Relaxed);
                let from = usize::try_from(shown.saturating_sub(dropped)).unwrap_or(usize::MAX);
                v[from.min(v.len())..].to_vec()
            })
            .unwrap_or_default();
        shown = shown.max(p.intervals_dropped.load(Ordering::Relaxed)) + new.len() as u64;
        for i in &new {
            reporter.transfer_interval(i);
        }
        reporter.transfer_progress(&p.snapshot());
        if last {
            return;
        }
    }
}

fn cp_retrying(o: &CpOptions) -> Result<CopyReport, EngineError> {
    let plan = plan(o)?;
    // Opened once: digests of files finished before a retry stay in it.
    let digest_out: Option<super::DigestOut> = match &o.digests_to {
        Some(p) => Some(super::DigestFile::create(p)?),
        None => None,
    };
    crate::report::retrying(o.retries, &o.client.interrupt, retryable, |attempt| {
        let mut s = cp_once(o, &plan, &digest_out, true)?;
        s.attempts = attempt;
        // An incomplete list is output lost: a failed entry, exit 6.
        if let Some(Err(f)) = digest_out.as_ref().map(|d| d.finish()) {
            s.failed.push(f);
        }
        Ok(s)
    })
}

/// A stage's rate on its own: bytes over busy time, with `parallel` workers.
fn stage_rate(bytes: u64, busy_us: u64, parallel: u16) -> f64 {
    if busy_us == 0 {
        return 0.0;
    }
    bytes as f64 * 8.0 * 1e6 / (busy_us as f64 / f64::from(parallel.max(1)))
}

/// Lists a path on a server (an end over ssh once reached).
pub fn ls(target: &End, recursive: bool, o: &ClientOptions) -> Result<Vec<ListEntry>, EngineError> {
    let r = match target {
        End::Server { at, .. } => at.clone(),
        End::Local(p) => {
            return Err(EngineError::Usage(format!(
                "'{p}' is not remote: name it [USER@]HOST:path (a host over ssh) or longhaul://HOST[:PORT]/EXPORT/path (a longhaul server)"
            )))
        }
        End::Ssh { .. } => return Err(unreached(target)),
    };
    let mut ctl = open_control(&r.host, o)?;
    // `DIR/` keeps its slash: the server lists what a link of that name
    // leads to, where `DIR` is the link itself (as `ls -l`).
    let path = match r.dir && !r.path.is_empty() {
        true => format!("{}/", r.path),
        false => r.path,
    };
    ctl.conn.send(&Message::ListRequest(ListRequest {
        export: r.export,
        path,
        recursive,
    }))?;
    let mut out = Vec::new();
    loop {
        // Each part within its time (a recursive listing may first wait
        // for a slot: the queue's reminders restart the wait).
        let deadline = Instant::now() + o.handshake_timeout * 6;
        let l = ctl.answer(deadline, "the listing", |m| match m {
            Message::Listing(l) => Some(l),
            _ => None,
        })?;
        out.extend(l.entries);
        if l.done {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_connections_are_retried_and_refusals_are_not() {
        assert!(retryable(&EngineError::Timeout("t".into())));
        assert!(retryable(&EngineError::Failed(
            "data stream failed: reset".into()
        )));
        assert!(!retryable(&EngineError::Usage("no such export".into())));
        assert!(!retryable(&EngineError::Failed(
            "verification failed".into()
        )));
        assert!(!retryable(&EngineError::Failed(
            "the sink ended the transfer early: destination full: no room for data/f (5 MiB): data stream failed".into()
        )));
    }

    #[test]
    fn a_stage_rate_is_over_its_busy_time_per_worker() {
        assert_eq!(stage_rate(1000, 0, 4), 0.0);
        assert_eq!(stage_rate(1_000_000, 1_000_000, 1), 8e6);
        // Four workers busy 1 s in all: each was busy a quarter second.
        assert_eq!(stage_rate(1_000_000, 1_000_000, 4), 32e6);
        assert_eq!(stage_rate(1_000_000, 1_000_000, 0), 8e6);
    }
}
