//! Prometheus metrics of a server (`serve --metrics ADDR:PORT`): [`Metrics`]
//! counts what the server serves (it is a [`ServeObserver`], told only at
//! the start and end of sessions, tests and transfers and on refusals),
//! and [`serve_metrics`] answers `GET /metrics` with them in the
//! OpenMetrics text format, from a thread of its own.
//!
//! The metrics and their labels are listed in `docs/METRICS.md`. Labels
//! are bounded: `kind`, `result` and `reason` are fixed words, `export` an
//! export the server was started with (empty when there is none), and
//! `grant` a grant id from the server's grants file or `anonymous`. The
//! client's address is never a label.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use longhaul_engine::server::observe::{
    Failure, Outcome, Refused, RunKind, ServeObserver, ServedRun, Session,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The content type of the answer to `GET /metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the rate histogram, bits/s: 1 Mbit/s to 400 Gbit/s.
pub const RATE_BUCKETS: &[f64] = &[
    1e6, 2.5e6, 5e6, 1e7, 2.5e7, 5e7, 1e8, 2.5e8, 5e8, 1e9, 2.5e9, 5e9, 1e10, 2.5e10, 5e10, 1e11,
    2e11, 4e11,
];

/// Upper bounds of the duration histogram, seconds: 0.1 s to a day.
pub const DURATION_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
    14400.0, 43200.0, 86400.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    kind: String,
    export: String,
    grant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    kind: String,
    export: String,
    grant: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TestLabels {
    grant: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GrantLabels {
    grant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    what: String,
    export: String,
    grant: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    stage: String,
    export: String,
    grant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InfoLabels {
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RateLabels {
    kind: String,
    export: String,
}

fn rate_histogram() -> Histogram {
    Histogram::new(RATE_BUCKETS.iter().copied())
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS.iter().copied())
}

type Histograms = Family<RateLabels, Histogram, fn() -> Histogram>;

/// A server's metrics, in their registry.
pub struct Metrics {
    registry: Registry,
    bytes: Family<RunLabels, Counter>,
    files: Family<RunLabels, Counter>,
    transfers: Family<ResultLabels, Counter>,
    tests: Family<TestLabels, Counter>,
    refusals: Family<RefusalLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    sessions: Family<GrantLabels, Gauge>,
    active_tests: Family<GrantLabels, Gauge>,
    active_transfers: Family<RunLabels, Gauge>,
    jobs: Family<JobLabels, Gauge>,
    rate: Histograms,
    duration: Histograms,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric registered, none with a value yet.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            registry: Registry::default(),
            bytes: Family::default(),
            files: Family::default(),
            transfers: Family::default(),
            tests: Family::default(),
            refusals: Family::default(),
            errors: Family::default(),
            sessions: Family::default(),
            active_tests: Family::default(),
            active_transfers: Family::default(),
            jobs: Family::default(),
            rate: Family::new_with_constructor(rate_histogram as fn() -> Histogram),
            duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
        };
        // Always there, so a server that has served nothing yet is seen.
        let info: Family<InfoLabels, Gauge> = Family::default();
        info.get_or_create(&InfoLabels {
            version: env!("CARGO_PKG_VERSION").into(),
        })
        .set(1);
        registry.register(
            "longhaul_server_info",
            "1, labelled with the server's version",
            info,
        );
        // Counters get `_total` from the encoder.
        registry.register(
            "longhaul_bytes_moved",
            "Bytes the server moved: transfers (push: received, pull: sent) and perf tests (both directions), counted when each ends",
            m.bytes.clone(),
        );
        registry.register(
            "longhaul_files_moved",
            "Files the server moved in transfers, counted when each ends",
            m.files.clone(),
        );
        registry.register(
            "longhaul_transfers",
            "Transfers (push, pull) and listings (ls) served, by how they ended",
            m.transfers.clone(),
        );
        registry.register(
            "longhaul_tests",
            "Perf tests served, by how they ended",
            m.tests.clone(),
        );
        registry.register(
            "longhaul_refusals",
            "Connections and requests refused, by what was refused and the refusal's code",
            m.refusals.clone(),
        );
        registry.register(
            "longhaul_errors",
            "Failures: handshakes, sessions, and tests and transfers that failed or were aborted",
            m.errors.clone(),
        );
        registry.register(
            "longhaul_active_sessions",
            "Control sessions open now",
            m.sessions.clone(),
        );
        registry.register(
            "longhaul_active_tests",
            "Perf tests running now",
            m.active_tests.clone(),
        );
        registry.register(
            "longhaul_active_transfers",
            "Transfers and listings running now",
            m.active_transfers.clone(),
        );
        registry.register(
            "longhaul_jobs",
            "A job server's jobs (serve --jobs) by state: submitted, active, finished, finished_with_failures, failed, cancelled (of the whole group, with PostgreSQL)",
            m.jobs.clone(),
        );
        registry.register(
            "longhaul_transfer_rate_bits_per_second",
            "Average rate of each finished transfer and perf test that moved data",
            m.rate.clone(),
        );
        registry.register(
            "longhaul_transfer_duration_seconds",
            "Duration of each finished transfer and perf test that moved data",
            m.duration.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The metrics in the OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    fn run_labels(r: &ServedRun) -> RunLabels {
        RunLabels {
            kind: r.kind.as_str().into(),
            export: r.export.clone().unwrap_or_default(),
            grant: r.grant.clone(),
        }
    }

    fn finished(&self, r: &ServedRun) {
        let labels = Self::run_labels(r);
        if r.kind != RunKind::List {
            self.bytes.get_or_create(&labels).inc_by(r.bytes);
            if r.kind != RunKind::Perf {
                self.files.get_or_create(&labels).inc_by(r.files);
            }
            // What moved nothing has no rate worth a bucket.
            if r.bytes > 0 && r.result != Outcome::Aborted {
                let l = RateLabels {
                    kind: labels.kind.clone(),
                    export: labels.export.clone(),
                };
                self.rate.get_or_create(&l).observe(r.bits_per_second);
                self.duration.get_or_create(&l).observe(r.seconds);
            }
        }
    }
}

impl ServeObserver for Metrics {
    fn jobs(&self, by_state: &[(&'static str, u64)]) {
        for state in longhaul_proto::job::JobState::ALL {
            let n = by_state
                .iter()
                .find(|(s, _)| *s == state.word())
                .map_or(0, |(_, n)| *n);
            self.jobs
                .get_or_create(&JobLabels {
                    state: state.word().into(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    fn session_opened(&self, s: &Session) {
        let l = GrantLabels {
            grant: s.grant.clone(),
        };
        self.sessions.get_or_create(&l).inc();
    }

    fn session_closed(&self, s: &Session) {
        let l = GrantLabels {
            grant: s.grant.clone(),
        };
        self.sessions.get_or_create(&l).dec();
    }

    fn test_started(&self, r: &ServedRun) {
        let l = GrantLabels {
            grant: r.grant.clone(),
        };
        self.active_tests.get_or_create(&l).inc();
    }

    fn test_finished(&self, r: &ServedRun) {
        let l = GrantLabels {
            grant: r.grant.clone(),
        };
        self.active_tests.get_or_create(&l).dec();
        let l = TestLabels {
            grant: r.grant.clone(),
            result: r.result.as_str().into(),
        };
        self.tests.get_or_create(&l).inc();
        self.finished(r);
    }

    fn transfer_started(&self, r: &ServedRun) {
        self.active_transfers
            .get_or_create(&Self::run_labels(r))
            .inc();
    }

    fn transfer_finished(&self, r: &ServedRun) {
        let labels = Self::run_labels(r);
        self.active_transfers.get_or_create(&labels).dec();
        let l = ResultLabels {
            kind: labels.kind,
            export: labels.export,
            grant: labels.grant,
            result: r.result.as_str().into(),
        };
        self.transfers.get_or_create(&l).inc();
        self.finished(r);
    }

    fn refused(&self, r: &Refused) {
        let l = RefusalLabels {
            what: r.what.into(),
            export: r.export.clone().unwrap_or_default(),
            grant: r.grant.clone(),
            reason: r.reason.into(),
        };
        self.refusals.get_or_create(&l).inc();
    }

    fn error(&self, e: &Failure) {
        let l = ErrorLabels {
            stage: e.stage.into(),
            export: e.export.clone().unwrap_or_default(),
            grant: e.grant.clone(),
        };
        self.errors.get_or_create(&l).inc();
    }
}

/// Scrapers served at once; more wait until one closes.
pub const MAX_CONNECTIONS: usize = 16;

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics: {0}")]
    Listen(String),
    #[error("cannot start the metrics thread: {0}")]
    Thread(String),
}

/// Serves `GET /metrics` on `addr` from a thread of its own (an axum
/// router on a current-thread tokio runtime, within
/// [`crate::http::Limits`]); the address it bound (the port chosen when
/// `addr` asks for port 0) and the thread, which runs until the process
/// ends. Anything but `/metrics` is 404. A request must name this host as
/// an IP address, `localhost`, or one of `names` (`--metrics-host`): a
/// page elsewhere that rebinds its own name to this host cannot read it.
pub fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    names: &[String],
) -> Result<(SocketAddr, JoinHandle<()>), MetricsError> {
    serve_metrics_within(
        addr,
        metrics,
        names,
        crate::http::Limits::new(MAX_CONNECTIONS),
    )
}

/// [`serve_metrics`] within other limits.
pub fn serve_metrics_within(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    names: &[String],
    limits: crate::http::Limits,
) -> Result<(SocketAddr, JoinHandle<()>), MetricsError> {
    let endpoint = crate::http::Endpoint::bind(addr, "--metrics").map_err(|e| match e {
        crate::http::EndpointError::Bind(why) => MetricsError::Listen(why),
        e => MetricsError::Thread(e.to_string()),
    })?;
    let bound = endpoint
        .local_addr()
        .map_err(|e| MetricsError::Listen(format!("cannot listen on {addr}: {e}")))?;
    let hosts = Arc::new((
        crate::http::Hosts::addresses_and(names),
        "scrape it by an IP address of this host or localhost, or start `serve` with --metrics-host NAME for the name Prometheus uses",
    ));
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(scrape))
        .with_state(metrics)
        .layer(axum::middleware::from_fn_with_state(
            hosts,
            crate::http::host_guard,
        ));
    let thread = std::thread::Builder::new()
        .name("lh-metrics".into())
        .spawn(move || {
            if let Err(e) = endpoint.serve(None, app, limits) {
                tracing::warn!("metrics on {bound} not served: {e}");
            }
        })
        .map_err(|e| MetricsError::Thread(e.to_string()))?;
    Ok((bound, thread))
}

async fn scrape(
    axum::extract::State(metrics): axum::extract::State<Arc<Metrics>>,
) -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)],
        metrics.encode(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_engine::server::observe::ANONYMOUS;

    fn run(kind: RunKind, export: Option<&str>, grant: &str, bytes: u64, secs: f64) -> ServedRun {
        ServedRun {
            id: 1,
            kind,
            client: "192.0.2.1:4000".into(),
            grant: grant.into(),
            export: export.map(str::to_string),
            params: serde_json::Value::Null,
            bytes,
            files: 3,
            seconds: secs,
            bits_per_second: bytes as f64 * 8.0 / secs,
            result: Outcome::Ok,
            error: None,
        }
    }

    /// The value of the sample line that starts with `prefix` (name and labels).
    fn sample(text: &str, prefix: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn a_job_servers_jobs_are_counted_by_state() {
        let m = Metrics::new();
        m.jobs(&[("active", 2), ("finished", 5)]);
        let t = m.encode();
        assert_eq!(
            sample(&t, r#"longhaul_jobs{state="active"}"#),
            Some(2.0),
            "{t}"
        );
        assert_eq!(
            sample(&t, r#"longhaul_jobs{state="finished"}"#),
            Some(5.0),
            "{t}"
        );
        assert_eq!(
            sample(&t, r#"longhaul_jobs{state="failed"}"#),
            Some(0.0),
            "{t}"
        );
        m.jobs(&[("finished", 7)]);
        let t = m.encode();
        assert_eq!(
            sample(&t, r#"longhaul_jobs{state="active"}"#),
            Some(0.0),
            "{t}"
        );
    }

    #[test]
    fn bytes_files_and_transfers_are_counted_by_export_and_grant() {
        let m = Metrics::new();
        let mut r = run(RunKind::Push, Some("data"), "7e570000", 1_000_000, 2.0);
        m.transfer_started(&r);
        let t = m.encode();
        assert_eq!(
            sample(
                &t,
                r#"longhaul_active_transfers{kind="push",export="data",grant="7e570000"}"#
            ),
            Some(1.0),
            "{t}"
        );
        m.transfer_finished(&r);
        r.bytes = 500;
        m.transfer_started(&r);
        m.transfer_finished(&r);
        let t = m.encode();
        assert_eq!(
            sample(
                &t,
                r#"longhaul_bytes_moved_total{kind="push",export="data",grant="7e570000"}"#
            ),
            Some(1_000_500.0),
            "{t}"
        );
        assert_eq!(
            sample(
                &t,
                r#"longhaul_files_moved_total{kind="push",export="data",grant="7e570000"}"#
            ),
            Some(6.0),
            "{t}"
        );
        assert_eq!(
            sample(
                &t,
                r#"longhaul_transfers_total{kind="push",export="data",grant="7e570000",result="ok"}"#
            ),
            Some(2.0),
            "{t}"
        );
        assert_eq!(
            sample(
                &t,
                r#"longhaul_active_transfers{kind="push",export="data",grant="7e570000"}"#
            ),
            Some(0.0),
            "{t}"
        );
        assert!(t.contains("# TYPE longhaul_bytes_moved counter"), "{t}");
        assert!(t.trim_end().ends_with("# EOF"), "{t}");
        let version = format!(
            r#"longhaul_server_info{{version="{}"}}"#,
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(sample(&t, &version), Some(1.0), "{t}");
        // The client's address is never a label.
        assert!(!t.contains("192.0.2.1"), "{t}");
    }

    #[test]
    fn histograms_put_each_run_in_its_buckets() {
        let m = Metrics::new();
        // 1 GB in 10 s: 800 Mbit/s, 10 s.
        let r = run(RunKind::Pull, Some("arch"), ANONYMOUS, 1_000_000_000, 10.0);
        m.transfer_started(&r);
        m.transfer_finished(&r);
        let t = m.encode();
        let bucket = |name: &str, le: &str| {
            sample(
                &t,
                &format!(r#"{name}_bucket{{le="{le}",kind="pull",export="arch"}}"#),
            )
        };
        let rate = "longhaul_transfer_rate_bits_per_second";
        assert_eq!(bucket(rate, "500000000.0"), Some(0.0), "{t}");
        assert_eq!(bucket(rate, "1000000000.0"), Some(1.0), "{t}");
        assert_eq!(bucket(rate, "400000000000.0"), Some(1.0), "{t}");
        assert_eq!(bucket(rate, "+Inf"), Some(1.0), "{t}");
        let dur = "longhaul_transfer_duration_seconds";
        assert_eq!(bucket(dur, "5.0"), Some(0.0), "{t}");
        assert_eq!(bucket(dur, "10.0"), Some(1.0), "{t}");
        assert_eq!(bucket(dur, "86400.0"), Some(1.0), "{t}");
        assert_eq!(
            sample(&t, &format!(r#"{dur}_sum{{kind="pull",export="arch"}}"#)),
            Some(10.0),
            "{t}"
        );
        assert_eq!(
            sample(&t, &format!(r#"{rate}_count{{kind="pull",export="arch"}}"#)),
            Some(1.0),
            "{t}"
        );
    }

    #[test]
    fn tests_sessions_refusals_and_errors() {
        let m = Metrics::new();
        let s = Session {
            client: "192.0.2.1:4000".into(),
            grant: "g1".into(),
        };
        m.session_opened(&s);
        m.session_opened(&s);
        m.session_closed(&s);
        let mut r = run(RunKind::Perf, None, "g1", 4096, 1.0);
        m.test_started(&r);
        r.result = Outcome::Failed;
        m.test_finished(&r);
        m.refused(&Refused {
            what: "push",
            export: Some("data".into()),
            grant: ANONYMOUS.into(),
            reason: "unauthorized",
            message: "authentication required".into(),
            client: "192.0.2.1:4000".into(),
        });
        m.error(&Failure {
            stage: "perf",
            export: None,
            grant: "g1".into(),
            message: "broken".into(),
            client: "192.0.2.1:4000".into(),
        });
        let t = m.encode();
        let want = [
            (r#"longhaul_active_sessions{grant="g1"}"#, 1.0),
            (r#"longhaul_active_tests{grant="g1"}"#, 0.0),
            (r#"longhaul_tests_total{grant="g1",result="failed"}"#, 1.0),
            (
                r#"longhaul_bytes_moved_total{kind="perf",export="",grant="g1"}"#,
                4096.0,
            ),
            (
                r#"longhaul_refusals_total{what="push",export="data",grant="anonymous",reason="unauthorized"}"#,
                1.0,
            ),
            (
                r#"longhaul_errors_total{stage="perf",export="",grant="g1"}"#,
                1.0,
            ),
        ];
        for (line, v) in want {
            assert_eq!(sample(&t, line), Some(v), "{line} in\n{t}");
        }
    }

    #[test]
    fn the_endpoint_answers_in_openmetrics_text() {
        use std::io::{Read, Write};
        let m = Arc::new(Metrics::new());
        let r = run(RunKind::Push, Some("data"), "g", 123, 1.0);
        m.transfer_started(&r);
        m.transfer_finished(&r);
        let (addr, _thread) = serve_metrics("127.0.0.1:0".parse().unwrap(), m, &[]).unwrap();
        let get = |path: &str| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
                .unwrap();
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let answer = get("/metrics");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer
                .to_ascii_lowercase()
                .contains(&format!("content-type: {CONTENT_TYPE}")),
            "{answer}"
        );
        assert!(
            answer
                .contains(r#"longhaul_bytes_moved_total{kind="push",export="data",grant="g"} 123"#),
            "{answer}"
        );
        assert!(get("/other").starts_with("HTTP/1.1 404"));
        // A second server on the same port is an error that says what to do.
        let e = serve_metrics(addr, Arc::new(Metrics::new()), &[]).unwrap_err();
        assert!(e.to_string().contains("--metrics"), "{e}");
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }

    #[test]
    fn a_rebound_host_name_reads_nothing() {
        use std::io::{Read, Write};
        let m = Arc::new(Metrics::new());
        let r = run(RunKind::Push, Some("secret-export"), "g", 123, 1.0);
        m.transfer_started(&r);
        m.transfer_finished(&r);
        let names = ["dtn1.example.org".to_string()];
        let (addr, _thread) = serve_metrics("127.0.0.1:0".parse().unwrap(), m, &names).unwrap();
        let get = |host: &str, path: &str| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
                .unwrap();
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        // A page of evil.example whose name now points here.
        for (host, path) in [
            ("evil.example", "/metrics"),
            (&format!("evil.example:{}", addr.port()), "/metrics"),
            ("evil.example", "/other"),
            ("127.0.0.1", "http://evil.example/metrics"),
        ] {
            let answer = get(host, path);
            assert!(
                answer.starts_with("HTTP/1.1 403"),
                "{host} {path}: {answer}"
            );
            assert!(!answer.contains("secret-export"), "{answer}");
            assert!(answer.contains("--metrics-host"), "{answer}");
        }
        // What Prometheus sends for a target given as an address, or as a
        // name the server was told.
        for host in [
            addr.to_string(),
            format!("localhost:{}", addr.port()),
            format!("dtn1.example.org:{}", addr.port()),
        ] {
            let answer = get(&host, "/metrics");
            assert!(answer.starts_with("HTTP/1.1 200"), "{host}: {answer}");
            assert!(answer.contains("secret-export"), "{answer}");
        }
    }
}
