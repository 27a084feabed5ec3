//! A queue rank's session, fed unit after unit.
//!
//! One transfer session carries many leased units: the engine asks the
//! feed for more of its share each time it has announced what it was
//! given ([`ShareFeed`]), with where the transfer stands ([`InFlight`]).
//! The feed leases again once the streams' work ahead (bytes announced
//! and not yet read) is below one unit, or below what the rank sends in
//! [`FeedConfig::ahead`] if that is more. A rank so holds the unit it
//! sends and about one more (the tail stays short: the others take what
//! is left), with no new connection, TLS handshake and slow start for
//! each unit, which a session per lease cost.
//!
//! A lease takes as many units as the rank sends in
//! [`FeedConfig::per_lease`] at the rate it has sent so far (one at the
//! start; at most [`MAX_BATCH`]), so a fast rank makes a few round trips a
//! second however small the units, and never more than a fair part of
//! what is left (what is left over twice the ranks), or one rank would
//! hoard the tail while the others idle. A session stops asking after
//! [`FeedConfig::span`], so that its units are marked done (a killed
//! rank's restart redoes at most that much) and the next session begins.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_engine::xfer::source::{Fed, InFlight, Share, ShareFeed};

use crate::confine::{Refused, Sources};
use crate::manifest::Manifest;
use crate::queue::{Leased, Queue, QueueError};
use crate::shard::Unit;

/// Units one lease takes at most.
pub const MAX_BATCH: u32 = 16;

/// How a feed leases.
#[derive(Debug, Clone)]
pub struct FeedConfig {
    /// Names this rank's leases in the queue.
    pub worker: String,
    /// The fleet's size: a lease takes at most 1 / (2 ranks) of what is left.
    pub ranks: u32,
    /// A lease not renewed for this long is taken by another rank.
    pub lease: Duration,
    /// How long one session takes new units for.
    pub span: Duration,
    /// The work ahead kept: at least a unit, or this long at the rank's rate.
    pub ahead: Duration,
    /// A lease takes about this long of work at the rank's rate.
    pub per_lease: Duration,
}

impl FeedConfig {
    pub fn new(worker: &str, ranks: u32, lease: Duration) -> FeedConfig {
        FeedConfig {
            worker: worker.to_string(),
            ranks,
            lease,
            span: Duration::from_secs(60),
            ahead: Duration::from_millis(250),
            per_lease: Duration::from_millis(500),
        }
    }
}

/// Where a feed leases units: the queue, or a stand-in in tests.
pub trait Lessor: Send {
    /// Up to `n` units for `worker`, held for `lease`; none when the
    /// queue has nothing free.
    fn lease(&mut self, worker: &str, n: u32, lease: Duration) -> Result<Vec<Leased>, QueueError>;

    /// Units not yet leased (or whose lease ran out).
    fn todo(&mut self) -> Result<u64, QueueError>;
}

impl Lessor for Queue {
    fn lease(&mut self, worker: &str, n: u32, lease: Duration) -> Result<Vec<Leased>, QueueError> {
        Queue::lease(self, worker, n, lease)
    }

    fn todo(&mut self) -> Result<u64, QueueError> {
        Ok(self.pending()?.0)
    }
}

/// What one session leased, and how its feed ended.
#[derive(Debug, Default)]
pub struct Taken {
    pub leased: Vec<Leased>,
    /// The queue failed while the session asked for more.
    pub error: Option<QueueError>,
    /// A lease whose entries do not all resolve beneath the sources: not
    /// given to the session (nothing of it was read), and why.
    pub refused: Option<(Vec<Leased>, Refused)>,
}

/// The state one session's feed shares with the rank that runs it.
pub struct Feed<L: Lessor> {
    lessor: Arc<Mutex<L>>,
    manifest: Arc<Manifest>,
    /// Every lease's entries are confined beneath these before they are
    /// given to the session (None: taken as they are, in tests).
    sources: Option<Arc<Sources>>,
    cfg: FeedConfig,
    /// The units leased before the session started (so that a session
    /// never starts with nothing to carry).
    first: Mutex<Option<Vec<Leased>>>,
    /// The leases' ids, renewed by the rank's heartbeat.
    held: Arc<Mutex<Vec<i64>>>,
    taken: Mutex<Taken>,
    /// The bytes of a unit, on average over the leases so far.
    unit: Mutex<(u64, u64)>,
    started: Instant,
}

/// Units a lease takes: `per_lease` of work at `rate` bytes a second, in
/// units of `unit` bytes; at least one, at most [`MAX_BATCH`].
pub fn batch(rate: f64, unit: u64, per_lease: Duration) -> u32 {
    let want = rate * per_lease.as_secs_f64() / unit.max(1) as f64;
    if want.is_finite() && want > 1.0 {
        (want.ceil() as u32).min(MAX_BATCH)
    } else {
        1
    }
}

impl<L: Lessor + 'static> Feed<L> {
    /// A session's feed, starting with the units `first`.
    pub fn new(
        lessor: Arc<Mutex<L>>,
        manifest: Arc<Manifest>,
        sources: Option<Arc<Sources>>,
        held: Arc<Mutex<Vec<i64>>>,
        first: Vec<Leased>,
        cfg: FeedConfig,
    ) -> Arc<Feed<L>> {
        Arc::new(Feed {
            lessor,
            manifest,
            sources,
            cfg,
            first: Mutex::new(Some(first)),
            held,
            taken: Mutex::default(),
            unit: Mutex::new((0, 0)),
            started: Instant::now(),
        })
    }

    /// The share a session carries, fed from this.
    pub fn share(self: &Arc<Self>) -> Share {
        let me = self.clone();
        let feed: ShareFeed = Arc::new(move |in_flight| me.next(in_flight));
        Share::Fed(feed)
    }

    /// What the session leased (once it has ended).
    pub fn taken(&self) -> Taken {
        std::mem::take(&mut *self.taken.lock().expect("poisoned"))
    }

    fn next(&self, in_flight: InFlight) -> Fed {
        if let Some(first) = self.first.lock().expect("poisoned").take() {
            return self.give(first);
        }
        let elapsed = self.started.elapsed();
        let rate = in_flight.sent as f64 / elapsed.as_secs_f64().max(1e-3);
        let unit = {
            let (bytes, units) = *self.unit.lock().expect("poisoned");
            bytes / units.max(1)
        };
        let low_water = unit.max((rate * self.cfg.ahead.as_secs_f64()) as u64);
        if in_flight.files > 0 && in_flight.unsent >= low_water {
            return Fed::Later;
        }
        if elapsed >= self.cfg.span {
            return Fed::End;
        }
        let n = batch(rate, unit, self.cfg.per_lease);
        let got = {
            let mut lessor = self.lessor.lock().expect("poisoned");
            let fair = match n {
                1 => Ok(1),
                _ => lessor.todo().map(|todo| {
                    let fair = todo / (2 * u64::from(self.cfg.ranks.max(1)));
                    u32::try_from(fair).unwrap_or(u32::MAX).clamp(1, n)
                }),
            };
            fair.and_then(|n| lessor.lease(&self.cfg.worker, n, self.cfg.lease))
        };
        match got {
            Ok(units) if units.is_empty() => Fed::End,
            Ok(units) => self.give(units),
            Err(e) => {
                self.taken.lock().expect("poisoned").error = Some(e);
                Fed::End
            }
        }
    }

    fn give(&self, units: Vec<Leased>) -> Fed {
        let cut: Vec<Unit> = units.iter().map(|l| l.unit.clone()).collect();
        let items = self.manifest.share(&cut);
        if let Some(Err(e)) = self.sources.as_ref().map(|s| s.confine(&items)) {
            self.taken.lock().expect("poisoned").refused = Some((units, e));
            return Fed::End;
        }
        {
            let mut u = self.unit.lock().expect("poisoned");
            u.0 += units.iter().map(|l| l.unit.bytes).sum::<u64>();
            u.1 += units.len() as u64;
        }
        self.held
            .lock()
            .expect("poisoned")
            .extend(units.iter().map(|l| l.id));
        self.taken.lock().expect("poisoned").leased.extend(units);
        Fed::More(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Entry;
    use longhaul_proto::xfer::Kind;

    /// Units 0..n, one entry each, handed out in order.
    struct Units {
        next: i64,
        n: i64,
        fail_at: Option<i64>,
    }

    impl Lessor for Units {
        fn lease(&mut self, _: &str, k: u32, _: Duration) -> Result<Vec<Leased>, QueueError> {
            if Some(self.next) == self.fail_at {
                return Err(QueueError::Db {
                    at: "test".into(),
                    why: "connection lost".into(),
                });
            }
            let mut out = Vec::new();
            while self.next < self.n && out.len() < k as usize {
                let i = self.next as u32;
                out.push(Leased {
                    id: self.next,
                    unit: Unit {
                        first: i,
                        end: i + 1,
                        chunks: None,
                        bytes: 100,
                    },
                    attempts: 1,
                });
                self.next += 1;
            }
            Ok(out)
        }

        fn todo(&mut self) -> Result<u64, QueueError> {
            Ok((self.n - self.next) as u64)
        }
    }

    fn manifest(n: usize) -> Arc<Manifest> {
        let entries = (0..n)
            .map(|i| Entry {
                rel: format!("d/f{i}"),
                path: format!("/src/d/f{i}").into(),
                kind: Kind::File,
                size: 100,
                mtime_ns: 0,
                chunk_size: 1 << 20,
            })
            .collect();
        Arc::new(Manifest {
            sources: vec!["/src/d".into()],
            entries,
        })
    }

    /// A feed whose leases never count as quick or slow (unless `pace`).
    fn feed_with(units: Units, cfg: FeedConfig) -> (Arc<Feed<Units>>, Arc<Mutex<Vec<i64>>>) {
        let mut u = units;
        let first = u.lease("w", 1, Duration::from_secs(1)).unwrap();
        let held = Arc::default();
        let f = Feed::new(
            Arc::new(Mutex::new(u)),
            manifest(40),
            None,
            Arc::clone(&held),
            first,
            cfg,
        );
        (f, held)
    }

    fn steady() -> FeedConfig {
        FeedConfig::new("w", 1, Duration::from_secs(60))
    }

    fn feed(units: Units, span: Duration) -> (Arc<Feed<Units>>, Arc<Mutex<Vec<i64>>>) {
        feed_with(units, FeedConfig { span, ..steady() })
    }

    fn rels(fed: Fed) -> Vec<String> {
        match fed {
            Fed::More(items) => items.into_iter().map(|i| i.rel).collect(),
            other => panic!("expected more, got {other:?}"),
        }
    }

    const IDLE: InFlight = InFlight {
        files: 0,
        unsent: 0,
        sent: 0,
    };

    #[test]
    fn every_unit_once_in_order_then_the_end() {
        let (f, held) = feed(
            Units {
                next: 0,
                n: 3,
                fail_at: None,
            },
            Duration::from_secs(60),
        );
        assert_eq!(rels(f.next(IDLE)), ["d/f0"]);
        assert_eq!(rels(f.next(IDLE)), ["d/f1"]);
        assert_eq!(rels(f.next(IDLE)), ["d/f2"]);
        assert!(matches!(f.next(IDLE), Fed::End));
        assert_eq!(*held.lock().unwrap(), [0, 1, 2]);
        let t = f.taken();
        assert_eq!(t.leased.iter().map(|l| l.id).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(t.error.is_none());
    }

    #[test]
    fn waits_while_a_unit_is_ahead_of_the_streams() {
        let (f, _) = feed(
            Units {
                next: 0,
                n: 8,
                fail_at: None,
            },
            Duration::from_secs(60),
        );
        rels(f.next(IDLE));
        let ahead = |unsent| InFlight {
            files: 2,
            unsent,
            sent: 0,
        };
        assert!(matches!(f.next(ahead(100)), Fed::Later));
        assert_eq!(rels(f.next(ahead(99))), ["d/f1"]);
    }

    #[test]
    fn a_fast_rank_leases_many_units_at_once_but_never_more_than_a_fair_part() {
        let (f, _) = feed_with(
            Units {
                next: 0,
                n: 40,
                fail_at: None,
            },
            steady(),
        );
        let fast = InFlight {
            files: 0,
            unsent: 0,
            sent: 1 << 40,
        };
        let sizes: Vec<usize> = std::iter::from_fn(|| match f.next(fast) {
            Fed::More(items) => Some(items.len()),
            _ => None,
        })
        .collect();
        // The unit leased before the start; then 16 (the cap) and at most
        // half of what is left (one rank): 23 left, 12 left, ...
        assert_eq!(sizes, [1, 16, 11, 6, 3, 1, 1, 1]);
    }

    #[test]
    fn a_lease_takes_half_a_second_of_the_ranks_rate() {
        let half = Duration::from_millis(500);
        // 1 Gbit/s: 256 MiB units one at a time, 17 MB units four.
        assert_eq!(batch(125e6, 256 << 20, half), 1);
        assert_eq!(batch(125e6, 17_000_000, half), 4);
        // 100 Gbit/s: capped.
        assert_eq!(batch(12.5e9, 256 << 20, half), MAX_BATCH);
        // Nothing sent yet, or nothing known.
        assert_eq!(batch(0.0, 1 << 20, half), 1);
        assert_eq!(batch(f64::NAN, 1 << 20, half), 1);
        assert_eq!(batch(1e9, 0, half), MAX_BATCH);
    }

    #[test]
    fn a_session_past_its_span_takes_no_more() {
        let (f, _) = feed(
            Units {
                next: 0,
                n: 8,
                fail_at: None,
            },
            Duration::ZERO,
        );
        // The unit leased before the start is still carried.
        assert_eq!(rels(f.next(IDLE)), ["d/f0"]);
        assert!(matches!(f.next(IDLE), Fed::End));
        assert_eq!(f.taken().leased.len(), 1);
    }

    #[test]
    fn a_queue_error_ends_the_feed_and_is_kept() {
        let (f, _) = feed(
            Units {
                next: 0,
                n: 8,
                fail_at: Some(2),
            },
            Duration::from_secs(60),
        );
        rels(f.next(IDLE));
        rels(f.next(IDLE));
        assert!(matches!(f.next(IDLE), Fed::End));
        let t = f.taken();
        assert_eq!(t.leased.len(), 2);
        assert!(t.error.is_some());
    }
}
