//! Trust, third round (issue 40): each hole played as an attacker would,
//! against the real binary. A request's cost is bounded before it is
//! served (filter rules under one budget, compiled only once the request
//! holds its slot, the server's memory watched); no peer steers a far end
//! (a relayed ticket with a second line, a listener at the address it
//! names); a listener keeps its door open to everyone (idle sockets on the
//! iperf3 port, then a real iperf3 client); no peer's words reach the
//! terminal raw (a planted server's refusal full of terminal controls);
//! and a third-party copy gives each server its own credential only.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_engine::net::conn::FramedConn;
use longhaul_engine::server::auth::{self, ExportGrant};
use longhaul_engine::server::observe::{Refused, ServeObserver, Session};
use longhaul_engine::server::{ServeConfig, Server, ServerHandle};
use longhaul_engine::xfer::storage::Local;
use longhaul_proto::frame::MAGIC;
use longhaul_proto::msg::{Hello, Message, Refuse, RefuseCode, Role, Welcome};
use longhaul_proto::xfer::{Op, TransferRequest};

use crate::common;
use common::require::{have, program};
use common::served::Served;
use common::xfer::{build_tree, export, remote};
use common::{assert_exit, bin, free_port, stderr, stdout, TempDir};

// ---------------------------------------------------------------- helpers

/// Runs `longhaul serve ARGS` with at most 4 GiB of address space (so
/// that a server that would take more dies instead of the host), and
/// waits for its stderr to say `ready` followed by an address.
fn serve_real(args: &[&str], ready: &str) -> (Served, SocketAddr) {
    use std::os::unix::process::CommandExt;
    let mut c = bin();
    c.arg("serve").args(args).stdout(Stdio::null());
    // SAFETY: between fork and exec only setrlimit runs, which is
    // async-signal-safe and touches no memory of the parent.
    unsafe {
        c.pre_exec(|| {
            let cap = rustix::process::Rlimit {
                current: Some(4 << 30),
                maximum: Some(4 << 30),
            };
            rustix::process::setrlimit(rustix::process::Resource::As, cap)
                .map_err(std::io::Error::from)
        });
    }
    let mut served = Served::start(&mut c);
    let addr = served.wait_said(ready, Duration::from_secs(60));
    let addr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
    (served, addr)
}

/// A process's peak resident memory (`VmHWM`), in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .expect("VmHWM in /proc/PID/status");
    kib << 10
}

fn hello(token: Option<&str>) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    Message::Hello(Hello {
        min_version: longhaul_proto::msg::PROTOCOL_VERSION,
        max_version: longhaul_proto::msg::PROTOCOL_VERSION,
        software: "trust test".into(),
        role: Role::Control,
        token: token.map(str::to_string),
        token_id: None,
    })
    .encode(&mut b)
    .unwrap();
    b
}

/// A control session over TLS, welcomed (`token` None: anonymous).
fn control(addr: SocketAddr, token: Option<&str>) -> FramedConn {
    let mut st = common::tls_to(addr);
    st.write_all(&hello(token)).unwrap();
    st.flush().unwrap();
    let mut conn = FramedConn::new(st, addr.to_string());
    match conn.recv_until(Instant::now() + Duration::from_secs(10)) {
        Ok(Some(Message::Welcome(_))) => conn,
        other => panic!("no welcome: {other:?}"),
    }
}

fn pull(export: &str, source: &str, filter: Vec<String>) -> Message {
    Message::TransferRequest(TransferRequest {
        op: Op::Pull,
        export: export.into(),
        dest: String::new(),
        sources: vec![source.into()],
        source_count: 1,
        recursive: false,
        preserve: false,
        streams: 1,
        chunk_size: Some(1 << 20),
        force: false,
        sync: None,
        dry_run: false,
        verify: false,
        contents: false,
        dest_dir: false,
        mkpath: false,
        direct: false,
        tuning: Default::default(),
        bundles: false,
        parts: false,
        sealed: false,
        source_dir: false,
        filter,
        compress: None,
        defer_full: false,
        tag_checks: false,
    })
}

/// A planted server at a loopback address: TLS with the tests' identity
/// (so the client trusts it), then, for each connection, `script` with
/// the connection and the client's `Hello`.
fn planted(script: impl Fn(FramedConn, Hello) + Send + Sync + 'static) -> SocketAddr {
    use longhaul_engine::net::tls;
    let (dir, _) = common::identity();
    let (id, _) = tls::Identity::load_or_create(dir).unwrap();
    let cfg = tls::server_config(&id).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let script = Arc::new(script);
    std::thread::spawn(move || {
        for tcp in l.incoming().flatten() {
            let (cfg, script) = (cfg.clone(), script.clone());
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(10);
                let Ok(mut st) = tls::accept(&cfg, tcp, deadline) else {
                    return;
                };
                let mut magic = [0u8; MAGIC.len()];
                if st.read_exact(&mut magic).is_err() || magic != MAGIC {
                    return;
                }
                let mut conn = FramedConn::new(st, "client".into());
                if let Ok(Some(Message::Hello(h))) =
                    conn.recv_until(Instant::now() + Duration::from_secs(10))
                {
                    script(conn, h);
                }
            });
        }
    });
    addr
}

fn welcome(features: &[&str]) -> Message {
    Message::Welcome(Welcome {
        version: longhaul_proto::msg::PROTOCOL_VERSION,
        software: "planted".into(),
        host: "planted".into(),
        buffers: Default::default(),
        max_streams: None,
        features: features.iter().map(|f| f.to_string()).collect(),
    })
}

// ------------------------------------------- 1. one request, one budget

/// Issue 40, A1: a pull's rules from an anonymous client of a `:public`
/// export, as the attack sent them (a thousand rules of 200 `?`, and the
/// POSIX class that became a counted Unicode repeat), wait their turn
/// while the only slot is taken (nothing is compiled meanwhile), then are
/// compiled under the request's one budget and refused, naming it; the
/// server's peak memory (VmHWM) grows by a few MB at most, and it serves
/// on.
#[test]
fn attacker_filter_rules_wait_for_a_slot_and_cannot_grow_the_servers_memory() {
    let t = TempDir::new("trust-filter");
    let public = t.dir("pub");
    std::fs::write(public.join("a.txt"), b"public\n").unwrap();
    let state = common::prepare_state(&t.dir("state"));
    let export = format!("pub={}:ro:public", public.display());
    let (served, addr) = serve_real(
        &[
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            state.to_str().unwrap(),
            "--export",
            &export,
            "--max-tests",
            "1",
            "--handshake-timeout",
            "5s",
            "--no-archive",
        ],
        "serving on ",
    );
    // The one slot, held by a pull whose data streams never come (until
    // the handshake time-out frees it).
    let mut holder = control(addr, None);
    holder.send(&pull("pub", "a.txt", Vec::new())).unwrap();
    match holder.recv_until(Instant::now() + Duration::from_secs(10)) {
        Ok(Some(Message::TransferAccept(_))) => {}
        other => panic!("the holder's pull was not accepted: {other:?}"),
    }
    let before = peak_memory(served.id());
    let mut rules = vec![format!("- {}", "?".repeat(200)); 1000];
    rules.extend(vec!["- [[:a]]\\w{20}[[b:]]".to_string(); 200]);
    let mut attacker = control(addr, None);
    attacker.send(&pull("pub", "a.txt", rules)).unwrap();
    // Queued behind the holder: told so, and nothing compiled yet.
    match attacker.recv_until(Instant::now() + Duration::from_secs(10)) {
        Ok(Some(Message::Queued(_))) => {}
        other => panic!("the rules were taken on before the request held a slot: {other:?}"),
    }
    let queued = peak_memory(served.id());
    assert!(
        queued < before + (16 << 20),
        "{} MB more while queued",
        (queued - before) >> 20
    );
    // Its turn: the budget refuses the rules, naming the first over it.
    let until = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        match attacker.recv_until(until) {
            Ok(Some(Message::Queued(_))) => continue,
            other => break other,
        }
    };
    let after = peak_memory(served.id());
    match answer {
        Ok(Some(Message::Refuse(r))) => {
            assert_eq!(r.code, RefuseCode::BadRequest, "{}", r.message);
            assert!(
                r.message.contains("filter rule") && r.message.contains("MiB"),
                "{}",
                r.message
            );
        }
        other => panic!("the rules were not refused: {other:?}"),
    }
    assert!(
        after < before + (64 << 20),
        "the server's peak memory grew by {} MB",
        (after - before) >> 20
    );
    drop(holder);
    // It serves on.
    let o = bin()
        .env_remove("LONGHAUL_TOKEN")
        .args(["ls", &format!("{}:{}:pub/", addr.ip(), addr.port())])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("a.txt"), "{}", stdout(&o));
}

// ------------------------------------ 2. no peer steers a walled far end

/// Issue 40, A2: a malicious source relays a connect-back "ticket" that
/// carries a second line, `connect-back ADDR:PORT TICKET`, naming a
/// listener of its choice (at 127.0.0.2). The destination is a far end
/// over ssh that connects back (`--connect-back`). The client refuses the
/// relay (its ticket is not of the exact form) and says the source sent
/// it; nothing ever connects to the listener.
#[test]
fn attacker_a_relayed_ticket_with_a_second_line_reaches_no_listener() {
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("trust-relay");
    let dest = t.dir("dest");
    let bait = TcpListener::bind("127.0.0.2:0").unwrap();
    let bait_at = bait.local_addr().unwrap();
    let reached = Arc::new(AtomicBool::new(false));
    {
        let reached = reached.clone();
        std::thread::spawn(move || {
            for c in bait.incoming() {
                if c.is_ok() {
                    reached.store(true, Ordering::SeqCst);
                }
            }
        });
    }
    let ticket = "lh1b_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
    let evil = format!("{ticket}\nconnect-back {bait_at} {ticket}");
    let watched = reached.clone();
    let source = planted(move |mut conn, _| {
        conn.send(&welcome(&[longhaul_proto::msg::FEATURE_COPY_BACK]))
            .unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            match conn.recv_until(until) {
                Ok(Some(Message::CopyOrder(_))) => break,
                Ok(Some(_)) => continue,
                _ => return,
            }
        }
        let relay = longhaul_proto::msg::CopyRelay::ConnectBack(
            longhaul_proto::xfer::copy::CopyConnectBack {
                // The address the order named (where the client reached
                // this source), and a port: past the client's first check.
                addr: "127.0.0.1:41234".into(),
                ticket: evil.clone(),
            },
        );
        if conn.send(&Message::CopyRelay(relay)).is_err() {
            return;
        }
        // Until the client hangs up (it refused), or the bait was reached
        // (it did not): then the copy "fails" and the client ends.
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until && !watched.load(Ordering::SeqCst) {
            match conn.recv(Duration::from_millis(50)) {
                Ok(_) => {}
                Err(_) => return,
            }
        }
        let _ = conn.send(&Message::CopyRelay(longhaul_proto::msg::CopyRelay::Failed(
            Refuse {
                code: RefuseCode::ServerError,
                message: "planted source: the end".into(),
            },
        )));
    });
    let tokens = t.path().join("source.token");
    longhaul_testkit::data::write_secret(&tokens, common::TOKEN);
    let o = s
        .longhaul()
        .env("LONGHAUL_TRUST", common::fingerprint())
        .env("LONGHAUL_ARCHIVE", common::archive_file())
        .env("LONGHAUL_PATHS", common::paths_file())
        .args(["cp", "--connect-back", "--remote-path", common::sshd::BIN])
        .arg("--token-file")
        .arg(format!("{source}={}", tokens.display()))
        .arg(remote(source, "x"))
        .arg(format!("{}:{}/", common::sshd::HOST, dest.display()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let e = stderr(&o);
    assert!(!o.status.success(), "{e}");
    assert!(
        !reached.load(Ordering::SeqCst),
        "the far end connected to the address a relayed second line named: {e}"
    );
    assert!(
        e.contains(&format!("the source ({source})")) && e.contains("ticket"),
        "the refusal does not say the source sent a bad ticket: {e}"
    );
    assert!(!e.contains(ticket), "a ticket was shown: {e}");
}

// ------------------------------------------ 3. the iperf3 port stays open

fn iperf3_here() -> bool {
    have("IPERF3", program("iperf3", "iperf3"))
}

/// Connections waiting in the kernel's accept queue of the listener on
/// `port` (`/proc/net/tcp`, the `rx_queue` of its LISTEN socket).
fn accept_backlog(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let local = f.get(1)?;
        let listening = f.get(3) == Some(&"0A");
        let port_hex = local.rsplit(':').next()?;
        (listening && u16::from_str_radix(port_hex, 16).ok()? == port).then(|| {
            let rx = f.get(4)?.split(':').nth(1)?;
            u64::from_str_radix(rx, 16).ok()
        })?
    })
}

/// Issue 40, A3: 64 idle sockets from one address (as many as the port
/// reads cookies for at once), taken by the server, then Debian's own
/// iperf3 client from that same address: served, a second after, because
/// the idlest idle sockets make room (and never more than its share are
/// kept from one address).
#[test]
fn attacker_64_idle_sockets_from_one_address_leave_the_iperf3_port_open() {
    if !iperf3_here() {
        return;
    }
    let t = TempDir::new("trust-iperf3");
    let state = common::prepare_state(&t.dir("state"));
    let port = free_port();
    let (_served, _) = serve_real(
        &[
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            state.to_str().unwrap(),
            "--iperf3",
            &format!("127.0.0.1:{port}"),
            "--handshake-timeout",
            "120s",
            "--no-archive",
        ],
        "serving on ",
    );
    let idle: Vec<TcpStream> = (0..64)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    // Every one of them taken by the server (none left in the backlog).
    let until = Instant::now() + Duration::from_secs(60);
    while accept_backlog(port) != Some(0) {
        assert!(Instant::now() < until, "the server took no connections");
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    let o = Command::new("iperf3")
        .args(["-c", "127.0.0.1", "-p", &port.to_string(), "-t", "1", "-J"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_exit(&o, 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let got = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    assert!(got > 0, "{v}");
    assert!(started.elapsed() < Duration::from_secs(60));
    // The first idle sockets were closed to make room.
    let mut first = idle.into_iter().next().unwrap();
    first
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 1];
    assert!(
        !matches!(first.read(&mut b), Ok(1)),
        "the idlest socket was kept"
    );
}

// ----------------------------- 4. no peer's words reach the terminal raw

/// What a malicious server says: it sets the window title, clears the
/// screen, returns to the line's start and prints a line of its own.
const EVIL: &str =
    "\u{1b}]0;pwned\u{7}\u{1b}[2J\rall files verified\n\u{9b}31mlonghaul: done\u{202e}";

fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

/// Issue 40, A4: a planted server refuses with terminal controls and a
/// line of its own. `ls`, `cp` (push and pull) and `perf` print its words
/// escaped, on the refusal's own line; `--json` keeps the document valid
/// and its words exact.
#[test]
fn attacker_a_refusal_full_of_terminal_controls_is_printed_escaped() {
    let t = TempDir::new("trust-escape");
    let src = t.path().join("f.txt");
    std::fs::write(&src, b"x").unwrap();
    let server = planted(|mut conn, _| {
        let _ = conn.send(&Message::Refuse(Refuse {
            code: RefuseCode::Unauthorized,
            message: EVIL.into(),
        }));
        // Read what the client sent after its hello until it hangs up, so
        // that closing never resets the connection under the refusal.
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until && conn.recv(Duration::from_millis(100)).is_ok() {}
    });
    let here = t.dir("here");
    let runs: Vec<Vec<String>> = vec![
        vec!["ls".into(), remote(server, "")],
        vec!["cp".into(), src.display().to_string(), remote(server, "")],
        vec![
            "cp".into(),
            remote(server, "f.txt"),
            here.display().to_string(),
        ],
        vec!["perf".into(), "-t".into(), "1".into(), server.to_string()],
    ];
    for args in runs {
        let o = bin()
            .args(&args)
            .arg("--retries=0")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (out, err) = (stdout(&o), stderr(&o));
        assert!(!o.status.success(), "{args:?}: {err}");
        for text in [&out, &err] {
            assert!(
                raw_controls(text).is_empty(),
                "{args:?}: raw {:?} in {text:?}",
                raw_controls(text)
            );
        }
        assert!(
            err.contains("\\u{1b}]0;pwned") && err.contains("\\rall files verified\\n"),
            "{args:?}: the server's words are not shown escaped: {err}"
        );
        assert!(
            !err.lines()
                .any(|l| l.starts_with("all files verified") || l.starts_with("longhaul: done")),
            "{args:?}: a line of the server's own: {err}"
        );
    }
    // A JSON document stays one, and says exactly what the server said.
    let o = bin()
        .args(["ls", "--json", "--retries=0", &remote(server, "")])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = stdout(&o);
    assert!(raw_controls(&out).is_empty(), "{out:?}");
    if !out.trim().is_empty() {
        let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
        assert!(v.to_string().contains("pwned"), "{v}");
    }
}

// ------------------------------- 5. one credential for each server

/// What a server saw: the grant of every session, the grant and reason of
/// every refusal.
#[derive(Default)]
struct Seen {
    sessions: Mutex<Vec<String>>,
    refused: Mutex<Vec<(String, String)>>,
}

impl ServeObserver for Seen {
    fn session_opened(&self, s: &Session) {
        self.sessions.lock().unwrap().push(s.grant.clone());
    }
    fn refused(&self, r: &Refused) {
        self.refused
            .lock()
            .unwrap()
            .push((r.grant.clone(), r.message.clone()));
    }
}

/// A server taking part in third-party copies whose only grant is
/// `token`'s, watched by `seen`.
fn copy_server(root: &Path, state: &Path, token: &str, seen: Arc<Seen>) -> ServerHandle {
    std::fs::create_dir_all(state).unwrap();
    let id = common::identity();
    std::fs::copy(
        id.0.join(longhaul_engine::net::tls::IDENTITY_FILE),
        state.join(longhaul_engine::net::tls::IDENTITY_FILE),
    )
    .unwrap();
    auth::add_token(
        state,
        token,
        vec![ExportGrant {
            name: "*".into(),
            write: true,
        }],
        "trust test",
    )
    .unwrap();
    Server::bind(
        &[SocketAddr::from(([127, 0, 0, 1], 0))],
        ServeConfig {
            exports: vec![export("data", root, false)],
            storage: Arc::new(Local),
            sync_files: false,
            state_dir: state.to_path_buf(),
            third_party_copies: true,
            observers: vec![seen],
            ..ServeConfig::default()
        },
    )
    .expect("bind loopback")
    .spawn()
}

fn grant_id(token: &str) -> &str {
    token.split('_').nth(1).unwrap()
}

/// Issue 40, A5 (and issue 41, B5): a copy from server A to server B with
/// a credential for each (`--token-file HOST=FILE`), each valid on its own
/// server only: A's sessions were all A's grant, B's all B's (or the
/// capability), none saw the other's; while a default credential that
/// would go to both (`LONGHAUL_TOKEN`, a plain `--token-file`) is refused
/// before anything is dialled, and a refusal names the server that
/// refused.
#[test]
fn a_third_party_copy_presents_each_server_its_own_credential() {
    let t = TempDir::new("trust-tokens");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    build_tree(&ra.join("tree"));
    let token_a = "lh1_aaaa0001_sourcesecret-sourcesecret-sourcesecret-01";
    let token_b = "lh1_bbbb0002_destsecret-destsecret-destsecret-destsecret-2";
    let (seen_a, seen_b) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
    let a = copy_server(&ra, &t.dir("state-a"), token_a, seen_a.clone());
    let b = copy_server(&rb, &t.dir("state-b"), token_b, seen_b.clone());
    let (fa, fb) = (t.path().join("a.token"), t.path().join("b.token"));
    longhaul_testkit::data::write_secret(&fa, token_a);
    longhaul_testkit::data::write_secret(&fb, token_b);
    let per_server = |extra: &[String]| {
        bin()
            .env_remove("LONGHAUL_TOKEN")
            .args(["cp", "-r", "--json", "--retries=0"])
            .args(extra)
            .arg(remote(a.addr(), "tree"))
            .arg(remote(b.addr(), ""))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let o = per_server(&[
        format!("--token-file={}={}", a.addr(), fa.display()),
        format!("--token-file={}={}", b.addr(), fb.display()),
    ]);
    assert_exit(&o, 0);
    common::xfer::assert_same_tree(&ra.join("tree"), &rb.join("tree"), false);
    let (sa, sb) = (
        seen_a.sessions.lock().unwrap().clone(),
        seen_b.sessions.lock().unwrap().clone(),
    );
    assert!(sa.iter().any(|g| g == grant_id(token_a)), "A saw {sa:?}");
    assert!(sb.iter().any(|g| g == grant_id(token_b)), "B saw {sb:?}");
    assert!(
        !sa.iter().any(|g| g.contains(grant_id(token_b))),
        "A saw B's: {sa:?}"
    );
    assert!(
        !sb.iter().any(|g| g.contains(grant_id(token_a))),
        "B saw A's: {sb:?}"
    );
    for (server, seen) in [("A", &seen_a), ("B", &seen_b)] {
        let r = seen.refused.lock().unwrap().clone();
        assert!(r.is_empty(), "{server} refused {r:?}");
    }

    // One credential for both, from the environment or a plain
    // --token-file: refused before anything is dialled.
    let (before_a, before_b) = (sa.len(), sb.len());
    let shared = t.path().join("shared.token");
    longhaul_testkit::data::write_secret(&shared, token_a);
    let by_env = bin()
        .env("LONGHAUL_TOKEN", token_a)
        .args(["cp", "-r", "--retries=0"])
        .arg(remote(a.addr(), "tree"))
        .arg(remote(b.addr(), "again/"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let by_file = per_server(&[format!("--token-file={}", shared.display())]);
    for o in [by_env, by_file] {
        assert_exit(&o, 2);
        let e = stderr(&o);
        assert!(
            e.contains(&a.addr().to_string())
                && e.contains(&b.addr().to_string())
                && e.contains("--token-file"),
            "{e}"
        );
    }
    assert_eq!(seen_a.sessions.lock().unwrap().len(), before_a);
    assert_eq!(seen_b.sessions.lock().unwrap().len(), before_b);
    assert!(!rb.join("again").exists());

    // The destination refuses (A's token, which it does not know): the
    // refusal says it was the destination, and which.
    let o = per_server(&[
        format!("--token-file={}={}", a.addr(), fa.display()),
        format!("--token-file={}={}", b.addr(), fa.display()),
    ]);
    assert_exit(&o, 4);
    let e = stderr(&o);
    assert!(
        e.contains(&format!("the destination ({})", b.addr())),
        "the refusal does not name the server: {e}"
    );
    a.shutdown();
    b.shutdown();
}
