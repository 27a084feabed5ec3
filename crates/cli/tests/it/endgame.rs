//! The end game: a chunk stuck on one stream at a transfer's end is sent
//! again on another. A real stall on loopback: nftables drops every
//! packet one data connection sends, mid-copy, for good.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common;
use common::xfer::*;
use common::{bin, TempDir};

/// An nftables table that drops what local `port` sends to `to`; removed
/// on drop.
struct Stall(String);

impl Stall {
    fn start(port: u16, to: u16) -> Stall {
        let table = format!("longhaul_stall_{port}");
        let rules = format!(
            "table inet {table} {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n  \
             tcp sport {port} tcp dport {to} drop\n }}\n}}\n"
        );
        nft(&["-f", "-"], Some(&rules));
        Stall(table)
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        nft(&["delete", "table", "inet", &self.0], None);
    }
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
            .and_then(|()| common::require::program("ss", "iproute2")),
    ) {
        return;
    }
    let t = TempDir::new("endgame");
    let (src, exp) = (t.dir("src"), t.dir("export"));
    const SIZE: usize = 48 << 20;
    write_random(&src.join("f.bin"), SIZE, 44);
    let s = data_server(&exp, &t.dir("state"));
    let port = s.addr().port();
    // Paced so that the copy is still running when the stall starts.
    let mut cp = bin()
        .args(["cp", "--json", "-P", "4", "--rate", "200mbit"])
        .arg(src.join("f.bin"))
        .arg(remote(s.addr(), ""))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run longhaul cp");
    // A data stream that has carried 4 MiB (the control connection
    // carries kilobytes): stalled from then on, for good.
    let deadline = Instant::now() + Duration::from_secs(30);
    let victim = loop {
        assert!(Instant::now() < deadline, "no data stream carried 4 MiB");
        assert!(
            cp.try_wait().unwrap().is_none(),
            "cp ended before the stall"
        );
        let busiest = connections(port).into_iter().max_by_key(|c| c.1);
        if let Some((p, _)) = busiest.filter(|c| c.1 >= 4 << 20) {
            break p;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let _stall = Stall::start(victim, port);
    let stalled = Instant::now();
    let mut out = String::new();
    cp.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let status = cp.wait().unwrap();
    let took = stalled.elapsed();
    let mut err = String::new();
    cp.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "{err}");
    // Without the end game the stuck chunks wait for the dropped
    // connection, which never delivers them: the transfer idles out (5
    // minutes). Sent again after a stall of a few round trips, the copy
    // ends in about the time the rest of it takes.
    assert!(
        took < Duration::from_secs(20),
        "{took:?} after the stall: {err}"
    );
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
