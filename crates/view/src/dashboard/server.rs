//! The dashboard's HTTP side: the routes, the token check, the embedded
//! page, binding, and the current-thread runtime it all runs on.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{self, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::{api, check_options, live, token_matches, DashboardError, DashboardOptions};
use crate::http::Hosts;

const INDEX_HTML: &str = include_str!("../../assets/dashboard/index.html");
const APP_JS: &str = include_str!("../../assets/dashboard/app.js");
const STYLE_CSS: &str = include_str!("../../assets/dashboard/style.css");

/// The cookie a `?token=` visit sets, so the page's own requests (and its
/// event stream, which cannot send headers) carry the token. Cookies do
/// not tell ports apart, so the name carries the port: two dashboards on
/// one host do not overwrite each other's.
pub fn cookie_name(port: u16) -> String {
    format!("longhaul_dashboard_{port}")
}

pub use super::AppState;

/// A bound dashboard, not yet serving.
pub struct Dashboard {
    endpoint: crate::http::Endpoint,
    opts: DashboardOptions,
    /// The token was made here: the URL gives it.
    made_token: bool,
}

impl Dashboard {
    /// Checks the options, makes a token unless there is one or the
    /// dashboard is open, and binds the address (port 0: any free one).
    pub fn bind(mut opts: DashboardOptions) -> Result<Dashboard, DashboardError> {
        check_options(&opts)?;
        let made_token = opts.token.is_none() && !opts.open;
        if made_token {
            opts.token = Some(super::random_token()?);
        }
        let endpoint =
            crate::http::Endpoint::bind(opts.listen, "--listen").map_err(|e| match e {
                crate::http::EndpointError::Bind(why) => DashboardError::Bind(why),
                e => DashboardError::Runtime(e.to_string()),
            })?;
        Ok(Dashboard {
            endpoint,
            opts,
            made_token,
        })
    }

    /// The address bound (the real port when asked for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, DashboardError> {
        self.endpoint
            .local_addr()
            .map_err(|e| DashboardError::Runtime(e.to_string()))
    }

    /// The address to open: with the token when it was made here (so the
    /// one who started the dashboard, and no one else, gets in; the visit
    /// moves it into a cookie).
    pub fn url(&self) -> Result<String, DashboardError> {
        let scheme = if self.opts.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let addr = self.local_addr()?;
        Ok(match (&self.opts.token, self.made_token) {
            (Some(t), true) => format!("{scheme}://{addr}/?token={t}"),
            _ => format!("{scheme}://{addr}/"),
        })
    }

    /// Serves until the process ends (or the listener fails).
    pub fn run(self) -> Result<(), DashboardError> {
        let port = self.local_addr()?.port();
        let feed = live::LiveFeed::start(self.opts.archive_path.clone());
        let state = Arc::new(AppState {
            archive_path: self.opts.archive_path.clone(),
            token: self.opts.token.clone(),
            cookie: cookie_name(port),
            hosts: Hosts::loopback(),
            secure: self.opts.tls.is_some(),
            live: feed,
        });
        let (tls, limits) = (self.opts.tls.clone(), self.opts.limits.clone());
        self.endpoint
            .serve(tls, router(state), limits)
            .map_err(|e| DashboardError::Runtime(e.to_string()))
    }
}

/// `longhaul dashboard`: binds, says where, and serves (blocking). `said`
/// is told the address bound and the URL to open (which may carry the
/// token: show it only to the one who started the dashboard) before
/// serving starts.
pub fn serve_dashboard(
    opts: DashboardOptions,
    said: impl FnOnce(SocketAddr, &str),
) -> Result<(), DashboardError> {
    let d = Dashboard::bind(opts)?;
    said(d.local_addr()?, &d.url()?);
    d.run()
}

/// Every route, behind the token check and the security headers.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/app.js", get(app_js))
        .route("/style.css", get(style_css))
        .route("/api/status", get(api::status))
        .route("/api/history", get(api::history))
        .route("/api/run/{id}", get(api::run))
        .route("/api/run/{id}/intervals", get(api::intervals))
        .route("/api/run/{id}/files", get(api::files))
        .route("/api/doctor", get(api::doctor))
        .route("/api/matrix", get(api::matrix))
        .route("/api/jobs", get(api::jobs))
        .route("/api/running", get(live::running))
        .route("/api/live", get(live::events))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

async fn index() -> Response {
    asset(INDEX_HTML, "text/html; charset=utf-8")
}
async fn app_js() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}
async fn style_css() -> Response {
    asset(STYLE_CSS, "text/css; charset=utf-8")
}
async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

/// The token check (when there is a token), the host check (when there is
/// none), and the headers every answer carries.
async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let mut resp = match check(&st, &req) {
        Access::Allowed => next.run(req).await,
        Access::SetCookie(to) => {
            let token = st.token.as_deref().unwrap_or_default();
            let cookie = format!(
                "{}={}; HttpOnly; SameSite=Strict; Path=/{}",
                st.cookie,
                longhaul_proto::units::hex(token.as_bytes()),
                if st.secure { "; Secure" } else { "" }
            );
            let mut r = StatusCode::SEE_OTHER.into_response();
            if let Ok(v) = HeaderValue::from_str(&to) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Access::Denied(why) => (
            StatusCode::UNAUTHORIZED,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            why,
        )
            .into_response(),
    };
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

/// What a request may do.
#[derive(Debug, PartialEq)]
pub enum Access {
    Allowed,
    /// A right `?token=`: set the cookie and send the browser here (the
    /// same address without the token).
    SetCookie(String),
    Denied(&'static str),
}

/// Decides a request: with a token (always, unless `--open`), it must
/// come as `Authorization: Bearer`, the cookie, or `?token=`, whatever
/// the Host (a page elsewhere has neither the token nor, under another
/// name, the cookie); an open dashboard (loopback only) answers only to
/// requests naming a loopback host ([`Hosts::loopback`]), so that a web
/// page elsewhere cannot reach it by rebinding its own name to 127.0.0.1.
pub fn check(st: &AppState, req: &Request) -> Access {
    let Some(token) = st.token.as_deref() else {
        return if st.hosts.allows_request(req) {
            Access::Allowed
        } else {
            Access::Denied(
                "this dashboard answers only to a loopback address (127.0.0.1, [::1], localhost)\n",
            )
        };
    };
    let right = token.as_bytes();
    if let Some(v) = req.headers().get(header::AUTHORIZATION) {
        if let Some(t) = v.to_str().ok().and_then(|s| s.strip_prefix("Bearer ")) {
            if token_matches(t.trim().as_bytes(), right) {
                return Access::Allowed;
            }
        }
    }
    let want = longhaul_proto::units::hex(right);
    for v in req.headers().get_all(header::COOKIE) {
        let Ok(s) = v.to_str() else { continue };
        for pair in s.split(';') {
            if let Some((k, val)) = pair.trim().split_once('=') {
                if k == st.cookie && token_matches(val.as_bytes(), want.as_bytes()) {
                    return Access::Allowed;
                }
            }
        }
    }
    if let Some(q) = req.uri().query() {
        let mut rest = Vec::new();
        let mut hit = false;
        // A query is form-encoded (`+` is a space), as a browser sends it.
        for pair in q.split('&') {
            match form_urlencoded::parse(pair.as_bytes()).next() {
                Some((k, v)) if k == "token" => hit |= token_matches(v.as_bytes(), right),
                _ => rest.push(pair),
            }
        }
        if hit {
            return Access::SetCookie(without_query(req.uri(), &rest.join("&")));
        }
    }
    Access::Denied("this dashboard needs its token: open the address `longhaul dashboard` printed (http://HOST:PORT/?token=TOKEN) once, or send Authorization: Bearer TOKEN\n")
}

fn without_query(uri: &Uri, rest: &str) -> String {
    if rest.is_empty() {
        uri.path().to_string()
    } else {
        format!("{}?{rest}", uri.path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn state(token: Option<&str>) -> AppState {
        AppState {
            archive_path: std::path::PathBuf::from("/nonexistent"),
            token: token.map(str::to_string),
            cookie: cookie_name(5380),
            hosts: Hosts::loopback(),
            secure: false,
            live: live::LiveFeed::idle(),
        }
    }

    fn req(uri: &str, headers: &[(&str, &str)]) -> Request {
        let mut b = Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn open_only_loopback_names_get_in() {
        let st = state(None);
        for host in [
            "127.0.0.1:5380",
            "localhost:5380",
            "[::1]:80",
            "127.0.0.2",
            "LOCALHOST",
        ] {
            assert_eq!(
                check(&st, &req("/", &[("host", host)])),
                Access::Allowed,
                "{host}"
            );
        }
        for host in ["evil.example:5380", "192.0.2.1", "[2001:db8::1]:80"] {
            assert!(
                matches!(check(&st, &req("/", &[("host", host)])), Access::Denied(_)),
                "{host}"
            );
        }
    }

    #[test]
    fn a_token_is_needed_by_header_cookie_or_query() {
        let st = state(Some("s3cret/x"));
        assert!(matches!(
            check(&st, &req("/api/history", &[])),
            Access::Denied(_)
        ));
        assert_eq!(
            check(&st, &req("/", &[("authorization", "Bearer s3cret/x")])),
            Access::Allowed
        );
        assert!(matches!(
            check(&st, &req("/", &[("authorization", "Bearer s3cret/y")])),
            Access::Denied(_)
        ));
        assert!(matches!(
            check(&st, &req("/", &[("authorization", "Basic s3cret/x")])),
            Access::Denied(_)
        ));
        let cookie = format!(
            "a=b; longhaul_dashboard_5380={}",
            longhaul_proto::units::hex(b"s3cret/x")
        );
        assert_eq!(
            check(&st, &req("/", &[("cookie", &cookie)])),
            Access::Allowed
        );
        let bad = format!(
            "longhaul_dashboard_5380={}",
            longhaul_proto::units::hex(b"s3cret/")
        );
        assert!(matches!(
            check(&st, &req("/", &[("cookie", &bad)])),
            Access::Denied(_)
        ));
        // Another port's dashboard's cookie is not this one's.
        let bad = format!(
            "longhaul_dashboard_5381={}",
            longhaul_proto::units::hex(b"s3cret/x")
        );
        assert!(matches!(
            check(&st, &req("/", &[("cookie", &bad)])),
            Access::Denied(_)
        ));
        assert_eq!(
            check(&st, &req("/?token=s3cret%2Fx", &[])),
            Access::SetCookie("/".into())
        );
        assert_eq!(
            check(&st, &req("/api/history?kind=cp&token=s3cret/x", &[])),
            Access::SetCookie("/api/history?kind=cp".into())
        );
        assert!(matches!(
            check(&st, &req("/?token=s3cret", &[])),
            Access::Denied(_)
        ));
        // A token on a foreign Host is still fine: the token is the check.
        assert_eq!(
            check(
                &st,
                &req(
                    "/",
                    &[
                        ("host", "dash.example"),
                        ("authorization", "Bearer s3cret/x")
                    ]
                )
            ),
            Access::Allowed
        );
    }

    /// One request over a fresh connection; the status line, headers and body.
    fn http(addr: SocketAddr, path: &str, headers: &str) -> (u16, String, String) {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        write!(
            c,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n"
        )
        .unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, head.to_string(), body.to_string())
    }

    /// A dashboard with this token, or open without one.
    fn serve(token: Option<&str>, archive: &std::path::Path) -> SocketAddr {
        let d = Dashboard::bind(DashboardOptions {
            token: token.map(str::to_string),
            open: token.is_none(),
            ..DashboardOptions::new("127.0.0.1:0".parse().unwrap(), archive.to_path_buf())
        })
        .unwrap();
        let addr = d.local_addr().unwrap();
        std::thread::spawn(move || d.run());
        addr
    }

    #[test]
    fn on_loopback_a_token_is_made_and_only_its_url_gets_in() {
        let t = tempfile::tempdir().unwrap();
        let d = Dashboard::bind(DashboardOptions::new(
            "127.0.0.1:0".parse().unwrap(),
            t.path().join("archive.db"),
        ))
        .unwrap();
        let addr = d.local_addr().unwrap();
        let url = d.url().unwrap();
        let token = url
            .strip_prefix(&format!("http://{addr}/?token="))
            .unwrap_or_else(|| panic!("{url}"))
            .to_string();
        assert_eq!(token.len(), 64, "{url}");
        std::thread::spawn(move || d.run());
        // Another account on this host, without the token: nothing.
        for path in ["/", "/app.js", "/api/history", "/api/live", "/api/running"] {
            let (status, head, body) = http(addr, path, "");
            assert_eq!(status, 401, "{path}: {head}");
            assert!(!body.contains(&token) && !head.contains(&token));
        }
        let (status, _, _) = http(addr, "/?token=0000", "");
        assert_eq!(status, 401);
        let (status, head, _) = http(addr, &format!("/?token={token}"), "");
        assert_eq!(status, 303, "{head}");
        let want = format!("set-cookie: longhaul_dashboard_{}=", addr.port());
        assert!(head.to_ascii_lowercase().contains(&want), "{head}");
        let auth = format!("Authorization: Bearer {token}\r\n");
        let (status, _, body) = http(addr, "/api/history", &auth);
        assert_eq!(status, 200, "{body}");
    }

    #[test]
    fn over_http_the_token_guards_everything() {
        let t = tempfile::tempdir().unwrap();
        let addr = serve(Some("tok-123"), &t.path().join("archive.db"));
        for path in [
            "/",
            "/app.js",
            "/api/history",
            "/api/live",
            "/api/run/1",
            "/nope",
        ] {
            let (status, head, body) = http(addr, path, "");
            assert_eq!(status, 401, "{path}: {head}");
            assert!(!body.contains("tok-123"));
        }
        let (status, head, _) = http(addr, "/?token=tok-123", "");
        assert_eq!(status, 303, "{head}");
        let lower = head.to_ascii_lowercase();
        assert!(lower.contains("location: /\r\n"), "{head}");
        assert!(lower.contains("set-cookie: longhaul_dashboard_"), "{head}");
        assert!(
            lower.contains("httponly") && lower.contains("samesite=strict"),
            "{head}"
        );
        let cookie = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .starts_with("set-cookie:")
                    .then(|| l[11..].trim())
            })
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_string();
        let (status, _, body) = http(addr, "/", &format!("Cookie: {cookie}\r\n"));
        assert_eq!(status, 200);
        assert!(body.contains("<script src=\"/app.js\""));
        let (status, _, body) = http(addr, "/api/history", "Authorization: Bearer tok-123\r\n");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["missing"], true);
        assert_eq!(v["runs"], serde_json::json!([]));
    }

    #[test]
    fn over_http_the_api_answers_json_and_the_feed_pushes() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("archive.db");
        let addr = serve(None, &p);
        let (status, head, body) = http(addr, "/api/run/1", "");
        assert_eq!(status, 404, "{head}");
        assert!(body.contains("\"error\""), "{body}");
        let (status, _, body) = http(addr, "/api/history?since=soon", "");
        assert_eq!(status, 400);
        assert!(body.contains("since"), "{body}");
        let (status, _, body) = http(addr, "/api/run/1/intervals?after=x", "");
        assert_eq!(status, 400, "{body}");
        let (status, head, _) = http(addr, "/", "");
        assert_eq!(status, 200);
        assert!(
            head.to_ascii_lowercase()
                .contains("content-security-policy"),
            "{head}"
        );

        // A run appears in the archive while the dashboard is up.
        let a = longhaul_archive::Archive::open(&p).unwrap();
        let id = a
            .begin_run(&longhaul_archive::model::NewRun {
                kind: "cp".into(),
                command: "longhaul cp a h:data/".into(),
                ..Default::default()
            })
            .unwrap();
        let (w, fin) = longhaul_archive::writer::Writer::start(a, id);
        w.live(4096, 3, Some(1e9));
        let started = std::time::Instant::now();
        loop {
            let (_, _, body) = http(addr, "/api/running", "");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            if v["running"][0]["live_bytes"] == 4096 {
                assert_eq!(v["archive"], "ok");
                assert_eq!(v["running"][0]["rate_bps"], 1e9);
                break;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "{v}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        // The event stream: its first event at once, then more, each a snapshot.
        {
            use std::io::{BufRead, Write};
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
                .unwrap();
            write!(c, "GET /api/live HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
            let mut r = std::io::BufReader::new(c);
            let mut seqs = Vec::new();
            let mut line = String::new();
            while seqs.len() < 3 {
                line.clear();
                assert!(r.read_line(&mut line).unwrap() > 0, "the stream ended");
                if let Some(data) = line.trim_end().strip_prefix("data: ") {
                    let v: serde_json::Value = serde_json::from_str(data).unwrap();
                    assert_eq!(v["running"][0]["id"], id);
                    seqs.push(v["seq"].as_u64().unwrap());
                }
            }
            assert!(seqs.windows(2).all(|w| w[1] > w[0]), "{seqs:?}");
            assert!(started.elapsed() < std::time::Duration::from_secs(60));
        }
        w.end(longhaul_archive::writer::RunEnd {
            status: "ok".into(),
            ..Default::default()
        });
        drop(w);
        fin.finish();
        let (status, _, body) = http(addr, &format!("/api/run/{id}"), "");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "ok");
        assert_eq!(v["kind"], "cp");
    }

    #[test]
    fn a_query_token_is_form_decoded_and_odd_escapes_are_refused() {
        let st = state(Some("s3cret/A b"));
        for q in ["s3cret%2F%41+b", "s3cret/A%20b", "s3cret%2fA+b"] {
            assert_eq!(
                check(&st, &req(&format!("/?token={q}"), &[])),
                Access::SetCookie("/".into()),
                "{q}"
            );
        }
        for q in ["%", "%4", "%zz", "s3cret%2F%4", "s3cret/A+b%"] {
            assert!(
                matches!(
                    check(&st, &req(&format!("/?token={q}"), &[])),
                    Access::Denied(_)
                ),
                "{q}"
            );
        }
    }
}
