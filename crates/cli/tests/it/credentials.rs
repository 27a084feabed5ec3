//! No credential on a plaintext connection (issue 13, item 14): what a
//! client writes is recorded by a proxy in the middle, as an eavesdropper
//! on the path would see it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use longhaul_engine::server::{ServeConfig, ServerHandle};

use crate::common;
use common::{assert_exit, bin, stderr, TempDir, TOKEN};

/// The secret part of the test token: what must never be on the wire.
fn secret() -> &'static str {
    TOKEN.rsplit_once('_').unwrap().1
}

fn server(root: &Path, state: &Path, allow_plaintext: bool) -> ServerHandle {
    common::xfer::spawn_server(ServeConfig {
        allow_plaintext,
        ..common::xfer::data_config(root, state, false)
    })
}

/// A TCP proxy to `to` that records every byte clients send, per
/// connection, in order.
struct Recorder {
    addr: SocketAddr,
    sent: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Recorder {
    fn start(to: SocketAddr) -> Recorder {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let all = sent.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(client) = c else { return };
                let Ok(upstream) = TcpStream::connect(to) else {
                    continue;
                };
                let slot = {
                    let mut a = all.lock().unwrap();
                    a.push(Vec::new());
                    a.len() - 1
                };
                let (mut c_r, mut u_w) =
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let rec = all.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n) = c_r.read(&mut buf) {
                        if n == 0 || u_w.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        rec.lock().unwrap()[slot].extend_from_slice(&buf[..n]);
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
        Recorder { addr, sent }
    }

    fn connections(&self) -> Vec<Vec<u8>> {
        self.sent.lock().unwrap().clone()
    }

    /// Panics if any connection carried the token's secret.
    fn assert_no_secret(&self) {
        let s = secret().as_bytes();
        for (i, c) in self.connections().iter().enumerate() {
            assert!(
                !c.windows(s.len()).any(|w| w == s),
                "connection {i} carried the token's secret: {}",
                String::from_utf8_lossy(c)
            );
        }
    }
}

#[test]
fn a_plaintext_client_proves_its_token_and_never_sends_it() {
    let t = TempDir::new("cred-plain");
    let (exp, src) = (t.dir("export"), t.dir("src"));
    std::fs::write(src.join("a.bin"), vec![5u8; 3 << 20]).unwrap();
    let s = server(&exp, &t.dir("state"), true);
    let proxy = Recorder::start(s.addr());
    let o = bin()
        .args([
            "cp",
            "--insecure-plaintext",
            src.join("a.bin").to_str().unwrap(),
            &format!("127.0.0.1:{}:data/", proxy.addr.port()),
        ])
        .output()
        .unwrap();
    assert_exit(&o, 0);
    assert_eq!(
        std::fs::read(exp.join("a.bin")).unwrap(),
        std::fs::read(src.join("a.bin")).unwrap()
    );
    proxy.assert_no_secret();
    // What an eavesdropper saw does not let it in: the control connection
    // replayed byte for byte is refused (its proof answered another
    // connection's challenge).
    assert_replay_refused(s.addr(), &proxy.connections()[0]);
    s.shutdown();
}

/// Sends what a client sent on a recorded connection, byte for byte, and
/// returns the server's answer as messages.
fn replay(to: SocketAddr, recorded: &[u8]) -> Vec<longhaul_proto::msg::Message> {
    use longhaul_proto::frame::Decoder;
    let mut c = TcpStream::connect(to).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The answer is read as it comes: the server refuses before it has
    // read all of a long recording.
    let _ = c.write_all(recorded);
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    let mut d = Decoder::new(1 << 20);
    d.push(&answer);
    let mut out = Vec::new();
    while let Ok(Some(f)) = d.next_frame() {
        out.push(longhaul_proto::msg::Message::decode(&f).unwrap());
    }
    out
}

/// A replay of `recorded` at `to` meets a fresh challenge and is refused
/// as unauthorized, never welcomed.
fn assert_replay_refused(to: SocketAddr, recorded: &[u8]) {
    use longhaul_proto::msg::{Message, RefuseCode};
    let answer = replay(to, recorded);
    assert!(
        matches!(
            answer.as_slice(),
            [Message::Challenge(_), Message::Refuse(r)]
                if r.code == RefuseCode::Unauthorized && r.message.contains("challenge")
        ),
        "a replayed proof was not refused at {to}: {answer:?}"
    );
}

/// Issue 26, A6: a proof an eavesdropper recorded on one plaintext
/// connection is worth nothing anywhere else: not on another connection
/// to the same server, not at a second server that shares the grant, and
/// not at the same server after a restart (nothing it remembered is
/// needed: every connection has its own challenge).
#[test]
fn a_recorded_proof_is_refused_everywhere_else_and_after_a_restart() {
    let t = TempDir::new("cred-replay");
    let (exp, src, state) = (t.dir("export"), t.dir("src"), t.dir("state"));
    std::fs::write(src.join("a.bin"), vec![5u8; 64 << 10]).unwrap();
    let s1 = server(&exp, &state, true);
    // The same grant on another server (`token add` of one token on many).
    let exp2 = t.dir("export2");
    let s2 = server(&exp2, &t.dir("state2"), true);
    let proxy = Recorder::start(s1.addr());
    let o = bin()
        .args([
            "cp",
            "--insecure-plaintext",
            src.join("a.bin").to_str().unwrap(),
            &format!("127.0.0.1:{}:data/", proxy.addr.port()),
        ])
        .output()
        .unwrap();
    assert_exit(&o, 0);
    proxy.assert_no_secret();
    let recorded = proxy.connections()[0].clone();
    std::fs::remove_file(exp.join("a.bin")).unwrap();

    assert_replay_refused(s1.addr(), &recorded);
    assert_replay_refused(s2.addr(), &recorded);
    s1.shutdown();
    let restarted = server(&exp, &state, true);
    assert_replay_refused(restarted.addr(), &recorded);
    // Nothing landed anywhere.
    assert!(!exp.join("a.bin").exists());
    assert!(!exp2.join("a.bin").exists());
    restarted.shutdown();
    s2.shutdown();
}

/// The replayable proofs of clients before challenges (`lh1p_...` in the
/// hello, good for 300 s and kept in memory only) are refused, also when
/// freshly made and valid by the old rule.
#[test]
fn an_old_kind_of_proof_is_refused_even_when_valid() {
    use longhaul_proto::frame::MAGIC;
    use longhaul_proto::msg::{Hello, Message, RefuseCode, Role, PROTOCOL_VERSION};
    let t = TempDir::new("cred-oldproof");
    let s = server(&t.dir("export"), &t.dir("state"), true);
    let id = TOKEN.split('_').nth(1).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let nonce = "07".repeat(16);
    let msg = format!("longhaul token proof v1\0{id}\0{now}\0{nonce}");
    let mac = blake3::keyed_hash(blake3::hash(TOKEN.as_bytes()).as_bytes(), msg.as_bytes());
    let old = format!("lh1p_{id}_{now}_{nonce}_{}", mac.to_hex());
    for tls in [false, true] {
        let mut b = MAGIC.to_vec();
        Message::Hello(Hello {
            min_version: PROTOCOL_VERSION,
            max_version: PROTOCOL_VERSION,
            software: "longhaul before challenges".into(),
            role: Role::Control,
            token: Some(old.clone()),
            token_id: None,
        })
        .encode(&mut b)
        .unwrap();
        let answer = if tls {
            let mut st = common::tls_to(s.addr());
            st.write_all(&b).unwrap();
            st.flush().unwrap();
            let mut conn = longhaul_engine::net::conn::FramedConn::new(st, s.addr().to_string());
            conn.recv(Duration::from_secs(10))
                .ok()
                .flatten()
                .into_iter()
                .collect()
        } else {
            replay(s.addr(), &b)
        };
        assert!(
            matches!(
                answer.as_slice(),
                [Message::Refuse(r)] if r.code == RefuseCode::Unauthorized && r.message.contains("old kind")
            ),
            "tls {tls}: {answer:?}"
        );
    }
    s.shutdown();
}

#[test]
fn a_raw_token_sent_in_the_clear_is_refused() {
    use longhaul_proto::frame::MAGIC;
    use longhaul_proto::msg::{Hello, Message, Role, PROTOCOL_VERSION};
    let t = TempDir::new("cred-raw");
    let s = server(&t.dir("export"), &t.dir("state"), true);
    let mut b = MAGIC.to_vec();
    Message::Hello(Hello {
        min_version: PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        software: "an old client".into(),
        role: Role::Control,
        token: Some(TOKEN.into()),
        token_id: None,
    })
    .encode(&mut b)
    .unwrap();
    let mut c = TcpStream::connect(s.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(&b).unwrap();
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.contains("in the clear"), "{answer}");
    s.shutdown();
}

/// `doctor --json` through a recording proxy to a server that allows
/// plaintext or not; checks that no connection carried the token, and
/// returns the report.
fn doctor_through_a_recorder(name: &str, allow_plaintext: bool) -> serde_json::Value {
    let t = TempDir::new(name);
    let s = server(&t.dir("export"), &t.dir("state"), allow_plaintext);
    let proxy = Recorder::start(s.addr());
    let o = bin()
        .arg("doctor")
        .arg(format!("127.0.0.1:{}:data/", proxy.addr.port()))
        .args(["--json", "--time", "1s", "--no-copy", "--no-remember"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(proxy.connections().len() > 2);
    proxy.assert_no_secret();
    s.shutdown();
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn doctor_against_a_tls_only_server_never_sends_the_token_in_the_clear() {
    let v = doctor_through_a_recorder("cred-doctor", false);
    // Plaintext perf data streams run on a TLS-only server (issue 15), with
    // no token on them: the cost without TLS is measured.
    assert_eq!(v["plain_measured"], true, "{v:#}");
}

#[test]
fn doctor_measures_plaintext_where_both_ends_allow_it_without_the_token() {
    let v = doctor_through_a_recorder("cred-doctor-plain", true);
    assert_eq!(v["plain_measured"], true, "{v:#}");
}
