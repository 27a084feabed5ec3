//! Parts of one file that several transfers share: the ranks of a fleet
//! (`longhaul-fleet`) each carry a range of a large file's chunks
//! ([`Entry::part`]), possibly through different servers onto one shared
//! file system.
//!
//! Every part writes into the same partial file (`.NAME.lhpart`, never
//! truncated by a part) and journals its own chunks in a journal of its
//! own (`.NAME.FIRST-END.lhjournal`). A part whose chunks are all in makes
//! its data durable, then renames its journal to `.NAME.FIRST-END.lhdone`:
//! the mark that its range is complete and on disk. Then, under an
//! exclusive lock on the partial file, it looks at every done mark: once
//! they cover every chunk of the file (their headers agreeing with the
//! file's size, mtime and chunk size), that part, whichever it is, gives
//! the file its mode and mtime, renames it into place and removes the
//! marks. A part that finds the file already in place (another finished
//! it) has nothing more to do. So no coordinator is needed, and a part run
//! again after a crash resumes from its journal or finds itself done.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use longhaul_proto::digest::{chunk_value, file_digest};
use longhaul_proto::plan::{chunk_at, chunk_count};
use longhaul_proto::xfer::*;

use super::beneath::Dir;
use super::storage::{open_regular, read_exact_at, Storage};

/// A file beside `target` that stands for it while it arrives (its
/// partial file, journal, a link's temporary): `.NAME.SUFFIX`.
pub(super) fn side_path(target: &Path, suffix: &str) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!(".{name}.{suffix}"))
}

/// The name of a part's journal beside `target`, while its range is
/// arriving, or once it is complete and durable.
pub(super) fn journal_name(target: &Path, [first, end]: [u32; 2], done: bool) -> PathBuf {
    let suffix = if done { "lhdone" } else { "lhjournal" };
    side_path(target, &format!("{first}-{end}.{suffix}"))
}

/// The chunks of `range` that an earlier run of this part verified: those
/// its journal (or done mark) lists and that hash the same in the partial
/// file now. Anything unreadable counts as not there.
pub(super) fn resumed(
    storage: &dyn Storage,
    at_part: &Path,
    journal: &[u8],
    header: &JournalHeader,
    entry: &Entry,
    [first, end]: [u32; 2],
) -> Vec<(u32, [u8; 32])> {
    let Some((h, records)) = parse_journal(journal) else {
        return Vec::new();
    };
    if h != *header {
        return Vec::new();
    }
    let Ok(reader) = storage.open_read(at_part) else {
        return Vec::new();
    };
    let mut seen = std::collections::HashSet::new();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    for (index, hash) in records {
        if !(first..end).contains(&index) || !seen.insert(index) {
            continue;
        }
        let c = chunk_at(entry.id, entry.size, entry.chunk_size, index);
        buf.resize(c.len as usize, 0);
        if read_exact_at(&*reader, &mut buf, c.offset).is_ok()
            && chunk_value(
                &buf,
                c.offset,
                chunk_count(entry.size, entry.chunk_size) == 1,
            ) == hash
        {
            out.push((index, hash));
        }
    }
    out
}

/// What [`finalize`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Finalized {
    /// Every part is in: the file is in place, with this digest (its
    /// BLAKE3, from its chunks' values).
    Landed(String),
    /// Other parts are still missing; whichever completes last finishes it.
    Waiting,
    /// Another part finished the file already.
    Elsewhere,
}

/// How the file is given its final form.
pub(super) struct Finish<'a> {
    pub dir: &'a Dir,
    pub target: &'a Path,
    pub part: &'a Path,
    pub entry: &'a Entry,
    pub mode: u32,
    /// The hashes this part verified as its chunks arrived (its range;
    /// the rest is not read).
    pub own: &'a [Option<[u8; 32]>],
    pub storage: &'a dyn Storage,
}

/// Under an exclusive lock on the partial file: if the done marks of the
/// parts cover every chunk, proves every chunk a mark lists on disk (a
/// mark is a file anyone who can write the directory could have made),
/// then lands the file (mode, mtime, rename) and removes the marks.
pub(super) fn finalize(f: &Finish) -> Result<Finalized, String> {
    let name = |p: &Path| p.file_name().expect("side paths have a name").to_owned();
    let at_part = f.dir.join(name(f.part));
    let lock = match open_regular(&at_part, OpenOptions::new().read(true)) {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Finalized::Elsewhere),
        Err(e) => return Err(io_err("open", f.part, e)),
    };
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| io_err("lock", f.part, e.into()))?;
    // Renamed into place while this side waited for the lock: the inode
    // it holds has the target's name now, not the partial's.
    match std::fs::symlink_metadata(&at_part) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Finalized::Elsewhere),
        Err(e) => return Err(io_err("stat", f.part, e)),
        Ok(_) => {}
    }
    let e = f.entry;
    let count = chunk_count(e.size, e.chunk_size);
    let header = JournalHeader {
        size: e.size,
        mtime_ns: e.mtime_ns,
        chunk_size: e.chunk_size,
    };
    let (mut hashes, marks) = done_marks(f.dir, f.target, &header, count)?;
    let [first, end] = e.chunk_range();
    for i in first..end.min(count as u32) {
        if let Some(Some(h)) = f.own.get(i as usize) {
            hashes[i as usize] = Some((*h, None));
        }
    }
    if hashes.iter().any(Option::is_none) {
        return Ok(Finalized::Waiting);
    }
    let bad = prove(f, &at_part, &hashes, &marks)?;
    if !bad.is_empty() {
        // What a mark claims is not on disk: a planted or stale mark. It is
        // dropped, and the file waits for a part (or a whole copy: the
        // fleet's final check) that really writes those chunks.
        for m in &bad {
            tracing::warn!(
                "ignoring the done mark {} beside {}: its chunks are not on disk as it says",
                m.to_string_lossy(),
                f.part.display()
            );
            let _ = std::fs::remove_file(f.dir.join(m));
        }
        return Ok(Finalized::Waiting);
    }
    use std::os::unix::fs::PermissionsExt;
    lock.set_permissions(std::fs::Permissions::from_mode(f.mode))
        .map_err(|err| io_err("set mode of", f.part, err))?;
    super::set_mtime_through(&at_part, e.mtime_ns)
        .map_err(|err| io_err("set mtime of", f.part, err))?;
    rustix::fs::renameat(f.dir.fd(), name(f.part), f.dir.fd(), name(f.target))
        .map_err(|err| io_err("rename into", f.target, err.into()))?;
    for m in marks {
        let _ = std::fs::remove_file(f.dir.join(m));
    }
    let values: Vec<[u8; 32]> = hashes.iter().flatten().map(|(h, _)| *h).collect();
    let digest =
        file_digest(&values).ok_or_else(|| format!("{}: no chunks", f.target.display()))?;
    Ok(Finalized::Landed(super::hex(&digest)))
}

/// A chunk's hash, and the done mark that listed it (`None`: this part
/// verified it as it arrived).
type Listed = Option<([u8; 32], Option<usize>)>;

/// The chunk hashes every done mark of `target` lists (their headers
/// matching `header`), each with the index of its mark in the names of
/// all its parts' marks, stale ones included (removed once the file
/// lands).
fn done_marks(
    dir: &Dir,
    target: &Path,
    header: &JournalHeader,
    count: u64,
) -> Result<(Vec<Listed>, Vec<std::ffi::OsString>), String> {
    let stem = format!(
        ".{}.",
        target.file_name().unwrap_or_default().to_string_lossy()
    );
    let mut hashes = vec![None; count as usize];
    let mut marks = Vec::new();
    let listing = std::fs::read_dir(dir.path()).map_err(|e| io_err("list", target, e))?;
    for de in listing.flatten() {
        let n = de.file_name();
        let s = n.to_string_lossy();
        let Some(range) = s.strip_prefix(&stem).and_then(|r| {
            r.strip_suffix(".lhdone")
                .or_else(|| r.strip_suffix(".lhjournal"))
        }) else {
            continue;
        };
        if !range
            .split_once('-')
            .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
        {
            continue;
        }
        let done = s.ends_with(".lhdone");
        let path = dir.join(&n);
        marks.push(n.clone());
        if !done {
            continue;
        }
        let Some(bytes) = read_mark(&path, count) else {
            continue;
        };
        let Some((h, records)) = parse_journal(&bytes) else {
            continue;
        };
        if h != *header {
            continue;
        }
        for (i, hash) in records {
            if let Some(slot) = hashes.get_mut(i as usize) {
                *slot = Some((hash, Some(marks.len() - 1)));
            }
        }
    }
    Ok((hashes, marks))
}

/// A done mark's bytes: a regular file of one name, no longer than a
/// journal of `count` chunks.
fn read_mark(path: &Path, count: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let most = JOURNAL_HEADER_LEN as u64 + count.saturating_mul(JOURNAL_RECORD_LEN as u64);
    let f: File = open_regular(path, OpenOptions::new().read(true)).ok()?;
    let m = f.metadata().ok()?;
    if m.nlink() != 1 || m.len() > most {
        return None;
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    f.take(most).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Reads back every chunk a done mark lists (not this part's own, which
/// it verified as they arrived, and with `--verify` read back already)
/// and hashes it again; returns the names of the marks whose chunks are
/// not on disk as they say.
fn prove(
    f: &Finish,
    at_part: &Path,
    hashes: &[Listed],
    marks: &[std::ffi::OsString],
) -> Result<Vec<std::ffi::OsString>, String> {
    let e = f.entry;
    let r = f
        .storage
        .open_read(at_part)
        .map_err(|err| io_err("re-read", f.part, err))?;
    let mut bad: Vec<usize> = Vec::new();
    let mut buf = Vec::new();
    for (i, listed) in hashes.iter().enumerate() {
        let Some((h, Some(mark))) = listed else {
            continue;
        };
        if bad.contains(mark) {
            continue;
        }
        let c = chunk_at(e.id, e.size, e.chunk_size, i as u32);
        buf.resize(c.len as usize, 0);
        let same = read_exact_at(&*r, &mut buf, c.offset).is_ok()
            && chunk_value(&buf, c.offset, chunk_count(e.size, e.chunk_size) == 1) == *h;
        if !same {
            bad.push(*mark);
        }
    }
    Ok(bad
        .into_iter()
        .filter_map(|m| marks.get(m).cloned())
        .collect())
}

fn io_err(what: &str, path: &Path, e: io::Error) -> String {
    format!("failed to {what} {}: {e}", path.display())
}
