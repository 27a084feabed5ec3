//! [`Archive`]: one connection to the archive file, its writes and its
//! queries. Opening checks what the file is before anything is written:
//! not SQLite, damaged, or from a newer longhaul is an [`ArchiveError`]
//! naming the file, and the file is left as it was.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};

use crate::model::{FileHit, FileRow, HistoryFilter, IntervalRow, NewRun, RunDetail, RunRow};
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
    let head = digest.get(..16)?;
    u64::from_str_radix(head, 16).ok().map(|v| v as i64)
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
        let conn = Connection::open(path).map_err(|e| classify(path, e))?;
        let mut a = Archive {
            conn,
            path: path.to_path_buf(),
        };
        a.prepare(true)?;
        Ok(a)
    }

    /// Opens an existing archive to read it (history, show, where, the
    /// dashboard, plots). Never creates, migrates or changes the file.
    pub fn open_read_only(path: &Path) -> Result<Archive, ArchiveError> {
        if !path.exists() {
            return Err(ArchiveError::Missing {
                path: path.to_path_buf(),
            });
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| classify(path, e))?;
        let mut a = Archive {
            conn,
            path: path.to_path_buf(),
        };
        a.prepare(false)?;
        Ok(a)
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
        // Reading the header is what tells a damaged file or a stranger from an archive.
        let version: u32 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| classify(&path, e))?;
        if version > SCHEMA_VERSION {
            return Err(ArchiveError::Newer {
                path,
                found: version,
                ours: SCHEMA_VERSION,
            });
        }
        let tables: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
                [],
                |r| r.get(0),
            )
            .map_err(|e| classify(&path, e))?;
        if version == 0 && tables > 0 {
            return Err(ArchiveError::Corrupt {
                path,
                why: "an SQLite database with other tables".into(),
            });
        }
        if version > 0 {
            let has_runs: i64 = self
                .conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'runs'",
                    [],
                    |r| r.get(0),
                )
                .map_err(|e| classify(&path, e))?;
            if has_runs == 0 {
                return Err(ArchiveError::Corrupt {
                    path,
                    why: format!("schema version {version} but no runs table"),
                });
            }
        }
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
        self.conn
            .pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| classify(&path, e))?;
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
        for (from, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = self.conn.transaction().map_err(|e| classify(&path, e))?;
            tx.execute_batch(sql).map_err(|e| classify(&path, e))?;
            tx.pragma_update(None, "user_version", from as u32 + 1)
                .map_err(|e| classify(&path, e))?;
            tx.commit().map_err(|e| classify(&path, e))?;
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
                    run.command,
                    host_name(),
                    run.remote_host,
                    run.export,
                    run.grant,
                    run.source,
                    run.dest,
                    run.params.as_ref().map(|p| p.to_string()),
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

    /// The id `RUN` names: a number, or `last` (the newest run).
    pub fn resolve(&self, run: &str) -> Result<i64, ArchiveError> {
        let id = if run == "last" {
            self.conn
                .query_row("SELECT max(id) FROM runs", [], |r| {
                    r.get::<_, Option<i64>>(0)
                })
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
        Ok(RunDetail {
            run,
            params: params.and_then(|p| serde_json::from_str(&p).ok()),
            summary: summary.and_then(|p| serde_json::from_str(&p).ok()),
            warnings: warnings
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
    /// these bytes (a digest), newest first.
    pub fn find(&self, what: &str) -> Result<Vec<FileHit>, ArchiveError> {
        let is_digest = what.len() == 64 && what.bytes().all(|b| b.is_ascii_hexdigit());
        let (sql, key) = if is_digest {
            (
                format!(
                    "SELECT runs.id, runs.kind, runs.started_at, runs.status, {FILE_COLUMNS_QUALIFIED}
                     FROM files JOIN runs ON runs.id = files.run
                     WHERE files.digest_key = ?2 AND files.digest = lower(?1)
                     ORDER BY runs.id DESC, files.rowid"
                ),
                digest_key(what).unwrap_or(0),
            )
        } else {
            (
                format!(
                    "SELECT runs.id, runs.kind, runs.started_at, runs.status, {FILE_COLUMNS_QUALIFIED}
                     FROM files JOIN runs ON runs.id = files.run
                     WHERE (files.dest_key = ?2 AND files.dest = ?1)
                        OR (files.source_key = ?2 AND files.source = ?1)
                     ORDER BY runs.id DESC, files.rowid"
                ),
                name_key(what),
            )
        };
        let mut stmt = self
            .conn
            .prepare(&sql)
            .map_err(|e| io_error(&self.path, e))?;
        let rows = stmt
            .query_map(params![what, key], |r| {
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
    verdict, live_bytes, live_files, live_bps, error, exit_code, lost, pid";
const RUN_COLUMN_COUNT: usize = 26;
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
        command: r.get(6)?,
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
        error: r.get(22)?,
        exit_code: r.get(23)?,
        lost: r.get::<_, i64>(24)? as u64,
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
