//! The sink of a transfer: creates directories and links, opens partial
//! files (resuming from their journal), receives chunks on the data
//! streams, verifies each against its BLAKE3 hash before it counts,
//! journals it, and renames a file into place once all its chunks are in.
//!
//! [`run_sink`] starts the receivers (`receive`: one a data stream), the
//! openers (`open`, resuming from `journal`) and the finishers (`finish`)
//! around the files in flight they share, and runs the control thread
//! (`control`), which also makes directories and links and deletes what
//! `sync --delete` removes (`tree`).

mod control;
mod finish;
mod journal;
mod open;
mod receive;
mod tail;
mod tree;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use longhaul_proto::transfer::sink::FileLedger;
use longhaul_proto::xfer::*;

use super::beneath::{Anchor, Dir};
use super::storage::{Storage, WriteAt};
use crate::net::conn::{FramedConn, Stream};
use crate::stages::{self, timed, Stage, StageTotals};
use crate::EngineError;
use finish::finish_batches;
use open::Openers;
use receive::receive;

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
    /// With `delete`: what these rules exclude is left alone (rsync
    /// without `--delete-excluded`).
    pub filter: Option<Arc<super::filter::Filter>>,
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
    /// Both ends agreed to `-z` (`TransferAccept::compress`): compressed
    /// chunk frames are taken on the data streams.
    pub compress: bool,
    /// Both ends agreed to `TransferAccept::defer_full`: a file with no
    /// room while others are in flight goes back to the source, to come
    /// again alone.
    pub defer_full: bool,
    /// Both ends agreed to tag checks (`TransferAccept::tag_checks`): the
    /// data streams' AEAD proves each chunk; no XXH3 check is computed, and
    /// a trailer whose check is not `NO_CHECK` marks a chunk the source
    /// could not read.
    pub tag_checks: bool,
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
    /// Whether `dir`, a directory entry's target, is the destination put
    /// onto ([`Landing::Onto`]) where a file (not a directory) is now.
    pub(crate) fn replaces_a_file(&self, dir: &Path) -> bool {
        self.landing == Landing::Onto
            && dir == self.dest
            && self
                .anchor
                .anchored(dir)
                .ok()
                .and_then(|p| std::fs::symlink_metadata(p).ok())
                .is_some_and(|m| m.is_file())
    }

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
    /// One writer at a time per file: the kernel serializes buffered writes
    /// to one inode anyway, and contended, its lock spins on the CPU the
    /// other streams need; a sleeping lock here costs nothing. Direct
    /// writes (a big file, `storage::DIRECT_MIN`) are kept one at a time
    /// too: in order, the device streams them (measured: 11 s for 4 GiB
    /// against 18-22 s with four at once, issue 45).
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
    /// No room at the destination for a file (its partial file removed).
    Full(u64, String),
    Done(FileDone, u64),
    /// An opener's answers for a group of files ([`Openers`]), each an
    /// `Opened` or a `Full`.
    Answers(Vec<Event>),
    /// A finisher's batch, told at once: one wake-up of the control thread
    /// for up to [`finish::FINISH_BATCH`] files, not one a file.
    Dones(Vec<(FileDone, u64)>),
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

/// Opens out at once: enough to keep the openers busy through the control
/// thread's turn on the network (about a millisecond).
const OPENS_AT_ONCE: usize = 64;

/// Files handed to an opener at once (a quarter of [`OPENS_AT_ONCE`]: the
/// four openers each get a group): a hand-off and an answer a group, not
/// a file.
const OPEN_GROUP: usize = 16;

use super::parts::side_path;
use super::DESTINATION_FULL;

/// Makes one new inode (a partial file, journal, directory or link) with
/// `make`; on an ext4 without a journal (`one_at_a_time`:
/// `Dir::on_ext4_without_journal`) one at a time in this process (issue
/// 45). Only an ext4 without a journal passes over inodes freed in the
/// last minutes (`recently_deleted` in its ialloc.c, called when
/// `s_journal` is NULL), and only those whose inode-table block is in
/// memory. Creates made one after another fill each table
/// block from scratch (its other inodes free: zeroed, not read), so a
/// destination emptied moments ago costs what a fresh one does. Creates
/// at once on neighbouring inodes make ext4 read the block from disk,
/// with up to 32 blocks of read-ahead, and every later create in that
/// group then checks each freed inode there: on a 20,000-file tree copied
/// again into its emptied destination, 2-3 CPU-s of the server's system
/// time instead of 1 (BENCHMARKS.md). Elsewhere (a journalled ext4, the
/// usual one; XFS; network file systems, where a create may wait on a
/// server) creates stay parallel.
fn one_create<T>(one_at_a_time: bool, make: impl FnOnce() -> T) -> T {
    static CREATES: Mutex<()> = Mutex::new(());
    if !one_at_a_time {
        return make();
    }
    let _one = CREATES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    make()
}

/// Whether a write or create failed for want of room (space, inodes, or
/// the quota's).
fn no_room(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// What says a file found no room: its size, and what is free in its
/// directory's file system now.
fn no_room_for(target: &Path, size: u64, dir: &Dir, e: &io::Error) -> String {
    use longhaul_proto::units::format_bytes;
    let free = rustix::fs::fstatvfs(dir.fd())
        .map(|st| format!("; {} free there", format_bytes(st.f_bavail * st.f_frsize)))
        .unwrap_or_default();
    let quota = match e.raw_os_error() {
        Some(libc::EDQUOT) => ", over the quota",
        _ => "",
    };
    format!(
        "{DESTINATION_FULL}: no room for {} ({}{free}{quota})",
        target.display(),
        format_bytes(size)
    )
}

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

/// Removes the partial file and journal a broken transfer left for
/// `target` (a path beneath `anchor`'s root), each only if it is a regular
/// file, through a descriptor of its directory opened beneath the root:
/// what a cancelled job leaves nothing of. How many it removed.
pub fn discard_partial(anchor: &super::beneath::Anchor, target: &Path) -> u64 {
    let Ok((dir, name)) = anchor.parent_of(target, false) else {
        return 0;
    };
    let name = name.to_string_lossy();
    let mut removed = 0;
    for suffix in ["lhpart", "lhjournal"] {
        let p = dir.join(format!(".{name}.{suffix}"));
        let plain = std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_file());
        if plain && std::fs::remove_file(&p).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The shallowest path on the way from `root` to `dest` (a resolved path
/// beneath it) that does not exist now, relative to `root`: what a push
/// there creates first. None if all of it exists, or it cannot be told
/// (then nothing is ever removed for it).
pub fn first_missing(root: &Path, dest: &Path) -> Option<String> {
    let rel = dest.strip_prefix(root).ok()?;
    let mut made = PathBuf::new();
    for c in rel.components() {
        made.push(c);
        match std::fs::symlink_metadata(root.join(&made)) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return made.to_str().map(String::from)
            }
            Err(_) => return None,
        }
    }
    None
}

/// What a cancelled job left beneath its destination `dest` (a resolved
/// path beneath `anchor`'s root): the partial files and journals of
/// `paths` (its entries as the transfer named them, its source's name
/// first) in their two possible places, into `dest` under their own names
/// or, unless `dest_dir`, onto it; then, if the job made `made` (a
/// directory relative to the root, from [`first_missing`] when the job
/// was submitted), the directories at and beneath it on the way to those
/// places and to `dest` that are left empty ([`remove_empty_dirs`]). How
/// many files, and how many directories, it removed.
pub fn discard_entries(
    anchor: &super::beneath::Anchor,
    dest: &Path,
    paths: &[String],
    dest_dir: bool,
    made: Option<&Path>,
) -> (u64, u64) {
    let mut removed = 0;
    let mut places = vec![dest.to_path_buf()];
    for p in paths {
        let Ok(comps) = longhaul_proto::xfer::components(p) else {
            continue;
        };
        let into = dest.join(comps.join("/"));
        let onto = dest.join(comps.iter().skip(1).copied().collect::<Vec<_>>().join("/"));
        removed += discard_partial(anchor, &into);
        if onto != into && !dest_dir {
            removed += discard_partial(anchor, &onto);
            places.extend(onto.parent().map(Path::to_path_buf));
        }
        places.extend(into.parent().map(Path::to_path_buf));
    }
    let dirs = made.map_or(0, |m| {
        remove_empty_dirs(anchor, &anchor.root().join(m), places)
    });
    (removed, dirs)
}

/// Removes the empty directories at and beneath `top` on the way up from
/// each of `places` (paths beneath `anchor`'s root), deepest first: what
/// a cancelled job made and left empty. rmdir's own rule keeps every
/// directory with anything in it; each is removed through a descriptor of
/// its parent opened beneath the root, so no symbolic link is followed,
/// and a link is never removed. How many it removed.
pub fn remove_empty_dirs(
    anchor: &super::beneath::Anchor,
    top: &Path,
    places: impl IntoIterator<Item = PathBuf>,
) -> u64 {
    let mut dirs = std::collections::BTreeSet::new();
    for p in places {
        dirs.extend(
            p.ancestors()
                .take_while(|a| a.starts_with(top))
                .map(Path::to_path_buf),
        );
    }
    let mut deepest_first: Vec<PathBuf> = dirs.into_iter().collect();
    deepest_first.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    let mut removed = 0;
    for d in deepest_first {
        let Ok((parent, name)) = anchor.parent_of(&d, false) else {
            continue;
        };
        if rustix::fs::unlinkat(
            parent.fd(),
            name.as_os_str(),
            rustix::fs::AtFlags::REMOVEDIR,
        )
        .is_ok()
        {
            removed += 1;
        }
    }
    removed
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
    let tail = tail::Tail::new(sockets.iter().filter_map(|s| s.try_clone().ok()).collect());
    let streams = sockets;
    drop(tx);
    let result = control::control(
        conn,
        (&files, tail),
        &rx,
        &fin_tx,
        openers.as_ref(),
        &cfg,
        &totals,
    );
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

/// What the parts' tests share: a sink laying files into a temp dir.
#[cfg(test)]
mod testing {
    use super::super::storage::Local;
    use super::*;

    /// A sink into `dest` with every option off.
    pub(super) fn config(dest: &Path) -> SinkConfig {
        SinkConfig {
            digest_out: None,
            on_landed: None,
            progress: Default::default(),
            dest: dest.to_path_buf(),
            dest_shown: "dest".into(),
            landing: Landing::Into,
            preserve: false,
            keep_special_modes: false,
            force: false,
            sync_files: false,
            verify: false,
            storage: Arc::new(Local),
            umask: 0o022,
            delete: false,
            filter: None,
            dry_run: false,
            anchor: Anchor::open(dest).expect("anchor"),
            max_files: 64,
            bundles: true,
            compress: true,
            defer_full: true,
            tag_checks: false,
        }
    }

    /// A file entry as a source announces it.
    pub(super) fn file(id: u64, path: &str, size: u64, chunk_size: u64) -> Entry {
        Entry {
            id,
            path: path.into(),
            kind: Kind::File,
            size,
            mode: 0o644,
            mtime_ns: 1_600_000_000_000_000_000,
            target: None,
            chunk_size,
            sparse: false,
            incomplete: false,
            digest: None,
            part: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Runs `threads` creates at once through [`one_create`] and returns
    /// the most that were inside at one time.
    fn most_at_once(one_at_a_time: bool, threads: usize) -> usize {
        let (inside, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let start = std::sync::Barrier::new(threads);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    start.wait();
                    for _ in 0..200 {
                        one_create(one_at_a_time, || {
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            for _ in 0..50 {
                                std::thread::yield_now();
                            }
                            inside.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                });
            }
        });
        most.into_inner()
    }

    #[test]
    fn creates_on_ext4_are_made_one_at_a_time() {
        assert_eq!(most_at_once(true, 4), 1);
        // Anywhere else (a journalled ext4 too), creates run side by side.
        assert!(most_at_once(false, 4) > 1);
    }

    #[test]
    fn only_empty_directories_at_or_beneath_the_top_are_removed_and_no_link() {
        let base = std::env::temp_dir().join(format!("lh-tidy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (root, top) = (base.join("root"), base.join("root/made"));
        for d in ["made/a/b", "made/full", "made/lead", "elsewhere/empty"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("made/full/f"), b"x").unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere/empty"), root.join("made/link")).unwrap();
        let anchor = Anchor::open(&root).unwrap();
        let places = [
            "made/a/b",
            "made/full",
            "made/link",
            "made/lead/gone",
            "elsewhere/empty",
        ]
        .map(|p| root.join(p));
        assert_eq!(remove_empty_dirs(&anchor, &top, places.clone()), 3);
        assert!(!top.join("a").exists() && !top.join("lead").exists());
        assert_eq!(std::fs::read(top.join("full/f")).unwrap(), b"x");
        assert!(std::fs::symlink_metadata(top.join("link"))
            .unwrap()
            .is_symlink());
        assert!(root.join("elsewhere/empty").is_dir(), "outside the top");
        // Emptied, the rest goes, the top too; the link's target stays.
        std::fs::remove_file(top.join("full/f")).unwrap();
        std::fs::remove_file(top.join("link")).unwrap();
        let anchor = Anchor::open(&root).unwrap();
        assert_eq!(remove_empty_dirs(&anchor, &top, places), 2);
        assert!(!top.exists() && root.join("elsewhere/empty").is_dir());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_tmpfs_directory_is_in_memory_and_not_ext4() {
        let shm = Path::new("/dev/shm");
        let d = Anchor::open(shm).unwrap().dir(shm, false).unwrap();
        assert!(d.in_memory() && !d.on_ext4_without_journal());
    }
}
