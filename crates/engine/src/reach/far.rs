//! A far end started over ssh, while it runs: how connections reach it
//! (directly, or connecting back), its lifeline, and what its failures
//! mean in the user's words.

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::net::back;
use crate::net::dial::Security;
use crate::net::tls::TrustOptions;
use crate::process::Owned;
use crate::server::oneshot::{self, Admits, Handshake};
use crate::EngineError;

use super::{export_path, SshOptions, HOME_EXPORT, ROOT_EXPORT};

/// The far end, started: its handshake and the ssh process that carries
/// its lifeline (its standard input), and the requests to connect back.
pub struct FarEnd {
    pub handshake: Handshake,
    pub(super) dest: String,
    pub(super) child: Owned,
    pub(super) stdin: Arc<Mutex<Option<std::process::ChildStdin>>>,
    /// What ssh (so the far end) wrote on standard error, the last of it.
    pub(super) said: Arc<Mutex<String>>,
    /// How connections to it are opened, once [`FarEnd::route`] set it up.
    pub(super) route: Option<Arc<back::Route>>,
    /// An open far end's: says `alive` on the channel until dropped.
    pub(super) alive: Option<Sender<()>>,
}

/// A far path on the one-shot server: its address, its export and the
/// path in that.
pub type Exported = (String, (&'static str, String));

/// A failure against a far end, worded for its user: `error` says what
/// kind it was (the exit code a command gives), `message` what happened.
#[derive(Debug)]
pub struct Explained {
    pub error: EngineError,
    pub message: String,
}

impl std::fmt::Display for Explained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl FarEnd {
    /// Starts the far end on `dest` ([`super::start`]) and puts connections
    /// to it on their route; each of `paths` (as written after `HOST:`)
    /// becomes its address on the far end's one-shot server
    /// (`longhaul://ADDR:PORT/EXPORT/path`, with the export and the path in
    /// it). The paths are read first: a
    /// bad one starts nothing.
    pub fn open_for(
        ssh: &SshOptions,
        dest: &str,
        admits: Admits,
        paths: &[Option<&str>],
    ) -> Result<(FarEnd, Vec<Option<Exported>>), EngineError> {
        let exported = paths
            .iter()
            .map(|p| p.map(export_path).transpose())
            .collect::<Result<Vec<_>, String>>()
            .map_err(EngineError::Usage)?;
        let mut far = super::start(ssh, dest, admits)?;
        if let Err(e) = far.route(ssh) {
            far.finish();
            return Err(e);
        }
        let server = far.server();
        let urls = exported
            .into_iter()
            .map(|e| {
                e.map(|(export, path)| {
                    (
                        format!("longhaul://{server}/{export}/{path}"),
                        (export, path),
                    )
                })
            })
            .collect();
        Ok((far, urls))
    }

    /// `[USER@]HOST`, as ssh was given it.
    pub fn dest(&self) -> &str {
        &self.dest
    }

    /// The one-shot server's `ADDR:PORT`, as the engine parses it.
    pub fn server(&self) -> String {
        SocketAddr::new(self.handshake.addr, self.handshake.port).to_string()
    }

    /// The trust and credential of a client of the far end: its
    /// fingerprint pinned (nothing else), its one-time secret.
    pub fn security(&self) -> Security {
        Security {
            plaintext: false,
            trust: TrustOptions {
                pins: vec![self.handshake.fingerprint.clone()],
                ..TrustOptions::default()
            },
            token: Some(self.handshake.secret.clone()),
            tokens: Vec::new(),
        }
    }

    /// How the user wrote paths on this far end.
    pub fn as_written(&self) -> AsWritten {
        AsWritten {
            server: self.server(),
            dest: self.dest.clone(),
        }
    }

    /// Which side opened the connections to the far end, and why (None if
    /// none was opened).
    pub fn opened(&self) -> Option<back::Opened> {
        self.route.as_ref().and_then(|r| r.opened())
    }

    /// Where to listen for the far end's connections, if anywhere.
    fn listen_at(&self, ssh: &SshOptions) -> Result<Option<SocketAddr>, EngineError> {
        let h = &self.handshake;
        let forced = ssh.connect_back.as_deref();
        let given = match forced {
            Some("") | None => None,
            Some(a) => Some(connect_back_addr(a).map_err(EngineError::Usage)?),
        };
        let listen = match (given, h.client) {
            (Some(a), _) => a,
            (None, Some(ip)) => SocketAddr::new(ip, 0),
            (None, None) if forced.is_some() => {
                return Err(EngineError::Usage(format!(
                    "--connect-back: the far end on {} did not say where this client's ssh came from; give the address it can reach, --connect-back=ADDR[:PORT]",
                    self.dest
                )))
            }
            (None, None) => return Ok(None),
        };
        if !h.back {
            if forced.is_some() {
                return Err(EngineError::Connect(format!(
                    "--connect-back: the longhaul on {} does not connect back (an older version): install this version there ({})",
                    self.dest,
                    env!("CARGO_PKG_VERSION")
                )));
            }
            return Ok(None);
        }
        Ok(Some(listen))
    }

    /// Puts connections to the far end on a route that connects back when
    /// the direct connection fails (or always, with `--connect-back`).
    fn route(&mut self, ssh: &SshOptions) -> Result<(), EngineError> {
        let Some(listen) = self.listen_at(ssh)? else {
            return Ok(());
        };
        let stdin = self.stdin.clone();
        let said = self.said.clone();
        let dest = self.dest.clone();
        let ask = move |line: &str| {
            let mut w = stdin
                .lock()
                .map_err(|_| EngineError::Failed("internal error".into()))?;
            let w = w
                .as_mut()
                .ok_or_else(|| EngineError::Closed(format!("the ssh channel to {dest}")))?;
            writeln!(w, "{line}").and_then(|()| w.flush()).map_err(|e| {
                EngineError::io(
                    format!("cannot ask the far end on {dest} to connect back over ssh"),
                    e,
                )
            })
        };
        let heard = move || {
            let k = said.lock().ok()?;
            k.lines()
                .rev()
                .find_map(|l| l.strip_prefix(oneshot::BACK_FAILED))
                .map(|l| longhaul_proto::units::escaped(l.trim()).to_string())
        };
        // A listening address other than where ssh came from (a NAT
        // between): the far end connects only where its client named.
        if Some(listen.ip()) != self.handshake.client {
            use longhaul_proto::xfer::back::{allow_line, ALLOW_MAX};
            ask(&allow_line(listen.ip(), ALLOW_MAX))?;
        }
        let target = SocketAddr::new(self.handshake.addr, self.handshake.port);
        self.route = Some(back::Route::install(
            target,
            ssh.connect_back
                .as_ref()
                .map(|_| "--connect-back was given".to_string()),
            listen,
            Box::new(ask),
            Box::new(heard),
        ));
        Ok(())
    }

    /// Tells an open far end (`--sessions open`) that this client is
    /// there: [`oneshot::ALIVE_LINE`] on the channel every
    /// [`oneshot::ALIVE_EVERY`], until the far end is finished.
    pub(super) fn keep_alive(&mut self) {
        let (tx, rx) = channel::<()>();
        let stdin = self.stdin.clone();
        let spawned = std::thread::Builder::new()
            .name("lh-ssh-alive".into())
            .spawn(move || {
                use std::sync::mpsc::RecvTimeoutError::Timeout;
                // Until `finish` (or a drop) lets go of the sender.
                while rx.recv_timeout(oneshot::ALIVE_EVERY) == Err(Timeout) {
                    let Ok(mut w) = stdin.lock() else { return };
                    let Some(w) = w.as_mut() else { return };
                    if writeln!(w, "{}", oneshot::ALIVE_LINE)
                        .and_then(|()| w.flush())
                        .is_err()
                    {
                        return;
                    }
                }
            });
        self.alive = spawned.is_ok().then_some(tx);
    }

    /// Closes the lifeline (the far end exits) and waits for ssh a moment;
    /// ends it if it lingers.
    pub fn finish(mut self) {
        self.route = None;
        self.alive = None;
        if let Ok(mut s) = self.stdin.lock() {
            drop(s.take());
        }
        if self.child.wait_for(Duration::from_secs(5)).is_none() && !self.child.ended() {
            tracing::warn!(
                "ssh to {} did not end after the transfer; stopping it",
                self.dest
            );
        }
    }

    /// A failure of the client against the far end, with a hint when it
    /// could not connect: the far end listens on the address ssh reached,
    /// which a jump host or a NAT may hide from here.
    pub fn explain(&self, e: EngineError) -> Explained {
        let connect = matches!(e, EngineError::Connect(_));
        let back = self.opened().is_some_and(|o| o.opened_by == "far_end");
        // The user named a host, not a server: the refusal is that host's.
        let mut message = match &e {
            EngineError::Refused { message, .. } => format!("{} refused: {message}", self.dest),
            e => format!("{e:#}"),
        };
        if back {
            message = format!(
                "{message} (the far end on {} was to connect back: {})",
                self.dest,
                self.opened().and_then(|o| o.reason).unwrap_or_default()
            );
        } else if connect {
            message = format!(
                "{message} (the far end on {} listens on {}, the address ssh reached there; through a jump host or a NAT that address may not be reachable from here)",
                self.dest,
                self.server()
            );
        }
        Explained { error: e, message }
    }
}

/// A failed third-party copy (`from`: the source's far end, `to`: the
/// destination's, each when over ssh): when the destination's far end
/// could only be reached by connecting back, it was to connect back to
/// the source too; say what that needs, and what to run instead.
pub fn explain_third_party(
    from: Option<&FarEnd>,
    to: Option<&FarEnd>,
    e: EngineError,
) -> Explained {
    let walled = to.filter(|t| t.opened().is_some_and(|o| o.opened_by == "far_end"));
    let mut x = match (from, to) {
        (Some(far), _) | (None, Some(far)) => far.explain(e),
        (None, None) => {
            let message = format!("{e:#}");
            return Explained { error: e, message };
        }
    };
    if let Some(to) = walled {
        x.message = format!(
            "{}; the destination's far end on {} takes no new connection (it connected back to this client), so it was to connect back to the source, at the address this client reached the source at: that needs a source of longhaul {} or later, reachable from {}; else copy in two steps through this host (`longhaul cp -r SRC... LOCAL`, then `longhaul cp -r LOCAL {}:PATH`), or run the copy on the destination's host, pulling from the source",
            x.message, to.dest, env!("CARGO_PKG_VERSION"), to.dest, to.dest
        );
    }
    x
}

/// `--connect-back=ADDR[:PORT]`: where to listen and what to tell the far
/// end (port 0 or none: any).
fn connect_back_addr(a: &str) -> Result<SocketAddr, String> {
    if let Ok(s) = a.parse::<SocketAddr>() {
        return Ok(s);
    }
    a.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 0))
        .map_err(|_| {
            format!("--connect-back={a}: not an address (ADDR or ADDR:PORT, [V6]:PORT; names are not looked up)")
        })
}

/// Names paths on a far end as its user wrote them (see [`AsWritten::name`]).
#[derive(Clone)]
pub struct AsWritten {
    /// The one-shot server's `ADDR:PORT`, as the engine names it.
    server: String,
    /// `[USER@]HOST`, as given to ssh.
    dest: String,
}

impl AsWritten {
    /// A name the engine gave a path on the far end (`ADDR:PORT:root/tmp/x`,
    /// by its one-shot server's address and exports) as the user wrote it:
    /// `HOST:/tmp/x`, or `HOST:x` in the home. Any other name as it is.
    pub fn name(&self, name: &str) -> String {
        let Some(rest) = name
            .strip_prefix(self.server.as_str())
            .and_then(|r| r.strip_prefix(':'))
        else {
            return name.to_string();
        };
        let (export, path) = rest.split_once('/').unwrap_or((rest, ""));
        match export {
            ROOT_EXPORT => format!("{}:/{path}", self.dest),
            HOME_EXPORT => format!("{}:{path}", self.dest),
            _ => name.to_string(),
        }
    }
}
