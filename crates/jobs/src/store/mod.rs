//! Where jobs and the state of each of their files are kept, behind one
//! small trait ([`JobStore`]) with two implementations: SQLite in the
//! server's state directory (one server, the default) and PostgreSQL,
//! shared by a group of servers that lease jobs from it, heartbeat, and
//! take over the jobs of a server that stopped heartbeating.
//!
//! A lease is a deadline in the job's row: a server that holds a job
//! renews it every second (its lease lasts [`crate::LEASE_S`], or
//! `--jobs-lease`); a job whose lease ran out
//! is leased again by whoever asks next. So no job stays active without a
//! live worker, and a result written by a server that lost its lease is
//! dropped ([`JobStore::save`] checks the holder).

#[cfg(feature = "postgres")]
pub mod postgres;
pub mod sqlite;

use longhaul_proto::job::{
    AttemptView, DiscardView, FileCounts, FileState, JobKind, JobSpec, JobState,
};
use longhaul_proto::xfer::Kind;

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Usage(String),
    #[error("the jobs' database ({at}) failed: {why}")]
    Db { at: String, why: String },
    #[error("job {job}: its {column} in the jobs' database does not read ({why}): was the row written by a newer longhaul, or changed by hand?")]
    BadRow {
        job: String,
        column: String,
        why: String,
    },
}

impl From<StoreError> for longhaul_engine::EngineError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Usage(m) => longhaul_engine::EngineError::Usage(m),
            e => longhaul_engine::EngineError::Failed(e.to_string()),
        }
    }
}

/// How many attempts a job's row keeps in its history.
pub const HISTORY_KEPT: usize = 20;

/// A job as stored: what it is, where it stands, who holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    /// 16 hex digits.
    pub id: String,
    /// The grant that submitted it: the only one that sees and steers it.
    pub owner: String,
    pub kind: JobKind,
    pub state: JobState,
    /// What to do, with the far ends' capabilities (secrets).
    pub spec: JobSpec,
    /// Unix seconds.
    pub created: u64,
    pub updated: u64,
    /// When its capabilities end.
    pub expires: u64,
    /// When it is next due (an attempt, a recurring run, or a chore).
    pub next_attempt: u64,
    /// Attempts made so far (of this run, for a recurring job).
    pub attempts: u32,
    /// Runs of a recurring job ended so far.
    pub runs: u32,
    /// Its files are listed (its current run walked its sources).
    pub listed: bool,
    /// Its owner asked for it to stop.
    pub cancel: bool,
    pub error: Option<String>,
    /// The server that holds its lease, and until when.
    pub worker: Option<String>,
    pub lease_until: u64,
    /// The secret its notifications are signed with.
    pub notify_secret: Option<String>,
    /// Its end was told (webhook, mail), and its capabilities revoked.
    pub notified: bool,
    pub revoked: bool,
    pub history: Vec<AttemptView>,
    /// While active: bytes moved so far and the rate, as the holder last
    /// heartbeat them.
    pub live_bytes: u64,
    pub live_bps: Option<f64>,
    /// A cancelled job's partial files at each far end, and whether they
    /// are removed yet (a far end that could not be reached at the cancel
    /// is tried again, with backoff).
    pub discards: Vec<DiscardView>,
    /// A pull: the shallowest directory of its destination's path (relative
    /// to the job server's export) that did not exist when it was
    /// submitted, which a cancel removes, with the directories beneath it,
    /// while they are empty. Written once, at the insert. A push over ssh:
    /// the same on the far host (relative to its one-shot server's export,
    /// `root` or `home`), found when the job first reaches the host, before
    /// it writes there ([`JobStore::note_made`]).
    pub made: Option<String>,
}

impl JobRow {
    /// Whether only chores are left: its end told, its capabilities revoked.
    pub fn chores_left(&self) -> bool {
        self.state.is_terminal() && !(self.notified && self.revoked)
    }
}

/// One entry of a job's sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRow {
    /// As the transfer names it (its source's name first).
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    pub state: FileState,
    pub attempts: u32,
    pub error: Option<String>,
    /// Its failure would recur at every attempt ([`crate::lasting`]): it
    /// is not due again, and its attempts are not counted on.
    pub permanent: bool,
}

/// What happened to some files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    pub path: String,
    pub state: FileState,
    pub error: Option<String>,
    /// [`FileRow::permanent`].
    pub permanent: bool,
}

impl FileChange {
    /// `path` failed with `error`, permanent or not as
    /// [`crate::lasting::permanent`] reads it.
    pub fn failed(path: String, error: String) -> FileChange {
        FileChange {
            path,
            state: FileState::Failed,
            permanent: crate::lasting::permanent(&error),
            error: Some(error),
        }
    }
}

/// A page of a job's files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileQuery {
    /// Only files in this state.
    pub state: Option<FileState>,
    pub from: u64,
    pub limit: u32,
}

/// A job's files, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Regular files by state, and any other entry that failed (a
    /// directory named without `-r`, one that could not be listed).
    pub counts: FileCounts,
    /// Entries an attempt would carry (not finished, attempts left, not
    /// failed permanently).
    pub due: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
}

impl Tally {
    /// Counts `n` entries in `state` (regular files if `file`) of `bytes`
    /// in all, `due` of them still to carry.
    pub fn add(&mut self, state: FileState, file: bool, n: u64, bytes: u64, due: u64) {
        self.due += due;
        if file || state == FileState::Failed {
            self.counts.add(state, n);
        }
        if file {
            self.bytes_total += bytes;
            if state == FileState::Finished {
                self.bytes_done += bytes;
            }
        }
    }
}

/// A job in flight, as its holder heartbeats it.
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    pub id: String,
    pub bytes: u64,
    pub bps: Option<f64>,
}

/// What a heartbeat learns of the jobs it renews.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Beat {
    /// Their owners asked them to stop.
    pub cancelled: Vec<String>,
    /// This server no longer holds them (another took them over).
    pub lost: Vec<String>,
}

/// Where jobs live.
pub trait JobStore: Send + Sync {
    /// Keeps a new job.
    fn insert(&self, job: &JobRow) -> Result<(), StoreError>;
    /// Jobs of `owner` that have not ended.
    fn live_jobs_of(&self, owner: &str) -> Result<u64, StoreError>;
    /// Forgets `owner`'s ended jobs older than its `keep` newest ended
    /// ones that have nothing left to do (their end told, their
    /// capabilities revoked), with their entries; how many ended jobs of
    /// `owner` are left.
    fn forget_ended(&self, owner: &str, keep: u64) -> Result<u64, StoreError>;
    /// Leases the next job due at `now` to `worker` until `until`: one
    /// waiting for an attempt (its `next_attempt` passed), one whose
    /// holder's lease ran out (taken over), or an ended one with chores
    /// left. Its row as it was, with the lease.
    fn lease(&self, worker: &str, now: u64, until: u64) -> Result<Option<JobRow>, StoreError>;
    /// Renews `worker`'s leases of `live` until `until`, with their
    /// progress; which of them were cancelled, and which are lost.
    fn heartbeat(&self, worker: &str, until: u64, live: &[Live]) -> Result<Beat, StoreError>;
    /// Writes `job` back (state, times, attempts, history, flags). With
    /// `holder`, only if that server still holds its lease (false: it does
    /// not, and nothing was written); the lease goes with the row's
    /// `worker` and `lease_until`.
    fn save(&self, job: &JobRow, holder: Option<&str>) -> Result<bool, StoreError>;
    fn get(&self, id: &str) -> Result<Option<JobRow>, StoreError>;
    /// Every job of `owner` (every job with None), newest first.
    fn list(&self, owner: Option<&str>) -> Result<Vec<JobRow>, StoreError>;
    /// Asks a job to stop: true if it had not ended. The holder's next
    /// heartbeat learns it; a job nobody holds ends at once (its chores
    /// left to whoever leases it next).
    fn cancel(&self, id: &str, now: u64) -> Result<bool, StoreError>;
    /// The job's entries as its run's walk found them: new ones are
    /// added as the walk found them (`submitted`, or `failed` and perhaps
    /// permanently); with `fresh` (a new run of a recurring job) all
    /// start over. Entries the walk no longer finds are dropped.
    fn put_files(&self, id: &str, files: &[FileRow], fresh: bool) -> Result<(), StoreError>;
    /// Sets the state (and error) of some entries.
    fn change_files(&self, id: &str, changes: &[FileChange]) -> Result<(), StoreError>;
    /// One more attempt for every entry an attempt now carries (`due`
    /// with `retries`), and for one its listing failed permanently (its
    /// first: the attempt that failed it), but never again for that.
    fn count_attempt(&self, id: &str, retries: u32) -> Result<(), StoreError>;
    /// The failed entries go again (the permanent ones too: their owner
    /// asks, having changed what failed them): `submitted`, attempts from
    /// zero.
    fn retry_failed(&self, id: &str) -> Result<u64, StoreError>;
    /// After an attempt whose transfer completed: every entry not yet
    /// finished finished (the transfer landed or skipped it), then those of
    /// `failed` failed, with their errors (and whether for good).
    fn settle(&self, id: &str, failed: &[FileChange]) -> Result<(), StoreError>;
    /// Notes what of a job's destination its push over ssh will make
    /// ([`JobRow::made`]), unless something is noted already.
    fn note_made(&self, id: &str, made: &str) -> Result<(), StoreError>;
    /// Entries in a state (all with None), ordered by path.
    fn files(&self, id: &str, q: FileQuery) -> Result<(Vec<FileRow>, u64), StoreError>;
    /// The job's files counted, `due` as an attempt with `retries` sees it.
    fn tally(&self, id: &str, retries: u32) -> Result<Tally, StoreError>;
    /// Jobs by state, every job (for metrics).
    fn by_state(&self) -> Result<Vec<(JobState, u64)>, StoreError>;
}

/// A kind's word in a row, and back.
pub fn kind_word(k: Kind) -> &'static str {
    match k {
        Kind::File => "file",
        Kind::Dir | Kind::DirEnd => "dir",
        Kind::Symlink => "symlink",
    }
}

pub fn kind_of(w: &str) -> Kind {
    match w {
        "dir" => Kind::Dir,
        "symlink" => Kind::Symlink,
        _ => Kind::File,
    }
}

pub fn job_kind_of(w: &str) -> JobKind {
    match w {
        "pull" => JobKind::Pull,
        "third_party" => JobKind::ThirdParty,
        _ => JobKind::Push,
    }
}

/// Tells an unreadable spec or history in a row: a row this build did not
/// write cannot be run.
pub fn decode<T: serde::de::DeserializeOwned>(
    what: &str,
    id: &str,
    text: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::Usage(format!(
            "job {id}: its {what} does not read ({e}): was it written by a newer longhaul?"
        ))
    })
}

/// A file of one byte still to do, for the stores' tests.
#[cfg(test)]
fn a_file(path: &str) -> FileRow {
    FileRow {
        path: path.into(),
        kind: Kind::File,
        size: 1,
        state: FileState::Submitted,
        attempts: 0,
        error: None,
        permanent: false,
    }
}

/// A cancelled push of owner `g1`, for the stores' tests.
#[cfg(test)]
fn a_job(id: &str) -> JobRow {
    JobRow {
        id: id.into(),
        owner: "g1".into(),
        kind: JobKind::Push,
        state: JobState::Cancelled,
        spec: sqlite::placeholder_spec(),
        created: 1,
        updated: 1,
        expires: 100,
        next_attempt: 1,
        attempts: 1,
        runs: 0,
        listed: true,
        cancel: true,
        error: None,
        worker: None,
        lease_until: 0,
        notify_secret: None,
        notified: true,
        revoked: false,
        history: Vec::new(),
        live_bytes: 0,
        live_bps: None,
        discards: Vec::new(),
        made: None,
    }
}
