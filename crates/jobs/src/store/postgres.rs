//! Jobs shared by a group of servers, in PostgreSQL (`serve --jobs
//! postgres://...`): FTS3's model. A server leases a due job with `SELECT
//! ... FOR UPDATE SKIP LOCKED` (servers never wait on each other's rows),
//! renews the leases of its attempts in flight, and a job whose lease ran
//! out (its server died) is leased by whoever asks next. The connection is
//! the fleet's (`longhaul_fleet::queue::open_client`: TLS always verified,
//! the password found as libpq finds it).
//!
//! The far ends' capabilities are in the database (every server of the
//! group must be able to present them): give the group a database, or a
//! role owning these tables, that no one else reads.

use std::sync::Mutex;

use longhaul_proto::job::{FileState, JobState};
use postgres::types::ToSql;
use postgres::{Client, Row};

use super::{
    decode, job_kind_of, kind_of, kind_word, Beat, FileChange, FileQuery, FileRow, JobRow,
    JobStore, Live, StoreError, Tally,
};

/// The schema this build writes; a database with a newer one is refused.
pub const SCHEMA_VERSION: i32 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS longhaul_jobs_schema (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS longhaul_jobs (
    id            text PRIMARY KEY,
    owner         text NOT NULL,
    kind          text NOT NULL,
    state         text NOT NULL,
    spec          text NOT NULL,
    created       bigint NOT NULL,
    updated       bigint NOT NULL,
    expires       bigint NOT NULL,
    next_attempt  bigint NOT NULL,
    attempts      integer NOT NULL,
    runs          integer NOT NULL,
    listed        boolean NOT NULL,
    cancel        boolean NOT NULL,
    error         text,
    worker        text,
    lease_until   bigint NOT NULL,
    notify_secret text,
    notified      boolean NOT NULL,
    revoked       boolean NOT NULL,
    history       text NOT NULL,
    live_bytes    bigint NOT NULL,
    live_bps      double precision
);
CREATE INDEX IF NOT EXISTS longhaul_jobs_owner ON longhaul_jobs (owner);
CREATE INDEX IF NOT EXISTS longhaul_jobs_due ON longhaul_jobs (next_attempt);
CREATE TABLE IF NOT EXISTS longhaul_job_files (
    job      text NOT NULL REFERENCES longhaul_jobs(id) ON DELETE CASCADE,
    path     text NOT NULL,
    kind     text NOT NULL,
    size     bigint NOT NULL,
    state    text NOT NULL,
    attempts integer NOT NULL,
    error    text,
    seen     boolean NOT NULL DEFAULT true,
    PRIMARY KEY (job, path)
);
ALTER TABLE longhaul_jobs ADD COLUMN IF NOT EXISTS discards text NOT NULL DEFAULT '[]';
ALTER TABLE longhaul_jobs ADD COLUMN IF NOT EXISTS made text;
ALTER TABLE longhaul_job_files ADD COLUMN IF NOT EXISTS permanent boolean NOT NULL DEFAULT false;
";

const COLUMNS: &str = "id, owner, kind, state, spec, created, updated, expires, next_attempt, attempts, runs, listed, cancel, error, worker, lease_until, notify_secret, notified, revoked, history, live_bytes, live_bps, discards, made";

/// Rows sent in one statement by the bulk writes.
const BATCH: usize = 10_000;

pub struct PgStore {
    client: Mutex<Client>,
    url: String,
    at: String,
}

fn i(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn u(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl PgStore {
    /// Connects and makes the tables if they are not there (one server at
    /// a time: an advisory lock around the DDL).
    pub fn connect(url: &str) -> Result<PgStore, StoreError> {
        let (client, at) = open(url)?;
        let s = PgStore {
            client: Mutex::new(client),
            url: url.to_string(),
            at,
        };
        s.migrate()?;
        Ok(s)
    }

    fn migrate(&self) -> Result<(), StoreError> {
        let v = self.with(|c| {
            let mut tx = c.transaction()?;
            tx.execute("SELECT pg_advisory_xact_lock(7171018)", &[])?;
            tx.batch_execute(SCHEMA)?;
            let v: Option<i32> = tx
                .query_opt("SELECT max(version) FROM longhaul_jobs_schema", &[])?
                .and_then(|r| r.get(0));
            if v.is_none() {
                tx.execute(
                    "INSERT INTO longhaul_jobs_schema (version) VALUES ($1)",
                    &[&SCHEMA_VERSION],
                )?;
            }
            tx.commit()?;
            Ok(v)
        })?;
        match v {
            Some(v) if v > SCHEMA_VERSION => Err(StoreError::Usage(format!(
                "the jobs' database ({}) has schema {v}, newer than this build's {SCHEMA_VERSION}: upgrade longhaul on every server",
                self.at
            ))),
            _ => Ok(()),
        }
    }

    /// Runs `f` on the connection, connecting again first if the last one
    /// broke (the database restarted, the network went away).
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, StoreError> {
        let mut c = self
            .client
            .lock()
            .map_err(|_| StoreError::Usage("internal error: the jobs' lock".into()))?;
        if c.is_closed() {
            *c = open(&self.url)?.0;
        }
        f(&mut c).map_err(|e| StoreError::Db {
            at: self.at.clone(),
            why: longhaul_fleet::queue::statement_failed(&e),
        })
    }
}

fn open(url: &str) -> Result<(Client, String), StoreError> {
    longhaul_fleet::queue::open_client(url).map_err(|e| match e {
        longhaul_fleet::queue::QueueError::Usage(m) => {
            StoreError::Usage(m.replace("--queue", "--jobs"))
        }
        e => StoreError::Usage(e.to_string().replace("--queue", "--jobs")),
    })
}

/// Column `i` of a row of job `job`: a type or a NULL this build did not
/// write is an error naming the job and the column, never a panic.
fn col<'a, T: postgres::types::FromSql<'a>>(
    r: &'a Row,
    i: usize,
    job: &str,
) -> Result<T, StoreError> {
    r.try_get(i).map_err(|e| bad_row(r, i, job, e.to_string()))
}

/// A count (attempts, runs) in column `i`: a negative one is refused.
fn count(r: &Row, i: usize, job: &str) -> Result<u32, StoreError> {
    let n: i32 = col(r, i, job)?;
    u32::try_from(n).map_err(|_| bad_row(r, i, job, format!("{n}, a count below zero")))
}

fn bad_row(r: &Row, i: usize, job: &str, why: String) -> StoreError {
    StoreError::BadRow {
        job: job.to_string(),
        column: r.columns().get(i).map_or("?", |c| c.name()).to_string(),
        why,
    }
}

fn row_of(r: &Row) -> Result<JobRow, StoreError> {
    let id: String = col(r, 0, "(unknown)")?;
    let text = |i: usize| col::<String>(r, i, &id);
    let (kind, state) = (text(2)?, text(3)?);
    let (spec, history, discards) = (text(4)?, text(19)?, text(22)?);
    let time = |i: usize| col::<i64>(r, i, &id).map(u);
    let flag = |i: usize| col::<bool>(r, i, &id);
    let maybe = |i: usize| col::<Option<String>>(r, i, &id);
    Ok(JobRow {
        discards: decode("discards", &id, &discards)?,
        spec: decode("spec", &id, &spec)?,
        history: decode("history", &id, &history)?,
        owner: text(1)?,
        kind: job_kind_of(&kind),
        state: JobState::from_word(&state).unwrap_or(JobState::Failed),
        created: time(5)?,
        updated: time(6)?,
        expires: time(7)?,
        next_attempt: time(8)?,
        attempts: count(r, 9, &id)?,
        runs: count(r, 10, &id)?,
        listed: flag(11)?,
        cancel: flag(12)?,
        error: maybe(13)?,
        worker: maybe(14)?,
        lease_until: time(15)?,
        notify_secret: maybe(16)?,
        notified: flag(17)?,
        revoked: flag(18)?,
        live_bytes: time(20)?,
        live_bps: col(r, 21, &id)?,
        made: maybe(23)?,
        id,
    })
}

/// A row of job `job`'s files.
fn file_of(r: &Row, job: &str) -> Result<FileRow, StoreError> {
    let kind: String = col(r, 1, job)?;
    let state: String = col(r, 3, job)?;
    Ok(FileRow {
        path: col(r, 0, job)?,
        kind: kind_of(&kind),
        size: u(col(r, 2, job)?),
        state: FileState::from_word(&state).unwrap_or(FileState::Failed),
        attempts: count(r, 4, job)?,
        error: col(r, 5, job)?,
        permanent: col(r, 6, job)?,
    })
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// The columns [`JobStore::save`] writes, in its order ($2 to $19 after
/// the id); [`JobStore::insert`] writes them too, then the ones a job
/// keeps from its submission.
const SAVED: &str = "state, spec, updated, expires, next_attempt, attempts, runs, listed, error, worker, lease_until, notified, revoked, history, live_bytes, live_bps, cancel, discards";

/// A row's values that are computed (encoded, converted) before they are
/// written.
struct Saved {
    state: &'static str,
    spec: String,
    history: String,
    discards: String,
    times: [i64; 4],
    counts: [i32; 2],
    live_bytes: i64,
}

impl Saved {
    fn of(j: &JobRow) -> Saved {
        Saved {
            state: j.state.word(),
            spec: json(&j.spec),
            history: json(&j.history),
            discards: json(&j.discards),
            times: [j.updated, j.expires, j.next_attempt, j.lease_until].map(i),
            counts: [j.attempts as i32, j.runs as i32],
            live_bytes: i(j.live_bytes),
        }
    }

    /// The values of [`SAVED`], in its order.
    fn params<'a>(&'a self, j: &'a JobRow) -> [&'a (dyn ToSql + Sync); 18] {
        let [updated, expires, next_attempt, lease_until] = &self.times;
        let [attempts, runs] = &self.counts;
        [
            &self.state,
            &self.spec,
            updated,
            expires,
            next_attempt,
            attempts,
            runs,
            &j.listed,
            &j.error,
            &j.worker,
            lease_until,
            &j.notified,
            &j.revoked,
            &self.history,
            &self.live_bytes,
            &j.live_bps,
            &j.cancel,
            &self.discards,
        ]
    }
}

impl JobStore for PgStore {
    fn insert(&self, j: &JobRow) -> Result<(), StoreError> {
        let saved = Saved::of(j);
        let (kind, created) = (j.kind.word(), i(j.created));
        let mut params = vec![&j.id as &(dyn ToSql + Sync)];
        params.extend(saved.params(j));
        params.extend([
            &j.owner as &(dyn ToSql + Sync),
            &kind,
            &created,
            &j.notify_secret,
            &j.made,
        ]);
        let places: Vec<String> = (1..=params.len()).map(|n| format!("${n}")).collect();
        self.with(|c| {
            c.execute(
                &format!(
                    "INSERT INTO longhaul_jobs (id, {SAVED}, owner, kind, created, notify_secret, made) VALUES ({})",
                    places.join(", ")
                ),
                &params,
            )
            .map(|_| ())
        })
    }

    fn live_jobs_of(&self, owner: &str) -> Result<u64, StoreError> {
        self.with(|c| {
            c.query_one(
                "SELECT count(*) FROM longhaul_jobs WHERE owner = $1 AND state IN ('submitted', 'active')",
                &[&owner],
            )
            .map(|r| u(r.get(0)))
        })
    }

    fn forget_ended(&self, owner: &str, keep: u64) -> Result<u64, StoreError> {
        self.with(|c| {
            let mut tx = c.transaction()?;
            let old: Vec<String> = tx
                .query(
                    "SELECT id FROM (SELECT id, notified, revoked FROM longhaul_jobs
                       WHERE owner = $1 AND state NOT IN ('submitted', 'active')
                       ORDER BY updated DESC, created DESC, id OFFSET $2) AS ended
                     WHERE notified AND revoked",
                    &[&owner, &i(keep)],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            tx.execute("DELETE FROM longhaul_job_files WHERE job = ANY($1)", &[&old])?;
            tx.execute("DELETE FROM longhaul_jobs WHERE id = ANY($1)", &[&old])?;
            let ended = tx.query_one(
                "SELECT count(*) FROM longhaul_jobs WHERE owner = $1 AND state NOT IN ('submitted', 'active')",
                &[&owner],
            )?;
            tx.commit()?;
            Ok(u(ended.get(0)))
        })
    }

    fn lease(&self, worker: &str, now: u64, until: u64) -> Result<Option<JobRow>, StoreError> {
        let row = self.with(|c| {
            c.query_opt(
                &format!(
                    "UPDATE longhaul_jobs SET worker = $2, lease_until = $3, updated = $1,
                       attempts = attempts + (CASE WHEN state IN ('submitted', 'active') THEN 1 ELSE 0 END),
                       state = (CASE WHEN state = 'submitted' THEN 'active' ELSE state END)
                     WHERE id = (
                       SELECT id FROM longhaul_jobs
                       WHERE lease_until <= $1 AND next_attempt <= $1
                         AND (state IN ('submitted', 'active') OR NOT notified OR NOT revoked)
                       ORDER BY next_attempt LIMIT 1 FOR UPDATE SKIP LOCKED)
                     RETURNING {COLUMNS}"
                ),
                &[&i(now), &worker, &i(until)],
            )
        })?;
        row.as_ref().map(row_of).transpose()
    }

    fn heartbeat(&self, worker: &str, until: u64, live: &[Live]) -> Result<Beat, StoreError> {
        self.with(|c| {
            let mut beat = Beat::default();
            for l in live {
                let r = c.query_opt(
                    "UPDATE longhaul_jobs SET lease_until = $3, live_bytes = $4, live_bps = $5
                     WHERE id = $1 AND worker = $2 RETURNING cancel",
                    &[&l.id, &worker, &i(until), &i(l.bytes), &l.bps],
                )?;
                match r {
                    None => beat.lost.push(l.id.clone()),
                    Some(r) if r.get::<_, bool>(0) => beat.cancelled.push(l.id.clone()),
                    Some(_) => {}
                }
            }
            Ok(beat)
        })
    }

    fn save(&self, j: &JobRow, holder: Option<&str>) -> Result<bool, StoreError> {
        let saved = Saved::of(j);
        let mut params = vec![&j.id as &(dyn ToSql + Sync)];
        params.extend(saved.params(j));
        params.push(&holder);
        self.with(|c| {
            c.execute(
                "UPDATE longhaul_jobs SET state = $2, spec = $3, updated = $4, expires = $5, next_attempt = $6,
                   attempts = $7, runs = $8, listed = $9, error = $10, worker = $11, lease_until = $12,
                   notified = $13, revoked = $14, history = $15, live_bytes = $16, live_bps = $17,
                   cancel = (cancel OR $18), discards = $19
                 WHERE id = $1 AND ($20::text IS NULL OR worker = $20)",
                &params,
            )
            .map(|n| n > 0)
        })
    }

    fn get(&self, id: &str) -> Result<Option<JobRow>, StoreError> {
        let row = self.with(|c| {
            c.query_opt(
                &format!("SELECT {COLUMNS} FROM longhaul_jobs WHERE id = $1"),
                &[&id],
            )
        })?;
        row.as_ref().map(row_of).transpose()
    }

    fn list(&self, owner: Option<&str>) -> Result<Vec<JobRow>, StoreError> {
        let rows = self.with(|c| {
            c.query(
                &format!("SELECT {COLUMNS} FROM longhaul_jobs WHERE ($1::text IS NULL OR owner = $1) ORDER BY created DESC, id"),
                &[&owner],
            )
        })?;
        rows.iter().map(row_of).collect()
    }

    fn cancel(&self, id: &str, now: u64) -> Result<bool, StoreError> {
        self.with(|c| {
            let mut tx = c.transaction()?;
            let row = tx.query_opt(
                "SELECT state, lease_until FROM longhaul_jobs WHERE id = $1 FOR UPDATE",
                &[&id],
            )?;
            let Some(row) = row else {
                return Ok(false);
            };
            let (state, lease_until): (String, i64) = (row.get(0), row.get(1));
            if matches!(
                JobState::from_word(&state),
                None | Some(JobState::Finished | JobState::Cancelled)
            ) {
                return Ok(false);
            }
            tx.execute(
                "UPDATE longhaul_jobs SET cancel = true, updated = $2 WHERE id = $1",
                &[&id, &i(now)],
            )?;
            if u(lease_until) <= now {
                tx.execute(
                    "UPDATE longhaul_jobs SET next_attempt = $2, revoked = false,
                       notified = (CASE WHEN state IN ('submitted', 'active') THEN false ELSE notified END),
                       state = 'cancelled'
                     WHERE id = $1",
                    &[&id, &i(now)],
                )?;
                tx.execute(
                    "UPDATE longhaul_job_files SET state = 'cancelled' WHERE job = $1 AND state IN ('submitted', 'failed')",
                    &[&id],
                )?;
            }
            tx.commit()?;
            Ok(true)
        })
    }

    fn put_files(&self, id: &str, files: &[FileRow], fresh: bool) -> Result<(), StoreError> {
        self.with(|c| {
            let mut tx = c.transaction()?;
            if fresh {
                tx.execute("DELETE FROM longhaul_job_files WHERE job = $1", &[&id])?;
            } else {
                tx.execute("UPDATE longhaul_job_files SET seen = false WHERE job = $1", &[&id])?;
            }
            for batch in files.chunks(BATCH) {
                let paths: Vec<&str> = batch.iter().map(|f| f.path.as_str()).collect();
                let kinds: Vec<&str> = batch.iter().map(|f| kind_word(f.kind)).collect();
                let sizes: Vec<i64> = batch.iter().map(|f| i(f.size)).collect();
                let states: Vec<&str> = batch.iter().map(|f| f.state.word()).collect();
                let errors: Vec<Option<&str>> = batch.iter().map(|f| f.error.as_deref()).collect();
                let permanent: Vec<bool> = batch.iter().map(|f| f.permanent).collect();
                tx.execute(
                    "INSERT INTO longhaul_job_files (job, path, kind, size, state, attempts, error, permanent, seen)
                     SELECT $1, p, k, s, st, 0, e, pe, true
                     FROM unnest($2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::boolean[])
                       AS t(p, k, s, st, e, pe)
                     ON CONFLICT (job, path) DO UPDATE SET kind = excluded.kind, size = excluded.size, seen = true",
                    &[&id, &paths, &kinds, &sizes, &states, &errors, &permanent],
                )?;
            }
            tx.execute("DELETE FROM longhaul_job_files WHERE job = $1 AND NOT seen", &[&id])?;
            tx.commit()
        })
    }

    fn change_files(&self, id: &str, changes: &[FileChange]) -> Result<(), StoreError> {
        self.with(|c| {
            let mut tx = c.transaction()?;
            for batch in changes.chunks(BATCH) {
                set_states(&mut tx, id, batch)?;
            }
            tx.commit()
        })
    }

    fn count_attempt(&self, id: &str, retries: u32) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE longhaul_job_files SET attempts = attempts + 1
                 WHERE job = $1 AND state IN ('submitted', 'failed') AND attempts <= $2
                   AND (NOT permanent OR attempts = 0)",
                &[&id, &(retries as i32)],
            )
            .map(|_| ())
        })
    }

    fn retry_failed(&self, id: &str) -> Result<u64, StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE longhaul_job_files SET state = 'submitted', attempts = 0, error = NULL, permanent = false
                 WHERE job = $1 AND state IN ('failed', 'cancelled')",
                &[&id],
            )
        })
    }

    fn settle(&self, id: &str, failed: &[FileChange]) -> Result<(), StoreError> {
        self.with(|c| {
            let mut tx = c.transaction()?;
            tx.execute(
                "UPDATE longhaul_job_files SET state = 'finished', error = NULL, permanent = false
                 WHERE job = $1 AND state IN ('submitted', 'failed')",
                &[&id],
            )?;
            for batch in failed.chunks(BATCH) {
                set_states(&mut tx, id, batch)?;
            }
            tx.commit()
        })
    }

    fn note_made(&self, id: &str, made: &str) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE longhaul_jobs SET made = $2 WHERE id = $1 AND made IS NULL",
                &[&id, &made],
            )
            .map(|_| ())
        })
    }

    fn files(&self, id: &str, q: FileQuery) -> Result<(Vec<FileRow>, u64), StoreError> {
        let state = q.state.map(FileState::word);
        let (rows, total) = self.with(|c| {
            let total: i64 = c
                .query_one(
                    "SELECT count(*) FROM longhaul_job_files WHERE job = $1 AND ($2::text IS NULL OR state = $2)",
                    &[&id, &state],
                )?
                .get(0);
            let rows = c.query(
                "SELECT path, kind, size, state, attempts, error, permanent FROM longhaul_job_files
                 WHERE job = $1 AND ($2::text IS NULL OR state = $2)
                 ORDER BY path LIMIT $3 OFFSET $4",
                &[&id, &state, &i64::from(q.limit), &i(q.from)],
            )?;
            Ok((rows, u(total)))
        })?;
        let files = rows
            .iter()
            .map(|r| file_of(r, id))
            .collect::<Result<_, _>>()?;
        Ok((files, total))
    }

    fn tally(&self, id: &str, retries: u32) -> Result<Tally, StoreError> {
        let rows = self.with(|c| {
            c.query(
                "SELECT state, kind = 'file', count(*), coalesce(sum(size), 0)::bigint,
                        sum(CASE WHEN state IN ('submitted', 'failed') AND attempts <= $2 AND NOT permanent
                            THEN 1 ELSE 0 END)::bigint
                 FROM longhaul_job_files WHERE job = $1 GROUP BY state, kind = 'file'",
                &[&id, &(retries as i32)],
            )
        })?;
        let mut t = Tally::default();
        for r in rows {
            let state: String = r.get(0);
            let file: bool = r.get(1);
            let (n, bytes, due): (i64, i64, i64) = (r.get(2), r.get(3), r.get(4));
            let state = FileState::from_word(&state).unwrap_or(FileState::Failed);
            t.add(state, file, u(n), u(bytes), u(due));
        }
        Ok(t)
    }

    fn by_state(&self) -> Result<Vec<(JobState, u64)>, StoreError> {
        let rows = self.with(|c| {
            c.query(
                "SELECT state, count(*) FROM longhaul_jobs GROUP BY state",
                &[],
            )
        })?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let s: String = r.get(0);
                JobState::from_word(&s).map(|s| (s, u(r.get(1))))
            })
            .collect())
    }
}

/// Sets the state, error and permanence of a batch of entries in one
/// statement.
fn set_states(
    tx: &mut postgres::Transaction,
    id: &str,
    batch: &[FileChange],
) -> Result<u64, postgres::Error> {
    let paths: Vec<&str> = batch.iter().map(|c| c.path.as_str()).collect();
    let states: Vec<&str> = batch.iter().map(|c| c.state.word()).collect();
    let errors: Vec<Option<&str>> = batch.iter().map(|c| c.error.as_deref()).collect();
    let permanent: Vec<bool> = batch.iter().map(|c| c.permanent).collect();
    tx.execute(
        "UPDATE longhaul_job_files f SET state = u.st, error = u.e, permanent = u.pe
         FROM unnest($2::text[], $3::text[], $4::text[], $5::boolean[]) AS u(p, st, e, pe)
         WHERE f.job = $1 AND f.path = u.p",
        &[&id, &paths, &states, &errors, &permanent],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_testkit::pg::TempPostgres;

    /// Rows changed by hand (a count below zero, a column of another
    /// type, a NULL) are errors naming the job and the column: never a
    /// panic, never a count read as four billion.
    #[test]
    fn a_planted_bad_row_is_an_error_naming_the_job_and_the_column() {
        let Some(pg) = TempPostgres::start() else {
            return;
        };
        let s = PgStore::connect(&pg.url()).unwrap();
        let id = "00000000000000aa";
        let mut job = super::super::a_job(id);
        job.made = Some("in/new".into());
        s.insert(&job).unwrap();
        assert_eq!(s.get(id).unwrap().unwrap().made.as_deref(), Some("in/new"));
        s.put_files(id, &[super::super::a_file("a")], true).unwrap();
        assert_eq!(s.get(id).unwrap().unwrap().attempts, 1);
        let mut c = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
        let planted = |c: &mut Client, sql: &str| c.batch_execute(sql).unwrap();
        let refused = |e: StoreError, column: &str| {
            let e = e.to_string();
            assert!(e.contains(id) && e.contains(column), "{e}");
        };
        planted(&mut c, "UPDATE longhaul_jobs SET attempts = -1");
        refused(s.get(id).unwrap_err(), "attempts");
        refused(s.list(None).unwrap_err(), "attempts");
        planted(
            &mut c,
            "UPDATE longhaul_jobs SET attempts = 1; UPDATE longhaul_job_files SET attempts = -2",
        );
        refused(
            s.files(
                id,
                FileQuery {
                    limit: 10,
                    ..FileQuery::default()
                },
            )
            .unwrap_err(),
            "attempts",
        );
        planted(
            &mut c,
            "ALTER TABLE longhaul_jobs ALTER COLUMN runs TYPE bigint",
        );
        refused(s.get(id).unwrap_err(), "runs");
        planted(&mut c, "ALTER TABLE longhaul_jobs ALTER COLUMN runs TYPE integer, ALTER COLUMN listed DROP NOT NULL; UPDATE longhaul_jobs SET listed = NULL");
        refused(s.get(id).unwrap_err(), "listed");
    }
}
