//! Opening announced files: skipped when the destination has them,
//! else a partial file made or resumed (its journal's chunks hashed
//! again) and the chunks still needed asked for; on the openers' threads
//! beside the control thread.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};

use longhaul_proto::digest;
use longhaul_proto::plan::{chunk_at, chunk_count};
use longhaul_proto::transfer::sink::FileLedger;
use longhaul_proto::xfer::*;

use super::super::beneath::Dir;
use super::super::storage::read_exact_at;
use super::super::storage::WriteAt;
use super::journal::{new_journal, read_journal};
use super::{
    io_err, no_room, no_room_for, one_create, side_path, Event, FileState, Files, Progress,
    SinkConfig,
};
use crate::stages::{self, timed, Stage, StageTotals};
use crate::EngineError;

/// Threads that open announced files beside the control thread: a create
/// waiting on the file system's journal, or a resume hashing a partial
/// file again, holds up neither the network nor the other files.
/// Files come in groups (a run of one message's entries) and their answers
/// go back together as one [`Event::Answers`]: two thread wake-ups a group,
/// not a file (issue 45).
pub(super) struct Openers {
    tx: Sender<Vec<Entry>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Openers {
    pub(super) fn start(
        cfg: &Arc<SinkConfig>,
        files: &Files,
        events: &Sender<Event>,
        totals: &Arc<StageTotals>,
    ) -> Result<Self, EngineError> {
        let (tx, rx) = mpsc::channel::<Vec<Entry>>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for _ in 0..OPENERS {
            let (rx, cfg, files, events) = (rx.clone(), cfg.clone(), files.clone(), events.clone());
            let totals = totals.clone();
            let open = move || {
                let _counted = stages::count_into(&totals);
                loop {
                    let Ok(group) = rx.lock().expect("poisoned").recv() else {
                        return;
                    };
                    // Dry runs open nothing here: nothing to report.
                    let answers = timed(Stage::Write, || {
                        group
                            .iter()
                            .map(|e| {
                                let opened = open_file(e, &cfg, &files, &mut SinkReport::default());
                                answer(e.id, opened)
                            })
                            .collect()
                    });
                    if events.send(Event::Answers(answers)).is_err() {
                        return;
                    }
                }
            };
            threads.push(
                std::thread::Builder::new()
                    .name("lh-open".into())
                    .spawn(open)
                    .map_err(|e| EngineError::io("failed to start an opener".into(), e))?,
            );
        }
        Ok(Self { tx, threads })
    }

    /// Opens a group of files on one opener.
    pub(super) fn open(&self, group: Vec<Entry>) {
        let _ = self.tx.send(group);
    }

    /// Lets the openers finish what they took, and waits for them.
    pub(super) fn join(self) {
        drop(self.tx);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The destination has no room for a file (what says so): its partial
/// file is not left behind.
pub(super) struct NoRoom(pub(super) String);

/// An opener's answer as the control thread takes it.
pub(super) fn answer(id: u64, opened: Result<Want, NoRoom>) -> Event {
    match opened {
        Ok(want) => Event::Opened(id, want),
        Err(NoRoom(why)) => Event::Full(id, why),
    }
}

/// Answers one announced file: skip it, or open its partial file and say
/// which chunks are still needed; or find no room for it.
pub(super) fn open_file(
    e: &Entry,
    cfg: &SinkConfig,
    files: &Files,
    report: &mut SinkReport,
) -> Result<Want, NoRoom> {
    let fail = |error: String| Ok(Want::Fail { id: e.id, error });
    let target = match cfg.target(&e.path) {
        Ok(t) => t,
        Err(err) => return fail(err.to_string()),
    };
    if !cfg.force && in_place(e, cfg, &target) {
        return Ok(Want::Skip { id: e.id });
    }
    if cfg.dry_run {
        report
            .would_send
            .push(format!("{} -> {}", e.path, cfg.shown(&e.path)));
        report.would_send_bytes += e.size;
        return Ok(Want::Skip { id: e.id });
    }
    let (dir, _) = match cfg.anchor.parent_of(&target, true) {
        Ok(x) => x,
        Err(err) => return fail(err.to_string()),
    };
    // From here on the target is named as the peer knows it: messages
    // never carry a server's absolute path.
    let target = cfg.anchor.show(&target);
    match e.part {
        Some(range) => open_part(e, range, cfg, files, target, dir),
        None => open_whole(e, cfg, files, target, dir),
    }
}

/// Whether the destination has the file already: a regular file of its
/// size, and its mtime (or, with `sync --checksum`, its content). A
/// missing (or refused) parent: no such file here yet. Stat'ed relative to
/// its directory's descriptor (cached by the anchor): no walk of a
/// `/proc/self/fd` path per file, which a no-change sync pays for every
/// file it has (issue 45).
fn in_place(e: &Entry, cfg: &SinkConfig, target: &Path) -> bool {
    use rustix::fs::{statat, AtFlags, FileType};
    let Ok((dir, name)) = cfg.anchor.parent_of(target, false) else {
        return false;
    };
    let Ok(st) = statat(dir.fd(), name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) else {
        return false;
    };
    FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
        && u64::try_from(st.st_size) == Ok(e.size)
        && match &e.digest {
            // sync --checksum: the content decides, not the mtime.
            Some(d) => super::super::content_digest(&*cfg.storage, &dir.join(&name), e.size)
                .is_ok_and(|mine| &mine == d),
            None => {
                st.st_mtime
                    .saturating_mul(1_000_000_000)
                    .saturating_add(st.st_mtime_nsec as i64)
                    == e.mtime_ns
            }
        }
}

/// Opens a whole file's partial file beside `target` in `dir`: resumed
/// from its journal if that checks out, else made afresh (sized, its
/// space reserved); its journal rewritten; the chunks still needed asked
/// for. No room for it: what was made of it is removed.
fn open_whole(
    e: &Entry,
    cfg: &SinkConfig,
    files: &Files,
    target: PathBuf,
    dir: Arc<Dir>,
) -> Result<Want, NoRoom> {
    let fail = |error: String| Ok(Want::Fail { id: e.id, error });
    // The machine checked the peer's numbers (chunk size and count, chunks
    // in flight) before it asked for the file.
    let count = chunk_count(e.size, e.chunk_size);
    let part = side_path(&target, "lhpart");
    let journal_path = side_path(&target, "lhjournal");
    let side = |p: &Path| dir.join(p.file_name().expect("side paths have a name"));
    let (at_part, at_journal) = (side(&part), side(&journal_path));
    let header = JournalHeader {
        size: e.size,
        mtime_ns: e.mtime_ns,
        chunk_size: e.chunk_size,
    };
    let (hashes, skip, resumed) = resume(e, cfg, &header, &at_part, &at_journal);
    let fresh = skip.is_empty();
    let skip = skip_ranges(skip, MAX_SKIP_RANGES);
    // A fresh file of one chunk gets its size from that chunk's write (or,
    // for a hole, when it arrives): no ftruncate.
    let sized = !(fresh && count == 1);
    let out = match open_partial(e, cfg, &dir, &part, &at_part, &target, fresh, sized)? {
        Ok(o) => o,
        Err(error) => return fail(error),
    };
    // Rewrite the journal with the records that checked out. A one-chunk
    // file has none: it completes or starts over.
    let verified = || {
        hashes
            .iter()
            .enumerate()
            .filter_map(|(i, h)| Some((i as u32, (*h)?)))
    };
    let journal = if count == 1 {
        Ok(None)
    } else {
        one_create(dir.on_ext4_without_journal(), || {
            new_journal(&at_journal, &header, verified())
        })
        .map(Some)
    };
    let journal = match journal {
        Ok(j) => j,
        Err(err) => {
            let _ = std::fs::remove_file(&at_part);
            let _ = std::fs::remove_file(&at_journal);
            if no_room(&err) {
                return Err(NoRoom(no_room_for(&target, e.size, &dir, &err)));
            }
            return fail(io_err("write journal", &journal_path, err));
        }
    };
    let state = Arc::new(FileState {
        entry: e.clone(),
        target,
        part,
        journal_path,
        dir,
        sized: AtomicBool::new(sized),
        at_part,
        at_journal,
        out,
        fresh,
        write_lock: Mutex::new(()),
        inner: Mutex::new(Progress {
            journal,
            ledger: FileLedger::new(hashes.len(), verified()),
        }),
    });
    files.lock().expect("poisoned").insert(e.id, state);
    Ok(Want::Send {
        id: e.id,
        skip,
        resumed_bytes: resumed,
    })
}

/// What a resume keeps of a partial file: the chunks its journal lists
/// that hash again to what it says (a journal is not trusted). Only
/// files of several chunks have a journal; the partial file is opened
/// only when there is one. Returns each chunk's value if kept, the kept
/// indices in order, and their bytes.
fn resume(
    e: &Entry,
    cfg: &SinkConfig,
    header: &JournalHeader,
    at_part: &Path,
    at_journal: &Path,
) -> (Vec<Option<[u8; 32]>>, Vec<u32>, u64) {
    let count = chunk_count(e.size, e.chunk_size);
    let mut hashes = vec![None; count as usize];
    let mut skip = Vec::new();
    let mut resumed = 0u64;
    let journal_bytes = if count > 1 {
        read_journal(at_journal, count)
    } else {
        None
    };
    if let Some((bytes, reader)) =
        journal_bytes.and_then(|b| cfg.storage.open_read(at_part).ok().map(|r| (b, r)))
    {
        if let Some((_, records)) = parse_journal(&bytes).filter(|(h, _)| h == header) {
            let mut buf = Vec::new();
            for (index, hash) in records {
                if u64::from(index) >= count || hashes[index as usize].is_some() {
                    continue;
                }
                let c = chunk_at(e.id, e.size, e.chunk_size, index);
                buf.resize(c.len as usize, 0);
                if read_exact_at(&*reader, &mut buf, c.offset).is_ok()
                    && digest::chunk_value(&buf, c.offset, false) == hash
                {
                    hashes[index as usize] = Some(hash);
                    skip.push(index);
                    resumed += u64::from(c.len);
                }
            }
        }
    }
    skip.sort_unstable();
    (hashes, skip, resumed)
}

/// Opens the partial file for writing: made afresh (and, if `sized`,
/// given its full size, with its space reserved unless the source is
/// sparse) or opened as it is for a resume. A fresh one that fails is
/// removed; no room for it is the outer error.
#[allow(clippy::too_many_arguments)]
fn open_partial(
    e: &Entry,
    cfg: &SinkConfig,
    dir: &Dir,
    part: &Path,
    at_part: &Path,
    target: &Path,
    fresh: bool,
    sized: bool,
) -> Result<Result<Box<dyn WriteAt>, String>, NoRoom> {
    let count = chunk_count(e.size, e.chunk_size);
    let part_name = part.file_name().expect("side paths have a name");
    let opened = if fresh {
        one_create(dir.on_ext4_without_journal(), || {
            cfg.storage.create_in(dir, part_name)
        })
    } else {
        cfg.storage.open_write(at_part, false)
    };
    let out = match opened {
        Ok(o) => o,
        Err(err) if no_room(&err) => return Err(NoRoom(no_room_for(target, e.size, dir, &err))),
        Err(err) => return Ok(Err(io_err("create", target, err))),
    };
    if !cfg.sync_files {
        out.will_not_sync();
    }
    if !(fresh && sized) {
        return Ok(Ok(out));
    }
    // Made for this run and failed at once: nothing stays.
    let fail = |what: &str, err: io::Error| {
        let _ = std::fs::remove_file(at_part);
        if no_room(&err) {
            return Err(NoRoom(no_room_for(target, e.size, dir, &err)));
        }
        Ok(Err(io_err(what, part, err)))
    };
    if let Err(err) = out.set_len(e.size) {
        return fail("size", err);
    }
    // Reserve the space now, so that a full disk shows at once; a sparse
    // source keeps its holes instead.
    if !e.sparse && count > 1 {
        match out.allocate(e.size) {
            Err(err) if no_room(&err) => return fail("reserve space for", err),
            // Reserving is an optimisation: other errors leave it undone.
            _ => {}
        }
    }
    Ok(Ok(out))
}

/// Answers a part of a file ([`Entry::part`], see [`super::super::parts`]): opens
/// the shared partial file without truncating it, resumes from this part's
/// journal (or finds the part done), and asks for the part's chunks only.
fn open_part(
    e: &Entry,
    [first, end]: [u32; 2],
    cfg: &SinkConfig,
    files: &Files,
    target: PathBuf,
    dir: Arc<Dir>,
) -> Result<Want, NoRoom> {
    let fail = |error: String| Ok(Want::Fail { id: e.id, error });
    let count = chunk_count(e.size, e.chunk_size);
    let part = side_path(&target, "lhpart");
    let journal_path = super::super::parts::journal_name(&target, [first, end], false);
    let done_path = super::super::parts::journal_name(&target, [first, end], true);
    let side = |p: &Path| dir.join(p.file_name().expect("side paths have a name"));
    let (at_part, at_journal, at_done) = (side(&part), side(&journal_path), side(&done_path));
    let header = JournalHeader {
        size: e.size,
        mtime_ns: e.mtime_ns,
        chunk_size: e.chunk_size,
    };
    let out = match open_shared(e, cfg, &part, &at_part) {
        Ok(o) => o,
        Err(error) => return fail(error),
    };
    // A done mark first (this part finished before a restart), else its
    // journal: the chunks listed are hashed again, not trusted.
    let journal = read_journal(&at_done, count).or_else(|| read_journal(&at_journal, count));
    let verified = journal.map_or_else(Vec::new, |bytes| {
        super::super::parts::resumed(&*cfg.storage, &at_part, &bytes, &header, e, [first, end])
    });
    let resumed: u64 = verified
        .iter()
        .map(|(i, _)| u64::from(chunk_at(e.id, e.size, e.chunk_size, *i).len))
        .sum();
    let _ = std::fs::remove_file(&at_done);
    let journal = one_create(dir.on_ext4_without_journal(), || {
        new_journal(&at_journal, &header, verified.iter().copied())
    });
    let journal = match journal {
        Ok(j) => j,
        Err(err) => return fail(io_err("write journal", &journal_path, err)),
    };
    // Chunks outside the part are other transfers': booked as present
    // here (their hashes are never used), and skipped by the source.
    let outside = (0..first).chain(end..count as u32);
    let mut skip: Vec<u32> = outside
        .clone()
        .chain(verified.iter().map(|(i, _)| *i))
        .collect();
    skip.sort_unstable();
    let skip = skip_ranges(skip, MAX_SKIP_RANGES);
    let present = outside.map(|i| (i, [0u8; 32])).chain(verified);
    let state = Arc::new(FileState {
        entry: e.clone(),
        target,
        part,
        journal_path,
        dir,
        sized: AtomicBool::new(true),
        at_part,
        at_journal,
        out,
        // Other parts (or an earlier run) may have written here.
        fresh: false,
        write_lock: Mutex::new(()),
        inner: Mutex::new(Progress {
            journal: Some(journal),
            ledger: FileLedger::new(count as usize, present),
        }),
    });
    files.lock().expect("poisoned").insert(e.id, state);
    Ok(Want::Send {
        id: e.id,
        skip,
        resumed_bytes: resumed,
    })
}

/// Threads that open announced files ([`Openers`]).
const OPENERS: usize = 4;

/// Opens the partial file the parts of a file share: made if missing and
/// never truncated (other parts write into it), and sized alike by every
/// part.
fn open_shared(
    e: &Entry,
    cfg: &SinkConfig,
    part: &Path,
    at_part: &Path,
) -> Result<Box<dyn WriteAt>, String> {
    // Two parts may make it at once: the one whose create loses opens it.
    let opened = cfg.storage.open_write(at_part, false).or_else(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            cfg.storage.open_write(at_part, false)
        } else {
            Err(e)
        }
    });
    let out = opened.map_err(|err| io_err("open", part, err))?;
    let len = std::fs::metadata(at_part).map(|m| m.len());
    if len.as_ref().map_or(true, |l| *l != e.size) {
        out.set_len(e.size)
            .map_err(|err| io_err("size", part, err))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{config, file};
    use super::*;

    const CHUNK: u64 = 64 << 10;

    fn no_files() -> Files {
        Arc::new(Mutex::new(std::collections::HashMap::new()))
    }

    fn open(e: &Entry, cfg: &SinkConfig, files: &Files) -> (Want, SinkReport) {
        let mut report = SinkReport::default();
        let Ok(want) = open_file(e, cfg, files, &mut report) else {
            panic!("no room in a temp dir");
        };
        (want, report)
    }

    #[test]
    fn a_new_file_gets_a_sized_partial_file_and_a_journal() {
        let t = tempfile::tempdir().unwrap();
        let (cfg, files) = (config(t.path()), no_files());
        let e = file(1, "run/big.bin", 3 * CHUNK, CHUNK);
        std::fs::create_dir(t.path().join("run")).unwrap();
        let (want, _) = open(&e, &cfg, &files);
        assert!(
            matches!(&want, Want::Send { id: 1, skip, resumed_bytes: 0 } if skip.is_empty()),
            "{want:?}"
        );
        let part = t.path().join("run/.big.bin.lhpart");
        assert_eq!(std::fs::metadata(&part).unwrap().len(), 3 * CHUNK);
        assert!(t.path().join("run/.big.bin.lhjournal").exists());
        let f = files.lock().unwrap()[&1].clone();
        assert!(f.fresh && f.sized.load(std::sync::atomic::Ordering::Relaxed));
        // One chunk: no journal, and sized by its write.
        let small = file(2, "run/small", 10, CHUNK);
        assert!(matches!(open(&small, &cfg, &files).0, Want::Send { .. }));
        assert!(!t.path().join("run/.small.lhjournal").exists());
        assert!(!files.lock().unwrap()[&2]
            .sized
            .load(std::sync::atomic::Ordering::Relaxed));
    }

    #[test]
    fn a_file_in_place_is_skipped_and_a_dry_run_opens_nothing() {
        let t = tempfile::tempdir().unwrap();
        let (mut cfg, files) = (config(t.path()), no_files());
        let e = file(1, "same", 5, CHUNK);
        let p = t.path().join("same");
        std::fs::write(&p, b"12345").unwrap();
        let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(e.mtime_ns as u64);
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert!(matches!(open(&e, &cfg, &files).0, Want::Skip { id: 1 }));
        // Another mtime: sent again.
        let newer = Entry {
            mtime_ns: e.mtime_ns + 1,
            ..e.clone()
        };
        assert!(matches!(open(&newer, &cfg, &files).0, Want::Send { .. }));
        // --force sends it whatever.
        cfg.force = true;
        assert!(matches!(open(&e, &cfg, &files).0, Want::Send { .. }));
        // A dry run says what it would send, and opens nothing.
        let (cfg, files) = (
            SinkConfig {
                dry_run: true,
                ..config(t.path())
            },
            no_files(),
        );
        let (want, report) = open(&file(3, "new", 7, CHUNK), &cfg, &files);
        assert!(matches!(want, Want::Skip { id: 3 }));
        assert_eq!(report.would_send, ["new -> dest/new"]);
        assert_eq!(report.would_send_bytes, 7);
        assert!(!t.path().join(".new.lhpart").exists());
        assert!(files.lock().unwrap().is_empty());
    }

    #[test]
    fn a_resume_keeps_only_the_journaled_chunks_that_hash_again() {
        let t = tempfile::tempdir().unwrap();
        let (cfg, files) = (config(t.path()), no_files());
        let e = file(1, "big", 3 * CHUNK, CHUNK);
        let data: Vec<u8> = (0..3 * CHUNK).map(|i| (i % 253) as u8).collect();
        std::fs::write(t.path().join(".big.lhpart"), &data).unwrap();
        let value = |i: u64| {
            let c = &data[(i * CHUNK) as usize..((i + 1) * CHUNK) as usize];
            digest::chunk_value(c, i * CHUNK, false)
        };
        let header = JournalHeader {
            size: e.size,
            mtime_ns: e.mtime_ns,
            chunk_size: e.chunk_size,
        };
        // Chunk 0 checks out; chunk 2's record lies.
        let records = [(0, value(0)), (2, value(1))];
        new_journal(&t.path().join(".big.lhjournal"), &header, records).unwrap();
        let (want, _) = open(&e, &cfg, &files);
        let Want::Send {
            skip,
            resumed_bytes,
            ..
        } = want
        else {
            panic!("{want:?}");
        };
        assert_eq!(skip, [[0, 1]]);
        assert_eq!(resumed_bytes, CHUNK);
        let f = files.lock().unwrap()[&1].clone();
        assert!(!f.fresh);
        // The journal was rewritten with the record that checked out.
        let bytes = std::fs::read(t.path().join(".big.lhjournal")).unwrap();
        let (h, kept) = parse_journal(&bytes).unwrap();
        assert_eq!(h, header);
        assert_eq!(kept, [(0, value(0))]);

        // A journal of another version of the file: started over.
        let other = Entry {
            id: 2,
            mtime_ns: e.mtime_ns + 1,
            ..e
        };
        let (want, _) = open(&other, &cfg, &no_files());
        assert!(
            matches!(&want, Want::Send { skip, resumed_bytes: 0, .. } if skip.is_empty()),
            "{want:?}"
        );
    }
}
