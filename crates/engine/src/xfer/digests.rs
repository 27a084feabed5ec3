//! The `--digests FILE` list: one `DIGEST  PATH` line per verified file,
//! written as files land so that memory stays bounded. Lines come from the
//! source's and the sink's threads; a write that fails (a full disk) is
//! kept, and [`DigestFile::finish`] reports it once the transfer is over, so
//! that an incomplete list never goes unnoticed.

use std::fs::File;
use std::io::{self, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use longhaul_proto::xfer::Failure;

use crate::EngineError;

/// The open digests file. Shared by the threads that verify files.
pub struct DigestFile {
    path: PathBuf,
    state: Mutex<State>,
}

struct State {
    out: BufWriter<File>,
    /// Lines asked for, written or not.
    lines: u64,
    /// The first error; no line is written after it.
    error: Option<io::Error>,
}

impl DigestFile {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path) -> Result<Arc<DigestFile>, EngineError> {
        let f = File::create(path).map_err(|e| {
            EngineError::Usage(format!("cannot write digests to {}: {e}", path.display()))
        })?;
        Ok(Arc::new(DigestFile {
            path: path.to_path_buf(),
            state: Mutex::new(State {
                out: BufWriter::new(f),
                lines: 0,
                error: None,
            }),
        }))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A thread that panicked holding it left at worst a partial line,
        // which the next write's error or `finish` still reports.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes one line; after a failed write, only counts it.
    pub fn line(&self, path: &str, digest: &str) {
        let mut s = self.state();
        s.lines += 1;
        if s.error.is_none() {
            if let Err(e) = writeln!(s.out, "{digest}  {path}") {
                s.error = Some(e);
            }
        }
    }

    /// Flushes the list to the file and, for a regular file, to its disk.
    /// A failure, now or of an earlier line, comes back as a failed entry
    /// naming the file, the cause and what to do.
    pub fn finish(&self) -> Result<(), Failure> {
        let mut s = self.state();
        if s.error.is_none() {
            let synced = s.out.flush().and_then(|()| {
                let f = s.out.get_ref();
                if f.metadata()?.is_file() {
                    f.sync_all()
                } else {
                    Ok(())
                }
            });
            if let Err(e) = synced {
                s.error = Some(e);
            }
        }
        match &s.error {
            None => Ok(()),
            Some(e) => Err(Failure {
                path: self.path.display().to_string(),
                error: format!(
                    "failed to write the digests list: {e}; it lacks some of the {} files' \
                     digests. The copied files are not affected: free space where the list is \
                     written (or give --digests another file) and copy again with --force to \
                     list them all",
                    s.lines
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_device_is_reported_by_finish_naming_the_file() {
        let d = DigestFile::create(Path::new("/dev/full")).expect("open /dev/full");
        for i in 0..3 {
            d.line(&format!("f{i}"), "ab");
        }
        let f = d.finish().expect_err("a full device");
        assert_eq!(f.path, "/dev/full");
        assert!(f.error.contains("No space left on device"), "{}", f.error);
        assert!(f.error.contains("some of the 3 files"), "{}", f.error);
    }

    #[test]
    fn a_good_file_gets_every_line() {
        let p = std::env::temp_dir().join(format!("lh-digests-{}", std::process::id()));
        let d = DigestFile::create(&p).expect("create");
        d.line("a", "01");
        d.line("b", "02");
        d.finish().expect("written");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "01  a\n02  b\n");
        let _ = std::fs::remove_file(&p);
    }
}
