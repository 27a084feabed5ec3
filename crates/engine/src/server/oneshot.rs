//! The one-shot server: what `longhaul cp HOST:path` starts over ssh on a
//! host that runs no `longhaul serve` (`longhaul serve --one-shot`, run
//! under the user's own account by the user's own ssh).
//!
//! It is the ordinary server (the same accept loop, TLS, control session,
//! transfers and confinement) with three differences: its identity is
//! fresh and kept only in memory; it has no grants, only one secret made
//! for this run that lets one control connection in (then it is spent),
//! or as many as its client asked for on the command line, at most
//! [`SESSIONS_MAX`] (`--sessions N`: the doctor's stages each open one),
//! or, for a client that cannot count its sessions ahead (a fleet's queue
//! rank, a session a minute for as long as the queue lasts), any number
//! while the ssh channel lives, at most [`OPEN_AT_ONCE`] at a time
//! (`--sessions open`, [`Admits::Open`]); and it lives only as long as
//! that: it ends when its standard input closes (the ssh channel, so the
//! client, is gone; nothing is admitted after that), when the last
//! session it may admit ends, when no client came in time, or (open)
//! when its client was silent for [`OPEN_IDLE`]: no session open and no
//! line on the ssh channel, where such a client says `alive` now and then
//! ([`ALIVE_LINE`]).
//! The port, the fingerprint and the secret reach the client in one line
//! on standard output ([`Handshake`], PROTOCOL.md 16), which ssh carries
//! encrypted; the data never passes through ssh.
//!
//! A far end that can only connect out (a firewall drops new connections
//! to it) opens the connections itself: the client asks over the ssh
//! channel, one line per connection (`connect-back ADDR:PORT TICKET`,
//! [`crate::net::back`]), and the far end connects there, sends the
//! ticket, and serves the connection as if it had accepted it.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::auth::Access;
use super::{ServeConfig, Server};
use crate::net::{back, tls};
use crate::xfer::Export;
use crate::EngineError;

/// The first word of the handshake line.
pub const HANDSHAKE_WORD: &str = "longhaul-one-shot";
/// The version of the handshake line (its second word).
pub const HANDSHAKE_VERSION: u32 = 1;
/// What every one-time secret starts with (so that a scrubber or a person
/// can tell one in a log or a paste).
pub const SECRET_PREFIX: &str = "lh1o_";
/// How long the one-shot server waits for its client's control connection.
pub const CLAIM_WAIT: Duration = Duration::from_secs(60);
/// The most control sessions a client may ask one far end to admit on its
/// one secret (`serve --one-shot --sessions N`).
pub const SESSIONS_MAX: u32 = 32;
/// The most control sessions an open far end (`--sessions open`) serves
/// at once (a queue rank has one, and one more while a dead one's
/// connection is noticed).
pub const OPEN_AT_ONCE: u32 = 4;
/// An open far end ends when, for this long, no session was open and no
/// line came on its standard input.
pub const OPEN_IDLE: Duration = Duration::from_secs(600);
/// The line an open far end's client writes on the ssh channel while it
/// waits between sessions (every [`ALIVE_EVERY`]); any line counts.
pub const ALIVE_LINE: &str = "alive";
/// How often that client says [`ALIVE_LINE`].
pub const ALIVE_EVERY: Duration = Duration::from_secs(60);

/// How many control sessions a far end's secret admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admits {
    /// That many in all (1 to [`SESSIONS_MAX`]; `--sessions N`), at once
    /// or one after another; it ends after the last.
    Sessions(u32),
    /// Any number while the ssh channel lives, [`OPEN_AT_ONCE`] at a time
    /// (`--sessions open`).
    Open,
}

impl From<u32> for Admits {
    fn from(n: u32) -> Admits {
        Admits::Sessions(n)
    }
}

impl std::str::FromStr for Admits {
    type Err = String;

    /// `open`, or a count (its range is checked where it is used).
    fn from_str(s: &str) -> Result<Admits, String> {
        match s {
            "open" => Ok(Admits::Open),
            n => n
                .parse::<u32>()
                .map(Admits::Sessions)
                .map_err(|_| format!("'{s}': a count of sessions, or `open`")),
        }
    }
}

impl std::fmt::Display for Admits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Admits::Sessions(n) => write!(f, "{n}"),
            Admits::Open => f.write_str("open"),
        }
    }
}

/// Why a one-shot server ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Its standard input closed: the ssh channel, so the client, is gone.
    InputClosed,
    /// The last session it could admit ended.
    Done,
    /// No client proved the secret within the wait.
    NoClient,
    /// An open far end's client was silent for its idle bound: no session
    /// open, no line on the ssh channel.
    Idle,
}

/// The sessions a secret admitted so far, and those still open.
#[derive(Debug, Clone, Copy)]
struct Count {
    claimed: u32,
    open: u32,
    /// The ssh channel closed: nothing more is admitted.
    closed: bool,
    /// When the client was last heard of (a session began or ended, a line
    /// came on the ssh channel).
    heard: Instant,
}

/// The one-time secret of a one-shot server: admits one control
/// connection (or `sessions`, or any number while the channel lives),
/// each once.
pub struct OneTime {
    hash: blake3::Hash,
    /// How many control sessions it admits.
    admits: Admits,
    count: Mutex<Count>,
    ended: Mutex<Option<Sender<End>>>,
}

impl std::fmt::Debug for OneTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneTime").finish_non_exhaustive()
    }
}

impl OneTime {
    /// A secret's gate for `admits` control sessions (a count is taken
    /// from 1 to [`SESSIONS_MAX`]); `ended` hears when the last is over.
    fn new(secret: &str, admits: Admits, ended: Sender<End>) -> OneTime {
        OneTime {
            hash: blake3::hash(secret.as_bytes()),
            admits: match admits {
                Admits::Sessions(n) => Admits::Sessions(n.clamp(1, SESSIONS_MAX)),
                Admits::Open => Admits::Open,
            },
            count: Mutex::new(Count {
                claimed: 0,
                open: 0,
                closed: false,
                heard: Instant::now(),
            }),
            ended: Mutex::new(Some(ended)),
        }
    }

    /// Whether a session was admitted yet.
    fn claimed(&self) -> bool {
        self.count.lock().map(|c| c.claimed > 0).unwrap_or(true)
    }

    /// A line came on the ssh channel: the client is there.
    fn heard(&self) {
        if let Ok(mut c) = self.count.lock() {
            c.heard = Instant::now();
        }
    }

    /// The ssh channel closed: from now on every claim is refused (the
    /// server ends, and nothing may slip in meanwhile).
    fn close(&self) {
        if let Ok(mut c) = self.count.lock() {
            c.closed = true;
        }
    }

    /// How long the client has been silent at `now`: no session open, no
    /// line on the ssh channel (zero while a session is open).
    fn silent(&self, now: Instant) -> Duration {
        match self.count.lock() {
            Ok(c) if c.open == 0 => now.saturating_duration_since(c.heard),
            _ => Duration::ZERO,
        }
    }

    /// Admits a control connection that presents the secret, while it
    /// has sessions left (one, unless the client asked for more; open:
    /// while fewer than [`OPEN_AT_ONCE`] are open) and its ssh channel
    /// lives. The refusal says which rule refused, nothing of the secret.
    pub(super) fn claim(&self, token: Option<&str>) -> Result<Access, String> {
        // blake3::Hash compares in constant time.
        let right = token.is_some_and(|t| blake3::hash(t.as_bytes()) == self.hash);
        if !right {
            return Err(
                "this is a one-shot server: it admits only the one-time secret its client received over ssh"
                    .into(),
            );
        }
        let mut c = self
            .count
            .lock()
            .map_err(|_| "internal error".to_string())?;
        if c.closed {
            return Err("this one-shot server's ssh channel closed: it admits nothing more".into());
        }
        match self.admits {
            Admits::Sessions(1) if c.claimed >= 1 => {
                return Err("the one-time secret of this one-shot server was used already".into())
            }
            Admits::Sessions(n) if c.claimed >= n => {
                return Err(format!(
                    "the one-time secret of this one-shot server was used already ({n} sessions, as many as its client asked for)"
                ))
            }
            Admits::Open if c.open >= OPEN_AT_ONCE => {
                return Err(format!(
                    "this one-shot server has {OPEN_AT_ONCE} sessions open, as many as it serves at once: try again when one has ended"
                ))
            }
            _ => {}
        }
        c.claimed = c.claimed.saturating_add(1);
        c.open += 1;
        c.heard = Instant::now();
        Ok(Access::everything("the one-shot client"))
    }

    /// An admitted session ended; after the last one it could admit, the
    /// server's work is done.
    pub(super) fn finished(&self) {
        let last = match self.count.lock() {
            Ok(mut c) => {
                c.open = c.open.saturating_sub(1);
                c.heard = Instant::now();
                match self.admits {
                    Admits::Sessions(n) => c.claimed >= n && c.open == 0,
                    Admits::Open => false,
                }
            }
            Err(_) => true,
        };
        if !last {
            return;
        }
        if let Some(tx) = self.ended.lock().ok().and_then(|mut t| t.take()) {
            let _ = tx.send(End::Done);
        }
    }
}

/// A session the secret admitted: [`OneTime::finished`] when dropped, on
/// every path out of the session (so that a failed one never keeps a
/// place of [`OPEN_AT_ONCE`]).
pub(super) struct Admitted(Arc<OneTime>);

impl Admitted {
    pub(super) fn new(one_time: Arc<OneTime>) -> Admitted {
        Admitted(one_time)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.finished();
    }
}

/// The line a one-shot server writes on its standard output once it
/// listens: `longhaul-one-shot 1 pid=P addr=A port=N fingerprint=SHA256:F
/// secret=lh1o_S` (PROTOCOL.md 16).
#[derive(Clone, PartialEq, Eq)]
pub struct Handshake {
    pub pid: u32,
    /// The address it listens on (the one the client's ssh reached).
    pub addr: IpAddr,
    pub port: u16,
    pub fingerprint: String,
    pub secret: String,
    /// It connects back when asked (`back=1`; older far ends do not).
    pub back: bool,
    /// The address the client's ssh came from, as this end saw it
    /// (`SSH_CONNECTION`'s first field): where it can connect back to.
    pub client: Option<IpAddr>,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("pid", &self.pid)
            .field("addr", &self.addr)
            .field("port", &self.port)
            .field("fingerprint", &self.fingerprint)
            .field("back", &self.back)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl Handshake {
    /// The line, without its newline.
    pub fn line(&self) -> String {
        let mut l = format!(
            "{HANDSHAKE_WORD} {HANDSHAKE_VERSION} pid={} addr={} port={} fingerprint={} secret={}",
            self.pid, self.addr, self.port, self.fingerprint, self.secret
        );
        if self.back {
            l.push_str(" back=1");
        }
        if let Some(c) = self.client {
            l.push_str(&format!(" client={c}"));
        }
        l
    }

    /// Whether `line` is meant to be a handshake (its first word), so
    /// that what a login script prints before it can be told apart.
    pub fn is_handshake(line: &str) -> bool {
        line.split_whitespace().next() == Some(HANDSHAKE_WORD)
    }

    /// Reads a handshake line; the error names what is wrong, never the
    /// secret.
    pub fn parse(line: &str) -> Result<Handshake, String> {
        let mut words = line.split_whitespace();
        if words.next() != Some(HANDSHAKE_WORD) {
            return Err(format!("not a one-shot handshake (no '{HANDSHAKE_WORD}')"));
        }
        match words.next().map(str::parse::<u32>) {
            Some(Ok(HANDSHAKE_VERSION)) => {}
            Some(Ok(v)) => {
                return Err(format!(
                    "handshake version {v}, this longhaul speaks {HANDSHAKE_VERSION}: install the same version on both hosts"
                ))
            }
            _ => return Err("the handshake has no version".into()),
        }
        let (mut pid, mut addr, mut port, mut fingerprint, mut secret) =
            (None, None, None, None, None);
        let (mut back, mut client) = (false, None);
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| "a handshake field without '='".to_string())?;
            match k {
                "pid" => pid = v.parse::<u32>().ok(),
                "addr" => addr = v.parse::<IpAddr>().ok(),
                "port" => port = v.parse::<u16>().ok().filter(|p| *p != 0),
                "fingerprint" => fingerprint = tls::parse_fingerprint(v).ok(),
                "secret" => {
                    secret = Some(v.to_string()).filter(|s| {
                        s.starts_with(SECRET_PREFIX) && s.len() > SECRET_PREFIX.len() + 20
                    })
                }
                "back" => back = v == "1",
                "client" => client = v.parse::<IpAddr>().ok(),
                // Fields of later versions of the same major version.
                _ => {}
            }
        }
        let missing = |what: &str| format!("the handshake has no valid {what}");
        Ok(Handshake {
            pid: pid.ok_or_else(|| missing("pid"))?,
            addr: addr.ok_or_else(|| missing("addr"))?,
            port: port.ok_or_else(|| missing("port"))?,
            fingerprint: fingerprint.ok_or_else(|| missing("fingerprint"))?,
            secret: secret.ok_or_else(|| missing("secret"))?,
            back,
            client,
        })
    }
}

/// A fresh one-time secret: 32 bytes of the OS's CSPRNG.
fn fresh_secret() -> Result<String, EngineError> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)
        .map_err(|e| EngineError::Usage(format!("cannot read the OS random source: {e}")))?;
    Ok(format!(
        "{SECRET_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    ))
}

/// What a one-shot server serves, and where.
pub struct OneShotConfig {
    /// The address to listen on (a port is chosen by the kernel).
    pub listen: IpAddr,
    /// What the account can reach, as exports.
    pub exports: Vec<Export>,
    /// How each export's root is shown to the client: as its user wrote
    /// paths after `HOST:` (see [`ServeConfig::shown_roots`]).
    pub shown_roots: Vec<(String, std::path::PathBuf)>,
    /// How long to wait for the client (see [`CLAIM_WAIT`]).
    pub claim_wait: Duration,
    /// The client's address as ssh saw it (told to the client, which may
    /// ask to be connected back to it).
    pub client: Option<IpAddr>,
    /// Control sessions the secret admits.
    pub admits: Admits,
    /// With [`Admits::Open`]: how long its client may be silent (see
    /// [`OPEN_IDLE`]).
    pub idle: Duration,
}

/// What a far end writes on its standard error when it cannot connect
/// back, before the reason (the client shows it in its error).
pub const BACK_FAILED: &str = "longhaul-connect-back-failed:";

/// How long the far end tries to connect back.
const BACK_WAIT: Duration = Duration::from_secs(10);

/// Connections back a far end opens at once, at most: a request past it
/// is refused as one to an address nobody named is.
const BACK_AT_ONCE: usize = 64;

/// Serves the ssh channel's lines (`xfer::back::Reader`): each
/// `connect-back` request for an address the client named is a connection
/// to open and serve; any line (a request, [`ALIVE_LINE`], anything) says
/// the client is there. Returns at the channel's end.
fn read_requests(
    mut input: impl Read,
    client: Option<IpAddr>,
    injector: &super::Injector,
    one_time: &OneTime,
) {
    use longhaul_proto::xfer::back::{Event, Reader};
    let mut reader = Reader::new(client);
    let dialing = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut buf = [0u8; 4096];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        for event in reader.feed(&buf[..n]) {
            match event {
                Event::Heard => one_time.heard(),
                Event::Refused { to, why } => back_failed(&format!("{to}: {why}")),
                Event::Dial { to, ticket } => dial(to, ticket, injector, &dialing),
            }
        }
    }
}

/// Opens one connection back to `to` on a thread of its own, and serves
/// it; at most [`BACK_AT_ONCE`] at a time.
fn dial(
    to: SocketAddr,
    ticket: String,
    injector: &super::Injector,
    dialing: &Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::Ordering;
    if dialing.fetch_add(1, Ordering::SeqCst) >= BACK_AT_ONCE {
        dialing.fetch_sub(1, Ordering::SeqCst);
        back_failed(&format!(
            "{to}: {BACK_AT_ONCE} connections back are being opened already"
        ));
        return;
    }
    let (injector, count) = (injector.clone(), dialing.clone());
    let spawned = std::thread::Builder::new()
        .name("lh-one-shot-back".into())
        .spawn(move || {
            let dialed = back::dial_back(to, &ticket, BACK_WAIT);
            count.fetch_sub(1, Ordering::SeqCst);
            match dialed {
                Ok(s) => injector.serve(s, to),
                Err(e) => back_failed(&e.to_string()),
            }
        });
    if spawned.is_err() {
        dialing.fetch_sub(1, Ordering::SeqCst);
        back_failed(&format!("{to}: cannot start a thread"));
    }
}

/// Says on standard error (which ssh carries to the client, whose error
/// quotes it) why a connection back was not opened.
fn back_failed(why: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{BACK_FAILED} {why}");
}

/// Waits for the end of a one-shot server whose gate is `one_time`: what
/// `rx` hears (the channel's end, the last session's), no claim within
/// `claim_wait`, or (open) a client silent for `idle`.
fn wait_end(rx: &Receiver<End>, one_time: &OneTime, claim_wait: Duration, idle: Duration) -> End {
    let open = one_time.admits == Admits::Open;
    let claim_by = Instant::now() + claim_wait;
    let tick = (idle / 8).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        let wait = if open {
            tick
        } else if one_time.claimed() {
            Duration::from_secs(3600)
        } else {
            claim_by.saturating_duration_since(Instant::now())
        };
        match rx.recv_timeout(wait) {
            Ok(end) => return end,
            Err(RecvTimeoutError::Disconnected) => return End::InputClosed,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        if !one_time.claimed() {
            if now >= claim_by {
                return End::NoClient;
            }
        } else if open && one_time.silent(now) >= idle {
            // Whatever comes now is refused, as after the channel's end.
            one_time.close();
            return End::Idle;
        }
    }
}

/// Runs a one-shot server: listens, writes the handshake line to `out`,
/// then serves until `input` reaches its end, the last session it admits
/// ends, no client came within `claim_wait`, or (open) the client was
/// silent for `idle`. Returns why it ended; its threads may still run,
/// and the caller ends the process.
pub fn run(
    cfg: OneShotConfig,
    mut input: impl Read + Send + 'static,
    out: &mut dyn Write,
) -> Result<End, EngineError> {
    let id = tls::Identity::ephemeral()?;
    let secret = fresh_secret()?;
    let (tx, rx) = channel();
    let one_time = Arc::new(OneTime::new(&secret, cfg.admits, tx.clone()));
    let server = Server::bind(
        &[SocketAddr::new(cfg.listen, 0)],
        ServeConfig {
            exports: cfg.exports,
            shown_roots: cfg.shown_roots,
            tls: Some(tls::server_config(&id)?),
            one_time: Some(one_time.clone()),
            // The user's own server: copies between two of their hosts
            // (PROTOCOL.md 13.9) go directly from one to the other.
            third_party_copies: true,
            // Its port takes connections from other hosts too (the
            // address ssh reached): one address cannot fill it.
            max_connections: 512,
            max_per_client: 256,
            ..ServeConfig::default()
        },
    )?;
    let port = server.local_addrs().first().map(|a| a.port()).unwrap_or(0);
    let handle = server.spawn();
    let injector = handle.injector();
    let line = Handshake {
        pid: std::process::id(),
        addr: cfg.listen,
        port,
        fingerprint: id.fingerprint(),
        secret,
        back: true,
        client: cfg.client,
    }
    .line();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| EngineError::Closed(format!("cannot write the handshake line: {e}")))?;
    drop(line);
    let (stdin_tx, gate, client) = (tx, one_time.clone(), cfg.client);
    std::thread::Builder::new()
        .name("lh-one-shot-in".into())
        .spawn(move || {
            read_requests(&mut input, client, &injector, &gate);
            gate.close();
            let _ = stdin_tx.send(End::InputClosed);
        })
        .map_err(|e| EngineError::Usage(format!("cannot start a thread: {e}")))?;
    let end = wait_end(&rx, &one_time, cfg.claim_wait, cfg.idle);
    tracing::info!("one-shot server ends: {end:?}");
    drop(handle);
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handshake_line_reads_back_and_its_debug_form_hides_the_secret() {
        let h = Handshake {
            pid: 42,
            addr: "127.0.0.1".parse().unwrap(),
            port: 40000,
            fingerprint: tls::parse_fingerprint(&"ab".repeat(32)).unwrap(),
            secret: fresh_secret().unwrap(),
            back: true,
            client: Some("198.18.0.1".parse().unwrap()),
        };
        assert_eq!(Handshake::parse(&h.line()).unwrap(), h);
        assert!(!format!("{h:?}").contains(&h.secret));
        assert!(Handshake::parse("longhaul-one-shot 2 pid=1")
            .unwrap_err()
            .contains("version 2"));
        assert!(Handshake::parse(&h.line().replace("port=40000", "port=0")).is_err());
        assert!(!Handshake::is_handshake("Welcome to the cluster"));
    }

    #[test]
    fn the_secret_admits_one_connection_once_and_nothing_else() {
        let (tx, rx) = channel();
        let s = fresh_secret().unwrap();
        let ot = OneTime::new(&s, 1.into(), tx);
        assert!(ot.claim(None).is_err());
        assert!(ot.claim(Some("lh1o_wrong")).is_err());
        assert!(ot.claim(Some(&s)).is_ok());
        assert!(ot.claim(Some(&s)).unwrap_err().contains("used already"));
        ot.finished();
        assert_eq!(rx.recv().unwrap(), End::Done);
        assert!(ot.claim(Some(&s)).is_err());
    }

    #[test]
    fn attacker_a_secret_for_n_sessions_admits_n_and_ends_after_the_last() {
        let (tx, rx) = channel();
        let s = fresh_secret().unwrap();
        let ot = OneTime::new(&s, 3.into(), tx);
        // Two at once, then the first ends: the server lives on.
        ot.claim(Some(&s)).unwrap();
        ot.claim(Some(&s)).unwrap();
        ot.finished();
        assert!(rx.try_recv().is_err());
        // A wrong secret never counts, nor takes a session.
        assert!(ot.claim(Some("lh1o_wrong")).is_err());
        ot.claim(Some(&s)).unwrap();
        // The fourth is one too many, while two are open and after.
        let e = ot.claim(Some(&s)).unwrap_err();
        assert!(e.contains("used already (3 sessions"), "{e}");
        ot.finished();
        assert!(rx.try_recv().is_err(), "one session is still open");
        ot.finished();
        assert_eq!(rx.recv().unwrap(), End::Done);
        assert!(ot.claim(Some(&s)).is_err());
        // Asking for more than the bound admits the bound.
        let (tx, _rx) = channel();
        let ot = OneTime::new(&s, 10_000.into(), tx);
        for _ in 0..SESSIONS_MAX {
            ot.claim(Some(&s)).unwrap();
        }
        assert!(ot.claim(Some(&s)).is_err());
    }

    #[test]
    fn attacker_an_open_far_end_admits_its_secret_again_and_again_and_nothing_else() {
        let (tx, rx) = channel();
        let s = fresh_secret().unwrap();
        let ot = OneTime::new(&s, Admits::Open, tx);
        // Far more sessions, one after another, than any count admits
        // (a queue rank opens one a minute for as long as the queue lasts).
        for _ in 0..SESSIONS_MAX * 4 {
            ot.claim(Some(&s)).unwrap();
            ot.finished();
        }
        // Each end of a session is not the end of the server.
        assert!(rx.try_recv().is_err());
        // Wrong secrets, none and near misses are refused, however many.
        for wrong in [None, Some("lh1o_wrong"), Some(&s[..s.len() - 1]), Some("")] {
            let e = ot.claim(wrong).unwrap_err();
            assert!(e.contains("admits only the one-time secret"), "{e}");
        }
        assert!(ot.claim(Some(&format!("{s}x"))).is_err());
    }

    #[test]
    fn attacker_an_open_far_end_serves_a_few_sessions_at_once_and_no_more() {
        let (tx, _rx) = channel();
        let s = fresh_secret().unwrap();
        let ot = OneTime::new(&s, Admits::Open, tx);
        for _ in 0..OPEN_AT_ONCE {
            ot.claim(Some(&s)).unwrap();
        }
        let e = ot.claim(Some(&s)).unwrap_err();
        assert!(
            e.contains("sessions open, as many as it serves at once"),
            "{e}"
        );
        assert!(!e.contains(&s));
        // One ends: one more.
        ot.finished();
        ot.claim(Some(&s)).unwrap();
        assert!(ot.claim(Some(&s)).is_err());
    }

    #[test]
    fn attacker_nothing_is_admitted_after_the_ssh_channel_closed() {
        for admits in [Admits::Open, Admits::Sessions(5), Admits::Sessions(1)] {
            let (tx, _rx) = channel();
            let s = fresh_secret().unwrap();
            let ot = OneTime::new(&s, admits, tx);
            ot.close();
            let e = ot.claim(Some(&s)).unwrap_err();
            assert!(e.contains("ssh channel closed"), "{admits}: {e}");
        }
    }

    #[test]
    fn an_admitted_session_is_finished_however_it_ends() {
        let (tx, rx) = channel();
        let s = fresh_secret().unwrap();
        let ot = Arc::new(OneTime::new(&s, 2.into(), tx));
        for _ in 0..2 {
            ot.claim(Some(&s)).unwrap();
            drop(Admitted::new(ot.clone()));
        }
        assert_eq!(rx.recv().unwrap(), End::Done);
    }

    #[test]
    fn an_open_far_end_ends_when_its_client_is_silent_and_lives_while_it_speaks() {
        let s = fresh_secret().unwrap();
        let idle = Duration::from_millis(300);
        // No claim at all: the claim wait ends it, as for a count.
        let (tx, rx) = channel();
        let ot = OneTime::new(&s, Admits::Open, tx);
        let t = Instant::now();
        assert_eq!(
            wait_end(&rx, &ot, Duration::from_millis(100), idle),
            End::NoClient
        );
        assert!(t.elapsed() < Duration::from_secs(5));
        // Claimed and done: silent for `idle`, it ends, and admits nothing more.
        let (tx, rx) = channel();
        let ot = Arc::new(OneTime::new(&s, Admits::Open, tx));
        ot.claim(Some(&s)).unwrap();
        ot.finished();
        let t = Instant::now();
        assert_eq!(wait_end(&rx, &ot, Duration::from_secs(60), idle), End::Idle);
        assert!(t.elapsed() >= idle);
        assert!(ot
            .claim(Some(&s))
            .unwrap_err()
            .contains("admits nothing more"));
        // A client that says it is there (lines on the channel) keeps it,
        // and so does a session that stays open; then the channel closes.
        let (tx, rx) = channel();
        let ot = Arc::new(OneTime::new(&s, Admits::Open, tx.clone()));
        ot.claim(Some(&s)).unwrap();
        ot.finished();
        let speaker = {
            let ot = ot.clone();
            std::thread::spawn(move || {
                for _ in 0..10 {
                    std::thread::sleep(Duration::from_millis(100));
                    ot.heard();
                }
                ot.claim(Some(&s)).unwrap();
                std::thread::sleep(Duration::from_millis(900));
                ot.close();
                let _ = tx.send(End::InputClosed);
            })
        };
        let t = Instant::now();
        // Twenty of the speaker's beats: a busy machine that delays one
        // does not make it silent.
        assert_eq!(
            wait_end(&rx, &ot, Duration::from_secs(60), Duration::from_secs(2)),
            End::InputClosed
        );
        assert!(
            t.elapsed() >= Duration::from_millis(1900),
            "{:?}",
            t.elapsed()
        );
        speaker.join().unwrap();
    }

    #[test]
    fn a_count_or_open_reads_from_the_command_line() {
        assert_eq!("open".parse::<Admits>().unwrap(), Admits::Open);
        assert_eq!("16".parse::<Admits>().unwrap(), Admits::Sessions(16));
        assert!("many".parse::<Admits>().is_err());
        assert_eq!(Admits::Open.to_string(), "open");
    }
}
