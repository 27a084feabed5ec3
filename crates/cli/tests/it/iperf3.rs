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
use std::net::{TcpStream, UdpSocket};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;
use common::require::{have, program};
use common::{bin, free_port, stderr, stdout, TempDir};

fn iperf3_here() -> bool {
    have("IPERF3", program("iperf3", "iperf3"))
}

/// A child, killed (by its PID) and reaped when dropped.
struct Proc(common::Owned);

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
    (Proc(common::Owned::new(child)), port)
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
    (Proc(common::Owned::new(child)), port)
}

fn iperf3_client(port: u16, args: &[&str]) -> Proc {
    Proc(common::Owned::new(
        Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port.to_string(), "-J"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start iperf3 -c"),
    ))
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

/// Runs alone (`_timed`): each end's rate over its own time span must agree
/// within 10 %, which CPU contention from a test beside it can break.
#[test]
fn longhaul_perf_against_iperf3_server_timed() {
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
fn two_iperf3_clients_at_once_and_the_third_is_busy_timed() {
    if !iperf3_here() {
        return;
    }
    let dir = TempDir::new("iperf3-busy");
    let (server, port) = longhaul_server(&dir, &["--iperf3-max-tests", "2"]);
    let a = iperf3_client(port, &["-t", "2", "-b", "200M"]);
    let b = iperf3_client(port, &["-t", "2", "-b", "200M", "-R"]);
    // Both running: each one's control connection and data stream taken.
    common::wait_until("both iperf3 tests to run", Duration::from_secs(10), || {
        common::counters::established(port) >= 4
    });
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

    // Over the time cap: refused at once with the error iperf3's own
    // servers send for theirs (37), never iperf3's "maximum = 86400
    // seconds", which is no cap of this server.
    let o = iperf3_client(port, &["-t", "100"]).finish(Duration::from_secs(10));
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert!(
        text.contains("int_errno=37")
            || text.contains("exceeds the server's maximum permitted limit"),
        "{text}"
    );
    assert!(!text.contains("86400"), "{text}");
    // A byte count is refused the same way, clearly.
    let o = iperf3_client(port, &["-n", "1M"]).finish(Duration::from_secs(10));
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert!(text.contains("not implemented"), "{text}");

    // After all that, a real test still runs.
    let o = iperf3_client(port, &["-t", "1"]).finish(Duration::from_secs(20));
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    // Each refusal is in the server's log, by default, with its reason.
    let log = stderr(&server.finish(Duration::ZERO));
    assert!(
        log.lines()
            .any(|l| l.contains("refused (limit)") && l.contains("a test of 100 s")),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("refused (bad_request)") && l.contains("byte or block count")),
        "{log}"
    );
}

/// iperf3 -s's own UDP figures of direction `d` of a test with `dirs`.
fn iperf3_side<'a>(end: &'a Value, d: &str, dirs: usize) -> &'a Value {
    // From iperf3 -s's point of view: the client's up is what it
    // received, down what it sent.
    &end[match (d, dirs) {
        ("up", _) => "sum_received",
        (_, 1) => "sum_sent",
        _ => "sum_sent_bidir_reverse",
    }]
}

/// Runs alone (`_timed`), as `longhaul_perf_against_iperf3_server_timed`.
#[test]
fn longhaul_perf_udp_against_iperf3_server_timed() {
    if !iperf3_here() {
        return;
    }
    for (args, dirs) in [
        (&["-P", "2"][..], &["up"][..]),
        (&["-R", "-P", "2"][..], &["down"][..]),
        (&["--bidir"][..], &["up", "down"][..]),
    ] {
        let (server, port) = iperf3_server();
        let o = bin()
            .args(["--no-archive", "perf", "--iperf3"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["-u", "-b", "100M", "-t", "1", "--json"])
            .args(args)
            .output()
            .expect("run longhaul");
        let theirs = json(&server.finish(Duration::from_secs(10)), "iperf3 -s");
        assert!(
            o.status.success(),
            "-u {args:?}: {}\n{}",
            stdout(&o),
            stderr(&o)
        );
        let doc = json(&o, "longhaul perf --json");
        let s = &doc["summary"];
        for &d in dirs {
            let theirs_d = iperf3_side(&theirs["end"], d, dirs.len());
            let ours = local_rate(&doc, d);
            close(
                ours,
                theirs_d["bits_per_second"].as_f64().unwrap_or(0.0),
                &format!("perf --iperf3 -u {args:?} {d}: this end vs iperf3 -s"),
            );
            let mine = direction(s, d);
            // The receiver's datagram counts, whichever end it was.
            let received = mine["packets_received"].as_u64().unwrap_or(0);
            assert!(received > 1000, "{d}: {mine}");
            assert!(mine["jitter_us"].as_u64().is_some(), "{mine}");
            if d == "up" {
                // iperf3 -s received: its packets and losses are ours.
                let p = theirs_d["packets"].as_u64().unwrap_or(0);
                let lost = theirs_d["lost_packets"].as_u64().unwrap_or(0);
                assert_eq!(received, p.saturating_sub(lost), "{mine}\n{theirs_d}");
            }
        }
        let notes = s["warnings"].to_string();
        assert!(
            notes.contains("UDP") && notes.contains("by its own count"),
            "{notes}"
        );
    }
}

#[test]
fn iperf3_udp_clients_against_longhaul_serve() {
    if !iperf3_here() {
        return;
    }
    let dir = TempDir::new("iperf3-serve-udp");
    let (server, port) = longhaul_server(&dir, &[]);
    for args in [
        &["-P", "2"][..],
        &["-R", "-P", "2"][..],
        &["--bidir", "--udp-counters-64bit"][..],
    ] {
        let mut a = vec!["-u", "-b", "50M", "-t", "1"];
        a.extend_from_slice(args);
        let o = iperf3_client(port, &a).finish(Duration::from_secs(20));
        assert!(
            o.status.success(),
            "iperf3 -c {a:?}: {}\n{}",
            stdout(&o),
            stderr(&o)
        );
        let j = json(&o, "iperf3 -c -u");
        assert!(j["error"].is_null(), "{a:?}: {}", j["error"]);
        let end = &j["end"];
        let r = |k: &str| end[k]["bits_per_second"].as_f64().unwrap_or(0.0);
        let halves: &[(&str, &str)] = if args[0] == "--bidir" {
            &[
                ("sum_sent", "sum_received"),
                ("sum_sent_bidir_reverse", "sum_received_bidir_reverse"),
            ]
        } else {
            &[("sum_sent", "sum_received")]
        };
        for (tx, rx) in halves {
            // One count is iperf3's, the other longhaul's (results exchange).
            close(r(tx), r(rx), &format!("iperf3 -c {a:?} {tx}/{rx}"));
            let packets = end[rx]["packets"].as_u64().unwrap_or(0);
            let jitter = end[rx]["jitter_ms"].as_f64().unwrap_or(-1.0);
            assert!(packets > 100, "{a:?}: {}", end[rx]);
            assert!((0.0..1000.0).contains(&jitter), "{a:?}: {}", end[rx]);
        }
    }
    drop(server);
}

#[test]
fn iperf3_rate_cap_refuses_udp_and_tcp_over_it() {
    if !iperf3_here() {
        return;
    }
    let dir = TempDir::new("iperf3-cap");
    let (server, port) = longhaul_server(&dir, &["--iperf3-max-rate", "60M"]);
    for args in [
        &["-u", "-b", "50M", "-P", "2"][..],
        &["-u", "-b", "0"][..],
        &["-b", "100M"][..],
        &[][..],
    ] {
        let o = iperf3_client(port, args).finish(Duration::from_secs(10));
        let text = format!("{}{}", stdout(&o), stderr(&o));
        assert!(
            text.contains("total required bandwidth is larger than server limit"),
            "{args:?}: {text}"
        );
    }
    // Within the cap, UDP runs.
    let o = iperf3_client(port, &["-u", "-b", "20M", "-P", "2", "-t", "1"])
        .finish(Duration::from_secs(20));
    let j = json(&o, "iperf3 -c -u within the cap");
    assert!(j["error"].is_null(), "{}", j["error"]);
    drop(server);
}

/// Sends `what` from `from` to the server's port; whether any answer came.
fn answered(from: &UdpSocket, port: u16, what: &[u8]) -> Option<Vec<u8>> {
    let _ = from.send_to(what, ("127.0.0.1", port));
    from.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 64];
    match from.recv(&mut buf) {
        Ok(n) => Some(buf[..n].to_vec()),
        Err(_) => None,
    }
}

#[test]
fn udp_strangers_and_malformed_setup_datagrams_are_ignored_timed() {
    if !iperf3_here() {
        return;
    }
    let dir = TempDir::new("iperf3-udp-attack");
    let (server, port) = longhaul_server(&dir, &["--handshake-timeout", "2s"]);
    let near = UdpSocket::bind("127.0.0.1:0").expect("bind");
    // Another host, as far as the server can tell: 127.0.0.2.
    let stranger = UdpSocket::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    // No test sets up UDP streams: nothing listens, nothing answers.
    assert_eq!(answered(&near, port, b"9876"), None);

    // A control connection that asks for UDP, then lets others try.
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.write_all(&cookie()).unwrap();
    let params = br#"{"udp":true,"time":1,"parallel":1,"len":1460,"bandwidth":1000000}"#;
    c.write_all(&(params.len() as u32).to_be_bytes()).unwrap();
    c.write_all(params).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 2];
    c.read_exact(&mut b).unwrap();
    assert_eq!(b, [9, 10], "PARAM_EXCHANGE, CREATE_STREAMS");
    // A stranger's setup datagram, and malformed ones from the client's
    // own address: dropped unanswered.
    assert_eq!(
        answered(&stranger, port, b"9876"),
        None,
        "stranger answered"
    );
    for junk in [&b""[..], b"987", b"98765", b"abcd", &[0u8; 1500][..]] {
        assert_eq!(answered(&near, port, junk), None, "{junk:?} answered");
    }
    // The client's own setup datagram is still answered: 4 bytes back.
    assert_eq!(
        answered(&near, port, b"9876").as_deref(),
        Some(&b"6789"[..])
    );
    // An early close frees the UDP setup for the next test at once.
    drop(c);

    // A real test runs while strangers keep sending junk at the port.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let junk = std::thread::spawn(move || {
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = stranger.send_to(b"9876", ("127.0.0.1", port));
            let _ = stranger.send_to(&[0xff; 100], ("127.0.0.1", port));
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    let t = Instant::now();
    let o = iperf3_client(port, &["-u", "-b", "20M", "-t", "1"]).finish(Duration::from_secs(20));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    junk.join().unwrap();
    let j = json(&o, "iperf3 -c -u after the attack");
    assert!(j["error"].is_null(), "{}", j["error"]);
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    let r = |k: &str| j["end"][k]["bits_per_second"].as_f64().unwrap_or(0.0);
    close(
        r("sum_sent"),
        r("sum_received"),
        "iperf3 -u among strangers",
    );
    drop(server);
}

#[test]
fn a_udp_client_over_its_asked_rate_is_ended_timed() {
    if !iperf3_here() {
        return;
    }
    let dir = TempDir::new("iperf3-udp-liar");
    let (server, port) = longhaul_server(&dir, &["--iperf3-max-rate", "10M"]);
    // Asks for 1 Mbit/s, within the cap, then sends far more.
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.write_all(&cookie()).unwrap();
    let params = br#"{"udp":true,"time":5,"parallel":1,"len":1400,"bandwidth":1000000}"#;
    c.write_all(&(params.len() as u32).to_be_bytes()).unwrap();
    c.write_all(params).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 2];
    c.read_exact(&mut b).unwrap();
    assert_eq!(b, [9, 10], "PARAM_EXCHANGE, CREATE_STREAMS");
    let u = UdpSocket::bind("127.0.0.1:0").expect("bind");
    u.connect(("127.0.0.1", port)).unwrap();
    assert_eq!(answered(&u, port, b"9876").as_deref(), Some(&b"6789"[..]));
    c.read_exact(&mut b).unwrap();
    assert_eq!(b, [1, 2], "TEST_START, TEST_RUNNING");
    c.set_nonblocking(true).unwrap();
    let t = Instant::now();
    let mut dgram = [0u8; 1400];
    let mut count: u32 = 0;
    let mut got = Vec::new();
    while t.elapsed() < Duration::from_secs(4) {
        for _ in 0..50 {
            count += 1;
            dgram[8..12].copy_from_slice(&count.to_be_bytes());
            let _ = u.send(&dgram);
        }
        std::thread::sleep(Duration::from_millis(1));
        let mut buf = [0u8; 16];
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                break;
            }
            Err(_) => {}
        }
    }
    // SERVER_TERMINATE ("the server has terminated") after the first second.
    assert_eq!(got.first(), Some(&11), "{got:?} after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    drop(server);
}

/// `perf --iperf3 -R`: the iperf3 server sent, so the retransmits are its
/// own count from its results, and the RTT, which iperf3's results do not
/// carry, is said to be unknown rather than 0. The header is TCP's and
/// names no option the user did not give.
#[test]
fn perf_iperf3_reverse_takes_the_servers_retransmits_and_says_what_it_cannot() {
    if !iperf3_here() {
        return;
    }
    let run = |json: bool| {
        let (server, port) = iperf3_server();
        let o = bin()
            .args([
                "perf",
                "--iperf3",
                &format!("127.0.0.1:{port}"),
                "-R",
                "-t",
                "1",
            ])
            .args(if json { &["--json"][..] } else { &[][..] })
            .output()
            .expect("run longhaul");
        let theirs = json_of_iperf3(&server.finish(Duration::from_secs(10)));
        assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
        (o, theirs)
    };
    let (o, theirs) = run(true);
    let doc = json(&o, "longhaul perf --iperf3 -R --json");
    let s = &doc["summary"];
    let sent = theirs["end"]["sum_sent"]["retransmits"]
        .as_u64()
        .unwrap_or_else(|| panic!("iperf3 -s counted no retransmits: {theirs}"));
    assert_eq!(s["retransmits"].as_u64(), Some(sent), "{s}");
    assert_eq!(s["rtt_unknown"], true, "{s}");
    assert!(s["retransmits_unknown"].is_null(), "{s}");
    let (o, _) = run(false);
    let out = stdout(&o);
    assert!(out.contains("RTT unknown"), "{out}");
    assert!(!out.contains("RTT 0.000"), "{out}");
    assert!(!out.contains("Lost/Total"), "UDP columns for TCP: {out}");
    assert!(out.contains("Retr"), "{out}");
    assert!(!out.contains("--insecure-plaintext"), "{out}");
}

/// iperf3 -s -J's document (its stdout).
fn json_of_iperf3(o: &Output) -> Value {
    json(o, "iperf3 -s -J")
}
