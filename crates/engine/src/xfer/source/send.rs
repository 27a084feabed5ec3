//! A data stream's sender: takes reads from the queue and streams each
//! chunk from its file in cache-sized pieces, hashing as it goes (holes go
//! as zero chunks), or whole small files many to a bundle frame.

use std::io::{self, Write};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use longhaul_proto::digest::ChunkHasher;
use longhaul_proto::plan::Chunk;
use longhaul_proto::xfer::compress::{Block, Encoder, Governor};
use longhaul_proto::xfer::*;

use super::super::storage::{read_exact_at, AlignedBuf, ReadAt};
use super::at;
use super::bundle::send_bundle;
use super::queue::{Event, Out, Pick, Shared, SrcFile, Taken};
use crate::net::conn::Stream;
use crate::stages::{timed, Stage};

/// Where a chunk's pieces go: a piece may be sent from the read buffer
/// itself, which it then overwrites ([`Stream::write_all_scratch`]: sealed
/// frames encrypt it in place, so each byte is read into the one buffer
/// that is hashed, sealed and sent, and takes the cache once).
pub(super) trait PieceWrite: Write {
    fn write_piece(&mut self, piece: &mut [u8]) -> io::Result<()> {
        self.write_all(piece)
    }
}

impl PieceWrite for io::BufWriter<Box<dyn Stream>> {
    fn write_piece(&mut self, piece: &mut [u8]) -> io::Result<()> {
        if piece.len() < self.capacity() {
            return self.write_all(piece);
        }
        self.flush()?;
        self.get_mut().write_all_scratch(piece)
    }
}

impl PieceWrite for Vec<u8> {}

/// A stream's compressor and the governor that says when to use it.
pub(super) struct Zip<'a> {
    enc: Encoder,
    gov: &'a Mutex<Governor>,
}

impl Zip<'_> {
    fn trying(&self) -> bool {
        self.gov.lock().expect("poisoned").trying()
    }
}

/// One data stream: sends what the queue holds until it is closed, then
/// ends the stream cleanly; a failure of the stream is fatal to the
/// transfer.
pub(super) fn send(index: u16, s: Box<dyn Stream>, shared: &Shared, out: &Out, bundles: bool) {
    let mut sender = StreamSender {
        index,
        bundles,
        shared,
        out: *out,
        // Buffered: small files' chunks (header, bytes, trailer) leave
        // many to a write; big pieces bypass the buffer. Flushed whenever
        // the queue runs dry, so nothing waits in it.
        w: io::BufWriter::with_capacity(256 << 10, s),
        unflushed: false,
        cache: None,
        buf: AlignedBuf::new(super::super::PIECE),
        bundle: Vec::new(),
        frame: Vec::new(),
        pending: None,
        zip: None,
    };
    if let Some((gov, level)) = out.compress {
        match Encoder::new(level) {
            Ok(enc) => sender.zip = Some(Zip { enc, gov }),
            Err(e) => {
                let _ = out.tx.send(Event::Fatal(format!(
                    "cannot start a zstd compressor at level {level}: {e}"
                )));
                return;
            }
        }
    }
    match sender.run() {
        Ok(()) => sender.close(),
        Err(e) => {
            let _ = out
                .tx
                .send(Event::Fatal(format!("data stream failed: {e}")));
        }
    }
}

/// One data stream's state between chunks.
struct StreamSender<'a> {
    index: u16,
    bundles: bool,
    shared: &'a Shared,
    out: Out<'a>,
    w: io::BufWriter<Box<dyn Stream>>,
    /// Written since the last flush. Not the same as bytes in `w`'s
    /// buffer: a write past its capacity goes straight to the stream,
    /// which may hold some of it too (sealed frames gather small writes,
    /// and a bundle frame longer than a sealed frame leaves its tail
    /// there), so only a flush of the stream sends everything.
    unflushed: bool,
    /// The file last read from, kept open for its next chunk.
    cache: Option<(u64, Box<dyn ReadAt>)>,
    buf: AlignedBuf,
    /// Bundles: the files of the frame being built...
    bundle: Vec<(Chunk, Arc<SrcFile>)>,
    frame: Vec<u8>,
    /// ...and the chunk that ended it (not a whole small file), sent next.
    pending: Option<Pick>,
    /// `-z`: this stream's compressor.
    zip: Option<Zip<'a>>,
}

impl StreamSender<'_> {
    /// Sends until the queue is closed and empty. Errors are the stream's.
    fn run(&mut self) -> io::Result<()> {
        while let Some(taken) = self.next()? {
            self.unflushed = true;
            match taken {
                Taken::Bundle(pending) => {
                    self.pending = pending;
                    send_bundle(&mut self.w, &mut self.bundle, &mut self.frame, &self.out)?;
                }
                Taken::One((c, resend, f)) => self.send_chunk(&c, resend, &f)?,
            }
        }
        Ok(())
    }

    /// All sent: ends the stream cleanly (TLS close_notify, FIN).
    fn close(self) {
        if let Ok(mut s) = self.w.into_inner() {
            let _ = s.close_write();
        }
    }

    /// What to send next: the chunk that ended a bundle, else what the
    /// queue has, waiting for it (and flushing what was written, through
    /// the stream, before the queue is waited on: the sink may be waiting
    /// for it to answer); None once the queue is closed.
    fn next(&mut self) -> io::Result<Option<Taken>> {
        let (q, cv) = &**self.shared;
        loop {
            if let Some(p) = self.pending.take() {
                if p.2.failed() {
                    continue;
                }
                return Ok(Some(Taken::One(p)));
            }
            let mut queue = q.lock().expect("poisoned");
            loop {
                if let Some(taken) = queue.take(self.index, self.bundles, &mut self.bundle) {
                    return Ok(Some(taken));
                }
                if self.unflushed {
                    break;
                }
                if queue.closed {
                    return Ok(None);
                }
                queue = cv.wait(queue).expect("poisoned");
            }
            drop(queue);
            timed(Stage::Send, || self.w.flush())?;
            self.unflushed = false;
        }
    }

    /// Sends one chunk, and then its file's seal if that was its last
    /// read. A file that cannot be opened or read, or that changed, is
    /// reported; errors are the stream's.
    fn send_chunk(&mut self, c: &Chunk, resend: bool, f: &SrcFile) -> io::Result<()> {
        if !self.open(c, f) {
            return Ok(());
        }
        let reader = &*self.cache.as_ref().expect("opened above").1;
        let mut read_us = 0;
        let read = write_chunk(
            &mut self.w,
            &mut self.buf,
            reader,
            c,
            f,
            self.out.tx,
            &mut read_us,
            self.zip.as_mut(),
            self.out.checked,
        )?;
        let tx = self.out.tx;
        let _ = tx.send(Event::Sent {
            read_bytes: u64::from(c.len),
            read_us,
        });
        // Once a file's last read is done, its descriptor shows whether it
        // changed while it was read: sealed for the sink, or read again.
        if let Some(resends) = read.then(|| f.after_read(c.index, resend)).flatten() {
            let _ = tx.send(f.seal_or_changed(c.file, resends, reader));
        }
        Ok(())
    }

    /// Makes `c`'s file the cached one, opening it unless it is already:
    /// false (and reported) if it cannot be opened or is no longer the
    /// file announced.
    fn open(&mut self, c: &Chunk, f: &SrcFile) -> bool {
        if self.cache.as_ref().is_some_and(|(id, _)| *id == c.file) {
            return true;
        }
        let Out {
            storage,
            anchor,
            tx,
            ..
        } = self.out;
        let opened = at(anchor, &f.path)
            .map_err(|e| io::Error::other(e.to_string()))
            .and_then(|p| storage.open_read(&p));
        match opened {
            Ok(r) => {
                // The file announced, not one swapped in since.
                if let Some(why) = f.differs(r.metadata_at_open()) {
                    f.fail();
                    let _ = tx.send(Event::Changed(c.file, why));
                    return false;
                }
                self.cache = Some((c.file, r));
                true
            }
            Err(e) => {
                f.fail();
                let _ = tx.send(Event::FileFailed(
                    c.file,
                    format!("cannot open {}: {e}", f.path.display()),
                ));
                false
            }
        }
    }
}

/// Writes one chunk frame of `c` read from `reader`: header, bytes and
/// trailer, or a zero chunk for a hole; with `zip`, while its governor
/// says so, a compressed chunk frame. True if the chunk was read whole;
/// false if a read failed (the frame then carries a check that cannot
/// match, and the failure is reported). Errors are the stream's.
// What a chunk needs from its stream, passed apart so that tests can call
// it without a stream sender.
#[allow(clippy::too_many_arguments)]
fn write_chunk(
    w: &mut impl PieceWrite,
    buf: &mut [u8],
    reader: &dyn ReadAt,
    c: &Chunk,
    f: &SrcFile,
    tx: &Sender<Event>,
    read_us: &mut u64,
    zip: Option<&mut Zip>,
    checked: bool,
) -> io::Result<bool> {
    // A file with all its blocks has no hole to look for.
    let zero = c.len > 0 && f.stamp.sparse && reader.is_hole(c.offset, u64::from(c.len));
    let compressed = !zero && c.len > 0 && zip.as_ref().is_some_and(|z| z.trying());
    if let Some(z) = zip.as_ref().filter(|_| !zero && !compressed) {
        // Sent plain while compression rests: counted toward the probe.
        let n = u64::from(c.len);
        z.gov.lock().expect("poisoned").plain(n, n);
    }
    let header = ChunkHeader {
        zero,
        compressed,
        file: c.file,
        index: c.index,
        offset: c.offset,
        len: c.len,
    };
    timed(Stage::Send, || w.write_all(&header.encode()))?;
    if zero {
        let t = timed(Stage::Hash, || {
            super::super::zero_trailer(c.offset, c.len, f.whole, checked)
        });
        return timed(Stage::Send, || w.write_all(&t.encode())).map(|()| true);
    }
    let zip = zip.filter(|_| compressed);
    let hasher = ChunkHasher::new(c.offset, f.whole, checked);
    let (hasher, read_error) = write_pieces(w, buf, reader, c, hasher, read_us, zip)?;
    let Some(e) = read_error else {
        let t = timed(Stage::Hash, || trailer_of(&hasher));
        return timed(Stage::Send, || w.write_all(&t.encode())).map(|()| true);
    };
    let mut bogus = trailer_of(&hasher);
    bogus.check[0] ^= 0xff;
    w.write_all(&bogus.encode())?;
    f.fail();
    // A file cut short while it was read changed; else the storage failed.
    let _ = tx.send(match f.changed(reader) {
        Some(why) => Event::Changed(c.file, why),
        None => Event::FileFailed(
            c.file,
            format!(
                "cannot read {} at offset {}: {e}",
                f.path.display(),
                c.offset
            ),
        ),
    });
    Ok(false)
}

/// Reads `c` in pieces of `buf`'s size, hashing and writing each (with
/// `zip`, as the blocks of a compressed chunk frame: `buf` is then
/// [`BLOCK`](longhaul_proto::xfer::compress::BLOCK) long, the blocks'
/// size); after a read fails, the rest of the chunk goes as zeros (its
/// header is out). Returns the hasher and the read error, if any; errors
/// are the stream's.
fn write_pieces(
    w: &mut impl PieceWrite,
    buf: &mut [u8],
    reader: &dyn ReadAt,
    c: &Chunk,
    mut hasher: ChunkHasher,
    read_us: &mut u64,
    mut zip: Option<&mut Zip>,
) -> io::Result<(ChunkHasher, Option<io::Error>)> {
    let mut off = 0u64;
    let mut read_error = None;
    while off < u64::from(c.len) {
        let n = (u64::from(c.len) - off).min(buf.len() as u64) as usize;
        let piece = &mut buf[..n];
        if read_error.is_none() {
            let r = Instant::now();
            if let Err(e) = timed(Stage::Read, || read_exact_at(reader, piece, c.offset + off)) {
                read_error = Some(e);
            }
            *read_us += r.elapsed().as_micros() as u64;
        }
        if read_error.is_some() {
            // Let a check that cannot match make the sink drop the chunk.
            piece.fill(0);
        }
        timed(Stage::Hash, || hasher.update(piece));
        match zip.as_deref_mut() {
            Some(z) => write_block(w, piece, z)?,
            None => timed(Stage::Send, || w.write_piece(piece))?,
        }
        off += n as u64;
    }
    Ok((hasher, read_error))
}

/// Writes one block of a compressed chunk frame: compressed if the
/// governor says to try and that saves enough, else stored; the time
/// compressing and writing it goes to the governor.
fn write_block(w: &mut impl Write, raw: &[u8], z: &mut Zip) -> io::Result<()> {
    let trying = z.trying();
    let t = Instant::now();
    let zipped = if trying { z.enc.compress(raw) } else { None };
    let compress_us = t.elapsed().as_micros() as u64;
    let (word, data) = match zipped {
        Some(d) => (Block::Compressed(d.len() as u32), d),
        None => (Block::Stored(raw.len() as u32), raw),
    };
    let t = Instant::now();
    timed(Stage::Send, || {
        w.write_all(&word.encode())?;
        w.write_all(data)
    })?;
    let write_us = t.elapsed().as_micros() as u64;
    let (n, wire) = (raw.len() as u64, (4 + data.len()) as u64);
    let mut gov = z.gov.lock().expect("poisoned");
    if trying {
        let compressed = matches!(word, Block::Compressed(_));
        gov.tried(n, wire, compressed, compress_us, write_us);
    } else {
        gov.plain(n, wire);
    }
    Ok(())
}

/// The trailer of a chunk hashed to its end.
pub(super) fn trailer_of(h: &ChunkHasher) -> Trailer {
    let (value, check) = h.finalize();
    Trailer { check, value }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use longhaul_proto::digest;
    use longhaul_proto::plan::chunk_at;

    use super::super::super::storage::{Local, Storage};
    use super::super::super::Stamp;
    use super::*;

    /// Reads as the file does up to `at`, and fails from there.
    struct FailsAt {
        inner: Box<dyn ReadAt>,
        at: u64,
    }

    impl ReadAt for FailsAt {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            if offset >= self.at {
                return Err(io::Error::other("bad sector"));
            }
            self.inner.read_at(buf, offset)
        }
        fn metadata(&self) -> io::Result<std::fs::Metadata> {
            self.inner.metadata()
        }
    }

    const SIZE: usize = 3000;

    fn data() -> Vec<u8> {
        (0..SIZE).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// A file of [`data`], its reader, and its announcement.
    fn file() -> (tempfile::TempDir, Box<dyn ReadAt>, SrcFile) {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, data()).unwrap();
        let stamp = Stamp::of(&std::fs::symlink_metadata(&p).unwrap());
        let f = SrcFile::new(p.clone(), stamp, 1, SIZE as u64, 64 << 10);
        (t, Local.open_read(&p).unwrap(), f)
    }

    fn split(frame: &[u8]) -> (ChunkHeader, &[u8], Trailer) {
        let (head, rest) = frame.split_at(CHUNK_HEADER_LEN);
        let (body, trailer) = rest.split_at(rest.len() - CHUNK_TRAILER_LEN);
        (
            ChunkHeader::decode(head.try_into().unwrap()).unwrap(),
            body,
            Trailer::decode(trailer.try_into().unwrap()),
        )
    }

    #[test]
    fn a_chunk_goes_as_header_bytes_and_trailer_read_in_pieces() {
        let (_t, reader, f) = file();
        let c = chunk_at(7, SIZE as u64, 64 << 10, 0);
        let (tx, rx) = mpsc::channel();
        let (mut w, mut buf, mut read_us) = (Vec::new(), vec![0u8; 1024], 0);
        let read = write_chunk(
            &mut w,
            &mut buf,
            &*reader,
            &c,
            &f,
            &tx,
            &mut read_us,
            None,
            true,
        )
        .unwrap();
        assert!(read);
        let (h, body, trailer) = split(&w);
        assert_eq!(
            (h.file, h.index, h.offset, h.len, h.zero),
            (7, 0, 0, SIZE as u32, false)
        );
        assert_eq!(body, data());
        assert_eq!(trailer.check, digest::check(&data()));
        assert_eq!(trailer.value, digest::chunk_value(&data(), 0, true));
        assert!(rx.try_recv().is_err(), "nothing to report");
        assert!(!f.failed());
    }

    #[test]
    fn with_tag_checks_a_chunk_carries_no_check_unless_its_read_failed() {
        let (_t, reader, f) = file();
        let c = chunk_at(7, SIZE as u64, 64 << 10, 0);
        let (tx, _rx) = mpsc::channel();
        let (mut w, mut buf, mut read_us) = (Vec::new(), vec![0u8; 1024], 0);
        write_chunk(
            &mut w,
            &mut buf,
            &*reader,
            &c,
            &f,
            &tx,
            &mut read_us,
            None,
            false,
        )
        .unwrap();
        let (_, body, trailer) = split(&w);
        assert_eq!(body, data());
        assert_eq!(trailer.check, digest::NO_CHECK);
        assert_eq!(trailer.value, digest::chunk_value(&data(), 0, true));

        let (_t, inner, f) = file();
        let reader = FailsAt { inner, at: 1024 };
        let mut w = Vec::new();
        let read = write_chunk(
            &mut w,
            &mut buf,
            &reader,
            &c,
            &f,
            &tx,
            &mut read_us,
            None,
            false,
        )
        .unwrap();
        assert!(!read);
        assert_ne!(
            split(&w).2.check,
            digest::NO_CHECK,
            "a failed read is marked"
        );
    }

    #[test]
    fn a_failed_read_fills_the_chunk_with_a_check_that_cannot_match() {
        let (_t, inner, f) = file();
        let reader = FailsAt { inner, at: 1024 };
        let c = chunk_at(7, SIZE as u64, 64 << 10, 0);
        let (tx, rx) = mpsc::channel();
        let (mut w, mut buf, mut read_us) = (Vec::new(), vec![0u8; 1024], 0);
        let read = write_chunk(
            &mut w,
            &mut buf,
            &reader,
            &c,
            &f,
            &tx,
            &mut read_us,
            None,
            true,
        )
        .unwrap();
        assert!(!read);
        let (h, body, trailer) = split(&w);
        // The header was out: the frame is whole, its bytes zero past the
        // failure, and the sink drops it.
        assert_eq!(h.len as usize, SIZE);
        assert_eq!(&body[..1024], &data()[..1024]);
        assert!(body[1024..].iter().all(|&b| b == 0));
        assert_ne!(trailer.check, digest::check(body));
        assert!(f.failed());
        match rx.try_recv() {
            Ok(Event::FileFailed(7, why)) => {
                assert!(
                    why.contains("cannot read") && why.contains("bad sector"),
                    "{why}"
                )
            }
            _ => panic!("the failed read is reported"),
        }
    }

    /// A stream that holds what is written to it until it is flushed, as
    /// sealed frames hold small writes and the tail of a long one.
    struct Held {
        tcp: std::net::TcpStream,
        held: Vec<u8>,
    }

    impl io::Read for Held {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.tcp.read(buf)
        }
    }

    impl Write for Held {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.held.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            self.tcp.write_all(&self.held)?;
            self.held.clear();
            self.tcp.flush()
        }
    }

    impl Stream for Held {
        fn tcp(&self) -> &std::net::TcpStream {
            &self.tcp
        }
        fn into_plain(self: Box<Self>) -> Result<std::net::TcpStream, Box<dyn Stream>> {
            Err(self)
        }
    }

    /// A sender that runs out of work flushes everything it wrote before
    /// it waits for more, whatever its stream still holds: a bundle frame
    /// longer than the sender's buffer goes straight to the stream, and a
    /// sealed stream kept the tail of one while the sink waited for it
    /// (issue 41 A1: a copy of many small files stalled at its end).
    #[test]
    fn an_idle_sender_leaves_nothing_held_in_its_stream() {
        use std::io::Read;
        use std::sync::{Condvar, Mutex};

        use super::super::queue::Queue;

        const FILES: u64 = 100;
        const SIZE: u64 = 4096;
        let t = tempfile::tempdir().unwrap();
        let mut q = Queue {
            active: 1,
            ..Queue::default()
        };
        for id in 1..=FILES {
            let p = t.path().join(format!("f{id}"));
            std::fs::write(&p, vec![id as u8; SIZE as usize]).unwrap();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let stamp = Stamp {
                sparse: false,
                ..Stamp::of(&meta)
            };
            let reads = q.planner.add(id, SIZE, 64 << 10, Vec::new()).unwrap();
            let f = SrcFile::new(p, stamp, reads, SIZE, 64 << 10);
            q.files.insert(id, Arc::new(f));
        }
        let shared: Shared = Arc::new((Mutex::new(q), Condvar::new()));
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        peer.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stream = Box::new(Held {
            tcp,
            held: Vec::new(),
        });
        let anchor = None;
        let out = Out {
            storage: &Local,
            anchor: &anchor,
            tx: &tx,
            compress: None,
            checked: true,
        };
        let got = std::thread::scope(|scope| {
            let shared = &shared;
            let sender = scope.spawn(move || send(0, stream, shared, &out, true));
            // The queue stays open: the sender, out of work, waits on it.
            let mut head = [0u8; BUNDLE_HEADER_LEN];
            let got = peer.read_exact(&mut head).and_then(|()| {
                let h = BundleHeader::decode(&head).map_err(io::Error::other)?;
                let mut body = vec![0u8; h.body_len as usize];
                peer.read_exact(&mut body).map(|()| h.count)
            });
            let (q, cv) = &**shared;
            q.lock().unwrap().closed = true;
            cv.notify_all();
            sender.join().unwrap();
            got
        });
        let count = got.expect("the whole bundle reached the peer while the sender waited");
        assert_eq!(u64::from(count), FILES);
        let sealed = rx
            .try_iter()
            .filter(|e| matches!(e, Event::Sealed { .. }))
            .count();
        assert_eq!(sealed as u64, FILES);
    }
}
