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
use super::queue::{Event, SrcFile};
use super::send::Out;
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
                continue;
            }
        };
        // The file announced, not one swapped in since.
        if let Some(why) = f.differs(reader.metadata_at_open()) {
            f.fail();
            events.push(Event::Changed(c.file, why));
            continue;
        }
        let start = frame.len();
        frame.extend_from_slice(&bundle_record_head(c.file, c.len));
        let data = frame.len();
        frame.resize(data + c.len as usize, 0);
        let t = Instant::now();
        let read = timed(Stage::Read, || {
            read_exact_at(&*reader, &mut frame[data..], 0)
        });
        read_us += t.elapsed().as_micros() as u64;
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
            continue;
        }
        let t = timed(Stage::Hash, || Trailer {
            check: digest::check(&frame[data..]),
            value: digest::chunk_value(&frame[data..], 0, true),
        });
        frame.extend_from_slice(&t.encode());
        count += 1;
        read_bytes += u64::from(c.len);
        if let Some(resends) = f.after_read(false) {
            events.push(f.seal_or_changed(c.file, resends, &*reader));
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
