//! Resume journals: written afresh with the records that checked out
//! (never through a planted link), and read back only when they are
//! plainly a journal of this file.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use longhaul_proto::xfer::*;

/// Writes a journal afresh at `at`: the header and the `records` that
/// checked out, in a new inode (never written through a link planted in
/// its name); returns it open for appending.
pub(super) fn new_journal(
    at: &Path,
    header: &JournalHeader,
    records: impl IntoIterator<Item = (u32, [u8; 32])>,
) -> io::Result<File> {
    match std::fs::remove_file(at) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut j = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(at)?;
    j.write_all(&header.encode())?;
    for (i, h) in records {
        j.write_all(&journal_record(i, &h))?;
    }
    Ok(j)
}

/// Reads a resume journal, if there is a usable one: a regular file with
/// one name (never through a link, never a FIFO or device, which would
/// hang or feed the reader without end), no longer than a journal of
/// `chunks` chunks can be. Anything else is ignored: the file starts over.
pub(super) fn read_journal(path: &Path, chunks: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let most = JOURNAL_HEADER_LEN as u64 + chunks.saturating_mul(JOURNAL_RECORD_LEN as u64);
    let f = super::super::storage::open_regular(path, OpenOptions::new().read(true)).ok()?;
    let m = f.metadata().ok()?;
    if m.nlink() != 1 || m.len() > most {
        tracing::warn!(
            "ignoring the journal {}: {}",
            path.display(),
            if m.nlink() != 1 {
                "it has other names (hard links)"
            } else {
                "it is longer than a journal of this file can be"
            }
        );
        return None;
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    f.take(most).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}
