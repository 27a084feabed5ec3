//! The jobs of one server, in SQLite: `jobs.db` in its state directory,
//! made 0600 (it holds the far ends' capabilities), WAL mode, one
//! connection behind a lock (the runner's few threads and the control
//! sessions share it; every statement is short).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use longhaul_proto::job::{FileState, JobState};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};

use super::{
    decode, job_kind_of, kind_of, kind_word, Beat, FileChange, FileQuery, FileRow, JobRow,
    JobStore, Live, StoreError, Tally,
};

/// The file in the state directory.
pub const FILE_NAME: &str = "jobs.db";
/// The schema this build writes (`user_version`).
pub const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    id            TEXT PRIMARY KEY,
    owner         TEXT NOT NULL,
    kind          TEXT NOT NULL,
    state         TEXT NOT NULL,
    spec          TEXT NOT NULL,
    created       INTEGER NOT NULL,
    updated       INTEGER NOT NULL,
    expires       INTEGER NOT NULL,
    next_attempt  INTEGER NOT NULL,
    attempts      INTEGER NOT NULL,
    runs          INTEGER NOT NULL,
    listed        INTEGER NOT NULL,
    cancel        INTEGER NOT NULL,
    error         TEXT,
    worker        TEXT,
    lease_until   INTEGER NOT NULL,
    notify_secret TEXT,
    notified      INTEGER NOT NULL,
    revoked       INTEGER NOT NULL,
    history       TEXT NOT NULL,
    live_bytes    INTEGER NOT NULL,
    live_bps      REAL
);
CREATE INDEX IF NOT EXISTS jobs_owner ON jobs (owner);
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (next_attempt);
CREATE TABLE IF NOT EXISTS job_files (
    job      TEXT NOT NULL,
    path     TEXT NOT NULL,
    kind     TEXT NOT NULL,
    size     INTEGER NOT NULL,
    state    TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    error    TEXT,
    seen     INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (job, path)
) WITHOUT ROWID;
";

/// The columns of a job, in the order [`row_of`] reads them.
const COLUMNS: &str = "id, owner, kind, state, spec, created, updated, expires, next_attempt, attempts, runs, listed, cancel, error, worker, lease_until, notify_secret, notified, revoked, history, live_bytes, live_bps, discards, made";

/// Added since schema 1 was first written, each with its table's and its
/// column's name; a build that does not know them reads and writes the
/// rows as before.
const ADDED: [(&str, &str, &str); 3] = [
    (
        "jobs",
        "discards",
        "ALTER TABLE jobs ADD COLUMN discards TEXT NOT NULL DEFAULT '[]'",
    ),
    ("jobs", "made", "ALTER TABLE jobs ADD COLUMN made TEXT"),
    (
        "job_files",
        "permanent",
        "ALTER TABLE job_files ADD COLUMN permanent INTEGER NOT NULL DEFAULT 0",
    ),
];

pub struct SqliteStore {
    conn: Mutex<Connection>,
    path: PathBuf,
}

fn db(path: &Path, e: rusqlite::Error) -> StoreError {
    StoreError::Db {
        at: path.display().to_string(),
        why: e.to_string(),
    }
}

impl SqliteStore {
    /// Opens (makes, 0600) the jobs of the state directory `state`.
    /// Leases held when the server last stopped are let go: only this
    /// server uses this file, so whoever held them is gone.
    pub fn open(state: &Path) -> Result<SqliteStore, StoreError> {
        let path = state.join(FILE_NAME);
        longhaul_archive::store::private_sqlite(&path)
            .map_err(|e| StoreError::Usage(e.to_string()))?;
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )
        .map_err(|e| db(&path, e))?;
        let err = |e| db(&path, e);
        conn.busy_timeout(Duration::from_secs(10)).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(err)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::Usage(format!(
                "{} has jobs of a newer longhaul (schema {version}, this build's {SCHEMA_VERSION}): upgrade longhaul",
                path.display()
            )));
        }
        conn.execute_batch(SCHEMA).map_err(err)?;
        for (table, column, add) in ADDED {
            let has: bool = conn
                .query_row(
                    "SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
                    [table, column],
                    |r| r.get(0),
                )
                .map_err(err)?;
            if !has {
                conn.execute(add, []).map_err(err)?;
            }
        }
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(err)?;
        conn.execute("UPDATE jobs SET lease_until = 0 WHERE lease_until > 0", [])
            .map_err(err)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            path,
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut c = self
            .conn
            .lock()
            .map_err(|_| StoreError::Usage("internal error: the jobs' lock".into()))?;
        f(&mut c).map_err(|e| db(&self.path, e))
    }
}

/// A row as read, with its JSON columns still text.
struct Raw {
    row: JobRow,
    spec: String,
    history: String,
    discards: String,
}

fn raw_of(r: &Row) -> rusqlite::Result<Raw> {
    let state: String = r.get(3)?;
    let kind: String = r.get(2)?;
    let u = |k: usize| r.get::<_, i64>(k).map(|v| v as u64);
    Ok(Raw {
        row: JobRow {
            id: r.get(0)?,
            owner: r.get(1)?,
            kind: job_kind_of(&kind),
            state: JobState::from_word(&state).unwrap_or(JobState::Failed),
            spec: placeholder_spec(),
            created: u(5)?,
            updated: u(6)?,
            expires: u(7)?,
            next_attempt: u(8)?,
            attempts: u(9)? as u32,
            runs: u(10)? as u32,
            listed: r.get(11)?,
            cancel: r.get(12)?,
            error: r.get(13)?,
            worker: r.get(14)?,
            lease_until: u(15)?,
            notify_secret: r.get(16)?,
            notified: r.get(17)?,
            revoked: r.get(18)?,
            history: Vec::new(),
            live_bytes: u(20)?,
            live_bps: r.get(21)?,
            discards: Vec::new(),
            made: r.get(23)?,
        },
        spec: r.get(4)?,
        history: r.get(19)?,
        discards: r.get(22)?,
    })
}

/// A placeholder spec until the row's own is decoded.
pub(super) fn placeholder_spec() -> longhaul_proto::job::JobSpec {
    longhaul_proto::job::JobSpec {
        source: placeholder_end(),
        dest: placeholder_end(),
        options: Default::default(),
    }
}

fn placeholder_end() -> longhaul_proto::job::JobEnd {
    longhaul_proto::job::JobEnd {
        host: None,
        export: String::new(),
        paths: Vec::new(),
        dir: false,
        credential: None,
        ssh: None,
    }
}

fn finish(raw: Raw) -> Result<JobRow, StoreError> {
    let mut row = raw.row;
    row.spec = decode("spec", &row.id, &raw.spec)?;
    row.history = decode("history", &row.id, &raw.history)?;
    row.discards = decode("discards", &row.id, &raw.discards)?;
    Ok(row)
}

fn i(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Sets the state, error and permanence of some entries.
fn set_states(
    tx: &rusqlite::Transaction,
    id: &str,
    changes: &[FileChange],
) -> rusqlite::Result<()> {
    let mut st = tx.prepare(
        "UPDATE job_files SET state = ?3, error = ?4, permanent = ?5 WHERE job = ?1 AND path = ?2",
    )?;
    for ch in changes {
        st.execute(params![
            id,
            ch.path,
            ch.state.word(),
            ch.error,
            ch.permanent
        ])?;
    }
    Ok(())
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

impl JobStore for SqliteStore {
    fn insert(&self, j: &JobRow) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                &format!("INSERT INTO jobs ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24)"),
                params![
                    j.id, j.owner, j.kind.word(), j.state.word(), json(&j.spec),
                    i(j.created), i(j.updated), i(j.expires), i(j.next_attempt),
                    j.attempts, j.runs, j.listed, j.cancel, j.error, j.worker,
                    i(j.lease_until), j.notify_secret, j.notified, j.revoked,
                    json(&j.history), i(j.live_bytes), j.live_bps, json(&j.discards),
                    j.made
                ],
            )
            .map(|_| ())
        })
    }

    fn live_jobs_of(&self, owner: &str) -> Result<u64, StoreError> {
        self.with(|c| {
            c.query_row(
                "SELECT count(*) FROM jobs WHERE owner = ?1 AND state IN ('submitted', 'active')",
                params![owner],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
        })
    }

    fn forget_ended(&self, owner: &str, keep: u64) -> Result<u64, StoreError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let old: Vec<String> = {
                let mut st = tx.prepare(
                    "SELECT id FROM (SELECT id, notified, revoked FROM jobs
                       WHERE owner = ?1 AND state NOT IN ('submitted', 'active')
                       ORDER BY updated DESC, created DESC, id LIMIT -1 OFFSET ?2)
                     WHERE notified AND revoked",
                )?;
                let ids = st.query_map(params![owner, i(keep)], |r| r.get(0))?;
                ids.collect::<rusqlite::Result<_>>()?
            };
            for id in &old {
                tx.execute("DELETE FROM job_files WHERE job = ?1", params![id])?;
                tx.execute("DELETE FROM jobs WHERE id = ?1", params![id])?;
            }
            let ended: i64 = tx.query_row(
                "SELECT count(*) FROM jobs WHERE owner = ?1 AND state NOT IN ('submitted', 'active')",
                params![owner],
                |r| r.get(0),
            )?;
            tx.commit()?;
            Ok(ended as u64)
        })
    }

    fn lease(&self, worker: &str, now: u64, until: u64) -> Result<Option<JobRow>, StoreError> {
        let raw = self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let id: Option<String> = tx
                .query_row(
                    "SELECT id FROM jobs
                     WHERE lease_until <= ?1 AND next_attempt <= ?1
                       AND (state IN ('submitted', 'active') OR notified = 0 OR revoked = 0)
                     ORDER BY next_attempt LIMIT 1",
                    params![i(now)],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(id) = id else {
                return Ok(None);
            };
            tx.execute(
                "UPDATE jobs SET worker = ?2, lease_until = ?3, updated = ?4,
                   attempts = attempts + (CASE WHEN state IN ('submitted', 'active') THEN 1 ELSE 0 END),
                   state = (CASE WHEN state = 'submitted' THEN 'active' ELSE state END)
                 WHERE id = ?1",
                params![id, worker, i(until), i(now)],
            )?;
            let raw = tx.query_row(
                &format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"),
                params![id],
                raw_of,
            )?;
            tx.commit()?;
            Ok(Some(raw))
        })?;
        raw.map(finish).transpose()
    }

    fn heartbeat(&self, worker: &str, until: u64, live: &[Live]) -> Result<Beat, StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let mut beat = Beat::default();
            for l in live {
                let n = tx.execute(
                    "UPDATE jobs SET lease_until = ?3, live_bytes = ?4, live_bps = ?5
                     WHERE id = ?1 AND worker = ?2",
                    params![l.id, worker, i(until), i(l.bytes), l.bps],
                )?;
                if n == 0 {
                    beat.lost.push(l.id.clone());
                    continue;
                }
                let cancel: bool = tx.query_row(
                    "SELECT cancel FROM jobs WHERE id = ?1",
                    params![l.id],
                    |r| r.get(0),
                )?;
                if cancel {
                    beat.cancelled.push(l.id.clone());
                }
            }
            tx.commit()?;
            Ok(beat)
        })
    }

    fn save(&self, j: &JobRow, holder: Option<&str>) -> Result<bool, StoreError> {
        self.with(|c| {
            let n = c.execute(
                "UPDATE jobs SET state = ?2, spec = ?3, updated = ?4, expires = ?5, next_attempt = ?6,
                   attempts = ?7, runs = ?8, listed = ?9, error = ?10, worker = ?11, lease_until = ?12,
                   notified = ?13, revoked = ?14, history = ?15, live_bytes = ?16, live_bps = ?17,
                   cancel = (cancel OR ?18), discards = ?20
                 WHERE id = ?1 AND (?19 IS NULL OR worker = ?19)",
                params![
                    j.id, j.state.word(), json(&j.spec), i(j.updated), i(j.expires),
                    i(j.next_attempt), j.attempts, j.runs, j.listed, j.error, j.worker,
                    i(j.lease_until), j.notified, j.revoked, json(&j.history),
                    i(j.live_bytes), j.live_bps, j.cancel, holder, json(&j.discards)
                ],
            )?;
            Ok(n > 0)
        })
    }

    fn get(&self, id: &str) -> Result<Option<JobRow>, StoreError> {
        let raw = self.with(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"),
                params![id],
                raw_of,
            )
            .optional()
        })?;
        raw.map(finish).transpose()
    }

    fn list(&self, owner: Option<&str>) -> Result<Vec<JobRow>, StoreError> {
        let raws = self.with(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {COLUMNS} FROM jobs WHERE (?1 IS NULL OR owner = ?1) ORDER BY created DESC, id"
            ))?;
            let rows = st.query_map(params![owner], raw_of)?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })?;
        raws.into_iter().map(finish).collect()
    }

    fn cancel(&self, id: &str, now: u64) -> Result<bool, StoreError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let row: Option<(String, i64)> = tx
                .query_row(
                    "SELECT state, lease_until FROM jobs WHERE id = ?1",
                    params![id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((state, lease_until)) = row else {
                return Ok(false);
            };
            // A job that ended with failures keeps its capabilities for a
            // retry: cancelling it revokes them.
            if matches!(
                JobState::from_word(&state),
                None | Some(JobState::Finished | JobState::Cancelled)
            ) {
                return Ok(false);
            }
            tx.execute("UPDATE jobs SET cancel = 1, updated = ?2 WHERE id = ?1", params![id, i(now)])?;
            // Nobody holds it: it ends now; its chores go to the next lease.
            if lease_until as u64 <= now {
                tx.execute(
                    "UPDATE jobs SET next_attempt = ?2, revoked = 0,
                       notified = (CASE WHEN state IN ('submitted', 'active') THEN 0 ELSE notified END),
                       state = 'cancelled'
                     WHERE id = ?1",
                    params![id, i(now)],
                )?;
                tx.execute(
                    "UPDATE job_files SET state = 'cancelled' WHERE job = ?1 AND state IN ('submitted', 'failed')",
                    params![id],
                )?;
            }
            tx.commit()?;
            Ok(true)
        })
    }

    fn put_files(&self, id: &str, files: &[FileRow], fresh: bool) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            if fresh {
                tx.execute("DELETE FROM job_files WHERE job = ?1", params![id])?;
            } else {
                tx.execute("UPDATE job_files SET seen = 0 WHERE job = ?1", params![id])?;
            }
            {
                let mut st = tx.prepare(
                    "INSERT INTO job_files (job, path, kind, size, state, attempts, error, permanent, seen)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 1)
                     ON CONFLICT (job, path) DO UPDATE SET kind = excluded.kind, size = excluded.size, seen = 1",
                )?;
                for f in files {
                    st.execute(params![
                        id, f.path, kind_word(f.kind), i(f.size), f.state.word(), f.attempts, f.error,
                        f.permanent
                    ])?;
                }
            }
            tx.execute("DELETE FROM job_files WHERE job = ?1 AND seen = 0", params![id])?;
            tx.commit()
        })
    }

    fn change_files(&self, id: &str, changes: &[FileChange]) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            set_states(&tx, id, changes)?;
            tx.commit()
        })
    }

    fn count_attempt(&self, id: &str, retries: u32) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE job_files SET attempts = attempts + 1
                 WHERE job = ?1 AND state IN ('submitted', 'failed') AND attempts <= ?2
                   AND (permanent = 0 OR attempts = 0)",
                params![id, retries],
            )
            .map(|_| ())
        })
    }

    fn retry_failed(&self, id: &str) -> Result<u64, StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE job_files SET state = 'submitted', attempts = 0, error = NULL, permanent = 0
                 WHERE job = ?1 AND state IN ('failed', 'cancelled')",
                params![id],
            )
            .map(|n| n as u64)
        })
    }

    fn settle(&self, id: &str, failed: &[FileChange]) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "UPDATE job_files SET state = 'finished', error = NULL, permanent = 0
                 WHERE job = ?1 AND state IN ('submitted', 'failed')",
                params![id],
            )?;
            set_states(&tx, id, failed)?;
            tx.commit()
        })
    }

    fn note_made(&self, id: &str, made: &str) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET made = ?2 WHERE id = ?1 AND made IS NULL",
                params![id, made],
            )
            .map(|_| ())
        })
    }

    fn files(&self, id: &str, q: FileQuery) -> Result<(Vec<FileRow>, u64), StoreError> {
        let state = q.state.map(FileState::word);
        self.with(|c| {
            let total: i64 = c.query_row(
                "SELECT count(*) FROM job_files WHERE job = ?1 AND (?2 IS NULL OR state = ?2)",
                params![id, state],
                |r| r.get(0),
            )?;
            let mut st = c.prepare(
                "SELECT path, kind, size, state, attempts, error, permanent FROM job_files
                 WHERE job = ?1 AND (?2 IS NULL OR state = ?2)
                 ORDER BY path LIMIT ?3 OFFSET ?4",
            )?;
            let rows = st.query_map(params![id, state, q.limit, i(q.from)], |r| {
                let kind: String = r.get(1)?;
                let state: String = r.get(3)?;
                Ok(FileRow {
                    path: r.get(0)?,
                    kind: kind_of(&kind),
                    size: r.get::<_, i64>(2)? as u64,
                    state: FileState::from_word(&state).unwrap_or(FileState::Failed),
                    attempts: r.get::<_, i64>(4)? as u32,
                    error: r.get(5)?,
                    permanent: r.get(6)?,
                })
            })?;
            Ok((rows.collect::<rusqlite::Result<Vec<_>>>()?, total as u64))
        })
    }

    fn tally(&self, id: &str, retries: u32) -> Result<Tally, StoreError> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT state, kind = 'file', count(*), coalesce(sum(size), 0),
                        sum(CASE WHEN state IN ('submitted', 'failed') AND attempts <= ?2 AND permanent = 0
                            THEN 1 ELSE 0 END)
                 FROM job_files WHERE job = ?1 GROUP BY state, kind = 'file'",
            )?;
            let mut t = Tally::default();
            let rows = st.query_map(params![id, retries], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, bool>(1)?,
                    r.get::<_, i64>(2)? as u64,
                    r.get::<_, i64>(3)? as u64,
                    r.get::<_, i64>(4)? as u64,
                ))
            })?;
            for row in rows {
                let (state, file, n, bytes, due) = row?;
                let state = FileState::from_word(&state).unwrap_or(FileState::Failed);
                t.add(state, file, n, bytes, due);
            }
            Ok(t)
        })
    }

    fn by_state(&self) -> Result<Vec<(JobState, u64)>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare("SELECT state, count(*) FROM jobs GROUP BY state")?;
            let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
            let mut out = Vec::new();
            for row in rows {
                let (s, n) = row?;
                if let Some(s) = JobState::from_word(&s) {
                    out.push((s, n as u64));
                }
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_proto::job::{DiscardState, DiscardView};

    /// A grant that submits and cancels in a loop: its ended jobs past
    /// the newest `keep` go, with their entries, once nothing is left to
    /// do for them; those still holding a capability, its live jobs and
    /// another grant's stay.
    #[test]
    fn attacker_a_grants_ended_jobs_past_its_share_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(dir.path()).unwrap();
        let row = |n: u64, owner: &str, state: JobState, revoked: bool| JobRow {
            owner: owner.into(),
            state,
            revoked,
            updated: n,
            ..super::super::a_job(&format!("{n:016x}"))
        };
        for n in 1..=50 {
            s.insert(&row(n, "g1", JobState::Cancelled, true)).unwrap();
            let file = super::super::a_file("src/f");
            s.put_files(&format!("{n:016x}"), &[file], true).unwrap();
        }
        s.insert(&row(51, "g1", JobState::FinishedWithFailures, false))
            .unwrap();
        s.insert(&row(52, "g1", JobState::Submitted, false))
            .unwrap();
        s.insert(&row(53, "g2", JobState::Cancelled, true)).unwrap();
        s.insert(&row(54, "g1", JobState::Finished, true)).unwrap();
        // Kept: the 5 newest ended (54, 51, 50, 49, 48) and the live one.
        assert_eq!(s.forget_ended("g1", 5).unwrap(), 5);
        let mut kept: Vec<u64> = s
            .list(Some("g1"))
            .unwrap()
            .iter()
            .map(|j| j.updated)
            .collect();
        kept.sort_unstable();
        assert_eq!(kept, [48, 49, 50, 51, 52, 54]);
        assert_eq!(s.list(Some("g2")).unwrap().len(), 1);
        let gone = s
            .files(&format!("{:016x}", 1), FileQuery::default())
            .unwrap();
        assert_eq!(gone.1, 0, "a forgotten job's entries go with it");
        // The one still holding its capability outlives its share.
        assert_eq!(s.forget_ended("g1", 1).unwrap(), 2);
    }

    /// An entry failed for good is not due again and its attempts stay
    /// (one, its first), while one failed for now is due until its retries
    /// are used; a settled attempt that names it failed again keeps it so,
    /// and `jobs retry` makes it due again.
    #[test]
    fn an_entry_failed_for_good_is_not_due_and_not_counted_again() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(dir.path()).unwrap();
        let id = "00000000000000aa";
        s.insert(&super::super::a_job(id)).unwrap();
        let row = super::super::a_file;
        let (retries, due) = (5, |s: &SqliteStore| s.tally(id, 5).unwrap().due);
        let all = FileQuery {
            limit: 10,
            ..FileQuery::default()
        };
        let lost = FileChange::failed("lost".into(), "connection reset by the peer".into());
        let tree = FileChange::failed(
            "tree".into(),
            "src:tree is a directory: use -r to copy trees".into(),
        );
        assert!(tree.permanent && !lost.permanent);
        let gone = FileChange::failed(
            "gone".into(),
            "cannot read data/gone: No such file or directory (os error 2)".into(),
        );
        let listed_gone = FileRow {
            state: FileState::Failed,
            error: gone.error.clone(),
            permanent: gone.permanent,
            ..row("gone")
        };
        let failed = [lost.clone(), tree.clone(), gone.clone()];
        let listed = [row("good"), row("lost"), row("tree"), listed_gone];
        for n in 0..4 {
            s.put_files(id, &listed, n == 0).unwrap();
            s.count_attempt(id, retries).unwrap();
            s.settle(id, &failed).unwrap();
            assert_eq!(due(&s), 1, "only the transient failure is due");
        }
        let files = s.files(id, all).unwrap().0;
        let of = |p: &str| files.iter().find(|f| f.path == p).unwrap().clone();
        assert_eq!(
            (of("good").state, of("good").permanent),
            (FileState::Finished, false)
        );
        assert_eq!((of("lost").attempts, of("lost").permanent), (4, false));
        let tree_row = of("tree");
        assert_eq!(tree_row.state, FileState::Failed);
        assert_eq!((tree_row.attempts, tree_row.permanent), (1, true));
        // Failed when listed: counted once, at the attempt that failed it.
        assert_eq!((of("gone").attempts, of("gone").permanent), (1, true));
        assert_eq!(s.tally(id, retries).unwrap().counts.failed, 3);
        // Its owner fixed them and asks again: due, counted from zero.
        s.retry_failed(id).unwrap();
        assert_eq!(due(&s), 3);
        let files = s.files(id, all).unwrap().0;
        assert!(files.iter().all(|f| !f.permanent));
    }

    /// A pending discard is kept with its job, and so is what a pull made;
    /// a `jobs.db` written before either was kept gains their columns, its
    /// jobs read with none.
    #[test]
    fn a_pending_discard_is_kept_and_an_older_jobs_db_gains_its_column() {
        let dir = tempfile::tempdir().unwrap();
        {
            let old = Connection::open(dir.path().join(FILE_NAME)).unwrap();
            old.execute_batch(SCHEMA).unwrap();
            old.pragma_update(None, "user_version", 1).unwrap();
            old.execute(
                "INSERT INTO jobs (id, owner, kind, state, spec, created, updated, expires, next_attempt, attempts, runs, listed, cancel, worker, lease_until, notified, revoked, history, live_bytes)
                 VALUES ('00000000000000aa', 'g1', 'push', 'cancelled', ?1, 1, 1, 100, 1, 1, 0, 1, 1, NULL, 0, 1, 0, '[]', 0)",
                params![json(&placeholder_spec())],
            )
            .unwrap();
        }
        let s = SqliteStore::open(dir.path()).unwrap();
        let old = s.get("00000000000000aa").unwrap().unwrap();
        assert!(old.discards.is_empty() && old.made.is_none());
        let mut j = super::super::a_job("00000000000000bb");
        j.made = Some("in/new".into());
        s.insert(&j).unwrap();
        j.discards.push(DiscardView {
            end: "b.example:5310".into(),
            state: DiscardState::Pending,
            tries: 2,
            next_try: Some(50.0),
            error: Some("connection refused".into()),
            removed: 0,
        });
        assert!(s.save(&j, None).unwrap());
        drop(s);
        let s = SqliteStore::open(dir.path()).unwrap();
        let kept = s.get(&j.id).unwrap().unwrap();
        assert_eq!(kept.discards, j.discards);
        assert_eq!(kept.made.as_deref(), Some("in/new"));
    }
}
