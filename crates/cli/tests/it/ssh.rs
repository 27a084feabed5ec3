//! `HOST:path` over ssh with no longhaul server on the far host (issue 29):
//! each test starts its own OpenSSH server on a free loopback port, with
//! its own host key, client key, `authorized_keys` and client config, and
//! the binary reaches it with `--rsh "ssh -F CONFIG"`. Nothing of the
//! system's sshd is used or touched; each sshd is ended by its PID.
//!
//! Without sshd, ssh or ssh-keygen the tests skip, saying so; with
//! `LONGHAUL_REQUIRE_SSH=1` (CI) they fail instead.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use longhaul_engine::server::oneshot::{Handshake, SECRET_PREFIX};
use longhaul_testkit::process::{descendants, gone};

use crate::common;
use common::pg;

use common::sshd::{sshd, Sshd, BIN, HOST};

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Bytes that differ from file to file and position to position.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    longhaul_testkit::data::bytes(seed, len)
}

fn write_tree(root: &Path) {
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("a.bin"), pattern(1, 3 << 20)).unwrap();
    std::fs::write(root.join("sub/b.txt"), b"hello over ssh\n").unwrap();
    std::fs::write(root.join("sub/empty"), b"").unwrap();
}

fn same_tree(a: &Path, b: &Path) {
    for rel in ["a.bin", "sub/b.txt", "sub/empty"] {
        let (x, y) = (
            std::fs::read(a.join(rel)).unwrap(),
            std::fs::read(b.join(rel)),
        );
        assert_eq!(
            Some(&x),
            y.as_ref().ok(),
            "{rel} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

/// Whether a process is gone (or a zombie nobody has reaped yet).
fn wait_gone(pid: u32, what: &str) {
    let until = Instant::now() + Duration::from_secs(15);
    while !gone(pid) {
        assert!(
            Instant::now() < until,
            "{what}: process {pid} is still there"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The far end's PID, from the client's `-v` log line.
fn far_pid(log: &str) -> Option<u32> {
    let at = log.find("is pid ")?;
    log[at + 7..].split_whitespace().next()?.parse().ok()
}

/// Waits until a sink's journal has recorded some chunks (and a moment
/// more), so that a resume has something to resume.
/// `big.bin` of `len` pattern bytes (seed `seed`) and an empty `far/` in `dir`.
fn big_and_far(dir: &Path, seed: u64, len: usize) -> (PathBuf, Vec<u8>, PathBuf) {
    let big = dir.join("big.bin");
    let data = pattern(seed, len);
    std::fs::write(&big, &data).unwrap();
    let far = dir.join("far");
    std::fs::create_dir(&far).unwrap();
    (big, data, far)
}

/// Kills the far end this test's own sshd started.
fn kill_far(pid: u32) {
    // SAFETY: kill(2) takes any pid and signal; this pid is the far end
    // our own sshd started for this test.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Waits until the far end's journal holds `records` verified chunks:
/// data is flowing and a resume has something to resume.
fn journaled(journal: &Path, records: u64) {
    common::wait_until(
        &format!("{records} chunks journaled in {}", journal.display()),
        Duration::from_secs(60),
        || common::xfer::journal_records(journal) >= records,
    );
}

/// Lines of a child's stderr, as they come.
fn lines_of(r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for the far end's PID in a running client's stderr; returns it
/// and what was read.
fn wait_far_pid(lines: &Receiver<String>) -> (u32, String) {
    let mut seen = String::new();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) => {
                seen.push_str(&l);
                seen.push('\n');
                if let Some(p) = far_pid(&l) {
                    return (p, seen);
                }
            }
            Err(_) => panic!("no far end started; the client said:\n{seen}"),
        }
    }
}

#[test]
fn push_pull_sync_and_ls_over_ssh_with_no_server_running() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    write_tree(&src);
    let far = work.path().join("far");
    std::fs::create_dir(&far).unwrap();

    // Push, to an absolute path.
    let o = s
        .longhaul()
        .args(["-v", "cp", "-r", "--remote-path", BIN])
        .arg(&src)
        .arg(format!("{HOST}:{}/", far.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "push: {}", text(&o));
    same_tree(&src, &far.join("tree"));
    let pid = far_pid(&String::from_utf8_lossy(&o.stderr)).expect("the far end's pid in the log");
    wait_gone(pid, "the far end after a push");

    // Pull it back.
    let back = work.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let o = s
        .longhaul()
        .args(["cp", "-r", "--json", "--remote-path", BIN])
        .arg(format!("{HOST}:{}/tree", far.display()))
        .arg(&back)
        .output()
        .unwrap();
    assert!(o.status.success(), "pull: {}", text(&o));
    same_tree(&src, &back.join("tree"));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["verified"], true, "{}", text(&o));
    assert!(
        j["encryption"].as_str().unwrap().starts_with("TLS"),
        "{}",
        text(&o)
    );

    // sync: one changed file goes again.
    std::fs::write(src.join("sub/b.txt"), b"changed, longer than before\n").unwrap();
    let o = s
        .longhaul()
        .args(["sync", "--json", "--remote-path", BIN])
        .arg(&src)
        .arg(format!("{HOST}:{}/", far.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "sync: {}", text(&o));
    same_tree(&src, &far.join("tree"));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["files"], 1, "only the changed file: {}", text(&o));

    // ls of an absolute path.
    let o = s
        .longhaul()
        .args(["ls", "--remote-path", BIN])
        .arg(format!("{HOST}:{}/tree/sub", far.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "ls: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("b.txt") && out.contains("empty"),
        "{}",
        text(&o)
    );

    // A relative path is in the far account's home, as with scp.
    let home = PathBuf::from(std::env::var("HOME").unwrap());
    let home = std::fs::canonicalize(home).unwrap();
    let rel = format!(".cache/longhaul-ssh-test-{}", std::process::id());
    let o = s
        .longhaul()
        .args(["cp", "--mkpath", "--remote-path", BIN])
        .arg(src.join("sub/b.txt"))
        .arg(format!("{HOST}:{rel}/b.txt"))
        .output()
        .unwrap();
    let landed = std::fs::read(home.join(&rel).join("b.txt"));
    let _ = std::fs::remove_dir_all(home.join(&rel));
    assert!(o.status.success(), "relative push: {}", text(&o));
    assert_eq!(
        landed.unwrap(),
        std::fs::read(src.join("sub/b.txt")).unwrap()
    );
}

/// A pull over ssh of a directory named without `-r` fails naming it,
/// as a pull from a server does: its far end's walk tells the client.
#[test]
fn a_pull_over_ssh_of_a_directory_without_r_fails_naming_it() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    write_tree(&src);
    let back = work.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let o = s
        .longhaul()
        .args(["cp", "--json", "--remote-path", BIN])
        .arg(format!("{HOST}:{}", src.display()))
        .arg(&back)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(6), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let failed = j["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{}", text(&o));
    assert_eq!(failed[0]["path"], "tree", "{}", text(&o));
    assert!(
        failed[0]["error"]
            .as_str()
            .unwrap()
            .ends_with("tree is a directory: use -r to copy trees"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read_dir(&back).unwrap().count(), 0);
}

#[test]
fn a_vanished_client_leaves_no_far_process() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let big = work.path().join("big.bin");
    std::fs::write(&big, pattern(7, 64 << 20)).unwrap();
    let far = work.path().join("far");
    std::fs::create_dir(&far).unwrap();
    let mut c = s
        .longhaul()
        .args(["-v", "cp", "--rate", "40M", "-P", "1", "--remote-path", BIN])
        .arg(&big)
        .arg(format!("{HOST}:{}/", far.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(c.stderr.take().unwrap());
    let (pid, _) = wait_far_pid(&lines);
    assert!(!gone(pid), "the far end {pid} is running");
    // Data flows, then the client vanishes without a word.
    journaled(&far.join(".big.bin.lhjournal"), 1);
    c.kill().unwrap();
    c.wait().unwrap();
    wait_gone(pid, "the far end after its client was killed");
}

#[test]
fn a_far_end_killed_mid_copy_then_a_resume_completes() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let (big, data, far) = big_and_far(work.path(), 9, 64 << 20);
    let mut c = s
        .longhaul()
        .args([
            "-v",
            "cp",
            "--retries",
            "0",
            "--rate",
            "40M",
            "-P",
            "1",
            "--chunk",
            "1M",
            "--remote-path",
            BIN,
        ])
        .arg(&big)
        .arg(format!("{HOST}:{}/", far.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(c.stderr.take().unwrap());
    let (pid, _) = wait_far_pid(&lines);
    journaled(&far.join(".big.bin.lhjournal"), 6);
    kill_far(pid);
    let status = c.wait().unwrap();
    assert!(!status.success(), "the copy cannot have completed");
    let o = s
        .longhaul()
        .args(["cp", "--json", "--chunk", "1M", "--remote-path", BIN])
        .arg(&big)
        .arg(format!("{HOST}:{}/", far.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "resume: {}", text(&o));
    assert!(
        std::fs::read(far.join("big.bin")).unwrap() == data,
        "the copy differs"
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["verified"], true);
    assert!(
        j["resumed_bytes"].as_u64().unwrap() > 0,
        "the second run resumed the first's partial file: {}",
        text(&o)
    );
}

#[test]
fn with_retries_a_far_end_killed_mid_copy_is_replaced_and_the_copy_completes() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let (big, data, far) = big_and_far(work.path(), 13, 48 << 20);
    let mut c = s
        .longhaul()
        .args([
            "-v",
            "cp",
            "--json",
            "--retries",
            "2",
            "-P",
            "1",
            "--rate",
            "40M",
        ])
        .args(["--remote-path", BIN])
        .arg(&big)
        .arg(format!("{HOST}:{}/", far.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(c.stderr.take().unwrap());
    let (pid, _) = wait_far_pid(&lines);
    // Killed once it holds verified chunks, so the next far end resumes.
    journaled(&far.join(".big.bin.lhjournal"), 6);
    kill_far(pid);
    let (next, _) = wait_far_pid(&lines);
    assert_ne!(next, pid, "a new far end");
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let status = c.wait().unwrap();
    let said: Vec<String> = lines.try_iter().collect();
    assert!(status.success(), "{out}\n{said:?}");
    assert!(
        std::fs::read(far.join("big.bin")).unwrap() == data,
        "the copy differs"
    );
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["attempts"], 2, "{out}");
    assert_eq!(j["verified"], true, "{out}");
    wait_gone(next, "the second far end");
}

#[test]
fn a_missing_far_binary_is_a_clear_error() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let f = work.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    let o = s
        .longhaul()
        .args(["cp", "--remote-path", "/nonexistent/longhaul"])
        .arg(&f)
        .arg(format!("{HOST}:{}/", work.path().display()))
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("longhaul is not installed on {HOST}"))
            && err.contains("--remote-path")
            && err.contains("--copy-binary"),
        "{}",
        text(&o)
    );
}

/// Starts a far end by hand, as `cp` does: ssh running `longhaul serve
/// --one-shot`, its handshake read from ssh's stdout.
fn far_end(s: &Sshd) -> (Child, Handshake, Receiver<String>) {
    far_end_with(s, "")
}

/// [`far_end`] with more words on the far command line.
fn far_end_with(s: &Sshd, more: &str) -> (Child, Handshake, Receiver<String>) {
    let mut c = s
        .ssh()
        .arg(format!("{BIN} serve --one-shot {more}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = lines_of(c.stderr.take().unwrap());
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let h = Handshake::parse(line.trim_end()).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    (c, h, err)
}

/// The command line and environment of every process this test started
/// (the client, ssh, the far end) and of every process of its sshd (the
/// sessions), for a search; what other tests or users run on the host beside
/// it is theirs, and may hold stand-in secrets of its own.
fn cmdlines_and_environs_of_this_test(s: &Sshd) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for pid in descendants(&[std::process::id(), s.child.id()]) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let shown = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        for what in ["cmdline", "environ"] {
            if let Ok(b) = std::fs::read(format!("/proc/{pid}/{what}")) {
                out.push((format!("/proc/{pid}/{what} ({shown})"), b));
            }
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The stand-in secret the other tests plant on purpose (`lh1o_AAA...`,
/// in an `ls`'s environment, to see it refused).
fn planted() -> String {
    format!("{SECRET_PREFIX}{}", "A".repeat(43))
}

/// Whether `b` holds a one-time secret other than the planted stand-in,
/// which another test of this binary may have in a process's environment
/// at the same moment.
fn holds_a_secret(b: &[u8]) -> bool {
    let prefix = SECRET_PREFIX.as_bytes();
    let planted = planted();
    (0..b.len().saturating_sub(prefix.len() - 1))
        .filter(|&i| b[i..].starts_with(prefix))
        .any(|i| !b[i..].starts_with(planted.as_bytes()))
}

#[test]
fn attacker_the_one_shot_port_admits_only_the_secret_once_and_the_secret_is_in_no_process_or_log() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("secret-data.bin"), pattern(3, 32 << 20)).unwrap();
    let (mut ssh, h, far_err) = far_end(&s);
    let server = format!("longhaul://127.0.0.1:{}/root{}", h.port, dir.display());
    let fp = h.fingerprint.clone();

    // The secret is on no command line and in no environment, here or there.
    for (what, b) in cmdlines_and_environs_of_this_test(&s) {
        assert!(
            !contains(&b, h.secret.as_bytes()),
            "the secret is in {what}"
        );
    }

    // Another local user knows the port (and even the fingerprint): without
    // the secret, or with a wrong one, nothing is listed.
    let ls = |token: Option<&str>| {
        let mut c = s.longhaul();
        c.args(["ls", "--trust", &fp]).arg(&server);
        if let Some(t) = token {
            c.env("LONGHAUL_TOKEN", t);
        }
        c.output().unwrap()
    };
    for token in [None, Some(planted()), Some("lh1_x_y".into())] {
        let o = ls(token.as_deref());
        assert!(!o.status.success(), "{}", text(&o));
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("secret-data"),
            "{}",
            text(&o)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("one-shot server"),
            "{}",
            text(&o)
        );
    }
    // Nor does someone who does not speak TLS get anything but a refusal.
    let mut raw = TcpStream::connect(("127.0.0.1", h.port)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = raw.write_all(b"LONGHAUL\0\0\0\0hello");
    let mut got = Vec::new();
    let _ = raw.read_to_end(&mut got);
    assert!(!contains(&got, b"secret-data"), "{got:?}");

    // The secret's holder gets in (a slow pull keeps its session open) ...
    let back = work.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let mut first = s
        .longhaul()
        .env("LONGHAUL_TOKEN", &h.secret)
        .args(["cp", "--rate", "40M", "-P", "1", "--trust", &fp])
        .arg(format!("{server}/secret-data.bin"))
        .arg(&back)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let first_err = lines_of(first.stderr.take().unwrap());
    let until = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&back).unwrap().next().is_none() {
        assert!(Instant::now() < until, "the first use did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    // ... once: a second use of the same secret is refused while it runs.
    let o = ls(Some(&h.secret));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("used already"),
        "{}",
        text(&o)
    );
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("secret-data"),
        "{}",
        text(&o)
    );

    let status = first.wait().unwrap();
    let first_said: Vec<String> = first_err.try_iter().collect();
    assert!(status.success(), "the first use: {first_said:?}");
    assert_eq!(
        std::fs::read(back.join("secret-data.bin")).unwrap(),
        std::fs::read(dir.join("secret-data.bin")).unwrap()
    );
    // Its session over, the far end is gone, and so is ssh.
    wait_gone(h.pid, "the far end after its session");
    let until = Instant::now() + Duration::from_secs(10);
    while ssh.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "ssh still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The far end's log and the clients' say nothing of the secret.
    let far_said: String = far_err.try_iter().collect::<Vec<_>>().join("\n");
    assert!(
        !far_said.contains(&h.secret) && !far_said.contains(SECRET_PREFIX),
        "{far_said}"
    );
    assert!(!first_said.join("\n").contains(&h.secret));
    assert!(!s.log().contains(&h.secret));
}

#[test]
fn attacker_a_copy_over_ssh_shows_its_secret_nowhere() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let big = work.path().join("big.bin");
    std::fs::write(&big, pattern(5, 24 << 20)).unwrap();
    let far = work.path().join("far");
    std::fs::create_dir(&far).unwrap();
    let mut c = s
        .longhaul()
        .args([
            "-vv",
            "cp",
            "--rate",
            "40M",
            "-P",
            "1",
            "--remote-path",
            BIN,
        ])
        .arg(&big)
        .arg(format!("{HOST}:{}/", far.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(c.stderr.take().unwrap());
    let (_pid, mut said) = wait_far_pid(&lines);
    // While it runs: no command line or environment of any process (the
    // client, ssh, sshd's session, the far end) holds a one-time secret.
    for _ in 0..5 {
        for (what, b) in cmdlines_and_environs_of_this_test(&s) {
            assert!(!holds_a_secret(&b), "a one-time secret is in {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let status = c.wait().unwrap();
    said.extend(lines.iter().map(|l| l + "\n"));
    assert!(status.success(), "{said}");
    assert!(
        !said.contains(SECRET_PREFIX),
        "the debug log shows the secret:\n{said}"
    );
    assert!(!out.contains(SECRET_PREFIX));
    assert!(!s.log().contains(SECRET_PREFIX));
}

#[test]
fn copy_binary_puts_this_binary_on_a_host_without_longhaul_and_uses_it() {
    let Some(s) = sshd() else { return };
    let home = std::fs::canonicalize(std::env::var("HOME").unwrap()).unwrap();
    let id = blake3::hash(&std::fs::read(BIN).unwrap()).to_hex();
    let copied = home.join(format!(
        ".cache/longhaul/longhaul-{}-{}",
        env!("CARGO_PKG_VERSION"),
        &id[..12]
    ));
    // The test's far host is this host: only a copy this test made is removed.
    let was_there = copied.exists();
    let work = tempfile::tempdir().unwrap();
    let f = work.path().join("f.bin");
    std::fs::write(&f, pattern(11, 1 << 20)).unwrap();
    let far = work.path().join("far");
    std::fs::create_dir(&far).unwrap();
    let o = s
        .longhaul()
        .args([
            "cp",
            "--copy-binary",
            "--remote-path",
            "/nonexistent/longhaul",
        ])
        .arg(&f)
        .arg(format!("{HOST}:{}/", far.display()))
        .output()
        .unwrap();
    let landed = std::fs::read(far.join("f.bin"));
    let mode = std::fs::metadata(&copied)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()));
    if !was_there {
        let _ = std::fs::remove_file(&copied);
    }
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(landed.unwrap(), std::fs::read(&f).unwrap());
    assert_eq!(
        mode.unwrap() & 0o777,
        0o700,
        "the copy is its owner's alone"
    );
}

#[test]
fn perf_over_ssh_with_no_server_running() {
    let Some(s) = sshd() else { return };
    let o = s
        .longhaul()
        .args(["-v", "perf", "-t", "1", "--json", "--remote-path", BIN])
        .arg(format!("{HOST}:"))
        .output()
        .unwrap();
    assert!(o.status.success(), "perf: {}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(j["error"].is_null(), "{}", text(&o));
    assert!(j["summary"]["bytes"].as_u64().unwrap() > 0, "{}", text(&o));
    // As cp's, the report says which side opened the connections.
    assert_eq!(
        j["summary"]["connections"]["opened_by"],
        "client",
        "{}",
        text(&o)
    );
    let pid = far_pid(&String::from_utf8_lossy(&o.stderr)).expect("the far end's pid in the log");
    wait_gone(pid, "the far end after a perf test");

    // Connected back: the JSON and the words say so, and why.
    let o = s
        .longhaul()
        .args([
            "perf",
            "-t",
            "1",
            "--json",
            "--connect-back",
            "--remote-path",
            BIN,
        ])
        .arg(format!("{HOST}:"))
        .output()
        .unwrap();
    assert!(o.status.success(), "perf --connect-back: {}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(j["summary"]["bytes"].as_u64().unwrap() > 0, "{}", text(&o));
    assert_eq!(
        j["summary"]["connections"]["opened_by"],
        "far_end",
        "{}",
        text(&o)
    );
    let why = j["summary"]["connections"]["reason"].as_str().unwrap();
    assert!(
        why.starts_with("--connect-back was given; the far end connected back to 127.0.0.1:"),
        "{why}"
    );
    let o = s
        .longhaul()
        .args(["perf", "-t", "1", "--connect-back", "--remote-path", BIN])
        .arg(format!("{HOST}:"))
        .output()
        .unwrap();
    assert!(o.status.success(), "perf --connect-back: {}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .contains("connections: opened by the far end (--connect-back was given; "),
        "{}",
        text(&o)
    );

    // UDP where the far end opened the way: it sends each stream's first
    // datagram, both ways at once here.
    let o = s
        .longhaul()
        .args([
            "perf",
            "-u",
            "-t",
            "1",
            "--bidir",
            "--json",
            "--connect-back",
        ])
        .args(["--remote-path", BIN])
        .arg(format!("{HOST}:"))
        .output()
        .unwrap();
    assert!(o.status.success(), "perf -u --connect-back: {}", text(&o));
    udp_through(&o, 2, 1);
}

/// A UDP perf report (`--json`) of a test whose far end connected back:
/// `directions` ways of `streams` streams, every one with datagrams
/// received and counted, little lost.
fn udp_through(o: &Output, directions: usize, streams: usize) {
    let j: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o)));
    let sum = &j["summary"];
    assert!(sum["error"].is_null(), "{}", text(o));
    assert_eq!(sum["transport"], "udp", "{}", text(o));
    assert_eq!(sum["connections"]["opened_by"], "far_end", "{}", text(o));
    let dirs = sum["directions"].as_array().unwrap();
    assert_eq!(dirs.len(), directions, "{}", text(o));
    for d in dirs {
        let sent = d["packets_sent"].as_u64().unwrap();
        let received = d["packets_received"].as_u64().unwrap();
        assert!(received > 0, "no datagram got through: {d}");
        assert_eq!(sent, received + d["lost_packets"].as_u64().unwrap(), "{d}");
    }
    // 1 Mbit/s (the default rate) loses next to nothing, even on a busy host.
    assert!(sum["lost_percent"].as_f64().unwrap() < 10.0, "{sum}");
    let each = sum["streams"].as_array().unwrap();
    assert_eq!(each.len(), directions * streams, "{sum}");
    assert!(
        each.iter()
            .all(|s| s["packets_received"].as_u64() > Some(0)),
        "{sum}"
    );
}

/// The far host of a DTN whose firewall lets it only connect out: a
/// network namespace joined to this one by a veth pair (198.19.N.0/30,
/// this side .1, the far side .2), whose nftables rules drop every new
/// inbound connection but those to its sshd. Deleted on drop (the veth
/// with it); its sshd is the caller's, ended by PID.
struct Walled {
    ns: String,
    near: String,
    pub far_ip: String,
    pub near_ip: String,
}

impl Walled {
    /// The namespace and its link, no firewall yet; None (SKIP) without
    /// root, iproute2 or nftables, a failure with `LONGHAUL_REQUIRE_ROOT=1`.
    fn up() -> Option<Walled> {
        use common::require;
        let can = require::root("a firewalled namespace")
            .and_then(|()| require::program("ip", "iproute2"))
            .and_then(|()| require::program("nft", "nftables"));
        if !require::have("ROOT", can) {
            return None;
        }
        let pid = std::process::id();
        let n = pid % 250 + 1;
        let w = Walled {
            ns: format!("lhcb{pid}"),
            near: format!("lhcb{pid}a"),
            far_ip: format!("198.19.{n}.2"),
            near_ip: format!("198.19.{n}.1"),
        };
        let far_if = format!("lhcb{pid}b");
        let run = |args: &[&str]| {
            let o = std::process::Command::new("ip")
                .args(args)
                .output()
                .unwrap();
            assert!(o.status.success(), "ip {args:?}: {}", text(&o));
        };
        run(&["netns", "add", &w.ns]);
        run(&[
            "link", "add", &w.near, "type", "veth", "peer", "name", &far_if,
        ]);
        run(&["link", "set", &far_if, "netns", &w.ns]);
        run(&["addr", "add", &format!("{}/30", w.near_ip), "dev", &w.near]);
        run(&["link", "set", &w.near, "up"]);
        let inside = |args: &[&str]| {
            let mut a = vec!["netns", "exec", &w.ns, "ip"];
            a.extend_from_slice(args);
            run(&a);
        };
        inside(&["addr", "add", &format!("{}/30", w.far_ip), "dev", &far_if]);
        inside(&["link", "set", &far_if, "up"]);
        inside(&["link", "set", "lo", "up"]);
        Some(w)
    }

    /// The firewall: new inbound connections dropped (no answer at all),
    /// but those to `ssh_port`; whatever the far host opened, and its
    /// loopback, pass.
    fn wall(&self, ssh_port: u16) {
        let rules = format!(
            "table inet lhcb {{\n chain input {{\n  type filter hook input priority 0; policy drop;\n  \
             iif lo accept\n  ct state established,related accept\n  tcp dport {ssh_port} accept\n }}\n}}\n"
        );
        let mut nft = std::process::Command::new("ip")
            .args(["netns", "exec", &self.ns, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        nft.stdin
            .take()
            .unwrap()
            .write_all(rules.as_bytes())
            .unwrap();
        let o = nft.wait_with_output().unwrap();
        assert!(o.status.success(), "nft: {}", text(&o));
    }
}

impl Drop for Walled {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .output();
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.near])
            .output();
    }
}

/// The port in the `Port` line of a test sshd's config.
fn sshd_port(s: &Sshd) -> u16 {
    let c = std::fs::read_to_string(s.dir.path().join("sshd_config")).unwrap();
    c.lines()
        .find_map(|l| l.strip_prefix("Port "))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_far_end_that_can_only_connect_out_connects_back_and_the_report_says_why() {
    let Some(w) = Walled::up() else { return };
    let Some(s) = common::sshd::sshd_in(Some(&w.ns), &w.far_ip) else {
        return;
    };
    w.wall(sshd_port(&s));
    // The far end's own port is truly out of reach from here.
    let (mut ssh, h, _) = far_end(&s);
    assert_eq!(h.addr.to_string(), w.far_ip);
    assert_eq!(h.client.map(|c| c.to_string()), Some(w.near_ip.clone()));
    assert!(h.back);
    let direct = TcpStream::connect_timeout(
        &std::net::SocketAddr::new(h.addr, h.port),
        Duration::from_secs(1),
    );
    assert!(
        direct.is_err(),
        "the far end's port answered through the wall"
    );
    drop(ssh.stdin.take());
    let _ = ssh.kill();
    let _ = ssh.wait();

    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    write_tree(&src);
    let far = work.path().join("far");
    std::fs::create_dir(&far).unwrap();
    let o = s
        .longhaul()
        .args(["-v", "cp", "-r", "--json", "--remote-path", BIN])
        .arg(&src)
        .arg(format!("{HOST}:{}/", far.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "push: {}", text(&o));
    same_tree(&src, &far.join("tree"));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["verified"], true, "{}", text(&o));
    assert_eq!(j["connections"]["opened_by"], "far_end", "{}", text(&o));
    let why = j["connections"]["reason"].as_str().unwrap();
    assert!(
        why.contains(&format!("direct connection to {}:", w.far_ip))
            && why.contains("no answer")
            && why.contains(&format!("connected back to {}:", w.near_ip)),
        "{why}"
    );
    let pid = far_pid(&String::from_utf8_lossy(&o.stderr)).expect("the far end's pid in the log");
    wait_gone(pid, "the far end after a push");

    // The pull, in words: the summary says it too.
    let back = work.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let o = s
        .longhaul()
        .args(["cp", "-r", "--remote-path", BIN])
        .arg(format!("{HOST}:{}/tree", far.display()))
        .arg(&back)
        .output()
        .unwrap();
    assert!(o.status.success(), "pull: {}", text(&o));
    same_tree(&src, &back.join("tree"));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("connections: opened by the far end (direct connection to"),
        "{}",
        text(&o)
    );
}

/// UDP perf to a far end whose firewall drops every new inbound datagram:
/// it sends each stream's first datagram to this side, which answers
/// through the hole that opened; one way and the other, several streams.
#[test]
fn udp_perf_to_a_far_end_that_can_only_connect_out_starts_its_streams_from_there() {
    let Some(w) = Walled::up() else { return };
    let Some(s) = common::sshd::sshd_in(Some(&w.ns), &w.far_ip) else {
        return;
    };
    w.wall(sshd_port(&s));
    for (more, directions, streams) in [(&["-P", "2"][..], 1, 2), (&["-R"][..], 1, 1)] {
        let o = s
            .longhaul()
            .args([
                "-v",
                "perf",
                "-u",
                "-t",
                "1",
                "--json",
                "--remote-path",
                BIN,
            ])
            .args(more)
            .arg(format!("{HOST}:"))
            .output()
            .unwrap();
        assert!(o.status.success(), "perf -u {more:?}: {}", text(&o));
        udp_through(&o, directions, streams);
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let why = j["summary"]["connections"]["reason"].as_str().unwrap();
        assert!(
            why.contains(&format!("direct connection to {}:", w.far_ip)),
            "{why}"
        );
    }
}

#[test]
fn connect_back_can_be_forced_and_a_direct_copy_says_the_client_connected() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let (big, data, far) = big_and_far(work.path(), 11, 4 << 20);
    let o = s
        .longhaul()
        .args(["cp", "--json", "--connect-back", "--remote-path", BIN])
        .arg(&big)
        .arg(format!("{HOST}:{}/", far.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "forced: {}", text(&o));
    assert_eq!(std::fs::read(far.join("big.bin")).unwrap(), data);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["connections"]["opened_by"], "far_end", "{}", text(&o));
    let why = j["connections"]["reason"].as_str().unwrap();
    assert!(
        why.starts_with("--connect-back was given; the far end connected back to 127.0.0.1:"),
        "{why}"
    );

    // Without it, on a path that lets the client in, the client connects.
    std::fs::remove_file(far.join("big.bin")).unwrap();
    let o = s
        .longhaul()
        .args(["cp", "--json", "--remote-path", BIN])
        .arg(&big)
        .arg(format!("{HOST}:{}/", far.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "direct: {}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["connections"]["opened_by"], "client", "{}", text(&o));
    assert!(j["connections"].get("reason").is_none(), "{}", text(&o));
}

#[test]
fn attacker_a_stranger_at_the_connect_back_listener_is_closed_and_the_copy_goes_on() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let (big, data, far) = big_and_far(work.path(), 12, 16 << 20);
    let mut c = s
        .longhaul()
        .args(["-v", "cp", "--json", "--connect-back", "--rate", "40mbit"])
        .args(["--remote-path", BIN])
        .arg(&big)
        .arg(format!("{HOST}:{}/", far.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(c.stderr.take().unwrap());
    let mut seen = String::new();
    let listener = loop {
        let l = lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no connect-back listener; the client said:\n{seen}"));
        seen.push_str(&l);
        seen.push('\n');
        if let Some(at) = l
            .find("listening on ")
            .filter(|_| l.contains("for the far end to connect back"))
        {
            let a = l[at + 13..].split_whitespace().next().unwrap();
            break a.parse::<std::net::SocketAddr>().unwrap();
        }
    };
    // A stranger with a ticket of the right form, and one speaking TLS
    // straight away: each is closed without a byte.
    for first in [
        format!("lh1b_{}", "A".repeat(43)).into_bytes(),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".repeat(5),
    ] {
        let mut t = TcpStream::connect(listener).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = t.write_all(&first);
        let mut b = [0u8; 64];
        assert!(
            !matches!(t.read(&mut b), Ok(n) if n > 0),
            "the connect-back listener answered a stranger"
        );
    }
    let mut out = Vec::new();
    c.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let status = c.wait().unwrap();
    for l in lines.iter() {
        seen.push_str(&l);
        seen.push('\n');
    }
    assert!(status.success(), "cp: {seen}");
    assert_eq!(std::fs::read(far.join("big.bin")).unwrap(), data);
    let j: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(j["verified"], true, "{seen}");
    assert_eq!(j["connections"]["opened_by"], "far_end");
    assert!(seen.contains("closed a connection from"), "{seen}");
}

#[test]
fn doctor_over_ssh_runs_its_stages_through_one_far_end_that_is_gone_afterwards() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let far = work.path().join("far");
    std::fs::create_dir(&far).unwrap();
    let o = s
        .longhaul()
        .args([
            "-v",
            "doctor",
            "--json",
            "--time",
            "1s",
            "--remote-path",
            BIN,
        ])
        .arg(format!("{HOST}:{}/", far.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "doctor: {}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Each stage ran against the far end: its settings and storage, memory
    // to memory both ways, the short copy; and a verdict.
    assert!(j["remote"]["cpus"].as_u64().is_some(), "{}", text(&o));
    assert!(j["dest_storage"].is_object(), "{}", text(&o));
    for way in ["upload", "download"] {
        assert!(
            j[way]["bits_per_second"].as_f64().unwrap() > 0.0,
            "{way}: {}",
            text(&o)
        );
    }
    assert!(j["copy"]["bytes"].as_u64().unwrap() > 0, "{}", text(&o));
    assert!(j["verdict"]["stage"].is_string(), "{}", text(&o));
    let notes = j["notes"].to_string();
    assert!(notes.contains("one-shot far end on lhtest"), "{notes}");
    assert!(!notes.contains("used already"), "{notes}");
    // One far end for all of it, gone afterwards, its scratch copy too.
    let log = String::from_utf8_lossy(&o.stderr);
    assert_eq!(log.matches("is pid ").count(), 1, "{log}");
    let pid = far_pid(&log).expect("the far end's pid in the log");
    wait_gone(pid, "the far end after the doctor");
    assert!(
        std::fs::read_dir(&far).unwrap().next().is_none(),
        "the doctor left something in {}",
        far.display()
    );
    assert!(!log.contains(SECRET_PREFIX), "{log}");
    // Nothing remembered under the far end's passing port.
    assert!(!s.dir.path().join("state/longhaul/paths.json").exists());
}

#[test]
fn attacker_a_far_end_for_n_sessions_admits_n_on_its_secret_and_nothing_else() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("listed.bin"), b"x").unwrap();
    let (mut ssh, h, far_err) = far_end_with(&s, "--sessions 2");
    let server = format!("longhaul://127.0.0.1:{}/root{}", h.port, dir.display());
    let ls = |token: &str| {
        s.longhaul()
            .env("LONGHAUL_TOKEN", token)
            .args(["ls", "--trust", &h.fingerprint])
            .arg(&server)
            .output()
            .unwrap()
    };
    // A wrong secret is refused, and takes none of the sessions.
    let o = ls(&planted());
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("one-shot server"),
        "{}",
        text(&o)
    );
    // The secret, twice: both admitted, one after the other.
    for n in 1..=2 {
        let o = ls(&h.secret);
        assert!(o.status.success(), "session {n}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("listed.bin"),
            "{}",
            text(&o)
        );
    }
    // The third is beyond the bound: refused, or the far end is already
    // gone (its last session ended it); never listed.
    let o = ls(&h.secret);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("listed.bin"),
        "{}",
        text(&o)
    );
    wait_gone(h.pid, "the far end after its last session");
    let until = Instant::now() + Duration::from_secs(10);
    while ssh.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "ssh still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
    let far_said: String = far_err.try_iter().collect::<Vec<_>>().join("\n");
    assert!(!far_said.contains(SECRET_PREFIX), "{far_said}");

    // While sessions are open, the one beyond the bound is refused as such.
    let (mut ssh, h, _) = far_end_with(&s, "--sessions 2");
    let server = format!("longhaul://127.0.0.1:{}/root{}", h.port, dir.display());
    let big = dir.join("big.bin");
    std::fs::write(&big, pattern(8, 16 << 20)).unwrap();
    let back = work.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let slow = |to: &Path| {
        s.longhaul()
            .env("LONGHAUL_TOKEN", &h.secret)
            .args(["cp", "--rate", "40M", "-P", "1", "--trust", &h.fingerprint])
            .arg(format!("{server}/big.bin"))
            .arg(to)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (b1, b2) = (back.join("1"), back.join("2"));
    std::fs::create_dir(&b1).unwrap();
    std::fs::create_dir(&b2).unwrap();
    let mut first = slow(&b1);
    let mut second = slow(&b2);
    let until = Instant::now() + Duration::from_secs(30);
    while [&b1, &b2]
        .iter()
        .any(|b| std::fs::read_dir(b).unwrap().next().is_none())
    {
        assert!(Instant::now() < until, "the two sessions did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = s
        .longhaul()
        .env("LONGHAUL_TOKEN", &h.secret)
        .args(["ls", "--trust", &h.fingerprint])
        .arg(&server)
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("used already (2 sessions"),
        "{}",
        text(&o)
    );
    assert!(first.wait().unwrap().success());
    assert!(second.wait().unwrap().success());
    wait_gone(h.pid, "the far end after its two sessions");
    let _ = ssh.wait();

    // A bound the far end does not take is refused before anything listens.
    let o = std::process::Command::new(BIN)
        .args(["serve", "--one-shot", "--sessions", "1000"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("from 1 to"),
        "{}",
        text(&o)
    );
}

/// Rank `r` of a two-rank fleet's `cp` over ssh (1 MiB chunks, `--json`,
/// a minute's wait for the others), its output piped; the caller names
/// the mode, the sources and the destination.
fn fleet_rank(s: &Sshd, r: u32) -> Command {
    let mut c = s.longhaul();
    c.args([
        "-v",
        "cp",
        "-r",
        "--chunk",
        "1M",
        "--json",
        "--remote-path",
        BIN,
    ])
    .args([
        "--rank",
        &r.to_string(),
        "--size",
        "2",
        "--fleet-wait",
        "60s",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

#[test]
fn a_fleets_ranks_push_to_a_host_over_ssh_each_through_its_own_far_end() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    write_tree(&src);
    let far = work.path().join("far");
    std::fs::create_dir(&far).unwrap();
    let run_dir = work.path().join("run");
    let dest = format!("{HOST}:{}/out/", far.display());
    let rank = |r: u32| {
        fleet_rank(&s, r)
            .arg("--run-dir")
            .arg(&run_dir)
            .arg(format!("{}/", src.display()))
            .arg(&dest)
            .spawn()
            .unwrap()
    };
    let ranks = [rank(0), rank(1)];
    let outs: Vec<Output> = ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let mut pids = Vec::new();
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", text(o));
        let log = String::from_utf8_lossy(&o.stderr);
        assert_eq!(log.matches("is pid ").count(), 1, "rank {r}: {log}");
        pids.push(far_pid(&log).unwrap());
    }
    assert_ne!(pids[0], pids[1], "each rank has its own far end");
    let j: serde_json::Value = serde_json::from_slice(&outs[0].stdout).unwrap();
    assert_eq!(j["format"], "longhaul-fleet", "{}", text(&outs[0]));
    assert_eq!(j["verified"], true, "{}", text(&outs[0]));
    same_tree(&src, &far.join("out"));
    for p in pids {
        wait_gone(p, "a rank's far end");
    }

    // What a rank does not take is refused before anything starts, saying
    // what to run instead.
    let o = s
        .longhaul()
        .args(["cp", "-r", "--rank", "0", "--size", "1", "--run-dir"])
        .arg(work.path().join("run2"))
        .arg(format!("{HOST}:{}/", far.display()))
        .arg(work.path().join("back"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("third-party copy"),
        "{}",
        text(&o)
    );
}

/// The source of a third-party copy into a walled far end: a server on
/// this side's end of the veth (which the far end reaches by connecting
/// out), exporting `root` as `data`, taking part in third-party copies.
fn source_near(w: &Walled, root: &Path, state: &Path) -> longhaul_engine::server::ServerHandle {
    longhaul_engine::server::Server::bind(
        &[std::net::SocketAddr::new(w.near_ip.parse().unwrap(), 0)],
        longhaul_engine::server::ServeConfig {
            third_party_copies: true,
            ..common::xfer::data_config(root, state, false)
        },
    )
    .unwrap()
    .spawn()
}

/// A walled far end over ssh, a source server near it, and `a/tree` (the
/// ssh tree and `big.bin`, `big` bytes) to copy; None: SKIP.
fn walled_copy(
    big: usize,
) -> Option<(
    Walled,
    Sshd,
    tempfile::TempDir,
    longhaul_engine::server::ServerHandle,
)> {
    let w = Walled::up()?;
    let s = common::sshd::sshd_in(Some(&w.ns), &w.far_ip)?;
    w.wall(sshd_port(&s));
    let work = tempfile::tempdir().unwrap();
    let ra = work.path().join("a");
    write_tree(&ra.join("tree"));
    std::fs::write(ra.join("tree/big.bin"), pattern(21, big)).unwrap();
    std::fs::create_dir(work.path().join("far")).unwrap();
    let a = source_near(&w, &ra, &work.path().join("state"));
    Some((w, s, work, a))
}

/// `cp -r SERVER:tree WALLED:far/` from the ordering client, which trusts
/// the source and holds its token.
fn order_into_walled(
    s: &Sshd,
    a: &longhaul_engine::server::ServerHandle,
    work: &Path,
    more: &[&str],
) -> std::process::Command {
    let mut c = s.longhaul();
    c.env("LONGHAUL_TOKEN", common::TOKEN)
        .env("LONGHAUL_TRUST", common::fingerprint())
        .args(["-v", "cp", "-r", "--json", "--verify", "--retries", "0"])
        .args(["--remote-path", BIN])
        .args(more)
        .arg(common::xfer::remote(a.addr(), "tree"))
        .arg(format!("{HOST}:{}/", work.join("far").display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[test]
fn a_third_party_copy_into_a_far_end_that_can_only_connect_out_has_it_connect_back_to_the_source() {
    let Some((w, s, work, a)) = walled_copy(8 << 20) else {
        return;
    };
    let mut child = order_into_walled(&s, &a, work.path(), &[]).spawn().unwrap();
    // The most the client moved through its calls, sampled as it runs.
    let pid = child.id();
    let io = || {
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
        let field = |name: &str| {
            io.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        Some(field("rchar:")? + field("wchar:")?)
    };
    let mut most = 0u64;
    let until = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() && Instant::now() < until {
        most = most.max(io().unwrap_or(0));
        std::thread::sleep(Duration::from_millis(5));
    }
    let o = child.wait_with_output().unwrap();
    a.shutdown();
    assert!(o.status.success(), "{}", text(&o));
    let (src, dst) = (work.path().join("a/tree"), work.path().join("far/tree"));
    same_tree(&src, &dst);
    assert_eq!(
        std::fs::read(src.join("big.bin")).unwrap(),
        std::fs::read(dst.join("big.bin")).unwrap()
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["verified"], true, "{}", text(&o));
    // The client reached the far end by its connecting back, and so did
    // the source: the report says both.
    assert_eq!(j["connections"]["opened_by"], "far_end", "{}", text(&o));
    let data = &j["third_party"]["data_connections"];
    assert_eq!(data["opened_by"], "dest", "{}", text(&o));
    let why = data["reason"].as_str().unwrap();
    assert!(
        why.contains(&format!("connected back to the source at {}:", w.near_ip)),
        "{why}"
    );
    // And the data did not pass through the client.
    let total = (8u64 << 20) + (3 << 20);
    let control = j["third_party"]["control_bytes"].as_u64().unwrap();
    assert!(
        control > 0 && control < total / 50,
        "control {control} of {total}"
    );
    assert!(
        most < total / 10,
        "the client moved {most} of {total} bytes"
    );
}

#[test]
fn attacker_a_stranger_at_the_sources_connect_back_listener_is_closed_and_no_ticket_shows() {
    let Some((w, s, work, a)) = walled_copy(8 << 20) else {
        return;
    };
    let mut c = order_into_walled(&s, &a, work.path(), &["--rate", "20mbit"])
        .spawn()
        .unwrap();
    let lines = lines_of(c.stderr.take().unwrap());
    let mut seen = String::new();
    let listener = loop {
        let l = lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no connect-back to the source; the client said:\n{seen}"));
        seen.push_str(&l);
        seen.push('\n');
        if let Some(at) = l.find("has the destination connect back to it at ") {
            let addr = l[at + 42..].split_whitespace().next().unwrap();
            break addr.parse::<std::net::SocketAddr>().unwrap();
        }
    };
    assert_eq!(listener.ip().to_string(), w.near_ip);
    // Strangers at the source's listener: one with a ticket of the right
    // form, one speaking TLS at once; each is closed without a byte.
    for first in [
        format!("lh1b_{}", "A".repeat(43)).into_bytes(),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".repeat(5),
    ] {
        let mut t = TcpStream::connect_timeout(&listener, Duration::from_secs(5)).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = t.write_all(&first);
        let mut b = [0u8; 64];
        assert!(
            !matches!(t.read(&mut b), Ok(n) if n > 0),
            "the source's connect-back listener answered a stranger"
        );
    }
    // No ticket in any process's command line or environment meanwhile.
    let ticket = longhaul_engine::net::back::TICKET_PREFIX.as_bytes();
    while c.try_wait().unwrap().is_none() {
        for (what, b) in cmdlines_and_environs_of_this_test(&s) {
            assert!(!contains(&b, ticket), "a ticket in {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut out = Vec::new();
    c.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let status = c.wait().unwrap();
    for l in lines.iter() {
        seen.push_str(&l);
        seen.push('\n');
    }
    a.shutdown();
    assert!(status.success(), "cp: {seen}");
    let j: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(j["verified"], true, "{seen}");
    assert_eq!(j["third_party"]["data_connections"]["opened_by"], "dest");
    assert_eq!(
        std::fs::read(work.path().join("a/tree/big.bin")).unwrap(),
        std::fs::read(work.path().join("far/tree/big.bin")).unwrap()
    );
    // The relayed tickets went only through TLS and the ssh channel: not
    // in the client's output or its log.
    assert!(
        !contains(&out, ticket) && !seen.contains("lh1b_"),
        "a ticket shown:\n{seen}"
    );
    // The listener lived only while the order ran.
    let until = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&listener, Duration::from_secs(1)).is_ok() {
        assert!(
            Instant::now() < until,
            "the source still listens at {listener}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_third_party_copy_into_a_walled_far_end_that_cannot_reach_the_source_says_what_to_do_instead() {
    let Some(w) = Walled::up() else { return };
    let Some(s) = common::sshd::sshd_in(Some(&w.ns), &w.far_ip) else {
        return;
    };
    w.wall(sshd_port(&s));
    let work = tempfile::tempdir().unwrap();
    let (ra, far) = (work.path().join("a"), work.path().join("far"));
    std::fs::create_dir(&ra).unwrap();
    std::fs::create_dir(&far).unwrap();
    std::fs::write(ra.join("f.bin"), pattern(21, 1 << 20)).unwrap();
    // The source: a server on this side's loopback, out of the far end's
    // reach, which gives up on a destination that did not connect back
    // after 2 s.
    let a = common::xfer::spawn_server(longhaul_engine::server::ServeConfig {
        third_party_copies: true,
        limits: longhaul_proto::session::Limits {
            handshake_timeout: Duration::from_secs(2),
            ..Default::default()
        },
        ..common::xfer::data_config(&ra, &work.path().join("state"), false)
    });
    let o = s
        .longhaul()
        .env("LONGHAUL_TOKEN", common::TOKEN)
        .env("LONGHAUL_TRUST", common::fingerprint())
        .args([
            "cp",
            "--retries",
            "0",
            "--connect-back",
            "--remote-path",
            BIN,
        ])
        .arg(common::xfer::remote(a.addr(), "f.bin"))
        .arg(format!("{HOST}:{}/", far.display()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    a.shutdown();
    assert!(!o.status.success(), "{}", text(&o));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains("it was to connect back to this source at 127.0.0.1")
            && said.contains("takes no new connection (it connected back to this client)")
            && said.contains("copy in two steps through this host"),
        "{}",
        text(&o)
    );
    assert!(!far.join("f.bin").exists());
}

#[test]
fn attacker_an_open_far_end_admits_only_its_secret_a_few_at_a_time_and_nothing_after_its_channel() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("listed.bin"), b"x").unwrap();
    let (mut ssh, h, far_err) = far_end_with(&s, "--sessions open");
    let server = format!("longhaul://127.0.0.1:{}/root{}", h.port, dir.display());
    let ls = |token: &str| {
        s.longhaul()
            .env("LONGHAUL_TOKEN", token)
            .args(["ls", "--trust", &h.fingerprint])
            .arg(&server)
            .output()
            .unwrap()
    };
    let listed = |o: &Output| String::from_utf8_lossy(&o.stdout).contains("listed.bin");
    // Wrong secrets are refused, however often, and take nothing.
    for wrong in [planted(), format!("{}x", h.secret)] {
        let o = ls(&wrong);
        assert!(!o.status.success() && !listed(&o), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("one-shot server"),
            "{}",
            text(&o)
        );
    }
    // The secret, one session after another: more than a count of three
    // (a fleet rank's far end before) admitted, and the far end stays.
    for n in 1..=5 {
        let o = ls(&h.secret);
        assert!(
            o.status.success() && listed(&o),
            "session {n}: {}",
            text(&o)
        );
    }
    assert!(!gone(h.pid), "an open far end lives while its channel does");
    // At most four at once: four slow pulls, and a fifth is refused as such.
    let big = dir.join("big.bin");
    std::fs::write(&big, pattern(9, 6 << 20)).unwrap();
    let backs: Vec<PathBuf> = (0..4)
        .map(|i| {
            let b = work.path().join(format!("back{i}"));
            std::fs::create_dir(&b).unwrap();
            b
        })
        .collect();
    let slow: Vec<Child> = backs
        .iter()
        .map(|to| {
            s.longhaul()
                .env("LONGHAUL_TOKEN", &h.secret)
                .args(["cp", "--rate", "10M", "-P", "1", "--trust", &h.fingerprint])
                .arg(format!("{server}/big.bin"))
                .arg(to)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(30);
    while backs
        .iter()
        .any(|b| std::fs::read_dir(b).unwrap().next().is_none())
    {
        assert!(Instant::now() < until, "the four sessions did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = ls(&h.secret);
    assert!(!o.status.success() && !listed(&o), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("as many as it serves at once"),
        "{}",
        text(&o)
    );
    for c in slow {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "a slow pull: {}", text(&o));
    }
    for b in &backs {
        assert_eq!(
            std::fs::read(b.join("big.bin")).unwrap(),
            std::fs::read(&big).unwrap()
        );
    }
    // They ended: the secret gets in again.
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let o = ls(&h.secret);
        if o.status.success() && listed(&o) {
            break;
        }
        assert!(Instant::now() < until, "not admitted again: {}", text(&o));
        std::thread::sleep(Duration::from_millis(200));
    }
    // The ssh channel closes: the far end is gone, and the secret is
    // worth nothing.
    drop(ssh.stdin.take());
    wait_gone(h.pid, "an open far end after its channel closed");
    let o = ls(&h.secret);
    assert!(!o.status.success() && !listed(&o), "{}", text(&o));
    let _ = ssh.wait();
    let far_said: String = far_err.try_iter().collect::<Vec<_>>().join("\n");
    assert!(!far_said.contains(SECRET_PREFIX), "{far_said}");
}

#[test]
fn a_queue_fleets_ranks_drain_it_to_a_host_over_ssh_each_through_its_own_open_far_end() {
    let Some(s) = sshd() else { return };
    let Some(pg) = pg::TempPostgres::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    write_tree(&src);
    for i in 0..30 {
        let d = src.join(format!("many/{}", i % 4));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(format!("f{i}")),
            pattern(100 + i, 1000 + i as usize * 997),
        )
        .unwrap();
    }
    let far = work.path().join("far");
    std::fs::create_dir(&far).unwrap();
    let url = pg.url();
    let rank = |r: u32, run: &str, out: &str| {
        fleet_rank(&s, r)
            .args([
                "--queue", &url, "--run-id", run, "--unit", "1M", "--lease", "5s",
            ])
            .arg(format!("{}/", src.display()))
            .arg(format!("{HOST}:{}/{out}/", far.display()))
            .spawn()
            .unwrap()
    };
    // A rank killed (SIGKILL) while its far end serves it: ssh's channel
    // closes with it, and the far end is gone.
    let mut doomed = rank(1, "doomed", "doomed");
    let lines = lines_of(doomed.stderr.take().unwrap());
    let (pid, _) = wait_far_pid(&lines);
    assert!(!gone(pid), "the far end {pid} is running");
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    wait_gone(pid, "a queue rank's far end after the rank was killed");

    // Two ranks drain the queue, each through its own far end, which
    // admits the rank's sessions however many (`--sessions open`).
    let outs: Vec<Output> = [rank(0, "q", "out"), rank(1, "q", "out")]
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let (mut pids, mut results) = (Vec::new(), Vec::new());
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", text(o));
        let log = String::from_utf8_lossy(&o.stderr);
        assert_eq!(log.matches("is pid ").count(), 1, "rank {r}: {log}");
        assert!(!log.contains(SECRET_PREFIX), "rank {r}: {log}");
        pids.push(far_pid(&log).unwrap());
        if !o.stdout.is_empty() {
            results.push(serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap());
        }
    }
    assert_ne!(pids[0], pids[1], "each rank has its own far end");
    assert_eq!(results.len(), 1, "one rank prints the result: {results:?}");
    let j = &results[0];
    assert_eq!(j["mode"], "queue", "{j}");
    assert_eq!(j["verified"], true, "{j}");
    same_tree(&src, &far.join("out"));
    for i in 0..30 {
        let rel = format!("many/{}/f{i}", i % 4);
        assert_eq!(
            std::fs::read(src.join(&rel)).unwrap(),
            std::fs::read(far.join("out").join(&rel)).unwrap(),
            "{rel}"
        );
    }
    for p in pids {
        wait_gone(p, "a queue rank's far end");
    }
}

/// ssh's own words reach the user as ssh printed them (issue 41): a
/// refused key's "Permission denied" with the warning before it, a
/// changed host key's whole warning; each line whole and on its own,
/// none lost to a race with ssh's end, none run together by a `\n`.
#[test]
fn ssh_s_own_words_reach_the_user_whole() {
    let Some(s) = sshd() else { return };
    let d = s.dir.path();
    let conf = std::fs::read_to_string(&s.config).unwrap();
    for (key, more) in [("stranger_key", "-q"), ("other_host_key", "-q")] {
        let ok = Command::new("ssh-keygen")
            .args(["-t", "ed25519", "-N", "", more, "-f"])
            .arg(d.join(key))
            .status()
            .unwrap()
            .success();
        assert!(ok, "ssh-keygen {key}");
    }
    // A key the server does not know, its host key accepted as new.
    let refused = conf
        .replace("client_key", "stranger_key")
        .replace(
            "StrictHostKeyChecking yes",
            "StrictHostKeyChecking accept-new",
        )
        .replace("/known_hosts", "/fresh_known_hosts")
        .replace("LogLevel ERROR", "LogLevel INFO");
    // A host key that is not the one this side knows.
    let known = std::fs::read_to_string(d.join("known_hosts")).unwrap();
    let (at, _) = known.split_once(' ').unwrap();
    let other = std::fs::read_to_string(d.join("other_host_key.pub")).unwrap();
    std::fs::write(d.join("changed_known_hosts"), format!("{at} {other}")).unwrap();
    let changed = conf
        .replace("/known_hosts", "/changed_known_hosts")
        .replace("LogLevel ERROR", "LogLevel INFO");
    let f = d.join("f");
    std::fs::write(&f, b"x").unwrap();
    for (name, config, words) in [
        (
            "refused_config",
            refused,
            &["Permanently added", "Permission denied (publickey)"][..],
        ),
        (
            "changed_config",
            changed,
            &[
                "REMOTE HOST IDENTIFICATION HAS CHANGED",
                "Host key verification failed.",
            ][..],
        ),
    ] {
        std::fs::write(d.join(name), config).unwrap();
        let o = s
            .longhaul()
            .env("LONGHAUL_RSH", format!("ssh -F {}", d.join(name).display()))
            .args(["cp", "--remote-path", BIN])
            .arg(&f)
            .arg(format!("{HOST}:{}/", d.display()))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(3), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        for w in words {
            assert!(
                err.lines().any(|l| l.contains(w) && !l.contains("\\n")),
                "{w:?} not on a line of its own: {}",
                text(&o)
            );
        }
        assert!(!err.contains("\\n"), "{}", text(&o));
    }
}

/// Over ssh, paths read as the user wrote them after `HOST:`, in every
/// refusal and failure and in the archive (`where`): never the far end's
/// internal exports (`root/...`, `root:...`), its temporary port, or a
/// "server" the user never named.
#[test]
fn ssh_paths_read_as_the_user_wrote_them() {
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let w = work.path().display().to_string();
    let f = work.path().join("f1.dat");
    std::fs::write(&f, b"one\n").unwrap();
    let archive = work.path().join("archive.db");
    let run = |args: &[&str]| {
        s.longhaul()
            .env("LONGHAUL_ARCHIVE", &archive)
            .args(args)
            .output()
            .unwrap()
    };
    let internal = |t: &str| {
        t.contains("root/")
            || t.contains("root:")
            || t.contains("home/nosuch")
            || t.contains("server refused")
            || t.contains("127.0.0.1:")
    };
    // A destination directory that does not exist, a source that does not,
    // a listing of neither.
    let missing = format!("{w}/nosuch/");
    let cases: Vec<Vec<String>> = vec![
        vec![
            "cp".into(),
            f.display().to_string(),
            format!("{HOST}:{missing}"),
        ],
        vec!["cp".into(), format!("{HOST}:{w}/nosuch.dat"), w.clone()],
        vec!["ls".into(), format!("{HOST}:{missing}")],
        vec![
            "cp".into(),
            f.display().to_string(),
            format!("{HOST}:nosuch-{}/", std::process::id()),
        ],
    ];
    for c in &cases {
        let args: Vec<&str> = c.iter().map(String::as_str).collect();
        let o = run(&[&args[..1], &["--remote-path", BIN], &args[1..]].concat());
        assert_eq!(o.status.code(), Some(4), "{c:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!internal(&err), "{c:?}: {err}");
        assert!(err.contains(&format!("{HOST} refused")), "{c:?}: {err}");
        assert!(err.contains("nosuch"), "{c:?}: {err}");
    }
    // A destination the far end cannot write (a read-only file system,
    // which root cannot write either): the failure names the file as the
    // user wrote it, never the far end's partial file or its exports.
    if let Some(ro) = common::SmallDisk::mount(&work.path().join("ro"), 1024) {
        let o = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(ro.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let o = run(&[
            "cp",
            "--remote-path",
            BIN,
            f.to_str().unwrap(),
            &format!("{HOST}:{w}/ro/"),
        ]);
        assert!(!o.status.success(), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!internal(&err), "{err}");
        assert!(!err.contains("lhpart"), "{err}");
        assert!(err.contains(&format!("{w}/ro/")), "{err}");
    }
    // A copy that lands: the archive names it where the user put it.
    let o = run(&[
        "cp",
        "--remote-path",
        BIN,
        f.to_str().unwrap(),
        &format!("{HOST}:{w}/f2.dat"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["where", f.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&format!("{HOST}:{w}/f2.dat")), "{out}");
    assert!(!internal(&out), "{out}");
}

/// Issue 41 A2 over ssh: a push onto a destination that is a link to a
/// directory copies into that directory (a file, a tree, `ldir/`, a new
/// name through it) and replaces no link; a link to a file is refused by
/// name and stays. ssh mode names its paths from the far host's root.
#[test]
fn a_push_over_ssh_onto_a_link_to_a_directory_lands_in_it_and_replaces_no_link() {
    use std::os::unix::fs::symlink;
    let Some(s) = sshd() else { return };
    let work = tempfile::tempdir().unwrap();
    let far = work.path().join("far");
    std::fs::create_dir_all(far.join("incoming")).unwrap();
    symlink("incoming", far.join("ldir")).unwrap();
    std::fs::write(far.join("real.dat"), b"keep").unwrap();
    symlink("real.dat", far.join("lfile")).unwrap();
    let f = work.path().join("f.dat");
    std::fs::write(&f, pattern(61, 3000)).unwrap();
    let tree = work.path().join("tree");
    write_tree(&tree);
    let to = |dest: &str| format!("{HOST}:{}/{dest}", far.display());
    let push = |args: &[&str], dest: &str| {
        s.longhaul()
            .args(["cp", "--remote-path", BIN])
            .args(args)
            .arg(to(dest))
            .output()
            .unwrap()
    };
    let is_link_to = |p: &Path, to: &str| std::fs::read_link(p).is_ok_and(|l| l == Path::new(to));
    let f_s = f.to_str().unwrap();

    for (args, dest) in [
        (vec![f_s], "ldir"),
        (vec!["-r", tree.to_str().unwrap()], "ldir"),
        (vec![f_s], "ldir/"),
    ] {
        let o = push(&args, dest);
        assert!(o.status.success(), "{args:?} {dest}: {}", text(&o));
        assert!(
            is_link_to(&far.join("ldir"), "incoming"),
            "{args:?} {dest}: the link was replaced"
        );
    }
    assert_eq!(
        std::fs::read(far.join("incoming/f.dat")).unwrap(),
        std::fs::read(&f).unwrap()
    );
    same_tree(&tree, &far.join("incoming/tree"));
    let o = push(&[f_s], "ldir/g.dat");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read(far.join("incoming/g.dat")).unwrap(),
        std::fs::read(&f).unwrap()
    );
    assert!(is_link_to(&far.join("ldir"), "incoming"));

    // A link to a file is no directory: refused by name, never replaced.
    let o = push(&[f_s], "lfile");
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("lfile is a symbolic link to real.dat, not a directory"),
        "{err}"
    );
    assert!(is_link_to(&far.join("lfile"), "real.dat"));
    assert_eq!(std::fs::read(far.join("real.dat")).unwrap(), b"keep");
}
