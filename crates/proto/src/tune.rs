//! Online tuning and per-interval diagnosis of a transfer, sans I/O.
//!
//! The source samples its data streams once a second (the kernel's
//! counters, its own storage reads) into a [`TransferInterval`], names what
//! limited that second ([`classify`]), and feeds a [`Climb`]: a hill-climb
//! on the number of streams carrying chunks, on a utility that is goodput
//! discounted by retransmissions (after Falcon: more streams than the path
//! needs only fill its queue). The climb starts from the streams sized for
//! the path and only keeps a change that measured at least as good, so the
//! tuned transfer is never held below its start.

use serde::{Deserialize, Serialize};

/// What held a transfer back over one interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferLimit {
    /// The receiver's window (its buffers) was full of data in flight.
    Window,
    /// The sender's socket buffer.
    SendBuffer,
    /// Congestion control: the path (its rate, loss, a queue).
    Congestion,
    /// The sender's own pipeline (hashing, encryption, the CPU) did not
    /// keep the sockets busy.
    Application,
    /// Reading the source files.
    StorageRead,
    /// The receiver did not drain its sockets: writing at the destination
    /// (or the receiver's CPU).
    StorageWrite,
    /// Nothing to send (waiting for the sink's wants, or the end).
    #[default]
    Idle,
    /// The source had announced as many files as it may and waited for
    /// their answers: small files at a long RTT (the count grows online up
    /// to what the sink allows; see [`grow_files_in_flight`]).
    FilesInFlight,
    /// The user's own cap (`cp --rate`, each stream paced to its share):
    /// the interval carried what was asked for (see [`rate_capped`]).
    RateCap,
}

impl TransferLimit {
    pub fn name(self) -> &'static str {
        match self {
            TransferLimit::Window => "window",
            TransferLimit::SendBuffer => "send_buffer",
            TransferLimit::Congestion => "congestion",
            TransferLimit::Application => "application",
            TransferLimit::StorageRead => "storage_read",
            TransferLimit::StorageWrite => "storage_write",
            TransferLimit::Idle => "idle",
            TransferLimit::FilesInFlight => "files_in_flight",
            TransferLimit::RateCap => "rate_cap",
        }
    }

    /// The limit's name for people (summaries, intervals, the progress
    /// bar); [`TransferLimit::name`] is the JSON name.
    pub fn label(self) -> &'static str {
        match self {
            TransferLimit::Window => "receive window",
            TransferLimit::SendBuffer => "send buffer",
            TransferLimit::Congestion => "the path (congestion control)",
            TransferLimit::Application => "the sender's pipeline (CPU)",
            TransferLimit::StorageRead => "source storage",
            TransferLimit::StorageWrite => "destination (storage or CPU)",
            TransferLimit::Idle => "idle",
            TransferLimit::FilesInFlight => "files in flight",
            TransferLimit::RateCap => "--rate",
        }
    }
}

/// The sender's view of one interval of a transfer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TransferInterval {
    pub index: u32,
    pub start_s: f64,
    pub end_s: f64,
    /// Bytes the receiver acknowledged in the interval, all streams.
    pub bytes: u64,
    pub bits_per_second: f64,
    /// Streams carrying chunks (the rest are parked by the tuner).
    pub active_streams: u16,
    pub retransmits: u64,
    /// Mean smoothed RTT of the active streams, microseconds.
    pub rtt_us: u32,
    /// Shares of the interval, averaged over the active streams: data in
    /// flight, limited by the receiver's window, by the send buffer, and
    /// the share of the senders' time spent reading storage.
    pub busy: f64,
    pub rwnd_limited: f64,
    pub sndbuf_limited: f64,
    pub read_busy: f64,
    /// The receiver's advertised window against what its buffer allows:
    /// near 0 means it is not reading what arrives.
    pub window_open: f64,
    /// What the active streams' largest advertised windows carry at the
    /// path's RTT (the smallest seen), bits/s (0: not known). An interval held by the
    /// window far below it was held by a window that closed, not by one
    /// too small for the path: the receiver did not read what arrived.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_bps: f64,
    pub limit: TransferLimit,
    /// The user's cap (`cp --rate`) held the interval ([`rate_capped`]):
    /// its limit is [`TransferLimit::RateCap`]. On the wire the limit is
    /// then the one the other rules give (an older client knows no
    /// `rate_cap`) and this flag says the rest; left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rate_capped: bool,
}

/// Names the limit of one interval. The kernel's chrono counters split the
/// time a socket had data into receive-window-limited, send-buffer-limited
/// and the rest (congestion window); a window that is closed rather than
/// small means the receiving application is not draining it.
pub fn classify(i: &TransferInterval) -> TransferLimit {
    if i.read_busy >= 0.5 {
        return TransferLimit::StorageRead;
    }
    if i.rwnd_limited >= 0.3 {
        // A window the receiver keeps full by not reading (its storage or
        // CPU) is the receiver's limit; the window's own only where the
        // rate is what the window allows at the RTT.
        let closed = i.window_open < 0.25;
        return if closed || undrained(i.bits_per_second, i.window_bps) {
            TransferLimit::StorageWrite
        } else {
            TransferLimit::Window
        };
    }
    if i.sndbuf_limited >= 0.3 {
        return TransferLimit::SendBuffer;
    }
    if i.busy >= 0.6 {
        return TransferLimit::Congestion;
    }
    if i.bytes == 0 {
        return TransferLimit::Idle;
    }
    TransferLimit::Application
}

/// Below this share of what its windows carry at the RTT, a transfer held
/// by the receive window was held by a receiver that did not drain it: a
/// window too small for the path is filled by the data in flight, which
/// then carries about all it allows.
pub const UNDRAINED: f64 = 0.5;

/// The one rule for a transfer held by the receive window (a copy's
/// interval, the doctor's run, a perf direction): carried under
/// [`UNDRAINED`] of `windows_bps`, what its windows carry at the path's
/// RTT (0: not known), it was held by a receiver that did not read, not by
/// a window too small for the path.
pub fn undrained(bits_per_second: f64, windows_bps: f64) -> bool {
    windows_bps > 0.0 && bits_per_second < windows_bps * UNDRAINED
}

/// The smallest window an autotuned stream advertises: half of
/// tcp_rmem's default 128 KiB ([`crate::window::RECV_BUFFER_USE`]);
/// autotuning only grows it.
pub const SMALLEST_WINDOW: f64 = 131_072.0 * crate::window::RECV_BUFFER_USE;

/// What `streams` streams carry at `rtt_us` (the path's smallest RTT; under
/// 100 us taken as 100, as the window plan does) each with the smallest
/// window it can have advertised: autotuning's first, or the window of a
/// receive buffer of `buffer` bytes set smaller. Bits/s; 0 when the RTT is
/// not known. A run held by the window far below this one
/// ([`undrained`]) was not held by the window's size.
pub fn smallest_windows_bps(streams: usize, rtt_us: u32, buffer: Option<u32>) -> f64 {
    if rtt_us == 0 {
        return 0.0;
    }
    let window = buffer.map_or(SMALLEST_WINDOW, |b| {
        SMALLEST_WINDOW.min(f64::from(b) * crate::window::RECV_BUFFER_USE)
    });
    window * 8.0 / (f64::from(rtt_us.max(100)) / 1e6) * streams.max(1) as f64
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// The share of the pacing cap an interval must carry for the cap to be
/// its limit. The kernel paces each stream to its share (a tenth over the
/// user's rate, `cp --rate`), so an interval at 3/4 of that, about 5/6 of
/// the rate asked for, was held by the cap; whatever else it saw (data in
/// flight all the time, an RTT grown by the paced queue) is the cap's
/// doing, not the path's congestion.
pub const RATE_CAP_SHARE: f64 = 0.75;

/// Whether the user's cap held an interval: `pacing` is each stream's
/// pacing rate (bytes/s), of which the interval's active streams carried
/// at least [`RATE_CAP_SHARE`] together. `starved`: every chunk was
/// already taken, so streams that had none left were idle, not slow: the
/// cap is then that of the streams that had data (the active streams
/// times their busy share); each is paced to its own share, so the
/// others' cannot be used.
pub fn rate_capped(i: &TransferInterval, pacing: Option<u64>, starved: bool) -> bool {
    let Some(per_stream) = pacing.filter(|&p| p > 0) else {
        return false;
    };
    let streams = f64::from(i.active_streams.max(1));
    let sending = if starved {
        streams * i.busy.clamp(0.0, 1.0)
    } else {
        streams
    };
    let cap_bps = per_stream as f64 * 8.0 * sending;
    i.bytes > 0 && cap_bps > 0.0 && i.bits_per_second >= cap_bps * RATE_CAP_SHARE
}

/// What limited a transfer as a whole: the limit of most of its intervals
/// (idle ones not counted; of equal counts, the one seen first). None
/// when every interval was idle or there were none.
pub fn verdict(intervals: &[TransferInterval]) -> Option<TransferLimit> {
    let mut by: Vec<(TransferLimit, usize)> = Vec::new();
    for i in intervals.iter().filter(|i| i.limit != TransferLimit::Idle) {
        match by.iter_mut().find(|(l, _)| *l == i.limit) {
            Some((_, n)) => *n += 1,
            None => by.push((i.limit, 1)),
        }
    }
    let most = by.iter().map(|b| b.1).max()?;
    by.into_iter().find(|b| b.1 == most).map(|b| b.0)
}

/// The climb's utility: goodput, less the share of bytes sent again (at
/// most a tenth): of two counts with the same goodput the one that wastes
/// less of the path wins, but loss never outweighs a real loss of goodput
/// by more than that tenth.
pub fn utility(bits_per_second: f64, retransmit_fraction: f64) -> f64 {
    bits_per_second * (1.0 - retransmit_fraction.clamp(0.0, 0.1))
}

/// One step of the climb, for the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClimbStep {
    pub at_s: f64,
    pub streams: u16,
    pub utility_bps: f64,
}

/// A stream count's record: the utility's moving average and when it was
/// last measured.
#[derive(Debug, Clone, Copy)]
struct Seen {
    mean: f64,
    at_epoch: u32,
}

/// A hill-climb on the number of active streams, one observation per
/// epoch. Each count tried keeps a moving average of its utility (noise
/// between epochs is 5-10% on a real path: BBR's probing, a queue filling
/// and draining), so one lucky epoch does not carry the climb away. The
/// best is the count with the highest average; a count with fewer streams
/// counts as best when it is within [`KEEP_DOWN`] of a larger one (it loads
/// the path less). Its untried neighbours are tried first, a quarter below
/// and a third above (half below, right after a step down that became the
/// best: the knee is further down, and a long transfer's first epochs
/// should not crawl to it); after [`HOLD_EPOCHS`] at the best the oldest
/// neighbour is measured again.
#[derive(Debug, Clone)]
pub struct Climb {
    min: u16,
    max: u16,
    current: u16,
    seen: std::collections::BTreeMap<u16, Seen>,
    epoch: u32,
    held: u32,
    pub steps: Vec<ClimbStep>,
}

/// Fewer streams win when within this share of more streams' utility...
pub const KEEP_DOWN: f64 = 0.98;
/// Epochs at the best before a neighbour is measured again.
pub const HOLD_EPOCHS: u32 = 4;

impl Climb {
    /// Starts at `start` streams, which the climb may lower to `min` and
    /// raise back to `max` (the streams open).
    pub fn new(start: u16, min: u16, max: u16) -> Climb {
        let max = max.max(1);
        let min = min.clamp(1, max);
        let start = start.clamp(min, max);
        Climb {
            min,
            max,
            current: start,
            seen: Default::default(),
            epoch: 0,
            held: 0,
            steps: Vec::new(),
        }
    }

    pub fn current(&self) -> u16 {
        self.current
    }

    /// The count with the best average, fewer streams winning near-ties.
    pub fn best(&self) -> u16 {
        let top = self.seen.values().map(|s| s.mean).fold(f64::MIN, f64::max);
        self.seen
            .iter()
            .find(|(_, s)| s.mean >= top * KEEP_DOWN)
            .map_or(self.current, |(&n, _)| n)
    }

    fn half_from(&self, n: u16) -> u16 {
        (n / 2).max(self.min)
    }

    fn down_from(&self, n: u16) -> u16 {
        (n - n / 4).min(n.saturating_sub(1)).max(self.min)
    }

    fn up_from(&self, n: u16) -> u16 {
        (n + n.div_ceil(3)).max(n + 1).min(self.max)
    }

    /// Takes the utility measured over an epoch at the current count and
    /// returns the count for the next epoch.
    pub fn observe(&mut self, at_s: f64, u: f64) -> u16 {
        self.steps.push(ClimbStep {
            at_s,
            streams: self.current,
            utility_bps: u,
        });
        self.epoch += 1;
        let e = self.epoch;
        let before = self.best();
        self.seen
            .entry(self.current)
            .and_modify(|s| {
                s.mean = s.mean * 0.5 + u * 0.5;
                s.at_epoch = e;
            })
            .or_insert(Seen {
                mean: u,
                at_epoch: e,
            });
        let best = self.best();
        // A step down that became the best: the knee is further down.
        let falling = best == self.current && best < before;
        let half = self.half_from(best);
        let down = if falling && half < best && !self.seen.contains_key(&half) {
            half
        } else {
            self.down_from(best)
        };
        let up = self.up_from(best);
        let untried = |n: u16, me: &Climb| n != best && !me.seen.contains_key(&n);
        let next = if untried(down, self) {
            down
        } else if untried(up, self) {
            up
        } else if self.held >= HOLD_EPOCHS {
            // Measure the neighbour heard from longest ago again.
            self.held = 0;
            [down, up]
                .into_iter()
                .filter(|&n| n != best)
                .min_by_key(|n| self.seen.get(n).map_or(0, |s| s.at_epoch))
                .unwrap_or(best)
        } else {
            self.held += 1;
            best
        };
        self.current = next;
        next
    }
}

/// Files in flight (announced to the sink and not yet finished) a sink
/// that says nothing allows: what every sink allowed before the count was
/// negotiated, and the least any sink allows.
pub const DEFAULT_FILES_IN_FLIGHT: u64 = 2048;
/// The most files in flight any sink allows (each holds a partial file
/// open there).
pub const MAX_FILES_IN_FLIGHT: u64 = 32768;
/// The file size assumed when sizing files in flight before the source has
/// seen its files: a small file of a LOSF tree.
pub const ASSUMED_FILE_SIZE: u64 = 64 << 10;

/// The files in flight a transfer starts with: enough to keep the path full
/// at `target_bps` when each file takes two round trips from announcement
/// to its `FileDone` (entries and wants, chunks and the answer), for files
/// of [`ASSUMED_FILE_SIZE`]; never fewer than [`DEFAULT_FILES_IN_FLIGHT`],
/// never more than the sink's `cap`.
pub fn initial_files_in_flight(target_bps: u64, rtt_us: u32, cap: u64) -> u64 {
    let files_per_s = target_bps as f64 / 8.0 / ASSUMED_FILE_SIZE as f64;
    let need = (files_per_s * 2.0 * f64::from(rtt_us) / 1e6).ceil() as u64;
    need.max(DEFAULT_FILES_IN_FLIGHT).min(cap.max(1))
}

/// Files in flight for the next interval. `held`: the source had announced
/// as many files as it may while its streams had nothing to send (so the
/// count, not the path, held the transfer back): doubled, up to the
/// sink's `cap`; otherwise kept.
pub fn grow_files_in_flight(limit: u64, held: bool, cap: u64) -> u64 {
    if held {
        limit.saturating_mul(2).min(cap).max(limit.min(cap))
    } else {
        limit
    }
}

/// What the tuner chose, for the summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TuningReport {
    /// False when fixed by flags (`-P`, `--no-tune`).
    pub online: bool,
    /// perf: the direction whose sending streams were tuned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<crate::params::Direction>,
    pub initial_streams: u16,
    pub final_streams: u16,
    pub chunk_size: u64,
    /// Files announced and not yet finished, at most: at the end (it grows
    /// online while it is what holds the transfer back).
    pub files_in_flight: u64,
    /// ... and at the start, sized for the path.
    #[serde(default)]
    pub initial_files_in_flight: u64,
    /// The largest send buffer of the data streams at the end, bytes as
    /// the kernel reports it (0: not known, as in perf)...
    #[serde(default)]
    pub send_buffer: u64,
    /// ... and how often an interval limited by it had them raised.
    #[serde(default)]
    pub send_buffer_raises: u32,
    pub steps: Vec<ClimbStep>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_in_flight_are_sized_for_the_path_and_grow_only_when_they_held_it() {
        // A LAN or a slow path: the default.
        assert_eq!(initial_files_in_flight(10_000_000_000, 100, 1 << 20), 2048);
        // 10 Gbit/s at 80 ms: 19,073 files of 64 KiB a second, two RTTs each.
        assert_eq!(
            initial_files_in_flight(10_000_000_000, 80_000, 1 << 20),
            3052
        );
        // Never beyond what the sink allows.
        assert_eq!(initial_files_in_flight(10_000_000_000, 540_000, 5000), 5000);
        assert_eq!(initial_files_in_flight(0, 0, 0), 1);
        assert_eq!(grow_files_in_flight(2048, false, 32768), 2048);
        assert_eq!(grow_files_in_flight(2048, true, 32768), 4096);
        assert_eq!(grow_files_in_flight(20000, true, 32768), 32768);
        assert_eq!(grow_files_in_flight(32768, true, 32768), 32768);
        assert_eq!(grow_files_in_flight(u64::MAX, true, u64::MAX), u64::MAX);
    }

    fn interval() -> TransferInterval {
        TransferInterval {
            bytes: 1 << 20,
            window_open: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn an_interval_at_the_users_cap_is_the_caps() {
        // 4 streams paced to 1.25 MB/s each: 40 Mbit/s of pacing.
        let at = |bps: f64, active: u16| TransferInterval {
            bits_per_second: bps,
            active_streams: active,
            busy: 1.0,
            ..interval()
        };
        let pacing = Some(1_250_000);
        assert!(rate_capped(&at(36e6, 4), pacing, false));
        assert!(rate_capped(&at(30e6, 4), pacing, false));
        assert!(
            !rate_capped(&at(20e6, 4), pacing, false),
            "the path held it"
        );
        // Two streams parked: the cap is the active streams'.
        assert!(rate_capped(&at(18e6, 2), pacing, false));
        // The tail: chunks all taken, one stream of four still sending
        // (busy a quarter of the time, on average) at its pacing.
        let mut tail = at(9.5e6, 4);
        tail.busy = 0.25;
        assert!(rate_capped(&tail, pacing, true));
        // ...but with chunks waiting, streams that send a quarter of the
        // time are slow, not capped.
        assert!(!rate_capped(&tail, pacing, false));
        // No cap, or nothing carried: never the cap.
        assert!(!rate_capped(&at(36e6, 4), None, false));
        assert!(!rate_capped(&at(36e6, 4), Some(0), false));
        let mut idle = at(36e6, 4);
        idle.bytes = 0;
        assert!(!rate_capped(&idle, pacing, true));
        idle.bytes = 10;
        idle.busy = 0.0;
        assert!(!rate_capped(&idle, pacing, true));
        assert_eq!(TransferLimit::RateCap.name(), "rate_cap");
        assert_eq!(
            serde_json::to_string(&TransferLimit::RateCap).unwrap(),
            "\"rate_cap\""
        );
        // The flag is left out when false, so the message is what it was.
        let plain = serde_json::to_value(interval()).unwrap();
        assert!(plain.get("rate_capped").is_none(), "{plain}");
        let capped = TransferInterval {
            rate_capped: true,
            ..interval()
        };
        let v = serde_json::to_value(&capped).unwrap();
        assert_eq!(v["rate_capped"], true);
        let back: TransferInterval = serde_json::from_value(v).unwrap();
        assert!(back.rate_capped);
    }

    #[test]
    fn the_verdict_is_the_limit_of_most_intervals() {
        let with = |l: TransferLimit| TransferInterval {
            limit: l,
            ..interval()
        };
        use TransferLimit::*;
        let v = |ls: &[TransferLimit]| verdict(&ls.iter().map(|&l| with(l)).collect::<Vec<_>>());
        assert_eq!(
            v(&[Congestion, RateCap, RateCap, Idle, Idle, Idle]),
            Some(RateCap)
        );
        assert_eq!(v(&[StorageRead, Congestion]), Some(StorageRead));
        assert_eq!(v(&[Idle, Idle]), None);
        assert_eq!(v(&[]), None);
    }

    #[test]
    fn classify_names_each_limit() {
        let i = |f: &dyn Fn(&mut TransferInterval)| {
            let mut x = interval();
            f(&mut x);
            classify(&x)
        };
        assert_eq!(i(&|x| x.read_busy = 0.8), TransferLimit::StorageRead);
        assert_eq!(i(&|x| x.rwnd_limited = 0.6), TransferLimit::Window);
        // Full windows that carry far more at the RTT than came: the
        // receiver kept them full (its writes), not the path's length;
        // windows that carry about what came are too small for the path.
        for (window_bps, limit) in [
            (200e9, TransferLimit::StorageWrite),
            (1.2e9, TransferLimit::Window),
        ] {
            let full = |x: &mut TransferInterval| {
                x.rwnd_limited = 1.0;
                x.bits_per_second = 1e9;
                x.window_bps = window_bps;
            };
            assert_eq!(i(&full), limit, "windows carrying {window_bps}");
        }
        assert_eq!(
            i(&|x| {
                x.rwnd_limited = 0.6;
                x.window_open = 0.05;
            }),
            TransferLimit::StorageWrite
        );
        assert_eq!(i(&|x| x.sndbuf_limited = 0.5), TransferLimit::SendBuffer);
        assert_eq!(i(&|x| x.busy = 0.9), TransferLimit::Congestion);
        assert_eq!(i(&|x| x.busy = 0.2), TransferLimit::Application);
        assert_eq!(i(&|x| x.bytes = 0), TransferLimit::Idle);
    }

    #[test]
    fn utility_discounts_retransmissions() {
        assert_eq!(utility(1e9, 0.0), 1e9);
        assert!((utility(1e9, 0.02) - 0.98e9).abs() < 1.0);
        assert!((utility(1e9, 1.0) - 0.9e9).abs() < 1.0);
    }

    /// Drives a climb against a utility curve; returns where it settles.
    fn settle(start: u16, max: u16, curve: impl Fn(u16) -> f64) -> (u16, Climb) {
        settle_noisy(start, max, curve, 0.0)
    }

    /// The same with +-`noise` (a share) on every observation.
    fn settle_noisy(start: u16, max: u16, curve: impl Fn(u16) -> f64, noise: f64) -> (u16, Climb) {
        let mut c = Climb::new(start, 1, max);
        let mut rng = crate::data::Rng::new(1);
        for e in 0..40 {
            let r = rng.next() as f64 / u64::MAX as f64 * 2.0 - 1.0;
            let n = c.current();
            c.observe(f64::from(e), curve(n) * (1.0 + noise * r));
        }
        (c.best(), c)
    }

    #[test]
    fn noise_does_not_carry_the_climb_below_what_the_start_does() {
        // A window-bound path (each stream 100 Mbit/s) measured with +-8%
        // noise: whatever it tries, it ends where the rate is within the
        // noise of the start's.
        let curve = |n: u16| 1e8 * f64::from(n);
        let (best, c) = settle_noisy(19, 19, curve, 0.08);
        assert!(
            curve(best) >= curve(19) * 0.8,
            "settled at {best}: {:?}",
            c.steps
        );
        // A flat path (any count does the same): fewer streams win.
        let (best, c) = settle_noisy(19, 19, |_| 2e9, 0.08);
        assert!(best < 19, "settled at {best}: {:?}", c.steps);
    }

    #[test]
    fn climbs_down_to_the_knee_of_a_shared_queue() {
        // Goodput flat from 4 streams up, retransmissions growing with more:
        // the utility peaks at 4-6.
        let curve = |n: u16| {
            let rate = 2e9 * f64::from(n.min(4)) / 4.0;
            let loss = if n > 6 { 0.01 * f64::from(n - 6) } else { 0.0 };
            utility(rate, loss)
        };
        let (best, c) = settle(19, 19, curve);
        assert!((4..=6).contains(&best), "settled at {best}: {:?}", c.steps);
        assert_eq!(c.best(), best);
        // Never held below the start's utility.
        assert!(curve(best) >= curve(19));
    }

    #[test]
    fn a_far_knee_is_reached_in_a_few_epochs() {
        // 32 streams open where 4-6 fill the path: each step down that
        // pays off is followed by a halving, so the knee is found in four
        // epochs, not the seven quarter steps would take.
        let curve = |n: u16| {
            let rate = 2e9 * f64::from(n.min(4)) / 4.0;
            let loss = if n > 6 { 0.01 * f64::from(n - 6) } else { 0.0 };
            utility(rate, loss)
        };
        let mut c = Climb::new(32, 1, 32);
        for e in 0..4 {
            let n = c.current();
            c.observe(f64::from(e), curve(n));
        }
        assert!((4..=6).contains(&c.best()), "{:?}", c.steps);
    }

    #[test]
    fn keeps_the_start_when_fewer_streams_do_worse() {
        // A window-bound path: each stream carries 100 Mbit/s.
        let curve = |n: u16| 1e8 * f64::from(n);
        let (best, c) = settle(8, 8, curve);
        assert_eq!(best, 8, "{:?}", c.steps);
    }

    #[test]
    fn climbs_up_when_more_streams_help() {
        let curve = |n: u16| 1e8 * f64::from(n.min(12));
        let (best, c) = settle(4, 16, curve);
        assert!(best >= 12, "settled at {best}: {:?}", c.steps);
    }

    #[test]
    fn bounds_hold() {
        let mut c = Climb::new(50, 3, 10);
        assert_eq!(c.current(), 10);
        for e in 0..30 {
            let n = c.observe(f64::from(e), 1.0);
            assert!((3..=10).contains(&n), "{n}");
        }
        let mut one = Climb::new(1, 1, 1);
        for e in 0..5 {
            assert_eq!(one.observe(f64::from(e), f64::from(e)), 1);
        }
        assert_eq!(one.best(), 1);
    }
}
