//! `longhaul`: the command-line front end. Parses arguments, runs the
//! engine, prints through a reporter, and maps failures to exit codes.

#[macro_use]
mod print;
mod exit;
mod output;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use longhaul_engine::net::dial::{ClientOptions, Security};
use longhaul_engine::net::tls::TrustOptions;
use longhaul_engine::perf::client::{run_perf, run_third_party};
use longhaul_engine::server::{ServeConfig, Server};
use longhaul_engine::sink::Reporter;
use longhaul_engine::xfer::client::CpOptions;
use longhaul_engine::{EngineError, DEFAULT_PORT};
use longhaul_proto::msg::{Mode, RecvMode, SendMode, TestParams, Transport};
use longhaul_proto::session::Limits;
use longhaul_proto::units;

#[derive(Parser)]
#[command(
    name = "longhaul",
    version,
    about = "Move data between sites as fast as the hardware allows, and say what limits it"
)]
struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the longhaul server (control and data on one port).
    Serve(ServeArgs),
    /// Memory-to-memory throughput test against a server (TCP or UDP).
    Perf(PerfArgs),
    /// Copy files and trees to or from a server: `cp SRC... HOST:EXPORT/path` (push)
    /// or `cp HOST:EXPORT/path... DIR` (pull).
    Cp(CpArgs),
    /// Make a destination tree match a source tree: send what differs (size and
    /// mtime, or content with --checksum), optionally delete what the source lacks.
    Sync(SyncArgs),
    /// List a remote directory: `ls HOST:EXPORT/path`.
    Ls(LsArgs),
    /// Start a server on loopback in this process and run a short test against it.
    Demo,
    /// Print the identity fingerprint kept in a state directory (made if missing).
    Id(IdArgs),
    /// Connect to a server, show its fingerprint and record it in the known-hosts file
    /// (trust on first use, as an explicit step).
    Trust(TrustArgs),
    /// Manage who may use a server: tokens and client-certificate grants.
    Token(TokenArgs),
    /// Emulated WAN between two network namespaces (delay, jitter, loss, rate, outages).
    Wan(WanArgs),
    /// Benchmarks: `bench disk PATH` measures a directory's storage.
    Bench(BenchArgs),
    /// Find what limits transfers: with no argument, audit this host's settings; with
    /// HOST:EXPORT/path (or longhaul://HOST/EXPORT/path), measure the whole path (RTT idle
    /// and loaded, memory to memory both ways, both hosts' settings and storage, a short
    /// copy) and name the stage that limits it, with the fix.
    Doctor(DoctorArgs),
}

#[derive(Args)]
struct DoctorArgs {
    /// `[SOURCE] REMOTE`, as for cp: the server and a writable place on it (HOST:EXPORT/path or
    /// longhaul://HOST[:PORT]/EXPORT/path), after what you will send if you name it here
    /// (the same as --source). A local path alone: audit this host with it as the source.
    #[arg(num_args = 0..=2, value_name = "[SOURCE] REMOTE")]
    targets: Vec<String>,
    /// What you will send (a file or a tree on this host): its storage is measured as the
    /// source, and its mean file size sizes the small-file (metadata) stage.
    #[arg(long)]
    source: Option<PathBuf>,
    /// Judge a pull (the server is the source, this host the destination).
    #[arg(long)]
    pull: bool,
    /// With --pull: a directory on this host's destination storage to measure.
    #[arg(long, requires = "pull")]
    dest: Option<PathBuf>,
    /// The path's rate, if known (judges the buffer settings against it), e.g. 10G.
    #[arg(long, value_parser = path_rate)]
    rate: Option<u64>,
    /// Seconds of each memory-to-memory test (one each way).
    #[arg(long, default_value = "3s", value_parser = duration)]
    time: Duration,
    /// Skip the short file-to-file copy.
    #[arg(long)]
    no_copy: bool,
    /// Do not remember the path's rate for later copies (by default, when the path itself
    /// limits, its rate is kept in $XDG_STATE_HOME/longhaul/paths.json, or LONGHAUL_PATHS,
    /// and `cp` to this server sizes its streams for it for a week while the RTT matches).
    #[arg(long)]
    no_remember: bool,
    #[arg(long)]
    json: bool,
    #[arg(long, default_value = "5s", value_parser = duration)]
    connect_timeout: Duration,
    #[command(flatten)]
    security: SecurityArgs,
}

#[derive(Args)]
struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Sequential write and read of one file (block size, threads, O_DIRECT or
    /// buffered), then small files created and read back as a transfer of many
    /// small files does. Everything made is removed again.
    Disk(DiskArgs),
}

#[derive(Args)]
struct DiskArgs {
    /// A directory on the storage to measure.
    path: PathBuf,
    /// Size of the sequential test file.
    #[arg(short, long, default_value = "1G", value_parser = size)]
    size: u64,
    /// Bytes per request.
    #[arg(long = "bs", default_value = "1M", value_parser = size)]
    block_size: u64,
    /// Threads for the sequential tests, each with one request in flight (the queue depth).
    #[arg(short, long, default_value_t = 1)]
    threads: usize,
    /// Go through the page cache (writes end with fdatasync; reads drop the cache first).
    /// Default: O_DIRECT where the file system takes it.
    #[arg(long)]
    buffered: bool,
    /// Small files to create and read back (0: none).
    #[arg(long, default_value_t = 2000)]
    files: u64,
    /// Size of each small file.
    #[arg(long, default_value = "16K", value_parser = size)]
    file_size: u64,
    /// Each test stops after this long even if it has not done its size.
    #[arg(long, default_value = "10s", value_parser = duration)]
    time: Duration,
    /// Only these sequential tests: `write`, `read` (read needs the write to make its file).
    #[arg(long, value_delimiter = ',', value_parser = ["write", "read"])]
    only: Vec<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct WanArgs {
    #[command(subcommand)]
    command: WanCommand,
}

#[derive(Subcommand)]
enum WanCommand {
    /// Make hosts `a` (198.18.0.1) and `b` (198.18.0.2) joined by an emulated link, and
    /// forward between them until Ctrl-C or SIGTERM, then remove everything (needs root).
    Up(WanUpArgs),
    /// Run a command in host `a` or `b`: `longhaul wan exec a -- CMD ARGS...`.
    Exec {
        host: String,
        #[arg(long, default_value = "lhwan")]
        name: String,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Change a running emulator's link (both directions) from now on; options as for `up`,
    /// only those given change.
    Set(WanSetArgs),
    /// Remove the hosts of an emulator whose forwarder is gone.
    Down {
        #[arg(long, default_value = "lhwan")]
        name: String,
    },
    /// Internal: started by `up`; when its stdin closes (the forwarder ended,
    /// even by SIGKILL) removes the namespaces that are still the ones `up` made.
    #[command(hide = true)]
    Reap {
        #[arg(long)]
        name: String,
        /// Inode numbers of the two namespaces `up` made.
        #[arg(long, num_args = 2)]
        inodes: Vec<u64>,
    },
}

#[derive(Args, serde::Serialize, serde::Deserialize, Default)]
struct WanSetArgs {
    #[arg(long, default_value = "lhwan")]
    #[serde(skip)]
    name: String,
    #[arg(long, value_parser = duration)]
    rtt: Option<Duration>,
    #[arg(long, value_parser = duration)]
    jitter: Option<Duration>,
    #[arg(long)]
    loss: Option<f64>,
    #[arg(long)]
    corrupt: Option<f64>,
    #[arg(long, value_parser = rate)]
    rate: Option<u64>,
    /// No rate limit any more.
    #[arg(long, conflicts_with = "rate")]
    no_rate: bool,
    #[arg(long, value_parser = duration)]
    queue: Option<Duration>,
}

impl WanSetArgs {
    /// `p` with the given changes.
    fn apply(
        &self,
        p: &mut longhaul_engine::wan::LinkParams,
        queue: &mut Duration,
    ) -> Result<(), String> {
        for (what, v) in [("loss", self.loss), ("corrupt", self.corrupt)] {
            if v.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
                return Err(format!("--{what} must be a probability (0 to 1)"));
            }
        }
        if let Some(r) = self.rtt {
            p.delay = r / 2;
        }
        if let Some(j) = self.jitter {
            p.jitter = j;
        }
        if let Some(l) = self.loss {
            p.loss = l;
        }
        if let Some(c) = self.corrupt {
            p.corrupt = c;
        }
        if self.rate.is_some() {
            p.rate_bps = self.rate;
        }
        if self.no_rate {
            p.rate_bps = None;
        }
        if let Some(q) = self.queue {
            *queue = q;
        }
        p.queue_for(*queue);
        Ok(())
    }
}

/// Starts `longhaul wan reap` with a pipe as its stdin; the pipe closes
/// when this process ends, however it ends.
fn spawn_reaper(
    names: &longhaul_engine::wan::net::Names,
    name: &str,
) -> Option<std::process::Child> {
    use longhaul_engine::wan::net::netns_inode;
    let (a, b) = (netns_inode(&names.ns_a)?, netns_inode(&names.ns_b)?);
    let exe = std::env::current_exe().ok()?;
    let child = std::process::Command::new(exe)
        .args(["wan", "reap", "--name", name, "--inodes"])
        .args([a.to_string(), b.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn();
    match child {
        Ok(c) => Some(c),
        Err(e) => {
            errln!("longhaul: warning: no cleanup should this process be killed: cannot start the reaper: {e}");
            None
        }
    }
}

/// Where a running emulator takes `wan set` requests.
fn wan_socket(name: &str) -> PathBuf {
    let dir = if std::path::Path::new("/run").is_dir() {
        PathBuf::from("/run/longhaul-wan")
    } else {
        std::env::temp_dir().join("longhaul-wan")
    };
    dir.join(format!("{name}.sock"))
}

#[derive(Args)]
struct WanUpArgs {
    /// Names the namespaces NAME-a and NAME-b (several emulators may run at once).
    #[arg(long, default_value = "lhwan")]
    name: String,
    /// Round-trip time: half of it is added in each direction.
    #[arg(long, value_parser = duration, default_value = "0ms")]
    rtt: Duration,
    /// Up to this much extra one-way delay per packet (uniform; no reordering).
    #[arg(long, value_parser = duration, default_value = "0ms")]
    jitter: Duration,
    /// Let jitter reorder packets.
    #[arg(long)]
    reorder: bool,
    /// Packet loss probability per direction, e.g. 1e-5.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Probability that a packet has one bit flipped.
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// Bottleneck rate per direction, e.g. 2gbit (default: none).
    #[arg(long, value_parser = rate)]
    rate: Option<u64>,
    /// Bottleneck queue (drop-tail) as time at the rate.
    #[arg(long, value_parser = duration, default_value = "50ms")]
    queue: Duration,
    /// MTU of the emulated link.
    #[arg(long, default_value_t = 65000)]
    mtu: u32,
    /// The link is down for DURATION from START after it comes up (repeatable), e.g. 5s+3s.
    #[arg(long, value_name = "START+DURATION")]
    outage: Vec<String>,
    /// Print the hosts as one JSON line: {"hosts":{"a":ADDR,"b":ADDR}}.
    #[arg(long)]
    json: bool,
}

/// `-P N` or `-P auto`.
#[derive(Clone, Copy)]
enum StreamCount {
    Fixed(u16),
    Auto,
}

impl StreamCount {
    /// The count before the path is measured (auto starts from the default).
    fn initial(self) -> u16 {
        match self {
            StreamCount::Fixed(n) => n,
            StreamCount::Auto => longhaul_proto::window::DEFAULT_STREAMS,
        }
    }
}

fn stream_count(s: &str) -> Result<StreamCount, String> {
    if s == "auto" {
        return Ok(StreamCount::Auto);
    }
    s.parse::<u16>()
        .map(StreamCount::Fixed)
        .map_err(|_| format!("'{s}' is not a stream count: give a number or `auto`"))
}

fn size(s: &str) -> Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}
/// `cp --rate`: a path's rate, at least 1 Mbit/s (each stream is paced to its share).
fn path_rate(s: &str) -> Result<u64, String> {
    match rate(s)? {
        r if r < 1_000_000 => Err(format!(
            "{s} is below 1 Mbit/s: give the path's rate, e.g. 10gbit"
        )),
        r => Ok(r),
    }
}
fn rate(s: &str) -> Result<u64, String> {
    units::parse_rate(s).map_err(|e| e.to_string())
}
fn send_mode(s: &str) -> Result<SendMode, String> {
    match s {
        "splice" => Ok(SendMode::Splice),
        "sendfile" => Ok(SendMode::Sendfile),
        "copy" => Ok(SendMode::Copy),
        _ => Err(format!(
            "unknown zero-copy mode '{s}': use splice, sendfile or copy"
        )),
    }
}
fn recv_mode(s: &str) -> Result<RecvMode, String> {
    match s {
        "discard" => Ok(RecvMode::Discard),
        "copy" => Ok(RecvMode::Copy),
        _ => Err(format!("unknown receive mode '{s}': use discard or copy")),
    }
}
fn duration(s: &str) -> Result<Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on, IPv4 or IPv6 (repeatable). `[::]:PORT` serves both families.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Vec<SocketAddr>,
    /// Directory for the server's identity and state (default: $XDG_STATE_HOME/longhaul).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Tests, transfers and probes running at once; more wait their turn
    /// in a queue (round robin between grants; anonymous clients together
    /// hold at most half the slots).
    #[arg(long, default_value_t = 16)]
    max_tests: usize,
    /// Requests waiting for a slot at once; more are refused as busy
    /// (default: 4 x --max-tests).
    #[arg(long, value_name = "N")]
    max_queued: Option<usize>,
    /// Rate cap per direction of an anonymous (--public-perf) test.
    #[arg(long, default_value = "1G", value_parser = rate)]
    public_max_rate: u64,
    /// Longest anonymous (--public-perf) test.
    #[arg(long, default_value = "30s", value_parser = duration)]
    public_max_time: Duration,
    /// Streams one test may ask for, per direction.
    #[arg(long, default_value_t = 128)]
    max_streams: u16,
    /// Longest test a client may ask for.
    #[arg(long, default_value = "1h", value_parser = duration)]
    max_duration: Duration,
    /// Connections open at once (each holds a thread).
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Connections open at once from one client address.
    #[arg(long, default_value_t = 300)]
    max_per_client: usize,
    /// Largest byte count (-n) one test may ask for.
    #[arg(long, default_value = "1P", value_parser = size)]
    max_bytes: u64,
    /// Memory for stream buffers one test may take (streams x buffer length).
    #[arg(long, default_value = "512M", value_parser = size)]
    max_buffer: u64,
    /// Offer a directory for transfers as NAME (repeatable); `:ro` refuses writes.
    #[arg(long, value_name = "NAME=PATH[:ro]", value_parser = longhaul_engine::xfer::parse_export)]
    export: Vec<longhaul_engine::xfer::Export>,
    /// Skip the fdatasync of each received file before it is renamed into place.
    #[arg(long)]
    no_sync: bool,
    /// Read and write file data with O_DIRECT (bypass the page cache) for every transfer.
    #[arg(long)]
    direct: bool,
    /// Also serve clients that ask for plaintext (--insecure-plaintext): no encryption.
    #[arg(long)]
    allow_plaintext: bool,
    /// Let clients without credentials run perf tests.
    #[arg(long)]
    public_perf: bool,
    /// Keep setuid, setgid and sticky bits and world-writable directories that clients
    /// send with -p (by default they are stripped).
    #[arg(long)]
    keep_special_modes: bool,
    /// A CA-issued certificate chain (PEM) instead of the self-signed identity.
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Refuse third-party requests (`longhaul perf THIS OTHER`).
    #[arg(long)]
    no_third_party: bool,
    /// Time a new connection has to complete its handshake.
    #[arg(long, default_value = "10s", value_parser = duration)]
    handshake_timeout: Duration,
    /// Time an idle control connection is kept.
    #[arg(long, default_value = "60s", value_parser = duration)]
    idle_timeout: Duration,
}

#[derive(Args)]
struct CpArgs {
    /// Sources, then the destination. Remote: HOST:EXPORT/path or longhaul://HOST[:PORT]/EXPORT/path.
    #[arg(required = true, num_args = 2.., value_name = "SRC... DST")]
    paths: Vec<String>,
    /// Copy directories and their contents.
    #[arg(short, long)]
    recursive: bool,
    /// Keep permission bits (modification times are always kept). Setuid, setgid and sticky
    /// bits and world-writable directories are stripped unless --keep-special-modes.
    #[arg(short, long)]
    preserve: bool,
    /// With -p on a pull: keep setuid, setgid and sticky bits and world-writable directories
    /// (a server keeps them only if started with --keep-special-modes).
    #[arg(long)]
    keep_special_modes: bool,
    /// Parallel data streams (default: sized for the path from the RTT and both hosts'
    /// socket-buffer caps, 4 to 32).
    #[arg(short = 'P', long, value_parser = clap::value_parser!(u16).range(1..))]
    streams: Option<u16>,
    /// Print a line per second (to stderr): rate, streams carrying chunks, retransmits,
    /// RTT and what limited it (window, send_buffer, congestion, application,
    /// storage_read, storage_write, files_in_flight).
    #[arg(long)]
    intervals: bool,
    /// Keep every stream carrying chunks: no online tuning (which parks streams the path
    /// does not need, by a hill-climb on goodput less retransmissions; -P also turns it off).
    #[arg(long)]
    no_tune: bool,
    /// Files announced to the destination and not yet finished, at most (default: sized
    /// for the path, at least 2048, and doubled online while it holds the transfer back,
    /// up to what the destination allows: a quarter of its open-file limit, 2048-32768).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    files_in_flight: Option<u64>,
    /// The path's rate if known, e.g. 10gbit: streams are sized for it (default 10 Gbit/s)
    /// and each is paced to its share (SO_MAX_PACING_RATE).
    #[arg(long, value_parser = path_rate)]
    rate: Option<u64>,
    /// Congestion control of the sending side (default: bbr where the sender has it).
    #[arg(long = "cc", value_name = "NAME")]
    congestion: Option<String>,
    /// Chunk size, e.g. 8M (default: chosen per file, 1-64 MiB).
    #[arg(long, value_parser = size)]
    chunk: Option<u64>,
    /// Send files even where the destination has the same size and mtime.
    #[arg(long)]
    force: bool,
    /// Create the destination's missing directories (without it, a destination whose
    /// directory does not exist is refused, as with cp and rsync).
    #[arg(long)]
    mkpath: bool,
    /// Connection attempts after the first before giving up (each resumes).
    #[arg(long, default_value_t = 3)]
    retries: u32,
    /// Write `DIGEST  PATH` for every file verified (BLAKE3 over its chunk hashes).
    #[arg(long, value_name = "FILE")]
    digests: Option<PathBuf>,
    /// Skip the fdatasync of each received file before it is renamed into place.
    #[arg(long)]
    no_sync: bool,
    /// Re-read every file at the destination after writing it and compare.
    #[arg(long)]
    verify: bool,
    /// Read and write file data with O_DIRECT on both ends (bypass the page cache).
    #[arg(long)]
    direct: bool,
    /// Print one JSON document at the end.
    #[arg(long)]
    json: bool,
    #[arg(long, default_value = "5s", value_parser = duration)]
    connect_timeout: Duration,
    #[command(flatten)]
    security: SecurityArgs,
}

#[derive(Args)]
struct SyncArgs {
    #[command(flatten)]
    cp: CpArgs,
    /// Compare file contents (BLAKE3) instead of size and modification time.
    #[arg(long)]
    checksum: bool,
    /// Delete destination files and directories the source does not have.
    #[arg(long)]
    delete: bool,
    /// Show what would be sent and deleted; change nothing.
    #[arg(short = 'n', long)]
    dry_run: bool,
}

#[derive(Args)]
struct LsArgs {
    /// HOST:EXPORT/path or longhaul://HOST[:PORT]/EXPORT/path
    target: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    security: SecurityArgs,
}

#[derive(Args)]
struct IdArgs {
    /// State directory of a server (default: $XDG_STATE_HOME/longhaul), or a client
    /// identity directory for --identity. Made with a new key if it holds none.
    dir: Option<PathBuf>,
}

#[derive(Args)]
struct TrustArgs {
    /// The server, HOST[:PORT].
    host: String,
    /// Accept only this fingerprint (as `longhaul id` printed it on the server).
    #[arg(long, value_name = "SHA256:...", value_parser = fingerprint_arg)]
    fingerprint: Option<String>,
    /// Replace an entry for this host that lists another fingerprint.
    #[arg(long)]
    replace: bool,
    /// Known-hosts file (default ~/.config/longhaul/known_hosts).
    #[arg(long, value_name = "FILE", env = "LONGHAUL_KNOWN_HOSTS")]
    known_hosts: Option<PathBuf>,
    #[arg(long, default_value = "5s", value_parser = duration)]
    connect_timeout: Duration,
}

#[derive(Args)]
struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Make a grant and print its token, once, alone on stdout (or, with --client-cert,
    /// authorize a client certificate instead).
    Create {
        /// The server's state directory (default: $XDG_STATE_HOME/longhaul).
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// An export the grant opens, NAME[:ro|rw] (read-only unless :rw; * for every export);
        /// repeatable.
        #[arg(long = "export", value_name = "NAME[:ro|rw]", required = true,
              value_parser = longhaul_engine::server::auth::parse_export_grant)]
        exports: Vec<longhaul_engine::server::auth::ExportGrant>,
        /// Grant a client certificate with this fingerprint (mutual TLS) instead of a token.
        #[arg(long, value_name = "SHA256:...", value_parser = fingerprint_arg)]
        client_cert: Option<String>,
        /// A note for `token list` (who it is for).
        #[arg(long, default_value = "")]
        note: String,
    },
    /// List grants (never the tokens, which are not stored).
    List {
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Revoke a grant by id; takes effect for the next connection.
    Revoke {
        id: String,
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
    },
}

#[derive(Args, Clone)]
struct PerfArgs {
    /// Server `HOST[:PORT]`; with two, the first server tests to the second (third-party mode).
    #[arg(required = true, num_args = 1..=2, value_name = "HOST[:PORT]")]
    hosts: Vec<String>,
    /// Server port, when HOST does not carry one.
    #[arg(short, long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Parallel streams (per direction), or `auto`: enough for the window each stream can
    /// have at the measured RTT under both hosts' buffer caps, for --pacing's rate if given
    /// (else 10 Gbit/s), 4 to 32.
    #[arg(short = 'P', long, default_value = "1", value_parser = stream_count)]
    streams: StreamCount,
    /// Test length (after --omit), e.g. 10, 30s, 2m.
    #[arg(short = 't', long = "time", value_parser = duration, conflicts_with = "bytes")]
    time: Option<Duration>,
    /// Bytes to send per direction instead of a time, e.g. 10G.
    #[arg(short = 'n', long, value_parser = size)]
    bytes: Option<u64>,
    /// Bytes per write (TCP) or per datagram (UDP). Default for TCP: 1M over
    /// the number of streams, at least 128K; for UDP 1472.
    #[arg(short = 'l', long, value_parser = size)]
    length: Option<u64>,
    /// Socket buffer (window) on both ends, e.g. 16M. Default: the kernel's autotuning.
    #[arg(short = 'w', long, value_parser = size)]
    window: Option<u64>,
    /// Congestion control on both ends (e.g. bbr, cubic).
    #[arg(short = 'C', long)]
    congestion: Option<String>,
    /// Pace the sender(s) to this total rate with SO_MAX_PACING_RATE, e.g. 2G.
    #[arg(long, value_parser = rate)]
    pacing: Option<u64>,
    /// TCP maximum segment size.
    #[arg(short = 'M', long)]
    mss: Option<u32>,
    /// Server sends, client receives.
    #[arg(short = 'R', long, conflicts_with = "bidir")]
    reverse: bool,
    /// Both directions at once.
    #[arg(long)]
    bidir: bool,
    /// Pin stream threads: local CPU, and optionally the server's (`-A 0,1`).
    #[arg(short = 'A', long, value_name = "N[,M]")]
    affinity: Option<String>,
    /// How senders hand data to the kernel: splice (default: vmsplice+splice,
    /// no copy), sendfile (from a memory file, like iperf3 -Z) or copy (write(2)).
    #[arg(long, value_name = "MODE", num_args = 0..=1, default_missing_value = "sendfile", value_parser = send_mode)]
    zerocopy: Option<SendMode>,
    /// Copy data in and out of the kernel with write(2) and read(2), as an
    /// application that touches its data would, instead of the default
    /// zero-copy send and discarding receive.
    #[arg(long, conflicts_with_all = ["zerocopy", "recv_mode"])]
    copy: bool,
    /// How receivers take data from the kernel: discard (default: recv with
    /// MSG_TRUNC, no copy) or copy (read(2) into a buffer).
    #[arg(long, value_name = "MODE", value_parser = recv_mode)]
    recv_mode: Option<RecvMode>,
    /// Seconds between interval reports; 0 for none.
    #[arg(short = 'i', long, default_value = "1", value_parser = duration)]
    interval: Duration,
    /// Leave out the first SECS (slow start) from the results.
    #[arg(long, value_parser = duration, default_value = "0")]
    omit: Duration,
    /// UDP instead of TCP.
    #[arg(short = 'u', long)]
    udp: bool,
    /// UDP rate in total per direction, e.g. 1G; 0 for unlimited. Default 1M.
    #[arg(short = 'b', long, value_parser = rate)]
    rate: Option<u64>,
    /// Print one JSON document at the end.
    #[arg(long, conflicts_with = "json_stream")]
    json: bool,
    /// Print one JSON object per line as events happen.
    #[arg(long)]
    json_stream: bool,
    /// Time to wait for the server to answer.
    #[arg(long, default_value = "5s", value_parser = duration)]
    connect_timeout: Duration,
    #[command(flatten)]
    security: SecurityArgs,
}

/// How a client secures its connections and proves who it is.
#[derive(Args, Clone)]
struct SecurityArgs {
    /// Trust the server presenting this certificate fingerprint (SHA256:..., as
    /// `longhaul id` prints it on the server); repeatable or comma-separated.
    #[arg(long, value_name = "SHA256:...", env = "LONGHAUL_TRUST", value_delimiter = ',',
          value_parser = fingerprint_arg)]
    trust: Vec<String>,
    /// Known-hosts file, filled by `longhaul trust HOST` (default ~/.config/longhaul/known_hosts).
    #[arg(long, value_name = "FILE", env = "LONGHAUL_KNOWN_HOSTS")]
    known_hosts: Option<PathBuf>,
    /// Trust servers whose certificate chains to a CA in this PEM file and names the host.
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Present the identity kept in DIR (see `longhaul id`) as a client certificate (mutual TLS).
    #[arg(long, value_name = "DIR")]
    identity: Option<PathBuf>,
    /// Read the access token from FILE (default: the LONGHAUL_TOKEN variable).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// No TLS: no encryption, no server authentication. Works only with a server started
    /// with --allow-plaintext; never chosen silently.
    #[arg(long)]
    insecure_plaintext: bool,
}

fn fingerprint_arg(s: &str) -> Result<String, String> {
    longhaul_engine::net::tls::parse_fingerprint(s)
}

impl SecurityArgs {
    fn trust_options(&self) -> Result<TrustOptions, Failure> {
        // An identity to present must exist: a new key made here would be
        // one no server has a grant for.
        let identity = match &self.identity {
            Some(dir) => {
                let file = dir.join(longhaul_engine::net::tls::IDENTITY_FILE);
                if !file.is_file() {
                    return Err(usage(format!(
                        "--identity {d}: no identity there ({f} is missing); make one with `longhaul id {d}` and have the server grant its fingerprint (`longhaul token create --client-cert`)",
                        d = dir.display(),
                        f = file.display()
                    )));
                }
                Some(
                    longhaul_engine::net::tls::Identity::load(&file, &file)
                        .map_err(Failure::from)?,
                )
            }
            None => None,
        };
        Ok(TrustOptions {
            pins: self.trust.clone(),
            known_hosts: self
                .known_hosts
                .clone()
                .or_else(longhaul_engine::state::default_known_hosts),
            ca: self.ca.clone(),
            identity,
            accept_any: false,
        })
    }

    fn security(&self) -> Result<Security, Failure> {
        let token = match &self.token_file {
            Some(p) => {
                let t = std::fs::read_to_string(p).map_err(|e| {
                    usage(format!("cannot read the token file {}: {e}", p.display()))
                })?;
                Some(t.trim().to_string())
            }
            None => std::env::var("LONGHAUL_TOKEN")
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()),
        };
        Ok(Security {
            plaintext: self.insecure_plaintext,
            trust: self.trust_options()?,
            token,
        })
    }
}

/// A failure with the exit code it maps to.
struct Failure {
    code: i32,
    message: String,
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        let code = match &e {
            EngineError::Usage(_) => exit::USAGE,
            EngineError::Connect(_) => exit::CONNECT,
            EngineError::Refused { .. } => exit::REFUSED,
            EngineError::Trust(_) => exit::UNTRUSTED,
            EngineError::Timeout(_) | EngineError::Failed(_) | EngineError::Closed(_) => {
                exit::FAILED
            }
            EngineError::Proto(_) => exit::FAILED,
            EngineError::Io { .. } => exit::FAILED,
            EngineError::Interrupted(_) => exit::INTERRUPTED,
        };
        Failure {
            code,
            message: format!("{e:#}"),
        }
    }
}

fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: exit::USAGE,
        message: message.into(),
    }
}

/// Raises the open-file limit to its hard maximum: a sink keeps up to
/// 2048 partial files open, and a server serves many clients.
fn raise_nofile_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let l = getrlimit(Resource::Nofile);
    // None is RLIM_INFINITY.
    if l.current.unwrap_or(u64::MAX) < l.maximum.unwrap_or(u64::MAX) {
        let _ = setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: l.maximum,
                ..l
            },
        );
    }
}

fn main() {
    let cli = Cli::parse();
    raise_nofile_limit();
    let filter = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| filter.into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, never into a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let code = match cli.command {
        Command::Serve(a) => serve(a),
        Command::Perf(a) => perf(a),
        Command::Cp(a) => cp(a, None, false),
        Command::Sync(a) => cp(
            CpArgs {
                recursive: true,
                ..a.cp
            },
            Some(longhaul_proto::xfer::SyncOptions {
                checksum: a.checksum,
                delete: a.delete,
            }),
            a.dry_run,
        ),
        Command::Ls(a) => ls(a),
        Command::Demo => demo(),
        Command::Id(a) => id(a),
        Command::Trust(a) => trust(a),
        Command::Token(a) => token(a),
        Command::Wan(a) => wan(a),
        Command::Doctor(a) => doctor(a),
        Command::Bench(a) => match a.command {
            BenchCommand::Disk(d) => bench_disk(d),
        },
    };
    leave(code)
}

/// Ends the process with `code`. Other threads may still run (data
/// streams in a TLS handshake when the server refused the request, say):
/// the C library's exit handlers would tear down the crypto library's
/// state under them, and a process that said "refused" could then die of
/// a signal instead of exiting with its code. So: our output flushed, then
/// `_exit`, without those handlers; nothing of ours needs them (every
/// temporary directory and emulator is removed before this point).
fn leave(code: i32) -> ! {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit has no preconditions; our buffers are flushed above.
    unsafe { libc::_exit(code) }
}

fn serve(a: ServeArgs) -> i32 {
    let listen = if a.listen.is_empty() {
        vec![SocketAddr::from(([0u16; 8], DEFAULT_PORT))]
    } else {
        a.listen
    };
    let cfg = ServeConfig {
        limits: Limits {
            max_streams: a.max_streams,
            max_duration: a.max_duration,
            max_bytes: a.max_bytes,
            max_buffer_bytes: a.max_buffer,
            allow_third_party: !a.no_third_party,
            handshake_timeout: a.handshake_timeout,
            idle_timeout: a.idle_timeout,
        },
        max_tests: a.max_tests,
        max_queued: a.max_queued.unwrap_or(a.max_tests.saturating_mul(4)),
        public_max_rate: a.public_max_rate,
        public_max_time: a.public_max_time,
        max_connections: a.max_connections,
        max_per_client: a.max_per_client,
        exports: a.export,
        sync_files: !a.no_sync,
        storage: if a.direct {
            std::sync::Arc::new(longhaul_engine::xfer::storage::Direct)
        } else {
            std::sync::Arc::new(longhaul_engine::xfer::storage::Local)
        },
        state_dir: match state_dir_or_default(a.state_dir) {
            Ok(d) => d,
            Err(e) => {
                let f = Failure::from(e);
                errln!("longhaul: error: {}", f.message);
                return f.code;
            }
        },
        tls: None,
        allow_plaintext: a.allow_plaintext,
        public_perf: a.public_perf,
        keep_special_modes: a.keep_special_modes,
        open_access: false,
    };
    let mut cfg = cfg;
    if let (Some(cert), Some(key)) = (&a.cert, &a.key) {
        match longhaul_engine::net::tls::Identity::load(cert, key)
            .and_then(|id| longhaul_engine::net::tls::server_config(&id).map(|c| (id, c)))
        {
            Ok((id, c)) => {
                errln!(
                    "longhaul: certificate {} ({})",
                    cert.display(),
                    id.fingerprint()
                );
                cfg.tls = Some(c);
            }
            Err(e) => {
                errln!("longhaul: error: {e}");
                return exit::USAGE;
            }
        }
    }
    // Only its owner may enter a new state directory: it holds the key and the grants.
    if let Err(e) =
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&cfg.state_dir)
    {
        errln!(
            "longhaul: error: cannot create state directory {}: {e} (choose another with --state-dir)",
            cfg.state_dir.display()
        );
        return exit::USAGE;
    }
    let state_dir = cfg.state_dir.clone();
    let server = match Server::bind(&listen, cfg) {
        Ok(s) => s,
        Err(e) => {
            let f = Failure::from(e);
            errln!("longhaul: error: {}", f.message);
            return f.code;
        }
    };
    for a in server.local_addrs() {
        errln!(
            "longhaul: serving on {a} (state in {})",
            state_dir.display()
        );
    }
    if let Some(fp) = server.fingerprint() {
        errln!("longhaul: identity {fp} (clients: longhaul trust HOST, or --trust {fp})");
    }
    server.run();
    exit::OK
}

fn parse_affinity(s: &str) -> Result<(Option<u32>, Option<u32>), Failure> {
    let bad = || {
        usage(format!(
            "invalid affinity '{s}': expected a CPU number, or LOCAL,REMOTE like 0,1"
        ))
    };
    let mut it = s.split(',');
    let local = it
        .next()
        .filter(|x| !x.is_empty())
        .map(|x| x.trim().parse().map_err(|_| bad()))
        .transpose()?;
    let remote = it
        .next()
        .map(|x| x.trim().parse().map_err(|_| bad()))
        .transpose()?;
    if it.next().is_some() {
        return Err(bad());
    }
    Ok((local, remote))
}

fn params_of(a: &PerfArgs) -> Result<(TestParams, Option<u32>), Failure> {
    let transport = if a.udp {
        Transport::Udp
    } else {
        Transport::Tcp
    };
    let directions = if a.bidir { 2 } else { 1 };
    let length = a.length.unwrap_or(match transport {
        Transport::Tcp => default_tcp_length(u32::from(a.streams.initial()) * directions),
        Transport::Udp => 1472,
    });
    let length =
        u32::try_from(length).map_err(|_| usage(format!("buffer length {length} is too large")))?;
    if let Some(t) = a.time {
        if t.is_zero() {
            return Err(usage("duration 0: give a positive test length, like -t 10"));
        }
    }
    if a.bytes == Some(0) {
        return Err(usage("byte count 0: give a positive size, like -n 1G"));
    }
    if a.streams.initial() == 0 {
        return Err(usage("0 streams: use -P 1 or more, or -P auto"));
    }
    let window = a
        .window
        .map(|w| u32::try_from(w).map_err(|_| usage(format!("window {w} bytes is larger than the kernel allows for any socket (1 GiB); use -w 1G or less"))))
        .transpose()?;
    if !a.udp && a.rate.is_some() {
        return Err(usage(
            "-b/--rate applies to UDP tests (-u); for TCP use --pacing",
        ));
    }
    let (local_cpu, server_cpu) = match &a.affinity {
        Some(s) => parse_affinity(s)?,
        None => (None, None),
    };
    let ms = |d: Duration| d.as_millis() as u64;
    let params = TestParams {
        transport,
        mode: if a.bidir {
            Mode::Bidir
        } else if a.reverse {
            Mode::Down
        } else {
            Mode::Up
        },
        streams: a.streams.initial(),
        duration_ms: match (a.time, a.bytes) {
            (_, Some(_)) => None,
            (Some(t), None) => Some(ms(t).max(1)),
            (None, None) => Some(10_000),
        },
        bytes: a.bytes,
        length,
        window,
        congestion: a.congestion.clone(),
        pacing_bps: a.pacing,
        mss: a.mss,
        server_cpu,
        send_mode: match (a.copy, a.zerocopy) {
            (true, _) => SendMode::Copy,
            (false, Some(m)) => m,
            (false, None) => SendMode::default(),
        },
        recv_mode: if a.copy {
            RecvMode::Copy
        } else {
            RecvMode::default()
        },
        interval_ms: ms(a.interval),
        omit_ms: ms(a.omit),
        udp_rate_bps: if a.udp {
            Some(a.rate.unwrap_or(1_000_000))
        } else {
            None
        },
    };
    Ok((params, local_cpu))
}

/// Default bytes per write: 1 MiB for one stream; with more streams the
/// buffers together stay near 1 MiB (at least 128 KiB each), so they stay in
/// cache. Measured on loopback: see BENCHMARKS.md.
fn default_tcp_length(streams: u32) -> u64 {
    ((1u64 << 20) / u64::from(streams.max(1))).max(128 << 10)
}

fn with_port(host: &str, port: u16) -> String {
    let has_port = host.starts_with('[') && host.contains("]:")
        || host
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok());
    if has_port {
        host.to_string()
    } else if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    let _ = ctrlc::set_handler(move || {
        if f.swap(true, Ordering::SeqCst) {
            leave(exit::INTERRUPTED);
        }
    });
    flag
}

fn perf(a: PerfArgs) -> i32 {
    let (params, local_cpu) = match params_of(&a) {
        Ok(p) => p,
        Err(f) => return report_failure(&a, None, f),
    };
    let security = match a.security.security() {
        Ok(s) => s,
        Err(f) => return report_failure(&a, None, f),
    };
    let opts = ClientOptions {
        connect_timeout: a.connect_timeout,
        local_cpu,
        interrupt: interrupt_flag(),
        security,
        auto_streams: matches!(a.streams, StreamCount::Auto),
        ..ClientOptions::default()
    };
    let hosts: Vec<String> = a.hosts.iter().map(|h| with_port(h, a.port)).collect();
    let mut human = output::Human::new(params.streams, params.mode);
    let mut doc = output::JsonDoc::default();
    let mut stream = output::JsonStream;
    let sink: &mut dyn Reporter = if a.json {
        &mut doc
    } else if a.json_stream {
        &mut stream
    } else {
        &mut human
    };
    let result = match hosts.as_slice() {
        [one] => run_perf(one, &params, &opts, sink),
        [from, to] => run_third_party(from, to, &params, &opts, sink),
        _ => unreachable!("clap allows one or two hosts"),
    };
    let interrupted = opts.interrupt.load(Ordering::SeqCst);
    match result {
        Ok(_) => {
            if a.json {
                doc.finish(None);
            }
            if interrupted {
                exit::INTERRUPTED
            } else {
                exit::OK
            }
        }
        Err(e) => report_failure(&a, Some(&doc), e.into()),
    }
}

fn report_failure(a: &PerfArgs, doc: Option<&output::JsonDoc>, f: Failure) -> i32 {
    if a.json {
        match doc {
            Some(d) => d.finish(Some((&f.message, f.code))),
            None => output::JsonDoc::default().finish(Some((&f.message, f.code))),
        }
    } else if a.json_stream {
        output::JsonStream::error(&f.message, f.code);
    }
    errln!("longhaul: error: {}", f.message);
    f.code
}

fn cp(a: CpArgs, sync: Option<longhaul_proto::xfer::SyncOptions>, dry_run: bool) -> i32 {
    let security = match a.security.security() {
        Ok(s) => s,
        Err(f) => {
            errln!("longhaul: error: {}", f.message);
            return f.code;
        }
    };
    let mut paths = a.paths.clone();
    let dest = paths.pop().expect("clap requires two paths");
    let interrupt = interrupt_flag();
    let opts = CpOptions {
        sources: paths,
        dest,
        recursive: a.recursive,
        preserve: a.preserve,
        streams: a.streams,
        rate: a.rate,
        congestion: a.congestion.clone(),
        chunk_size: a.chunk,
        force: a.force,
        mkpath: a.mkpath,
        keep_special_modes: a.keep_special_modes,
        retries: a.retries,
        sync_files: !a.no_sync,
        direct: a.direct,
        verify: a.verify,
        sync,
        dry_run,
        tune: !a.no_tune,
        files_in_flight: a.files_in_flight,
        path_memory: Some(longhaul_engine::state::default_pathdb_file()),
        digests_to: a.digests.clone(),
        progress: Arc::new(longhaul_engine::xfer::Progress {
            interrupt: interrupt.clone(),
            ..Default::default()
        }),
        client: ClientOptions {
            connect_timeout: a.connect_timeout,
            interrupt,
            security,
            ..ClientOptions::default()
        },
    };
    let bar = (!a.json && !a.intervals && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .then(|| progress_bar(opts.progress.clone()));
    let lines = a.intervals.then(|| interval_printer(opts.progress.clone()));
    let result = longhaul_engine::xfer::client::cp(&opts);
    for (done, t) in [bar, lines].into_iter().flatten() {
        done.store(true, Ordering::SeqCst);
        let _ = t.join();
    }
    match result {
        Ok(s) => {
            if a.json {
                let mut v = serde_json::to_value(&s).unwrap_or_default();
                v["format"] = "longhaul-cp".into();
                v["format_version"] = output::CP_JSON_FORMAT_VERSION.into();
                outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                outln!(
                    "{} files{}, {} in {:.2} s = {} ({} skipped as up to date, {} resumed, {} stream(s), {} attempt(s))",
                    s.files,
                    match s.links {
                        0 => String::new(),
                        n => format!(" and {n} link(s)"),
                    },
                    units::format_bytes(s.bytes),
                    s.seconds,
                    units::format_rate(s.bits_per_second),
                    s.skipped,
                    units::format_bytes(s.resumed_bytes),
                    s.streams,
                    s.attempts,
                );
                outln!(
                    "stages: source read {}, network {}, destination write {}",
                    units::format_rate(s.source_read_bps),
                    units::format_rate(s.network_bps),
                    units::format_rate(s.dest_write_bps)
                );
                if let Some(t) = &s.tuning {
                    outln!(
                        "tuning: {} stream(s){}; chunks of {}; up to {} files in flight{}",
                        t.final_streams,
                        if t.online {
                            format!(
                                " carrying chunks of {} open (online, {} step(s))",
                                t.initial_streams,
                                t.steps.len()
                            )
                        } else {
                            " (fixed)".into()
                        },
                        units::format_bytes(t.chunk_size),
                        t.files_in_flight,
                        if t.files_in_flight > t.initial_files_in_flight
                            && t.initial_files_in_flight > 0
                        {
                            format!(" (grown online from {})", t.initial_files_in_flight)
                        } else {
                            String::new()
                        },
                    );
                    if t.send_buffer > 0 {
                        outln!(
                            "send buffers: {} a stream{}",
                            units::format_bytes(t.send_buffer),
                            match t.send_buffer_raises {
                                0 => String::new(),
                                n => format!(" (raised online {n} time(s))"),
                            }
                        );
                    }
                }
                if let Some(l) = output::limit_shares(&s.intervals) {
                    outln!("limited by: {l}");
                }
                if let Some(p) = &s.path {
                    let w = &p.window;
                    outln!(
                        "path: RTT {:.1} ms; {} stream(s){}, {} in flight each (up to {} per stream), {}{}",
                        f64::from(w.rtt_us) / 1e3,
                        w.streams,
                        match (&p.remembered, w.auto_streams) {
                            (Some(r), _) => format!(
                                " sized for {} (doctor measured {})",
                                units::format_rate(w.target_bps as f64),
                                units::format_rate(r.bits_per_second)
                            ),
                            (None, true) => " sized for it".into(),
                            (None, false) => String::new(),
                        },
                        units::format_bytes(w.stream_window),
                        units::format_rate(w.stream_ceiling_bps),
                        p.congestion,
                        p.pacing.map_or(String::new(), |r| format!(
                            ", paced to {} each",
                            units::format_rate(r as f64 * 8.0)
                        )),
                    );
                }
                for w in &s.warnings {
                    errln!("longhaul: warning: {w}");
                }
                for p in &s.would_send {
                    outln!("would send: {p}");
                }
                if s.resent_changed > 0 {
                    errln!(
                        "longhaul: warning: {} file(s) changed while they were read and were sent again",
                        s.resent_changed
                    );
                }
                for p in &s.deleted {
                    outln!("{}: {p}", if dry_run { "would delete" } else { "deleted" });
                }
                for f in &s.failed {
                    errln!("longhaul: failed: {}: {}", f.path, f.error);
                }
                outln!(
                    "verified: {}",
                    if s.verified {
                        "every file, chunk by chunk (BLAKE3)"
                    } else {
                        "NO: some files failed"
                    }
                );
            }
            if s.failed.is_empty() {
                exit::OK
            } else {
                exit::PARTIAL
            }
        }
        Err(e) => {
            let f = Failure::from(e);
            if a.json {
                outln!(
                    "{}",
                    serde_json::json!({"format": "longhaul-cp", "format_version": output::CP_JSON_FORMAT_VERSION,
                        "error": {"message": f.message, "exit_code": f.code}})
                );
            }
            errln!("longhaul: error: {}", f.message);
            f.code
        }
    }
}

/// Draws a progress bar from the engine's counters until told to stop.
fn progress_bar(
    p: std::sync::Arc<longhaul_engine::xfer::Progress>,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let done = Arc::new(AtomicBool::new(false));
    let stop = done.clone();
    let t = std::thread::spawn(move || {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        while !stop.load(Ordering::SeqCst) {
            bar.set_length(p.announced_bytes.load(Ordering::Relaxed));
            bar.set_position(p.bytes.load(Ordering::Relaxed));
            let walking = if p.walk_done.load(Ordering::Relaxed) {
                ""
            } else {
                "+"
            };
            let limit = p
                .intervals
                .lock()
                .ok()
                .and_then(|i| i.last().cloned())
                .map(|i| {
                    format!(
                        ", {} stream(s), limited by {}",
                        i.active_streams,
                        i.limit.name()
                    )
                })
                .unwrap_or_default();
            bar.set_message(format!(
                "{}/{}{walking} files{limit}",
                p.files.load(Ordering::Relaxed),
                p.announced_files.load(Ordering::Relaxed)
            ));
            std::thread::sleep(Duration::from_millis(200));
        }
        bar.finish_and_clear();
    });
    (done, t)
}

/// Prints each interval of a transfer as it arrives (`cp --intervals`), to stderr.
fn interval_printer(
    p: std::sync::Arc<longhaul_engine::xfer::Progress>,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let done = Arc::new(AtomicBool::new(false));
    let stop = done.clone();
    let t = std::thread::spawn(move || {
        let mut shown = 0;
        loop {
            let finished = stop.load(Ordering::SeqCst);
            let new: Vec<_> = p
                .intervals
                .lock()
                .map(|i| i[shown.min(i.len())..].to_vec())
                .unwrap_or_default();
            for i in &new {
                errln!("{}", output::transfer_interval_line(i));
            }
            shown += new.len();
            if finished {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    (done, t)
}

fn ls(a: LsArgs) -> i32 {
    let opts = match a.security.security() {
        Ok(security) => ClientOptions {
            security,
            ..ClientOptions::default()
        },
        Err(f) => {
            errln!("longhaul: error: {}", f.message);
            return f.code;
        }
    };
    print_result(
        longhaul_engine::xfer::client::ls(&a.target, &opts),
        a.json,
        |entries| {
            for e in entries {
                let kind = match e.kind {
                    longhaul_proto::xfer::Kind::Dir => 'd',
                    longhaul_proto::xfer::Kind::Symlink => 'l',
                    longhaul_proto::xfer::Kind::File | longhaul_proto::xfer::Kind::DirEnd => '-',
                };
                outln!("{kind} {:04o} {:>14} {}", e.mode, e.size, e.name);
            }
        },
    )
}

fn doctor(a: DoctorArgs) -> i32 {
    use longhaul_engine::doctor;
    let is_remote = |t: &String| longhaul_proto::xfer::parse_remote(t).is_some();
    let (source, remote) = match a.targets.as_slice() {
        [] => (a.source.clone(), None),
        [one] if is_remote(one) => (a.source.clone(), Some(one.clone())),
        [one] => (Some(PathBuf::from(one)), None),
        [src, r] => (Some(PathBuf::from(src)), Some(r.clone())),
        _ => unreachable!("clap takes at most two"),
    };
    if a.source.is_some() && (a.targets.len() == 2 || a.targets.iter().any(|t| !is_remote(t))) {
        errln!("longhaul: error: name the source once: as the first argument or with --source");
        return exit::USAGE;
    }
    if let [first, _] = a.targets.as_slice() {
        if is_remote(first) {
            errln!(
                "longhaul: error: '{first}' is remote: doctor takes [SOURCE] REMOTE, the source on this host"
            );
            return exit::USAGE;
        }
    }
    if let Some(s) = &source {
        if let Err(e) = std::fs::symlink_metadata(s) {
            errln!(
                "longhaul: error: cannot read the source {}: {e}",
                s.display()
            );
            return exit::USAGE;
        }
    }
    let o = doctor::DoctorOptions {
        perf_time: a.time,
        source,
        pull: a.pull,
        target_bps: a.rate,
        no_copy: a.no_copy,
        dest: a.dest.clone(),
        remember: (!a.no_remember).then(longhaul_engine::state::default_pathdb_file),
    };
    let report = match &remote {
        None => Ok(doctor::local(&o)),
        Some(r) => {
            let Some(remote) = longhaul_proto::xfer::parse_remote(r) else {
                errln!(
                    "longhaul: error: '{r}' is not remote: name it HOST:EXPORT/path or longhaul://HOST/EXPORT/path"
                );
                return exit::USAGE;
            };
            let security = match a.security.security() {
                Ok(s) => s,
                Err(f) => {
                    errln!("longhaul: error: {}", f.message);
                    return f.code;
                }
            };
            let opts = ClientOptions {
                connect_timeout: a.connect_timeout,
                security,
                ..ClientOptions::default()
            };
            if !a.json {
                errln!(
                    "measuring the path to {} (about {} s)...",
                    remote.host,
                    (a.time.as_secs_f64() * 2.0 + 8.0).round()
                );
            }
            doctor::remote(&remote.host, &remote.export, &remote.path, &opts, &o)
        }
    };
    print_result(report, a.json, output::print_doctor)
}

/// Prints a command's result as JSON or for people; an error as its message
/// and exit code.
fn print_result<T: serde::Serialize>(
    r: Result<T, EngineError>,
    json: bool,
    human: impl Fn(&T),
) -> i32 {
    match r {
        Ok(r) => {
            if json {
                outln!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                human(&r);
            }
            exit::OK
        }
        Err(e) => {
            let f = Failure::from(e);
            errln!("longhaul: error: {}", f.message);
            f.code
        }
    }
}

fn bench_disk(a: DiskArgs) -> i32 {
    let only = |t: &str| a.only.is_empty() || a.only.iter().any(|o| o == t);
    let b = longhaul_engine::bench::disk::DiskBench {
        file_size: a.size,
        block_size: usize::try_from(a.block_size).unwrap_or(usize::MAX),
        threads: a.threads,
        direct: !a.buffered,
        files: a.files,
        small_file_size: a.file_size,
        time_limit: a.time,
        write: only("write"),
        read: only("read"),
        ..longhaul_engine::bench::disk::DiskBench::new(a.path)
    };
    print_result(
        longhaul_engine::bench::disk::run(&b),
        a.json,
        output::print_disk,
    )
}

fn demo() -> i32 {
    // A throw-away identity (the client pins it, as `--trust` would), an
    // export and a tree to copy into it.
    // A private directory (0700, a name nobody could plant first), removed
    // when the demo ends however it ends.
    let scratch = match tempfile::Builder::new().prefix("longhaul-demo-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            errln!(
                "longhaul: error: cannot make the demo's directory in {}: {e}",
                std::env::temp_dir().display()
            );
            return exit::INTERNAL;
        }
    };
    let state = scratch.path().to_path_buf();
    let (export_dir, tree) = (state.join("export"), state.join("run7"));
    if let Err(e) = demo_tree(&tree).and_then(|()| std::fs::create_dir_all(&export_dir)) {
        errln!(
            "longhaul: error: cannot make the demo's files in {}: {e}",
            state.display()
        );
        return exit::INTERNAL;
    }
    let export =
        match longhaul_engine::xfer::parse_export(&format!("demo={}", export_dir.display())) {
            Ok(e) => e,
            Err(e) => {
                errln!("longhaul: error: {e}");
                return exit::INTERNAL;
            }
        };
    let server = match Server::bind(
        &[SocketAddr::from(([127, 0, 0, 1], 0))],
        ServeConfig {
            state_dir: state.clone(),
            exports: vec![export],
            open_access: true,
            ..ServeConfig::default()
        },
    ) {
        Ok(s) => s.spawn(),
        Err(e) => {
            errln!("longhaul: error: {e}");
            return exit::INTERNAL;
        }
    };
    let addr = server.addr().to_string();
    let fp = server.fingerprint().unwrap_or_default();
    outln!("longhaul demo: server started in-process on {addr}, TLS 1.3, identity {fp}");
    let opts = ClientOptions {
        security: Security {
            trust: TrustOptions {
                pins: vec![fp],
                ..TrustOptions::default()
            },
            ..Security::default()
        },
        ..ClientOptions::default()
    };
    let mut code = exit::OK;
    for (title, params) in [
        (
            "TCP, 1 stream, 3 s",
            TestParams {
                duration_ms: Some(3000),
                ..TestParams::default()
            },
        ),
        (
            "TCP, 4 streams, reverse, 2 s",
            TestParams {
                duration_ms: Some(2000),
                streams: 4,
                mode: Mode::Down,
                ..TestParams::default()
            },
        ),
        (
            "UDP at 500 Mbit/s, 2 s",
            TestParams {
                transport: Transport::Udp,
                duration_ms: Some(2000),
                length: 1472,
                udp_rate_bps: Some(500_000_000),
                ..TestParams::default()
            },
        ),
    ] {
        outln!("\n== {title}: longhaul perf {addr} ==");
        let mut human = output::Human::new(params.streams, params.mode);
        if let Err(e) = run_perf(&addr, &params, &opts, &mut human) {
            let f = Failure::from(e);
            errln!("longhaul: error: {}", f.message);
            code = f.code;
        }
    }
    outln!("\n== cp -r: a 256 MiB file and 500 small ones, 4 streams, TLS ==");
    let cp = CpOptions::new(
        vec![tree.display().to_string()],
        format!("longhaul://{addr}/demo/"),
        opts.clone(),
    );
    match longhaul_engine::xfer::client::cp(&cp) {
        Ok(s) => outln!(
            "{} files, {} in {:.2} s = {}, {}, verified: {}\nstages: source read {}, network {}, destination write {}",
            s.files,
            units::format_bytes(s.bytes),
            s.seconds,
            units::format_rate(s.bits_per_second),
            s.encryption,
            s.verified,
            units::format_rate(s.source_read_bps),
            units::format_rate(s.network_bps),
            units::format_rate(s.dest_write_bps)
        ),
        Err(e) => {
            let f = Failure::from(e);
            errln!("longhaul: error: {}", f.message);
            code = f.code;
        }
    }
    server.shutdown();
    drop(scratch);
    code
}

/// The demo's tree: one 256 MiB file and 500 files of 1-64 KiB.
fn demo_tree(dir: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir.join("small"))?;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut big = std::io::BufWriter::new(std::fs::File::create(dir.join("big.bin"))?);
    for _ in 0..(256 << 20) / 8 {
        big.write_all(&next().to_le_bytes())?;
    }
    big.flush()?;
    for i in 0..500 {
        let len = 1024 + (next() % (63 * 1024)) as usize;
        let bytes: Vec<u8> = (0..len.div_ceil(8))
            .flat_map(|_| next().to_le_bytes())
            .collect();
        std::fs::write(
            dir.join("small").join(format!("f{i:03}.dat")),
            &bytes[..len],
        )?;
    }
    Ok(())
}

/// The directory given, else the default one; an error, not a shared
/// fallback such as /tmp, when HOME is unset.
fn state_dir_or_default(d: Option<PathBuf>) -> Result<PathBuf, EngineError> {
    d.map_or_else(longhaul_engine::state::state_dir_from_env, Ok)
}

fn id(a: IdArgs) -> i32 {
    // A mistyped directory must not get a new key: DIR has to exist. One
    // that exists and holds no identity gets one (a client identity for
    // --identity is made this way).
    let result = state_dir_or_default(a.dir).and_then(|dir| {
        if dir.is_dir() {
            return Ok(dir);
        }
        Err(EngineError::Usage(format!(
            "no state directory at {d}: start `longhaul serve --state-dir {d}` once, or check the path (for a client identity, make the directory first: mkdir {d})",
            d = dir.display()
        )))
    });
    let dir = match result {
        Ok(d) => d,
        Err(e) => {
            let f = Failure::from(e);
            errln!("longhaul: error: {}", f.message);
            return f.code;
        }
    };
    match longhaul_engine::net::tls::Identity::load_or_create(&dir) {
        Ok((id, created)) => {
            if created {
                errln!("longhaul: made a new identity in {}", dir.display());
            }
            outln!("{}", id.fingerprint());
            exit::OK
        }
        Err(e) => {
            let f = Failure::from(e);
            errln!("longhaul: error: {}", f.message);
            f.code
        }
    }
}

fn trust(a: TrustArgs) -> i32 {
    let Some(file) = a
        .known_hosts
        .clone()
        .or_else(longhaul_engine::state::default_known_hosts)
    else {
        errln!("longhaul: error: no known-hosts file: set HOME or pass --known-hosts FILE");
        return exit::USAGE;
    };
    let host = longhaul_engine::net::dial::host_key(&a.host);
    let result =
        longhaul_engine::net::dial::probe_fingerprint(&host, a.connect_timeout).and_then(|fp| {
            if let Some(want) = &a.fingerprint {
                if *want != fp {
                    return Err(EngineError::Trust(format!(
                        "{host} presents {fp}, not the expected {want}: not trusted"
                    )));
                }
            }
            let added = longhaul_engine::net::tls::add_known_host(&file, &host, &fp, a.replace)?;
            Ok((fp, added))
        });
    match result {
        Ok((fp, added)) => {
            outln!("{host} {fp}");
            if added {
                errln!("longhaul: added to {}", file.display());
            } else {
                errln!("longhaul: already in {}", file.display());
            }
            if a.fingerprint.is_none() {
                errln!(
                    "longhaul: compare it with `longhaul id` on the server; if it differs, remove the line from {}",
                    file.display()
                );
            }
            exit::OK
        }
        Err(e) => {
            let f = Failure::from(e);
            errln!("longhaul: error: {}", f.message);
            f.code
        }
    }
}

fn token(a: TokenArgs) -> i32 {
    use longhaul_engine::server::auth;
    let result = match a.command {
        TokenCommand::Create {
            state_dir,
            exports,
            client_cert,
            note,
        } => {
            let dir = match state_dir_or_default(state_dir) {
                Ok(d) => d,
                Err(e) => {
                    let f = Failure::from(e);
                    errln!("longhaul: error: {}", f.message);
                    return f.code;
                }
            };
            match client_cert {
                Some(fp) => auth::create_cert_grant(&dir, &fp, exports, &note).map(|g| {
                    errln!(
                        "longhaul: grant {} lets the client certificate {fp} in",
                        g.id
                    );
                }),
                None => auth::create_token(&dir, exports, &note).map(|(g, token)| {
                    errln!(
                        "longhaul: grant {} made; its token follows, shown this once (clients: --token-file FILE or LONGHAUL_TOKEN)",
                        g.id
                    );
                    outln!("{token}");
                }),
            }
        }
        TokenCommand::List { state_dir } => state_dir_or_default(state_dir)
            .and_then(|d| auth::list(&d))
            .map(|grants| {
                for g in grants {
                    let exports: Vec<String> = g
                        .exports
                        .iter()
                        .map(|e| format!("{}:{}", e.name, if e.write { "rw" } else { "ro" }))
                        .collect();
                    let how = match &g.client_cert {
                        Some(fp) => format!("client-cert {fp}"),
                        None => "token".to_string(),
                    };
                    outln!("{} {how} {} {}", g.id, exports.join(","), g.note);
                }
            }),
        TokenCommand::Revoke { id, state_dir } => {
            match state_dir_or_default(state_dir).and_then(|d| auth::revoke(&d, &id)) {
                Ok(true) => {
                    errln!("longhaul: grant {id} revoked");
                    Ok(())
                }
                Ok(false) => Err(EngineError::Usage(format!("no grant with id {id}"))),
                Err(e) => Err(e),
            }
        }
    };
    match result {
        Ok(()) => exit::OK,
        Err(e) => {
            let f = Failure::from(e);
            errln!("longhaul: error: {}", f.message);
            f.code
        }
    }
}

fn wan(a: WanArgs) -> i32 {
    use longhaul_engine::wan::{forward::Forwarder, net, LinkParams};
    let fail = |e: EngineError| {
        let f = Failure::from(e);
        errln!("longhaul: error: {}", f.message);
        f.code
    };
    match a.command {
        WanCommand::Exec {
            host,
            name,
            command,
        } => {
            let names = match net::Names::new(&name) {
                Ok(n) => n,
                Err(e) => return fail(e),
            };
            let Some(ns) = names.ns(&host) else {
                return fail(EngineError::Usage(format!(
                    "unknown host '{host}': the emulator's hosts are a and b"
                )));
            };
            use std::os::unix::process::CommandExt;
            let e = std::process::Command::new("ip")
                .args(["netns", "exec", ns])
                .args(&command)
                .exec();
            fail(EngineError::Usage(format!(
                "cannot run `ip netns exec {ns}`: {e}"
            )))
        }
        WanCommand::Set(s) => {
            use std::io::{BufRead, Write};
            let path = wan_socket(&s.name);
            let reply = std::os::unix::net::UnixStream::connect(&path)
                .and_then(|mut c| {
                    writeln!(c, "{}", serde_json::to_string(&s).unwrap_or_default())?;
                    let mut line = String::new();
                    std::io::BufReader::new(c).read_line(&mut line)?;
                    Ok(line)
                })
                .map_err(|e| {
                    EngineError::Usage(format!(
                        "no running emulator '{}' ({}: {e}); start one with `longhaul wan up`",
                        s.name,
                        path.display()
                    ))
                });
            match reply {
                Ok(l) if l.trim() == "ok" => exit::OK,
                Ok(l) => fail(EngineError::Usage(l.trim().to_string())),
                Err(e) => fail(e),
            }
        }
        WanCommand::Reap { name, inodes } => {
            // Out of the terminal's process group: a Ctrl-C meant for `up`
            // must not end the reaper before `up` has cleaned up.
            let _ = rustix::process::setsid();
            let mut sink = [0u8; 64];
            use std::io::Read as _;
            while !matches!(std::io::stdin().read(&mut sink), Ok(0) | Err(_)) {}
            let Ok(n) = net::Names::new(&name) else {
                return exit::USAGE;
            };
            for (ns, ino) in [&n.ns_a, &n.ns_b].into_iter().zip(inodes) {
                // Only the namespace `up` made: a new emulator of the same
                // name may have replaced it since.
                if net::netns_inode(ns) == Some(ino) {
                    let _ = net::ip(&["netns", "del", ns]);
                }
            }
            let _ = std::fs::remove_file(wan_socket(&name));
            exit::OK
        }
        WanCommand::Down { name } => match net::Names::new(&name) {
            Ok(n) => {
                let gone = [&n.ns_a, &n.ns_b]
                    .iter()
                    .filter(|ns| net::ip(&["netns", "del", ns]).is_ok())
                    .count();
                errln!("longhaul: removed {gone} namespace(s) of {name}");
                exit::OK
            }
            Err(e) => fail(e),
        },
        WanCommand::Up(u) => {
            let mut outages = Vec::new();
            for o in &u.outage {
                let parsed = o.split_once('+').and_then(|(s, d)| {
                    Some((
                        units::parse_duration(s).ok()?,
                        units::parse_duration(d).ok()?,
                    ))
                });
                match parsed {
                    Some((s, d)) => outages.push((s, s + d)),
                    None => {
                        return fail(EngineError::Usage(format!(
                            "invalid outage '{o}': expected START+DURATION, e.g. 5s+3s"
                        )))
                    }
                }
            }
            for (what, p) in [("loss", u.loss), ("corrupt", u.corrupt)] {
                if !(0.0..=1.0).contains(&p) {
                    return fail(EngineError::Usage(format!(
                        "--{what} {p} is not a probability (0 to 1)"
                    )));
                }
            }
            let mut p = LinkParams {
                delay: u.rtt / 2,
                jitter: u.jitter,
                reorder: u.reorder,
                loss: u.loss,
                corrupt: u.corrupt,
                rate_bps: u.rate,
                outages,
                ..LinkParams::default()
            };
            p.queue_for(u.queue);
            let names = match net::Names::new(&u.name) {
                Ok(n) => n,
                Err(e) => return fail(e),
            };
            let stop = interrupt_flag();
            let hosts = match net::Hosts::up(names, u.mtu) {
                Ok(h) => h,
                Err(e) => return fail(e),
            };
            // A reaper removes the hosts should this process die without
            // cleaning up (SIGKILL, a crash): it waits for its stdin to close.
            let _reaper = spawn_reaper(&hosts.names, &u.name);
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            let fwd = match Forwarder::start(&hosts, p.clone(), p.clone(), seed) {
                Ok(f) => Arc::new(f),
                Err(e) => return fail(e),
            };
            // `wan set` from other processes: one JSON line in, `ok` or an error out.
            let sock = wan_socket(&u.name);
            let _ = std::fs::create_dir_all(sock.parent().unwrap_or(std::path::Path::new("/")));
            let _ = std::fs::remove_file(&sock);
            match std::os::unix::net::UnixListener::bind(&sock) {
                Ok(l) => {
                    let (fwd, mut p, mut queue) = (fwd.clone(), p, u.queue);
                    std::thread::spawn(move || {
                        use std::io::{BufRead, Write};
                        for c in l.incoming().flatten() {
                            let mut line = String::new();
                            let mut r = std::io::BufReader::new(&c);
                            if r.read_line(&mut line).is_err() {
                                continue;
                            }
                            let answer = serde_json::from_str::<WanSetArgs>(&line)
                                .map_err(|e| format!("bad request: {e}"))
                                .and_then(|s| s.apply(&mut p, &mut queue))
                                .map(|()| fwd.set(p.clone(), p.clone()));
                            let mut w = &c;
                            let _ = match answer {
                                Ok(()) => writeln!(w, "ok"),
                                Err(e) => writeln!(w, "{e}"),
                            };
                        }
                    });
                }
                Err(e) => errln!(
                    "longhaul: warning: `wan set` will not reach this emulator: cannot listen on {}: {e}",
                    sock.display()
                ),
            }
            let (a, b) = (net::ADDR_A, net::ADDR_B);
            if u.json {
                outln!("{{\"hosts\":{{\"a\":\"{a}\",\"b\":\"{b}\"}}}}");
            } else {
                outln!(
                    "host a {a} (netns {}), host b {b} (netns {}); `longhaul wan exec a -- CMD` runs CMD in a; Ctrl-C ends",
                    hosts.names.ns_a, hosts.names.ns_b
                );
            }
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
            }
            fwd.stop();
            let [ab, ba] = fwd.stats();
            drop(hosts);
            drop(fwd);
            let _ = std::fs::remove_file(&sock);
            errln!(
                "longhaul: link down. a->b: {} packets, {} lost, {} queue drops, {} outage drops; b->a: {} packets, {} lost, {} queue drops, {} outage drops",
                ab.packets, ab.lost, ab.queue_drops, ab.outage_drops,
                ba.packets, ba.lost, ba.queue_drops, ba.outage_drops
            );
            exit::OK
        }
    }
}
