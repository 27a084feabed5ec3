//! The command line: clap's types for every command and the parsers of
//! their values (sizes, rates, durations). Nothing here runs anything.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use longhaul_engine::DEFAULT_PORT;
use longhaul_proto::msg::{RecvMode, SendMode};
use longhaul_proto::units;

use crate::print::FormatUnit;

#[derive(Parser)]
#[command(
    name = "longhaul",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("LONGHAUL_BUILD_COMMIT"), ")"),
    long_version = concat!(
        env!("CARGO_PKG_VERSION"),
        "\ncommit: ",
        env!("LONGHAUL_BUILD_COMMIT"),
        "\nfeatures: ",
        env!("LONGHAUL_BUILD_FEATURES"),
        "\ntarget: ",
        env!("LONGHAUL_BUILD_TARGET")
    ),
    about = "Move data between sites as fast as the hardware allows, and say what limits it"
)]
pub struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(flatten)]
    pub archive: ArchiveArgs,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// `-q` on cp or sync: errors only.
    pub fn quiet(&self) -> bool {
        match &self.command {
            Command::Cp(a) => a.quiet,
            Command::Sync(a) => a.cp.quiet,
            _ => false,
        }
    }
}

/// The command line, or the end of the process: clap's error, or, for an
/// iperf3 option `perf` does not take, one that names what does the same
/// here ([`IPERF3_ONLY`]).
pub fn parse() -> Cli {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            if let Some(hint) = iperf3_hint(&argv, &e) {
                crate::print::error(&hint);
                crate::leave(crate::exit::USAGE);
            }
            e.exit()
        }
    }
}

/// iperf3's options that `perf` lacks, with what to use instead.
pub const IPERF3_ONLY: &[(&[&str], &str)] = &[
    (
        &["-k", "--blockcount"],
        "give the test's length as bytes (-n 10G) or time (-t 10)",
    ),
    (
        &["--cport"],
        "the client's ports are the kernel's; -B ADDR picks the local address",
    ),
    (&["--bind-dev"], "-B ADDR with an address of that interface"),
    (&["-V"], "-v (more log output; -vv for debug)"),
    (&["-d", "--debug"], "-vv (debug log output)"),
    (
        &["-T", "--title"],
        "every run is archived with its command line: `longhaul history`, `longhaul show N`",
    ),
    (
        &["--timestamps"],
        "--json-stream (each line carries its time) or the archive: `longhaul show N`",
    ),
    (
        &["--forceflush"],
        "every line is written out as it is printed already",
    ),
    (
        &["--get-server-output"],
        "the report has both ends already (-J for all of it)",
    ),
    (
        &["-D", "--daemon", "-1", "--one-off", "-I", "--pidfile"],
        "the server is `longhaul serve` (a systemd unit is in dist/)",
    ),
    (
        &["-F", "--file"],
        "files go with `longhaul cp` (memory to memory is perf)",
    ),
    (
        &["--fq-rate"],
        "--pacing RATE (SO_MAX_PACING_RATE on each sender)",
    ),
    (
        &["--skip-rx-copy"],
        "receiving without a copy is the default (--recv-mode discard)",
    ),
    (
        &["-N", "--no-delay"],
        "not offered: the streams carry bulk data",
    ),
    (
        &["-S", "--tos", "--dscp"],
        "not offered: longhaul does not mark its packets",
    ),
    (&["-L", "--flowlabel"], "not offered"),
    (
        &["--sctp", "--nstreams", "-X", "--xbind", "-m", "--mptcp"],
        "TCP and UDP only (-u)",
    ),
    (
        &["--username", "--rsa-public-key-path"],
        "--token-file FILE or --identity DIR (docs/SECURITY.md)",
    ),
    (
        &[
            "--extra-data",
            "--repeating-payload",
            "--udp-counters-64bit",
            "--dont-fragment",
            "--cntl-ka",
            "--rcv-timeout",
            "--snd-timeout",
        ],
        "not offered",
    ),
];

/// For a `perf` command line clap refused over an argument iperf3 knows:
/// what to say instead of clap's error.
fn iperf3_hint(argv: &[std::ffi::OsString], e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    if argv
        .iter()
        .skip(1)
        .find(|a| !a.to_string_lossy().starts_with('-'))
        .is_none_or(|a| a != "perf")
    {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let name = arg.split('=').next().unwrap_or(arg);
    IPERF3_ONLY
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map(|(_, hint)| format!("perf takes no {name} (iperf3's option): {hint}"))
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the longhaul server (control and data on one port).
    Serve(ServeArgs),
    /// Memory-to-memory throughput test against a server (TCP or UDP).
    Perf(PerfArgs),
    /// Copy files and trees to or from a host over ssh (`cp SRC... [USER@]HOST:path`, `cp
    /// HOST:path... DIR`) or a server (`longhaul://HOST[:PORT]/EXPORT/path`).
    #[command(override_usage = "longhaul cp [OPTIONS] SRC... DST")]
    Cp(CpArgs),
    /// Make a destination tree match a source tree: send what differs (size and
    /// mtime, or content with --checksum), optionally delete what the source lacks.
    #[command(override_usage = "longhaul sync [OPTIONS] SRC... DST")]
    Sync(SyncArgs),
    /// List a remote directory: `ls HOST:path` (ssh) or `ls longhaul://HOST/EXPORT/path`.
    Ls(LsArgs),
    /// Submit a copy or sync to a server that runs it to the end unattended (through
    /// disconnects, restarts and failures, retried, each file's state kept): prints the job's
    /// id and exits at once. The source's server runs it unless --via names another.
    #[command(override_usage = "longhaul submit [OPTIONS] SRC... DST")]
    Submit(SubmitArgs),
    /// Your jobs on a server (--via HOST[:PORT]): list them, or `show`, `wait` for,
    /// `cancel` or `retry` one.
    Jobs(JobsArgs),
    /// Start a server on loopback in this process and run a short test against it.
    Demo,
    /// Print the identity fingerprint kept in a state directory (one that holds none gets a
    /// new one; a directory that does not exist is refused, never made).
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
    /// Find what limits transfers: with no argument, audit this host's settings; with a
    /// place on a server (longhaul://HOST[:PORT]/EXPORT/path) or on a host over ssh
    /// ([USER@]HOST:path), measure the whole path (RTT idle and loaded, memory to memory
    /// both ways, both hosts' settings and storage, a short copy) and name the stage that
    /// limits it, with the fix.
    Doctor(DoctorArgs),
    /// The archived runs, newest first (every perf, cp, sync, doctor, bench disk and matrix
    /// run is archived unless --no-archive).
    History(HistoryArgs),
    /// One archived run whole: parameters, summary, intervals, files.
    Show(ShowArgs),
    /// Which runs moved this file (a path, source or destination) or these bytes
    /// (a BLAKE3 digest as `--digests` writes it), where to, when, and verified or not.
    Where(WhereArgs),
    /// A web page of the live runs, the history and each run's graphs, served
    /// from this binary (loopback by default).
    Dashboard(DashboardArgs),
    /// Draw a run's intervals (per stream and total, retransmits, RTT, each
    /// interval's limit), or a matrix run's cells (tools by paths, a panel per workload),
    /// to an SVG or PNG file.
    Plot(PlotArgs),
    /// Print a shell completion script: `longhaul completions bash >
    /// /etc/bash_completion.d/longhaul` (or zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Print the manual page (roff), or write one page per command into a
    /// directory: `longhaul man | man -l -`, `longhaul man --out /usr/local/share/man/man1`.
    Man(ManArgs),
    /// The data transfer test matrix: every installed tool (longhaul and its peers, at their
    /// defaults and best settings) by path (loopback, emulated WANs) by workload, put and get,
    /// each cell the median of N runs with its spread, CPU seconds and a check of the data.
    Matrix(MatrixArgs),
}

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Args)]
pub struct ManArgs {
    /// Write `longhaul.1` and a page per command (`longhaul-cp.1`, ...)
    /// into this directory instead of printing the main page.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Where runs are archived (every command).
#[derive(Args, Clone, Default)]
pub struct ArchiveArgs {
    /// The archive file (default: $XDG_DATA_HOME/longhaul/archive.db).
    #[arg(long, global = true, value_name = "FILE", env = "LONGHAUL_ARCHIVE")]
    pub archive: Option<PathBuf>,
    /// Do not archive this run.
    #[arg(long, global = true)]
    pub no_archive: bool,
}

#[derive(Args)]
pub struct HistoryArgs {
    /// Only runs of this kind: perf, cp, sync, doctor, bench-disk, served, matrix, job.
    #[arg(long)]
    pub kind: Option<String>,
    /// Only runs with this remote host (a part of its name is enough).
    #[arg(long)]
    pub host: Option<String>,
    /// Only runs started since: a duration ago with its unit (`90s`, `30m`, `2h`, `7d`, `2w`)
    /// or a UTC date (`2026-11-23`) or date and time (`2026-11-23T08:00:00Z`); a bare number is refused.
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Only runs to or from this export.
    #[arg(long)]
    pub export: Option<String>,
    /// At most this many runs (0: all).
    #[arg(short = 'n', long, default_value_t = 50)]
    pub limit: usize,
    /// One JSON document (docs/JSON.md, `longhaul-history`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ShowArgs {
    /// The run: its number, or `last`.
    pub run: String,
    /// Every file of a cp or sync (default: the first 20).
    #[arg(long)]
    pub all_files: bool,
    /// One JSON document (docs/JSON.md, `longhaul-show`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct WhereArgs {
    /// A file's path (as a source or a destination), or a BLAKE3 digest or
    /// a prefix of one (8 or more hex digits naming one digest).
    pub what: String,
    /// One JSON document (docs/JSON.md, `longhaul-where`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DashboardArgs {
    /// Address to serve the page on. Anything but loopback needs --token-file.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:5380")]
    pub listen: SocketAddr,
    /// A file holding the token the page asks for (needed off loopback).
    /// Without it a random token is made and printed once, in the address
    /// to open.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve without a token (loopback only): every account on this host
    /// can then read every run, path and host in the archive.
    #[arg(long, conflicts_with = "token_file")]
    pub open: bool,
}

#[derive(Args)]
pub struct PlotArgs {
    /// The run: its number, or `last`.
    pub run: String,
    /// The file to write: `.svg` or `.png`.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Run the one-shot server that `longhaul cp HOST:path` starts over ssh (internal).
    #[arg(long, hide = true)]
    pub one_shot: bool,
    /// With --one-shot: control sessions its one secret admits, N or `open` (internal;
    /// doctor's stages, a fleet's ranks).
    #[arg(long, hide = true, requires = "one_shot", value_name = "N|open")]
    pub sessions: Option<longhaul_engine::server::oneshot::Admits>,
    /// Address to listen on, IPv4 or IPv6 (repeatable). `[::]:PORT` serves both families.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Vec<SocketAddr>,
    /// Directory for the server's identity and state (default: $XDG_STATE_HOME/longhaul).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Tests, transfers and probes running at once; more wait their turn
    /// in a queue (round robin between grants; anonymous clients together
    /// hold at most half the slots).
    #[arg(long, default_value_t = 16)]
    pub max_tests: usize,
    /// Requests waiting for a slot at once; more are refused as busy
    /// (default: 4 x --max-tests).
    #[arg(long, value_name = "N")]
    pub max_queued: Option<usize>,
    /// Rate cap per direction of an anonymous (--public-perf) test.
    #[arg(long, default_value = "1G", value_parser = rate)]
    pub public_max_rate: u64,
    /// Longest anonymous (--public-perf) test.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub public_max_time: Duration,
    /// Streams one test may ask for, per direction.
    #[arg(long, default_value_t = 128)]
    pub max_streams: u16,
    /// Longest test a client may ask for.
    #[arg(long, default_value = "1h", value_parser = duration)]
    pub max_duration: Duration,
    /// Connections open at once (each holds a thread).
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Connections open at once from one client address.
    #[arg(long, default_value_t = 300)]
    pub max_per_client: usize,
    /// Largest byte count (-n) one test may ask for.
    #[arg(long, default_value = "1P", value_parser = size)]
    pub max_bytes: u64,
    /// Memory for stream buffers one test may take (streams x buffer length).
    #[arg(long, default_value = "512M", value_parser = size)]
    pub max_buffer: u64,
    /// Offer a directory for transfers as NAME (repeatable); `:ro` refuses writes;
    /// `:ro:public` also lets clients without credentials read and list it.
    #[arg(long, value_name = "NAME=PATH[:ro][:public]", value_parser = longhaul_engine::xfer::parse_export)]
    pub export: Vec<longhaul_engine::xfer::Export>,
    /// Skip the fdatasync of each received file before it is renamed into place.
    #[arg(long)]
    pub no_sync: bool,
    /// Read and write file data with O_DIRECT (bypass the page cache) for every transfer.
    #[arg(long)]
    pub direct: bool,
    /// Also serve clients that ask for plaintext (--insecure-plaintext): no encryption.
    #[arg(long)]
    pub allow_plaintext: bool,
    /// Let clients without credentials run perf tests.
    #[arg(long)]
    pub public_perf: bool,
    /// Refuse perf tests whose data would cross the network unencrypted: plaintext TCP data
    /// streams (perf's default; clients must use `perf --tls`) and UDP tests.
    #[arg(long)]
    pub perf_tls_only: bool,
    /// Keep setuid, setgid and sticky bits and world-writable directories that clients
    /// send with -p (by default they are stripped).
    #[arg(long)]
    pub keep_special_modes: bool,
    /// A CA-issued certificate chain (PEM) instead of the self-signed identity.
    #[arg(long, value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long, value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Refuse third-party requests (`longhaul perf THIS OTHER`).
    #[arg(long)]
    pub no_third_party: bool,
    /// Take part in third-party copies (`longhaul cp A:src B:dst` with
    /// both ends servers): grant an authenticated writer a capability for
    /// one push into its destination, and push to another server on an
    /// authenticated reader's order. Off by default (docs/SECURITY.md).
    #[arg(long)]
    pub third_party_copies: bool,
    /// Time a new connection has to complete its handshake.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub handshake_timeout: Duration,
    /// Time an idle control connection is kept.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub idle_timeout: Duration,
    /// Serve Prometheus metrics (GET /metrics) on this address: bytes and files moved,
    /// transfers, tests, refusals and errors by export and grant (docs/METRICS.md). Port 0
    /// picks a free port. An address off loopback is allowed: the metrics carry no
    /// credentials, but they do show export and grant names and traffic to whoever can
    /// reach the port, so firewall it.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// A name by which Prometheus reaches the metrics (repeatable): the
    /// endpoint answers only to requests naming an IP address, localhost,
    /// or one of these, so that no web page can read it by rebinding its
    /// own name to this host (docs/METRICS.md).
    #[arg(long, value_name = "NAME", requires = "metrics")]
    pub metrics_host: Vec<String>,
    /// Also answer stock iperf3 3.x clients (`iperf3 -c`) on [ADDR:]PORT (a port alone: all
    /// addresses), several tests at once. iperf3 tests are unauthenticated and unencrypted, so
    /// this is off unless given, and held to the --iperf3-max-* caps (docs/SECURITY.md).
    #[arg(long, value_name = "[ADDR:]PORT", value_parser = iperf3_listen)]
    pub iperf3: Option<SocketAddr>,
    /// iperf3 tests at once; the next client is told the server is busy (iperf3's own error).
    #[arg(long, default_value_t = 4, requires = "iperf3")]
    pub iperf3_max_tests: usize,
    /// Longest iperf3 test (omitted plus measured time); longer ones are refused.
    #[arg(long, default_value = "60s", value_parser = duration, requires = "iperf3")]
    pub iperf3_max_time: Duration,
    /// Most bit/s one iperf3 test may move in all (default: no cap). With a cap, clients (TCP or
    /// UDP) must ask for a rate (iperf3 -b, per stream) within it or are refused, never capped;
    /// a test that moves 1.25 times it is ended.
    #[arg(long, value_parser = rate, requires = "iperf3")]
    pub iperf3_max_rate: Option<u64>,
    /// Streams per direction of one iperf3 test.
    #[arg(long, default_value_t = 16, requires = "iperf3")]
    pub iperf3_max_streams: u16,
    /// Take jobs (`longhaul submit`) and run them to the end: kept in the state
    /// directory's jobs.db (SQLite), or, with a URL, in a PostgreSQL database that a group
    /// of servers shares (each leases jobs, heartbeats, and takes over a dead server's).
    #[arg(long, value_name = "postgres://...", num_args = 0..=1, default_missing_value = "")]
    pub jobs: Option<String>,
    /// With --jobs: attempts running at once.
    #[arg(long, default_value_t = 4, requires = "jobs", value_parser = clap::value_parser!(u64).range(1..=256))]
    pub jobs_workers: u64,
    /// With --jobs: jobs one grant may have that have not ended (and ended
    /// ones it keeps: older ones are forgotten).
    #[arg(long, default_value_t = 100, requires = "jobs")]
    pub jobs_max_per_grant: u64,
    /// With --jobs: the shortest interval of a recurring job (submit --every).
    #[arg(long, default_value = "60s", value_parser = duration, requires = "jobs")]
    pub jobs_min_every: Duration,
    /// With --jobs: how long a server's hold on a job lasts without its heartbeat (one a
    /// second): a server that died loses its jobs to the others after this long (3s at
    /// least).
    #[arg(long, default_value = "30s", value_parser = duration, requires = "jobs")]
    pub jobs_lease: Duration,
    /// With --jobs: an attempt that moves nothing (no byte, no file) for this long is
    /// stopped and tried again, resuming (a connection a long outage left stuck does not
    /// hold the job); 5s at least.
    #[arg(long, default_value = "120s", value_parser = duration, requires = "jobs")]
    pub jobs_stall: Duration,
    /// With --jobs: the wait before a job's first retry; it doubles at each attempt, up to
    /// five minutes (1s at least).
    #[arg(long, default_value = "5s", value_parser = duration, requires = "jobs")]
    pub jobs_backoff: Duration,
    /// With --jobs: a host this server may reach over ssh, as its own user and with its
    /// own ssh keys, for the far end of a job (`[USER@]HOST` as the job names it, e.g.
    /// `submit --via THIS DATA dtn9:/scratch/in/`); repeatable; none by default.
    #[arg(long = "jobs-ssh", value_name = "[USER@]HOST", requires = "jobs")]
    pub jobs_ssh: Vec<String>,
    /// With --jobs-ssh: the command that runs ssh, with its options (default: ssh). OpenSSH
    /// runs with BatchMode=yes: a job never prompts (give this server's account a key).
    #[arg(long, value_name = "CMD", env = "LONGHAUL_RSH", requires = "jobs")]
    pub jobs_rsh: Option<String>,
    /// With --jobs-ssh: the longhaul program on those hosts (default: longhaul on their
    /// PATH).
    #[arg(long, value_name = "PATH", requires = "jobs")]
    pub jobs_remote_path: Option<String>,
    /// With --jobs: the sendmail that a job's --mail goes through.
    #[arg(
        long,
        default_value = "/usr/sbin/sendmail",
        value_name = "PATH",
        requires = "jobs"
    )]
    pub sendmail: PathBuf,
}

/// `submit`: a job.
#[derive(Args)]
pub struct SubmitArgs {
    /// Sources, then the destination: on servers, longhaul://HOST[:PORT]/EXPORT/path (or
    /// HOST:PORT:EXPORT/path); one end may be a host over ssh, [USER@]HOST:path, that the job
    /// server may reach (its serve --jobs-ssh). The job server is the source's, or --via's.
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    pub paths: Vec<String>,
    /// The server that runs the job, HOST[:PORT] (default: the source's server). It must
    /// hold the source or the destination.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub via: Option<String>,
    /// Make it a sync: send what differs (size and mtime, or content with --checksum).
    #[arg(long)]
    pub sync: bool,
    /// With --sync: compare file contents (BLAKE3) instead of size and modification time.
    #[arg(long, requires = "sync")]
    pub checksum: bool,
    /// With --sync: delete destination files and directories the source does not have.
    #[arg(long, requires = "sync")]
    pub delete: bool,
    /// With --sync: run again every INTERVAL (e.g. 1h), each run an attempt of the job that
    /// moves what changed; a run that would overlap the last waits for it.
    #[arg(long, value_name = "INTERVAL", value_parser = duration, requires = "sync")]
    pub every: Option<Duration>,
    /// Copy directories and their contents.
    #[arg(short, long)]
    pub recursive: bool,
    /// rsync's archive mode: -r and -p.
    #[arg(short = 'a', long = "archive-mode")]
    pub archive_mode: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Keep permission bits.
    #[arg(short, long)]
    pub preserve: bool,
    /// Create the destination's missing directories.
    #[arg(long)]
    pub mkpath: bool,
    /// Re-read every file at the destination after writing it and compare.
    #[arg(long)]
    pub verify: bool,
    /// Parallel data streams (default: sized for the path).
    #[arg(short = 'P', long, value_parser = clap::value_parser!(u16).range(1..))]
    pub streams: Option<u16>,
    /// The path's rate, e.g. 10gbit: streams are sized for it and paced to it.
    #[arg(long, value_parser = path_rate)]
    pub rate: Option<u64>,
    /// rsync's rate cap, in rsync's units (the same cap as --rate).
    #[arg(long, value_name = "RATE", value_parser = bwlimit, conflicts_with = "rate")]
    pub bwlimit: Option<u64>,
    /// Chunk size, 64K to 2G.
    #[arg(long, value_name = "SIZE", value_parser = chunk)]
    pub chunk: Option<u64>,
    /// Compress chunks with zstd where it pays.
    #[arg(short = 'z', long)]
    pub compress: bool,
    /// Attempts after the first (a broken transfer, a file that failed), with backoff 5 s,
    /// 10 s, 20 s ... 5 min; each resumes.
    #[arg(long, default_value_t = longhaul_proto::job::DEFAULT_RETRIES,
          value_parser = clap::value_parser!(u32).range(0..=longhaul_proto::job::MAX_RETRIES as i64))]
    pub retries: u32,
    /// How long the job (and the capabilities its far ends issue for it) may last: 30d at
    /// most.
    #[arg(long, default_value = "7d", value_parser = lifetime)]
    pub lifetime: u32,
    /// POST the job's end here (JSON, signed with HMAC-SHA256 under a secret printed once).
    #[arg(long, value_name = "URL")]
    pub notify: Option<String>,
    /// Mail the job's end here through the job server's sendmail.
    #[arg(long, value_name = "ADDR")]
    pub mail: Option<String>,
    /// Print one JSON document (docs/JSON.md, `longhaul-job`).
    #[arg(long)]
    pub json: bool,
    /// How long to wait for each connection to open.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
    pub connect_timeout: Duration,
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// A job's lifetime: a duration (`12h`, `7d`, `2d12h`), at most 30 days.
fn lifetime(s: &str) -> Result<u32, String> {
    let secs = duration(s)?.as_secs_f64();
    let most = longhaul_proto::job::MAX_LIFETIME_S;
    if !(1.0..=f64::from(most)).contains(&secs) {
        return Err(format!("{s:?}: a job lasts at most 30d"));
    }
    Ok(secs as u32)
}

/// Which job server, and how to reach it (`jobs` and its subcommands).
#[derive(Args, Clone)]
pub struct JobServerArgs {
    /// The job server, HOST[:PORT].
    #[arg(long, value_name = "HOST[:PORT]", env = "LONGHAUL_JOB_SERVER")]
    pub via: Option<String>,
    /// Print one JSON document (docs/JSON.md).
    #[arg(long)]
    pub json: bool,
    /// How long to wait for the connection to open.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
    pub connect_timeout: Duration,
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// `jobs`.
#[derive(Args)]
pub struct JobsArgs {
    #[command(subcommand)]
    pub command: Option<JobsCommand>,
    #[command(flatten)]
    pub server: JobServerArgs,
}

#[derive(Subcommand)]
pub enum JobsCommand {
    /// One job: its state, files by state, bytes, rate, time left, attempts, and its files
    /// (the failed ones with their errors).
    Show {
        /// The job's id, as submit printed it.
        id: String,
        /// Files listed, at most (0: none).
        #[arg(long, default_value_t = 100)]
        files: u32,
        /// List only the files in this state: submitted, finished, failed, cancelled.
        #[arg(long, value_name = "STATE", value_parser = file_state)]
        state: Option<longhaul_proto::job::FileState>,
        #[command(flatten)]
        server: JobServerArgs,
    },
    /// Wait until the job ends (a recurring one: until its next run ends); the exit code says
    /// how: 0 every file finished verified, 6 some failed, 5 it failed, 8 it was cancelled,
    /// 9 --timeout ran out with the job still going.
    Wait {
        /// The job's id, as submit printed it.
        id: String,
        /// Give up waiting after this long (exit 9); the job goes on.
        #[arg(long, value_name = "DURATION", value_parser = duration)]
        timeout: Option<Duration>,
        #[command(flatten)]
        server: JobServerArgs,
    },
    /// Stop the job: its streams stop, its partial files are removed, its far ends'
    /// capabilities revoked.
    Cancel {
        /// The job's id, as submit printed it.
        id: String,
        #[command(flatten)]
        server: JobServerArgs,
    },
    /// Send again only the files that failed, of a job that ended with failures.
    Retry {
        /// The job's id, as submit printed it.
        id: String,
        #[command(flatten)]
        server: JobServerArgs,
    },
}

fn file_state(s: &str) -> Result<longhaul_proto::job::FileState, String> {
    longhaul_proto::job::FileState::from_word(s)
        .ok_or_else(|| format!("{s:?}: a file's state is submitted, finished, failed or cancelled"))
}

#[derive(Args)]
pub struct IdArgs {
    /// State directory of a server (default: $XDG_STATE_HOME/longhaul), or a client
    /// identity directory for --identity. It must exist (a mistyped path is refused, not
    /// made); one that holds no identity gets a new key.
    pub dir: Option<PathBuf>,
    /// Print the fingerprint as a JSON document (docs/JSON.md, `longhaul-id`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct TrustArgs {
    /// The server, HOST[:PORT].
    pub host: String,
    /// Accept only this fingerprint (as `longhaul id` printed it on the server).
    #[arg(long, value_name = "SHA256:...", value_parser = fingerprint_arg)]
    pub fingerprint: Option<String>,
    /// Replace an entry for this host that lists another fingerprint.
    #[arg(long)]
    pub replace: bool,
    /// Known-hosts file (default ~/.config/longhaul/known_hosts).
    #[arg(long, value_name = "FILE", env = "LONGHAUL_KNOWN_HOSTS")]
    pub known_hosts: Option<PathBuf>,
    /// How long to wait for the server to answer.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
    pub connect_timeout: Duration,
}

#[derive(Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(Subcommand)]
pub enum TokenCommand {
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
        /// The server's state directory (default: $XDG_STATE_HOME/longhaul).
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Revoke a grant by id; takes effect for the next connection.
    Revoke {
        /// The grant's id, as `token create` and `token list` print it.
        id: String,
        /// The server's state directory (default: $XDG_STATE_HOME/longhaul).
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
    },
}

#[derive(Args, Clone)]
pub struct PerfArgs {
    /// Server `HOST[:PORT]`; with two, the first server tests to the second (third-party mode).
    /// `[USER@]HOST:` (an empty ssh path): a host with no server, reached over ssh.
    #[arg(required_unless_present_any = ["client", "server"], num_args = 1..=2, value_name = "HOST[:PORT]")]
    pub hosts: Vec<String>,
    /// iperf3's form of the server to test (`-c HOST`): the same as naming HOST.
    #[arg(
        short = 'c',
        long = "client",
        value_name = "HOST",
        conflicts_with = "hosts"
    )]
    pub client: Option<String>,
    /// iperf3's server switch: longhaul's server is `longhaul serve` (this says so and exits).
    #[arg(short = 's', long = "server")]
    pub server: bool,
    /// Write everything this command prints to FILE (appended), as iperf3's --logfile.
    #[arg(long, value_name = "FILE")]
    pub logfile: Option<PathBuf>,
    /// Server port, when HOST does not carry one.
    #[arg(short, long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Parallel streams (per direction), or `auto`: enough for the window each stream can
    /// have at the measured RTT under both hosts' buffer caps, for --pacing's rate if given
    /// (else 10 Gbit/s), 4 to 32.
    #[arg(short = 'P', long, alias = "parallel", default_value = "1", value_parser = stream_count)]
    pub streams: StreamCount,
    /// Test length (after --omit), e.g. 10, 30s, 2m.
    #[arg(short = 't', long = "time", value_parser = duration, conflicts_with = "bytes")]
    pub time: Option<Duration>,
    /// Bytes to send per direction instead of a time, e.g. 10G.
    #[arg(short = 'n', long, value_parser = size)]
    pub bytes: Option<u64>,
    /// Bytes per write (TCP) or per datagram (UDP). Default for TCP: 1M over
    /// the number of streams, at least 128K; for UDP 1472.
    #[arg(short = 'l', long, value_parser = size)]
    pub length: Option<u64>,
    /// Socket buffer (window) on both ends, e.g. 16M. Default: the kernel's autotuning.
    #[arg(short = 'w', long, value_parser = size)]
    pub window: Option<u64>,
    /// Congestion control on both ends (e.g. bbr, cubic).
    #[arg(short = 'C', long)]
    pub congestion: Option<String>,
    /// Pace the sender(s) to this total rate with SO_MAX_PACING_RATE, e.g. 2G.
    #[arg(long, value_parser = rate)]
    pub pacing: Option<u64>,
    /// TCP maximum segment size.
    #[arg(short = 'M', long, alias = "set-mss")]
    pub mss: Option<u32>,
    /// Server sends, client receives.
    #[arg(short = 'R', long, conflicts_with = "bidir")]
    pub reverse: bool,
    /// Both directions at once.
    #[arg(long)]
    pub bidir: bool,
    /// Pin stream threads: local CPU, and optionally the server's (`-A 0,1`).
    #[arg(short = 'A', long, value_name = "N[,M]")]
    pub affinity: Option<String>,
    /// How senders hand data to the kernel: splice (default: vmsplice+splice,
    /// no copy), sendfile (from a memory file; -Z alone, as iperf3's) or copy (write(2)).
    #[arg(short = 'Z', long, value_name = "MODE", num_args = 0..=1, default_missing_value = "sendfile", value_parser = send_mode)]
    pub zerocopy: Option<SendMode>,
    /// Copy data in and out of the kernel with write(2) and read(2), as an
    /// application that touches its data would, instead of the default
    /// zero-copy send and discarding receive.
    #[arg(long, conflicts_with_all = ["zerocopy", "recv_mode"])]
    pub copy: bool,
    /// How receivers take data from the kernel: discard (default: recv with
    /// MSG_TRUNC, no copy) or copy (read(2) into a buffer).
    #[arg(long, value_name = "MODE", value_parser = recv_mode)]
    pub recv_mode: Option<RecvMode>,
    /// Seconds between interval reports; 0 for none.
    #[arg(short = 'i', long, default_value = "1", value_parser = duration)]
    pub interval: Duration,
    /// Leave out the first SECS (slow start) from the results.
    #[arg(short = 'O', long, value_parser = duration, default_value = "0")]
    pub omit: Duration,
    /// Run the data streams over TLS, to measure encrypted throughput. By default they are
    /// plaintext (the control connection stays TLS, and each stream proves it belongs to the
    /// test without a credential on the wire), so that the rate is the path's, not the
    /// cipher's.
    #[arg(long, conflicts_with_all = ["udp", "insecure_plaintext"])]
    pub tls: bool,
    /// UDP instead of TCP.
    #[arg(short = 'u', long)]
    pub udp: bool,
    /// UDP send rate in total per direction, e.g. 1G; 0 for unlimited. Default 1M. (iperf3's
    /// name; `--rate` is the path's rate in every command, and a TCP test's pace is --pacing.)
    #[arg(short = 'b', long = "bitrate", alias = "rate", value_name = "RATE", value_parser = rate)]
    pub rate: Option<u64>,
    /// Print one JSON document at the end (`-J`, as iperf3).
    #[arg(short = 'J', long, conflicts_with = "json_stream")]
    pub json: bool,
    /// Print one JSON object per line as events happen.
    #[arg(long)]
    pub json_stream: bool,
    /// Time to wait for the server to answer.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub connect_timeout: Duration,
    #[command(flatten)]
    pub retry: RetryArgs,
    /// Connect from this local address (control and data; iperf3's -B), for a host with
    /// several networks: the test takes the path from that address's interface.
    #[arg(short = 'B', long, value_name = "ADDR")]
    pub bind: Option<std::net::IpAddr>,
    /// Only IPv4 (connect to the host's IPv4 addresses).
    #[arg(
        short = '4',
        long = "ipv4",
        alias = "version4",
        conflicts_with = "ipv6"
    )]
    pub ipv4: bool,
    /// Only IPv6 (connect to the host's IPv6 addresses).
    #[arg(short = '6', long = "ipv6", alias = "version6")]
    pub ipv6: bool,
    /// The unit of the rates printed, as iperf3's -f: k, m, g for kbit/s, Mbit/s, Gbit/s;
    /// K, M, G for KiB/s, MiB/s, GiB/s (default: each rate in the bit/s unit that suits it;
    /// sizes stay in IEC units, JSON in bit/s).
    #[arg(short = 'f', long, value_name = "k|m|g|K|M|G", value_parser = format_unit)]
    pub format: Option<FormatUnit>,
    /// The server is a stock iperf3 server (`iperf3 -s`; port 5201 unless HOST:PORT or -p
    /// says): a TCP or UDP (-u -b) test with -P, -t, -R, --bidir, -l, -w, -C, --omit, reported and archived
    /// like any perf run, with what each end counted (docs/PROTOCOL.md, section 17).
    #[arg(long)]
    pub iperf3: bool,
    #[command(flatten)]
    pub ssh: SshArgs,
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// How often a client command tries to connect (cp, sync, ls, perf,
/// doctor): the one option and wording of every retry.
#[derive(Args, Clone, Copy)]
pub struct RetryArgs {
    /// Attempts after the first when the server cannot be reached, or (cp, sync) when the
    /// connection is lost (each attempt resumes), before giving up; they wait 1 s, 2 s, 4 s,
    /// ... and each says `retrying (N/RETRIES)`.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub retries: u32,
}

/// iperf3's `-f` letters; its `-f t`/`T` (tera) and `a` (adaptive) too.
pub fn format_unit(s: &str) -> Result<FormatUnit, String> {
    let power = match s.to_ascii_lowercase().as_str() {
        "k" => 1,
        "m" => 2,
        "g" => 3,
        "t" => 4,
        _ => {
            return Err(format!(
            "'{s}' is not a unit: k, m, g, t (kbit/s ... Tbit/s) or K, M, G, T (KiB/s ... TiB/s)"
        ))
        }
    };
    Ok(FormatUnit {
        bytes: s.chars().all(|c| c.is_ascii_uppercase()),
        power,
    })
}

/// `-P N` or `-P auto`.
#[derive(Clone, Copy)]
pub enum StreamCount {
    Fixed(u16),
    Auto,
}

impl StreamCount {
    /// The count before the path is measured (auto starts from the default).
    pub fn initial(self) -> u16 {
        match self {
            StreamCount::Fixed(n) => n,
            StreamCount::Auto => longhaul_proto::window::DEFAULT_STREAMS,
        }
    }
}

#[derive(Args)]
pub struct CpArgs {
    /// Sources, then the destination. Over ssh (no server there): [USER@]HOST:path. On a
    /// longhaul server: longhaul://HOST[:PORT]/EXPORT/path or HOST:PORT:EXPORT/path.
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    pub paths: Vec<String>,
    /// Copy directories and their contents.
    #[arg(short, long)]
    pub recursive: bool,
    /// rsync's archive mode: -r and -p. Symbolic links are always copied as links and
    /// modification times always kept; owners, groups, devices and special files are not
    /// copied (rsync's -a has -o -g -D; longhaul leaves them out). Its long name is
    /// --archive-mode: --archive names the file of archived runs.
    #[arg(short = 'a', long = "archive-mode")]
    pub archive_mode: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Keep permission bits (modification times are always kept). Setuid, setgid and sticky
    /// bits and world-writable directories are stripped unless --keep-special-modes.
    #[arg(short, long)]
    pub preserve: bool,
    /// With -p on a pull: keep setuid, setgid and sticky bits and world-writable directories
    /// (a server keeps them only if started with --keep-special-modes).
    #[arg(long)]
    pub keep_special_modes: bool,
    /// Parallel data streams (default: sized for the path from the RTT and both hosts'
    /// socket-buffer caps, 4 to 32).
    #[arg(short = 'P', long, value_parser = clap::value_parser!(u16).range(1..))]
    pub streams: Option<u16>,
    /// Errors only: no summary, warnings, retry notices or progress (rsync's -q).
    #[arg(short = 'q', long, conflicts_with_all = ["progress", "intervals"])]
    pub quiet: bool,
    /// Show the progress bar even when stderr is not a terminal (as a line a second, for a
    /// log); without it the bar shows only at a terminal.
    #[arg(long)]
    pub progress: bool,
    /// Say what would be sent (and what sync would delete); send, write and delete
    /// nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Print a line per second (to stderr): rate, streams carrying chunks, retransmits,
    /// RTT and what limited it (window, send_buffer, congestion, application,
    /// storage_read, storage_write, files_in_flight).
    #[arg(long)]
    pub intervals: bool,
    /// Keep every stream carrying chunks: no online tuning (which parks streams the path
    /// does not need, by a hill-climb on goodput less retransmissions; -P also turns it off).
    #[arg(long)]
    pub no_tune: bool,
    /// Files announced to the destination and not yet finished, at most (default: sized
    /// for the path, at least 2048, and doubled online while it holds the transfer back,
    /// up to what the destination allows: a quarter of its open-file limit, 2048-32768).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub files_in_flight: Option<u64>,
    /// The path's rate if known, e.g. 10gbit: streams are sized for it (default 10 Gbit/s)
    /// and each is paced to its share (SO_MAX_PACING_RATE). `--rate` is the path's rate in
    /// every command (doctor, wan); perf's UDP send rate is -b/--bitrate.
    #[arg(long, value_parser = path_rate)]
    pub rate: Option<u64>,
    /// rsync's rate cap, in rsync's units: bytes per second, a bare number in KiB/s, or with
    /// a suffix K, M, G (1024-based; KB, MB, GB 1000-based). The same cap as --rate.
    #[arg(long, value_name = "RATE", value_parser = bwlimit, conflicts_with = "rate")]
    pub bwlimit: Option<u64>,
    /// Congestion control of the sending side, as perf's -C (default: bbr where the sender
    /// has it).
    #[arg(short = 'C', long = "congestion", alias = "cc", value_name = "NAME")]
    pub congestion: Option<String>,
    /// Chunk size, 64K to 2G, rounded down to a power of two, e.g. 8M (default: chosen per
    /// file, 1-4 MiB, more for files over 1 TiB).
    #[arg(long, value_name = "SIZE", value_parser = chunk)]
    pub chunk: Option<u64>,
    /// Send files even where the destination has the same size and mtime.
    #[arg(long)]
    pub force: bool,
    /// Create the destination's missing directories (without it, a destination whose
    /// directory does not exist is refused, as with cp and rsync).
    #[arg(long)]
    pub mkpath: bool,
    #[command(flatten)]
    pub retry: RetryArgs,
    /// Write `DIGEST  PATH` for every file verified (its BLAKE3, as `b3sum` prints it).
    #[arg(long, value_name = "FILE")]
    pub digests: Option<PathBuf>,
    /// Skip the fdatasync of each received file before it is renamed into place.
    #[arg(long)]
    pub no_sync: bool,
    /// Re-read every file at the destination after writing it and compare.
    #[arg(long)]
    pub verify: bool,
    /// Read and write file data with O_DIRECT on both ends (bypass the page cache).
    #[arg(long)]
    pub direct: bool,
    /// Compress chunks with zstd where it pays: off by itself while the data does not
    /// compress or the path is faster than the compressor (unlike rsync's -z).
    #[arg(short = 'z', long)]
    pub compress: bool,
    /// zstd level for -z (implies it): -50..=-1 (fastest) or 1..=9; default 1.
    #[arg(long, value_name = "LEVEL", allow_hyphen_values = true,
          value_parser = |s: &str| s.parse::<i32>().map_err(|e| e.to_string())
              .and_then(|l| longhaul_proto::xfer::compress::check_level(l).map(|()| l)))]
    pub compress_level: Option<i32>,
    /// Print one JSON document at the end (docs/JSON.md, `longhaul-cp`).
    #[arg(long)]
    pub json: bool,
    /// How long to wait for each connection (control and data streams) to open.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
    pub connect_timeout: Duration,
    /// A local address the data streams connect from (repeatable: the
    /// streams take them in turn, one path per NIC); the control connection
    /// leaves from the first, as perf's -B.
    #[arg(long, value_name = "ADDR")]
    pub bind: Vec<std::net::IpAddr>,
    /// Another address of the same server for the data streams (repeatable;
    /// the control connection's address is the first path): stripes one
    /// transfer over several links into one server.
    #[arg(long, value_name = "ADDR[:PORT]", value_parser = via)]
    pub via: Vec<std::net::SocketAddr>,
    #[command(flatten)]
    pub security: SecurityArgs,
    #[command(flatten)]
    pub ssh: SshArgs,
    #[command(flatten)]
    pub fleet: FleetArgs,
}

/// `--bwlimit` as rsync reads it, in bits/s: bytes per second, a bare
/// number KiB/s; `K`/`M`/`G` (or `KiB`...) 1024-based, `KB`/`MB`/`GB`
/// 1000-based; fractions allowed (`1.5M`).
pub fn bwlimit(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a rate: a number of KiB/s, or with K, M or G"))?;
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "b" => 1.0,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (K, M, G as rsync; KB, MB, GB for 1000)"
            ))
        }
    };
    let bits = n * mult * 8.0;
    if !(1.0..1e18).contains(&bits) {
        return Err(format!("{s:?} is no rate to cap at"));
    }
    Ok(bits as u64)
}

/// Include/exclude rules from one option, numbered in the order clap
/// parsed them (the command line's), so that --include and --exclude can
/// be put back in that order: rsync's first match wins.
#[derive(Clone, Debug)]
pub struct Ranked {
    pub order: u64,
    pub rules: Vec<String>,
}

static RULE_ORDER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn ranked(rules: Vec<String>) -> Ranked {
    Ranked {
        order: RULE_ORDER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        rules,
    }
}

fn pattern_rule(kind: char, s: &str) -> Result<Ranked, String> {
    if s.is_empty() {
        return Err("an empty pattern matches nothing".into());
    }
    Ok(ranked(vec![format!("{kind} {s}")]))
}

fn exclude_rule(s: &str) -> Result<Ranked, String> {
    pattern_rule('-', s)
}

fn include_rule(s: &str) -> Result<Ranked, String> {
    pattern_rule('+', s)
}

fn rules_file(path: &str, include: bool) -> Result<Ranked, String> {
    let text = if path == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| format!("cannot read stdin: {e}"))?
    } else {
        std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?
    };
    longhaul_engine::xfer::filter::rules_from_lines(&text, include)
        .map(ranked)
        .map_err(|e| format!("{path}: {e}"))
}

fn exclude_from(s: &str) -> Result<Ranked, String> {
    rules_file(s, false)
}

fn include_from(s: &str) -> Result<Ranked, String> {
    rules_file(s, true)
}

impl CpArgs {
    /// The include/exclude rules in command-line order.
    pub fn filter_rules(&self) -> Vec<String> {
        self.filter.rules()
    }
}

/// rsync's include/exclude rules, as cp, sync and submit take them.
#[derive(Args, Clone, Default)]
pub struct FilterArgs {
    /// Leave out what matches PATTERN (rsync's rules: `*` stays within a name, `**` crosses
    /// `/`, a trailing `/` matches directories only, a leading `/` anchors at the transfer
    /// root, a name without `/` matches at any depth). Repeatable; with --include, the first
    /// rule that matches decides, in command-line order. An excluded directory is not
    /// walked, and what sync deletes never includes excluded destination files.
    #[arg(long, value_name = "PATTERN", value_parser = exclude_rule, help_heading = "What is sent")]
    pub exclude: Vec<Ranked>,
    /// Send what matches PATTERN even if a later --exclude matches it (put it first).
    #[arg(long, value_name = "PATTERN", value_parser = include_rule, help_heading = "What is sent")]
    pub include: Vec<Ranked>,
    /// Read exclude patterns from FILE (- for stdin), one a line, as rsync does: blank lines
    /// and lines starting with # or ; are skipped, `+ PATTERN` includes, `- PATTERN` excludes.
    #[arg(long, value_name = "FILE", value_parser = exclude_from, help_heading = "What is sent")]
    pub exclude_from: Vec<Ranked>,
    /// Read include patterns from FILE (- for stdin), as --exclude-from.
    #[arg(long, value_name = "FILE", value_parser = include_from, help_heading = "What is sent")]
    pub include_from: Vec<Ranked>,
}

impl FilterArgs {
    /// The include/exclude rules in command-line order.
    pub fn rules(&self) -> Vec<String> {
        let mut all: Vec<&Ranked> = self
            .exclude
            .iter()
            .chain(&self.include)
            .chain(&self.exclude_from)
            .chain(&self.include_from)
            .collect();
        all.sort_by_key(|r| r.order);
        all.into_iter().flat_map(|r| r.rules.clone()).collect()
    }
}

/// `ADDR` or `ADDR:PORT` (`[V6]:PORT`); port 0 (absent) means the
/// control connection's.
pub fn via(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(a) = s.parse::<std::net::SocketAddr>() {
        return Ok(a);
    }
    s.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .map(|ip| std::net::SocketAddr::new(ip, 0))
        .map_err(|_| {
            format!("{s:?} is not an address (ADDR or ADDR:PORT; names are not looked up here)")
        })
}

/// `--ranks N` or `--ranks auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ranks {
    Auto,
    Count(u32),
}

fn ranks_arg(s: &str) -> Result<Ranks, String> {
    match s {
        "auto" => Ok(Ranks::Auto),
        _ => match s.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(Ranks::Count(n)),
            _ => Err(format!(
                "'{s}' is not a rank count: give a number of ranks (1 or more) or `auto`"
            )),
        },
    }
}

impl FleetArgs {
    /// How many ranks were named (`--ranks N`, or the old `--size N`).
    pub fn count(&self) -> Option<u32> {
        match self.ranks {
            Some(Ranks::Count(n)) => Some(n),
            _ => self.size,
        }
    }
}

/// One transfer across many nodes: every node runs the same command under
/// a launcher (Slurm, MPI, a Kubernetes indexed Job) and moves its share.
#[derive(Args, Clone, Default)]
#[command(next_help_heading = "One transfer across many nodes")]
pub struct FleetArgs {
    /// This process is one rank of a fleet of N ranks (with --rank R, or the rank a
    /// Kubernetes indexed Job's JOB_COMPLETION_INDEX gives, N its completions); `auto` reads
    /// the rank and the count from the launcher (SLURM_PROCID/SLURM_NTASKS,
    /// OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE), in that order.
    #[arg(long, value_name = "N|auto", value_parser = ranks_arg)]
    pub ranks: Option<Ranks>,
    /// This process's rank, 0 to N-1, with --ranks N.
    #[arg(long, value_name = "R")]
    pub rank: Option<u32>,
    /// The old name of --ranks N (kept for scripts).
    #[arg(long, value_name = "N", hide = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub size: Option<u32>,
    /// Static shares: a directory every rank sees (the shared file system)
    /// for the manifest and each rank's result. Its own per transfer, and
    /// the user's alone (made 0700; one others can write is refused).
    #[arg(long, value_name = "DIR", conflicts_with = "queue")]
    pub run_dir: Option<PathBuf>,
    /// A dynamic work queue in PostgreSQL instead of static shares:
    /// postgres://USER@HOST[:PORT]/DB (or host=/run/postgresql for a socket).
    #[arg(long, value_name = "URL")]
    pub queue: Option<String>,
    /// Names the run in the queue; the same id resumes it (default: from
    /// the sources and destination).
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,
    /// Bytes a queue unit carries about (a range of a large file, or a
    /// group of small files).
    #[arg(long, value_name = "SIZE", value_parser = size, default_value = "256M")]
    pub unit: u64,
    /// A queue lease not renewed for this long is taken over by another rank.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "60s")]
    pub lease: Duration,
    /// Servers the ranks push to, rank R to the (R mod N)-th, instead of the
    /// destination's host: DTNs of the far site that export one shared
    /// file system under the destination's export (HOST[:PORT], repeatable
    /// or comma-separated).
    #[arg(long, value_name = "HOST[:PORT]", value_delimiter = ',')]
    pub servers: Vec<String>,
    /// How long a rank waits for the manifest, the finishing rank for the
    /// others' results, and a queue rank with nothing to lease for units
    /// other ranks hold and finish none of.
    #[arg(long = "fleet-wait", value_name = "DURATION", value_parser = duration, default_value = "24h")]
    pub wait: Duration,
}

#[derive(Args)]
pub struct SyncArgs {
    #[command(flatten)]
    pub cp: CpArgs,
    /// Compare file contents (BLAKE3) instead of size and modification time.
    #[arg(long, help_heading = "What sync compares and deletes")]
    pub checksum: bool,
    /// Delete destination files and directories the source does not have.
    #[arg(long, help_heading = "What sync compares and deletes")]
    pub delete: bool,
}

#[derive(Args)]
#[command(disable_help_flag = true)]
pub struct LsArgs {
    /// [USER@]HOST:path (over ssh), or longhaul://HOST[:PORT]/EXPORT/path or HOST:PORT:EXPORT/path
    pub target: String,
    /// Long listing, as `ls -l`: type and mode, size, modification time (UTC), name, and
    /// where a symbolic link points.
    #[arg(short = 'l', long)]
    pub long: bool,
    /// With -l: sizes in IEC units (4.0 KiB, 1.5 GiB) instead of bytes.
    #[arg(short = 'h', long)]
    pub human_readable: bool,
    /// List every directory beneath too, named by their path from the one listed.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Print help (-h is --human-readable here, as in ls).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Print one JSON document (docs/JSON.md, `longhaul-ls`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub retry: RetryArgs,
    #[command(flatten)]
    pub security: SecurityArgs,
    #[command(flatten)]
    pub ssh: SshArgs,
}

/// How a host named `[USER@]HOST:path` is reached over ssh (as rsync's -e
/// and --rsync-path).
#[derive(Args, Clone, Default)]
#[command(next_help_heading = "Over ssh (HOST:path)")]
pub struct SshArgs {
    /// The command that runs ssh for HOST:path, with its options (default: ssh).
    #[arg(short = 'e', long = "rsh", value_name = "CMD", env = "LONGHAUL_RSH")]
    pub rsh: Option<String>,
    /// The longhaul program on the far host, for HOST:path (default: longhaul on its PATH).
    #[arg(long, value_name = "PATH")]
    pub remote_path: Option<String>,
    /// Where longhaul is missing on the far host, copy a build that runs there (~/.cache/longhaul/),
    /// checked against its machine type and glibc first: this binary, else the portable build
    /// (scripts/release.sh) beside it; with =PATH, that one.
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true)]
    pub copy_binary: Option<Option<PathBuf>>,
    /// Have the far end open the connections (its firewall lets it only connect out). Without
    /// this, that happens when a direct connection fails; with =ADDR[:PORT], listen there and
    /// have it connect to that (default: the address its ssh saw this client come from).
    #[arg(long, value_name = "ADDR[:PORT]", num_args = 0..=1, require_equals = true,
          default_missing_value = "")]
    pub connect_back: Option<String>,
}

/// How a client secures its connections and proves who it is.
#[derive(Args, Clone)]
#[command(next_help_heading = "Trust and credentials")]
pub struct SecurityArgs {
    /// Trust the server presenting this certificate fingerprint (SHA256:..., as
    /// `longhaul id` prints it on the server); repeatable or comma-separated.
    #[arg(long, value_name = "SHA256:...", env = "LONGHAUL_TRUST", value_delimiter = ',',
          value_parser = fingerprint_arg)]
    pub trust: Vec<String>,
    /// Known-hosts file, filled by `longhaul trust HOST` (default ~/.config/longhaul/known_hosts).
    #[arg(long, value_name = "FILE", env = "LONGHAUL_KNOWN_HOSTS")]
    pub known_hosts: Option<PathBuf>,
    /// Trust servers whose certificate chains to a CA in this PEM file and names the host.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Present the identity kept in DIR (see `longhaul id`) as a client certificate (mutual TLS).
    #[arg(long, value_name = "DIR")]
    pub identity: Option<PathBuf>,
    /// Read the access token from FILE (default: the LONGHAUL_TOKEN variable); with
    /// HOST[:PORT]=FILE, the token of that server only, presented to it and to no other (HOST
    /// alone: the server at the default port; repeatable: a third-party copy takes one for each
    /// of its two servers).
    #[arg(long, value_name = "[HOST[:PORT]=]FILE")]
    pub token_file: Vec<String>,
    /// No TLS: no encryption, no server authentication. Works only with a server started
    /// with --allow-plaintext; never chosen silently.
    #[arg(long)]
    pub insecure_plaintext: bool,
}

#[derive(Args)]
pub struct DoctorArgs {
    /// `[SOURCE] REMOTE`, as for cp: a writable place on a host over ssh ([USER@]HOST:path) or
    /// on a server (longhaul://HOST[:PORT]/EXPORT/path), after what you will send if you name it here
    /// (the same as --source). A local path alone: audit this host with it as the source.
    #[arg(num_args = 0..=2, value_name = "[SOURCE] REMOTE")]
    pub targets: Vec<String>,
    /// What you will send (a file or a tree on this host): its storage is measured as the
    /// source, and its mean file size sizes the small-file (metadata) stage.
    #[arg(long)]
    pub source: Option<PathBuf>,
    /// Judge a pull (the server is the source, this host the destination).
    #[arg(long)]
    pub pull: bool,
    /// With --pull: a directory on this host's destination storage to measure.
    #[arg(long, requires = "pull")]
    pub dest: Option<PathBuf>,
    /// The path's rate, if known (judges the buffer settings against it), e.g. 10G: the
    /// same as cp's --rate.
    #[arg(long, value_parser = path_rate)]
    pub rate: Option<u64>,
    /// How long each memory-to-memory test runs (one each way), e.g. 10s.
    #[arg(long, default_value = "3s", value_parser = duration)]
    pub time: Duration,
    /// Skip the short file-to-file copy.
    #[arg(long)]
    pub no_copy: bool,
    /// Do not remember the path's rate for later copies (by default, when the path itself
    /// limits, its rate is kept in $XDG_STATE_HOME/longhaul/paths.json, or LONGHAUL_PATHS,
    /// and `cp` to this server sizes its streams for it for a week while the RTT matches).
    #[arg(long)]
    pub no_remember: bool,
    /// Forget what an earlier doctor remembered of this server's path (both directions), so
    /// that later copies size their streams by their own probe again; measures nothing.
    #[arg(long, value_name = "HOST[:PORT]", conflicts_with_all = ["targets", "no_remember", "source", "pull", "dest", "rate", "no_copy"])]
    pub forget: Option<String>,
    /// Print the report as one JSON document (docs/JSON.md, `longhaul-doctor`).
    #[arg(long)]
    pub json: bool,
    /// How long to wait for each connection to the server to open.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
    pub connect_timeout: Duration,
    #[command(flatten)]
    pub retry: RetryArgs,
    #[command(flatten)]
    pub security: SecurityArgs,
    #[command(flatten)]
    pub ssh: SshArgs,
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Sequential write and read of one file (block size, threads, O_DIRECT or
    /// buffered), then small files created and read back as a transfer of many
    /// small files does. Everything made is removed again.
    Disk(DiskArgs),
}

#[derive(Args)]
pub struct DiskArgs {
    /// A directory on the storage to measure.
    pub path: PathBuf,
    /// Size of the sequential test file.
    #[arg(short, long, default_value = "1G", value_parser = size)]
    pub size: u64,
    /// Bytes per request.
    #[arg(long = "bs", default_value = "1M", value_parser = size)]
    pub block_size: u64,
    /// Threads for the sequential tests, each with one request in flight (the queue depth).
    #[arg(short, long, default_value_t = 1)]
    pub threads: usize,
    /// Go through the page cache (writes end with fdatasync; reads drop the cache first).
    /// Default: O_DIRECT where the file system takes it.
    #[arg(long)]
    pub buffered: bool,
    /// Small files to create and read back (0: none).
    #[arg(long, default_value_t = 2000)]
    pub files: u64,
    /// Size of each small file.
    #[arg(long, default_value = "16K", value_parser = size)]
    pub file_size: u64,
    /// Each test stops after this long even if it has not done its size.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub time: Duration,
    /// Only these sequential tests: `write`, `read` (read needs the write to make its file).
    #[arg(long, value_delimiter = ',', value_parser = ["write", "read"])]
    pub only: Vec<String>,
    /// Print the report as one JSON document (docs/JSON.md, `longhaul-disk`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct WanArgs {
    #[command(subcommand)]
    pub command: WanCommand,
}

#[derive(Subcommand)]
pub enum WanCommand {
    /// Make hosts `a` (198.18.0.1) and `b` (198.18.0.2) joined by an emulated link, and
    /// forward between them until Ctrl-C or SIGTERM, then remove everything (needs root).
    Up(WanUpArgs),
    /// Run a command in host `a` or `b`: `longhaul wan exec a -- CMD ARGS...`.
    Exec {
        /// The host to run in: `a` or `b`.
        host: String,
        /// The emulator's name, as given to `up --name`.
        #[arg(long, default_value = "lhwan")]
        name: String,
        /// The command and its arguments, after `--`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Change a running emulator's link (both directions) from now on; options as for `up`,
    /// only those given change.
    Set(WanSetArgs),
    /// Remove the hosts of an emulator whose forwarder is gone.
    Down {
        /// The emulator's name, as given to `up --name`.
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
pub struct WanSetArgs {
    /// The emulator's name, as given to `up --name`.
    #[arg(long, default_value = "lhwan")]
    #[serde(skip)]
    pub name: String,
    /// Round-trip time: half of it is added in each direction.
    #[arg(long, value_parser = duration)]
    pub rtt: Option<Duration>,
    /// Up to this much extra one-way delay per packet.
    #[arg(long, value_parser = duration)]
    pub jitter: Option<Duration>,
    /// Packet loss probability per direction, e.g. 1e-5.
    #[arg(long)]
    pub loss: Option<f64>,
    /// Probability that a packet has one bit flipped.
    #[arg(long)]
    pub corrupt: Option<f64>,
    /// Bottleneck rate per direction, e.g. 2gbit.
    #[arg(long, value_parser = rate)]
    pub rate: Option<u64>,
    /// No rate limit any more.
    #[arg(long, conflicts_with = "rate")]
    pub no_rate: bool,
    /// Bottleneck queue (drop-tail) as time at the rate.
    #[arg(long, value_parser = duration)]
    pub queue: Option<Duration>,
}

#[derive(Args)]
pub struct WanUpArgs {
    /// Names the namespaces NAME-a and NAME-b (several emulators may run at once).
    #[arg(long, default_value = "lhwan")]
    pub name: String,
    /// Round-trip time: half of it is added in each direction.
    #[arg(long, value_parser = duration, default_value = "0ms")]
    pub rtt: Duration,
    /// Up to this much extra one-way delay per packet (uniform; no reordering).
    #[arg(long, value_parser = duration, default_value = "0ms")]
    pub jitter: Duration,
    /// Let jitter reorder packets.
    #[arg(long)]
    pub reorder: bool,
    /// Packet loss probability per direction, e.g. 1e-5.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Probability that a packet has one bit flipped.
    #[arg(long, default_value_t = 0.0)]
    pub corrupt: f64,
    /// Bottleneck rate per direction, e.g. 2gbit (default: none).
    #[arg(long, value_parser = rate)]
    pub rate: Option<u64>,
    /// Bottleneck queue (drop-tail) as time at the rate.
    #[arg(long, value_parser = duration, default_value = "50ms")]
    pub queue: Duration,
    /// MTU of the emulated link (default: 1500 up to a --rate of 1gbit, 9000 up to 10gbit, else 65000).
    #[arg(long)]
    pub mtu: Option<u32>,
    /// The link is down for DURATION from START after it comes up (repeatable), e.g. 5s+3s.
    #[arg(long, value_name = "START+DURATION")]
    pub outage: Vec<String>,
    /// Print the hosts as one JSON line: {"format":"longhaul-wan","format_version":1,"hosts":{"a":ADDR,"b":ADDR}}.
    #[arg(long)]
    pub json: bool,
}

pub fn stream_count(s: &str) -> Result<StreamCount, String> {
    if s == "auto" {
        return Ok(StreamCount::Auto);
    }
    s.parse::<u16>()
        .map(StreamCount::Fixed)
        .map_err(|_| format!("'{s}' is not a stream count: give a number or `auto`"))
}

pub fn size(s: &str) -> Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}

/// `cp --rate`: a path's rate, at least 1 Mbit/s (each stream is paced to its share).
pub fn path_rate(s: &str) -> Result<u64, String> {
    match rate(s)? {
        r if r < 1_000_000 => Err(format!(
            "{s} is below 1 Mbit/s: give the path's rate, e.g. 10gbit"
        )),
        r => Ok(r),
    }
}

/// The chunk sizes a destination takes: 64 KiB to 2 GiB (the engine rounds
/// down to a power of two).
pub const CHUNK_RANGE: std::ops::RangeInclusive<u64> = (64 << 10)..=(2 << 30);

/// `--chunk`: a size in [`CHUNK_RANGE`].
pub fn chunk(s: &str) -> Result<u64, String> {
    match size(s)? {
        c if CHUNK_RANGE.contains(&c) => Ok(c),
        c => Err(format!(
            "{s} ({c} bytes) is not a chunk size: give 64K to 2G"
        )),
    }
}

pub fn rate(s: &str) -> Result<u64, String> {
    units::parse_rate(s).map_err(|e| e.to_string())
}

pub fn send_mode(s: &str) -> Result<SendMode, String> {
    match s {
        "splice" => Ok(SendMode::Splice),
        "sendfile" => Ok(SendMode::Sendfile),
        "copy" => Ok(SendMode::Copy),
        _ => Err(format!(
            "unknown zero-copy mode '{s}': use splice, sendfile or copy"
        )),
    }
}

pub fn recv_mode(s: &str) -> Result<RecvMode, String> {
    match s {
        "discard" => Ok(RecvMode::Discard),
        "copy" => Ok(RecvMode::Copy),
        _ => Err(format!("unknown receive mode '{s}': use discard or copy")),
    }
}

pub fn duration(s: &str) -> Result<Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}

pub fn fingerprint_arg(s: &str) -> Result<String, String> {
    longhaul_engine::net::tls::parse_fingerprint(s)
}

/// `serve --iperf3`: `PORT` (every address) or `ADDR:PORT`.
fn iperf3_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([0u16; 8], port)));
    }
    s.parse().map_err(|_| {
        format!(
            "invalid iperf3 address '{s}': expected PORT or ADDR:PORT, like 5201 or 127.0.0.1:5201"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// `submit --lifetime` reads the one duration grammar, up to 30 days.
    #[test]
    fn a_lifetime_is_a_duration_of_at_most_30_days() {
        assert_eq!(lifetime("7d"), Ok(7 * 86_400));
        assert_eq!(lifetime("12h"), Ok(12 * 3600));
        assert_eq!(lifetime("2d12h"), Ok(60 * 3600));
        assert_eq!(lifetime("30d"), Ok(30 * 86_400));
        assert!(lifetime("31d").unwrap_err().contains("at most 30d"));
        assert!(lifetime("0s").is_err());
        assert!(lifetime("soon").unwrap_err().contains("1h30m"));
    }

    /// rsync's --bwlimit units: a bare number is KiB/s.
    #[test]
    fn bwlimit_reads_rsyncs_units() {
        assert_eq!(bwlimit("100").unwrap(), 100 * 1024 * 8);
        assert_eq!(bwlimit("1.5M").unwrap(), 1536 * 1024 * 8);
        assert_eq!(bwlimit("2g").unwrap(), 2 * (1 << 30) * 8);
        assert_eq!(bwlimit("10MB").unwrap(), 10_000_000 * 8);
        for bad in ["", "x", "0", "5q", "-1"] {
            assert!(bwlimit(bad).is_err(), "{bad}");
        }
    }

    /// --include and --exclude keep their command-line order (first
    /// match wins), whichever option each is.
    #[test]
    fn filter_rules_keep_command_line_order() {
        let cli = Cli::try_parse_from([
            "longhaul",
            "cp",
            "-a",
            "--exclude",
            "*.o",
            "--include",
            "keep.o",
            "--exclude",
            "b",
            "src",
            "dst",
        ])
        .unwrap();
        let Command::Cp(a) = cli.command else {
            panic!("not cp")
        };
        assert_eq!(a.filter_rules(), ["- *.o", "+ keep.o", "- b"]);
        assert!(a.archive_mode);
    }

    /// Every command and subcommand, with its path (`longhaul cp`).
    fn all_commands() -> Vec<(String, clap::Command)> {
        let mut out = Vec::new();
        let mut todo = vec![("longhaul".to_owned(), Cli::command())];
        while let Some((path, cmd)) = todo.pop() {
            for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
                todo.push((format!("{path} {}", sub.get_name()), sub.clone()));
            }
            out.push((path, cmd));
        }
        out
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("longhaul").chain(args.iter().copied()))
    }

    /// `--chunk`'s range, both ends in and just past each out, as its help says.
    #[test]
    fn chunk_accepts_its_documented_range() {
        assert_eq!(chunk("64K").unwrap(), 64 << 10);
        assert_eq!(chunk("2G").unwrap(), 2 << 30);
        assert!(chunk("65535").is_err());
        assert!(chunk(&((2u64 << 30) + 1).to_string()).is_err());
        let Command::Cp(a) = parse(&["cp", "--chunk", "64K", "a", "b"]).unwrap().command else {
            panic!("not cp")
        };
        assert_eq!(a.chunk, Some(64 << 10));
        let help = Cli::command()
            .find_subcommand("cp")
            .and_then(|c| c.get_arguments().find(|a| a.get_id() == "chunk").cloned())
            .and_then(|a| a.get_help().map(|h| h.to_string()))
            .unwrap_or_default();
        assert!(help.contains("64K to 2G"), "{help}");
    }

    /// The old spellings keep working, hidden: `cp --cc`, `cp --size`,
    /// `perf --rate`; the new ones are iperf3's where it has one.
    #[test]
    fn one_name_per_idea_with_the_old_names_kept() {
        for cc in [
            &["-C", "cubic"][..],
            &["--congestion", "cubic"],
            &["--cc", "cubic"],
        ] {
            let mut args = vec!["cp"];
            args.extend(cc);
            args.extend(["a", "h:b"]);
            let Command::Cp(a) = parse(&args).unwrap().command else {
                panic!("not cp")
            };
            assert_eq!(a.congestion.as_deref(), Some("cubic"));
        }
        let fleet = |args: &[&str]| {
            let mut all = vec!["cp"];
            all.extend(args);
            all.extend(["a", "h:b"]);
            match parse(&all).unwrap().command {
                Command::Cp(a) => a.fleet,
                _ => panic!("not cp"),
            }
        };
        assert_eq!(fleet(&["--rank", "1", "--ranks", "4"]).count(), Some(4));
        assert_eq!(fleet(&["--rank", "1", "--size", "4"]).count(), Some(4));
        assert_eq!(fleet(&["--ranks", "auto"]).ranks, Some(Ranks::Auto));
        assert!(parse(&["cp", "--ranks", "0", "a", "h:b"]).is_err());
        for b in [&["-b", "5M"][..], &["--bitrate", "5M"], &["--rate", "5M"]] {
            let mut args = vec!["perf", "h", "-u"];
            args.extend(b);
            let Command::Perf(p) = parse(&args).unwrap().command else {
                panic!("not perf")
            };
            assert_eq!(p.rate, Some(5_000_000));
        }
        // Hidden: --help shows one name.
        let cp = Cli::command().find_subcommand("cp").cloned().unwrap();
        let shown: Vec<String> = cp
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect();
        assert!(shown.contains(&"congestion".to_owned()));
        assert!(!shown.contains(&"size".to_owned()), "{shown:?}");
    }

    /// The names issue 32 found with two meanings have one now, across
    /// every command's shown options.
    #[test]
    fn a_long_name_means_one_idea_in_every_command() {
        use std::collections::BTreeMap;
        let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (path, cmd) in all_commands() {
            for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                if let Some(long) = arg.get_long() {
                    seen.entry(long.to_owned()).or_default().push(path.clone());
                }
            }
        }
        // cp's --cc and perf's -C are one name now.
        assert!(!seen.contains_key("cc"), "{:?}", seen.get("cc"));
        // perf's UDP rate is --bitrate; --rate is a path's rate (cp, sync,
        // doctor, wan, matrix) and never perf's.
        let rate = &seen["rate"];
        assert!(!rate.iter().any(|p| p.ends_with("perf")), "{rate:?}");
        assert!(seen["bitrate"].iter().all(|p| p.ends_with("perf")));
        // The fleet's count is --ranks, not --size (bench disk's --size is a file's).
        assert!(
            seen["size"]
                .iter()
                .all(|p| !p.ends_with(" cp") && !p.ends_with(" sync")),
            "{:?}",
            seen["size"]
        );
        assert!(seen["congestion"].len() >= 3, "{:?}", seen["congestion"]);
        assert!(seen["retries"].len() >= 5, "{:?}", seen["retries"]);
    }

    /// Every iperf3 option that gets a hint is one perf really refuses (a
    /// hint never hides an option), and the hint names ours.
    #[test]
    fn iperf3_options_we_lack_name_ours() {
        for (names, hint) in IPERF3_ONLY {
            assert!(!hint.is_empty());
            for name in *names {
                let argv: Vec<std::ffi::OsString> = ["longhaul", "perf", "h", name, "1"]
                    .iter()
                    .map(Into::into)
                    .collect();
                let e = match Cli::try_parse_from(&argv) {
                    Ok(_) => panic!("perf takes {name}: drop it from IPERF3_ONLY"),
                    Err(e) => e,
                };
                let said =
                    iperf3_hint(&argv, &e).unwrap_or_else(|| panic!("no hint for {name}: {e}"));
                assert!(said.contains(hint), "{said}");
            }
        }
        // Another command's unknown option keeps clap's own error.
        let argv: Vec<std::ffi::OsString> = ["longhaul", "cp", "-k", "a", "b"]
            .iter()
            .map(Into::into)
            .collect();
        let e = Cli::try_parse_from(&argv).err().unwrap();
        assert!(iperf3_hint(&argv, &e).is_none());
    }

    #[test]
    fn format_reads_iperf3s_letters() {
        assert_eq!(
            format_unit("m").unwrap(),
            FormatUnit {
                bytes: false,
                power: 2
            }
        );
        assert_eq!(
            format_unit("G").unwrap(),
            FormatUnit {
                bytes: true,
                power: 3
            }
        );
        assert_eq!(
            format_unit("k").unwrap(),
            FormatUnit {
                bytes: false,
                power: 1
            }
        );
        assert!(format_unit("x").is_err());
        assert!(format_unit("").is_err());
    }

    #[test]
    fn the_definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    /// `--help` describes every option and argument it shows, in every
    /// command: none is a bare name a user has to guess the meaning of.
    #[test]
    fn every_option_shown_has_a_description() {
        let mut bare = Vec::new();
        for (path, cmd) in all_commands() {
            for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    bare.push(format!("{path}: {}", arg.get_id()));
                }
            }
            if path != "longhaul" && cmd.get_about().is_none() {
                bare.push(format!("{path}: (the command itself)"));
            }
        }
        assert!(bare.is_empty(), "without a description: {bare:#?}");
    }
}

/// `longhaul matrix` (crates/cli/src/cmd/matrix.rs).
#[derive(Args)]
#[command(
    after_help = "Tools: longhaul, longhaul-ssh (over ssh reach, no server), longhaul-perf, iperf3, iperf2, nuttcp, gridftp, xrootd, rsyncd, rsync-ssh, scp, tar-socket, cp (a local copy); each at `defaults` (as installed) and `best` (swept on each path and workload from the tool's grid in tools.toml; its winner is in the table and the document); longhaul-perf and iperf3 also `one-stream-bbr`, `one-stream-cubic` when named (e.g. iperf3:one-stream-cubic). CPU is read from a cgroup of each end (root). Paths: loopback, lan, 80ms, 100ms, satellite, or RTT/LOSS/RATE (e.g. 50ms/1e-5/1gbit); emulated paths need root and /dev/net/tun; far (with --far HOST: a real second host over ssh; GridFTP, XRootD, the rsync daemon and tar-socket, anonymous servers, are not started there)."
)]
pub struct MatrixArgs {
    /// Tools, comma-separated (default: every known tool; missing ones become rows that say
    /// how to install them). `NAME:SETTINGS` picks one settings (e.g. iperf3:best).
    #[arg(long, value_delimiter = ',')]
    pub tools: Vec<String>,
    /// More tools from a JSON file (a list of templates; docs/JSON.md, "matrix tools").
    #[arg(long, value_name = "FILE")]
    pub tools_file: Option<PathBuf>,
    /// Paths, comma-separated (default: loopback,80ms; --quick: loopback,lan).
    #[arg(long, value_delimiter = ',')]
    pub paths: Vec<String>,
    /// Workloads, comma-separated: mem, elephant, smallfiles, tree (default: those four); and
    /// syncs after a first copy: W+same (nothing changed) and W+changed (1% of the files
    /// differ), e.g. smallfiles+same. A sync's first copy is the tool's own put, before its clock;
    /// its rate is the data's bytes over the sync's seconds. Tools without a sync have no such cells.
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Directions, comma-separated: put (to the server), get (from it); default both.
    #[arg(long, value_delimiter = ',', value_parser = ["put", "get"])]
    pub directions: Vec<String>,
    /// Runs per cell; a cell is their median. 0: only the sweeps of `best` (with --resume,
    /// their winners are kept for a later run: a long path's sweeps split over several runs).
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Small data (32 MiB, 100 files, 2 s), loopback and one emulated path, still 3 runs a cell
    /// (a median with its spread); `best` from the winners the last archived matrix swept on
    /// each path (swept now where there are none).
    #[arg(long)]
    pub quick: bool,
    /// Bottleneck rate of the named emulated paths.
    #[arg(long, value_parser = rate, default_value = "1gbit")]
    pub rate: u64,
    /// Size of the elephant file.
    #[arg(long, value_parser = size)]
    pub size: Option<u64>,
    /// Number of small files (smallfiles; the tree has a tenth as many, of mixed sizes).
    #[arg(long)]
    pub files: Option<u32>,
    /// Seconds of each memory-to-memory run.
    #[arg(long, value_parser = duration)]
    pub seconds: Option<Duration>,
    /// Longest a single run may take before it is ended and counted as failed; on --far also
    /// the longest any wait on the far host may take (a command over ssh, its shell's answer, a
    /// copy of the data there or back).
    #[arg(long, value_parser = duration, default_value = "120s")]
    pub run_timeout: Duration,
    /// Rounds each candidate of a `best` sweep runs after its warm-up, alternated with the
    /// others; its figure is their median. One round finds a working winner fast (a smoke
    /// run); more rounds tell close candidates apart on a noisy host.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub sweep_rounds: u32,
    /// Keep finished cells in FILE (the --json document) and skip them when run again.
    #[arg(long, value_name = "FILE")]
    pub resume: Option<PathBuf>,
    /// Also take the finished cells and the sweeps' winners of FILE, another run's --resume file
    /// (repeatable, read only; --resume's own win): one document from pieces run apart, printed
    /// with nothing left to run. Cells of other data (--size, --files, --seconds, --cold) are left
    /// out.
    #[arg(long, value_name = "FILE")]
    pub merge: Vec<PathBuf>,
    /// Where the data and the servers' files go (default: a temporary directory, removed after):
    /// a directory on the disk under test for copies from and to that disk. A workload's data
    /// already in DIR/data/WORKLOAD is used as it is (e.g. a tree of your own).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Drop the page cache (sync, then 3 into /proc/sys/vm/drop_caches) before every timed run,
    /// so that each reads its source from the disk and writes to a cold cache: a copy from and to
    /// a disk (--work-dir) as a user's first copy meets it. Needs root; refused, not ignored,
    /// without it. On --far only this host's cache is dropped.
    #[arg(long)]
    pub cold: bool,
    /// Another longhaul build as tools of their own, for an A/B of two builds in one run:
    /// `--build old=/path/to/longhaul` adds longhaul@old, longhaul-perf@old and longhaul-ssh@old,
    /// the built-in longhaul tools with that program as client and server. Repeatable.
    #[arg(long, value_name = "NAME=PATH")]
    pub build: Vec<String>,
    /// A second real host, reached by ssh: the path `far` (the default path with it), where
    /// the matrix starts the peers' servers. It needs only ssh and longhaul there.
    #[arg(long, value_name = "HOST")]
    pub far: Option<String>,
    /// The command that runs ssh for --far, with its options (default: ssh).
    #[arg(long, value_name = "CMD", env = "LONGHAUL_RSH")]
    pub rsh: Option<String>,
    /// The longhaul program on the --far host (default: longhaul on its PATH).
    #[arg(long, value_name = "PATH")]
    pub remote_path: Option<String>,
    /// Print the tables as Markdown instead of for the terminal. (Not `--format`: that is
    /// perf's unit of rates, as iperf3's `-f`.)
    #[arg(long, conflicts_with_all = ["csv", "json"])]
    pub md: bool,
    /// Print every cell as a CSV row instead of the tables.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Print the versioned JSON document (format longhaul-matrix) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only print the plan and its expected time.
    #[arg(long)]
    pub dry_run: bool,
}
