//! Connecting back (issue 29, part 3): a far end that can only connect
//! out (a common DTN policy) opens the connections itself, as bbcp's
//! reverse mode does.
//!
//! The client side is a [`Route`] for one far end's address: every TCP
//! connection this process opens to that address ([`connect`]) goes
//! through it. It first tries the direct connection, bounded by
//! [`DIRECT_WAIT`]; if that is refused or times out (or the user forced
//! it), it listens ([`Listener`]) and, for each connection the engine
//! wants, makes a fresh ticket ([`TICKET_PREFIX`] and 32 bytes of the OS
//! CSPRNG), asks the far end over the ssh channel to connect back with it
//! (`ask`, PROTOCOL.md 16.1), and hands the engine the connection that
//! arrives with that ticket. Everything after the TCP handshake is as on
//! any connection: this side is still the TLS client, pinning the far
//! end's one-time certificate, and still proves the one-time secret in its
//! `Hello`. The ticket is what keeps a stranger who connects to the
//! listener from taking a stream's place (a denial of service); the pinned
//! TLS is what authenticates. A connection without a ticket, with a wrong
//! or spent one, or too slow to send it, is closed unread.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use base64::Engine as _;

use crate::EngineError;

/// The ticket's form and the request line (PROTOCOL.md 16.1).
pub use longhaul_proto::xfer::back::{TICKET_LEN, TICKET_PREFIX};
/// How long the direct connection may take before the far end is asked to
/// connect back instead.
pub const DIRECT_WAIT: Duration = Duration::from_secs(3);
/// How long a connection to the listener may take to send its ticket.
const TICKET_WAIT: Duration = Duration::from_secs(5);
/// Connections to the listener that have not sent their ticket yet, at
/// most, in all and from one address; past either the idlest is closed
/// ([`super::lobby`]).
const UNPROVEN_MAX: usize = 128;
const UNPROVEN_PER_ADDRESS: usize = 64;

/// Which side opened a far end's connections, and why: what a report says.
pub use longhaul_proto::report::Opened;

/// A fresh ticket: the prefix and 32 bytes of the OS CSPRNG.
pub fn fresh_ticket() -> Result<String, EngineError> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)
        .map_err(|e| EngineError::Usage(format!("cannot read the OS random source: {e}")))?;
    Ok(format!(
        "{TICKET_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    ))
}

/// The request line on the ssh channel: `connect-back ADDR:PORT TICKET`,
/// for a ticket of the exact form only (one of [`fresh_ticket`]'s, or a
/// source's relayed one that passed [`Route::relay`]'s check).
pub fn request_line(to: SocketAddr, ticket: &str) -> Result<String, EngineError> {
    longhaul_proto::xfer::back::request_line(to, ticket).ok_or_else(|| {
        EngineError::Failed(format!(
            "a request to connect back to {to} whose ticket is not one ({TICKET_LEN} characters, {TICKET_PREFIX} and base64url, and nothing else): not written"
        ))
    })
}

/// Reads a request line (without its `\n`); None for anything else.
pub fn parse_request(line: &str) -> Option<(SocketAddr, String)> {
    match longhaul_proto::xfer::back::parse_line(line.as_bytes()) {
        longhaul_proto::xfer::back::Line::Request { to, ticket } => Some((to, ticket)),
        _ => None,
    }
}

/// The far end's part: connects to `to` and sends `ticket`; the stream
/// is then served as if accepted.
pub fn dial_back(
    to: SocketAddr,
    ticket: &str,
    timeout: Duration,
) -> Result<TcpStream, EngineError> {
    use std::io::Write;
    let mut s = TcpStream::connect_timeout(&to, timeout)
        .map_err(|e| EngineError::Connect(format!("cannot connect back to {to}: {e}")))?;
    s.write_all(ticket.as_bytes())
        .map_err(|e| EngineError::io(format!("cannot send the ticket to {to}"), e))?;
    Ok(s)
}

/// Waiting connections, by their ticket's hash.
type Waiting = Mutex<HashMap<[u8; 32], SyncSender<TcpStream>>>;

/// The client's listener for connections back from a far end: hands each
/// connection that brings a waiting ticket to its waiter, and closes every
/// other.
pub struct Listener {
    addr: SocketAddr,
    waiting: Arc<Waiting>,
    stop: Arc<AtomicBool>,
    /// Connections closed for want of a valid ticket.
    refused: Arc<AtomicU64>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Listener {
    /// Listens on `addr` (port 0: any); if that address is not this
    /// host's (a NAT between), on the unspecified address of its family,
    /// same port.
    pub fn bind(addr: SocketAddr) -> Result<Listener, EngineError> {
        let l = match TcpListener::bind(addr) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
                let any: IpAddr = match addr {
                    SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
                    SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
                };
                TcpListener::bind(SocketAddr::new(any, addr.port()))
                    .map_err(|e| EngineError::Usage(format!("cannot listen on {addr} for the far end to connect back: {e}")))?
            }
            Err(e) => {
                return Err(EngineError::Usage(format!(
                    "cannot listen on {addr} for the far end to connect back: {e} (choose another with --connect-back ADDR:PORT)"
                )))
            }
        };
        let local = l
            .local_addr()
            .map_err(|e| EngineError::io("failed to read the listener's address".into(), e))?;
        l.set_nonblocking(true)
            .map_err(|e| EngineError::io("failed to set up the listener".into(), e))?;
        let me = Listener {
            addr: SocketAddr::new(addr.ip(), local.port()),
            waiting: Arc::default(),
            stop: Arc::default(),
            refused: Arc::default(),
        };
        let (waiting, stop, refused) = (me.waiting.clone(), me.stop.clone(), me.refused.clone());
        std::thread::Builder::new()
            .name("lh-back-accept".into())
            .spawn(move || accept_loop(&l, &waiting, &stop, &refused))
            .map_err(|e| EngineError::Usage(format!("cannot start a thread: {e}")))?;
        Ok(me)
    }

    /// The address the far end is told to connect to: the one asked for,
    /// with the port the kernel chose.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections closed for want of a valid ticket so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Waits up to `wait` for the connection that brings `ticket` (made
    /// by [`fresh_ticket`], sent to the far end by the caller after this
    /// call registered it: `send` runs once the ticket is waited for).
    pub fn expect(
        &self,
        ticket: &str,
        wait: Duration,
        send: impl FnOnce() -> Result<(), EngineError>,
    ) -> Result<TcpStream, EngineError> {
        let key = *blake3::hash(ticket.as_bytes()).as_bytes();
        let (tx, rx) = sync_channel(1);
        self.waiting
            .lock()
            .map_err(|_| EngineError::Failed("internal error".into()))?
            .insert(key, tx);
        let got = send().and_then(|()| {
            rx.recv_timeout(wait).map_err(|_| {
                EngineError::Connect(format!(
                    "the far end did not connect back to {} within {} s",
                    self.addr,
                    wait.as_secs()
                ))
            })
        });
        if let Ok(mut w) = self.waiting.lock() {
            w.remove(&key);
        }
        got
    }
}

fn accept_loop(
    l: &TcpListener,
    waiting: &Arc<Waiting>,
    stop: &AtomicBool,
    refused: &Arc<AtomicU64>,
) {
    let lobby = super::lobby::Lobby::new(UNPROVEN_PER_ADDRESS, UNPROVEN_MAX);
    while !stop.load(Ordering::SeqCst) {
        let (s, peer) = match l.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => {
                tracing::warn!("connect-back listener: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let seat = match lobby.enter(&s, peer.ip()) {
            Ok((seat, entered)) => {
                if let super::lobby::Entered::Dropped(ip) = entered {
                    refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        "connect-back listener: closed the idlest connection without a ticket from {ip} to take {peer}"
                    );
                }
                seat
            }
            Err(e) => {
                refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("connect-back listener: closed {peer}: {e}");
                continue;
            }
        };
        let (waiting, refused) = (waiting.clone(), refused.clone());
        let _ = std::thread::Builder::new()
            .name("lh-back-ticket".into())
            .spawn(move || {
                // Counted before the connection closes.
                if let Err((why, s)) = take_ticket(s, &waiting) {
                    refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("connect-back listener: closed a connection from {peer}: {why}");
                    drop(s);
                }
                drop(seat);
            });
    }
}

/// Reads a connection's ticket and hands it to its waiter; else gives it
/// back, with why, to be closed.
fn take_ticket(mut s: TcpStream, waiting: &Waiting) -> Result<(), (&'static str, TcpStream)> {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(TICKET_WAIT));
    let mut t = [0u8; TICKET_LEN];
    if s.read_exact(&mut t).is_err() {
        return Err((
            "no ticket in time (only the far end, told over ssh, has one)",
            s,
        ));
    }
    let _ = s.set_read_timeout(None);
    // The map is keyed by the ticket's hash: nothing is compared with the
    // ticket itself, so nothing leaks by timing.
    let key = *blake3::hash(&t).as_bytes();
    let tx = waiting.lock().ok().and_then(|mut w| w.remove(&key));
    match tx {
        Some(tx) => tx.send(s).map_err(|e| ("its waiter gave up", e.0)),
        None => Err((
            "not a ticket this client is waiting for (wrong, spent or late)",
            s,
        )),
    }
}

/// How a [`Route`] reaches its far end.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Way {
    /// Not tried yet.
    Untried,
    Direct,
    /// Connect back, because of this.
    Back(String),
}

/// Sends a request line to the far end (over the ssh channel).
pub type Ask = Box<dyn Fn(&str) -> Result<(), EngineError> + Send + Sync>;
/// What the far end last said about connecting back, for errors.
pub type Heard = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// One far end's address and how this process reaches it (see the
/// module's documentation).
pub struct Route {
    target: SocketAddr,
    way: Mutex<Way>,
    listen: SocketAddr,
    listener: Mutex<Option<Arc<Listener>>>,
    /// Writes a request line to the far end (over the ssh channel).
    ask: Ask,
    /// What the far end last said about connecting back, for errors.
    heard: Heard,
    /// Only for the connections of the [`ClientOptions`] that carry it
    /// (not in the process's table): see [`Route::scoped`].
    ///
    /// [`ClientOptions`]: super::dial::ClientOptions
    scoped: bool,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// Routes in force in this process: each far end's address, and the
/// addresses its connections back came from (the control connection's
/// peer, which data streams dial), to their route.
static ROUTES: Mutex<Vec<(SocketAddr, Weak<Route>)>> = Mutex::new(Vec::new());

/// Connects with a time-out, trying each address in turn; to a far end
/// with a connect-back route in force, through that route.
pub fn connect(
    addrs: &[SocketAddr],
    timeout: Duration,
    tune: impl Fn(&socket2::Socket) -> io::Result<()>,
) -> Result<TcpStream, EngineError> {
    if let Some(route) = addrs.iter().find_map(|a| route_for(*a)) {
        return route.connect(timeout, &tune);
    }
    super::conn::connect_direct(addrs, timeout, tune)
}

/// The route for connections to `addr`, if one is in force.
pub(crate) fn route_for(addr: SocketAddr) -> Option<Arc<Route>> {
    let mut r = ROUTES.lock().ok()?;
    r.retain(|(_, w)| w.strong_count() > 0);
    r.iter()
        .find(|(a, _)| *a == addr)
        .and_then(|(_, w)| w.upgrade())
}

fn alias(addr: SocketAddr, route: &Arc<Route>) {
    if let Ok(mut r) = ROUTES.lock() {
        r.push((addr, Arc::downgrade(route)));
    }
}

impl Route {
    /// A route to the far end at `target`, in force while the returned
    /// value lives. `forced` connects back from the start; `listen` is
    /// where to listen then (port 0: any); `ask` sends a request line to
    /// the far end; `heard` is what it said last.
    pub fn install(
        target: SocketAddr,
        forced: Option<String>,
        listen: SocketAddr,
        ask: Ask,
        heard: Heard,
    ) -> Arc<Route> {
        let r = Arc::new(Route {
            target,
            way: Mutex::new(forced.map_or(Way::Untried, Way::Back)),
            listen,
            listener: Mutex::new(None),
            ask,
            heard,
            scoped: false,
        });
        alias(target, &r);
        r
    }

    /// A route that connects back from the start (`why`), for the
    /// connections of one set of client options only
    /// (`ClientOptions::back`): a source server's copy into a destination
    /// that can only connect out (PROTOCOL.md 13.9), where `ask` relays
    /// each request to the ordering client. Nothing else this process
    /// dials (another client's copy to the same address) goes this way.
    pub fn scoped(target: SocketAddr, why: String, listen: SocketAddr, ask: Ask) -> Arc<Route> {
        Arc::new(Route {
            target,
            way: Mutex::new(Way::Back(why)),
            listen,
            listener: Mutex::new(None),
            ask,
            heard: Box::new(|| None),
            scoped: true,
        })
    }

    /// Whether the far end opens the connections (it connects back).
    pub fn is_back(&self) -> bool {
        self.opened().is_some_and(|o| o.opened_by == "far_end")
    }

    /// Asks the far end (over its ssh channel) to connect to `to` with
    /// `ticket`: a request another process made (a third-party copy's
    /// source), relayed. Only a ticket of the exact form is written, as
    /// one line: anything else (a second line, spaces, control bytes, a
    /// ticket of another length or alphabet) is refused, and nothing is
    /// written.
    pub fn relay(&self, to: SocketAddr, ticket: &str) -> Result<(), EngineError> {
        (self.ask)(&request_line(to, ticket)?)
    }

    /// Lets the far end connect to `ip`, `count` more times (PROTOCOL.md
    /// 16.1, `connect-back-allow`): a third-party copy's source, before
    /// its requests are relayed. A far end before this line ignores it.
    pub fn allow(&self, ip: IpAddr, count: u32) -> Result<(), EngineError> {
        (self.ask)(&longhaul_proto::xfer::back::allow_line(ip, count))
    }

    /// Which side opened the connections to `addr` so far, and why: None
    /// when no route is in force for it (not a far end over ssh) or
    /// nothing was opened yet.
    pub fn opened_at(addr: SocketAddr) -> Option<Opened> {
        route_for(addr)?.opened()
    }

    /// Which side opened the connections so far, and why (None before any).
    pub fn opened(&self) -> Option<Opened> {
        match &*self.way.lock().ok()? {
            Way::Untried => None,
            Way::Direct => Some(Opened {
                opened_by: "client".into(),
                reason: None,
            }),
            Way::Back(why) => Some(Opened {
                opened_by: "far_end".into(),
                reason: Some(why.clone()),
            }),
        }
    }

    /// A connection to the far end, direct or back (see the module's
    /// documentation); `tune` is applied before a direct connect, or to
    /// the connection back once it arrived.
    pub(crate) fn connect(
        self: &Arc<Route>,
        timeout: Duration,
        tune: &dyn Fn(&socket2::Socket) -> io::Result<()>,
    ) -> Result<TcpStream, EngineError> {
        let way = self.way.lock().map(|w| w.clone()).unwrap_or(Way::Direct);
        match way {
            Way::Direct => super::conn::connect_direct(&[self.target], timeout, tune),
            Way::Untried => {
                let bound = timeout.min(DIRECT_WAIT);
                match super::conn::connect_direct(&[self.target], bound, tune) {
                    Ok(s) => {
                        self.set(Way::Direct);
                        Ok(s)
                    }
                    Err(EngineError::Connect(m)) => {
                        let what = if m.contains("refused") {
                            "refused".to_string()
                        } else {
                            format!("got no answer within {} s", bound.as_secs_f64())
                        };
                        tracing::info!("{m}; asking the far end to connect back");
                        self.set(Way::Back(format!(
                            "direct connection to {} {what}",
                            self.target
                        )));
                        self.back(timeout, tune)
                    }
                    Err(e) => Err(e),
                }
            }
            Way::Back(_) => self.back(timeout, tune),
        }
    }

    fn set(&self, way: Way) {
        if let Ok(mut w) = self.way.lock() {
            if *w == Way::Untried {
                *w = way;
            }
        }
    }

    fn listener(&self) -> Result<Arc<Listener>, EngineError> {
        let mut l = self
            .listener
            .lock()
            .map_err(|_| EngineError::Failed("internal error".into()))?;
        if let Some(l) = &*l {
            return Ok(l.clone());
        }
        let made = Arc::new(Listener::bind(self.listen)?);
        tracing::info!(
            "listening on {} for the far end to connect back",
            made.addr()
        );
        *l = Some(made.clone());
        Ok(made)
    }

    fn back(
        self: &Arc<Route>,
        timeout: Duration,
        tune: &dyn Fn(&socket2::Socket) -> io::Result<()>,
    ) -> Result<TcpStream, EngineError> {
        let listener = self.listener()?;
        let ticket = fresh_ticket()?;
        // A source's copy (scoped) waits no longer than its check may
        // take, so that its listener does not outlive the order.
        let wait = match self.scoped {
            true => timeout * 2,
            false => (timeout * 2).max(Duration::from_secs(10)),
        };
        let s = listener
            .expect(&ticket, wait, || {
                (self.ask)(&request_line(listener.addr(), &ticket)?)
            })
            .map_err(|e| match (self.heard)() {
                Some(said) => EngineError::Connect(format!("{e}; it said: {said}")),
                None => EngineError::Connect(format!(
                    "{e} (is {} reachable from there? name an address it can reach with --connect-back ADDR[:PORT])",
                    listener.addr()
                )),
            })?;
        if let Ok(peer) = s.peer_addr() {
            if !self.scoped && peer != self.target && route_for(peer).is_none() {
                alias(peer, self);
            }
        }
        tune(&socket2::SockRef::from(&s))
            .map_err(|e| EngineError::Usage(format!("a connection back from the far end: {e}")))?;
        if let Ok(mut w) = self.way.lock() {
            if let Way::Back(why) = &*w {
                if !why.contains("connected back") {
                    *w = Way::Back(format!(
                        "{why}; the far end connected back to {}",
                        listener.addr()
                    ));
                }
            }
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_request_line_reads_back_and_nothing_else_does() {
        let t = fresh_ticket().unwrap();
        assert_eq!(t.len(), TICKET_LEN);
        let to: SocketAddr = "198.18.0.1:4000".parse().unwrap();
        assert_eq!(
            parse_request(&request_line(to, &t).unwrap()),
            Some((to, t.clone()))
        );
        assert_eq!(
            parse_request(&format!("connect-back 198.18.0.1:0 {t}")),
            None
        );
        assert_eq!(
            parse_request("connect-back 198.18.0.1:4000 lh1b_short"),
            None
        );
        assert_eq!(
            parse_request(&format!("connect-forth 198.18.0.1:4000 {t}")),
            None
        );
    }

    /// A source server's route for one copy (`Route::scoped`) is in no
    /// process-wide table: another copy's dial to the same address, or to
    /// where a connection back came from, never takes it. Its requests go
    /// to its `ask` (here the far end's part runs them), and its listener
    /// closes with it.
    #[test]
    fn attacker_a_scoped_route_is_its_copys_only_and_closes_with_it() {
        let target: SocketAddr = "198.18.0.9:4000".parse().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let r = Route::scoped(
            target,
            "asked".into(),
            "127.0.0.1:0".parse().unwrap(),
            Box::new(move |l: &str| {
                tx.send(l.to_string())
                    .map_err(|_| EngineError::Failed("gone".into()))
            }),
        );
        assert!(route_for(target).is_none());
        let far = std::thread::spawn(move || {
            let (to, t) = parse_request(&rx.recv().unwrap()).unwrap();
            (to, dial_back(to, &t, Duration::from_secs(5)).unwrap())
        });
        let s = r.connect(Duration::from_secs(5), &|_| Ok(())).unwrap();
        let (to, _far) = far.join().unwrap();
        assert!(r.is_back());
        assert!(route_for(s.peer_addr().unwrap()).is_none());
        assert!(route_for(target).is_none());
        drop(r);
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(to).is_ok() {
            assert!(std::time::Instant::now() < until, "still listening at {to}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The attacker: a stranger who connects to the listener first,
    /// without a ticket, with a wrong one, or with one already spent,
    /// gets a closed connection; the far end's own connection (the right
    /// ticket) still gets through, and is the one handed over.
    #[test]
    fn attacker_the_listener_takes_only_a_waiting_ticket_once() {
        let l = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let at = l.addr();
        let ticket = fresh_ticket().unwrap();
        let closed = |mut s: TcpStream| {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut b = [0u8; 1];
            // Closed unread: end of stream or a reset, never a byte.
            assert!(!matches!(s.read(&mut b), Ok(1)));
        };
        let got = l
            .expect(&ticket, Duration::from_secs(10), || {
                // A stranger with no ticket, then one with a wrong one.
                let mut wrong = TcpStream::connect(at).unwrap();
                wrong.write_all(fresh_ticket().unwrap().as_bytes()).unwrap();
                closed(wrong);
                let mut real = TcpStream::connect(at).unwrap();
                real.write_all(ticket.as_bytes()).unwrap();
                real.write_all(b"after").unwrap();
                Ok(())
            })
            .unwrap();
        let mut b = [0u8; 5];
        let mut got = got;
        got.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"after");
        // The same ticket again: spent.
        let mut replay = TcpStream::connect(at).unwrap();
        replay.write_all(ticket.as_bytes()).unwrap();
        closed(replay);
        assert!(l.refused() >= 2, "refused {}", l.refused());
        // And nothing arrives for a ticket never sent.
        let e = l
            .expect(&fresh_ticket().unwrap(), Duration::from_millis(300), || {
                Ok(())
            })
            .unwrap_err();
        assert!(e.to_string().contains("did not connect back"), "{e}");
    }

    /// The attacker fills the listener with idle connections from one
    /// address (more than its share, and more than the listener took in
    /// all before issue 40): it keeps its share only, and the far end's
    /// connection, with its ticket, still gets through.
    #[test]
    fn attacker_idle_strangers_do_not_keep_the_far_end_out() {
        let l = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let at = l.addr();
        let idle: Vec<TcpStream> = (0..UNPROVEN_MAX + 8)
            .map(|_| {
                let c = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .unwrap();
                c.bind(&SocketAddr::from(([127, 0, 0, 2], 0)).into())
                    .unwrap();
                c.connect(&at.into()).unwrap();
                TcpStream::from(c)
            })
            .collect();
        let ticket = fresh_ticket().unwrap();
        let got = l.expect(&ticket, Duration::from_secs(20), || {
            let mut far = TcpStream::connect(at).unwrap();
            far.write_all(ticket.as_bytes()).unwrap();
            Ok(())
        });
        assert!(got.is_ok(), "{:?}", got.err());
        drop(idle);
    }
}
