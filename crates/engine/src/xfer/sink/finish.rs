//! Finishing a file once all its chunks are in: made durable (small
//! files together, by one syncfs), read back with `--verify`, given its
//! mode and mtime, and renamed into place; a part of a file is marked done
//! and the file landed once every part is in.

use std::io;
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};

use longhaul_proto::digest::{self, ChunkValue};
use longhaul_proto::plan::{chunk_at, chunk_count};
use longhaul_proto::xfer::*;

use super::super::hex;
use super::super::storage::read_exact_at;
use super::{drop_partial, io_err, Event, FileState, SinkConfig};

/// Makes a batch of small files durable with one syncfs(2) on their file
/// system (one journal commit instead of one per file). False if it did
/// not (one file, a large one, or syncfs failed): each is then synced
/// on its own.
fn sync_together(batch: &[Arc<FileState>]) -> bool {
    if batch.len() < 2 || batch.iter().any(|f| f.entry.size > GROUP_SYNC_MAX_FILE) {
        return false;
    }
    // The batch may span file systems only if the destination does; then
    // sync each of them. A file is on its directory's (asked once per
    // directory, not once per file).
    let mut devs: Vec<(u64, i32)> = Vec::new();
    for f in batch {
        let Some(fd) = f.out.raw_fd() else {
            return false;
        };
        match f.dir.dev() {
            Some(d) if !devs.iter().any(|(x, _)| *x == d) => devs.push((d, fd)),
            Some(_) => {}
            None => return false,
        }
    }
    // SAFETY: syncfs on descriptors the batch holds open.
    devs.iter().all(|(_, fd)| unsafe { libc::syncfs(*fd) } == 0)
}

/// A finisher's loop: one file, and whatever else is ready (small files
/// are made durable together: group commit), until the channel closes.
pub(super) fn finish_batches(
    fin_rx: &Mutex<Receiver<Arc<FileState>>>,
    tx: &Sender<Event>,
    cfg: &SinkConfig,
) {
    loop {
        let batch: Vec<Arc<FileState>> = {
            let rx = fin_rx.lock().expect("poisoned");
            let Ok(first) = rx.recv() else { return };
            let mut b = vec![first];
            while b.len() < FINISH_BATCH {
                match rx.try_recv() {
                    Ok(f) => b.push(f),
                    Err(_) => break,
                }
            }
            b
        };
        let synced = cfg.sync_files && sync_together(&batch);
        let dones = batch
            .iter()
            .map(|f| (finish(f, cfg, synced), f.entry.carried_bytes()))
            .collect();
        let _ = tx.send(Event::Dones(dones));
    }
}

/// Finishes a complete part: its data and journal made durable, its
/// journal marked done, and the file landed if every part is now in
/// ([`super::super::parts::finalize`]).
fn finish_part(f: &FileState, cfg: &SinkConfig, synced: bool) -> Result<Option<String>, String> {
    let range = f.entry.chunk_range();
    if cfg.sync_files && !synced && !f.dir.in_memory() {
        f.out.sync_data().map_err(|e| io_err("sync", &f.part, e))?;
    }
    if cfg.verify {
        verify(f, cfg)?;
    }
    {
        let mut p = f.inner.lock().expect("poisoned");
        if let Some(j) = p.journal.take() {
            if cfg.sync_files && !f.dir.in_memory() {
                j.sync_data()
                    .map_err(|e| io_err("sync", &f.journal_path, e))?;
            }
        }
    }
    let done = super::super::parts::journal_name(&f.target, range, true);
    let name = |p: &Path| p.file_name().expect("named").to_owned();
    match rustix::fs::renameat(f.dir.fd(), name(&f.journal_path), f.dir.fd(), name(&done)) {
        // Another part finished the file and cleared the journals away
        // (this range was carried twice, as a queue's expired lease is).
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(io_err("mark done", &f.journal_path, e.into())),
        Ok(()) => {}
    }
    let mode = mode_of(f, cfg);
    let own = f.inner.lock().expect("poisoned").ledger.hashes().to_vec();
    let finished = super::super::parts::finalize(&super::super::parts::Finish {
        dir: &f.dir,
        target: &f.target,
        part: &f.part,
        entry: &f.entry,
        mode,
        own: &own,
        storage: &*cfg.storage,
    })?;
    Ok(match finished {
        super::super::parts::Finalized::Landed(digest) => Some(digest),
        super::super::parts::Finalized::Waiting => None,
        super::super::parts::Finalized::Elsewhere => {
            // Written into the landed file itself: its mtime again.
            let _ = f.out.set_mtime(f.entry.mtime_ns);
            None
        }
    })
}

/// Whether finishing `f` waits on no device, so that the thread that
/// completed it finishes it at once (mode, mtime, rename: microseconds)
/// instead of handing it to the finisher pool, which costs two thread
/// wake-ups a file: a file in memory (tmpfs, where fdatasync does
/// nothing) with nothing to read back. Not for `--no-sync` on other file
/// systems: there a rename may still wait on a server (NFS) or a journal.
pub(super) fn finishes_at_once(f: &FileState, cfg: &SinkConfig) -> bool {
    !cfg.verify && f.dir.in_memory()
}

/// Makes a complete file durable, gives it its mode and mtime, and renames
/// it into place.
pub(super) fn finish(f: &FileState, cfg: &SinkConfig, synced: bool) -> FileDone {
    let id = f.entry.id;
    let result = match f.entry.part {
        Some(_) => finish_part(f, cfg, synced),
        None => land(f, cfg, synced)
            .map(Some)
            .inspect_err(|_| drop_partial(f)),
    };
    match result {
        Ok(digest) => FileDone {
            id,
            digest,
            ..FileDone::default()
        },
        Err(error) => FileDone {
            id,
            error: Some(error),
            ..FileDone::default()
        },
    }
}

/// Lands a whole file: durable (unless `synced` with others), checked
/// with `--verify`, its mode and mtime set through the open file, renamed
/// into place beside it, its journal removed. Returns its digest.
fn land(f: &FileState, cfg: &SinkConfig, synced: bool) -> Result<String, String> {
    if cfg.sync_files && !synced && !f.dir.in_memory() {
        f.out.sync_data().map_err(|e| io_err("sync", &f.part, e))?;
    }
    if cfg.verify {
        verify(f, cfg)?;
    }
    // Through the open file: no path, nothing to follow.
    f.out
        .set_mode(mode_of(f, cfg))
        .map_err(|e| io_err("set mode of", &f.part, e))?;
    f.out
        .set_mtime(f.entry.mtime_ns)
        .map_err(|e| io_err("set mtime of", &f.part, e))?;
    // Relative to the directory's descriptor: the very directory the
    // partial file was made in, without a walk of its /proc path.
    let name = |p: &Path| p.file_name().expect("named").to_owned();
    rustix::fs::renameat(f.dir.fd(), name(&f.part), f.dir.fd(), name(&f.target))
        .map_err(io::Error::from)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EISDIR | libc::ENOTEMPTY | libc::EEXIST) => {
                format!(
                    "{} is a directory; not replaced by a file",
                    f.target.display()
                )
            }
            _ => io_err("rename into", &f.target, e),
        })?;
    if f.inner.lock().expect("poisoned").journal.is_some() {
        let _ = std::fs::remove_file(&f.at_journal);
    }
    let p = f.inner.lock().expect("poisoned");
    let values: Vec<ChunkValue> = p.ledger.hashes().iter().flatten().copied().collect();
    digest::file_digest(&values)
        .map(|d| hex(&d))
        .ok_or_else(|| {
            format!(
                "{}: no chunk values to make its digest of",
                f.target.display()
            )
        })
}

/// The mode a landed file gets: the source's with `--preserve` (special
/// bits as [`SinkConfig::mode_of`] allows), else a new file's.
fn mode_of(f: &FileState, cfg: &SinkConfig) -> u32 {
    if cfg.preserve {
        cfg.mode_of(&f.entry)
    } else {
        0o666 & !cfg.umask
    }
}

/// Reads a written file back and compares each chunk with its hash.
fn verify(f: &FileState, cfg: &SinkConfig) -> Result<(), String> {
    let r = cfg
        .storage
        .open_read(&f.at_part)
        .map_err(|e| io_err("re-read", &f.part, e))?;
    let hashes = f.inner.lock().expect("poisoned").ledger.hashes().to_vec();
    let [first, end] = f.entry.chunk_range();
    let whole = chunk_count(f.entry.size, f.entry.chunk_size) == 1;
    let mut buf = Vec::new();
    for (i, h) in hashes
        .iter()
        .enumerate()
        .take(end as usize)
        .skip(first as usize)
    {
        let c = chunk_at(f.entry.id, f.entry.size, f.entry.chunk_size, i as u32);
        buf.resize(c.len as usize, 0);
        read_exact_at(&*r, &mut buf, c.offset).map_err(|e| io_err("re-read", &f.part, e))?;
        if Some(digest::chunk_value(&buf, c.offset, whole)) != *h {
            return Err(format!(
                "verification failed: {} differs from the source at offset {} (chunk {i}) after writing",
                f.target.display(),
                c.offset
            ));
        }
    }
    Ok(())
}

/// Files one finisher takes at a time.
pub(super) const FINISH_BATCH: usize = 256;

/// Files up to this size are made durable together by one syncfs(2); a
/// batch with a larger one syncs each file on its own.
const GROUP_SYNC_MAX_FILE: u64 = 4 << 20;
