//! Third-party copies, on the ordering client (`longhaul cp A:src B:dst`
//! with both ends remote, PROTOCOL.md 13.9): ask the destination B for a
//! capability scoped to this copy's destination, order the source A to push
//! there with it, and report what A relays. The data goes from A to B over
//! their own TLS data streams; this client carries only the two control
//! connections, and says how many bytes they carried.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::msg::CopyRelay;
use longhaul_proto::msg::{Message, RefuseCode, Stop};
use longhaul_proto::xfer::copy::{
    ConnectBackOrder, CopyOptions, CopyOrder, CopyReport, CopyShareItem, GrantRequest,
};
use longhaul_proto::xfer::Remote;

use super::client::CpOptions;
use crate::end::End;
use crate::net::back::{self, Opened, Route};
use crate::net::dial::{open_control, ClientOptions, Control};
use crate::net::sock;
use crate::report::{Reporter, TransferProgress};
use crate::EngineError;

/// How long the capability may be used: a copy's retries all start within
/// it. The destination also revokes it when this client's session with it
/// ends, so it never outlives the copy.
pub const LIFETIME: Duration = Duration::from_secs(3600);

/// How long this client waits for a word from the source before it gives
/// up on it (the source relays progress about once a second; its dial of
/// the destination may take its connect and handshake time-outs first).
const SILENCE: Duration = Duration::from_secs(90);

/// The most requests to connect back a source may relay in one copy (a
/// connection each: its control and data streams, over its retries): as
/// many as the destination is allowed to open to it for the copy.
const RELAYED_MAX: u32 = longhaul_proto::xfer::back::ALLOW_MAX;

pub use longhaul_proto::xfer::report::ThirdPartyUse;

fn bytes_of(c: &Control) -> u64 {
    sock::tcp_bytes(sock::fd_of(c.conn.tcp())).map_or(0, |(acked, received)| acked + received)
}

/// Copies `o.sources` (on one server) to `o.dest` (on another) directly
/// between them, reaching the source with `from` and the destination with
/// `to` (each end's own trust and credential). Reports progress and
/// intervals as they are relayed; the outcome is the caller's to report.
pub fn third_party_cp(
    o: &CpOptions,
    from: &ClientOptions,
    to: &ClientOptions,
    reporter: &mut (dyn Reporter + Send),
) -> Result<CopyReport, EngineError> {
    third_party_share(o, from, to, None, reporter)
}

/// [`third_party_cp`] of a fleet rank's share only (`share`: entries
/// beneath `o.sources`, by index, which the source confines).
pub fn third_party_share(
    o: &CpOptions,
    from: &ClientOptions,
    to: &ClientOptions,
    share: Option<Vec<CopyShareItem>>,
    reporter: &mut (dyn Reporter + Send),
) -> Result<CopyReport, EngineError> {
    let started = Instant::now();
    let (srcs, d) = remote_ends(o, from, to)?;
    let (host, export) = (srcs[0].host.clone(), srcs[0].export.clone());
    let held = request_capability(
        &d.host,
        to,
        GrantRequest {
            export: d.export.clone(),
            dest: d.path.clone(),
            dest_dir: d.dir,
            lifetime_s: LIFETIME.as_secs() as u32,
            ..GrantRequest::default()
        },
    )?;
    let src_export = export.clone();
    // A destination this client reached only by its connecting back (a
    // far end over ssh behind a firewall) connects back to the source too.
    let walled = back::route_for(held.ctl.peer).filter(|r| r.is_back());
    let order = CopyOrder {
        export,
        sources: order_paths(&o.sources),
        target: d.host.clone(),
        fingerprint: held.fingerprint.clone(),
        capability: held.capability.clone(),
        dest_export: d.export.clone(),
        dest: d.path.clone(),
        dest_dir: d.dir,
        options: wire_options(o),
        connect_back: walled.as_ref().map(|_| ConnectBackOrder::default()),
        share,
    };
    let mut intervals = Vec::new();
    let (report, a_bytes, back_to) = run_order(&host, from, order, walled, &mut |r| match r {
        Relayed::Progress(p) => reporter.transfer_progress(&p),
        Relayed::Interval(i) => {
            reporter.transfer_interval(&i);
            intervals.push(i);
        }
        Relayed::Landed(l) => catalogue_landed(o, &host, &src_export, l),
    })?;
    let control_bytes = a_bytes + bytes_of(&held.ctl);
    held.release();
    let verdict = longhaul_proto::tune::verdict(&intervals);
    Ok(CopyReport {
        seconds: started.elapsed().as_secs_f64(),
        intervals,
        verdict,
        dry_run: o.dry_run,
        third_party: Some(ThirdPartyUse {
            source: host,
            dest: d.host.clone(),
            control_bytes,
            data_connections: Some(opened_by(back_to)),
        }),
        ..summary_of(report)
    })
}

/// The remote sources (one server and export, every one with a trailing
/// `/` or none) and the remote destination of a third-party copy, each
/// end reached with its own credential, over TLS.
fn remote_ends<'o>(
    o: &'o CpOptions,
    from: &ClientOptions,
    to: &ClientOptions,
) -> Result<(Vec<&'o Remote>, &'o Remote), EngineError> {
    let usage = |m: &str| EngineError::Usage(m.to_string());
    if let Some(e) = o
        .sources
        .iter()
        .chain([&o.dest])
        .find(|e| e.ssh().is_some())
    {
        return Err(super::client::unreached(e));
    }
    let d = o
        .dest
        .server()
        .ok_or_else(|| usage("the destination is not remote"))?;
    let srcs: Vec<&Remote> = o.sources.iter().filter_map(End::server).collect();
    if srcs.is_empty() || srcs.len() != o.sources.len() {
        return Err(usage(
            "a third-party copy names remote sources only (HOST:PORT:EXPORT/path, longhaul://HOST/EXPORT/path or HOST:path)",
        ));
    }
    let (host, export) = (&srcs[0].host, &srcs[0].export);
    if srcs.iter().any(|r| &r.host != host || &r.export != export) {
        return Err(usage("all remote sources must be on one server and export"));
    }
    let slashed = o.sources.iter().filter(|s| s.slashed()).count();
    if slashed > 0 && slashed < o.sources.len() {
        return Err(usage(
            "name every source with a trailing '/' (copy their contents) or none (copy them by name), not a mix",
        ));
    }
    one_credential_each(host, from, &d.host, to)?;
    if from.security.plaintext || to.security.plaintext {
        return Err(usage(
            "a third-party copy needs TLS to both servers: its capability is never sent in the clear (drop --insecure-plaintext)",
        ));
    }
    Ok((srcs, d))
}

/// The order's source paths as the source's export names them, each
/// with the trailing `/` its user gave.
fn order_paths(sources: &[End]) -> Vec<String> {
    sources
        .iter()
        .filter_map(|s| Some((s.server()?, s.slashed())))
        .map(|(r, slashed)| {
            if slashed && !r.path.is_empty() {
                format!("{}/", r.path)
            } else if slashed {
                "/".to_string()
            } else {
                r.path.clone()
            }
        })
        .collect()
}

/// A copy's options as they cross the wire to the source; the source's
/// [`options_of`] takes them back.
fn wire_options(o: &CpOptions) -> CopyOptions {
    CopyOptions {
        recursive: o.recursive,
        preserve: o.preserve,
        force: o.force,
        mkpath: o.mkpath,
        verify: o.verify,
        dry_run: o.dry_run,
        sync: o.sync.clone(),
        streams: o.streams,
        chunk_size: o.chunk_size,
        rate: o.rate,
        files_in_flight: o.files_in_flight,
        retries: o.retries,
        direct: o.direct,
        no_tune: !o.tune,
        catalogue: o.catalogue.is_some(),
        compress: o.compress,
    }
}

/// Which end opened the data's connections: the destination, when it
/// connected back to the source (at `back_to`), else the source.
fn opened_by(back_to: Option<SocketAddr>) -> Opened {
    match back_to {
        Some(at) => Opened {
            opened_by: "dest".into(),
            reason: Some(format!(
                "the destination connected back to the source at {at}, as it did to this client"
            )),
        },
        None => Opened {
            opened_by: "source".into(),
            reason: None,
        },
    }
}

/// The push a source server runs for a copy's options (an order's, a
/// job's): `cp`'s own options from what crossed the wire, files synced,
/// retries at most 10.
pub fn options_of(
    x: &CopyOptions,
    sources: Vec<End>,
    dest: End,
    client: ClientOptions,
) -> CpOptions {
    let mut o = CpOptions::new(sources, dest, client);
    o.recursive = x.recursive;
    o.preserve = x.preserve;
    o.force = x.force;
    o.mkpath = x.mkpath;
    o.verify = x.verify;
    o.dry_run = x.dry_run;
    o.sync = x.sync.clone();
    o.streams = x.streams;
    o.chunk_size = x.chunk_size;
    o.rate = x.rate;
    o.files_in_flight = x.files_in_flight;
    o.retries = x.retries.min(10);
    o.direct = x.direct;
    o.compress = x.compress;
    o.tune = !x.no_tune;
    o.sync_files = true;
    o
}

/// A summary from a source's relayed report: its fields, the rest default
/// (the network rate is the report's rate: the source's streams carried it).
pub(crate) fn summary_of(r: CopyReport) -> CopyReport {
    CopyReport {
        network_bps: r.bits_per_second,
        ..r
    }
}

/// What a source relays while it copies.
pub(crate) enum Relayed {
    Progress(TransferProgress),
    Interval(longhaul_proto::tune::TransferInterval),
    Landed(longhaul_proto::xfer::copy::CopyLanded),
}

/// A file the source says landed, into the catalogue (when it is kept):
/// named where it was read, as this client named the source (`host`, its
/// export), and where it landed, as the source named it.
pub(crate) fn catalogue_landed(
    o: &CpOptions,
    host: &str,
    src_export: &str,
    l: longhaul_proto::xfer::copy::CopyLanded,
) {
    if let Some(catalogue) = &o.catalogue {
        let names = (format!("{host}:{src_export}/{}", l.source), l.dest);
        catalogue(crate::xfer::Landed {
            path: l.path,
            size: l.size,
            mtime_ns: l.mtime_ns,
            digest: l.digest,
            namer: std::sync::Arc::new(move |_: &str| names.clone()),
        });
    }
}

/// Sends `order` to the source `host` and follows the copy to its end:
/// the source's report, the bytes this control connection carried, and
/// where the destination connected back to, if it did. With
/// `order.connect_back`, the source listens where this client reached it,
/// and each of its requests to connect back is written to the
/// destination's ssh channel by `walled`, its route.
pub(crate) fn run_order(
    host: &str,
    o: &ClientOptions,
    mut order: CopyOrder,
    walled: Option<Arc<Route>>,
    tell: &mut dyn FnMut(Relayed),
) -> Result<(CopyReport, u64, Option<SocketAddr>), EngineError> {
    let mut a = open_control(host, o).map_err(|e| at("the source", host, e))?;
    if let Some(c) = &mut order.connect_back {
        if !a.welcome.can(longhaul_proto::msg::FEATURE_COPY_BACK) {
            return Err(EngineError::Usage(format!(
                "the destination can only connect out, so the source ({host}) must listen for it, and its longhaul ({}) is too old to: install this version on the source, or copy in two steps through this host (cp A:src ./tmp, then cp ./tmp B:dst)",
                a.welcome.software
            )));
        }
        c.addr = a.peer.ip().to_string();
    }
    let listen = a.peer.ip();
    // The destination connects only where this client named: the source,
    // as many times as a copy may ask.
    if let (Some(route), Some(_)) = (&walled, &order.connect_back) {
        route.allow(listen, RELAYED_MAX)?;
    }
    let mut back = BackRelay {
        host,
        walled,
        listen,
        relayed: 0,
        back_to: None,
    };
    a.conn.send(&Message::CopyOrder(Box::new(order)))?;
    let mut stopped = false;
    let mut heard = Instant::now();
    let report: CopyReport = loop {
        if !stopped && o.interrupt.load(std::sync::atomic::Ordering::Relaxed) {
            stopped = true;
            let _ = a.conn.send(&Message::Stop(Stop {
                reason: "interrupted by the user".into(),
            }));
        }
        if heard.elapsed() > SILENCE {
            return Err(EngineError::Timeout(format!(
                "the third-party copy: {host} said nothing for {} s",
                SILENCE.as_secs()
            )));
        }
        let m = match a.conn.recv(Duration::from_millis(100)) {
            Ok(Some(m)) => m,
            Ok(None) => continue,
            Err(_) if stopped => return Err(interrupted()),
            Err(e) => return Err(at("the source", host, e)),
        };
        heard = Instant::now();
        match m {
            Message::CopyRelay(CopyRelay::Progress(p)) => {
                tell(Relayed::Progress(TransferProgress {
                    bytes: p.bytes,
                    files: p.files,
                    announced_bytes: p.announced_bytes,
                    announced_files: p.announced_files,
                    walk_done: p.walk_done,
                }));
            }
            Message::CopyRelay(CopyRelay::Interval(i)) => {
                tell(Relayed::Interval(i));
            }
            Message::CopyRelay(CopyRelay::Landed(l)) => {
                tell(Relayed::Landed(l));
            }
            Message::CopyRelay(CopyRelay::ConnectBack(c)) => back.relay(&c)?,
            Message::CopyRelay(CopyRelay::Done(r)) => break *r,
            // The end the user asked for, whatever the source calls it.
            Message::CopyRelay(CopyRelay::Failed(_)) | Message::Refuse(_) if stopped => {
                return Err(interrupted());
            }
            Message::CopyRelay(CopyRelay::Failed(r)) | Message::Refuse(r) => {
                return Err(at("the source", host, refused_by(r)));
            }
            Message::Queued(_) => {}
            other => {
                return Err(EngineError::Failed(format!(
                    "{host} sent an unexpected {} message during a third-party copy",
                    other.name()
                )))
            }
        }
    };
    Ok((report, bytes_of(&a), back.back_to))
}

/// The destination's connections back to the source, relayed for the
/// source through the destination's route (`walled`).
struct BackRelay<'a> {
    host: &'a str,
    walled: Option<Arc<Route>>,
    /// Where this client reached the source: the one address the
    /// destination may be sent to.
    listen: std::net::IpAddr,
    relayed: u32,
    back_to: Option<SocketAddr>,
}

impl BackRelay<'_> {
    /// Relays one of the source's requests to connect back. Only to the
    /// address the order named, only as many as a copy may open: a source
    /// cannot have the destination dial anywhere else.
    fn relay(
        &mut self,
        c: &longhaul_proto::xfer::copy::CopyConnectBack,
    ) -> Result<(), EngineError> {
        let host = self.host;
        let to = relayed_to(&c.addr, self.listen);
        let (Some(route), Some(to)) = (&self.walled, to) else {
            return Err(EngineError::Failed(format!(
                "{host} asked for a connection back that this client did not order (to {})",
                longhaul_proto::units::escaped(&c.addr)
            )));
        };
        self.relayed += 1;
        if self.relayed > RELAYED_MAX {
            return Err(EngineError::Failed(format!(
                "{host} asked for more than {RELAYED_MAX} connections back"
            )));
        }
        route
            .relay(to, &c.ticket)
            .map_err(|e| at("the source", host, e))?;
        if self.back_to.replace(to) != Some(to) {
            tracing::info!("{host} has the destination connect back to it at {to}");
        }
        Ok(())
    }
}

/// The error of a source's refusal or failure, as it said it.
fn refused_by(r: longhaul_proto::msg::Refuse) -> EngineError {
    match r.code {
        RefuseCode::ServerError => {
            EngineError::Failed(longhaul_proto::units::escaped(&r.message).to_string())
        }
        code => EngineError::Refused {
            code,
            message: r.message,
        },
    }
}

/// A copy the user stopped (Ctrl-C): interrupted, not failed at either end.
fn interrupted() -> EngineError {
    EngineError::Interrupted(
        "the third-party copy was stopped; run the same command again to resume".into(),
    )
}

/// Where a source's relayed request to connect back sends the
/// destination, if this client may write it there: the IP the order named
/// (where this client reached the source), and a port.
fn relayed_to(addr: &str, named: std::net::IpAddr) -> Option<SocketAddr> {
    addr.parse::<SocketAddr>()
        .ok()
        .filter(|to| to.ip() == named && to.port() != 0)
}

/// Orders the source `host` to run `order` and waits for its report (for
/// tests and tools; `cp` uses [`third_party_cp`]).
pub fn order_copy(
    host: &str,
    o: &ClientOptions,
    order: CopyOrder,
) -> Result<CopyReport, EngineError> {
    run_order(host, o, order, None, &mut |_| {}).map(|(r, ..)| r)
}

/// A capability into a destination server, held: the server revokes it
/// when this is released or dropped (the session ends), or at the end of
/// its lifetime, whichever comes first.
pub struct HeldCapability {
    ctl: Control,
    /// The capability (`lh1c_...`): a secret, for the source only.
    pub capability: String,
    /// The fingerprint of the certificate the destination presented.
    pub fingerprint: String,
    /// The lifetime the destination gave.
    pub lifetime: Duration,
}

impl std::fmt::Debug for HeldCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldCapability")
            .field("fingerprint", &self.fingerprint)
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl HeldCapability {
    /// Ends the session that holds the capability: the server revokes it.
    pub fn release(mut self) {
        let _ = self.ctl.conn.send(&Message::Stop(Stop {
            reason: "the copy is over".into(),
        }));
    }
}

/// Asks the destination `target` for a capability for one push into
/// `req`'s destination, over TLS (it is never asked for or sent in the
/// clear), and holds it.
pub fn request_capability(
    target: &str,
    o: &ClientOptions,
    req: GrantRequest,
) -> Result<HeldCapability, EngineError> {
    if o.security.plaintext {
        return Err(EngineError::Usage(
            "a third-party copy capability is asked for and sent inside TLS only (drop --insecure-plaintext)".into(),
        ));
    }
    let mut ctl = open_control(target, o).map_err(|e| at("the destination", target, e))?;
    let fingerprint = ctl
        .conn
        .peer_fingerprint()
        .ok_or_else(|| EngineError::Failed(format!("{target} presented no certificate")))?;
    ctl.conn.send(&Message::GrantRequest(req))?;
    let deadline = Instant::now() + o.handshake_timeout;
    let grant = ctl
        .answer(deadline, "the destination's capability", |m| match m {
            Message::Grant(g) => Some(g),
            _ => None,
        })
        .map_err(|e| at("the destination", target, e))?;
    Ok(HeldCapability {
        ctl,
        capability: grant.capability,
        fingerprint,
        lifetime: Duration::from_secs(u64::from(grant.lifetime_s)),
    })
}

/// Refuses a copy that would present one credential to both servers when
/// the user did not name it for each: the destination would receive a
/// credential that also works on the source (and the other way round).
/// Each server gets its own (`Security::tokens`, `--token-file
/// HOST=FILE`); a far end over ssh has its own secret anyway.
fn one_credential_each(
    source: &str,
    from: &ClientOptions,
    dest: &str,
    to: &ClientOptions,
) -> Result<(), EngineError> {
    let (a, b) = (from.security.token_for(source), to.security.token_for(dest));
    let named = from.security.named_for(source) && to.security.named_for(dest);
    match (a, b) {
        (Some(a), Some(b)) if a == b && !named => Err(EngineError::Usage(format!(
            "a third-party copy presents each server its own credential, and this one would go to both the source ({source}) and the destination ({dest}), each of which could then use it on the other: name one for each, --token-file {source}=FILE --token-file {dest}=FILE (the same file for both only if you mean both to have it)"
        ))),
        _ => Ok(()),
    }
}

/// Names which end an error came from.
fn at(end: &str, host: &str, e: EngineError) -> EngineError {
    match e {
        EngineError::Refused { code, message } => EngineError::Refused {
            code,
            message: format!("{end} ({host}): {message}"),
        },
        EngineError::Failed(m) => EngineError::Failed(format!("{end} ({host}): {m}")),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attacker is the source: a request to connect back is written
    /// to the destination only for the address the order named.
    #[test]
    fn attacker_a_source_cannot_send_the_destination_elsewhere() {
        let named: std::net::IpAddr = "198.51.100.4".parse().unwrap();
        assert_eq!(
            relayed_to("198.51.100.4:41234", named),
            Some("198.51.100.4:41234".parse().unwrap())
        );
        for other in [
            "198.51.100.5:41234",
            "10.0.0.1:22",
            "198.51.100.4:0",
            "198.51.100.4",
            "[::1]:41234",
            "internal.example:80",
            "198.51.100.4:41234 lh1b_x",
        ] {
            assert_eq!(relayed_to(other, named), None, "{other}");
        }
    }
}
