//! Jobs that run unattended to the end (`serve --jobs`, `submit`, `jobs`;
//! docs/ARCHITECTURE.md section 17).
//!
//! A server that takes jobs keeps them ([`store`]: SQLite in its state
//! directory, or PostgreSQL shared by a group of servers), answers its
//! clients about them ([`desk`], the engine's `JobDesk`), and runs them
//! ([`runner`]): it leases a due job, walks its sources into a list of
//! entries with a state each, drives the engine's ordinary copy to the far
//! end with the capability that end issued for the job ([`attempt`]),
//! records what each file became, and retries with backoff (each retry
//! resumes from the destination's chunk journal), until every file is
//! finished or its attempts are used up; then it tells the job's end
//! ([`notify`]) and revokes its capabilities. The rules (states, derived
//! job state, backoff, recurrence) are `longhaul_proto::job`, sans I/O.
// Unit tests are scenarios, not shipped functions: only shipped code is held to 100 lines.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod attempt;
pub mod desk;
pub mod lasting;
pub mod made;
pub mod notify;
pub mod runner;
pub mod store;
pub mod view;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use longhaul_engine::server::observe::ServeObserver;
use longhaul_engine::xfer::Export;

/// How long a lease lasts without a heartbeat by default, seconds
/// (`serve --jobs-lease`): a server that died loses its jobs to the others
/// after at most this long. Heartbeats come every second; each renews it.
pub const LEASE_S: u64 = 30;

/// Where a server keeps its jobs.
#[derive(Clone, PartialEq, Eq)]
pub enum Place {
    /// `jobs.db` in this state directory.
    Sqlite(PathBuf),
    /// A PostgreSQL database shared with other servers (`--jobs URL`).
    Postgres(String),
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Sqlite(p) => write!(f, "Sqlite({})", p.display()),
            // The URL may carry a password.
            Place::Postgres(_) => f.write_str("Postgres(..)"),
        }
    }
}

/// How a server runs jobs.
#[derive(Clone)]
pub struct JobsConfig {
    pub place: Place,
    /// The server's exports (a job's end on this server is one of them).
    pub exports: Vec<Export>,
    /// The server's state directory: its grants (a job runs only while
    /// the grant that submitted it lives).
    pub state_dir: PathBuf,
    /// Attempts running at once.
    pub workers: usize,
    /// Jobs one grant may have that have not ended.
    pub max_per_grant: u64,
    /// The shortest interval of a recurring job.
    pub min_every: Duration,
    /// Where each attempt is archived (None: not archived).
    pub archive: Option<PathBuf>,
    /// The sendmail that `--mail` uses.
    pub sendmail: PathBuf,
    /// Told how many jobs are in each state (metrics).
    pub observers: Vec<Arc<dyn ServeObserver>>,
    /// This server's name in leases and attempts (host and port).
    pub worker: String,
    /// The time-outs of the runner's connections to far ends.
    pub connect_timeout: Duration,
    pub handshake_timeout: Duration,
    /// How long a lease lasts without a heartbeat, seconds (at least 3).
    pub lease_s: u64,
    /// An attempt that moves nothing for this long is stopped and tried
    /// again (it resumes): a connection a long outage left stuck does not
    /// hold the job.
    pub stall: Duration,
    /// The first wait before a retry, seconds; it doubles each attempt.
    pub backoff_first_s: u64,
    /// Open access (a demo or a test server): every client is the same
    /// grant, and no grant is looked up.
    pub open_access: bool,
    /// The hosts (`[USER@]HOST`, as written) this server may reach over
    /// ssh, as its own user, for a job's far end (`serve --jobs-ssh`):
    /// none unless its admin lists them.
    pub ssh_hosts: Vec<String>,
    /// How it reaches them (its ssh command, the far longhaul); always
    /// unattended (`BatchMode=yes`).
    pub ssh: longhaul_engine::reach::SshOptions,
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig {
            place: Place::Sqlite(PathBuf::new()),
            exports: Vec::new(),
            state_dir: PathBuf::new(),
            workers: 4,
            max_per_grant: 100,
            min_every: Duration::from_secs(60),
            archive: None,
            sendmail: PathBuf::from("/usr/sbin/sendmail"),
            observers: Vec::new(),
            worker: String::new(),
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            lease_s: LEASE_S,
            stall: Duration::from_secs(120),
            backoff_first_s: longhaul_proto::job::BACKOFF_FIRST_S,
            open_access: false,
            ssh_hosts: Vec::new(),
            ssh: Default::default(),
        }
    }
}

/// The store of `place`.
pub fn open_store(place: &Place) -> Result<Arc<dyn store::JobStore>, store::StoreError> {
    match place {
        Place::Sqlite(dir) => Ok(Arc::new(store::sqlite::SqliteStore::open(dir)?)),
        #[cfg(feature = "postgres")]
        Place::Postgres(url) => Ok(Arc::new(store::postgres::PgStore::connect(url)?)),
        #[cfg(not(feature = "postgres"))]
        Place::Postgres(_) => Err(store::StoreError::Usage(
            "--jobs postgres://...: this longhaul was built without PostgreSQL; it needs the Cargo feature `queue`, in the default build".into(),
        )),
    }
}

/// Starts taking and running jobs: the desk to hand the server
/// (`ServeConfig::jobs`), with the runner's threads behind it.
pub fn start(
    mut cfg: JobsConfig,
) -> Result<Arc<dyn longhaul_engine::server::jobs::JobDesk>, store::StoreError> {
    let store = open_store(&cfg.place)?;
    // Nobody answers the job server's ssh: a prompt would hold a worker.
    cfg.ssh.unattended = true;
    let cfg = Arc::new(cfg);
    let runner = runner::Runner::start(store.clone(), cfg.clone());
    Ok(Arc::new(desk::Desk::new(store, cfg, runner)))
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `n` random bytes from the OS.
pub(crate) fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the OS random source");
    b
}
