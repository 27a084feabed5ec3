//! The source of a transfer: walks the roots lazily, announces entries in
//! bounded batches, and sends the chunks the sink wants on the data
//! streams, each with its BLAKE3 hash.

use std::collections::{HashMap, VecDeque};
use std::fs::ReadDir;
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use longhaul_proto::digest::{self, ChunkHasher};
use longhaul_proto::msg::Message;
use longhaul_proto::plan::{auto_chunk_size, Chunk, Planner};
use longhaul_proto::transfer::source::{
    Source, SourceAction, SourceError, SourceLimits, SourceTally,
};
use longhaul_proto::xfer::*;

use super::beneath::Anchor;
use super::prefetch::Prefetcher;
use super::storage::{read_exact_at, ReadAt, Storage};
use super::{kind_of, mtime_ns, ENTRIES_BATCH};
use crate::net::conn::{FramedConn, Stream};
use crate::stages::{self, timed, Stage, StageTotals};
use crate::EngineError;

pub struct SourceConfig {
    /// Send `DirEnd` markers (sync --delete) and content digests (sync --checksum).
    pub dir_ends: bool,
    pub digests: bool,
    pub digest_out: Option<super::DigestOut>,
    /// Each file that landed, for the catalogue.
    pub on_landed: Option<super::OnLanded>,
    pub progress: Arc<super::Progress>,
    pub roots: Vec<PathBuf>,
    pub recursive: bool,
    pub chunk_size: Option<u64>,
    pub streams: u16,
    pub storage: Arc<dyn Storage>,
    /// On a server: every path read resolves beneath the export root
    /// (race-free; see [`super::beneath`]). None on a client, whose own
    /// paths are its user's to choose.
    pub anchor: Option<Arc<Anchor>>,
    /// Tune the number of streams carrying chunks online.
    pub online: bool,
    /// Send each interval to the sink (a server sending to its client).
    pub send_intervals: bool,
    /// The path's RTT, for the tuner's epoch.
    pub rtt: Duration,
    /// Each stream's pacing cap, bytes/s, when the user capped the rate
    /// (`cp --rate`): intervals that carry it are named `rate_cap`.
    pub pacing: Option<u64>,
    /// Files announced and not yet finished, at most, at the start...
    pub files_in_flight: u64,
    /// ...and the sink's cap, toward which the count grows while it holds
    /// the transfer back (equal when fixed).
    pub max_files_in_flight: u64,
    /// Both ends agreed to bundles (`TransferAccept::bundles`): small
    /// whole files go many to a bundle frame, seals batched.
    pub bundles: bool,
    /// A fleet rank's share: these entries instead of a walk of `roots`.
    pub share: Option<Share>,
}

/// A fleet rank's share of a transfer (`longhaul-fleet`).
#[derive(Clone)]
pub enum Share {
    /// Entries cut before the transfer starts (static shares).
    Fixed(Arc<Vec<ShareItem>>),
    /// Entries asked for as the transfer goes (a work queue's leases): one
    /// session carries unit after unit, without a new connection and a new
    /// slow start for each.
    Fed(ShareFeed),
}

/// Asked for more of a share each time the entries it gave have all been
/// announced, with what is still in flight.
pub type ShareFeed = Arc<dyn Fn(InFlight) -> Fed + Send + Sync>;

/// Where a transfer stands when its feed is asked for more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    /// Files announced and not yet resolved by the sink.
    pub files: usize,
    /// About the bytes announced and not yet read for sending (the
    /// streams' work ahead).
    pub unsent: u64,
    /// Bytes read for sending so far in this transfer.
    pub sent: u64,
}

/// A [`ShareFeed`]'s answer.
#[derive(Debug)]
pub enum Fed {
    /// These entries next.
    More(Vec<ShareItem>),
    /// Nothing yet: ask again when more of what is in flight has landed.
    /// (Never answered while nothing is in flight, or the transfer idles.)
    Later,
    /// The share is complete: the transfer ends once what is in flight
    /// lands.
    End,
}

/// One entry of a fleet rank's share (`longhaul-fleet`): a path a walk of
/// the roots found, announced under the name that walk gave it, whole or
/// as the chunks `[first, end)` of its file ([`Entry::part`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareItem {
    pub path: PathBuf,
    pub rel: String,
    /// The chunk size the share was cut with (files only).
    pub chunk_size: u64,
    pub part: Option<[u32; 2]>,
}

/// `path` as it is to be used: through the anchor, if there is one.
fn at(anchor: &Option<Arc<Anchor>>, path: &Path) -> Result<PathBuf, EngineError> {
    match anchor {
        Some(a) => a.anchored(path),
        None => Ok(path.to_path_buf()),
    }
}

/// What the source saw of a transfer: its machine's tally, the tuning it
/// settled on, and the sink's report.
#[derive(Debug, Default, Clone)]
pub struct SourceReport {
    pub tally: SourceTally,
    pub tuning: Option<longhaul_proto::tune::TuningReport>,
    pub sink: SinkReport,
    /// Where this end's CPU went.
    pub cpu: StageCpu,
}

/// Walks the roots depth first, one directory handle per level.
struct Walker {
    /// Set when something under the current directory could not be sent:
    /// its `DirEnd` then says so, and nothing there is deleted.
    level_failed: Vec<bool>,
    dir_ends: bool,
    roots: VecDeque<PathBuf>,
    /// Open listings: the handle, the entry path, the directory's path.
    stack: Vec<(ReadDir, String, PathBuf)>,
    anchor: Option<Arc<Anchor>>,
    next_id: u64,
    recursive: bool,
    chunk_size: Option<u64>,
    streams: u16,
    /// Told of each directory entered, to stat its entries ahead.
    ahead: Option<Arc<Prefetcher>>,
    /// A fleet rank's share, announced in order instead of the walk...
    share: VecDeque<ShareItem>,
    /// ...and where more of it comes from, until it says it has ended.
    feed: Option<ShareFeed>,
    /// Files announced as parts: a part that changed while it was read is
    /// not sent again (the other ranks' parts are of the old version).
    parts: std::collections::HashSet<PathBuf>,
}

/// An entry found by the walk: what is announced, where it is read from,
/// and the version of it that is announced.
struct Found {
    entry: Entry,
    path: PathBuf,
    stamp: super::Stamp,
}

/// The name a root is announced under: the last component the user
/// named, never what a symbolic link leads to (a lone link is copied as
/// itself, under its own name). `.`, `..` and `/` have no name of their
/// own; they are named by the directory they resolve to. (A fleet rank
/// maps a manifest entry's name back to its source by it.)
pub fn root_name(root: &Path) -> String {
    root.file_name()
        .map(|n| n.to_owned())
        .or_else(|| root.canonicalize().ok()?.file_name().map(|n| n.to_owned()))
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
}

impl Walker {
    fn entry(
        &mut self,
        path: PathBuf,
        rel: String,
        meta: Option<std::fs::Metadata>,
    ) -> Result<Option<Found>, Failure> {
        let found = self.stat(path, rel, meta)?;
        if found.entry.kind == Kind::Dir {
            let (path, rel) = (&found.path, &found.entry.path);
            let fail = |error: String| Failure {
                path: rel.clone(),
                error,
            };
            if !self.recursive {
                return Err(fail(format!(
                    "{} is a directory: use -r to copy trees",
                    path.display()
                )));
            }
            let listed = match &self.anchor {
                Some(a) => a.dir(path, false).map(|d| d.path()),
                None => Ok(path.clone()),
            }
            .map_err(|e| fail(e.to_string()))?;
            let rd = std::fs::read_dir(&listed)
                .map_err(|e| fail(format!("cannot list {}: {e}", path.display())))?;
            if let Some(p) = &self.ahead {
                p.list(path.clone());
            }
            self.stack.push((rd, rel.clone(), path.clone()));
            self.level_failed.push(false);
        }
        Ok(Some(found))
    }

    /// The next entry of a share, as the walk that cut it found it.
    fn shared(&mut self, item: ShareItem) -> Result<Found, Failure> {
        let mut found = self.stat(item.path, item.rel, None)?;
        let e = &mut found.entry;
        if e.kind == Kind::File {
            e.chunk_size = item.chunk_size;
            if let Some([first, end]) = item.part {
                let count = longhaul_proto::plan::chunk_count(e.size, e.chunk_size);
                if first >= end || u64::from(end) > count {
                    return Err(Failure {
                        path: e.path.clone(),
                        error: format!(
                            "changed since the fleet's manifest was made (now {} bytes): run the transfer again with a fresh manifest",
                            e.size
                        ),
                    });
                }
                e.part = Some([first, end]);
                self.parts.insert(found.path.clone());
            }
        }
        Ok(found)
    }

    /// A file announced again under a new id, after it changed while it
    /// was read: it must still be a regular file.
    fn again(&mut self, path: PathBuf, rel: String) -> Result<Found, Failure> {
        if self.parts.contains(&path) {
            return Err(Failure {
                path: rel,
                error: "changed while it was read; other ranks hold other parts of it, so it is not sent again: run the transfer again once it stays still".into(),
            });
        }
        let found = self.stat(path, rel, None)?;
        if found.entry.kind != Kind::File {
            return Err(Failure {
                path: found.entry.path,
                error: "changed while it was read, and is no longer a regular file".into(),
            });
        }
        Ok(found)
    }

    /// Describes one path, without following a final symlink; `meta` is
    /// its `lstat` if the caller has it already.
    fn stat(
        &mut self,
        path: PathBuf,
        rel: String,
        meta: Option<std::fs::Metadata>,
    ) -> Result<Found, Failure> {
        let fail = |error: String| Failure {
            path: rel.clone(),
            error,
        };
        let at_path = at(&self.anchor, &path).map_err(|e| fail(e.to_string()))?;
        let m = match meta {
            Some(m) => m,
            None => std::fs::symlink_metadata(&at_path)
                .map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?,
        };
        let Some(kind) = kind_of(&m) else {
            return Err(fail(
                "not a regular file, directory or symlink; skipped".into(),
            ));
        };
        let target = match kind {
            Kind::Symlink => Some(
                std::fs::read_link(&at_path)
                    .map_err(|e| fail(format!("cannot read link: {e}")))?
                    .to_str()
                    .ok_or_else(|| fail("link target is not UTF-8".into()))?
                    .to_string(),
            ),
            _ => None,
        };
        let size = if kind == Kind::File { m.len() } else { 0 };
        self.next_id += 1;
        Ok(Found {
            stamp: super::Stamp::of(&m),
            entry: Entry {
                id: self.next_id,
                path: rel,
                kind,
                size,
                mode: m.mode() & 0o7777,
                mtime_ns: mtime_ns(&m),
                target,
                // A power of two, so that chunk values combine into the
                // file's BLAKE3 (--chunk is rounded down to one).
                chunk_size: self.chunk_size.map_or_else(
                    || auto_chunk_size(size, self.streams),
                    longhaul_proto::digest::usable_chunk_size,
                ),
                sparse: kind == Kind::File && m.blocks() * 512 < size,
                incomplete: false,
                digest: None,
                part: None,
            },
            path,
        })
    }

    /// Asks the share's feed for more once what it gave is announced:
    /// false when it says later (the walk waits; it has not ended).
    fn refill(&mut self, m: &Source<Handle>) -> bool {
        if !self.share.is_empty() {
            return true;
        }
        let Some(feed) = &self.feed else {
            return true;
        };
        let in_flight = InFlight {
            files: m.in_flight(),
            unsent: m.unsent_bytes(),
            sent: m.tally().read_bytes,
        };
        match feed(in_flight) {
            Fed::More(items) => {
                self.share.extend(items);
                true
            }
            // Nothing in flight to wait for: asking later would idle.
            Fed::Later if in_flight.files > 0 => false,
            Fed::Later | Fed::End => {
                self.feed = None;
                true
            }
        }
    }

    fn mark_failed(&mut self) {
        if let Some(l) = self.level_failed.last_mut() {
            *l = true;
        }
    }

    /// The next entry, a failure to report, or `None` at the end.
    fn next(&mut self) -> Option<Result<Found, Failure>> {
        if let Some(item) = self.share.pop_front() {
            return Some(self.shared(item));
        }
        loop {
            if let Some((rd, prefix, dir)) = self.stack.last_mut() {
                let prefix = prefix.clone();
                let dir = dir.clone();
                match rd.next() {
                    None => {
                        self.stack.pop();
                        // Only this directory's own listing counts: a child
                        // that failed was either announced (and so kept) or
                        // marked this level already.
                        let incomplete = self.level_failed.pop().unwrap_or(false);
                        if self.dir_ends {
                            self.next_id += 1;
                            return Some(Ok(Found {
                                entry: Entry {
                                    id: self.next_id,
                                    path: prefix,
                                    kind: Kind::DirEnd,
                                    size: 0,
                                    mode: 0,
                                    mtime_ns: 0,
                                    target: None,
                                    chunk_size: 0,
                                    sparse: false,
                                    incomplete,
                                    digest: None,
                                    part: None,
                                },
                                path: PathBuf::new(),
                                stamp: super::Stamp::default(),
                            }));
                        }
                    }
                    Some(Err(e)) => {
                        self.mark_failed();
                        return Some(Err(Failure {
                            path: prefix,
                            error: format!("cannot list: {e}"),
                        }));
                    }
                    Some(Ok(de)) => {
                        let Some(name) = de.file_name().to_str().map(str::to_string) else {
                            self.mark_failed();
                            return Some(Err(Failure {
                                path: format!("{prefix}/{}", de.file_name().to_string_lossy()),
                                error: "name is not UTF-8; skipped".into(),
                            }));
                        };
                        // A sink's partial files, journals and marks are
                        // never data: a later pull or push must not carry one.
                        if is_reserved_name(&name) {
                            continue;
                        }
                        // fstatat relative to the listed directory, never
                        // following a final link: no walk of the path.
                        let meta = de.metadata().ok();
                        match self.entry(dir.join(de.file_name()), format!("{prefix}/{name}"), meta)
                        {
                            Ok(Some(e)) => return Some(Ok(e)),
                            Ok(None) => {}
                            Err(f) => {
                                self.mark_failed();
                                return Some(Err(f));
                            }
                        }
                    }
                }
                continue;
            }
            let root = self.roots.pop_front()?;
            let name = root_name(&root);
            match self.entry(root, name, None) {
                Ok(Some(e)) => return Some(Ok(e)),
                Ok(None) => {}
                Err(f) => return Some(Err(f)),
            }
        }
    }
}

/// Every entry a walk of `roots` finds, named and sized as a transfer of
/// them would announce it (chunk sizes for `streams` streams unless
/// `chunk_size` is set), in walk order; and what could not be read. The
/// manifest a fleet's ranks share is made of it.
pub fn walk(
    roots: &[PathBuf],
    recursive: bool,
    chunk_size: Option<u64>,
    streams: u16,
) -> (Vec<(Entry, PathBuf)>, Vec<Failure>) {
    let mut walker = Walker {
        level_failed: Vec::new(),
        dir_ends: false,
        roots: roots.iter().cloned().collect(),
        stack: Vec::new(),
        next_id: 0,
        recursive,
        chunk_size,
        streams,
        anchor: None,
        ahead: None,
        share: VecDeque::new(),
        feed: None,
        parts: Default::default(),
    };
    let (mut found, mut failed) = (Vec::new(), Vec::new());
    while let Some(next) = walker.next() {
        match next {
            Ok(f) => found.push((f.entry, f.path)),
            Err(f) => failed.push(f),
        }
    }
    (found, failed)
}

struct SrcFile {
    path: PathBuf,
    failed: AtomicBool,
    /// The version announced: every descriptor read must still show it.
    stamp: super::Stamp,
    /// Chunks still to be read once (resends not counted).
    reads_left: AtomicU64,
    /// Resends of this file read so far.
    resends_read: AtomicU32,
    /// The file is one chunk: that chunk's value is the file's BLAKE3.
    whole: bool,
}

impl SrcFile {
    /// After a read: the seal to send if every read of the file so far is
    /// done (`resend`: this read served a resend), or None while reads
    /// are left. The descriptor is then checked against the stamp.
    fn after_read(&self, resend: bool) -> Option<u32> {
        if resend {
            let n = self.resends_read.fetch_add(1, Ordering::SeqCst) + 1;
            (self.reads_left.load(Ordering::SeqCst) == 0).then_some(n)
        } else if self.reads_left.fetch_sub(1, Ordering::SeqCst) == 1 {
            Some(self.resends_read.load(Ordering::SeqCst))
        } else {
            None
        }
    }

    /// Once every read is done: sealed for the sink if the open file is
    /// still the one announced, or changed (and marked failed) otherwise.
    fn seal_or_changed(&self, id: u64, resends: u32, reader: &dyn ReadAt) -> Event {
        match self.changed(reader) {
            None => Event::Sealed { id, resends },
            Some(why) => {
                self.failed.store(true, Ordering::Relaxed);
                Event::Changed(id, why)
            }
        }
    }

    /// What changed between the announcement and the open file now.
    fn changed(&self, reader: &dyn ReadAt) -> Option<String> {
        self.differs(reader.metadata())
    }

    /// What changed between the announcement and `now`.
    fn differs(&self, now: io::Result<std::fs::Metadata>) -> Option<String> {
        match now {
            Ok(m) => self.stamp.changed(&super::Stamp::of(&m)),
            Err(e) => Some(format!("cannot check it after reading: {e}")),
        }
    }
}

/// Times a file is read in all when it changes while it is read: then it
/// is reported as changed, never sent torn.
pub use longhaul_proto::transfer::source::MAX_READS_OF_A_CHANGING_FILE;

#[derive(Default)]
struct Queue {
    planner: Planner,
    /// Resends, served first: (chunk, true).
    resends: VecDeque<Chunk>,
    files: HashMap<u64, Arc<SrcFile>>,
    closed: bool,
    /// Streams 0..active carry chunks; the rest are parked by the tuner.
    active: u16,
}

type Shared = Arc<(Mutex<Queue>, Condvar)>;

enum Event {
    Sent {
        read_bytes: u64,
        read_us: u64,
    },
    FileFailed(u64, String),
    /// Every read of a file so far is done and it did not change.
    Sealed {
        id: u64,
        resends: u32,
    },
    /// The file changed while it was read (what, in words).
    Changed(u64, String),
    Fatal(String),
}

/// Runs the source side until the sink reports the transfer done.
pub fn run_source(
    conn: &mut FramedConn,
    streams: Vec<Box<dyn Stream>>,
    cfg: SourceConfig,
) -> Result<SourceReport, EngineError> {
    let shared: Shared = Arc::new((
        Mutex::new(Queue {
            active: streams.len() as u16,
            ..Queue::default()
        }),
        Condvar::new(),
    ));
    let (tx, rx) = mpsc::channel();
    let totals = StageTotals::new();
    let mut workers = Vec::new();
    // The sockets under the streams, to end them from here on a failure.
    let mut sockets: Vec<TcpStream> = Vec::new();
    for (index, s) in streams.into_iter().enumerate() {
        sockets.push(crate::net::conn::socket_of(&*s)?);
        let (shared, tx, storage) = (shared.clone(), tx.clone(), cfg.storage.clone());
        let anchor = cfg.anchor.clone();
        let bundles = cfg.bundles;
        let totals = totals.clone();
        workers.push(
            std::thread::Builder::new()
                .name("lh-src".into())
                .spawn(move || {
                    let _counted = stages::count_into(&totals);
                    let out = Out {
                        storage: &*storage,
                        anchor: &anchor,
                        tx: &tx,
                    };
                    send(index as u16, s, &shared, &out, bundles)
                })
                .map_err(|e| EngineError::io("failed to start a sender".into(), e))?,
        );
    }
    let sampler = super::tune::Sampler::new(
        sockets.iter().filter_map(|s| s.try_clone().ok()).collect(),
        cfg.online,
        cfg.rtt,
        cfg.pacing,
    );
    let streams = sockets;
    drop(tx);
    // Stopped (its threads joined) when `control` returns.
    let prefetch = Prefetcher::start(&*cfg.storage, &cfg.roots, cfg.anchor.clone()).map(Arc::new);
    let result = control(conn, &shared, &rx, &cfg, sampler, prefetch, &totals);
    {
        let (q, cv) = &*shared;
        q.lock().expect("poisoned").closed = true;
        cv.notify_all();
    }
    if result.is_err() {
        for s in &streams {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
    for w in workers {
        let _ = w.join();
    }
    for s in &streams {
        let _ = s.shutdown(Shutdown::Write);
    }
    result
}

/// What finds an announced file again: where it is, and the version of
/// it that was announced.
type Handle = (PathBuf, super::Stamp);

/// Drives the source's state machine ([`Source`]): walks and announces
/// what it has room for, feeds it the sink's messages and what the
/// senders report, queues the reads it asks for, and tunes the streams.
fn control(
    conn: &mut FramedConn,
    shared: &Shared,
    rx: &Receiver<Event>,
    cfg: &SourceConfig,
    mut sampler: super::tune::Sampler,
    ahead: Option<Arc<Prefetcher>>,
    totals: &StageTotals,
) -> Result<SourceReport, EngineError> {
    let prefetch = ahead.as_deref();
    let mut walker = Walker {
        level_failed: Vec::new(),
        dir_ends: cfg.dir_ends,
        roots: match &cfg.share {
            Some(_) => VecDeque::new(),
            None => cfg.roots.iter().cloned().collect(),
        },
        feed: match &cfg.share {
            Some(Share::Fed(feed)) => Some(feed.clone()),
            _ => None,
        },
        stack: Vec::new(),
        next_id: 0,
        recursive: cfg.recursive,
        chunk_size: cfg.chunk_size,
        streams: cfg.streams,
        anchor: cfg.anchor.clone(),
        ahead: ahead.clone(),
        share: match &cfg.share {
            Some(Share::Fixed(items)) => items.iter().cloned().collect(),
            _ => VecDeque::new(),
        },
        parts: Default::default(),
    };
    let mut m: Source<Handle> = Source::new(
        Instant::now(),
        SourceLimits {
            batch: ENTRIES_BATCH,
            files_in_flight: cfg.files_in_flight,
            max_files_in_flight: cfg.max_files_in_flight,
            idle: super::TRANSFER_IDLE,
        },
    );
    if cfg.bundles {
        m.batch_messages();
    }
    let (q, cv) = &**shared;
    let max_files = cfg.max_files_in_flight.max(1);
    // Whether, this interval, the files in flight were all announced while
    // the streams had nothing left to send.
    let mut held_by_files = false;
    loop {
        cfg.progress.check_interrupt()?;
        if m.wants_entries() {
            announce(&mut m, &mut walker, cfg);
        }
        while let Ok(ev) = rx.try_recv() {
            let now = Instant::now();
            match ev {
                Event::Sent {
                    read_bytes,
                    read_us,
                } => {
                    cfg.progress.bytes.fetch_add(read_bytes, Ordering::Relaxed);
                    m.sent(now, read_bytes, read_us);
                }
                Event::FileFailed(id, error) => m.file_failed(now, id, error),
                Event::Sealed { id, resends } => m.sealed(now, id, resends),
                Event::Changed(id, why) => m.changed(now, id, &why),
                Event::Fatal(e) => return Err(EngineError::Failed(e)),
            }
        }
        act(&mut m, shared, cfg, prefetch)?;
        while let Some(msg) = m.poll_transmit() {
            conn.queue(&msg)?;
        }
        conn.flush_queued()?;
        let now = Instant::now();
        if sampler.due(now) {
            let (active, starved) = {
                let queue = q.lock().expect("poisoned");
                let starved = queue.planner.pending_files() == 0 && queue.resends.is_empty();
                (queue.active, starved)
            };
            let (interval, next) =
                sampler.sample(now, m.tally().read_us, active, starved, held_by_files);
            // The count of files in flight grows while it is what held the
            // transfer (fixed when its cap is its start).
            let before = m.files_limit();
            let after = m.interval(held_by_files);
            if after != before {
                tracing::debug!("tuner: {before} -> {after} files in flight");
            }
            held_by_files = false;
            if let Some(n) = next.filter(|&n| n != active) {
                tracing::debug!("tuner: {active} -> {n} streams");
                q.lock().expect("poisoned").active = n;
                cv.notify_all();
            }
            if cfg.send_intervals {
                // rate_cap is not on the wire (a client older than it
                // would refuse the message): its flag says it.
                let mut sent = interval.clone();
                if sent.limit == longhaul_proto::tune::TransferLimit::RateCap {
                    sent.limit = longhaul_proto::tune::classify(&sent);
                }
                conn.send(&Message::SourceInterval(sent))?;
            }
            cfg.progress.push_interval(interval);
        }
        m.handle_timeout(now).map_err(engine_error)?;
        let limit = usize::try_from(m.files_limit()).unwrap_or(usize::MAX);
        let busy_walking = m.wants_entries();
        if !m.walk_done() && !held_by_files && m.in_flight() >= limit {
            let queue = q.lock().expect("poisoned");
            held_by_files = queue.planner.pending_files() == 0 && queue.resends.is_empty();
        }
        // Seals come from the senders between messages: while files are
        // in flight they leave within a couple of milliseconds.
        let msg = if busy_walking {
            conn.recv(Duration::from_millis(1))?
        } else if m.in_flight() > 0 {
            conn.recv(Duration::from_millis(2))?
        } else {
            conn.recv(Duration::from_millis(20))?
        };
        let Some(msg) = msg else { continue };
        m.handle(Instant::now(), msg).map_err(engine_error)?;
        act(&mut m, shared, cfg, prefetch)?;
        let Some((tally, sink)) = m.finished() else {
            continue;
        };
        let tuning = longhaul_proto::tune::TuningReport {
            online: sampler.climb().is_some(),
            direction: None,
            initial_streams: sampler.streams(),
            final_streams: q.lock().expect("poisoned").active,
            chunk_size: m.largest_chunk(),
            files_in_flight: m.files_limit(),
            initial_files_in_flight: cfg.files_in_flight.clamp(1, max_files),
            send_buffer: sampler.send_buffer(),
            send_buffer_raises: sampler.send_buffer_raises,
            steps: sampler.climb().map(|c| c.steps.clone()).unwrap_or_default(),
        };
        let cpu = totals.report();
        let _ = conn.send(&Message::SourceDone(SourceDone {
            read_bytes: tally.read_bytes,
            read_us: tally.read_us,
            resent_changed: tally.resent_changed,
            tuning: Some(tuning.clone()),
            cpu: Some(cpu),
        }));
        return Ok(SourceReport {
            tally,
            tuning: Some(tuning),
            sink,
            cpu,
        });
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
        let e = &mut found.entry;
        if cfg.digests && e.kind == Kind::File {
            let digest = at(&cfg.anchor, &found.path).and_then(|p| {
                super::content_digest(&*cfg.storage, &p, e.size)
                    .map_err(|e| EngineError::Usage(e.to_string()))
            });
            match digest {
                Ok(d) => e.digest = Some(d),
                Err(err) => {
                    m.walk_failed(Failure {
                        path: e.path.clone(),
                        error: format!("cannot read {}: {err}", found.path.display()),
                    });
                    continue;
                }
            }
        }
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
                    queue.files.insert(
                        id,
                        Arc::new(SrcFile {
                            path: path.clone(),
                            failed: AtomicBool::new(false),
                            stamp,
                            reads_left: AtomicU64::new(reads),
                            resends_read: AtomicU32::new(0),
                            whole: size <= chunk_size,
                        }),
                    );
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
                    if queue.files.contains_key(&c.file) {
                        queue.resends.push_back(c);
                        added = true;
                    }
                }
                SourceAction::Forget(id) => {
                    let queue = queue.get_or_insert_with(|| q.lock().expect("poisoned"));
                    if let Some(f) = queue.files.remove(&id) {
                        f.failed.store(true, Ordering::Relaxed);
                    }
                    if let Some(p) = prefetch {
                        p.forget(id);
                    }
                }
                SourceAction::Landed {
                    path,
                    size,
                    mtime_ns,
                    digest,
                } => {
                    cfg.progress.files.fetch_add(1, Ordering::Relaxed);
                    if let Some(f) = &cfg.on_landed {
                        f(&path, size, mtime_ns, digest.as_deref());
                    }
                    if let Some(digest) = digest {
                        super::write_digest(&cfg.digest_out, &path, &digest);
                    }
                }
                SourceAction::WalkDone => cfg.progress.walk_done.store(true, Ordering::Relaxed),
                SourceAction::Retrying { path, why } => {
                    tracing::warn!("{path} changed while it was read ({why}); sending it again");
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
        for (id, path, stamp) in unchanged {
            let now = at(&cfg.anchor, &path)
                .ok()
                .and_then(|p| std::fs::symlink_metadata(p).ok());
            match now.map(|meta| stamp.changed(&super::Stamp::of(&meta))) {
                Some(None) => m.sealed(Instant::now(), id, 0),
                Some(Some(why)) => m.changed(Instant::now(), id, &why),
                None => m.changed(Instant::now(), id, "it is gone"),
            }
        }
    }
}

/// One data stream: takes chunks from the queue and streams each from the
/// file in cache-sized pieces, hashing as it goes; holes go as zero chunks.
fn send(index: u16, s: Box<dyn Stream>, shared: &Shared, out: &Out, bundles: bool) {
    let Out {
        storage,
        anchor,
        tx,
    } = *out;
    let (q, cv) = &**shared;
    // Buffered: small files' chunks (header, bytes, trailer) leave many to
    // a write; big pieces bypass the buffer. Flushed whenever the queue
    // runs dry, so nothing waits in it.
    let mut w = io::BufWriter::with_capacity(256 << 10, s);
    let mut cache: Option<(u64, Box<dyn ReadAt>)> = None;
    let mut buf = super::storage::AlignedBuf::new(super::PIECE);
    // Bundles: the frame being built, and the chunk that ended it (not a
    // whole small file), sent next.
    let mut bundle: Vec<(Chunk, Arc<SrcFile>)> = Vec::new();
    let mut frame = Vec::new();
    let mut pending: Option<(Chunk, bool, Arc<SrcFile>)> = None;
    loop {
        let next = 'pick: loop {
            if let Some(p) = pending.take() {
                if p.2.failed.load(Ordering::Relaxed) {
                    continue;
                }
                break 'pick Some(p);
            }
            let mut queue = q.lock().expect("poisoned");
            loop {
                // A parked stream takes nothing until the tuner wakes it.
                let next = if index < queue.active {
                    match queue.resends.pop_front() {
                        Some(c) => Some((c, true)),
                        None => queue.planner.next_chunk().map(|c| (c, false)),
                    }
                } else {
                    None
                };
                match next {
                    Some((c, resend)) => match queue.files.get(&c.file) {
                        Some(f) if !f.failed.load(Ordering::Relaxed) => {
                            if !(bundles && bundled(&c, resend, f)) {
                                break 'pick Some((c, resend, f.clone()));
                            }
                            bundle.push((c, f.clone()));
                            pending = gather(&mut queue, &mut bundle);
                            break 'pick None;
                        }
                        _ => continue,
                    },
                    None if !w.buffer().is_empty() => break,
                    None if queue.closed => break 'pick None,
                    None => queue = cv.wait(queue).expect("poisoned"),
                }
            }
            drop(queue);
            if let Err(e) = timed(Stage::Send, || w.flush()) {
                let _ = tx.send(Event::Fatal(format!("data stream failed: {e}")));
                return;
            }
        };
        if !bundle.is_empty() {
            if let Err(e) = send_bundle(&mut w, &mut bundle, &mut frame, out) {
                let _ = tx.send(Event::Fatal(format!("data stream failed: {e}")));
                return;
            }
            continue;
        }
        let Some((c, resend, f)) = next else {
            // All sent: end the stream cleanly (TLS close_notify, FIN).
            if let Ok(mut s) = w.into_inner() {
                let _ = s.close_write();
            }
            return;
        };
        if cache.as_ref().is_none_or(|(id, _)| *id != c.file) {
            let opened = at(anchor, &f.path)
                .map_err(|e| io::Error::other(e.to_string()))
                .and_then(|p| storage.open_read(&p));
            match opened {
                Ok(r) => {
                    // The file announced, not one swapped in since.
                    if let Some(why) = f.differs(r.metadata_at_open()) {
                        f.failed.store(true, Ordering::Relaxed);
                        let _ = tx.send(Event::Changed(c.file, why));
                        continue;
                    }
                    cache = Some((c.file, r));
                }
                Err(e) => {
                    f.failed.store(true, Ordering::Relaxed);
                    let _ = tx.send(Event::FileFailed(
                        c.file,
                        format!("cannot open {}: {e}", f.path.display()),
                    ));
                    continue;
                }
            }
        }
        let reader = &cache.as_ref().expect("set above").1;
        // A file with all its blocks has no hole to look for.
        let zero = c.len > 0 && f.stamp.sparse && reader.is_hole(c.offset, u64::from(c.len));
        let header = ChunkHeader {
            zero,
            file: c.file,
            index: c.index,
            offset: c.offset,
            len: c.len,
        };
        let mut read_us = 0;
        let sent = (|| {
            timed(Stage::Send, || w.write_all(&header.encode()))?;
            if zero {
                let t = timed(Stage::Hash, || {
                    super::zero_trailer(c.offset, c.len, f.whole)
                });
                return timed(Stage::Send, || w.write_all(&t.encode())).map(|()| true);
            }
            let mut hasher = ChunkHasher::new(c.offset, f.whole);
            let mut off = 0u64;
            let mut read_error = None;
            while off < u64::from(c.len) {
                let n = (u64::from(c.len) - off).min(buf.len() as u64) as usize;
                let piece = &mut buf[..n];
                if read_error.is_none() {
                    let r = Instant::now();
                    if let Err(e) = timed(Stage::Read, || {
                        read_exact_at(&**reader, piece, c.offset + off)
                    }) {
                        read_error = Some(e);
                    }
                    read_us += r.elapsed().as_micros() as u64;
                }
                if read_error.is_some() {
                    // The header is out: fill the chunk, and let a check
                    // that cannot match make the sink drop it.
                    piece.fill(0);
                }
                timed(Stage::Hash, || hasher.update(piece));
                timed(Stage::Send, || w.write_all(piece))?;
                off += n as u64;
            }
            match read_error {
                None => {
                    let t = timed(Stage::Hash, || trailer_of(&hasher));
                    timed(Stage::Send, || w.write_all(&t.encode())).map(|()| true)
                }
                Some(e) => {
                    let mut bogus = trailer_of(&hasher);
                    bogus.check[0] ^= 0xff;
                    w.write_all(&bogus.encode())?;
                    f.failed.store(true, Ordering::Relaxed);
                    // A file cut short while it was read changed; else
                    // the storage failed.
                    let _ = tx.send(match f.changed(&**reader) {
                        Some(why) => Event::Changed(c.file, why),
                        None => Event::FileFailed(
                            c.file,
                            format!(
                                "cannot read {} at offset {}: {e}",
                                f.path.display(),
                                c.offset
                            ),
                        ),
                    });
                    Ok(false)
                }
            }
        })();
        let read = match sent {
            Ok(read) => read,
            Err(e) => {
                let _ = tx.send(Event::Fatal(format!("data stream failed: {e}")));
                return;
            }
        };
        let _ = tx.send(Event::Sent {
            read_bytes: u64::from(c.len),
            read_us,
        });
        // Once a file's last read is done, its descriptor shows whether it
        // changed while it was read: sealed for the sink, or read again.
        if let Some(resends) = read.then(|| f.after_read(resend)).flatten() {
            let _ = tx.send(f.seal_or_changed(c.file, resends, &**reader));
        }
    }
}

/// What a sender reads from and reports to.
#[derive(Clone, Copy)]
struct Out<'a> {
    storage: &'a dyn Storage,
    anchor: &'a Option<Arc<Anchor>>,
    tx: &'a Sender<Event>,
}

/// Whether a chunk goes in a bundle: a first read (a resend goes alone)
/// of the whole of a small file without holes.
fn bundled(c: &Chunk, resend: bool, f: &SrcFile) -> bool {
    !resend
        && c.index == 0
        && u64::from(c.len) == f.stamp.size
        && c.len <= MAX_BUNDLE_FILE
        && !f.stamp.sparse
}

/// Fills `bundle` (which holds its first file) from the queue with more
/// whole small files that are ready, up to the caps; returns the chunk
/// that ended it, if it was not one of them.
fn gather(
    queue: &mut Queue,
    bundle: &mut Vec<(Chunk, Arc<SrcFile>)>,
) -> Option<(Chunk, bool, Arc<SrcFile>)> {
    let mut payload: u64 = bundle.iter().map(|(c, _)| u64::from(c.len)).sum();
    while bundle.len() < MAX_BUNDLE_FILES as usize && queue.resends.is_empty() {
        let c = queue.planner.next_chunk()?;
        let Some(f) = queue
            .files
            .get(&c.file)
            .filter(|f| !f.failed.load(Ordering::Relaxed))
        else {
            continue;
        };
        if !bundled(&c, false, f) || payload + u64::from(c.len) > u64::from(MAX_BUNDLE_PAYLOAD) {
            return Some((c, false, f.clone()));
        }
        payload += u64::from(c.len);
        bundle.push((c, f.clone()));
    }
    None
}

/// The trailer of a chunk hashed to its end.
fn trailer_of(h: &ChunkHasher) -> Trailer {
    let (value, check) = h.finalize();
    Trailer { check, value }
}

/// Reads each file of `bundle` with one pread into its record of one
/// bundle frame, hashes it, writes the frame in one go, and then reports
/// the reads and the seals (each file checked unchanged as for a chunk
/// frame). A file that cannot be opened or read, or that changed, is
/// left out of the frame and reported. Errors are the stream's.
fn send_bundle(
    w: &mut impl Write,
    bundle: &mut Vec<(Chunk, Arc<SrcFile>)>,
    frame: &mut Vec<u8>,
    out: &Out,
) -> io::Result<()> {
    let mut events = Vec::with_capacity(bundle.len() + 1);
    frame.clear();
    frame.resize(BUNDLE_HEADER_LEN, 0);
    let (mut count, mut read_bytes, mut read_us) = (0u32, 0u64, 0u64);
    for (c, f) in bundle.drain(..) {
        let opened = at(out.anchor, &f.path)
            .map_err(|e| io::Error::other(e.to_string()))
            .and_then(|p| out.storage.open_read(&p));
        let reader = match opened {
            Ok(r) => r,
            Err(e) => {
                f.failed.store(true, Ordering::Relaxed);
                events.push(Event::FileFailed(
                    c.file,
                    format!("cannot open {}: {e}", f.path.display()),
                ));
                continue;
            }
        };
        // The file announced, not one swapped in since.
        if let Some(why) = f.differs(reader.metadata_at_open()) {
            f.failed.store(true, Ordering::Relaxed);
            events.push(Event::Changed(c.file, why));
            continue;
        }
        let start = frame.len();
        frame.extend_from_slice(&bundle_record_head(c.file, c.len));
        let data = frame.len();
        frame.resize(data + c.len as usize, 0);
        let t = Instant::now();
        let read = timed(Stage::Read, || {
            read_exact_at(&*reader, &mut frame[data..], 0)
        });
        read_us += t.elapsed().as_micros() as u64;
        if let Err(e) = read {
            frame.truncate(start);
            f.failed.store(true, Ordering::Relaxed);
            events.push(match f.changed(&*reader) {
                Some(why) => Event::Changed(c.file, why),
                None => Event::FileFailed(
                    c.file,
                    format!("cannot read {} at offset 0: {e}", f.path.display()),
                ),
            });
            continue;
        }
        let t = timed(Stage::Hash, || Trailer {
            check: digest::check(&frame[data..]),
            value: digest::chunk_value(&frame[data..], 0, true),
        });
        frame.extend_from_slice(&t.encode());
        count += 1;
        read_bytes += u64::from(c.len);
        if let Some(resends) = f.after_read(false) {
            events.push(f.seal_or_changed(c.file, resends, &*reader));
        }
    }
    if count > 0 {
        let header = BundleHeader {
            count,
            body_len: (frame.len() - BUNDLE_HEADER_LEN) as u32,
        };
        frame[..BUNDLE_HEADER_LEN].copy_from_slice(&header.encode());
        timed(Stage::Send, || w.write_all(frame))?;
        tracing::trace!("sent a bundle of {count} files, {read_bytes} bytes");
        events.push(Event::Sent {
            read_bytes,
            read_us,
        });
    }
    for e in events {
        let _ = out.tx.send(e);
    }
    Ok(())
}
