//! The archive keeps no credential and is its owner's alone: a queue's
//! password on the command line is in no row, no output and no byte of
//! the file or its log (rows an older build wrote included); the file and
//! its log are 0600 whatever the umask; a linked, planted or foreign
//! archive is refused. And what it records is right: a `dir/` source's
//! files under their own names, `where` by a digest's prefix, `sync -n`
//! as a dry run.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;
use common::xfer::*;
use common::{assert_exit, bin, stderr, stdout, TempDir};

const SECRET: &str = "SECRET-pw-5e1f";
const OLD_SECRET: &str = "OLDSECRET-pw-77c2";

/// The archive and the files SQLite keeps beside it.
fn archive_files(archive: &Path) -> Vec<PathBuf> {
    ["", "-wal", "-shm", "-journal"]
        .iter()
        .map(|s| PathBuf::from(format!("{}{s}", archive.display())))
        .collect()
}

#[track_caller]
fn assert_no_bytes(archive: &Path, needle: &str) {
    for f in archive_files(archive) {
        if let Ok(b) = fs::read(&f) {
            assert!(
                !b.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{} holds {needle}",
                f.display()
            );
        }
    }
}

/// An archive as an older longhaul left it: schema 1, its rows with the
/// password they were given, nothing scrubbed.
fn old_archive(archive: &Path) {
    fs::create_dir_all(archive.parent().unwrap()).unwrap();
    let c = rusqlite::Connection::open(archive).unwrap();
    c.pragma_update(None, "journal_mode", "WAL").unwrap();
    c.execute_batch(longhaul_archive::schema::MIGRATIONS[0])
        .unwrap();
    c.pragma_update(None, "user_version", 1).unwrap();
    c.execute(
        "INSERT INTO runs (kind, status, started_at, updated_at, pid, command, local_host, error)
         VALUES ('cp', 'failed', 1.0, 1.0, 1, ?1, 'old-host', ?2)",
        [
            format!("longhaul cp -r --rank 0 --size 1 --queue postgres://lh:{OLD_SECRET}@db.example/q a/ far:data/"),
            format!("cannot reach postgres://lh:{OLD_SECRET}@db.example/q"),
        ],
    )
    .unwrap();
    fs::set_permissions(archive, fs::Permissions::from_mode(0o644)).unwrap();
}

/// `/api/history` of a dashboard on `archive`, read once.
fn api_history(archive: &Path) -> String {
    use std::io::{BufRead, BufReader};
    let mut child = bin()
        .args(["dashboard", "--listen", "127.0.0.1:0", "--archive"])
        .arg(archive)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start longhaul dashboard");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // `dashboard: http://ADDR/?token=TOKEN`: the token it made, printed once.
    let (addr, token) = line
        .trim()
        .strip_prefix("dashboard: http://")
        .and_then(|s| s.split_once("/?token="))
        .unwrap_or_else(|| panic!("dashboard said {line:?}"));
    let auth = format!("Authorization: Bearer {token}\r\n");
    let (_, body) = common::http::get(addr, "/api/history", addr, &auth);
    let _ = child.kill();
    let _ = child.wait();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    body
}

#[test]
fn a_queue_password_is_in_no_row_no_output_and_no_byte_of_the_archive() {
    let t = TempDir::new("privacy-queue");
    let archive = t.path().join("a/archive.db");
    old_archive(&archive);
    let src = t.dir("src");
    write_random(&src.join("f"), 1000, 1);
    let url = format!(
        "postgres://lh:{SECRET}@127.0.0.1:{}/queue?sslmode=disable",
        common::free_port()
    );
    let o = with_archive(
        &archive,
        &[
            "cp",
            "-r",
            "--rank",
            "0",
            "--size",
            "1",
            "--queue",
            &url,
            "--fleet-wait",
            "5s",
            &format!("{}/", src.display()),
            "127.0.0.1:1:data/out/",
        ],
    );
    let err = stderr(&o);
    assert!(!o.status.success(), "no queue there: {err}");
    assert!(
        err.contains("ps") && err.contains("PGPASSWORD") && err.contains(".pgpass"),
        "no warning that the URL's password is visible: {err}"
    );
    assert!(!err.contains(SECRET), "stderr shows the password: {err}");

    let h = json_ok(&archive, &["history", "--json"]);
    let runs = h["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{h}");
    assert!(
        runs[0]["command"]
            .as_str()
            .unwrap()
            .contains("--queue postgres://lh:***@127.0.0.1"),
        "{h}"
    );
    for (what, text) in [
        ("history --json", h.to_string()),
        (
            "show --json",
            json_ok(&archive, &["show", "last", "--json"]).to_string(),
        ),
        (
            "show --json 1",
            json_ok(&archive, &["show", "1", "--json"]).to_string(),
        ),
        ("show", stdout(&with_archive(&archive, &["show", "last"]))),
        ("show 1", stdout(&with_archive(&archive, &["show", "1"]))),
        ("history", stdout(&with_archive(&archive, &["history"]))),
        ("/api/history", api_history(&archive)),
    ] {
        for s in [SECRET, OLD_SECRET] {
            assert!(!text.contains(s), "{what} shows {s}: {text}");
        }
    }
    // The old build's row was scrubbed in the file, its old bytes overwritten.
    let c = rusqlite::Connection::open(&archive).unwrap();
    let (command, error): (String, String) = c
        .query_row("SELECT command, error FROM runs WHERE id = 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert!(
        command.contains("postgres://lh:***@db.example"),
        "{command}"
    );
    assert!(!error.contains(OLD_SECRET), "{error}");
    drop(c);
    assert_no_bytes(&archive, SECRET);
    assert_no_bytes(&archive, OLD_SECRET);

    // A row an older build writes now (beside this one) is scrubbed as it is read.
    let c = rusqlite::Connection::open(&archive).unwrap();
    c.execute(
        "INSERT INTO runs (kind, status, started_at, updated_at, pid, command, local_host)
         VALUES ('cp', 'ok', 2.0, 2.0, 1, ?1, 'old-host')",
        [format!(
            "longhaul cp --queue 'host=db user=lh password={OLD_SECRET}' --token lh1_0badc0de_{OLD_SECRET} a b"
        )],
    )
    .unwrap();
    drop(c);
    for args in [&["show", "last", "--json"][..], &["history", "--json"]] {
        let text = json_ok(&archive, args).to_string();
        assert!(!text.contains(OLD_SECRET), "{args:?}: {text}");
        assert!(text.contains("password=***"), "{args:?}: {text}");
    }
}

#[track_caller]
fn assert_private(f: &Path) {
    let m = fs::symlink_metadata(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    assert_eq!(
        m.mode() & 0o777,
        0o600,
        "{} is {:o}",
        f.display(),
        m.mode() & 0o777
    );
}

#[test]
fn the_archive_and_its_log_are_0600_whatever_the_umask() {
    // SAFETY: umask(2) only sets this process's file creation mask.
    unsafe {
        libc::umask(0o022);
    }
    let t = TempDir::new("privacy-modes");
    let archive = t.path().join("archive.db");
    let s = data_server(&t.dir("export"), &t.dir("state"));
    let mut perf = bin()
        .arg("--archive")
        .arg(&archive)
        .args(["perf", &s.addr().to_string(), "-t", "60", "-i", "0.2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // While it runs, the log and its index are there.
    let start = Instant::now();
    let [db, wal, shm, _] = &archive_files(&archive)[..] else {
        unreachable!()
    };
    while !(wal.exists() && shm.exists()) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no -wal or -shm while perf ran"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Each made private as the archive opens it: waited for, not slept on.
    for f in [db, wal, shm] {
        let mode = || fs::symlink_metadata(f).map_or(0, |m| m.mode() & 0o777);
        while mode() != 0o600 && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_private(f);
    }
    perf.kill().unwrap();
    perf.wait().unwrap();

    // An archive an older build left readable by all is made private.
    let old = t.path().join("old/archive.db");
    old_archive(&old);
    fs::write(format!("{}-shm", old.display()), b"").unwrap();
    fs::set_permissions(
        format!("{}-shm", old.display()),
        fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let f = t.path().join("f");
    write_random(&f, 1000, 3);
    let o = with_archive(&old, &["cp", f.to_str().unwrap(), &remote(s.addr(), "f")]);
    assert_exit(&o, 0);
    assert!(!stderr(&o).contains("not archiving"), "{}", stderr(&o));
    for f in archive_files(&old) {
        if f.exists() {
            assert_private(&f);
        }
    }
}

/// A transfer with `--archive archive` goes on without archiving, saying
/// why; `history` on it is refused the same way.
#[track_caller]
fn assert_refused(archive: &Path, says: &str) {
    let err = push_archived(archive, 10_000);
    assert!(
        err.contains("not archiving this run")
            && err.contains("refusing the archive")
            && err.contains(says),
        "{err}"
    );
    let o = with_archive(archive, &["history"]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains(says), "{}", stderr(&o));
}

#[test]
fn a_linked_planted_or_foreign_archive_is_refused() {
    let t = TempDir::new("privacy-links");
    // A link to a file another user may read: never followed.
    let victim = t.path().join("victim.db");
    let link = t.path().join("link.db");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    assert_refused(&link, "symbolic link");
    assert!(!victim.exists(), "the link was followed");
    // A log planted beside a good archive, leading elsewhere.
    let good = t.path().join("good/archive.db");
    old_archive(&good);
    let elsewhere = t.path().join("elsewhere");
    fs::write(&elsewhere, b"keep me").unwrap();
    std::os::unix::fs::symlink(&elsewhere, format!("{}-wal", good.display())).unwrap();
    assert_refused(&good, "-wal is a symbolic link");
    assert_eq!(fs::read(&elsewhere).unwrap(), b"keep me");
    // Another user's archive (we run as root in CI; as anyone else chown fails).
    let theirs = t.path().join("theirs/archive.db");
    old_archive(&theirs);
    let before = fs::read(&theirs).unwrap();
    if std::os::unix::fs::chown(&theirs, Some(54321), Some(54321)).is_ok() {
        assert_refused(&theirs, "belongs to uid 54321");
        assert_eq!(fs::read(&theirs).unwrap(), before);
    } else {
        eprintln!("not root: the foreign-owner case needs chown");
    }
    // Not a file at all.
    let dir = t.dir("adir.db");
    assert_refused(&dir, "not a regular file");
}

#[test]
fn a_dir_slash_source_is_catalogued_under_its_own_names_and_where_finds_it() {
    let t = TempDir::new("privacy-slash");
    let archive = t.path().join("archive.db");
    let run7 = t.path().join("src/run7");
    fs::create_dir_all(run7.join("sub")).unwrap();
    write_random(&run7.join("new.txt"), 5000, 7);
    write_random(&run7.join("sub/deep.bin"), 7000, 8);
    let exp = t.dir("export");
    fs::create_dir_all(exp.join("out")).unwrap();
    let s = data_server(&exp, &t.dir("state"));
    let o = with_archive(
        &archive,
        &[
            "cp",
            "-r",
            &format!("{}/", run7.display()),
            &remote(s.addr(), "out/"),
        ],
    );
    assert_exit(&o, 0);
    let show = json_ok(&archive, &["show", "last", "--json", "--all-files"]);
    let files = show["files"].as_array().unwrap();
    let at = format!("{}:{}:data/out", s.addr().ip(), s.addr().port());
    let mut pairs: Vec<(String, String)> = files
        .iter()
        .map(|f| {
            (
                f["source"].as_str().unwrap().to_string(),
                f["dest"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    pairs.sort();
    assert_eq!(
        pairs,
        [
            (
                format!("{}/new.txt", run7.display()),
                format!("{at}/new.txt")
            ),
            (
                format!("{}/sub/deep.bin", run7.display()),
                format!("{at}/sub/deep.bin")
            ),
        ],
        "{show}"
    );
    let w = json_ok(
        &archive,
        &["where", "--json", run7.join("new.txt").to_str().unwrap()],
    );
    assert_eq!(w["hits"].as_array().unwrap().len(), 1, "{w}");

    // Pulled back, `dir/` again: the source is the server's file.
    let back = t.dir("back");
    let o = with_archive(
        &archive,
        &[
            "cp",
            "-r",
            &remote(s.addr(), "out/"),
            back.to_str().unwrap(),
        ],
    );
    assert_exit(&o, 0);
    let w = json_ok(
        &archive,
        &[
            "where",
            "--json",
            back.join("sub/deep.bin").to_str().unwrap(),
        ],
    );
    let hits = w["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 1, "{w}");
    assert_eq!(hits[0]["source"], format!("{at}/sub/deep.bin"), "{w}");

    // By a prefix of its digest: both runs moved these bytes.
    let digest = hits[0]["digest"].as_str().unwrap().to_string();
    for n in [8, 12, 16, 40, 64] {
        let w = json_ok(&archive, &["where", "--json", &digest[..n]]);
        assert_eq!(w["hits"].as_array().unwrap().len(), 2, "{n} digits: {w}");
        assert!(w["hits"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["digest"] == digest.as_str()));
    }
    let upper = digest[..12].to_uppercase();
    let w = json_ok(&archive, &["where", "--json", &upper]);
    assert_eq!(w["hits"].as_array().unwrap().len(), 2, "{w}");
    let o = with_archive(&archive, &["where", &digest[..12]]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("deep.bin"), "{}", stdout(&o));
}

#[test]
fn sync_dry_run_says_what_it_would_do_and_is_archived_as_a_dry_run() {
    let t = TempDir::new("privacy-dry");
    let archive = t.path().join("archive.db");
    let src = t.dir("src");
    write_random(&src.join("a"), 1000, 1);
    write_random(&src.join("b"), 2345, 2);
    let exp = t.dir("export");
    fs::create_dir_all(exp.join("out")).unwrap();
    fs::write(exp.join("out/extra"), b"stale").unwrap();
    let s = data_server(&exp, &t.dir("state"));
    let srcs = format!("{}/", src.display());
    let dest = remote(s.addr(), "out/");
    let v = json_ok(
        &archive,
        &["sync", "-n", "--delete", "--json", &srcs, &dest],
    );
    assert_eq!(v["dry_run"], true, "{v}");
    assert_eq!(v["would_send_bytes"], 3345, "{v}");
    assert_eq!(v["would_send"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["deleted"], serde_json::json!(["extra"]), "{v}");
    assert!(!exp.join("out/a").exists() && exp.join("out/extra").exists());

    let o = with_archive(&archive, &["sync", "-n", "--delete", &srcs, &dest]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(
        out.contains("dry run") && out.contains("would send 2 file") && out.contains("delete 1"),
        "{out}"
    );
    assert!(
        !out.contains("verified"),
        "a dry run verifies nothing: {out}"
    );
    assert!(out.contains("would delete: extra"), "{out}");

    let h = json_ok(&archive, &["history", "--json"]);
    let runs = h["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{h}");
    assert!(runs.iter().all(|r| r["dry_run"] == true), "{h}");
    let show = json_ok(&archive, &["show", "last", "--json"]);
    assert_eq!(show["run"]["dry_run"], true, "{show}");
    assert_eq!(show["run"]["verified"], Value::Null, "{show}");
    let o = with_archive(&archive, &["history"]);
    assert!(stdout(&o).contains("(dry)"), "{}", stdout(&o));
    let o = with_archive(&archive, &["show", "last"]);
    assert!(stdout(&o).contains("a dry run"), "{}", stdout(&o));

    // The real one is not.
    let o = with_archive(&archive, &["sync", "--delete", &srcs, &dest]);
    assert_exit(&o, 0);
    let show = json_ok(&archive, &["show", "last", "--json"]);
    assert_eq!(show["run"]["dry_run"], false, "{show}");
    assert_eq!(show["run"]["verified"], true, "{show}");
}
