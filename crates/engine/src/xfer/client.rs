//! `longhaul cp` and `longhaul ls` on the client: work out which way the
//! data goes, ask the server, open the data streams, run the local side,
//! and retry a lost connection (the sink's journal makes a retry resume).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::msg::{Direction, Message};
use longhaul_proto::xfer::*;

use super::beneath::Anchor;
use super::sink::{run_sink, SinkConfig};
use super::source::{run_source, SourceConfig};
use super::storage::{Direct, Local, Storage};
use super::Landed;
use crate::net::dial::{open_control, open_control_early, present, ClientOptions, Control, Dialer};
use crate::report::{Discard, Reporter, PROGRESS_TICK};
use crate::EngineError;

/// What `cp` was asked to do.
#[derive(Clone)]
pub struct CpOptions {
    pub sources: Vec<String>,
    pub dest: String,
    pub recursive: bool,
    pub preserve: bool,
    /// Data streams; None sizes them for the path (see [`longhaul_proto::window`]).
    pub streams: Option<u16>,
    /// The path's rate, bits/s, if known: streams are sized for it and
    /// each is paced to its share.
    pub rate: Option<u64>,
    /// Congestion control of the sending side; None: BBR where the sender
    /// has it, else its default.
    pub congestion: Option<String>,
    pub chunk_size: Option<u64>,
    pub force: bool,
    /// With `preserve`: keep setuid, setgid and sticky bits and
    /// world-writable directories (stripped otherwise).
    pub keep_special_modes: bool,
    /// Create missing directories of the destination (rsync's `--mkpath`);
    /// without it a destination whose directory does not exist is refused.
    pub mkpath: bool,
    /// Connection attempts after the first, with backoff, before giving up.
    pub retries: u32,
    pub sync_files: bool,
    /// O_DIRECT for file data on both ends, bypassing the page cache.
    pub direct: bool,
    /// Re-read every file at the destination after writing and compare.
    pub verify: bool,
    /// `sync`: what to compare and whether to delete extraneous files.
    pub sync: Option<SyncOptions>,
    pub dry_run: bool,
    /// Tune the streams carrying chunks online (unless `streams` is set),
    /// and the files in flight (unless `files_in_flight` is set).
    pub tune: bool,
    /// Files announced and not yet finished, at most; None sizes the count
    /// for the path and grows it online.
    pub files_in_flight: Option<u64>,
    /// Where `doctor` remembers path rates ([`crate::pathdb`]): without
    /// `rate` or `streams`, a fresh record for this server sizes the
    /// streams. None: not consulted.
    pub path_memory: Option<PathBuf>,
    pub client: ClientOptions,
    /// Write `DIGEST  PATH` per verified file here.
    pub digests_to: Option<PathBuf>,
    /// Tell each file that landed here, named in full (the archive's
    /// file catalogue).
    pub catalogue: Option<super::Catalogue>,
    /// The transfer's counters (and its interrupt flag); [`cp_with`]
    /// samples them for its reporter.
    pub progress: Arc<super::Progress>,
    /// One fleet rank's share of `sources` (push only): these entries
    /// instead of a walk, some of them parts of files.
    pub share: Option<super::source::Share>,
    /// A push whose sources are beneath this directory (a server's
    /// export, in a third-party copy): everything read resolves beneath it.
    pub source_anchor: Option<Arc<Anchor>>,
}

/// The outcome of a `cp`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CpSummary {
    pub files: u64,
    pub bytes: u64,
    /// Symbolic links created as links (never followed).
    pub links: u64,
    /// Files that changed while they were read and were sent again (each
    /// is verified against what was read the last time).
    pub resent_changed: u64,
    pub seconds: f64,
    /// The bytes this run sent: `bytes` less `resumed_bytes`.
    pub sent_bytes: u64,
    /// `sent_bytes` over `seconds`: what this run moved over the network.
    pub bits_per_second: f64,
    /// True only if every file was verified at the destination.
    pub verified: bool,
    pub failed: Vec<Failure>,
    pub skipped: u64,
    pub resumed_bytes: u64,
    pub streams: u16,
    /// `TLS1.3 <cipher suite>`, or `none` (plaintext).
    pub encryption: String,
    /// Rates of each stage on its own: what it did over the time it was busy.
    pub source_read_bps: f64,
    pub network_bps: f64,
    pub dest_write_bps: f64,
    /// Where each end's CPU went, by stage (an end that did not say, an
    /// older server, is absent).
    #[serde(skip_serializing_if = "CpuStages::is_empty")]
    pub cpu_stages: CpuStages,
    pub attempts: u32,
    /// How the streams were sized for the path.
    pub path: Option<PathTuning>,
    /// What the source's tuner chose (streams, chunk size, files in flight).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tuning: Option<longhaul_proto::tune::TuningReport>,
    /// The sender's intervals, each with what limited it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub intervals: Vec<longhaul_proto::tune::TransferInterval>,
    /// What limited the transfer: the limit of most of its intervals
    /// (`rate_cap` when `--rate` held it, as asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<longhaul_proto::tune::TransferLimit>,
    /// Conditions that bound the transfer, with the fix (window caps).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// A third-party copy: what the ordering client's own connections
    /// carried ([`super::copy`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub third_party: Option<super::copy::ThirdPartyUse>,
    /// `sync --delete`: destination paths removed (or, with --dry-run, that would be).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deleted: Vec<String>,
    /// `--dry-run`: the files that would be sent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_send: Vec<String>,
    /// `--dry-run`: the bytes of the files that would be sent.
    #[serde(skip_serializing_if = "is_zero")]
    pub would_send_bytes: u64,
    /// `--dry-run`: nothing was sent, written or deleted; `files`, `bytes`
    /// and `verified` say nothing was moved.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// With several paths (`--bind`, `--via`): each path's streams and the
    /// bytes that crossed it (TCP payload, TLS records included).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathUse>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One path of a transfer's data streams.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PathUse {
    /// This host's address and the server's.
    pub local: String,
    pub remote: String,
    pub streams: u16,
    pub bytes: u64,
}

/// The data streams' sockets, kept (duplicated) to read at the end what
/// crossed each path.
struct PathTaps(Vec<(String, String, std::net::TcpStream)>);

impl PathTaps {
    fn of(streams: &[Box<dyn crate::net::conn::Stream>], o: &CpOptions) -> PathTaps {
        if !o.client.paths.several() {
            return PathTaps(Vec::new());
        }
        PathTaps(
            streams
                .iter()
                .filter_map(|s| {
                    let t = s.tcp();
                    let local = t.local_addr().ok()?.ip().to_string();
                    let remote = t.peer_addr().ok()?.to_string();
                    Some((local, remote, t.try_clone().ok()?))
                })
                .collect(),
        )
    }

    /// Bytes each path carried: sent (a push) or received (a pull).
    fn count(&self, sent: bool) -> Vec<PathUse> {
        let mut out: Vec<PathUse> = Vec::new();
        for (local, remote, tcp) in &self.0 {
            let (acked, received) =
                crate::net::sock::tcp_bytes(crate::net::sock::fd_of(tcp)).unwrap_or_default();
            let bytes = if sent { acked } else { received };
            match out
                .iter_mut()
                .find(|p| &p.local == local && &p.remote == remote)
            {
                Some(p) => {
                    p.streams += 1;
                    p.bytes += bytes;
                }
                None => out.push(PathUse {
                    local: local.clone(),
                    remote: remote.clone(),
                    streams: 1,
                    bytes,
                }),
            }
        }
        out
    }
}

/// The path as measured and the settings chosen for it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PathTuning {
    #[serde(flatten)]
    pub window: longhaul_proto::window::WindowPlan,
    /// The sending side's congestion control (on a pull, as requested).
    pub congestion: String,
    /// Each stream's pacing cap, bytes/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pacing: Option<u64>,
    /// The doctor's measurement of this path the streams were sized for
    /// (with [`crate::pathdb::HEADROOM`]), when there was one and no `--rate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remembered: Option<crate::pathdb::PathRecord>,
}

enum Plan {
    Push {
        host: String,
        export: String,
        dest: String,
        /// Named with a trailing `/`.
        dest_dir: bool,
        roots: Vec<PathBuf>,
    },
    Pull {
        host: String,
        export: String,
        sources: Vec<String>,
        dest: PathBuf,
    },
}

fn plan(o: &CpOptions) -> Result<Plan, EngineError> {
    let slashed = o.sources.iter().filter(|s| s.ends_with('/')).count();
    if slashed > 0 && slashed < o.sources.len() {
        return Err(EngineError::Usage(
            "name every source with a trailing '/' (copy their contents) or none (copy them by name), not a mix".into(),
        ));
    }
    let dest_remote = parse_remote(&o.dest);
    let remotes: Vec<Option<Remote>> = o.sources.iter().map(|s| parse_remote(s)).collect();
    match dest_remote {
        Some(d) => {
            if remotes.iter().any(Option::is_some) {
                return Err(EngineError::Usage(
                    "remote-to-remote copies are not supported yet: copy to a local directory first".into(),
                ));
            }
            Ok(Plan::Push {
                host: d.host,
                export: d.export,
                dest: d.path,
                dest_dir: d.dir,
                roots: o.sources.iter().map(PathBuf::from).collect(),
            })
        }
        None if o.share.is_some() => Err(EngineError::Usage(
            "a fleet pushes: name a local source and a remote destination (HOST:EXPORT/path)"
                .into(),
        )),
        None => {
            let rs: Vec<Remote> = remotes.into_iter().flatten().collect();
            if rs.len() != o.sources.len() {
                return Err(EngineError::Usage(
                    "neither side is remote: name the remote as HOST:EXPORT/path or longhaul://HOST/EXPORT/path".into(),
                ));
            }
            let (host, export) = (rs[0].host.clone(), rs[0].export.clone());
            if rs.iter().any(|r| r.host != host || r.export != export) {
                return Err(EngineError::Usage(
                    "all remote sources must be on one server and export".into(),
                ));
            }
            Ok(Plan::Pull {
                host,
                export,
                sources: rs.into_iter().map(|r| r.path).collect(),
                dest: PathBuf::from(&o.dest),
            })
        }
    }
}

impl CpOptions {
    /// A recursive copy of `sources` to `dest` with every other setting at
    /// `cp`'s defaults (streams sized for the path, tuned online, files
    /// synced, no retries).
    pub fn new(sources: Vec<String>, dest: String, client: ClientOptions) -> CpOptions {
        CpOptions {
            sources,
            dest,
            recursive: true,
            preserve: false,
            streams: None,
            rate: None,
            congestion: None,
            chunk_size: None,
            force: false,
            mkpath: false,
            keep_special_modes: false,
            retries: 0,
            sync_files: true,
            direct: false,
            verify: false,
            sync: None,
            dry_run: false,
            tune: true,
            files_in_flight: None,
            path_memory: None,
            digests_to: None,
            catalogue: None,
            progress: Default::default(),
            share: None,
            source_anchor: None,
            client,
        }
    }

    /// `SRC/`: sources named with a trailing slash stand for their
    /// contents, as in rsync (see [`landing`]).
    fn contents(&self) -> bool {
        self.sources.iter().all(|s| s.ends_with('/'))
    }
}

/// Worth another attempt: the network or the peer went away.
fn retryable(e: &EngineError) -> bool {
    matches!(
        e,
        EngineError::Connect(_)
            | EngineError::Closed(_)
            | EngineError::Io { .. }
            | EngineError::Timeout(_)
    ) || matches!(e, EngineError::Failed(m) if m.contains("data stream failed") || m.contains("closed"))
}

/// Copies, retrying lost connections; each retry resumes. Reports nothing
/// on the way (see [`cp_with`]).
pub fn cp(o: &CpOptions) -> Result<CpSummary, EngineError> {
    cp_with(o, &mut Discard)
}

/// [`cp`], telling `reporter` how it goes: the counters of
/// [`CpOptions::progress`] every [`PROGRESS_TICK`] and once at the end,
/// and each of the sender's intervals as it arrives. The outcome is the
/// caller's to report (it may add to it).
pub fn cp_with(
    o: &CpOptions,
    reporter: &mut (dyn Reporter + Send),
) -> Result<CpSummary, EngineError> {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let ticker = scope.spawn(move || report_progress(&o.progress, &stopped, reporter));
        let r = {
            // Dropped when the transfer ends, however it ends (a panic
            // too): that ends the ticker, which the scope waits for.
            let _stop = stop;
            cp_retrying(o)
        };
        // A reporter that panicked loses its display, not the transfer.
        let _ = ticker.join();
        r
    })
}

/// Samples `p` for `reporter` every [`PROGRESS_TICK`] until `stopped`
/// closes, then once more.
fn report_progress(
    p: &super::Progress,
    stopped: &std::sync::mpsc::Receiver<()>,
    reporter: &mut dyn Reporter,
) {
    use std::sync::mpsc::RecvTimeoutError;
    // Intervals reported so far, counting those trimmed from the front.
    let mut shown: u64 = 0;
    loop {
        let last = !matches!(
            stopped.recv_timeout(PROGRESS_TICK),
            Err(RecvTimeoutError::Timeout)
        );
        let new: Vec<_> = p
            .intervals
            .lock()
            .map(|v| {
                let dropped = p.intervals_dropped.load(Ordering::Relaxed);
                let from = usize::try_from(shown.saturating_sub(dropped)).unwrap_or(usize::MAX);
                v[from.min(v.len())..].to_vec()
            })
            .unwrap_or_default();
        shown = shown.max(p.intervals_dropped.load(Ordering::Relaxed)) + new.len() as u64;
        for i in &new {
            reporter.transfer_interval(i);
        }
        reporter.transfer_progress(&p.snapshot());
        if last {
            return;
        }
    }
}

fn cp_retrying(o: &CpOptions) -> Result<CpSummary, EngineError> {
    let plan = plan(o)?;
    // Opened once: digests of files finished before a retry stay in it.
    let digest_out: Option<super::DigestOut> = match &o.digests_to {
        Some(p) => Some(super::DigestFile::create(p)?),
        None => None,
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        match cp_once(o, &plan, &digest_out, true) {
            Ok(mut s) => {
                s.attempts = attempt;
                // An incomplete list is output lost: a failed entry, exit 6.
                if let Some(Err(f)) = digest_out.as_ref().map(|d| d.finish()) {
                    s.failed.push(f);
                }
                return Ok(s);
            }
            Err(e)
                if retryable(&e)
                    && attempt <= o.retries
                    && !o.client.interrupt.load(Ordering::Relaxed) =>
            {
                let wait = Duration::from_secs(1 << (attempt - 1).min(5));
                tracing::warn!(
                    "attempt {attempt} failed: {e}; retrying in {} s",
                    wait.as_secs()
                );
                std::thread::sleep(wait);
            }
            Err(e) => return Err(e),
        }
    }
}

fn open_streams(
    ctl: &Control,
    token: &str,
    which: &[(Direction, u16)],
    tuning: &StreamTuning,
    o: &ClientOptions,
) -> Result<Vec<Box<dyn crate::net::conn::Stream>>, EngineError> {
    // Set before connecting, so the window scale covers the buffer.
    let sending = which.first().is_some_and(|w| w.0 == Direction::Up);
    ctl.open_data_streams(token, which, o, |s, _| {
        s.set_tcp_nodelay(false)?;
        crate::net::sock::tune_data_stream(s.as_fd(), tuning, sending).map(|_| ())
    })
}

/// Data streams dialed while the control handshake goes on: connected (TCP,
/// TLS) but not yet presented.
type EarlyStreams =
    Vec<std::thread::JoinHandle<Result<Box<dyn crate::net::conn::Stream>, EngineError>>>;

/// Dials the streams a first plan wants (the RTT of the control
/// connection's TCP handshake, the server's caps taken to be this host's),
/// so that their TCP and TLS handshakes overlap the control handshake: two
/// round trips less before the first byte. This side's socket settings
/// depend only on this host's caps, so they are final; the count may not
/// be, and [`attach_streams`] adds or drops streams.
fn dial_early(o: &CpOptions, push: bool, host: &str, dialer: &Dialer, rtt_us: u32) -> EarlyStreams {
    use longhaul_proto::window::{plan, PathInput};
    let local = crate::net::sock::buffer_caps();
    let guess = plan(&PathInput {
        rtt_us,
        target_bps: target_rate(o, host, push, rtt_us).0,
        sender: local,
        receiver: local,
        streams: o.streams,
    });
    let tuning = StreamTuning {
        congestion: congestion_for(o, push).ok().flatten(),
        send_buffer: guess.send_buffer.to_set(),
        receive_buffer: guess.receive_buffer.to_set(),
        pacing: None,
        online: false,
        intervals: true,
        ..StreamTuning::default()
    };
    (0..guess.streams)
        .map(|k| {
            let (d, t, opts) = (dialer.clone(), tuning.clone(), o.client.clone());
            std::thread::spawn(move || {
                d.dial_nth(usize::from(k), &opts, |s| {
                    s.set_tcp_nodelay(false)?;
                    crate::net::sock::tune_data_stream(s.as_fd(), &t, push).map(|_| ())
                })
            })
        })
        .collect()
}

/// The data streams of the transfer `accept` took: the early ones that
/// connected, presented as streams 0, 1, ...; more dialed if the final plan
/// wants more, the rest closed; each paced if the plan says so, and in
/// sealed frames if the server agreed.
fn attach_streams(
    ctl: &Control,
    early: EarlyStreams,
    accept: &TransferAccept,
    n: u16,
    direction: Direction,
    tuning: &StreamTuning,
    o: &ClientOptions,
) -> Result<Vec<Box<dyn crate::net::conn::Stream>>, EngineError> {
    let (token, sealed) = (accept.token.as_str(), accept.sealed);
    let mut data: Vec<Box<dyn crate::net::conn::Stream>> = early
        .into_iter()
        .filter_map(|h| h.join().ok()?.ok())
        .take(usize::from(n))
        .collect();
    for (i, s) in data.iter_mut().enumerate() {
        present(s, ctl.welcome.version, token, i as u16, direction)?;
        // Sized for the final plan (both hosts' caps, the streams chosen),
        // which the early guess could not know.
        let sending = direction == Direction::Up;
        if let Err(e) =
            crate::net::sock::tune_data_stream(crate::net::sock::fd_of(s.tcp()), tuning, sending)
        {
            tracing::warn!("failed to size an early data stream: {e}");
        }
    }
    let which: Vec<(Direction, u16)> = (data.len() as u16..n).map(|i| (direction, i)).collect();
    if !which.is_empty() {
        data.extend(open_streams(ctl, token, &which, tuning, o)?);
    }
    if direction == Direction::Up {
        for s in &data {
            let fd = crate::net::sock::fd_of(s.tcp());
            if let Some(rate) = tuning.pacing {
                crate::net::sock::set_pacing(fd, rate)
                    .map_err(|e| EngineError::io("failed to pace a data stream".into(), e))?;
            }
            if let Err(e) = crate::net::sock::limit_unsent(fd) {
                tracing::warn!("{e}");
            }
        }
    }
    if !sealed {
        return Ok(data);
    }
    data.into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.sealed(crate::net::sealed::Side::Client).map_err(|e| {
                EngineError::io(
                    format!("failed to start sealed frames on data stream {i}"),
                    e,
                )
            })
        })
        .collect()
}

/// The rate to size the streams for: `--rate`; else, unless `-P` fixed
/// them, what the doctor measured of this path if that still applies
/// (with headroom); else None (the default target).
fn target_rate(
    o: &CpOptions,
    host: &str,
    push: bool,
    rtt_us: u32,
) -> (Option<u64>, Option<crate::pathdb::PathRecord>) {
    if o.rate.is_some() || o.streams.is_some() {
        return (o.rate, None);
    }
    let direction = if push { Direction::Up } else { Direction::Down };
    let rec = o.path_memory.as_deref().and_then(|f| {
        crate::pathdb::recall(
            f,
            &crate::net::dial::host_key(host),
            direction,
            crate::pathdb::now(),
            rtt_us,
        )
    });
    (rec.as_ref().map(crate::pathdb::PathRecord::target_bps), rec)
}

/// The sending side's congestion control: `--cc`, else BBR where the
/// sender has it (asked of the server on a pull).
fn congestion_for(o: &CpOptions, push: bool) -> Result<Option<String>, EngineError> {
    use crate::net::sock;
    Ok(match &o.congestion {
        Some(cc) => {
            if push {
                sock::check_congestion(cc).map_err(EngineError::Usage)?;
            }
            Some(cc.clone())
        }
        // BBR holds its rate through random loss where CUBIC backs off.
        None if !push || sock::available_congestion().iter().any(|c| c == "bbr") => {
            Some("bbr".to_string())
        }
        None => None,
    })
}

/// What sizing for the path starts from.
#[derive(Clone, Copy)]
struct PathFacts {
    /// The smallest RTT the control connection has seen, microseconds.
    rtt_us: u32,
    local: crate::net::sock::BufferCaps,
    /// The server's caps (`Welcome.buffers`); None before its `Welcome`,
    /// when they are taken to be this host's.
    remote: Option<crate::net::sock::BufferCaps>,
    /// The server's `--max-streams`, when known.
    max_streams: Option<u16>,
}

impl PathFacts {
    fn of(ctl: &Control) -> PathFacts {
        let (rtt_us, local, remote) = ctl.path_facts();
        PathFacts {
            rtt_us,
            local,
            remote: Some(remote),
            max_streams: ctl.welcome.max_streams,
        }
    }

    /// (sender, receiver) caps.
    fn sides(&self, push: bool) -> (crate::net::sock::BufferCaps, crate::net::sock::BufferCaps) {
        let remote = self.remote.unwrap_or(self.local);
        if push {
            (self.local, remote)
        } else {
            (remote, self.local)
        }
    }
}

/// Sizes the data streams for the path: RTT from the control connection,
/// both hosts' buffer caps, the rate if given (see [`longhaul_proto::window`]).
fn size_for_path(
    o: &CpOptions,
    facts: PathFacts,
    host: &str,
    push: bool,
) -> Result<(PathTuning, StreamTuning, Vec<String>), EngineError> {
    use longhaul_proto::window::{plan, PathInput};
    let rtt_us = facts.rtt_us;
    let (sender, receiver) = facts.sides(push);
    let (target_bps, remembered) = target_rate(o, host, push, rtt_us);
    let mut window = plan(&PathInput {
        rtt_us,
        target_bps,
        sender,
        receiver,
        streams: o.streams,
    });
    // Within the server's --max-streams when the count was ours to choose.
    if let (true, Some(max)) = (window.auto_streams, facts.max_streams) {
        window.streams = window.streams.min(max.max(1));
        window.ceiling_bps = window.stream_ceiling_bps * f64::from(window.streams);
    }
    let congestion = congestion_for(o, push)?;
    // Each stream paced to a little over its share: bursts above the
    // bottleneck's rate are what overflow its queue.
    let pacing = o
        .rate
        .map(|r| (r as f64 * 1.1 / 8.0 / f64::from(window.streams)) as u64);
    let mut tuning = StreamTuning {
        congestion: congestion.clone(),
        send_buffer: window.send_buffer.to_set(),
        receive_buffer: window.receive_buffer.to_set(),
        pacing,
        // Online tuning unless the streams were fixed (-P) or it is off.
        online: o.tune && o.streams.is_none(),
        intervals: true,
        ..StreamTuning::default()
    };
    let warnings = window.shortfall(&sender, &receiver).into_iter().collect();
    // A pulling client is the sink: it tells the source where to start and
    // how far it may grow.
    if !push {
        let (start, most) = files_in_flight(o, &window, super::files_in_flight_cap());
        tuning.files_in_flight = Some(start);
        tuning.max_files_in_flight = Some(most);
    }
    let path = PathTuning {
        window,
        congestion: congestion.unwrap_or_else(|| "default".into()),
        pacing,
        remembered,
    };
    Ok((path, tuning, warnings))
}

/// The warnings of a plan sized before the server's `Welcome`, with the
/// server's caps as they are: the streams stay as requested.
fn shortfall_with_server(path: &PathTuning, facts: PathFacts, push: bool) -> Vec<String> {
    use longhaul_proto::window::{plan, PathInput};
    let (sender, receiver) = facts.sides(push);
    plan(&PathInput {
        rtt_us: path.window.rtt_us,
        target_bps: Some(path.window.target_bps),
        sender,
        receiver,
        streams: Some(path.window.streams),
    })
    .shortfall(&sender, &receiver)
    .into_iter()
    .collect()
}

/// Files in flight to start with and the most to grow to, for a sink
/// that allows `cap`: fixed by `--files-in-flight` or `--no-tune`, else
/// sized for the path and free to grow to the cap.
fn files_in_flight(
    o: &CpOptions,
    window: &longhaul_proto::window::WindowPlan,
    cap: u64,
) -> (u64, u64) {
    use longhaul_proto::tune::initial_files_in_flight;
    match o.files_in_flight {
        Some(n) => (n.clamp(1, cap), n.clamp(1, cap)),
        None => {
            let start = initial_files_in_flight(window.target_bps, window.rtt_us, cap);
            (start, if o.tune { cap } else { start })
        }
    }
}

/// The server's answer to the `TransferRequest` sent on `ctl`.
fn accepted(ctl: &mut Control, o: &ClientOptions) -> Result<TransferAccept, EngineError> {
    let deadline = Instant::now() + o.handshake_timeout;
    ctl.answer(deadline, "the transfer request", |m| match m {
        Message::TransferAccept(a) => Some(a),
        _ => None,
    })
}

/// The request for `plan`, `streams` data streams tuned by `tuning`.
fn transfer_request(
    o: &CpOptions,
    plan: &Plan,
    streams: u16,
    tuning: &StreamTuning,
) -> TransferRequest {
    let mut req = TransferRequest {
        op: Op::Push,
        export: String::new(),
        dest: String::new(),
        sources: Vec::new(),
        source_count: o.sources.len() as u32,
        recursive: o.recursive,
        preserve: o.preserve,
        streams,
        chunk_size: o.chunk_size,
        force: o.force,
        sync: o.sync.clone(),
        dry_run: o.dry_run,
        verify: o.verify,
        contents: o.contents(),
        dest_dir: false,
        mkpath: o.mkpath,
        direct: o.direct,
        tuning: tuning.clone(),
        // Used only once the server agrees (`TransferAccept::bundles`).
        bundles: true,
        parts: o.share.is_some(),
        sealed: super::sealed_frames(),
        source_dir: false,
    };
    match plan {
        Plan::Push {
            export,
            dest,
            dest_dir,
            roots,
            ..
        } => {
            req.export = export.clone();
            req.dest = dest.clone();
            req.dest_dir = *dest_dir;
            // A tree cannot replace a file: the server refuses it at once.
            req.source_dir = o.recursive
                && o.share.is_none()
                && matches!(roots.as_slice(), [one] if std::fs::symlink_metadata(one).is_ok_and(|m| m.is_dir()));
        }
        Plan::Pull {
            export, sources, ..
        } => {
            req.op = Op::Pull;
            req.export = export.clone();
            req.sources = sources.clone();
        }
    }
    req
}

fn cp_once(
    o: &CpOptions,
    plan: &Plan,
    digest_out: &Option<super::DigestOut>,
    pipeline: bool,
) -> Result<CpSummary, EngineError> {
    let started = Instant::now();
    let host = match plan {
        Plan::Push { host, .. } | Plan::Pull { host, .. } => host,
    };
    let push = matches!(plan, Plan::Push { .. });
    // What can fail here fails before the server is asked anything.
    let pull_dest = match plan {
        Plan::Push { roots, .. } => {
            for r in roots {
                std::fs::symlink_metadata(r)
                    .map_err(|e| EngineError::Usage(format!("cannot read {}: {e}", r.display())))?;
            }
            None
        }
        Plan::Pull { dest, .. } => Some(local_dest(o, dest)?),
    };
    // Sized from the RTT of the TCP handshake and this host's caps (the
    // server's are not known before its Welcome), the request goes out
    // right behind the Hello: a round trip less before data flows.
    let mut pipelined = None;
    let (mut ctl, early) = open_control_early(
        host,
        &o.client,
        |d, rtt_us| dial_early(o, push, host, d, rtt_us),
        |rtt_us| {
            if !pipeline {
                return None;
            }
            let facts = PathFacts {
                rtt_us,
                local: crate::net::sock::buffer_caps(),
                remote: None,
                max_streams: None,
            };
            // An error is asked again below, where it is reported.
            let sized = size_for_path(o, facts, host, push).ok()?;
            let req = transfer_request(o, plan, sized.0.window.streams, &sized.1);
            pipelined = Some(sized);
            Some(Message::TransferRequest(req))
        },
    )?;
    let (mut path, tuning, warnings) = match pipelined {
        Some((path, tuning, _)) => {
            if ctl
                .welcome
                .max_streams
                .is_some_and(|max| path.window.streams > max)
            {
                // The server refuses that many (`limit`) and closes: ask
                // again, sized with its Welcome.
                drop(ctl);
                return cp_once(o, plan, digest_out, false);
            }
            let warnings = shortfall_with_server(&path, PathFacts::of(&ctl), push);
            (path, tuning, warnings)
        }
        None => {
            let sized = size_for_path(o, PathFacts::of(&ctl), host, push)?;
            let req = transfer_request(o, plan, sized.0.window.streams, &sized.1);
            ctl.conn.send(&Message::TransferRequest(req))?;
            sized
        }
    };
    let streams = path.window.streams;
    let storage: Arc<dyn Storage> = if o.direct {
        Arc::new(Direct)
    } else {
        Arc::new(Local)
    };
    let mut s = CpSummary {
        streams,
        warnings,
        dry_run: o.dry_run,
        encryption: ctl.conn.encryption(),
        ..CpSummary::default()
    };
    match plan {
        Plan::Push { roots, .. } => {
            let accept = accepted(&mut ctl, &o.client)?;
            if o.share.is_some() && !accept.parts {
                return Err(EngineError::Failed(format!(
                    "the server at {host} does not take parts of files (it is older than this client): upgrade it to move a fleet's share"
                )));
            }
            let bundles = accept.bundles;
            let cap = accept
                .max_files_in_flight
                .unwrap_or(longhaul_proto::tune::DEFAULT_FILES_IN_FLIGHT)
                .min(longhaul_proto::tune::MAX_FILES_IN_FLIGHT);
            let (files_start, files_most) = files_in_flight(o, &path.window, cap);
            let data = attach_streams(
                &ctl,
                early,
                &accept,
                streams,
                Direction::Up,
                &tuning,
                &o.client,
            )?;
            if let Some(first) = data.first() {
                path.congestion =
                    crate::net::sock::congestion(crate::net::sock::fd_of(first.tcp()));
                s.encryption = first.encryption();
            }
            let taps = PathTaps::of(&data, o);
            let r = run_source(
                &mut ctl.conn,
                data,
                SourceConfig {
                    dir_ends: o.sync.as_ref().is_some_and(|s| s.delete),
                    digests: o.sync.as_ref().is_some_and(|s| s.checksum),
                    digest_out: digest_out.clone(),
                    on_landed: o
                        .catalogue
                        .clone()
                        .map(|c| Place::push(plan, accept.onto).hook(c)),
                    progress: o.progress.clone(),
                    roots: roots.clone(),
                    recursive: o.recursive,
                    chunk_size: o.chunk_size,
                    streams,
                    storage,
                    anchor: o.source_anchor.clone(),
                    online: tuning.online,
                    send_intervals: false,
                    rtt: Duration::from_micros(u64::from(path.window.rtt_us)),
                    pacing: tuning.pacing,
                    files_in_flight: files_start,
                    max_files_in_flight: files_most,
                    bundles,
                    share: o.share.clone(),
                },
            )?;
            s.tuning = r.tuning.clone();
            let t = r.tally;
            s.files = t.files;
            s.links = r.sink.links;
            s.resent_changed = t.resent_changed;
            s.bytes = t.bytes;
            s.skipped = t.skipped;
            s.resumed_bytes = t.resumed_bytes;
            s.failed = t.failed;
            for f in r.sink.failed {
                if !s.failed.iter().any(|g| g.path == f.path) {
                    s.failed.push(f);
                }
            }
            s.source_read_bps = stage_rate(t.read_bytes, t.read_us, streams);
            s.cpu_stages = CpuStages {
                source: Some(r.cpu),
                sink: r.sink.cpu,
            };
            s.deleted = r.sink.deleted.clone();
            s.would_send = r.sink.would_send.clone();
            s.would_send_bytes = r.sink.would_send_bytes;
            s.dest_write_bps = stage_rate(r.sink.written_bytes, r.sink.write_us, streams);
            s.paths = taps.count(true);
        }
        Plan::Pull { .. } => {
            let (dest, landing, anchor) = pull_dest.expect("made for a pull");
            let dest = &dest;
            let accept = accepted(&mut ctl, &o.client)?;
            let data = attach_streams(
                &ctl,
                early,
                &accept,
                streams,
                Direction::Down,
                &tuning,
                &o.client,
            )?;
            let bundles = accept.bundles;
            if let Some(first) = data.first() {
                s.encryption = first.encryption();
            }
            let taps = PathTaps::of(&data, o);
            let r = run_sink(
                &mut ctl.conn,
                data,
                SinkConfig {
                    digest_out: digest_out.clone(),
                    on_landed: o
                        .catalogue
                        .clone()
                        .map(|c| Place::pull(plan, o, landing).hook(c)),
                    progress: o.progress.clone(),
                    landing,
                    dest: dest.clone(),
                    dest_shown: o.dest.clone(),
                    preserve: o.preserve,
                    keep_special_modes: o.keep_special_modes,
                    force: o.force,
                    sync_files: o.sync_files,
                    verify: o.verify,
                    storage,
                    umask: super::umask(),
                    delete: o.sync.as_ref().is_some_and(|s| s.delete),
                    dry_run: o.dry_run,
                    anchor,
                    max_files: super::files_in_flight_cap(),
                    bundles,
                },
            )?;
            s.files = r.files;
            s.links = r.links;
            s.bytes = r.bytes;
            s.skipped = r.skipped;
            s.resumed_bytes = r.resumed_bytes;
            s.failed = r.failed.clone();
            s.deleted = r.deleted.clone();
            s.would_send = r.would_send.clone();
            s.would_send_bytes = r.would_send_bytes;
            s.dest_write_bps = stage_rate(r.written_bytes, r.write_us, streams);
            s.cpu_stages = CpuStages {
                source: r.source.as_ref().and_then(|d| d.cpu),
                sink: r.cpu,
            };
            if let Some(d) = &r.source {
                s.source_read_bps = stage_rate(d.read_bytes, d.read_us, streams);
                s.tuning = d.tuning.clone();
                s.resent_changed = d.resent_changed;
            }
            s.paths = taps.count(false);
        }
    }
    s.path = Some(path);
    // Cloned, not taken: the reporter reads the last ones after this.
    s.intervals = o.progress.intervals.lock().expect("poisoned").clone();
    s.verdict = longhaul_proto::tune::verdict(&s.intervals);
    s.seconds = started.elapsed().as_secs_f64();
    s.sent_bytes = s.bytes.saturating_sub(s.resumed_bytes);
    s.bits_per_second = s.sent_bytes as f64 * 8.0 / s.seconds.max(1e-9);
    s.network_bps = s.bits_per_second;
    s.verified = s.failed.is_empty();
    Ok(s)
}

/// Names a landed file in full for the catalogue: where each entry of the
/// transfer came from and where it went, as a local absolute path or
/// `HOST:EXPORT/path`.
struct Place {
    /// Each root: the name its entries start with (whether it was named
    /// `dir` or `dir/`) and the directory that holds it; or None and the
    /// root itself when its entries are named by the server (an export's
    /// root) or it has no name (`/`).
    roots: Vec<(Option<String>, String)>,
    /// The destination as named, and whether the first component of an
    /// entry is replaced by it ([`Landing::Onto`]) or kept.
    dest: String,
    onto: bool,
}

impl Place {
    fn push(plan: &Plan, onto: bool) -> Place {
        let Plan::Push {
            host,
            export,
            dest,
            roots,
            ..
        } = plan
        else {
            unreachable!("a push plan")
        };
        // A root's entries start with its name, `dir/` (its contents) or
        // not: the walk names them so, and the landing drops the name.
        let roots = roots
            .iter()
            .map(|r| {
                let abs = std::path::absolute(r).unwrap_or_else(|_| r.clone());
                let named = match abs.file_name() {
                    Some(_) if !abs.ends_with("..") => abs,
                    _ => abs.canonicalize().unwrap_or(abs),
                };
                let named = named.to_string_lossy().trim_end_matches('/').to_string();
                match named.rsplit_once('/') {
                    Some((parent, name)) if !name.is_empty() => {
                        (Some(name.to_string()), parent.to_string())
                    }
                    _ => (None, named),
                }
            })
            .collect();
        Place {
            roots,
            dest: format!("{host}:{export}/{dest}"),
            onto,
        }
    }

    fn pull(plan: &Plan, o: &CpOptions, landing: Landing) -> Place {
        let Plan::Pull {
            host,
            export,
            sources,
            ..
        } = plan
        else {
            unreachable!("a pull plan")
        };
        let roots = sources
            .iter()
            .map(|s| {
                let full = format!("{host}:{export}/{}", s.trim_end_matches('/'));
                if s.trim_end_matches('/').is_empty() {
                    (None, full.trim_end_matches('/').to_string())
                } else {
                    let (parent, name) = full.rsplit_once('/').unwrap_or(("", &full));
                    (Some(name.to_string()), parent.to_string())
                }
            })
            .collect();
        let dest = std::path::absolute(&o.dest)
            .map_or_else(|_| o.dest.clone(), |p| p.to_string_lossy().into_owned());
        Place {
            roots,
            dest,
            onto: landing == Landing::Onto,
        }
    }

    /// What the source and sink threads call as a file lands: the row for
    /// `catalogue`, its naming left to whoever writes it.
    fn hook(self, catalogue: super::Catalogue) -> super::OnLanded {
        let place = Arc::new(self);
        let namer: super::Namer = Arc::new(move |path: &str| place.names(path));
        Arc::new(move |path: &str, size, mtime_ns, digest: Option<&str>| {
            catalogue(Landed {
                path: path.to_string(),
                size,
                mtime_ns,
                digest: digest.map(str::to_string),
                namer: namer.clone(),
            });
        })
    }

    /// (source, destination) of an entry path.
    fn names(&self, path: &str) -> (String, String) {
        let first = path.split('/').next().unwrap_or("");
        let source = match self
            .roots
            .iter()
            .find(|(name, _)| name.as_deref() == Some(first))
        {
            Some((_, parent)) => format!("{parent}/{path}"),
            // A root named by the server (an export's root): its entries
            // start with a name of the server's, in place of the root.
            None => match self.roots.iter().find(|(name, _)| name.is_none()) {
                Some((_, root)) => match path.split_once('/') {
                    Some((_, rest)) => format!("{root}/{rest}"),
                    None => root.clone(),
                },
                None => path.to_string(),
            },
        };
        let rest = if self.onto {
            path.split_once('/').map_or("", |(_, r)| r)
        } else {
            path
        };
        let base = self.dest.trim_end_matches('/');
        let dest = if rest.is_empty() {
            base.to_string()
        } else {
            format!("{base}/{rest}")
        };
        (source, dest)
    }
}

/// A pull's destination, by the rule of [`landing`]: where entries land
/// and the anchor everything written stays beneath (the destination, or
/// the directory that holds it when the source becomes it), whatever
/// names the server sends. The user's own links on the way are followed:
/// the path is theirs to choose.
fn local_dest(o: &CpOptions, dest: &Path) -> Result<(PathBuf, Landing, Anchor), EngineError> {
    let abs = std::path::absolute(dest)
        .map_err(|e| EngineError::Usage(format!("{}: {e}", dest.display())))?;
    let parent = abs
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| abs.clone());
    let state = match std::fs::metadata(&abs) {
        Ok(m) if m.is_dir() => DestState::Dir,
        Ok(_) => DestState::Other,
        Err(_) if std::fs::symlink_metadata(&abs).is_ok() => DestState::Other,
        Err(_) => DestState::Missing {
            parent: parent.is_dir(),
        },
    };
    let (landing, create) = landing(
        &o.dest,
        o.sources.len() as u32,
        o.contents(),
        o.dest.ends_with('/'),
        state,
        o.mkpath,
    )
    .map_err(|e| EngineError::Usage(format!("destination {e}")))?;
    let make = match create {
        Create::Nothing => None,
        Create::Dest => Some(&abs),
        Create::Parents => Some(&parent),
    };
    if let (Some(dir), false) = (make, o.dry_run) {
        std::fs::create_dir_all(dir)
            .map_err(|e| EngineError::Usage(format!("cannot create {}: {e}", dir.display())))?;
    }
    let mut root = match landing {
        Landing::Into => abs.clone(),
        Landing::Onto => parent,
    };
    // A dry run creates nothing: it looks from what exists.
    while o.dry_run && !root.is_dir() {
        match root.parent() {
            Some(p) => root = p.to_path_buf(),
            None => break,
        }
    }
    Ok((abs, landing, Anchor::open(&root)?))
}

/// A stage's rate on its own: bytes over busy time, with `parallel` workers.
fn stage_rate(bytes: u64, busy_us: u64, parallel: u16) -> f64 {
    if busy_us == 0 {
        return 0.0;
    }
    bytes as f64 * 8.0 * 1e6 / (busy_us as f64 / f64::from(parallel.max(1)))
}

/// Lists a remote path.
pub fn ls(target: &str, recursive: bool, o: &ClientOptions) -> Result<Vec<ListEntry>, EngineError> {
    let r = parse_remote(target).ok_or_else(|| {
        EngineError::Usage(format!(
            "'{target}' is not remote: name it HOST:EXPORT/path or longhaul://HOST/EXPORT/path"
        ))
    })?;
    let mut ctl = open_control(&r.host, o)?;
    ctl.conn.send(&Message::ListRequest(ListRequest {
        export: r.export,
        path: r.path,
        recursive,
    }))?;
    let mut out = Vec::new();
    let deadline = Instant::now() + o.handshake_timeout * 6;
    loop {
        let l = ctl.answer(deadline, "the listing", |m| match m {
            Message::Listing(l) => Some(l),
            _ => None,
        })?;
        out.extend(l.entries);
        if l.done {
            return Ok(out);
        }
    }
}
