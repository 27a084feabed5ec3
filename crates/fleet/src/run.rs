//! One rank's run: its manifest, its share (fixed, or leased from the
//! queue), the final check of the whole tree by one rank, and the one
//! result of all ranks.
//!
//! Static shares: rank 0 walks the sources and writes the manifest into
//! the run directory (a directory every rank sees: the parallel file
//! system); every rank cuts the same shares from it and moves its own;
//! each writes its result there. Rank 0 then waits for every rank's
//! result, checks the whole tree (a `sync` of the sources: what every
//! rank landed is skipped, anything missing is sent and counted), and
//! reports the aggregate. A rank run again under the same index reads the
//! same manifest, so it moves the same share, resuming where it stopped.
//!
//! The queue: the manifest and the units live in PostgreSQL; each rank
//! leases units until none are left, renewing its leases while it works;
//! one session carries unit after unit ([`crate::feed`]).
//! A rank that dies leaves leases that expire; another rank takes them.
//! The first rank to find the queue empty claims the final check.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use longhaul_engine::report::Reporter;
use longhaul_engine::xfer::client::{cp_with, CopyReport, CpOptions};
use longhaul_engine::xfer::source::Share;
use longhaul_engine::EngineError;
use longhaul_proto::xfer::copy::CopyShareItem;
use longhaul_proto::xfer::{Failure, SyncOptions};
use serde::{Deserialize, Serialize};

use crate::confine::Sources;
use crate::manifest::Manifest;
use crate::ranks::Rank;
use crate::shard;

#[cfg(feature = "queue")]
mod queued;

/// How the ranks share the work.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Fixed shares cut from one manifest in a directory all ranks see.
    Static { run_dir: PathBuf },
    /// Units leased from a PostgreSQL queue.
    Queue {
        url: String,
        /// Names the run in the database; the same id resumes it.
        run_id: String,
        /// About this many bytes a unit (a range of a large file, or a
        /// group of small files).
        unit_bytes: u64,
        unit_files: u32,
        /// A lease not renewed for this long is taken by another rank.
        lease: Duration,
    },
}

/// One rank's part in a fleet transfer.
pub struct Fleet {
    pub rank: Rank,
    pub mode: Mode,
    /// The transfer as the command named it (sources, destination,
    /// streams, security): every rank's sessions are made from it.
    pub cp: CpOptions,
    /// How long a rank waits for the manifest, and the finishing rank for
    /// the others' results, before it gives up (saying on whom it waited).
    pub wait: Duration,
    /// Told of each wait, for the user.
    pub note: Arc<dyn Fn(&str) + Send + Sync>,
    /// The launcher's name for this start of the fleet
    /// ([`crate::ranks::job_from_env`]): static results of another start
    /// are stale.
    pub job: Option<String>,
}

/// What one rank did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RankResult {
    pub rank: u32,
    pub host: String,
    /// The launcher its rank came from.
    pub launcher: String,
    /// The manifest its share was cut from.
    pub manifest: String,
    /// The launcher's start of the fleet it ran in, if named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    pub started_unix_ms: u64,
    pub ended_unix_ms: u64,
    /// Files landed whole or as parts, and bytes carried (resumed bytes not
    /// counted).
    pub files: u64,
    pub bytes: u64,
    pub resumed_bytes: u64,
    pub seconds: f64,
    pub bits_per_second: f64,
    /// Units (queue) or 1 (static) this rank finished.
    pub units: u64,
    /// Transfer sessions it ran (static: one; queue: one fed unit after
    /// unit, and another after each `FeedConfig::span`).
    pub sessions: u64,
    pub failed: Vec<Failure>,
    /// A third-party copy's rank: the bytes its own connections carried
    /// (control only; the data went from server to server).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub control_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The final check of the whole tree, by one rank.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FinalCheck {
    pub rank: u32,
    /// Entries the check compared.
    pub entries: u64,
    /// Files it found missing or different and sent itself.
    pub resent_files: u64,
    pub resent_bytes: u64,
    pub seconds: f64,
    pub failed: Vec<Failure>,
}

/// The one result of all ranks.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FleetSummary {
    /// `static` or `queue`.
    pub mode: String,
    pub ranks: u32,
    pub manifest: String,
    /// The manifest's files and bytes: what the destination now holds.
    pub files: u64,
    pub bytes: u64,
    /// From the first rank's start to the last rank's end.
    pub seconds: f64,
    pub bits_per_second: f64,
    pub per_rank: Vec<RankResult>,
    /// Ranks that ended well after the others (over 1.25x the median
    /// end), slowest first.
    pub stragglers: Vec<u32>,
    /// Ranks that left no result (killed, lost); their work was finished
    /// by others (queue) or the final check.
    pub lost: Vec<u32>,
    pub failed: Vec<Failure>,
    pub final_check: Option<FinalCheck>,
    /// Every entry of the manifest is at the destination, each verified
    /// chunk by chunk, and nothing failed.
    pub verified: bool,
    /// Verified, and nothing had to move: no rank carried a byte and the
    /// final check sent nothing (a run again over a finished tree).
    #[serde(default)]
    pub up_to_date: bool,
}

/// What [`run`] hands back: this rank's result, and the aggregate if this
/// rank made it.
pub struct Outcome {
    pub rank: RankResult,
    pub summary: Option<FleetSummary>,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn failed(what: impl Into<String>) -> EngineError {
    EngineError::Failed(what.into())
}

/// What `--queue` says in a build without the `queue` feature.
pub const NO_QUEUE: &str = "--queue: this longhaul was built without the PostgreSQL work queue (it needs the Cargo feature `queue`, in the default build); use --run-dir (static shares), or a build with the feature";

/// Runs this rank's part of the transfer.
pub fn run(f: &Fleet, reporter: &mut (dyn Reporter + Send)) -> Result<Outcome, EngineError> {
    match &f.mode {
        Mode::Static { run_dir } => run_static(f, run_dir, reporter),
        #[cfg(feature = "queue")]
        Mode::Queue { .. } => queued::run_queue(f, reporter),
        #[cfg(not(feature = "queue"))]
        Mode::Queue { .. } => Err(EngineError::Usage(NO_QUEUE.into())),
    }
}

/// Whether the ranks order third-party copies: remote sources (on one
/// server) pushed to a remote destination, the data never through them.
pub fn third_party(f: &Fleet) -> bool {
    longhaul_engine::reach::is_third_party(&f.cp.sources, &f.cp.dest)
}

/// The sources as the command named them (as a manifest records them).
pub(crate) fn named(f: &Fleet) -> Vec<String> {
    f.cp.sources.iter().map(|s| s.arg().to_string()).collect()
}

/// The sources, confined by name (remote ones: by their server too).
fn sources(f: &Fleet) -> Result<Sources, EngineError> {
    if third_party(f) {
        Sources::remote(&f.cp.sources).map_err(EngineError::Usage)
    } else {
        Ok(Sources::new(&named(f)))
    }
}

/// Walks the sources as the run's manifest (remote ones: listed by their
/// server).
fn walk(f: &Fleet) -> Result<Manifest, EngineError> {
    if third_party(f) {
        return Manifest::remote(&f.cp.sources, f.cp.recursive, f.cp.chunk_size, &f.cp.client)
            .map_err(|e| EngineError::Usage(format!("cannot make the fleet's manifest: {e}")));
    }
    Manifest::walk(&named(f), f.cp.recursive, f.cp.chunk_size).map_err(|failures| {
        let first: Vec<String> = failures
            .iter()
            .take(3)
            .map(|x| format!("{}: {}", x.path, x.error))
            .collect();
        EngineError::Usage(format!(
            "cannot make the fleet's manifest: {} entries could not be read ({}); fix them or leave them out",
            failures.len(),
            first.join("; ")
        ))
    })
}

/// Writes `bytes` to `path` whole or not at all (a temporary name, then a
/// rename), durable. The temporary file is made anew, never through a
/// link someone left at its name, and is this user's alone (0600).
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let base = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut attempt = 0u32;
    let (tmp, mut file) = loop {
        let mut tmp = base.clone().into_os_string();
        if attempt > 0 {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            tmp.push(format!(".{attempt}.{nanos}"));
        }
        let tmp = PathBuf::from(tmp);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Reads a file of the run directory: a regular file of this user's,
/// never through a link.
fn read_private(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() || m.uid() != euid() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "not a regular file of this user's",
        ));
    }
    let mut out = Vec::new();
    f.read_to_end(&mut out)?;
    Ok(out)
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Refuses a run directory that anyone but this user can write: whoever
/// can could plant the manifest, links at the names the ranks write, or
/// the ranks' results.
fn private_dir(run_dir: &Path) -> Result<(), EngineError> {
    longhaul_engine::state::private_dir(run_dir).map_err(|why| {
        EngineError::Usage(format!(
            "refusing the run directory {}: {why}; give a --run-dir that is this user's alone",
            run_dir.display()
        ))
    })
}

fn manifest_file(run_dir: &Path) -> PathBuf {
    run_dir.join("manifest.jsonl")
}

fn result_file(run_dir: &Path, rank: u32) -> PathBuf {
    run_dir.join(format!("rank-{rank:05}.json"))
}

/// The results an earlier start of the fleet already counted: rank 0
/// writes, after each aggregate, each result it took as (rank, started,
/// ended). Without a launcher naming the start (`job`), a result left by
/// the last start is otherwise the same as this one's: run again, rank 0
/// could take a rank's last result for its new one when that rank had
/// not written it yet (a whole share "resent" on a run that moved
/// nothing).
fn taken_file(run_dir: &Path) -> PathBuf {
    run_dir.join("taken.json")
}

type Taken = std::collections::BTreeSet<(u32, u64, u64)>;

fn taken_key(r: &RankResult) -> (u32, u64, u64) {
    (r.rank, r.started_unix_ms, r.ended_unix_ms)
}

/// What [`taken_file`] holds; nothing when there is none (a first start,
/// or one whose rank 0 never aggregated: its results are then this
/// start's to take).
fn read_taken(run_dir: &Path) -> Taken {
    read_private(&taken_file(run_dir))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn write_taken(run_dir: &Path, ranks: &[RankResult]) -> Result<(), EngineError> {
    let taken: Taken = ranks.iter().map(taken_key).collect();
    let path = taken_file(run_dir);
    write_atomic(
        &path,
        &serde_json::to_vec(&taken).expect("a set of numbers serializes"),
    )
    .map_err(|e| EngineError::io(format!("failed to write {}", path.display()), e))
}

/// The run directory's manifest: rank 0 writes it once (a rank 0 run
/// again keeps it); the others wait for it. Whoever wrote it, a rank
/// reads only what resolves beneath its own sources.
fn static_manifest(f: &Fleet, run_dir: &Path) -> Result<Manifest, EngineError> {
    let path = manifest_file(run_dir);
    if f.rank.rank == 0 && !path.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(run_dir)
            .map_err(|e| {
                EngineError::Usage(format!(
                    "cannot make the run directory {}: {e}",
                    run_dir.display()
                ))
            })?;
        private_dir(run_dir)?;
        let m = walk(f)?;
        write_atomic(&path, &m.encode()).map_err(|e| {
            EngineError::io(
                format!("failed to write the manifest {}", path.display()),
                e,
            )
        })?;
        return Ok(m);
    }
    let started = Instant::now();
    let mut said = false;
    while !path.exists() {
        if run_dir.exists() {
            private_dir(run_dir)?;
        }
        if started.elapsed() > f.wait {
            return Err(failed(format!(
                "no manifest at {} after {} s: is rank 0 running, with the same --run-dir?",
                path.display(),
                f.wait.as_secs()
            )));
        }
        if !said {
            (f.note)(&format!(
                "waiting for rank 0 to write the manifest {}",
                path.display()
            ));
            said = true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    private_dir(run_dir)?;
    let m = read_private(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
        .and_then(|b| Manifest::decode(&b).map_err(|e| format!("{}: {e}", path.display())))
        .map_err(failed)?;
    if m.sources != named(f) {
        return Err(EngineError::Usage(format!(
            "the manifest in {} is of other sources ({}): give each transfer its own --run-dir",
            run_dir.display(),
            m.sources.join(" ")
        )));
    }
    sources(f)?.check(&m).map_err(|e| failed(e.to_string()))?;
    Ok(m)
}

/// A session moving `share`, from the command's transfer.
fn session(
    f: &Fleet,
    share: Share,
    reporter: &mut (dyn Reporter + Send),
) -> Result<CopyReport, EngineError> {
    let mut o = f.cp.clone();
    o.share = Some(share);
    // Every rank lands into the same tree: the destination directory is
    // made by whichever rank gets there first.
    o.mkpath = true;
    cp_with(&o, reporter)
}

/// A third-party copy of `share` (all of the sources: `None`), ordered of
/// the source server, both ends reached with the command's client.
fn third_party_session(
    f: &Fleet,
    share: Option<Vec<CopyShareItem>>,
    reporter: &mut (dyn Reporter + Send),
) -> Result<CopyReport, EngineError> {
    let mut o = f.cp.clone();
    o.share = None;
    o.mkpath = true;
    if share.is_none() {
        o.sync = Some(SyncOptions {
            checksum: false,
            delete: false,
        });
        o.progress = Default::default();
    }
    let client = o.client.clone();
    longhaul_engine::xfer::copy::third_party_share(&o, &client, &client, share, reporter)
}

/// Bytes of a share's items an order carries at most: well within a
/// control frame (`MAX_FRAME_BODY`), with the rest of the order.
const ORDER_SHARE_BYTES: usize = 512 << 10;

/// A share cut into orders of at most [`ORDER_SHARE_BYTES`] of items.
fn batches(items: Vec<CopyShareItem>) -> Vec<Vec<CopyShareItem>> {
    let mut out: Vec<Vec<CopyShareItem>> = Vec::new();
    let mut size = 0;
    for item in items {
        // Its JSON: the path escaped (at most 6 bytes a byte), the rest.
        let n = item.rel.len() * 6 + 96;
        if out.is_empty() || size + n > ORDER_SHARE_BYTES {
            out.push(Vec::new());
            size = 0;
        }
        size += n;
        out.last_mut().expect("pushed").push(item);
    }
    out
}

fn add(r: &mut RankResult, s: &CopyReport) {
    r.control_bytes += s.third_party.as_ref().map_or(0, |t| t.control_bytes);
    r.files += s.files;
    r.bytes += s.bytes;
    r.resumed_bytes += s.resumed_bytes;
    r.sessions += 1;
    r.failed.extend(s.failed.iter().cloned());
}

fn finish_rank(r: &mut RankResult, started: Instant) {
    r.ended_unix_ms = unix_ms(SystemTime::now());
    r.seconds = started.elapsed().as_secs_f64();
    r.bits_per_second = if r.seconds > 0.0 {
        r.bytes as f64 * 8.0 / r.seconds
    } else {
        0.0
    };
}

fn new_rank(f: &Fleet, manifest: &Manifest) -> RankResult {
    RankResult {
        rank: f.rank.rank,
        host: longhaul_engine::net::sock::hostname(),
        launcher: f.rank.launcher.to_string(),
        manifest: manifest.hash(),
        job: f.job.clone(),
        started_unix_ms: unix_ms(SystemTime::now()),
        ..RankResult::default()
    }
}

fn run_static(
    f: &Fleet,
    run_dir: &Path,
    reporter: &mut (dyn Reporter + Send),
) -> Result<Outcome, EngineError> {
    let manifest = static_manifest(f, run_dir)?;
    let started = Instant::now();
    let mut me = new_rank(f, &manifest);
    let shares = shard::static_shares(&manifest.items(), f.rank.size);
    let mine = manifest.share(&shares[f.rank.rank as usize]);
    if third_party(f) {
        let items = sources(f)?
            .remote_share(&mine)
            .map_err(|e| failed(e.to_string()))?;
        // An order is one frame: a large share goes as several, one
        // after another, each with its own capability.
        for batch in batches(items) {
            let s = third_party_session(f, Some(batch), reporter)?;
            add(&mut me, &s);
        }
    } else {
        Sources::new(&named(f))
            .confine(&mine)
            .map_err(|e| failed(e.to_string()))?;
        let s = session(f, Share::Fixed(Arc::new(mine)), reporter)?;
        add(&mut me, &s);
    }
    me.units = 1;
    finish_rank(&mut me, started);
    let json = serde_json::to_vec_pretty(&me).expect("a rank result serializes");
    let path = result_file(run_dir, f.rank.rank);
    write_atomic(&path, &json)
        .map_err(|e| EngineError::io(format!("failed to write {}", path.display()), e))?;
    if f.rank.rank != 0 {
        return Ok(Outcome {
            rank: me,
            summary: None,
        });
    }
    let hash = manifest.hash();
    let taken = read_taken(run_dir);
    let mut told = std::collections::HashSet::new();
    let ranks = wait_for_results(f, &manifest, |missing| {
        let mut found = Vec::new();
        for r in 0..f.rank.size {
            let file = result_file(run_dir, r);
            let x = match read_private(&file).map(|b| serde_json::from_slice::<RankResult>(&b)) {
                Ok(Ok(x)) => x,
                Ok(Err(_)) | Err(_) => {
                    missing.push(r);
                    continue;
                }
            };
            // Of this manifest, and of this start of the fleet when the
            // launcher names it (a job run again is all again).
            if x.manifest != hash
                || (f.job.is_some() && x.job != f.job)
                || taken.contains(&taken_key(&x))
            {
                missing.push(r);
                continue;
            }
            let plan = Plan::of(&shares[r as usize]);
            match unplanned(&x, r, &plan) {
                None => found.push(x),
                Some(why) => {
                    if told.insert(r) {
                        (f.note)(&format!(
                            "ignoring {}: not a result of this run's plan ({why})",
                            file.display()
                        ));
                    }
                    missing.push(r);
                }
            }
        }
        Ok(found)
    })?;
    let check = final_check(f, &manifest, reporter)?;
    write_taken(run_dir, &ranks)?;
    let summary = aggregate("static", f.rank.size, &manifest, ranks, check);
    Ok(Outcome {
        rank: me,
        summary: Some(summary),
    })
}

/// What the plan gave one rank (static) or all of them (the queue): the
/// most a true result of it can claim.
struct Plan {
    entries: u64,
    bytes: u64,
    units: u64,
}

impl Plan {
    fn of(units: &[shard::Unit]) -> Plan {
        Plan {
            entries: units.iter().map(|u| u64::from(u.end - u.first)).sum(),
            bytes: units.iter().map(|u| u.bytes).sum(),
            units: 1,
        }
    }
}

/// Why a rank's result is not one a rank `rank` of the plan could have
/// made, if it is not. (A file that changed while it was read is sent
/// again, so a true rank may carry up to twice its bytes.)
fn unplanned(r: &RankResult, rank: u32, plan: &Plan) -> Option<String> {
    let odd = |x: f64| !x.is_finite() || x < 0.0;
    if r.rank != rank {
        Some(format!("it says it is rank {}", r.rank))
    } else if r.host.is_empty() || r.host.len() > 255 || r.host.chars().any(char::is_control) {
        Some("its host name is not one".into())
    } else if r.files > plan.entries {
        Some(format!(
            "{} files, of a share of {} entries",
            r.files, plan.entries
        ))
    } else if r.bytes.saturating_add(r.resumed_bytes) > plan.bytes.saturating_mul(2) {
        Some(format!(
            "{} bytes, of a share of {}",
            r.bytes.saturating_add(r.resumed_bytes),
            plan.bytes
        ))
    } else if r.units > plan.units {
        Some(format!("{} units, of {}", r.units, plan.units))
    } else if r.ended_unix_ms < r.started_unix_ms || odd(r.seconds) || odd(r.bits_per_second) {
        Some("its times do not add up".into())
    } else {
        None
    }
}

/// Polls `found` until every rank's result is in or the wait is over
/// (then the rest are lost).
fn wait_for_results(
    f: &Fleet,
    manifest: &Manifest,
    mut found: impl FnMut(&mut Vec<u32>) -> Result<Vec<RankResult>, EngineError>,
) -> Result<Vec<RankResult>, EngineError> {
    let _ = manifest;
    let started = Instant::now();
    let mut last_said = None::<Vec<u32>>;
    loop {
        let mut missing = Vec::new();
        let got = found(&mut missing)?;
        if missing.is_empty() || started.elapsed() > f.wait {
            return Ok(got);
        }
        if last_said.as_ref() != Some(&missing) {
            (f.note)(&format!(
                "waiting for the results of rank{} {}",
                if missing.len() == 1 { "" } else { "s" },
                missing
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            last_said = Some(missing);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The whole tree checked by one rank: a `sync` of the sources, which
/// skips what landed (same size and mtime) and sends what is missing.
fn final_check(
    f: &Fleet,
    manifest: &Manifest,
    reporter: &mut (dyn Reporter + Send),
) -> Result<FinalCheck, EngineError> {
    let started = Instant::now();
    let s = if third_party(f) {
        third_party_session(f, None, reporter)?
    } else {
        let mut o = f.cp.clone();
        o.share = None;
        o.mkpath = true;
        o.sync = Some(SyncOptions {
            checksum: false,
            delete: false,
        });
        o.progress = Default::default();
        cp_with(&o, reporter)?
    };
    Ok(FinalCheck {
        rank: f.rank.rank,
        entries: manifest.entries.len() as u64,
        resent_files: s.files,
        resent_bytes: s.bytes,
        seconds: started.elapsed().as_secs_f64(),
        failed: s.failed,
    })
}

/// The aggregate of every rank's result.
fn aggregate(
    mode: &str,
    size: u32,
    manifest: &Manifest,
    mut ranks: Vec<RankResult>,
    check: FinalCheck,
) -> FleetSummary {
    ranks.sort_by_key(|r| r.rank);
    let lost: Vec<u32> = (0..size)
        .filter(|r| !ranks.iter().any(|x| x.rank == *r))
        .collect();
    let first = ranks.iter().map(|r| r.started_unix_ms).min().unwrap_or(0);
    let last = ranks.iter().map(|r| r.ended_unix_ms).max().unwrap_or(first);
    let seconds = last.saturating_sub(first) as f64 / 1000.0;
    let carried: u64 = ranks.iter().map(|r| r.bytes).sum();
    let mut ends: Vec<u64> = ranks.iter().map(|r| r.ended_unix_ms - first).collect();
    ends.sort_unstable();
    let median = ends.get(ends.len() / 2).copied().unwrap_or(0);
    let mut stragglers: Vec<&RankResult> = ranks
        .iter()
        .filter(|r| median > 0 && (r.ended_unix_ms - first) as f64 > 1.25 * median as f64)
        .collect();
    stragglers.sort_by_key(|r| std::cmp::Reverse(r.ended_unix_ms));
    let mut failures: Vec<Failure> = Vec::new();
    // A rank's failure that the final check repaired is not one.
    let repaired = check.failed.is_empty();
    if !repaired {
        failures.extend(check.failed.iter().cloned());
    }
    let verified = failures.is_empty();
    let up_to_date = verified && carried == 0 && check.resent_files == 0 && check.resent_bytes == 0;
    FleetSummary {
        mode: mode.into(),
        ranks: size,
        manifest: manifest.hash(),
        files: manifest.files(),
        bytes: manifest.bytes(),
        seconds,
        bits_per_second: if seconds > 0.0 {
            carried as f64 * 8.0 / seconds
        } else {
            0.0
        },
        stragglers: stragglers.iter().map(|r| r.rank).collect(),
        per_rank: ranks,
        lost,
        failed: failures,
        final_check: Some(check),
        verified,
        up_to_date,
    }
}
