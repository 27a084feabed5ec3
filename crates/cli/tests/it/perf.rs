//! End-to-end tests of `longhaul perf` and `longhaul serve` on loopback:
//! the real binary as client, servers in this process or as processes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use longhaul_engine::server::{ServeConfig, Server, ServerHandle};
use longhaul_proto::session::Limits;
use serde_json::Value;

use crate::common;
use common::{bin, stderr};

fn server() -> ServerHandle {
    common::xfer::spawn_server(ServeConfig {
        state_dir: common::prepare_state(&std::env::temp_dir().join("longhaul-test-state")),
        ..ServeConfig::default()
    })
}

fn perf(addr: SocketAddr, args: &[&str]) -> Output {
    bin()
        .arg("perf")
        .arg(addr.to_string())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run longhaul")
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout {} stderr {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

fn ok_json(addr: SocketAddr, args: &[&str]) -> Value {
    let o = perf(addr, &[args, &["--json"]].concat());
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    json_of(&o)
}

#[test]
fn tcp_one_stream_reports_required_fields() {
    let s = server();
    let v = ok_json(s.addr(), &["-t", "1", "-i", "0.25"]);
    let sum = &v["summary"];
    for f in [
        "bits_per_second",
        "bytes",
        "seconds",
        "retransmits",
        "rtt_us",
        "cpu_local_percent",
        "cpu_remote_percent",
    ] {
        assert!(
            sum.get(f).is_some_and(|x| x.is_number()),
            "summary.{f} missing: {sum}"
        );
    }
    assert!(sum["bytes"].as_u64().unwrap() > 1_000_000, "{sum}");
    assert!(sum["bits_per_second"].as_f64().unwrap() > 1e8);
    assert!(
        (0.9..1.6).contains(&sum["seconds"].as_f64().unwrap()),
        "{sum}"
    );
    assert!(sum["cpu_local_percent"].as_f64().unwrap() > 0.0);
    assert!(sum["cpu_remote_percent"].as_f64().unwrap() > 0.0);
    assert!(sum["rtt_us"].as_u64().unwrap() > 0);
    let intervals = v["intervals"].as_array().unwrap();
    assert!(intervals.len() >= 3, "{} intervals", intervals.len());
    assert_eq!(v["format_version"], 2);
    let limit = sum["limit"]["kind"].as_str().unwrap();
    assert!(!limit.is_empty());
    // Plaintext data streams by default, the control connection in TLS,
    // and the report says so.
    assert_eq!(v["start"]["data_encrypted"], false, "{}", v["start"]);
    assert_eq!(v["start"]["encryption"], "none", "{}", v["start"]);
    let enc = v["start"]["control_encryption"]
        .as_str()
        .unwrap_or_default();
    assert!(enc.starts_with("TLS1.3 TLS13_"), "{enc}");
    s.shutdown();
}

#[test]
fn tcp_four_streams_each_carry_data() {
    let s = server();
    let v = ok_json(s.addr(), &["-t", "1", "-P", "4"]);
    let streams = v["summary"]["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 4);
    let mut total = 0;
    for st in streams {
        let b = st["bytes"].as_u64().unwrap();
        assert!(b > 0, "{st}");
        total += b;
    }
    assert_eq!(total, v["summary"]["bytes"].as_u64().unwrap());
    s.shutdown();
}

#[test]
fn reverse_takes_tcp_info_from_the_server() {
    let s = server();
    let v = ok_json(s.addr(), &["-t", "1", "-R"]);
    let d = &v["summary"]["directions"][0];
    assert_eq!(d["direction"], "down");
    // Sender-side kernel counters come from the server, which sends here.
    assert!(d["rtt_us"].as_u64().unwrap() > 0, "{d}");
    assert!(d.get("busy_fraction").is_some(), "{d}");
    assert!(d["cwnd_bytes"].as_u64().unwrap() > 0, "{d}");
    assert!(v["summary"]["bytes"].as_u64().unwrap() > 0);
    s.shutdown();
}

#[test]
fn bidir_runs_both_directions() {
    let s = server();
    let v = ok_json(s.addr(), &["-t", "1", "--bidir", "-P", "2"]);
    let dirs = v["summary"]["directions"].as_array().unwrap();
    assert_eq!(dirs.len(), 2);
    for d in dirs {
        assert!(d["bytes"].as_u64().unwrap() > 0, "{d}");
        assert!(d["rtt_us"].as_u64().unwrap() > 0, "{d}");
    }
    assert_eq!(v["summary"]["streams"].as_array().unwrap().len(), 4);
    s.shutdown();
}

#[test]
fn byte_count_mode_sends_exactly_that() {
    let s = server();
    let v = ok_json(s.addr(), &["-n", "50M", "-P", "3"]);
    assert_eq!(v["summary"]["bytes"].as_u64().unwrap(), 50 << 20);
    s.shutdown();
}

#[test]
fn udp_at_a_set_rate_without_loss_timed() {
    let s = server();
    let v = ok_json(s.addr(), &["-u", "-b", "100M", "-t", "1"]);
    let sum = &v["summary"];
    let rate = sum["bits_per_second"].as_f64().unwrap();
    assert!((80e6..120e6).contains(&rate), "rate {rate}");
    assert!(sum["lost_percent"].as_f64().unwrap() < 1.0, "{sum}");
    assert!(sum.get("jitter_us").is_some());
    let d = &sum["directions"][0];
    let sent = d["packets_sent"].as_u64().unwrap();
    let received = d["packets_received"].as_u64().unwrap();
    assert!(sent > 7000, "{d}");
    assert_eq!(sent, received + d["lost_packets"].as_u64().unwrap(), "{d}");
    s.shutdown();
}

#[test]
fn udp_loss_in_a_small_receive_buffer_is_counted_and_named_timed() {
    let s = server();
    // Unlimited rate into a tiny receive buffer: the receiver's own socket drops.
    let v = ok_json(s.addr(), &["-u", "-b", "0", "-w", "4K", "-t", "1"]);
    let d = &v["summary"]["directions"][0];
    let sent = d["packets_sent"].as_u64().unwrap();
    let received = d["packets_received"].as_u64().unwrap();
    let lost = d["lost_packets"].as_u64().unwrap();
    assert_eq!(sent, received + lost, "{d}");
    assert!(lost > 0, "{d}");
    assert!(d["rcvbuf_drops"].as_u64().unwrap() > 0, "{d}");
    let pct = v["summary"]["lost_percent"].as_f64().unwrap();
    assert!((pct - lost as f64 * 100.0 / sent as f64).abs() < 1e-6);
    assert_eq!(v["summary"]["limit"]["kind"], "receiver_buffer");
    s.shutdown();
}

#[test]
fn two_clients_at_once() {
    let s = server();
    let a = s.addr();
    let t1 = std::thread::spawn(move || perf(a, &["-t", "2", "--json"]));
    let t2 = std::thread::spawn(move || perf(a, &["-t", "2", "-R", "--json"]));
    for o in [t1.join().unwrap(), t2.join().unwrap()] {
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(json_of(&o)["summary"]["bytes"].as_u64().unwrap() > 0);
    }
    s.shutdown();
}

#[test]
fn garbage_client_does_not_disturb_a_real_test() {
    // Plaintext allowed, so that the oversized frame below reaches the
    // framing layer (a TLS-only server refuses the preamble itself).
    let s = common::xfer::spawn_server(ServeConfig {
        allow_plaintext: true,
        state_dir: common::prepare_state(&std::env::temp_dir().join("longhaul-test-state")),
        ..ServeConfig::default()
    });
    let a = s.addr();
    let mut real = bin()
        .arg("perf")
        .arg(a.to_string())
        .args(["-t", "2", "--json-stream"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Until its test is running (its `start` event), then the garbage.
    let mut out = std::io::BufReader::new(real.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains(r#""event":"start""#) {
        line.clear();
        let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert!(n > 0, "perf ended before its test started");
    }
    let mut junk = TcpStream::connect(a).unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    junk.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let _ = junk.read_to_end(&mut buf);
    // The server answers garbage with a refusal frame (type 0x03) and closes.
    assert!(buf.len() > 5 && buf[4] == 0x03, "got {buf:?}");
    // A well-formed preamble with an absurd frame length is refused before allocation.
    let mut big = TcpStream::connect(a).unwrap();
    big.write_all(b"LONGHAUL").unwrap();
    big.write_all(&[0xff, 0xff, 0xff, 0xff, 0x01]).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let _ = big.read_to_end(&mut buf);
    assert!(buf.len() > 5 && buf[4] == 0x03);
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let o = real.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let summary: Value = serde_json::from_str(rest.lines().last().unwrap()).unwrap();
    assert_eq!(summary["event"], "summary", "{rest}");
    assert!(summary["bytes"].as_u64().unwrap() > 0, "{summary}");
    s.shutdown();
}

#[test]
fn slowloris_is_cut_off_at_the_handshake_deadline_timed() {
    let s = common::xfer::spawn_server(ServeConfig {
        limits: Limits {
            handshake_timeout: Duration::from_millis(800),
            ..Limits::default()
        },
        state_dir: common::prepare_state(&std::env::temp_dir().join("longhaul-test-state")),
        ..ServeConfig::default()
    });
    let mut c = TcpStream::connect(s.addr()).unwrap();
    let started = Instant::now();
    let mut closed = false;
    for b in b"LONGHAUL\0\0\0\x10\x01{\"min_version\":1" {
        if c.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(150));
        c.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        let mut x = [0u8; 16];
        if matches!(c.read(&mut x), Ok(0)) {
            closed = true;
            break;
        }
    }
    assert!(
        closed,
        "server kept a trickling client for {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    s.shutdown();
}

#[test]
fn third_party_test_between_two_servers() {
    let a = server();
    let b = server();
    let o = bin()
        .args([
            "perf",
            &a.addr().to_string(),
            &b.addr().to_string(),
            "-t",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json_of(&o);
    assert!(v["summary"]["bytes"].as_u64().unwrap() > 0);
    assert!(!v["intervals"].as_array().unwrap().is_empty());
    // The relaying server passes on the setup of its test, too.
    assert_eq!(v["start"]["server"], b.addr().to_string(), "{}", v["start"]);
    a.shutdown();
    b.shutdown();
}

/// Over plaintext the requester proves its token to A and lends it to no
/// one: A still runs the test to B (which takes anonymous perf here).
#[test]
fn third_party_test_over_plaintext_lends_no_token() {
    let plain = || {
        common::xfer::spawn_server(ServeConfig {
            allow_plaintext: true,
            public_perf: true,
            state_dir: common::prepare_state(&std::env::temp_dir().join("longhaul-test-state")),
            ..ServeConfig::default()
        })
    };
    let (a, b) = (plain(), plain());
    let o = bin()
        .args([
            "perf",
            "--insecure-plaintext",
            &a.addr().to_string(),
            &b.addr().to_string(),
            "-t",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(json_of(&o)["summary"]["bytes"].as_u64().unwrap() > 0);
    a.shutdown();
    b.shutdown();
}

#[test]
fn third_party_refused_when_disabled() {
    let a = common::xfer::spawn_server(ServeConfig {
        limits: Limits {
            allow_third_party: false,
            ..Limits::default()
        },
        state_dir: common::prepare_state(&std::env::temp_dir().join("longhaul-test-state")),
        ..ServeConfig::default()
    });
    let b = server();
    let o = bin()
        .args([
            "perf",
            &a.addr().to_string(),
            &b.addr().to_string(),
            "-t",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(stderr(&o).contains("third-party"), "{}", stderr(&o));
    a.shutdown();
    b.shutdown();
}

#[test]
fn bad_input_is_a_one_line_error_with_the_right_exit_code() {
    let s = server();
    let a = s.addr();
    let cases: &[(&[&str], i32, &str)] = &[
        (&["-l", "10Q"], 2, "invalid size '10Q'"),
        (&["-t", "0"], 2, "duration 0"),
        (&["-w", "3G"], 2, "larger than the kernel allows"),
        (
            &["-C", "nosuchcc", "-t", "1"],
            2,
            "unknown congestion control 'nosuchcc'",
        ),
        (&["-P", "0"], 2, "0 streams"),
        (&["-b", "1G"], 2, "UDP"),
    ];
    for (args, code, text) in cases {
        let o = perf(a, args);
        assert_eq!(o.status.code(), Some(*code), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(text), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"));
    }
    s.shutdown();
}

#[test]
fn unreachable_and_refused_servers() {
    // A port nothing listens on: bind, read the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = bin()
        .args([
            "perf",
            &format!("127.0.0.1:{port}"),
            "-t",
            "1",
            "--retries",
            "0",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("cannot connect"), "{}", stderr(&o));

    let busy = common::xfer::spawn_server(ServeConfig {
        max_tests: 0,
        state_dir: common::prepare_state(&std::env::temp_dir().join("longhaul-test-state")),
        ..ServeConfig::default()
    });
    let o = perf(busy.addr(), &["-t", "1"]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(stderr(&o).contains("limit"), "{}", stderr(&o));
    busy.shutdown();

    let small = common::xfer::spawn_server(ServeConfig {
        limits: Limits {
            max_streams: 2,
            ..Limits::default()
        },
        state_dir: common::prepare_state(&std::env::temp_dir().join("longhaul-test-state")),
        ..ServeConfig::default()
    });
    let o = perf(small.addr(), &["-t", "1", "-P", "3", "--json"]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let v = json_of(&o);
    assert_eq!(v["error"]["exit_code"], 4);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("at most 2"));
    small.shutdown();
}

#[test]
fn a_server_that_is_not_longhaul_is_a_connect_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let _ = c.write_all(b"SSH-2.0-OpenSSH_9.2\r\n");
        std::thread::sleep(Duration::from_millis(500));
    });
    let o = bin()
        .args(["perf", &addr.to_string(), "-t", "1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("TLS"), "{}", stderr(&o));
    t.join().unwrap();
}

#[test]
fn json_stream_prints_one_object_per_line() {
    let s = server();
    let o = perf(s.addr(), &["-t", "1", "-i", "0.5", "--json-stream"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let events: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("a JSON line")["event"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(events.first().map(String::as_str), Some("start"));
    assert_eq!(events.last().map(String::as_str), Some("summary"));
    assert!(events.iter().filter(|e| *e == "interval").count() >= 2);
    s.shutdown();
}

/// A sender whose writes block on a full socket buffer (paced far below
/// what its 8 MiB writes hand over: each takes seconds to drain) still
/// ends the test at its time, as iperf3 does: the run, its reported
/// duration and its intervals end within a generous margin of `-t 2`
/// (before, the blocked write and the bytes queued behind it held the end
/// to 4.5-5 s, and the intervals after the end ran backwards). Both
/// directions, and through TLS, whose sender is stopped rather than shut.
#[test]
fn a_sender_blocked_at_the_end_ends_the_test_on_time_timed() {
    let s = server();
    for extra in [&[][..], &["-R"], &["--tls"]] {
        let args = [
            &["-t", "2", "-i", "0.5", "--pacing", "10M", "-l", "8M"],
            extra,
        ]
        .concat();
        let mut c = bin();
        c.arg("perf").arg(s.addr().to_string()).args(&args);
        common::ontime::assert_ends_on_time(c, 2.0);
    }
    s.shutdown();
}

#[test]
fn window_request_is_reported_as_granted() {
    let s = server();
    let v = ok_json(s.addr(), &["-t", "1", "-w", "256K"]);
    let local = &v["start"]["local_streams"][0];
    // The kernel reports twice the requested size.
    assert_eq!(local["sndbuf"].as_u64().unwrap(), 512 << 10, "{local}");
    assert_eq!(local["rcvbuf"].as_u64().unwrap(), 512 << 10, "{local}");
    let remote = &v["start"]["remote_streams"][0];
    assert_eq!(remote["rcvbuf"].as_u64().unwrap(), 512 << 10, "{remote}");
    s.shutdown();
}

#[test]
fn window_above_the_kernel_cap_warns_with_the_fix() {
    let cap = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let Some(cap) = cap.filter(|&c| c < (512 << 20)) else {
        common::require::missing(
            "RMEM_CAP",
            &format!(
                "net.core.rmem_max ({}) is not below the 512M a window can ask for",
                cap.map_or("unreadable".into(), |c| c.to_string())
            ),
        );
        return;
    };
    let s = server();
    let want = (cap * 2).to_string();
    let v = ok_json(s.addr(), &["-t", "1", "-w", &want]);
    let warnings: Vec<String> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_string())
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("rmem_max") && w.contains("sysctl -w")),
        "{warnings:?}"
    );
    s.shutdown();
}

#[test]
fn every_data_path_moves_exactly_the_bytes_asked_for() {
    let s = server();
    for mode in [
        &["--copy"][..],
        &["--zerocopy"],
        &["--zerocopy=splice"],
        &["--zerocopy=copy"],
        &[],
    ] {
        for dir in [&[][..], &["-R"]] {
            let args = [&["-n", "20M"][..], mode, dir].concat();
            let v = ok_json(s.addr(), &args);
            assert_eq!(
                v["summary"]["bytes"].as_u64().unwrap(),
                20 << 20,
                "{args:?}"
            );
        }
    }
    let o = perf(s.addr(), &["--zerocopy=msg", "-t", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown zero-copy mode"),
        "{}",
        stderr(&o)
    );
    s.shutdown();
}

#[test]
fn ipv6_server_and_client() {
    if !common::require::have("IPV6", common::require::ipv6()) {
        return;
    }
    let server = Server::bind(
        &["[::1]:0".parse().unwrap()],
        ServeConfig {
            state_dir: common::prepare_state(&std::env::temp_dir().join("longhaul-test-state")),
            ..ServeConfig::default()
        },
    )
    .expect("bind [::1]");
    let s = server.spawn();
    let port = s.addr().port().to_string();
    for target in [&["[::1]"][..], &["::1"]] {
        let o = bin()
            .arg("perf")
            .args(target)
            .args(["-p", &port, "-t", "1", "--json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{target:?}: {}", stderr(&o));
        assert!(json_of(&o)["summary"]["bytes"].as_u64().unwrap() > 0);
    }
    let o = bin()
        .args([
            "perf",
            &format!("[::1]:{port}"),
            "-u",
            "-b",
            "10M",
            "-t",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(json_of(&o)["summary"]["bytes"].as_u64().unwrap() > 0);
    s.shutdown();
}

#[test]
fn pacing_mss_affinity_and_omit_take_effect_timed() {
    let s = server();
    // Pacing caps the rate (SO_MAX_PACING_RATE), split over the streams:
    // the paced bytes over the paced span, from the tool's own intervals
    // (the first, with the connection's initial window, left out). A paced
    // sender overshoots only by its interval edges' jitter, so 10% above;
    // a busy machine can slow it but not speed it, so 25% below. Pacing
    // off (Gbit/s on loopback), not split (800M) or split twice (200M)
    // all fall outside.
    let v = ok_json(
        s.addr(),
        &["-t", "3", "-i", "0.5", "-P", "2", "--pacing", "400M"],
    );
    let iv = &v["intervals"].as_array().unwrap()[1..];
    let bytes: u64 = iv
        .iter()
        .map(|i| i["directions"][0]["bytes"].as_u64().unwrap())
        .sum();
    let span = iv.last().unwrap()["end_s"].as_f64().unwrap() - iv[0]["start_s"].as_f64().unwrap();
    let rate = bytes as f64 * 8.0 / span;
    assert!(
        (300e6..=440e6).contains(&rate),
        "paced at 400M, got {rate} over {span} s: {v}"
    );
    // A small MSS is what the kernel then reports.
    let v = ok_json(s.addr(), &["-t", "0.5", "-M", "1200"]);
    let mss = v["start"]["local_streams"][0]["mss"].as_u64().unwrap();
    assert!(mss <= 1200 && mss > 0, "mss {mss}");
    let o = perf(s.addr(), &["-t", "0.5", "-A", "0,x"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // --omit: the first interval is flagged and the summary covers -t only.
    let v = ok_json(s.addr(), &["-t", "1", "--omit", "0.5", "-i", "0.25"]);
    let iv = v["intervals"].as_array().unwrap();
    assert_eq!(iv[0]["omitted"], true);
    assert_eq!(iv.last().unwrap()["omitted"], false);
    let secs = v["summary"]["seconds"].as_f64().unwrap();
    assert!((0.9..1.3).contains(&secs), "summary seconds {secs}");
    s.shutdown();
}

/// Threads of process `pid` (a task directory under /proc) allowed on
/// `cpu` alone, with the CPU each last ran on.
fn pinned_threads(pid: &str, cpu: usize) -> Vec<(String, usize)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            let allowed = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
                .trim();
            if allowed != cpu.to_string() {
                return None;
            }
            // Field 39 of stat, `processor`: the 37th after the command's ')'.
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let ran = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(36)?
                .parse()
                .ok()?;
            Some((t.file_name().to_string_lossy().into_owned(), ran))
        })
        .collect()
}

#[test]
fn affinity_pins_each_ends_streams_to_the_cpu_asked_timed() {
    if !common::require::have("CPUS", common::require::cpus(2)) {
        return;
    }
    // The highest CPU this test may use: not the default of any thread.
    let mine = rustix::thread::sched_getaffinity(None).unwrap();
    let cpu = (0..rustix::thread::CpuSet::MAX_CPU)
        .rev()
        .find(|&c| mine.is_set(c))
        .unwrap();
    let s = server();
    let mut client = bin()
        .arg("perf")
        .arg(s.addr().to_string())
        .args(["-t", "2", "--json", "-A", &format!("{cpu},{cpu}")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Sampled while the test runs: the client's threads (its process) and
    // the server's (this process) that are pinned, and where they ran.
    let pid = client.id().to_string();
    let (mut local, mut remote) = (Vec::new(), Vec::new());
    while client.try_wait().unwrap().is_none() {
        local.extend(pinned_threads(&pid, cpu));
        remote.extend(pinned_threads("self", cpu));
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = client.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(json_of(&o)["summary"]["bytes"].as_u64().unwrap() > 0);
    assert!(
        !local.is_empty(),
        "no client thread was pinned to CPU {cpu}"
    );
    assert!(
        !remote.is_empty(),
        "no server thread was pinned to CPU {cpu}"
    );
    for (tid, ran) in local.iter().chain(&remote) {
        assert_eq!(*ran, cpu, "thread {tid}, pinned to CPU {cpu}, ran on {ran}");
    }
    s.shutdown();
}

/// iperf3's hands on perf: `-c HOST`, `-J`, `-O`, `--logfile`; `-s` says
/// where the server is.
#[test]
fn iperf3_habits_c_j_o_logfile_and_s() {
    let s = server();
    let t = common::TempDir::new("perf-habits");
    let log = t.path().join("perf.log");
    let o = bin()
        .args([
            "perf",
            "-c",
            &s.addr().to_string(),
            "-t",
            "1",
            "-O",
            "0.2",
            "-J",
        ])
        .arg("--logfile")
        .arg(&log)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "printed despite --logfile");
    let v: Value = serde_json::from_slice(&std::fs::read(&log).unwrap()).unwrap();
    assert!(
        v["summary"]["bits_per_second"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    let o = bin().args(["perf", "-s"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("longhaul serve"), "{}", stderr(&o));
    // -c and a HOST are one server named twice: refused.
    let a = s.addr().to_string();
    let o = bin().args(["perf", &a, "-c", &a]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// `-f m` keeps the columns under their names, however wide the numbers
/// in that unit grow.
#[test]
fn perf_f_keeps_its_columns() {
    let s = server();
    for unit in ["m", "k"] {
        let o = perf(s.addr(), &["-t", "1", "-P", "2", "-f", unit]);
        assert!(o.status.success(), "{}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let header = out
            .lines()
            .find(|l| l.contains("Bitrate"))
            .unwrap_or_else(|| panic!("no header: {out}"));
        let end_of = |l: &str, word: &str| l.find(word).map(|i| i + word.len());
        let rate_end = end_of(header, "Bitrate").unwrap();
        let retr_end = end_of(header, "Retr").unwrap();
        for l in out
            .lines()
            .filter(|l| l.starts_with('[') && l.contains("bit/s"))
        {
            assert_eq!(end_of(l, "bit/s"), Some(rate_end), "{header}\n{l}");
            // The next column, the retransmits, ends under its name.
            let retr = l[rate_end..].split_whitespace().next().unwrap();
            let at = l[rate_end..].find(retr).unwrap() + rate_end + retr.len();
            assert_eq!(at, retr_end, "{header}\n{l}");
        }
    }
}

/// The demo titles each test with the command that runs it again: an
/// encrypted test's has `--tls`, a plaintext one's has not.
#[test]
fn demo_titles_are_the_commands_that_ran() {
    let o = bin()
        .arg("demo")
        .env("TMPDIR", std::env::temp_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut sections = 0;
    let mut title = "";
    for l in out.lines() {
        if l.starts_with("== ") && l.contains("longhaul perf") {
            title = l;
            sections += 1;
        }
        if l.starts_with("Connected to") {
            let encrypted = l.contains("data streams encrypted");
            assert_eq!(title.contains("--tls"), encrypted, "{title}\n{l}");
            let command = title.split(": ").nth(1).unwrap_or("");
            assert!(command.starts_with("longhaul perf "), "{title}");
        }
    }
    assert_eq!(sections, 3, "{out}");
}
