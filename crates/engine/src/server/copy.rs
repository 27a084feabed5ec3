//! Third-party copies, on the servers (PROTOCOL.md 13.9): the destination
//! makes a capability for one push into one destination and holds it while
//! the ordering client's session lasts (at most its lifetime); the source
//! dials the destination with it and pushes, as a client would, relaying
//! progress and the final report to the ordering client.
//!
//! The rules are those of the third-party perf test (`third_party.rs`):
//! only authenticated requesters, nothing dialled for anyone else, and one
//! uniform failure at one fixed time for a target that has not completed
//! longhaul's handshake, so that a source cannot be used as a port scanner.
//! A capability is a fresh 256-bit secret held in memory only (its BLAKE3
//! hash, never the secret, is kept); it is never logged, stored or shown.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_proto::msg::*;
use longhaul_proto::units::escaped;
use longhaul_proto::xfer::copy::{
    within_scope, CopyConnectBack, CopyLanded, CopyOrder, CopyProgress, CopyShareItem,
    CAPABILITY_PREFIX,
};
use longhaul_proto::xfer::{Remote, TransferRequest};

use super::slots::Claimant;
use super::{auth, Shared};
use crate::end::End;
use crate::net::back;
use crate::net::conn::FramedConn;
use crate::net::dial::{open_control, ClientOptions, Security};
use crate::net::tls;
use crate::report::{Reporter, TransferProgress};
use crate::xfer::beneath::Anchor;
use crate::xfer::client::cp_with;
use crate::xfer::source::{root_name, Share, ShareItem};
use crate::xfer::{beneath, confine};
use crate::EngineError;

/// What a capability allows (defined beside the access it gives).
pub use super::auth::Scope;

/// The one refusal of a capability that is not (or no longer) good: which
/// of unknown, expired or revoked is not told.
const NOT_GOOD: &str = "unknown, expired or revoked third-party copy capability: the copy's ordering client must ask the destination for a new one";

/// The capabilities a server has issued ([`super::grant`]) and not yet
/// revoked, by the BLAKE3 hash of each; a job's (`durable`) also in the
/// state directory ([`super::durable`]), so that they outlive a restart.
#[derive(Default)]
pub(super) struct Capabilities {
    pub(super) live: Mutex<HashMap<blake3::Hash, Scope>>,
    /// Where durable ones are kept; None: nowhere (they are refused).
    pub(super) state: Option<std::path::PathBuf>,
}

impl Capabilities {
    pub(super) fn revoke(&self, key: &blake3::Hash) {
        if let Ok(mut m) = self.live.lock() {
            if m.remove(key).is_some_and(|s| s.request.durable) {
                if let Err(e) = self.persist(&m) {
                    tracing::warn!("{e}");
                }
            }
        }
    }

    /// Who presents `token`, a capability: its scope while it lives.
    pub(super) fn admit(&self, token: &str) -> Result<auth::Access, String> {
        let key = blake3::hash(token.as_bytes());
        let mut m = self.live.lock().map_err(|_| "internal error".to_string())?;
        // Looked up by hash: no comparison of secrets to time.
        match m.get(&key) {
            Some(s) if Instant::now() < s.expires => Ok(auth::Access::capability(s.clone())),
            Some(_) => {
                if m.remove(&key).is_some_and(|s| s.request.durable) {
                    let _ = self.persist(&m);
                }
                Err(NOT_GOOD.into())
            }
            None => Err(NOT_GOOD.into()),
        }
    }

    /// Whether a request in `scope` may run now: the capability still
    /// issued and alive, and the request within it.
    pub(super) fn check(&self, scope: &Scope, t: &TransferRequest) -> Result<(), String> {
        self.alive(scope)?;
        within_scope(&scope.request, t)
    }

    /// Whether the capability of `scope` is still issued and alive.
    pub(super) fn alive(&self, scope: &Scope) -> Result<(), String> {
        let live = self
            .live
            .lock()
            .map_err(|_| "internal error".to_string())?
            .get(&scope.key)
            .is_some_and(|s| Instant::now() < s.expires);
        if !live {
            return Err(NOT_GOOD.into());
        }
        Ok(())
    }
}

/// Whether a session admitted by a capability of `scope` may ask for
/// `ev`: a push capability only pushes (and, a job's, revokes itself and
/// discards what its pushes left); a pull capability reads (pulls, lists)
/// and revokes itself; an order capability orders its one copy, lists its
/// sources and revokes itself. Each request is checked against the scope
/// again.
pub(super) fn may_ask(scope: &Scope, ev: &longhaul_proto::session::ServerEvent) -> bool {
    use longhaul_proto::session::ServerEvent as E;
    use longhaul_proto::xfer::copy::CapabilityOp;
    match ev {
        E::TransferRequested(_) | E::Stop(_) | E::RevokeRequested => true,
        E::DiscardRequested(_) => scope.request.op == CapabilityOp::Push,
        E::ListRequested(_) => scope.request.op != CapabilityOp::Push,
        E::CopyOrdered(_) => scope.request.op == CapabilityOp::Order,
        _ => false,
    }
}

/// Whether `token` is a capability rather than a grant's token.
pub(super) fn is_capability(token: Option<&str>) -> bool {
    token.is_some_and(|t| t.starts_with(CAPABILITY_PREFIX))
}

pub(super) fn disabled() -> (RefuseCode, String) {
    (
        RefuseCode::ThirdPartyDisabled,
        "this server does not take part in third-party copies: its admin may allow them with `longhaul serve --third-party-copies`".into(),
    )
}

pub(super) fn anonymous(what: &str) -> (RefuseCode, String) {
    (
        RefuseCode::Unauthorized,
        format!("this server {what} for authenticated clients only: pass --token-file FILE or set LONGHAUL_TOKEN"),
    )
}

/// Relays a copy's progress and intervals to the ordering client.
struct Relayer {
    tx: mpsc::Sender<CopyRelay>,
    last: Option<Instant>,
}

impl Reporter for Relayer {
    fn transfer_progress(&mut self, p: &TransferProgress) {
        // About once a second: the ordering client's traffic stays small.
        let now = Instant::now();
        if self
            .last
            .is_some_and(|l| now.duration_since(l) < Duration::from_secs(1))
            && !p.walk_done
        {
            return;
        }
        self.last = Some(now);
        let _ = self.tx.send(CopyRelay::Progress(CopyProgress {
            bytes: p.bytes,
            files: p.files,
            announced_bytes: p.announced_bytes,
            announced_files: p.announced_files,
            walk_done: p.walk_done,
        }));
    }

    fn transfer_interval(&mut self, i: &longhaul_proto::tune::TransferInterval) {
        let _ = self.tx.send(CopyRelay::Interval(i.clone()));
    }
}

fn failed(conn: &mut FramedConn, code: RefuseCode, message: String) {
    let _ = conn.send(&Message::CopyRelay(CopyRelay::Failed(Refuse {
        code,
        message,
    })));
}

/// Runs a third-party copy from this server: checks the order, dials the
/// destination (one uniform failure at one fixed time if it is not a
/// longhaul server that takes the capability), pushes to it, and relays
/// the copy while still listening to the requester (a stop or a closed
/// connection interrupts the copy; its journal lets the next one resume).
/// `Err`: refused before anything was dialled.
pub(super) fn serve_copy(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    order: &CopyOrder,
    access: &auth::Access,
) -> Result<(), (RefuseCode, String)> {
    let checked = check_order(shared, conn, order, access)?;
    let Some(_slot) = shared.slots.try_take(shared, &Claimant::of(access)) else {
        let (running, limit) = shared.slots.load();
        return Err((
            RefuseCode::Busy,
            format!("server is running {running} tests and transfers, its limit (--max-tests {limit}); try again later"),
        ));
    };
    let back_ip = checked.back_ip;
    tracing::info!(
        "third-party copy from {} ({}): {} source(s) of {} to {}{}",
        conn.peer(),
        access.who,
        checked.sources.len(),
        checked.ex.name,
        escaped(&order.target),
        match back_ip {
            Some(ip) => format!(", which connects back to {ip}"),
            None => String::new(),
        }
    );
    let (tx, rx) = mpsc::channel::<CopyRelay>();
    // Requests to connect back go to the client while the copy runs.
    let asks = Arc::new(Mutex::new(Some(tx.clone())));
    let back = back_ip.map(|ip| connect_back_route(&order.target, ip, asks.clone()));
    let interrupt = Arc::new(AtomicBool::new(false));
    let client = dialler(shared, order, &checked.fingerprint, &interrupt, back);
    let until = Instant::now() + super::third_party::reach(&client);
    let o = copy_options(order, checked, &client, &interrupt, &tx);
    let (shook, handshake_rx) = mpsc::channel::<bool>();
    let Ok(worker) = spawn_copy(order.target.clone(), client, o, tx, asks, shook) else {
        failed(
            conn,
            RefuseCode::ServerError,
            "cannot start a thread for the copy".into(),
        );
        return Ok(());
    };
    if !await_handshake(conn, &handshake_rx, &rx, until) {
        interrupt.store(true, Ordering::SeqCst);
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        let mut why = super::third_party::uniform_failure(&order.target);
        if let Some(ip) = back_ip {
            why.push_str(&format!(
                " (it was to connect back to this source at {ip}: can it reach that address?)"
            ));
        }
        failed(conn, RefuseCode::ServerError, why);
        return Ok(());
    }
    super::third_party::relay_until_done(conn, &rx, Message::CopyRelay, &interrupt, "copy");
    let _ = worker.join();
    Ok(())
}

/// A copy's order, checked: its export, the destination's certificate,
/// the address it connects back to, and what it reads, resolved beneath
/// the export's root.
struct CheckedOrder<'a> {
    ex: &'a crate::xfer::Export,
    fingerprint: String,
    back_ip: Option<std::net::IpAddr>,
    anchor: Anchor,
    sources: Vec<String>,
    share: Option<Vec<ShareItem>>,
}

/// Checks that this server takes the order from this requester, and what
/// the order reads; `Err`: the refusal.
fn check_order<'a>(
    shared: &'a Arc<Shared>,
    conn: &FramedConn,
    order: &CopyOrder,
    access: &auth::Access,
) -> Result<CheckedOrder<'a>, (RefuseCode, String)> {
    if !shared.cfg.third_party_copies {
        return Err(disabled());
    }
    if access.is_anonymous() {
        return Err(anonymous("runs third-party copies"));
    }
    if !conn.is_tls() {
        return Err((
            RefuseCode::TlsRequired,
            "a third-party copy is ordered inside TLS only: its capability crossed in the clear, and is not used".into(),
        ));
    }
    if let Some(scope) = &access.scope {
        shared
            .capabilities
            .alive(scope)
            .and_then(|()| longhaul_proto::xfer::copy::within_order_scope(&scope.request, order))
            .map_err(|m| (RefuseCode::Unauthorized, m))?;
    }
    let ex = super::files::export(shared, &order.export, access)?;
    access
        .check_read(ex)
        .map_err(|m| (RefuseCode::Unauthorized, m))?;
    if !order.capability.starts_with(CAPABILITY_PREFIX) {
        return Err((
            RefuseCode::BadRequest,
            "a third-party copy carries the destination's capability (lh1c_...), never another credential".into(),
        ));
    }
    let fingerprint =
        tls::parse_fingerprint(&order.fingerprint).map_err(|m| (RefuseCode::BadRequest, m))?;
    let back_ip = match &order.connect_back {
        Some(c) => Some(c.addr.parse::<std::net::IpAddr>().map_err(|_| {
            (
                RefuseCode::BadRequest,
                format!(
                    "connect_back.addr '{}' is not an IP address",
                    escaped(&c.addr)
                ),
            )
        })?),
        None => None,
    };
    let bad = |e: EngineError| (RefuseCode::BadRequest, e.to_string());
    let slashed = order.sources.iter().filter(|s| s.ends_with('/')).count();
    // Everything read resolves beneath the export root; links on the way
    // are followed beneath it, as for a pull.
    let anchor = Anchor::open_as(&ex.root, &shared.cfg.shown_root(ex)).map_err(bad)?;
    let mut sources = Vec::new();
    let mut resolved = Vec::new();
    for p in &order.sources {
        let named = beneath(&ex.root, p).map_err(bad)?;
        let r = anchor.resolve(&named, p.ends_with('/')).map_err(bad)?;
        let there = anchor
            .anchored(&r)
            .is_ok_and(|at| std::fs::symlink_metadata(at).is_ok());
        if !there {
            return Err((
                RefuseCode::BadRequest,
                format!("{} does not exist", shared.cfg.show(ex, p)),
            ));
        }
        let mut s = r.to_string_lossy().into_owned();
        if p.ends_with('/') && !s.ends_with('/') {
            s.push('/');
        }
        sources.push(s);
        resolved.push(r);
    }
    let read: Vec<(&str, &Path)> = order
        .sources
        .iter()
        .map(String::as_str)
        .zip(resolved.iter().map(|r| r.as_path()))
        .collect();
    auth::reads_within(access, &anchor, &ex.root, &read)
        .map_err(|m| (RefuseCode::Unauthorized, m))?;
    if sources.is_empty() || (slashed > 0 && slashed < sources.len()) {
        return Err((
            RefuseCode::BadRequest,
            "name one or more sources, every one with a trailing '/' or none".into(),
        ));
    }
    let share = match &order.share {
        Some(items) => Some(confine_share(&ex.root, &anchor, &resolved, items, order)?),
        None => None,
    };
    Ok(CheckedOrder {
        ex,
        fingerprint,
        back_ip,
        anchor,
        sources,
        share,
    })
}

/// How this server reaches the copy's destination: within its own
/// handshake time-out, pinning the destination's certificate, with the
/// capability as the only credential.
fn dialler(
    shared: &Shared,
    order: &CopyOrder,
    fingerprint: &str,
    interrupt: &Arc<AtomicBool>,
    back: Option<Arc<back::Route>>,
) -> ClientOptions {
    let handshake = shared.cfg.limits.handshake_timeout;
    ClientOptions {
        connect_timeout: ClientOptions::default().connect_timeout.min(handshake),
        handshake_timeout: handshake,
        interrupt: interrupt.clone(),
        security: Security {
            plaintext: false,
            trust: tls::TrustOptions {
                pins: vec![fingerprint.to_string()],
                ..Default::default()
            },
            token: Some(order.capability.clone()),
            tokens: Vec::new(),
        },
        back,
        ..ClientOptions::default()
    }
}

/// The push the order asks for, as a `cp` from this server's export,
/// each landed file relayed when the order asks for the catalogue.
fn copy_options(
    order: &CopyOrder,
    checked: CheckedOrder,
    client: &ClientOptions,
    interrupt: &Arc<AtomicBool>,
    tx: &mpsc::Sender<CopyRelay>,
) -> crate::xfer::client::CpOptions {
    let dest = End::on_server(Remote {
        host: order.target.clone(),
        export: order.dest_export.clone(),
        path: order.dest.trim_end_matches('/').to_string(),
        dir: order.dest_dir || order.dest.is_empty() || order.dest.ends_with('/'),
    });
    let sources = checked.sources.into_iter().map(End::Local).collect();
    let x = &order.options;
    let mut o = crate::xfer::copy::options_of(x, sources, dest, client.clone());
    o.source_anchor = Some(Arc::new(checked.anchor));
    o.share = checked.share.map(|items| Share::Fixed(Arc::new(items)));
    o.progress = Arc::new(crate::xfer::Progress {
        interrupt: interrupt.clone(),
        ..Default::default()
    });
    if x.catalogue {
        let (tx, root) = (Mutex::new(tx.clone()), checked.ex.root.clone());
        o.catalogue = Some(Arc::new(move |l: crate::xfer::Landed| {
            let (source, dest) = (l.namer)(&l.path);
            let source = Path::new(&source)
                .strip_prefix(&root)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            let landed = CopyLanded {
                path: l.path,
                source,
                dest,
                size: l.size,
                mtime_ns: l.mtime_ns,
                digest: l.digest,
            };
            if let Ok(tx) = tx.lock() {
                let _ = tx.send(CopyRelay::Landed(landed));
            }
        }));
    }
    o
}

/// The copy's thread: learns that the destination is a longhaul server
/// that takes the capability (says so on `shook`), then runs the copy and
/// sends its end on `tx`.
fn spawn_copy(
    target: String,
    client: ClientOptions,
    o: crate::xfer::client::CpOptions,
    tx: mpsc::Sender<CopyRelay>,
    asks: Arc<Mutex<Option<mpsc::Sender<CopyRelay>>>>,
    shook: mpsc::Sender<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("lh-3rd-cp".into())
        .spawn(move || {
            let _hush = Hush(asks);
            // Only to learn that a longhaul server that takes the
            // capability is there; the copy dials again.
            match open_control(&target, &client) {
                Ok(ctl) => drop(ctl),
                Err(e) => {
                    tracing::info!(
                        "third-party copy target {} did not complete the handshake: {}",
                        escaped(&target),
                        escaped(&e.to_string())
                    );
                    let _ = shook.send(false);
                    return;
                }
            }
            if shook.send(true).is_err() || client.interrupt.load(Ordering::SeqCst) {
                return;
            }
            let mut relayer = Relayer {
                tx: tx.clone(),
                last: None,
            };
            let relay = match cp_with(&o, &mut relayer) {
                Ok(s) => CopyRelay::Done(Box::new(s.relayed())),
                Err(e) => CopyRelay::Failed(Refuse {
                    code: match &e {
                        EngineError::Refused { code, .. } => *code,
                        _ => RefuseCode::ServerError,
                    },
                    message: e.to_string(),
                }),
            };
            let _ = tx.send(relay);
        })
}

/// Whether the destination completed the handshake before `until`,
/// passing its requests to connect back to the client meanwhile.
fn await_handshake(
    conn: &mut FramedConn,
    handshake_rx: &mpsc::Receiver<bool>,
    rx: &mpsc::Receiver<CopyRelay>,
    until: Instant,
) -> bool {
    loop {
        match handshake_rx.recv_timeout(Duration::from_millis(10)) {
            Ok(ok) => return ok,
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < until => {}
            Err(_) => return false,
        }
        // A destination that connects back is asked through the client.
        while let Ok(r) = rx.try_recv() {
            let _ = conn.send(&Message::CopyRelay(r));
        }
    }
}

/// Ends a copy's requests to connect back when dropped (the copy is
/// over), so that its relay ends with it.
struct Hush(Arc<Mutex<Option<mpsc::Sender<CopyRelay>>>>);

impl Drop for Hush {
    fn drop(&mut self) {
        if let Ok(mut a) = self.0.lock() {
            a.take();
        }
    }
}

/// The route of a copy into a destination that connects back: this
/// server listens on `ip` (as the client reached it; on every address of
/// its family if not its own), on a port its kernel chooses, and each
/// connection's request goes to the client as a `connect_back` relay
/// (`asks`, while the copy runs). It serves this copy's connections only,
/// and its listener closes with it.
fn connect_back_route(
    target: &str,
    ip: std::net::IpAddr,
    asks: Arc<Mutex<Option<mpsc::Sender<CopyRelay>>>>,
) -> Arc<back::Route> {
    let listen = std::net::SocketAddr::new(ip, 0);
    let ask = move |line: &str| {
        let gone = || EngineError::Closed("the ordering client's connection".into());
        let (to, ticket) = back::parse_request(line)
            .ok_or_else(|| EngineError::Failed("internal error: a bad request".into()))?;
        let tx = asks.lock().ok().and_then(|a| a.clone()).ok_or_else(gone)?;
        tx.send(CopyRelay::ConnectBack(CopyConnectBack {
            addr: to.to_string(),
            ticket,
        }))
        .map_err(|_| gone())
    };
    back::Route::scoped(
        target.parse().unwrap_or(listen),
        "the ordering client said the destination can only connect out".into(),
        listen,
        Box::new(ask),
    )
}

/// A fleet rank's share, confined (PROTOCOL.md 13.9, "shares"): each
/// item beneath the order's source it names, by a relative path in the
/// form a walk gives (no `..`, no absolute path), its directory opened
/// beneath the export without following a symbolic link; read from that
/// source joined with its path and announced under the name the source's
/// walk would give it. Anything else refuses the whole order, naming the
/// item. (A directory gone since the rank's manifest passes: the push
/// reads through the export's anchor and reports it missing.)
fn confine_share(
    root: &Path,
    anchor: &Anchor,
    sources: &[std::path::PathBuf],
    items: &[CopyShareItem],
    order: &CopyOrder,
) -> Result<Vec<ShareItem>, (RefuseCode, String)> {
    if order.options.sync.is_some() || order.options.dry_run {
        return Err((
            RefuseCode::BadRequest,
            "a share is copied: it takes no --sync and no --dry-run (the final check is an order without one)".into(),
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for (n, item) in items.iter().enumerate() {
        let refuse = |why: String| {
            let named = order.sources.get(item.source as usize).map_or_else(
                || format!("source #{}", item.source),
                |s| s.trim_end_matches('/').to_string(),
            );
            (
                RefuseCode::BadRequest,
                format!(
                    "share item {n} ({}/{}): {why}; a rank's share names entries beneath the order's sources only",
                    escaped(&named),
                    escaped(&item.rel.chars().take(200).collect::<String>())
                ),
            )
        };
        let Some(source) = sources.get(item.source as usize) else {
            return Err(refuse("the order has no such source".into()));
        };
        let comps = longhaul_proto::xfer::components(&item.rel)
            .map_err(|e| refuse(format!("its path is refused ({})", e.why)))?;
        if comps.join("/") != item.rel {
            return Err(refuse("its path is not in the form a walk gives".into()));
        }
        let mut path = source.clone();
        path.extend(&comps);
        let name = root_name(source);
        if let Some(parent) = path.parent().filter(|_| !comps.is_empty()) {
            if let Err(e) = anchor.dir(parent, false) {
                if !anchor.gone(source, parent) || confine(root, &path).is_err() {
                    return Err(refuse(format!(
                        "it does not resolve beneath its source without following a symbolic link ({e})"
                    )));
                }
            }
        }
        out.push(ShareItem {
            rel: if comps.is_empty() {
                name
            } else {
                format!("{name}/{}", item.rel)
            },
            path,
            chunk_size: item.chunk_size,
            part: item.part,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{ServeConfig, Server};
    use crate::xfer::Export;
    use longhaul_proto::xfer::copy::CopyOptions;
    use longhaul_proto::xfer::copy::GrantRequest;

    /// A job's capability to read `tree` reads beneath `tree` only: a
    /// path named beneath it that a link there leads to the rest of the
    /// export (`tree/out -> ../secret`) is refused, pulled or listed, while
    /// the tree itself (the link as a link, too) still reads.
    #[test]
    fn attacker_a_jobs_read_capability_reads_nothing_through_a_link_out_of_its_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        std::fs::create_dir_all(root.join("tree")).unwrap();
        std::fs::create_dir_all(root.join("secret")).unwrap();
        std::fs::write(root.join("tree/a"), b"mine").unwrap();
        std::fs::write(root.join("secret/key"), b"not the job's").unwrap();
        std::os::unix::fs::symlink("../secret", root.join("tree/out")).unwrap();
        let srv = Server::bind(
            &["127.0.0.1:0".parse().unwrap()],
            ServeConfig {
                exports: vec![Export {
                    name: "data".into(),
                    root: root.clone(),
                    read_only: false,
                    public: false,
                }],
                state_dir: dir.path().join("state"),
                open_access: true,
                third_party_copies: true,
                ..ServeConfig::default()
            },
        )
        .unwrap()
        .spawn();
        let addr = srv.addr().to_string();
        let fingerprint = srv.fingerprint().unwrap();
        let base = ClientOptions {
            security: Security {
                trust: tls::TrustOptions {
                    pins: vec![fingerprint],
                    ..Default::default()
                },
                ..Security::default()
            },
            ..ClientOptions::default()
        };
        let cap = crate::xfer::jobcaps::ask(
            &addr,
            &base,
            GrantRequest {
                export: "data".into(),
                op: longhaul_proto::xfer::copy::CapabilityOp::Pull,
                sources: vec!["tree".into()],
                lifetime_s: 60,
                ..GrantRequest::default()
            },
        )
        .unwrap();
        let holder =
            crate::xfer::jobcaps::presenting(&base, &cap.fingerprint, &cap.capability).unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let pull = |path: &str| {
            let mut o = crate::xfer::client::CpOptions::new(
                vec![End::read(&format!("longhaul://{addr}/data/{path}"))],
                End::local(format!("{}/", out.display())),
                holder.clone(),
            );
            o.retries = 0;
            crate::xfer::client::cp(&o)
        };
        pull("tree/a").unwrap();
        assert_eq!(std::fs::read(out.join("a")).unwrap(), b"mine");
        let listed = crate::xfer::client::ls(
            &End::read(&format!("longhaul://{addr}/data/tree/")),
            false,
            &holder,
        )
        .unwrap();
        assert!(listed.iter().any(|e| e.name == "out"), "{listed:?}");
        for path in ["tree/out/key", "tree/out/"] {
            let e = pull(path).unwrap_err().to_string();
            assert!(e.contains("leads outside"), "{path}: {e}");
        }
        assert!(!out.join("key").exists());
        let e = crate::xfer::client::ls(
            &End::read(&format!("longhaul://{addr}/data/tree/out/")),
            false,
            &holder,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("leads outside"), "{e}");
        srv.shutdown();
    }

    /// The server's own refusal, whatever the client does: a session in
    /// plaintext (a client that skips its own check, as an attacker's
    /// would) is given no capability and cannot order a copy, even where
    /// plaintext is allowed and the session may do everything else.
    #[test]
    fn attacker_a_plaintext_session_gets_no_capability_and_orders_no_copy() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("f"), b"x").unwrap();
        let srv = Server::bind(
            &["127.0.0.1:0".parse().unwrap()],
            ServeConfig {
                exports: vec![Export {
                    name: "data".into(),
                    root: root.clone(),
                    read_only: false,
                    public: false,
                }],
                state_dir: dir.path().join("state"),
                allow_plaintext: true,
                open_access: true,
                third_party_copies: true,
                ..ServeConfig::default()
            },
        )
        .unwrap()
        .spawn();
        let opts = ClientOptions {
            security: Security {
                plaintext: true,
                ..Security::default()
            },
            ..ClientOptions::default()
        };
        let grant = GrantRequest {
            export: "data".into(),
            dest: String::new(),
            dest_dir: true,
            lifetime_s: 60,
            ..GrantRequest::default()
        };
        let order = CopyOrder {
            export: "data".into(),
            sources: vec!["f".into()],
            target: "127.0.0.1:9".into(),
            fingerprint: format!("SHA256:{}", "A".repeat(43)),
            capability: format!("lh1c_{}", "A".repeat(43)),
            dest_export: "data".into(),
            dest: "g".into(),
            dest_dir: false,
            options: CopyOptions::default(),
            connect_back: None,
            share: None,
        };
        for m in [
            Message::GrantRequest(grant),
            Message::CopyOrder(Box::new(order)),
        ] {
            let name = m.name();
            let mut c = open_control(&srv.addr().to_string(), &opts).unwrap();
            c.conn.send(&m).unwrap();
            let e = c
                .answer(
                    Instant::now() + Duration::from_secs(10),
                    "the answer",
                    |m| Some(m.name()),
                )
                .unwrap_err();
            match e {
                EngineError::Refused {
                    code: RefuseCode::TlsRequired,
                    message,
                } => assert!(message.contains("inside TLS only"), "{name}: {message}"),
                other => panic!("{name} in plaintext: {other}"),
            }
        }
        assert!(!root.join("g").exists());
        srv.shutdown();
    }
}
