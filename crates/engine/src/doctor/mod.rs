//! `longhaul doctor`: measures every stage a transfer goes through and
//! names the one that limits it. The rules live in
//! [`longhaul_proto::doctor`]; this module measures:
//!
//! * both hosts' settings (this one read here, the server's through a
//!   [`ProbeRequest`]) and the cipher's speed per core;
//! * the RTT idle (the control connection's handshake) and under load
//!   (the data streams' smoothed RTT during the memory-to-memory test);
//! * memory to memory both ways (perf, streams sized for the path, TLS),
//!   with the sender's kernel counters per interval;
//! * the source storage (this host, `--source`) and the destination
//!   storage (the server, on the export: sequential O_DIRECT writes and
//!   small-file creates);
//! * a short real file-to-file copy into a scratch directory on the export,
//!   removed afterwards.

mod cpu;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use longhaul_proto::cpulimit::{self, CpuRun};
use longhaul_proto::disk::{
    DiskReport, ProbeRequest, ProbeResult, ProbeTests, DOCTOR_SCRATCH_PREFIX,
};
use longhaul_proto::doctor::{
    self, audit, Finding, HostSettings, RunLimit, Stage, StageCeiling, Verdict,
};
use longhaul_proto::msg::{Direction, Message, Mode, TestParams};
use longhaul_proto::report::{IntervalReport, LimitKind, Summary};
use serde::{Deserialize, Serialize};

use crate::net::dial::{open_control, ClientOptions};
use crate::net::sock;
use crate::perf::client::run_perf;
use crate::report::Reporter;
use crate::EngineError;

/// What `doctor` is asked to do.
#[derive(Debug, Clone)]
pub struct DoctorOptions {
    /// Seconds of each memory-to-memory test.
    pub perf_time: Duration,
    /// What is to be sent, on this host: its storage is the source
    /// measured, and its mean file size sizes the metadata stage.
    pub source: Option<PathBuf>,
    /// The transfer is a pull (the server is the source).
    pub pull: bool,
    /// The path rate to judge settings against, bits/s (default: what was
    /// measured, or the interface's speed).
    pub target_bps: Option<u64>,
    /// Skip the short file-to-file copy.
    pub no_copy: bool,
    /// On a pull: a directory on this host's destination storage, to measure.
    pub dest: Option<PathBuf>,
    /// Where to remember the path's rate for later transfers
    /// ([`crate::pathdb`]); None: not remembered.
    pub remember: Option<PathBuf>,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            perf_time: Duration::from_secs(3),
            source: None,
            pull: false,
            target_bps: None,
            no_copy: false,
            dest: None,
            remember: None,
        }
    }
}

/// One direction of the memory-to-memory test, as the doctor sees it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PathRun {
    pub direction: Direction,
    pub streams: u16,
    pub bits_per_second: f64,
    pub retransmits: u64,
    /// Retransmitted segments per segment sent, after the first second.
    pub loss_fraction: f64,
    pub rtt_loaded_us: u32,
    pub cpu_sender_percent: f64,
    pub cpu_receiver_percent: f64,
    pub limit: LimitKind,
    pub limit_detail: String,
    /// What limited each interval, in order.
    pub interval_limits: Vec<LimitKind>,
    /// Loss of a light UDP probe (a tenth of the TCP rate, 1200-byte
    /// datagrams): loss on the path itself, not drops at a queue that the
    /// test's own load filled. None when not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_packets: Option<u64>,
}

/// The short real copy.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CopyRun {
    pub bytes: u64,
    pub seconds: f64,
    pub bits_per_second: f64,
    pub streams: u16,
    /// The copy's own stages, each over the time it was busy.
    pub source_read_bps: f64,
    pub dest_write_bps: f64,
    /// Where each end's CPU went in the copy, by stage.
    #[serde(
        default,
        skip_serializing_if = "longhaul_proto::xfer::CpuStages::is_empty"
    )]
    pub cpu_stages: longhaul_proto::xfer::CpuStages,
    /// True when it copied generated data (no `--source` given), false
    /// when it copied the source the user named.
    #[serde(default)]
    pub generated: bool,
}

/// Everything the doctor found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DoctorReport {
    pub local: HostSettings,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<HostSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_idle_us: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_loaded_us: Option<u32>,
    /// The path MTU this host's kernel knows for the server after the
    /// tests (path MTU discovery), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_mtu: Option<u32>,
    /// The rate the settings were judged against, and its BDP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_bps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bdp_bytes: Option<u64>,
    pub upload: Option<PathRun>,
    pub download: Option<PathRun>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_storage: Option<DiskReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_storage: Option<DiskReport>,
    /// Mean file size the metadata stage was sized for.
    pub mean_file_size: u64,
    /// True when that size was measured on the files to send (`--source`);
    /// false when it is assumed, and then file creation is reported but
    /// takes no part in the verdict (a ceiling for files of a guessed size
    /// would be a guess).
    #[serde(default)]
    pub mean_file_size_measured: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<CopyRun>,
    /// CPU of the sender per Gbit/s, percent of a core, with TLS (measured)
    /// and without (the cipher's share taken off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_cpu_per_gbps_tls: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_cpu_per_gbps_plain: Option<f64>,
    /// True when the plaintext figure was measured (perf data streams in
    /// plaintext, which a server refuses with `--perf-tls-only`), false
    /// when it is the TLS figure less the cipher's cost.
    #[serde(default)]
    pub plain_measured: bool,
    /// The one-second memory-to-memory run with plaintext data streams in
    /// the transfer's direction (None where the server runs none, `serve
    /// --perf-tls-only`): far above the TLS run, it shows that run held by
    /// the cipher, not the path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain: Option<PathRun>,
    pub findings: Vec<Finding>,
    pub stages: Vec<StageCeiling>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// Steps that could not be measured, and why.
    pub notes: Vec<String>,
    /// The path's rate as remembered for later transfers (`cp` sizes its
    /// streams for it): only when the path itself was what limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remembered: Option<crate::pathdb::PathRecord>,
    /// What each end's CPU went through during the memory-to-memory run
    /// in the transfer's direction: cgroup throttling, steal, the load
    /// before it. Omitted when not read (a server that predates it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_cpu: Option<CpuRun>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_cpu: Option<CpuRun>,
    pub seconds: f64,
}

/// The mean file size the metadata stage is sized for when the data to
/// send is not known (`--source` gives the real one): creates then limit
/// only where they are slow for files of a megabyte.
pub const DEFAULT_MEAN_FILE_SIZE: u64 = 1 << 20;

/// The most control connections [`remote`] opens, one after another: the
/// probe (and its settings-only retry), memory to memory each way, the CPU
/// probe after a run, the UDP loss probe (twice at most), the plaintext
/// run, the short copy and the probe that removes its scratch directory
/// (ten), with room to spare. A one-shot far end over ssh admits as many
/// on its one secret (`serve --one-shot --sessions`).
pub const CONTROL_SESSIONS: u32 = 16;

/// Reads this host's settings; `peer` picks the interface.
pub fn host_settings(peer: Option<IpAddr>) -> HostSettings {
    // First, before the cipher's measurement spends any of the quota.
    let cpu_limits = cpu::cpu_limits();
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let interface = peer.and_then(route_interface);
    let sys_if = |what: &str| {
        interface
            .as_ref()
            .and_then(|i| std::fs::read_to_string(format!("/sys/class/net/{i}/{what}")).ok())
            .and_then(|s| s.trim().parse::<i64>().ok())
    };
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .map(|s| count_cpu_list(s.trim()))
        .filter(|&n| n > 0)
        .unwrap_or(1);
    let numa_nodes = std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.starts_with("node") && n[4..].parse::<u32>().is_ok()
                })
                .count() as u32
        })
        .unwrap_or(1)
        .max(1);
    let governor = read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor");
    HostSettings {
        hostname: sock::hostname(),
        kernel: read("/proc/sys/kernel/osrelease"),
        buffers: sock::buffer_caps(),
        congestion_control: read("/proc/sys/net/ipv4/tcp_congestion_control"),
        available_congestion_control: read("/proc/sys/net/ipv4/tcp_available_congestion_control")
            .split_whitespace()
            .map(String::from)
            .collect(),
        default_qdisc: read("/proc/sys/net/core/default_qdisc"),
        tcp_no_metrics_save: match read("/proc/sys/net/ipv4/tcp_no_metrics_save").as_str() {
            "0" => Some(false),
            "" => None,
            _ => Some(true),
        },
        qdisc: interface.as_deref().and_then(interface_qdisc),
        mtu: sys_if("mtu").and_then(|m| u32::try_from(m).ok()),
        link_mbps: sys_if("speed")
            .filter(|&s| s > 0)
            .and_then(|s| u64::try_from(s).ok()),
        interface,
        cpus,
        cpus_usable: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        governor: (!governor.is_empty()).then_some(governor),
        numa_nodes,
        cipher_bytes_per_core: cipher_speed(),
        cpu_limits: Some(cpu_limits),
    }
}

fn count_cpu_list(s: &str) -> u32 {
    s.split(',')
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some(b.parse::<u32>().ok()? - a.parse::<u32>().ok()? + 1),
            None => r.parse::<u32>().ok().map(|_| 1),
        })
        .sum()
}

/// The interface a packet to `peer` leaves by: the longest matching
/// prefix of the IPv4 routing table, `lo` for a local address.
fn route_interface(peer: IpAddr) -> Option<String> {
    let v4 = match peer {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) if a.is_loopback() => return Some("lo".into()),
        IpAddr::V6(a) => a.to_ipv4_mapped()?,
    };
    if v4.is_loopback() || is_local_address(IpAddr::V4(v4)) {
        return Some("lo".into());
    }
    let table = std::fs::read_to_string("/proc/net/route").ok()?;
    let ip = u32::from_le_bytes(v4.octets());
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let dest = u32::from_str_radix(f.get(1)?, 16).ok()?;
            let mask = u32::from_str_radix(f.get(7)?, 16).ok()?;
            (ip & mask == dest).then(|| (mask.count_ones(), f[0].to_string()))
        })
        .max_by_key(|(bits, _)| *bits)
        .map(|(_, i)| i)
}

fn is_local_address(ip: IpAddr) -> bool {
    // Binding to an address succeeds only if it is one of ours.
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// The root qdisc of an interface, from `tc` (iproute2), if it is there.
fn interface_qdisc(interface: &str) -> Option<String> {
    let out = std::process::Command::new("tc")
        .args(["qdisc", "show", "dev", interface, "root"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout);
    // "qdisc fq_codel 0: root refcnt 2 ..."
    s.split_whitespace().nth(1).map(String::from)
}

/// Bytes/s one core seals with AES-128-GCM (TLS 1.3's first choice here),
/// in 16 KiB records, for about 50 ms of this thread's CPU time (at most a
/// second): per core of CPU time, so a CPU quota or steal that holds the
/// thread back does not lower it (the rules count the cores apart).
pub fn cipher_speed() -> f64 {
    use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};
    let Ok(key) = UnboundKey::new(&AES_128_GCM, &[7u8; 16]) else {
        return 0.0;
    };
    let key = LessSafeKey::new(key);
    let mut record = vec![0x5au8; 16 << 10];
    let start = Instant::now();
    let cpu_start = sock::thread_cpu_us();
    let cpu_us = || sock::thread_cpu_us().saturating_sub(cpu_start);
    let mut bytes = 0u64;
    let mut n = 0u64;
    while cpu_us() < 50_000 && start.elapsed() < Duration::from_secs(1) {
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&n.to_be_bytes());
        n += 1;
        if key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::empty(),
                &mut record,
            )
            .is_err()
        {
            return 0.0;
        }
        bytes += record.len() as u64;
    }
    let cpu = cpu_us();
    if cpu == 0 {
        // No thread clock: the wall clock's figure.
        return bytes as f64 / start.elapsed().as_secs_f64();
    }
    bytes as f64 * 1e6 / cpu as f64
}

/// Keeps a perf run's intervals, and whether its data was encrypted.
#[derive(Default)]
struct Keep {
    intervals: Vec<IntervalReport>,
    data_encrypted: Option<bool>,
}

impl Reporter for Keep {
    fn setup(&mut self, s: &longhaul_proto::report::Setup) {
        self.data_encrypted = s.data_encrypted;
    }
    fn interval(&mut self, r: &IntervalReport) {
        self.intervals.push(r.clone());
    }
}

fn path_run(summary: &Summary, intervals: &[IntervalReport], mss: u32) -> Option<PathRun> {
    let d = summary.directions.first()?;
    let t = d.tcp.unwrap_or_default();
    // Loss after the start-up: retransmits per segment in the intervals
    // that begin at or after one second.
    let (mut retrans, mut bytes) = (0u64, 0u64);
    for i in intervals.iter().filter(|i| i.start_s >= 1.0) {
        if let Some(id) = i.directions.first() {
            retrans += id.tcp.map_or(0, |t| t.retransmits);
            bytes += id.bytes;
        }
    }
    if bytes == 0 {
        (retrans, bytes) = (t.retransmits, d.bytes);
    }
    let segments = (bytes / u64::from(mss.max(536))).max(1);
    Some(PathRun {
        direction: d.direction,
        streams: summary.streams.len() as u16,
        bits_per_second: d.bits_per_second,
        retransmits: t.retransmits,
        loss_fraction: retrans as f64 / segments as f64,
        rtt_loaded_us: t.rtt_us,
        cpu_sender_percent: d.cpu_sender_percent,
        cpu_receiver_percent: d.cpu_receiver_percent,
        limit: d.limit.kind,
        limit_detail: d.limit.detail.clone(),
        interval_limits: intervals
            .iter()
            .filter_map(|i| i.directions.first().map(|d| d.limit.kind))
            .collect(),
        probe_loss: None,
        probe_packets: None,
    })
}

/// A UDP test at a tenth of `tcp_bps` (10 to 50 Mbit/s: light enough for
/// any receiver), 1200-byte datagrams, 3 s, 4 MiB socket buffers: the share
/// of datagrams lost on the path, and how many were sent. If the
/// receiver's own socket buffer dropped any (a busy receiver), once more at
/// half the rate; then the figure is unknown (an error).
fn udp_probe(
    host: &str,
    opts: &ClientOptions,
    mode: Mode,
    tcp_bps: f64,
) -> Result<(f64, u64), EngineError> {
    let opts = ClientOptions {
        auto_streams: false,
        ..opts.clone()
    };
    let mut rate = (tcp_bps / 10.0).clamp(1e7, 5e7);
    let mut drops = 0;
    for _ in 0..2 {
        let params = TestParams {
            transport: longhaul_proto::msg::Transport::Udp,
            mode,
            streams: 1,
            duration_ms: Some(3000),
            length: 1200,
            window: Some(4 << 20),
            udp_rate_bps: Some(rate as u64),
            interval_ms: 0,
            ..TestParams::default()
        };
        let s = run_perf(host, &params, &opts, &mut crate::report::Discard)?;
        let u = s
            .directions
            .first()
            .and_then(|d| d.udp)
            .ok_or_else(|| EngineError::Failed("the UDP probe reported nothing".into()))?;
        if u.rcvbuf_drops == 0 {
            return Ok((
                u.lost_packets as f64 / u.packets_sent.max(1) as f64,
                u.packets_sent,
            ));
        }
        drops = u.rcvbuf_drops;
        rate /= 2.0;
    }
    Err(EngineError::Failed(format!(
        "the receiver's own socket buffer dropped datagrams ({drops} events, twice): the path's loss is unknown"
    )))
}

/// Sends one probe request on its own control connection.
fn probe(
    target: &str,
    opts: &ClientOptions,
    req: ProbeRequest,
) -> Result<(ProbeResult, u32), EngineError> {
    let mut ctl = open_control(target, opts)?;
    let (rtt_us, _, _) = ctl.path_facts();
    ctl.conn.send(&Message::Probe(req))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    ctl.answer(deadline, "the storage probe", |m| match m {
        Message::ProbeResult(r) => Some((*r, rtt_us)),
        _ => None,
    })
}

/// Reads the files of `source` (a file or a tree) front to back with
/// O_DIRECT for up to `limit`, and counts files and bytes of up to 20,000
/// entries for the mean file size.
fn measure_source(source: &Path, limit: Duration) -> Result<(DiskReport, u64), EngineError> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let mut files = Vec::new();
    let mut stack = vec![source.to_path_buf()];
    let mut seen = 0;
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p)
            .map_err(|e| EngineError::io(format!("cannot read {}", p.display()), e))?;
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                for e in rd.flatten() {
                    stack.push(e.path());
                }
            }
        } else if m.is_file() {
            files.push((p, m.len()));
        }
        seen += 1;
        if seen >= 20_000 {
            break;
        }
    }
    let total: u64 = files.iter().map(|f| f.1).sum();
    let mean = if files.is_empty() {
        0
    } else {
        total / files.len() as u64
    };
    let mut buf = crate::xfer::storage::AlignedBuf::new(1 << 20);
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut direct = true;
    'files: for (path, _) in files.iter().rev() {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .or_else(|_| {
                direct = false;
                std::fs::File::open(path)
            })
            .map_err(|e| EngineError::io(format!("cannot read {}", path.display()), e))?;
        let mut off = 0u64;
        loop {
            if start.elapsed() >= limit {
                break 'files;
            }
            let n = match f.read_at(&mut buf, off) {
                Ok(n) => n,
                // O_DIRECT refuses an unaligned tail on some file systems.
                Err(_) => break,
            };
            if n == 0 {
                break;
            }
            off += n as u64;
            bytes += n as u64;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let (fs, _) = crate::bench::disk::statfs(source);
    Ok((
        DiskReport {
            path: source.display().to_string(),
            filesystem: fs,
            direct,
            block_size: 1 << 20,
            threads: 1,
            file_size: total,
            read: Some(longhaul_proto::disk::SeqResult {
                bytes,
                seconds,
                bytes_per_second: bytes as f64 / seconds.max(1e-9),
            }),
            ..Default::default()
        },
        mean,
    ))
}

/// Audits this host only (`doctor` with no remote).
pub fn local(o: &DoctorOptions) -> DoctorReport {
    let started = Instant::now();
    let local = host_settings(None);
    let target = o
        .target_bps
        .unwrap_or(longhaul_proto::window::DEFAULT_TARGET_BPS) as f64;
    // With no path measured, judge the buffers for 100 ms at the target.
    let bdp = (target / 8.0 * 0.1) as u64;
    let mut findings = audit("local", &local, bdp, 1);
    findings.extend(doctor::cpu_findings("local", &local, None));
    let mut r = DoctorReport {
        findings,
        local,
        target_bps: Some(target),
        bdp_bytes: Some(bdp),
        mean_file_size: DEFAULT_MEAN_FILE_SIZE,
        ..Default::default()
    };
    r.notes.push(format!(
        "no remote given: settings judged for {} at 100 ms over one stream; name a server to measure the path",
        longhaul_proto::units::format_rate(target)
    ));
    if let Some(s) = &o.source {
        measure_source_into(&mut r, s);
    }
    r.seconds = started.elapsed().as_secs_f64();
    r
}

/// Measures the source storage (`--source`) into the report: its read
/// rate, and the mean size of its files the metadata stage is sized for.
fn measure_source_into(r: &mut DoctorReport, source: &Path) {
    match measure_source(source, Duration::from_secs(2)) {
        Ok((d, mean)) => {
            r.source_storage = Some(d);
            if mean > 0 {
                r.mean_file_size = mean;
                r.mean_file_size_measured = true;
            }
        }
        Err(e) => r.notes.push(format!("source storage: {e}")),
    }
}

/// The whole path to `remote` (`HOST[:PORT]`, an export and a path on it).
pub fn remote(
    host: &str,
    export: &str,
    path: &str,
    opts: &ClientOptions,
    o: &DoctorOptions,
) -> Result<DoctorReport, EngineError> {
    let started = Instant::now();
    let mut notes = Vec::new();
    // 1. The server's settings and storage, on its own connection.
    let server = probe_server(host, export, path, opts, o, &mut notes)?;
    let peer_ip = crate::net::conn::resolve(host, crate::DEFAULT_PORT)
        .ok()
        .and_then(|a| a.first().map(|a| a.ip()));
    let local = host_settings(peer_ip);
    // 2. Memory to memory, both ways, streams sized for the path.
    let target = PerfTarget {
        host,
        export,
        path,
        opts,
        o,
    };
    let runs = target.memory_runs(&local, server.host.as_ref(), &mut notes);
    // CPU without TLS, measured with plaintext data streams where the
    // server runs them: one second in the transfer's direction over as
    // many streams.
    let plain = run_dir_plain(host, opts, &o.pull, &runs.upload, &runs.download);
    let mut r = DoctorReport {
        path_mtu: peer_ip.and_then(sock::path_mtu),
        local,
        remote: server.host,
        rtt_idle_us: (server.rtt_idle > 0).then_some(server.rtt_idle),
        upload: runs.upload,
        download: runs.download,
        dest_storage: server.storage,
        mean_file_size: DEFAULT_MEAN_FILE_SIZE,
        notes,
        local_cpu: runs.local_cpu,
        remote_cpu: runs.remote_cpu,
        ..Default::default()
    };
    // 3. The source storage (this host on a push; on a pull the server's
    //    read probe stands for it, and this host is the destination).
    if let Some(s) = &o.source {
        measure_source_into(&mut r, s);
    } else if !o.pull {
        r.notes
            .push("source storage not measured: give --source PATH (what you will send)".into());
    }
    if o.pull {
        // The server's read probe is the source; this host's benchmark the destination.
        r.source_storage = r.dest_storage.take();
        r.dest_storage = measure_local_dest(o, &mut r.notes);
    }
    // 4. A short real copy into a scratch directory on the export.
    if !o.no_copy && !o.pull {
        short_copy(&mut r, host, export, &server.dir, opts, o);
    }
    r.plain = plain.filter(|p| p.bits_per_second > 0.0);
    judge(&mut r, o);
    if let Some(p) = &r.plain {
        r.sender_cpu_per_gbps_plain = Some(p.cpu_sender_percent / (p.bits_per_second / 1e9));
        r.plain_measured = true;
    }
    if let Some(file) = &o.remember {
        remember_path(&mut r, file, host, o.pull);
    }
    r.seconds = started.elapsed().as_secs_f64();
    Ok(r)
}

/// What the server's probe told of it.
struct ServerProbe {
    /// Its settings (None: not read).
    host: Option<HostSettings>,
    /// Its storage at the path, as the transfer would use it.
    storage: Option<DiskReport>,
    /// The handshake's RTT: the idle RTT, microseconds (0: unknown).
    rtt_idle: u32,
    /// Where the server measured (the path, or the nearest directory above
    /// it that exists): the copy's scratch data goes there too.
    dir: String,
}

/// The server's settings and storage, on its own connection; its storage
/// refused (a read-only export or credential), its settings only.
fn probe_server(
    host: &str,
    export: &str,
    path: &str,
    opts: &ClientOptions,
    o: &DoctorOptions,
    notes: &mut Vec<String>,
) -> Result<ServerProbe, EngineError> {
    let want = ProbeRequest {
        export: export.into(),
        path: path.into(),
        tests: ProbeTests {
            write: !o.pull,
            read: o.pull,
            create: !o.pull,
        },
        max_bytes: 512 << 20,
        max_files: 2000,
        max_millis: 2000,
        host: true,
        remove: None,
    };
    let (probe_result, rtt_idle) = match probe(host, opts, want.clone()) {
        Ok(r) => (Some(r.0), r.1),
        Err(e @ EngineError::Refused { .. }) => {
            notes.push(format!("the server's storage was not measured: {e}"));
            // Settings only (a read-only export or credential still answers).
            let settings_only = ProbeRequest {
                tests: ProbeTests::default(),
                ..want
            };
            match probe(host, opts, settings_only) {
                Ok(r) => (Some(r.0), r.1),
                Err(e) => {
                    notes.push(format!("the server's settings were not read: {e}"));
                    (None, 0)
                }
            }
        }
        Err(e) => return Err(e),
    };
    let dir = probe_result
        .as_ref()
        .and_then(|p| p.dir.clone())
        .unwrap_or_else(|| path.trim_matches('/').to_string());
    Ok(ServerProbe {
        host: probe_result.as_ref().and_then(|p| p.host.clone()),
        storage: probe_result.map(|p| p.report),
        rtt_idle,
        dir,
    })
}

/// Where the memory-to-memory runs go, and how.
struct PerfTarget<'a> {
    host: &'a str,
    export: &'a str,
    path: &'a str,
    opts: &'a ClientOptions,
    o: &'a DoctorOptions,
}

/// The memory-to-memory runs each way, and each end's CPU limits during
/// the run in the transfer's direction.
struct MemoryRuns {
    upload: Option<PathRun>,
    download: Option<PathRun>,
    local_cpu: Option<CpuRun>,
    remote_cpu: Option<CpuRun>,
}

impl PerfTarget<'_> {
    /// Memory to memory, both ways, streams sized for the path; loss seen
    /// by a light UDP probe in the transfer's direction.
    fn memory_runs(
        &self,
        local: &HostSettings,
        remote_host: Option<&HostSettings>,
        notes: &mut Vec<String>,
    ) -> MemoryRuns {
        let (host, o) = (self.host, self.o);
        let mss = local
            .mtu
            .into_iter()
            .chain(remote_host.and_then(|h| h.mtu))
            .min()
            .unwrap_or(1500)
            .saturating_sub(52);
        let perf_opts = ClientOptions {
            auto_streams: true,
            ..self.opts.clone()
        };
        let mut run_dir = |mode: Mode| self.run_dir(&perf_opts, mode, notes);
        // Each end's CPU counters around the run in the transfer's direction
        // (on a pull the upload's too): throttling, steal.
        let cpu_after = || self.cpu_after(remote_host.is_some());
        let up = run_dir(Mode::Up);
        let after_up = (!o.pull).then(cpu_after);
        let down = run_dir(Mode::Down);
        let (local_after, remote_after) = after_up.unwrap_or_else(cpu_after);
        let local_cpu = local
            .cpu_limits
            .as_ref()
            .map(|before| cpulimit::during(before, &local_after));
        let remote_cpu = remote_host
            .and_then(|h| h.cpu_limits.as_ref())
            .zip(remote_after.as_ref())
            .map(|(before, after)| cpulimit::during(before, after));
        let mut upload = up.as_ref().and_then(|(s, i)| path_run(s, i, mss));
        let mut download = down.as_ref().and_then(|(s, i)| path_run(s, i, mss));
        // Loss on the path, seen by a light probe in the transfer's direction.
        let (mode, run) = if o.pull {
            (Mode::Down, &mut download)
        } else {
            (Mode::Up, &mut upload)
        };
        if let Some(r) = run.as_mut() {
            match udp_probe(host, &perf_opts, mode, r.bits_per_second) {
                Ok((loss, packets)) => {
                    r.probe_loss = Some(loss);
                    r.probe_packets = Some(packets);
                }
                Err(e) => notes.push(format!("loss probe (UDP): {e}")),
            }
        }
        MemoryRuns {
            upload,
            download,
            local_cpu,
            remote_cpu,
        }
    }

    /// One memory-to-memory run in `mode`, with its intervals.
    fn run_dir(
        &self,
        perf_opts: &ClientOptions,
        mode: Mode,
        notes: &mut Vec<String>,
    ) -> Option<(Summary, Vec<IntervalReport>)> {
        let params = TestParams {
            mode,
            streams: longhaul_proto::window::DEFAULT_STREAMS,
            duration_ms: Some(self.o.perf_time.as_millis() as u64),
            interval_ms: 500,
            length: 1 << 20,
            ..TestParams::default()
        };
        let mut keep = Keep::default();
        match run_perf(self.host, &params, perf_opts, &mut keep) {
            Ok(s) => Some((s, keep.intervals)),
            Err(e) => {
                notes.push(format!("memory-to-memory {mode:?}: {e}"));
                None
            }
        }
    }

    /// Each end's CPU counters now (the server's by a settings-only probe,
    /// when it told its settings).
    fn cpu_after(
        &self,
        remote_told: bool,
    ) -> (
        longhaul_proto::cpulimit::CpuLimits,
        Option<longhaul_proto::cpulimit::CpuLimits>,
    ) {
        let settings_only = ProbeRequest {
            export: self.export.into(),
            path: self.path.into(),
            tests: ProbeTests::default(),
            max_bytes: 0,
            max_files: 0,
            max_millis: 0,
            host: true,
            remove: None,
        };
        let local = cpu::cpu_limits();
        let remote = remote_told
            .then(|| probe(self.host, self.opts, settings_only).ok())
            .flatten()
            .and_then(|(p, _)| p.host?.cpu_limits);
        (local, remote)
    }
}

/// On a pull this host is the destination: its storage (`--dest`).
fn measure_local_dest(o: &DoctorOptions, notes: &mut Vec<String>) -> Option<DiskReport> {
    let Some(d) = &o.dest else {
        notes.push(
            "destination storage not measured: give --dest DIR (where the files will go)".into(),
        );
        return None;
    };
    let b = crate::bench::disk::DiskBench {
        file_size: 512 << 20,
        time_limit: Duration::from_secs(2),
        direct: false,
        like_transfer: true,
        read: false,
        ..crate::bench::disk::DiskBench::new(d.clone())
    };
    match crate::bench::disk::run(&b) {
        Ok(r) => Some(r),
        Err(e) => {
            notes.push(format!("destination storage: {e}"));
            None
        }
    }
}

/// A short real copy into a scratch directory on the export, sized for two
/// seconds at the slowest rate measured so far.
fn short_copy(
    r: &mut DoctorReport,
    host: &str,
    export: &str,
    dir: &str,
    opts: &ClientOptions,
    o: &DoctorOptions,
) {
    let mut best = r.upload.as_ref().map_or(1e9, |u| u.bits_per_second);
    for d in [&r.source_storage, &r.dest_storage].into_iter().flatten() {
        for s in [d.read, d.write].into_iter().flatten() {
            best = best.min(s.bytes_per_second * 8.0);
        }
    }
    let copy = ShortCopy {
        host,
        export,
        dir,
        source: o.source.as_deref(),
        rate_bps: best,
        time: o.perf_time,
    };
    match copy.run(opts) {
        Ok(c) => r.copy = Some(c),
        Err(e) => r.notes.push(format!("file-to-file copy: {e}")),
    }
}

/// Remembers what the path carried when the path itself was the limit
/// (what another stage allowed says nothing of the path): a later `cp`
/// to this server sizes its streams for it.
fn remember_path(r: &mut DoctorReport, file: &Path, host: &str, pull: bool) {
    let path_limited = r
        .stages
        .iter()
        .any(|s| s.name == Stage::PathRate && s.limiting);
    let run = if pull { &r.download } else { &r.upload };
    let (Some(run), Some(rtt_us), true) = (run, r.rtt_idle_us, path_limited) else {
        return;
    };
    let rec = crate::pathdb::PathRecord {
        host: crate::net::dial::host_key(host),
        direction: run.direction,
        bits_per_second: run.bits_per_second,
        rtt_us,
        measured_at: crate::pathdb::now(),
    };
    match crate::pathdb::remember(file, &rec) {
        Ok(()) => r.remembered = Some(rec),
        Err(e) => r.notes.push(format!(
            "could not remember the path's rate in {}: {e}",
            file.display()
        )),
    }
}

/// The longest the short copy may take beyond the `--time` it is sized for.
pub const COPY_GRACE: Duration = Duration::from_secs(4);

/// A one-second test with plaintext data streams (the control connection
/// stays TLS) like the TLS one of the transfer's direction; None where
/// the server refuses plaintext data (`serve --perf-tls-only`) or
/// predates it.
fn run_dir_plain(
    host: &str,
    opts: &ClientOptions,
    pull: &bool,
    upload: &Option<PathRun>,
    download: &Option<PathRun>,
) -> Option<PathRun> {
    let (mode, like) = if *pull {
        (Mode::Down, download)
    } else {
        (Mode::Up, upload)
    };
    let like = like.as_ref()?;
    // Where the server refuses it, the TLS figure less the cipher's cost
    // stands in.
    let params = TestParams {
        mode,
        streams: like.streams.max(1),
        duration_ms: Some(1000),
        interval_ms: 0,
        length: 1 << 20,
        data_tls: Some(false),
        ..TestParams::default()
    };
    let opts = ClientOptions {
        auto_streams: false,
        ..opts.clone()
    };
    let mut keep = Keep::default();
    let s = run_perf(host, &params, &opts, &mut keep).ok()?;
    if keep.data_encrypted != Some(false) {
        return None;
    }
    path_run(&s, &[], 1448)
}

/// The doctor's short real copy: `--source` (what the user will send) or,
/// without one, generated data, into a scratch directory under `dir` on
/// the export, which the server removes afterwards whatever happened.
struct ShortCopy<'a> {
    host: &'a str,
    export: &'a str,
    /// Within the export: the directory the probe measured.
    dir: &'a str,
    source: Option<&'a Path>,
    /// The slowest rate measured so far, to size generated data.
    rate_bps: f64,
    /// `--time`: the copy is sized for it and stopped a little after.
    time: Duration,
}

/// Removes a local directory when dropped.
struct LocalScratch(PathBuf);

impl Drop for LocalScratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl ShortCopy<'_> {
    fn run(&self, opts: &ClientOptions) -> Result<CopyRun, EngineError> {
        use crate::xfer::client::{cp, CpOptions};
        let name = format!("{DOCTOR_SCRATCH_PREFIX}{}", fastrand::u64(..));
        let mut _local = None;
        let source = match self.source {
            Some(s) => s.display().to_string(),
            None => {
                let (dir, file) = self.generate(&name)?;
                _local = Some(dir);
                file.display().to_string()
            }
        };
        let inside = [self.dir.trim_matches('/'), &name]
            .iter()
            .filter(|p| !p.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("/");
        let dest = crate::end::End::on_server(longhaul_proto::xfer::Remote {
            host: self.host.to_string(),
            export: self.export.to_string(),
            path: inside.clone(),
            dir: true,
        });
        let co = CpOptions {
            force: true,
            // Only the scratch directory itself is made: its parent is the
            // directory the probe found.
            mkpath: true,
            ..CpOptions::new(vec![crate::end::End::Local(source)], dest, opts.clone())
        };
        let progress = co.progress.clone();
        let stop = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let limit = self.time + COPY_GRACE;
        // Ended after the limit whatever the data's size: the rate so far
        // is the result then.
        let watchdog = {
            let (progress, stop) = (progress.clone(), stop.clone());
            std::thread::spawn(move || {
                let (done, cv) = &*stop;
                let guard = done.lock().expect("poisoned");
                let (guard, timeout) = cv
                    .wait_timeout_while(guard, limit, |d| !*d)
                    .expect("poisoned");
                if timeout.timed_out() && !*guard {
                    progress
                        .interrupt
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
            })
        };
        let started = Instant::now();
        let res = cp(&co);
        *stop.0.lock().expect("poisoned") = true;
        stop.1.notify_all();
        let _ = watchdog.join();
        let seconds = started.elapsed().as_secs_f64();
        // Remove the scratch directory whatever the copy did.
        let removed = probe(
            self.host,
            opts,
            ProbeRequest {
                export: self.export.into(),
                path: self.dir.into(),
                tests: ProbeTests::default(),
                max_bytes: 0,
                max_files: 0,
                max_millis: 0,
                host: false,
                remove: Some(name.clone()),
            },
        );
        if let Err(e) = removed {
            return Err(EngineError::Failed(format!(
                "the copy's scratch directory {}:/{inside} could not be removed ({e}): remove it by hand",
                self.export
            )));
        }
        let generated = self.source.is_none();
        if progress
            .interrupt
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            let bytes = progress.bytes.load(std::sync::atomic::Ordering::Relaxed);
            return Ok(CopyRun {
                bytes,
                seconds,
                bits_per_second: bytes as f64 * 8.0 / seconds.max(1e-9),
                generated,
                ..Default::default()
            });
        }
        let s = res?;
        Ok(CopyRun {
            bytes: s.bytes,
            seconds,
            bits_per_second: s.bits_per_second,
            streams: s.streams,
            source_read_bps: s.source_read_bps,
            dest_write_bps: s.dest_write_bps,
            cpu_stages: s.cpu_stages,
            generated,
        })
    }

    /// Writes `--time`'s worth of data at the slowest rate measured (16 MiB
    /// to 1 GiB) into a private local directory; returns it and the file.
    fn generate(&self, name: &str) -> Result<(LocalScratch, PathBuf), EngineError> {
        use std::os::unix::fs::DirBuilderExt;
        let secs = self.time.as_secs_f64().max(1.0);
        let size = ((self.rate_bps / 8.0 * secs) as u64).clamp(16 << 20, 1 << 30) >> 20 << 20;
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| EngineError::io(format!("creating {}", dir.display()), e))?;
        let guard = LocalScratch(dir.clone());
        let file = dir.join("data");
        let mut f = std::fs::File::create(&file)
            .map_err(|e| EngineError::io(format!("creating {}", file.display()), e))?;
        longhaul_proto::data::write_random(&mut f, size, fastrand::u64(..))
            .map_err(|e| EngineError::io(format!("writing {}", file.display()), e))?;
        Ok((guard, file))
    }
}

/// Fills in the findings, the stages and the verdict from the measurements
/// ([`doctor::judge`] holds the rules).
pub fn judge(r: &mut DoctorReport, o: &DoctorOptions) {
    let j = doctor::judge(&measured(r, o));
    r.rtt_loaded_us = j.rtt_loaded_us;
    r.target_bps = Some(j.target_bps);
    r.bdp_bytes = Some(j.bdp_bytes);
    r.findings = j.findings;
    r.stages = j.stages;
    r.verdict = j.verdict;
    if j.sender_cpu_per_gbps_tls.is_some() {
        r.sender_cpu_per_gbps_tls = j.sender_cpu_per_gbps_tls;
    }
    if j.sender_cpu_per_gbps_plain.is_some() {
        r.sender_cpu_per_gbps_plain = j.sender_cpu_per_gbps_plain;
    }
    r.notes.extend(j.notes);
}

/// The report's measurements in the terms of the rules, with the one fact
/// read here: whether this host's interface is a physical device (virtual
/// ones claim 10 Gbit/s whatever they carry).
fn measured(r: &DoctorReport, o: &DoctorOptions) -> doctor::Measured {
    let link_bps = r
        .local
        .link_mbps
        .filter(|_| {
            r.local
                .interface
                .as_deref()
                .is_some_and(|i| Path::new(&format!("/sys/class/net/{i}/device")).exists())
        })
        .map(|m| m as f64 * 1e6);
    let run = if o.pull { &r.download } else { &r.upload };
    let run = run.as_ref().map(|p| doctor::RunMeasured {
        streams: p.streams,
        bits_per_second: p.bits_per_second,
        loss_fraction: p.loss_fraction,
        rtt_loaded_us: p.rtt_loaded_us,
        cpu_sender_percent: p.cpu_sender_percent,
        cpu_receiver_percent: p.cpu_receiver_percent,
        limit: match p.limit {
            LimitKind::ReceiverWindow | LimitKind::SendBuffer => RunLimit::Window,
            LimitKind::SenderCpu => RunLimit::SenderCpu,
            LimitKind::ReceiverCpu => RunLimit::ReceiverCpu,
            _ => RunLimit::Other,
        },
        limit_detail: p.limit_detail.clone(),
        probe_loss: p.probe_loss,
        probe_packets: p.probe_packets,
    });
    let source = r.source_storage.as_ref();
    let dest = r.dest_storage.as_ref();
    doctor::Measured {
        local: r.local.clone(),
        remote: r.remote.clone(),
        pull: o.pull,
        rtt_idle_us: r.rtt_idle_us,
        path_mtu: r.path_mtu,
        target_bps: o.target_bps,
        link_bps,
        run,
        plain_bps: r.plain.as_ref().map(|p| p.bits_per_second),
        source_read: source
            .and_then(|d| Some((d.read.or(d.write)?.bytes_per_second, d.path.clone()))),
        dest_write: dest.and_then(|d| Some((d.write?.bytes_per_second, d.direct))),
        dest_creates_per_second: dest.and_then(|d| Some(d.create?.files_per_second)),
        mean_file_size: r.mean_file_size,
        mean_file_size_measured: r.mean_file_size_measured,
        copy: r.copy.as_ref().map(|c| doctor::CopyMeasured {
            bits_per_second: c.bits_per_second,
            source_read_bps: c.source_read_bps,
            dest_write_bps: c.dest_write_bps,
            cpu_stages: c.cpu_stages,
        }),
        local_cpu: r.local_cpu,
        remote_cpu: r.remote_cpu,
    }
}

/// The server's half of a probe: settings, and the storage benchmark in a
/// scratch directory under `dir` (already confined to the export).
pub fn serve_probe(
    dir: &Path,
    p: &ProbeRequest,
    peer: Option<IpAddr>,
) -> Result<ProbeResult, EngineError> {
    use longhaul_proto::disk::{PROBE_MAX_BYTES, PROBE_MAX_FILES, PROBE_MAX_MILLIS};
    if let Some(name) = &p.remove {
        if !name.starts_with(DOCTOR_SCRATCH_PREFIX) || name.contains('/') || name.contains("..") {
            return Err(EngineError::Usage(format!(
                "refusing to remove '{name}': only {DOCTOR_SCRATCH_PREFIX}* scratch directories"
            )));
        }
        let victim = dir.join(name);
        if victim.exists() {
            std::fs::remove_dir_all(&victim)
                .map_err(|e| EngineError::io(format!("removing {}", victim.display()), e))?;
        }
    }
    let mut report = DiskReport::default();
    let t = p.tests;
    let max_bytes = p.max_bytes.min(PROBE_MAX_BYTES);
    let time_limit = Duration::from_millis(p.max_millis.min(PROBE_MAX_MILLIS));
    if t.write || t.create {
        // What a transfer's sink does: a new file, buffered, allocated as
        // the sink allocates, synced at the end (in the time).
        let b = crate::bench::disk::DiskBench {
            file_size: max_bytes,
            threads: 1,
            direct: false,
            like_transfer: true,
            files: if t.create {
                p.max_files.min(PROBE_MAX_FILES)
            } else {
                0
            },
            time_limit,
            write: t.write,
            read: false,
            ..crate::bench::disk::DiskBench::new(dir.to_path_buf())
        };
        report = crate::bench::disk::run(&b)?;
    } else {
        let (filesystem, _) = crate::bench::disk::statfs(dir);
        report.filesystem = filesystem;
    }
    if t.read {
        // Reads what is there and writes nothing: a read probe must be
        // possible on a read-only export, and the files a pull will read
        // are the ones to measure.
        report.read =
            crate::bench::disk::read_existing(dir, max_bytes, time_limit).map_err(|e| {
                EngineError::io(format!("reading the files under {}", dir.display()), e)
            })?;
        if report.read.is_none() {
            report.warnings.push(
                "no files to read there: the source storage was not measured (point the doctor at the data to pull)"
                    .into(),
            );
        }
    }
    Ok(ProbeResult {
        report,
        host: p.host.then(|| host_settings(peer)),
        dir: None,
    })
}

/// The report's measurements reach the rules as they were taken; the rules
/// themselves are tested in [`longhaul_proto::doctor`].
#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_proto::disk::SeqResult;

    fn host(name: &str, cpus: u32) -> HostSettings {
        HostSettings {
            hostname: name.into(),
            kernel: "6.1".into(),
            cpus,
            cpus_usable: cpus,
            ..Default::default()
        }
    }

    /// A push whose memory-to-memory run carried 10 Gbit/s with the given
    /// CPU at each end, and a destination that wrote 3 GB/s in its probe.
    fn report(local: &str, remote: &str, send: f64, recv: f64) -> DoctorReport {
        DoctorReport {
            local: host(local, 2),
            remote: Some(host(remote, 2)),
            rtt_idle_us: Some(50),
            upload: Some(PathRun {
                direction: Direction::Up,
                streams: 4,
                bits_per_second: 1e10,
                rtt_loaded_us: 60,
                cpu_sender_percent: send,
                cpu_receiver_percent: recv,
                limit: LimitKind::Application,
                ..Default::default()
            }),
            dest_storage: Some(DiskReport {
                write: Some(SeqResult {
                    bytes: 3 << 30,
                    seconds: 1.0,
                    bytes_per_second: 3e9,
                }),
                ..Default::default()
            }),
            mean_file_size: DEFAULT_MEAN_FILE_SIZE,
            ..Default::default()
        }
    }

    fn ceiling(r: &DoctorReport, s: Stage) -> f64 {
        r.stages.iter().find(|x| x.name == s).unwrap().ceiling_bps
    }

    #[test]
    fn a_copy_far_below_the_verdict_names_the_stage_its_own_figures_show() {
        // The probe said 24 Gbit/s of writes; the copy moved 2.18 Gbit/s
        // with its destination writing at 2.5 Gbit/s while busy (87%).
        let mut r = report("a", "b", 60.0, 60.0);
        r.copy = Some(CopyRun {
            bytes: 1 << 29,
            seconds: 2.0,
            bits_per_second: 2.18e9,
            streams: 4,
            source_read_bps: 40e9,
            dest_write_bps: 2.5e9,
            generated: true,
            ..Default::default()
        });
        judge(&mut r, &DoctorOptions::default());
        let v = r.verdict.as_ref().unwrap();
        assert_eq!(v.stage, Stage::DestStorage, "{:?}", r.stages);
        assert_eq!(v.ceiling_bps, 2.5e9);
        assert!(
            r.notes
                .iter()
                .any(|n| n.contains("its own stages show dest_storage")),
            "{:?}",
            r.notes
        );
    }

    #[test]
    fn a_copy_with_no_busy_end_is_said_to_be_below_without_a_stage() {
        let mut r = report("a", "b", 60.0, 60.0);
        r.copy = Some(CopyRun {
            bits_per_second: 1e9,
            source_read_bps: 20e9,
            dest_write_bps: 20e9,
            ..Default::default()
        });
        judge(&mut r, &DoctorOptions::default());
        assert!(
            r.notes.iter().any(|n| n.contains("well below")),
            "{:?}",
            r.notes
        );
        assert_ne!(r.verdict.as_ref().unwrap().stage, Stage::DestStorage);
    }

    #[test]
    fn both_ends_on_one_host_count_their_cpu_together() {
        // 80% + 80% of 2 cores: each end alone could carry 25 Gbit/s, the
        // two together only 12.5.
        let mut apart = report("a", "b", 80.0, 80.0);
        judge(&mut apart, &DoctorOptions::default());
        assert_eq!(ceiling(&apart, Stage::SenderCpu), 2.5e10);
        let mut shared = report("a", "a", 80.0, 80.0);
        judge(&mut shared, &DoctorOptions::default());
        assert_eq!(ceiling(&shared, Stage::SenderCpu), 1.25e10);
        assert_eq!(ceiling(&shared, Stage::ReceiverCpu), 1.25e10);
        // 95% + 95%: both cores busy, so the CPU was seen limiting.
        let mut full = report("a", "a", 95.0, 95.0);
        judge(&mut full, &DoctorOptions::default());
        assert!(full
            .stages
            .iter()
            .any(|s| s.name == Stage::SenderCpu && s.limiting));
        assert!(
            matches!(
                full.verdict.as_ref().unwrap().stage,
                Stage::SenderCpu | Stage::ReceiverCpu
            ),
            "{:?}",
            full.stages
        );
    }

    #[test]
    fn the_runs_own_limit_reaches_the_rules() {
        for (kind, stage) in [
            (LimitKind::SendBuffer, Stage::Window),
            (LimitKind::ReceiverWindow, Stage::Window),
            (LimitKind::SenderCpu, Stage::SenderCpu),
            (LimitKind::ReceiverCpu, Stage::ReceiverCpu),
        ] {
            let mut r = report("a", "b", 60.0, 60.0);
            r.upload.as_mut().unwrap().limit = kind;
            // A path of 20 ms, whose windows the 10 Gbit/s carried fill: at
            // loopback's RTT a full window would be a receiver that did
            // not read (proto::doctor's `undrained`).
            r.rtt_idle_us = Some(20_000);
            judge(&mut r, &DoctorOptions::default());
            assert!(
                r.stages.iter().any(|s| s.name == stage && s.limiting),
                "{kind:?}: {:?}",
                r.stages
            );
        }
        // On a pull the download is the run judged.
        let mut r = report("a", "b", 60.0, 60.0);
        r.download = r.upload.take();
        judge(
            &mut r,
            &DoctorOptions {
                pull: true,
                ..Default::default()
            },
        );
        assert!(r.stages.iter().any(|s| s.name == Stage::PathRate));
    }

    #[test]
    fn an_assumed_file_size_never_makes_metadata_the_verdict() {
        let mut r = report("a", "b", 60.0, 60.0);
        if let Some(d) = r.dest_storage.as_mut() {
            d.create = Some(longhaul_proto::disk::FilesResult {
                files: 100,
                file_size: 16 << 10,
                seconds: 1.0,
                files_per_second: 100.0,
            });
        }
        judge(&mut r, &DoctorOptions::default());
        assert!(r.stages.iter().all(|s| s.name != Stage::Metadata));
        assert!(r.notes.iter().any(|n| n.contains("metadata not judged")));
        let mut measured = report("a", "b", 60.0, 60.0);
        measured.dest_storage = r.dest_storage.clone();
        measured.mean_file_size_measured = true;
        judge(&mut measured, &DoctorOptions::default());
        assert_eq!(measured.verdict.unwrap().stage, Stage::Metadata);
    }
}
