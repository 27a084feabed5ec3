//! Storage behind a small trait, so that the transfer engine can run on a
//! fault-injecting implementation in tests (short writes, ENOSPC at a set
//! point, failing reads) as well as on the local file system.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::beneath::Dir;

/// Positional reads of one open file.
pub trait ReadAt: Send + Sync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// The open file's metadata (fstat): whether it changed while it was read.
    fn metadata(&self) -> io::Result<std::fs::Metadata>;
    /// The metadata as the file was opened: what [`Self::metadata`] said
    /// then, kept where the open took it anyway (one fstat less a file).
    fn metadata_at_open(&self) -> io::Result<std::fs::Metadata> {
        self.metadata()
    }
    /// True if `offset..offset+len` is entirely a hole (reads as zeros
    /// without being stored). False when unsure.
    fn is_hole(&self, _offset: u64, _len: u64) -> bool {
        false
    }
}

/// Positional writes of one open file.
pub trait WriteAt: Send + Sync {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes the written data durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Reserves space for `len` bytes (fallocate); unsupported is not an error.
    fn allocate(&self, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Permission bits, through the open file (fchmod).
    fn set_mode(&self, mode: u32) -> io::Result<()>;
    /// The descriptor, where there is one (for syncfs of a batch).
    fn raw_fd(&self) -> Option<i32> {
        None
    }
    /// Modification time, through the open file (futimens).
    fn set_mtime(&self, mtime_ns: i64) -> io::Result<()>;
    /// The copy will not fdatasync this file (`--no-sync`): nothing waits
    /// for the device, so a file the page cache can hold dirty is written
    /// through it, as other tools write. Called before its size is set; a
    /// resumed partial file, sized as it was opened, keeps the mode that
    /// size gave it.
    fn will_not_sync(&self) {}
}

fn fchmod(f: &File, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

fn futimens(f: &File, mtime_ns: i64) -> io::Result<()> {
    let d = std::time::Duration::from_nanos(mtime_ns.unsigned_abs());
    let t = if mtime_ns >= 0 {
        std::time::UNIX_EPOCH + d
    } else {
        std::time::UNIX_EPOCH - d
    };
    f.set_times(std::fs::FileTimes::new().set_modified(t))
}

/// Where file data lives. Namespace operations (mkdir, rename, times)
/// stay on `std::fs`; the data path, where faults matter, goes here.
pub trait Storage: Send + Sync {
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadAt>>;
    /// Opens a partial file for writing, creating it if needed; `truncate`
    /// empties one left from an earlier run.
    fn open_write(&self, path: &Path, truncate: bool) -> io::Result<Box<dyn WriteAt>>;
    /// A fresh partial file `name` in the open directory `dir`, as
    /// [`Self::open_write`] with `truncate`; by default through the
    /// directory's path.
    fn create_in(&self, dir: &Dir, name: &OsStr) -> io::Result<Box<dyn WriteAt>> {
        self.open_write(&dir.join(name), true)
    }
    /// Whether reads go through the page cache of the local file system,
    /// so that warming it ahead of the readers helps (`xfer::prefetch`).
    fn page_cached(&self) -> bool {
        false
    }
}

/// A file opened for reading, with its metadata from the open.
struct Opened {
    file: File,
    at_open: std::fs::Metadata,
}

impl ReadAt for Opened {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(&self.file, buf, offset)
    }
    fn metadata(&self) -> io::Result<std::fs::Metadata> {
        self.file.metadata()
    }
    fn metadata_at_open(&self) -> io::Result<std::fs::Metadata> {
        Ok(self.at_open.clone())
    }
    fn is_hole(&self, offset: u64, len: u64) -> bool {
        ReadAt::is_hole(&self.file, offset, len)
    }
}

/// Files up to this size are read in one request: no readahead advice.
const ADVISE_ABOVE: u64 = 256 << 10;

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }

    fn metadata(&self) -> io::Result<std::fs::Metadata> {
        File::metadata(self)
    }

    fn is_hole(&self, offset: u64, len: u64) -> bool {
        match rustix::fs::seek(self, rustix::fs::SeekFrom::Data(offset)) {
            Ok(next) => next >= offset.saturating_add(len),
            // ENXIO: no data at or after offset (inside the file: a hole).
            Err(e) => e == rustix::io::Errno::NXIO,
        }
    }
}

impl WriteAt for File {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        FileExt::write_at(self, buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
    fn set_mode(&self, mode: u32) -> io::Result<()> {
        fchmod(self, mode)
    }
    fn raw_fd(&self) -> Option<i32> {
        use std::os::fd::AsRawFd;
        Some(self.as_raw_fd())
    }
    fn set_mtime(&self, mtime_ns: i64) -> io::Result<()> {
        futimens(self, mtime_ns)
    }
    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        // On tmpfs fallocate zero-fills memory up front (0.3 s a GiB here)
        // and there is no fragmentation to avoid: skip it.
        if rustix::fs::fstatfs(self).is_ok_and(|st| st.f_type == libc::TMPFS_MAGIC) {
            return Ok(());
        }
        match rustix::fs::fallocate(self, rustix::fs::FallocateFlags::empty(), 0, len) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// The local file system.
pub struct Local;

impl Storage for Local {
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadAt>> {
        let (file, at_open) = open_regular_with(path, OpenOptions::new().read(true))?;
        if at_open.len() >= DIRECT_MIN
            && auto_direct()
            && direct_pays(&file)
            && !mostly_cached(&file, at_open.len())
        {
            return Ok(Box::new(DirectFile {
                direct: reopen_direct(&file, false).ok(),
                plain: file,
                at_open: Some(at_open),
            }));
        }
        // Files are read front to back (chunks in order, a few streams
        // apart): ask for the larger readahead of a sequential reader.
        if at_open.len() > ADVISE_ABOVE {
            let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Sequential);
        }
        Ok(Box::new(Opened { file, at_open }))
    }

    fn open_write(&self, path: &Path, truncate: bool) -> io::Result<Box<dyn WriteAt>> {
        let file = open_part(path, truncate)?;
        let out = Written::new(file);
        if !truncate {
            // A resumed partial file has its size already.
            out.sized(out.plain.metadata()?.len());
        }
        Ok(Box::new(out))
    }

    fn create_in(&self, dir: &Dir, name: &OsStr) -> io::Result<Box<dyn WriteAt>> {
        Ok(Box::new(Written::new(create_part_in(dir, name)?)))
    }

    fn page_cached(&self) -> bool {
        true
    }
}

/// [`open_part`] of a fresh partial file, relative to its directory's
/// descriptor: no walk of the `/proc/self/fd` path on every file.
fn create_part_in(dir: &Dir, name: &OsStr) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let create = || {
        rustix::fs::openat(
            dir.fd(),
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
    };
    let fd = match create() {
        Err(rustix::io::Errno::EXIST) => {
            rustix::fs::unlinkat(dir.fd(), name, rustix::fs::AtFlags::empty())?;
            create()?
        }
        r => r?,
    };
    Ok(File::from(fd))
}

/// The local file system with O_DIRECT (`--direct`): data moves between
/// the device and our buffers without the page cache. O_DIRECT needs the
/// buffer, offset and length aligned to the device's logical block, so
/// each file has two open descriptions of the same inode: aligned requests
/// go through the direct one, the rest (a file's unaligned tail, odd chunk
/// sizes) through a buffered one. File systems without O_DIRECT fall back
/// to buffered I/O, with a warning once.
pub struct Direct;

/// What O_DIRECT requests are aligned to: 4 KiB covers 512-byte and
/// 4 KiB logical blocks.
pub const DIRECT_ALIGN: usize = 4096;

struct DirectFile {
    plain: File,
    direct: Option<File>,
    /// The metadata the open took, where it was kept.
    at_open: Option<std::fs::Metadata>,
}

impl DirectFile {
    fn new(plain: File, write: bool) -> DirectFile {
        let direct = match reopen_direct(&plain, write) {
            Ok(f) => Some(f),
            Err(e) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    tracing::warn!(
                        "--direct: O_DIRECT is not available here ({e}); using buffered I/O"
                    )
                });
                None
            }
        };
        DirectFile {
            plain,
            direct,
            at_open: None,
        }
    }

    /// The descriptor for a request: direct if it is aligned.
    fn pick(&self, ptr: *const u8, len: usize, offset: u64) -> &File {
        match &self.direct {
            Some(d)
                if (ptr as usize) % DIRECT_ALIGN == 0
                    && len % DIRECT_ALIGN == 0
                    && offset % DIRECT_ALIGN as u64 == 0 =>
            {
                d
            }
            _ => &self.plain,
        }
    }
}

/// The inode open as `plain` opened again with O_DIRECT: through its /proc
/// magic link, not its path, which could have been swapped meanwhile.
fn reopen_direct(plain: &File, write: bool) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let link = format!("/proc/self/fd/{}", plain.as_raw_fd());
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(&link)
}

impl ReadAt for DirectFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self.pick(buf.as_ptr(), buf.len(), offset), buf, offset)
    }
    fn metadata(&self) -> io::Result<std::fs::Metadata> {
        self.plain.metadata()
    }
    fn metadata_at_open(&self) -> io::Result<std::fs::Metadata> {
        match &self.at_open {
            Some(m) => Ok(m.clone()),
            None => self.plain.metadata(),
        }
    }
    fn is_hole(&self, offset: u64, len: u64) -> bool {
        ReadAt::is_hole(&self.plain, offset, len)
    }
}

impl WriteAt for DirectFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        FileExt::write_at(self.pick(buf.as_ptr(), buf.len(), offset), buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.plain.set_len(len)
    }
    fn set_mode(&self, mode: u32) -> io::Result<()> {
        fchmod(&self.plain, mode)
    }
    fn raw_fd(&self) -> Option<i32> {
        use std::os::fd::AsRawFd;
        Some(self.plain.as_raw_fd())
    }
    fn set_mtime(&self, mtime_ns: i64) -> io::Result<()> {
        futimens(&self.plain, mtime_ns)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.plain.sync_data()
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        WriteAt::allocate(&self.plain, len)
    }
}

impl Storage for Direct {
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadAt>> {
        let plain = open_regular(path, OpenOptions::new().read(true))?;
        Ok(Box::new(DirectFile::new(plain, false)))
    }

    fn open_write(&self, path: &Path, truncate: bool) -> io::Result<Box<dyn WriteAt>> {
        Ok(Box::new(DirectFile::new(open_part(path, truncate)?, true)))
    }
}

/// Files from this size up move with O_DIRECT where it pays (the local
/// file system's default, [`Local`]): their big aligned pieces go between
/// the device and our buffers without the page cache, which saves the
/// kernel's copy and the cache's allocation and reclaim (on this project's
/// virtio disk a cold 4 GiB copy took half the CPU and a quarter of the
/// time; BENCHMARKS.md, issue 45). Smaller files stay buffered: they are
/// few bytes, and the cache serves their neighbours. So does a file a copy
/// will not sync while the page cache can hold it dirty: nothing waits for
/// the device then, and a direct write would (a 256 MiB elephant on
/// loopback went at 0.57-0.69x the rate; BENCHMARKS.md, issue 46 session g).
pub const DIRECT_MIN: u64 = 8 << 20;

/// Whether [`Local`] may choose O_DIRECT: `LONGHAUL_DIRECT=off` keeps
/// every file buffered (to compare the two; `--direct` forces it).
fn auto_direct() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LONGHAUL_DIRECT").map_or(true, |v| v != "off"))
}

/// Whether O_DIRECT pays on `f`'s file system: local block file systems
/// whose direct path is the device's (ext4, XFS). Not tmpfs (memory
/// either way), network or FUSE file systems (their direct I/O is a round
/// trip per request, or means something else), nor ones not known here.
fn direct_pays(f: &File) -> bool {
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    // `f_type`'s width and sign differ between architectures (i64 here).
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::fstatfs(f).is_ok_and(|st| matches!(st.f_type as i64, EXT4 | XFS))
}

/// Whether most of the head of `f` (its first 64 MiB) is in the page
/// cache, so that reading it buffered costs one copy and no device read
/// (cachestat(2), Linux 6.5; unknown counts as cached: buffered, as
/// before). Dirty pages count as cached: a direct read would flush them.
fn mostly_cached(f: &File, len: u64) -> bool {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    // The syscall's number in the table every 64-bit architecture shares
    // since Linux 6.5; neither libc nor rustix names it yet.
    const SYS_CACHESTAT: libc::c_long = 451;
    let head = len.min(64 << 20);
    let range = Range { off: 0, len: head };
    let mut st = Stat::default();
    // SAFETY: cachestat reads `range` and writes `st`, both live and of
    // the kernel's layout; the descriptor is open.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            f.as_raw_fd(),
            &range as *const Range,
            &mut st as *mut Stat,
            0,
        )
    };
    r != 0 || st.nr_cache * 4096 >= head / 2
}

/// A partial file of [`Local`]: buffered, and once it is known to be
/// big (sized at [`DIRECT_MIN`] or more, on a file system where it
/// pays, and, for a copy that does not sync, more than the page cache can
/// hold dirty without holding the writer to the device's pace), its
/// aligned pieces go through a second, O_DIRECT description of the same
/// inode, opened at the first such piece.
struct Written {
    plain: File,
    big: std::sync::atomic::AtomicBool,
    unsynced: std::sync::atomic::AtomicBool,
    direct: std::sync::OnceLock<Option<File>>,
}

impl Written {
    fn new(plain: File) -> Written {
        Written {
            plain,
            big: std::sync::atomic::AtomicBool::new(false),
            unsynced: std::sync::atomic::AtomicBool::new(false),
            direct: std::sync::OnceLock::new(),
        }
    }

    /// The file will be `len` bytes: big enough for O_DIRECT?
    fn sized(&self, len: u64) {
        if len >= DIRECT_MIN
            && !self.big.load(Ordering::Relaxed)
            && auto_direct()
            && direct_pays(&self.plain)
            && !(self.unsynced.load(Ordering::Relaxed) && super::dirty::fits(len))
        {
            self.big.store(true, Ordering::Relaxed);
        }
    }

    /// The descriptor for a write: the direct one for a big file's aligned
    /// piece (at least 64 KiB), else the buffered one.
    fn pick(&self, buf: &[u8], offset: u64) -> &File {
        if !self.direct_piece(buf, offset) {
            return &self.plain;
        }
        let direct = self
            .direct
            .get_or_init(|| reopen_direct(&self.plain, true).ok());
        direct.as_ref().unwrap_or(&self.plain)
    }
}

impl Written {
    /// A big file's aligned piece of at least 64 KiB.
    fn direct_piece(&self, buf: &[u8], offset: u64) -> bool {
        (buf.as_ptr() as usize) % DIRECT_ALIGN == 0
            && buf.len() % DIRECT_ALIGN == 0
            && buf.len() >= 64 << 10
            && offset % DIRECT_ALIGN as u64 == 0
            && self.big.load(Ordering::Relaxed)
    }
}

impl WriteAt for Written {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        FileExt::write_at(self.pick(buf, offset), buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.sized(len);
        self.plain.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.plain.sync_data()
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        WriteAt::allocate(&self.plain, len)
    }
    fn set_mode(&self, mode: u32) -> io::Result<()> {
        fchmod(&self.plain, mode)
    }
    fn raw_fd(&self) -> Option<i32> {
        WriteAt::raw_fd(&self.plain)
    }
    fn set_mtime(&self, mtime_ns: i64) -> io::Result<()> {
        futimens(&self.plain, mtime_ns)
    }
    fn will_not_sync(&self) {
        self.unsynced.store(true, Ordering::Relaxed);
    }
}

/// A buffer of `len` bytes whose start is aligned for O_DIRECT, carved out
/// of a slightly larger vector (no unsafe code).
pub struct AlignedBuf {
    vec: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let vec = vec![0u8; len + DIRECT_ALIGN];
        let start = vec.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf { vec, start, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.vec[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.vec[self.start..self.start + self.len]
    }
}

/// Opens an existing regular file, never through a symlink, and never
/// blocking on a FIFO or device planted under its name: opened
/// non-blocking, checked with fstat, then switched back to blocking.
pub fn open_regular(path: &Path, how: &mut OpenOptions) -> io::Result<File> {
    open_regular_with(path, how).map(|(f, _)| f)
}

/// [`open_regular`], with the metadata it checked.
fn open_regular_with(path: &Path, how: &mut OpenOptions) -> io::Result<(File, std::fs::Metadata)> {
    let f = how
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    // The status flags F_SETFL changes are all ours to know (none of
    // O_APPEND, O_DIRECT, O_NOATIME, O_ASYNC was asked for): clear
    // O_NONBLOCK without reading them first.
    let _ = rustix::fs::fcntl_setfl(&f, rustix::fs::OFlags::empty());
    Ok((f, m))
}

/// Opens a partial file, private to us and never through a symlink. A
/// fresh one (`truncate`) is always a new inode: whatever had its name (a
/// partial file of an earlier run that a late writer may still hold, a
/// hard link to another file, a FIFO) is unlinked, not written through.
/// An existing one is resumed only if it is a regular file with no other
/// name.
fn open_part(path: &Path, truncate: bool) -> io::Result<File> {
    let create = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    };
    if truncate {
        // Usually nothing has the name: one exclusive create. Otherwise
        // whatever has it is unlinked first, never opened.
        return match create() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(path)?;
                create()
            }
            r => r,
        };
    }
    match open_regular(path, OpenOptions::new().read(true).write(true)) {
        Ok(f) if f.metadata()?.nlink() == 1 => Ok(f),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} has other names (hard links): not resumed",
                path.display()
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => create(),
        Err(e) => Err(e),
    }
}

/// Faults to inject, shared by every file a [`Faulty`] storage opens.
#[derive(Debug, Default)]
pub struct Faults {
    /// Writes give at most this many bytes at a time (short writes).
    pub short_write: Option<usize>,
    /// Bytes that may be written in all before writes fail with ENOSPC.
    pub space_left: Option<AtomicU64>,
    /// Reads whose file path contains this string fail with EIO.
    pub fail_reads_of: Option<String>,
    /// Every write first sleeps this long (a slow disk).
    pub write_delay: Option<std::time::Duration>,
}

/// A storage that injects [`Faults`] into the local file system.
pub struct Faulty {
    pub faults: Arc<Faults>,
}

struct FaultyRead(File);

impl ReadAt for FaultyRead {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(&self.0, buf, offset)
    }
    fn metadata(&self) -> io::Result<std::fs::Metadata> {
        self.0.metadata()
    }
}

struct FaultyWrite {
    file: File,
    faults: Arc<Faults>,
}

impl WriteAt for FaultyWrite {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        if let Some(d) = self.faults.write_delay {
            std::thread::sleep(d);
        }
        let mut n = buf.len();
        if let Some(max) = self.faults.short_write {
            n = n.min(max.max(1));
        }
        if let Some(left) = &self.faults.space_left {
            let take = left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
                    Some(l.saturating_sub(n as u64))
                })
                .expect("closure never fails");
            if take == 0 && n > 0 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            n = n.min(take as usize);
        }
        FileExt::write_at(&self.file, &buf[..n], offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn set_mode(&self, mode: u32) -> io::Result<()> {
        fchmod(&self.file, mode)
    }
    fn set_mtime(&self, mtime_ns: i64) -> io::Result<()> {
        futimens(&self.file, mtime_ns)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

impl Storage for Faulty {
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadAt>> {
        if let Some(bad) = &self.faults.fail_reads_of {
            if path.to_string_lossy().contains(bad.as_str()) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        Ok(Box::new(FaultyRead(open_regular(
            path,
            OpenOptions::new().read(true),
        )?)))
    }

    fn open_write(&self, path: &Path, truncate: bool) -> io::Result<Box<dyn WriteAt>> {
        Ok(Box::new(FaultyWrite {
            file: open_part(path, truncate)?,
            faults: self.faults.clone(),
        }))
    }
}

/// Writes all of `buf` at `offset`, through short writes.
pub fn write_all_at(f: &dyn WriteAt, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match f.write_at(buf, offset) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes at `offset`; a file that got shorter is an error.
pub fn read_exact_at(f: &dyn ReadAt, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match f.read_at(buf, offset) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file is shorter than announced (changed during the transfer?)",
                ))
            }
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_storage_round_trips_aligned_and_unaligned_requests() {
        let dir = std::env::temp_dir().join(format!("lh-direct-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        let mut data = AlignedBuf::new(3 * DIRECT_ALIGN);
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let w = Direct.open_write(&p, true).unwrap();
        // Aligned (direct where the file system allows), then an unaligned
        // tail and an unaligned rewrite in the middle (buffered).
        write_all_at(&*w, &data[..2 * DIRECT_ALIGN], 0).unwrap();
        write_all_at(&*w, &data[..100], 2 * DIRECT_ALIGN as u64).unwrap();
        write_all_at(&*w, b"xyz", 10).unwrap();
        w.sync_data().unwrap();
        drop(w);
        let mut want = data[..2 * DIRECT_ALIGN].to_vec();
        want.extend_from_slice(&data[..100]);
        want[10..13].copy_from_slice(b"xyz");
        assert_eq!(std::fs::read(&p).unwrap(), want);
        let r = Direct.open_read(&p).unwrap();
        let mut back = AlignedBuf::new(2 * DIRECT_ALIGN);
        read_exact_at(&*r, &mut back, 0).unwrap();
        assert_eq!(&back[..], &want[..2 * DIRECT_ALIGN]);
        let mut tail = [0u8; 100];
        read_exact_at(&*r, &mut tail, 2 * DIRECT_ALIGN as u64).unwrap();
        assert_eq!(&tail[..], &want[2 * DIRECT_ALIGN..]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Evicts `p`'s clean pages from the page cache (no root needed).
    fn evict(p: &Path) {
        let f = File::open(p).unwrap();
        f.sync_all().unwrap();
        let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
    }

    /// A big file through the local file system's default: direct where
    /// it pays (sized big, aligned pieces; read back out of cache), the
    /// unaligned tail and a rewrite buffered; every byte as written.
    #[test]
    fn big_files_round_trip_through_local_whatever_the_io() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("big");
        const PIECE: usize = 512 << 10;
        let len = DIRECT_MIN as usize + PIECE + 1000;
        let want: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4096) as u8).collect();
        let w = Local.open_write(&p, true).unwrap();
        w.set_len(len as u64).unwrap();
        let mut buf = AlignedBuf::new(PIECE);
        for off in (0..len).step_by(PIECE) {
            let n = PIECE.min(len - off);
            buf[..n].copy_from_slice(&want[off..off + n]);
            write_all_at(&*w, &buf[..n], off as u64).unwrap();
        }
        // A piece written again (a resend), with the same bytes.
        buf.copy_from_slice(&want[PIECE..2 * PIECE]);
        write_all_at(&*w, &buf, PIECE as u64).unwrap();
        w.sync_data().unwrap();
        drop(w);
        assert_eq!(std::fs::read(&p).unwrap(), want);
        evict(&p);
        let r = Local.open_read(&p).unwrap();
        assert_eq!(r.metadata_at_open().unwrap().len(), len as u64);
        let mut back = vec![0u8; len];
        for off in (0..len).step_by(PIECE) {
            let n = PIECE.min(len - off);
            read_exact_at(&*r, &mut buf[..n], off as u64).unwrap();
            back[off..off + n].copy_from_slice(&buf[..n]);
        }
        assert!(back == want, "read back differs");
    }

    /// A big file a copy will not sync stays in the page cache while that
    /// can hold it dirty; one it syncs takes O_DIRECT where that pays.
    #[test]
    fn a_file_not_synced_that_the_cache_can_hold_is_written_through_it() {
        let t = tempfile::tempdir().unwrap();
        const PIECE: usize = crate::xfer::PIECE;
        let len = DIRECT_MIN as usize + (1 << 20);
        let mut buf = AlignedBuf::new(PIECE);
        buf.fill(7);
        let took_direct = |name: &str, unsynced: bool| {
            let w = Written::new(open_part(&t.path().join(name), true).unwrap());
            if unsynced {
                w.will_not_sync();
            }
            WriteAt::set_len(&w, len as u64).unwrap();
            for off in (0..len).step_by(PIECE) {
                let n = PIECE.min(len - off);
                write_all_at(&w, &buf[..n], off as u64).unwrap();
            }
            let pays = auto_direct() && direct_pays(&w.plain);
            (w.direct.get().is_some_and(|d| d.is_some()), pays)
        };
        let (synced, pays) = took_direct("synced", false);
        assert_eq!(synced, pays, "a synced big file: O_DIRECT where it pays");
        let fits = crate::xfer::dirty::fits(len as u64);
        let (unsynced, _) = took_direct("unsynced", true);
        assert_eq!(
            unsynced,
            pays && !fits,
            "a file not synced: buffered while the cache can hold it"
        );
    }

    /// A big file with a hole and pieces of odd sizes (most unaligned),
    /// read back cold while it grows: every byte as written, the hole
    /// zeros (and still a hole where the file system keeps them), the
    /// bytes added after the open readable; O_DIRECT taken exactly where
    /// it pays.
    #[test]
    fn odd_pieces_holes_and_a_growing_file_through_local() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("odd");
        const MIB: usize = 1 << 20;
        const ODD: usize = MIB + 123;
        let (hole, tail) = (
            4 * MIB..6 * MIB,
            6 * MIB..DIRECT_MIN as usize + 3 * MIB + 777,
        );
        let len = tail.end;
        let mut want: Vec<u8> = (0..len).map(|i| (i * 13 + i / 4099) as u8).collect();
        want[hole.clone()].fill(0);
        let w = Written::new(open_part(&p, true).unwrap());
        WriteAt::set_len(&w, len as u64).unwrap();
        let mut buf = AlignedBuf::new(ODD);
        for off in (0..hole.start).step_by(MIB) {
            buf[..MIB].copy_from_slice(&want[off..off + MIB]);
            write_all_at(&w, &buf[..MIB], off as u64).unwrap();
        }
        for off in tail.clone().step_by(ODD) {
            let n = ODD.min(len - off);
            buf[..n].copy_from_slice(&want[off..off + n]);
            write_all_at(&w, &buf[..n], off as u64).unwrap();
        }
        let pays = auto_direct() && direct_pays(&w.plain);
        let took_direct = w.direct.get().is_some_and(|d| d.is_some());
        assert_eq!(
            took_direct, pays,
            "O_DIRECT where it does not pay, or not where it does"
        );
        WriteAt::sync_data(&w).unwrap();
        drop(w);
        assert!(std::fs::read(&p).unwrap() == want, "written bytes differ");
        if pays {
            let f = File::open(&p).unwrap();
            assert!(
                ReadAt::is_hole(&f, hole.start as u64, hole.len() as u64),
                "hole filled"
            );
        }
        evict(&p);
        let r = Local.open_read(&p).unwrap();
        let grown = b"appended after the open";
        {
            use std::io::Write;
            let mut a = OpenOptions::new().append(true).open(&p).unwrap();
            a.write_all(grown).unwrap();
        }
        want.extend_from_slice(grown);
        assert_eq!(r.metadata_at_open().unwrap().len(), len as u64);
        let mut back = vec![0u8; want.len()];
        let mut read = AlignedBuf::new(MIB);
        for off in (0..want.len()).step_by(MIB) {
            let n = MIB.min(want.len() - off);
            // The last request is aligned too, past the end (as a chunk
            // reader's may be): short, and direct where the rest was.
            let asked = n.next_multiple_of(DIRECT_ALIGN);
            let mut got = 0;
            while got < n {
                let k = r
                    .read_at(&mut read[got..asked], (off + got) as u64)
                    .unwrap();
                assert!(k > 0, "end of file at {} of {}", off + got, want.len());
                got += k;
            }
            assert_eq!(got, n);
            back[off..off + n].copy_from_slice(&read[..n]);
        }
        assert!(back == want, "read back differs");
    }

    #[test]
    fn the_cache_check_sees_a_file_in_cache_and_out_of_it() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, vec![7u8; 4 << 20]).unwrap();
        let f = File::open(&p).unwrap();
        // Just written: in the cache (or cachestat unknown: taken as cached).
        assert!(mostly_cached(&f, 4 << 20));
        evict(&p);
        if rustix::fs::fstatfs(&f).is_ok_and(|st| st.f_type != libc::TMPFS_MAGIC)
            && probe_cachestat(&f)
        {
            assert!(!mostly_cached(&f, 4 << 20), "evicted, still seen cached");
        }
    }

    /// Whether this kernel has cachestat(2) (Linux 6.5).
    fn probe_cachestat(f: &File) -> bool {
        use std::os::fd::AsRawFd;
        let range = [0u64, 4096];
        let mut st = [0u64; 5];
        // SAFETY: as in `mostly_cached`.
        unsafe { libc::syscall(451, f.as_raw_fd(), range.as_ptr(), st.as_mut_ptr(), 0) == 0 }
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [1, 4096, 512 << 10] {
            let b = AlignedBuf::new(len);
            assert_eq!(b.as_ptr() as usize % DIRECT_ALIGN, 0);
            assert_eq!(b.len(), len);
        }
    }

    #[test]
    fn short_writes_and_enospc() {
        let dir = std::env::temp_dir().join(format!("lh-storage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let faults = Arc::new(Faults {
            short_write: Some(3),
            space_left: Some(AtomicU64::new(10)),
            fail_reads_of: None,
            write_delay: None,
        });
        let s = Faulty { faults };
        let p = dir.join("f");
        let w = s.open_write(&p, true).unwrap();
        write_all_at(&*w, b"abcdefgh", 0).unwrap();
        let e = write_all_at(&*w, b"ijklmnop", 8).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(std::fs::read(&p).unwrap(), b"abcdefghij");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
