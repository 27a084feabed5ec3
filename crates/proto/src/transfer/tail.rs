//! The end game of a transfer (BitTorrent's, FDT's and GridFTP's): when
//! all that is left of it is chunks in flight on a stream that stalled (a
//! connection in RTO back-off, a dead path, a peer's stuck socket) while
//! the other streams are idle, the sink asks for those chunks again, and
//! the source sends them on another stream; whichever copy is first to
//! take the chunk whole is kept ([`super::sink::FileLedger::take`]).
//!
//! The sink judges, since only it knows which chunks are missing: every
//! chunk still missing belongs to a file the source has sealed (every read
//! of it done: its chunks are all on their way), and no data stream has
//! received a byte for the *patience*, while none holds bytes the sink has
//! not read (else the sink, not the network, is behind). The patience is
//! the longest a live TCP stream goes without a byte, from what the
//! streams show: four round trips, four segments' time at the rate each
//! stream carried, and never below TCP's minimum retransmission timeout
//! (200 ms: a stream silent longer is retransmitting on a timer, or
//! dead). Each round asks every such chunk again, at most
//! [`MAX_STALL_RESENDS`] times a chunk; a next round waits the patience
//! again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// TCP's minimum retransmission timeout (Linux's `TCP_RTO_MIN`).
pub const RTO_MIN: Duration = Duration::from_millis(200);

/// Times one chunk is asked again for a stall; then the transfer's idle
/// time-out has the last word.
pub const MAX_STALL_RESENDS: u32 = 3;

/// What the sink sees of its data streams at one look.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamsSeen {
    /// Bytes all streams received so far (the kernel's count).
    pub received: u64,
    /// Streams that received anything.
    pub streams: u32,
    /// Some stream holds bytes the sink has not read yet.
    pub unread: bool,
    /// The streams' round trip (the receiver's estimate) and segment size.
    pub rtt: Duration,
    pub mss: u32,
}

/// The sink's end game: when to ask stuck chunks again.
#[derive(Debug, Default)]
pub struct EndGame {
    received: u64,
    first_byte: Option<Instant>,
    last_byte: Option<Instant>,
    /// When a stream last received a byte (or the sink last caught up).
    progress: Option<Instant>,
    /// When the last round went out.
    round: Option<Instant>,
    seen: StreamsSeen,
    asked: HashMap<(u64, u32), u32>,
}

impl EndGame {
    pub fn new() -> Self {
        Self::default()
    }

    /// A look at the streams at `now`.
    pub fn observe(&mut self, now: Instant, seen: StreamsSeen) {
        if seen.received > self.received {
            self.first_byte.get_or_insert(now);
            self.last_byte = Some(now);
            self.progress = Some(now);
            self.received = seen.received;
        }
        if seen.unread {
            self.progress = Some(now);
        }
        self.seen = seen;
    }

    /// The longest a live stream goes without a byte (module docs), each
    /// stream's rate taken over the time bytes flowed.
    pub fn patience(&self) -> Duration {
        let s = &self.seen;
        let active = match (self.first_byte, self.last_byte) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        let per_stream = self.received as f64 / active.max(1e-3) / f64::from(s.streams.max(1));
        let segments = Duration::from_secs_f64(4.0 * f64::from(s.mss) / per_stream.max(1.0));
        RTO_MIN
            .max(s.rtt * 4)
            .max(segments.min(Duration::from_secs(60)))
    }

    /// Whether the streams have been silent for the patience since the
    /// last byte and the last round: a round may be due (cheap: the
    /// driver gathers its pending chunks only then).
    pub fn silent(&self, now: Instant) -> bool {
        let Some(progress) = self.progress else {
            return false;
        };
        let since = self.round.map_or(progress, |r| r.max(progress));
        now >= since + self.patience()
    }

    /// The chunks of `pending` (file, chunk: missing from sealed files) to
    /// ask again now: none unless the streams have been silent for the
    /// patience since the last byte and the last round.
    pub fn due(
        &mut self,
        now: Instant,
        pending: impl IntoIterator<Item = (u64, u32)>,
    ) -> Vec<(u64, u32)> {
        if !self.silent(now) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for c in pending {
            let n = self.asked.entry(c).or_insert(0);
            if *n < MAX_STALL_RESENDS {
                *n += 1;
                out.push(c);
            }
        }
        // A round that asks nothing waits the patience too: the driver's
        // gathering walks every open file's chunks.
        self.round = Some(now);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn seen(received: u64, rtt: Duration) -> StreamsSeen {
        StreamsSeen {
            received,
            streams: 4,
            unread: false,
            rtt,
            mss: 1448,
        }
    }

    #[test]
    fn a_stall_is_judged_from_the_streams_pace() {
        let t0 = Instant::now();
        let mut g = EndGame::new();
        // Nothing arrived yet: nothing is stalled.
        assert!(g.due(t0 + 10 * MS * 1000, [(1, 0)]).is_empty());
        // 4 streams carried 400 MB in 1 s at an 80 ms RTT: four round
        // trips (320 ms) is the patience.
        g.observe(t0, seen(1, 80 * MS));
        g.observe(t0 + 1000 * MS, seen(400_000_000, 80 * MS));
        assert_eq!(g.patience(), 320 * MS);
        assert!(g.due(t0 + 1300 * MS, [(1, 0)]).is_empty(), "not yet");
        // A byte arrived: the clock starts again.
        g.observe(t0 + 1300 * MS, seen(400_000_001, 80 * MS));
        assert!(g.due(t0 + 1500 * MS, [(1, 0)]).is_empty());
        assert_eq!(g.due(t0 + 1620 * MS, [(1, 0), (2, 3)]), [(1, 0), (2, 3)]);
        // A next round waits the patience again, and stops after three.
        assert!(g.due(t0 + 1700 * MS, [(1, 0)]).is_empty());
        assert_eq!(g.due(t0 + 1940 * MS, [(1, 0)]), [(1, 0)]);
        assert_eq!(g.due(t0 + 2300 * MS, [(1, 0)]), [(1, 0)]);
        assert!(g.due(t0 + 9000 * MS, [(1, 0)]).is_empty(), "asked 3 times");
        assert_eq!(g.due(t0 + 9320 * MS, [(2, 3)]), [(2, 3)]);
    }

    /// A sender that stops once every chunk left was asked its 3 times
    /// would have the sink gather its pending chunks (a walk of every open
    /// file's chunks) at every look, 50 times a second, until the idle
    /// time-out: a round that asks nothing waits the patience as well.
    #[test]
    fn attacker_a_round_that_asks_nothing_waits_the_patience_again() {
        let t0 = Instant::now();
        let mut g = EndGame::new();
        g.observe(t0, seen(1, MS));
        g.observe(t0 + 1000 * MS, seen(400_000_000, MS));
        let mut at = t0 + 1000 * MS;
        for _ in 0..MAX_STALL_RESENDS {
            at += RTO_MIN;
            assert_eq!(g.due(at, [(1, 0)]), [(1, 0)]);
        }
        at += RTO_MIN;
        assert!(g.silent(at));
        assert!(g.due(at, [(1, 0)]).is_empty(), "asked 3 times");
        assert!(!g.silent(at + 20 * MS), "the next look waits");
        assert!(g.silent(at + RTO_MIN));
    }

    #[test]
    fn the_patience_is_never_below_the_minimum_rto_and_grows_on_a_slow_path() {
        let t0 = Instant::now();
        let mut g = EndGame::new();
        g.observe(t0, seen(1, Duration::from_micros(50)));
        g.observe(t0 + 1000 * MS, seen(100_000_000, Duration::from_micros(50)));
        assert_eq!(g.patience(), RTO_MIN, "loopback");
        // 20 Mbit/s over 4 streams of 64 KiB segments: a segment each
        // 100 ms a stream; four of them.
        let mut g = EndGame::new();
        let mut s = seen(1, 10 * MS);
        s.mss = 62_500;
        g.observe(t0, s);
        s.received = 2_500_000;
        g.observe(t0 + 1000 * MS, s);
        let p = g.patience().as_secs_f64();
        assert!((p - 0.4).abs() < 1e-6, "{p}");
    }

    #[test]
    fn nothing_is_asked_again_while_the_streams_carry_bytes() {
        let t0 = Instant::now();
        let mut g = EndGame::new();
        // Bytes come every 150 ms (less than the 200 ms patience), for a
        // minute, chunks pending all along.
        for step in 0..400u32 {
            let now = t0 + 150 * MS * step;
            g.observe(now, seen(1 + u64::from(step) * 1_000_000, MS));
            assert!(!g.silent(now + 149 * MS));
            assert!(g.due(now + 149 * MS, [(1, 0), (1, 1)]).is_empty());
        }
        // Then silence: the next look past the patience asks both.
        let last = t0 + 150 * MS * 399;
        assert_eq!(g.due(last + 400 * MS, [(1, 0), (1, 1)]), [(1, 0), (1, 1)]);
    }

    #[test]
    fn a_sink_behind_its_streams_is_no_stall() {
        let t0 = Instant::now();
        let mut g = EndGame::new();
        g.observe(t0, seen(1, MS));
        g.observe(t0 + 1000 * MS, seen(400_000_000, MS));
        let mut s = seen(400_000_000, MS);
        s.unread = true;
        g.observe(t0 + 5000 * MS, s);
        assert!(g.due(t0 + 5100 * MS, [(1, 0)]).is_empty());
        assert_eq!(g.due(t0 + 5300 * MS, [(1, 0)]), [(1, 0)]);
    }
}
