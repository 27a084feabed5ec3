//! One attempt of a job: its sources walked into entries (each with a
//! state), then the engine's ordinary copy, with the far end's capability
//! as the credential and its certificate pinned, archived as a run of kind
//! `job`. Every attempt walks and sends the whole job: what landed before
//! is skipped by the destination (same size and mtime), and a file cut
//! short resumes from its chunk journal, so a retry moves only what is
//! missing, and never a verified chunk again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use longhaul_archive::model::NewRun;
use longhaul_archive::reporter::ArchiveReporter;
use longhaul_engine::net::dial::ClientOptions;
use longhaul_engine::reach::{reach_ends, End, FarEnd};
use longhaul_engine::report::{Discard, Reporter};
use longhaul_engine::results::CommandReporter;
use longhaul_engine::server::oneshot::Admits;
use longhaul_engine::xfer::client::{cp_with, CopyReport, CpOptions};
use longhaul_engine::xfer::filter::Filter;
use longhaul_engine::xfer::{beneath, confine, Catalogue, Export, Landed, Progress};
use longhaul_engine::EngineError;
use longhaul_proto::job::{AttemptView, FileState, JobEnd, JobKind};
use longhaul_proto::xfer::copy::{CopyOptions, CopyOrder};
use longhaul_proto::xfer::{Failure, Kind, Remote};

use crate::store::{FileChange, FileRow, JobRow, JobStore};
use crate::JobsConfig;

/// A job's attempt in flight on this server, as the heartbeat and a
/// cancel see it.
#[derive(Default)]
pub struct Running {
    /// The copy's counters and interrupt flag.
    pub progress: Arc<Progress>,
    /// Its owner cancelled it (or this server lost its lease).
    pub cancelled: AtomicBool,
    pub lost: AtomicBool,
    /// Files landed and not yet written to the store.
    pub landed: Mutex<Vec<String>>,
    /// The last sample of the bytes moved, for the rate.
    pub sampled: Mutex<Option<(Instant, u64)>>,
    pub rate_bps: AtomicU64,
    /// The copy has started (its listing is done): from then on it must
    /// move, or the heartbeat stops it as stalled.
    pub copying: AtomicBool,
    /// When it last moved (bytes sent, entries announced), and what then.
    pub moved: Mutex<Option<(Instant, u64)>>,
    /// The heartbeat stopped it: it moved nothing for the stall time.
    pub stalled: AtomicBool,
}

impl Running {
    /// Whether the copy has moved nothing (no byte sent, no entry
    /// announced) for `stall` since it started copying.
    pub fn stalled_for(&self, stall: std::time::Duration) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.copying.load(Relaxed) {
            return false;
        }
        let p = &self.progress;
        let now = p.bytes.load(Relaxed) + p.announced_files.load(Relaxed) + p.files.load(Relaxed);
        let Ok(mut m) = self.moved.lock() else {
            return false;
        };
        match *m {
            Some((at, before)) if before == now => at.elapsed() >= stall,
            _ => {
                *m = Some((Instant::now(), now));
                false
            }
        }
    }

    /// Stops the copy: its streams end, its journals stay (a cancel then
    /// removes them).
    pub fn stop(&self) {
        self.progress
            .interrupt
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How an attempt ended.
pub enum Ended {
    /// The transfer ran to its end (some files may have failed).
    Completed(Box<CopyReport>),
    /// It broke (the network, the far end) or could not start: worth
    /// another attempt.
    Broke(String),
    /// A far end refused it (its capability, its scope), or the job no
    /// longer fits this server (its export gone): no attempt would do
    /// better.
    Refused(String),
    /// It was stopped (a cancel, a lost lease).
    Stopped,
}

/// What an attempt needs.
pub struct Attempt<'a> {
    pub job: &'a JobRow,
    pub cfg: &'a JobsConfig,
    pub store: &'a dyn JobStore,
    pub running: &'a Arc<Running>,
}

/// The export of the job's end on this server.
pub fn export_of<'a>(cfg: &'a JobsConfig, end: &JobEnd) -> Result<&'a Export, String> {
    cfg.exports
        .iter()
        .find(|e| e.name == end.export)
        .ok_or_else(|| format!("the export '{}' is gone from this server", end.export))
}

/// How to reach the far end `end`: its capability, its pinned certificate.
pub fn far_end(
    cfg: &JobsConfig,
    end: &JobEnd,
    interrupt: &Arc<AtomicBool>,
) -> Result<ClientOptions, String> {
    let c = end
        .credential
        .as_ref()
        .ok_or("the job carries no capability of its far end")?;
    let base = ClientOptions {
        connect_timeout: cfg.connect_timeout,
        handshake_timeout: cfg.handshake_timeout,
        interrupt: interrupt.clone(),
        ..ClientOptions::default()
    };
    longhaul_engine::xfer::jobcaps::presenting(&base, &c.fingerprint, &c.capability)
        .map_err(|e| e.to_string())
}

/// `path` on a far end's server (`longhaul://HOST/EXPORT/PATH`).
pub fn on_server(end: &JobEnd, path: &str) -> End {
    End::on_server(Remote {
        host: end.host.clone().unwrap_or_default(),
        export: end.export.clone(),
        path: path.trim_end_matches('/').to_string(),
        dir: end.dir || path.is_empty() || path.ends_with('/'),
    })
}

/// The copy an attempt runs, as `cp` would take it.
fn copy_options(job: &JobRow) -> CopyOptions {
    let o = &job.spec.options;
    CopyOptions {
        recursive: o.recursive,
        preserve: o.preserve,
        mkpath: o.mkpath,
        verify: o.verify,
        sync: o.sync.clone(),
        streams: o.streams,
        chunk_size: o.chunk_size,
        rate: o.rate,
        compress: o.compress,
        ..CopyOptions::default()
    }
}

/// The job's copy: its sources and destination as this server reaches
/// them, and the far end's credential.
fn plan(a: &Attempt) -> Result<CpOptions, String> {
    let job = a.job;
    let interrupt = a.running.progress.interrupt.clone();
    let spec = &job.spec;
    let (sources, dest, client, anchor) = match job.kind {
        JobKind::Push => {
            let ex = export_of(a.cfg, &spec.source)?;
            let sources = local_paths(ex, &spec.source.paths)?
                .into_iter()
                .map(End::Local)
                .collect();
            let anchor = longhaul_engine::xfer::beneath::Anchor::open_as(
                &ex.root,
                std::path::Path::new(&ex.name),
            )
            .map_err(|e| e.to_string())?;
            let (dest, client) = match spec.dest.ssh {
                Some(_) => (
                    over_ssh_end(&spec.dest, &spec.dest.paths[0]),
                    over_ssh_client(a.cfg, &interrupt),
                ),
                None => (
                    on_server(&spec.dest, &spec.dest.paths[0]),
                    far_end(a.cfg, &spec.dest, &interrupt)?,
                ),
            };
            (sources, dest, client, Some(Arc::new(anchor)))
        }
        JobKind::Pull => {
            let ex = export_of(a.cfg, &spec.dest)?;
            let mut dest = local_paths(ex, &spec.dest.paths)?.remove(0);
            if spec.dest.dir && !dest.ends_with('/') {
                dest.push('/');
            }
            let (sources, client) = match spec.source.ssh {
                Some(_) => (
                    spec.source
                        .paths
                        .iter()
                        .map(|p| over_ssh_end(&spec.source, p))
                        .collect(),
                    over_ssh_client(a.cfg, &interrupt),
                ),
                None => (
                    spec.source
                        .paths
                        .iter()
                        .map(|p| on_server(&spec.source, p))
                        .collect(),
                    far_end(a.cfg, &spec.source, &interrupt)?,
                ),
            };
            (sources, End::Local(dest), client, None)
        }
        JobKind::ThirdParty => (
            spec.source
                .paths
                .iter()
                .map(|p| on_server(&spec.source, p))
                .collect(),
            on_server(&spec.dest, &spec.dest.paths[0]),
            far_end(a.cfg, &spec.source, &interrupt)?,
            None,
        ),
    };
    let mut o = longhaul_engine::xfer::copy::options_of(&copy_options(job), sources, dest, client);
    o.retries = 0;
    o.filter = spec.options.filter.clone();
    o.source_anchor = anchor;
    o.progress = a.running.progress.clone();
    o.path_memory = None;
    Ok(o)
}

/// An entry of the job, still to do.
fn entry(path: String, kind: Kind, size: u64) -> FileRow {
    FileRow {
        path,
        kind,
        size: if kind == Kind::File { size } else { 0 },
        state: FileState::Submitted,
        attempts: 0,
        error: None,
        permanent: false,
    }
}

/// An entry of the job that failed when its sources were listed, for good
/// or not as [`crate::lasting::permanent`] reads `error`.
fn failed_entry(path: String, kind: Kind, error: String) -> FileRow {
    FileRow {
        state: FileState::Failed,
        permanent: crate::lasting::permanent(&error),
        error: Some(error),
        ..entry(path, kind, 0)
    }
}

/// The job's entries as a walk of its sources finds them (a listing of
/// the far end's, for a pull), without those its rules exclude.
fn list(a: &Attempt, o: &CpOptions) -> Result<Vec<FileRow>, Ended> {
    let job = a.job;
    let mut rows: Vec<FileRow> = match job.kind {
        JobKind::Push => {
            let roots: Vec<PathBuf> = o.sources.iter().map(|s| PathBuf::from(s.arg())).collect();
            let (found, failed) = longhaul_engine::xfer::source::walk_beneath(
                o.source_anchor.clone(),
                &roots,
                o.recursive,
                o.chunk_size,
                1,
            );
            let mut rows: Vec<FileRow> = found
                .into_iter()
                .map(|(e, _)| entry(e.path, e.kind, e.size))
                .collect();
            rows.extend(
                failed
                    .into_iter()
                    .map(|f| failed_entry(f.path, Kind::File, f.error)),
            );
            rows
        }
        _ => remote_entries(o)?,
    };
    let filter = longhaul_engine::xfer::client::compile_filter(
        &o.filter,
        o.sources.iter().all(End::slashed),
    );
    if let Some(f) = filter.map_err(Ended::Refused)? {
        rows = without_excluded(rows, &f);
    }
    rows.sort_by(|x, y| x.path.cmp(&y.path));
    rows.dedup_by(|x, y| x.path == y.path);
    Ok(rows)
}

/// A pull's entries, from the far end's listing of each source (with the
/// job's capability, which lists beneath its sources only), named as the
/// far end's walk names what it sends: the source's own name first (the
/// export's for its root). A source that lists as one entry of its own
/// name that is no directory is that file. A directory named without
/// `-r` is one entry, failed as `cp` fails it.
fn remote_entries(o: &CpOptions) -> Result<Vec<FileRow>, Ended> {
    let mut out = Vec::new();
    for source in &o.sources {
        let s = source.arg();
        let r = source
            .server()
            .ok_or_else(|| Ended::Refused(format!("{s} is not remote")))?;
        let path = r.path.trim_end_matches('/');
        let name = path
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty())
            .unwrap_or(&r.export)
            .to_string();
        let listed = longhaul_engine::xfer::client::ls(source, o.recursive, &o.client)
            .map_err(|e| ended_by(&e, format!("cannot list {s}: {e}")))?;
        match listed.as_slice() {
            [one] if one.kind != Kind::Dir && one.name == name && !path.is_empty() => {
                out.push(entry(name, one.kind, one.size));
            }
            _ if !o.recursive => out.push(failed_entry(
                name,
                Kind::Dir,
                longhaul_engine::xfer::source::directory_without_r(&s),
            )),
            _ => {
                out.push(entry(name.clone(), Kind::Dir, 0));
                out.extend(
                    listed
                        .into_iter()
                        .map(|e| entry(format!("{name}/{}", e.name), e.kind, e.size)),
                );
            }
        }
    }
    Ok(out)
}

/// `rows` (in walk order) without what `f` excludes, and nothing beneath
/// an excluded directory.
fn without_excluded(rows: Vec<FileRow>, f: &Filter) -> Vec<FileRow> {
    let mut pruned: Vec<String> = Vec::new();
    rows.into_iter()
        .filter(|r| {
            if pruned.iter().any(|d| r.path.starts_with(d.as_str())) {
                return false;
            }
            let dir = r.kind == Kind::Dir;
            if f.excludes_entry(&r.path, dir) {
                if dir {
                    pruned.push(format!("{}/", r.path));
                }
                return false;
            }
            true
        })
        .collect()
}

/// The run in the archive, when the server keeps one.
fn archive_run(a: &Attempt, attempt: u32) -> Option<ArchiveReporter> {
    let path = a.cfg.archive.as_ref()?;
    let job = a.job;
    let run = NewRun {
        kind: "job".into(),
        command: format!("job {} attempt {attempt}", job.id),
        remote_host: [&job.spec.source, &job.spec.dest]
            .into_iter()
            .find_map(|e| e.host.clone()),
        grant: Some(job.owner.clone()),
        source: Some(job.spec.source.shown()),
        dest: Some(job.spec.dest.shown()),
        params: Some(serde_json::json!({
            "job": job.id,
            "attempt": attempt,
            "run": job.runs + 1,
            "kind": job.kind.word(),
            "sync": job.spec.options.sync.is_some(),
            "rate_bps": job.spec.options.rate,
        })),
        ..NewRun::default()
    };
    ArchiveReporter::start(path, &run)
        .map_err(|e| tracing::warn!("not archiving job {}'s attempt: {e}", job.id))
        .ok()
}

/// The files that land go to the running attempt (the heartbeat writes
/// them to the store) and to the archive's catalogue.
fn catalogue(running: &Arc<Running>, archive: Option<Catalogue>) -> Catalogue {
    let running = running.clone();
    Arc::new(move |l: Landed| {
        if let Ok(mut v) = running.landed.lock() {
            v.push(l.path.clone());
        }
        if let Some(c) = &archive {
            c(l);
        }
    })
}

/// Runs one attempt: lists the job's entries, copies, and records what
/// each entry became. The attempt's row for the job's history.
pub fn run(a: &Attempt, number: u32, worker: &str) -> (Ended, AttemptView) {
    let started = crate::now();
    let mut view = AttemptView {
        attempt: number,
        started: started as f64,
        worker: worker.to_string(),
        outcome: "running".into(),
        ..AttemptView::default()
    };
    let ended = match prepare(a) {
        Ok((o, far, listed)) => {
            let ended = copy(a, o, listed, number, &mut view);
            if let Some(f) = far {
                f.finish();
            }
            ended
        }
        Err(e) => e,
    };
    view.ended = Some(crate::now() as f64);
    match &ended {
        Ended::Completed(s) => {
            view.outcome = if s.failed.is_empty() { "ok" } else { "partial" }.into();
            view.files = s.files;
            view.bytes = s.bytes;
            view.resumed_bytes = s.resumed_bytes;
            view.sent_bytes = s.sent_bytes;
        }
        Ended::Broke(e) | Ended::Refused(e) => {
            view.outcome = "failed".into();
            view.error = Some(e.clone());
        }
        Ended::Stopped => view.outcome = "cancelled".into(),
    }
    (ended, view)
}

/// The copy planned and the entries listed, their attempts counted; the
/// far end over ssh started for it, if the job has one (it lives until
/// the attempt ends); and the entries that failed when listed.
fn prepare(a: &Attempt) -> Result<(CpOptions, Option<FarEnd>, Vec<Failure>), Ended> {
    let mut o = plan(a).map_err(Ended::Refused)?;
    let far = over_ssh(a, &mut o)?;
    note_made_over_ssh(a, &o);
    let rows = list(a, &o)?;
    let fresh = a.job.spec.options.every_s.is_some() && a.job.attempts <= 1;
    let store = |e: crate::store::StoreError| Ended::Broke(e.to_string());
    a.store.put_files(&a.job.id, &rows, fresh).map_err(store)?;
    a.store
        .count_attempt(&a.job.id, a.job.spec.options.retries)
        .map_err(store)?;
    if let Some(why) = nothing_to_do(&rows) {
        if let Some(f) = far {
            f.finish();
        }
        return Err(Ended::Refused(why));
    }
    let listed = rows
        .into_iter()
        .filter(|r| r.state == FileState::Failed)
        .map(|r| Failure {
            error: r.error.unwrap_or_default(),
            path: r.path,
        })
        .collect();
    Ok((o, far, listed))
}

/// Why an attempt has nothing to copy, when each entry its listing found
/// failed there (a directory named without `-r`, a source that is not
/// there): no later attempt would find more, so the job ends with this
/// instead of retrying a copy of nothing.
fn nothing_to_do(rows: &[FileRow]) -> Option<String> {
    if rows.iter().any(|r| r.state != FileState::Failed) {
        return None;
    }
    let first = rows.first()?;
    Some(format!(
        "nothing to copy: {} entry(ies) failed when the sources were listed; the first, {}: {}",
        rows.len(),
        first.path,
        first.error.as_deref().unwrap_or("failed")
    ))
}

/// A far end over ssh: started by this server's own ssh (to a host its
/// admin allowed, checked at submission), the job's paths there put on
/// its one-shot server, which `o.client` then trusts and proves itself to.
fn over_ssh(a: &Attempt, o: &mut CpOptions) -> Result<Option<FarEnd>, Ended> {
    let spec = &a.job.spec;
    if spec.source.ssh.is_none() && spec.dest.ssh.is_none() {
        return Ok(None);
    }
    let mut ends = o.sources.clone();
    ends.push(o.dest.clone());
    let far = reach_ends(&mut ends, &mut o.client, &a.cfg.ssh, Admits::Open)
        .map_err(|e| ended_by(&e, format!("cannot reach the far end over ssh: {e}")))?;
    o.dest = ends.pop().unwrap_or(End::Local(String::new()));
    o.sources = ends;
    Ok(far)
}

/// A push over ssh whose job has noted nothing it makes yet, in its first
/// run: what of its destination's path is missing on the far host, noted
/// before this attempt writes there ([`JobRow::made`]). Looking again at a
/// later attempt is safe: what an earlier one made is there then, and is
/// never taken for made.
fn note_made_over_ssh(a: &Attempt, o: &CpOptions) {
    let job = a.job;
    let first_run = job.runs == 0 && job.made.is_none();
    if job.kind != JobKind::Push || job.spec.dest.ssh.is_none() || !first_run {
        return;
    }
    let Some(made) = o
        .dest
        .server()
        .and_then(|dest| crate::made::first_missing_far(dest, &o.client))
    else {
        return;
    };
    match a.store.note_made(&job.id, &made) {
        Ok(()) => tracing::info!(
            "job {}: its push makes {} on {} (a cancel removes what is left empty of it)",
            job.id,
            longhaul_proto::units::escaped(&made),
            longhaul_proto::units::escaped(job.spec.dest.ssh.as_deref().unwrap_or_default())
        ),
        Err(e) => tracing::warn!("job {}: {e}", job.id),
    }
}

/// Removes, on the host over ssh a cancelled push went to, the partial
/// files (and journals) of its unfinished entries `paths` (as the push
/// named them): reached as at each attempt (this server's own ssh, to a
/// host its admin still allows), a one-shot server there is asked to
/// discard them beneath the job's destination, and nowhere else. How many
/// it removed.
pub fn discard_over_ssh(
    cfg: &JobsConfig,
    end: &JobEnd,
    paths: &[String],
    made: Option<&str>,
) -> Result<u64, EngineError> {
    let host = end.ssh.as_deref().unwrap_or_default();
    if !cfg.ssh_hosts.iter().any(|h| h == host) {
        return Err(EngineError::Usage(format!(
            "this server no longer reaches '{}' over ssh for its jobs (serve --jobs-ssh)",
            longhaul_proto::units::escaped(host)
        )));
    }
    let dest = end.paths.first().map(String::as_str).unwrap_or_default();
    let (far, exported) = FarEnd::open_for(&cfg.ssh, host, Admits::Sessions(1), &[Some(dest)])?;
    let discarded = match exported.into_iter().next().flatten() {
        Some((_, (export, dest))) => {
            let o = ClientOptions {
                security: far.security(),
                ..over_ssh_client(cfg, &Default::default())
            };
            let into = longhaul_proto::xfer::copy::DiscardInto {
                export: export.to_string(),
                dest,
                made: made.map(String::from),
            };
            longhaul_engine::xfer::jobcaps::discard(&far.server(), &o, Some(&into), paths)
        }
        None => Err(EngineError::Usage("the job names no destination".into())),
    };
    far.finish();
    discarded
}

/// `[USER@]HOST:path` of a far end over ssh, read as `cp` reads it.
fn over_ssh_end(end: &JobEnd, path: &str) -> End {
    let host = end.ssh.as_deref().unwrap_or_default();
    let slash = if end.dir && !path.is_empty() && !path.ends_with('/') {
        "/"
    } else {
        ""
    };
    End::read(&format!("{host}:{path}{slash}"))
}

/// How this server reaches a far end over ssh: no credential of the job's
/// (the far end's one-shot server gives its own once started).
fn over_ssh_client(cfg: &JobsConfig, interrupt: &Arc<AtomicBool>) -> ClientOptions {
    ClientOptions {
        connect_timeout: cfg.connect_timeout,
        handshake_timeout: cfg.handshake_timeout,
        interrupt: interrupt.clone(),
        ..ClientOptions::default()
    }
}

fn copy(
    a: &Attempt,
    mut o: CpOptions,
    listed: Vec<Failure>,
    number: u32,
    view: &mut AttemptView,
) -> Ended {
    let mut archive = archive_run(a, number);
    view.archive_run = archive.as_ref().and_then(ArchiveReporter::run);
    o.catalogue = Some(catalogue(
        a.running,
        archive.as_ref().and_then(ArchiveReporter::catalogue),
    ));
    a.running
        .copying
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let copied = match archive.as_mut() {
        Some(r) => transfer(a, &o, r),
        None => transfer(a, &o, &mut Discard),
    };
    flush_landed(a);
    let stopped = a
        .running
        .cancelled
        .load(std::sync::atomic::Ordering::SeqCst)
        || a.running.lost.load(std::sync::atomic::Ordering::SeqCst);
    let ended = match copied {
        Ok(mut s) => {
            with_listed(&mut s, listed);
            let failed: Vec<FileChange> = s
                .failed
                .iter()
                .map(|f| FileChange::failed(f.path.clone(), f.error.clone()))
                .collect();
            if let Err(e) = a.store.settle(&a.job.id, &failed) {
                tracing::warn!("job {}: {e}", a.job.id);
            }
            if let Some(r) = archive.as_mut() {
                r.transfer_summary(&s);
            }
            Ended::Completed(Box::new(s))
        }
        Err(EngineError::Interrupted(_)) if stopped => Ended::Stopped,
        Err(EngineError::Interrupted(_))
            if a.running.stalled.load(std::sync::atomic::Ordering::SeqCst) =>
        {
            Ended::Broke(format!(
                "it moved nothing for {} s (a stalled connection): stopped, to be tried again",
                a.cfg.stall.as_secs()
            ))
        }
        Err(e) => ended_by(&e, e.to_string()),
    };
    if let Some(mut r) = archive {
        let failure = match &ended {
            Ended::Completed(_) => None,
            Ended::Broke(e) | Ended::Refused(e) => Some((e.as_str(), 5)),
            Ended::Stopped => Some(("cancelled", 130)),
        };
        longhaul_engine::report::Reporter::end(&mut r, failure);
    }
    ended
}

/// The copy's report with the entries that failed when listed, which an
/// older pull's far end does not report (its walk's failures stayed
/// there); a newer one reports them under the same paths, counted once.
fn with_listed(s: &mut CopyReport, listed: Vec<Failure>) {
    for f in listed {
        if !s.failed.iter().any(|g| g.path == f.path) {
            s.failed.push(f);
        }
    }
}

/// The attempt's copy: the engine's own, or for a job between two other
/// servers, the copy the job server orders its source to run to its
/// destination (with the destination's capability, within the order
/// capability's scope).
fn transfer(
    a: &Attempt,
    o: &CpOptions,
    reporter: &mut (dyn Reporter + Send),
) -> Result<CopyReport, EngineError> {
    if a.job.kind != JobKind::ThirdParty {
        return cp_with(o, reporter);
    }
    let spec = &a.job.spec;
    let to = spec.dest.credential.as_ref().ok_or_else(|| {
        EngineError::Usage("the job carries no capability of its destination".into())
    })?;
    let order = CopyOrder {
        export: spec.source.export.clone(),
        sources: spec.source.paths.clone(),
        target: spec.dest.host.clone().unwrap_or_default(),
        fingerprint: to.fingerprint.clone(),
        capability: to.capability.clone(),
        dest_export: spec.dest.export.clone(),
        dest: spec.dest.paths[0].clone(),
        dest_dir: spec.dest.dir,
        options: CopyOptions {
            catalogue: true,
            ..copy_options(a.job)
        },
        connect_back: None,
        share: None,
    };
    let source = spec.source.host.as_deref().unwrap_or_default();
    longhaul_engine::xfer::jobcaps::ordered_cp(source, o, order, reporter)
}

/// How an engine error ends an attempt: a refusal (the far end's word on
/// the capability or the request) or a usage error is for good; anything
/// else is worth another attempt.
fn ended_by(e: &EngineError, message: String) -> Ended {
    match e {
        EngineError::Refused { .. } | EngineError::Usage(_) | EngineError::Trust(_) => {
            Ended::Refused(message)
        }
        _ => Ended::Broke(message),
    }
}

/// Writes the files that landed so far to the store, as finished.
pub fn flush_landed(a: &Attempt) {
    flush(a.store, &a.job.id, a.running);
}

/// [`flush_landed`] for the heartbeat, which holds no [`Attempt`].
pub fn flush(store: &dyn JobStore, id: &str, running: &Running) {
    let landed = match running.landed.lock() {
        Ok(mut v) => std::mem::take(&mut *v),
        Err(_) => return,
    };
    if landed.is_empty() {
        return;
    }
    let changes: Vec<FileChange> = landed
        .into_iter()
        .map(|path| FileChange {
            path,
            state: FileState::Finished,
            error: None,
            permanent: false,
        })
        .collect();
    if let Err(e) = store.change_files(id, &changes) {
        tracing::warn!("job {id}: {e}");
    }
}

/// A job's end on this server, as the runner reads it: the export's root
/// joined with each path (beneath it), a trailing `/` kept.
pub fn local_paths(ex: &Export, paths: &[String]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for p in paths {
        let r = beneath(&ex.root, p).map_err(|e| e.to_string())?;
        confine(&ex.root, &r).map_err(|e| e.to_string())?;
        let mut s = r.to_string_lossy().into_owned();
        if p.ends_with('/') && !s.ends_with('/') {
            s.push('/');
        }
        out.push(s);
    }
    Ok(out)
}
