//! The transfer session, sans-IO: the [`source`] and [`sink`] state
//! machines that speak the messages of [`crate::xfer`]. Events and `now`
//! go in; messages to send, file and stream actions, and timers come out.
//! The engine (or the in-memory harness, `tests/transfer.rs`) drives them
//! with files, streams and a clock.
//!
//! A floor above [`crate::msg`] and [`crate::xfer`]: the messages know
//! nothing of the machines.

pub mod sink;
pub mod source;
pub mod tail;

/// A file that landed at the sink, as both ends' drivers count it
/// (progress) and the catalogue records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landed {
    /// Its path as the transfer names it.
    pub path: String,
    /// Its size and modification time as announced.
    pub size: u64,
    pub mtime_ns: i64,
    /// Its BLAKE3 (hex, what `b3sum` prints), when it is known.
    pub digest: Option<String>,
}

use std::collections::VecDeque;

use crate::msg::Message;
use crate::xfer::{FilesDone, FilesSealed, MAX_BATCH_BYTES, MAX_BATCH_ITEMS};

/// The next message to send: with `batched` (bundles negotiated), a run
/// of `FileSealed` or of `FileDone` at the front of the queue leaves as one
/// `FilesSealed` or `FilesDone` of up to [`MAX_BATCH_ITEMS`] (only a run:
/// the order of everything else is kept, e.g. a changed file's `FileDone`
/// before its new announcement).
fn next_transmit(queue: &mut VecDeque<Message>, batched: bool) -> Option<Message> {
    let first = queue.pop_front()?;
    if !batched {
        return Some(first);
    }
    match first {
        Message::FileSealed(s) if matches!(queue.front(), Some(Message::FileSealed(_))) => {
            let mut items = vec![s];
            while items.len() < MAX_BATCH_ITEMS {
                match queue.pop_front() {
                    Some(Message::FileSealed(s)) => items.push(s),
                    Some(other) => {
                        queue.push_front(other);
                        break;
                    }
                    None => break,
                }
            }
            Some(Message::FilesSealed(FilesSealed { items }))
        }
        Message::FileDone(d) if matches!(queue.front(), Some(Message::FileDone(_))) => {
            let size = |d: &crate::xfer::FileDone| {
                64 + d.error.as_ref().map_or(0, String::len)
                    + d.digest.as_ref().map_or(0, String::len)
            };
            let mut bytes = size(&d);
            let mut items = vec![d];
            while items.len() < MAX_BATCH_ITEMS && bytes < MAX_BATCH_BYTES {
                match queue.pop_front() {
                    Some(Message::FileDone(d)) => {
                        bytes = bytes.saturating_add(size(&d));
                        items.push(d);
                    }
                    Some(other) => {
                        queue.push_front(other);
                        break;
                    }
                    None => break,
                }
            }
            Some(Message::FilesDone(FilesDone { items }))
        }
        m => Some(m),
    }
}
