//! Third-party copies (issue 29, part 2): `longhaul cp A:src B:dst` with
//! both ends remote. The data goes from A to B directly; the ordering
//! client carries only control, and its own traffic is measured twice: by
//! the kernel's counters of its sockets (its `--json`), and from outside,
//! by the bytes the process moved through read and write calls
//! (`/proc/PID/io`). The capability B grants is played against as an
//! attacker holding it would: outside its scope, after its lifetime, after
//! its revocation, for anything but a push.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_engine::net::dial::{ClientOptions, Security};
use longhaul_engine::net::tls::TrustOptions;
use longhaul_engine::server::{ServeConfig, Server, ServerHandle};
use longhaul_engine::xfer::copy::request_capability;
use longhaul_engine::xfer::storage::Local;
use longhaul_proto::session::Limits;
use longhaul_proto::xfer::copy::GrantRequest;

use crate::common;
use common::xfer::*;
use common::{assert_exit, bin, stderr, TempDir};

/// A server exporting `root` as `data`, taking part in third-party copies
/// or not.
fn server(root: &Path, state: &Path, copies: bool) -> ServerHandle {
    server_timing_out(root, state, copies, Limits::default().handshake_timeout)
}

/// [`server`] with a handshake time-out of `handshake`: a short one makes
/// its uniform failure for a target that is not longhaul come at twice
/// that. (Only a test that measures that time shortens it: on a loaded
/// machine a 2 s handshake fails a test that measures nothing.)
fn server_timing_out(root: &Path, state: &Path, copies: bool, handshake: Duration) -> ServerHandle {
    Server::bind(
        &[SocketAddr::from(([127, 0, 0, 1], 0))],
        ServeConfig {
            exports: vec![export("data", root, false)],
            storage: Arc::new(Local),
            sync_files: false,
            state_dir: common::prepare_state(state),
            third_party_copies: copies,
            limits: Limits {
                handshake_timeout: handshake,
                ..Limits::default()
            },
            ..ServeConfig::default()
        },
    )
    .expect("bind loopback")
    .spawn()
}

/// Bytes the process moved through read and write calls so far (files,
/// pipes and sockets alike).
fn io_chars(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let field = |name: &str| {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Some(field("rchar:")? + field("wchar:")?)
}

/// A client of the test's servers: their certificate pinned, the test grant's token.
pub(crate) fn client() -> ClientOptions {
    ClientOptions {
        security: Security {
            plaintext: false,
            trust: TrustOptions {
                pins: vec![common::fingerprint().to_string()],
                ..TrustOptions::default()
            },
            token: Some(common::TOKEN.to_string()),
            tokens: Vec::new(),
        },
        ..ClientOptions::default()
    }
}

#[test]
fn a_tree_goes_from_one_server_to_another_and_not_through_the_client() {
    let t = TempDir::new("3rd-copy");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    build_tree(&ra.join("tree"));
    let a = server(&ra, &t.dir("state-a"), true);
    let b = server(&rb, &t.dir("state-b"), true);
    let total: u64 = walkdir_bytes(&ra.join("tree"));
    assert!(total > 10 << 20, "{total}");

    let (src, dst) = (remote(a.addr(), "tree"), remote(b.addr(), ""));
    let mut child = bin()
        .args(["cp", "--json", "-r", "--verify"])
        .args(tokens_for(&[&src, &dst]))
        .arg(src)
        .arg(dst)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The most the client moved through its calls, sampled as it runs.
    let pid = child.id();
    let mut most = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        if let Some(n) = io_chars(pid) {
            most = most.max(n);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let o = child.wait_with_output().unwrap();
    assert_exit(&o, 0);
    let v = json_of(&o);
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["failed"].as_array().map(Vec::len), Some(0), "{v}");
    assert!(v["bytes"].as_u64().unwrap() >= total, "{v}");
    assert_same_tree(&ra.join("tree"), &rb.join("tree"), false);
    // What the client's own sockets carried, by the kernel's count:
    // TLS handshakes, the order, the grant and the relays.
    let control = v["third_party"]["control_bytes"].as_u64().unwrap();
    assert!(control > 0, "{v}");
    assert!(control < total / 50, "control {control} of {total}: {v}");
    // And from outside: the process never moved the data through a call.
    assert!(
        most < total / 10,
        "the client moved {most} of {total} bytes"
    );
    a.shutdown();
    b.shutdown();
}

/// What the source server's walk cannot send reaches the ordering
/// client as a failed entry, as a pull's does: a directory named without
/// `-r`, and with `-r` a special file beside files that land.
#[test]
fn a_third_party_copys_walk_failures_reach_the_client() {
    let t = TempDir::new("3rd-walk");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    write_random(&ra.join("tree/f"), 1000, 51);
    let fifo = ra.join("tree/pipe");
    let mode = rustix::fs::Mode::from_raw_mode(0o644);
    rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, mode).unwrap();
    let a = server(&ra, &t.dir("state-a"), true);
    let b = server(&rb, &t.dir("state-b"), true);
    let (src, dst) = (remote(a.addr(), "tree"), remote(b.addr(), ""));
    let copy = |recursive: bool| {
        bin()
            .args(["cp", "--json"])
            .args(recursive.then_some("-r"))
            .args(tokens_for(&[&src, &dst]))
            .args([&src, &dst])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let o = copy(false);
    assert_exit(&o, 6);
    let v = json_of(&o);
    assert_eq!(v["files"], 0, "{v}");
    assert_eq!(v["failed"][0]["path"], "tree", "{v}");
    assert_eq!(
        v["failed"][0]["error"], "data/tree is a directory: use -r to copy trees",
        "{v}"
    );
    assert_eq!(std::fs::read_dir(&rb).unwrap().count(), 0);
    let o = copy(true);
    assert_exit(&o, 6);
    let v = json_of(&o);
    assert_eq!(v["files"], 1, "{v}");
    assert_eq!(v["failed"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["failed"][0]["path"], "tree/pipe", "{v}");
    assert_same_file(&ra.join("tree/f"), &rb.join("tree/f"));
    a.shutdown();
    b.shutdown();
}

fn walkdir_bytes(root: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(root).unwrap().flatten() {
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        if m.is_dir() {
            n += walkdir_bytes(&e.path());
        } else if m.is_file() {
            n += m.len();
        }
    }
    n
}

/// `cp` with a capability as the client's token, to B.
fn push_with(capability: &str, src: &Path, dest: &str) -> std::process::Output {
    bin()
        .env("LONGHAUL_TOKEN", capability)
        .args(["cp", "--retries", "0"])
        .arg(src)
        .arg(dest)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn attacker_a_capability_outside_its_scope_or_lifetime_or_after_its_copy_is_refused() {
    let t = TempDir::new("3rd-cap");
    let rb = t.dir("b");
    std::fs::create_dir_all(rb.join("in")).unwrap();
    let b = server(&rb, &t.dir("state-b"), true);
    let file = t.path().join("x.bin");
    write_random(&file, 1000, 1);
    let target = b.addr().to_string();
    let ask = |lifetime_s| {
        request_capability(
            &target,
            &client(),
            GrantRequest {
                export: "data".into(),
                dest: "in".into(),
                dest_dir: true,
                lifetime_s,
                ..GrantRequest::default()
            },
        )
        .expect("a capability")
    };

    // Long enough that no load can end it within the checks of its scope.
    let held = ask(600);
    assert!(held.capability.starts_with("lh1c_"));
    assert_eq!(held.fingerprint, common::fingerprint());
    assert!(!format!("{held:?}").contains(&held.capability));
    // Within its scope it pushes.
    let o = push_with(&held.capability, &file, &format!("{}:data/in/", target));
    assert_exit(&o, 0);
    assert_same_file(&file, &rb.join("in/x.bin"));
    // Anywhere else it does not: another directory, the export's root,
    // beneath its destination, another export.
    for dest in ["data/", "data/other/", "data/in/deeper/", "nope/in/"] {
        let o = push_with(&held.capability, &file, &format!("{target}:{dest}"));
        assert_exit(&o, 4);
        assert!(stderr(&o).contains("capability"), "{dest}: {}", stderr(&o));
    }
    assert!(!rb.join("x.bin").exists() && !rb.join("other").exists());
    // It cannot read: no pull, no listing.
    let o = bin()
        .env("LONGHAUL_TOKEN", &held.capability)
        .args(["cp", "--retries", "0"])
        .arg(format!("{target}:data/in/x.bin"))
        .arg(t.path().join("pulled"))
        .output()
        .unwrap();
    assert_exit(&o, 4);
    assert!(!t.path().join("pulled").exists());
    let o = bin()
        .env("LONGHAUL_TOKEN", &held.capability)
        .args(["ls", &format!("{target}:data/")])
        .output()
        .unwrap();
    assert_exit(&o, 4);
    drop(held);
    // After its lifetime, refused (its holder's session still open). The
    // server (in this process) dated it before its answer came: one second
    // after the answer, it has ended.
    let short = ask(1);
    let ended = Instant::now() + Duration::from_secs(1);
    std::thread::sleep(ended.saturating_duration_since(Instant::now()));
    let o = push_with(&short.capability, &file, &format!("{target}:data/in/"));
    assert_exit(&o, 4);
    assert!(stderr(&o).contains("expired or revoked"), "{}", stderr(&o));
    drop(short);

    // Revoked as soon as the session that asked for it ends.
    let held = ask(600);
    let capability = held.capability.clone();
    held.release();
    let until = Instant::now() + Duration::from_secs(5);
    let mut o = push_with(&capability, &file, &format!("{target}:data/in/"));
    while o.status.code() == Some(0) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
        o = push_with(&capability, &file, &format!("{target}:data/in/"));
    }
    assert_exit(&o, 4);
    // A made-up one, of the right form, is refused the same way.
    let o = push_with(
        "lh1c_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        &file,
        &format!("{target}:data/in/"),
    );
    assert_exit(&o, 4);
    assert!(stderr(&o).contains("expired or revoked"), "{}", stderr(&o));
    b.shutdown();
}

#[test]
fn a_server_without_third_party_copies_refuses_either_role() {
    let t = TempDir::new("3rd-off");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    write_random(&ra.join("f.bin"), 1000, 1);
    let on = server(&ra, &t.dir("state-on"), true);
    let off = server(&rb, &t.dir("state-off"), false);
    for (src, dst) in [(&on, &off), (&off, &on)] {
        let (from, to) = (remote(src.addr(), "f.bin"), remote(dst.addr(), ""));
        let o = bin()
            .args(["cp", "--retries", "0"])
            .args(tokens_for(&[&from, &to]))
            .arg(from)
            .arg(to)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_exit(&o, 4);
        assert!(
            stderr(&o).contains("--third-party-copies"),
            "{}",
            stderr(&o)
        );
    }
    assert!(!rb.join("f.bin").exists());
    on.shutdown();
    off.shutdown();
}

#[test]
fn attacker_a_source_ordered_to_a_port_that_is_not_longhaul_says_one_thing_timed() {
    let t = TempDir::new("3rd-scan");
    let ra = t.dir("a");
    write_random(&ra.join("f.bin"), 1000, 1);
    let a = server_timing_out(&ra, &t.dir("state-a"), true, Duration::from_secs(2));
    let b = server_timing_out(&t.dir("b"), &t.dir("state-b"), true, Duration::from_secs(2));
    // The ordering client is honest with B but lies to A about where B
    // is: a closed port, and a listener that is not longhaul.
    let held = request_capability(
        &b.addr().to_string(),
        &client(),
        GrantRequest {
            export: "data".into(),
            dest: String::new(),
            dest_dir: true,
            lifetime_s: 60,
            ..GrantRequest::default()
        },
    )
    .unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = common::free_port();
    let mut messages = Vec::new();
    for target in [
        format!("127.0.0.1:{closed}"),
        silent.local_addr().unwrap().to_string(),
    ] {
        let named = target.clone();
        let started = Instant::now();
        let m = longhaul_engine::xfer::copy::order_copy(
            &a.addr().to_string(),
            &client(),
            longhaul_proto::xfer::copy::CopyOrder {
                export: "data".into(),
                sources: vec!["f.bin".into()],
                target,
                fingerprint: held.fingerprint.clone(),
                capability: held.capability.clone(),
                dest_export: "data".into(),
                dest: String::new(),
                dest_dir: true,
                options: Default::default(),
                connect_back: None,
                share: None,
            },
        )
        .expect_err("no copy");
        // One fixed time: connect and handshake time-outs (2 s each here).
        assert!(started.elapsed() >= Duration::from_millis(3500), "{m}");
        // The same words whatever the port, but for its own name.
        messages.push(m.to_string().replace(&named, "TARGET"));
    }
    assert_eq!(messages[0], messages[1]);
    assert!(messages[0].contains("no longhaul server completed the handshake"));
    // An order never lends A another credential (a token, a one-shot
    // secret) for B: refused before anything is dialled.
    for credential in [
        common::TOKEN,
        "lh1o_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    ] {
        let started = Instant::now();
        let e = longhaul_engine::xfer::copy::order_copy(
            &a.addr().to_string(),
            &client(),
            longhaul_proto::xfer::copy::CopyOrder {
                export: "data".into(),
                sources: vec!["f.bin".into()],
                target: b.addr().to_string(),
                fingerprint: held.fingerprint.clone(),
                capability: credential.into(),
                dest_export: "data".into(),
                dest: String::new(),
                dest_dir: true,
                options: Default::default(),
                connect_back: None,
                share: None,
            },
        )
        .expect_err("no copy");
        assert!(e.to_string().contains("never another credential"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(2), "{e}");
    }
    assert!(!t.dir("b").join("f.bin").exists());
    held.release();
    a.shutdown();
    b.shutdown();
}

/// `cp` between a host over ssh (its own one-shot far end) and a server,
/// the ordering client holding the server's token and trusting it.
fn over_ssh(s: &common::sshd::Sshd, args: &[String]) -> std::process::Output {
    s.longhaul()
        .env("LONGHAUL_TOKEN", common::TOKEN)
        .env("LONGHAUL_TRUST", common::fingerprint())
        .env("LONGHAUL_PATHS", common::paths_file())
        .env("LONGHAUL_ARCHIVE", common::archive_file())
        .args([
            "cp",
            "--json",
            "-r",
            "--verify",
            "--remote-path",
            common::sshd::BIN,
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_tree_goes_from_a_host_over_ssh_to_a_server_and_back() {
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("3rd-ssh");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    build_tree(&ra.join("tree"));
    let total = walkdir_bytes(&ra.join("tree"));
    let b = server(&rb, &t.dir("state-b"), true);
    let host = common::sshd::HOST;

    // ssh host -> server: the far end is the source.
    let o = over_ssh(
        &s,
        &[
            format!("{host}:{}", ra.join("tree").display()),
            remote(b.addr(), ""),
        ],
    );
    assert_exit(&o, 0);
    let v = json_of(&o);
    assert_eq!(v["verified"], true, "{v}");
    assert_same_tree(&ra.join("tree"), &rb.join("tree"), false);
    let control = v["third_party"]["control_bytes"].as_u64().unwrap();
    assert!(control < total / 50, "control {control} of {total}: {v}");

    // server -> ssh host: the far end is the destination, and grants.
    let back = t.dir("back");
    let o = over_ssh(
        &s,
        &[
            remote(b.addr(), "tree"),
            format!("{host}:{}/", back.display()),
        ],
    );
    assert_exit(&o, 0);
    let v = json_of(&o);
    assert_eq!(v["verified"], true, "{v}");
    assert_same_tree(&ra.join("tree"), &back.join("tree"), false);

    // ssh host -> ssh host (here the same one, reached twice: two far
    // ends, each with its own secret), as a sync that deletes.
    let mirror = t.dir("mirror");
    std::fs::write(mirror.join("stale"), b"x").unwrap();
    let o = s
        .longhaul()
        .args([
            "sync",
            "--json",
            "--delete",
            "--remote-path",
            common::sshd::BIN,
        ])
        .arg(format!("{host}:{}/", ra.join("tree").display()))
        .arg(format!("{host}:{}/", mirror.display()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_exit(&o, 0);
    let v = json_of(&o);
    assert_eq!(v["verified"], true, "{v}");
    assert!(
        v["third_party"]["control_bytes"].as_u64().unwrap() < total / 50,
        "{v}"
    );
    assert_same_tree(&ra.join("tree"), &mirror, false);
    b.shutdown();
}

/// The far end's PID in a client's `-v` log line (`... is pid N ...`).
fn far_pid(line: &str) -> Option<u32> {
    let at = line.find("is pid ")?;
    line[at + 7..].split_whitespace().next()?.parse().ok()
}

#[test]
fn an_interrupted_third_party_copy_resumes_and_moves_only_what_is_missing() {
    use std::io::{BufRead, BufReader};
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("3rd-resume");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let data: Vec<u8> = (0..48 << 20)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng as u8
        })
        .collect();
    std::fs::write(ra.join("big.bin"), &data).unwrap();
    let b = server(&rb, &t.dir("state-b"), true);
    let src = format!("{}:{}", common::sshd::HOST, ra.join("big.bin").display());
    let run = |extra: &[&str]| {
        let mut c = s.longhaul();
        c.env("LONGHAUL_TOKEN", common::TOKEN)
            .env("LONGHAUL_TRUST", common::fingerprint())
            .env("LONGHAUL_PATHS", common::paths_file())
            .env("LONGHAUL_ARCHIVE", common::archive_file())
            .args(extra)
            .args(["--chunk", "1M", "--remote-path", common::sshd::BIN])
            .arg(&src)
            .arg(remote(b.addr(), ""))
            .stdin(Stdio::null());
        c
    };
    // A slow first run, its source (the far end over ssh) killed mid-way.
    let mut c = run(&["-v", "cp", "--retries", "0", "--rate", "40M", "-P", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(c.stderr.take().unwrap());
    let mut seen = String::new();
    let pid = loop {
        let mut l = String::new();
        assert!(err.read_line(&mut l).unwrap() > 0, "no far end: {seen}");
        seen.push_str(&l);
        if let Some(p) = far_pid(&l) {
            break p;
        }
    };
    let drain = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });
    let journal = rb.join(".big.bin.lhjournal");
    common::wait_until("six chunks journaled", Duration::from_secs(60), || {
        journal_records(&journal) >= 6
    });
    // SAFETY: kill(2) takes any pid; this one is the far end our own
    // sshd started for this test.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let status = c.wait().unwrap();
    let rest = drain.join().unwrap();
    assert!(
        !status.success(),
        "the copy cannot have completed: {seen}{rest}"
    );
    assert!(!rb.join("big.bin").exists(), "a partial file landed");

    // Run again: only the missing chunks move, and the result is verified.
    let o = run(&["cp", "--json", "--verify"]).output().unwrap();
    assert_exit(&o, 0);
    let v = json_of(&o);
    assert_eq!(v["verified"], true, "{v}");
    let (resumed, sent) = (
        v["resumed_bytes"].as_u64().unwrap(),
        v["sent_bytes"].as_u64().unwrap(),
    );
    assert!(resumed > 0, "nothing resumed: {v}");
    assert_eq!(resumed + sent, data.len() as u64, "{v}");
    assert!(
        std::fs::read(rb.join("big.bin")).unwrap() == data,
        "the copy differs from its source"
    );
    assert!(!journal.exists(), "the journal outlived the copy");
    b.shutdown();
}

#[test]
fn the_archive_catalogues_a_third_party_copys_files_as_any_copys() {
    let t = TempDir::new("3rd-catalogue");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    std::fs::create_dir_all(ra.join("tree/sub")).unwrap();
    std::fs::write(ra.join("tree/one"), b"first file").unwrap();
    std::fs::write(ra.join("tree/sub/two"), vec![7u8; 100_000]).unwrap();
    let a = server(&ra, &t.dir("state-a"), true);
    let b = server(&rb, &t.dir("state-b"), true);
    let archive = t.path().join("archive.db");
    let (src, dst) = (remote(a.addr(), "tree"), remote(b.addr(), ""));
    let mut args = vec!["cp".to_string(), "-r".into(), "--json".into()];
    args.extend(tokens_for(&[&src, &dst]));
    args.extend([src, dst]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = with_archive(&archive, &args);
    assert_exit(&o, 0);
    let show = json_ok(&archive, &["show", "last", "--json", "--all-files"]);
    let files = show["files"].as_array().unwrap();
    assert_eq!(files.len(), 2, "{show}");
    let two = files
        .iter()
        .find(|f| f["path"] == "tree/sub/two")
        .unwrap_or_else(|| panic!("{show}"));
    assert_eq!(two["source"], remote(a.addr(), "tree/sub/two"), "{show}");
    assert_eq!(two["dest"], remote(b.addr(), "tree/sub/two"), "{show}");
    assert_eq!(two["size"], 100_000, "{show}");
    a.shutdown();
    b.shutdown();
}

/// `cp` as rank `rank` of `ranks` of a fleet of third-party copies
/// (static shares in `run_dir`), run to its end.
fn tp_rank(rank: u32, ranks: u32, run_dir: &Path, src: &str, dest: &str) -> std::process::Output {
    tp_rank_started(rank, ranks, run_dir, src, dest)
        .wait_with_output()
        .unwrap()
}

fn tp_rank_started(
    rank: u32,
    ranks: u32,
    run_dir: &Path,
    src: &str,
    dest: &str,
) -> std::process::Child {
    bin()
        .args(["cp", "-r", "--json", "--chunk", "1M", "--retries", "0"])
        .args(["--rank", &rank.to_string(), "--ranks", &ranks.to_string()])
        .args(["--fleet-wait", "60s", "--run-dir"])
        .arg(run_dir)
        .args(tokens_for(&[src, dest]))
        .args([src, dest])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A small tree with a file large enough to be cut in parts between two
/// ranks, small files, an empty file, an empty directory and a link.
fn fleet_tree(root: &Path) -> u64 {
    write_random(&root.join("big.bin"), (6 << 20) + 4321, 3);
    for i in 0..24u64 {
        let d = root.join(format!("small/{:02}", i % 5));
        write_random(&d.join(format!("f{i}")), 1 + (i as usize * 7919) % 9000, i);
    }
    std::fs::write(root.join("empty"), b"").unwrap();
    std::fs::create_dir_all(root.join("empty dir")).unwrap();
    std::os::unix::fs::symlink("big.bin", root.join("link")).unwrap();
    walkdir_bytes(root)
}

#[track_caller]
fn no_leftovers(root: &Path) {
    for name in snapshot(root).keys() {
        let last = name.rsplit('/').next().unwrap_or("");
        assert!(
            !(last.ends_with(".lhpart")
                || last.ends_with(".lhjournal")
                || last.ends_with(".lhdone")),
            "left over: {name}"
        );
    }
}

#[test]
fn a_fleet_of_two_ranks_copies_a_tree_from_one_server_to_another_in_shares() {
    let t = TempDir::new("3rd-fleet");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    let total = fleet_tree(&ra.join("tree"));
    let a = server(&ra, &t.dir("state-a"), true);
    let b = server(&rb, &t.dir("state-b"), true);
    let run_dir = t.path().join("run");
    let (src, dest) = (remote(a.addr(), "tree"), remote(b.addr(), ""));
    for round in 0..2 {
        let ranks: Vec<_> = (0..2)
            .map(|r| tp_rank_started(r, 2, &run_dir, &src, &dest))
            .collect();
        let outs: Vec<_> = ranks
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        for o in &outs {
            assert_exit(o, 0);
        }
        let v = json_of(&outs[0]);
        assert_eq!(v["verified"], true, "{v}");
        assert_eq!(v["mode"], "static", "{v}");
        assert_eq!(v["failed"].as_array().map(Vec::len), Some(0), "{v}");
        let per_rank = v["per_rank"].as_array().unwrap();
        assert_eq!(per_rank.len(), 2, "{v}");
        if round == 0 {
            // Each rank carried its share (the big file's parts split
            // between them), through its own orders: only control crossed
            // its sockets.
            for r in per_rank {
                let bytes = r["bytes"].as_u64().unwrap();
                assert!(bytes > 1 << 20, "{r}");
                let control = r["control_bytes"].as_u64().unwrap();
                assert!(
                    control > 0 && control < total / 20,
                    "control {control} of {total}: {r}"
                );
            }
            let carried: u64 = per_rank.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
            assert_eq!(carried, total, "each byte once: {v}");
            assert_eq!(v["final_check"]["resent_files"], 0, "{v}");
        } else {
            // Run again over the finished tree: no rank carries a byte, the
            // final check finds nothing missing, and it says so. (Rank 0
            // once took rank 1's result of the first run for this one's,
            // when rank 1 had not written its own yet: a whole share
            // "resent".)
            for r in per_rank {
                assert_eq!(r["bytes"], 0, "rank {} carried bytes again: {v}", r["rank"]);
            }
            assert_eq!(v["final_check"]["resent_files"], 0, "{v}");
            assert_eq!(v["up_to_date"], true, "{v}");
        }
        assert_same_tree(&ra.join("tree"), &rb.join("tree"), false);
        no_leftovers(&rb);
    }
    a.shutdown();
    b.shutdown();
}

/// A run directory of this user's alone, holding `m` as its manifest.
fn planted_run_dir(
    t: &TempDir,
    name: &str,
    m: &longhaul_fleet::manifest::Manifest,
) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let run_dir = t.path().join(name);
    std::fs::create_dir(&run_dir).unwrap();
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(run_dir.join("manifest.jsonl"), m.encode()).unwrap();
    run_dir
}

#[test]
fn attacker_a_planted_entry_outside_a_third_party_fleets_sources_is_refused_and_never_lands() {
    use longhaul_fleet::manifest::{Entry, Manifest};
    use longhaul_proto::xfer::Kind;
    let t = TempDir::new("3rd-fleet-planted");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    write_random(&ra.join("tree/mine"), 100, 1);
    let secret = b"not for B".to_vec();
    std::fs::create_dir_all(ra.join("other")).unwrap();
    std::fs::write(ra.join("other/shadow"), &secret).unwrap();
    let outside = t.dir("outside");
    std::fs::write(outside.join("shadow"), &secret).unwrap();
    // Links in the source's tree: out of the export, and out of the
    // sources into the export.
    std::os::unix::fs::symlink(&outside, ra.join("tree/esc")).unwrap();
    std::os::unix::fs::symlink("../other", ra.join("tree/side")).unwrap();
    let a = server(&ra, &t.dir("state-a"), true);
    let b = server(&rb, &t.dir("state-b"), true);
    let (src, dest) = (remote(a.addr(), "tree"), remote(b.addr(), ""));
    let entry = |rel: &str, path: &str| Entry {
        rel: rel.into(),
        path: path.into(),
        kind: Kind::File,
        size: secret.len() as u64,
        mtime_ns: 0,
        chunk_size: 1 << 20,
    };
    let forgeries = [
        // Named beneath the sources, read elsewhere in the export: the
        // rank refuses it by name.
        (
            entry("tree/shadow", "other/shadow"),
            "refusing the manifest's entry",
        ),
        (
            entry("tree/../other/shadow", "other/shadow"),
            "refusing the manifest's entry",
        ),
        // Beneath the sources by name, through a link out of them: the
        // source server refuses the order.
        (entry("tree/esc/shadow", "tree/esc/shadow"), "share item"),
        (entry("tree/side/shadow", "tree/side/shadow"), "share item"),
    ];
    for (i, (e, says)) in forgeries.into_iter().enumerate() {
        let rel = e.rel.clone();
        let mut m = Manifest {
            sources: vec![src.clone()],
            entries: vec![
                Entry {
                    rel: "tree".into(),
                    path: "tree".into(),
                    kind: Kind::Dir,
                    size: 0,
                    mtime_ns: 0,
                    chunk_size: 0,
                },
                e,
            ],
        };
        m.entries
            .sort_by(|a, b| a.rel.as_bytes().cmp(b.rel.as_bytes()));
        let run_dir = planted_run_dir(&t, &format!("run{i}"), &m);
        let o = tp_rank(0, 1, &run_dir, &src, &dest);
        assert!(!o.status.success(), "{rel}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{rel}: {}", stderr(&o));
        for name in snapshot(&rb).keys() {
            assert!(!name.contains("shadow"), "{rel}: {name} landed");
        }
    }
    a.shutdown();
    b.shutdown();
}

#[test]
fn attacker_an_order_whose_share_leaves_its_sources_is_refused_by_the_source() {
    use longhaul_proto::xfer::copy::{CopyOptions, CopyOrder, CopyShareItem};
    let t = TempDir::new("3rd-share");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    write_random(&ra.join("tree/a.txt"), 100, 1);
    write_random(&ra.join("tree/b.txt"), 100, 2);
    std::fs::create_dir_all(ra.join("other")).unwrap();
    std::fs::write(ra.join("other/shadow"), b"secret").unwrap();
    let outside = t.dir("outside");
    std::fs::write(outside.join("shadow"), b"secret").unwrap();
    std::os::unix::fs::symlink(&outside, ra.join("tree/esc")).unwrap();
    std::os::unix::fs::symlink("../other", ra.join("tree/side")).unwrap();
    let a = server(&ra, &t.dir("state-a"), true);
    let b = server(&rb, &t.dir("state-b"), true);
    let held = request_capability(
        &b.addr().to_string(),
        &client(),
        GrantRequest {
            export: "data".into(),
            dest: String::new(),
            dest_dir: true,
            lifetime_s: 60,
            ..GrantRequest::default()
        },
    )
    .unwrap();
    let item = |source: u32, rel: &str| CopyShareItem {
        source,
        rel: rel.into(),
        chunk_size: 1 << 20,
        part: None,
    };
    let order = |share: Vec<CopyShareItem>| CopyOrder {
        export: "data".into(),
        sources: vec!["tree".into()],
        target: b.addr().to_string(),
        fingerprint: held.fingerprint.clone(),
        capability: held.capability.clone(),
        dest_export: "data".into(),
        dest: String::new(),
        dest_dir: true,
        options: CopyOptions {
            recursive: true,
            mkpath: true,
            ..Default::default()
        },
        connect_back: None,
        share: Some(share),
    };
    let host = a.addr().to_string();
    for (bad, says) in [
        (item(0, "../other/shadow"), "'..'"),
        (item(0, "/etc/shadow"), "absolute"),
        (item(0, "esc/shadow"), "symbolic link"),
        (item(0, "side/shadow"), "symbolic link"),
        (item(0, "esc/no/such"), "symbolic link"),
        (item(0, "./a.txt"), "form"),
        (item(3, "a.txt"), "no such source"),
    ] {
        let rel = bad.rel.clone();
        let e = longhaul_engine::xfer::copy::order_copy(
            &host,
            &client(),
            order(vec![item(0, ""), item(0, "a.txt"), bad]),
        )
        .expect_err("refused");
        let m = e.to_string();
        assert!(m.contains("share item 2") && m.contains(says), "{rel}: {m}");
        assert!(!m.contains(&*outside.to_string_lossy()), "{m}");
        assert!(!rb.join("tree").exists(), "{rel}: nothing landed");
    }
    // A true share moves what it names and nothing else; an entry gone
    // since the manifest is reported missing, not refused.
    let r = longhaul_engine::xfer::copy::order_copy(
        &host,
        &client(),
        order(vec![item(0, ""), item(0, "a.txt"), item(0, "gone/x")]),
    )
    .unwrap();
    assert_eq!(r.failed.len(), 1, "{r:?}");
    assert!(r.failed[0].path.contains("gone/x"), "{r:?}");
    assert_same_file(&ra.join("tree/a.txt"), &rb.join("tree/a.txt"));
    assert!(!rb.join("tree/b.txt").exists());
    held.release();
    a.shutdown();
    b.shutdown();
}

/// The manifest of remote sources names every entry as the source's own
/// walk names it (what a push from it announces), with the same kind,
/// size, time and chunk size: the listing and the walk agree.
#[test]
fn a_remote_manifest_names_entries_as_the_sources_walk_does() {
    use longhaul_fleet::manifest::Manifest;
    let t = TempDir::new("3rd-fleet-names");
    let ra = t.dir("a");
    fleet_tree(&ra.join("tree"));
    std::fs::write(ra.join("tree/sp ace é;'x"), b"odd").unwrap();
    write_random(&ra.join("tree/deep/er/f"), 3 << 20, 9);
    // A directory holding one file of its own name, and a lone file.
    write_random(&ra.join("same/same"), 10, 2);
    write_random(&ra.join("lone.bin"), 5 << 20, 4);
    let a = server(&ra, &t.dir("state-a"), true);
    let key = |m: &Manifest| -> Vec<(String, Kind, u64, i64, u64)> {
        m.entries
            .iter()
            .map(|e| {
                // A directory source's own time is not in its listing.
                let root = !e.rel.contains('/') && e.kind == Kind::Dir;
                (
                    e.rel.clone(),
                    e.kind,
                    e.size,
                    if root { 0 } else { e.mtime_ns },
                    e.chunk_size,
                )
            })
            .collect()
    };
    use longhaul_proto::xfer::Kind;
    for (paths, chunk) in [
        (vec!["tree"], None),
        (vec!["tree/", "same/"], Some(1 << 20)),
        (vec!["same", "lone.bin", "tree/link"], None),
    ] {
        let local: Vec<String> = paths
            .iter()
            .map(|p| format!("{}/{p}", ra.display()))
            .collect();
        let far: Vec<_> = paths
            .iter()
            .map(|p| longhaul_engine::reach::End::read_server(&remote(a.addr(), p)))
            .collect();
        let walked = Manifest::walk(&local, true, chunk).unwrap();
        let listed = Manifest::remote(&far, true, chunk, &client()).unwrap();
        assert_eq!(key(&listed), key(&walked), "{paths:?}");
        for e in &listed.entries {
            assert!(
                ra.join(&e.path).symlink_metadata().is_ok(),
                "{}",
                e.path.display()
            );
        }
    }
    a.shutdown();
}

/// What a fleet of third-party copies does not take is refused before
/// anything starts, saying what works instead.
#[test]
fn a_third_party_fleet_over_ssh_is_refused_saying_what_works() {
    let t = TempDir::new("3rd-fleet-refused");
    let run_dir = t.path().join("run");
    for (args, says) in [
        (
            vec![
                "--run-dir",
                run_dir.to_str().unwrap(),
                "far:data/x",
                "127.0.0.1:8:data/",
            ],
            "names servers",
        ),
        (
            vec![
                "--run-dir",
                run_dir.to_str().unwrap(),
                "127.0.0.1:9:data/x",
                "far:data/",
            ],
            "pushes to a server",
        ),
    ] {
        let o = bin()
            .args(["cp", "-r", "--rank", "0", "--ranks", "1"])
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_exit(&o, 2);
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    assert!(!run_dir.exists());
}

/// Ctrl-C during a third-party copy ends it as the user's stop: exit 130
/// (as any interrupted copy), blaming neither server (issue 41).
#[test]
fn ctrl_c_during_a_third_party_copy_exits_130_blaming_no_end() {
    let t = TempDir::new("3rd-ctrl-c");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    write_random(&ra.join("big.bin"), 24 << 20, 7);
    let a = server(&ra, &t.dir("state-a"), true);
    let b = server(&rb, &t.dir("state-b"), true);
    // A slow copy (2 MiB/s): stopped long before it could finish.
    let (src, dst) = (remote(a.addr(), "big.bin"), remote(b.addr(), ""));
    let child = bin()
        .args(["cp", "--bwlimit", "2M", "--chunk", "1M"])
        .args(tokens_for(&[&src, &dst]))
        .arg(src)
        .arg(dst)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let journal = rb.join(".big.bin.lhjournal");
    let until = Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(&journal).map_or(true, |m| m.len() < 64) {
        assert!(Instant::now() < until, "the copy never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) takes any pid; this one is our own child's.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    a.shutdown();
    b.shutdown();
    assert_exit(&o, 130);
    let err = stderr(&o);
    assert!(err.contains("interrupted"), "{err}");
    assert!(
        !err.contains("the source") && !err.contains("the destination"),
        "{err}"
    );
    assert!(!rb.join("big.bin").exists(), "a partial file landed");
}
