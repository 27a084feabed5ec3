//! [`Writer`]: a run's rows go to the archive from one thread, in batched
//! transactions, fed by a bounded channel. The data path never waits on the
//! database: when the channel is full a sample is dropped and counted, and
//! when a write fails (a full disk) its rows are counted as lost and the
//! run goes on. What was lost is written to the run when it ends (when the
//! disk lets it) and told to the caller.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{params, Transaction};

use longhaul_engine::xfer::Landed;

use crate::model::{FileRow, IntervalRow, Loss};
use crate::scrub::scrub_text;
use crate::store::{digest_key, name_key, unix_now, Archive};

/// How long rows wait before they are committed: the live view is this
/// far behind at most.
pub const COMMIT_EVERY: Duration = Duration::from_millis(250);

/// Records the channel holds before samples are dropped.
const CHANNEL: usize = 131_072;

/// Rows committed in one transaction at most.
const BATCH: usize = 200_000;

/// What a run's end says.
#[derive(Debug, Clone, Default)]
pub struct RunEnd {
    /// `ok`, `partial`, `failed` or `interrupted`.
    pub status: String,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub warnings: Vec<String>,
}

/// The result of a run, as its command found it.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    pub summary: Option<serde_json::Value>,
    pub bytes: Option<u64>,
    pub files: Option<u64>,
    pub seconds: Option<f64>,
    pub bits_per_second: Option<f64>,
    pub verified: Option<bool>,
    pub verdict: Option<String>,
}

/// One message to the writer thread.
enum Record {
    Params(serde_json::Value),
    Interval(IntervalRow),
    File(FileRow),
    /// A file of a cp or sync, named in full by the writer thread.
    Landed(Landed),
    Live {
        bytes: u64,
        files: u64,
        bps: Option<f64>,
    },
    Result(Box<RunResult>),
    End(Box<RunEnd>),
}

impl Record {
    fn rows(&self) -> u64 {
        match self {
            Record::Interval(_) | Record::File(_) | Record::Landed(_) => 1,
            _ => 0,
        }
    }
}

/// Feeds one run's rows to the archive. Cheap to clone for threads that
/// record files ([`Writer::file`]).
#[derive(Clone)]
pub struct Writer {
    tx: SyncSender<Record>,
    dropped: Arc<AtomicU64>,
    run: i64,
}

/// Ends the writer thread: [`Writer`]s dropped, then [`Finisher::finish`].
pub struct Finisher {
    thread: JoinHandle<Loss>,
    dropped: Arc<AtomicU64>,
}

impl Writer {
    /// Starts the thread that writes run `run` into `archive`.
    pub fn start(archive: Archive, run: i64) -> (Writer, Finisher) {
        let (tx, rx) = mpsc::sync_channel(CHANNEL);
        let dropped = Arc::new(AtomicU64::new(0));
        let d = dropped.clone();
        let thread = std::thread::Builder::new()
            .name("lh-archive".into())
            .spawn(move || write_loop(archive, run, &rx, &d))
            .expect("spawning the archive thread");
        (
            Writer {
                tx,
                dropped: dropped.clone(),
                run,
            },
            Finisher { thread, dropped },
        )
    }

    /// The run's id in the archive.
    pub fn run(&self) -> i64 {
        self.run
    }

    fn offer(&self, r: Record) {
        let rows = r.rows();
        match self.tx.try_send(r) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(rows.max(1), Ordering::Relaxed);
            }
            // The thread is gone (it failed to start its work): counted there.
            Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(rows, Ordering::Relaxed);
            }
        }
    }

    /// Waits for room: for the few records that say how a run went.
    fn must(&self, r: Record) {
        let _ = self.tx.send(r);
    }

    pub fn params(&self, p: serde_json::Value) {
        self.must(Record::Params(p));
    }
    pub fn interval(&self, i: IntervalRow) {
        self.offer(Record::Interval(i));
    }
    pub fn file(&self, f: FileRow) {
        self.offer(Record::File(f));
    }
    /// A file a cp or sync moved (verified: it landed); its names are made
    /// on this writer's thread, off the transfer's.
    pub fn landed(&self, l: Landed) {
        self.offer(Record::Landed(l));
    }
    /// [`Writer::file`], waiting for room instead of dropping (the
    /// catalogue benchmark measures the writer, not the channel).
    #[doc(hidden)]
    pub fn file_waiting(&self, f: FileRow) {
        self.must(Record::File(f));
    }
    pub fn live(&self, bytes: u64, files: u64, bps: Option<f64>) {
        self.offer(Record::Live { bytes, files, bps });
    }
    pub fn result(&self, r: RunResult) {
        self.must(Record::Result(Box::new(r)));
    }
    pub fn end(&self, e: RunEnd) {
        self.must(Record::End(Box::new(e)));
    }
}

impl Finisher {
    /// Waits for the thread to write what it holds, up to the end record
    /// ([`Writer::end`], sent first); what could not be kept.
    pub fn finish(self) -> Loss {
        let mut loss = self.thread.join().unwrap_or_else(|_| Loss {
            rows: 0,
            error: Some("the archive thread panicked".into()),
        });
        loss.rows += self.dropped.load(Ordering::Relaxed);
        loss
    }
}

fn write_loop(mut archive: Archive, run: i64, rx: &Receiver<Record>, dropped: &AtomicU64) -> Loss {
    let mut loss = Loss::default();
    let mut batch: Vec<Record> = Vec::new();
    let mut first_at: Option<Instant> = None;
    let mut open = true;
    while open {
        let wait = first_at.map_or(Duration::from_secs(3600), |t| {
            COMMIT_EVERY.saturating_sub(t.elapsed())
        });
        match rx.recv_timeout(wait) {
            Ok(r) => {
                first_at.get_or_insert_with(Instant::now);
                // The end is the last record: clones of the writer that
                // live on (a catalogue hook in a thread) cannot hold it open.
                open = !matches!(r, Record::End(_));
                batch.push(r);
                // Take what is queued without waiting, up to a batch.
                while open && batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(r) => {
                            open = !matches!(r, Record::End(_));
                            batch.push(r);
                        }
                        Err(_) => break,
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => open = false,
        }
        let due = first_at.is_some_and(|t| t.elapsed() >= COMMIT_EVERY);
        if !batch.is_empty() && (due || batch.len() >= BATCH || !open) {
            commit(&mut archive, run, &mut batch, &mut loss);
            first_at = None;
        }
    }
    // Say on the run what was lost, when the disk lets us.
    let lost = loss.rows + dropped.load(Ordering::Relaxed);
    if lost > 0 {
        let _ = archive.conn().execute(
            "UPDATE runs SET lost = ?2 WHERE id = ?1",
            params![run, lost as i64],
        );
    }
    loss
}

fn commit(archive: &mut Archive, run: i64, batch: &mut Vec<Record>, loss: &mut Loss) {
    let rows: u64 = batch.iter().map(Record::rows).sum();
    let result = archive
        .conn()
        .transaction()
        .and_then(|tx| write_batch(&tx, run, batch).and_then(|()| tx.commit()));
    if let Err(e) = result {
        loss.rows += rows;
        if loss.error.is_none() {
            loss.error = Some(e.to_string());
        }
        tracing::debug!("archive: {rows} rows not written: {e}");
        // The end and result still count: try them alone, outside the batch.
        let tail: Vec<Record> = batch
            .drain(..)
            .filter(|r| matches!(r, Record::End(_) | Record::Result(_)))
            .collect();
        if !tail.is_empty() {
            let _ = archive.conn().transaction().and_then(|tx| {
                write_batch(&tx, run, &tail)?;
                tx.commit()
            });
        }
    }
    batch.clear();
}

fn write_batch(tx: &Transaction, run: i64, batch: &[Record]) -> rusqlite::Result<()> {
    let mut live = None;
    for r in batch {
        match r {
            Record::Interval(i) => write_interval(tx, run, i)?,
            Record::File(f) => write_file(tx, run, f)?,
            Record::Landed(l) => {
                let (source, dest) = l.names();
                let f = FileRow {
                    path: l.path.clone(),
                    source,
                    dest,
                    size: l.size,
                    mtime_ns: Some(l.mtime_ns),
                    digest: l.digest.clone(),
                    verified: true,
                };
                write_file(tx, run, &f)?;
            }
            Record::Live { bytes, files, bps } => live = Some((*bytes, *files, *bps)),
            Record::Params(p) => {
                tx.execute(
                    "UPDATE runs SET params = ?2 WHERE id = ?1",
                    params![run, scrub_text(&p.to_string())],
                )?;
            }
            Record::Result(r) => write_result(tx, run, r)?,
            Record::End(e) => write_end(tx, run, e)?,
        }
    }
    match live {
        Some((bytes, files, bps)) => tx.execute(
            "UPDATE runs SET live_bytes = ?2, live_files = ?3, live_bps = coalesce(?4, live_bps),
               updated_at = ?5 WHERE id = ?1",
            params![run, bytes as i64, files as i64, bps, unix_now()],
        )?,
        None => tx.execute(
            "UPDATE runs SET updated_at = ?2 WHERE id = ?1",
            params![run, unix_now()],
        )?,
    };
    Ok(())
}

fn write_interval(tx: &Transaction, run: i64, i: &IntervalRow) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO intervals (run, idx, direction, stream, start_s, end_s, bytes,
           bits_per_second, retransmits, rtt_us, cwnd_bytes, streams, limit_kind, omitted)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?
    .execute(params![
        run,
        i.idx,
        i.direction,
        i.stream,
        i.start_s,
        i.end_s,
        i.bytes as i64,
        i.bits_per_second,
        i.retransmits.map(|v| v as i64),
        i.rtt_us,
        i.cwnd_bytes.map(|v| v as i64),
        i.streams,
        i.limit,
        i.omitted,
    ])?;
    Ok(())
}

/// A file's row, with the keys `where` finds it by.
fn write_file(tx: &Transaction, run: i64, f: &FileRow) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO files (run, path, source, dest, size, mtime_ns, digest, verified,
           source_key, dest_key, digest_key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        run,
        f.path,
        f.source,
        f.dest,
        f.size as i64,
        f.mtime_ns,
        f.digest,
        f.verified,
        name_key(&f.source),
        name_key(&f.dest),
        f.digest.as_deref().and_then(digest_key),
    ])?;
    Ok(())
}

fn write_result(tx: &Transaction, run: i64, r: &RunResult) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE runs SET summary = ?2, bytes = ?3, files = ?4, seconds = ?5,
           bits_per_second = ?6, verified = ?7, verdict = ?8 WHERE id = ?1",
        params![
            run,
            r.summary.as_ref().map(|s| scrub_text(&s.to_string())),
            r.bytes.map(|v| v as i64),
            r.files.map(|v| v as i64),
            r.seconds,
            r.bits_per_second,
            r.verified,
            r.verdict,
        ],
    )?;
    Ok(())
}

fn write_end(tx: &Transaction, run: i64, e: &RunEnd) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE runs SET status = ?2, ended_at = ?3, error = ?4, exit_code = ?5,
           warnings = ?6 WHERE id = ?1",
        params![
            run,
            e.status,
            unix_now(),
            e.error.as_deref().map(scrub_text),
            e.exit_code,
            (!e.warnings.is_empty())
                .then(|| scrub_text(&serde_json::to_string(&e.warnings).unwrap_or_default())),
        ],
    )?;
    Ok(())
}
