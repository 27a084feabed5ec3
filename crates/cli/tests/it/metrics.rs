//! What `longhaul serve` tells about what it serves: its Prometheus
//! metrics (`--metrics`), scraped by a real Prometheus, and its archive of
//! served runs (`--archive`).
//!
//! The Prometheus test needs `/usr/bin/prometheus` (Debian's
//! `prometheus` package, 2.42); without it the test says why and passes,
//! unless `LONGHAUL_REQUIRE_PROMETHEUS=1` (CI) makes that a failure.

use common::free_port;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use longhaul_archive::model::HistoryFilter;
use longhaul_archive::Archive;

use crate::common;
use common::served::Served;
use common::xfer::*;
use common::{bin, Owned, TempDir};

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// A `longhaul serve` process on loopback exporting `exp` as `data`, with
/// `extra` arguments; its address and, with `--metrics`, its metrics
/// address, read from its log.
struct Server {
    served: Served,
    addr: SocketAddr,
    metrics: Option<SocketAddr>,
}

fn serve(t: &TempDir, exp: &Path, extra: &[&str]) -> Server {
    let mut served = Served::start(
        bin()
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .arg("--state-dir")
            .arg(common::prepare_state(&t.dir("state")))
            .arg("--export")
            .arg(format!("data={}", exp.display()))
            .arg("--no-sync")
            .args(extra)
            .stdout(Stdio::null()),
    );
    let addr = served.addr();
    let metrics = extra.contains(&"--metrics").then(|| {
        let m = served.wait_said("metrics on http://", Duration::from_secs(30));
        m.trim_end_matches("/metrics").parse().unwrap()
    });
    Server {
        served,
        addr,
        metrics,
    }
}

/// Pushes a few files into the export; the bytes moved.
fn push_some(t: &TempDir, addr: SocketAddr) -> u64 {
    let src = t.dir("src");
    write_random(&src.join("a.bin"), 3 << 20, 1);
    write_random(&src.join("b.bin"), 12_345, 2);
    let v = cp_ok(&["-r", src.to_str().unwrap(), &remote(addr, "")]);
    let bytes = v["bytes"].as_u64().unwrap();
    assert_eq!(bytes, (3 << 20) + 12_345, "{v}");
    bytes
}

fn get(url: &str) -> Result<(String, String), String> {
    let mut r = ureq::get(url)
        .config()
        .timeout_global(Some(Duration::from_secs(20)))
        .proxy(None)
        .build()
        .call()
        .map_err(|e| e.to_string())?;
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
    Ok((ct, body))
}

/// The value of the sample line that starts with `prefix` (name and labels).
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn metrics_count_a_push_and_prometheus_scrapes_them() {
    let t = TempDir::new("metrics");
    let exp = t.dir("export");
    let s = serve(&t, &exp, &["--metrics", "127.0.0.1:0", "--no-archive"]);
    let m = s.metrics.unwrap();
    let bytes = push_some(&t, s.addr);

    // The server's own answer. The transfer is counted when it ends on the
    // server, which may be a moment after the client has its answer.
    let url = format!("http://{m}/metrics");
    let line = r#"longhaul_bytes_moved_total{kind="push",export="data",grant="7e570000"}"#;
    let start = Instant::now();
    let text = loop {
        let (ct, text) = get(&url).unwrap();
        assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
        if sample(&text, line) == Some(bytes as f64) {
            break text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{line} never became {bytes}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let files = r#"longhaul_files_moved_total{kind="push",export="data",grant="7e570000"}"#;
    assert_eq!(sample(&text, files), Some(2.0), "{text}");
    let ok = r#"longhaul_transfers_total{kind="push",export="data",grant="7e570000",result="ok"}"#;
    assert_eq!(sample(&text, ok), Some(1.0), "{text}");
    assert!(
        text.contains(
            r#"longhaul_transfer_rate_bits_per_second_count{kind="push",export="data"} 1"#
        ),
        "{text}"
    );

    // A real Prometheus scraping it.
    let installed = common::require::file(PROMETHEUS, "apt-get install prometheus");
    if !common::require::have("PROMETHEUS", installed) {
        return;
    }
    let prom = Prometheus::start(&t, m);
    let total = prom.wait_for("sum(longhaul_bytes_moved_total)", bytes as f64);
    assert_eq!(total, bytes as f64);
    // The labels arrive as they were exposed.
    let by_export = prom.wait_for(
        r#"sum by (export, grant) (longhaul_bytes_moved_total{export="data",grant="7e570000",kind="push"})"#,
        bytes as f64,
    );
    assert_eq!(by_export, bytes as f64);
    // A histogram Prometheus took in whole: its count series.
    prom.wait_for(
        r#"sum(longhaul_transfer_rate_bits_per_second_count{kind="push"})"#,
        1.0,
    );
}

/// A Prometheus scraping one target every second, from a temporary
/// directory; killed by its PID when dropped.
struct Prometheus {
    proc: Owned,
    api: String,
    log: PathBuf,
}

impl Prometheus {
    fn start(t: &TempDir, target: SocketAddr) -> Prometheus {
        let dir = t.dir("prometheus");
        let config = dir.join("prometheus.yml");
        fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: longhaul\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = dir.join("prometheus.log");
        let proc = Owned::spawn(
            Command::new(PROMETHEUS)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(&log).unwrap()),
        )
        .unwrap();
        Prometheus {
            proc,
            api: format!("http://127.0.0.1:{port}/api/v1/query"),
            log,
        }
    }

    /// Polls the instant query until its (first) value is `want`, for up
    /// to 90 s (Prometheus starts slowly on a busy machine); the value.
    fn wait_for(&self, query: &str, want: f64) -> f64 {
        let start = Instant::now();
        let mut last;
        loop {
            let url = format!("{}?query={}", self.api, encode(query));
            match get(&url) {
                Ok((_, body)) => {
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                    let value = v["data"]["result"][0]["value"][1]
                        .as_str()
                        .and_then(|s| s.parse::<f64>().ok());
                    if value == Some(want) {
                        return want;
                    }
                    last = body;
                }
                Err(e) => last = e,
            }
            if start.elapsed() > Duration::from_secs(90) {
                let log = fs::read_to_string(&self.log).unwrap_or_default();
                let targets = get(&self.api.replace("/query", "/targets"))
                    .map(|x| x.1)
                    .unwrap_or_default();
                panic!(
                    "Prometheus (pid {}) never answered {want} to {query}: last {last}\ntargets: {targets}\nlog:\n{log}",
                    self.proc.id()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Percent-encodes a query for a URL.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn a_served_push_is_archived_as_a_served_run() {
    let t = TempDir::new("served-archive");
    let exp = t.dir("export");
    let db = t.path().join("server-archive.db");
    let s = serve(&t, &exp, &["--archive", db.to_str().unwrap()]);
    let bytes = push_some(&t, s.addr);
    // The server writes its rows from a thread of its own: poll.
    let filter = HistoryFilter {
        kind: Some("served".into()),
        ..HistoryFilter::default()
    };
    let start = Instant::now();
    let run = loop {
        let runs = Archive::open_read_only(&db)
            .and_then(|a| a.history(&filter))
            .unwrap_or_default();
        if let Some(r) = runs.into_iter().find(|r| r.status != "running") {
            break r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no finished served run in {}",
            db.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(run.kind, "served");
    assert_eq!(run.status, "ok", "{run:?}");
    assert_eq!(run.export.as_deref(), Some("data"), "{run:?}");
    assert_eq!(run.grant.as_deref(), Some("7e570000"), "{run:?}");
    assert_eq!(run.bytes, Some(bytes), "{run:?}");
    assert_eq!(run.files, Some(2), "{run:?}");
    assert!(
        run.remote_host
            .as_deref()
            .is_some_and(|h| h.starts_with("127.0.0.1:")),
        "{run:?}"
    );
    let detail = Archive::open_read_only(&db).unwrap().run(run.id).unwrap();
    let params = detail.params.unwrap();
    assert_eq!(params["kind"], "push", "{params}");
    assert_eq!(params["direction"], "in", "{params}");
}

#[test]
fn an_unusable_archive_warns_once_and_the_server_serves() {
    let t = TempDir::new("served-bad-archive");
    let exp = t.dir("export");
    let db = t.path().join("garbage.db");
    fs::write(&db, vec![b'x'; 8192]).unwrap();
    let s = serve(&t, &exp, &["--archive", db.to_str().unwrap()]);
    push_some(&t, s.addr);
    let log = s.served.log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("not archiving what this server serves"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("garbage.db"), "{log}");
    // The file is left as it was.
    assert_eq!(fs::read(&db).unwrap(), vec![b'x'; 8192]);
}

#[test]
fn perf_tests_refusals_and_sessions_are_counted() {
    let t = TempDir::new("metrics-perf");
    let exp = t.dir("export");
    let s = serve(&t, &exp, &["--metrics", "127.0.0.1:0", "--no-archive"]);
    let url = format!("http://{}/metrics", s.metrics.unwrap());
    let o = bin()
        .args(["perf", &s.addr.to_string(), "-t", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    common::assert_exit(&o, 0);
    // A push to a name that is no export: refused, and the made-up name
    // never becomes a label.
    let o = longhaul(&[
        "cp",
        exp.to_str().unwrap(),
        &format!("{}:{}:made-up-name/", s.addr.ip(), s.addr.port()),
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", common::stderr(&o));

    let want = [
        (r#"longhaul_tests_total{grant="7e570000",result="ok"}"#, 1.0),
        (r#"longhaul_active_tests{grant="7e570000"}"#, 0.0),
        (r#"longhaul_active_sessions{grant="7e570000"}"#, 0.0),
        (
            r#"longhaul_refusals_total{what="push",export="",grant="7e570000",reason="bad_request"}"#,
            1.0,
        ),
    ];
    let start = Instant::now();
    let text = loop {
        let (_, text) = get(&url).unwrap();
        if want.iter().all(|(l, v)| sample(&text, l) == Some(*v)) {
            break text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never all of {want:?} in\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let perf_bytes = sample(
        &text,
        r#"longhaul_bytes_moved_total{kind="perf",export="",grant="7e570000"}"#,
    );
    assert!(perf_bytes.is_some_and(|b| b > 0.0), "{text}");
    assert!(!text.contains("made-up-name"), "{text}");
    assert!(!text.contains("127.0.0.1"), "{text}");
}

/// One request to `/metrics` naming `host`; the status and the answer.
fn scrape_as(m: SocketAddr, host: &str) -> (u16, String) {
    common::http::get(m, "/metrics", host, "")
}

/// A web page of evil.example whose name now points at this host asks
/// its browser for /metrics: the export and grant names stay here.
#[test]
fn metrics_refuse_a_rebound_host_name() {
    let t = TempDir::new("metrics-rebinding");
    let exp = t.dir("export");
    let s = serve(
        &t,
        &exp,
        &[
            "--metrics",
            "127.0.0.1:0",
            "--metrics-host",
            "dtn1.example.org",
            "--no-archive",
        ],
    );
    let m = s.metrics.unwrap();
    for host in [
        "evil.example".to_string(),
        format!("evil.example:{}", m.port()),
    ] {
        let (status, text) = scrape_as(m, &host);
        assert_eq!(status, 403, "{text}");
        assert!(!text.contains("longhaul_"), "{text}");
        assert!(text.contains("--metrics-host"), "{text}");
    }
    for host in [m.to_string(), format!("dtn1.example.org:{}", m.port())] {
        let (status, text) = scrape_as(m, &host);
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("longhaul_server_info"), "{text}");
    }
}

/// Clients that open connections, start a request and never finish its
/// header (twice the cap of 16) are cut off after the 10 s header limit,
/// and a real scrape is served.
#[test]
fn metrics_cut_off_slow_headers_and_still_answer_timed() {
    use std::io::{Read, Write};
    let t = TempDir::new("metrics-slowloris");
    let exp = t.dir("export");
    let s = serve(&t, &exp, &["--metrics", "127.0.0.1:0", "--no-archive"]);
    let m = s.metrics.unwrap();
    let mut slow: Vec<std::net::TcpStream> = (0..32)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(m).unwrap();
            c.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                .unwrap();
            c
        })
        .collect();
    let (status, text) = scrape_as(m, &m.to_string());
    assert_eq!(status, 200, "{text}");
    for c in slow.iter_mut() {
        c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut b = [0u8; 256];
        let cut = loop {
            match c.read(&mut b) {
                Ok(0) => break true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
                Err(_) => break false,
            }
        };
        assert!(cut, "a slow client was never cut off");
    }
}

/// A client that does not trust the server ends its connection in the TLS
/// handshake; a cp dials its data streams meanwhile, yet the server counts
/// one failed handshake for it, not one per stream.
#[test]
fn a_client_refusing_the_server_is_one_handshake_error() {
    let t = TempDir::new("metrics-untrusted");
    let exp = t.dir("export");
    let s = serve(&t, &exp, &["--metrics", "127.0.0.1:0", "--no-archive"]);
    let url = format!("http://{}/metrics", s.metrics.unwrap());
    let src = t.path().join("a.bin");
    write_random(&src, 1 << 20, 3);
    let wrong = "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let o = bin()
        .arg("cp")
        .arg(&src)
        .arg(remote(s.addr, ""))
        .env("LONGHAUL_TRUST", wrong)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    common::assert_exit(&o, 7);
    let line = r#"longhaul_errors_total{stage="handshake",export="",grant="anonymous"}"#;
    let start = Instant::now();
    let mut first = None;
    loop {
        let (_, text) = get(&url).unwrap();
        let n = sample(&text, line);
        assert!(
            n.is_none_or(|n| n <= 1.0),
            "one client, {n:?} errors:\n{text}"
        );
        match first {
            None if n == Some(1.0) => first = Some(Instant::now()),
            // Every connection the client made is over by now: a second
            // count would have come.
            Some(at) if at.elapsed() > Duration::from_secs(3) => break,
            _ => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no handshake error counted:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
