//! A capability asked for (PROTOCOL.md 13.9, a job's: 18): checked
//! against the asker's grant, issued into the server's [`Capabilities`],
//! held while the asker's session lasts (a job's outlives it, in the state
//! directory: [`super::durable`]), then revoked.
//!
//! Above both the capabilities' store ([`super::copy`]) and their durable
//! keeping, which it uses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use longhaul_proto::msg::*;
use longhaul_proto::xfer::copy::{Grant, GrantRequest, CAPABILITY_PREFIX, MAX_LIFETIME_S};

use super::copy::{anonymous, disabled, Capabilities, Scope};
use super::{auth, Shared};
use crate::net::conn::FramedConn;

impl Capabilities {
    /// Makes a capability for `request`, good for `lifetime`.
    fn issue(
        &self,
        request: GrantRequest,
        grant: &str,
        lifetime: Duration,
        made: Option<String>,
    ) -> Result<(String, blake3::Hash), String> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| format!("the OS random source failed: {e}"))?;
        let secret = format!(
            "{CAPABILITY_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
        );
        let key = blake3::hash(secret.as_bytes());
        let scope = Scope {
            request,
            grant: grant.to_string(),
            key,
            expires: Instant::now() + lifetime,
            expires_unix: super::durable::unix_now().saturating_add(lifetime.as_secs()),
            made,
        };
        let mut live = self.live.lock().map_err(|_| "internal error".to_string())?;
        live.insert(key, scope);
        if live[&key].request.durable {
            if let Err(e) = self.persist(&live) {
                live.remove(&key);
                return Err(e);
            }
        }
        Ok((secret, key))
    }
}

/// Answers a request for a capability into this server, then holds it
/// until the requester's session ends (or stops, or the lifetime ends),
/// and revokes it.
pub(super) fn serve_grant(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    req: &GrantRequest,
    access: &auth::Access,
) -> Result<(), (RefuseCode, String)> {
    if !shared.cfg.third_party_copies {
        return Err(disabled());
    }
    if access.is_anonymous() {
        return Err(anonymous("grants third-party copies"));
    }
    if !conn.is_tls() {
        return Err((
            RefuseCode::TlsRequired,
            "a third-party copy capability is given inside TLS only".into(),
        ));
    }
    let ex = super::files::export(shared, &req.export, access)?;
    let made = super::durable::check_grant(shared, ex, req, access)?;
    let most = if req.durable {
        longhaul_proto::job::MAX_LIFETIME_S
    } else {
        MAX_LIFETIME_S
    };
    let lifetime = Duration::from_secs(u64::from(req.lifetime_s.clamp(1, most)));
    let (capability, key) = shared
        .capabilities
        .issue(req.clone(), access.grant_label(), lifetime, made)
        .map_err(|m| (RefuseCode::ServerError, m))?;
    let what = super::durable::scope_words(&ex.name, req);
    tracing::info!(
        "{} ({}) holds a {}capability {what} for {} s",
        conn.peer(),
        access.who,
        if req.durable {
            "job's "
        } else {
            "third-party copy "
        },
        lifetime.as_secs()
    );
    let until = Instant::now() + lifetime;
    let sent = conn.send(&Message::Grant(Grant {
        capability,
        lifetime_s: lifetime.as_secs() as u32,
    }));
    // A job's capability outlives this session: its holder revokes it.
    if req.durable {
        return sent.map_err(|e| (RefuseCode::ServerError, e.to_string()));
    }
    if sent.is_ok() {
        while Instant::now() < until {
            match conn.recv(Duration::from_millis(200)) {
                Ok(Some(Message::Stop(_))) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
    shared.capabilities.revoke(&key);
    tracing::info!(
        "the third-party copy capability of {} {what} is revoked",
        conn.peer(),
    );
    Ok(())
}
