//! Sizing a transfer for its path: how much one TCP stream can keep in
//! flight under both hosts' socket-buffer caps, what that allows at the
//! measured round-trip time, and so how many streams a target rate needs.
//!
//! Pure arithmetic over numbers the engine measured (RTT from TCP_INFO,
//! caps from sysctls of both hosts): no I/O here.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::params::Direction;

/// A host's caps on TCP socket buffers (its sysctls), bytes; None where
/// the host could not read them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferCaps {
    /// net.core.rmem_max: the most SO_RCVBUF may ask for (the kernel doubles it).
    pub rmem_max: Option<u64>,
    /// net.core.wmem_max: the most SO_SNDBUF may ask for (the kernel doubles it).
    pub wmem_max: Option<u64>,
    /// The third number of net.ipv4.tcp_rmem: where receive autotuning stops.
    pub tcp_rmem_max: Option<u64>,
    /// The third number of net.ipv4.tcp_wmem: where send autotuning stops.
    pub tcp_wmem_max: Option<u64>,
}

/// The share of a send buffer that is data in flight; the rest is the
/// kernel's per-packet overhead and data not yet sent. Measured on Linux
/// 6.18 at 80 ms (MTU 9000): 4 MiB autotuned moved 270 Mbit/s, an 8 MiB
/// SO_SNDBUF 531 Mbit/s, both about 0.65.
pub const SEND_BUFFER_USE: f64 = 0.65;
/// The share of a receive buffer advertised as window (tcp_rmem's
/// scaling ratio is about half for small segments, more for large).
pub const RECV_BUFFER_USE: f64 = 0.5;

/// Streams chosen when the path does not ask for more.
pub const DEFAULT_STREAMS: u16 = 4;
/// The most streams the automatic choice opens.
pub const MAX_AUTO_STREAMS: u16 = 32;
/// The rate sized for when none is given: a common DTN interface.
pub const DEFAULT_TARGET_BPS: u64 = 10_000_000_000;

/// How one side should set a socket buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferChoice {
    /// Leave autotuning on; it grows up to this many bytes.
    Auto(u64),
    /// Set SO_SNDBUF/SO_RCVBUF to this (the kernel doubles it): more than
    /// autotuning allows on this host.
    Set(u64),
}

impl BufferChoice {
    /// The buffer the kernel will allow, bytes.
    pub fn bytes(self) -> u64 {
        match self {
            BufferChoice::Auto(b) => b,
            BufferChoice::Set(b) => b.saturating_mul(2),
        }
    }

    /// The size to ask for with setsockopt, if any.
    pub fn to_set(self) -> Option<u64> {
        match self {
            BufferChoice::Set(b) => Some(b),
            BufferChoice::Auto(_) => None,
        }
    }
}

/// The autotuning maximum assumed where a host's cannot be read: Linux's
/// default third number of tcp_wmem.
pub const DEFAULT_AUTOTUNE_MAX: u64 = 4 << 20;

/// What to ask setsockopt (SO_SNDBUF or SO_RCVBUF) for a buffer of
/// `wanted` bytes, or None to leave the kernel's autotuning on. A setting
/// locks the buffer (autotuning stops growing it), and the kernel caps it
/// at `core_max` (net.core.wmem_max or rmem_max) and doubles it; so it is
/// worth setting only where that, 2 x min(wanted, core_max), is more than
/// autotuning would reach by itself, `autotune_max` (tcp_wmem's or
/// tcp_rmem's third number in the socket's network namespace; unknown:
/// [`DEFAULT_AUTOTUNE_MAX`]). On a DTN whose tcp_*mem allow more than its
/// net.core caps, a setting would lock the buffer below what the kernel
/// gives on its own.
pub fn buffer_to_set(wanted: u64, core_max: Option<u64>, autotune_max: Option<u64>) -> Option<u64> {
    let granted = core_max.map_or(wanted, |m| wanted.min(m));
    (granted.saturating_mul(2) > autotune_max.unwrap_or(DEFAULT_AUTOTUNE_MAX)).then_some(wanted)
}

impl BufferCaps {
    /// SO_SNDBUF to set for a send buffer of `wanted` bytes under these
    /// caps, or None: autotuning ([`buffer_to_set`]).
    pub fn send_buffer_to_set(&self, wanted: u64) -> Option<u64> {
        buffer_to_set(wanted, self.wmem_max, self.tcp_wmem_max)
    }

    /// SO_RCVBUF to set for a receive buffer of `wanted` bytes under these
    /// caps, or None: autotuning ([`buffer_to_set`]).
    pub fn receive_buffer_to_set(&self, wanted: u64) -> Option<u64> {
        buffer_to_set(wanted, self.rmem_max, self.tcp_rmem_max)
    }
}

/// The larger of what autotuning allows and what an explicit setting
/// gets (twice the core maximum, which also turns autotuning off).
/// Unknown caps: leave autotuning alone.
fn best_buffer(autotune_max: Option<u64>, core_max: Option<u64>) -> BufferChoice {
    match core_max.and_then(|m| buffer_to_set(m, core_max, autotune_max)) {
        Some(m) => BufferChoice::Set(m),
        None => BufferChoice::Auto(autotune_max.unwrap_or(DEFAULT_AUTOTUNE_MAX)),
    }
}

/// Headroom over the bandwidth-delay product a buffer is sized with: for
/// RTT that grows under load and a rate above the one sized for.
pub const BUFFER_HEADROOM: f64 = 2.0;

/// A buffer sized for `need` bytes of it (already divided by the share in
/// flight), with [`BUFFER_HEADROOM`]: set where a setting gives more than
/// autotuning reaches ([`buffer_to_set`]), no larger than `core_max`;
/// else left to autotuning (the kernel then sizes it from the path itself).
fn sized_buffer(core_max: Option<u64>, autotune_max: Option<u64>, need: f64) -> BufferChoice {
    // The kernel doubles what is set.
    let want = (need * BUFFER_HEADROOM / 2.0).ceil() as u64;
    match (core_max, buffer_to_set(want, core_max, autotune_max)) {
        (Some(core), Some(w)) => BufferChoice::Set(w.min(core)),
        _ => BufferChoice::Auto(autotune_max.unwrap_or(DEFAULT_AUTOTUNE_MAX)),
    }
}

/// What the plan is sized from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathInput {
    /// The smallest RTT seen, microseconds (0 = unknown, treated as LAN).
    pub rtt_us: u32,
    /// The rate to size for, bits/s (None: [`DEFAULT_TARGET_BPS`]).
    pub target_bps: Option<u64>,
    pub sender: BufferCaps,
    pub receiver: BufferCaps,
    /// Streams fixed by the user (None: choose).
    pub streams: Option<u16>,
}

/// Which cap bounds a stream's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The sender's send buffer.
    SendBuffer,
    /// The receiver's receive buffer.
    ReceiveBuffer,
}

/// The plan: buffers on both sides, the window and rate of one stream,
/// the number of streams.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowPlan {
    pub rtt_us: u32,
    pub target_bps: u64,
    pub send_buffer: BufferChoice,
    pub receive_buffer: BufferChoice,
    /// Bytes one stream can have in flight.
    pub stream_window: u64,
    /// What one stream can carry at this RTT, bits/s (window / RTT).
    pub stream_ceiling_bps: f64,
    pub bound: Bound,
    pub streams: u16,
    /// True when the streams were chosen here, not fixed by the user.
    pub auto_streams: bool,
    /// What all streams together can carry, bits/s.
    pub ceiling_bps: f64,
}

impl WindowPlan {
    /// The bandwidth-delay product of the target, bytes.
    pub fn bdp(&self) -> u64 {
        (self.target_bps as f64 / 8.0 * f64::from(self.rtt_us.max(100)) / 1e6) as u64
    }

    /// Says what bounds the transfer when the streams cannot reach the
    /// target, with the sysctl that lifts it; None when they can.
    pub fn shortfall(&self, sender: &BufferCaps, receiver: &BufferCaps) -> Option<String> {
        if self.ceiling_bps >= self.target_bps as f64 * 0.999 {
            return None;
        }
        // A window per stream that would carry the target over these streams.
        let need_window = self.bdp() / u64::from(self.streams.max(1));
        // The side, its buffer, the share of it in flight, its two caps and sysctl names.
        let (side, what, share, core, tcp, x, default) = match self.bound {
            Bound::SendBuffer => (
                "sender",
                "send",
                SEND_BUFFER_USE,
                sender.wmem_max,
                sender.tcp_wmem_max,
                'w',
                65536,
            ),
            Bound::ReceiveBuffer => (
                "receiver",
                "receive",
                RECV_BUFFER_USE,
                receiver.rmem_max,
                receiver.tcp_rmem_max,
                'r',
                131072,
            ),
        };
        let buf = (need_window as f64 / share) as u64;
        // What the buffer can be: autotuning's maximum, or twice the core cap set.
        let now = best_buffer(tcp, core).bytes();
        let who = format!(
            "the {side}'s {what} buffer ({} allowed: net.core.{x}mem_max / net.ipv4.tcp_{x}mem)",
            crate::units::format_bytes(now)
        );
        let fix = format!(
            "on the {side}: sysctl -w net.core.{x}mem_max={buf} net.ipv4.tcp_{x}mem='4096 {default} {buf}'"
        );
        Some(format!(
            "window-limited: at RTT {:.2} ms each stream carries at most {} ({} in flight, bound by {who}); {} stream(s) reach {} of the {} sized for. Use more streams (-P) or {fix}",
            f64::from(self.rtt_us) / 1e3,
            crate::units::format_rate(self.stream_ceiling_bps),
            crate::units::format_bytes(self.stream_window),
            self.streams,
            crate::units::format_rate(self.ceiling_bps),
            crate::units::format_rate(self.target_bps as f64),
        ))
    }
}

/// The window one stream gets from these buffers, and which bounds it.
fn window_of(send: BufferChoice, receive: BufferChoice) -> (u64, Bound) {
    let by_send = (send.bytes() as f64 * SEND_BUFFER_USE) as u64;
    let by_recv = (receive.bytes() as f64 * RECV_BUFFER_USE) as u64;
    if by_send <= by_recv {
        (by_send, Bound::SendBuffer)
    } else {
        (by_recv, Bound::ReceiveBuffer)
    }
}

/// Sizes streams for the path from the largest buffers both hosts allow,
/// then each buffer for its stream's share of the bandwidth-delay product
/// (with headroom): no more memory than the path needs, and autotuning
/// left on wherever it reaches that far.
pub fn plan(input: &PathInput) -> WindowPlan {
    let best_send = best_buffer(input.sender.tcp_wmem_max, input.sender.wmem_max);
    let best_receive = best_buffer(input.receiver.tcp_rmem_max, input.receiver.rmem_max);
    let (best_window, _) = window_of(best_send, best_receive);
    let target_bps = input.target_bps.unwrap_or(DEFAULT_TARGET_BPS).max(1);
    // An unknown or sub-100-microsecond RTT: a LAN, where a window is no limit.
    let rtt_s = f64::from(input.rtt_us.max(100)) / 1e6;
    let best_ceiling_bps = best_window as f64 * 8.0 / rtt_s;
    let (streams, auto_streams) = match input.streams {
        Some(n) => (n.max(1), false),
        None => {
            let need = (target_bps as f64 / best_ceiling_bps).ceil();
            let n = need.clamp(f64::from(DEFAULT_STREAMS), f64::from(MAX_AUTO_STREAMS));
            (n as u16, true)
        }
    };
    // Each stream's share of the bandwidth-delay product, bytes in flight.
    let share = target_bps as f64 / 8.0 * rtt_s / f64::from(streams);
    let send_buffer = sized_buffer(
        input.sender.wmem_max,
        input.sender.tcp_wmem_max,
        share / SEND_BUFFER_USE,
    );
    let receive_buffer = sized_buffer(
        input.receiver.rmem_max,
        input.receiver.tcp_rmem_max,
        share / RECV_BUFFER_USE,
    );
    let (stream_window, bound) = window_of(send_buffer, receive_buffer);
    let stream_ceiling_bps = stream_window as f64 * 8.0 / rtt_s;
    WindowPlan {
        rtt_us: input.rtt_us,
        target_bps,
        send_buffer,
        receive_buffer,
        stream_window,
        stream_ceiling_bps,
        bound,
        streams,
        auto_streams,
        ceiling_bps: stream_ceiling_bps * f64::from(streams),
    }
}

/// How long a measurement stands.
pub const MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// A transfer is sized for this much more than the path carried: the
/// measurement was short, and a stream count too small for the path is
/// worse than one a little too large (the online tuning parks the extra).
pub const HEADROOM: f64 = 1.25;

/// One path as the doctor measured it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathRecord {
    /// `HOST:PORT` as the user named the server (the engine's `net::dial::host_key`).
    pub host: String,
    /// Up: this host sends (a push); down: the server sends (a pull).
    pub direction: Direction,
    /// What the path carried memory to memory, bits/s, when the path
    /// itself was the limit.
    pub bits_per_second: f64,
    /// The idle RTT then, microseconds.
    pub rtt_us: u32,
    /// Seconds since the Unix epoch.
    pub measured_at: u64,
}

impl PathRecord {
    /// Whether this record still describes a path measured `now` (Unix
    /// seconds) with this RTT: fresh, and the RTT within a quarter (or a
    /// millisecond) of the one measured; another RTT is another route.
    pub fn applies(&self, now: u64, rtt_us: u32) -> bool {
        let fresh = now.saturating_sub(self.measured_at) <= MAX_AGE.as_secs();
        let (then, now_rtt) = (f64::from(self.rtt_us), f64::from(rtt_us));
        let slack = (then * 0.25).max(1000.0);
        fresh
            && (now_rtt - then).abs() <= slack
            && self.bits_per_second.is_finite()
            && self.bits_per_second > 0.0
    }

    /// The rate a transfer on this path is sized for, bits/s.
    pub fn target_bps(&self) -> u64 {
        (self.bits_per_second * HEADROOM) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This host's caps: 4 MiB core maxima, tcp_rmem to 32 MiB, tcp_wmem to 4 MiB.
    fn here() -> BufferCaps {
        BufferCaps {
            rmem_max: Some(4 << 20),
            wmem_max: Some(4 << 20),
            tcp_rmem_max: Some(32 << 20),
            tcp_wmem_max: Some(4 << 20),
        }
    }

    fn input(rtt_ms: u32, target: Option<u64>, streams: Option<u16>) -> PathInput {
        PathInput {
            rtt_us: rtt_ms * 1000,
            target_bps: target,
            sender: here(),
            receiver: here(),
            streams,
        }
    }

    #[test]
    fn an_explicit_send_buffer_beats_autotuning_when_the_core_cap_is_larger() {
        let p = plan(&input(80, None, None));
        // 2 x wmem_max = 8 MiB > tcp_wmem's 4 MiB: set it.
        assert_eq!(p.send_buffer, BufferChoice::Set(4 << 20));
        // tcp_rmem's 32 MiB > 2 x rmem_max: leave receive autotuning on.
        assert_eq!(p.receive_buffer, BufferChoice::Auto(32 << 20));
        assert_eq!(p.bound, Bound::SendBuffer);
        assert_eq!(
            p.stream_window,
            ((8u64 << 20) as f64 * SEND_BUFFER_USE) as u64
        );
    }

    #[test]
    fn streams_grow_with_the_rtt_until_the_cap() {
        let lan = plan(&input(0, None, None));
        assert_eq!(lan.streams, DEFAULT_STREAMS);
        let p80 = plan(&input(80, Some(2_000_000_000), None));
        // 5.45 MB per stream at 80 ms is 545 Mbit/s: 4 streams carry 2 Gbit/s.
        assert_eq!(p80.streams, 4);
        assert!(p80.ceiling_bps >= 2e9);
        let p120 = plan(&input(120, Some(2_000_000_000), None));
        assert_eq!(p120.streams, 6);
        let sat = plan(&input(540, Some(2_000_000_000), None));
        assert_eq!(sat.streams, 25);
        let far = plan(&input(540, None, None));
        assert_eq!(far.streams, MAX_AUTO_STREAMS);
        assert!(far.shortfall(&here(), &here()).is_some());
        assert!(sat.shortfall(&here(), &here()).is_none());
    }

    #[test]
    fn fixed_streams_are_kept_and_a_shortfall_names_the_cap_and_the_fix() {
        let p = plan(&input(80, Some(2_000_000_000), Some(1)));
        assert_eq!((p.streams, p.auto_streams), (1, false));
        let s = p.shortfall(&here(), &here()).unwrap();
        assert!(s.contains("send buffer (8.00 MiB allowed"), "{s}");
        assert!(s.contains("net.core.wmem_max="), "{s}");
    }

    #[test]
    fn a_small_receiver_bounds_the_window() {
        let mut i = input(80, Some(1_000_000_000), Some(2));
        i.receiver = BufferCaps {
            rmem_max: Some(212_992),
            wmem_max: Some(212_992),
            tcp_rmem_max: Some(1 << 20),
            tcp_wmem_max: Some(1 << 20),
        };
        let p = plan(&i);
        assert_eq!(p.bound, Bound::ReceiveBuffer);
        assert_eq!(p.receive_buffer, BufferChoice::Auto(1 << 20));
        let s = p.shortfall(&here(), &i.receiver).unwrap();
        assert!(s.contains("net.core.rmem_max="), "{s}");
    }

    #[test]
    fn buffers_are_sized_for_the_bandwidth_delay_product_not_the_caps() {
        // A DTN that allows 2 GiB buffers, autotuning to 64 MiB.
        let dtn = BufferCaps {
            rmem_max: Some(2 << 30),
            wmem_max: Some(2 << 30),
            tcp_rmem_max: Some(64 << 20),
            tcp_wmem_max: Some(64 << 20),
        };
        let mut i = input(80, Some(10_000_000_000), None);
        (i.sender, i.receiver) = (dtn, dtn);
        let p = plan(&i);
        assert_eq!(p.streams, DEFAULT_STREAMS);
        // 100 MB in flight over 4 streams: 25 MB each, 38.5 MB of send
        // buffer at 0.65, twice that for headroom, half of it set.
        let BufferChoice::Set(send) = p.send_buffer else {
            panic!("{p:?}");
        };
        assert_eq!(
            send,
            (25e6 / SEND_BUFFER_USE * BUFFER_HEADROOM / 2.0).ceil() as u64
        );
        assert_eq!(p.receive_buffer, BufferChoice::Set(50_000_000));
        assert!(p.ceiling_bps >= 2.0 * 10e9 * 0.99, "{p:?}");
        // A path the autotuning reaches: left to the kernel.
        let mut slow = i;
        slow.target_bps = Some(100_000_000);
        let p = plan(&slow);
        assert_eq!(p.send_buffer, BufferChoice::Auto(64 << 20));
        assert_eq!(p.receive_buffer, BufferChoice::Auto(64 << 20));
        // Here, 300 Mbit/s at 80 ms: autotuning's 4 MiB carry each stream's share.
        let p = plan(&input(80, Some(300_000_000), None));
        assert_eq!(p.send_buffer, BufferChoice::Auto(4 << 20));
        // Never below what autotuning would have reached, never above the cap.
        let p = plan(&input(540, None, None));
        assert_eq!(p.send_buffer, BufferChoice::Set(4 << 20));
    }

    /// A tuned DTN: 128 MiB for the core caps and autotuning alike.
    fn dtn() -> BufferCaps {
        BufferCaps {
            rmem_max: Some(128 << 20),
            wmem_max: Some(128 << 20),
            tcp_rmem_max: Some(128 << 20),
            tcp_wmem_max: Some(128 << 20),
        }
    }

    #[test]
    fn a_buffer_is_set_only_where_the_setting_gives_more_than_autotuning() {
        let mib = |n: u64| n << 20;
        // Here: a send buffer set gets 2 x 4 MiB = 8 MiB, autotuning 4 MiB.
        assert_eq!(here().send_buffer_to_set(mib(4)), Some(mib(4)));
        assert_eq!(here().send_buffer_to_set(mib(64)), Some(mib(64)));
        assert_eq!(here().send_buffer_to_set(mib(3)), Some(mib(3)));
        // 2 x 2 MiB is what autotuning reaches anyway.
        assert_eq!(here().send_buffer_to_set(mib(2)), None);
        // Receiving: autotuning's 32 MiB beats any setting under rmem_max.
        assert_eq!(here().receive_buffer_to_set(mib(4)), None);
        assert_eq!(here().receive_buffer_to_set(mib(64)), None);
        // A tuned DTN: autotuning reaches 128 MiB; only more is set.
        assert_eq!(dtn().send_buffer_to_set(mib(32)), None);
        assert_eq!(dtn().receive_buffer_to_set(mib(64)), None);
        assert_eq!(dtn().send_buffer_to_set(mib(65)), Some(mib(65)));
        // Autotuning raised, the core caps not: a setting would lock the
        // buffer at 8 MiB where the kernel gives 64 MiB by itself.
        let small_core = BufferCaps {
            rmem_max: Some(mib(4)),
            wmem_max: Some(mib(4)),
            ..dtn()
        };
        for wanted in [mib(1), mib(4), mib(100), 1 << 30] {
            assert_eq!(small_core.send_buffer_to_set(wanted), None, "{wanted}");
            assert_eq!(small_core.receive_buffer_to_set(wanted), None, "{wanted}");
        }
        // Unknown autotuning: Linux's default; unknown core cap: as asked.
        assert_eq!(buffer_to_set(mib(3), None, None), Some(mib(3)));
        assert_eq!(buffer_to_set(mib(2), None, None), None);
    }

    #[test]
    fn a_plan_leaves_autotuning_on_where_it_reaches_as_far() {
        let mut i = input(80, Some(10_000_000_000), None);
        // tcp_*mem to 128 MiB, core caps at 4 MiB: nothing set, whatever the path.
        let small_core = BufferCaps {
            rmem_max: Some(4 << 20),
            wmem_max: Some(4 << 20),
            ..dtn()
        };
        (i.sender, i.receiver) = (small_core, small_core);
        let p = plan(&i);
        assert_eq!(p.send_buffer, BufferChoice::Auto(128 << 20));
        assert_eq!(p.receive_buffer, BufferChoice::Auto(128 << 20));
        // The DTN: 10 Gbit/s at 80 ms over 4 streams wants 2 x 38.5 MB of
        // send buffer a stream, which autotuning's 128 MiB covers.
        (i.sender, i.receiver) = (dtn(), dtn());
        let p = plan(&i);
        assert_eq!(p.streams, DEFAULT_STREAMS);
        assert_eq!(p.send_buffer, BufferChoice::Auto(128 << 20));
        assert_eq!(p.receive_buffer, BufferChoice::Auto(128 << 20));
        // Whatever the plan sets, the socket's own check sets too.
        for c in [here(), dtn(), small_core] {
            (i.sender, i.receiver) = (c, c);
            for rtt in [1, 80, 540] {
                i.rtt_us = rtt * 1000;
                let p = plan(&i);
                let send = p.send_buffer.to_set();
                assert_eq!(
                    send.and_then(|b| c.send_buffer_to_set(b)),
                    send,
                    "{c:?} {p:?}"
                );
                let recv = p.receive_buffer.to_set();
                assert_eq!(
                    recv.and_then(|b| c.receive_buffer_to_set(b)),
                    recv,
                    "{c:?} {p:?}"
                );
            }
        }
    }

    #[test]
    fn unknown_caps_and_rtt_do_not_panic() {
        let p = plan(&PathInput {
            rtt_us: 0,
            target_bps: Some(0),
            sender: BufferCaps::default(),
            receiver: BufferCaps::default(),
            streams: Some(0),
        });
        assert_eq!(p.streams, 1);
        assert!(p.stream_ceiling_bps.is_finite());
    }
}
