//! The work queue in PostgreSQL: one row a run (its manifest, its one
//! result), one row a unit of work, one row a rank's report.
//!
//! A rank leases units with `SELECT ... FOR UPDATE SKIP LOCKED`, so ranks
//! never wait on each other's rows; a lease is a deadline in the row, kept
//! alive by the rank's heartbeat, and a unit whose lease ran out is leased
//! again by whoever asks next (its writes are positional and every chunk is
//! verified, so a unit done twice is harmless). Every statement is one
//! round trip; [`Queue::round_trips`] counts them for docs/SCALE.md.

use std::time::{Duration, Instant};

use postgres::types::ToSql;
use postgres::{Client, NoTls, Row};

use crate::shard::Unit;

/// The schema this build writes; a database with a newer one is refused.
pub const SCHEMA_VERSION: i32 = 1;

/// Why the queue could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("{0}")]
    Usage(String),
    #[error(
        "cannot reach PostgreSQL at {at}: {why}; is the server running, and is --queue right?"
    )]
    Connect { at: String, why: String },
    #[error("the queue's database ({at}) failed: {why}")]
    Db { at: String, why: String },
    #[error("the run {run} in the queue was made from another manifest ({theirs}; this rank's is {ours}): the sources changed, or two transfers share a --run-id")]
    ManifestDiffers {
        run: String,
        theirs: String,
        ours: String,
    },
    #[error("no manifest for the run {run} in the queue after {} s: is rank 0 running, with the same --queue and --run-id?", .waited.as_secs())]
    NotPublished { run: String, waited: Duration },
}

impl From<QueueError> for longhaul_engine::EngineError {
    fn from(e: QueueError) -> Self {
        use longhaul_engine::EngineError as E;
        match e {
            QueueError::Usage(_) | QueueError::ManifestDiffers { .. } => E::Usage(e.to_string()),
            QueueError::Connect { .. } => E::Connect(e.to_string()),
            QueueError::Db { .. } | QueueError::NotPublished { .. } => E::Failed(e.to_string()),
        }
    }
}

/// What [`Queue::publish`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// This call made the run.
    New,
    /// The run was there, from the same manifest.
    Existing,
}

/// A unit this rank holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    pub id: i64,
    pub unit: Unit,
    /// Times it was leased, this one included.
    pub attempts: u32,
}

/// The run's units by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub todo: u64,
    /// Leased, their leases running (expired ones count as `todo`).
    pub leased: u64,
    pub done: u64,
    pub failed: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
}

/// One run's queue, on one connection.
pub struct Queue {
    db: Db,
    run: String,
}

/// The connection, and what it has cost.
struct Db {
    client: Client,
    /// Where, for messages: host and database, never the password.
    at: String,
    round_trips: u64,
}

/// `url` without its password, for messages.
fn shown(url: &str) -> String {
    match url.parse::<postgres::Config>() {
        Ok(c) => shown_config(&c),
        Err(_) => "the --queue URL".into(),
    }
}

/// Where `c` connects, without its password, for messages.
fn shown_config(c: &postgres::Config) -> String {
    let hosts: Vec<String> = c
        .get_hosts()
        .iter()
        .map(|h| match h {
            postgres::config::Host::Tcp(h) => h.clone(),
            postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    let port = c.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{}:{port}/{}",
        hosts.join(","),
        c.get_dbname().unwrap_or("")
    )
}

/// Whether every host of `c` is this machine (loopback or a socket).
fn local_only(c: &postgres::Config) -> bool {
    c.get_hosts().iter().all(|h| match h {
        postgres::config::Host::Unix(_) => true,
        postgres::config::Host::Tcp(h) => {
            h == "localhost" || h.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback())
        }
    })
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS longhaul_schema (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS longhaul_runs (
    run           text PRIMARY KEY,
    manifest_hash text NOT NULL,
    manifest      bytea NOT NULL,
    units         bigint NOT NULL,
    bytes         bigint NOT NULL,
    created       timestamptz NOT NULL DEFAULT now(),
    finalized_by  text,
    aggregate     jsonb
);
CREATE TABLE IF NOT EXISTS longhaul_work (
    run         text NOT NULL REFERENCES longhaul_runs(run) ON DELETE CASCADE,
    id          bigint NOT NULL,
    first_entry integer NOT NULL,
    end_entry   integer NOT NULL,
    chunk_lo    integer,
    chunk_hi    integer,
    bytes       bigint NOT NULL,
    state       text NOT NULL DEFAULT 'todo',
    owner       text,
    lease_until timestamptz,
    attempts    integer NOT NULL DEFAULT 0,
    error       text,
    PRIMARY KEY (run, id)
);
CREATE INDEX IF NOT EXISTS longhaul_work_open ON longhaul_work (run, id) WHERE state <> 'done';
CREATE TABLE IF NOT EXISTS longhaul_ranks (
    run     text NOT NULL REFERENCES longhaul_runs(run) ON DELETE CASCADE,
    rank    integer NOT NULL,
    worker  text NOT NULL,
    summary jsonb NOT NULL,
    updated timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run, rank)
);
";

impl Db {
    /// One statement, one round trip, its error named with the database.
    fn one(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row, QueueError> {
        self.round_trips += 1;
        self.client
            .query_one(sql, params)
            .map_err(|e| self.db_err(e))
    }

    fn opt(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, QueueError> {
        self.round_trips += 1;
        self.client
            .query_opt(sql, params)
            .map_err(|e| self.db_err(e))
    }

    fn all(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, QueueError> {
        self.round_trips += 1;
        self.client.query(sql, params).map_err(|e| self.db_err(e))
    }

    fn exec(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, QueueError> {
        self.round_trips += 1;
        self.client.execute(sql, params).map_err(|e| self.db_err(e))
    }

    fn db_err(&self, e: postgres::Error) -> QueueError {
        QueueError::Db {
            at: self.at.clone(),
            why: statement_failed(&e),
        }
    }
}

/// A connection to the PostgreSQL database `url` names, as libpq would
/// make it (its password found as libpq finds it, [`crate::dbauth`]; TLS
/// always verified, [`crate::dbtls`]), and where it is (host and
/// database, never the password) for messages. The work queue's, and a
/// job server's (`serve --jobs postgres://...`).
pub fn open_client(url: &str) -> Result<(Client, String), QueueError> {
    let (url, auth) = crate::dbauth::split(url).map_err(QueueError::Usage)?;
    let service_name = auth
        .service
        .clone()
        .or_else(|| std::env::var("PGSERVICE").ok().filter(|s| !s.is_empty()));
    let service = match &service_name {
        Some(name) => crate::dbauth::service(name).map_err(QueueError::Usage)?,
        None => Vec::new(),
    };
    let (rest, mut tls) = crate::dbtls::split(&url).map_err(QueueError::Usage)?;
    if !url.contains("sslmode=") {
        let (_, from_service) = crate::dbtls::split(&crate::dbauth::service_tls(&service))
            .map_err(|e| QueueError::Usage(format!("{e} (in the service's settings)")))?;
        tls = tls.or(from_service);
    }
    let mut config: postgres::Config = rest.parse().map_err(|e| {
        QueueError::Usage(format!(
            "--queue {}: not a PostgreSQL URL ({e}); {}",
            shown(&rest),
            crate::dbtls::URL_FORMS
        ))
    })?;
    let found = crate::dbauth::fill(&mut config, &auth, service_name.as_deref(), &service)
        .map_err(QueueError::Usage)?;
    let at = shown_config(&config);
    for note in &found.notes {
        tracing::warn!("--queue {at}: {note}");
    }
    if let (Some(from), None, false) = (&found.from, &tls, local_only(&config)) {
        return Err(QueueError::Usage(format!(
            "--queue {at}: the password (from {from}) would cross the network in plaintext; add ?sslmode=verify-full (and &sslrootcert=CA.pem for a site's own CA), or use a database on this host"
        )));
    }
    limits(&mut config);
    config.application_name("longhaul");
    let connect_err = |e: postgres::Error| {
        let mut why = crate::dbtls::explained(&e);
        if why.contains("password") {
            match &found.from {
                Some(from) => why.push_str(&format!(" (the password came from {from})")),
                None => {
                    why.push_str(&format!(
                        " (no password was found: {})",
                        crate::dbauth::WHERE_PASSWORDS_GO
                    ));
                }
            }
            for note in &found.notes {
                why.push_str(&format!("; {note}"));
            }
        }
        QueueError::Connect {
            at: at.clone(),
            why,
        }
    };
    let db = match tls {
        None => config.connect(NoTls).map_err(connect_err)?,
        Some(t) => {
            config.ssl_mode(postgres::config::SslMode::Require);
            let tls = t.connector().map_err(QueueError::Usage)?;
            config.connect(tls).map_err(connect_err)?
        }
    };
    Ok((db, at))
}

/// How long a connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection silent this long is probed (TCP keepalive), every
/// [`KEEPALIVE_INTERVAL`], and given up after [`KEEPALIVE_RETRIES`]
/// probes unanswered: a database host that vanished is found within a
/// minute, where the kernel's defaults take over two hours.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub const KEEPALIVE_RETRIES: u32 = 3;
/// Data sent and not acknowledged this long ends the connection (Linux's
/// `TCP_USER_TIMEOUT`; its default retransmits for about 15 minutes).
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(60);
/// Set on every connection (the startup packet's `options`, so no round
/// trip): no statement of longhaul's runs longer (the longest, a batch of
/// 1,000 units, takes milliseconds), none waits longer for a lock another
/// session holds, and a transaction left idle (its client gone) is ended
/// by the server, its locks released. A URL's own
/// `options=-c statement_timeout=...` comes after these and wins.
pub const SESSION_LIMITS: &str =
    "-c statement_timeout=600s -c lock_timeout=60s -c idle_in_transaction_session_timeout=600s";

/// Puts the limits above on `config`: a database that vanishes, or a
/// statement stuck behind another session's lock, ends in an error that
/// names the database, never in a rank that hangs.
fn limits(config: &mut postgres::Config) {
    config
        .connect_timeout(CONNECT_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_RETRIES)
        .tcp_user_timeout(TCP_USER_TIMEOUT);
    let options = match config.get_options() {
        Some(theirs) if !theirs.trim().is_empty() => format!("{SESSION_LIMITS} {theirs}"),
        _ => SESSION_LIMITS.to_string(),
    };
    config.options(&options);
}

/// Why a statement failed, and what to do where longhaul's limits
/// ([`SESSION_LIMITS`], the keepalives) ended it; the job server's store
/// says it the same way.
pub fn statement_failed(e: &postgres::Error) -> String {
    use postgres::error::SqlState;
    let Some(d) = e.as_db_error() else {
        let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
        if e.is_closed() || io {
            return format!(
                "{} (the connection was lost: the database did not answer for {} s, or closed it; is it up and reachable from this host?)",
                crate::dbtls::explained(e),
                (KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_RETRIES).as_secs()
            );
        }
        return e.to_string();
    };
    let hint = match *d.code() {
        SqlState::QUERY_CANCELED => " (a statement ran past its statement_timeout, 600 s unless the URL sets another: the database is overloaded, or another session holds a lock on longhaul's tables; see pg_stat_activity)",
        SqlState::LOCK_NOT_AVAILABLE => " (waited past the lock_timeout, 60 s unless the URL sets another, for a lock another session holds on longhaul's tables: end that session, see pg_stat_activity)",
        SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT => " (the server ended this session, idle in a transaction past 600 s)",
        _ => "",
    };
    format!("{}{hint}", d.message())
}

impl Queue {
    /// Connects and makes the tables if they are not there (one rank at a
    /// time: an advisory lock around the DDL).
    /// The password is found as libpq finds it ([`crate::dbauth`]).
    pub fn connect(url: &str, run: &str) -> Result<Queue, QueueError> {
        let (client, at) = open_client(url)?;
        let mut q = Queue {
            db: Db {
                client,
                at,
                round_trips: 1,
            },
            run: run.to_string(),
        };
        q.migrate()?;
        Ok(q)
    }
    /// Whether this connection is encrypted (TLS), as the server sees it.
    pub fn encrypted(&mut self) -> Result<bool, QueueError> {
        let r = self.db.opt(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )?;
        Ok(r.is_some_and(|r| r.get::<_, bool>(0)))
    }

    fn migrate(&mut self) -> Result<(), QueueError> {
        let r = (|| {
            let mut tx = self.db.client.transaction()?;
            tx.execute("SELECT pg_advisory_xact_lock(7171017)", &[])?;
            tx.batch_execute(SCHEMA)?;
            let v: Option<i32> = tx
                .query_opt("SELECT max(version) FROM longhaul_schema", &[])?
                .and_then(|r| r.get(0));
            if v.is_none() {
                tx.execute(
                    "INSERT INTO longhaul_schema (version) VALUES ($1)",
                    &[&SCHEMA_VERSION],
                )?;
            }
            tx.commit()?;
            Ok::<_, postgres::Error>(v)
        })();
        self.db.round_trips += 5;
        match r {
            Ok(Some(v)) if v > SCHEMA_VERSION => Err(QueueError::Usage(format!(
                "the queue's database ({}) has schema {v}, newer than this build's {SCHEMA_VERSION}: upgrade longhaul on every node",
                self.db.at
            ))),
            Ok(_) => Ok(()),
            Err(e) => Err(self.db.db_err(e)),
        }
    }

    /// Makes the run with its manifest and units, unless it is there;
    /// then it must be of the same manifest.
    pub fn publish(
        &mut self,
        manifest_hash: &str,
        manifest: &[u8],
        units: &[Unit],
    ) -> Result<Published, QueueError> {
        let run = self.run.clone();
        let bytes: i64 = units.iter().map(|u| u.bytes as i64).sum();
        let r = (|| {
            let mut tx = self.db.client.transaction()?;
            let made = tx.execute(
                "INSERT INTO longhaul_runs (run, manifest_hash, manifest, units, bytes) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (run) DO NOTHING",
                &[&run, &manifest_hash, &manifest, &(units.len() as i64), &bytes],
            )?;
            if made == 0 {
                let theirs: String = tx
                    .query_one(
                        "SELECT manifest_hash FROM longhaul_runs WHERE run = $1",
                        &[&run],
                    )?
                    .get(0);
                tx.commit()?;
                return Ok(Err(theirs));
            }
            // Many rows a statement: a million units in a few hundred round trips.
            for (n, batch) in units.chunks(1_000).enumerate() {
                let mut sql = String::from(
                    "INSERT INTO longhaul_work (run, id, first_entry, end_entry, chunk_lo, chunk_hi, bytes) VALUES ",
                );
                for (i, u) in batch.iter().enumerate() {
                    let id = n * 1_000 + i;
                    let (lo, hi) = match u.chunks {
                        Some([lo, hi]) => (lo.to_string(), hi.to_string()),
                        None => ("NULL".into(), "NULL".into()),
                    };
                    if i > 0 {
                        sql.push(',');
                    }
                    sql.push_str(&format!(
                        "($1, {id}, {}, {}, {lo}, {hi}, {})",
                        u.first, u.end, u.bytes
                    ));
                }
                tx.execute(sql.as_str(), &[&run])?;
            }
            tx.commit()?;
            Ok(Ok(()))
        })();
        self.db.round_trips += 4 + units.len().div_ceil(1_000) as u64;
        match r.map_err(|e| self.db.db_err(e))? {
            Ok(()) => Ok(Published::New),
            Err(theirs) if theirs == manifest_hash => Ok(Published::Existing),
            Err(theirs) => Err(QueueError::ManifestDiffers {
                run,
                theirs,
                ours: manifest_hash.to_string(),
            }),
        }
    }

    /// The run's manifest (hash, bytes), if it is published.
    pub fn manifest(&mut self) -> Result<Option<(String, Vec<u8>)>, QueueError> {
        let r = self.db.opt(
            "SELECT manifest_hash, manifest FROM longhaul_runs WHERE run = $1",
            &[&self.run],
        )?;
        Ok(r.map(|r| (r.get(0), r.get(1))))
    }

    /// Takes the right to walk the sources for this run, if no other rank
    /// holds it: a session lock, so a rank that dies walking gives it up.
    pub fn try_lock_walk(&mut self) -> Result<bool, QueueError> {
        let r = self.db.one(
            "SELECT pg_try_advisory_lock(7171017, hashtext($1))",
            &[&self.run],
        )?;
        Ok(r.get(0))
    }

    /// Gives the right to walk back.
    pub fn unlock_walk(&mut self) -> Result<(), QueueError> {
        self.db.exec(
            "SELECT pg_advisory_unlock(7171017, hashtext($1))",
            &[&self.run],
        )?;
        Ok(())
    }

    /// Waits up to `timeout` for the manifest.
    pub fn wait_published(&mut self, timeout: Duration) -> Result<(String, Vec<u8>), QueueError> {
        let started = Instant::now();
        loop {
            if let Some(m) = self.manifest()? {
                return Ok(m);
            }
            if started.elapsed() > timeout {
                return Err(QueueError::NotPublished {
                    run: self.run.clone(),
                    waited: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Leases up to `n` units for `lease`: units never leased, given back,
    /// or whose lease ran out, lowest id first, skipping rows another rank
    /// is leasing at this moment.
    pub fn lease(
        &mut self,
        worker: &str,
        n: u32,
        lease: Duration,
    ) -> Result<Vec<Leased>, QueueError> {
        let secs = lease.as_secs_f64();
        let rows = self.db.all(
                "UPDATE longhaul_work w SET state = 'leased', owner = $2, attempts = w.attempts + 1,
                     lease_until = now() + make_interval(secs => $3)
                 WHERE (w.run, w.id) IN (
                     SELECT run, id FROM longhaul_work
                     WHERE run = $1 AND (state = 'todo' OR (state = 'leased' AND lease_until < now()))
                     ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED)
                 RETURNING w.id, w.first_entry, w.end_entry, w.chunk_lo, w.chunk_hi, w.bytes, w.attempts",
                &[&self.run, &worker, &secs, &i64::from(n)],
        )?;
        let mut out: Vec<Leased> = rows
            .iter()
            .map(|r| {
                let lo: Option<i32> = r.get(3);
                let hi: Option<i32> = r.get(4);
                Leased {
                    id: r.get(0),
                    unit: Unit {
                        first: r.get::<_, i32>(1) as u32,
                        end: r.get::<_, i32>(2) as u32,
                        chunks: lo.zip(hi).map(|(lo, hi)| [lo as u32, hi as u32]),
                        bytes: r.get::<_, i64>(5) as u64,
                    },
                    attempts: r.get::<_, i32>(6) as u32,
                }
            })
            .collect();
        out.sort_by_key(|l| l.id);
        Ok(out)
    }

    /// Extends the leases of `ids` this worker still holds; how many.
    pub fn renew(
        &mut self,
        worker: &str,
        ids: &[i64],
        lease: Duration,
    ) -> Result<usize, QueueError> {
        let n = self.db.exec(
            "UPDATE longhaul_work SET lease_until = now() + make_interval(secs => $4)
                 WHERE run = $1 AND owner = $2 AND state = 'leased' AND id = ANY($3)",
            &[&self.run, &worker, &ids, &lease.as_secs_f64()],
        )?;
        Ok(n as usize)
    }

    /// Marks `ids` done (whoever holds them now: the work is done either way).
    pub fn done(&mut self, worker: &str, ids: &[i64]) -> Result<(), QueueError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.db.exec(
            "UPDATE longhaul_work SET state = 'done', owner = $2, lease_until = NULL, error = NULL
                 WHERE run = $1 AND id = ANY($3)",
            &[&self.run, &worker, &ids],
        )?;
        Ok(())
    }

    /// Gives unit `id` back after it failed: leased again, unless it has
    /// been tried `max_attempts` times (then failed for good).
    pub fn failed(
        &mut self,
        worker: &str,
        id: i64,
        error: &str,
        max_attempts: u32,
    ) -> Result<(), QueueError> {
        self.db.exec(
            "UPDATE longhaul_work SET
                     state = CASE WHEN attempts >= $4 THEN 'failed' ELSE 'todo' END,
                     owner = NULL, lease_until = NULL, error = $5
                 WHERE run = $1 AND id = $2 AND owner = $3 AND state = 'leased'",
            &[&self.run, &id, &worker, &(max_attempts as i32), &error],
        )?;
        Ok(())
    }

    /// The run's units by state.
    /// Units free to lease now (never leased, or their lease ran out),
    /// and units whose leases still run: a probe of the pending units'
    /// index, however many are done.
    pub fn pending(&mut self) -> Result<(u64, u64), QueueError> {
        let r = self.db.one(
                "SELECT
                   count(*) FILTER (WHERE state = 'todo' OR (state = 'leased' AND lease_until < now())),
                   count(*) FILTER (WHERE state = 'leased' AND lease_until >= now())
                 FROM longhaul_work WHERE run = $1 AND state <> 'done'",
                &[&self.run],
        )?;
        Ok((r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64))
    }

    pub fn counts(&mut self) -> Result<Counts, QueueError> {
        let r = self.db.one(
                "SELECT
                   count(*) FILTER (WHERE state = 'todo' OR (state = 'leased' AND lease_until < now())),
                   count(*) FILTER (WHERE state = 'leased' AND lease_until >= now()),
                   count(*) FILTER (WHERE state = 'done'),
                   count(*) FILTER (WHERE state = 'failed'),
                   coalesce(sum(bytes), 0)::bigint,
                   coalesce(sum(bytes) FILTER (WHERE state = 'done'), 0)::bigint
                 FROM longhaul_work WHERE run = $1",
                &[&self.run],
        )?;
        let n = |i: usize| r.get::<_, i64>(i) as u64;
        Ok(Counts {
            todo: n(0),
            leased: n(1),
            done: n(2),
            failed: n(3),
            bytes_total: n(4),
            bytes_done: n(5),
        })
    }

    /// Stores (or replaces) a rank's result.
    pub fn report_rank(
        &mut self,
        rank: u32,
        worker: &str,
        summary: &serde_json::Value,
    ) -> Result<(), QueueError> {
        self.db.exec(
            "INSERT INTO longhaul_ranks (run, rank, worker, summary) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (run, rank) DO UPDATE SET worker = $3, summary = $4, updated = now()",
            &[&self.run, &(rank as i32), &worker, summary],
        )?;
        Ok(())
    }

    /// Every rank's result: rank, worker, summary.
    pub fn rank_reports(&mut self) -> Result<Vec<(u32, String, serde_json::Value)>, QueueError> {
        let rows = self.db.all(
            "SELECT rank, worker, summary FROM longhaul_ranks WHERE run = $1 ORDER BY rank",
            &[&self.run],
        )?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, i32>(0) as u32, r.get(1), r.get(2)))
            .collect())
    }

    /// Claims the run's final check: true for exactly one worker.
    pub fn claim_finalize(&mut self, worker: &str) -> Result<bool, QueueError> {
        let n = self.db.exec(
            "UPDATE longhaul_runs SET finalized_by = $2 WHERE run = $1 AND finalized_by IS NULL",
            &[&self.run, &worker],
        )?;
        Ok(n == 1)
    }

    /// Stores the run's one result.
    pub fn set_aggregate(&mut self, v: &serde_json::Value) -> Result<(), QueueError> {
        self.db.exec(
            "UPDATE longhaul_runs SET aggregate = $2 WHERE run = $1",
            &[&self.run, v],
        )?;
        Ok(())
    }

    /// Round trips to the database this connection made.
    pub fn round_trips(&self) -> u64 {
        self.db.round_trips
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_probes_a_silent_database_and_keeps_the_urls_own_options() {
        let mut c: postgres::Config = "postgres://h/d?options=-c%20search_path%3Dx"
            .parse()
            .unwrap();
        limits(&mut c);
        assert!(c.get_keepalives());
        assert_eq!(c.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(c.get_keepalives_interval(), Some(KEEPALIVE_INTERVAL));
        assert_eq!(c.get_keepalives_retries(), Some(KEEPALIVE_RETRIES));
        assert_eq!(c.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        assert_eq!(c.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(
            c.get_options(),
            Some(format!("{SESSION_LIMITS} -c search_path=x").as_str())
        );
    }
}
