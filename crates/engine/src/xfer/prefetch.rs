//! Warms the page cache ahead of the source's senders, so that a cold
//! tree is read at the device's queue depth rather than at the stream
//! count (issue 15). Only warms: the senders still open each file through
//! [`Storage`], check it is the version announced, and read it; a file
//! swapped in between is caught there as before.
//!
//! The walk runs ahead too: each directory the walker enters is listed
//! here and its entries' inodes are stat'ed in parallel, before the
//! walker stats them one by one (at most [`STATS_AHEAD`] queued).
//! The files come in the order the planner queues them; at most
//! [`AHEAD_BYTES`] (or [`AHEAD_FILES`]) are warmed and not yet resolved.
//! Two ways, picked by `LONGHAUL_PREFETCH` (off | pool | uring): a pool of
//! [`DEPTH`] threads that each open and read one file at a time, or one
//! thread that keeps [`DEPTH`] opens and reads in flight on an io_uring.
//! See docs/ARCHITECTURE.md for the figures that chose the default.

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::beneath::Anchor;
use super::storage::Storage;

/// Reads in flight at once. A virtio disk here took 5,400 small files/s
/// at depth 1, 11,000 at 4 and 16,300 at 16; depth past what the device
/// serves costs only idle threads or ring slots, and on a rotating disk
/// a deeper queue lets the elevator sort.
const DEPTH: usize = 16;
/// Bytes warmed and not yet resolved (sent and sealed), at most.
const AHEAD_BYTES: u64 = 64 << 20;
/// Files warmed and not yet resolved, at most.
const AHEAD_FILES: usize = 4096;
/// Stats queued ahead of the walk, at most (the rest of a huge directory
/// is left to the walker).
const STATS_AHEAD: usize = 1 << 16;
/// Of a large file only its head is warmed: past it the sender's own
/// sequential readahead keeps up.
const WARM_MAX: u64 = 1 << 20;

/// How the cache is warmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Off,
    /// [`DEPTH`] threads, each open + `fadvise(WILLNEED)`.
    Pool,
    /// One thread, [`DEPTH`] openat + read in flight on an io_uring.
    Uring,
}

impl Mode {
    /// From `LONGHAUL_PREFETCH`; the default when unset or unknown.
    pub fn from_env() -> Mode {
        match std::env::var("LONGHAUL_PREFETCH").as_deref() {
            Ok("off") => Mode::Off,
            Ok("pool") => Mode::Pool,
            Ok("uring") => Mode::Uring,
            _ => Mode::Pool,
        }
    }
}

/// What a warmer does next, in this order of priority: the walk is what
/// everything else waits for.
enum Work {
    /// List a directory the walk entered, queueing its entries' stats.
    List(PathBuf),
    /// Stat an entry (its inode into the cache): the directory, the name.
    Stat(Arc<OwnedFd>, CString),
    /// Read the head of a file queued for the senders.
    Data(Job),
}

/// A file to warm: its id (to forget it by) and where it is.
struct Job {
    id: u64,
    path: PathBuf,
    len: u64,
}

enum Ahead {
    Queued,
    /// Being warmed or warm: this many bytes.
    Warm(u64),
}

/// The files to warm and the bound on how far ahead they are.
#[derive(Default)]
struct State {
    dirs: VecDeque<PathBuf>,
    stats: VecDeque<(Arc<OwnedFd>, CString)>,
    queue: VecDeque<Job>,
    files: HashMap<u64, Ahead>,
    bytes: u64,
    warm: usize,
    closed: bool,
}

impl State {
    fn has_room(&self) -> bool {
        self.bytes < AHEAD_BYTES && self.warm < AHEAD_FILES
    }

    fn take(&mut self) -> Option<Work> {
        if let Some(d) = self.dirs.pop_front() {
            return Some(Work::List(d));
        }
        if let Some((d, name)) = self.stats.pop_front() {
            return Some(Work::Stat(d, name));
        }
        self.has_room()
            .then(|| self.pop().map(Work::Data))
            .flatten()
    }

    /// The next queued file not forgotten meanwhile, now counted warm.
    fn pop(&mut self) -> Option<Job> {
        while let Some(job) = self.queue.pop_front() {
            if let Some(a @ Ahead::Queued) = self.files.get_mut(&job.id) {
                *a = Ahead::Warm(job.len);
                self.bytes += job.len;
                self.warm += 1;
                return Some(job);
            }
        }
        None
    }

    fn release(&mut self, was: Option<Ahead>) {
        if let Some(Ahead::Warm(b)) = was {
            self.bytes -= b;
            self.warm -= 1;
        }
    }
}

#[derive(Default)]
struct Window {
    state: Mutex<State>,
    cv: Condvar,
}

impl Window {
    /// The next work (a file only once there is room); None when closed,
    /// or (unless `block`) when nothing can be taken now.
    fn next(&self, block: bool) -> Option<Work> {
        let mut s = self.state.lock().expect("poisoned");
        loop {
            if s.closed {
                return None;
            }
            if let Some(w) = s.take() {
                return Some(w);
            }
            if !block {
                return None;
            }
            s = self.cv.wait(s).expect("poisoned");
        }
    }
}

/// The warmers of one transfer's source; stopped when dropped.
pub struct Prefetcher {
    window: Arc<Window>,
    threads: Vec<JoinHandle<()>>,
}

impl Prefetcher {
    /// Starts warming for a transfer of `roots`, or None where it cannot
    /// help: prefetch off, a storage that is not the page cache of the
    /// local file system (O_DIRECT, fault injection), or roots all in
    /// memory (tmpfs, ramfs).
    pub fn start(
        storage: &dyn Storage,
        roots: &[PathBuf],
        anchor: Option<Arc<Anchor>>,
    ) -> Option<Prefetcher> {
        let mode = Mode::from_env();
        if mode == Mode::Off || !storage.page_cached() || roots.iter().all(|r| in_memory(r)) {
            return None;
        }
        let window = Arc::new(Window::default());
        let threads = match mode {
            Mode::Uring => spawn_uring(&window, &anchor)
                .map(|t| vec![t])
                .unwrap_or_else(|| spawn_pool(&window, &anchor)),
            _ => spawn_pool(&window, &anchor),
        };
        tracing::debug!("prefetch: {mode:?}, {} thread(s)", threads.len());
        Some(Prefetcher { window, threads })
    }

    /// Queues the file `id`, of `len` bytes at `path` (as announced,
    /// before the anchor), to be warmed.
    pub fn want(&self, id: u64, path: PathBuf, len: u64) {
        let mut s = self.window.state.lock().expect("poisoned");
        let was = s.files.insert(id, Ahead::Queued);
        s.release(was);
        s.queue.push_back(Job { id, path, len });
        drop(s);
        self.window.cv.notify_one();
    }

    /// The walk entered the directory `dir` (as announced, before the
    /// anchor): its entries are to be stat'ed ahead of it.
    pub fn list(&self, dir: PathBuf) {
        self.window
            .state
            .lock()
            .expect("poisoned")
            .dirs
            .push_back(dir);
        self.window.cv.notify_one();
    }

    /// The file `id` is resolved: its room goes to the files behind it.
    pub fn forget(&self, id: u64) {
        let mut s = self.window.state.lock().expect("poisoned");
        let was = s.files.remove(&id);
        let freed = matches!(was, Some(Ahead::Warm(_)));
        s.release(was);
        drop(s);
        if freed {
            self.window.cv.notify_all();
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.window.state.lock().expect("poisoned").closed = true;
        self.window.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// statfs(2) f_type of ramfs (linux/magic.h; not in the libc crate).
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Whether `path` lives in memory (tmpfs, ramfs): nothing to warm.
fn in_memory(path: &Path) -> bool {
    rustix::fs::statfs(path)
        .is_ok_and(|st| st.f_type == libc::TMPFS_MAGIC || st.f_type == RAMFS_MAGIC)
}

/// Where a job is opened: through the anchor, if there is one.
fn resolve(anchor: &Option<Arc<Anchor>>, job: &Job) -> Option<PathBuf> {
    match anchor {
        Some(a) => a.anchored(&job.path).ok(),
        None => Some(job.path.clone()),
    }
}

/// How much of a file is warmed.
fn warm_len(len: u64) -> usize {
    len.min(WARM_MAX) as usize
}

/// Opens a file to warm as the senders do: never through a symbolic
/// link, never blocking on a FIFO swapped in.
const OPEN_FLAGS: i32 = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;

fn spawn_pool(window: &Arc<Window>, anchor: &Option<Arc<Anchor>>) -> Vec<JoinHandle<()>> {
    (0..DEPTH)
        .filter_map(|_| {
            let (window, anchor) = (window.clone(), anchor.clone());
            std::thread::Builder::new()
                .name("lh-prefetch".into())
                .spawn(move || pool_worker(&window, &anchor))
                .ok()
        })
        .collect()
}

fn pool_worker(window: &Window, anchor: &Option<Arc<Anchor>>) {
    while let Some(work) = window.next(true) {
        match work {
            Work::List(dir) => list(window, anchor, &dir),
            Work::Stat(dir, name) => {
                let _ = rustix::fs::statat(&*dir, &name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW);
            }
            Work::Data(job) => {
                if let Some(path) = resolve(anchor, &job) {
                    let _ = warm(&path, warm_len(job.len));
                }
            }
        }
    }
}

/// Lists `dir` and queues a stat of each of its entries.
fn list(window: &Window, anchor: &Option<Arc<Anchor>>, dir: &Path) {
    let Some(fd) = open_dir(anchor, dir) else {
        return;
    };
    let Ok(entries) = rustix::fs::Dir::read_from(&fd) else {
        return;
    };
    let fd = Arc::new(fd);
    let names: Vec<CString> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .take(STATS_AHEAD)
        .collect();
    let mut s = window.state.lock().expect("poisoned");
    let room = STATS_AHEAD.saturating_sub(s.stats.len());
    s.stats
        .extend(names.into_iter().take(room).map(|n| (fd.clone(), n)));
    drop(s);
    window.cv.notify_all();
}

/// `dir` opened for listing: beneath the anchor's root, if there is one.
fn open_dir(anchor: &Option<Arc<Anchor>>, dir: &Path) -> Option<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match anchor {
        Some(a) => {
            let d = a.dir(dir, false).ok()?;
            rustix::fs::openat(d.fd(), c".", flags, Mode::empty()).ok()
        }
        None => rustix::fs::open(dir, flags | OFlags::NOFOLLOW, Mode::empty()).ok(),
    }
}

/// Asks for the head of the regular file at `path` to be read into the
/// page cache (`POSIX_FADV_WILLNEED`: the reads are queued, not waited
/// for, so the device sees more than one read per thread; the window
/// bounds how many).
fn warm(path: &Path, len: usize) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = File::options()
        .read(true)
        .custom_flags(OPEN_FLAGS & !libc::O_RDONLY)
        .open(path)?;
    if f.metadata()?.is_file() {
        let len = std::num::NonZeroU64::new(len as u64);
        rustix::fs::fadvise(&f, 0, len, rustix::fs::Advice::WillNeed)?;
    }
    Ok(())
}

fn spawn_uring(window: &Arc<Window>, anchor: &Option<Arc<Anchor>>) -> Option<JoinHandle<()>> {
    let ring = match io_uring::IoUring::new(2 * DEPTH as u32) {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!("prefetch: no io_uring ({e}); a thread pool instead");
            return None;
        }
    };
    let (window, anchor) = (window.clone(), anchor.clone());
    std::thread::Builder::new()
        .name("lh-prefetch".into())
        .spawn(move || {
            let mut u = Uring {
                ring,
                slots: (0..DEPTH).map(|_| Slot::default()).collect(),
                free: (0..DEPTH).collect(),
            };
            if let Err(e) = u.run(&window, &anchor) {
                tracing::debug!("prefetch: io_uring failed: {e}");
            }
        })
        .ok()
}

/// One file in flight on the ring: its path (until opened) or name in
/// `dir` (to stat), descriptor, buffer and statx, each kept in place
/// until the kernel is done with it.
struct Slot {
    path: CString,
    dir: Option<Arc<OwnedFd>>,
    fd: i32,
    buf: Vec<u8>,
    statx: Box<libc::statx>,
}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            path: CString::default(),
            dir: None,
            fd: -1,
            buf: Vec::new(),
            // SAFETY: statx is plain integers, for which zero is a value.
            statx: Box::new(unsafe { std::mem::zeroed() }),
        }
    }
}

/// user_data: the slot index, shifted, and which step completed.
const STEP_OPEN: u64 = 0;
const STEP_READ: u64 = 1;
const STEP_STAT: u64 = 2;

fn user_data(i: usize, step: u64) -> u64 {
    (i as u64) << 2 | step
}

struct Uring {
    ring: io_uring::IoUring,
    slots: Vec<Slot>,
    free: Vec<usize>,
}

impl Uring {
    fn busy(&self) -> bool {
        self.free.len() < self.slots.len()
    }

    /// Keeps the slots full of opens and reads until the window closes
    /// and the last in flight is done.
    fn run(&mut self, window: &Window, anchor: &Option<Arc<Anchor>>) -> io::Result<()> {
        loop {
            while let Some(&i) = self.free.last() {
                let Some(work) = window.next(!self.busy()) else {
                    break;
                };
                match work {
                    Work::List(dir) => list(window, anchor, &dir),
                    Work::Stat(dir, name) => {
                        self.free.pop();
                        self.stat(i, dir, name);
                    }
                    Work::Data(job) => {
                        let Some(path) = resolve(anchor, &job) else {
                            continue;
                        };
                        let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
                            continue;
                        };
                        self.free.pop();
                        self.open(i, path, warm_len(job.len));
                    }
                }
            }
            if !self.busy() {
                return Ok(());
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                if e.kind() != io::ErrorKind::Interrupted {
                    // Reads in flight may still land in the buffers.
                    std::mem::forget(std::mem::take(&mut self.slots));
                    return Err(e);
                }
            }
            self.reap();
        }
    }

    fn open(&mut self, i: usize, path: CString, len: usize) {
        let slot = &mut self.slots[i];
        slot.path = path;
        slot.buf.resize(len, 0);
        let sqe =
            io_uring::opcode::OpenAt::new(io_uring::types::Fd(libc::AT_FDCWD), slot.path.as_ptr())
                .flags(OPEN_FLAGS)
                .build()
                .user_data(user_data(i, STEP_OPEN));
        self.push(&sqe);
    }

    fn stat(&mut self, i: usize, dir: Arc<OwnedFd>, name: CString) {
        let slot = &mut self.slots[i];
        slot.path = name;
        let sqe = io_uring::opcode::Statx::new(
            io_uring::types::Fd(dir.as_raw_fd()),
            slot.path.as_ptr(),
            (&mut *slot.statx as *mut libc::statx).cast(),
        )
        .flags(libc::AT_SYMLINK_NOFOLLOW)
        .mask(libc::STATX_BASIC_STATS)
        .build()
        .user_data(user_data(i, STEP_STAT));
        slot.dir = Some(dir);
        self.push(&sqe);
    }

    fn read(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let sqe = io_uring::opcode::Read::new(
            io_uring::types::Fd(slot.fd),
            slot.buf.as_mut_ptr(),
            slot.buf.len() as u32,
        )
        .build()
        .user_data(user_data(i, STEP_READ));
        self.push(&sqe);
    }

    fn push(&mut self, sqe: &io_uring::squeue::Entry) {
        // SAFETY: what the entry points to (the slot's path, directory,
        // buffer and statx) stays in place, untouched, until its
        // completion is reaped: a slot is reused only once free, and
        // never freed while busy.
        let pushed = unsafe { self.ring.submission().push(sqe) };
        // Twice as many entries as slots, one entry per slot at a time.
        debug_assert!(pushed.is_ok(), "the submission queue has room");
    }

    /// Takes the completions: an open goes on to its read, a read (or a
    /// failure) frees its slot.
    fn reap(&mut self) {
        let done: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (data, res) in done {
            let i = (data >> 2) as usize;
            if data & 3 == STEP_OPEN && res >= 0 {
                self.slots[i].fd = res;
                if is_file(res) {
                    self.read(i);
                    continue;
                }
            }
            self.finish(i);
        }
    }

    fn finish(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if slot.fd >= 0 {
            // SAFETY: the descriptor came from this slot's open and no
            // operation on it is in flight.
            unsafe { libc::close(slot.fd) };
            slot.fd = -1;
        }
        slot.dir = None;
        self.free.push(i);
    }
}

/// Whether the open descriptor `fd` is a regular file (not a device or
/// FIFO swapped in since the walk).
fn is_file(fd: i32) -> bool {
    // SAFETY: `fd` is open, owned by the caller, and only borrowed here.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(fd).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
}
