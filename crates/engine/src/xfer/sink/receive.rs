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
use longhaul_proto::xfer::*;

use super::super::read_frame;
use super::super::storage::write_all_at;
use super::finish::{finish, finishes_at_once};
use super::{drop_partial, io_err, Event, FileState, Files, SinkConfig, DESTINATION_FULL};
use crate::net::conn::Stream;
use crate::stages::{timed, Stage};

/// One data stream: chunk frames in, streamed through the cache in pieces
/// (hashed and written as they arrive), counted only once the trailer's
/// hash matches; bundle frames (if negotiated) in whole, each record
/// checked against its hash and then written with one write.
pub(super) fn receive(
    s: Box<dyn Stream>,
    files: &Files,
    tx: &Sender<Event>,
    fin: &Sender<Arc<FileState>>,
    cfg: &SinkConfig,
) {
    // Buffered: a small file's header, bytes and trailer come in one read;
    // big pieces bypass the buffer.
    let mut r = io::BufReader::with_capacity(256 << 10, s);
    let mut header = [0u8; CHUNK_HEADER_LEN];
    let mut trailer = [0u8; CHUNK_TRAILER_LEN];
    let mut buf = super::super::storage::AlignedBuf::new(super::super::PIECE);
    let mut body = Vec::new();
    let zeros = vec![0u8; super::super::PIECE];
    let fatal = |e: String| {
        let _ = tx.send(Event::Fatal(e));
    };
    loop {
        match timed(Stage::Receive, || read_frame(&mut r, &mut header[..1])) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return fatal(format!("data stream failed: {e}")),
        }
        if header[0] == BUNDLE_FRAME {
            if !cfg.bundles {
                return fatal("bad chunk frame: a bundle frame, which was not agreed".into());
            }
            if let Err(e) = receive_bundle(&mut r, &mut body, files, tx, fin, cfg) {
                return fatal(e);
            }
            continue;
        }
        if let Err(e) = timed(Stage::Receive, || read_all(&mut r, &mut header[1..])) {
            return fatal(format!("data stream failed: {e}"));
        }
        let h = match ChunkHeader::decode(&header) {
            Ok(h) => h,
            Err(e) => return fatal(e.to_string()),
        };
        let f = files.lock().expect("poisoned").get(&h.file).cloned();
        if let Some(f) = &f {
            let want = chunk_at(h.file, f.entry.size, f.entry.chunk_size, h.index);
            let count = chunk_count(f.entry.size, f.entry.chunk_size);
            if u64::from(h.index) >= count || (want.offset, want.len) != (h.offset, h.len) {
                return fatal(format!(
                    "chunk {} of {} does not match the file's plan",
                    h.index, f.entry.path
                ));
            }
        }
        // Bytes go to storage unless the file is gone (failed or done), the
        // chunk is verified already, or it is a hole in a fresh file.
        let target = f
            .as_ref()
            .filter(|f| f.inner.lock().expect("poisoned").ledger.wants(h.index));
        let write = target.is_some_and(|f| !(h.zero && f.fresh));
        let mut write_error = None;
        if let Some(f) = target.filter(|f| h.zero && !f.sized.load(Ordering::Relaxed)) {
            // A hole not written: the file still needs its size.
            match f.out.set_len(f.entry.size) {
                Ok(()) => f.sized.store(true, Ordering::Relaxed),
                Err(e) => write_error = Some(e),
            }
        }
        let mut write_us = 0u64;
        let mut checker = digest::Checker::new();
        let mut off = 0u64;
        while off < u64::from(h.len) {
            let n = (u64::from(h.len) - off).min(buf.len() as u64) as usize;
            let piece: &[u8] = if h.zero {
                &zeros[..n]
            } else {
                if let Err(e) = timed(Stage::Receive, || read_frame(&mut r, &mut buf[..n])) {
                    return fatal(format!("data stream failed mid-chunk: {e}"));
                }
                timed(Stage::Verify, || checker.update(&buf[..n]));
                &buf[..n]
            };
            if write && write_error.is_none() {
                let f = target.expect("write implies a target");
                let t = Instant::now();
                let _one_writer = f.write_lock.lock().expect("poisoned");
                if let Err(e) = timed(Stage::Write, || {
                    write_all_at(&*f.out, piece, h.offset + off)
                }) {
                    write_error = Some(e);
                }
                write_us += t.elapsed().as_micros() as u64;
            }
            off += n as u64;
        }
        if let Err(e) = timed(Stage::Receive, || read_frame(&mut r, &mut trailer)) {
            return fatal(format!("data stream failed mid-chunk: {e}"));
        }
        let Some(f) = target else { continue };
        let trailer = Trailer::decode(&trailer);
        let check = if h.zero {
            super::super::zero_check(h.len)
        } else {
            timed(Stage::Verify, || checker.finalize())
        };
        if check != trailer.check {
            let _ = tx.send(Event::Resend(Resend {
                id: h.file,
                index: h.index,
            }));
            continue;
        }
        let written = Written {
            index: h.index,
            hash: trailer.value,
            len: h.len,
            error: write_error,
            busy_us: write_us,
        };
        if let Err(e) = book(f, written, tx, fin, cfg) {
            return fatal(e);
        }
    }
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
    for (rec, f) in records.iter().zip(found) {
        let Some(f) = f else { continue };
        if chunk_count(f.entry.size, f.entry.chunk_size) != 1
            || rec.data.len() as u64 != f.entry.size
        {
            return Err(format!(
                "bad chunk frame: a bundle record of {} bytes for {}, announced with {} bytes in one chunk of {}",
                rec.data.len(),
                f.entry.path,
                f.entry.size,
                f.entry.chunk_size
            ));
        }
        if !f.inner.lock().expect("poisoned").ledger.wants(0) {
            continue;
        }
        if timed(Stage::Verify, || digest::check(rec.data)) != rec.trailer.check {
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
            index: 0,
            hash: rec.trailer.value,
            len: rec.data.len() as u32,
            error,
            busy_us: t.elapsed().as_micros() as u64,
        };
        book(&f, written, tx, fin, cfg)?;
    }
    Ok(())
}

/// A verified chunk as it went to storage.
struct Written {
    index: u32,
    hash: [u8; 32],
    len: u32,
    error: Option<io::Error>,
    busy_us: u64,
}

/// Books a chunk that matched its hash: a write error fails the file (a
/// full disk ends the transfer: the error returned); else the chunk is
/// journaled and verified in the ledger, and the file finished if that
/// completes it.
fn book(
    f: &Arc<FileState>,
    w: Written,
    tx: &Sender<Event>,
    fin: &Sender<Arc<FileState>>,
    cfg: &SinkConfig,
) -> Result<(), String> {
    if let Some(e) = w.error {
        let msg = io_err("write", &f.target, e);
        if msg.contains("No space left") {
            let missing = {
                let p = f.inner.lock().expect("poisoned");
                p.ledger.remaining() * f.entry.chunk_size.min(f.entry.size.max(1))
            };
            return Err(format!(
                "{DESTINATION_FULL}: {msg}; about {missing} more bytes were needed for this file. Free space and run the same command again: files in place are skipped"
            ));
        }
        f.inner.lock().expect("poisoned").ledger.fail();
        drop_partial(f);
        let _ = tx.send(Event::Done(
            FileDone {
                id: f.entry.id,
                error: Some(msg),
                ..FileDone::default()
            },
            0,
        ));
        return Ok(());
    }
    let _ = tx.send(Event::Written {
        bytes: u64::from(w.len),
        busy_us: w.busy_us,
    });
    let complete = {
        let mut p = f.inner.lock().expect("poisoned");
        if !p.ledger.wants(w.index) {
            return Ok(());
        }
        let record = journal_record(w.index, &w.hash);
        if let Err(e) = p.journal.as_mut().map_or(Ok(()), |j| j.write_all(&record)) {
            return Err(io_err("append to journal", &f.journal_path, e));
        }
        p.ledger.verified(w.index, w.hash);
        p.ledger.claim()
    };
    if complete {
        if finishes_at_once(f, cfg) {
            let done = finish(f, cfg, true);
            let _ = tx.send(Event::Done(done, f.entry.carried_bytes()));
        } else {
            let _ = fin.send(f.clone());
        }
    }
    Ok(())
}
