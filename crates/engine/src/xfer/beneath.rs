//! Race-free confinement of the paths a peer names.
//!
//! Lexical checks ([`longhaul_proto::xfer::components`]) refuse `..`,
//! absolute paths, NUL bytes and over-long names. What they cannot see is
//! the file system: a symbolic link in the export, or one swapped in for a
//! directory after a check. So every directory a transfer touches is
//! opened from an [`Anchor`] (the export root, or a client's destination)
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)`, one component at a time when it must create
//! them, and used afterwards only through its descriptor
//! (`/proc/self/fd/N/NAME`): the kernel resolves that to the very
//! directory that was checked, whatever happens to the path since. Final
//! components are never followed (O_NOFOLLOW, rename, unlink, lstat).

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::EngineError;

/// An open directory beneath an anchor.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// Its file system's device, once asked for.
    dev: std::sync::OnceLock<Option<u64>>,
    /// What its file system is, once asked for.
    fs_kind: std::sync::OnceLock<FsKind>,
}

/// The file systems whose kind changes what the sink does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FsKind {
    Tmpfs,
    /// ext4 (or ext2) with no journal, or whose journal could not be found.
    Ext4WithoutJournal,
    /// Anything else, a journalled ext4 too.
    Other,
}

impl Dir {
    /// A path that names this directory itself, whatever its path is now.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    fn new(fd: OwnedFd) -> Dir {
        Dir {
            fd,
            dev: std::sync::OnceLock::new(),
            fs_kind: std::sync::OnceLock::new(),
        }
    }

    /// Whether files made in it live in memory only (tmpfs): making them
    /// durable is a no-op there. Asked of the kernel once.
    pub fn in_memory(&self) -> bool {
        self.fs_kind() == FsKind::Tmpfs
    }

    /// Whether its file system is an ext4 without a journal, whose inode
    /// allocator wants one create at a time (the sink's `one_create`).
    pub fn on_ext4_without_journal(&self) -> bool {
        self.fs_kind() == FsKind::Ext4WithoutJournal
    }

    /// What its file system is, asked of the kernel once. An ext4 counts
    /// as journalled only if its journal is found
    /// ([`ext4_journalled`]): where that cannot be told, creates stay one
    /// at a time, as on every ext4 before.
    fn fs_kind(&self) -> FsKind {
        *self
            .fs_kind
            .get_or_init(|| match rustix::fs::fstatfs(&self.fd) {
                Ok(st) if st.f_type == libc::TMPFS_MAGIC => FsKind::Tmpfs,
                Ok(st) if st.f_type == libc::EXT4_SUPER_MAGIC => match self.dev() {
                    Some(dev) if ext4_journalled(dev) => FsKind::Other,
                    _ => FsKind::Ext4WithoutJournal,
                },
                _ => FsKind::Other,
            })
    }

    /// The device of its file system (and so of every file made in it),
    /// asked of the kernel once.
    pub fn dev(&self) -> Option<u64> {
        *self
            .dev
            .get_or_init(|| rustix::fs::fstat(&self.fd).ok().map(|st| st.st_dev))
    }

    /// Its descriptor (`O_PATH`), for `*at` calls relative to it.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// A path to `name` inside this directory.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path().join(name)
    }

    /// The subdirectory `name` (one component), never through a symbolic
    /// link; not kept in any cache (for walks that visit each once).
    pub fn child(&self, name: &std::ffi::OsStr) -> io::Result<Dir> {
        let c = CString::new(name.as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if name.as_bytes().contains(&b'/') || name == ".." || name == "." {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let fd = rustix::fs::openat(
            &self.fd,
            c.as_c_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Dir::new(fd))
    }
}

/// Whether the ext4 on the block device `dev` has a journal that jbd2
/// runs, looked up once per device in this process ([`journal_found`]
/// under `/proc` and `/sys`); false if that cannot be told.
fn ext4_journalled(dev: u64) -> bool {
    static KNOWN: Mutex<Option<HashMap<u64, bool>>> = Mutex::new(None);
    let mut known = KNOWN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *known
        .get_or_insert_with(HashMap::new)
        .entry(dev)
        .or_insert_with(|| {
            journal_found(dev, Path::new("/proc"), Path::new("/sys")).unwrap_or(false)
        })
}

/// Whether jbd2 runs a journal for the block device `dev`, from the
/// kernel's tables under `proc` and `sys` (`/proc`, `/sys`). jbd2 makes
/// `/proc/fs/jbd2/NAME-INODE` for each journal inside a file system it
/// runs (fs/jbd2/journal.c, `jbd2_journal_init_inode`: `"%pg-%lu"`, the
/// device's kernel name with `/` written `!`, then the journal's inode, 8
/// for ext4's own), and removes it at unmount. The device's kernel name is
/// its `DEVNAME` in `/sys/dev/block/MAJOR:MINOR/uevent`, or else the name
/// of that link's target. None if either table is missing (no procfs, a
/// device /sys does not know). A journal on a device of its own is listed
/// under that device's name alone, so such an ext4 reads as having none.
fn journal_found(dev: u64, proc: &Path, sys: &Path) -> Option<bool> {
    let block = sys.join(format!(
        "dev/block/{}:{}",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    ));
    let from_uevent = std::fs::read_to_string(block.join("uevent"))
        .ok()
        .and_then(|u| {
            u.lines()
                .find_map(|l| l.strip_prefix("DEVNAME="))
                .map(|n| n.trim().to_string())
        });
    let name = match from_uevent {
        Some(n) if !n.is_empty() => n,
        _ => std::fs::read_link(&block)
            .ok()?
            .file_name()?
            .to_str()?
            .to_string(),
    }
    .replace('/', "!");
    let journals = std::fs::read_dir(proc.join("fs/jbd2")).ok()?;
    Some(journals.flatten().any(|e| {
        e.file_name().to_str().is_some_and(|n| {
            n.strip_prefix(name.as_str())
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|ino| !ino.is_empty() && ino.bytes().all(|b| b.is_ascii_digit()))
        })
    }))
}

/// A directory under which every path of a transfer must stay.
#[derive(Debug)]
pub struct Anchor {
    root: PathBuf,
    /// The root as messages name it: the export's name on a server (a
    /// peer never learns the server's absolute paths), the root itself
    /// on a client.
    shown: PathBuf,
    dir: Arc<Dir>,
    cache: Mutex<HashMap<PathBuf, Arc<Dir>>>,
}

/// Directories kept open per anchor before the cache starts over (files
/// in flight keep theirs open anyway).
const CACHE_MAX: usize = 1024;

/// Symbolic links one named path may pass through (Linux's own limit).
const MAX_LINKS: u32 = 40;

impl Anchor {
    /// Opens `root` (trusted: configuration or the user's own choice).
    pub fn open(root: &Path) -> Result<Anchor, EngineError> {
        Self::open_as(root, root)
    }

    /// Opens `root`, naming it `shown` in every message (an export's
    /// name: see [`Anchor::show`]).
    pub fn open_as(root: &Path, shown: &Path) -> Result<Anchor, EngineError> {
        let c = CString::new(root.as_os_str().as_bytes())
            .map_err(|_| EngineError::Usage(format!("{} contains a NUL byte", shown.display())))?;
        let fd = rustix::fs::open(
            c.as_c_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            EngineError::Usage(format!(
                "cannot open {}: {}",
                shown.display(),
                io::Error::from(e)
            ))
        })?;
        Ok(Anchor {
            root: root.to_path_buf(),
            shown: shown.to_path_buf(),
            dir: Arc::new(Dir::new(fd)),
            cache: Mutex::new(HashMap::new()),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `path` (beneath the root) as messages name it: under the shown
    /// root. The one place a sink's error names a path, so that a server's
    /// absolute paths never reach a peer; a path elsewhere is shown by its
    /// last component only.
    pub fn show(&self, path: &Path) -> PathBuf {
        match path.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => self.shown.clone(),
            Ok(rel) => self.shown.join(rel),
            Err(_) => PathBuf::from(path.file_name().unwrap_or_default()),
        }
    }

    /// Whether the directory `dir` (beneath `within`, itself beneath the
    /// root) is gone, rather than reached through a link: an ancestor of
    /// it within `within` opens without following a link, and the next
    /// component is not in it at all (not a link, not anything). A fleet's
    /// share (local, `fleet::confine`, or a third-party order's) passes a
    /// directory removed since its manifest, which the push then reports
    /// missing.
    pub fn gone(&self, within: &Path, dir: &Path) -> bool {
        let mut child = dir;
        while let Some(parent) = child.parent() {
            if !parent.starts_with(within) {
                return false;
            }
            if let Ok(d) = self.dir(parent, false) {
                return child.file_name().is_some_and(|name| {
                    std::fs::symlink_metadata(d.join(name))
                        .is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
                });
            }
            child = parent;
        }
        false
    }

    /// Opens the directory `dir` (a path beneath the root), creating
    /// missing components if `create`, never through a symbolic link.
    pub fn dir(&self, dir: &Path, create: bool) -> Result<Arc<Dir>, EngineError> {
        let rel = dir.strip_prefix(&self.root).map_err(|_| {
            EngineError::Usage(format!(
                "{} is outside {}",
                self.show(dir).display(),
                self.shown.display()
            ))
        })?;
        if rel.as_os_str().is_empty() {
            return Ok(self.dir.clone());
        }
        if let Some(d) = self.cache.lock().expect("poisoned").get(rel) {
            return Ok(d.clone());
        }
        let explain = |e: io::Error, at: &Path| -> EngineError {
            let at = self.show(at);
            EngineError::Usage(match e.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::EXDEV) => format!(
                    "refusing to go through the symbolic link in {}",
                    at.display()
                ),
                Some(libc::ENOTDIR) => format!("{} is not a directory", at.display()),
                _ => format!("cannot open directory {}: {e}", at.display()),
            })
        };
        let d = match open_beneath(&self.dir.fd, rel) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create => {
                // One level at a time, each made then opened beneath the last.
                let mut cur: Option<OwnedFd> = None;
                let mut at = self.root.clone();
                for c in rel.components() {
                    let Component::Normal(name) = c else {
                        return Err(EngineError::Usage(format!(
                            "refusing the path {}",
                            self.show(dir).display()
                        )));
                    };
                    at.push(name);
                    let parent = cur.as_ref().unwrap_or(&self.dir.fd);
                    let cname = CString::new(name.as_bytes()).map_err(|_| {
                        EngineError::Usage(format!(
                            "{} contains a NUL byte",
                            self.show(&at).display()
                        ))
                    })?;
                    let r = rustix::fs::mkdirat(parent, cname.as_c_str(), Mode::from(0o777));
                    if let Err(e) = r {
                        let e = io::Error::from(e);
                        if e.raw_os_error() != Some(libc::EEXIST) {
                            return Err(EngineError::Usage(format!(
                                "cannot create directory {}: {e}",
                                self.show(&at).display()
                            )));
                        }
                    }
                    let next =
                        open_beneath(parent, Path::new(name)).map_err(|e| explain(e, &at))?;
                    cur = Some(next);
                }
                cur.expect("rel has a component")
            }
            Err(e) => return Err(explain(e, dir)),
        };
        let d = Arc::new(Dir::new(d));
        let mut cache = self.cache.lock().expect("poisoned");
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(rel.to_path_buf(), d.clone());
        Ok(d)
    }

    /// The directory holding `path`, opened beneath the root (made if
    /// `create`), and `path`'s name in it.
    pub fn parent_of(
        &self,
        path: &Path,
        create: bool,
    ) -> Result<(Arc<Dir>, std::ffi::OsString), EngineError> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(EngineError::Usage(format!(
                "{} names no file",
                self.show(path).display()
            )));
        };
        Ok((self.dir(parent, create)?, name.to_owned()))
    }

    /// The path a user named (`path`, beneath the root), with the symbolic
    /// links on the way followed where they lead beneath the root: the
    /// path it names, free of links (docs: "Links in the paths you name").
    /// `follow_last`: its last component too, if it is a link. A link that
    /// leads outside the root, or through too many links, is refused,
    /// naming it. What is missing is kept as named (a destination yet to
    /// be made). Everything done afterwards goes through [`Anchor::dir`],
    /// which follows no link: a link swapped in since is refused there.
    pub fn resolve(&self, path: &Path, follow_last: bool) -> Result<PathBuf, EngineError> {
        let rel = path.strip_prefix(&self.root).map_err(|_| {
            EngineError::Usage(format!(
                "{} is outside {}",
                self.show(path).display(),
                self.shown.display()
            ))
        })?;
        let mut todo: std::collections::VecDeque<std::ffi::OsString> =
            rel.components().map(|c| c.as_os_str().to_owned()).collect();
        let mut done = self.root.clone();
        let mut hops = 0;
        // The link being followed, as messages name it.
        let mut via: Option<PathBuf> = None;
        while let Some(name) = todo.pop_front() {
            if name == "." {
                continue;
            }
            if name == ".." {
                if done == self.root {
                    return Err(self.leads_outside(via.as_deref().unwrap_or(path)));
                }
                done.pop();
                continue;
            }
            let last = todo.is_empty();
            let here = done.join(&name);
            let target = match self.dir(&done, false) {
                Ok(d) if !last || follow_last => std::fs::read_link(d.join(&name)).ok(),
                _ => None,
            };
            let Some(target) = target else {
                done = here;
                continue;
            };
            hops += 1;
            if hops > MAX_LINKS {
                return Err(EngineError::Usage(format!(
                    "{}: too many levels of symbolic links",
                    self.show(&here).display()
                )));
            }
            let shown = self.show(&here);
            let rest = match self.within_root(&target) {
                Some(Ok(rest)) => {
                    done = self.root.clone();
                    rest
                }
                Some(Err(())) => return Err(self.leads_outside(&shown)),
                None => target,
            };
            for c in rest.components().rev() {
                match c {
                    Component::Normal(n) => todo.push_front(n.to_owned()),
                    Component::ParentDir => todo.push_front("..".into()),
                    _ => {}
                }
            }
            via = Some(shown);
        }
        Ok(done)
    }

    /// An absolute link target as a path from the root: `Some(Ok)` beneath
    /// it (as configured or resolved), `Some(Err)` elsewhere; None for a
    /// relative target.
    fn within_root(&self, target: &Path) -> Option<Result<PathBuf, ()>> {
        if !target.is_absolute() {
            return None;
        }
        let real = self.root.canonicalize().ok();
        let rest = target
            .strip_prefix(&self.root)
            .ok()
            .or_else(|| target.strip_prefix(real.as_ref()?).ok());
        Some(rest.map(Path::to_path_buf).ok_or(()))
    }

    fn leads_outside(&self, link: &Path) -> EngineError {
        EngineError::Usage(format!(
            "{} is a symbolic link that leads outside {}: refused (links in a path are followed only where they stay beneath it; name the place it leads to instead)",
            link.display(),
            self.shown.display()
        ))
    }

    /// A destination a user named: [`Anchor::resolve`]d, its last
    /// component too when that is a link to a directory beneath the root
    /// (the copy goes into that directory, as rsync and scp put it). A
    /// link to anything else (a file, nothing, a place outside) is refused,
    /// naming it: a link is never replaced, nor written through, silently.
    pub fn resolve_dest(&self, path: &Path) -> Result<PathBuf, EngineError> {
        let named = self.resolve(path, false)?;
        let Some(target) = self
            .anchored(&named)
            .ok()
            .and_then(|at| std::fs::read_link(at).ok())
        else {
            return Ok(named);
        };
        let shown = self.show(&named);
        let resolved = self.resolve(&named, true)?;
        let meta = self
            .anchored(&resolved)
            .ok()
            .and_then(|at| std::fs::symlink_metadata(at).ok());
        let (what, fix) = match meta {
            Some(m) if m.is_dir() => return Ok(resolved),
            _ if resolved == self.root => return Ok(resolved),
            Some(_) => (
                "not a directory",
                format!("name {} itself", self.show(&resolved).display()),
            ),
            None => ("which does not exist", "create it first".to_string()),
        };
        Err(EngineError::Usage(format!(
            "{} is a symbolic link to {}, {what}: a link is never replaced or written through; {fix}, or remove the link",
            shown.display(),
            target.display()
        )))
    }

    /// `path` as a path that resolves beneath the root whatever happens to
    /// its directories meanwhile (its last component is not resolved).
    pub fn anchored(&self, path: &Path) -> Result<PathBuf, EngineError> {
        if path == self.root {
            // `N/.`, not `N`: lstat of the magic link itself would see a link.
            return Ok(self.dir.join("."));
        }
        let (d, name) = self.parent_of(path, false)?;
        Ok(d.join(name))
    }
}

/// openat2 beneath `dir`, following no symbolic link (and falling back to
/// a walk of O_NOFOLLOW opens on kernels before 5.6).
fn open_beneath(dir: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    match rustix::fs::openat2(
        dir,
        c.as_c_str(),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => return Ok(fd),
        Err(rustix::io::Errno::NOSYS) => {}
        Err(e) => return Err(e.into()),
    }
    // No openat2: one component at a time, never following a link.
    let mut cur: Option<OwnedFd> = None;
    for comp in rel.components() {
        let Component::Normal(name) = comp else {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        };
        let cname = CString::new(name.as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let parent = cur.as_ref().unwrap_or(dir);
        cur = Some(rustix::fs::openat(
            parent,
            cname.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?);
    }
    cur.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A planted `/proc` and `/sys`: the block device 254:16 named `name`
    /// in its uevent (or, if `name` is None, only by its link's target),
    /// and jbd2's journals `journals`.
    fn planted(base: &Path, name: Option<&str>, journals: &[&str]) -> (PathBuf, PathBuf) {
        let _ = std::fs::remove_dir_all(base);
        let (proc, sys) = (base.join("proc"), base.join("sys"));
        let device = sys.join("devices/virtual/block/vdb");
        std::fs::create_dir_all(&device).unwrap();
        std::fs::create_dir_all(sys.join("dev/block")).unwrap();
        std::os::unix::fs::symlink(&device, sys.join("dev/block/254:16")).unwrap();
        let devname = name.map(|n| format!("DEVNAME={n}\n")).unwrap_or_default();
        std::fs::write(
            device.join("uevent"),
            format!("MAJOR=254\nMINOR=16\n{devname}DEVTYPE=disk\n"),
        )
        .unwrap();
        std::fs::create_dir_all(proc.join("fs/jbd2")).unwrap();
        for j in journals {
            std::fs::create_dir(proc.join("fs/jbd2").join(j)).unwrap();
        }
        (proc, sys)
    }

    #[test]
    fn an_ext4_has_a_journal_only_if_jbd2_lists_one_for_its_device() {
        let base = std::env::temp_dir().join(format!("lh-jbd2-{}", std::process::id()));
        let dev = rustix::fs::makedev(254, 16);
        let found = |name, journals: &[&str]| {
            let (proc, sys) = planted(&base, name, journals);
            journal_found(dev, &proc, &sys)
        };
        assert_eq!(found(Some("vdb"), &["vdb-8"]), Some(true));
        assert_eq!(found(Some("vdb"), &["vda-8", "loop3-8"]), Some(false));
        assert_eq!(found(Some("vdb"), &[]), Some(false));
        // Any journal inode counts; a longer name that starts alike does not.
        assert_eq!(found(Some("vdb"), &["vdb-12"]), Some(true));
        assert_eq!(
            found(Some("vdb"), &["vdb1-8", "vdb-", "vdb-x8"]),
            Some(false)
        );
        // The kernel writes a name's slashes as `!`.
        assert_eq!(found(Some("cciss/c0d0"), &["cciss!c0d0-8"]), Some(true));
        // No DEVNAME: the name of the device link's target.
        assert_eq!(found(None, &["vdb-8"]), Some(true));
        // What cannot be told is said so (the sink then keeps one create at
        // a time): no jbd2 table, a device /sys does not know.
        let (proc, sys) = planted(&base, Some("vdb"), &["vdb-8"]);
        std::fs::remove_dir_all(proc.join("fs/jbd2")).unwrap();
        assert_eq!(journal_found(dev, &proc, &sys), None);
        let (proc, sys) = planted(&base, Some("vdb"), &["vdb-8"]);
        assert_eq!(
            journal_found(rustix::fs::makedev(254, 17), &proc, &sys),
            None
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn symlinks_never_lead_out() {
        let base = std::env::temp_dir().join(format!("lh-beneath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        std::os::unix::fs::symlink("/", root.join("slash")).unwrap();
        let a = Anchor::open(&root).unwrap();
        // A real directory, and one made on the way.
        assert!(a.dir(&root.join("a"), false).is_ok());
        let made = a.dir(&root.join("a/b/c"), true).unwrap();
        std::fs::write(made.join("f"), b"x").unwrap();
        assert_eq!(std::fs::read(root.join("a/b/c/f")).unwrap(), b"x");
        // Links, as a directory or on the way through one, are refused.
        for p in ["link", "link/x", "slash/etc", "slash"] {
            let e = a.dir(&root.join(p), true).unwrap_err().to_string();
            assert!(e.contains("symbolic link"), "{p}: {e}");
        }
        assert!(a.dir(&outside, false).is_err());
        // A directory swapped for a link after it was opened: the
        // descriptor still names the directory that was checked.
        let d = a.dir(&root.join("a/b"), false).unwrap();
        std::fs::rename(root.join("a/b"), base.join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("a/b")).unwrap();
        std::fs::write(d.join("g"), b"y").unwrap();
        assert!(base.join("moved/g").exists());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
