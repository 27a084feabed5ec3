//! The archive's tables and how an older archive is brought up to date.
//!
//! The version lives in SQLite's `user_version`. Each migration takes the
//! schema from version `n` to `n + 1`; an upgrade runs them all inside one
//! transaction that holds the write lock from its start (`BEGIN
//! IMMEDIATE`) and reads the version again under it, so that an
//! interrupted upgrade leaves the file at its old version, never half way,
//! and several processes first opening one archive at once make its
//! schema once.
//! An archive written by a newer longhaul (a version above
//! [`SCHEMA_VERSION`]) is refused, never touched.

/// The schema this build writes.
pub const SCHEMA_VERSION: u32 = 1;

/// `MIGRATIONS[n]` takes an archive from version `n` to `n + 1`.
pub const MIGRATIONS: &[&str] = &[
    // 0 -> 1: runs, their intervals, the file catalogue.
    r#"
CREATE TABLE runs (
    id              INTEGER PRIMARY KEY,
    kind            TEXT NOT NULL,        -- perf, cp, sync, doctor, bench-disk, served
    status          TEXT NOT NULL,        -- running, ok, partial, failed, interrupted
    started_at      REAL NOT NULL,        -- Unix seconds
    ended_at        REAL,
    updated_at      REAL NOT NULL,        -- last write while it ran (live view)
    pid             INTEGER,              -- the process that ran it
    command         TEXT NOT NULL,        -- the command line, credentials removed
    local_host      TEXT NOT NULL,
    remote_host     TEXT,                 -- server, client or path, when there is one
    export          TEXT,                 -- the server's export, when there is one
    grant_name      TEXT,                 -- served runs: the grant the client used
    source          TEXT,                 -- cp/sync: what was copied (space-separated when several)
    dest            TEXT,                 -- cp/sync: where to
    params          TEXT,                 -- JSON: what was asked and set up
    summary         TEXT,                 -- JSON: the command's result document
    verdict         TEXT,                 -- what limited it (perf, doctor), or null
    bytes           INTEGER,
    files           INTEGER,
    seconds         REAL,
    bits_per_second REAL,
    verified        INTEGER,              -- cp/sync: 1 when every file was verified
    live_bytes      INTEGER NOT NULL DEFAULT 0,
    live_files      INTEGER NOT NULL DEFAULT 0,
    live_bps        REAL,
    error           TEXT,
    exit_code       INTEGER,
    warnings        TEXT,                 -- JSON array
    lost            INTEGER NOT NULL DEFAULT 0  -- rows the archive failed to keep
);
CREATE INDEX runs_by_start ON runs(started_at);
CREATE INDEX runs_by_status ON runs(status);

CREATE TABLE intervals (
    run             INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    idx             INTEGER NOT NULL,
    direction       TEXT NOT NULL,        -- perf: up, down; cp/sync: send
    stream          INTEGER NOT NULL,     -- -1: all streams of the direction
    start_s         REAL NOT NULL,
    end_s           REAL NOT NULL,
    bytes           INTEGER NOT NULL,
    bits_per_second REAL NOT NULL,
    retransmits     INTEGER,
    rtt_us          INTEGER,
    cwnd_bytes      INTEGER,
    streams         INTEGER,              -- cp/sync: streams carrying chunks
    limit_kind      TEXT,
    omitted         INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run, idx, direction, stream)
) WITHOUT ROWID;

CREATE TABLE files (
    run             INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    path            TEXT NOT NULL,        -- as the transfer named it
    source          TEXT NOT NULL,
    dest            TEXT NOT NULL,
    size            INTEGER NOT NULL,
    mtime_ns        INTEGER,
    digest          TEXT,                 -- the file's BLAKE3 (b3sum), hex
    verified        INTEGER NOT NULL,
    -- Lookup keys (`where`): 64 bits of each name's BLAKE3 and of the
    -- digest. Integer indexes are written several times faster than
    -- indexes of long text, which a million-file catalogue needs.
    source_key      INTEGER NOT NULL,
    dest_key        INTEGER NOT NULL,
    digest_key      INTEGER
);
CREATE INDEX files_by_run ON files(run);
CREATE INDEX files_by_source ON files(source_key);
CREATE INDEX files_by_dest ON files(dest_key);
CREATE INDEX files_by_digest ON files(digest_key);
"#,
];
