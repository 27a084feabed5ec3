//! A third-party test: this server runs a perf test against another one
//! for a requester, and relays it.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use longhaul_proto::msg::*;
use longhaul_proto::units::escaped;

use super::slots::Claimant;
use super::{auth, Shared};
use crate::net::conn::FramedConn;
use crate::net::dial::ClientOptions;
use crate::net::tls;
use crate::perf::client::run_perf;
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
    // there, present its token, plaintext only if it uses plaintext.
    let opts = ClientOptions {
        security: crate::net::dial::Security {
            plaintext: req.plaintext,
            trust: tls::TrustOptions {
                pins: req.trust.clone(),
                ..Default::default()
            },
            token: req.token.clone(),
        },
        ..ClientOptions::default()
    };
    let interrupt = opts.interrupt.clone();
    let (tx, rx) = mpsc::channel::<Relay>();
    let (target, params) = (req.target.clone(), req.params.clone());
    let worker = std::thread::Builder::new()
        .name("lh-3rd".into())
        .spawn(move || {
            let mut sink = RelaySink(|r: Relay| {
                let _ = tx.send(r);
            });
            if let Err(e) = run_perf(&target, &params, &opts, &mut sink) {
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
    loop {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(r) => {
                if conn.send(&Message::Relay(r)).is_err() {
                    interrupt.store(true, Ordering::SeqCst);
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        match conn.recv(Duration::from_millis(1)) {
            Ok(Some(Message::Stop(s))) => {
                tracing::info!(
                    "{} stops its third-party test: {}",
                    conn.peer(),
                    escaped(&s.reason)
                );
                interrupt.store(true, Ordering::SeqCst);
            }
            Ok(_) => {}
            Err(_) => interrupt.store(true, Ordering::SeqCst),
        }
    }
    let _ = worker.join();
}
