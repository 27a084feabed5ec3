//! iperf3 interop against Debian's real iperf3 (issue 31): `longhaul perf
//! --iperf3` against `iperf3 -s`, and `iperf3 -c` against `longhaul serve
//! --iperf3`, forward, reverse, bidirectional, several streams; several
//! clients at once and the one past the limit told iperf3's busy error;
//! and clients that play the attacker (a huge JSON length, a bad cookie,
//! an early close, silence, a test over the time cap).
//!
//! Rates are compared within 10 % between the two ends' counts of the
//! same test, never between two runs. Needs iperf3 (`LONGHAUL_REQUIRE_IPERF3`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;
use common::require::{have, program};
use common::{bin, free_port, stderr, stdout, TempDir};

fn iperf3_here() -> bool {
    have("IPERF3", program("iperf3", "iperf3"))
}

/// Kills a child (by its PID, through its handle) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// Waits for the child's end up to `within`; its output.
    fn finish(mut self, within: Duration) -> Output {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if let Ok(Some(_)) = self.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let mut out = Vec::new();
        let mut err = Vec::new();
        if let Some(mut o) = self.0.stdout.take() {
            let _ = o.read_to_end(&mut out);
        }
        if let Some(mut e) = self.0.stderr.take() {
            let _ = e.read_to_end(&mut err);
        }
        let status = self.0.wait().expect("wait");
        Output {
            status,
            stdout: out,
            stderr: err,
        }
    }
}

fn wait_port(port: u16) {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on 127.0.0.1:{port} after 10 s");
}

/// `iperf3 -s` for one test on loopback, JSON on stdout.
fn iperf3_server() -> (Proc, u16) {
    let port = free_port();
    let child = Command::new("iperf3")
        .args(["-s", "-1", "-J", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start iperf3 -s");
    // iperf3 -s -1 ends after one connection: wait for its socket without
    // connecting to it.
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let ss = Command::new("ss")
            .args(["-Hltn", &format!("sport = :{port}")])
            .output();
        match ss {
            Ok(o) if !o.stdout.is_empty() => break,
            Ok(_) => std::thread::sleep(Duration::from_millis(20)),
            // No ss: give it time.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(500));
                break;
            }
        }
    }
    (Proc(child), port)
}

/// `longhaul serve --iperf3` on loopback with `extra` options.
fn longhaul_server(dir: &TempDir, extra: &[&str]) -> (Proc, u16) {
    let port = free_port();
    let child = bin()
        .arg("--archive")
        .arg(dir.path().join("served.db"))
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir.path())
        .args(["--iperf3", &format!("127.0.0.1:{port}")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start longhaul serve");
    wait_port(port);
    (Proc(child), port)
}

fn iperf3_client(port: u16, args: &[&str]) -> Proc {
    Proc(
        Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port.to_string(), "-J"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start iperf3 -c"),
    )
}

fn json(o: &Output, what: &str) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{what}: no JSON ({e}): {}\n{}", stdout(o), stderr(o)))
}

fn close(a: f64, b: f64, what: &str) {
    assert!(a > 0.0 && b > 0.0, "{what}: {a} vs {b}");
    let off = (a - b).abs() / a.max(b);
    eprintln!(
        "{what}: {a:.4e} vs {b:.4e} bit/s ({:.2} % apart)",
        off * 100.0
    );
    assert!(
        off <= 0.10,
        "{what}: {a:.4e} and {b:.4e} bit/s differ by {:.1} %",
        off * 100.0
    );
}

/// The longhaul summary's direction `d` (`up`/`down`).
fn direction<'a>(summary: &'a Value, d: &str) -> &'a Value {
    summary["directions"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["direction"] == d))
        .unwrap_or_else(|| panic!("no direction {d} in {summary}"))
}

/// This end's own count of direction `d`: the sum of its intervals.
fn local_rate(doc: &Value, d: &str) -> f64 {
    let mut bytes = 0.0;
    let mut secs = 0.0;
    for i in doc["intervals"].as_array().expect("intervals") {
        let x = direction(i, d);
        bytes += x["bytes"].as_f64().expect("bytes");
        secs = i["end_s"].as_f64().expect("end_s");
    }
    bytes * 8.0 / secs
}

#[test]
fn longhaul_perf_against_iperf3_server() {
    if !iperf3_here() {
        return;
    }
    for (args, dirs) in [
        (&["-P", "2"][..], &["up"][..]),
        (&["-R"][..], &["down"][..]),
        (&["--bidir", "-P", "2"][..], &["up", "down"][..]),
    ] {
        let (server, port) = iperf3_server();
        let o = bin()
            .args([
                "perf",
                "--iperf3",
                &format!("127.0.0.1:{port}"),
                "-t",
                "1",
                "--json",
            ])
            .args(args)
            .output()
            .expect("run longhaul");
        let theirs = json(&server.finish(Duration::from_secs(10)), "iperf3 -s");
        assert!(
            o.status.success(),
            "{args:?}: {}\n{}",
            stdout(&o),
            stderr(&o)
        );
        let doc = json(&o, "longhaul perf --json");
        let s = &doc["summary"];
        assert_eq!(doc["start"]["server_software"], "iperf3");
        let end = &theirs["end"];
        for &d in dirs {
            // iperf3 -s's own count, from its point of view: the client's
            // up is what it received; down what it sent (in a
            // bidirectional test under `sum_sent_bidir_reverse`).
            let key = match (d, dirs.len()) {
                ("up", _) => "sum_received",
                (_, 1) => "sum_sent",
                _ => "sum_sent_bidir_reverse",
            };
            let theirs_rate = end[key]["bits_per_second"].as_f64().unwrap_or(0.0);
            let ours = local_rate(&doc, d);
            close(
                ours,
                theirs_rate,
                &format!("perf --iperf3 {args:?} {d}: this end vs iperf3 -s"),
            );
            assert!(direction(s, d)["bits_per_second"].as_f64().unwrap_or(0.0) > 0.0);
        }
        let notes = s["warnings"].to_string();
        assert!(notes.contains("by its own count"), "{notes}");
        // Archived like any perf run.
        let h = bin().args(["history", "--json"]).output().expect("history");
        let h = json(&h, "history --json");
        let target = format!("127.0.0.1:{port}");
        let run = h["runs"]
            .as_array()
            .and_then(|r| r.iter().find(|x| x["remote_host"] == target.as_str()))
            .unwrap_or_else(|| panic!("no archived run against {target}: {h}"));
        assert_eq!(run["kind"], "perf");
        assert_eq!(run["status"], "ok");
        assert!(
            run["bits_per_second"].as_f64().unwrap_or(0.0) > 0.0,
            "{run}"
        );
    }
}

#[test]
fn iperf3_clients_against_longhaul_serve() {
    if !iperf3_here() {
        return;
    }
    let dir = TempDir::new("iperf3-serve");
    let (server, port) = longhaul_server(&dir, &[]);
    for args in [&["-P", "2"][..], &["-R"][..], &["--bidir"][..]] {
        let mut a = vec!["-t", "1"];
        a.extend_from_slice(args);
        let o = iperf3_client(port, &a).finish(Duration::from_secs(20));
        assert!(
            o.status.success(),
            "iperf3 -c {args:?}: {}\n{}",
            stdout(&o),
            stderr(&o)
        );
        let j = json(&o, "iperf3 -c");
        let end = &j["end"];
        // sum_sent is the sender's count, sum_received the receiver's: one
        // of them is longhaul's, sent back in the results exchange.
        let r = |k: &str| end[k]["bits_per_second"].as_f64().unwrap_or(0.0);
        close(
            r("sum_sent"),
            r("sum_received"),
            &format!("iperf3 -c {args:?}"),
        );
        if args == ["--bidir"] {
            close(
                r("sum_sent_bidir_reverse"),
                r("sum_received_bidir_reverse"),
                "iperf3 -c --bidir, reverse half",
            );
        }
    }
    // Each test is recorded like any served test.
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let h = bin()
            .arg("--archive")
            .arg(dir.path().join("served.db"))
            .args(["history", "--json"])
            .output()
            .expect("history");
        let h = json(&h, "history --json");
        let ok = h["runs"].as_array().map_or(0, |r| {
            r.iter()
                .filter(|x| x["kind"] == "served" && x["status"] == "ok")
                .count()
        });
        if ok >= 3 {
            break;
        }
        assert!(
            Instant::now() < end,
            "3 served iperf3 tests not archived: {h}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(server);
}

#[test]
fn two_iperf3_clients_at_once_and_the_third_is_busy() {
    if !iperf3_here() {
        return;
    }
    let dir = TempDir::new("iperf3-busy");
    let (server, port) = longhaul_server(&dir, &["--iperf3-max-tests", "2"]);
    let a = iperf3_client(port, &["-t", "2", "-b", "200M"]);
    let b = iperf3_client(port, &["-t", "2", "-b", "200M", "-R"]);
    std::thread::sleep(Duration::from_millis(600));
    let c = iperf3_client(port, &["-t", "1"]).finish(Duration::from_secs(10));
    let text = format!("{}{}", stdout(&c), stderr(&c));
    // iperf3 -J exits 0 even so; its JSON carries the error.
    assert!(text.contains("the server is busy running a test"), "{text}");
    // longhaul's own client gets the same answer, as a refusal.
    let l = bin()
        .args([
            "--no-archive",
            "perf",
            "--iperf3",
            &format!("127.0.0.1:{port}"),
            "-t",
            "1",
        ])
        .output()
        .expect("run longhaul");
    assert_eq!(l.status.code(), Some(4), "{}", stderr(&l));
    assert!(stderr(&l).contains("busy"), "{}", stderr(&l));
    for (p, what) in [(a, "first"), (b, "second")] {
        let o = p.finish(Duration::from_secs(20));
        assert!(
            o.status.success(),
            "{what} client: {}\n{}",
            stdout(&o),
            stderr(&o)
        );
        let j = json(&o, what);
        let r = |k: &str| j["end"][k]["bits_per_second"].as_f64().unwrap_or(0.0);
        close(
            r("sum_sent"),
            r("sum_received"),
            &format!("{what} of two at once"),
        );
    }
    // Both slots are free again: longhaul perf --iperf3 against longhaul.
    let l = bin()
        .args([
            "--no-archive",
            "perf",
            "--iperf3",
            &format!("127.0.0.1:{port}"),
            "-t",
            "1",
            "--json",
        ])
        .output()
        .expect("run longhaul");
    assert!(l.status.success(), "{}", stderr(&l));
    drop(server);
}

/// Reads until EOF or `within`; what came.
fn read_all(s: &mut TcpStream, within: Duration) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(within)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 256];
    let end = Instant::now() + within;
    while Instant::now() < end {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (out, true),
            Err(_) => break,
        }
    }
    (out, false)
}

fn cookie() -> Vec<u8> {
    let mut c = b"abcdefghijklmnopqrstuvwxyz234567abcd".to_vec();
    c.push(0);
    c
}

#[test]
fn hostile_iperf3_clients_are_refused_without_a_hang() {
    if !iperf3_here() {
        return;
    }
    let dir = TempDir::new("iperf3-attack");
    let (server, port) = longhaul_server(
        &dir,
        &["--iperf3-max-time", "5s", "--handshake-timeout", "1s"],
    );
    let connect = || TcpStream::connect(("127.0.0.1", port)).expect("connect");

    // A huge JSON length: refused at once (SERVER_ERROR), nothing buffered.
    let mut s = connect();
    s.write_all(&cookie()).unwrap();
    s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    let (got, closed) = read_all(&mut s, Duration::from_secs(5));
    assert!(closed, "not closed after a 4 GiB length: {got:?}");
    assert_eq!(got.first(), Some(&9), "PARAM_EXCHANGE first: {got:?}");
    assert_eq!(got.get(1), Some(&0xfe), "then SERVER_ERROR: {got:?}");

    // A bad cookie: ACCESS_DENIED and closed.
    let mut s = connect();
    s.write_all(&[b'A'; 37]).unwrap();
    let (got, closed) = read_all(&mut s, Duration::from_secs(5));
    assert!(
        closed && got == [0xff],
        "bad cookie: {got:?} closed {closed}"
    );

    // Garbage JSON: refused.
    let mut s = connect();
    s.write_all(&cookie()).unwrap();
    s.write_all(&[0, 0, 0, 3, b'{', b'x', b'}']).unwrap();
    let (got, closed) = read_all(&mut s, Duration::from_secs(5));
    assert!(closed && got.get(1) == Some(&0xfe), "bad JSON: {got:?}");

    // An early close, and silence: the server lets go (1 s handshake).
    let mut s = connect();
    s.write_all(&cookie()[..10]).unwrap();
    drop(s);
    let mut s = connect();
    let t = Instant::now();
    let (_, closed) = read_all(&mut s, Duration::from_secs(5));
    assert!(closed, "a silent connection was kept");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "held {:?}",
        t.elapsed()
    );
    let mut s = connect();
    s.write_all(&cookie()).unwrap();
    let (got, closed) = read_all(&mut s, Duration::from_secs(5));
    // PARAM_EXCHANGE, then SERVER_TERMINATE when no parameters came in time.
    assert!(closed && got == [9, 11], "silent after the cookie: {got:?}");

    // Over the time cap: iperf3's own error, at once.
    let o = iperf3_client(port, &["-t", "100"]).finish(Duration::from_secs(10));
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert!(text.contains("test duration too long"), "{text}");
    // UDP is refused the same way, clearly.
    let o = iperf3_client(port, &["-u", "-t", "1"]).finish(Duration::from_secs(10));
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert!(text.contains("not implemented"), "{text}");

    // After all that, a real test still runs.
    let o = iperf3_client(port, &["-t", "1"]).finish(Duration::from_secs(20));
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    drop(server);
}
