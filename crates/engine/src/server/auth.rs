//! Who may do what on a server: grants, kept in its state directory
//! (`grants`, one JSON object a line), each naming the exports it opens
//! (read-only or read-write) and how its holder proves itself: a token
//! (only its BLAKE3 hash is stored; the secret is printed once, at
//! creation) or a client certificate's fingerprint (mutual TLS).
//!
//! The file is read at every authentication, so `longhaul token revoke`
//! takes effect for the next connection without a restart. Every change
//! (create, add, revoke) reads, changes and rewrites the file while holding
//! an exclusive `flock` on `grants.lock` beside it, and replaces it by a
//! synced temporary file renamed into place: concurrent `token create`s all
//! land, and a reader sees the old file or the new one, never half. A grant
//! is never replaced: a new one gets an id no grant has, and adding a token
//! whose id is taken is refused. Without a
//! grant a client is anonymous: it may read exports marked `:public` and
//! run perf tests if the server allows it (`--public-perf`), nothing else.

use std::path::{Path, PathBuf};

use longhaul_proto::tokenproof;
use longhaul_proto::units::escaped;
use longhaul_proto::xfer::copy::GrantRequest;
use serde::{Deserialize, Serialize};
use std::time::Instant;

use crate::state::{make_state_dir, named_state_dir};
use crate::xfer::beneath::Anchor;
use crate::xfer::{beneath, Export};
use crate::EngineError;

const GRANTS_FILE: &str = "grants";
const LOCK_FILE: &str = "grants.lock";
const TOKEN_PREFIX: &str = "lh1";

/// One export a grant opens; `name` `*` stands for every export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportGrant {
    pub name: String,
    pub write: bool,
}

/// Parses `NAME[:ro|:rw]` (read-only unless `:rw`).
pub fn parse_export_grant(s: &str) -> Result<ExportGrant, String> {
    let (name, write) = match s.rsplit_once(':') {
        Some((n, "rw")) => (n, true),
        Some((n, "ro")) => (n, false),
        Some((_, other)) => {
            return Err(format!(
                "'{s}': the access after ':' must be ro or rw, not '{other}'"
            ))
        }
        None => (s, false),
    };
    if name.is_empty() || name.contains('/') {
        return Err(format!("'{s}': name an export (or * for all)"));
    }
    Ok(ExportGrant {
        name: name.to_string(),
        write,
    })
}

/// A stored grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub id: String,
    /// BLAKE3 (hex) of the token, for a token grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_hash: Option<String>,
    /// Fingerprint of a client certificate, for a mutual-TLS grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<String>,
    pub exports: Vec<ExportGrant>,
    /// Seconds since the epoch.
    pub created: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// What a capability allows, and until when.
#[derive(Clone, PartialEq, Eq)]
pub struct Scope {
    /// The export, destination and trailing `/` of the one push allowed
    /// (or, `op` pull, the sources a job reads).
    pub request: GrantRequest,
    /// The grant of the client that asked for it (for logs and observers).
    pub grant: String,
    pub(super) key: blake3::Hash,
    pub(super) expires: Instant,
    /// The same, in Unix seconds (what the state directory keeps).
    pub(super) expires_unix: u64,
    /// A job's push: the shallowest directory on the way to its
    /// destination that did not exist when the capability was issued
    /// (export-relative), which a discard removes, with the directories
    /// beneath it, while they are empty.
    pub(super) made: Option<String>,
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("request", &self.request)
            .field("grant", &self.grant)
            .finish_non_exhaustive()
    }
}

/// What an authenticated (or anonymous) client may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// For logs: `token ID`, `client certificate ID` or `anonymous`.
    pub who: String,
    /// The grant's id; None for anonymous (and open) access.
    pub grant: Option<String>,
    pub perf: bool,
    exports: Vec<ExportGrant>,
    anonymous: bool,
    /// A third-party copy's capability ([`super::copy`]): one push into
    /// one destination, nothing else, while the capability lives.
    pub scope: Option<Scope>,
}

impl Access {
    /// Everything (a server without authentication, used by the demo).
    pub fn everything(who: &str) -> Access {
        Access {
            who: who.to_string(),
            grant: None,
            perf: true,
            exports: vec![ExportGrant {
                name: "*".into(),
                write: true,
            }],
            anonymous: false,
            scope: None,
        }
    }

    /// The holder of a third-party copy capability: write access to the
    /// one export of its scope, and (checked at each request) only a push
    /// into its destination while it lives.
    pub fn capability(scope: Scope) -> Access {
        let push = scope.request.op == longhaul_proto::xfer::copy::CapabilityOp::Push;
        Access {
            who: format!(
                "a {} capability for {}",
                if scope.request.durable {
                    "job's"
                } else {
                    "third-party copy"
                },
                scope.grant
            ),
            grant: Some(scope.grant.clone()),
            perf: false,
            exports: vec![ExportGrant {
                name: scope.request.export.clone(),
                write: push,
            }],
            anonymous: false,
            scope: Some(scope),
        }
    }

    pub fn anonymous(public_perf: bool) -> Access {
        Access {
            who: "anonymous".into(),
            grant: None,
            perf: public_perf,
            exports: Vec::new(),
            anonymous: true,
            scope: None,
        }
    }

    pub fn is_anonymous(&self) -> bool {
        self.anonymous
    }

    /// What observers are told of this client's grant: its id, or
    /// `anonymous`.
    pub fn grant_label(&self) -> &str {
        self.grant.as_deref().unwrap_or(super::observe::ANONYMOUS)
    }

    fn grant_for(&self, export: &str) -> Option<&ExportGrant> {
        self.exports
            .iter()
            .filter(|g| g.name == export || g.name == "*")
            .max_by_key(|g| g.write)
    }

    /// May this client read `e`? Explains the refusal if not.
    pub fn check_read(&self, e: &Export) -> Result<(), String> {
        if e.public || self.grant_for(&e.name).is_some() {
            return Ok(());
        }
        Err(self.denied(&e.name, "read"))
    }

    /// May this client write to `e` (the export's own `:ro` is checked apart)?
    pub fn check_write(&self, e: &Export) -> Result<(), String> {
        if self.grant_for(&e.name).is_some_and(|g| g.write) {
            return Ok(());
        }
        Err(self.denied(&e.name, "write to"))
    }

    fn denied(&self, export: &str, what: &str) -> String {
        if self.anonymous {
            format!(
                "authentication required to {what} export '{export}': pass --token-file FILE or set LONGHAUL_TOKEN (the server's admin makes one with `longhaul token create`)"
            )
        } else {
            format!("{} may not {what} export '{export}'", self.who)
        }
    }
}

fn grants_path(state: &Path) -> PathBuf {
    state.join(GRANTS_FILE)
}

/// Every grant in a state directory (none if the file is missing).
pub fn list(state: &Path) -> Result<Vec<Grant>, EngineError> {
    let p = grants_path(state);
    let text = match crate::state::read_credential(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(EngineError::Usage(format!(
                "cannot read {}: {e}",
                p.display()
            )))
        }
    };
    parse_grants(&text).map_err(|e| EngineError::Usage(format!("{}: {e}", p.display())))
}

/// Parses the text of a grants file.
pub fn parse_grants(text: &str) -> Result<Vec<Grant>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

/// An exclusive lock on the grants of a state directory, held until drop
/// (closing the descriptor releases it, also when the process dies).
struct GrantsLock {
    _file: std::fs::File,
}

impl GrantsLock {
    fn take(state: &Path) -> Result<GrantsLock, EngineError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let p = state.join(LOCK_FILE);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p)
            .map_err(|e| EngineError::Usage(format!("cannot open {}: {e}", p.display())))?;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(GrantsLock { _file: f });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(EngineError::Usage(format!(
                    "cannot lock {}: {e}",
                    p.display()
                )));
            }
        }
    }
}

/// Reads the grants, lets `change` edit them, and stores the result if it
/// differs, all under the lock: no concurrent change is lost. The state
/// directory is made if `create`, else it must exist.
fn update<T>(
    state: &Path,
    create: bool,
    change: impl FnOnce(&mut Vec<Grant>) -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    named_state_dir(state)?;
    if create {
        make_state_dir(state)?;
    } else if !state.is_dir() {
        return Err(EngineError::Usage(format!(
            "no state directory at {}: check the path (--state-dir)",
            state.display()
        )));
    }
    let lock = GrantsLock::take(state)?;
    let before = list(state)?;
    let mut all = before.clone();
    let out = change(&mut all)?;
    if all != before {
        store(state, &all)?;
    }
    drop(lock);
    Ok(out)
}

fn store(state: &Path, grants: &[Grant]) -> Result<(), EngineError> {
    let mut text = String::new();
    for g in grants {
        text.push_str(&serde_json::to_string(g).expect("grants serialize"));
        text.push('\n');
    }
    crate::state::replace_private(state, GRANTS_FILE, text.as_bytes()).map_err(EngineError::Usage)
}

/// A grant id no grant in `all` has (8 hex digits).
fn unused_id(all: &[Grant]) -> String {
    loop {
        let id = longhaul_proto::units::hex(&random_bytes::<4>());
        if !all.iter().any(|g| g.id == id) {
            return id;
        }
    }
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the OS random source");
    b
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn token_hash(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

/// Makes a token grant; returns it and the secret token (shown once).
pub fn create_token(
    state: &Path,
    exports: Vec<ExportGrant>,
    note: &str,
) -> Result<(Grant, String), EngineError> {
    use base64::Engine as _;
    update(state, true, |all| {
        let id = unused_id(all);
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes::<32>());
        let token = format!("{TOKEN_PREFIX}_{id}_{secret}");
        let g = Grant {
            id,
            token_hash: Some(token_hash(&token)),
            client_cert: None,
            exports,
            created: now_secs(),
            note: note.to_string(),
        };
        all.push(g.clone());
        Ok((g, token))
    })
}

/// Grants a token made elsewhere (`lh1_ID_SECRET`, a secret of at least
/// 32 characters): for provisioning the same credential on many servers.
///
/// Granting the same token with the same exports again changes nothing;
/// a token whose id another grant holds is refused, never put in its
/// place.
pub fn add_token(
    state: &Path,
    token: &str,
    exports: Vec<ExportGrant>,
    note: &str,
) -> Result<Grant, EngineError> {
    let id = token
        .strip_prefix(TOKEN_PREFIX)
        .and_then(|r| r.strip_prefix('_'))
        .and_then(|r| r.split_once('_'))
        .filter(|(id, secret)| !id.is_empty() && secret.len() >= 32)
        .map(|(id, _)| id.to_string())
        .ok_or_else(|| {
            EngineError::Usage(format!(
                "a token looks like {TOKEN_PREFIX}_ID_SECRET with a secret of 32 or more characters"
            ))
        })?;
    let g = Grant {
        id,
        token_hash: Some(token_hash(token)),
        client_cert: None,
        exports,
        created: now_secs(),
        note: note.to_string(),
    };
    update(state, true, |all| {
        if let Some(old) = all.iter().find(|o| o.id == g.id) {
            if old.token_hash == g.token_hash && old.exports == g.exports {
                return Ok(old.clone());
            }
            return Err(EngineError::Usage(format!(
                "a grant with id {} exists already in {}: revoke it first (`longhaul token revoke {}`) or use a token with another id",
                g.id,
                grants_path(state).display(),
                g.id
            )));
        }
        all.push(g.clone());
        Ok(g)
    })
}

/// Makes a grant for a client certificate, known by its fingerprint;
/// refused if that certificate has a grant already.
pub fn create_cert_grant(
    state: &Path,
    fingerprint: &str,
    exports: Vec<ExportGrant>,
    note: &str,
) -> Result<Grant, EngineError> {
    update(state, true, |all| {
        if let Some(old) = all
            .iter()
            .find(|g| g.client_cert.as_deref() == Some(fingerprint))
        {
            return Err(EngineError::Usage(format!(
                "the client certificate {fingerprint} has grant {} already: revoke it first (`longhaul token revoke {}`) to change what it opens",
                old.id, old.id
            )));
        }
        let g = Grant {
            id: unused_id(all),
            token_hash: None,
            client_cert: Some(fingerprint.to_string()),
            exports,
            created: now_secs(),
            note: note.to_string(),
        };
        all.push(g.clone());
        Ok(g)
    })
}

/// Removes a grant; false if there was none with that id.
pub fn revoke(state: &Path, id: &str) -> Result<bool, EngineError> {
    update(state, false, |all| {
        let before = all.len();
        all.retain(|g| g.id != id);
        Ok(all.len() != before)
    })
}

const UNKNOWN_TOKEN: &str =
    "unknown or revoked token: get a new one from the server's admin (`longhaul token create`)";

/// Why a proof of the kind clients sent before challenges (`lh1p_...` in
/// the hello) is refused.
pub const OLD_PROOF: &str = "this client sent a token proof of the old kind (lh1p), which can be replayed: it is refused; upgrade the client (it then answers this server's challenge), or use TLS";

fn token_access(g: &Grant, how: &str) -> Access {
    Access {
        who: format!("{how} {}", g.id),
        grant: Some(g.id.clone()),
        perf: true,
        exports: g.exports.clone(),
        anonymous: false,
        scope: None,
    }
}

fn read_grants(state: &Path) -> Result<Vec<Grant>, String> {
    list(state).map_err(|e| {
        tracing::error!("cannot read grants: {e}");
        "the server cannot read its grants; ask its admin".to_string()
    })
}

/// Decides who a plaintext client is from its proof of the token of grant
/// `token_id` for this connection's `challenge`
/// ([`longhaul_proto::tokenproof`]). A proof that does not check out, or
/// names no token grant, is an error, not a fall-back to anonymous access;
/// the message is the same whether the grant exists or not.
pub fn authenticate_proof(
    state: &Path,
    token_id: &str,
    challenge: &[u8; tokenproof::CHALLENGE_LEN],
    proof: &str,
) -> Result<Access, String> {
    let grants = read_grants(state)?;
    let found = grants.iter().find(|g| {
        g.id == token_id
            && g.token_hash
                .as_deref()
                .and_then(|h| blake3::Hash::from_hex(h).ok())
                .is_some_and(|h| tokenproof::verify(h.as_bytes(), token_id, challenge, proof))
    });
    match found {
        Some(g) => Ok(token_access(g, "token proof")),
        None => Err(format!(
            "the proof of token {token_id} does not answer this connection's challenge: a replayed proof, or an {UNKNOWN_TOKEN}"
        )),
    }
}

/// Decides who a client is, from the token it sent and the certificate
/// it presented. A token that is wrong or revoked is an error, not a
/// fall-back to anonymous access.
pub fn authenticate(
    state: &Path,
    token: Option<&str>,
    client_cert: Option<&str>,
    public_perf: bool,
) -> Result<Access, String> {
    let grants = read_grants(state)?;
    let access = token_access;
    if token.is_some_and(|t| t.starts_with(tokenproof::OLD_PROOF_PREFIX)) {
        return Err(OLD_PROOF.into());
    }
    if let Some(t) = token {
        let id = t
            .strip_prefix(TOKEN_PREFIX)
            .and_then(|r| r.strip_prefix('_'))
            .and_then(|r| r.split_once('_'))
            .map(|(id, _)| id);
        let hash = blake3::hash(t.as_bytes());
        let found = grants.iter().find(|g| {
            Some(g.id.as_str()) == id
                && g.token_hash
                    .as_deref()
                    .and_then(|h| blake3::Hash::from_hex(h).ok())
                    .is_some_and(|h| h == hash)
        });
        return match found {
            Some(g) => Ok(access(g, "token")),
            None => Err(UNKNOWN_TOKEN.into()),
        };
    }
    if let Some(fp) = client_cert {
        if let Some(g) = grants.iter().find(|g| g.client_cert.as_deref() == Some(fp)) {
            return Ok(access(g, "client certificate"));
        }
    }
    Ok(Access::anonymous(public_perf))
}

/// Whether what a read capability's session reads stays within its scope
/// once the links on the way are followed: each of `read` (a path as
/// named, and as [`Anchor::resolve`] resolved it beneath the export's
/// `root`) beneath one of the capability's sources, as named or as
/// resolved. Its sources are checked as named at each request
/// ([`within_scope`]); this keeps a link inside them from leading to the
/// rest of the export. Ok for any other session.
pub(super) fn reads_within(
    access: &Access,
    anchor: &Anchor,
    root: &Path,
    read: &[(&str, &Path)],
) -> Result<(), String> {
    use longhaul_proto::xfer::copy::CapabilityOp;
    let Some(scope) = access
        .scope
        .as_ref()
        .filter(|s| s.request.op != CapabilityOp::Push)
    else {
        return Ok(());
    };
    let mut inside = Vec::new();
    for s in &scope.request.sources {
        let Ok(named) = beneath(root, s.trim_end_matches('/')) else {
            continue;
        };
        if let Ok(r) = anchor.resolve(&named, true) {
            inside.push(r);
        }
        inside.push(named);
    }
    match read
        .iter()
        .find(|(_, r)| !inside.iter().any(|s| r.starts_with(s)))
    {
        Some((named, _)) => Err(format!(
            "{}/{} leads outside what this job's capability reads ({}/{{{}}}) through a symbolic link: name the path the link leads to in the job",
            scope.request.export,
            escaped(named),
            scope.request.export,
            escaped(&scope.request.sources.join(", "))
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lh-auth-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn export(name: &str, public: bool) -> Export {
        Export {
            name: name.into(),
            root: "/nonexistent".into(),
            read_only: public,
            public,
        }
    }

    /// The grants hold each token's hash, which proves the token on
    /// plaintext: grants others may read are refused until `chmod 600`.
    #[test]
    fn attacker_grants_others_can_read_are_refused_until_chmod_600() {
        use std::os::unix::fs::PermissionsExt;
        let s = state("open-grants");
        let (_, token) = create_token(&s, vec![parse_export_grant("data").unwrap()], "t").unwrap();
        let file = s.join(GRANTS_FILE);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = list(&s).unwrap_err().to_string();
        assert!(e.contains(&format!("chmod 600 {}", file.display())), "{e}");
        assert!(authenticate(&s, Some(&token), None, false).is_err());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(list(&s).unwrap().len(), 1);
        assert!(authenticate(&s, Some(&token), None, false).is_ok());
        let _ = std::fs::remove_dir_all(&s);
    }

    #[test]
    fn tokens_authenticate_until_revoked() {
        let s = state("tokens");
        let (g, token) = create_token(
            &s,
            vec![
                parse_export_grant("data:rw").unwrap(),
                parse_export_grant("arch").unwrap(),
            ],
            "test",
        )
        .unwrap();
        assert!(token.starts_with("lh1_"));
        // Only the hash is stored.
        let stored = std::fs::read_to_string(s.join(GRANTS_FILE)).unwrap();
        assert!(!stored.contains(token.rsplit('_').next().unwrap()));
        let a = authenticate(&s, Some(&token), None, false).unwrap();
        assert!(a.perf && !a.is_anonymous());
        assert!(a.check_write(&export("data", false)).is_ok());
        assert!(a.check_read(&export("arch", false)).is_ok());
        assert!(a.check_write(&export("arch", false)).is_err());
        assert!(a.check_read(&export("other", false)).is_err());
        // A token one character off is refused, not anonymous.
        let mut bad = token.clone();
        bad.pop();
        bad.push(if token.ends_with('A') { 'B' } else { 'A' });
        assert!(authenticate(&s, Some(&bad), None, true).is_err());
        assert!(authenticate(&s, Some("garbage"), None, true).is_err());
        assert!(revoke(&s, &g.id).unwrap());
        assert!(!revoke(&s, &g.id).unwrap());
        assert!(authenticate(&s, Some(&token), None, false).is_err());
        std::fs::remove_dir_all(&s).unwrap();
    }

    #[test]
    fn a_proof_lets_in_for_its_challenge_only_and_old_proofs_never() {
        let s = state("proofs");
        let (g, token) = create_token(&s, vec![parse_export_grant("d").unwrap()], "").unwrap();
        let (c1, c2) = ([1u8; 32], [2u8; 32]);
        let p = tokenproof::prove(&token, &c1).unwrap();
        let a = authenticate_proof(&s, &g.id, &c1, &p).unwrap();
        assert_eq!(a.grant.as_deref(), Some(g.id.as_str()));
        assert!(a.who.starts_with("token proof"));
        // Another connection's challenge; another grant's id; garbage.
        let e = authenticate_proof(&s, &g.id, &c2, &p).unwrap_err();
        assert!(e.contains("challenge"), "{e}");
        assert_eq!(
            authenticate_proof(&s, "00000000", &c1, &p).unwrap_err(),
            e.replace(&g.id, "00000000"),
            "an unknown id must read as a wrong proof"
        );
        assert!(authenticate_proof(&s, &g.id, &c1, "zz").is_err());
        // Revoked: its proofs go with it.
        let old = format!("lh1p_{}_1_{}_{}", g.id, "0".repeat(32), "0".repeat(64));
        assert_eq!(
            authenticate(&s, Some(&old), None, true),
            Err(OLD_PROOF.into())
        );
        revoke(&s, &g.id).unwrap();
        assert!(authenticate_proof(&s, &g.id, &c1, &p).is_err());
        std::fs::remove_dir_all(&s).unwrap();
    }

    #[test]
    fn anonymous_reads_public_exports_only() {
        let s = state("anon");
        let a = authenticate(&s, None, None, false).unwrap();
        assert!(a.is_anonymous() && !a.perf);
        assert!(a.check_read(&export("pub", true)).is_ok());
        assert!(a.check_write(&export("pub", true)).is_err());
        let e = a.check_read(&export("data", false)).unwrap_err();
        assert!(e.contains("--token-file"), "{e}");
        assert!(authenticate(&s, None, None, true).unwrap().perf);
    }

    #[test]
    fn client_certificates_are_known_by_fingerprint() {
        let s = state("certs");
        let fp = "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
        create_cert_grant(&s, fp, vec![parse_export_grant("*:rw").unwrap()], "").unwrap();
        let a = authenticate(&s, None, Some(fp), false).unwrap();
        assert!(a.check_write(&export("anything", false)).is_ok());
        let other = authenticate(&s, None, Some("SHA256:other"), false).unwrap();
        assert!(other.is_anonymous());
        std::fs::remove_dir_all(&s).unwrap();
    }

    #[test]
    fn export_grant_syntax() {
        assert_eq!(
            parse_export_grant("d").unwrap(),
            ExportGrant {
                name: "d".into(),
                write: false
            }
        );
        assert!(parse_export_grant("d:rw").unwrap().write);
        assert!(parse_export_grant("d:wx").is_err());
        assert!(parse_export_grant(":rw").is_err());
    }

    #[test]
    fn concurrent_changes_all_land() {
        let s = state("concurrent");
        let made: Vec<Grant> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..16)
                .map(|i| {
                    let s = &s;
                    sc.spawn(move || {
                        create_token(s, vec![parse_export_grant("d").unwrap()], &format!("{i}"))
                            .unwrap()
                            .0
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let stored = list(&s).unwrap();
        assert_eq!(stored.len(), 16, "{stored:?}");
        for g in &made {
            assert!(stored.contains(g), "grant {} lost", g.id);
        }
        std::fs::remove_dir_all(&s).unwrap();
    }

    #[test]
    fn a_taken_id_is_refused_never_replaced() {
        let s = state("taken");
        let first = "lh1_0badc0de_firstsecret-firstsecret-firstsecret-0";
        let g = add_token(&s, first, vec![parse_export_grant("d").unwrap()], "").unwrap();
        // The same token again: nothing changes.
        let again = add_token(&s, first, vec![parse_export_grant("d").unwrap()], "x").unwrap();
        assert_eq!(again, g);
        // Another secret, or other exports, under the same id: refused.
        let other = "lh1_0badc0de_othersecret-othersecret-othersecret-0";
        let e = add_token(&s, other, vec![parse_export_grant("*:rw").unwrap()], "")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("0badc0de") && e.contains("exists already"),
            "{e}"
        );
        let e = add_token(&s, first, vec![parse_export_grant("*:rw").unwrap()], "").unwrap_err();
        assert!(e.to_string().contains("revoke it first"), "{e}");
        assert_eq!(list(&s).unwrap(), vec![g]);
        assert!(authenticate(&s, Some(first), None, false).is_ok());
        assert!(authenticate(&s, Some(other), None, false).is_err());
        // A certificate has one grant.
        let fp = "SHA256:BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";
        create_cert_grant(&s, fp, vec![parse_export_grant("d").unwrap()], "").unwrap();
        let e =
            create_cert_grant(&s, fp, vec![parse_export_grant("*:rw").unwrap()], "").unwrap_err();
        assert!(e.to_string().contains("already"), "{e}");
        assert_eq!(list(&s).unwrap().len(), 2);
        std::fs::remove_dir_all(&s).unwrap();
    }

    #[test]
    fn revoke_in_a_missing_state_directory_creates_nothing() {
        let s = state("missing");
        let e = revoke(&s, "0badc0de").unwrap_err();
        assert!(e.to_string().contains("no state directory"), "{e}");
        assert!(!s.exists());
    }
}
