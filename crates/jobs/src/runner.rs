//! The runner: worker threads that lease due jobs and run their attempts,
//! and a heartbeat thread that renews the leases of the attempts in
//! flight, writes their progress and landed files, and stops an attempt
//! whose job was cancelled (or whose lease another server took).
//!
//! After each attempt the job's state is derived from its files
//! (`longhaul_proto::job::derive`): it waits for its next attempt (with
//! backoff) or run (recurring), or it has ended; then its end is told
//! (`notify`) and, for a job that finished or was cancelled, its far
//! ends' capabilities are revoked (a job that ended with failures keeps
//! them for `jobs retry` until its lifetime ends, or a cancel).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use longhaul_engine::EngineError;
use longhaul_proto::job::{
    backoff, derive, next_run, DiscardState, DiscardView, FileState, JobKind, JobState, Standing,
    MAX_DISCARD_TRIES,
};
use longhaul_proto::units::escaped;

use crate::attempt::{self, Attempt, Ended, Running};
use crate::store::{FileQuery, JobRow, JobStore, Live, HISTORY_KEPT};
use crate::{notify, now, JobsConfig};

pub struct Runner {
    store: Arc<dyn JobStore>,
    cfg: Arc<JobsConfig>,
    running: Mutex<HashMap<String, Arc<Running>>>,
    /// The jobs this server leased and is handling (an attempt, its
    /// settling, or an ended job's chores: telling its end can take a
    /// webhook's every try): the heartbeat renews their leases, so that no
    /// other worker leases one meanwhile and tells its end again.
    held: Mutex<HashMap<String, u32>>,
    /// Bumped by [`Runner::wake`]; idle workers wait on it.
    wakes: Mutex<u64>,
    woken: Condvar,
}

/// How long an idle worker waits before it looks for due jobs again
/// (another server's submissions and retries it is not woken for).
const IDLE: Duration = Duration::from_secs(1);

impl Runner {
    /// Starts `cfg.workers` workers and the heartbeat.
    pub fn start(store: Arc<dyn JobStore>, cfg: Arc<JobsConfig>) -> Arc<Runner> {
        let r = Arc::new(Runner {
            store,
            cfg,
            running: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            wakes: Mutex::new(0),
            woken: Condvar::new(),
        });
        for n in 0..r.cfg.workers.max(1) {
            let me = r.clone();
            let _ = std::thread::Builder::new()
                .name(format!("lh-job{n}"))
                .spawn(move || me.work());
        }
        let me = r.clone();
        let _ = std::thread::Builder::new()
            .name("lh-jobbeat".into())
            .spawn(move || me.beat());
        r
    }

    /// Something is due now (a submission, a retry, a cancel).
    pub fn wake(&self) {
        if let Ok(mut n) = self.wakes.lock() {
            *n += 1;
            self.woken.notify_all();
        }
    }

    /// Stops the job's attempt if it runs here; wakes a worker for its
    /// chores otherwise.
    pub fn cancel(&self, id: &str) {
        if let Some(r) = self.running.lock().ok().and_then(|m| m.get(id).cloned()) {
            r.cancelled.store(true, Ordering::SeqCst);
            r.stop();
        }
        self.wake();
    }

    fn idle(&self) {
        let Ok(n) = self.wakes.lock() else {
            std::thread::sleep(IDLE);
            return;
        };
        let seen = *n;
        let _ = self.woken.wait_timeout_while(n, IDLE, |n| *n == seen);
    }

    fn work(self: Arc<Self>) {
        loop {
            let t = now();
            match self.store.lease(&self.cfg.worker, t, t + self.cfg.lease_s) {
                Ok(Some(job)) => self.handle(job),
                Ok(None) => self.idle(),
                Err(e) => {
                    tracing::warn!("jobs: {e}");
                    std::thread::sleep(IDLE * 5);
                }
            }
        }
    }

    fn beat(self: Arc<Self>) {
        let every = Duration::from_secs(10);
        let mut last_counts = Instant::now() - every;
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let running: Vec<(String, Arc<Running>)> = match self.running.lock() {
                Ok(m) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                Err(_) => continue,
            };
            let mut live: Vec<Live> = running
                .iter()
                .map(|(id, r)| {
                    attempt::flush(&*self.store, id, r);
                    live_of(id, r)
                })
                .collect();
            live.extend(self.held_only(&running));
            match self
                .store
                .heartbeat(&self.cfg.worker, now() + self.cfg.lease_s, &live)
            {
                Ok(beat) => {
                    for (id, r) in &running {
                        if beat.lost.contains(id) {
                            tracing::warn!("job {id}: another server took it over; stopping here");
                            r.lost.store(true, Ordering::SeqCst);
                            r.stop();
                        } else if beat.cancelled.contains(id) {
                            r.cancelled.store(true, Ordering::SeqCst);
                            r.stop();
                        } else if r.stalled_for(self.cfg.stall)
                            && !r.stalled.swap(true, Ordering::SeqCst)
                        {
                            tracing::warn!("job {id}: nothing moved for {} s; stopping the attempt to try again", self.cfg.stall.as_secs());
                            r.stop();
                        }
                    }
                }
                Err(e) => tracing::warn!("jobs: heartbeat: {e}"),
            }
            if last_counts.elapsed() >= every && !self.cfg.observers.is_empty() {
                last_counts = Instant::now();
                if let Ok(counts) = self.store.by_state() {
                    let words: Vec<(&'static str, u64)> =
                        counts.iter().map(|(s, n)| (s.word(), *n)).collect();
                    for o in &self.cfg.observers {
                        o.jobs(&words);
                    }
                }
            }
        }
    }

    /// The jobs held with no attempt in flight, as a heartbeat renews
    /// them (their counters are the store's own while no attempt runs).
    fn held_only(&self, running: &[(String, Arc<Running>)]) -> Vec<Live> {
        let Ok(held) = self.held.lock() else {
            return Vec::new();
        };
        held.keys()
            .filter(|id| !running.iter().any(|(r, _)| r == *id))
            .map(|id| Live {
                id: id.clone(),
                bytes: 0,
                bps: None,
            })
            .collect()
    }

    /// Holds `id`'s lease (renewed by the heartbeat) until the guard drops.
    fn hold(&self, id: &str) -> Held<'_> {
        if let Ok(mut h) = self.held.lock() {
            *h.entry(id.to_string()).or_insert(0) += 1;
        }
        Held {
            runner: self,
            id: id.to_string(),
        }
    }

    fn handle(&self, mut job: JobRow) {
        let _held = self.hold(&job.id);
        let t = now();
        if job.state.is_terminal() {
            self.chores(job);
            return;
        }
        if job.cancel {
            self.cancelled(job);
            return;
        }
        if t >= job.expires {
            job.error = Some("its capabilities' lifetime ended before it did".into());
            self.settle(job, true);
            return;
        }
        if let Err(why) = self.owner_lives(&job) {
            job.error = Some(why);
            job.attempts = job.attempts.max(job.spec.options.retries + 1);
            self.settle(job, true);
            return;
        }
        self.begin(&mut job);
        let running = Arc::new(Running::default());
        if let Ok(mut m) = self.running.lock() {
            m.insert(job.id.clone(), running.clone());
        }
        tracing::info!("job {}: attempt {} begins", job.id, job.attempts);
        let (ended, view) = attempt::run(
            &Attempt {
                job: &job,
                cfg: &self.cfg,
                store: &*self.store,
                running: &running,
            },
            job.attempts,
            &self.cfg.worker,
        );
        if let Ok(mut m) = self.running.lock() {
            m.remove(&job.id);
        }
        if running.lost.load(Ordering::SeqCst) {
            return;
        }
        job.history.pop();
        push_history(&mut job, view);
        match ended {
            Ended::Stopped => {
                job.cancel = true;
                self.cancelled(job);
            }
            Ended::Broke(e) => {
                tracing::info!("job {}: attempt {} broke: {e}", job.id, job.attempts);
                job.error = Some(e);
                self.settle(job, false);
            }
            Ended::Refused(e) => {
                tracing::warn!("job {}: attempt {} was refused: {e}", job.id, job.attempts);
                job.error = Some(e);
                self.settle(job, true);
            }
            Ended::Completed(s) => {
                job.error = s.failed.first().map(|f| {
                    format!(
                        "{} file(s) failed; the first, {}: {}",
                        s.failed.len(),
                        f.path,
                        f.error
                    )
                });
                job.listed = true;
                self.settle(job, false);
            }
        }
    }

    /// Records the attempt as running in the job's history (so that one
    /// whose server dies shows as `lost` to whoever takes the job over),
    /// and marks such an attempt before it.
    fn begin(&self, job: &mut JobRow) {
        let t = now();
        if let Some(last) = job.history.last_mut().filter(|a| a.outcome == "running") {
            last.outcome = "lost".into();
            last.ended = Some(t as f64);
            last.error = Some(format!("its server ({}) stopped", last.worker));
        }
        push_history(
            job,
            longhaul_proto::job::AttemptView {
                attempt: job.attempts,
                started: t as f64,
                worker: self.cfg.worker.clone(),
                outcome: "running".into(),
                ..Default::default()
            },
        );
        job.updated = t;
        if let Err(e) = self.store.save(job, Some(&self.cfg.worker.clone())) {
            tracing::warn!("job {}: {e}", job.id);
        }
    }

    /// Whether the grant that submitted the job still lets it in here.
    fn owner_lives(&self, job: &JobRow) -> Result<(), String> {
        if self.cfg.open_access {
            return Ok(());
        }
        let grants =
            longhaul_engine::server::auth::list(&self.cfg.state_dir).map_err(|e| e.to_string())?;
        if grants.iter().any(|g| g.id == job.owner) {
            Ok(())
        } else {
            Err(format!(
                "the grant that submitted it ({}) is revoked on this server",
                job.owner
            ))
        }
    }

    /// The job's state after an attempt (or instead of one: `over`), its
    /// next time, and what ends with it.
    fn settle(&self, mut job: JobRow, over: bool) {
        let t = now();
        let retries = job.spec.options.retries;
        let tally = match self.store.tally(&job.id, retries) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("job {}: {e}", job.id);
                return;
            }
        };
        let standing = Standing {
            counts: tally.counts,
            due: tally.due,
            listed: job.listed,
            attempts: if over { u32::MAX } else { job.attempts },
            retries,
            cancelled: job.cancel,
            running: false,
            expired: t >= job.expires,
        };
        job.state = derive(&standing);
        job.updated = t;
        job.live_bps = None;
        job.live_bytes = tally.bytes_done;
        let every = job
            .spec
            .options
            .every_s
            .filter(|_| !over && t < job.expires);
        match (job.state, every) {
            (JobState::Submitted, _) => {
                let jitter = fastrand::f64();
                job.next_attempt = t + backoff(self.cfg.backoff_first_s, job.attempts, jitter);
            }
            (s, Some(every)) if s.is_terminal() && s != JobState::Cancelled => {
                let started = run_started(&job).unwrap_or(t);
                notify::tell(&self.cfg, &job, &tally, "run_ended");
                job.runs += 1;
                job.attempts = 0;
                job.listed = false;
                job.state = JobState::Submitted;
                job.next_attempt = next_run(started, t, every);
            }
            _ => job.next_attempt = t,
        }
        if job.state.is_terminal() {
            job.worker = Some(self.cfg.worker.clone());
            job.lease_until = now() + self.cfg.lease_s;
        } else {
            job.worker = None;
            job.lease_until = 0;
        }
        let holder = self.cfg.worker.clone();
        match self.store.save(&job, Some(&holder)) {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    "job {}: another server holds it now; its result here is dropped",
                    job.id
                );
                return;
            }
            Err(e) => {
                tracing::warn!("job {}: {e}", job.id);
                return;
            }
        }
        tracing::info!("job {} is {}", job.id, job.state.word());
        if job.state.is_terminal() {
            self.chores(job);
        }
    }

    /// A cancelled job: its attempt stopped; its unfinished entries are
    /// cancelled (their partial files go with its chores).
    fn cancelled(&self, mut job: JobRow) {
        let changes: Vec<crate::store::FileChange> = self
            .entries(&job.id, &[FileState::Submitted, FileState::Failed])
            .into_iter()
            .map(|path| crate::store::FileChange {
                path,
                state: FileState::Cancelled,
                error: None,
                permanent: false,
            })
            .collect();
        if let Err(e) = self.store.change_files(&job.id, &changes) {
            tracing::warn!("job {}: {e}", job.id);
        }
        job.cancel = true;
        job.error = Some("cancelled by its owner".into());
        job.revoked = false;
        self.settle(job, true);
    }

    /// What a cancelled job's copies left of its unfinished entries, removed
    /// at the far end (a push or a third-party copy, with the destination's
    /// capability, or over ssh) or here (a pull). A far end that cannot be
    /// reached keeps a pending discard in the job ([`DiscardView`]), tried
    /// again with backoff until it is done, [`MAX_DISCARD_TRIES`] tries
    /// fail or the job's lifetime ends: when it is due next, while pending.
    fn discard(&self, job: &mut JobRow, t: u64) -> Option<u64> {
        if job.kind == JobKind::Pull {
            let cancelled = self.entries(&job.id, &[FileState::Cancelled]);
            let (n, dirs) = self.discard_here(job, &cancelled);
            if n + dirs > 0 {
                tracing::info!(
                    "job {}: {n} partial file(s) and {dirs} empty directory(ies) it made removed here",
                    job.id
                );
            }
            return None;
        }
        let dest = &job.spec.dest;
        let end = dest
            .ssh
            .clone()
            .or_else(|| dest.host.clone())
            .unwrap_or_default();
        let cancelled = self.entries(&job.id, &[FileState::Cancelled]);
        let at = match job.discards.iter().position(|d| d.end == end) {
            Some(at) if job.discards[at].state != DiscardState::Pending => return None,
            Some(at) => at,
            None if cancelled.is_empty() => return None,
            None => {
                job.discards.push(DiscardView {
                    end,
                    ..DiscardView::default()
                });
                job.discards.len() - 1
            }
        };
        let tried = self.discard_far(job, &cancelled);
        let (first_s, expires) = (self.cfg.backoff_first_s, job.expires);
        let d = &mut job.discards[at];
        d.tries += 1;
        let shown = escaped(&d.end);
        match tried {
            Ok(n) => {
                tracing::info!("job {}: {n} partial file(s) removed on {shown}", job.id);
                d.state = DiscardState::Done;
                d.removed = n;
                d.next_try = None;
                d.error = None;
                None
            }
            Err(e) => {
                let for_good = matches!(
                    e,
                    EngineError::Refused { .. } | EngineError::Usage(_) | EngineError::Trust(_)
                );
                d.error = Some(e.to_string());
                if for_good || d.tries >= MAX_DISCARD_TRIES || t >= expires {
                    tracing::warn!(
                        "job {}: the partial files on {shown} stay (tried {} time(s)): {}",
                        job.id,
                        d.tries,
                        escaped(&e.to_string())
                    );
                    d.state = DiscardState::GivenUp;
                    d.next_try = None;
                    return None;
                }
                let next = t + backoff(first_s, d.tries, fastrand::f64());
                tracing::warn!(
                    "job {}: cannot remove the partial files on {shown} yet (try {}), again in {} s: {}",
                    job.id,
                    d.tries,
                    next - t,
                    escaped(&e.to_string())
                );
                d.next_try = Some(next as f64);
                Some(next)
            }
        }
    }

    /// Has the far end of a cancelled push or third-party copy remove the
    /// partial files of `cancelled`: over ssh as at each attempt, or at the
    /// far server with the destination's capability. How many it removed.
    fn discard_far(&self, job: &JobRow, cancelled: &[String]) -> Result<u64, EngineError> {
        let dest = &job.spec.dest;
        if dest.ssh.is_some() {
            // Noted by an attempt ([`JobRow::made`]), maybe since `job` was read.
            let made = job.made.clone().or_else(|| {
                let stored = self.store.get(&job.id).ok().flatten();
                stored.and_then(|r| r.made)
            });
            return attempt::discard_over_ssh(&self.cfg, dest, cancelled, made.as_deref());
        }
        let o =
            attempt::far_end(&self.cfg, dest, &Default::default()).map_err(EngineError::Usage)?;
        longhaul_engine::xfer::jobcaps::discard(
            dest.host.as_deref().unwrap_or_default(),
            &o,
            None,
            cancelled,
        )
    }

    /// The job's entries in `states`.
    fn entries(&self, id: &str, states: &[FileState]) -> Vec<String> {
        let mut out = Vec::new();
        for &state in states {
            let mut from = 0;
            loop {
                let page = self.store.files(
                    id,
                    FileQuery {
                        state: Some(state),
                        from,
                        limit: 10_000,
                    },
                );
                let Ok((rows, _)) = page else { break };
                if rows.is_empty() {
                    break;
                }
                from += rows.len() as u64;
                out.extend(rows.into_iter().map(|r| r.path));
            }
        }
        out
    }

    /// A cancelled pull's partial files, here beneath its destination, and
    /// the directories it made there that are left empty
    /// ([`JobRow::made`]): how many of each.
    fn discard_here(&self, job: &JobRow, paths: &[String]) -> (u64, u64) {
        let Ok(ex) = attempt::export_of(&self.cfg, &job.spec.dest) else {
            return (0, 0);
        };
        let Ok(anchor) = longhaul_engine::xfer::beneath::Anchor::open(&ex.root) else {
            return (0, 0);
        };
        let Ok(dest) = longhaul_engine::xfer::beneath(&ex.root, &job.spec.dest.paths[0]) else {
            return (0, 0);
        };
        longhaul_engine::xfer::sink::discard_entries(
            &anchor,
            &dest,
            paths,
            false,
            job.made.as_deref().map(std::path::Path::new),
        )
    }

    /// What is left to do for an ended job (its lease held): tell its end,
    /// once; revoke its capabilities once it finished or was cancelled, or
    /// its lifetime ended (one that ended with failures keeps them for a
    /// retry).
    fn chores(&self, mut job: JobRow) {
        if !job.notified {
            let tally = self
                .store
                .tally(&job.id, job.spec.options.retries)
                .unwrap_or_default();
            notify::tell(&self.cfg, &job, &tally, "ended");
            job.notified = true;
            job.lease_until = now() + self.cfg.lease_s;
            match self.store.save(&job, Some(&self.cfg.worker.clone())) {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => tracing::warn!("job {}: {e}", job.id),
            }
        }
        let t = now();
        let revoke_now =
            matches!(job.state, JobState::Finished | JobState::Cancelled) || t >= job.expires;
        let mut discard_due = None;
        if !job.revoked && revoke_now {
            if job.state == JobState::Cancelled {
                discard_due = self.discard(&mut job, t);
            }
            // A pending discard needs the destination's capability.
            job.revoked = self.revoke(&job, discard_due.is_some()) && discard_due.is_none();
        }
        job.next_attempt = if job.revoked {
            u64::MAX / 2
        } else if let Some(due) = discard_due {
            due
        } else if revoke_now {
            t + backoff(
                self.cfg.backoff_first_s,
                job.attempts.max(1),
                fastrand::f64(),
            )
        } else {
            job.expires
        };
        job.worker = None;
        job.lease_until = 0;
        job.updated = t;
        if let Err(e) = self.store.save(&job, Some(&self.cfg.worker.clone())) {
            tracing::warn!("job {}: {e}", job.id);
        }
    }

    /// Revokes the job's capabilities at each far end (but its
    /// destination's, `keep_dest`: a discard there is pending); whether
    /// every one revoked is gone (an expired one is).
    fn revoke(&self, job: &JobRow, keep_dest: bool) -> bool {
        let mut all = true;
        let ends = if keep_dest {
            vec![&job.spec.source]
        } else {
            vec![&job.spec.source, &job.spec.dest]
        };
        for end in ends {
            let (Some(host), Some(_)) = (&end.host, &end.credential) else {
                continue;
            };
            let done = attempt::far_end(&self.cfg, end, &Default::default())
                .map_err(longhaul_engine::EngineError::Usage)
                .and_then(|o| longhaul_engine::xfer::jobcaps::revoke(host, &o));
            match done {
                Ok(()) => tracing::info!("job {}: its capability at {host} is revoked", job.id),
                Err(e) if e.to_string().contains("unknown, expired or revoked") => {}
                Err(e) => {
                    tracing::warn!(
                        "job {}: cannot revoke its capability at {host} yet: {e}",
                        job.id
                    );
                    all = false;
                }
            }
        }
        all
    }
}

/// A job's lease held by this server while it handles the job.
struct Held<'a> {
    runner: &'a Runner,
    id: String,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Ok(mut h) = self.runner.held.lock() {
            if let Some(n) = h.get_mut(&self.id) {
                *n -= 1;
                if *n == 0 {
                    h.remove(&self.id);
                }
            }
        }
    }
}

/// The live counters of an attempt, with the rate since the last beat.
fn live_of(id: &str, r: &Running) -> Live {
    let bytes = r.progress.bytes.load(Ordering::Relaxed);
    let now = Instant::now();
    if let Ok(mut s) = r.sampled.lock() {
        if let Some((at, before)) = *s {
            let secs = now.duration_since(at).as_secs_f64();
            if secs >= 0.5 {
                let bps = bytes.saturating_sub(before) as f64 * 8.0 / secs;
                r.rate_bps.store(bps as u64, Ordering::Relaxed);
                *s = Some((now, bytes));
            }
        } else {
            *s = Some((now, bytes));
        }
    }
    let bps = r.rate_bps.load(Ordering::Relaxed);
    Live {
        id: id.to_string(),
        bytes,
        bps: (bps > 0).then_some(bps as f64),
    }
}

fn push_history(job: &mut JobRow, view: longhaul_proto::job::AttemptView) {
    job.history.push(view);
    if job.history.len() > HISTORY_KEPT {
        let extra = job.history.len() - HISTORY_KEPT;
        job.history.drain(..extra);
    }
}

/// When the current run of a recurring job started: its first attempt.
fn run_started(job: &JobRow) -> Option<u64> {
    job.history
        .iter()
        .rev()
        .find(|a| a.attempt == 1)
        .map(|a| a.started as u64)
}
