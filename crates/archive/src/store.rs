//! [`Archive`]: one connection to the archive file, its writes and its
//! queries. Opening checks what the file is before anything is written:
//! not SQLite, damaged, or from a newer longhaul is an [`ArchiveError`]
//! naming the file, and the file is left as it was.
//!
//! The archive is its owner's alone: made 0600 (with its `-wal`, `-shm`
//! and `-journal`, whatever the umask), and a path that is a symbolic
//! link, not a regular file or not owned by this user is refused
//! ([`ArchiveError::Unsafe`]), for reading too. Its rows carry no
//! credential: what is written is scrubbed ([`crate::scrub`]), rows an
//! older build wrote are scrubbed when the archive is next opened to write
//! (their old bytes overwritten), and everything read is scrubbed again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior};

use crate::model::{
    FileHit, FileRow, HistoryFilter, IntervalRow, JobRun, NewRun, RunDetail, RunRow,
};
use crate::schema::{MIGRATIONS, SCHEMA_VERSION};

/// What went wrong with the archive, naming its file.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("the archive {path} is not a longhaul archive or is damaged ({why}); move it aside (a new one is made in its place) or point --archive elsewhere")]
    Corrupt { path: PathBuf, why: String },
    #[error("the archive {path} has schema version {found}, newer than this longhaul's {ours}; use the newer longhaul, or --archive another file")]
    Newer {
        path: PathBuf,
        found: u32,
        ours: u32,
    },
    #[error("no archive at {path}: nothing has been recorded there yet (runs are archived unless --no-archive)")]
    Missing { path: PathBuf },
    #[error("archive {path}: {why}")]
    Io { path: PathBuf, why: String },
    #[error("no run {0} in the archive; `longhaul history` lists them")]
    NoRun(String),
    #[error("the digest prefix {prefix} matches {} different digests ({}); give more of its hex digits", .digests.len(), .digests.join(", "))]
    AmbiguousDigest {
        prefix: String,
        digests: Vec<String>,
    },
    #[error("refusing the archive {path}: {why}; point --archive (or LONGHAUL_ARCHIVE) at a file of your own")]
    Unsafe { path: PathBuf, why: String },
}

/// The files SQLite keeps beside the archive.
const SIDE_FILES: &[&str] = &["-wal", "-shm", "-journal"];

/// The archive's file and the files beside it.
fn archive_files(path: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    std::iter::once(path.to_path_buf()).chain(SIDE_FILES.iter().map(move |s| {
        let mut p = path.as_os_str().to_os_string();
        p.push(s);
        PathBuf::from(p)
    }))
}

/// Refuses the archive when it, or a file beside it, is a link, not a
/// regular file, or not this user's; makes each that exists 0600. Whether
/// the archive itself exists.
fn own_files(path: &Path) -> Result<bool, ArchiveError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let me = rustix::process::geteuid().as_raw();
    let mut exists = false;
    for (i, f) in archive_files(path).enumerate() {
        let m = match std::fs::symlink_metadata(&f) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(path, format!("{}: {e}", f.display()))),
        };
        let unsafe_file = |why: String| ArchiveError::Unsafe {
            path: path.to_path_buf(),
            why: format!("{} {why}", f.display()),
        };
        if m.file_type().is_symlink() {
            return Err(unsafe_file(
                "is a symbolic link (the archive is never written through a link)".into(),
            ));
        }
        if !m.file_type().is_file() {
            return Err(unsafe_file("is not a regular file".into()));
        }
        if m.uid() != me {
            return Err(unsafe_file(format!(
                "belongs to uid {}, not to this user (uid {me})",
                m.uid()
            )));
        }
        if m.mode() & 0o077 != 0 {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| io_error(path, format!("making {} 0600: {e}", f.display())))?;
        }
        exists |= i == 0;
    }
    Ok(exists)
}

/// The schema version of the archive at `path`, read with its tables in
/// one snapshot (another process may be making the schema meanwhile):
/// a newer archive, another program's database or a schema without its
/// runs table is refused.
fn read_header(conn: &Connection, path: &Path) -> Result<u32, ArchiveError> {
    let err = |e| classify(path, e);
    // Reading the header is what tells a damaged file or a stranger from an archive.
    let (version, tables, has_runs): (u32, i64, i64) = conn
        .query_row(
            "SELECT (SELECT user_version FROM pragma_user_version), \
                    (SELECT count(*) FROM sqlite_master WHERE type = 'table'), \
                    (SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'runs')",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(err)?;
    if version > SCHEMA_VERSION {
        return Err(ArchiveError::Newer {
            path: path.to_path_buf(),
            found: version,
            ours: SCHEMA_VERSION,
        });
    }
    if version == 0 && tables > 0 {
        return Err(ArchiveError::Corrupt {
            path: path.to_path_buf(),
            why: "an SQLite database with other tables".into(),
        });
    }
    if version > 0 && has_runs == 0 {
        return Err(ArchiveError::Corrupt {
            path: path.to_path_buf(),
            why: format!("schema version {version} but no runs table"),
        });
    }
    Ok(version)
}

/// Makes the archive's file, 0600 whatever the umask, unless it is there.
fn create_private(path: &Path) -> Result<(), ArchiveError> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        // Made meanwhile by another run: checked again by the caller.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_error(path, e)),
    }
}

/// Makes an SQLite file of this user's (the archive, a server's jobs)
/// private before it is opened: made 0600 if missing; refused if it, or
/// a `-wal`, `-shm` or `-journal` beside it, is a link, not a regular
/// file, or another user's; made 0600 if wider.
pub fn private_sqlite(path: &Path) -> Result<(), ArchiveError> {
    if !own_files(path)? {
        create_private(path)?;
        own_files(path)?;
    }
    Ok(())
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::Io {
        path: path.to_path_buf(),
        why: e.to_string(),
    }
}

/// The lookup key of a file's name: 64 bits of its BLAKE3.
pub fn name_key(name: &str) -> i64 {
    let h = blake3::hash(name.as_bytes());
    i64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// The lookup key of a digest (hex, any case): its first 64 bits. None
/// when it is not hex.
pub fn digest_key(digest: &str) -> Option<i64> {
    let head = longhaul_proto::units::from_hex::<8>(digest.get(..16)?)?;
    Some(u64::from_be_bytes(head) as i64)
}

/// The fewest hex digits `where` takes as a digest prefix.
pub const MIN_DIGEST_PREFIX: usize = 8;

/// Whether `what` reads as a digest or a prefix of one (hex, at least
/// [`MIN_DIGEST_PREFIX`] digits, at most 64).
pub fn is_digest_prefix(what: &str) -> bool {
    (MIN_DIGEST_PREFIX..=64).contains(&what.len()) && what.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The digest keys a hex prefix of a digest spans (inclusive).
fn digest_key_range(prefix: &str) -> Option<(i64, i64)> {
    let head = prefix.get(..prefix.len().min(16))?;
    let v = u64::from_str_radix(head, 16).ok()?;
    let free = 64 - 4 * head.len() as u32;
    let mask = if free == 0 {
        0
    } else {
        u64::MAX >> (64 - free)
    };
    let lo = v << free;
    let hi = lo | mask;
    // At least 8 digits: the top bit is fixed, so the range does not wrap as i64.
    Some((lo as i64, hi as i64))
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This host's name, as runs record it.
pub fn host_name() -> String {
    rustix_hostname().unwrap_or_else(|| "localhost".into())
}

fn rustix_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// An open archive.
pub struct Archive {
    conn: Connection,
    path: PathBuf,
}

/// `step`, tried again while SQLite answers "busy" for up to the busy
/// timeout: a lock taken while another connection upgrades its own (a
/// journal mode switched, a write begun by several first openers at once)
/// is refused at once, without the busy handler, to avoid a deadlock.
fn busy_retried<T>(
    path: &Path,
    mut step: impl FnMut() -> rusqlite::Result<T>,
) -> Result<T, ArchiveError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match step() {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            done => return done.map_err(|e| classify(path, e)),
        }
    }
}

impl Archive {
    /// Opens the archive for writing, making it (and its directory, mode
    /// 0700) when it does not exist, and migrating an older schema.
    pub fn open(path: &Path) -> Result<Archive, ArchiveError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::create_dir_all(dir).map_err(|e| io_error(path, e))?;
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
            }
        }
        private_sqlite(path)?;
        let mut a = Archive::connect(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        )?;
        a.prepare(true)?;
        a.scrub_old_rows()?;
        Ok(a)
    }

    /// Opens an existing archive to read it (history, show, where, the
    /// dashboard, plots). Never creates, migrates or changes the file.
    pub fn open_read_only(path: &Path) -> Result<Archive, ArchiveError> {
        if !own_files(path)? {
            return Err(ArchiveError::Missing {
                path: path.to_path_buf(),
            });
        }
        let mut a = Archive::connect(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        a.prepare(false)?;
        Ok(a)
    }

    /// The file at `path` opened with `flags`, never through a symbolic
    /// link, for this thread's use.
    fn connect(path: &Path, flags: OpenFlags) -> Result<Archive, ArchiveError> {
        let conn = Connection::open_with_flags(
            path,
            flags | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )
        .map_err(|e| classify(path, e))?;
        Ok(Archive {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// The file this archive lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn prepare(&mut self, write: bool) -> Result<(), ArchiveError> {
        let path = self.path.clone();
        self.conn
            .busy_timeout(Duration::from_secs(5))
            .map_err(|e| classify(&path, e))?;
        let version = read_header(&self.conn, &path)?;
        if !write {
            if version < SCHEMA_VERSION {
                return Err(ArchiveError::Io {
                    path,
                    why: format!(
                        "schema version {version} is older than {SCHEMA_VERSION}; any run (or `longhaul history` after one) upgrades it"
                    ),
                });
            }
            return Ok(());
        }
        // WAL: the dashboard and `history` read while a transfer writes.
        let conn = &self.conn;
        busy_retried(&path, || conn.pragma_update(None, "journal_mode", "WAL"))?;
        self.conn
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| classify(&path, e))?;
        self.conn
            .pragma_update(None, "foreign_keys", "ON")
            .map_err(|e| classify(&path, e))?;
        // A catalogue's index pages stay in memory while a run writes them;
        // 4 MiB at most, so a run of days writes in bounded memory.
        self.conn
            .pragma_update(None, "cache_size", -4096)
            .map_err(|e| classify(&path, e))?;
        if version < SCHEMA_VERSION {
            self.migrate()?;
        }
        Ok(())
    }

    /// Brings the schema up to date. Several commands (or `serve`s) may
    /// first use one archive at once: the write lock is taken before the
    /// version is read again, so one of them makes or upgrades the schema
    /// and the others, waiting their turn (the busy timeout), find it
    /// done. All steps in one transaction: an interrupted upgrade leaves
    /// the file at its old version, never half way.
    fn migrate(&mut self) -> Result<(), ArchiveError> {
        let path = self.path.clone();
        let conn = &self.conn;
        let tx = busy_retried(&path, || {
            rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
        })?;
        let version = read_header(&tx, &path)?;
        for sql in MIGRATIONS.iter().skip(version as usize) {
            tx.execute_batch(sql).map_err(|e| classify(&path, e))?;
        }
        if version < SCHEMA_VERSION {
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(|e| classify(&path, e))?;
        }
        tx.commit().map_err(|e| classify(&path, e))
    }

    /// Scrubs the credentials out of the rows written since the last time
    /// (by an older build, or by hand), and overwrites their old bytes in
    /// the file and its log. One pass over every row the first time, then
    /// only over the rows written since (`scrubbed_upto`).
    fn scrub_old_rows(&mut self) -> Result<(), ArchiveError> {
        use crate::scrub::{scrub_command, scrub_text};
        let path = self.path.clone();
        let err = |e: rusqlite::Error| io_error(&path, e);
        self.conn
            .execute_batch("CREATE TABLE IF NOT EXISTS scrubbed_upto (id INTEGER NOT NULL)")
            .map_err(err)?;
        let upto: i64 = self
            .conn
            .query_row("SELECT coalesce(max(id), 0) FROM scrubbed_upto", [], |r| {
                r.get(0)
            })
            .map_err(err)?;
        let last: i64 = self
            .conn
            .query_row("SELECT coalesce(max(id), 0) FROM runs", [], |r| r.get(0))
            .map_err(err)?;
        if last <= upto {
            return Ok(());
        }
        type Texts = (i64, String, [Option<String>; 4]);
        let rows: Vec<Texts> = {
            let mut stmt = self
                .conn
                .prepare(
                    "SELECT id, command, error, warnings, params, summary FROM runs WHERE id > ?1",
                )
                .map_err(err)?;
            let rows = stmt
                .query_map([upto], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        [r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?],
                    ))
                })
                .map_err(err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(err)?;
            rows
        };
        let mut changed = 0;
        // Freed bytes are zeroed: the old text leaves the file's pages.
        self.conn
            .pragma_update(None, "secure_delete", "ON")
            .map_err(err)?;
        let tx = self.conn.transaction().map_err(err)?;
        for (id, command, texts) in rows {
            let command2 = scrub_command(&command);
            let texts2 = texts.clone().map(|t| t.map(|t| scrub_text(&t)));
            if command2 != command || texts2 != texts {
                let [error, warnings, params, summary] = texts2;
                tx.execute(
                    "UPDATE runs SET command = ?2, error = ?3, warnings = ?4, params = ?5,
                       summary = ?6 WHERE id = ?1",
                    params![id, command2, error, warnings, params, summary],
                )
                .map_err(err)?;
                changed += 1;
            }
        }
        tx.execute("DELETE FROM scrubbed_upto", []).map_err(err)?;
        tx.execute("INSERT INTO scrubbed_upto (id) VALUES (?1)", [last])
            .map_err(err)?;
        tx.commit().map_err(err)?;
        self.conn
            .pragma_update(None, "secure_delete", "OFF")
            .map_err(err)?;
        if changed > 0 {
            // The log held the old pages: copied back, then emptied.
            let _ = self
                .conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
            tracing::info!(
                "archive {}: credentials scrubbed from {changed} older runs",
                path.display()
            );
        }
        Ok(())
    }

    /// Records a run as started; its id.
    pub fn begin_run(&self, run: &NewRun) -> Result<i64, ArchiveError> {
        let now = unix_now();
        self.conn
            .execute(
                "INSERT INTO runs (kind, status, started_at, updated_at, pid, command, local_host,
                   remote_host, export, grant_name, source, dest, params)
                 VALUES (?1, 'running', ?2, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    run.kind,
                    now,
                    std::process::id(),
                    crate::scrub::scrub_command(&run.command),
                    host_name(),
                    run.remote_host,
                    run.export,
                    run.grant,
                    run.source,
                    run.dest,
                    run.params
                        .as_ref()
                        .map(|p| crate::scrub::scrub_text(&p.to_string())),
                ],
            )
            .map_err(|e| io_error(&self.path, e))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Caps the file at `pages` pages, as a full disk would (tests).
    #[doc(hidden)]
    pub fn limit_pages(&self, pages: u64) {
        let _ = self
            .conn
            .query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()));
    }

    /// Pages the file holds now.
    #[doc(hidden)]
    pub fn page_count(&self) -> u64 {
        self.conn
            .query_row("PRAGMA page_count", [], |r| r.get::<_, i64>(0))
            .map_or(0, |n| n as u64)
    }

    /// The connection, for the writer's batched statements.
    pub(crate) fn conn(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// Runs that say `running` but whose process is gone (killed, power
    /// lost) become `interrupted`: what they recorded stays.
    pub fn settle_orphans(&self) -> Result<usize, ArchiveError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, pid, local_host FROM runs WHERE status = 'running'")
            .map_err(|e| io_error(&self.path, e))?;
        let orphans: Vec<i64> = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, Option<i64>>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .map_err(|e| io_error(&self.path, e))?
            .filter_map(Result::ok)
            .filter(|(_, pid, host)| gone(host, *pid))
            .map(|(id, ..)| id)
            .collect();
        for id in &orphans {
            self.conn
                .execute(
                    "UPDATE runs SET status = 'interrupted', ended_at = updated_at,
                       error = coalesce(error, 'the process ended without finishing the run')
                     WHERE id = ?1",
                    [id],
                )
                .map_err(|e| io_error(&self.path, e))?;
        }
        Ok(orphans.len())
    }

    /// `history`: runs, newest first.
    pub fn history(&self, f: &HistoryFilter) -> Result<Vec<RunRow>, ArchiveError> {
        let mut sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE 1 = 1");
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        if let Some(k) = &f.kind {
            sql.push_str(" AND kind = ?");
            args.push(k.clone().into());
        }
        if let Some(h) = &f.host {
            sql.push_str(" AND (instr(remote_host, ?) > 0 OR local_host = ?)");
            args.push(h.clone().into());
            args.push(h.clone().into());
        }
        if let Some(s) = f.since {
            sql.push_str(" AND started_at >= ?");
            args.push(s.into());
        }
        if let Some(e) = &f.export {
            sql.push_str(" AND export = ?");
            args.push(e.clone().into());
        }
        if let Some(s) = &f.status {
            sql.push_str(" AND status = ?");
            args.push(s.clone().into());
        }
        sql.push_str(" ORDER BY id DESC");
        if f.limit > 0 {
            sql.push_str(&format!(" LIMIT {}", f.limit));
        }
        let mut stmt = self
            .conn
            .prepare(&sql)
            .map_err(|e| io_error(&self.path, e))?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(args), run_row)
            .map_err(|e| io_error(&self.path, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io_error(&self.path, e))?;
        Ok(rows)
    }

    /// The archived attempts of jobs (runs of kind `job`), newest first, at
    /// most `limit`, each with its job's id and its attempt and run numbers
    /// (the dashboard's Jobs page groups them by job).
    pub fn job_runs(&self, limit: usize) -> Result<Vec<JobRun>, ArchiveError> {
        let sql = format!(
            "SELECT {RUN_COLUMNS}, coalesce(json_extract(params, '$.job'), ''),
                    coalesce(json_extract(params, '$.attempt'), 0), coalesce(json_extract(params, '$.run'), 0)
             FROM runs WHERE kind = 'job' ORDER BY id DESC LIMIT ?1"
        );
        let mut stmt = self
            .conn
            .prepare(&sql)
            .map_err(|e| io_error(&self.path, e))?;
        let rows = stmt
            .query_map([limit as i64], |r| {
                Ok(JobRun {
                    run: run_row(r)?,
                    job: r.get(RUN_COLUMN_COUNT)?,
                    attempt: r.get::<_, i64>(RUN_COLUMN_COUNT + 1)? as u32,
                    run_number: r.get::<_, i64>(RUN_COLUMN_COUNT + 2)? as u32,
                })
            })
            .map_err(|e| io_error(&self.path, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io_error(&self.path, e))?;
        Ok(rows)
    }

    /// Runs still running (the live view), oldest first.
    pub fn running(&self) -> Result<Vec<RunRow>, ArchiveError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE status = 'running' ORDER BY id"
            ))
            .map_err(|e| io_error(&self.path, e))?;
        let rows = stmt
            .query_map([], run_row)
            .map_err(|e| io_error(&self.path, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io_error(&self.path, e))?;
        Ok(rows.into_iter().filter(|r| r.status == "running").collect())
    }

    /// The id `RUN` names: a number, or `last`: the newest run of the
    /// user's own commands (a server on the same host archives what it
    /// served after the command that asked for it), else the newest
    /// served run (a host that only serves).
    pub fn resolve(&self, run: &str) -> Result<i64, ArchiveError> {
        let id = if run == "last" {
            self.conn
                .query_row(
                    "SELECT coalesce(max(id) FILTER (WHERE kind <> ?1), max(id)) FROM runs",
                    [crate::model::SERVED],
                    |r| r.get::<_, Option<i64>>(0),
                )
                .map_err(|e| io_error(&self.path, e))?
        } else {
            run.parse::<i64>().ok()
        };
        let Some(id) = id else {
            return Err(ArchiveError::NoRun(run.to_string()));
        };
        let exists: Option<i64> = self
            .conn
            .query_row("SELECT id FROM runs WHERE id = ?1", [id], |r| r.get(0))
            .optional()
            .map_err(|e| io_error(&self.path, e))?;
        exists.ok_or_else(|| ArchiveError::NoRun(run.to_string()))
    }

    /// `show`: the run, its parameters, summary and intervals.
    pub fn run(&self, id: i64) -> Result<RunDetail, ArchiveError> {
        let row = self
            .conn
            .query_row(
                &format!("SELECT {RUN_COLUMNS}, params, summary, warnings FROM runs WHERE id = ?1"),
                [id],
                |r| {
                    let run = run_row(r)?;
                    let params: Option<String> = r.get(RUN_COLUMN_COUNT)?;
                    let summary: Option<String> = r.get(RUN_COLUMN_COUNT + 1)?;
                    let warnings: Option<String> = r.get(RUN_COLUMN_COUNT + 2)?;
                    Ok((run, params, summary, warnings))
                },
            )
            .optional()
            .map_err(|e| io_error(&self.path, e))?
            .ok_or_else(|| ArchiveError::NoRun(id.to_string()))?;
        let (run, params, summary, warnings) = row;
        let file_count: i64 = self
            .conn
            .query_row("SELECT count(*) FROM files WHERE run = ?1", [id], |r| {
                r.get(0)
            })
            .map_err(|e| io_error(&self.path, e))?;
        let scrubbed = |t: Option<String>| t.map(|t| crate::scrub::scrub_text(&t));
        Ok(RunDetail {
            run,
            params: scrubbed(params).and_then(|p| serde_json::from_str(&p).ok()),
            summary: scrubbed(summary).and_then(|p| serde_json::from_str(&p).ok()),
            warnings: scrubbed(warnings)
                .and_then(|w| serde_json::from_str(&w).ok())
                .unwrap_or_default(),
            intervals: self.intervals(id, None)?,
            file_count: file_count as u64,
        })
    }

    /// A run's intervals in order, those after `after` when given (the
    /// live view asks for what is new).
    pub fn intervals(&self, id: i64, after: Option<u32>) -> Result<Vec<IntervalRow>, ArchiveError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT idx, direction, stream, start_s, end_s, bytes, bits_per_second, retransmits,
                        rtt_us, cwnd_bytes, streams, limit_kind, omitted
                 FROM intervals WHERE run = ?1 AND idx > ?2 ORDER BY idx, direction, stream",
            )
            .map_err(|e| io_error(&self.path, e))?;
        let after = after.map_or(-1, i64::from);
        let rows = stmt
            .query_map(params![id, after], |r| {
                Ok(IntervalRow {
                    idx: r.get(0)?,
                    direction: r.get(1)?,
                    stream: r.get(2)?,
                    start_s: r.get(3)?,
                    end_s: r.get(4)?,
                    bytes: r.get::<_, i64>(5)? as u64,
                    bits_per_second: r.get(6)?,
                    retransmits: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
                    rtt_us: r.get(8)?,
                    cwnd_bytes: r.get::<_, Option<i64>>(9)?.map(|v| v as u64),
                    streams: r.get(10)?,
                    limit: r.get(11)?,
                    omitted: r.get(12)?,
                })
            })
            .map_err(|e| io_error(&self.path, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io_error(&self.path, e))?;
        Ok(rows)
    }

    /// A run's files, in the order they landed, at most `limit` (0: all).
    pub fn files(&self, id: i64, limit: usize) -> Result<Vec<FileRow>, ArchiveError> {
        let limit = if limit == 0 { -1 } else { limit as i64 };
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {FILE_COLUMNS} FROM files WHERE run = ?1 ORDER BY rowid LIMIT ?2"
            ))
            .map_err(|e| io_error(&self.path, e))?;
        let rows = stmt
            .query_map(params![id, limit], file_row)
            .map_err(|e| io_error(&self.path, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io_error(&self.path, e))?;
        Ok(rows)
    }

    /// `where`: every run that moved this file (as its source or its
    /// destination, by full path or by the path it had in the transfer) or
    /// these bytes (a digest, or a prefix of one that names one digest),
    /// newest first.
    pub fn find(&self, what: &str) -> Result<Vec<FileHit>, ArchiveError> {
        if is_digest_prefix(what) {
            let hits = self.find_digest(what)?;
            let mut digests: Vec<String> =
                hits.iter().filter_map(|h| h.file.digest.clone()).collect();
            digests.sort();
            digests.dedup();
            if digests.len() > 1 {
                return Err(ArchiveError::AmbiguousDigest {
                    prefix: what.to_string(),
                    digests,
                });
            }
            // A name made of hex digits is a name too.
            if !hits.is_empty() {
                return Ok(hits);
            }
        }
        self.find_rows(
            &format!(
                "SELECT runs.id, runs.kind, runs.started_at, runs.status, {FILE_COLUMNS_QUALIFIED}
                 FROM files JOIN runs ON runs.id = files.run
                 WHERE (files.dest_key = ?2 AND files.dest = ?1)
                    OR (files.source_key = ?2 AND files.source = ?1)
                 ORDER BY runs.id DESC, files.rowid"
            ),
            params![what, name_key(what)],
        )
    }

    /// The files whose digest starts with `prefix` (hex, any case).
    fn find_digest(&self, prefix: &str) -> Result<Vec<FileHit>, ArchiveError> {
        let (lo, hi) = digest_key_range(prefix).unwrap_or((0, -1));
        self.find_rows(
            &format!(
                "SELECT runs.id, runs.kind, runs.started_at, runs.status, {FILE_COLUMNS_QUALIFIED}
                 FROM files JOIN runs ON runs.id = files.run
                 WHERE files.digest_key BETWEEN ?2 AND ?3
                   AND substr(files.digest, 1, length(?1)) = lower(?1)
                 ORDER BY runs.id DESC, files.rowid"
            ),
            params![prefix, lo, hi],
        )
    }

    fn find_rows(
        &self,
        sql: &str,
        args: impl rusqlite::Params,
    ) -> Result<Vec<FileHit>, ArchiveError> {
        let mut stmt = self
            .conn
            .prepare(sql)
            .map_err(|e| io_error(&self.path, e))?;
        let rows = stmt
            .query_map(args, |r| {
                Ok(FileHit {
                    run: r.get(0)?,
                    kind: r.get(1)?,
                    started_at: r.get(2)?,
                    status: r.get(3)?,
                    file: FileRow {
                        path: r.get(4)?,
                        source: r.get(5)?,
                        dest: r.get(6)?,
                        size: r.get::<_, i64>(7)? as u64,
                        mtime_ns: r.get(8)?,
                        digest: r.get(9)?,
                        verified: r.get(10)?,
                    },
                })
            })
            .map_err(|e| io_error(&self.path, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io_error(&self.path, e))?;
        Ok(rows)
    }
}

const RUN_COLUMNS: &str = "id, kind, status, started_at, ended_at, updated_at, command, local_host,
    remote_host, export, grant_name, source, dest, bytes, files, seconds, bits_per_second, verified,
    verdict, live_bytes, live_files, live_bps, error, exit_code, lost, pid,
    coalesce(json_extract(params, '$.dry_run'), 0)";
const RUN_COLUMN_COUNT: usize = 27;
const FILE_COLUMNS: &str = "path, source, dest, size, mtime_ns, digest, verified";
const FILE_COLUMNS_QUALIFIED: &str =
    "files.path, files.source, files.dest, files.size, files.mtime_ns, files.digest, files.verified";

/// True when `pid` ran a run of this host and is gone.
fn gone(host: &str, pid: Option<i64>) -> bool {
    host == host_name() && pid.is_none_or(|p| !Path::new(&format!("/proc/{p}")).exists())
}

fn run_row(r: &Row) -> rusqlite::Result<RunRow> {
    let mut status: String = r.get(2)?;
    // A run its process never finished (killed, power lost) reads as
    // interrupted, whoever reads it; the next run written marks it so.
    if status == "running" && gone(&r.get::<_, String>(7)?, r.get(25)?) {
        status = "interrupted".into();
    }
    Ok(RunRow {
        id: r.get(0)?,
        kind: r.get(1)?,
        status,
        started_at: r.get(3)?,
        ended_at: r.get(4)?,
        updated_at: r.get(5)?,
        command: crate::scrub::scrub_command(&r.get::<_, String>(6)?),
        local_host: r.get(7)?,
        remote_host: r.get(8)?,
        export: r.get(9)?,
        grant: r.get(10)?,
        source: r.get(11)?,
        dest: r.get(12)?,
        bytes: r.get::<_, Option<i64>>(13)?.map(|v| v as u64),
        files: r.get::<_, Option<i64>>(14)?.map(|v| v as u64),
        seconds: r.get(15)?,
        bits_per_second: r.get(16)?,
        verified: r.get(17)?,
        verdict: r.get(18)?,
        live_bytes: r.get::<_, i64>(19)? as u64,
        live_files: r.get::<_, i64>(20)? as u64,
        live_bps: r.get(21)?,
        error: r
            .get::<_, Option<String>>(22)?
            .map(|e| crate::scrub::scrub_text(&e)),
        exit_code: r.get(23)?,
        lost: r.get::<_, i64>(24)? as u64,
        dry_run: r.get::<_, i64>(26)? != 0,
    })
}

fn file_row(r: &Row) -> rusqlite::Result<FileRow> {
    Ok(FileRow {
        path: r.get(0)?,
        source: r.get(1)?,
        dest: r.get(2)?,
        size: r.get::<_, i64>(3)? as u64,
        mtime_ns: r.get(4)?,
        digest: r.get(5)?,
        verified: r.get(6)?,
    })
}

/// A damaged or foreign file is [`ArchiveError::Corrupt`]; the rest is I/O.
fn classify(path: &Path, e: rusqlite::Error) -> ArchiveError {
    use rusqlite::ErrorCode;
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => ArchiveError::Corrupt {
            path: path.to_path_buf(),
            why: e.to_string(),
        },
        _ => io_error(path, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digests_key_is_its_first_64_bits_and_falls_in_its_prefixes_range() {
        let d = "520e3d94c1b0a7f2".to_string() + &"0".repeat(48);
        assert_eq!(digest_key(&d), Some(0x520e_3d94_c1b0_a7f2));
        assert_eq!(digest_key(&d.to_uppercase()), digest_key(&d));
        assert_eq!(digest_key(&"f".repeat(64)), Some(-1));
        for n in [8, 9, 15, 16, 64] {
            let (lo, hi) = digest_key_range(&d[..n]).unwrap();
            let k = digest_key(&d).unwrap();
            assert!(lo <= k && k <= hi, "{n}");
        }
        for bad in ["+20e3d94c1b0a7f2", "520e3d94c1b0a7", "520e3d94c1b0a7fz", ""] {
            assert_eq!(digest_key(bad), None, "{bad}");
        }
    }
}
