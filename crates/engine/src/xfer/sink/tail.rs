//! The sink's end game (`proto::transfer::tail`): looks at the data
//! streams' sockets, and asks again the chunks of sealed files that a
//! stalled stream holds.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use longhaul_proto::plan::chunk_at;
use longhaul_proto::transfer::sink::Sink;
use longhaul_proto::transfer::tail::{EndGame, StreamsSeen};
use longhaul_proto::xfer::Resend;

use super::Files;
use crate::net::sock::{fd_of, tcp_receiving};

/// Chunks one look gathers at most (a transfer's tail holds a few).
const MOST_PENDING: usize = 256;

/// How often the sockets are looked at.
const LOOK_EVERY: Duration = Duration::from_millis(20);

pub(super) struct Tail {
    game: EndGame,
    sockets: Vec<TcpStream>,
    looked: Option<Instant>,
}

impl Tail {
    pub(super) fn new(sockets: Vec<TcpStream>) -> Tail {
        Tail {
            game: EndGame::new(),
            sockets,
            looked: None,
        }
    }

    /// Looks at the streams (at most every [`LOOK_EVERY`]) and asks again
    /// what the end game says is stuck.
    /// `walk_done`: the source announced everything (before, a silence
    /// may be its walk's, and only sealed files' chunks are on their way).
    pub(super) fn look(&mut self, m: &mut Sink, files: &Files, walk_done: bool) {
        let now = Instant::now();
        if self.looked.is_some_and(|t| now < t + LOOK_EVERY) || self.sockets.is_empty() {
            return;
        }
        self.looked = Some(now);
        self.game.observe(now, self.seen());
        if !self.game.silent(now) {
            return;
        }
        let pipes = if walk_done { self.pipes() } else { 0 };
        let mut pending = pending(files, pipes);
        // A file still opening is no stall, and its chunk is not counted
        // against the asks it may need later.
        pending.retain(|&(id, _)| m.may_resend(id));
        // Even with nothing pending: the next gathering waits the patience.
        for (id, index) in self.game.due(now, pending.iter().copied()) {
            let f = files.lock().expect("poisoned").get(&id).cloned();
            let Some(f) = f else { continue };
            let e = &f.entry;
            let len = chunk_at(id, e.size, e.chunk_size, index).len;
            // Booked before the ask leaves (the next poll_transmit), so
            // that the seal answering it is waited for.
            if m.stalled(now, Resend { id, index }, u64::from(len)) {
                f.inner.lock().expect("poisoned").ledger.damaged();
                tracing::info!(
                    "chunk {index} of {} is stuck on a stalled stream: asking for it again",
                    e.path
                );
            }
        }
    }

    /// Bytes the streams can hold on their way: twice their receive
    /// buffers (the sender's buffer is about the size of this side's).
    fn pipes(&self) -> u64 {
        self.sockets
            .iter()
            .filter_map(|t| rustix::net::sockopt::socket_recv_buffer_size(t).ok())
            .map(|b| 2 * b as u64)
            .sum()
    }

    fn seen(&self) -> StreamsSeen {
        let mut s = StreamsSeen::default();
        for t in &self.sockets {
            let fd = fd_of(t);
            if let Some((received, mss, rtt_us)) = tcp_receiving(fd) {
                s.received += received;
                s.streams += u32::from(received > 0);
                s.mss = s.mss.max(mss);
                s.rtt = s.rtt.max(Duration::from_micros(u64::from(rtt_us)));
            }
            s.unread |= rustix::io::ioctl_fionread(fd).is_ok_and(|n| n > 0);
        }
        s
    }
}

/// The chunks on their way that have not arrived: those missing from
/// files the source sealed (it read them all), and, when all that is
/// missing would fit in the streams' buffers (`pipes` bytes), those of the
/// other files too (a sender stuck mid-chunk on a stalled stream holds
/// its file's seal back).
fn pending(files: &Files, pipes: u64) -> Vec<(u64, u32)> {
    let files = files.lock().expect("poisoned");
    let (mut sealed, mut open, mut open_bytes) = (Vec::new(), Vec::new(), 0u64);
    for (id, f) in files.iter() {
        let p = f.inner.lock().expect("poisoned");
        if p.ledger.is_failed() || p.ledger.remaining() == 0 {
            continue;
        }
        let missing = p.ledger.missing().take(MOST_PENDING).map(|i| (*id, i));
        if p.ledger.is_sealed() {
            sealed.extend(missing);
        } else {
            open_bytes = open_bytes.saturating_add(p.ledger.remaining() * f.entry.chunk_size);
            open.extend(missing);
        }
        if sealed.len() + open.len() >= MOST_PENDING || open_bytes > pipes {
            open.clear();
            if sealed.len() >= MOST_PENDING {
                break;
            }
        }
    }
    if open_bytes <= pipes && !open.is_empty() {
        sealed.extend(open);
    }
    sealed.truncate(MOST_PENDING);
    sealed
}
