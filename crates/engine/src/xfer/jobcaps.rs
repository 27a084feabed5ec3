//! A job's capabilities, from the side that asks for and uses them
//! (PROTOCOL.md 13.9a): `submit` asks each far end for one scoped to the
//! job ([`ask`]), the job server presents it for each attempt, has a
//! cancelled push's partial files removed ([`discard`]) and revokes it when
//! the job ends ([`revoke`]), and orders the copy of a job between two
//! other servers ([`ordered_cp`]); and a client's words with a job server
//! ([`ask_job_server`]).

use std::time::Instant;

use std::sync::atomic::Ordering::Relaxed;

use longhaul_proto::msg::Message;
use longhaul_proto::xfer::copy::{
    CopyOrder, Discard, DiscardInto, GrantRequest, DISCARD_MAX, FEATURE_JOB_GRANTS,
};

use crate::net::dial::{open_control, ClientOptions, Security};
use crate::net::tls;
use crate::report::Reporter;
use crate::xfer::client::{CopyReport, CpOptions};
use crate::xfer::copy::{catalogue_landed, run_order, summary_of, Relayed};
use crate::EngineError;

/// A capability a far end issued for a job.
#[derive(Clone)]
pub struct JobCapability {
    /// `lh1c_...`: a secret.
    pub capability: String,
    /// The certificate the far end presented, `SHA256:...`.
    pub fingerprint: String,
    pub lifetime_s: u32,
}

impl std::fmt::Debug for JobCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobCapability")
            .field("fingerprint", &self.fingerprint)
            .field("lifetime_s", &self.lifetime_s)
            .finish_non_exhaustive()
    }
}

/// Asks `target` for a durable capability of `req` (inside TLS only), and
/// ends the session: the capability lives on without it.
pub fn ask(
    target: &str,
    o: &ClientOptions,
    req: GrantRequest,
) -> Result<JobCapability, EngineError> {
    if o.security.plaintext {
        return Err(EngineError::Usage(
            "a job's capabilities are asked for inside TLS only (drop --insecure-plaintext)".into(),
        ));
    }
    let mut ctl = open_control(target, o)?;
    if !ctl.welcome.can(FEATURE_JOB_GRANTS) {
        return Err(EngineError::Usage(format!(
            "{target} runs a longhaul ({}) that gives no capability for a job: upgrade it",
            ctl.welcome.software
        )));
    }
    let fingerprint = ctl
        .conn
        .peer_fingerprint()
        .ok_or_else(|| EngineError::Failed(format!("{target} presented no certificate")))?;
    ctl.conn.send(&Message::GrantRequest(GrantRequest {
        durable: true,
        ..req
    }))?;
    let deadline = Instant::now() + o.handshake_timeout;
    let grant = ctl.answer(deadline, "the far end's capability", |m| match m {
        Message::Grant(g) => Some(g),
        _ => None,
    })?;
    Ok(JobCapability {
        capability: grant.capability,
        fingerprint,
        lifetime_s: grant.lifetime_s,
    })
}

/// How to reach a far end with its capability: TLS pinned to the
/// certificate the submitting client saw there, the capability as the
/// token, and nothing else of `base`'s trust.
pub fn presenting(
    base: &ClientOptions,
    fingerprint: &str,
    capability: &str,
) -> Result<ClientOptions, EngineError> {
    let pin = tls::parse_fingerprint(fingerprint).map_err(EngineError::Usage)?;
    Ok(ClientOptions {
        security: Security {
            plaintext: false,
            trust: tls::TrustOptions {
                pins: vec![pin],
                ..Default::default()
            },
            token: Some(capability.to_string()),
            tokens: Vec::new(),
        },
        ..base.clone()
    })
}

/// Revokes the capability `o` presents at `target`.
pub fn revoke(target: &str, o: &ClientOptions) -> Result<(), EngineError> {
    let mut ctl = open_control(target, o)?;
    ctl.conn.send(&Message::Revoke(Default::default()))?;
    let deadline = Instant::now() + o.handshake_timeout;
    ctl.answer(deadline, "the revocation", |m| match m {
        Message::Revoked(_) => Some(()),
        _ => None,
    })
}

/// Has `target` remove the partial files (and journals) its pushes left
/// for `paths` (entries as the push named them): pushes with the
/// capability `o` presents (`into` None), or, on a one-shot server `o`
/// reaches as its own client, pushes into `into`. How many it removed.
pub fn discard(
    target: &str,
    o: &ClientOptions,
    into: Option<&DiscardInto>,
    paths: &[String],
) -> Result<u64, EngineError> {
    let mut ctl = open_control(target, o)?;
    let mut removed = 0;
    for batch in paths.chunks(DISCARD_MAX) {
        ctl.conn.send(&Message::Discard(Discard {
            paths: batch.to_vec(),
            into: into.cloned(),
        }))?;
        let deadline = Instant::now() + o.handshake_timeout * 4;
        removed += ctl.answer(deadline, "the discard", |m| match m {
            Message::Discarded(d) => Some(d.removed),
            _ => None,
        })?;
    }
    Ok(removed)
}

/// A job's copy between two other servers (PROTOCOL.md 13.9a, an
/// `order` capability): orders the source `host` (`o.client` presents the
/// job's order capability there) to run `order` (which carries the
/// destination's capability) and follows it to its end. The relayed
/// counters go to `o.progress` (what the job's heartbeat reads), each
/// landed file to `o.catalogue`, the counters and intervals to `reporter`.
pub fn ordered_cp(
    host: &str,
    o: &CpOptions,
    order: CopyOrder,
    reporter: &mut (dyn Reporter + Send),
) -> Result<CopyReport, EngineError> {
    let started = Instant::now();
    let src_export = order.export.clone();
    let (report, ..) = run_order(host, &o.client, order, None, &mut |r| match r {
        Relayed::Progress(p) => {
            let c = &o.progress;
            c.bytes.store(p.bytes, Relaxed);
            c.files.store(p.files, Relaxed);
            c.announced_bytes.store(p.announced_bytes, Relaxed);
            c.announced_files.store(p.announced_files, Relaxed);
            c.walk_done.store(p.walk_done, Relaxed);
            reporter.transfer_progress(&p);
        }
        Relayed::Interval(i) => reporter.transfer_interval(&i),
        Relayed::Landed(l) => catalogue_landed(o, host, &src_export, l),
    })?;
    Ok(CopyReport {
        seconds: started.elapsed().as_secs_f64(),
        ..summary_of(report)
    })
}

/// Sends one message about jobs (a submission, a command) to the job
/// server `target` and returns its answer.
pub fn ask_job_server(
    target: &str,
    o: &ClientOptions,
    m: Message,
) -> Result<longhaul_proto::job::JobAnswer, EngineError> {
    let mut ctl = open_control(target, o)?;
    ctl.conn.send(&m)?;
    let deadline = Instant::now() + o.handshake_timeout * 3;
    ctl.answer(deadline, "the job server's answer", |m| match m {
        Message::JobAnswer(a) => Some(a),
        _ => None,
    })
}
