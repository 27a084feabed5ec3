//! The storage benchmark (`longhaul bench disk`, and the server's half of
//! `longhaul doctor`): sequential write and read of one file with a block
//! size and a number of threads (each thread its own region, one request
//! in flight each: `threads` is the queue depth), through the page cache or
//! around it (O_DIRECT), then small files created and read back one after
//! another as a LOSF transfer does them.
//!
//! The test file is preallocated (`posix_fallocate`) before the write, as
//! the transfer sink does. Buffered writes end with `fdatasync`, inside the timing, so a write rate
//! is a rate to stable storage, not to the page cache. Buffered reads
//! first drop the file's clean pages (`posix_fadvise(DONTNEED)`), so they
//! read the device too. Everything made is removed again, also on error.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use longhaul_proto::disk::{DiskReport, FilesResult, SeqResult};

use crate::xfer::storage::{AlignedBuf, DIRECT_ALIGN};
use crate::EngineError;

/// What to measure and how.
#[derive(Debug, Clone)]
pub struct DiskBench {
    pub dir: PathBuf,
    /// Size of the sequential test file.
    pub file_size: u64,
    pub block_size: usize,
    /// Threads for the sequential tests (requests in flight).
    pub threads: usize,
    /// O_DIRECT for the sequential tests (falls back to buffered, with a
    /// warning, where the file system refuses it).
    pub direct: bool,
    /// Small files to create and read back (0: skip).
    pub files: u64,
    pub small_file_size: u64,
    /// Each test stops at this time even if it has not done its size.
    pub time_limit: Duration,
    pub write: bool,
    pub read: bool,
    /// Allocate the test file as a transfer's sink does (not on tmpfs,
    /// where allocating is zero-filling fresh pages: those then count in
    /// the write, as they do in a transfer), instead of always up front.
    pub like_transfer: bool,
}

impl DiskBench {
    /// The defaults of `longhaul bench disk`.
    pub fn new(dir: PathBuf) -> DiskBench {
        DiskBench {
            dir,
            file_size: 1 << 30,
            block_size: 1 << 20,
            threads: 1,
            direct: true,
            files: 2000,
            small_file_size: 16 << 10,
            time_limit: Duration::from_secs(10),
            write: true,
            read: true,
            like_transfer: false,
        }
    }
}

/// Removes a path (file or directory tree) when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0).or_else(|_| std::fs::remove_dir_all(&self.0));
    }
}

fn scratch_name(dir: &Path, what: &str) -> PathBuf {
    dir.join(format!(
        ".longhaul-bench-{}-{}-{what}",
        std::process::id(),
        fastrand::u32(..)
    ))
}

/// Runs the benchmark. A test that was not asked for is `None` in the report.
pub fn run(b: &DiskBench) -> Result<DiskReport, EngineError> {
    let usage = |m: String| EngineError::Usage(m);
    if b.block_size == 0 || b.block_size % DIRECT_ALIGN != 0 {
        return Err(usage(format!(
            "block size {} is not a multiple of {DIRECT_ALIGN}",
            b.block_size
        )));
    }
    if b.threads == 0 || b.threads > 256 {
        return Err(usage(format!("{} threads: use 1 to 256", b.threads)));
    }
    let meta = std::fs::metadata(&b.dir)
        .map_err(|e| EngineError::io(format!("cannot use {}", b.dir.display()), e))?;
    if !meta.is_dir() {
        return Err(usage(format!("{} is not a directory", b.dir.display())));
    }
    let (fs_type, free) = statfs(&b.dir);
    let mut report = DiskReport {
        path: b.dir.display().to_string(),
        filesystem: fs_type,
        direct: b.direct,
        block_size: b.block_size as u64,
        threads: b.threads as u32,
        ..Default::default()
    };
    // Leave a tenth of the free space; regions are whole blocks per thread.
    let mut size = b.file_size;
    let mut clipped = false;
    if let Some(free) = free {
        if size > free / 10 * 9 {
            size = free / 10 * 9;
            clipped = true;
            report.warnings.push(format!(
                "{} has {} free: the test file is {} instead of {}",
                b.dir.display(),
                longhaul_proto::units::format_bytes(free),
                longhaul_proto::units::format_bytes(size),
                longhaul_proto::units::format_bytes(b.file_size)
            ));
        }
    }
    let unit = (b.block_size * b.threads) as u64;
    size = size / unit * unit;
    report.file_size = size;
    if (b.write || b.read) && size == 0 {
        // The doctor measures with this too, and has no --size to name.
        return Err(usage(if clipped {
            format!(
                "{} has too little free space for a test file of one block per thread ({unit} bytes): free some space there",
                b.dir.display()
            )
        } else {
            format!(
                "the test file would be empty: make --size at least block size x threads ({unit} bytes)"
            )
        }));
    }

    if b.write || b.read {
        sequential_tests(b, size, &mut report)?;
    }
    if b.files > 0 {
        small_file_tests(b, &mut report)?;
    }
    Ok(report)
}

/// The sequential write and read of one file of `size` bytes, as asked.
fn sequential_tests(b: &DiskBench, size: u64, report: &mut DiskReport) -> Result<(), EngineError> {
    let path = scratch_name(&b.dir, "seq");
    let _scratch = Scratch(path.clone());
    let (file, direct) = open_seq(&path, b.direct, report)?;
    report.direct = direct;
    // Allocated first, outside the timing, as the transfer sink (and
    // fio) do: the write then measures writing, not block allocation.
    let allocated = if b.like_transfer {
        crate::xfer::storage::WriteAt::allocate(&file, size).is_ok()
    } else {
        // SAFETY: a plain call on a descriptor we own.
        unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) == 0 }
    };
    if !allocated {
        report
            .warnings
            .push("the file system cannot preallocate: the write includes allocation".into());
    }
    let written = sequential(&file, b, size, true, direct)
        .map_err(|e| EngineError::io(format!("writing {}", path.display()), e))?;
    if b.write {
        report.write = Some(written.0);
    }
    if b.read {
        // Whatever was written, read back (all of it if the write did
        // not stop at its time limit).
        cold(&file).map_err(|e| {
            EngineError::io(format!("readying {} for a cold read", path.display()), e)
        })?;
        // A larger readahead for a sequential reader, as the transfer
        // source asks for too.
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Sequential);
        let read = sequential(&file, b, written.1, false, direct)
            .map_err(|e| EngineError::io(format!("reading {}", path.display()), e))?;
        report.read = Some(read.0);
    }
    Ok(())
}

/// Creating `b.files` small files, then reading them back, in a scratch
/// directory.
fn small_file_tests(b: &DiskBench, report: &mut DiskReport) -> Result<(), EngineError> {
    let dir = scratch_name(&b.dir, "files");
    std::fs::create_dir(&dir)
        .map_err(|e| EngineError::io(format!("creating {}", dir.display()), e))?;
    let _scratch = Scratch(dir.clone());
    // Everything inside is reached through descriptors of directories
    // opened without following links: a directory swapped for a link
    // mid-run (by whoever else may write there) cannot lead outside.
    let held =
        held_dir(&dir).map_err(|e| EngineError::io(format!("opening {}", dir.display()), e))?;
    let inside = fd_path(&held);
    let (create, made) = create_files(&inside, b)
        .map_err(|e| EngineError::io(format!("creating files in {}", dir.display()), e))?;
    report.create = Some(create);
    report.small_read = Some(
        read_files(&inside, made, b)
            .map_err(|e| EngineError::io(format!("reading files in {}", dir.display()), e))?,
    );
    Ok(())
}

fn open_seq(
    path: &Path,
    direct: bool,
    report: &mut DiskReport,
) -> Result<(File, bool), EngineError> {
    let open = |flags: i32| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(flags | libc::O_NOFOLLOW)
            .open(path)
    };
    if direct {
        match open(libc::O_DIRECT) {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                report.warnings.push(format!(
                    "{} does not take O_DIRECT ({e}): buffered I/O, with fdatasync and the page cache dropped",
                    report.path
                ));
                let _ = std::fs::remove_file(path);
            }
            Err(e) => return Err(EngineError::io(format!("creating {}", path.display()), e)),
        }
    }
    open(0)
        .map(|f| (f, false))
        .map_err(|e| EngineError::io(format!("creating {}", path.display()), e))
}

/// Writes (or reads) `size` bytes with `b.threads` threads, each its own
/// contiguous region. Returns the result and the bytes done: a test that
/// hits its time limit stops early, and a read then covers what was written.
fn sequential(
    file: &File,
    b: &DiskBench,
    size: u64,
    write: bool,
    direct: bool,
) -> io::Result<(SeqResult, u64)> {
    let threads = b.threads as u64;
    let region = size / threads / b.block_size as u64 * b.block_size as u64;
    let start = Instant::now();
    let deadline = start + b.time_limit;
    let done: Vec<io::Result<u64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> io::Result<u64> {
                    let mut buf = AlignedBuf::new(b.block_size);
                    fill(&mut buf, t);
                    let base = t * region;
                    let mut off = 0;
                    while off < region && Instant::now() < deadline {
                        let n = if write {
                            file.write_at(&buf, base + off)?
                        } else {
                            file.read_at(&mut buf, base + off)?
                        };
                        if n == 0 {
                            break;
                        }
                        off += n as u64;
                    }
                    Ok(off)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(io::Error::other("worker panicked")))
            })
            .collect()
    });
    let mut bytes = 0;
    let mut least = u64::MAX;
    for d in done {
        let d = d?;
        bytes += d;
        least = least.min(d);
    }
    if write && !direct {
        file.sync_data()?;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok((
        SeqResult {
            bytes,
            seconds,
            bytes_per_second: bytes as f64 / seconds.max(1e-9),
        },
        // Every region has at least this much, for a read to follow.
        least.saturating_mul(threads),
    ))
}

/// Fills a buffer with bytes that neither compress nor dedupe to nothing.
fn fill(buf: &mut [u8], seed: u64) {
    longhaul_proto::data::Rng::new(seed).fill(buf);
}

/// Drops `file`'s cached pages, so that a read of it reads the device.
fn drop_cache(file: &File) -> io::Result<()> {
    rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed)
        .map_err(|e| io::Error::new(e.kind(), format!("dropping its cached pages: {e}")))
}

/// Writes `file`'s dirty pages out, then drops its cached pages: dirty
/// pages are never dropped, so a sync that failed would leave a "cold"
/// read reading memory. Its failure (a device that failed the writes) is
/// an error, never a warm figure.
fn cold(file: &File) -> io::Result<()> {
    file.sync_data().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("syncing it before its cached pages are dropped: {e}; the storage failed a write: check the device (dmesg)"),
        )
    })?;
    drop_cache(file)
}

/// Reads the files already under `dir` (a read-only probe: nothing is
/// created, written or removed), sequentially, a file after another, the
/// way a transfer's source does, their cached pages dropped first so the
/// storage and not memory is measured. Stops at `max_bytes` or the time
/// limit. Links are not followed, only regular files are read, and the
/// walk stays on `dir`'s file system. None when there is nothing to read.
pub fn read_existing(
    dir: &Path,
    max_bytes: u64,
    time_limit: Duration,
) -> io::Result<Option<SeqResult>> {
    // `dir` itself may be a descriptor's /proc path (the server's anchored
    // export directory): followed once; nothing under it is.
    let root = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?;
    let root_dev = root.metadata()?.dev();
    let mut files = Vec::new();
    let mut pending = vec![fd_path(&root)];
    let mut listed = 0u64;
    let mut held = vec![root];
    // Enough files to cover the bytes; a bounded walk of a large tree.
    let mut found = 0u64;
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            listed += 1;
            if listed > 100_000 || found >= max_bytes {
                break;
            }
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != root_dev {
                continue;
            }
            if m.is_file() && m.len() > 0 {
                found += m.len();
                files.push(e.path());
            } else if m.is_dir() {
                if let Ok(h) = held_dir(&e.path()) {
                    pending.push(fd_path(&h));
                    held.push(h);
                }
            }
        }
    }
    if files.is_empty() {
        return Ok(None);
    }
    let mut buf = AlignedBuf::new(1 << 20);
    let start = Instant::now();
    let deadline = start + time_limit;
    let mut bytes = 0u64;
    'files: for path in &files {
        let Ok(f) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
        else {
            continue;
        };
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            continue;
        }
        drop_cache(&f)?;
        let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::Sequential);
        let mut off = 0;
        loop {
            if Instant::now() >= deadline || bytes >= max_bytes {
                break 'files;
            }
            match f.read_at(&mut buf, off) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    off += n as u64;
                    bytes += n as u64;
                }
            }
        }
    }
    drop(held);
    let seconds = start.elapsed().as_secs_f64();
    Ok(Some(SeqResult {
        bytes,
        seconds,
        bytes_per_second: bytes as f64 / seconds.max(1e-9),
    }))
}

/// A directory opened as itself, never through a symlink.
fn held_dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
}

/// The path of an open descriptor, for calls that take paths.
fn fd_path(f: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// A few subdirectories of 1000 files, as real trees have, so one
/// directory does not grow to every file.
fn subdir_name(i: u64) -> String {
    format!("d{:03}", i / 1000)
}

fn file_name(i: u64) -> String {
    format!("f{i:07}")
}

fn open_small(sub: &File, i: u64, create: bool) -> io::Result<File> {
    let path = fd_path(sub).join(file_name(i));
    let mut o = OpenOptions::new();
    if create {
        o.write(true).create_new(true).mode(0o644);
    } else {
        o.read(true);
    }
    o.custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Creates small files one after another (create, write, close), as a
/// LOSF sink does. Returns the result and how many were made.
fn create_files(dir: &Path, b: &DiskBench) -> io::Result<(FilesResult, u64)> {
    let mut buf = vec![0u8; b.small_file_size as usize];
    fill(&mut buf, 7);
    let start = Instant::now();
    let deadline = start + b.time_limit;
    let mut made = 0;
    let mut sub: Option<File> = None;
    while made < b.files && Instant::now() < deadline {
        if made % 1000 == 0 {
            let p = dir.join(subdir_name(made));
            std::fs::create_dir(&p)?;
            sub = Some(held_dir(&p)?);
        }
        let f = open_small(sub.as_ref().expect("made above"), made, true)?;
        f.write_all_at(&buf, 0)?;
        made += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok((
        FilesResult {
            files: made,
            file_size: b.small_file_size,
            seconds,
            files_per_second: made as f64 / seconds.max(1e-9),
        },
        made,
    ))
}

/// Reads the files back (open, read, close), their pages dropped first.
fn read_files(dir: &Path, made: u64, b: &DiskBench) -> io::Result<FilesResult> {
    let subs: Vec<File> = (0..made.div_ceil(1000))
        .map(|k| held_dir(&dir.join(subdir_name(k * 1000))))
        .collect::<io::Result<_>>()?;
    let sub = |i: u64| &subs[(i / 1000) as usize];
    for i in 0..made {
        let f = open_small(sub(i), i, false)?;
        cold(&f).map_err(|e| io::Error::new(e.kind(), format!("file {i}: {e}")))?;
    }
    let mut buf = vec![0u8; b.small_file_size.max(1) as usize];
    let start = Instant::now();
    let deadline = start + b.time_limit;
    let mut read = 0;
    while read < made && Instant::now() < deadline {
        let f = open_small(sub(read), read, false)?;
        let mut off = 0;
        loop {
            let n = f.read_at(&mut buf, off)?;
            if n == 0 {
                break;
            }
            off += n as u64;
        }
        read += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(FilesResult {
        files: read,
        file_size: b.small_file_size,
        seconds,
        files_per_second: read as f64 / seconds.max(1e-9),
    })
}

/// The file system type's name and the bytes free to us, of a directory.
pub fn statfs(dir: &Path) -> (String, Option<u64>) {
    let Ok(s) = rustix::fs::statfs(dir) else {
        return ("unknown".into(), None);
    };
    let name = match s.f_type {
        0xEF53 => "ext4",
        0x0102_1994 => "tmpfs",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794C_7630 => "overlay",
        0x6573_5546 => "fuse",
        0x6969 => "nfs",
        0x2FC1_2FC1 => "zfs",
        0x0BD0_0BD0 => "lustre",
        0x4750_4653 => "gpfs",
        0x0027_e0eb => "cgroup",
        _ => "other",
    };
    let free = s.f_bavail.saturating_mul(s.f_bsize as u64);
    (name.into(), Some(free))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(dir: &Path) -> DiskBench {
        DiskBench {
            file_size: 8 << 20,
            block_size: 1 << 20,
            threads: 2,
            files: 50,
            small_file_size: 4096,
            time_limit: Duration::from_secs(30),
            ..DiskBench::new(dir.to_path_buf())
        }
    }

    #[test]
    fn measures_and_cleans_up() {
        let dir = std::env::temp_dir().join(format!("lh-disk-{}", fastrand::u64(..)));
        std::fs::create_dir(&dir).unwrap();
        let r = run(&small(&dir)).unwrap();
        let w = r.write.unwrap();
        let rd = r.read.unwrap();
        assert_eq!(w.bytes, 8 << 20);
        assert_eq!(rd.bytes, 8 << 20);
        assert!(w.bytes_per_second > 0.0 && rd.bytes_per_second > 0.0);
        assert_eq!(r.create.unwrap().files, 50);
        assert_eq!(r.small_read.unwrap().files, 50);
        assert_eq!(r.threads, 2);
        // Nothing is left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn refuses_bad_parameters_and_paths() {
        let dir = std::env::temp_dir();
        let b = DiskBench {
            block_size: 1000,
            ..small(&dir)
        };
        assert!(matches!(run(&b), Err(EngineError::Usage(m)) if m.contains("multiple of 4096")));
        let b = small(Path::new("/nonexistent/longhaul"));
        let e = run(&b).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/longhaul"), "{e}");
    }

    #[test]
    fn a_time_limit_stops_a_test_and_the_read_covers_what_was_written() {
        let dir = std::env::temp_dir().join(format!("lh-disk-{}", fastrand::u64(..)));
        std::fs::create_dir(&dir).unwrap();
        let b = DiskBench {
            time_limit: Duration::ZERO,
            ..small(&dir)
        };
        let r = run(&b).unwrap();
        assert_eq!(r.write.unwrap().bytes, 0);
        assert_eq!(r.read.unwrap().bytes, 0);
        assert_eq!(r.create.unwrap().files, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
