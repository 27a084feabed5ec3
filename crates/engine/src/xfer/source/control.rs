//! The source's control thread: drives its state machine ([`Source`]),
//! walking and announcing what it has room for, feeding it the sink's
//! messages and what the senders report, queueing the reads it asks for,
//! and tuning the streams.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::msg::Message;
use longhaul_proto::transfer::source::{
    Source, SourceAction, SourceError, SourceLimits, SourceTally,
};
use longhaul_proto::xfer::compress::Governor;
use longhaul_proto::xfer::*;

use super::super::prefetch::Prefetcher;
use super::super::tune::Sampler;
use super::super::{Stamp, ENTRIES_BATCH};
use super::queue::{Event, Shared, SrcFile};
use super::walk::{Found, Walker};
use super::{at, Handle, SourceConfig, SourceReport};
use crate::net::conn::FramedConn;
use crate::stages::StageTotals;
use crate::EngineError;

/// Drives the source's state machine until the sink reports the transfer
/// done: each turn announces, takes the senders' events, does what the
/// machine asks, sends what it says, samples the streams, and waits a
/// little for the sink.
pub(super) fn control(
    conn: &mut FramedConn,
    shared: &Shared,
    rx: &Receiver<Event>,
    cfg: &SourceConfig,
    sampler: Sampler,
    ahead: Option<Arc<Prefetcher>>,
    meters: Meters,
) -> Result<SourceReport, EngineError> {
    let mut m: Source<Handle> = Source::new(
        Instant::now(),
        SourceLimits {
            batch: ENTRIES_BATCH,
            files_in_flight: cfg.files_in_flight,
            max_files_in_flight: cfg.max_files_in_flight,
            idle: super::super::TRANSFER_IDLE,
        },
    );
    if cfg.bundles {
        m.batch_messages();
    }
    let mut c = Control {
        walker: Walker::for_transfer(cfg, ahead.clone()),
        m,
        shared,
        cfg,
        prefetch: ahead.as_deref(),
        sampler,
        held_by_files: false,
        sent: 0,
        shown_at: Instant::now(),
    };
    loop {
        cfg.progress.check_interrupt()?;
        if c.m.wants_entries() {
            announce(&mut c.m, &mut c.walker, cfg);
        }
        c.take_events(rx)?;
        c.act()?;
        while let Some(msg) = c.m.poll_transmit() {
            conn.queue(&msg)?;
        }
        conn.flush_queued()?;
        let now = Instant::now();
        if c.sampler.due(now) {
            c.sample(conn, now)?;
        }
        if now.duration_since(c.shown_at) >= crate::report::PROGRESS_TICK {
            c.show_progress(now, meters.governor);
        }
        c.m.handle_timeout(now).map_err(engine_error)?;
        let Some(msg) = c.wait(conn)? else { continue };
        c.m.handle(Instant::now(), msg).map_err(engine_error)?;
        c.act()?;
        if let Some((tally, sink)) = c.m.finished() {
            // All of it is at the sink: it said so.
            cfg.progress.bytes.store(c.sent, Ordering::Relaxed);
            return Ok(c.done(conn, tally, sink, meters));
        }
    }
}

/// What the senders measure for the report: their CPU by stage, and the
/// compression governor they share (with `-z`).
#[derive(Clone, Copy)]
pub(super) struct Meters<'a> {
    pub(super) totals: &'a StageTotals,
    pub(super) governor: Option<&'a std::sync::Mutex<Governor>>,
}

/// The control thread's state between turns.
struct Control<'a> {
    m: Source<Handle>,
    walker: Walker,
    shared: &'a Shared,
    cfg: &'a SourceConfig,
    prefetch: Option<&'a Prefetcher>,
    sampler: Sampler,
    /// Whether, this interval, the files in flight were all announced
    /// while the streams had nothing left to send.
    held_by_files: bool,
    /// Bytes of files read and handed to the data streams.
    sent: u64,
    /// When the progress was last brought up to date.
    shown_at: Instant,
}

impl Control<'_> {
    /// Feeds the machine what the senders reported since the last turn.
    fn take_events(&mut self, rx: &Receiver<Event>) -> Result<(), EngineError> {
        let m = &mut self.m;
        while let Ok(ev) = rx.try_recv() {
            let now = Instant::now();
            match ev {
                Event::Sent {
                    read_bytes,
                    read_us,
                } => {
                    self.sent += read_bytes;
                    m.sent(now, read_bytes, read_us);
                }
                Event::FileFailed(id, error) => m.file_failed(now, id, error),
                Event::Sealed { id, resends } => m.sealed(now, id, resends),
                Event::Changed(id, why) => m.changed(now, id, &why),
                Event::Fatal(e) => return Err(EngineError::Failed(e)),
            }
        }
        Ok(())
    }

    fn act(&mut self) -> Result<(), EngineError> {
        act(&mut self.m, self.shared, self.cfg, self.prefetch)
    }

    /// The progress's bytes: what has reached the far end, not what was
    /// handed to the sockets, whose buffers take megabytes at once (the
    /// first moment of a copy would show them moved). The far end's
    /// acknowledgements count wire bytes: with `-z`, each stands for as
    /// many raw bytes as compression made of it so far.
    fn show_progress(&mut self, now: Instant, governor: Option<&std::sync::Mutex<Governor>>) {
        self.shown_at = now;
        let acked = self.sampler.acked() as f64;
        let raw_per_wire = governor
            .and_then(|g| g.lock().ok().map(|g| g.report()))
            .filter(|r| r.wire_bytes > 0)
            .map_or(1.0, |r| (r.raw_bytes as f64 / r.wire_bytes as f64).max(1.0));
        let arrived = (acked * raw_per_wire) as u64;
        self.cfg
            .progress
            .bytes
            .store(self.sent.min(arrived), Ordering::Relaxed);
    }

    /// Ends an interval: its figures to the tuner, which may change the
    /// streams carrying chunks and the files in flight; the interval to
    /// the progress (and to a client, from a server).
    fn sample(&mut self, conn: &mut FramedConn, now: Instant) -> Result<(), EngineError> {
        let (q, cv) = &**self.shared;
        let (active, starved) = {
            let queue = q.lock().expect("poisoned");
            let starved = queue.planner.pending_files() == 0 && queue.resends.is_empty();
            (queue.active, starved)
        };
        let m = &mut self.m;
        let (interval, next) =
            self.sampler
                .sample(now, m.tally().read_us, active, starved, self.held_by_files);
        // The count of files in flight grows while it is what held the
        // transfer (fixed when its cap is its start).
        let before = m.files_limit();
        let after = m.interval(self.held_by_files);
        if after != before {
            tracing::debug!("tuner: {before} -> {after} files in flight");
        }
        self.held_by_files = false;
        if let Some(n) = next.filter(|&n| n != active) {
            tracing::debug!("tuner: {active} -> {n} streams");
            q.lock().expect("poisoned").active = n;
            cv.notify_all();
        }
        if self.cfg.send_intervals {
            // rate_cap is not on the wire (a client older than it would
            // refuse the message): its flag says it.
            let mut sent = interval.clone();
            if sent.limit == longhaul_proto::tune::TransferLimit::RateCap {
                sent.limit = longhaul_proto::tune::classify(&sent);
            }
            conn.send(&Message::SourceInterval(sent))?;
        }
        self.cfg.progress.push_interval(interval);
        Ok(())
    }

    /// Notes whether the files in flight are what holds the transfer
    /// back, and waits for the sink's next message: briefly while there
    /// is walking to do or files in flight (seals come from the senders
    /// between messages: while files are in flight they leave within a
    /// couple of milliseconds).
    fn wait(&mut self, conn: &mut FramedConn) -> Result<Option<Message>, EngineError> {
        let m = &self.m;
        let limit = usize::try_from(m.files_limit()).unwrap_or(usize::MAX);
        let busy_walking = m.wants_entries();
        if !m.walk_done() && !self.held_by_files && m.in_flight() >= limit {
            let queue = self.shared.0.lock().expect("poisoned");
            self.held_by_files = queue.planner.pending_files() == 0 && queue.resends.is_empty();
        }
        if busy_walking {
            conn.recv(Duration::from_millis(1))
        } else if m.in_flight() > 0 {
            conn.recv(Duration::from_millis(2))
        } else {
            conn.recv(Duration::from_millis(20))
        }
    }

    /// The transfer is done: the tuning settled on and this end's figures,
    /// sent to the sink and reported.
    fn done(
        &self,
        conn: &mut FramedConn,
        tally: SourceTally,
        sink: SinkReport,
        meters: Meters,
    ) -> SourceReport {
        let (m, cfg, sampler) = (&self.m, self.cfg, &self.sampler);
        let max_files = cfg.max_files_in_flight.max(1);
        let tuning = longhaul_proto::tune::TuningReport {
            online: sampler.climb().is_some(),
            direction: None,
            initial_streams: sampler.streams(),
            final_streams: self.shared.0.lock().expect("poisoned").active,
            chunk_size: m.largest_chunk(),
            files_in_flight: m.files_limit(),
            initial_files_in_flight: cfg.files_in_flight.clamp(1, max_files),
            send_buffer: sampler.send_buffer(),
            send_buffer_raises: sampler.send_buffer_raises,
            steps: sampler.climb().map(|c| c.steps.clone()).unwrap_or_default(),
        };
        let cpu = meters.totals.report();
        let compress = meters
            .governor
            .map(|g| g.lock().expect("poisoned").report());
        let _ = conn.send(&Message::SourceDone(SourceDone {
            read_bytes: tally.read_bytes,
            read_us: tally.read_us,
            resent_changed: tally.resent_changed,
            tuning: Some(tuning.clone()),
            cpu: Some(cpu),
            compress: compress.clone(),
        }));
        SourceReport {
            tally,
            tuning: Some(tuning),
            sink,
            cpu,
            compress,
        }
    }
}

fn engine_error(e: SourceError) -> EngineError {
    match e {
        SourceError::Idle(_) => EngineError::Timeout(e.to_string()),
        SourceError::Usage(e) => EngineError::Usage(e),
        SourceError::Failed(e) => EngineError::Failed(e),
    }
}

/// Walks on (files that changed while they were read first) and hands
/// the machine one batch of entries.
fn announce(m: &mut Source<Handle>, walker: &mut Walker, cfg: &SourceConfig) {
    while m.batch_has_room() {
        let (next, attempt) = match m.take_again() {
            Some(((path, _), rel, attempt)) => (Some(walker.again(path, rel)), attempt),
            None if m.walk_done() => break,
            None if !walker.refill(m) => break,
            None => (walker.next(), 1),
        };
        let mut found = match next {
            None => {
                m.walk_ended();
                break;
            }
            Some(Err(f)) => {
                m.walk_failed(f);
                continue;
            }
            Some(Ok(found)) => found,
        };
        if let Err(f) = with_digest(&mut found, cfg) {
            m.walk_failed(f);
            continue;
        }
        let e = &found.entry;
        // A file announced again takes its first id's place.
        if e.kind == Kind::File && attempt == 1 {
            cfg.progress.announced_files.fetch_add(1, Ordering::Relaxed);
            cfg.progress
                .announced_bytes
                .fetch_add(e.size, Ordering::Relaxed);
        }
        m.add(found.entry, (found.path, found.stamp), attempt);
    }
    m.end_batch();
}

/// With `--checksum`, gives a file its content digest.
fn with_digest(found: &mut Found, cfg: &SourceConfig) -> Result<(), Failure> {
    let e = &mut found.entry;
    if !(cfg.digests && e.kind == Kind::File) {
        return Ok(());
    }
    let digest = at(&cfg.anchor, &found.path).and_then(|p| {
        super::super::content_digest(&*cfg.storage, &p, e.size)
            .map_err(|e| EngineError::Usage(e.to_string()))
    });
    match digest {
        Ok(d) => {
            e.digest = Some(d);
            Ok(())
        }
        Err(err) => Err(Failure {
            path: e.path.clone(),
            error: format!("cannot read {}: {err}", found.path.display()),
        }),
    }
}

/// Does what the machine asks, until it asks nothing more: the reads of
/// a batch of wants are queued under one lock, with one wake-up (and
/// handed to the prefetcher, in the order the senders will take them).
fn act(
    m: &mut Source<Handle>,
    shared: &Shared,
    cfg: &SourceConfig,
    prefetch: Option<&Prefetcher>,
) -> Result<(), EngineError> {
    let (q, cv) = &**shared;
    loop {
        let mut unchanged = Vec::new();
        let mut queue = None;
        let mut any = false;
        // Whether a sender has something new to take: forgetting a file
        // (every resolved one) gives them nothing, so wakes nobody.
        let mut added = false;
        while let Some(action) = m.poll_action() {
            any = true;
            match action {
                SourceAction::Plan {
                    id,
                    path: rel,
                    handle: (path, stamp),
                    size,
                    chunk_size,
                    skip,
                } => {
                    let queue = queue.get_or_insert_with(|| q.lock().expect("poisoned"));
                    let reads = queue
                        .planner
                        .add(id, size, chunk_size, skip)
                        .map_err(|e| EngineError::Usage(format!("{rel}: {e}")))?;
                    let file = SrcFile::new(path.clone(), stamp, reads, size, chunk_size);
                    queue.files.insert(id, Arc::new(file));
                    added |= reads > 0;
                    if let Some(p) = prefetch.filter(|_| reads > 0) {
                        p.want(id, path.clone(), size);
                    }
                    // Nothing to read (all of it resumed): checked now.
                    if reads == 0 {
                        unchanged.push((id, path, stamp));
                    }
                }
                SourceAction::Resend(c) => {
                    let queue = queue.get_or_insert_with(|| q.lock().expect("poisoned"));
                    added |= queue.resend(c).map_err(EngineError::Failed)?;
                }
                SourceAction::Forget(id) => {
                    let queue = queue.get_or_insert_with(|| q.lock().expect("poisoned"));
                    if let Some(f) = queue.forget(id) {
                        f.fail();
                    }
                    if let Some(p) = prefetch {
                        p.forget(id);
                    }
                }
                SourceAction::Landed(l) => landed(cfg, &l.path, l.size, l.mtime_ns, l.digest),
                SourceAction::WalkDone => cfg.progress.walk_done.store(true, Ordering::Relaxed),
                SourceAction::Retrying { path, why } => {
                    tracing::warn!("{path} changed while it was read ({why}); sending it again");
                }
                SourceAction::Deferred { path, why } => {
                    tracing::info!("{path}: {why}; sending it again alone at the end");
                }
            }
        }
        if queue.take().is_some() && added {
            // All: one woken at random may be a parked stream, which would
            // leave a resend waiting.
            cv.notify_all();
        }
        if !any {
            return Ok(());
        }
        seal_unread(m, cfg, unchanged);
    }
}

/// Tells the catalogue and the digest list of a file that landed.
fn landed(cfg: &SourceConfig, path: &str, size: u64, mtime_ns: i64, digest: Option<String>) {
    cfg.progress.files.fetch_add(1, Ordering::Relaxed);
    if let Some(f) = &cfg.on_landed {
        f(path, size, mtime_ns, digest.as_deref());
    }
    if let Some(digest) = digest {
        super::super::write_digest(&cfg.digest_out, path, &digest);
    }
}

/// Seals the files with nothing to read (all of them resumed) that are
/// still the version announced; the others changed.
fn seal_unread(m: &mut Source<Handle>, cfg: &SourceConfig, unread: Vec<(u64, PathBuf, Stamp)>) {
    for (id, path, stamp) in unread {
        let now = at(&cfg.anchor, &path)
            .ok()
            .and_then(|p| std::fs::symlink_metadata(p).ok());
        match now.map(|meta| stamp.changed(&Stamp::of(&meta))) {
            Some(None) => m.sealed(Instant::now(), id, 0),
            Some(Some(why)) => m.changed(Instant::now(), id, &why),
            None => m.changed(Instant::now(), id, "it is gone"),
        }
    }
}
