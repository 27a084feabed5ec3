//! The link model: what one direction of an
//! emulated path does to each packet, decided without I/O or a clock so
//! that it can be tested exactly. The forwarder between the TUN devices of
//! two network namespaces asks [`Link::arrive`] for every packet it reads
//! and writes the packet out at the time the verdict names (or drops it).
//!
//! Per direction: a fixed one-way delay; jitter (uniform, added to the
//! delay, never reordering unless asked); random loss down to 1e-7; bit
//! corruption (one flipped bit in a packet); a rate limit with a drop-tail
//! queue (the serializer of a bottleneck link: a packet leaves when the
//! ones before it have, at `len * 8 / rate` each); and outages (the link
//! drops everything between two instants). Parameters change live with
//! [`Link::set`]; queued packets keep the times they were given.

use std::time::Duration;

/// One direction of an emulated path.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkParams {
    /// One-way propagation delay.
    pub delay: Duration,
    /// Up to this much extra delay per packet, uniformly distributed.
    pub jitter: Duration,
    /// Let jitter reorder packets (a later packet may overtake an earlier
    /// one); by default releases stay in arrival order.
    pub reorder: bool,
    /// Probability that a packet is lost, 0..=1.
    pub loss: f64,
    /// Probability that a packet arrives with one bit flipped, 0..=1.
    pub corrupt: f64,
    /// Bottleneck rate in bits per second; None for no limit.
    pub rate_bps: Option<u64>,
    /// Bytes the bottleneck holds, the packet on the wire included; a
    /// packet that does not fit is dropped (drop-tail).
    pub queue_bytes: u64,
    /// Intervals `[start, end)`, measured from the link's start, in which
    /// every packet is dropped.
    pub outages: Vec<(Duration, Duration)>,
}

impl Default for LinkParams {
    fn default() -> Self {
        Self {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            reorder: false,
            loss: 0.0,
            corrupt: 0.0,
            rate_bps: None,
            queue_bytes: 16 << 20,
            outages: Vec::new(),
        }
    }
}

/// Full-size packets a bottleneck's queue holds at least, whatever its
/// time at the rate: a router's buffer is counted in packets as well as in
/// time (Cisco's default hold queue is 40 to 75 packets, Linux's
/// txqueuelen 1000). Fewer, and TCP cannot recover a loss by fast
/// retransmit: a queue of one or two packets drops the retransmission
/// too, and the connection backs off for seconds.
pub const QUEUE_MIN_PACKETS: u64 = 32;

impl LinkParams {
    /// A queue that holds `d` of traffic at the link's rate, and at least
    /// [`QUEUE_MIN_PACKETS`] packets of `mtu` bytes besides the one on the
    /// wire; unchanged without a rate.
    pub fn queue_for(&mut self, d: Duration, mtu: u32) {
        if let Some(r) = self.rate_bps {
            let bytes = (d.as_secs_f64() * r as f64 / 8.0) as u64;
            self.queue_bytes = bytes.max((QUEUE_MIN_PACKETS + 1) * u64::from(mtu));
        }
    }
}

/// The MTU `wan up` gives the link when none is asked for: a WAN's 1500
/// bytes up to 1 Gbit/s (a real path's packet counts, so its queue, loss
/// and TCP's recovery behave as on one), jumbo frames (9000, what research
/// networks run end to end) up to 10 Gbit/s, and 65000 above or without a
/// rate, where the forwarder's packet rate (two system calls a packet) and
/// not the link would otherwise be the bottleneck.
pub fn default_mtu(rate_bps: Option<u64>) -> u32 {
    match rate_bps {
        Some(r) if r <= 1_000_000_000 => 1500,
        Some(r) if r <= 10_000_000_000 => 9000,
        _ => 65000,
    }
}

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    Loss,
    QueueFull,
    Outage,
}

/// What happens to one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Write it out at `at` (time since the link started), with bit
    /// `flip_bit` inverted if set (0 = the first byte's high bit).
    Deliver {
        at: Duration,
        flip_bit: Option<u64>,
    },
    Drop(Drop),
}

/// Counters of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub packets: u64,
    pub bytes: u64,
    pub delivered: u64,
    pub lost: u64,
    pub queue_drops: u64,
    pub outage_drops: u64,
    pub corrupted: u64,
}

/// One direction's state.
pub struct Link {
    params: LinkParams,
    rng: fastrand::Rng,
    /// When the bottleneck's serializer finishes the packets it has.
    busy_until: Duration,
    /// The latest release time handed out (no reordering).
    last_release: Duration,
    stats: LinkStats,
}

impl Link {
    /// A link with reproducible randomness from `seed`.
    pub fn new(params: LinkParams, seed: u64) -> Link {
        Link {
            params,
            rng: fastrand::Rng::with_seed(seed),
            busy_until: Duration::ZERO,
            last_release: Duration::ZERO,
            stats: LinkStats::default(),
        }
    }

    pub fn params(&self) -> &LinkParams {
        &self.params
    }

    /// New parameters from now on (`longhaul wan set`).
    pub fn set(&mut self, params: LinkParams) {
        self.params = params;
    }

    pub fn stats(&self) -> LinkStats {
        self.stats
    }

    /// Decides the fate of a packet of `len` bytes arriving at `now`
    /// (time since the link started; never earlier than a previous call's).
    pub fn arrive(&mut self, now: Duration, len: usize) -> Verdict {
        let p = &self.params;
        self.stats.packets += 1;
        self.stats.bytes += len as u64;
        if p.outages.iter().any(|(a, b)| (*a..*b).contains(&now)) {
            self.stats.outage_drops += 1;
            return Verdict::Drop(Drop::Outage);
        }
        if p.loss > 0.0 && self.rng.f64() < p.loss {
            self.stats.lost += 1;
            return Verdict::Drop(Drop::Loss);
        }
        let departs = match p.rate_bps.filter(|r| *r > 0) {
            None => now,
            Some(rate) => {
                let start = self.busy_until.max(now);
                // Bytes the bottleneck still holds when this one arrives.
                let backlog = (start - now).as_secs_f64() * rate as f64 / 8.0;
                if backlog + len as f64 > p.queue_bytes as f64 {
                    self.stats.queue_drops += 1;
                    return Verdict::Drop(Drop::QueueFull);
                }
                let wire = Duration::from_secs_f64(len as f64 * 8.0 / rate as f64);
                self.busy_until = start + wire;
                self.busy_until
            }
        };
        let jitter = if p.jitter.is_zero() {
            Duration::ZERO
        } else {
            p.jitter.mul_f64(self.rng.f64())
        };
        let mut at = departs + p.delay + jitter;
        if !p.reorder {
            at = at.max(self.last_release);
        }
        self.last_release = self.last_release.max(at);
        let flip_bit = (p.corrupt > 0.0 && len > 0 && self.rng.f64() < p.corrupt)
            .then(|| self.rng.u64(0..len as u64 * 8));
        if flip_bit.is_some() {
            self.stats.corrupted += 1;
        }
        self.stats.delivered += 1;
        Verdict::Deliver { at, flip_bit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn at(v: Verdict) -> Duration {
        match v {
            Verdict::Deliver { at, .. } => at,
            Verdict::Drop(d) => panic!("dropped: {d:?}"),
        }
    }

    #[test]
    fn an_unimpaired_link_delivers_at_once() {
        let mut l = Link::new(LinkParams::default(), 1);
        for i in 0..100 {
            assert_eq!(at(l.arrive(i * MS, 1500)), i * MS);
        }
    }

    #[test]
    fn delay_is_exact() {
        let mut l = Link::new(
            LinkParams {
                delay: 40 * MS,
                ..LinkParams::default()
            },
            1,
        );
        for i in 0..100 {
            assert_eq!(at(l.arrive(i * MS, 9000)), i * MS + 40 * MS);
        }
    }

    #[test]
    fn the_rate_limit_spaces_packets_by_their_wire_time() {
        // 12 Mbit/s: a 1500-byte packet takes exactly 1 ms on the wire.
        let mut l = Link::new(
            LinkParams {
                rate_bps: Some(12_000_000),
                delay: 10 * MS,
                ..LinkParams::default()
            },
            1,
        );
        let times: Vec<Duration> = (0..1000)
            .map(|_| at(l.arrive(Duration::ZERO, 1500)))
            .collect();
        for (i, t) in times.iter().enumerate() {
            let want = (i as u32 + 1) * MS + 10 * MS;
            let err = t.as_secs_f64() - want.as_secs_f64();
            assert!(err.abs() < 1e-9, "packet {i}: {t:?} vs {want:?}");
        }
        // A sender slower than the rate is not delayed beyond the delay.
        let mut l = Link::new(
            LinkParams {
                rate_bps: Some(12_000_000),
                ..LinkParams::default()
            },
            1,
        );
        for i in 0..100u32 {
            let t = at(l.arrive(i * 2 * MS, 1500));
            assert_eq!(t, i * 2 * MS + MS);
        }
    }

    #[test]
    fn a_full_queue_drops_the_tail() {
        let mut p = LinkParams {
            rate_bps: Some(12_000_000),
            ..LinkParams::default()
        };
        p.queue_bytes = 10 * 1500;
        let mut l = Link::new(p, 1);
        let verdicts: Vec<Verdict> = (0..100).map(|_| l.arrive(Duration::ZERO, 1500)).collect();
        let delivered = verdicts
            .iter()
            .filter(|v| matches!(v, Verdict::Deliver { .. }))
            .count();
        // Ten packets' worth, the one on the wire included.
        assert_eq!(delivered, 10);
        assert!(verdicts[10..]
            .iter()
            .all(|v| *v == Verdict::Drop(Drop::QueueFull)));
        assert_eq!(l.stats().queue_drops, 90);
        // Once the queue drains, packets go through again.
        assert!(matches!(l.arrive(20 * MS, 1500), Verdict::Deliver { .. }));
        // A queue sized in time.
        let mut p = LinkParams {
            rate_bps: Some(8_000_000_000),
            ..LinkParams::default()
        };
        p.queue_for(10 * MS, 9000);
        assert_eq!(p.queue_bytes, 10_000_000);
    }

    #[test]
    fn a_queue_holds_its_packets_at_any_mtu() {
        // 50 ms at 20 Mbit/s is 125 kB: two packets of 65000 bytes, the
        // case that left TCP in back-off. The floor holds 32 of any size.
        for mtu in [1500u32, 9000, 65000] {
            let mut p = LinkParams {
                rate_bps: Some(20_000_000),
                ..LinkParams::default()
            };
            p.queue_for(50 * MS, mtu);
            let packets = p.queue_bytes / u64::from(mtu);
            assert!(packets >= QUEUE_MIN_PACKETS, "mtu {mtu}: {packets} packets");
            let floor = (QUEUE_MIN_PACKETS + 1) * u64::from(mtu);
            assert_eq!(p.queue_bytes, 125_000.max(floor));
            // And the link takes that many back to back before it drops.
            let mut l = Link::new(p, 1);
            let delivered = (0..QUEUE_MIN_PACKETS * 2)
                .filter(|_| {
                    matches!(
                        l.arrive(Duration::ZERO, mtu as usize),
                        Verdict::Deliver { .. }
                    )
                })
                .count() as u64;
            assert!(
                delivered >= QUEUE_MIN_PACKETS,
                "mtu {mtu}: {delivered} delivered"
            );
        }
        // Without a rate there is no queue to size.
        let mut p = LinkParams::default();
        p.queue_for(50 * MS, 65000);
        assert_eq!(p.queue_bytes, LinkParams::default().queue_bytes);
        assert_eq!(default_mtu(Some(20_000_000)), 1500);
        assert_eq!(default_mtu(Some(1_000_000_000)), 1500);
        assert_eq!(default_mtu(Some(2_000_000_000)), 9000);
        assert_eq!(default_mtu(None), 65000);
    }

    #[test]
    fn loss_rate_is_within_statistical_bounds() {
        for (loss, n) in [(1e-2, 1_000_000u64), (1e-4, 4_000_000), (0.5, 100_000)] {
            let mut l = Link::new(
                LinkParams {
                    loss,
                    ..LinkParams::default()
                },
                7,
            );
            for i in 0..n {
                let _ = l.arrive(Duration::from_nanos(i), 100);
            }
            let lost = l.stats().lost as f64;
            let mean = n as f64 * loss;
            let sigma = (n as f64 * loss * (1.0 - loss)).sqrt();
            assert!(
                (lost - mean).abs() < 5.0 * sigma,
                "loss {loss}: {lost} lost of {n}, expected {mean} +- {sigma}"
            );
        }
    }

    #[test]
    fn jitter_adds_delay_without_reordering_unless_asked() {
        let p = LinkParams {
            delay: 20 * MS,
            jitter: 10 * MS,
            ..LinkParams::default()
        };
        // Packets 100 us apart: never reordered, always within delay +
        // jitter (a packet waits for the one before it at most).
        let mut l = Link::new(p.clone(), 3);
        let mut last = Duration::ZERO;
        for i in 0..10_000u32 {
            let now = i * Duration::from_micros(100);
            let t = at(l.arrive(now, 1500));
            assert!(t >= last, "reordered at {i}");
            assert!(t >= now + 20 * MS && t <= now + 30 * MS, "{i}");
            last = t;
        }
        // Packets farther apart than the jitter: uniform 0..10 ms, mean 5.
        let mut l = Link::new(p.clone(), 3);
        let n = 10_000u32;
        let extra: f64 = (0..n)
            .map(|i| {
                let now = i * 20 * MS;
                (at(l.arrive(now, 1500)) - now - 20 * MS).as_secs_f64()
            })
            .sum();
        let mean_ms = extra / f64::from(n) * 1e3;
        assert!((4.8..5.2).contains(&mean_ms), "mean jitter {mean_ms} ms");
        let mut l = Link::new(LinkParams { reorder: true, ..p }, 3);
        let times: Vec<Duration> = (0..1000u32)
            .map(|i| at(l.arrive(i * Duration::from_micros(100), 1500)))
            .collect();
        assert!(times.windows(2).any(|w| w[1] < w[0]), "never reordered");
    }

    #[test]
    fn outages_drop_everything_inside_them() {
        let mut l = Link::new(
            LinkParams {
                outages: vec![(Duration::from_secs(1), Duration::from_secs(3))],
                ..LinkParams::default()
            },
            1,
        );
        for ms in (0..5000).step_by(10) {
            let now = ms * MS;
            let v = l.arrive(now, 1500);
            if (1000..3000).contains(&ms) {
                assert_eq!(v, Verdict::Drop(Drop::Outage), "{ms} ms");
            } else {
                assert!(matches!(v, Verdict::Deliver { .. }), "{ms} ms");
            }
        }
        assert_eq!(l.stats().outage_drops, 200);
    }

    #[test]
    fn corruption_flips_one_bit_inside_the_packet() {
        let mut l = Link::new(
            LinkParams {
                corrupt: 0.1,
                ..LinkParams::default()
            },
            9,
        );
        let mut flips = 0;
        for i in 0..100_000u64 {
            if let Verdict::Deliver {
                flip_bit: Some(b), ..
            } = l.arrive(Duration::from_nanos(i), 64)
            {
                assert!(b < 64 * 8);
                flips += 1;
            }
        }
        assert!((9_000..11_000).contains(&flips), "{flips}");
        assert_eq!(l.stats().corrupted, flips);
    }

    #[test]
    fn new_parameters_apply_to_later_packets() {
        let mut l = Link::new(LinkParams::default(), 1);
        assert_eq!(at(l.arrive(Duration::ZERO, 100)), Duration::ZERO);
        l.set(LinkParams {
            delay: 5 * MS,
            ..LinkParams::default()
        });
        assert_eq!(at(l.arrive(MS, 100)), 6 * MS);
        assert_eq!(l.params().delay, 5 * MS);
    }
}
