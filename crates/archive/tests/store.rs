//! The archive file: what opening it does to good, damaged, foreign and
//! newer files; the writer's rows read back by every query; a full disk;
//! a run whose process died.

use std::path::Path;
use std::time::Duration;

use longhaul_archive::model::{FileRow, HistoryFilter, IntervalRow, NewRun};
use longhaul_archive::writer::{RunEnd, RunResult, Writer};
use longhaul_archive::{Archive, ArchiveError};

fn run(kind: &str) -> NewRun {
    NewRun {
        kind: kind.into(),
        command: format!("longhaul {kind}"),
        remote_host: Some("far.example.org".into()),
        export: Some("data".into()),
        ..NewRun::default()
    }
}

fn interval(idx: u32, stream: i32) -> IntervalRow {
    IntervalRow {
        idx,
        direction: "up".into(),
        stream,
        start_s: f64::from(idx),
        end_s: f64::from(idx + 1),
        bytes: 1 << 20,
        bits_per_second: 8e6,
        retransmits: Some(3),
        rtt_us: Some(1200),
        cwnd_bytes: Some(65536),
        streams: None,
        limit: Some("cwnd".into()),
        omitted: false,
    }
}

fn file(i: u64) -> FileRow {
    FileRow {
        path: format!("tree/f{i}"),
        source: format!("/src/tree/f{i}"),
        dest: format!("far:data/tree/f{i}"),
        size: i,
        mtime_ns: Some(1_700_000_000_000_000_000),
        digest: Some(format!("{i:064x}")),
        verified: true,
    }
}

fn end_ok(w: &Writer) {
    w.end(RunEnd {
        status: "ok".into(),
        ..RunEnd::default()
    });
}

/// `show last` is the user's last command, not the row a server on the
/// same host (same archive) wrote for serving it, which begins after it;
/// on a host that only serves, the last served run.
#[test]
fn last_is_the_users_last_command_not_a_served_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    let a = Archive::open(&path).unwrap();
    let served = a.begin_run(&run("served")).unwrap();
    assert_eq!(
        a.resolve("last").unwrap(),
        served,
        "only served runs: the last of them"
    );
    let cp = a.begin_run(&run("cp")).unwrap();
    let _served_for_cp = a.begin_run(&run("served")).unwrap();
    assert_eq!(a.resolve("last").unwrap(), cp);
    let perf = a.begin_run(&run("perf")).unwrap();
    a.begin_run(&run("served")).unwrap();
    assert_eq!(a.resolve("last").unwrap(), perf);
}

#[test]
fn a_run_written_reads_back_through_every_query() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/archive.db");
    let a = Archive::open(&path).unwrap();
    let id = a.begin_run(&run("cp")).unwrap();
    let (w, fin) = Writer::start(a, id);
    for i in 0..5 {
        w.interval(interval(i, -1));
        w.interval(interval(i, 0));
    }
    for i in 0..1000 {
        w.file(file(i));
    }
    w.result(RunResult {
        bytes: Some(499_500),
        files: Some(1000),
        verified: Some(true),
        ..RunResult::default()
    });
    end_ok(&w);
    drop(w);
    let loss = fin.finish();
    assert_eq!(loss.rows, 0, "{loss:?}");

    let r = Archive::open_read_only(&path).unwrap();
    assert_eq!(r.resolve("last").unwrap(), id);
    let d = r.run(id).unwrap();
    assert_eq!(d.run.status, "ok");
    assert_eq!(d.run.bytes, Some(499_500));
    assert_eq!(d.run.verified, Some(true));
    assert_eq!(d.intervals.len(), 10);
    assert_eq!(d.file_count, 1000);
    assert_eq!(r.files(id, 3).unwrap().len(), 3);
    let by_dest = r.find("far:data/tree/f7").unwrap();
    assert_eq!(by_dest.len(), 1);
    assert_eq!(by_dest[0].run, id);
    assert_eq!(r.find("/src/tree/f7").unwrap().len(), 1);
    assert_eq!(
        r.find(&format!("{:064X}", 7)).unwrap().len(),
        1,
        "digests match in any case"
    );
    assert!(r.find("/nowhere").unwrap().is_empty());
    // Filters.
    let all = |f: HistoryFilter| r.history(&f).unwrap().len();
    assert_eq!(all(HistoryFilter::default()), 1);
    let kind = |k: &str| HistoryFilter {
        kind: Some(k.into()),
        ..HistoryFilter::default()
    };
    assert_eq!(all(kind("cp")), 1);
    assert_eq!(all(kind("perf")), 0);
    let host = HistoryFilter {
        host: Some("example".into()),
        ..HistoryFilter::default()
    };
    assert_eq!(all(host), 1);
    let future = HistoryFilter {
        since: Some(4e9),
        ..HistoryFilter::default()
    };
    assert_eq!(all(future), 0);
    let export = HistoryFilter {
        export: Some("other".into()),
        ..HistoryFilter::default()
    };
    assert_eq!(all(export), 0);
    assert!(matches!(r.resolve("9999"), Err(ArchiveError::NoRun(_))));
    assert!(matches!(r.resolve("x"), Err(ArchiveError::NoRun(_))));
}

fn assert_untouched(path: &Path, before: &[u8], e: ArchiveError, says: &str) {
    let msg = e.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains(says), "{msg}");
    assert_eq!(std::fs::read(path).unwrap(), before, "the file changed");
}

#[test]
fn a_damaged_file_is_refused_by_name_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    let junk: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&path, &junk).unwrap();
    let e = Archive::open(&path).err().expect("refused");
    assert_untouched(&path, &junk, e, "damaged");
    let e = Archive::open_read_only(&path).err().expect("refused");
    assert_untouched(&path, &junk, e, "damaged");
}

fn sqlite_file(path: &Path, sql: &str) -> Vec<u8> {
    // Made with the archive's own SQLite through a raw connection.
    let c = rusqlite_connection(path);
    c.execute_batch(sql).unwrap();
    drop(c);
    std::fs::read(path).unwrap()
}

fn rusqlite_connection(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

#[test]
fn a_newer_archive_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    let before = sqlite_file(
        &path,
        "CREATE TABLE runs (id INTEGER PRIMARY KEY); PRAGMA user_version = 99;",
    );
    let e = Archive::open(&path).err().expect("refused");
    assert_untouched(&path, &before, e, "newer");
    let e = Archive::open_read_only(&path).err().expect("refused");
    assert_untouched(&path, &before, e, "newer");
}

#[test]
fn another_programs_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    let before = sqlite_file(&path, "CREATE TABLE photos (id INTEGER PRIMARY KEY);");
    let e = Archive::open(&path).err().expect("refused");
    assert_untouched(&path, &before, e, "not a longhaul archive");
}

#[test]
fn reading_a_missing_archive_says_so_and_makes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("none.db");
    let e = Archive::open_read_only(&path).err().expect("missing");
    assert!(matches!(e, ArchiveError::Missing { .. }), "{e}");
    assert!(!path.exists());
}

#[test]
fn an_empty_file_becomes_an_archive() {
    // SQLite takes an empty file as a new database: nothing to lose.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    std::fs::write(&path, b"").unwrap();
    let a = Archive::open(&path).unwrap();
    assert!(a.begin_run(&run("perf")).is_ok());
}

#[test]
fn a_full_disk_loses_rows_not_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    let a = Archive::open(&path).unwrap();
    let id = a.begin_run(&run("cp")).unwrap();
    // Room for a few more pages, as a disk that is nearly full.
    a.limit_pages(a.page_count() + 4);
    let (w, fin) = Writer::start(a, id);
    for i in 0..20_000 {
        w.file(file(i));
    }
    w.result(RunResult {
        files: Some(20_000),
        ..RunResult::default()
    });
    end_ok(&w);
    drop(w);
    let loss = fin.finish();
    assert!(loss.rows > 0, "{loss:?}");
    assert!(
        loss.error.as_deref().unwrap_or("").contains("full"),
        "{loss:?}"
    );
    let r = Archive::open_read_only(&path).unwrap();
    let d = r.run(id).unwrap();
    assert_eq!(d.run.status, "ok", "the run's end is kept");
    assert!(d.file_count < 20_000);
}

#[test]
fn a_run_whose_process_died_reads_as_interrupted_with_what_it_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    let a = Archive::open(&path).unwrap();
    let id = a.begin_run(&run("perf")).unwrap();
    let (w, fin) = Writer::start(a, id);
    w.interval(interval(0, -1));
    w.interval(interval(1, -1));
    // Committed within COMMIT_EVERY: wait for the two rows, then the
    // process "dies": its pid is made one that is gone.
    let reader = Archive::open_read_only(&path).unwrap();
    longhaul_testkit::wait_until("the writer's commit", Duration::from_secs(30), || {
        reader.run(id).is_ok_and(|d| d.intervals.len() == 2)
    });
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let c = rusqlite_connection(&path);
    c.execute("UPDATE runs SET pid = ?1", [dead]).unwrap();
    let r = Archive::open_read_only(&path).unwrap();
    let d = r.run(id).unwrap();
    assert_eq!(d.run.status, "interrupted");
    assert_eq!(d.intervals.len(), 2, "what it recorded stays");
    assert!(r.running().unwrap().is_empty());
    // The next writer marks it for good.
    let a2 = Archive::open(&path).unwrap();
    assert_eq!(a2.settle_orphans().unwrap(), 1);
    drop(w);
    drop(fin);
}

#[test]
fn a_long_run_streams_its_intervals_in_bounded_memory() {
    // 16 h at 1 s with 8 streams and their total: 57,600 intervals.
    fn rss_kib() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    let a = Archive::open(&path).unwrap();
    let id = a.begin_run(&run("perf")).unwrap();
    let (w, fin) = Writer::start(a, id);
    let mut at_quarter = 0;
    for i in 0..57_600u32 {
        for s in -1..8 {
            w.interval(interval(i, s));
        }
        if i % 64 == 0 {
            // Paced a little, as a real run is: the writer keeps up.
            std::thread::yield_now();
        }
        if i == 14_400 {
            at_quarter = rss_kib();
        }
    }
    end_ok(&w);
    drop(w);
    let loss = fin.finish();
    let at_end = rss_kib();
    // Growth past the first quarter stays far below what keeping the rows
    // would take (518,400 rows of ~150 bytes: ~75 MiB).
    assert!(
        at_end.saturating_sub(at_quarter) < 24 * 1024,
        "RSS grew from {at_quarter} KiB to {at_end} KiB"
    );
    let r = Archive::open_read_only(&path).unwrap();
    let n = r.intervals(id, None).unwrap().len() as u64;
    assert_eq!(n + loss.rows, 57_600 * 9, "every row kept or counted lost");
}

/// Several commands (or two `serve`s) first using one archive at once:
/// each opens it, makes the schema or finds it made, and records its run;
/// none fails on a table another made, or takes a half-made schema for
/// another program's database. Many rounds, each a fresh file, all
/// openers released together.
#[test]
fn an_archive_first_opened_by_many_at_once_records_every_run() {
    const OPENERS: usize = 6;
    for round in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("state/archive-{round}.db"));
        let start = std::sync::Arc::new(std::sync::Barrier::new(OPENERS));
        let openers: Vec<_> = (0..OPENERS)
            .map(|_| {
                let (path, start) = (path.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let a = Archive::open(&path)?;
                    a.begin_run(&run("cp"))
                })
            })
            .collect();
        for o in openers {
            let id = o.join().expect("no panic");
            assert!(id.is_ok(), "round {round}: {:?}", id.err());
        }
        let a = Archive::open_read_only(&path).unwrap();
        let runs = a.history(&HistoryFilter::default()).unwrap();
        assert_eq!(runs.len(), OPENERS, "round {round}");
    }
}

/// Two ranks of a fleet (or any two runs) opening the same new archive at
/// once both get it, made once: neither is told a table already exists.
#[test]
fn processes_opening_a_new_archive_at_once_all_get_it() {
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("archive.db");
        let start = std::sync::Arc::new(std::sync::Barrier::new(6));
        let openers: Vec<_> = (0..6)
            .map(|_| {
                let (path, start) = (path.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    Archive::open(&path).map(drop)
                })
            })
            .collect();
        for o in openers {
            let opened = o.join().unwrap();
            assert!(opened.is_ok(), "round {round}: {:?}", opened.err());
        }
    }
}
