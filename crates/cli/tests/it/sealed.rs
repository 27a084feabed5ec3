//! Sealed frames on TLS data streams (PROTOCOL.md 13.2b): files cross
//! both ways in them by default, TLS records stay when asked, and a byte
//! changed or a stream cut on the path never lands as data.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::xfer::{assert_same_file, cp_ok, data_server, json_of, remote, write_random};
use common::{bin, stderr, TempDir};

#[test]
fn sealed_frames_carry_a_push_and_a_pull() {
    let t = TempDir::new("sealed-both");
    let (exp, src, back) = (t.dir("export"), t.dir("src"), t.dir("back"));
    write_random(&src.join("big.bin"), (24 << 20) + 12_345, 1);
    write_random(&src.join("small.bin"), 1000, 2);
    std::fs::write(src.join("empty"), b"").unwrap();
    let s = data_server(&exp, &t.dir("state"));

    let v = cp_ok(&["-r", src.to_str().unwrap(), &remote(s.addr(), "")]);
    let enc = v["encryption"].as_str().unwrap();
    assert!(
        enc.starts_with("TLS1.3") && enc.ends_with(", sealed frames"),
        "{v}"
    );
    for f in ["big.bin", "small.bin", "empty"] {
        assert_same_file(&src.join(f), &exp.join("src").join(f));
    }

    let v = cp_ok(&["-r", &remote(s.addr(), "src"), back.to_str().unwrap()]);
    assert!(
        v["encryption"]
            .as_str()
            .unwrap()
            .ends_with(", sealed frames"),
        "{v}"
    );
    for f in ["big.bin", "small.bin", "empty"] {
        assert_same_file(&src.join(f), &back.join("src").join(f));
    }
}

#[test]
fn tls_records_stay_when_the_client_asks() {
    let t = TempDir::new("sealed-off");
    let (exp, src) = (t.dir("export"), t.dir("src"));
    write_random(&src.join("a.bin"), 3 << 20, 3);
    let s = data_server(&exp, &t.dir("state"));
    let o = bin()
        .env("LONGHAUL_DATA_FRAMES", "tls")
        .args(["cp", "--json", src.join("a.bin").to_str().unwrap()])
        .arg(remote(s.addr(), ""))
        .output()
        .unwrap();
    let v = json_of(&o);
    assert_eq!(v["verified"], true, "{v}");
    let enc = v["encryption"].as_str().unwrap();
    assert!(enc.starts_with("TLS1.3") && !enc.contains("sealed"), "{v}");
    assert_same_file(&src.join("a.bin"), &exp.join("a.bin"));
}

/// What a man in the middle does to the client's bytes of a connection,
/// once it has passed `at` bytes (the data streams carry megabytes; the
/// control connection and the handshakes fewer).
#[derive(Clone, Copy)]
enum Harm {
    Flip,
    Cut,
}

/// A TCP proxy to `to` that harms every connection that carries more
/// than `at` bytes from the client; counts the connections it harmed.
fn mangler(to: SocketAddr, at: usize, harm: Harm) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let harmed = Arc::new(AtomicUsize::new(0));
    let count = harmed.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(client) = c else { return };
            let Ok(upstream) = TcpStream::connect(to) else {
                continue;
            };
            let (mut c_r, mut u_w) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            let count = count.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                let mut seen = 0usize;
                let mut done = false;
                while let Ok(n) = c_r.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if !done && seen + n > at {
                        done = true;
                        count.fetch_add(1, Ordering::SeqCst);
                        match harm {
                            Harm::Flip => buf[at - seen] ^= 0x20,
                            Harm::Cut => {
                                let _ = u_w.write_all(&buf[..at - seen]);
                                let _ = u_w.shutdown(std::net::Shutdown::Both);
                                let _ = c_r.shutdown(std::net::Shutdown::Both);
                                return;
                            }
                        }
                    }
                    seen += n;
                    if u_w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = u_w.shutdown(std::net::Shutdown::Write);
            });
            let (mut u_r, mut c_w) = (upstream, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut u_r, &mut c_w);
                let _ = c_w.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (addr, harmed)
}

/// Pushes a file through a proxy that harms the data streams: the copy
/// fails, and what lands is never other than the source. `check` is
/// `LONGHAUL_CHUNK_CHECK`: `tag` (the default: the AEAD's tag is each
/// chunk's check) or `xxh3` (each chunk's XXH3 as well).
fn harmed_push(name: &str, harm: Harm, check: &str) {
    let t = TempDir::new(name);
    let (exp, src) = (t.dir("export"), t.dir("src"));
    let file = src.join("big.bin");
    write_random(&file, 16 << 20, 4);
    let s = data_server(&exp, &t.dir("state"));
    let (proxy, harmed) = mangler(s.addr(), 2 << 20, harm);
    let o = bin()
        .env("LONGHAUL_CHUNK_CHECK", check)
        .args(["cp", "--json", "--retries", "0", "--streams", "2"])
        .arg(&file)
        .arg(remote(proxy, ""))
        .output()
        .unwrap();
    assert!(
        harmed.load(Ordering::SeqCst) > 0,
        "no data stream was harmed"
    );
    assert_ne!(
        o.status.code(),
        Some(0),
        "a harmed copy succeeded: {}",
        stderr(&o)
    );
    landed_only_the_source(&file, &exp.join("big.bin"));
}

fn landed_only_the_source(src: &Path, dst: &Path) {
    if dst.exists() {
        assert_same_file(src, dst);
    }
}

#[test]
fn a_byte_flipped_in_a_sealed_stream_never_lands() {
    harmed_push("sealed-flip", Harm::Flip, "tag");
}

#[test]
fn a_byte_flipped_in_a_sealed_stream_with_xxh3_checks_never_lands() {
    harmed_push("sealed-flip-xxh3", Harm::Flip, "xxh3");
}

/// On TLS the AEAD's tag is each chunk's check: the sink spends nothing
/// on a check of its own, unless the client asks for XXH3 as well.
#[test]
fn tls_sessions_leave_the_chunk_checks_to_the_tags() {
    let t = TempDir::new("sealed-tags");
    let (exp, src) = (t.dir("export"), t.dir("src"));
    write_random(&src.join("a.bin"), 32 << 20, 5);
    let s = data_server(&exp, &t.dir("state"));
    let verify_cpu = |check: &str| {
        let o = bin()
            .env("LONGHAUL_CHUNK_CHECK", check)
            .args([
                "cp",
                "--json",
                "--force",
                src.join("a.bin").to_str().unwrap(),
            ])
            .arg(remote(s.addr(), ""))
            .output()
            .unwrap();
        let v = json_of(&o);
        assert_eq!(v["verified"], true, "{v}");
        assert_same_file(&src.join("a.bin"), &exp.join("a.bin"));
        v["cpu_stages"]["sink"]["verify"].as_f64().unwrap()
    };
    assert_eq!(
        verify_cpu("tag"),
        0.0,
        "the sink checked chunks the tags proved"
    );
    assert!(verify_cpu("xxh3") > 0.0, "XXH3 asked for, not computed");
}

#[test]
fn a_sealed_stream_cut_short_never_lands() {
    harmed_push("sealed-cut", Harm::Cut, "tag");
}

/// A bundle frame may be longer than a sealed frame (1 MiB of files, and
/// 60 bytes a record around them): its tail waits in the stream's gather
/// buffer until the stream is flushed. A sender that went idle without
/// flushing it held the last files of a copy back while both ends waited
/// on each other (issue 41 A1: a copy of 100,000 small files stalled at
/// its end). 255 files of 4 KiB on one stream make the copy's only bundle
/// such a frame: the copy ends, both ways, long before the idle time-out.
#[test]
fn a_bundle_longer_than_a_sealed_frame_is_sent_whole_both_ways() {
    let t = TempDir::new("sealed-long-bundle");
    let (exp, src, back) = (t.dir("export"), t.dir("files"), t.dir("back"));
    for i in 0..255 {
        write_random(&src.join(format!("f{i:03}")), 4096, i);
    }
    let s = data_server(&exp, &t.dir("state"));
    let ends = |from: &str, to: &str| {
        let out = t.path().join("cp.json");
        let mut cp = common::Owned::new(
            bin()
                .args(["cp", "--json", "--retries", "0", "-P", "1", "-r", from, to])
                .stdout(std::fs::File::create(&out).unwrap())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        common::wait_until("the copy of one long bundle to end", WAIT, || {
            cp.try_wait().unwrap().is_some()
        });
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(v["files"], 255, "{v}");
        assert_eq!(v["verified"], true, "{v}");
    };
    ends(src.to_str().unwrap(), &remote(s.addr(), ""));
    ends(&remote(s.addr(), "files"), back.to_str().unwrap());
    for i in 0..255 {
        let name = format!("files/f{i:03}");
        assert_same_file(&t.path().join(&name), &exp.join(&name));
        assert_same_file(&t.path().join(&name), &back.join(&name));
    }
}

/// Far beyond what 255 files of 4 KiB take on a busy machine (about a
/// second), far below the idle time-out (300 s) a stalled copy ends in.
const WAIT: Duration = Duration::from_secs(120);
