//! Bundles: whole small files read with one pread each into the records
//! of one bundle frame, written in one go, with their seals batched.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::Instant;

use longhaul_proto::digest;
use longhaul_proto::plan::Chunk;
use longhaul_proto::xfer::*;

use super::super::storage::read_exact_at;
use super::at;
use super::queue::{Event, Out, SrcFile};
use crate::stages::{timed, Stage};

/// Reads each file of `bundle` with one pread into its record of one
/// bundle frame, hashes it, writes the frame in one go, and then reports
/// the reads and the seals (each file checked unchanged as for a chunk
/// frame). A file that cannot be opened or read, or that changed, is
/// left out of the frame and reported. Errors are the stream's.
pub(super) fn send_bundle(
    w: &mut impl Write,
    bundle: &mut Vec<(Chunk, Arc<SrcFile>)>,
    frame: &mut Vec<u8>,
    out: &Out,
) -> io::Result<()> {
    let mut events = Vec::with_capacity(bundle.len() + 1);
    frame.clear();
    frame.resize(BUNDLE_HEADER_LEN, 0);
    let (mut count, mut read_bytes, mut read_us) = (0u32, 0u64, 0u64);
    for (c, f) in bundle.drain(..) {
        if add_record(frame, &c, &f, out, &mut events, &mut read_us) {
            count += 1;
            read_bytes += u64::from(c.len);
        }
    }
    if count > 0 {
        let header = BundleHeader {
            count,
            body_len: (frame.len() - BUNDLE_HEADER_LEN) as u32,
        };
        frame[..BUNDLE_HEADER_LEN].copy_from_slice(&header.encode());
        timed(Stage::Send, || w.write_all(frame))?;
        tracing::trace!("sent a bundle of {count} files, {read_bytes} bytes");
        events.push(Event::Sent {
            read_bytes,
            read_us,
        });
    }
    for e in events {
        let _ = out.tx.send(e);
    }
    Ok(())
}

/// Reads the whole of `c`'s file into a record at the end of `frame`,
/// with its trailer, and queues its seal if that was its last read: true
/// if it was added; false (and reported in `events`) if the file could
/// not be opened or read, or changed.
fn add_record(
    frame: &mut Vec<u8>,
    c: &Chunk,
    f: &SrcFile,
    out: &Out,
    events: &mut Vec<Event>,
    read_us: &mut u64,
) -> bool {
    let opened = at(out.anchor, &f.path)
        .map_err(|e| io::Error::other(e.to_string()))
        .and_then(|p| out.storage.open_read(&p));
    let reader = match opened {
        Ok(r) => r,
        Err(e) => {
            f.fail();
            events.push(Event::FileFailed(
                c.file,
                format!("cannot open {}: {e}", f.path.display()),
            ));
            return false;
        }
    };
    // The file announced, not one swapped in since.
    if let Some(why) = f.differs(reader.metadata_at_open()) {
        f.fail();
        events.push(Event::Changed(c.file, why));
        return false;
    }
    let start = frame.len();
    frame.extend_from_slice(&bundle_record_head(c.file, c.len));
    let data = frame.len();
    frame.resize(data + c.len as usize, 0);
    let t = Instant::now();
    let read = timed(Stage::Read, || {
        read_exact_at(&*reader, &mut frame[data..], 0)
    });
    *read_us += t.elapsed().as_micros() as u64;
    if let Err(e) = read {
        frame.truncate(start);
        f.fail();
        events.push(match f.changed(&*reader) {
            Some(why) => Event::Changed(c.file, why),
            None => Event::FileFailed(
                c.file,
                format!("cannot read {} at offset 0: {e}", f.path.display()),
            ),
        });
        return false;
    }
    let t = timed(Stage::Hash, || Trailer {
        check: if out.checked {
            digest::check(&frame[data..])
        } else {
            digest::NO_CHECK
        },
        value: digest::chunk_value(&frame[data..], 0, true),
    });
    frame.extend_from_slice(&t.encode());
    if let Some(resends) = f.after_read(0, false) {
        events.push(f.seal_or_changed(c.file, resends, &*reader));
    }
    true
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use longhaul_proto::plan::chunk_at;

    use super::super::super::storage::Local;
    use super::super::super::Stamp;
    use super::*;

    const CHUNK: u64 = 64 << 10;

    /// Files 1..=n of `contents` (None: announced, then gone) in a bundle.
    fn bundle_of(dir: &std::path::Path, contents: &[Option<&[u8]>]) -> Vec<(Chunk, Arc<SrcFile>)> {
        let mut bundle = Vec::new();
        for (i, data) in contents.iter().enumerate() {
            let id = i as u64 + 1;
            let p = dir.join(format!("f{id}"));
            let size = data.map_or(4, <[u8]>::len) as u64;
            std::fs::write(&p, data.unwrap_or(b"gone")).unwrap();
            let stamp = Stamp::of(&std::fs::symlink_metadata(&p).unwrap());
            if data.is_none() {
                std::fs::remove_file(&p).unwrap();
            }
            let f = SrcFile::new(p, stamp, 1, size, CHUNK);
            bundle.push((chunk_at(id, size, CHUNK, 0), Arc::new(f)));
        }
        bundle
    }

    #[test]
    fn a_bundle_carries_each_readable_file_as_a_checked_record() {
        let t = tempfile::tempdir().unwrap();
        let mut bundle = bundle_of(t.path(), &[Some(b"first file"), None, Some(b"third")]);
        let (tx, rx) = mpsc::channel();
        let out = Out {
            storage: &Local,
            anchor: &None,
            tx: &tx,
            compress: None,
            checked: true,
        };
        let (mut w, mut frame) = (Vec::new(), Vec::new());
        send_bundle(&mut w, &mut bundle, &mut frame, &out).unwrap();
        assert!(bundle.is_empty());

        let (head, body) = w.split_at(BUNDLE_HEADER_LEN);
        let h = BundleHeader::decode(head.try_into().unwrap()).unwrap();
        assert_eq!(h.count, 2);
        let records = h.records(body).unwrap();
        let got: Vec<(u64, &[u8])> = records.iter().map(|r| (r.file, r.data)).collect();
        assert_eq!(got, [(1, &b"first file"[..]), (3, &b"third"[..])]);
        for r in &records {
            assert_eq!(r.trailer.check, digest::check(r.data));
            assert_eq!(r.trailer.value, digest::chunk_value(r.data, 0, true));
        }

        let events: Vec<Event> = rx.try_iter().collect();
        assert!(matches!(events[0], Event::Sealed { id: 1, resends: 0 }));
        assert!(matches!(&events[1], Event::FileFailed(2, why) if why.contains("cannot open")));
        assert!(matches!(events[2], Event::Sealed { id: 3, resends: 0 }));
        assert!(matches!(events[3], Event::Sent { read_bytes: 15, .. }));
        assert_eq!(events.len(), 4);
    }

    #[test]
    fn a_bundle_of_nothing_readable_writes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let mut bundle = bundle_of(t.path(), &[None]);
        let (tx, rx) = mpsc::channel();
        let out = Out {
            storage: &Local,
            anchor: &None,
            tx: &tx,
            compress: None,
            checked: true,
        };
        let (mut w, mut frame) = (Vec::new(), Vec::new());
        send_bundle(&mut w, &mut bundle, &mut frame, &out).unwrap();
        assert!(w.is_empty());
        let events: Vec<Event> = rx.try_iter().collect();
        assert_eq!(events.len(), 1);
        assert!(matches!(events[0], Event::FileFailed(1, _)));
    }
}
