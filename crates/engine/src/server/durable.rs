//! A job's capabilities, on the server that issues them (PROTOCOL.md
//! 13.9a): asked for with `GrantRequest.durable`, they outlive the session
//! that asked (the job server holds them) and this server's restarts (their
//! BLAKE3 hashes and scopes are kept in the state directory's
//! `capabilities` file, mode 0600, rewritten whole on every change), and
//! end when their holder revokes them ([`serve_revoke`]) or their lifetime
//! ends. A push capability's holder may also have the partial files of a
//! cancelled push removed ([`serve_discard`]); a pull capability reads (a
//! pull, a listing) beneath its sources and does nothing else.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::msg::{Message, RefuseCode};
use longhaul_proto::units::escaped;
use longhaul_proto::xfer::copy::{
    CapabilityOp, Discard, DiscardInto, Discarded, GrantRequest, Revoked, DISCARD_MAX,
};
use serde::{Deserialize, Serialize};

use super::copy::{Capabilities, Scope};
use super::{auth, Shared};
use crate::net::conn::FramedConn;
use crate::xfer::beneath::Anchor;
use crate::xfer::{beneath, confine, Export};
use crate::EngineError;

/// The file of a state directory that keeps durable capabilities.
pub const CAPABILITIES_FILE: &str = "capabilities";

/// One durable capability as the state directory keeps it: never the
/// secret, only its hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    /// BLAKE3 of the capability, hex.
    key: String,
    grant: String,
    /// Unix seconds.
    expires: u64,
    request: GrantRequest,
    /// [`Scope::made`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    made: Option<String>,
}

pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Capabilities {
    /// The durable capabilities kept in `state` that are still alive (none
    /// if the file is missing; a line that does not read is skipped, with
    /// a warning). Without a state directory, durable ones are refused.
    pub(super) fn load(state: Option<PathBuf>) -> Capabilities {
        let mut live = HashMap::new();
        if let Some(dir) = &state {
            let path = dir.join(CAPABILITIES_FILE);
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => {
                    tracing::warn!(
                        "cannot read {}: {e}; jobs' capabilities are lost",
                        path.display()
                    );
                    String::new()
                }
            };
            let now = unix_now();
            for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
                let scope = serde_json::from_str::<Record>(line)
                    .map_err(|e| e.to_string())
                    .and_then(|r| scope_of(r, now));
                match scope {
                    Ok(Some(s)) => {
                        live.insert(s.key, s);
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!("{} line {}: {e}", path.display(), n + 1),
                }
            }
            if !live.is_empty() {
                tracing::info!("{} jobs' capabilities kept from before", live.len());
            }
        }
        Capabilities {
            live: std::sync::Mutex::new(live),
            state,
        }
    }

    /// Rewrites the state directory's file from the durable ones of
    /// `live` (the caller holds its lock, so writes are in order).
    pub(super) fn persist(&self, live: &HashMap<blake3::Hash, Scope>) -> Result<(), String> {
        let Some(dir) = &self.state else {
            return Err(
                "this server keeps no capabilities for jobs (it has no state directory)".into(),
            );
        };
        let now = unix_now();
        let mut text = String::new();
        for s in live
            .values()
            .filter(|s| s.request.durable && s.expires_unix > now)
        {
            let r = Record {
                key: s.key.to_hex().to_string(),
                grant: s.grant.clone(),
                expires: s.expires_unix,
                request: s.request.clone(),
                made: s.made.clone(),
            };
            text.push_str(&serde_json::to_string(&r).map_err(|e| e.to_string())?);
            text.push('\n');
        }
        crate::state::replace_private(dir, CAPABILITIES_FILE, text.as_bytes())
    }
}

/// A kept record as a live scope; None once it has expired.
fn scope_of(r: Record, now: u64) -> Result<Option<Scope>, String> {
    let key = blake3::Hash::from_hex(&r.key).map_err(|e| format!("bad key: {e}"))?;
    if r.expires <= now || !r.request.durable {
        return Ok(None);
    }
    Ok(Some(Scope {
        request: r.request,
        grant: r.grant,
        key,
        expires: Instant::now() + Duration::from_secs(r.expires - now),
        expires_unix: r.expires,
        made: r.made,
    }))
}

/// What a capability of `req` is for, in log lines.
pub(super) fn scope_words(export: &str, req: &GrantRequest) -> String {
    match req.op {
        CapabilityOp::Push => format!("into {export}/{}", escaped(&req.dest)),
        CapabilityOp::Pull => format!("to read {export}/{{{}}}", escaped(&req.sources.join(", "))),
        CapabilityOp::Order => format!(
            "to order {export}/{{{}}} sent to {}",
            escaped(&req.sources.join(", ")),
            req.order
                .as_ref()
                .map_or(String::new(), |o| escaped(&format!(
                    "{} {}/{}",
                    o.target, o.dest_export, o.dest
                ))
                .to_string())
        ),
    }
}

/// Whether this client may be given a capability of `req` into (or out
/// of) `ex`: what it could do itself, no more; a job's only where this
/// server can keep it. A job's push: the directory its pushes would make
/// first ([`Scope::made`], from [`crate::xfer::sink::first_missing`]).
pub(super) fn check_grant(
    shared: &Shared,
    ex: &Export,
    req: &GrantRequest,
    access: &auth::Access,
) -> Result<Option<String>, (RefuseCode, String)> {
    let bad = |e: EngineError| (RefuseCode::BadRequest, e.to_string());
    let denied = |m| (RefuseCode::Unauthorized, m);
    if req.durable && (shared.cfg.one_time.is_some() || shared.capabilities.state.is_none()) {
        return Err((
            RefuseCode::BadRequest,
            "this server gives no capability for a job: a one-shot server ends with its session (run `longhaul serve --third-party-copies` there)".into(),
        ));
    }
    match req.op {
        CapabilityOp::Push => {
            let read_only = || {
                Err((
                    RefuseCode::BadRequest,
                    format!("export '{}' is read-only", ex.name),
                ))
            };
            // Told so whether or not this client could write there.
            if ex.read_only && access.check_read(ex).is_ok() {
                return read_only();
            }
            access.check_write(ex).map_err(denied)?;
            if ex.read_only {
                return read_only();
            }
            // The push it allows resolves the destination again, under the same rule.
            let anchor = Anchor::open_as(&ex.root, &shared.cfg.shown_root(ex)).map_err(bad)?;
            let dest = anchor
                .resolve_dest(&beneath(&ex.root, &req.dest).map_err(bad)?)
                .map_err(bad)?;
            Ok(req
                .durable
                .then(|| crate::xfer::sink::first_missing(&ex.root, &dest))
                .flatten())
        }
        CapabilityOp::Pull | CapabilityOp::Order => {
            if !req.durable {
                return Err((
                    RefuseCode::BadRequest,
                    "a capability to read or to order a copy is for a job only (durable)".into(),
                ));
            }
            if req.op == CapabilityOp::Order {
                check_order_scope(req.order.as_ref())?;
            }
            access.check_read(ex).map_err(denied)?;
            let n = req.sources.len();
            if n == 0 || n > longhaul_proto::job::MAX_SOURCES {
                return Err((
                    RefuseCode::BadRequest,
                    format!(
                        "a capability to read names 1 to {} sources, not {n}",
                        longhaul_proto::job::MAX_SOURCES
                    ),
                ));
            }
            for p in &req.sources {
                let r = beneath(&ex.root, p).map_err(bad)?;
                confine(&ex.root, &r).map_err(bad)?;
            }
            Ok(None)
        }
    }
}

/// Whether an order capability's destination is one a copy order could
/// name: a pinned certificate, an address and an export, within the
/// budgets of a job's spec.
fn check_order_scope(
    to: Option<&longhaul_proto::xfer::copy::OrderScope>,
) -> Result<(), (RefuseCode, String)> {
    let bad = |m: String| (RefuseCode::BadRequest, m);
    let to = to.ok_or_else(|| bad("a capability to order a copy names its destination".into()))?;
    crate::net::tls::parse_fingerprint(&to.fingerprint).map_err(bad)?;
    let max = longhaul_proto::job::MAX_PATH;
    if to.target.is_empty()
        || to.dest_export.is_empty()
        || to.target.len() > 300
        || to.dest.len() > max
    {
        return Err(bad(format!(
            "a capability to order a copy names its destination's address (up to 300 bytes), export and path (up to {max} bytes)"
        )));
    }
    Ok(())
}

/// The holder of a capability revokes it: it no longer works, here or
/// after a restart.
pub(super) fn serve_revoke(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    access: &auth::Access,
) -> Result<(), (RefuseCode, String)> {
    let Some(scope) = &access.scope else {
        return Err((
            RefuseCode::BadRequest,
            "only a capability's holder revokes it: this session presents none".into(),
        ));
    };
    shared.capabilities.revoke(&scope.key);
    tracing::info!(
        "{} revoked its capability {}",
        conn.peer(),
        scope_words(&scope.request.export, &scope.request)
    );
    conn.send(&Message::Revoked(Revoked {}))
        .map_err(|e| (RefuseCode::ServerError, e.to_string()))
}

/// A push capability's holder, or a one-shot server's own client (a job
/// server that reached this host over ssh for a push), has the partial
/// files (and journals) of entries it pushed removed: each entry's
/// possible places beneath the destination (the capability's, or the one
/// `Discard::into` names on a one-shot server): into it under their own
/// names, or, unless it was named as a directory, onto it; nothing else
/// and nothing that is not a plain file.
pub(super) fn serve_discard(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    d: &Discard,
    access: &auth::Access,
) -> Result<(), (RefuseCode, String)> {
    if d.paths.len() > DISCARD_MAX {
        return Err((
            RefuseCode::BadRequest,
            format!("a discard names at most {DISCARD_MAX} entries"),
        ));
    }
    let (export, dest, scope) = discard_dest(shared, d, access)?;
    let dest_dir = scope.map_or(dest.ends_with('/'), |s| s.request.dest_dir);
    let ex = super::files::export(shared, &export, access)?;
    if scope.is_none() {
        access
            .check_write(ex)
            .map_err(|m| (RefuseCode::Unauthorized, m))?;
        if ex.read_only {
            return Err((
                RefuseCode::BadRequest,
                format!("export '{}' is read-only", ex.name),
            ));
        }
    }
    let bad = |e: EngineError| (RefuseCode::BadRequest, e.to_string());
    let anchor = Anchor::open_as(&ex.root, Path::new(&ex.name)).map_err(bad)?;
    let dest = anchor
        .resolve_dest(&beneath(&ex.root, &dest).map_err(bad)?)
        .map_err(bad)?;
    let made = match scope {
        Some(s) => s.made.as_deref().map(PathBuf::from),
        None => d
            .into
            .as_ref()
            .and_then(|into| made_on_the_way(&anchor, &ex.root, into)),
    };
    let (removed, dirs) =
        crate::xfer::sink::discard_entries(&anchor, &dest, &d.paths, dest_dir, made.as_deref());
    let beneath_words = match scope {
        Some(s) => scope_words(&ex.name, &s.request),
        None => format!(
            "beneath {}/{}",
            ex.name,
            escaped(&dest.display().to_string())
        ),
    };
    tracing::info!(
        "{} discarded {removed} partial file(s) and {dirs} empty directory(ies) the job made {beneath_words}",
        conn.peer()
    );
    conn.send(&Message::Discarded(Discarded { removed }))
        .map_err(|e| (RefuseCode::ServerError, e.to_string()))
}

/// What a one-shot server's own client says its push made
/// ([`DiscardInto::made`]), relative to the export's root: only a part of
/// the destination's path (at or above it, never the root), its links
/// resolved beneath the root as the destination's are.
fn made_on_the_way(anchor: &Anchor, root: &Path, into: &DiscardInto) -> Option<PathBuf> {
    let made = into.made.as_deref()?;
    let parts = longhaul_proto::xfer::components(made).ok()?;
    let dest = longhaul_proto::xfer::components(&into.dest).ok()?;
    if parts.is_empty() || !dest.starts_with(&parts) {
        return None;
    }
    let resolved = anchor
        .resolve(&beneath(root, &parts.join("/")).ok()?, false)
        .ok()?;
    let rel = resolved.strip_prefix(root).ok()?;
    (rel.components().count() > 0).then(|| rel.to_path_buf())
}

/// Where a discard looks: a live push capability's destination (and its
/// scope), or, from a one-shot server's own client only, the
/// destination its `into` names. Anyone else is refused.
fn discard_dest<'a>(
    shared: &Shared,
    d: &Discard,
    access: &'a auth::Access,
) -> Result<(String, String, Option<&'a Scope>), (RefuseCode, String)> {
    let denied = || {
        (
            RefuseCode::Unauthorized,
            "only a push capability's holder (or a one-shot server's own client) discards what its pushes left".to_string(),
        )
    };
    match (&access.scope, &d.into) {
        (Some(scope), None) if scope.request.op == CapabilityOp::Push => {
            shared
                .capabilities
                .alive(scope)
                .map_err(|m| (RefuseCode::Unauthorized, m))?;
            Ok((
                scope.request.export.clone(),
                scope.request.dest.clone(),
                Some(scope),
            ))
        }
        (None, Some(into)) if shared.cfg.one_time.is_some() => {
            Ok((into.export.clone(), into.dest.clone(), None))
        }
        _ => Err(denied()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a one-shot server's own client says its push made is taken
    /// only as a part of the destination's path beneath the export: never
    /// another place, the export's root, a way out, or a link's name in
    /// place of where it leads.
    #[test]
    fn attacker_a_discards_made_is_only_a_part_of_its_destination() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("real/in")).unwrap();
        std::os::unix::fs::symlink("real", root.join("linked")).unwrap();
        let anchor = Anchor::open_as(&root, Path::new("root")).unwrap();
        let made = |dest: &str, made: &str| {
            let into = DiscardInto {
                export: "root".into(),
                dest: dest.into(),
                made: Some(made.into()),
            };
            made_on_the_way(&anchor, &root, &into)
        };
        assert_eq!(made("a/b/c/", "a/b"), Some(PathBuf::from("a/b")));
        assert_eq!(made("a/b/c/", "a/b/c"), Some(PathBuf::from("a/b/c")));
        assert_eq!(
            made("linked/in/new/", "linked/in/new"),
            Some(PathBuf::from("real/in/new"))
        );
        for (dest, claimed) in [
            ("a/b/c/", "a/x"),
            ("a/b/c/", "a/b/c/d"),
            ("a/b/c/", "ab"),
            ("a/b/c/", ""),
            ("a/b/c/", "."),
            ("a/b/c/", "a/../.."),
            ("a/../../b/", "a"),
            ("a/b/c/", "/a"),
        ] {
            assert_eq!(made(dest, claimed), None, "{dest} {claimed}");
        }
    }

    fn req() -> GrantRequest {
        GrantRequest {
            export: "data".into(),
            dest: "in".into(),
            dest_dir: true,
            lifetime_s: 3600,
            durable: true,
            ..GrantRequest::default()
        }
    }

    fn scope(req: GrantRequest, expires_unix: u64) -> Scope {
        let key = blake3::hash(format!("{expires_unix} {}", req.durable).as_bytes());
        Scope {
            made: None,
            request: req,
            grant: "g1".into(),
            key,
            expires: Instant::now() + Duration::from_secs(60),
            expires_unix,
        }
    }

    /// A job's capability outlives the server: kept as a hash (never the
    /// secret) in a file only the server's user reads, and gone once it
    /// expired or was revoked.
    #[test]
    fn a_jobs_capability_outlives_a_restart_until_it_expires() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let caps = Capabilities::load(Some(dir.path().to_path_buf()));
        let now = unix_now();
        let kept = scope(req(), now + 600);
        let gone = scope(req(), now.saturating_sub(1));
        let brief = scope(
            GrantRequest {
                durable: false,
                ..req()
            },
            now + 600,
        );
        {
            let mut live = caps.live.lock().unwrap();
            for s in [&kept, &gone, &brief] {
                live.insert(s.key, s.clone());
            }
            caps.persist(&live).unwrap();
        }
        let file = dir.path().join(CAPABILITIES_FILE);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(&kept.key.to_hex().to_string()));
        let again = Capabilities::load(Some(dir.path().to_path_buf()));
        let live = again.live.lock().unwrap();
        assert_eq!(live.len(), 1);
        assert_eq!(live[&kept.key].request, kept.request);
        drop(live);
        again.revoke(&kept.key);
        let third = Capabilities::load(Some(dir.path().to_path_buf()));
        assert!(third.live.lock().unwrap().is_empty());
    }

    #[test]
    fn a_damaged_line_is_skipped_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let now = unix_now();
        let good = Record {
            key: blake3::hash(b"x").to_hex().to_string(),
            grant: "g".into(),
            expires: now + 100,
            request: req(),
            made: Some("in/new".into()),
        };
        std::fs::write(
            dir.path().join(CAPABILITIES_FILE),
            format!("not json\n{}\n", serde_json::to_string(&good).unwrap()),
        )
        .unwrap();
        let caps = Capabilities::load(Some(dir.path().to_path_buf()));
        let live = caps.live.lock().unwrap();
        assert_eq!(live.len(), 1);
        // What its pushes made, for a cancel after a restart to tidy.
        let kept = live.values().next().unwrap();
        assert_eq!(kept.made.as_deref(), Some("in/new"));
    }
}
