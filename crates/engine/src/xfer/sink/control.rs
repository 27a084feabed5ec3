//! The sink's control thread: drives its state machine ([`Sink`]),
//! feeding it the source's messages and what the receivers, openers and
//! finishers report, doing the file work it asks for, and sending what it
//! has to say.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::msg::Message;
use longhaul_proto::plan::chunk_count;
use longhaul_proto::transfer::sink::{Sink, SinkAction, SinkError, SinkLimits};
use longhaul_proto::xfer::*;

use super::super::beneath::Dir;
use super::finish::{finish, finishes_at_once};
use super::open::{answer, open_file, Openers};
use super::tree::{link_in_place, make_link, prune, set_directories};
use super::{
    drop_partial, one_create, Event, FileState, Files, SinkConfig, OPENS_AT_ONCE, OPEN_GROUP,
};
use crate::net::conn::FramedConn;
use crate::stages::StageTotals;
use crate::EngineError;

/// The sink's report at its end, with where this end's CPU went.
fn finished(m: Sink, totals: &StageTotals) -> SinkReport {
    let mut r = m.into_report();
    r.cpu = Some(totals.report());
    r
}

/// Drives the sink's state machine ([`Sink`]): feeds it the source's
/// messages and what the receivers and finishers report, does the file
/// work it asks for, and sends what it has to say.
pub(super) fn control(
    conn: &mut FramedConn,
    (files, mut tail): (&Files, super::tail::Tail),
    rx: &Receiver<Event>,
    fin: &Sender<Arc<FileState>>,
    openers: Option<&Openers>,
    cfg: &SinkConfig,
    totals: &StageTotals,
) -> Result<SinkReport, EngineError> {
    // The report carries where this end's CPU went, as of when it leaves.
    let stamped = |mut msg: Message| {
        if let Message::TransferDone(r) = &mut msg {
            r.cpu = Some(totals.report());
        }
        msg
    };
    let mut m = machine(cfg, openers.is_some());
    let dest = dest_dir(cfg);
    let mut work = Work {
        files,
        fin,
        openers,
        dest_in_memory: dest.as_ref().is_some_and(|d| d.in_memory()),
        dest_on_ext4_without_journal: dest.as_ref().is_some_and(|d| d.on_ext4_without_journal()),
        cfg,
        dirs: Vec::new(),
        seen: HashMap::new(),
    };
    // An event taken while waiting for the openers.
    let mut early: Option<Event> = None;
    loop {
        if !m.is_closing() {
            cfg.progress.check_interrupt()?;
        }
        m.handle_timeout(Instant::now()).map_err(engine_error)?;
        let events = early
            .take()
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()));
        for ev in events {
            if let Event::Fatal(e) = ev {
                return Err(fatal(conn, &mut m, e, &stamped));
            }
            work.event(&mut m, ev)?;
        }
        if let Err(e) = work.act(&mut m) {
            // The source is told why, as of a receiver's fatal error.
            let _ = fatal(conn, &mut m, e.to_string(), &stamped);
            return Err(e);
        }
        tail.look(
            &mut m,
            files,
            cfg.progress.walk_done.load(Ordering::Relaxed),
        );
        // Small files finish by the thousand: one write for many.
        while let Some(msg) = m.poll_transmit() {
            conn.queue(&stamped(msg))?;
        }
        conn.flush_queued()?;
        if m.is_done() {
            return Ok(finished(m, totals));
        }
        // The source answers the report with its read figures; an older or
        // vanished source is no reason to fail a finished transfer.
        let received = if m.is_opening() {
            // An opener's answer wakes this thread at once; the network is
            // looked at between answers, and at least every millisecond.
            early = rx.recv_timeout(Duration::from_millis(1)).ok();
            conn.try_recv()
        } else {
            conn.recv(Duration::from_millis(20))
        };
        let msg = match received {
            Ok(msg) => msg,
            Err(_) if m.is_closing() => return Ok(finished(m, totals)),
            Err(e) => return Err(e),
        };
        let Some(msg) = msg else { continue };
        if let Message::Entries(batch) = &msg {
            work.listed(batch);
        }
        m.handle(Instant::now(), msg).map_err(engine_error)?;
    }
}

/// The sink's state machine, with this end's limits.
fn machine(cfg: &SinkConfig, openers: bool) -> Sink {
    let mut m = Sink::new(
        Instant::now(),
        SinkLimits {
            max_files: cfg.max_files,
            max_chunks_per_file: super::super::MAX_CHUNKS_PER_FILE,
            max_chunks_in_flight: super::super::MAX_CHUNKS_IN_FLIGHT,
            idle: super::super::TRANSFER_IDLE,
        },
    );
    if cfg.bundles {
        m.batch_messages();
    }
    if openers {
        m.open_at_once(OPENS_AT_ONCE);
    }
    if cfg.defer_full {
        m.defer_full();
    }
    m
}

/// Ends the transfer on a fatal error of a receiver or finisher: the
/// source is told. (A full destination is no such error: each file that
/// finds no room is answered on its own, [`Sink::no_room`].)
fn fatal(
    conn: &mut FramedConn,
    m: &mut Sink,
    e: String,
    stamped: &dyn Fn(Message) -> Message,
) -> EngineError {
    let err = m.fatal(e);
    while let Some(msg) = m.poll_transmit() {
        let _ = conn.send(&stamped(msg));
    }
    engine_error(err)
}

fn engine_error(e: SinkError) -> EngineError {
    match e {
        SinkError::Idle(_) => EngineError::Timeout(e.to_string()),
        SinkError::Failed(e) => EngineError::Failed(e),
    }
}

/// What the sink's control thread does for its state machine: the file
/// system work and the bookkeeping of files in flight.
struct Work<'a> {
    files: &'a Files,
    fin: &'a Sender<Arc<FileState>>,
    /// None in a dry run: every open is answered here.
    openers: Option<&'a Openers>,
    /// The destination is in memory (tmpfs): a fresh small file opens in
    /// microseconds, cheaper here than a hand-off to the openers.
    dest_in_memory: bool,
    /// The destination is on an ext4 without a journal: its directories
    /// are made one create at a time with the openers' files
    /// ([`one_create`]).
    dest_on_ext4_without_journal: bool,
    cfg: &'a SinkConfig,
    /// Directories created, to get their modes and times at the end.
    dirs: Vec<(PathBuf, Entry)>,
    /// With --delete: names the source listed in each directory still open.
    seen: HashMap<PathBuf, HashSet<OsString>>,
}

impl Work<'_> {
    /// Counts an `Entries` message for progress, and (with --delete) the
    /// names it lists in each directory.
    fn listed(&mut self, batch: &Entries) {
        let cfg = self.cfg;
        for e in &batch.entries {
            if e.kind == Kind::File {
                cfg.progress.announced_files.fetch_add(1, Ordering::Relaxed);
                cfg.progress
                    .announced_bytes
                    .fetch_add(e.size, Ordering::Relaxed);
            }
            if cfg.delete && e.kind != Kind::DirEnd {
                if let Ok(t) = cfg.target(&e.path) {
                    if let (Some(parent), Some(name)) = (t.parent(), t.file_name()) {
                        self.seen
                            .entry(parent.to_path_buf())
                            .or_default()
                            .insert(name.to_owned());
                    }
                }
            }
        }
    }

    /// Feeds the machine what a receiver, opener or finisher reported
    /// (anything but a fatal error).
    fn event(&self, m: &mut Sink, ev: Event) -> Result<(), EngineError> {
        let now = Instant::now();
        match ev {
            Event::Opened(id, want) => m.opened(now, id, want),
            Event::Full(id, error) => m.no_room(now, id, error),
            Event::Done(d, bytes) => m.file_done(now, d, bytes),
            Event::Answers(answers) => {
                for a in answers {
                    self.event(m, a)?;
                }
            }
            Event::Dones(dones) => {
                for (d, bytes) in dones {
                    m.file_done(now, d, bytes);
                }
            }
            Event::Resend(r) => {
                if let Some(f) = self.files.lock().expect("poisoned").get(&r.id) {
                    f.inner.lock().expect("poisoned").ledger.damaged();
                }
                m.damaged(now, r).map_err(engine_error)?;
            }
            Event::Written { bytes, busy_us } => {
                self.cfg.progress.bytes.fetch_add(bytes, Ordering::Relaxed);
                m.written(now, bytes, busy_us);
            }
            Event::Fatal(e) => return Err(EngineError::Failed(e)),
        }
        Ok(())
    }

    /// Whether to open `e` here rather than on the openers: a file of one
    /// chunk in memory, with nothing to read first (no `--checksum`
    /// digest to compare, no journal to check).
    fn opens_here(&self, e: &Entry) -> bool {
        self.dest_in_memory && e.digest.is_none() && chunk_count(e.size, e.chunk_size) <= 1
    }

    /// Finishes a complete file: here if that waits on no device
    /// ([`finishes_at_once`]), else on the finisher pool.
    fn finish(&self, m: &mut Sink, f: Arc<FileState>) {
        if finishes_at_once(&f, self.cfg) {
            let done = finish(&f, self.cfg, true);
            m.file_done(Instant::now(), done, f.entry.carried_bytes());
        } else {
            let _ = self.fin.send(f);
        }
    }

    /// Does what the machine asks, until it asks nothing more. Opens go to
    /// the openers in groups of up to [`OPEN_GROUP`] files.
    fn act(&mut self, m: &mut Sink) -> Result<(), EngineError> {
        let mut group = Vec::new();
        while let Some(action) = m.poll_action().map_err(engine_error)? {
            match (action, self.openers) {
                (SinkAction::Open(e), Some(o)) if !self.opens_here(&e) => {
                    group.push(e);
                    if group.len() >= OPEN_GROUP {
                        o.open(std::mem::take(&mut group));
                    }
                }
                (action, _) => self.action(m, action)?,
            }
        }
        if let Some(o) = self.openers.filter(|_| !group.is_empty()) {
            o.open(group);
        }
        Ok(())
    }

    /// Does one thing the machine asks (an open here, on this thread).
    fn action(&mut self, m: &mut Sink, action: SinkAction) -> Result<(), EngineError> {
        let cfg = self.cfg;
        match action {
            SinkAction::Dir(e) => self.dir(m, e)?,
            SinkAction::Link(e) => link(m, &e, cfg),
            SinkAction::DirEnd(e) => self.dir_end(m, &e),
            SinkAction::SetDirectories => {
                set_directories(&self.dirs, cfg, m);
                m.directories_set();
            }
            SinkAction::Open(e) => {
                let opened = open_file(&e, cfg, self.files, m.report_mut());
                self.event(m, answer(e.id, opened))?;
            }
            SinkAction::Check(id) => {
                let f = self.files.lock().expect("poisoned").get(&id).cloned();
                if let Some(f) = f.filter(|f| f.inner.lock().expect("poisoned").ledger.claim()) {
                    self.finish(m, f);
                }
            }
            SinkAction::Seal { id, resends } => self.seal(m, id, resends),
            SinkAction::Discard { id, .. } => {
                if let Some(f) = self.files.lock().expect("poisoned").remove(&id) {
                    f.inner.lock().expect("poisoned").ledger.fail();
                    // Changed (what arrived may mix two versions) or
                    // unreadable at the source: nothing of it stays.
                    drop_partial(&f);
                }
            }
            SinkAction::Release(id) => {
                self.files.lock().expect("poisoned").remove(&id);
            }
            SinkAction::Landed(l) => {
                landed(cfg, &l.path, l.size, l.mtime_ns, l.digest.as_deref());
            }
            SinkAction::WalkDone => cfg.progress.walk_done.store(true, Ordering::Relaxed),
            SinkAction::Interval(mut i) => {
                if i.rate_capped {
                    i.limit = longhaul_proto::tune::TransferLimit::RateCap;
                }
                cfg.progress.push_interval(i);
            }
        }
        Ok(())
    }

    /// Makes a directory (not in a dry run), to get its mode and time at
    /// the end.
    /// A tree whose root would replace a file (a pull's local
    /// destination, whose kind the client learns only from this entry)
    /// ends the transfer before anything is written, as the server
    /// refuses a push of one.
    fn dir(&mut self, m: &mut Sink, e: Entry) -> Result<(), EngineError> {
        let cfg = self.cfg;
        if cfg.dry_run {
            return Ok(());
        }
        let target = cfg.target(&e.path);
        if let Ok(t) = &target {
            if cfg.replaces_a_file(t) {
                return Err(EngineError::Usage(format!(
                    "destination {}",
                    DestError::TreeOntoFile(cfg.dest_shown.clone())
                )));
            }
        }
        let made = target.and_then(|t| {
            one_create(self.dest_on_ext4_without_journal, || cfg.ensure_dir(&t)).map(|()| t)
        });
        match made {
            Ok(t) => self.dirs.push((t, e)),
            Err(err) => m.failed(&e.path, err.to_string()),
        }
        Ok(())
    }

    /// A directory's listing ended: with --delete, what the source did not
    /// list there goes, unless the listing was incomplete.
    fn dir_end(&mut self, m: &mut Sink, e: &Entry) {
        if let Ok(t) = self.cfg.target(&e.path) {
            let names = self.seen.remove(&t).unwrap_or_default();
            if !e.incomplete {
                prune(&t, &e.path, &names, self.cfg, m.report_mut());
            }
        }
    }

    /// Every read of a file is done at the source: finished if all its
    /// chunks are in.
    fn seal(&self, m: &mut Sink, id: u64, resends: u32) {
        let f = self.files.lock().expect("poisoned").get(&id).cloned();
        if let Some(f) = f {
            let ready = {
                let mut p = f.inner.lock().expect("poisoned");
                p.ledger.seal(resends);
                p.ledger.claim()
            };
            if ready {
                self.finish(m, f);
            }
        }
    }
}

/// Makes a link in place (a dry run only says it would); one already
/// pointing the same way is up to date, left alone and not listed.
fn link(m: &mut Sink, e: &Entry, cfg: &SinkConfig) {
    let target = cfg.target(&e.path);
    let made = if cfg.dry_run {
        let in_place = target.is_ok_and(|t| link_in_place(&t, e, cfg));
        if !in_place {
            m.report_mut()
                .would_send
                .push(format!("{} -> {}", e.path, cfg.shown(&e.path)));
        }
        Ok(!in_place)
    } else {
        target.and_then(|t| make_link(&t, e, cfg))
    };
    let r = m.report_mut();
    match made {
        Ok(made) => {
            r.links += 1;
            r.links_up_to_date += u64::from(!made);
        }
        Err(err) => m.failed(&e.path, err.to_string()),
    }
}

/// Tells the catalogue and the digest list of a file that landed.
fn landed(cfg: &SinkConfig, path: &str, size: u64, mtime_ns: i64, digest: Option<&str>) {
    cfg.progress.files.fetch_add(1, Ordering::Relaxed);
    if let Some(f) = &cfg.on_landed {
        f(path, size, mtime_ns, digest);
    }
    if let Some(dg) = digest {
        super::super::write_digest(&cfg.digest_out, path, dg);
    }
}

/// The destination (or, for a file landing onto its own name, the
/// directory it lands in), whose file system decides how files are made.
fn dest_dir(cfg: &SinkConfig) -> Option<Arc<Dir>> {
    let dest = &cfg.dest;
    cfg.anchor
        .dir(dest, false)
        .or_else(|e| dest.parent().map_or(Err(e), |p| cfg.anchor.dir(p, false)))
        .ok()
}
