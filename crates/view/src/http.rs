//! What the dashboard and the metrics endpoint share of HTTP: the accept
//! loop, with a cap on the connections open at once and a time limit on
//! each request's header (and on a TLS handshake), and the Host check that
//! stops a web page elsewhere from reading them by rebinding its own name
//! to this host's address (DNS rebinding).
//!
//! A connection holds one of [`Limits::max_connections`] slots from its
//! accept to its close; when all are held, new connections wait in the
//! kernel's queue until one is freed. One address holds at most
//! [`Limits::max_per_address`] of them: its next connection takes the
//! place of its oldest (closed), so that one peer cannot hold every slot,
//! and a client sharing an address with it still gets in. A client that does not finish a
//! request's header within [`Limits::header_timeout`] (counted once from
//! the first wait for it, not renewed by trickled bytes; an idle kept-alive
//! connection waits for its next header too) is cut off, so slow clients
//! hold a slot for a bounded time and cannot lock the endpoint out.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header::{self, HeaderValue};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio_rustls::TlsAcceptor;

/// How long a client may take to send a request's header.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What one endpoint allows its clients.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once (TLS handshakes included); more wait.
    pub max_connections: usize,
    /// Of those, from one address; past it the address's oldest
    /// connection is closed to make room.
    pub max_per_address: usize,
    /// Time to send a request's header, from the moment the server waits
    /// for it.
    pub header_timeout: Duration,
    /// Time to complete a TLS handshake.
    pub handshake_timeout: Duration,
}

impl Limits {
    /// The limits of an endpoint that allows `max_connections` at once,
    /// a quarter of them from one address.
    pub fn new(max_connections: usize) -> Limits {
        Limits {
            max_connections,
            max_per_address: (max_connections / 4).max(1),
            header_timeout: HEADER_TIMEOUT,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }
}

/// An endpoint bound and ready to serve: its listener and the
/// current-thread runtime it is served on, both made before anything is
/// served, so that a port in use (or no runtime) is the caller's error, at
/// once. The dashboard serves on the caller's thread, the metrics on a
/// thread of their own.
pub struct Endpoint {
    listener: std::net::TcpListener,
    runtime: tokio::runtime::Runtime,
}

/// Why an [`Endpoint`] could not be made.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The address could not be bound (the message says why and what to do).
    #[error("{0}")]
    Bind(String),
    #[error("cannot start the runtime serving HTTP: {0}")]
    Runtime(std::io::Error),
}

impl Endpoint {
    /// Binds `addr` (port 0: any free one; a port in use says so and
    /// names `option`, the option that chose it) and makes the runtime.
    pub fn bind(addr: SocketAddr, option: &str) -> Result<Endpoint, EndpointError> {
        let listener = bind(addr, option).map_err(EndpointError::Bind)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(EndpointError::Runtime)?;
        Ok(Endpoint { listener, runtime })
    }

    /// The address bound (the real port when asked for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `app` (HTTP/1.1; over TLS when `tls` is given) within
    /// `limits`, on this thread, until the process ends; each connection
    /// runs in a task of its own.
    pub fn serve(
        self,
        tls: Option<Arc<rustls::ServerConfig>>,
        app: Router,
        limits: Limits,
    ) -> std::io::Result<()> {
        let Endpoint { listener, runtime } = self;
        runtime.block_on(async move {
            serve(TcpListener::from_std(listener)?, tls, app, limits).await;
            Ok(())
        })
    }
}

async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    limits: Limits,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let per_address = PerAddress::default();
    let acceptor = tls.map(TlsAcceptor::from);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (sock, held) = match listener.accept().await {
            Ok((s, peer)) => (s, per_address.hold(peer.ip(), limits.max_per_address)),
            Err(_) => {
                // Out of descriptors and the like: breathe, then go on.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let (app, acceptor, limits) = (app.clone(), acceptor.clone(), limits.clone());
        tokio::spawn(async move {
            let served = async {
                match acceptor {
                    Some(a) => {
                        if let Ok(Ok(s)) =
                            tokio::time::timeout(limits.handshake_timeout, a.accept(sock)).await
                        {
                            serve_connection(s, app, &limits).await;
                        }
                    }
                    None => serve_connection(sock, app, &limits).await,
                }
            };
            // Made room for a newer one from its address: closed (dropped).
            tokio::select! {
                () = served => {}
                () = held.closed.notified() => {}
            }
            drop((slot, held));
        });
    }
}

/// The connections open from each address, oldest first: each can be
/// told to close.
#[derive(Default, Clone)]
struct PerAddress(Arc<std::sync::Mutex<Open>>);

type Open = std::collections::HashMap<IpAddr, std::collections::VecDeque<(u64, Arc<Notify>)>>;

/// One connection counted for its address while it lives.
struct Held {
    open: PerAddress,
    ip: IpAddr,
    id: u64,
    /// Notified when it must close to make room.
    closed: Arc<Notify>,
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl PerAddress {
    /// Counts one more from `ip`; if it holds `max` already, its oldest
    /// is told to close.
    fn hold(&self, ip: IpAddr, max: usize) -> Held {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mine = m.entry(ip).or_default();
        while mine.len() >= max.max(1) {
            if let Some((_, oldest)) = mine.pop_front() {
                oldest.notify_one();
            }
        }
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let closed = Arc::new(Notify::new());
        mine.push_back((id, closed.clone()));
        Held {
            open: self.clone(),
            ip,
            id,
            closed,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut m = self.open.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mine) = m.get_mut(&self.ip) {
            mine.retain(|(id, _)| *id != self.id);
            if mine.is_empty() {
                m.remove(&self.ip);
            }
        }
    }
}

async fn serve_connection<I>(io: I, app: Router, limits: &Limits)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // HTTP/1 only: hyper-util's automatic version detection reads the
    // preface without a time limit.
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app))
        .await;
}

/// Binds `addr` for an endpoint (non-blocking, for tokio). A port in use
/// says so and what to do.
fn bind(addr: SocketAddr, option: &str) -> Result<std::net::TcpListener, String> {
    let l = std::net::TcpListener::bind(addr).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                format!(" (another process listens there: pick another {option} port)")
            }
            std::io::ErrorKind::PermissionDenied => " (ports below 1024 need root)".to_string(),
            _ => String::new(),
        };
        format!("cannot listen on {addr}: {e}{hint}")
    })?;
    l.set_nonblocking(true)
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    Ok(l)
}

/// The host names an endpoint answers to. A browser names in `Host` the
/// name it was sent to; a page of `evil.example` whose name an attacker
/// rebinds to this host's address still says `Host: evil.example`, so
/// answering only to names that cannot be rebound (IP addresses, which a
/// browser sends as they are, and `localhost`) or that the operator gave
/// keeps such a page out.
#[derive(Debug, Clone)]
pub struct Hosts {
    /// Any IP address, not only loopback ones.
    any_ip: bool,
    /// More names, lowercase, without a trailing dot.
    names: Vec<String>,
}

impl Hosts {
    /// Loopback only: `localhost` (and `*.localhost`), `127.0.0.0/8`, `[::1]`.
    pub fn loopback() -> Hosts {
        Hosts {
            any_ip: false,
            names: Vec::new(),
        }
    }

    /// Any IP address, `localhost`, and `names` (the names by which this
    /// host is reached: `serve --metrics-host NAME`).
    pub fn addresses_and(names: &[String]) -> Hosts {
        Hosts {
            any_ip: true,
            names: names.iter().map(|n| normal(n)).collect(),
        }
    }

    /// Whether a `Host` value (a name or address, with or without a port)
    /// is one of these.
    pub fn allows(&self, host: &str) -> bool {
        let name = if let Some(rest) = host.strip_prefix('[') {
            match rest.split_once(']') {
                Some((ip, port)) if port.is_empty() || port.starts_with(':') => ip,
                _ => return false,
            }
        } else {
            host.rsplit_once(':').map_or(host, |(h, _)| h)
        };
        if let Ok(ip) = name.parse::<IpAddr>() {
            return self.any_ip || ip.is_loopback();
        }
        let name = normal(name);
        name == "localhost" || name.ends_with(".localhost") || self.names.contains(&name)
    }

    /// Whether a request names one of these: its `Host`, and the host of
    /// an absolute URI when it has one. A request without either (HTTP/1.0)
    /// comes from no browser, so no rebinding: it passes.
    pub fn allows_request(&self, req: &Request) -> bool {
        let host = req.headers().get(header::HOST);
        if host.is_some_and(|h| !h.to_str().is_ok_and(|h| self.allows(h))) {
            return false;
        }
        req.uri()
            .authority()
            .is_none_or(|a| self.allows(a.as_str().rsplit('@').next().unwrap_or("")))
    }
}

fn normal(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// What a request whose Host is not allowed gets.
pub fn wrong_host(hint: &str) -> Response {
    (
        StatusCode::FORBIDDEN,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        format!("this endpoint does not answer to the host name this request names (a page elsewhere may have rebound its name to this address); {hint}\n"),
    )
        .into_response()
}

/// A middleware that refuses requests whose Host is not allowed
/// ([`Hosts::allows_request`]), with `hint` saying which names are.
pub async fn host_guard(
    State(check): State<Arc<(Hosts, &'static str)>>,
    req: Request,
    next: Next,
) -> Response {
    if check.0.allows_request(&req) {
        next.run(req).await
    } else {
        wrong_host(check.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    #[test]
    fn hosts_that_cannot_be_rebound() {
        let lo = Hosts::loopback();
        for h in [
            "127.0.0.1:5380",
            "localhost:5380",
            "localhost.",
            "[::1]:80",
            "[::1]",
            "127.0.0.2",
            "LOCALHOST",
            "dash.localhost:1",
        ] {
            assert!(lo.allows(h), "{h}");
        }
        for h in [
            "evil.example:5380",
            "evil.example",
            "192.0.2.1",
            "[2001:db8::1]:80",
            "[::1]x",
            "localhost.evil.example",
            "",
        ] {
            assert!(!lo.allows(h), "{h}");
        }
        let m = Hosts::addresses_and(&["DTN1.example.org.".into()]);
        for h in [
            "192.0.2.1:9310",
            "[2001:db8::1]:9310",
            "127.0.0.1",
            "localhost:9310",
            "dtn1.example.org:9310",
            "dtn1.EXAMPLE.org.",
        ] {
            assert!(m.allows(h), "{h}");
        }
        for h in ["evil.example:9310", "dtn2.example.org", "example.org"] {
            assert!(!m.allows(h), "{h}");
        }
    }

    /// An endpoint of `limits` answering "ok" to `GET /`, on its own thread.
    fn endpoint(limits: Limits) -> SocketAddr {
        let e = Endpoint::bind("127.0.0.1:0".parse().unwrap(), "--listen").unwrap();
        let addr = e.local_addr().unwrap();
        std::thread::spawn(move || {
            let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
            e.serve(None, app, limits).unwrap();
        });
        addr
    }

    /// A client that starts a request and never finishes its header.
    fn slow(addr: SocketAddr) -> TcpStream {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            .unwrap();
        c
    }

    /// One whole request; the answer's status (0: none before `limit`).
    fn get(addr: SocketAddr, limit: Duration) -> u16 {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(limit)).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        String::from_utf8_lossy(&out)
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// Whether the server closed `c` (EOF or reset) within `limit`.
    fn cut_within(c: &mut TcpStream, limit: Duration) -> bool {
        c.set_read_timeout(Some(limit)).unwrap();
        let mut b = [0u8; 256];
        loop {
            match c.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    #[test]
    fn slow_headers_are_cut_off_and_a_real_client_is_served() {
        let addr = endpoint(Limits {
            max_connections: 8,
            max_per_address: 8,
            header_timeout: Duration::from_secs(1),
            handshake_timeout: HANDSHAKE_TIMEOUT,
        });
        // Five times the cap: partial headers, silent clients, a trickler.
        let mut held: Vec<TcpStream> = (0..30).map(|_| slow(addr)).collect();
        held.extend((0..10).map(|_| TcpStream::connect(addr).unwrap()));
        let mut trickler = slow(addr);
        let t = Instant::now();
        assert_eq!(get(addr, Duration::from_secs(60)), 200);
        assert!(t.elapsed() < Duration::from_secs(60));
        for c in held.iter_mut() {
            assert!(cut_within(c, Duration::from_secs(60)), "not cut off");
        }
        // Bytes that keep coming do not extend the limit.
        trickler
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let started = Instant::now();
        let mut cut = false;
        while started.elapsed() < Duration::from_secs(60) {
            if trickler.write_all(b"x").is_err() {
                cut = true;
                break;
            }
            let mut b = [0u8; 64];
            match trickler.read(&mut b) {
                Ok(0) => {
                    cut = true;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    cut = true;
                    break;
                }
                _ => {}
            }
        }
        assert!(cut, "a client trickling its header was never cut off");
        assert_eq!(get(addr, Duration::from_secs(60)), 200);
    }

    #[test]
    fn the_connection_cap_holds() {
        let addr = endpoint(Limits {
            max_connections: 4,
            max_per_address: 4,
            header_timeout: Duration::from_secs(3600),
            handshake_timeout: HANDSHAKE_TIMEOUT,
        });
        let mut held: Vec<TcpStream> = (0..4).map(|_| slow(addr)).collect();
        // A fifth is not served while four hold every slot (they hold them
        // for an hour)...
        let waiting = std::thread::spawn(move || get(addr, Duration::from_secs(120)));
        std::thread::sleep(Duration::from_secs(2));
        assert!(!waiting.is_finished(), "served beyond the cap");
        // ...and is as soon as one lets go.
        held.pop();
        assert_eq!(waiting.join().unwrap(), 200);
        drop(held);
    }

    /// The attacker opens silent connections from one address: past its
    /// share each takes the place of its oldest, so it holds its share
    /// only, and a client from another address is served at once while
    /// those hold theirs (for an hour).
    #[test]
    fn attacker_one_address_holds_its_share_of_the_slots_only() {
        let addr = endpoint(Limits {
            max_connections: 8,
            max_per_address: 4,
            header_timeout: Duration::from_secs(3600),
            handshake_timeout: HANDSHAKE_TIMEOUT,
        });
        let from = |ip: &str| {
            let c =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            c.bind(&SocketAddr::new(ip.parse().unwrap(), 0).into())
                .unwrap();
            c.connect(&addr.into()).unwrap();
            TcpStream::from(c)
        };
        let mut held: Vec<TcpStream> = (0..12).map(|_| from("127.0.0.2")).collect();
        // The first eight were closed, oldest first, as the rest came.
        for c in held.iter_mut().take(8) {
            assert!(cut_within(c, Duration::from_secs(60)), "an old one kept");
        }
        let t = Instant::now();
        assert_eq!(get(addr, Duration::from_secs(60)), 200);
        assert!(t.elapsed() < Duration::from_secs(30));
        drop(held);
    }
}
