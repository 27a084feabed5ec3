//! File transfer: `cp`, `ls` (and later `sync`) over the same port and
//! protocol as `perf`. One engine for every file size: files are announced
//! in batches, cut into chunks by the planner, sent on parallel streams,
//! verified chunk by chunk at the sink (XXH3-128 checks, BLAKE3 values: proto::digest), journaled for resume, and
//! renamed into place only once complete.

pub mod beneath;
pub mod client;
pub mod copy;
mod digests;
mod dirty;
pub mod filter;
pub mod jobcaps;
mod parts;
pub mod prefetch;
pub mod sink;
pub mod source;
pub mod storage;
pub mod tune;

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use longhaul_proto::xfer::{self, Kind};

use crate::EngineError;

/// Files announced to this host as a sink and not yet finished, at most
/// (it advertises the number; the source starts below it and grows toward
/// it online, see [`longhaul_proto::tune::grow_files_in_flight`]). Each
/// holds one descriptor (its partial file; two with a journal, for files
/// of several chunks; directories are shared) and a server serves other
/// transfers too: a quarter of the open-file limit, within 2048..=32768. This bounds the memory and descriptors both ends
/// spend on a tree of any size.
pub fn files_in_flight_cap() -> u64 {
    use longhaul_proto::tune::{DEFAULT_FILES_IN_FLIGHT, MAX_FILES_IN_FLIGHT};
    // No current limit (None) is RLIM_INFINITY.
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    (nofile / 4).clamp(DEFAULT_FILES_IN_FLIGHT, MAX_FILES_IN_FLIGHT)
}

/// Whether this client asks for sealed frames on its TLS data streams
/// (PROTOCOL.md 13.2b): yes, unless `LONGHAUL_DATA_FRAMES=tls` keeps TLS's
/// own records (to compare the two, or to reach past a middlebox that
/// inspects TLS).
pub fn sealed_frames() -> bool {
    std::env::var("LONGHAUL_DATA_FRAMES").map_or(true, |v| v != "tls")
}

/// How every message about a full destination starts: what says to free
/// space first, which no retry can fix (`cp` over ssh and the client's
/// own retries leave it alone).
pub const DESTINATION_FULL: &str = "destination full";

/// Whether this client asks that its TLS data streams' AEAD tags be each
/// chunk's check (PROTOCOL.md 13.5b): yes, unless `LONGHAUL_CHUNK_CHECK=xxh3`
/// keeps the XXH3-128 check of every chunk as well (to compare the two).
pub fn tag_checks() -> bool {
    std::env::var("LONGHAUL_CHUNK_CHECK").map_or(true, |v| v != "xxh3")
}

/// Whether each chunk's check may be left to its data stream's AEAD tag:
/// the ends agreed to it and every data stream is TLS. Only the data
/// streams decide: a TLS control connection proves nothing about bytes on
/// a plaintext data stream (which a server with `--allow-plaintext` takes).
pub(crate) fn tags_prove(agreed: bool, data: &[Box<dyn crate::net::conn::Stream>]) -> bool {
    agreed && data.iter().all(|s| s.is_tls())
}

/// A transfer in which nothing moves for this long (no chunk, no message,
/// either way) is ended: a silent or stuck peer does not hold a slot,
/// threads and memory forever. Generous, for slow disks and the re-hash of
/// large resumed files.
pub const TRANSFER_IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// Chunks one file may have at the sink (its per-chunk state is kept
/// while it is in flight)...
pub const MAX_CHUNKS_PER_FILE: u64 = 1 << 22;
/// ...and all files in flight in one transfer together (about 140 MB of
/// chunk state at most).
pub const MAX_CHUNKS_IN_FLIGHT: u64 = 1 << 22;
/// Entries per `Entries` message.
pub const ENTRIES_BATCH: usize = 256;

/// Live counters of a transfer. The source and the sink count; the
/// client samples them for its reporter ([`client::cp_with`]).
#[derive(Debug, Default)]
pub struct Progress {
    /// Payload bytes moved: that reached the far end (a source counts
    /// what the far end's TCP acknowledged, several times a second, not
    /// what its socket buffers took), or written (a sink).
    pub bytes: AtomicU64,
    pub files: AtomicU64,
    /// What the source has announced so far (grows while it walks).
    pub announced_bytes: AtomicU64,
    pub announced_files: AtomicU64,
    /// Set once the source has announced everything.
    pub walk_done: std::sync::atomic::AtomicBool,
    /// Set from outside (Ctrl-C) to end the transfer; journals stay for a resume.
    pub interrupt: Arc<std::sync::atomic::AtomicBool>,
    /// The sender's latest intervals (at most [`KEPT_INTERVALS`]), each
    /// with its limit (from the local source, or sent by a server that is
    /// the source). The reporter sees every one as it comes; the archive
    /// keeps them all.
    pub intervals: Mutex<Vec<longhaul_proto::tune::TransferInterval>>,
    /// Intervals dropped from the front of `intervals` so far (changed
    /// under its lock).
    pub intervals_dropped: AtomicU64,
}

/// The intervals a transfer keeps in memory (and its summary carries): an
/// hour at 1 s, so that a transfer of days runs in flat memory.
pub const KEPT_INTERVALS: usize = 3600;

impl Progress {
    /// Adds an interval, dropping the oldest past [`KEPT_INTERVALS`].
    pub fn push_interval(&self, i: longhaul_proto::tune::TransferInterval) {
        let mut v = self.intervals.lock().expect("poisoned");
        if v.len() >= KEPT_INTERVALS {
            // In halves: amortised O(1) per interval.
            v.drain(..KEPT_INTERVALS / 2);
            self.intervals_dropped.fetch_add(
                KEPT_INTERVALS as u64 / 2,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        v.push(i);
    }

    /// The counters now.
    pub fn snapshot(&self) -> crate::report::TransferProgress {
        use std::sync::atomic::Ordering::Relaxed;
        crate::report::TransferProgress {
            bytes: self.bytes.load(Relaxed),
            files: self.files.load(Relaxed),
            announced_bytes: self.announced_bytes.load(Relaxed),
            announced_files: self.announced_files.load(Relaxed),
            walk_done: self.walk_done.load(Relaxed),
        }
    }

    fn check_interrupt(&self) -> Result<(), EngineError> {
        if self.interrupt.load(std::sync::atomic::Ordering::Relaxed) {
            Err(EngineError::Interrupted(
                "run the same command again to resume".into(),
            ))
        } else {
            Ok(())
        }
    }
}

/// Where `DIGEST  PATH` lines go as files are verified (`--digests FILE`).
pub type DigestOut = Arc<DigestFile>;

/// Writes one digest line; a failed write is kept and reported by
/// [`DigestFile::finish`] when the transfer ends.
pub fn write_digest(out: &Option<DigestOut>, path: &str, digest: &str) {
    if let Some(o) = out {
        o.line(path, digest);
    }
}

/// A file that landed: the file catalogue's row. Its full names are made
/// by [`Landed::names`] where the row is written, not on the transfer's
/// threads.
#[derive(Clone)]
pub struct Landed {
    /// The file as the transfer named it (its root's name first).
    pub path: String,
    pub size: u64,
    pub mtime_ns: i64,
    /// The file's BLAKE3 (hex, what `b3sum` prints), as `--digests` writes it.
    pub digest: Option<String>,
    /// Names an entry path in full: (source, destination).
    pub namer: Namer,
}

/// Names a transfer's entry path in full: where it came from and where it
/// landed, each a local absolute path or `HOST:PORT:EXPORT/path`.
pub type Namer = Arc<dyn Fn(&str) -> (String, String) + Send + Sync>;

impl Landed {
    /// (source, destination), named in full.
    pub fn names(&self) -> (String, String) {
        (self.namer)(&self.path)
    }
}

/// Where a cp or sync tells each file that landed (the archive's
/// catalogue). Called from the transfer's threads: it must not block.
pub type Catalogue = Arc<dyn Fn(Landed) + Send + Sync>;

/// What the source and sink threads call as each file lands: its path in
/// the transfer, size, mtime and digest.
pub(crate) type OnLanded = Arc<dyn Fn(&str, u64, i64, Option<&str>) + Send + Sync>;

/// A server's named directory.
#[derive(Debug, Clone)]
pub struct Export {
    pub name: String,
    pub root: PathBuf,
    pub read_only: bool,
    /// Readable without authentication (`:ro:public`; never writable).
    pub public: bool,
}

/// Parses `NAME=PATH[:ro][:public]` (`:public` only with `:ro`).
pub fn parse_export(s: &str) -> Result<Export, String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("invalid export '{s}': expected NAME=PATH or NAME=PATH:ro"))?;
    if name.is_empty() || name.contains('/') || name.contains(':') {
        return Err(format!(
            "invalid export name '{name}': use letters, digits, '-' or '_'"
        ));
    }
    let (rest, public) = match rest.strip_suffix(":public") {
        Some(r) => (r, true),
        None => (rest, false),
    };
    let (path, read_only) = match rest.strip_suffix(":ro") {
        Some(p) => (p, true),
        None => (rest.strip_suffix(":rw").unwrap_or(rest), false),
    };
    if public && !read_only {
        return Err(format!(
            "export '{name}': a public export must be read-only: NAME=PATH:ro:public"
        ));
    }
    let root = PathBuf::from(path);
    let meta =
        std::fs::metadata(&root).map_err(|e| format!("export '{name}': cannot use {path}: {e}"))?;
    if !meta.is_dir() {
        return Err(format!("export '{name}': {path} is not a directory"));
    }
    Ok(Export {
        name: name.to_string(),
        root: root.canonicalize().unwrap_or(root),
        read_only,
        public,
    })
}

/// Joins a peer's relative path beneath `root`, refusing anything that
/// would leave it (see [`xfer::components`]).
pub fn beneath(root: &Path, rel: &str) -> Result<PathBuf, EngineError> {
    let comps = xfer::components(rel).map_err(|e| EngineError::Usage(e.to_string()))?;
    let mut p = root.to_path_buf();
    p.extend(comps);
    Ok(p)
}

/// Checks that `path` (which need not exist yet) resolves beneath `root`
/// once symlinks are followed: its deepest existing ancestor, resolved,
/// must lie under the resolved root. A final component that is a symlink
/// is not followed (links are copied as links, never through), so a lone
/// link, dangling or pointing anywhere, passes if its directory does.
/// The race-free guard is [`beneath::Anchor`]; this is the early check
/// that gives a clear error.
pub fn confine(root: &Path, path: &Path) -> Result<(), EngineError> {
    let root_c = root
        .canonicalize()
        .map_err(|e| EngineError::Usage(format!("export root is unusable: {e}")))?;
    let mut existing = path;
    while std::fs::symlink_metadata(existing).is_err() {
        match existing.parent() {
            Some(p) => existing = p,
            None => break,
        }
    }
    if std::fs::symlink_metadata(existing).is_ok_and(|m| m.file_type().is_symlink()) {
        existing = existing.parent().unwrap_or(existing);
    }
    let resolved = existing
        .canonicalize()
        .map_err(|e| EngineError::Usage(format!("cannot resolve the path: {e}")))?;
    if resolved.starts_with(&root_c) {
        Ok(())
    } else {
        Err(EngineError::Usage(
            "path refused: it leads outside the export through a symbolic link".into(),
        ))
    }
}

/// What tells one version of a file from another: taken when the source
/// announces a file, compared on the open descriptor before its first read
/// and after its last (GNU tar's check, with the inode so that a file
/// replaced by a rename is caught too).
#[derive(Debug, Clone, Copy, Default)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// Fewer blocks than bytes: it may have holes worth looking for
    /// (`SEEK_DATA`). Not part of the version.
    pub sparse: bool,
}

impl Stamp {
    pub fn of(m: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: mtime_ns(m),
            ctime_ns: m
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.ctime_nsec()),
            sparse: m.blocks().saturating_mul(512) < m.len(),
        }
    }

    /// What changed from `self` to `now`, in words; None if nothing did.
    pub fn changed(&self, now: &Stamp) -> Option<String> {
        if (self.dev, self.ino) != (now.dev, now.ino) {
            Some("it was replaced by another file".into())
        } else if self.size != now.size {
            Some(format!(
                "its size went from {} to {} bytes",
                self.size, now.size
            ))
        } else if self.mtime_ns != now.mtime_ns {
            Some("its modification time changed".into())
        } else if self.ctime_ns != now.ctime_ns {
            Some("its status-change time changed".into())
        } else {
            None
        }
    }
}

/// Modification time of a file's metadata, nanoseconds since the epoch.
pub fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    m.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(m.mtime_nsec())
}

pub fn kind_of(m: &std::fs::Metadata) -> Option<Kind> {
    let t = m.file_type();
    if t.is_file() {
        Some(Kind::File)
    } else if t.is_dir() {
        Some(Kind::Dir)
    } else if t.is_symlink() {
        Some(Kind::Symlink)
    } else {
        None
    }
}

/// Sets a path's modification time (and leaves access time alone), without
/// following a symlink.
pub fn set_mtime(path: &Path, mtime_ns: i64) -> io::Result<()> {
    set_mtime_flags(path, mtime_ns, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
}

/// Sets the modification time of what `path` leads to, following links:
/// for `/proc/self/fd/N` paths of directories opened beneath an anchor.
pub fn set_mtime_through(path: &Path, mtime_ns: i64) -> io::Result<()> {
    set_mtime_flags(path, mtime_ns, rustix::fs::AtFlags::empty())
}

fn set_mtime_flags(path: &Path, mtime_ns: i64, flags: rustix::fs::AtFlags) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::ErrorKind::InvalidInput)?;
    let times = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: mtime_ns.div_euclid(1_000_000_000),
            tv_nsec: mtime_ns.rem_euclid(1_000_000_000),
        },
    };
    Ok(rustix::fs::utimensat(
        rustix::fs::CWD,
        c.as_c_str(),
        &times,
        flags,
    )?)
}

/// The process umask, read without changing it for good.
pub fn umask() -> u32 {
    // Only a swap reads it: put the old mask back at once.
    let m = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    rustix::process::umask(m);
    m.bits()
}

/// Reads exactly `buf.len()` bytes from a stream. `Ok(false)` means the
/// stream ended cleanly before the first byte.
pub fn read_frame(s: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Bytes both ends move through the cache at a time within a chunk.
pub const PIECE: usize = 512 << 10;
// A compressed chunk frame's blocks are pieces: neither end holds more.
const _: () = assert!(PIECE == longhaul_proto::xfer::compress::BLOCK);

/// The XXH3-128 check of `len` zero bytes (a zero chunk's), computed
/// once per length.
pub fn zero_check(len: u32) -> longhaul_proto::digest::Check {
    static CACHE: std::sync::Mutex<Vec<(u32, longhaul_proto::digest::Check)>> =
        std::sync::Mutex::new(Vec::new());
    if let Some(h) = CACHE
        .lock()
        .expect("poisoned")
        .iter()
        .find(|(l, _)| *l == len)
    {
        return h.1;
    }
    let mut checker = longhaul_proto::digest::Checker::new();
    for_zeros(len, |z| checker.update(z));
    let h = checker.finalize();
    let mut c = CACHE.lock().expect("poisoned");
    if c.len() >= 16 {
        c.remove(0);
    }
    c.push((len, h));
    h
}

/// The trailer of a chunk of `len` zero bytes at `offset` (a hole): its
/// check (if `checked`, else the AEAD's tag is it), and its value, which
/// depends on where it is.
pub fn zero_trailer(offset: u64, len: u32, whole: bool, checked: bool) -> xfer::Trailer {
    let mut h = longhaul_proto::digest::ValueHasher::new(offset, whole);
    for_zeros(len, |z| h.update(z));
    xfer::Trailer {
        check: if checked {
            zero_check(len)
        } else {
            longhaul_proto::digest::NO_CHECK
        },
        value: h.finalize(),
    }
}

/// Hands `f` the `len` zero bytes, a piece at a time.
fn for_zeros(len: u32, mut f: impl FnMut(&[u8])) {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let mut left = len as usize;
    while left > 0 {
        let n = left.min(ZEROS.len());
        f(&ZEROS[..n]);
        left -= n;
    }
}

/// BLAKE3 of a file's content (hex), read through `storage`.
pub fn content_digest(
    storage: &dyn storage::Storage,
    path: &Path,
    size: u64,
) -> io::Result<String> {
    let r = storage.open_read(path)?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = storage::AlignedBuf::new(PIECE);
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(PIECE as u64) as usize;
        storage::read_exact_at(&*r, &mut buf[..n], off)?;
        hasher.update(&buf[..n]);
        off += n as u64;
    }
    Ok(hex(hasher.finalize().as_bytes()))
}

pub use digests::DigestFile;
pub use longhaul_proto::units::hex;

#[cfg(test)]
mod kept_intervals {
    use super::*;

    #[test]
    fn a_long_transfer_keeps_its_latest_intervals_only() {
        let p = Progress::default();
        let n = KEPT_INTERVALS as u32 * 5 + 7;
        for index in 0..n {
            p.push_interval(longhaul_proto::tune::TransferInterval {
                index,
                ..Default::default()
            });
        }
        let v = p.intervals.lock().unwrap();
        assert!(v.len() <= KEPT_INTERVALS);
        assert_eq!(v.last().unwrap().index, n - 1);
        let dropped = p
            .intervals_dropped
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(dropped + v.len() as u64, u64::from(n), "every one counted");
        assert_eq!(u64::from(v[0].index), dropped);
    }
}
