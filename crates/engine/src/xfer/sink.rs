//! The sink of a transfer: creates directories and links, opens partial
//! files (resuming from their journal), receives chunks on the data
//! streams, verifies each against its BLAKE3 hash before it counts,
//! journals it, and renames a file into place once all its chunks are in.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_proto::digest::{self, ChunkValue};
use longhaul_proto::msg::Message;
use longhaul_proto::plan::{chunk_at, chunk_count};
use longhaul_proto::transfer::sink::{FileLedger, Sink, SinkAction, SinkError, SinkLimits};
use longhaul_proto::xfer::*;

use super::beneath::{Anchor, Dir};
use super::storage::{read_exact_at, write_all_at, Storage, WriteAt};
use super::{hex, read_frame, set_mtime};
use crate::net::conn::{FramedConn, Stream};
use crate::stages::{self, timed, Stage, StageTotals};
use crate::EngineError;

/// How the sink lays files down.
pub struct SinkConfig {
    pub digest_out: Option<super::DigestOut>,
    /// Each file that landed, for the catalogue.
    pub on_landed: Option<super::OnLanded>,
    pub progress: Arc<super::Progress>,
    /// The destination as named by the request.
    pub dest: PathBuf,
    /// The destination as its user knows it (`data/run7/` on a server,
    /// the local path on a client): where `--dry-run` says files land.
    pub dest_shown: String,
    /// Whether entries go inside `dest` under their own name, or the
    /// source becomes `dest` (see [`Landing`]).
    pub landing: Landing,
    pub preserve: bool,
    /// With `preserve`: keep setuid, setgid and sticky bits and
    /// world-writable directories as the source has them. Off, they are
    /// stripped: a peer cannot plant a setuid file or an open directory.
    pub keep_special_modes: bool,
    pub force: bool,
    /// fdatasync each file before it is renamed into place.
    pub sync_files: bool,
    /// Re-read each file before it is renamed into place and compare it
    /// with the verified chunk hashes.
    pub verify: bool,
    pub storage: Arc<dyn Storage>,
    pub umask: u32,
    /// Remove destination entries the source does not have (at each `DirEnd`).
    pub delete: bool,
    /// Report what would change; change nothing.
    pub dry_run: bool,
    /// Everything written stays beneath this directory (the export root on
    /// a server, the destination or its parent on a client), resolved
    /// race-free (see [`super::beneath`]).
    pub anchor: Anchor,
    /// Files in flight this side allows ([`super::files_in_flight_cap`],
    /// as advertised to the source).
    pub max_files: u64,
    /// Both ends agreed to bundles (`TransferAccept::bundles`): bundle
    /// frames are taken on the data streams, dones batched.
    pub bundles: bool,
}

impl SinkConfig {
    /// Where an entry lands.
    pub fn target(&self, entry_path: &str) -> Result<PathBuf, EngineError> {
        let comps = components(entry_path).map_err(|e| EngineError::Usage(e.to_string()))?;
        let mut p = self.dest.clone();
        p.extend(comps.into_iter().skip(self.skipped_components()));
        Ok(p)
    }

    fn skipped_components(&self) -> usize {
        usize::from(self.landing == Landing::Onto)
    }

    /// Where an entry lands, as the user named the destination.
    pub fn shown(&self, entry_path: &str) -> String {
        let rest: Vec<&str> = entry_path
            .split('/')
            .skip(self.skipped_components())
            .collect();
        let base = self.dest_shown.trim_end_matches('/');
        match (rest.is_empty(), base.is_empty()) {
            (true, _) => self.dest_shown.clone(),
            (false, true) => rest.join("/"),
            (false, false) => format!("{base}/{}", rest.join("/")),
        }
    }

    /// The permission bits to give an entry with `preserve`.
    fn mode_of(&self, e: &Entry) -> u32 {
        let mode = e.mode & 0o7777;
        if self.keep_special_modes {
            return mode;
        }
        let mut strip = 0o7000;
        if e.kind == Kind::Dir {
            strip |= 0o002;
        }
        mode & !strip
    }
}

impl SinkConfig {
    /// Makes sure `dir` exists as a real directory beneath the anchor,
    /// creating what is missing one level at a time and refusing to pass
    /// through a symlink (one the source sent, or one planted at the
    /// destination, before or during the transfer).
    pub fn ensure_dir(&self, dir: &Path) -> Result<(), EngineError> {
        self.anchor.dir(dir, true).map(|_| ())
    }
}

/// Applies the destination rule ([`landing`]) of a push at the server,
/// before any entry arrives: looks at what `dest` is now (through
/// `anchor`, never following a link), refuses what the rule refuses, and
/// creates the directories `--mkpath` asks for (not in a dry run).
pub fn prepare_dest(
    anchor: &Anchor,
    dest: &Path,
    shown: &str,
    t: &TransferRequest,
) -> Result<Landing, EngineError> {
    let state = dest_state(anchor, dest);
    let (landing, create) = landing(
        shown,
        t.source_count,
        t.contents,
        t.dest_dir,
        state,
        t.mkpath,
    )
    .map_err(|e| EngineError::Usage(format!("destination {e}")))?;
    if t.source_dir && !t.contents && landing == Landing::Onto && state == DestState::Other {
        return Err(EngineError::Usage(format!(
            "destination {}",
            DestError::TreeOntoFile(shown.to_string())
        )));
    }
    if !t.dry_run {
        match create {
            Create::Nothing => {}
            Create::Dest => {
                anchor.dir(dest, true)?;
            }
            Create::Parents => {
                if let Some(parent) = dest.parent() {
                    anchor.dir(parent, true)?;
                }
            }
        }
    }
    Ok(landing)
}

/// What is at `dest` now, seen beneath `anchor` without following links.
fn dest_state(anchor: &Anchor, dest: &Path) -> DestState {
    match anchor
        .anchored(dest)
        .ok()
        .and_then(|p| std::fs::symlink_metadata(p).ok())
    {
        Some(m) if m.is_dir() => DestState::Dir,
        Some(_) => DestState::Other,
        None if dest == anchor.root() => DestState::Dir,
        None => DestState::Missing {
            parent: dest.parent().is_some_and(|p| anchor.dir(p, false).is_ok()),
        },
    }
}

struct FileState {
    entry: Entry,
    /// The paths as the user knows them (for messages)...
    target: PathBuf,
    part: PathBuf,
    journal_path: PathBuf,
    /// ...and as they are used: through the descriptor of their directory,
    /// opened beneath the anchor (kept open as long as the file is).
    dir: Arc<Dir>,
    /// Whether the partial file has its full size yet (a fresh file of
    /// one chunk gets it from that chunk).
    sized: AtomicBool,
    at_part: PathBuf,
    at_journal: PathBuf,
    out: Box<dyn WriteAt>,
    /// Created empty for this run (not resumed): unwritten ranges are zero.
    fresh: bool,
    /// One writer at a time per file: the kernel serializes writes to one
    /// inode anyway, and contended, its lock spins on the CPU the other
    /// streams need; a sleeping lock here costs nothing.
    write_lock: Mutex<()>,
    inner: Mutex<Progress>,
}

struct Progress {
    /// None for a one-chunk file: it completes or starts over.
    journal: Option<File>,
    /// Which chunks are verified, and whether the file may be finished.
    ledger: FileLedger,
}

enum Event {
    /// An opener's answer for a file ([`Openers`]).
    Opened(u64, Want),
    Done(FileDone, u64),
    Resend(Resend),
    Fatal(String),
    Written {
        bytes: u64,
        busy_us: u64,
    },
}

type Files = Arc<Mutex<HashMap<u64, Arc<FileState>>>>;

/// Threads that make finished files durable and rename them into place.
const FINISHERS: usize = 8;

/// Threads that open announced files ([`Openers`]).
const OPENERS: usize = 4;

/// Opens out at once: enough to keep the openers busy through the control
/// thread's turn on the network (about a millisecond).
const OPENS_AT_ONCE: usize = 64;

/// Files one finisher takes at a time.
const FINISH_BATCH: usize = 256;

/// Files up to this size are made durable together by one syncfs(2); a
/// batch with a larger one syncs each file on its own.
const GROUP_SYNC_MAX_FILE: u64 = 4 << 20;

/// Makes a batch of small files durable with one syncfs(2) on their file
/// system (one journal commit instead of one per file). False if it did
/// not (one file, a large one, or syncfs failed): each is then synced
/// on its own.
fn sync_together(batch: &[Arc<FileState>]) -> bool {
    if batch.len() < 2 || batch.iter().any(|f| f.entry.size > GROUP_SYNC_MAX_FILE) {
        return false;
    }
    // The batch may span file systems only if the destination does; then
    // sync each of them. A file is on its directory's (asked once per
    // directory, not once per file).
    let mut devs: Vec<(u64, i32)> = Vec::new();
    for f in batch {
        let Some(fd) = f.out.raw_fd() else {
            return false;
        };
        match f.dir.dev() {
            Some(d) if !devs.iter().any(|(x, _)| *x == d) => devs.push((d, fd)),
            Some(_) => {}
            None => return false,
        }
    }
    // SAFETY: syncfs on descriptors the batch holds open.
    devs.iter().all(|(_, fd)| unsafe { libc::syncfs(*fd) } == 0)
}

pub(super) fn side_path(target: &Path, suffix: &str) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!(".{name}.{suffix}"))
}

/// How a message about a full destination starts (the transfer ends).
const DESTINATION_FULL: &str = "destination full";

/// Removes what a failed file left beside its target: its partial file
/// (not a part's, which other parts share) and its journal, so that no
/// half-written file stays behind and its space is freed. The next run
/// sends the file whole.
fn drop_partial(f: &FileState) {
    if f.entry.part.is_none() {
        let _ = std::fs::remove_file(&f.at_part);
    }
    let _ = std::fs::remove_file(&f.at_journal);
}

fn io_err(what: &str, path: &Path, e: io::Error) -> String {
    format!("failed to {what} {}: {e}", path.display())
}

/// Runs the sink side until the source has announced everything and every
/// file is resolved; returns the sink's report (also sent to the source).
pub fn run_sink(
    conn: &mut FramedConn,
    streams: Vec<Box<dyn Stream>>,
    cfg: SinkConfig,
) -> Result<SinkReport, EngineError> {
    let files: Files = Arc::new(Mutex::new(HashMap::new()));
    let (tx, rx) = mpsc::channel();
    let cfg = Arc::new(cfg);
    let totals = StageTotals::new();
    // Finishing a file (fdatasync, mode, mtime, rename) runs on a pool, so
    // that neither the receivers nor the control thread wait on the disk,
    // and the file system can merge the flushes of many files.
    let (fin_tx, fin_rx) = mpsc::channel::<Arc<FileState>>();
    let fin_rx = Arc::new(Mutex::new(fin_rx));
    let mut finishers = Vec::new();
    for _ in 0..FINISHERS {
        let (fin_rx, tx, cfg) = (fin_rx.clone(), tx.clone(), cfg.clone());
        let totals = totals.clone();
        finishers.push(
            std::thread::Builder::new()
                .name("lh-finish".into())
                .spawn(move || {
                    let _counted = stages::count_into(&totals);
                    timed(Stage::Write, || finish_batches(&fin_rx, &tx, &cfg))
                })
                .map_err(|e| EngineError::io("failed to start a finisher".into(), e))?,
        );
    }
    let openers = if cfg.dry_run {
        None
    } else {
        Some(Openers::start(&cfg, &files, &tx, &totals)?)
    };
    let mut workers = Vec::new();
    let mut sockets: Vec<TcpStream> = Vec::new();
    for s in streams {
        sockets.push(crate::net::conn::socket_of(&*s)?);
        let (files, tx, fin) = (files.clone(), tx.clone(), fin_tx.clone());
        let (cfg, totals) = (cfg.clone(), totals.clone());
        workers.push(
            std::thread::Builder::new()
                .name("lh-sink".into())
                .spawn(move || {
                    let _counted = stages::count_into(&totals);
                    receive(s, &files, &tx, &fin, &cfg)
                })
                .map_err(|e| EngineError::io("failed to start a receiver".into(), e))?,
        );
    }
    let streams = sockets;
    drop(tx);
    let result = control(conn, &files, &rx, &fin_tx, openers.as_ref(), &cfg, &totals);
    for s in &streams {
        let _ = s.shutdown(Shutdown::Both);
    }
    for w in workers {
        let _ = w.join();
    }
    if let Some(o) = openers {
        o.join();
    }
    drop(fin_tx);
    for f in finishers {
        let _ = f.join();
    }
    result
}

/// The sink's report at its end, with where this end's CPU went.
fn finished(m: Sink, totals: &StageTotals) -> SinkReport {
    let mut r = m.into_report();
    r.cpu = Some(totals.report());
    r
}

/// A finisher's loop: one file, and whatever else is ready (small files
/// are made durable together: group commit), until the channel closes.
fn finish_batches(fin_rx: &Mutex<Receiver<Arc<FileState>>>, tx: &Sender<Event>, cfg: &SinkConfig) {
    loop {
        let batch: Vec<Arc<FileState>> = {
            let rx = fin_rx.lock().expect("poisoned");
            let Ok(first) = rx.recv() else { return };
            let mut b = vec![first];
            while b.len() < FINISH_BATCH {
                match rx.try_recv() {
                    Ok(f) => b.push(f),
                    Err(_) => break,
                }
            }
            b
        };
        let synced = cfg.sync_files && sync_together(&batch);
        for f in batch {
            let done = finish(&f, cfg, synced);
            let _ = tx.send(Event::Done(done, f.entry.carried_bytes()));
        }
    }
}

/// Drives the sink's state machine ([`Sink`]): feeds it the source's
/// messages and what the receivers and finishers report, does the file
/// work it asks for, and sends what it has to say.
fn control(
    conn: &mut FramedConn,
    files: &Files,
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
    let mut m = Sink::new(
        Instant::now(),
        SinkLimits {
            max_files: cfg.max_files,
            max_chunks_per_file: super::MAX_CHUNKS_PER_FILE,
            max_chunks_in_flight: super::MAX_CHUNKS_IN_FLIGHT,
            idle: super::TRANSFER_IDLE,
        },
    );
    if cfg.bundles {
        m.batch_messages();
    }
    if openers.is_some() {
        m.open_at_once(OPENS_AT_ONCE);
    }
    let mut work = Work {
        files,
        fin,
        openers,
        dest_in_memory: dest_in_memory(cfg),
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
            let now = Instant::now();
            match ev {
                Event::Opened(id, want) => m.opened(now, id, want),
                Event::Done(d, bytes) => m.file_done(now, d, bytes),
                Event::Resend(r) => {
                    if let Some(f) = files.lock().expect("poisoned").get(&r.id) {
                        f.inner.lock().expect("poisoned").ledger.damaged();
                    }
                    m.damaged(now, r).map_err(engine_error)?;
                }
                Event::Written { bytes, busy_us } => {
                    cfg.progress.bytes.fetch_add(bytes, Ordering::Relaxed);
                    m.written(now, bytes, busy_us);
                }
                Event::Fatal(e) => {
                    if e.starts_with(DESTINATION_FULL) {
                        // Every file in flight fails with the transfer:
                        // their partial files give their space back.
                        for f in files.lock().expect("poisoned").values() {
                            drop_partial(f);
                        }
                    }
                    let err = m.fatal(e);
                    while let Some(msg) = m.poll_transmit() {
                        let _ = conn.send(&stamped(msg));
                    }
                    return Err(engine_error(err));
                }
            }
        }
        work.act(&mut m)?;
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
    cfg: &'a SinkConfig,
    /// Directories created, to get their modes and times at the end.
    dirs: Vec<(PathBuf, Entry)>,
    /// With --delete: names the source listed in each directory still open.
    seen: HashMap<PathBuf, std::collections::HashSet<std::ffi::OsString>>,
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

    /// Does what the machine asks, until it asks nothing more.
    fn act(&mut self, m: &mut Sink) -> Result<(), EngineError> {
        let cfg = self.cfg;
        while let Some(action) = m.poll_action().map_err(engine_error)? {
            match action {
                SinkAction::Dir(_) if cfg.dry_run => {}
                SinkAction::Dir(e) => {
                    match cfg
                        .target(&e.path)
                        .and_then(|t| cfg.ensure_dir(&t).map(|()| t))
                    {
                        Ok(t) => self.dirs.push((t, e)),
                        Err(err) => m.failed(&e.path, err.to_string()),
                    }
                }
                SinkAction::Link(e) if cfg.dry_run => {
                    m.report_mut()
                        .would_send
                        .push(format!("{} -> {}", e.path, cfg.shown(&e.path)));
                }
                SinkAction::Link(e) => {
                    match cfg.target(&e.path).and_then(|t| make_link(&t, &e, cfg)) {
                        Ok(()) => m.report_mut().links += 1,
                        Err(err) => m.failed(&e.path, err.to_string()),
                    }
                }
                SinkAction::DirEnd(e) => {
                    if let Ok(t) = cfg.target(&e.path) {
                        let names = self.seen.remove(&t).unwrap_or_default();
                        if !e.incomplete {
                            prune(&t, &names, cfg, m.report_mut());
                        }
                    }
                }
                SinkAction::Open(e) => match self.openers {
                    Some(o) if !self.opens_here(&e) => o.open(e),
                    _ => {
                        let want = open_file(&e, cfg, self.files, m.report_mut());
                        m.opened(Instant::now(), e.id, want);
                    }
                },
                SinkAction::Check(id) => {
                    let f = self.files.lock().expect("poisoned").get(&id).cloned();
                    if let Some(f) = f.filter(|f| f.inner.lock().expect("poisoned").ledger.claim())
                    {
                        self.finish(m, f);
                    }
                }
                SinkAction::Seal { id, resends } => {
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
                SinkAction::Landed {
                    path,
                    size,
                    mtime_ns,
                    digest,
                } => {
                    cfg.progress.files.fetch_add(1, Ordering::Relaxed);
                    if let Some(f) = &cfg.on_landed {
                        f(&path, size, mtime_ns, digest.as_deref());
                    }
                    if let Some(dg) = &digest {
                        super::write_digest(&cfg.digest_out, &path, dg);
                    }
                }
                SinkAction::WalkDone => cfg.progress.walk_done.store(true, Ordering::Relaxed),
                SinkAction::Interval(mut i) => {
                    if i.rate_capped {
                        i.limit = longhaul_proto::tune::TransferLimit::RateCap;
                    }
                    cfg.progress.push_interval(i);
                }
                SinkAction::SetDirectories => {
                    for (path, e) in self.dirs.iter().rev() {
                        // Opened again beneath the anchor; changed through
                        // its descriptor, so never through a link swapped
                        // in since.
                        let Ok(d) = cfg.anchor.dir(path, false) else {
                            continue;
                        };
                        let mode = std::fs::Permissions::from_mode(cfg.mode_of(e));
                        let set = |what, r: io::Result<()>| {
                            r.map_err(|err| dir_attr_failure(what, path, &err))
                        };
                        // Without --preserve a directory's time is a courtesy.
                        let mtime = super::set_mtime_through(&d.path(), e.mtime_ns);
                        if cfg.preserve {
                            if let Err(err) = set("mode", std::fs::set_permissions(d.path(), mode))
                                .and(set("mtime", mtime))
                            {
                                m.failed(&e.path, err);
                            }
                        }
                    }
                    m.directories_set();
                }
            }
        }
        Ok(())
    }
}

/// A directory's mode or mtime that `--preserve` could not give it.
fn dir_attr_failure(what: &str, dir: &Path, e: &io::Error) -> String {
    format!(
        "failed to set the {what} of directory {}: {e}; check that it is not immutable \
         (lsattr -d) and that its file system is not mounted read-only, or copy without --preserve",
        dir.display()
    )
}

/// Whether the destination (or, for a file landing onto its own name, the
/// directory it lands in) is in memory.
fn dest_in_memory(cfg: &SinkConfig) -> bool {
    let dest = &cfg.dest;
    cfg.anchor
        .dir(dest, false)
        .or_else(|e| dest.parent().map_or(Err(e), |p| cfg.anchor.dir(p, false)))
        .is_ok_and(|d| d.in_memory())
}

/// Threads that open announced files beside the control thread: a create
/// waiting on the file system's journal, or a resume hashing a partial
/// file again, holds up neither the network nor the other files.
/// Answers come back as [`Event::Opened`].
struct Openers {
    tx: Sender<Entry>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Openers {
    fn start(
        cfg: &Arc<SinkConfig>,
        files: &Files,
        events: &Sender<Event>,
        totals: &Arc<StageTotals>,
    ) -> Result<Self, EngineError> {
        let (tx, rx) = mpsc::channel::<Entry>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for _ in 0..OPENERS {
            let (rx, cfg, files, events) = (rx.clone(), cfg.clone(), files.clone(), events.clone());
            let totals = totals.clone();
            let open = move || {
                let _counted = stages::count_into(&totals);
                loop {
                    let Ok(e) = rx.lock().expect("poisoned").recv() else {
                        return;
                    };
                    // Dry runs open nothing here: nothing to report.
                    let want = timed(Stage::Write, || {
                        open_file(&e, &cfg, &files, &mut SinkReport::default())
                    });
                    if events.send(Event::Opened(e.id, want)).is_err() {
                        return;
                    }
                }
            };
            threads.push(
                std::thread::Builder::new()
                    .name("lh-open".into())
                    .spawn(open)
                    .map_err(|e| EngineError::io("failed to start an opener".into(), e))?,
            );
        }
        Ok(Self { tx, threads })
    }

    fn open(&self, e: Entry) {
        let _ = self.tx.send(e);
    }

    /// Lets the openers finish what they took, and waits for them.
    fn join(self) {
        drop(self.tx);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn make_link(t: &Path, e: &Entry, cfg: &SinkConfig) -> Result<(), EngineError> {
    let target = e.target.clone().unwrap_or_default();
    let (dir, name) = cfg.anchor.parent_of(t, true)?;
    let at = dir.join(&name);
    if std::fs::read_link(&at).is_ok_and(|old| old == Path::new(&target)) {
        return Ok(());
    }
    let tmp = dir.join(side_path(t, "lhlink").file_name().expect("named"));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&target, &tmp)
        .and_then(|()| std::fs::rename(&tmp, &at))
        .map_err(|err| EngineError::Usage(io_err("create link", &cfg.anchor.show(t), err)))?;
    let _ = set_mtime(&at, e.mtime_ns);
    Ok(())
}

/// Removes what a destination directory holds beyond `keep` (sync --delete).
fn prune(
    dir: &Path,
    keep: &std::collections::HashSet<std::ffi::OsString>,
    cfg: &SinkConfig,
    report: &mut SinkReport,
) {
    // Listed and deleted through the directory's descriptor: a link
    // swapped in for it cannot turn the deletion elsewhere.
    let Ok(d) = cfg.anchor.dir(dir, false) else {
        return;
    };
    let Ok(rd) = std::fs::read_dir(d.path()) else {
        return;
    };
    for de in rd.flatten() {
        let name = de.file_name();
        if keep.contains(&name) {
            continue;
        }
        let s = name.to_string_lossy();
        if is_reserved_name(&s) {
            // A partial file, journal or mark of a file the source has
            // too may be in use (this transfer's, or a fleet's other
            // parts'); one of a file the source no longer has is stale.
            if !side_of(&s)
                .iter()
                .any(|n| keep.contains(std::ffi::OsStr::new(n)))
                && !cfg.dry_run
            {
                let _ = std::fs::remove_file(d.join(&name));
            }
            continue;
        }
        let at = d.join(&name);
        let path = dir.join(&name);
        // Reported relative to the destination: the peer need not learn the
        // server's directory layout.
        let shown = path
            .strip_prefix(&cfg.dest)
            .unwrap_or(&path)
            .display()
            .to_string();
        report.deleted.push(shown.clone());
        if cfg.dry_run {
            continue;
        }
        let is_dir = std::fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir());
        let r = if is_dir {
            std::fs::remove_dir_all(&at)
        } else {
            std::fs::remove_file(&at)
        };
        if let Err(e) = r {
            report.failed.push(Failure {
                path: shown,
                error: format!("cannot delete: {e}"),
            });
        }
    }
}

/// The names of the files a reserved name ([`is_reserved_name`]) may
/// belong to: `NAME` for `.NAME.lhpart`, and also `NAME` for a part's
/// `.NAME.F-E.lhdone` (whose `NAME` may itself hold dots and dashes).
fn side_of(reserved: &str) -> Vec<&str> {
    let Some(rest) = reserved.strip_prefix('.').and_then(|r| {
        RESERVED_SUFFIXES
            .iter()
            .find_map(|suffix| r.strip_suffix(suffix))
    }) else {
        return Vec::new();
    };
    let mut names = vec![rest];
    if let Some((name, range)) = rest.rsplit_once('.') {
        if range
            .split_once('-')
            .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
        {
            names.push(name);
        }
    }
    names
}

/// Answers one announced file: skip it, or open its partial file and say
/// which chunks are still needed.
fn open_file(e: &Entry, cfg: &SinkConfig, files: &Files, report: &mut SinkReport) -> Want {
    let fail = |error: String| Want::Fail { id: e.id, error };
    // The machine checked the peer's numbers (chunk size and count, chunks
    // in flight) before it asked for the file.
    let count = chunk_count(e.size, e.chunk_size);
    let target = match cfg.target(&e.path) {
        Ok(t) => t,
        Err(err) => return fail(err.to_string()),
    };
    if !cfg.force {
        // A missing (or refused) parent: no such file here yet.
        let at = cfg.anchor.anchored(&target).ok();
        if let Some(m) = at
            .as_ref()
            .and_then(|at| std::fs::symlink_metadata(at).ok())
        {
            let at = at.as_ref().expect("stat succeeded on it");
            let same = m.is_file()
                && m.len() == e.size
                && match &e.digest {
                    // sync --checksum: the content decides, not the mtime.
                    Some(d) => super::content_digest(&*cfg.storage, at, e.size)
                        .is_ok_and(|mine| &mine == d),
                    None => super::mtime_ns(&m) == e.mtime_ns,
                };
            if same {
                return Want::Skip { id: e.id };
            }
        }
    }
    if cfg.dry_run {
        report
            .would_send
            .push(format!("{} -> {}", e.path, cfg.shown(&e.path)));
        report.would_send_bytes += e.size;
        return Want::Skip { id: e.id };
    }
    let (dir, _) = match cfg.anchor.parent_of(&target, true) {
        Ok(x) => x,
        Err(err) => return fail(err.to_string()),
    };
    // From here on the target is named as the peer knows it: messages
    // never carry a server's absolute path.
    let target = cfg.anchor.show(&target);
    if let Some(range) = e.part {
        return open_part(e, range, cfg, files, target, dir);
    }
    let part = side_path(&target, "lhpart");
    let journal_path = side_path(&target, "lhjournal");
    let side = |p: &Path| dir.join(p.file_name().expect("side paths have a name"));
    let (at_part, at_journal) = (side(&part), side(&journal_path));
    let header = JournalHeader {
        size: e.size,
        mtime_ns: e.mtime_ns,
        chunk_size: e.chunk_size,
    };
    let mut hashes = vec![None; count as usize];
    let mut skip = Vec::new();
    let mut resumed = 0u64;
    // Resume: chunks the journal lists are hashed again, not trusted.
    // Resume: only files of several chunks have a journal; the partial
    // file is opened only when there is one.
    let journal_bytes = if count > 1 {
        read_journal(&at_journal, count)
    } else {
        None
    };
    if let Some((bytes, reader)) =
        journal_bytes.and_then(|b| cfg.storage.open_read(&at_part).ok().map(|r| (b, r)))
    {
        if let Some((h, records)) = parse_journal(&bytes).filter(|(h, _)| *h == header) {
            let _ = h;
            let mut buf = Vec::new();
            for (index, hash) in records {
                if u64::from(index) >= count || hashes[index as usize].is_some() {
                    continue;
                }
                let c = chunk_at(e.id, e.size, e.chunk_size, index);
                buf.resize(c.len as usize, 0);
                if read_exact_at(&*reader, &mut buf, c.offset).is_ok()
                    && digest::chunk_value(&buf, c.offset, false) == hash
                {
                    hashes[index as usize] = Some(hash);
                    skip.push(index);
                    resumed += u64::from(c.len);
                }
            }
        }
    }
    let fresh = skip.is_empty();
    skip.sort_unstable();
    let skip = skip_ranges(skip, MAX_SKIP_RANGES);
    let part_name = part.file_name().expect("side paths have a name");
    let opened = if fresh {
        cfg.storage.create_in(&dir, part_name)
    } else {
        cfg.storage.open_write(&at_part, false)
    };
    let out = match opened {
        Ok(o) => o,
        Err(err) => return fail(io_err("create", &part, err)),
    };
    // A fresh file of one chunk gets its size from that chunk's write (or,
    // for a hole, when it arrives): no ftruncate.
    let sized = !(fresh && count == 1);
    if fresh && sized {
        let fail = |error: String| {
            // Made for this run and failed at once: nothing stays.
            let _ = std::fs::remove_file(&at_part);
            fail(error)
        };
        if let Err(err) = out.set_len(e.size) {
            return fail(io_err("size", &part, err));
        }
        // Reserve the space now, so that a full disk shows at once; a
        // sparse source keeps its holes instead.
        if !e.sparse && count > 1 {
            if let Err(err) = out.allocate(e.size) {
                if err.raw_os_error() == Some(libc::ENOSPC) {
                    return fail(format!(
                        "{DESTINATION_FULL}: cannot allocate {} bytes for {}",
                        e.size,
                        target.display()
                    ));
                }
            }
        }
    }
    // Rewrite the journal with the records that checked out. A one-chunk
    // file has none: it completes or starts over.
    let journal = if count == 1 {
        Ok(None)
    } else {
        let records = hashes
            .iter()
            .enumerate()
            .filter_map(|(i, h)| Some((i as u32, (*h)?)));
        new_journal(&at_journal, &header, records).map(Some)
    };
    let journal = match journal {
        Ok(j) => j,
        Err(err) => return fail(io_err("write journal", &journal_path, err)),
    };
    let state = Arc::new(FileState {
        entry: e.clone(),
        target,
        part,
        journal_path,
        dir,
        sized: AtomicBool::new(sized),
        at_part,
        at_journal,
        out,
        fresh,
        write_lock: Mutex::new(()),
        inner: Mutex::new(Progress {
            journal,
            ledger: FileLedger::new(
                hashes.len(),
                hashes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, h)| Some((i as u32, (*h)?))),
            ),
        }),
    });
    files.lock().expect("poisoned").insert(e.id, state);
    Want::Send {
        id: e.id,
        skip,
        resumed_bytes: resumed,
    }
}

/// Answers a part of a file ([`Entry::part`], see [`super::parts`]): opens
/// the shared partial file without truncating it, resumes from this part's
/// journal (or finds the part done), and asks for the part's chunks only.
fn open_part(
    e: &Entry,
    [first, end]: [u32; 2],
    cfg: &SinkConfig,
    files: &Files,
    target: PathBuf,
    dir: Arc<Dir>,
) -> Want {
    let fail = |error: String| Want::Fail { id: e.id, error };
    let count = chunk_count(e.size, e.chunk_size);
    let part = side_path(&target, "lhpart");
    let journal_path = super::parts::journal_name(&target, [first, end], false);
    let done_path = super::parts::journal_name(&target, [first, end], true);
    let side = |p: &Path| dir.join(p.file_name().expect("side paths have a name"));
    let (at_part, at_journal, at_done) = (side(&part), side(&journal_path), side(&done_path));
    let header = JournalHeader {
        size: e.size,
        mtime_ns: e.mtime_ns,
        chunk_size: e.chunk_size,
    };
    // Opened (made if missing) and never truncated: other parts write
    // into the same file. Every part sizes it alike.
    // Two parts may make it at once: the one whose create loses opens it.
    let opened = cfg.storage.open_write(&at_part, false).or_else(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            cfg.storage.open_write(&at_part, false)
        } else {
            Err(e)
        }
    });
    let out = match opened {
        Ok(o) => o,
        Err(err) => return fail(io_err("open", &part, err)),
    };
    let len = std::fs::metadata(&at_part).map(|m| m.len());
    if len.as_ref().map_or(true, |l| *l != e.size) {
        if let Err(err) = out.set_len(e.size) {
            return fail(io_err("size", &part, err));
        }
    }
    // A done mark first (this part finished before a restart), else its
    // journal: the chunks listed are hashed again, not trusted.
    let journal = read_journal(&at_done, count).or_else(|| read_journal(&at_journal, count));
    let verified = journal.map_or_else(Vec::new, |bytes| {
        super::parts::resumed(&*cfg.storage, &at_part, &bytes, &header, e, [first, end])
    });
    let resumed: u64 = verified
        .iter()
        .map(|(i, _)| u64::from(chunk_at(e.id, e.size, e.chunk_size, *i).len))
        .sum();
    let _ = std::fs::remove_file(&at_done);
    let journal = new_journal(&at_journal, &header, verified.iter().copied());
    let journal = match journal {
        Ok(j) => j,
        Err(err) => return fail(io_err("write journal", &journal_path, err)),
    };
    // Chunks outside the part are other transfers': booked as present
    // here (their hashes are never used), and skipped by the source.
    let outside = (0..first).chain(end..count as u32);
    let mut skip: Vec<u32> = outside
        .clone()
        .chain(verified.iter().map(|(i, _)| *i))
        .collect();
    skip.sort_unstable();
    let skip = skip_ranges(skip, MAX_SKIP_RANGES);
    let present = outside.map(|i| (i, [0u8; 32])).chain(verified);
    let state = Arc::new(FileState {
        entry: e.clone(),
        target,
        part,
        journal_path,
        dir,
        sized: AtomicBool::new(true),
        at_part,
        at_journal,
        out,
        // Other parts (or an earlier run) may have written here.
        fresh: false,
        write_lock: Mutex::new(()),
        inner: Mutex::new(Progress {
            journal: Some(journal),
            ledger: FileLedger::new(count as usize, present),
        }),
    });
    files.lock().expect("poisoned").insert(e.id, state);
    Want::Send {
        id: e.id,
        skip,
        resumed_bytes: resumed,
    }
}

/// Finishes a complete part: its data and journal made durable, its
/// journal marked done, and the file landed if every part is now in
/// ([`super::parts::finalize`]).
fn finish_part(f: &FileState, cfg: &SinkConfig, synced: bool) -> Result<Option<String>, String> {
    let range = f.entry.chunk_range();
    if cfg.sync_files && !synced && !f.dir.in_memory() {
        f.out.sync_data().map_err(|e| io_err("sync", &f.part, e))?;
    }
    if cfg.verify {
        verify(f, cfg)?;
    }
    {
        let mut p = f.inner.lock().expect("poisoned");
        if let Some(j) = p.journal.take() {
            if cfg.sync_files && !f.dir.in_memory() {
                j.sync_data()
                    .map_err(|e| io_err("sync", &f.journal_path, e))?;
            }
        }
    }
    let done = super::parts::journal_name(&f.target, range, true);
    let name = |p: &Path| p.file_name().expect("named").to_owned();
    match rustix::fs::renameat(f.dir.fd(), name(&f.journal_path), f.dir.fd(), name(&done)) {
        // Another part finished the file and cleared the journals away
        // (this range was carried twice, as a queue's expired lease is).
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(io_err("mark done", &f.journal_path, e.into())),
        Ok(()) => {}
    }
    let mode = if cfg.preserve {
        cfg.mode_of(&f.entry)
    } else {
        0o666 & !cfg.umask
    };
    let own = f.inner.lock().expect("poisoned").ledger.hashes().to_vec();
    let finished = super::parts::finalize(&super::parts::Finish {
        dir: &f.dir,
        target: &f.target,
        part: &f.part,
        entry: &f.entry,
        mode,
        own: &own,
        storage: &*cfg.storage,
    })?;
    Ok(match finished {
        super::parts::Finalized::Landed(digest) => Some(digest),
        super::parts::Finalized::Waiting => None,
        super::parts::Finalized::Elsewhere => {
            // Written into the landed file itself: its mtime again.
            let _ = f.out.set_mtime(f.entry.mtime_ns);
            None
        }
    })
}

/// Writes a journal afresh at `at`: the header and the `records` that
/// checked out, in a new inode (never written through a link planted in
/// its name); returns it open for appending.
fn new_journal(
    at: &Path,
    header: &JournalHeader,
    records: impl IntoIterator<Item = (u32, [u8; 32])>,
) -> io::Result<File> {
    match std::fs::remove_file(at) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut j = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(at)?;
    j.write_all(&header.encode())?;
    for (i, h) in records {
        j.write_all(&journal_record(i, &h))?;
    }
    Ok(j)
}

/// Reads a resume journal, if there is a usable one: a regular file with
/// one name (never through a link, never a FIFO or device, which would
/// hang or feed the reader without end), no longer than a journal of
/// `chunks` chunks can be. Anything else is ignored: the file starts over.
fn read_journal(path: &Path, chunks: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let most = JOURNAL_HEADER_LEN as u64 + chunks.saturating_mul(JOURNAL_RECORD_LEN as u64);
    let f = super::storage::open_regular(path, OpenOptions::new().read(true)).ok()?;
    let m = f.metadata().ok()?;
    if m.nlink() != 1 || m.len() > most {
        tracing::warn!(
            "ignoring the journal {}: {}",
            path.display(),
            if m.nlink() != 1 {
                "it has other names (hard links)"
            } else {
                "it is longer than a journal of this file can be"
            }
        );
        return None;
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    f.take(most).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Whether finishing `f` waits on no device, so that the thread that
/// completed it finishes it at once (mode, mtime, rename: microseconds)
/// instead of handing it to the finisher pool, which costs two thread
/// wake-ups a file: a file in memory (tmpfs, where fdatasync does
/// nothing) with nothing to read back. Not for `--no-sync` on other file
/// systems: there a rename may still wait on a server (NFS) or a journal.
fn finishes_at_once(f: &FileState, cfg: &SinkConfig) -> bool {
    !cfg.verify && f.dir.in_memory()
}

/// Makes a complete file durable, gives it its mode and mtime, and renames
/// it into place.
fn finish(f: &FileState, cfg: &SinkConfig, synced: bool) -> FileDone {
    let id = f.entry.id;
    if f.entry.part.is_some() {
        return match finish_part(f, cfg, synced) {
            Ok(digest) => FileDone {
                id,
                digest,
                ..FileDone::default()
            },
            Err(error) => FileDone {
                id,
                error: Some(error),
                ..FileDone::default()
            },
        };
    }
    let result = (|| {
        if cfg.sync_files && !synced && !f.dir.in_memory() {
            f.out.sync_data().map_err(|e| io_err("sync", &f.part, e))?;
        }
        if cfg.verify {
            verify(f, cfg)?;
        }
        let mode = if cfg.preserve {
            cfg.mode_of(&f.entry)
        } else {
            0o666 & !cfg.umask
        };
        // Through the open file: no path, nothing to follow.
        f.out
            .set_mode(mode)
            .map_err(|e| io_err("set mode of", &f.part, e))?;
        f.out
            .set_mtime(f.entry.mtime_ns)
            .map_err(|e| io_err("set mtime of", &f.part, e))?;
        // Relative to the directory's descriptor: the very directory the
        // partial file was made in, without a walk of its /proc path.
        let name = |p: &Path| p.file_name().expect("named").to_owned();
        rustix::fs::renameat(f.dir.fd(), name(&f.part), f.dir.fd(), name(&f.target))
            .map_err(io::Error::from)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EISDIR | libc::ENOTEMPTY | libc::EEXIST) => {
                    format!(
                        "{} is a directory; not replaced by a file",
                        f.target.display()
                    )
                }
                _ => io_err("rename into", &f.target, e),
            })?;
        if f.inner.lock().expect("poisoned").journal.is_some() {
            let _ = std::fs::remove_file(&f.at_journal);
        }
        let p = f.inner.lock().expect("poisoned");
        let values: Vec<ChunkValue> = p.ledger.hashes().iter().flatten().copied().collect();
        digest::file_digest(&values)
            .map(|d| hex(&d))
            .ok_or_else(|| {
                format!(
                    "{}: no chunk values to make its digest of",
                    f.target.display()
                )
            })
    })();
    match result {
        Ok(digest) => FileDone {
            id,
            digest: Some(digest),
            ..FileDone::default()
        },
        Err(error) => {
            drop_partial(f);
            FileDone {
                id,
                error: Some(error),
                ..FileDone::default()
            }
        }
    }
}

/// Reads a written file back and compares each chunk with its hash.
fn verify(f: &FileState, cfg: &SinkConfig) -> Result<(), String> {
    let r = cfg
        .storage
        .open_read(&f.at_part)
        .map_err(|e| io_err("re-read", &f.part, e))?;
    let hashes = f.inner.lock().expect("poisoned").ledger.hashes().to_vec();
    let [first, end] = f.entry.chunk_range();
    let whole = chunk_count(f.entry.size, f.entry.chunk_size) == 1;
    let mut buf = Vec::new();
    for (i, h) in hashes
        .iter()
        .enumerate()
        .take(end as usize)
        .skip(first as usize)
    {
        let c = chunk_at(f.entry.id, f.entry.size, f.entry.chunk_size, i as u32);
        buf.resize(c.len as usize, 0);
        read_exact_at(&*r, &mut buf, c.offset).map_err(|e| io_err("re-read", &f.part, e))?;
        if Some(digest::chunk_value(&buf, c.offset, whole)) != *h {
            return Err(format!(
                "verification failed: {} differs from the source at offset {} (chunk {i}) after writing",
                f.target.display(),
                c.offset
            ));
        }
    }
    Ok(())
}

/// One data stream: chunk frames in, streamed through the cache in pieces
/// (hashed and written as they arrive), counted only once the trailer's
/// hash matches; bundle frames (if negotiated) in whole, each record
/// checked against its hash and then written with one write.
fn receive(
    s: Box<dyn Stream>,
    files: &Files,
    tx: &Sender<Event>,
    fin: &Sender<Arc<FileState>>,
    cfg: &SinkConfig,
) {
    // Buffered: a small file's header, bytes and trailer come in one read;
    // big pieces bypass the buffer.
    let mut r = io::BufReader::with_capacity(256 << 10, s);
    let mut header = [0u8; CHUNK_HEADER_LEN];
    let mut trailer = [0u8; CHUNK_TRAILER_LEN];
    let mut buf = super::storage::AlignedBuf::new(super::PIECE);
    let mut body = Vec::new();
    let zeros = vec![0u8; super::PIECE];
    let fatal = |e: String| {
        let _ = tx.send(Event::Fatal(e));
    };
    loop {
        match timed(Stage::Receive, || read_frame(&mut r, &mut header[..1])) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return fatal(format!("data stream failed: {e}")),
        }
        if header[0] == BUNDLE_FRAME {
            if !cfg.bundles {
                return fatal("bad chunk frame: a bundle frame, which was not agreed".into());
            }
            if let Err(e) = receive_bundle(&mut r, &mut body, files, tx, fin, cfg) {
                return fatal(e);
            }
            continue;
        }
        if let Err(e) = timed(Stage::Receive, || read_all(&mut r, &mut header[1..])) {
            return fatal(format!("data stream failed: {e}"));
        }
        let h = match ChunkHeader::decode(&header) {
            Ok(h) => h,
            Err(e) => return fatal(e.to_string()),
        };
        let f = files.lock().expect("poisoned").get(&h.file).cloned();
        if let Some(f) = &f {
            let want = chunk_at(h.file, f.entry.size, f.entry.chunk_size, h.index);
            let count = chunk_count(f.entry.size, f.entry.chunk_size);
            if u64::from(h.index) >= count || (want.offset, want.len) != (h.offset, h.len) {
                return fatal(format!(
                    "chunk {} of {} does not match the file's plan",
                    h.index, f.entry.path
                ));
            }
        }
        // Bytes go to storage unless the file is gone (failed or done), the
        // chunk is verified already, or it is a hole in a fresh file.
        let target = f
            .as_ref()
            .filter(|f| f.inner.lock().expect("poisoned").ledger.wants(h.index));
        let write = target.is_some_and(|f| !(h.zero && f.fresh));
        let mut write_error = None;
        if let Some(f) = target.filter(|f| h.zero && !f.sized.load(Ordering::Relaxed)) {
            // A hole not written: the file still needs its size.
            match f.out.set_len(f.entry.size) {
                Ok(()) => f.sized.store(true, Ordering::Relaxed),
                Err(e) => write_error = Some(e),
            }
        }
        let mut write_us = 0u64;
        let mut checker = digest::Checker::new();
        let mut off = 0u64;
        while off < u64::from(h.len) {
            let n = (u64::from(h.len) - off).min(buf.len() as u64) as usize;
            let piece: &[u8] = if h.zero {
                &zeros[..n]
            } else {
                if let Err(e) = timed(Stage::Receive, || read_frame(&mut r, &mut buf[..n])) {
                    return fatal(format!("data stream failed mid-chunk: {e}"));
                }
                timed(Stage::Verify, || checker.update(&buf[..n]));
                &buf[..n]
            };
            if write && write_error.is_none() {
                let f = target.expect("write implies a target");
                let t = Instant::now();
                let _one_writer = f.write_lock.lock().expect("poisoned");
                if let Err(e) = timed(Stage::Write, || {
                    write_all_at(&*f.out, piece, h.offset + off)
                }) {
                    write_error = Some(e);
                }
                write_us += t.elapsed().as_micros() as u64;
            }
            off += n as u64;
        }
        if let Err(e) = timed(Stage::Receive, || read_frame(&mut r, &mut trailer)) {
            return fatal(format!("data stream failed mid-chunk: {e}"));
        }
        let Some(f) = target else { continue };
        let trailer = Trailer::decode(&trailer);
        let check = if h.zero {
            super::zero_check(h.len)
        } else {
            timed(Stage::Verify, || checker.finalize())
        };
        if check != trailer.check {
            let _ = tx.send(Event::Resend(Resend {
                id: h.file,
                index: h.index,
            }));
            continue;
        }
        let written = Written {
            index: h.index,
            hash: trailer.value,
            len: h.len,
            error: write_error,
            busy_us: write_us,
        };
        if let Err(e) = book(f, written, tx, fin, cfg) {
            return fatal(e);
        }
    }
}

/// Fills `buf` from the stream: an end of stream here cuts a frame short.
fn read_all(r: &mut impl io::Read, buf: &mut [u8]) -> io::Result<()> {
    match read_frame(r, buf)? {
        true => Ok(()),
        false => Err(io::ErrorKind::UnexpectedEof.into()),
    }
}

/// The rest of a bundle frame (its type byte is read): the header,
/// checked against the caps, then the records, read whole. A record for
/// a file no longer here (landed, failed, skipped) or already verified is
/// dropped; one whose hash does not match asks for that file's chunk 0
/// again; one whose length is not the file's announced size (or for a
/// file of several chunks) breaks the protocol. Errors end the stream.
fn receive_bundle(
    r: &mut impl io::Read,
    body: &mut Vec<u8>,
    files: &Files,
    tx: &Sender<Event>,
    fin: &Sender<Arc<FileState>>,
    cfg: &SinkConfig,
) -> Result<(), String> {
    let mut head = [BUNDLE_FRAME; BUNDLE_HEADER_LEN];
    timed(Stage::Receive, || read_all(r, &mut head[1..]))
        .map_err(|e| format!("data stream failed: {e}"))?;
    let h = BundleHeader::decode(&head).map_err(|e| e.to_string())?;
    body.resize(h.body_len as usize, 0);
    timed(Stage::Receive, || read_all(r, body))
        .map_err(|e| format!("data stream failed mid-bundle: {e}"))?;
    let records = h.records(body).map_err(|e| e.to_string())?;
    let found: Vec<Option<Arc<FileState>>> = {
        let files = files.lock().expect("poisoned");
        records
            .iter()
            .map(|rec| files.get(&rec.file).cloned())
            .collect()
    };
    for (rec, f) in records.iter().zip(found) {
        let Some(f) = f else { continue };
        if chunk_count(f.entry.size, f.entry.chunk_size) != 1
            || rec.data.len() as u64 != f.entry.size
        {
            return Err(format!(
                "bad chunk frame: a bundle record of {} bytes for {}, announced with {} bytes in one chunk of {}",
                rec.data.len(),
                f.entry.path,
                f.entry.size,
                f.entry.chunk_size
            ));
        }
        if !f.inner.lock().expect("poisoned").ledger.wants(0) {
            continue;
        }
        if timed(Stage::Verify, || digest::check(rec.data)) != rec.trailer.check {
            let _ = tx.send(Event::Resend(Resend {
                id: rec.file,
                index: 0,
            }));
            continue;
        }
        let t = Instant::now();
        let error = if rec.data.is_empty() {
            None
        } else {
            let _one_writer = f.write_lock.lock().expect("poisoned");
            timed(Stage::Write, || write_all_at(&*f.out, rec.data, 0)).err()
        };
        let written = Written {
            index: 0,
            hash: rec.trailer.value,
            len: rec.data.len() as u32,
            error,
            busy_us: t.elapsed().as_micros() as u64,
        };
        book(&f, written, tx, fin, cfg)?;
    }
    Ok(())
}

/// A verified chunk as it went to storage.
struct Written {
    index: u32,
    hash: [u8; 32],
    len: u32,
    error: Option<io::Error>,
    busy_us: u64,
}

/// Books a chunk that matched its hash: a write error fails the file (a
/// full disk ends the transfer: the error returned); else the chunk is
/// journaled and verified in the ledger, and the file finished if that
/// completes it.
fn book(
    f: &Arc<FileState>,
    w: Written,
    tx: &Sender<Event>,
    fin: &Sender<Arc<FileState>>,
    cfg: &SinkConfig,
) -> Result<(), String> {
    if let Some(e) = w.error {
        let msg = io_err("write", &f.target, e);
        if msg.contains("No space left") {
            let missing = {
                let p = f.inner.lock().expect("poisoned");
                p.ledger.remaining() * f.entry.chunk_size.min(f.entry.size.max(1))
            };
            return Err(format!(
                "{DESTINATION_FULL}: {msg}; about {missing} more bytes were needed for this file. Free space and run the same command again: files in place are skipped"
            ));
        }
        f.inner.lock().expect("poisoned").ledger.fail();
        drop_partial(f);
        let _ = tx.send(Event::Done(
            FileDone {
                id: f.entry.id,
                error: Some(msg),
                ..FileDone::default()
            },
            0,
        ));
        return Ok(());
    }
    let _ = tx.send(Event::Written {
        bytes: u64::from(w.len),
        busy_us: w.busy_us,
    });
    let complete = {
        let mut p = f.inner.lock().expect("poisoned");
        if !p.ledger.wants(w.index) {
            return Ok(());
        }
        let record = journal_record(w.index, &w.hash);
        if let Err(e) = p.journal.as_mut().map_or(Ok(()), |j| j.write_all(&record)) {
            return Err(io_err("append to journal", &f.journal_path, e));
        }
        p.ledger.verified(w.index, w.hash);
        p.ledger.claim()
    };
    if complete {
        if finishes_at_once(f, cfg) {
            let done = finish(f, cfg, true);
            let _ = tx.send(Event::Done(done, f.entry.carried_bytes()));
        } else {
            let _ = fin.send(f.clone());
        }
    }
    Ok(())
}
