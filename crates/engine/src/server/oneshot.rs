//! The one-shot server: what `longhaul cp HOST:path` starts over ssh on a
//! host that runs no `longhaul serve` (`longhaul serve --one-shot`, run
//! under the user's own account by the user's own ssh).
//!
//! It is the ordinary server (the same accept loop, TLS, control session,
//! transfers and confinement) with three differences: its identity is
//! fresh and kept only in memory; it has no grants, only one secret made
//! for this run that lets one control connection in (then it is spent),
//! or as many as its client asked for on the command line, at most
//! [`SESSIONS_MAX`] (`--sessions N`: the doctor's stages each open one);
//! and it lives only as long as that: it ends when its standard input
//! closes (the ssh channel, so the client, is gone), when the last
//! session it may admit ends, or when no client came in time.
//! The port, the fingerprint and the secret reach the client in one line
//! on standard output ([`Handshake`], PROTOCOL.md 16), which ssh carries
//! encrypted; the data never passes through ssh.
//!
//! A far end that can only connect out (a firewall drops new connections
//! to it) opens the connections itself: the client asks over the ssh
//! channel, one line per connection (`connect-back ADDR:PORT TICKET`,
//! [`crate::net::back`]), and the far end connects there, sends the
//! ticket, and serves the connection as if it had accepted it.

use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// Why a one-shot server ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Its standard input closed: the ssh channel, so the client, is gone.
    InputClosed,
    /// The last session it could admit ended.
    Done,
    /// No client proved the secret within the wait.
    NoClient,
}

/// The sessions a secret admitted so far, and those still open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Count {
    claimed: u32,
    open: u32,
}

/// The one-time secret of a one-shot server: admits one control
/// connection (or `sessions`), each once.
pub struct OneTime {
    hash: blake3::Hash,
    /// How many control sessions it admits in all.
    sessions: u32,
    count: Mutex<Count>,
    ended: Mutex<Option<Sender<End>>>,
}

impl std::fmt::Debug for OneTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneTime").finish_non_exhaustive()
    }
}

impl OneTime {
    /// A secret's gate for `sessions` control sessions (1 to
    /// [`SESSIONS_MAX`]); `ended` hears when the last is over.
    fn new(secret: &str, sessions: u32, ended: Sender<End>) -> OneTime {
        OneTime {
            hash: blake3::hash(secret.as_bytes()),
            sessions: sessions.clamp(1, SESSIONS_MAX),
            count: Mutex::new(Count::default()),
            ended: Mutex::new(Some(ended)),
        }
    }

    /// Whether a session was admitted yet.
    fn claimed(&self) -> bool {
        self.count.lock().map(|c| c.claimed > 0).unwrap_or(true)
    }

    /// Admits a control connection that presents the secret, while it
    /// has sessions left (one, unless the client asked for more). The
    /// refusal says which rule refused, nothing of the secret.
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
        if c.claimed >= self.sessions {
            return Err(match self.sessions {
                1 => "the one-time secret of this one-shot server was used already".into(),
                n => format!(
                    "the one-time secret of this one-shot server was used already ({n} sessions, as many as its client asked for)"
                ),
            });
        }
        c.claimed += 1;
        c.open += 1;
        Ok(Access::everything("the one-shot client"))
    }

    /// An admitted session ended; after the last one it could admit, the
    /// server's work is done.
    pub(super) fn finished(&self) {
        let last = match self.count.lock() {
            Ok(mut c) => {
                c.open = c.open.saturating_sub(1);
                c.claimed >= self.sessions && c.open == 0
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
    /// How long to wait for the client (see [`CLAIM_WAIT`]).
    pub claim_wait: Duration,
    /// The client's address as ssh saw it (told to the client, which may
    /// ask to be connected back to it).
    pub client: Option<IpAddr>,
    /// Control sessions the secret admits (1 to [`SESSIONS_MAX`]).
    pub sessions: u32,
}

/// What a far end writes on its standard error when it cannot connect
/// back, before the reason (the client shows it in its error).
pub const BACK_FAILED: &str = "longhaul-connect-back-failed:";

/// How long the far end tries to connect back.
const BACK_WAIT: Duration = Duration::from_secs(10);

/// Serves the ssh channel's lines: each `connect-back` request is a
/// connection to open to the client and serve; anything else is ignored.
/// Returns at the channel's end.
fn read_requests(input: impl Read, injector: &super::Injector) {
    let mut r = std::io::BufReader::new(input);
    loop {
        let mut raw = Vec::new();
        match (&mut r).take(512).read_until(b'\n', &mut raw) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        let line = String::from_utf8_lossy(&raw);
        let Some((to, ticket)) = back::parse_request(line.trim_end()) else {
            continue;
        };
        let injector = injector.clone();
        let _ = std::thread::Builder::new()
            .name("lh-one-shot-back".into())
            .spawn(move || match back::dial_back(to, &ticket, BACK_WAIT) {
                Ok(s) => injector.serve(s, to),
                Err(e) => {
                    let _ = writeln!(std::io::stderr().lock(), "{BACK_FAILED} {e}");
                }
            });
    }
}

/// Runs a one-shot server: listens, writes the handshake line to `out`,
/// then serves until `input` reaches its end, the last session it admits
/// ends, or no client came within `claim_wait`. Returns why it ended; its threads may
/// still run, and the caller ends the process.
pub fn run(
    cfg: OneShotConfig,
    mut input: impl Read + Send + 'static,
    out: &mut dyn Write,
) -> Result<End, EngineError> {
    let id = tls::Identity::ephemeral()?;
    let secret = fresh_secret()?;
    let (tx, rx) = channel();
    let one_time = Arc::new(OneTime::new(&secret, cfg.sessions, tx.clone()));
    let server = Server::bind(
        &[SocketAddr::new(cfg.listen, 0)],
        ServeConfig {
            exports: cfg.exports,
            tls: Some(tls::server_config(&id)?),
            one_time: Some(one_time.clone()),
            // The user's own server: copies between two of their hosts
            // (PROTOCOL.md 13.9) go directly from one to the other.
            third_party_copies: true,
            max_connections: 256,
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
    let stdin_tx = tx;
    std::thread::Builder::new()
        .name("lh-one-shot-in".into())
        .spawn(move || {
            read_requests(&mut input, &injector);
            let _ = stdin_tx.send(End::InputClosed);
        })
        .map_err(|e| EngineError::Usage(format!("cannot start a thread: {e}")))?;
    let end = match rx.recv_timeout(cfg.claim_wait) {
        Ok(end) => end,
        Err(_) => {
            if one_time.claimed() {
                rx.recv().unwrap_or(End::InputClosed)
            } else {
                End::NoClient
            }
        }
    };
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
        let ot = OneTime::new(&s, 1, tx);
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
        let ot = OneTime::new(&s, 3, tx);
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
        let ot = OneTime::new(&s, 10_000, tx);
        for _ in 0..SESSIONS_MAX {
            ot.claim(Some(&s)).unwrap();
        }
        assert!(ot.claim(Some(&s)).is_err());
    }
}
