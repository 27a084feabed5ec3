//! A third-party test: this server runs a perf test against another one
//! for a requester, and relays it.
//!
//! Only for authenticated requesters (the caller refuses anonymous ones
//! before anything is dialed), and only toward longhaul servers: until the
//! target has completed longhaul's handshake (TLS with the pinned
//! certificate, then `Welcome`) nothing of it is reported but one uniform
//! failure at one fixed time after the request ([`reach`]), whether the
//! port is closed, filtered, or open to something else. Otherwise this
//! server would be a port scanner for whoever may ask it.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::msg::*;
use longhaul_proto::units::escaped;

use super::slots::Claimant;
use super::{auth, Shared};
use crate::net::conn::FramedConn;
use crate::net::dial::open_control;
use crate::net::dial::ClientOptions;
use crate::net::tls;
use crate::perf::client::{check_params, run_perf_over};
use crate::report::RelaySink;
use crate::EngineError;

/// Runs a test from this server to another and relays it to the
/// requester, while still listening to the requester: a stop or a closed
/// connection ends the run.
pub(super) fn third_party(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    req: &ThirdParty,
    access: &auth::Access,
) {
    tracing::info!(
        "third-party test from {} to {}",
        conn.peer(),
        escaped(&req.target)
    );
    // Not queued: the requester waits for relays, not for a queue.
    let Some(_slot) = shared.slots.try_take(shared, &Claimant::of(access)) else {
        let (running, limit) = shared.slots.load();
        let _ = conn.send(&Message::Relay(Relay::Failed(Refuse {
            code: RefuseCode::Busy,
            message: format!(
                "server is running {running} tests and transfers, its limit (--max-tests {limit}); try again later"
            ),
        })));
        return;
    };
    // Connect to the target as the requester would: pin what it trusts
    // there, present its token, plaintext only if it uses plaintext; give
    // it the time this server gives its own clients to shake hands.
    let handshake = shared.cfg.limits.handshake_timeout;
    let opts = ClientOptions {
        connect_timeout: ClientOptions::default().connect_timeout.min(handshake),
        handshake_timeout: handshake,
        security: crate::net::dial::Security {
            plaintext: req.plaintext,
            trust: tls::TrustOptions {
                pins: req.trust.clone(),
                ..Default::default()
            },
            token: req.token.clone(),
            tokens: Vec::new(),
        },
        ..ClientOptions::default()
    };
    let interrupt = opts.interrupt.clone();
    let until = Instant::now() + reach(&opts);
    let (tx, rx) = mpsc::channel::<Relay>();
    let (shook, handshake_rx) = mpsc::channel::<bool>();
    let (target, params) = (req.target.clone(), req.params.clone());
    let worker = std::thread::Builder::new()
        .name("lh-3rd".into())
        .spawn(move || {
            let mut sink = RelaySink(|r: Relay| {
                let _ = tx.send(r);
            });
            if let Err(e) = check_params(&params) {
                let _ = shook.send(true);
                let _ = tx.send(Relay::Failed(Refuse {
                    code: RefuseCode::BadRequest,
                    message: e.to_string(),
                }));
                return;
            }
            let ctl = match open_control(&target, &opts) {
                Ok(c) => c,
                Err(e) => {
                    // For this server's log only: the requester hears the
                    // uniform failure.
                    tracing::info!(
                        "third-party target {} did not complete the handshake: {}",
                        escaped(&target),
                        escaped(&e.to_string())
                    );
                    let _ = shook.send(false);
                    return;
                }
            };
            if shook.send(true).is_err() || opts.interrupt.load(Ordering::SeqCst) {
                return;
            }
            if let Err(e) = run_perf_over(ctl, &target, &params, &opts, &mut sink) {
                let code = match &e {
                    EngineError::Refused { code, .. } => *code,
                    _ => RefuseCode::ServerError,
                };
                let _ = tx.send(Relay::Failed(Refuse {
                    code,
                    message: e.to_string(),
                }));
            }
        });
    let Ok(worker) = worker else {
        let _ = conn.send(&Message::Relay(Relay::Failed(Refuse {
            code: RefuseCode::ServerError,
            message: "cannot start a thread for the test".into(),
        })));
        return;
    };
    let wait = until.saturating_duration_since(Instant::now());
    if !handshake_rx.recv_timeout(wait).unwrap_or(false) {
        // Closed, filtered, not longhaul, not trusted, refused, or still
        // trying: all the same, at the same time. A worker still dialing
        // ends on its own time-outs; nothing waits for it.
        interrupt.store(true, Ordering::SeqCst);
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        let _ = conn.send(&Message::Relay(Relay::Failed(Refuse {
            code: RefuseCode::ServerError,
            message: uniform_failure(&req.target),
        })));
        return;
    }
    relay_until_done(conn, &rx, Message::Relay, &interrupt, "test");
    let _ = worker.join();
}

/// Sends the requester each report of a run this server makes for it
/// (`wrap` makes it a message) until the run's sender is gone, while still
/// listening to the requester: a `Stop` or a closed connection sets
/// `interrupt`, which ends the run. `what` names the run in the log.
pub(super) fn relay_until_done<T>(
    conn: &mut FramedConn,
    rx: &mpsc::Receiver<T>,
    wrap: impl Fn(T) -> Message,
    interrupt: &std::sync::atomic::AtomicBool,
    what: &str,
) {
    loop {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(r) => {
                if conn.send(&wrap(r)).is_err() {
                    interrupt.store(true, Ordering::SeqCst);
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        match conn.recv(Duration::from_millis(1)) {
            Ok(Some(Message::Stop(s))) => {
                tracing::info!(
                    "{} stops its third-party {what}: {}",
                    conn.peer(),
                    escaped(&s.reason)
                );
                interrupt.store(true, Ordering::SeqCst);
            }
            Ok(_) => {}
            Err(_) => interrupt.store(true, Ordering::SeqCst),
        }
    }
}

/// How long after the request a target that has not completed longhaul's
/// handshake is reported, whatever the reason: the longest the dial may
/// take (connect, then the TLS and longhaul handshakes).
pub(super) fn reach(opts: &ClientOptions) -> Duration {
    opts.connect_timeout + opts.handshake_timeout
}

/// The one message for a target that did not complete the handshake.
pub(super) fn uniform_failure(target: &str) -> String {
    format!(
        "no longhaul server completed the handshake at the target: nothing listens there, it is filtered, it is not longhaul, its certificate is not the one trusted for it, or it refused this server; check it with `longhaul perf {target}`"
    )
}
