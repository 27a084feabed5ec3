//! The source's sampler and tuner: once an interval it reads the kernel's
//! counters of every data stream and its own storage-read time, makes a
//! [`TransferInterval`] with its limit named, and, when tuning online,
//! feeds the [`Climb`] that decides how many streams carry chunks.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use longhaul_proto::report::TcpSample;
use longhaul_proto::tune::{
    classify, rate_capped, utility, Climb, TransferInterval, TransferLimit,
};

use crate::net::sock;

/// Seconds between interval reports.
pub const INTERVAL: Duration = Duration::from_secs(1);

pub struct Sampler {
    sockets: Vec<TcpStream>,
    /// Each socket's bytes acknowledged when sampling began (its
    /// handshakes): what the far end took of the data is counted from it.
    acked_at_start: Vec<u64>,
    start: Instant,
    last_at: Instant,
    last: Vec<Option<TcpSample>>,
    /// The largest window each peer advertised: a window far below it is
    /// one the receiver is not draining.
    max_wnd: Vec<u32>,
    last_read_us: u64,
    index: u32,
    climb: Option<Climb>,
    /// Epoch of the climb: observations are summed over it.
    epoch: Duration,
    epoch_start: Instant,
    epoch_bytes: u64,
    epoch_sent: u64,
    epoch_resent: u64,
    epoch_valid: bool,
    /// Epochs ended so far; the first (slow start) is not observed.
    epochs: u32,
    /// After a change of the active streams, intervals that start before
    /// this are not measured: the streams that stay take up the share of
    /// the parked ones (or give some to the woken ones) over a few RTTs.
    settled_at: Instant,
    settle: Duration,
    /// This namespace's caps: net.core.wmem_max, the most SO_SNDBUF may be
    /// set to, so how far a send buffer that limits an interval is raised;
    /// tcp_wmem's, how far autotuning raises it without us.
    caps: sock::BufferCaps,
    /// Times the send buffers were raised online.
    pub send_buffer_raises: u32,
    /// Each stream's pacing (bytes/s) when the user capped the rate
    /// (`cp --rate`): an interval that carried it is the cap's.
    pacing: Option<u64>,
    pub intervals: Vec<TransferInterval>,
}

impl Sampler {
    /// `online`: tune the active streams, starting from all of them. The
    /// climb's epoch is 2 s or 25 RTTs, whichever is longer; it starts after
    /// the first epoch (slow start). `pacing`: each stream's pacing cap,
    /// bytes/s, when the rate was capped.
    pub fn new(
        sockets: Vec<TcpStream>,
        online: bool,
        rtt: Duration,
        pacing: Option<u64>,
    ) -> Sampler {
        let now = Instant::now();
        let n = sockets.len() as u16;
        let epoch = (rtt * 25).max(Duration::from_secs(2));
        let last: Vec<Option<TcpSample>> = sockets
            .iter()
            .map(|s| sock::tcp_info(sock::fd_of(s)))
            .collect();
        Sampler {
            acked_at_start: last
                .iter()
                .map(|t| t.map_or(0, |t| t.bytes_acked))
                .collect(),
            max_wnd: vec![0; sockets.len()],
            last,
            sockets,
            start: now,
            last_at: now,
            last_read_us: 0,
            index: 0,
            // Down to a quarter of the streams (at least 2), never above all.
            climb: (online && n > 2).then(|| Climb::new(n, (n / 4).max(2), n)),
            epoch,
            epoch_start: now,
            epoch_bytes: 0,
            epoch_sent: 0,
            epoch_resent: 0,
            epoch_valid: true,
            epochs: 0,
            settled_at: now,
            settle: (rtt * 10).max(Duration::from_secs(1)),
            caps: sock::buffer_caps(),
            send_buffer_raises: 0,
            pacing,
            intervals: Vec::new(),
        }
    }

    /// The send buffers (as the kernel reports them, the largest), bytes.
    pub fn send_buffer(&self) -> u64 {
        self.sockets
            .iter()
            .filter_map(|s| socket2::SockRef::from(s).send_buffer_size().ok())
            .max()
            .unwrap_or(0) as u64
    }

    /// An interval limited by the send buffer: the active streams' buffers
    /// doubled, up to what wmem_max lets a setting reach (beyond it the
    /// limit stays, and the shortfall warning names the sysctl). A buffer
    /// autotuning would grow as far is left to it: a setting would lock it.
    fn raise_send_buffers(&mut self, active: u16) {
        let Some(cap) = self.caps.wmem_max else {
            return;
        };
        let mut raised = false;
        for s in self.sockets.iter().take(usize::from(active)) {
            let r = socket2::SockRef::from(s);
            // The kernel reports twice what was set, and doubles a new setting.
            let now = r.send_buffer_size().unwrap_or(0) as u64;
            let Some(set) = self.caps.send_buffer_to_set(now).map(|b| b.min(cap)) else {
                continue;
            };
            if set.saturating_mul(2) > now && r.set_send_buffer_size(set as usize).is_ok() {
                raised = true;
            }
        }
        if raised {
            self.send_buffer_raises += 1;
            tracing::debug!("tuner: send buffers raised to {} bytes", self.send_buffer());
        }
    }

    pub fn streams(&self) -> u16 {
        self.sockets.len() as u16
    }

    /// Bytes the far end's TCP has acknowledged on the data streams since
    /// sampling began, read now: what has arrived there, as opposed to
    /// what was handed to the sockets (up to their buffers more).
    pub fn acked(&self) -> u64 {
        self.sockets
            .iter()
            .zip(&self.acked_at_start)
            .filter_map(|(s, &from)| {
                sock::tcp_info(sock::fd_of(s)).map(|t| t.bytes_acked.saturating_sub(from))
            })
            .sum()
    }

    pub fn climb(&self) -> Option<&Climb> {
        self.climb.as_ref()
    }

    pub fn due(&self, now: Instant) -> bool {
        now.duration_since(self.last_at) >= INTERVAL
    }

    /// Samples an interval ending now. `read_us`: the senders' storage-read
    /// time so far; `active`: streams carrying chunks; `starved`: the queue
    /// ran out of chunks (the epoch then says nothing of the streams);
    /// `held_by_files`: the streams ran dry while every file the source may
    /// have in flight was waiting for its answer.
    /// Returns the interval and, when tuning, the active streams to use.
    pub fn sample(
        &mut self,
        now: Instant,
        read_us: u64,
        active: u16,
        starved: bool,
        held_by_files: bool,
    ) -> (TransferInterval, Option<u16>) {
        let span_us = now.duration_since(self.last_at).as_micros().max(1) as u64;
        let mut i = TransferInterval {
            index: self.index,
            start_s: self.last_at.duration_since(self.start).as_secs_f64(),
            end_s: now.duration_since(self.start).as_secs_f64(),
            active_streams: active,
            ..Default::default()
        };
        let (mut busy, mut rwnd, mut sndbuf, mut open, mut rtt, mut n) =
            (0u64, 0u64, 0u64, 0.0f64, 0u64, 0u32);
        let mut windows = 0.0f64;
        for (k, s) in self.sockets.iter().enumerate() {
            let Some(t) = sock::tcp_info(sock::fd_of(s)) else {
                continue;
            };
            let prev = self.last[k].unwrap_or_default();
            i.bytes += t.bytes_acked.saturating_sub(prev.bytes_acked);
            i.retransmits += t.retransmits.saturating_sub(prev.retransmits);
            self.epoch_sent += t.bytes_sent.saturating_sub(prev.bytes_sent);
            self.epoch_resent += t.bytes_retrans.saturating_sub(prev.bytes_retrans);
            self.max_wnd[k] = self.max_wnd[k].max(t.snd_wnd);
            if k < usize::from(active) {
                busy += t.busy_us.saturating_sub(prev.busy_us);
                rwnd += t.rwnd_limited_us.saturating_sub(prev.rwnd_limited_us);
                sndbuf += t.sndbuf_limited_us.saturating_sub(prev.sndbuf_limited_us);
                if self.max_wnd[k] > 0 {
                    open += f64::from(t.snd_wnd) / f64::from(self.max_wnd[k]);
                }
                // At the path's own RTT: the smoothed one grows with the
                // very stall a receiver that does not read causes.
                let base_us = if t.min_rtt_us > 0 {
                    t.min_rtt_us
                } else {
                    t.rtt_us
                };
                if base_us > 0 {
                    windows += f64::from(self.max_wnd[k]) * 8.0 / (f64::from(base_us) / 1e6);
                }
                rtt += u64::from(t.rtt_us);
                n += 1;
            }
            self.last[k] = Some(t);
        }
        let whole = (span_us * u64::from(n.max(1))) as f64;
        i.busy = (busy as f64 / whole).min(1.0);
        i.rwnd_limited = (rwnd as f64 / whole).min(1.0);
        i.sndbuf_limited = (sndbuf as f64 / whole).min(1.0);
        i.window_open = if n > 0 { open / f64::from(n) } else { 1.0 };
        i.rtt_us = (rtt / u64::from(n.max(1))) as u32;
        i.window_bps = windows;
        let read = read_us.saturating_sub(self.last_read_us);
        self.last_read_us = read_us;
        i.read_busy = (read as f64 / (span_us * u64::from(active.max(1))) as f64).min(1.0);
        i.bits_per_second = i.bytes as f64 * 8.0 / (span_us as f64 / 1e6);
        i.rate_capped = rate_capped(&i, self.pacing, starved);
        i.limit = if i.rate_capped {
            TransferLimit::RateCap
        } else {
            classify(&i)
        };
        // Round trips per file, not the streams, held the interval back
        // (the kernel sees streams waiting on their acknowledgements).
        if held_by_files
            && matches!(
                i.limit,
                TransferLimit::Congestion | TransferLimit::Application | TransferLimit::Idle
            )
        {
            i.limit = TransferLimit::FilesInFlight;
        }
        if i.limit == TransferLimit::SendBuffer {
            self.raise_send_buffers(active);
        }
        let began = self.last_at;
        self.last_at = now;
        self.index += 1;
        self.intervals.push(i.clone());

        let next = self.epoch_step(now, began, &i, active, starved);
        (i, next)
    }

    /// The climb's epoch, from the first interval after settling: takes
    /// the interval `i` (begun at `began`) and, at an epoch's end, says
    /// the active streams to use next.
    fn epoch_step(
        &mut self,
        now: Instant,
        began: Instant,
        i: &TransferInterval,
        active: u16,
        starved: bool,
    ) -> Option<u16> {
        if began < self.settled_at {
            self.restart_epoch(now);
            return None;
        }
        self.epoch_bytes += i.bytes;
        // The user's cap held it: the epoch says nothing of the streams
        // (fewer would only carry less of the cap, each paced to its share).
        self.epoch_valid &= !starved && i.limit != TransferLimit::RateCap;
        let mut next = None;
        if now.duration_since(self.epoch_start) >= self.epoch {
            let seconds = now.duration_since(self.epoch_start).as_secs_f64();
            if let Some(c) = self.climb.as_mut() {
                if self.epoch_valid && self.epochs > 0 {
                    let rate = self.epoch_bytes as f64 * 8.0 / seconds;
                    let loss = self.epoch_resent as f64 / self.epoch_sent.max(1) as f64;
                    let at = now.duration_since(self.start).as_secs_f64();
                    let n = c.observe(at, utility(rate, loss));
                    if n != active {
                        self.settled_at = now + self.settle;
                    }
                    next = Some(n);
                }
            }
            self.restart_epoch(now);
            self.epochs += 1;
        }
        next
    }

    fn restart_epoch(&mut self, now: Instant) {
        self.epoch_start = now;
        self.epoch_bytes = 0;
        self.epoch_sent = 0;
        self.epoch_resent = 0;
        self.epoch_valid = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected stream over loopback, with its far end kept open.
    fn pair() -> (TcpStream, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    #[test]
    fn a_send_buffer_autotuning_would_grow_is_not_locked_online() {
        let (a, _b) = pair();
        let mut s = Sampler::new(vec![a], false, Duration::from_millis(80), None);
        let before = s.send_buffer();
        // Autotuning to 128 MiB, wmem_max 4 MiB: doubling the buffer by a
        // setting would lock it at 8 MiB at most.
        s.caps = sock::BufferCaps {
            rmem_max: Some(4 << 20),
            wmem_max: Some(4 << 20),
            tcp_rmem_max: Some(128 << 20),
            tcp_wmem_max: Some(128 << 20),
        };
        s.raise_send_buffers(1);
        // Autotuning reaching twice what the buffer has: as far as a doubling.
        s.caps.tcp_wmem_max = Some(before * 2);
        s.raise_send_buffers(1);
        assert_eq!((s.send_buffer_raises, s.send_buffer()), (0, before));
        // Autotuning at its end: doubled by a setting.
        (s.caps.wmem_max, s.caps.tcp_wmem_max) = (Some(before), Some(before));
        s.raise_send_buffers(1);
        assert_eq!(s.send_buffer_raises, 1);
    }

    #[test]
    fn a_set_send_buffer_limiting_an_interval_is_raised_online() {
        let (a, _b) = pair();
        socket2::SockRef::from(&a)
            .set_send_buffer_size(3 << 20)
            .unwrap();
        let mut s = Sampler::new(vec![a], false, Duration::from_millis(80), None);
        // A core cap above what the socket has, autotuning below it.
        s.caps = sock::BufferCaps {
            rmem_max: Some(4 << 20),
            wmem_max: Some(64 << 20),
            tcp_rmem_max: Some(32 << 20),
            tcp_wmem_max: Some(4 << 20),
        };
        s.raise_send_buffers(1);
        assert_eq!(s.send_buffer_raises, 1);
    }
}
