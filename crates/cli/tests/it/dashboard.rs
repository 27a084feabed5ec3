//! `longhaul dashboard` in a real browser: Debian's chromium, driven
//! headless through chromedriver's W3C WebDriver HTTP API. A run goes on
//! while the page is open; the test waits for it on the live page, checks
//! that its rate is pushed at least every 2 s, opens its run page, checks
//! the chart has data, and takes screenshots that must not be blank.
//!
//! Without chromium and chromedriver the test says why and passes, unless
//! `LONGHAUL_REQUIRE_BROWSER=1` (CI), where it fails.

use crate::common;

use common::free_port;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Everything the test started, ended (by PID) however the test ends.
#[derive(Default)]
struct Guard {
    children: Vec<(&'static str, Child)>,
    session: Option<String>,
    /// Printed when the test fails.
    log: Option<PathBuf>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(l) = &self.log {
                let text = std::fs::read_to_string(l).unwrap_or_default();
                eprintln!("{}:\n{text}", l.display());
            }
        }
        if let Some(s) = self.session.take() {
            let _ = ureq::delete(&s)
                .config()
                .timeout_global(Some(Duration::from_secs(20)))
                .proxy(None)
                .build()
                .call();
        }
        for (_, c) in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[track_caller]
fn browser_available() -> Option<String> {
    let installed = [CHROMIUM, CHROMEDRIVER]
        .into_iter()
        .try_for_each(|p| common::require::file(p, "apt-get install chromium chromium-driver"));
    common::require::have("BROWSER", installed).then(|| CHROMIUM.to_string())
}

/// A WebDriver client on loopback (no proxy from the environment): an error
/// status is an answer (its body says why).
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .proxy(None)
        .http_status_as_error(false)
        .build()
        .into()
}

/// One WebDriver command (a `GET`, or a `POST` of `body`); its `value`, or
/// the error it answered.
fn wd(method: &str, url: &str, body: Option<Value>) -> Result<Value, String> {
    let resp = match (method, body) {
        ("GET", None) => agent().get(url).call(),
        ("POST", Some(b)) => agent()
            .post(url)
            .header("content-type", "application/json")
            .send(b.to_string()),
        (m, b) => panic!("no WebDriver command {m} with body {b:?} in these tests"),
    };
    let mut r = resp.map_err(|e| e.to_string())?;
    // A screenshot's base64 can pass the default 10 MB limit.
    let text = r
        .body_mut()
        .with_config()
        .limit(256 << 20)
        .read_to_string()
        .map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!("{}: {text}", r.status().as_u16()));
    }
    serde_json::from_str::<Value>(&text)
        .map(|v| v["value"].clone())
        .map_err(|e| format!("{e}: {text}"))
}

struct Browser {
    session: String,
}

impl Browser {
    fn js(&self, script: &str) -> Value {
        wd(
            "POST",
            &format!("{}/execute/sync", self.session),
            Some(json!({ "script": script, "args": [] })),
        )
        .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    fn go(&self, url: &str) {
        wd(
            "POST",
            &format!("{}/url", self.session),
            Some(json!({ "url": url })),
        )
        .unwrap_or_else(|e| panic!("navigating to {url}: {e}"));
    }

    /// Waits until `script` returns something other than null/false.
    fn wait_for(&self, what: &str, limit: Duration, script: &str) -> Value {
        let t = Instant::now();
        loop {
            let v = self.js(script);
            if !(v.is_null() || v == Value::Bool(false)) {
                return v;
            }
            if t.elapsed() > limit {
                let body =
                    self.js("return document.body ? document.body.innerText.slice(0, 2000) : ''");
                panic!("timed out after {limit:?} waiting for {what}; the page says:\n{body}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn screenshot(&self, to: &Path) -> Vec<u8> {
        let v = wd("GET", &format!("{}/screenshot", self.session), None)
            .unwrap_or_else(|e| panic!("screenshot: {e}"));
        use base64::Engine;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("base64 screenshot"))
            .expect("screenshot is base64");
        std::fs::write(to, &png).unwrap();
        png
    }
}

/// The distinct colours of a PNG (a blank page has one or two).
fn colours(png_bytes: &[u8]) -> usize {
    let decoder = png::Decoder::new(png_bytes);
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("a PNG frame");
    let px = match info.color_type {
        png::ColorType::Rgba => 4,
        png::ColorType::Rgb => 3,
        other => panic!("unexpected PNG colour type {other:?}"),
    };
    let mut seen = std::collections::HashSet::new();
    for p in buf[..info.buffer_size()].chunks(px) {
        seen.insert((p[0], p[1], p[2]));
    }
    seen.len()
}

fn start_chromedriver(g: &mut Guard, chromium: &str, profile: &Path) -> Browser {
    let port = free_port();
    let log = profile.join("chromedriver.log");
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .arg(format!("--log-path={}", log.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    g.children.push(("chromedriver", child));
    let base = format!("http://127.0.0.1:{port}");
    let t = Instant::now();
    while wd("GET", &format!("{base}/status"), None)
        .map(|v| v["ready"] != true)
        .unwrap_or(true)
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "chromedriver did not become ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let caps = json!({ "capabilities": { "alwaysMatch": { "goog:chromeOptions": {
        "binary": chromium,
        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
                 "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
                 format!("--user-data-dir={}", profile.join("chrome").display())],
    }}}});
    let v = wd("POST", &format!("{base}/session"), Some(caps))
        .unwrap_or_else(|e| panic!("chromedriver session: {e}"));
    let id = v["sessionId"].as_str().expect("a session id").to_string();
    let session = format!("{base}/session/{id}");
    g.session = Some(session.clone());
    Browser { session }
}

/// Starts `longhaul dashboard` on a free loopback port with `extra`
/// arguments; its address and the URL it printed (which carries the token
/// it made, unless `--open`).
fn start_dashboard(g: &mut Guard, archive: &Path, extra: &[&str]) -> (SocketAddr, String) {
    let mut child = common::bin()
        .args(["dashboard", "--listen", "127.0.0.1:0", "--archive"])
        .arg(archive)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start longhaul dashboard");
    let out = child.stdout.take().unwrap();
    g.children.push(("dashboard", child));
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("dashboard: ")
        .unwrap_or_else(|| panic!("dashboard said {line:?}"))
        .to_string();
    let addr = url
        .strip_prefix("http://")
        .and_then(|s| s.split('/').next())
        .unwrap_or_else(|| panic!("dashboard said {line:?}"));
    (addr.parse().unwrap(), url)
}

/// An in-process server on loopback, exporting `root` as `data`.
fn server(root: &Path, state: &Path) -> longhaul_engine::server::ServerHandle {
    common::xfer::data_server(root, state)
}

/// A real run the dashboard can watch: `longhaul perf` with four streams,
/// held to a modest rate so the browser keeps a core, archived to `archive`.
/// Its output goes to `log`.
fn start_perf(g: &mut Guard, addr: SocketAddr, archive: &Path, log: &Path) {
    let child = common::bin()
        .args([
            "perf",
            &addr.to_string(),
            "-t",
            "40",
            "-P",
            "4",
            "--pacing",
            "800M",
        ])
        .arg("--archive")
        .arg(archive)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start longhaul perf");
    g.children.push(("perf", child));
}

/// A finished doctor run of `path` that found `verdict` the limit.
fn fake_doctor(archive: &Path, path: &str, verdict: &str) {
    use longhaul_archive::model::NewRun;
    use longhaul_archive::writer::{RunEnd, RunResult, Writer};
    let a = longhaul_archive::Archive::open(archive).unwrap();
    let id = a
        .begin_run(&NewRun {
            kind: "doctor".into(),
            command: format!("longhaul doctor {path}"),
            remote_host: Some(path.into()),
            ..Default::default()
        })
        .unwrap();
    let (w, fin) = Writer::start(a, id);
    w.result(RunResult {
        verdict: Some(verdict.into()),
        bits_per_second: Some(2e9),
        ..Default::default()
    });
    w.end(RunEnd {
        status: "ok".into(),
        ..Default::default()
    });
    drop(w);
    fin.finish();
}

#[test]
fn the_dashboard_shows_a_running_run_live_and_its_graph() {
    let Some(chromium) = browser_available() else {
        return;
    };
    let tmp = common::TempDir::new("dashboard");
    let archive = tmp.path().join("archive.db");
    let shots = std::env::var_os("LONGHAUL_DASHBOARD_SHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.dir("shots"));
    let mut g = Guard::default();

    // The dashboard first: the archive does not exist yet, and the page
    // must say so and pick the archive up when it appears.
    let (addr, url) = start_dashboard(&mut g, &archive, &[]);
    let browser = start_chromedriver(&mut g, &chromium, &tmp.dir("profile"));
    // Through the address with the token it made: the visit keeps the
    // token in a cookie, and the page's own requests carry it from then on.
    assert!(url.contains("/?token="), "{url}");
    browser.go(&url);
    browser.wait_for(
        "the live feed",
        Duration::from_secs(60),
        "return document.body.getAttribute('data-updated')",
    );
    assert_eq!(
        browser.js("return location.search"),
        json!(""),
        "the token is out of the address bar"
    );

    let export = tmp.dir("export");
    let srv = server(&export, &tmp.dir("state"));
    let perf_log = tmp.path().join("perf.log");
    start_perf(&mut g, srv.addr(), &archive, &perf_log);
    g.log = Some(perf_log);

    // The running run appears with its rate.
    let run = browser.wait_for(
        "the running run on the live page",
        Duration::from_secs(90),
        "const e = document.querySelector('.live-rate'); \
         return e && e.dataset.bps ? e.dataset.run : null",
    );
    let run = run.as_str().unwrap().to_string();
    let read = |b: &Browser| {
        b.js(&format!(
            "const e = document.querySelector('.live-rate[data-run=\"{run}\"]'); \
             return e ? [e.textContent, e.dataset.updated] : null"
        ))
    };
    let first = read(&browser);
    assert!(
        first[0].as_str().unwrap().ends_with("bit/s"),
        "the rate as text: {first}"
    );
    // A new value within 2 s (the page counts the events it got).
    let t = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = read(&browser);
        if !now.is_null() && now[1] != first[1] {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the live rate was not updated within 2 s: {first} then {now}"
        );
    }
    // Let the chart gather a few intervals, then picture the live page.
    browser.wait_for(
        "intervals on the live chart",
        Duration::from_secs(60),
        &format!(
            "const c = document.getElementById('live-chart-{run}'); \
             return c && Number(c.dataset.points) >= 15"
        ),
    );
    let live_png = browser.screenshot(&shots.join("dashboard-live.png"));
    let n = colours(&live_png);
    assert!(
        n > 30,
        "the live page's screenshot looks blank ({n} colours)"
    );

    // Into the run's page: the interval chart, with data.
    browser.js(&format!(
        "document.querySelector('.live-run[data-run=\"{run}\"] a').click(); return true"
    ));
    let points = browser.wait_for(
        "the run page's chart",
        Duration::from_secs(60),
        "const c = document.getElementById('run-chart'); \
         return c && Number(c.dataset.points) > 0 && c.querySelectorAll('path').length > 1 \
           ? Number(c.dataset.points) : null",
    );
    assert!(points.as_u64().unwrap() > 0);
    assert!(
        browser.js("return location.hash") == json!(format!("#/run/{run}")),
        "the link leads to the run page"
    );
    // For a picture with more of the run (docs/dashboard.png): wait longer.
    if let Some(secs) = std::env::var("LONGHAUL_DASHBOARD_SHOT_WAIT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(Duration::from_secs(secs));
    }
    let marks = browser.js("return document.querySelectorAll('#run-chart .limit-mark').length");
    assert!(
        marks.as_u64().unwrap() > 0,
        "each interval's limit is marked"
    );
    let run_png = browser.screenshot(&shots.join("dashboard-run.png"));
    let n = colours(&run_png);
    assert!(
        n > 30,
        "the run page's screenshot looks blank ({n} colours)"
    );

    // The history lists it.
    browser.go(&format!("http://{addr}/#/history?kind=perf"));
    browser.wait_for(
        "the run in the history",
        Duration::from_secs(60),
        &format!("return document.querySelector('table.runs tr[data-run=\"{run}\"]') !== null"),
    );

    // A copy: its run page shows the rates of its stages.
    let src = tmp.path().join("payload.bin");
    common::xfer::write_random(&src, 8 << 20, 7);
    let o = common::bin()
        .arg("cp")
        .arg(&src)
        .arg(common::xfer::remote(srv.addr(), ""))
        .arg("--archive")
        .arg(&archive)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    common::assert_exit(&o, 0);
    browser.go(&format!("http://{addr}/#/history?kind=cp"));
    let cp = browser.wait_for(
        "the copy in the history",
        Duration::from_secs(60),
        "const r = document.querySelector('table.runs tr[data-kind=\"cp\"]'); return r && r.dataset.run",
    );
    browser.js(&format!(
        "document.querySelector('table.runs tr[data-run=\"{}\"] a').click(); return true",
        cp.as_str().unwrap()
    ));
    browser.wait_for(
        "the copy's stage rates",
        Duration::from_secs(60),
        "return document.querySelectorAll('table.stages tr').length === 3 \
           && document.body.innerText.includes('payload.bin')",
    );
    let cp_png = browser.screenshot(&shots.join("dashboard-cp.png"));
    assert!(colours(&cp_png) > 30, "the copy's page looks blank");

    // The doctor's verdicts by path (doctor runs written as the reporter
    // would: the path in remote_host, the limiting stage as the verdict).
    for (path, verdict) in [
        ("far:data", "network"),
        ("near:data", "storage_write"),
        ("far:data", "storage_read"),
    ] {
        fake_doctor(&archive, path, verdict);
    }
    browser.go(&format!("http://{addr}/#/doctor"));
    let chips = browser.wait_for(
        "the doctor's verdicts",
        Duration::from_secs(60),
        "const p = document.querySelectorAll('.doctor-path'); \
         return p.length === 2 ? Array.from(p[0].querySelectorAll('.chip')).map(c => c.textContent) : null",
    );
    assert_eq!(
        chips,
        json!(["network", "storage_read"]),
        "far:data, oldest first"
    );
    eprintln!("screenshots in {}", shots.display());
    drop(g);
    srv.shutdown();
}

#[test]
fn off_loopback_without_a_token_is_refused() {
    let tmp = common::TempDir::new("dashboard-refuse");
    let o = common::bin()
        .args(["dashboard", "--listen", "0.0.0.0:0", "--archive"])
        .arg(tmp.path().join("archive.db"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    common::assert_exit(&o, 2);
    let err = common::stderr(&o);
    assert!(
        err.contains("not a loopback address") && err.contains("--token-file"),
        "{err}"
    );
    let empty = tmp.path().join("empty-token");
    longhaul_testkit::data::write_secret(&empty, "\n");
    let o = common::bin()
        .args(["dashboard", "--listen", "127.0.0.1:0", "--token-file"])
        .arg(&empty)
        .arg("--archive")
        .arg(tmp.path().join("archive.db"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    common::assert_exit(&o, 2);
    assert!(
        common::stderr(&o).contains("no token"),
        "{}",
        common::stderr(&o)
    );
}

#[test]
fn off_loopback_with_a_token_serves_https_with_the_identity() {
    let tmp = common::TempDir::new("dashboard-tls");
    let token = tmp.path().join("token");
    longhaul_testkit::data::write_secret(&token, "dash-token\n");
    // A v4-mapped address is not loopback to the check, yet stays on this host.
    if !common::require::have("IPV6", common::require::ipv6()) {
        return;
    }
    let mut g = Guard::default();
    let mut child = common::bin()
        .args([
            "dashboard",
            "--listen",
            "[::ffff:127.0.0.1]:0",
            "--token-file",
        ])
        .arg(&token)
        .arg("--archive")
        .arg(tmp.path().join("archive.db"))
        .env("XDG_STATE_HOME", tmp.path().join("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    g.children.push(("dashboard", child));
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    if line.is_empty() {
        let mut e = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(err), &mut e);
        panic!("the dashboard did not start: {e}");
    }
    assert!(line.starts_with("dashboard: https://"), "{line}");
    let mut cert = String::new();
    BufReader::new(err).read_line(&mut cert).unwrap();
    let fp = cert
        .split_whitespace()
        .find(|w| w.starts_with("SHA256:"))
        .unwrap_or_else(|| panic!("no fingerprint in {cert:?}"));
    let id = common::bin()
        .arg("id")
        .arg(tmp.path().join("state/longhaul"))
        .output()
        .unwrap();
    assert!(common::stdout(&id).contains(fp), "{}", common::stdout(&id));
    assert!(!cert.contains("dash-token"));
}

/// Another account on this host (or a page that rebinds its name to
/// 127.0.0.1) tries the dashboard without the token it printed.
#[test]
fn on_loopback_the_dashboard_needs_the_token_it_printed() {
    let tmp = common::TempDir::new("dashboard-token");
    let archive = tmp.path().join("archive.db");
    fake_doctor(&archive, "far:data", "network");
    let mut g = Guard::default();
    let (addr, url) = start_dashboard(&mut g, &archive, &[]);
    let token = url
        .split_once("?token=")
        .map(|(_, t)| t.to_string())
        .unwrap_or_else(|| panic!("no token in {url}"));
    assert!(token.len() >= 32, "{url}");
    let host = addr.to_string();
    for path in [
        "/",
        "/app.js",
        "/api/history",
        "/api/live",
        "/api/running",
        "/api/doctor",
        "/api/run/1",
        "/api/run/1/files",
        "/?token=not-the-token",
    ] {
        for h in [host.as_str(), "localhost", "evil.example"] {
            let (status, text) = common::http::get(addr, path, h, "");
            assert_eq!(status, 401, "{path} with Host {h}: {text}");
            assert!(!text.contains("far:data"), "{text}");
            assert!(!text.contains(&token), "{text}");
        }
    }
    // With the token: the visit sets a cookie and leads to the page.
    let (status, text) = common::http::get(addr, &format!("/?token={token}"), &host, "");
    assert_eq!(status, 303, "{text}");
    let cookie = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("set-cookie:")
                .then(|| l[11..].trim().to_string())
        })
        .unwrap_or_else(|| panic!("no cookie: {text}"));
    let lower = cookie.to_ascii_lowercase();
    assert!(
        lower.contains("httponly") && lower.contains("samesite=strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap();
    let (status, text) = common::http::get(addr, "/", &host, &format!("Cookie: {pair}\r\n"));
    assert_eq!(status, 200, "{text}");
    let (status, text) =
        common::http::get(addr, "/api/doctor", &host, &format!("Cookie: {pair}\r\n"));
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("far:data"), "{text}");
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let (status, text) = common::http::get(addr, "/api/history", &host, &bearer);
    assert_eq!(status, 200, "{text}");
}

/// `--open` serves without a token, to loopback names only.
#[test]
fn an_open_dashboard_answers_only_to_loopback_names() {
    let tmp = common::TempDir::new("dashboard-open");
    let archive = tmp.path().join("archive.db");
    fake_doctor(&archive, "far:data", "network");
    let mut g = Guard::default();
    let (addr, url) = start_dashboard(&mut g, &archive, &["--open"]);
    assert_eq!(url, format!("http://{addr}/"));
    let (status, text) = common::http::get(addr, "/api/doctor", &addr.to_string(), "");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("far:data"), "{text}");
    for h in ["evil.example", &format!("evil.example:{}", addr.port())] {
        let (status, text) = common::http::get(addr, "/api/doctor", h, "");
        assert_eq!(status, 401, "{text}");
        assert!(!text.contains("far:data"), "{text}");
    }
    // --open with a token, or off loopback, is refused.
    let token = tmp.path().join("token");
    longhaul_testkit::data::write_secret(&token, "t0k\n");
    let o = common::bin()
        .args(["dashboard", "--open", "--listen", "0.0.0.0:0", "--archive"])
        .arg(&archive)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    common::assert_exit(&o, 2);
    let o = common::bin()
        .args([
            "dashboard",
            "--open",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
        ])
        .arg(&token)
        .arg("--archive")
        .arg(&archive)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    common::assert_exit(&o, 2);
}

#[test]
fn a_port_in_use_is_named_and_a_usage_error() {
    let tmp = common::TempDir::new("dashboard-busy");
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let o = common::bin()
        .args(["dashboard", "--listen", &addr.to_string(), "--archive"])
        .arg(tmp.path().join("archive.db"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    common::assert_exit(&o, 2);
    let err = common::stderr(&o);
    assert!(err.contains(&addr.to_string()), "{err}");
    assert!(err.contains("in use") && err.contains("--listen"), "{err}");
    drop(busy);
}

/// Two matrix runs of the binary (nothing measured: their cells come from
/// `--resume`), one tool named like a script and its settings like an
/// image that runs one: what a user's `--tools-file` may say.
const SCRIPT_TOOL: &str = "<script>window.__pwned=1</script>";
const IMG_SETTINGS: &str = "<img src=x onerror=window.__pwned=2>";

fn two_matrices(tmp: &common::TempDir, archive: &Path) {
    for (k, gbit) in [(1, 3.0), (2, 4.0)] {
        let o = crate::archive::archived_matrix(
            archive,
            &tmp.path().join(format!("m{k}")),
            &[("mem-tool", "defaults"), (SCRIPT_TOOL, IMG_SETTINGS)],
            gbit,
            &[],
        );
        common::assert_exit(&o, 0);
    }
}

/// The matrix page's data obeys the dashboard's token like every other
/// answer, takes only `run` (a number or `last`) and `limit` (a number),
/// and gives a tool's name as a JSON string, never as markup.
#[test]
fn the_matrix_api_needs_the_token_and_takes_only_its_own_query() {
    let tmp = common::TempDir::new("dashboard-matrix-api");
    let archive = tmp.path().join("archive.db");
    two_matrices(&tmp, &archive);
    fake_doctor(&archive, "far:data", "network");
    let mut g = Guard::default();
    let (addr, url) = start_dashboard(&mut g, &archive, &[]);
    let token = url
        .split_once("?token=")
        .map(|(_, t)| t.to_string())
        .unwrap();
    let host = addr.to_string();
    for path in [
        "/api/matrix",
        "/api/matrix?run=1",
        "/api/matrix?run=last&limit=5",
    ] {
        for h in [host.as_str(), "localhost", "evil.example"] {
            let (status, text) = common::http::get(addr, path, h, "");
            assert_eq!(status, 401, "{path} with Host {h}: {text}");
            assert!(!text.contains("__pwned"), "{text}");
        }
    }
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let (status, text) = common::http::get(addr, "/api/matrix", &host, &bearer);
    assert_eq!(status, 200, "{text}");
    let lower = text.to_ascii_lowercase();
    assert!(lower.contains("content-type: application/json"), "{text}");
    assert!(lower.contains("x-content-type-options: nosniff"), "{text}");
    let body: Value = serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(body["run"]["id"], 2);
    assert_eq!(body["runs"].as_array().unwrap().len(), 2);
    assert!(body["matrix"]["cells"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["tool"] == SCRIPT_TOOL && c["settings"] == IMG_SETTINGS));
    let cells = body["history"].as_array().unwrap();
    assert_eq!(cells.len(), 4, "{body}");
    assert_eq!(cells[0]["points"].as_array().unwrap().len(), 2, "{body}");
    let (status, text) = common::http::get(addr, "/api/matrix?run=1&limit=1", &host, &bearer);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"id\":1"), "{text}");
    for bad in [
        "run=%3Cscript%3E",
        "run=1%3BDROP%20TABLE%20runs",
        "run=-1",
        "run=0",
        "limit=lots",
        "limit=-3",
        "run=1&callback=x",
        "run=1&run=2",
    ] {
        let (status, text) = common::http::get(addr, &format!("/api/matrix?{bad}"), &host, &bearer);
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(!text.contains("<script"), "{bad}: {text}");
    }
    // A run that is not a matrix, or is not there.
    for (run, status) in [("3", 404), ("99", 404)] {
        let (got, text) =
            common::http::get(addr, &format!("/api/matrix?run={run}"), &host, &bearer);
        assert_eq!(got, status, "run {run}: {text}");
    }
}

/// In a real browser: the matrix page shows the latest matrix and the
/// history of each cell, and a tool named like a script (its settings
/// like an image that runs one) is shown as text, run never.
#[test]
fn the_matrix_page_shows_a_tool_named_like_markup_as_text() {
    let Some(chromium) = browser_available() else {
        return;
    };
    let tmp = common::TempDir::new("dashboard-matrix");
    let archive = tmp.path().join("archive.db");
    two_matrices(&tmp, &archive);
    let mut g = Guard::default();
    let (addr, url) = start_dashboard(&mut g, &archive, &[]);
    let browser = start_chromedriver(&mut g, &chromium, &tmp.dir("profile"));
    browser.go(&url);
    browser.wait_for(
        "the live feed",
        Duration::from_secs(60),
        "return document.body.getAttribute('data-updated')",
    );
    browser.go(&format!("http://{addr}/#/matrix"));
    let names = browser.wait_for(
        "the matrix table",
        Duration::from_secs(60),
        "const t = document.querySelectorAll('.matrix-tool'); \
         return t.length ? Array.from(t).map(e => e.textContent) : null",
    );
    assert_eq!(
        names,
        json!([
            "mem-tool (defaults)",
            format!("{SCRIPT_TOOL} ({IMG_SETTINGS})")
        ])
    );
    assert_eq!(
        browser.js("return window.__pwned === undefined"),
        json!(true)
    );
    assert_eq!(
        browser.js("return document.querySelectorAll('main img, main script').length"),
        json!(0)
    );
    // The latest run's median, and each cell's history over both runs.
    let text = browser.js("return document.querySelector('table.matrix').innerText");
    assert!(text.as_str().unwrap().contains("4.00"), "{text}");
    let points = browser.js(
        "return Array.from(document.querySelectorAll('svg.spark')).map(s => Number(s.dataset.points))",
    );
    assert_eq!(points, json!([2, 2, 2, 2]));
    // An earlier matrix by its link.
    browser.js(
        "document.querySelector('.matrix-runs a[href=\"#/matrix?run=1\"]').click(); return true",
    );
    browser.wait_for(
        "the first matrix",
        Duration::from_secs(60),
        "const h = document.querySelector('main h2'); \
         return h && h.textContent.startsWith('Matrix run #1')",
    );
    let png = browser.screenshot(&tmp.path().join("dashboard-matrix.png"));
    assert!(colours(&png) > 30, "the matrix page looks blank");
    assert_eq!(
        browser.js("return window.__pwned === undefined"),
        json!(true)
    );
}

/// In a real browser: the Jobs page shows a job server's jobs from their
/// archived attempts, and a job whose source is named like markup shows
/// that name as text, run never.
#[test]
fn the_jobs_page_shows_a_job_and_its_hostile_name_as_text() {
    use crate::jobs::{pair, submit, url, wait_job};
    let Some(chromium) = browser_available() else {
        return;
    };
    let t = common::TempDir::new("dashboard-jobs");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    let hostile = "<img src=x onerror=\"window.__pwned=1\">";
    common::xfer::write_random(&src.join(hostile), 1000, 1);
    let (j, b) = pair(&t, &src, &dst, &[]);
    let (id, _) = submit(&[&url(&j, &format!("data/{hostile}")), &url(&b, "in/")]);
    let (code, v) = wait_job(&j, &id, Duration::from_secs(60));
    assert_eq!(code, 0, "{v} {}", j.log_text());
    let mut g = Guard::default();
    let (addr, url) = start_dashboard(&mut g, &common::archive_file(), &[]);
    let browser = start_chromedriver(&mut g, &chromium, &t.dir("profile"));
    browser.go(&url);
    browser.wait_for(
        "the live feed",
        Duration::from_secs(60),
        "return document.body.getAttribute('data-updated')",
    );
    browser.go(&format!("http://{addr}/#/jobs"));
    let card = browser.wait_for(
        "the job's card",
        Duration::from_secs(60),
        &format!(
            "const c = document.querySelector('.job[data-job=\"{id}\"]'); \
             return c ? c.innerText : null"
        ),
    );
    let text = card.as_str().unwrap();
    assert!(text.contains(&format!("data/{hostile}")), "{text}");
    assert!(text.contains("ok"), "{text}");
    assert_eq!(
        browser.js("return document.querySelectorAll('main img, main script').length"),
        json!(0)
    );
    assert_eq!(
        browser.js("return window.__pwned === undefined"),
        json!(true)
    );
}
