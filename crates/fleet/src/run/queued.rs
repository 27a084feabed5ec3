//! The queue mode of a rank ([`super::run`]): units leased from the
//! PostgreSQL work queue and fed to one session after another, the lease
//! heartbeat, and the aggregate the last rank writes back. Built with the
//! `queue` feature.

use std::sync::Mutex;

use super::*;
use crate::feed::{Feed, FeedConfig};
use crate::queue::{Leased, Published, Queue};

/// Renews the leases this rank holds, on a connection of its own, until
/// dropped.
struct Heartbeat {
    held: Arc<Mutex<Vec<i64>>>,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    fn start(
        url: &str,
        run_id: &str,
        worker: &str,
        lease: Duration,
    ) -> Result<Heartbeat, EngineError> {
        let mut q = Queue::connect(url, run_id)?;
        let held: Arc<Mutex<Vec<i64>>> = Arc::default();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (h, worker) = (held.clone(), worker.to_string());
        let thread = std::thread::Builder::new()
            .name("lh-lease".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(lease / 3)
                {
                    let ids = h.lock().expect("poisoned").clone();
                    if !ids.is_empty() {
                        if let Err(e) = q.renew(&worker, &ids, lease) {
                            tracing::warn!("could not renew this rank's leases: {e}");
                        }
                    }
                }
            })
            .map_err(|e| EngineError::io("failed to start the lease thread".into(), e))?;
        Ok(Heartbeat {
            held,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The queue's manifest: read if published; else the first rank to take
/// the walk (any rank: rank 0 may be gone) walks the sources and
/// publishes it with its units, and the others wait for it.
fn queue_manifest(
    f: &Fleet,
    q: &mut Queue,
    unit_bytes: u64,
    unit_files: u32,
) -> Result<Manifest, EngineError> {
    let q_err = EngineError::from;
    let started = Instant::now();
    let mut said = false;
    loop {
        if let Some((hash, bytes)) = q.manifest().map_err(q_err)? {
            return checked(f, &hash, &bytes);
        }
        if q.try_lock_walk().map_err(q_err)? {
            // Published meanwhile by the rank that held the walk before?
            if let Some((hash, bytes)) = q.manifest().map_err(q_err)? {
                q.unlock_walk().map_err(q_err)?;
                return checked(f, &hash, &bytes);
            }
            let published = walk(f).and_then(|m| {
                let units = shard::queue_units(&m.items(), unit_bytes, unit_files);
                let bytes = m.encode();
                if bytes.len() > MAX_QUEUE_MANIFEST {
                    return Err(EngineError::Usage(format!(
                        "the manifest of {} entries is {} MB, more than the queue keeps in one row ({} MB): use --run-dir (static shares) or split the transfer (docs/SCALE.md)",
                        m.entries.len(),
                        bytes.len() >> 20,
                        MAX_QUEUE_MANIFEST >> 20
                    )));
                }
                q.publish(&m.hash(), &bytes, &units)
                    .map_err(q_err)
                    .map(|p| (m, p))
            });
            q.unlock_walk().map_err(q_err)?;
            let (m, p) = published?;
            match p {
                Published::New | Published::Existing => return Ok(m),
            }
        }
        if started.elapsed() > f.wait {
            return Err(failed(format!(
                "no manifest in the queue after {} s: the rank walking the sources is slow or stuck",
                f.wait.as_secs()
            )));
        }
        if !said {
            (f.note)("waiting for another rank to publish the manifest");
            said = true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The queue's manifest, as every rank takes it: whole (its hash), of
/// this command's sources, and every entry beneath them by name.
fn checked(f: &Fleet, hash: &str, bytes: &[u8]) -> Result<Manifest, EngineError> {
    let m = Manifest::decode(bytes).map_err(failed)?;
    if m.hash() != hash {
        return Err(failed(format!(
            "the queue's manifest does not match its hash ({hash}): the database was changed by hand?"
        )));
    }
    if m.sources != super::named(f) {
        return Err(EngineError::Usage(format!(
            "the queue's run is of other sources ({}): give each transfer its own --run-id",
            m.sources.join(" ")
        )));
    }
    sources(f)?.check(&m).map_err(|e| failed(e.to_string()))?;
    Ok(m)
}

pub(super) fn run_queue(
    f: &Fleet,
    reporter: &mut (dyn Reporter + Send),
) -> Result<Outcome, EngineError> {
    let Mode::Queue {
        url,
        run_id,
        unit_bytes,
        unit_files,
        lease,
    } = &f.mode
    else {
        unreachable!("run_queue runs the queue mode");
    };
    let q_err = EngineError::from;
    let mut q = Queue::connect(url, run_id).map_err(q_err)?;
    let manifest = Arc::new(queue_manifest(f, &mut q, *unit_bytes, *unit_files)?);
    let worker = format!(
        "{}:{}:rank{}",
        longhaul_engine::net::sock::hostname(),
        std::process::id(),
        f.rank.rank
    );
    let heartbeat = Heartbeat::start(url, run_id, &worker, *lease)?;
    let sources = Arc::new(Sources::new(&super::named(f)));
    let started = Instant::now();
    let mut me = new_rank(f, &manifest);
    let q = Arc::new(Mutex::new(q));
    let rank = LeasingRank {
        f,
        q: &q,
        manifest: &manifest,
        held: &heartbeat.held,
        worker: &worker,
        lease: *lease,
    };
    if third_party(f) {
        third_party_units(&rank, &mut me, reporter)?;
    } else {
        fed_sessions(&rank, &sources, &mut me, reporter)?;
    }
    drop(heartbeat);
    let mut q = Arc::try_unwrap(q)
        .ok()
        .expect("every session's feed has ended")
        .into_inner()
        .expect("poisoned");
    finish_rank(&mut me, started);
    let json = serde_json::to_value(&me).expect("a rank result serializes");
    q.report_rank(f.rank.rank, &worker, &json).map_err(q_err)?;
    if !q.claim_finalize(&worker).map_err(q_err)? {
        return Ok(Outcome {
            rank: me,
            summary: None,
        });
    }
    let (ranks, counts) = gather_ranks(f, &mut q, &manifest, *lease)?;
    let check = final_check(f, &manifest, reporter)?;
    let mut summary = aggregate("queue", f.rank.size, &manifest, ranks, check);
    if counts.failed > 0 {
        summary.verified = summary.verified
            && summary
                .final_check
                .as_ref()
                .is_some_and(|c| c.failed.is_empty());
        summary.up_to_date &= summary.verified;
    }
    let _ = q.set_aggregate(&serde_json::to_value(&summary).expect("a summary serializes"));
    Ok(Outcome {
        rank: me,
        summary: Some(summary),
    })
}

/// A rank that leases units from the queue: its fleet, the queue, the
/// manifest, the units its heartbeat renews, its name and lease.
struct LeasingRank<'a> {
    f: &'a Fleet,
    q: &'a Arc<Mutex<Queue>>,
    manifest: &'a Arc<Manifest>,
    held: &'a Arc<Mutex<Vec<i64>>>,
    worker: &'a str,
    lease: Duration,
}

/// Sessions of this rank until the queue is empty: each starts with a
/// leased unit and is fed more as it goes; its units are then marked.
fn fed_sessions(
    rank: &LeasingRank,
    sources: &Arc<Sources>,
    me: &mut RankResult,
    reporter: &mut (dyn Reporter + Send),
) -> Result<(), EngineError> {
    let LeasingRank {
        f,
        q,
        manifest,
        held,
        worker,
        lease,
    } = *rank;
    let q_err = EngineError::from;
    let mut errors = 0u32;
    let mut idle = OthersHold::default();
    loop {
        // A session starts with a unit in hand, and is fed the next ones
        // as it goes (`feed`): one connection and slow start for many.
        let first = q.lock().expect("poisoned").lease(worker, 1, lease);
        let first = first.map_err(q_err)?;
        if first.is_empty() {
            let pending = q.lock().expect("poisoned").pending().map_err(q_err)?;
            if pending == (0, 0) {
                break;
            }
            idle.wait(f, pending, lease)?;
            continue;
        }
        idle = OthersHold::default();
        let feed = Feed::new(
            q.clone(),
            manifest.clone(),
            Some(sources.clone()),
            held.clone(),
            first,
            FeedConfig::new(worker, f.rank.size, lease),
        );
        let result = session(f, feed.share(), reporter);
        let taken = feed.taken();
        let ids: Vec<i64> = taken.leased.iter().map(|l| l.id).collect();
        let mut q = q.lock().expect("poisoned");
        if let Some((units, refused)) = taken.refused {
            // Failed for good (every rank would refuse them), and this
            // rank stops: the queue's tables were written by someone else.
            for l in &units {
                q.failed(worker, l.id, &refused.to_string(), 1)
                    .map_err(q_err)?;
            }
            if let Ok(s) = &result {
                mark_units(&mut q, worker, manifest, &taken.leased, &s.failed)?;
            }
            return Err(failed(refused.to_string()));
        }
        match result {
            Ok(s) => {
                errors = 0;
                me.units += mark_units(&mut q, worker, manifest, &taken.leased, &s.failed)?;
                add(me, &s);
                if let Some(e) = taken.error {
                    // The queue failed mid-session: what the session
                    // carried is marked; the next lease says whether the
                    // database is back.
                    (f.note)(&format!("leasing more units failed ({e}); trying again"));
                }
            }
            Err(e) => {
                errors += 1;
                for id in &ids {
                    q.failed(worker, *id, &e.to_string(), MAX_ATTEMPTS)
                        .map_err(q_err)?;
                }
                if errors >= 3 {
                    return Err(e);
                }
                (f.note)(&format!(
                    "a session failed ({e}); its units go back to the queue"
                ));
                drop(q);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        held.lock().expect("poisoned").clear();
    }
    Ok(())
}

/// How long a rank with nothing to lease waits before it looks again.
/// Others hold the rest: they finish it (the run ends), or one of their
/// leases expires. A probe of the pending units is cheap; polling often
/// ends the run soon after its last unit.
fn idle_wait(lease: Duration) -> Duration {
    (lease / 100).clamp(Duration::from_millis(50), Duration::from_millis(250))
}

/// A rank with nothing to lease, waiting on the units other ranks hold:
/// as long as they make progress (a unit done, a lease expired), and at
/// most `--fleet-wait` without any. Ranks that keep renewing their leases
/// and finish nothing would otherwise hold this one forever.
#[derive(Default)]
struct OthersHold {
    /// The pending units (to do, leased) last seen, and since when.
    seen: Option<((u64, u64), Instant)>,
}

impl OthersHold {
    /// Sleeps before the next look, or fails once `pending` has not moved
    /// for `--fleet-wait`.
    fn wait(&mut self, f: &Fleet, pending: (u64, u64), lease: Duration) -> Result<(), EngineError> {
        let since = match self.seen {
            Some((seen, since)) if seen == pending => since,
            _ => {
                self.seen = Some((pending, Instant::now()));
                Instant::now()
            }
        };
        if since.elapsed() > f.wait {
            return Err(failed(format!(
                "{} unit(s) of the queue are held by other ranks that renew their leases and finished none in {} s (--fleet-wait): a rank is stuck; stop it (its units are leased again after --lease) and run this command again with the same --run-id, or give a longer --fleet-wait",
                pending.1,
                f.wait.as_secs()
            )));
        }
        std::thread::sleep(idle_wait(lease));
        Ok(())
    }
}

/// Marks a session's leased units done, or failed (for good after
/// [`MAX_ATTEMPTS`]) where an entry of theirs failed; the number done.
fn mark_units(
    q: &mut Queue,
    worker: &str,
    manifest: &Manifest,
    leased: &[Leased],
    failures: &[Failure],
) -> Result<u64, EngineError> {
    let (bad, good) = split_failed(manifest, leased, failures);
    q.done(worker, &good).map_err(EngineError::from)?;
    for (id, why) in bad {
        q.failed(worker, id, &why, MAX_ATTEMPTS)
            .map_err(EngineError::from)?;
    }
    Ok(good.len() as u64)
}

/// The finalizing rank's wait for every rank's result in the queue (a
/// short one: the others end as soon as they see the queue empty), and
/// the queue's counts of units.
fn gather_ranks(
    f: &Fleet,
    q: &mut Queue,
    manifest: &Manifest,
    lease: Duration,
) -> Result<(Vec<RankResult>, crate::queue::Counts), EngineError> {
    let q_err = EngineError::from;
    // The others end as soon as they see the queue empty: a short wait
    // for their results; a rank that never reports is lost.
    let wait = Fleet {
        wait: (lease * 2).min(f.wait),
        ..clone_fleet(f)
    };
    let counts = q.counts().map_err(q_err)?;
    let plan = Plan {
        entries: manifest.entries.len() as u64,
        bytes: manifest.bytes(),
        units: counts.todo + counts.leased + counts.done + counts.failed,
    };
    let hash = manifest.hash();
    let mut told = std::collections::HashSet::new();
    let ranks = wait_for_results(&wait, manifest, |missing| {
        let reports = q.rank_reports().map_err(q_err)?;
        let mut found: Vec<RankResult> = Vec::new();
        for (rank, _, v) in reports {
            let Ok(r) = serde_json::from_value::<RankResult>(v) else {
                continue;
            };
            if r.manifest != hash {
                continue;
            }
            let why = if rank >= f.rank.size {
                Some(format!("rank {rank} of a fleet of {}", f.rank.size))
            } else {
                unplanned(&r, rank, &plan)
            };
            match why {
                None => {
                    found.retain(|x| x.rank != rank);
                    found.push(r);
                }
                Some(why) if told.insert(rank) => (f.note)(&format!(
                    "ignoring the queue's report of rank {rank}: not a result of this run's plan ({why})"
                )),
                Some(_) => {}
            }
        }
        missing.extend((0..f.rank.size).filter(|r| !found.iter().any(|x| x.rank == *r)));
        Ok(found)
    })?;
    Ok((ranks, counts))
}

/// A fleet of third-party copies on the queue: each leased unit is its
/// own order of the source server (a share of that unit alone: an order
/// cannot be fed more as it goes), marked done or failed once that copy
/// has ended. Its lease is renewed by the heartbeat meanwhile.
fn third_party_units(
    rank: &LeasingRank,
    me: &mut RankResult,
    reporter: &mut (dyn Reporter + Send),
) -> Result<(), EngineError> {
    let LeasingRank {
        f,
        q,
        manifest,
        held,
        worker,
        lease,
    } = *rank;
    let q_err = EngineError::from;
    let sources = sources(f)?;
    let mut errors = 0u32;
    let mut idle = OthersHold::default();
    loop {
        let leased = q
            .lock()
            .expect("poisoned")
            .lease(worker, 1, lease)
            .map_err(q_err)?;
        let Some(l) = leased.into_iter().next() else {
            let pending = q.lock().expect("poisoned").pending().map_err(q_err)?;
            if pending == (0, 0) {
                return Ok(());
            }
            idle.wait(f, pending, lease)?;
            continue;
        };
        idle = OthersHold::default();
        held.lock().expect("poisoned").push(l.id);
        let items = manifest.share(std::slice::from_ref(&l.unit));
        let result = match sources.remote_share(&items) {
            Ok(items) => third_party_session(f, Some(items), reporter),
            Err(refused) => {
                // Failed for good (every rank would refuse it), and this
                // rank stops: the queue's tables were written by someone else.
                q.lock()
                    .expect("poisoned")
                    .failed(worker, l.id, &refused.to_string(), 1)
                    .map_err(q_err)?;
                return Err(failed(refused.to_string()));
            }
        };
        held.lock().expect("poisoned").clear();
        let mut q = q.lock().expect("poisoned");
        match result {
            Ok(s) => {
                errors = 0;
                me.units += mark_units(
                    &mut q,
                    worker,
                    manifest,
                    std::slice::from_ref(&l),
                    &s.failed,
                )?;
                add(me, &s);
            }
            Err(e) => {
                errors += 1;
                q.failed(worker, l.id, &e.to_string(), MAX_ATTEMPTS)
                    .map_err(q_err)?;
                if errors >= 3 {
                    return Err(e);
                }
                (f.note)(&format!(
                    "a third-party copy failed ({e}); its unit goes back to the queue"
                ));
                drop(q);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// The largest manifest the queue keeps (PostgreSQL caps a value at 1 GB).
const MAX_QUEUE_MANIFEST: usize = 900 << 20;

/// Attempts a unit gets before it is failed for good.
const MAX_ATTEMPTS: u32 = 5;

fn clone_fleet(f: &Fleet) -> Fleet {
    Fleet {
        rank: f.rank,
        mode: f.mode.clone(),
        cp: f.cp.clone(),
        wait: f.wait,
        note: f.note.clone(),
        job: f.job.clone(),
    }
}

/// The leased units with a failed entry (and why), and the ids of the rest:
/// one look-up an entry of the units, however many failed.
fn split_failed(
    manifest: &Manifest,
    leased: &[Leased],
    failures: &[Failure],
) -> (Vec<(i64, String)>, Vec<i64>) {
    let mut failed: std::collections::HashMap<&str, &Failure> =
        std::collections::HashMap::with_capacity(failures.len());
    for x in failures {
        failed.entry(x.path.as_str()).or_insert(x);
    }
    let (mut bad, mut good) = (Vec::new(), Vec::new());
    for l in leased {
        let u = &l.unit;
        let end = (u.end as usize).min(manifest.entries.len());
        let entries = manifest.entries.get(u.first as usize..end).unwrap_or(&[]);
        let why = entries.iter().find_map(|e| {
            failed
                .get(e.rel.as_str())
                .map(|x| format!("{}: {}", x.path, x.error))
        });
        match why {
            Some(w) => bad.push((l.id, w)),
            None => good.push(l.id),
        }
    }
    (bad, good)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Entry;
    use crate::shard::Unit;
    use longhaul_proto::xfer::Kind;

    /// 600,000 entries in 300,000 units, half of them failed: split in one
    /// pass (a search of every failure for every entry takes over the
    /// test time-out, 180 s).
    #[test]
    fn many_failed_entries_are_split_from_their_units_in_one_pass() {
        let n = 600_000u32;
        let entries = (0..n)
            .map(|i| Entry {
                rel: format!("src/d{}/f{i}", i % 97),
                path: PathBuf::new(),
                kind: Kind::File,
                size: 1,
                mtime_ns: 0,
                chunk_size: 1 << 20,
            })
            .collect();
        let manifest = Manifest {
            sources: vec!["src".into()],
            entries,
        };
        let leased: Vec<Leased> = (0..n / 2)
            .map(|i| Leased {
                id: i64::from(i),
                unit: Unit {
                    first: 2 * i,
                    end: 2 * i + 2,
                    chunks: None,
                    bytes: 2,
                },
                attempts: 1,
            })
            .collect();
        let failures: Vec<Failure> = (0..n)
            .filter(|i| i % 4 == 1)
            .map(|i| Failure {
                path: format!("src/d{}/f{i}", i % 97),
                error: "disk full".into(),
            })
            .collect();
        let (bad, good) = split_failed(&manifest, &leased, &failures);
        assert_eq!((bad.len(), good.len()), (150_000, 150_000));
        assert!(
            good.iter().all(|id| id % 2 == 1),
            "units 2k+1 hold no failed entry"
        );
        assert_eq!(bad[1], (2, "src/d5/f5: disk full".to_string()));
    }
}
