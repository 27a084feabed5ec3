//! The end game: a chunk stuck on one stream at a transfer's end is sent
//! again on another. A real stall on loopback: nftables drops every
//! packet one data connection sends, mid-copy, for good. The test runs in
//! a network namespace of its own (its thread's, which the server's
//! threads, cp, ss and nft inherit): its loopback and its nftables table
//! go with it, even when the test is killed.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common;
use common::xfer::*;
use common::{bin, Owned, TempDir};

/// The longest the copy may take after the stall: many times the end
/// game's few seconds on a loaded machine, well below the transfer's idle
/// time-out (5 minutes), which is what a copy without the end game waits
/// for.
const LIMIT: Duration = Duration::from_secs(60);

/// Moves this thread (and what it starts from here on) into a network
/// namespace of its own, its loopback up.
fn own_network() {
    // SAFETY: a new network namespace only: no descriptor table or file
    // system state this process's other threads hold changes under them.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }
        .expect("a network namespace of the test's own");
    let up = std::process::Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .expect("run ip");
    assert!(up.success(), "ip link set lo up failed");
}

/// Drops, from now on, what local `port` sends to `to` (an nftables
/// table in the test's namespace, gone with it).
fn stall(port: u16, to: u16) {
    let rules = format!(
        "table inet longhaul_stall {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n  \
         tcp sport {port} tcp dport {to} drop\n }}\n}}\n"
    );
    nft(&["-f", "-"], Some(&rules));
}

fn nft(args: &[&str], input: Option<&str>) {
    use std::io::Write;
    let mut c = std::process::Command::new("nft")
        .args(args)
        .stdin(Stdio::piped())
        .spawn()
        .expect("run nft");
    if let (Some(text), Some(mut stdin)) = (input, c.stdin.take()) {
        stdin.write_all(text.as_bytes()).expect("feed nft");
    }
    assert!(c.wait().expect("nft").success(), "nft {args:?} failed");
}

/// The client's connections to the server's `port`: (local port, bytes
/// the server acknowledged), as `ss` shows them.
fn connections(port: u16) -> Vec<(u16, u64)> {
    let o = std::process::Command::new("ss")
        .args([
            "-Htin",
            "state",
            "established",
            "dport",
            &format!("= :{port}"),
        ])
        .output()
        .expect("run ss");
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out = Vec::new();
    let mut local = None;
    for w in text.split_whitespace() {
        if local.is_none() && w.starts_with("127.0.0.1:") {
            local = w.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok());
            continue;
        }
        if let (Some(l), Some(b)) = (local, w.strip_prefix("bytes_acked:")) {
            out.push((l, b.parse().unwrap_or(0)));
            local = None;
        }
    }
    out
}

#[test]
fn a_chunk_stuck_on_a_stalled_stream_is_sent_again_on_another() {
    if !common::require::have(
        "ROOT",
        common::require::root("dropping one connection's packets with nftables")
            .and_then(|()| common::require::program("nft", "nftables"))
            .and_then(|()| common::require::program("ss", "iproute2"))
            .and_then(|()| common::require::program("ip", "iproute2")),
    ) {
        return;
    }
    own_network();
    let t = TempDir::new("endgame");
    let (src, exp) = (t.dir("src"), t.dir("export"));
    const SIZE: usize = 48 << 20;
    write_random(&src.join("f.bin"), SIZE, 44);
    let s = data_server(&exp, &t.dir("state"));
    let port = s.addr().port();
    // Paced so that the copy is still running when the stall starts.
    let mut cp = Owned::spawn(
        bin()
            .args(["cp", "--json", "-P", "4", "--rate", "200mbit"])
            .arg(src.join("f.bin"))
            .arg(remote(s.addr(), ""))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .expect("run longhaul cp");
    let (out, err) = (drain(cp.stdout.take()), drain(cp.stderr.take()));
    // A data stream that has carried 4 MiB (the control connection
    // carries kilobytes): stalled from then on, for good.
    let mut victim = None;
    common::wait_until(
        "a data stream to carry 4 MiB",
        Duration::from_secs(30),
        || {
            assert!(!cp.ended(), "cp ended before the stall");
            let busiest = connections(port).into_iter().max_by_key(|c| c.1);
            victim = busiest.filter(|c| c.1 >= 4 << 20).map(|c| c.0);
            victim.is_some()
        },
    );
    stall(victim.expect("found"), port);
    let stalled = Instant::now();
    // Without the end game the stuck chunks wait for the dropped
    // connection, which never delivers them: the transfer idles out (5
    // minutes). Sent again after a stall of a few round trips, the copy
    // ends in about the time the rest of it takes.
    let status = cp.wait_for(LIMIT);
    let took = stalled.elapsed();
    if status.is_none() {
        let _ = cp.kill();
    }
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let status = status.unwrap_or_else(|| panic!("not done {LIMIT:?} after the stall: {err}"));
    assert!(status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("cp's JSON");
    assert_eq!(v["verified"], true, "{v}");
    let resent = v["resent_bytes"].as_u64().expect("resent_bytes");
    eprintln!("ended {took:?} after the stall; {resent} bytes sent again");
    assert!(resent > 0, "{v}");
    assert!(resent < SIZE as u64, "{v}");
    assert_same_file(&src.join("f.bin"), &exp.join("f.bin"));
    assert_no_leftovers(&exp);
    s.shutdown();
}

/// Reads all of a child's pipe on a thread of its own.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    let mut pipe = pipe.expect("piped");
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}
