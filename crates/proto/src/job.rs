//! Jobs that outlive their session (PROTOCOL.md 18): the messages by which
//! a client submits a copy or sync to a server that runs it unattended,
//! and watches and steers it; and the job's rules, sans I/O: the states of
//! a job and of each of its files, how a job's state follows from its
//! files', which files an attempt carries, when the next attempt starts
//! (backoff, recurrence). Time is passed in as Unix seconds.
//!
//! FTS3's model: a job is a set of files with one set of options; each
//! file has its own state and attempts; the job's state is derived.

use serde::{Deserialize, Serialize};

use crate::xfer::SyncOptions;

/// The longest a job's capabilities may live, seconds (30 days): a job
/// that has not ended by then fails, and its far ends forget it.
pub const MAX_LIFETIME_S: u32 = 30 * 86_400;
/// What `submit` asks for without `--lifetime` (7 days).
pub const DEFAULT_LIFETIME_S: u32 = 7 * 86_400;
/// Attempts after the first, at most (`submit --retries`).
pub const MAX_RETRIES: u32 = 100;
/// `submit`'s default retries: with [`backoff`] about 25 minutes of
/// failures before a job gives up.
pub const DEFAULT_RETRIES: u32 = 10;
/// Sources a job may name.
pub const MAX_SOURCES: usize = 1024;
/// Bytes of one path, export or host name in a job.
pub const MAX_PATH: usize = 4096;
/// Include/exclude rules a job may carry.
pub const MAX_FILTER_RULES: usize = 1024;
/// Bytes of a notification URL.
pub const MAX_URL: usize = 2048;
/// Bytes of a mail address (RFC 5321's path limit).
pub const MAX_MAIL: usize = 254;
/// Files one `show` answer lists, at most.
pub const FILES_PAGE_MAX: u32 = 2000;
/// Tries of a cancelled job's discard at one far end, at most: with
/// [`backoff`] (doubling to five minutes) about eight hours of a far end
/// that cannot be reached, and never past the job's lifetime (a far
/// server's capability ends with it).
pub const MAX_DISCARD_TRIES: u32 = 100;
/// The first wait before a retry, seconds; it doubles each attempt...
pub const BACKOFF_FIRST_S: u64 = 5;
/// ...up to this (five minutes).
pub const BACKOFF_MAX_S: u64 = 300;

/// A job's state: derived from its files' and its own flags ([`derive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for its first (or next) attempt.
    Submitted,
    /// A server runs an attempt now (and holds its lease).
    Active,
    /// Every file finished, verified.
    Finished,
    /// Some files finished, some failed for good.
    FinishedWithFailures,
    /// Nothing finished, or the job could not run (its attempts used up,
    /// its capabilities expired).
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 6] = [
        JobState::Submitted,
        JobState::Active,
        JobState::Finished,
        JobState::FinishedWithFailures,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// Whether the job is over: nothing will run for it again.
    pub fn is_terminal(self) -> bool {
        !matches!(self, JobState::Submitted | JobState::Active)
    }

    /// The word the store, the JSON and people use.
    pub fn word(self) -> &'static str {
        match self {
            JobState::Submitted => "submitted",
            JobState::Active => "active",
            JobState::Finished => "finished",
            JobState::FinishedWithFailures => "finished_with_failures",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn from_word(s: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|j| j.word() == s)
    }
}

/// One file's state in a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileState {
    /// Not yet moved (never tried, or the attempt that carried it broke).
    Submitted,
    /// At the destination, verified (or already there: skipped).
    Finished,
    /// The transfer said this file failed (its error is kept).
    Failed,
    /// The job was cancelled before it finished.
    Cancelled,
}

impl FileState {
    pub const ALL: [FileState; 4] = [
        FileState::Submitted,
        FileState::Finished,
        FileState::Failed,
        FileState::Cancelled,
    ];

    pub fn word(self) -> &'static str {
        match self {
            FileState::Submitted => "submitted",
            FileState::Finished => "finished",
            FileState::Failed => "failed",
            FileState::Cancelled => "cancelled",
        }
    }

    pub fn from_word(s: &str) -> Option<FileState> {
        FileState::ALL.into_iter().find(|f| f.word() == s)
    }

    /// The state after an attempt that carried the file: `landed` if the
    /// transfer landed (or skipped) it, `failed` if it named it failed;
    /// neither (the attempt broke first) leaves it as it was.
    pub fn after(self, landed: bool, failed: bool) -> FileState {
        match (self, landed, failed) {
            (FileState::Cancelled | FileState::Finished, _, _) => self,
            (_, _, true) => FileState::Failed,
            (_, true, false) => FileState::Finished,
            (s, false, false) => s,
        }
    }

    /// Whether an attempt carries this file: not yet finished, and tried
    /// at most `retries` times.
    pub fn due(self, attempts: u32, retries: u32) -> bool {
        matches!(self, FileState::Submitted | FileState::Failed) && attempts <= retries
    }
}

/// A job's files by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCounts {
    pub submitted: u64,
    pub finished: u64,
    pub failed: u64,
    pub cancelled: u64,
}

impl FileCounts {
    pub fn add(&mut self, s: FileState, n: u64) {
        match s {
            FileState::Submitted => self.submitted += n,
            FileState::Finished => self.finished += n,
            FileState::Failed => self.failed += n,
            FileState::Cancelled => self.cancelled += n,
        }
    }

    pub fn total(&self) -> u64 {
        self.submitted + self.finished + self.failed + self.cancelled
    }
}

/// What a job's state follows from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    pub counts: FileCounts,
    /// Files an attempt would carry (submitted or failed, with attempts left).
    pub due: u64,
    /// The job has its file list (its first attempt walked the sources).
    pub listed: bool,
    /// Attempts made so far, and the retries allowed after the first.
    pub attempts: u32,
    pub retries: u32,
    pub cancelled: bool,
    /// A server holds its lease and runs an attempt.
    pub running: bool,
    /// Its capabilities' lifetime has ended.
    pub expired: bool,
}

/// The job's state from where it stands: cancelled and running come
/// first; then a job with work left and attempts left is submitted;
/// otherwise its files say: all finished, some, or none.
pub fn derive(s: &Standing) -> JobState {
    if s.cancelled {
        return JobState::Cancelled;
    }
    if s.running {
        return JobState::Active;
    }
    let work_left = s.due > 0 || !s.listed;
    if work_left && s.attempts <= s.retries && !s.expired {
        return JobState::Submitted;
    }
    let c = &s.counts;
    if !s.listed || (c.finished == 0 && c.total() > 0) {
        return JobState::Failed;
    }
    if c.failed > 0 || c.submitted > 0 {
        JobState::FinishedWithFailures
    } else {
        JobState::Finished
    }
}

/// The wait before attempt `attempt + 1` after `attempt` attempts (from
/// 1): `first_s` (the server's `--jobs-backoff`, [`BACKOFF_FIRST_S`] by
/// default), then twice that, four times ... at most five minutes;
/// `jitter` in `0.0..1.0` (the caller's random draw) adds up to a fifth,
/// so servers that failed together do not all retry at the same instant.
pub fn backoff(first_s: u64, attempt: u32, jitter: f64) -> u64 {
    let doubled = first_s
        .max(1)
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(20));
    let base = doubled.min(BACKOFF_MAX_S);
    base + (base as f64 * jitter.clamp(0.0, 1.0) / 5.0) as u64
}

/// When a recurring job's next run starts: one interval after the last
/// run started, or at once if that run took longer (a run that would
/// overlap the last waits for it, and only one waits).
pub fn next_run(last_started: u64, ended: u64, every_s: u64) -> u64 {
    last_started.saturating_add(every_s.max(1)).max(ended)
}

/// A job's kind, from where its ends are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// From the job server's export to a far server.
    Push,
    /// From a far server into the job server's export.
    Pull,
    /// Between two far servers, ordered by the job server.
    ThirdParty,
}

impl JobKind {
    pub fn word(self) -> &'static str {
        match self {
            JobKind::Push => "push",
            JobKind::Pull => "pull",
            JobKind::ThirdParty => "third_party",
        }
    }
}

/// A far end's word for this job: the capability it issued and the
/// fingerprint of its certificate as the submitting client saw it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCredential {
    /// `SHA256:...`: the job server pins it.
    pub fingerprint: String,
    /// `lh1c_...`: a secret, never logged or shown.
    pub capability: String,
    /// What the far end gave, seconds from its issue.
    pub lifetime_s: u32,
}

impl std::fmt::Debug for JobCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobCredential")
            .field("fingerprint", &self.fingerprint)
            .field("lifetime_s", &self.lifetime_s)
            .finish_non_exhaustive()
    }
}

/// One end of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEnd {
    /// `HOST[:PORT]` of a far server; absent: the job server itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub export: String,
    /// Paths within the export: the sources at the source end (all with
    /// a trailing `/` or none), exactly one at the destination.
    pub paths: Vec<String>,
    /// The destination was named with a trailing `/`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dir: bool,
    /// A far end's capability for this job; absent for the job server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<JobCredential>,
    /// A host with no longhaul server, reached over ssh by the job server
    /// (`[USER@]HOST`, one its admin allowed: `serve --jobs-ssh`): `paths`
    /// are as written after `HOST:` (scp's), `export` is empty, and there
    /// is no `host` and no `credential`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<String>,
}

impl JobEnd {
    /// `HOST:EXPORT/path` (or `EXPORT/path` on the job server), for people.
    pub fn shown(&self) -> String {
        let paths = self.paths.join(" ");
        match (&self.host, &self.ssh) {
            (_, Some(h)) => format!("{h}:{paths}"),
            (Some(h), None) => format!("{h}:{}/{paths}", self.export),
            (None, None) => format!("{}/{paths}", self.export),
        }
    }

    /// Not the job server's: another server's or a host over ssh.
    pub fn is_far(&self) -> bool {
        self.host.is_some() || self.ssh.is_some()
    }
}

/// What the job does, as `cp`/`sync` would take it unattended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOptions {
    #[serde(default)]
    pub recursive: bool,
    #[serde(default)]
    pub preserve: bool,
    #[serde(default)]
    pub mkpath: bool,
    #[serde(default)]
    pub verify: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncOptions>,
    /// rsync's rules, `+ PATTERN` / `- PATTERN`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filter: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_size: Option<u64>,
    /// bits/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    /// Attempts after the first (a broken transfer, a failed file).
    #[serde(default)]
    pub retries: u32,
    /// A recurring sync: run again this many seconds after a run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_s: Option<u64>,
    /// POST the job's end here (http or https).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<String>,
    /// Mail the job's end here through the server's sendmail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mail: Option<String>,
}

/// Client -> job server (0x60): run this job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub source: JobEnd,
    pub dest: JobEnd,
    pub options: JobOptions,
}

/// Client -> job server (0x61): about the jobs of the client's grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum JobCommand {
    List {},
    /// One job, with a page of its files (`files_from`, at most
    /// `files_limit` of [`FILES_PAGE_MAX`]; of one state if `state`).
    Show {
        id: String,
        #[serde(default)]
        files_from: u64,
        #[serde(default)]
        files_limit: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state: Option<FileState>,
    },
    Cancel {
        id: String,
    },
    /// Send again the files that failed (only those).
    Retry {
        id: String,
    },
}

/// One attempt (or run, for a recurring job) of a job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptView {
    pub attempt: u32,
    /// Unix seconds.
    pub started: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<f64>,
    /// The server that ran it.
    pub worker: String,
    /// `ok`, `partial` (some files failed), `failed`, `cancelled`, or
    /// `running`; `lost` for one whose server died.
    pub outcome: String,
    pub files: u64,
    pub bytes: u64,
    pub resumed_bytes: u64,
    pub sent_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its run in the archive of the server that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive_run: Option<i64>,
}

/// A job as `jobs` lists it and `jobs show` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    pub id: String,
    pub state: JobState,
    pub kind: JobKind,
    pub source: String,
    pub dest: String,
    /// A sync (else a copy).
    pub sync: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_s: Option<u64>,
    /// Unix seconds.
    pub created: f64,
    pub updated: f64,
    /// When its capabilities end.
    pub expires: f64,
    pub attempts: u32,
    pub retries: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt: Option<f64>,
    pub files: FileCounts,
    pub bytes_total: u64,
    pub bytes_done: u64,
    /// While active: the latest rate (bits/s) and the time left at it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_bps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The server that holds it while active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// The runs of a recurring job so far.
    #[serde(default)]
    pub runs: u32,
    /// Its latest attempts, oldest first (`show` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<AttemptView>,
    /// A cancelled job's partial files at each far end, and whether they
    /// are removed yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discards: Vec<DiscardView>,
}

/// Where a cancelled job's discard at one far end stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiscardState {
    /// Not done yet (the far end could not be reached): tried again at
    /// its `next_try`.
    #[default]
    Pending,
    /// The partial files there are removed.
    Done,
    /// Its tries ([`MAX_DISCARD_TRIES`]) or the job's lifetime ran out:
    /// the partial files there stay.
    GivenUp,
}

impl DiscardState {
    pub fn word(self) -> &'static str {
        match self {
            DiscardState::Pending => "pending",
            DiscardState::Done => "done",
            DiscardState::GivenUp => "given_up",
        }
    }
}

/// A cancelled job's partial files at one far end (a far server or a host
/// over ssh), removed there ([`DiscardState`]): kept with the job, so that
/// a far end that could not be reached at the cancel has them removed
/// once it can.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiscardView {
    /// The far end: `HOST[:PORT]` of a server, `[USER@]HOST` over ssh.
    pub end: String,
    pub state: DiscardState,
    /// Tries so far.
    pub tries: u32,
    /// While pending: when it is tried again (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_try: Option<f64>,
    /// Why the last try failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Partial files and journals removed (once done).
    #[serde(default)]
    pub removed: u64,
}

/// One file of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileView {
    /// As the transfer names it (its source's name first).
    pub path: String,
    pub state: FileState,
    pub size: u64,
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Failed for good: every attempt would fail it the same way (a
    /// directory named without `-r`, a path not there, permission
    /// refused), so none is made for it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub permanent: bool,
}

/// Job server -> client (0x62): the answer to a [`JobSpec`] or a
/// [`JobCommand`].
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum JobAnswer {
    /// Taken: its id, and the secret its notifications are signed with
    /// (when it has a `notify` URL), told this once.
    Accepted {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        notify_secret: Option<String>,
    },
    List {
        jobs: Vec<JobView>,
    },
    Show {
        job: Box<JobView>,
        files: Vec<FileView>,
        /// Files of the asked state in all (the page is `files`).
        files_total: u64,
    },
    Cancelled {
        id: String,
    },
    /// The failed files go again: how many.
    Retried {
        id: String,
        files: u64,
    },
}

impl std::fmt::Debug for JobAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobAnswer::Accepted { id, .. } => f
                .debug_struct("Accepted")
                .field("id", id)
                .finish_non_exhaustive(),
            JobAnswer::List { jobs } => f.debug_struct("List").field("jobs", jobs).finish(),
            JobAnswer::Show {
                job,
                files,
                files_total,
            } => f
                .debug_struct("Show")
                .field("job", job)
                .field("files", files)
                .field("files_total", files_total)
                .finish(),
            JobAnswer::Cancelled { id } => f.debug_struct("Cancelled").field("id", id).finish(),
            JobAnswer::Retried { id, files } => f
                .debug_struct("Retried")
                .field("id", id)
                .field("files", files)
                .finish(),
        }
    }
}

/// Whether `id` has the form of a job id: 16 lowercase hex digits.
pub fn valid_id(id: &str) -> bool {
    id.len() == 16
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn text_ok(what: &str, s: &str, max: usize) -> Result<(), String> {
    if s.len() > max {
        return Err(format!("{what} is longer than {max} bytes"));
    }
    if s.chars().any(|c| c == '\0' || c == '\n' || c == '\r') {
        return Err(format!("{what} holds a NUL or a line break"));
    }
    Ok(())
}

/// Whether `addr` is a plain mail address a sendmail command line may
/// carry: `local@domain`, no spaces, quotes, line breaks or leading `-`.
pub fn valid_mail(addr: &str) -> bool {
    let Some((local, domain)) = addr.split_once('@') else {
        return false;
    };
    let local_ok = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+/=?^_`{|}~.-".contains(c);
    let domain_ok = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == '-';
    addr.len() <= MAX_MAIL
        && !local.is_empty()
        && !domain.is_empty()
        && !addr.starts_with('-')
        && local.chars().all(local_ok)
        && domain.chars().all(domain_ok)
        && !domain.starts_with(['.', '-'])
}

/// Whether `url` may be a notification URL: `http://` or `https://`, no
/// credentials in it, printable ASCII, within [`MAX_URL`].
pub fn valid_notify_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("a notification URL starts with https:// or http://")?;
    if url.len() > MAX_URL {
        return Err(format!(
            "the notification URL is longer than {MAX_URL} bytes"
        ));
    }
    if !url.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "the notification URL holds a space or a byte that is not printable ASCII".into(),
        );
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Err("the notification URL names no host".into());
    }
    if authority.contains('@') {
        return Err("the notification URL carries credentials (user@): a job stores none; check the signature instead".into());
    }
    Ok(())
}

impl JobEnd {
    fn check(&self, what: &str) -> Result<(), String> {
        if let Some(h) = &self.ssh {
            text_ok(&format!("the {what} ssh host"), h, 255)?;
            if h.is_empty() || h.starts_with('-') || h.contains(char::is_whitespace) {
                return Err(format!(
                    "the {what} ssh host '{h}' is no [USER@]HOST (ssh would read one starting with '-' as an option)"
                ));
            }
            if self.host.is_some() || self.credential.is_some() || !self.export.is_empty() {
                return Err(format!(
                    "the {what} is a host over ssh: it has no server, export or capability"
                ));
            }
            for p in &self.paths {
                text_ok(&format!("a {what} path"), p, MAX_PATH)?;
            }
            return Ok(());
        }
        if let Some(h) = &self.host {
            text_ok(&format!("the {what} host"), h, 255)?;
            if h.is_empty() {
                return Err(format!("the {what} host is empty"));
            }
        }
        text_ok(&format!("the {what} export"), &self.export, 255)?;
        if self.export.is_empty() {
            return Err(format!("the {what} names no export"));
        }
        for p in &self.paths {
            text_ok(&format!("a {what} path"), p, MAX_PATH)?;
        }
        if let Some(c) = &self.credential {
            if !c
                .capability
                .starts_with(crate::xfer::copy::CAPABILITY_PREFIX)
                || c.capability.len() > 128
            {
                return Err(format!(
                    "the {what}'s credential is not a capability (lh1c_...): a job carries no other credential"
                ));
            }
            text_ok(&format!("the {what}'s fingerprint"), &c.fingerprint, 128)?;
        }
        match (&self.host, &self.credential) {
            (Some(h), None) => Err(format!(
                "the {what} ({h}) is another server, and the job carries no capability of it"
            )),
            (None, Some(_)) => Err(format!(
                "the {what} is this server: a job carries no capability of it"
            )),
            _ => Ok(()),
        }
    }
}

/// Why a job with a host over ssh has the job server's export as its
/// other end (`{way}`: its direction): the job server reaches the host
/// with its own ssh and moves the data itself; it relays nothing between
/// two other hosts (a server and the ssh host), which would carry every
/// byte twice through it.
const SSH_BETWEEN_OTHERS: &str = "a job {way} the job server's own export: submit it to the server of its other end (leave out --via), which reaches the host with its own ssh if its admin allows it (`serve --jobs-ssh [USER@]HOST`); a job server relays no data between two other hosts";

impl JobSpec {
    /// The job's kind, from which end is the job server's.
    pub fn kind(&self) -> Result<JobKind, String> {
        if self.source.ssh.is_some() && self.dest.is_far() {
            return Err(SSH_BETWEEN_OTHERS.replace("{way}", "from a host over ssh goes into"));
        }
        if self.dest.ssh.is_some() && self.source.is_far() {
            return Err(SSH_BETWEEN_OTHERS.replace("{way}", "to a host over ssh goes from"));
        }
        match (self.source.is_far(), self.dest.is_far()) {
            (false, true) => Ok(JobKind::Push),
            (true, false) => Ok(JobKind::Pull),
            (true, true) => Ok(JobKind::ThirdParty),
            (false, false) => Err(
                "the source and the destination are both on the job server: a job moves data between servers (copy within a server with cp on it)".into(),
            ),
        }
    }

    /// Whether the job is well formed, within the budgets above. Says
    /// what is wrong, never panics, allocates nothing of the peer's size.
    pub fn check(&self) -> Result<JobKind, String> {
        let kind = self.kind()?;
        self.source.check("source")?;
        self.dest.check("destination")?;
        let n = self.source.paths.len();
        if n == 0 || n > MAX_SOURCES {
            return Err(format!("a job names 1 to {MAX_SOURCES} sources, not {n}"));
        }
        let slashed = self
            .source
            .paths
            .iter()
            .filter(|p| p.ends_with('/'))
            .count();
        if slashed > 0 && slashed < n {
            return Err("name every source with a trailing '/' (their contents) or none".into());
        }
        if self.dest.paths.len() != 1 {
            return Err("a job names one destination".into());
        }
        let o = &self.options;
        if o.retries > MAX_RETRIES {
            return Err(format!(
                "--retries {} is more than {MAX_RETRIES}",
                o.retries
            ));
        }
        if o.filter.len() > MAX_FILTER_RULES {
            return Err(format!(
                "more than {MAX_FILTER_RULES} include/exclude rules"
            ));
        }
        for r in &o.filter {
            text_ok("an include/exclude rule", r, MAX_PATH)?;
        }
        if o.every_s.is_some() && o.sync.is_none() {
            return Err("--every makes a recurring sync: submit it with `longhaul submit --sync` (a recurring cp would copy everything again each time)".into());
        }
        if o.every_s == Some(0) {
            return Err("--every takes an interval of at least one second".into());
        }
        if let Some(u) = &o.notify {
            valid_notify_url(u)?;
        }
        if let Some(m) = &o.mail {
            if !valid_mail(m) {
                return Err(format!(
                    "--mail '{}' is not a plain address (local@domain)",
                    crate::units::escaped(&m.chars().take(80).collect::<String>())
                ));
            }
        }
        Ok(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standing(c: FileCounts) -> Standing {
        Standing {
            counts: c,
            due: c.submitted + c.failed,
            listed: true,
            attempts: 1,
            retries: 3,
            ..Standing::default()
        }
    }

    #[test]
    fn a_jobs_state_follows_from_its_files() {
        let c = |submitted, finished, failed| FileCounts {
            submitted,
            finished,
            failed,
            cancelled: 0,
        };
        assert_eq!(derive(&standing(c(0, 5, 0))), JobState::Finished);
        // Work left and attempts left: it waits for the next attempt.
        assert_eq!(derive(&standing(c(1, 4, 0))), JobState::Submitted);
        assert_eq!(derive(&standing(c(0, 4, 1))), JobState::Submitted);
        // Attempts used up: what is left failed.
        let spent = |s: Standing| Standing {
            attempts: 4,
            due: 0,
            ..s
        };
        assert_eq!(
            derive(&spent(standing(c(0, 4, 1)))),
            JobState::FinishedWithFailures
        );
        assert_eq!(derive(&spent(standing(c(0, 0, 3)))), JobState::Failed);
        // A job whose attempts ran out before it listed its files failed.
        let unlisted = Standing {
            listed: false,
            attempts: 4,
            ..Standing::default()
        };
        assert_eq!(derive(&unlisted), JobState::Failed);
        // Running and cancelled come first.
        let running = Standing {
            running: true,
            ..standing(c(3, 0, 0))
        };
        assert_eq!(derive(&running), JobState::Active);
        let cancelled = Standing {
            cancelled: true,
            running: true,
            ..standing(c(3, 0, 0))
        };
        assert_eq!(derive(&cancelled), JobState::Cancelled);
        // Expired with work left: no more attempts.
        let expired = Standing {
            expired: true,
            ..standing(c(1, 4, 0))
        };
        assert_eq!(derive(&expired), JobState::FinishedWithFailures);
        // An empty tree, listed: finished.
        assert_eq!(derive(&standing(c(0, 0, 0))), JobState::Finished);
    }

    #[test]
    fn a_files_state_moves_only_forward() {
        use FileState as F;
        assert_eq!(F::Submitted.after(true, false), F::Finished);
        assert_eq!(F::Submitted.after(false, true), F::Failed);
        assert_eq!(F::Submitted.after(false, false), F::Submitted);
        assert_eq!(F::Failed.after(true, false), F::Finished);
        assert_eq!(F::Finished.after(false, true), F::Finished);
        assert_eq!(F::Cancelled.after(true, false), F::Cancelled);
        assert!(F::Submitted.due(1, 1));
        assert!(!F::Submitted.due(2, 1));
        assert!(F::Failed.due(0, 0));
        assert!(!F::Finished.due(0, 5));
        assert!(!F::Cancelled.due(0, 5));
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_never_overflows() {
        assert_eq!(backoff(BACKOFF_FIRST_S, 1, 0.0), 5);
        assert_eq!(backoff(BACKOFF_FIRST_S, 2, 0.0), 10);
        assert_eq!(backoff(BACKOFF_FIRST_S, 3, 0.0), 20);
        assert_eq!(backoff(BACKOFF_FIRST_S, 7, 0.0), 300);
        assert_eq!(backoff(BACKOFF_FIRST_S, u32::MAX, 0.0), 300);
        assert_eq!(backoff(BACKOFF_FIRST_S, 0, 0.0), 5);
        assert_eq!(backoff(BACKOFF_FIRST_S, 2, 1.0), 12);
        assert_eq!(backoff(BACKOFF_FIRST_S, 2, 7.0), 12);
        assert_eq!(backoff(1, 1, 0.0), 1);
        assert_eq!(backoff(1, 4, 0.0), 8);
        assert_eq!(backoff(0, 1, 0.0), 1);
        assert_eq!(backoff(u64::MAX, 3, 0.0), 300);
        let total: u64 = (1..=DEFAULT_RETRIES)
            .map(|a| backoff(BACKOFF_FIRST_S, a, 0.0))
            .sum();
        assert_eq!(total, 1515);
    }

    #[test]
    fn a_recurring_run_waits_for_the_last_one() {
        assert_eq!(next_run(100, 130, 60), 160);
        assert_eq!(next_run(100, 200, 60), 200);
        assert_eq!(next_run(u64::MAX - 1, 0, 60), u64::MAX);
    }

    fn spec() -> JobSpec {
        JobSpec {
            source: JobEnd {
                host: None,
                export: "data".into(),
                paths: vec!["tree".into()],
                dir: false,
                credential: None,
                ssh: None,
            },
            dest: JobEnd {
                host: Some("b.example:5310".into()),
                export: "in".into(),
                paths: vec!["".into()],
                dir: true,
                credential: Some(JobCredential {
                    fingerprint: "SHA256:x".into(),
                    capability: "lh1c_secretsecret".into(),
                    lifetime_s: 60,
                }),
                ssh: None,
            },
            options: JobOptions {
                recursive: true,
                ..JobOptions::default()
            },
        }
    }

    #[test]
    fn a_well_formed_job_passes_and_its_debug_hides_the_capability() {
        assert_eq!(spec().check(), Ok(JobKind::Push));
        assert!(!format!("{:?}", spec()).contains("secret"));
        let a = JobAnswer::Accepted {
            id: "0123456789abcdef".into(),
            notify_secret: Some("lh1n_secret".into()),
        };
        assert!(!format!("{a:?}").contains("secret"));
    }

    #[test]
    fn attacker_malformed_jobs_are_refused_with_a_reason() {
        type Change = fn(&mut JobSpec);
        let bad: &[(Change, &str)] = &[
            (|s| s.dest.host = None, "both on the job server"),
            (|s| s.dest.credential = None, "no capability"),
            (
                |s| s.source.credential = s.dest.credential.clone(),
                "carries no capability of it",
            ),
            (
                |s| s.dest.credential.as_mut().unwrap().capability = "lh1_abcdef_token".into(),
                "not a capability",
            ),
            (|s| s.source.paths.clear(), "1 to 1024 sources"),
            (
                |s| s.source.paths = vec!["a/".into(), "b".into()],
                "trailing '/'",
            ),
            (|s| s.source.paths = vec!["a\nb".into()], "line break"),
            (
                |s| s.source.paths = vec!["x".repeat(MAX_PATH + 1)],
                "longer than",
            ),
            (|s| s.source.export = String::new(), "no export"),
            (|s| s.dest.paths = vec![], "one destination"),
            (|s| s.options.retries = MAX_RETRIES + 1, "--retries"),
            (|s| s.options.every_s = Some(60), "recurring sync"),
            (
                |s| s.options.notify = Some("file:///etc/passwd".into()),
                "https://",
            ),
            (
                |s| s.options.notify = Some("https://user:pw@host/".into()),
                "credentials",
            ),
            (
                |s| s.options.notify = Some("https://host/ x".into()),
                "printable",
            ),
            (
                |s| s.options.mail = Some("-oQ/tmp/x@y".into()),
                "plain address",
            ),
            (
                |s| s.options.mail = Some("a@b\nBcc: c@d".into()),
                "plain address",
            ),
            (|s| s.options.filter = vec!["- x".into(); 1025], "rules"),
        ];
        for (change, why) in bad {
            let mut s = spec();
            change(&mut s);
            let e = s.check().unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }
    }

    #[test]
    fn mail_addresses_and_ids() {
        assert!(valid_mail("ops@example.org"));
        assert!(valid_mail("a.b+c@sub-1.example"));
        for bad in [
            "", "a", "@b", "a@", "a b@c", "a@b c", "-f@x", "a@-b", "a@b\n",
        ] {
            assert!(!valid_mail(bad), "{bad}");
        }
        assert!(valid_id("0123456789abcdef"));
        for bad in [
            "",
            "0123456789ABCDEF",
            "0123456789abcde",
            "../../../etc/pass",
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn commands_and_answers_read_as_documented() {
        let c: JobCommand =
            serde_json::from_str(r#"{"op":"show","id":"0123456789abcdef"}"#).unwrap();
        assert_eq!(
            c,
            JobCommand::Show {
                id: "0123456789abcdef".into(),
                files_from: 0,
                files_limit: 0,
                state: None
            }
        );
        let c: JobCommand = serde_json::from_str(r#"{"op":"list"}"#).unwrap();
        assert_eq!(c, JobCommand::List {});
        assert!(serde_json::from_str::<JobCommand>(r#"{"op":"drop"}"#).is_err());
        let a = JobAnswer::Retried {
            id: "0123456789abcdef".into(),
            files: 1,
        };
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"answer":"retried","id":"0123456789abcdef","files":1}"#
        );
    }
}
