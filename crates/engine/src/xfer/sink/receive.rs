//! A data stream's receiver: chunk frames streamed through the cache in
//! pieces (hashed and written as they arrive, counted only once the
//! trailer's hash matches), bundle frames taken whole; each verified
//! chunk journaled and booked in its file's ledger.

use std::io::{self, Write};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use longhaul_proto::digest;
use longhaul_proto::plan::{chunk_at, chunk_count};
use longhaul_proto::transfer::sink::ChunkCopy;
use longhaul_proto::xfer::compress::{block_len, Block, Decoder, BLOCK, BLOCK_WORD_LEN};
use longhaul_proto::xfer::*;

use super::super::read_frame;
use super::super::storage::{write_all_at, AlignedBuf};
use super::finish::{finish, finishes_at_once};
use super::{drop_partial, io_err, no_room, no_room_for, Event, FileState, Files, SinkConfig};
use crate::net::conn::Stream;
use crate::stages::{timed, Stage};

/// One data stream: chunk frames in, streamed through the cache in pieces
/// (hashed and written as they arrive), counted only once the trailer's
/// hash matches; bundle frames (if negotiated) in whole, each record
/// checked against its hash and then written with one write. A failure
/// of the stream, or a frame that breaks the protocol, is fatal to the
/// transfer.
pub(super) fn receive(
    s: Box<dyn Stream>,
    files: &Files,
    tx: &Sender<Event>,
    fin: &Sender<Arc<FileState>>,
    cfg: &SinkConfig,
) {
    let mut receiver = StreamReceiver {
        // Buffered: a small file's header, bytes and trailer come in one
        // read; big pieces bypass the buffer.
        r: io::BufReader::with_capacity(256 << 10, s),
        header: [0u8; CHUNK_HEADER_LEN],
        buf: AlignedBuf::new(super::super::PIECE),
        body: Vec::new(),
        zeros: vec![0u8; super::super::PIECE],
        unzip: None,
        files,
        tx,
        fin,
        cfg,
    };
    if let Err(e) = receiver.run() {
        let _ = tx.send(Event::Fatal(e));
    }
}

/// One data stream's state between frames.
struct StreamReceiver<'a> {
    r: io::BufReader<Box<dyn Stream>>,
    header: [u8; CHUNK_HEADER_LEN],
    buf: AlignedBuf,
    /// A bundle frame's records.
    body: Vec<u8>,
    zeros: Vec<u8>,
    /// `-z`: the decompressor and a block's compressed bytes, made at the
    /// first compressed chunk frame.
    unzip: Option<(Decoder, Vec<u8>)>,
    files: &'a Files,
    tx: &'a Sender<Event>,
    fin: &'a Sender<Arc<FileState>>,
    cfg: &'a SinkConfig,
}

/// A chunk's bytes as they went by: their check (None where the AEAD's
/// tag is it), and how writing them went.
struct Body {
    checker: Option<digest::Checker>,
    write_error: Option<io::Error>,
    write_us: u64,
}

impl StreamReceiver<'_> {
    /// Takes frames until the stream ends cleanly.
    fn run(&mut self) -> Result<(), String> {
        loop {
            match timed(Stage::Receive, || {
                read_frame(&mut self.r, &mut self.header[..1])
            }) {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                Err(e) => return Err(format!("data stream failed: {e}")),
            }
            if self.header[0] == COMPRESSED_CHUNK_FRAME && !self.cfg.compress {
                return Err(
                    "bad chunk frame: a compressed chunk frame, which was not agreed".into(),
                );
            }
            if self.header[0] != BUNDLE_FRAME {
                self.chunk()?;
            } else if self.cfg.bundles {
                let (files, tx, fin, cfg) = (self.files, self.tx, self.fin, self.cfg);
                receive_bundle(&mut self.r, &mut self.body, files, tx, fin, cfg)?;
            } else {
                return Err("bad chunk frame: a bundle frame, which was not agreed".into());
            }
        }
    }

    /// The rest of a chunk frame (its type byte is read): checked against
    /// its file's plan, its bytes written unless they are not wanted, and
    /// booked once its trailer's hash matches (else asked for again).
    fn chunk(&mut self) -> Result<(), String> {
        timed(Stage::Receive, || {
            read_all(&mut self.r, &mut self.header[1..])
        })
        .map_err(|e| format!("data stream failed: {e}"))?;
        let h = ChunkHeader::decode(&self.header).map_err(|e| e.to_string())?;
        let f = self.files.lock().expect("poisoned").get(&h.file).cloned();
        if let Some(f) = &f {
            check_plan(&h, &f.entry)?;
        }
        // Bytes go to storage unless the file is gone (failed or done), the
        // chunk is verified already, or it is a hole in a fresh file; a
        // copy of a chunk sent twice writes only while it holds the chunk.
        let copy = f
            .as_ref()
            .and_then(|f| f.inner.lock().expect("poisoned").ledger.take(h.index));
        let target = f.as_ref().filter(|_| copy.is_some());
        let body = self.body_of(&h, target.zip(copy), f.as_ref())?;
        let mut trailer = [0u8; CHUNK_TRAILER_LEN];
        timed(Stage::Receive, || read_frame(&mut self.r, &mut trailer))
            .map_err(|e| format!("data stream failed mid-chunk: {e}"))?;
        let Some(f) = target else { return Ok(()) };
        let trailer = Trailer::decode(&trailer);
        let check = match &body.checker {
            None => digest::NO_CHECK,
            Some(_) if h.zero => super::super::zero_check(h.len),
            Some(c) => timed(Stage::Verify, || c.finalize()),
        };
        let copy = copy.expect("a target implies a copy");
        if !f
            .inner
            .lock()
            .expect("poisoned")
            .ledger
            .holds(h.index, copy)
        {
            // A late copy of a chunk another copy took: discarded.
            return Ok(());
        }
        if check != trailer.check {
            f.inner
                .lock()
                .expect("poisoned")
                .ledger
                .release(h.index, copy);
            let _ = self.tx.send(Event::Resend(Resend {
                id: h.file,
                index: h.index,
            }));
            return Ok(());
        }
        let written = Written {
            copy: Some(copy),
            index: h.index,
            hash: trailer.value,
            len: h.len,
            error: body.write_error,
            busy_us: body.write_us,
        };
        let mut tally = Tally::default();
        let completed = book(f, written, self.tx, &mut tally)?;
        tally.flush(self.tx);
        if completed {
            complete(f, self.tx, self.fin, self.cfg);
        }
        Ok(())
    }

    /// A chunk's bytes, read in pieces (or zeros for a hole, or decoded
    /// from the blocks of a compressed chunk frame), hashed, and written to
    /// `target` unless they are not to be. `f` names the file in errors.
    fn body_of(
        &mut self,
        h: &ChunkHeader,
        target: Option<(&Arc<FileState>, ChunkCopy)>,
        f: Option<&Arc<FileState>>,
    ) -> Result<Body, String> {
        let mut write = target.is_some_and(|(f, _)| !(h.zero && f.fresh));
        let (target, copy) = (target.map(|t| t.0), target.map(|t| t.1));
        let mut body = Body {
            checker: (!self.cfg.tag_checks).then(digest::Checker::new),
            write_error: None,
            write_us: 0,
        };
        if let Some(f) = target.filter(|f| h.zero && !f.sized.load(Ordering::Relaxed)) {
            // A hole not written: the file still needs its size.
            match f.out.set_len(f.entry.size) {
                Ok(()) => f.sized.store(true, Ordering::Relaxed),
                Err(e) => body.write_error = Some(e),
            }
        }
        let mut off = 0u64;
        while off < u64::from(h.len) {
            let n = (u64::from(h.len) - off).min(self.buf.len() as u64) as usize;
            let piece: &[u8] = if h.zero {
                &self.zeros[..n]
            } else if h.compressed {
                let n = block_len(h.len, off);
                self.block(h, off, n, f)?;
                let buf = &self.buf[..n];
                verify_piece(&mut body.checker, buf);
                buf
            } else {
                let buf = &mut self.buf[..n];
                timed(Stage::Receive, || read_frame(&mut self.r, buf))
                    .map_err(|e| format!("data stream failed mid-chunk: {e}"))?;
                verify_piece(&mut body.checker, buf);
                buf
            };
            if write && body.write_error.is_none() {
                let f = target.expect("write implies a target");
                let t = Instant::now();
                let _one_writer = f.write_lock.lock().expect("poisoned");
                let copy = copy.expect("a target implies a copy");
                // Another copy took the chunk (this one stalled): it writes
                // all of it, this one nothing more.
                write = f
                    .inner
                    .lock()
                    .expect("poisoned")
                    .ledger
                    .holds(h.index, copy);
                if write {
                    if let Err(e) = timed(Stage::Write, || {
                        write_all_at(&*f.out, piece, h.offset + off)
                    }) {
                        body.write_error = Some(e);
                    }
                    body.write_us += t.elapsed().as_micros() as u64;
                }
            }
            off += n as u64;
        }
        Ok(body)
    }
}

impl StreamReceiver<'_> {
    /// One block of a compressed chunk frame, `n` raw bytes at `off` in
    /// the chunk, into `buf[..n]`: its word, then its bytes, stored or
    /// decoded with zstd into exactly `n` bytes (never more: a block that
    /// would decode to more or less, or lies about its length, ends the
    /// transfer with an error naming the chunk and its file).
    fn block(
        &mut self,
        h: &ChunkHeader,
        off: u64,
        n: usize,
        f: Option<&Arc<FileState>>,
    ) -> Result<(), String> {
        let bad = |why: FrameError| {
            let file = f.map_or_else(|| format!("file id {}", h.file), |f| f.entry.path.clone());
            format!("{why}: chunk {} (block at byte {off}) of {file}", h.index)
        };
        let mut word = [0u8; BLOCK_WORD_LEN];
        timed(Stage::Receive, || read_all(&mut self.r, &mut word))
            .map_err(|e| format!("data stream failed mid-chunk: {e}"))?;
        match Block::decode(word, n).map_err(bad)? {
            Block::Stored(_) => {
                let buf = &mut self.buf[..n];
                timed(Stage::Receive, || read_all(&mut self.r, buf))
                    .map_err(|e| format!("data stream failed mid-chunk: {e}"))?;
            }
            Block::Compressed(m) => {
                if self.unzip.is_none() {
                    let d = Decoder::new()
                        .map_err(|e| format!("cannot start a zstd decompressor: {e}"))?;
                    self.unzip = Some((d, vec![0u8; BLOCK]));
                }
                let (d, zbuf) = self.unzip.as_mut().expect("made above");
                // Shorter than the block (checked), so within zbuf.
                let wire = &mut zbuf[..m as usize];
                timed(Stage::Receive, || read_all(&mut self.r, wire))
                    .map_err(|e| format!("data stream failed mid-chunk: {e}"))?;
                d.decode(wire, &mut self.buf[..n]).map_err(bad)?;
            }
        }
        Ok(())
    }
}

/// Adds a piece to a chunk's check, if it has one.
fn verify_piece(checker: &mut Option<digest::Checker>, piece: &[u8]) {
    if let Some(c) = checker {
        timed(Stage::Verify, || c.update(piece));
    }
}

/// Whether a chunk frame's header is the chunk of `e`'s plan it names:
/// an index the file has, at that chunk's offset and of its length.
fn check_plan(h: &ChunkHeader, e: &Entry) -> Result<(), String> {
    let want = chunk_at(h.file, e.size, e.chunk_size, h.index);
    let count = chunk_count(e.size, e.chunk_size);
    if u64::from(h.index) >= count || (want.offset, want.len) != (h.offset, h.len) {
        return Err(format!(
            "chunk {} of {} does not match the file's plan",
            h.index, e.path
        ));
    }
    Ok(())
}

/// Fills `buf` from the stream: an end of stream here cuts a frame short.
fn read_all(r: &mut impl io::Read, buf: &mut [u8]) -> io::Result<()> {
    match read_frame(r, buf)? {
        true => Ok(()),
        false => Err(io::ErrorKind::UnexpectedEof.into()),
    }
}

/// The rest of a bundle frame (its type byte is read): the header,
/// checked against the caps, then the records, read whole. A record for
/// a file no longer here (landed, failed, skipped) or already verified is
/// dropped; one whose hash does not match asks for that file's chunk 0
/// again; one whose length is not the file's announced size (or for a
/// file of several chunks) breaks the protocol. Errors end the stream.
fn receive_bundle(
    r: &mut impl io::Read,
    body: &mut Vec<u8>,
    files: &Files,
    tx: &Sender<Event>,
    fin: &Sender<Arc<FileState>>,
    cfg: &SinkConfig,
) -> Result<(), String> {
    let mut head = [BUNDLE_FRAME; BUNDLE_HEADER_LEN];
    timed(Stage::Receive, || read_all(r, &mut head[1..]))
        .map_err(|e| format!("data stream failed: {e}"))?;
    let h = BundleHeader::decode(&head).map_err(|e| e.to_string())?;
    body.resize(h.body_len as usize, 0);
    timed(Stage::Receive, || read_all(r, body))
        .map_err(|e| format!("data stream failed mid-bundle: {e}"))?;
    let records = h.records(body).map_err(|e| e.to_string())?;
    let found: Vec<Option<Arc<FileState>>> = {
        let files = files.lock().expect("poisoned");
        records
            .iter()
            .map(|rec| files.get(&rec.file).cloned())
            .collect()
    };
    let mut tally = Tally::default();
    let mut completed = Vec::new();
    for (rec, f) in records.iter().zip(found) {
        let Some(f) = f else { continue };
        check_record(rec.data.len(), &f.entry)?;
        let Some(copy) = f.inner.lock().expect("poisoned").ledger.take(0) else {
            continue;
        };
        let check = if cfg.tag_checks {
            digest::NO_CHECK
        } else {
            timed(Stage::Verify, || digest::check(rec.data))
        };
        if check != rec.trailer.check {
            f.inner.lock().expect("poisoned").ledger.release(0, copy);
            let _ = tx.send(Event::Resend(Resend {
                id: rec.file,
                index: 0,
            }));
            continue;
        }
        let t = Instant::now();
        let error = if rec.data.is_empty() {
            None
        } else {
            let _one_writer = f.write_lock.lock().expect("poisoned");
            timed(Stage::Write, || write_all_at(&*f.out, rec.data, 0)).err()
        };
        let written = Written {
            copy: Some(copy),
            index: 0,
            hash: rec.trailer.value,
            len: rec.data.len() as u32,
            error,
            busy_us: t.elapsed().as_micros() as u64,
        };
        if book(&f, written, tx, &mut tally)? {
            completed.push(f);
        }
    }
    tally.flush(tx);
    for f in &completed {
        complete(f, tx, fin, cfg);
    }
    Ok(())
}

/// Whether a bundle record of `len` bytes can be all of `e`: a file of
/// one chunk, of that size.
fn check_record(len: usize, e: &Entry) -> Result<(), String> {
    if chunk_count(e.size, e.chunk_size) != 1 || len as u64 != e.size {
        return Err(format!(
            "bad chunk frame: a bundle record of {len} bytes for {}, announced with {} bytes in one chunk of {}",
            e.path, e.size, e.chunk_size
        ));
    }
    Ok(())
}

/// A verified chunk as it went to storage.
struct Written {
    /// The copy of the chunk this was: booked only if it still holds it.
    copy: Option<ChunkCopy>,
    index: u32,
    hash: [u8; 32],
    len: u32,
    error: Option<io::Error>,
    busy_us: u64,
}

/// Bytes written and the time their writes took, told to the control
/// thread once per frame ([`Event::Written`]): once per file, on a bundle
/// of small files, woke the control thread for every file (issue 45).
#[derive(Default)]
struct Tally {
    bytes: u64,
    busy_us: u64,
}

impl Tally {
    /// Tells what was written, if anything (before the files it completed
    /// are finished: the report counts their bytes).
    fn flush(self, tx: &Sender<Event>) {
        if self.bytes > 0 || self.busy_us > 0 {
            let _ = tx.send(Event::Written {
                bytes: self.bytes,
                busy_us: self.busy_us,
            });
        }
    }
}

/// Books a chunk that matched its hash: a write error fails the file (no
/// room for it is the control thread's to answer: it may come again
/// alone); else the chunk is tallied, journaled and verified in the
/// ledger. Whether that completed the file (to [`complete`] once the
/// tally is told).
fn book(
    f: &Arc<FileState>,
    w: Written,
    tx: &Sender<Event>,
    tally: &mut Tally,
) -> Result<bool, String> {
    if let Some(e) = w.error {
        give_up(f, e, "write", tx);
        return Ok(false);
    }
    let mut p = f.inner.lock().expect("poisoned");
    let held = match w.copy {
        Some(c) => p.ledger.holds(w.index, c),
        None => p.ledger.wants(w.index),
    };
    if !held {
        return Ok(false);
    }
    tally.bytes += u64::from(w.len);
    tally.busy_us += w.busy_us;
    let record = journal_record(w.index, &w.hash);
    if let Err(e) = p.journal.as_mut().map_or(Ok(()), |j| j.write_all(&record)) {
        if !no_room(&e) {
            return Err(io_err("append to journal", &f.journal_path, e));
        }
        drop(p);
        give_up(f, e, "append to the journal of", tx);
        return Ok(false);
    }
    match w.copy {
        Some(c) => p.ledger.verified_copy(w.index, c, w.hash),
        None => p.ledger.verified(w.index, w.hash),
    };
    Ok(p.ledger.claim())
}

/// Finishes a file whose every chunk is in: here if that waits on no
/// device, else on the finishers.
fn complete(
    f: &Arc<FileState>,
    tx: &Sender<Event>,
    fin: &Sender<Arc<FileState>>,
    cfg: &SinkConfig,
) {
    if finishes_at_once(f, cfg) {
        let done = finish(f, cfg, true);
        let _ = tx.send(Event::Done(done, f.entry.carried_bytes()));
    } else {
        let _ = fin.send(f.clone());
    }
}

/// A file whose write failed (`what`: the operation): nothing of it
/// stays, and the control thread hears why: no room for it, or the
/// error, which fails it.
fn give_up(f: &FileState, e: io::Error, what: &str, tx: &Sender<Event>) {
    f.inner.lock().expect("poisoned").ledger.fail();
    if no_room(&e) && f.entry.part.is_none() {
        // Its blocks go now, not when the last descriptor closes: the
        // other files in flight may need them.
        let _ = f.out.set_len(0);
    }
    drop_partial(f);
    let id = f.entry.id;
    let _ = tx.send(if no_room(&e) {
        Event::Full(id, no_room_for(&f.target, f.entry.size, &f.dir, &e))
    } else {
        let error = Some(io_err(what, &f.target, e));
        Event::Done(
            FileDone {
                id,
                error,
                ..FileDone::default()
            },
            0,
        )
    });
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{mpsc, Mutex};

    use super::super::open::open_file;
    use super::super::testing::{config, file};
    use super::*;

    const CHUNK: u64 = 64 << 10;

    fn header(file: u64, index: u32, offset: u64, len: u32) -> ChunkHeader {
        ChunkHeader {
            zero: false,
            compressed: false,
            file,
            index,
            offset,
            len,
        }
    }

    /// A chunk frame of chunk `index` of `data.len()` bytes.
    fn chunk_frame(file: u64, index: u32, data: &[u8]) -> Vec<u8> {
        let len = data.len() as u32;
        let mut frame = header(file, index, u64::from(index) * u64::from(len), len)
            .encode()
            .to_vec();
        frame.extend_from_slice(data);
        let check = digest::check(data);
        let value = digest::chunk_value(data, 0, false);
        frame.extend_from_slice(&Trailer { check, value }.encode());
        frame
    }

    /// The end game's duplicate: the first copy of a chunk stalls
    /// mid-payload on one stream after a piece of it was written (damaged,
    /// to show what lands), a resend arrives whole on another and is
    /// booked; the first copy's rest arrives late and is discarded: the
    /// file holds the resend's bytes, its journal one record, the bytes
    /// count once, and nothing is asked again.
    #[test]
    fn a_late_copy_of_a_chunk_sent_again_is_discarded() {
        use std::io::Write;
        use std::net::{TcpListener, TcpStream};
        const BIG: usize = 1 << 20;
        let t = tempfile::tempdir().unwrap();
        let cfg = config(t.path());
        let files: Files = Arc::new(Mutex::new(HashMap::new()));
        let e = file(1, "f", 2 * BIG as u64, BIG as u64);
        assert!(matches!(
            open_file(&e, &cfg, &files, &mut Default::default()),
            Ok(Want::Send { .. })
        ));
        let (tx, rx) = mpsc::channel();
        let (fin, _fin_rx) = mpsc::channel();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let pair = || {
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            (c, l.accept().unwrap().0)
        };
        let ((mut stalled, a), (mut healthy, b)) = (pair(), pair());
        let data = vec![7u8; BIG];
        let mut first = chunk_frame(1, 0, &data);
        let cut = CHUNK_HEADER_LEN + super::super::super::PIECE + 1000;
        first[CHUNK_HEADER_LEN..cut].fill(8);
        let part = t.path().join(".f.lhpart");
        let ledger = |f: &dyn Fn(&longhaul_proto::transfer::sink::FileLedger) -> bool| {
            f(&files.lock().unwrap()[&1].inner.lock().unwrap().ledger)
        };
        let until = |what: &str, done: &dyn Fn() -> bool| {
            let end = Instant::now() + std::time::Duration::from_secs(10);
            while !done() {
                assert!(Instant::now() < end, "{what}: timed out");
                std::thread::yield_now();
            }
        };
        std::thread::scope(|sc| {
            let r = |s: TcpStream| {
                let (files, tx, fin, cfg) = (&files, &tx, &fin, &cfg);
                sc.spawn(move || receive(Box::new(s), files, tx, fin, cfg))
            };
            let (ra, rb) = (r(a), r(b));
            stalled.write_all(&first[..cut]).unwrap();
            until("the first copy's first piece written", &|| {
                std::fs::read(&part).is_ok_and(|b| b.first() == Some(&8))
            });
            healthy.write_all(&chunk_frame(1, 0, &data)).unwrap();
            drop(healthy);
            rb.join().unwrap();
            assert!(ledger(&|l| !l.wants(0)), "the resend is booked");
            stalled.write_all(&first[cut..]).unwrap();
            drop(stalled);
            ra.join().unwrap();
        });
        drop((tx, fin));
        let events: Vec<Event> = rx.iter().collect();
        assert!(
            !events.iter().any(|e| matches!(e, Event::Resend(_))),
            "a late copy asks nothing again"
        );
        let written: u64 = events
            .iter()
            .map(|e| match e {
                Event::Written { bytes, .. } => *bytes,
                _ => 0,
            })
            .sum();
        assert_eq!(written, BIG as u64, "counted once");
        let on_disk = std::fs::read(&part).unwrap();
        assert!(on_disk[..BIG] == data[..], "the resend's bytes, whole");
        let journal = std::fs::read(t.path().join(".f.lhjournal")).unwrap();
        let (_, records) = parse_journal(&journal).expect("a journal");
        assert_eq!(records.len(), 1);
    }

    #[test]
    fn a_chunk_that_does_not_match_the_files_plan_is_refused() {
        // 2.5 chunks: chunks 0 and 1 full, chunk 2 half.
        let e = file(9, "f", 5 * CHUNK / 2, CHUNK);
        let half = (CHUNK / 2) as u32;
        assert!(check_plan(&header(9, 0, 0, CHUNK as u32), &e).is_ok());
        assert!(check_plan(&header(9, 2, 2 * CHUNK, half), &e).is_ok());
        for bad in [
            header(9, 1, 0, CHUNK as u32),            // at another chunk's offset
            header(9, 2, 2 * CHUNK, CHUNK as u32),    // past the file's end
            header(9, 0, 0, 1),                       // short
            header(9, 3, 3 * CHUNK, 0),               // a chunk the file lacks
            header(9, u32::MAX, u64::MAX - 10, half), // far out
        ] {
            let err = check_plan(&bad, &e).unwrap_err();
            assert!(err.contains("does not match the file's plan"), "{err}");
        }
    }

    #[test]
    fn a_bundle_record_must_be_all_of_a_one_chunk_file() {
        assert!(check_record(10, &file(1, "f", 10, CHUNK)).is_ok());
        assert!(check_record(0, &file(1, "f", 0, CHUNK)).is_ok());
        let err = check_record(9, &file(1, "f", 10, CHUNK)).unwrap_err();
        assert!(
            err.starts_with("bad chunk frame: a bundle record of 9 bytes"),
            "{err}"
        );
        // A file of two chunks never travels in a bundle.
        assert!(check_record(2 * CHUNK as usize, &file(1, "f", 2 * CHUNK, CHUNK)).is_err());
    }

    /// A bundle frame (less its type byte) of these records, checked by
    /// XXH3 or (`tagged`) left to the streams' AEAD tags.
    fn bundle(records: &[(u64, &[u8], bool)], tagged: bool) -> Vec<u8> {
        let mut body = Vec::new();
        for &(file, data, good) in records {
            body.extend_from_slice(&bundle_record_head(file, data.len() as u32));
            body.extend_from_slice(data);
            let mut check = if tagged {
                digest::NO_CHECK
            } else {
                digest::check(data)
            };
            if !good {
                check[0] ^= 1;
            }
            let t = Trailer {
                check,
                value: digest::chunk_value(data, 0, true),
            };
            body.extend_from_slice(&t.encode());
        }
        let h = BundleHeader {
            count: records.len() as u32,
            body_len: body.len() as u32,
        };
        let mut frame = h.encode()[1..].to_vec();
        frame.extend_from_slice(&body);
        frame
    }

    #[test]
    fn bundle_records_are_written_asked_again_or_dropped() {
        bundle_records_checked_by(false);
    }

    /// With tag checks, a record's check is `NO_CHECK` unless the source
    /// marked it unread: the mark is asked again like a damaged record.
    #[test]
    fn tag_checked_bundle_records_are_written_or_asked_again() {
        bundle_records_checked_by(true);
    }

    fn bundle_records_checked_by(tagged: bool) {
        let t = tempfile::tempdir().unwrap();
        let cfg = SinkConfig {
            tag_checks: tagged,
            ..config(t.path())
        };
        let files: Files = Arc::new(Mutex::new(HashMap::new()));
        for (id, size) in [(1, 5), (2, 4)] {
            let want = open_file(
                &file(id, &format!("f{id}"), size, CHUNK),
                &cfg,
                &files,
                &mut Default::default(),
            );
            assert!(matches!(want, Ok(Want::Send { .. })), "opened");
        }
        let (tx, rx) = mpsc::channel();
        let (fin, fin_rx) = mpsc::channel();
        // File 1 checks out, file 2's check does not, file 7 is not here.
        let frame = bundle(
            &[(1, b"hello", true), (2, b"oops", false), (7, b"gone", true)],
            tagged,
        );
        let mut body = Vec::new();
        receive_bundle(&mut &frame[..], &mut body, &files, &tx, &fin, &cfg).unwrap();
        drop((tx, fin));
        let events: Vec<Event> = rx.iter().collect();
        // One tally for the frame: file 1's bytes, not file 2's.
        let written: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                Event::Written { bytes, .. } => Some(*bytes),
                _ => None,
            })
            .collect();
        assert_eq!(written, [5]);
        assert!(events
            .iter()
            .any(|e| matches!(e, Event::Resend(Resend { id: 2, index: 0 }))));
        // File 1's chunk is verified and written (the file waits for its
        // seal); file 2's is still wanted.
        let wants = |id| {
            files.lock().unwrap()[&id]
                .inner
                .lock()
                .unwrap()
                .ledger
                .wants(0)
        };
        assert!(!wants(1));
        assert!(wants(2));
        assert!(fin_rx.try_recv().is_err(), "finished before its seal");
        assert_eq!(
            std::fs::read(t.path().join(".f1.lhpart")).unwrap(),
            b"hello"
        );
    }

    #[test]
    fn a_bundle_that_breaks_the_protocol_ends_the_stream() {
        let t = tempfile::tempdir().unwrap();
        let cfg = config(t.path());
        let files: Files = Arc::new(Mutex::new(HashMap::new()));
        let _ = open_file(
            &file(1, "f1", 5, CHUNK),
            &cfg,
            &files,
            &mut Default::default(),
        );
        let (tx, _rx) = mpsc::channel();
        let (fin, _fin_rx) = mpsc::channel();
        let run = |frame: &[u8]| {
            receive_bundle(&mut &frame[..], &mut Vec::new(), &files, &tx, &fin, &cfg)
        };
        // A record whose length is not the file's announced size.
        let err = run(&bundle(&[(1, b"hello!", true)], false)).unwrap_err();
        assert!(err.contains("bad chunk frame"), "{err}");
        // More records than the caps allow, or a body past its cap.
        let mut over = BundleHeader {
            count: MAX_BUNDLE_FILES + 1,
            body_len: 0,
        }
        .encode()[1..]
            .to_vec();
        assert!(run(&over).is_err());
        over = BundleHeader {
            count: 1,
            body_len: MAX_BUNDLE_BODY + 1,
        }
        .encode()[1..]
            .to_vec();
        assert!(run(&over).is_err());
        // A stream cut short mid-bundle.
        let frame = bundle(&[(1, b"hello", true)], false);
        let err = run(&frame[..frame.len() - 1]).unwrap_err();
        assert!(err.contains("mid-bundle"), "{err}");
    }
}
