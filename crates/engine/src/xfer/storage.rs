//! Storage behind a small trait, so that the transfer engine can run on a
//! fault-injecting implementation in tests (short writes, ENOSPC at a set
//! point, failing reads) as well as on the local file system.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Positional reads of one open file.
pub trait ReadAt: Send + Sync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
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
}

/// Where file data lives. Namespace operations (mkdir, rename, times)
/// stay on `std::fs`; the data path, where faults matter, goes here.
pub trait Storage: Send + Sync {
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadAt>>;
    /// Opens a partial file for writing, creating it if needed; `truncate`
    /// empties one left from an earlier run.
    fn open_write(&self, path: &Path, truncate: bool) -> io::Result<Box<dyn WriteAt>>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }

    fn is_hole(&self, offset: u64, len: u64) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: lseek on a descriptor we own; SEEK_DATA only moves our offset.
        let next = unsafe { libc::lseek(self.as_raw_fd(), offset as libc::off_t, libc::SEEK_DATA) };
        if next < 0 {
            // ENXIO: no data at or after offset (inside the file: a hole).
            return io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
        }
        next as u64 >= offset.saturating_add(len)
    }
}

impl WriteAt for File {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        FileExt::write_at(self, buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // On tmpfs fallocate zero-fills memory up front (0.3 s a GiB here)
        // and there is no fragmentation to avoid: skip it.
        // SAFETY: statfs is plain data, filled by fstatfs on our descriptor.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstatfs(self.as_raw_fd(), &mut st) } == 0
            && st.f_type == libc::TMPFS_MAGIC
        {
            return Ok(());
        }
        // SAFETY: plain fallocate on a descriptor we own.
        let r = unsafe { libc::fallocate(self.as_raw_fd(), 0, 0, len as libc::off_t) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP | libc::ENOSYS) => Ok(()),
            _ => Err(e),
        }
    }
}

/// The local file system.
pub struct Local;

impl Storage for Local {
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadAt>> {
        Ok(Box::new(
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)?,
        ))
    }

    fn open_write(&self, path: &Path, truncate: bool) -> io::Result<Box<dyn WriteAt>> {
        Ok(Box::new(open_part(path, truncate)?))
    }
}

/// Opens (or creates, private to us) a partial file, never through a symlink.
fn open_part(path: &Path, truncate: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(truncate)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
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
        Ok(Box::new(FaultyRead(File::open(path)?)))
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
