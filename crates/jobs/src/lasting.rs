//! Whether an entry's failure would recur at every attempt (permanent) or
//! may pass (transient), read from its error as the transfer words it.
//!
//! A job retries an entry only for a transient failure: its source there
//! but the network, a timeout, the far end gone, or a full destination
//! (space can be freed while the job backs off). A permanent one is what
//! the source or the destination says of the entry itself: a directory
//! named without `-r`, a path that is not there, permission refused (by
//! the file system or by an export's grant), a kind of file that is never
//! copied. Each would fail the same way at every attempt, so the entry is
//! failed at its first and the job ends without waiting for retries of it.
//!
//! The errors are text (a pull's far end words its failures, and so does
//! a push's destination): the words matched are those longhaul's own
//! messages and the operating system's `strerror` put in them. What is not
//! recognised is transient: at worst, a permanent failure that says
//! something new is retried, as every failure was before.

use rustix::io::Errno;

/// What longhaul says of an entry that no attempt would copy.
const PERMANENT_WORDS: &[&str] = &[
    "leads outside what this job's capability",
    "authentication required to",
    "not a regular file, directory or symlink",
    "name is not UTF-8",
];

/// The operating system's errors that an entry keeps until someone changes
/// it: not there, not allowed, not of a kind that can be opened so.
const PERMANENT_ERRNOS: &[Errno] = &[
    Errno::ACCESS,
    Errno::PERM,
    Errno::NOTDIR,
    Errno::ROFS,
    Errno::NAMETOOLONG,
    Errno::LOOP,
];

/// Whether an `error` says that what it names is not there.
pub fn not_there(error: &str) -> bool {
    error.contains("does not exist") || error.contains(&strerror(Errno::NOENT))
}

/// Whether a failure with this `error` would recur at every attempt.
pub fn permanent(error: &str) -> bool {
    let without_r = longhaul_engine::xfer::source::directory_without_r(&"");
    error.contains(without_r.trim_start())
        || not_there(error)
        || PERMANENT_WORDS.iter().any(|w| error.contains(w))
        || refused_by_grant(error)
        || PERMANENT_ERRNOS
            .iter()
            .any(|e| error.contains(&strerror(*e)))
}

/// An export's grant refused the entry: "GRANT may not read export 'x'",
/// or the export takes no writes.
fn refused_by_grant(error: &str) -> bool {
    (error.contains(" may not ") || error.contains("is read-only")) && error.contains("export '")
}

/// How the operating system words `e` (its `strerror`, without the
/// "(os error N)" that Rust adds).
fn strerror(e: Errno) -> String {
    let said = std::io::Error::from(e).to_string();
    match said.rfind(" (os error") {
        Some(at) => said[..at].to_string(),
        None => said,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_source_says_of_an_entry_is_permanent() {
        for error in [
            "src:tree is a directory: use -r to copy trees",
            "data:tree/ is a directory: use -r to copy trees",
            "cannot read data/g: No such file or directory (os error 2)",
            "data:run7 does not exist",
            "failed to open tree/locked.bin: Permission denied (os error 13)",
            "failed to create in/x: Read-only file system (os error 30)",
            "cannot read link: Operation not permitted (os error 1)",
            "failed to create in/f/x: Not a directory (os error 20)",
            "not a regular file, directory or symlink; skipped",
            "tree/\\xff: name is not UTF-8; skipped",
            "g1 may not read export 'data'",
            "export 'in' is read-only",
            "data/escape leads outside what this job's capability reads (data/{tree}) through a symbolic link: name the path the link leads to in the job",
        ] {
            assert!(permanent(error), "{error}");
        }
    }

    #[test]
    fn the_network_the_far_end_and_a_full_destination_are_transient() {
        for error in [
            "data stream failed: Connection reset by peer (os error 104)",
            "connection closed by the peer",
            "timed out after 30 s waiting for the far end",
            "it moved nothing for 120 s (a stalled connection): stopped, to be tried again",
            "destination full: no room for big.bin (needs 1 GiB, 10 MiB free)",
            "failed to write in/big.bin: No space left on device (os error 28)",
            "failed to write in/big.bin: Disk quota exceeded (os error 122)",
            "changed while it was read, and is no longer a regular file",
            "cannot read data/g: Input/output error (os error 5)",
            "",
        ] {
            assert!(!permanent(error), "{error}");
        }
    }

    #[test]
    fn the_systems_words_are_its_own() {
        assert_eq!(strerror(Errno::NOENT), "No such file or directory");
        assert_eq!(strerror(Errno::ACCESS), "Permission denied");
    }
}
