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
//! A pool of [`DEPTH`] threads does it: `LONGHAUL_PREFETCH=off` turns it
//! off (benchmarks). One io_uring thread instead was measured slower and
//! removed; see docs/ARCHITECTURE.md (10.2a) and BENCHMARKS.md.

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::beneath::Anchor;
use super::storage::Storage;

/// Warming threads: the walk's stats (and the opens) go to the device at
/// this depth; the data reads `fadvise` queues go deeper, up to the
/// window. A virtio disk here took 5,400 small files/s at depth 1, 11,000
/// at 4 and 16,300 at 16; its `/sys/block` (`rotational` 1, `nr_requests`
/// 256) tells nothing better. Depth past what a device serves costs only
/// idle threads, and on a rotating disk a deeper queue lets the elevator
/// sort.
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

/// Whether `LONGHAUL_PREFETCH=off` turned prefetch off (anything else,
/// `pool` included, leaves it on).
fn turned_off() -> bool {
    std::env::var("LONGHAUL_PREFETCH").as_deref() == Ok("off")
}

/// What a warmer does next, in this order of priority: the walk is what
/// everything else waits for.
enum Work {
    /// List a directory the walk entered, queueing its entries' stats.
    List(PathBuf),
    /// Stat an entry (its inode into the cache): the directory, the name.
    Stat(Arc<OwnedFd>, CString),
    /// Warm the head of a file queued for the senders.
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
    /// The next work (a file only once there is room), waiting for it;
    /// None once closed.
    fn next(&self) -> Option<Work> {
        let mut s = self.state.lock().expect("poisoned");
        loop {
            if s.closed {
                return None;
            }
            if let Some(w) = s.take() {
                return Some(w);
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
        if turned_off() || !storage.page_cached() || roots.iter().all(|r| in_memory(r)) {
            return None;
        }
        let window = Arc::new(Window::default());
        let threads = spawn_pool(&window, &anchor);
        tracing::debug!("prefetch: {} threads", threads.len());
        Some(Prefetcher { window, threads })
    }

    /// Queues the file `id`, of `len` bytes at `path` (as announced,
    /// before the anchor), to be warmed.
    pub fn want(&self, id: u64, path: PathBuf, len: u64) {
        let mut s = self.window.state.lock().expect("poisoned");
        let was = s.files.insert(id, Ahead::Queued);
        s.release(was);
        s.queue.push_back(Job { id, path, len });
        let room = s.has_room();
        drop(s);
        if room {
            self.window.cv.notify_one();
        }
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

    /// The file `id` is resolved: its room goes to the file behind it.
    /// One file's room is one warmer's work: waking them all per file
    /// (16 threads on one lock, 100,000 times) was half the source's CPU
    /// on a tree of small files (issue 45).
    pub fn forget(&self, id: u64) {
        let mut s = self.window.state.lock().expect("poisoned");
        let was = s.files.remove(&id);
        let freed = matches!(was, Some(Ahead::Warm(_))) && !s.queue.is_empty();
        s.release(was);
        drop(s);
        if freed {
            self.window.cv.notify_one();
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
    while let Some(work) = window.next() {
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
    // As the senders open: never through a symbolic link, never blocking
    // on a FIFO swapped in since the walk.
    let f = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if f.metadata()?.is_file() {
        let len = std::num::NonZeroU64::new(len as u64);
        rustix::fs::fadvise(&f, 0, len, rustix::fs::Advice::WillNeed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, len: u64) -> Job {
        Job {
            id,
            path: PathBuf::from("x"),
            len,
        }
    }

    #[test]
    fn the_window_holds_back_files_until_resolved_ones_free_room() {
        let mut s = State::default();
        let big = AHEAD_BYTES / 2;
        for id in 1..=4 {
            s.files.insert(id, Ahead::Queued);
            s.queue.push_back(job(id, big));
        }
        assert!(matches!(s.take(), Some(Work::Data(j)) if j.id == 1));
        assert!(matches!(s.take(), Some(Work::Data(j)) if j.id == 2));
        assert!(s.take().is_none(), "64 MiB ahead: no room");
        let was = s.files.remove(&1);
        s.release(was);
        // A file forgotten before it was warmed is skipped, not counted.
        s.files.remove(&3);
        assert!(matches!(s.take(), Some(Work::Data(j)) if j.id == 4));
        assert_eq!((s.bytes, s.warm), (2 * big, 2));
        s.dirs.push_back(PathBuf::from("d"));
        assert!(matches!(s.take(), Some(Work::List(_))), "the walk first");
    }

    #[test]
    fn a_tree_in_memory_is_not_warmed() {
        if Path::new("/dev/shm").exists() {
            assert!(in_memory(Path::new("/dev/shm")));
        }
        assert!(!in_memory(Path::new("/proc/self")));
        let roots = [std::env::temp_dir()];
        let faulty = super::super::storage::Faulty {
            faults: Default::default(),
        };
        assert!(Prefetcher::start(&faulty, &roots, None).is_none());
    }
}
