//! Third-party copies (`longhaul cp A:src B:dst` with both ends remote,
//! PROTOCOL.md 13.9): the messages by which the ordering client gets a
//! capability from the destination and orders the source to push with it,
//! and those by which the source relays the copy back.
//!
//! `CopyRelay` (0x53), which carries a `Refuse`, is in [`crate::msg`].
//!
//! The ordering client carries only these; the data goes from the source
//! to the destination over their own data streams, as in any push.

use serde::{Deserialize, Serialize};

use super::SyncOptions;

/// What every third-party copy capability starts with, so that a scrubber
/// or a person can tell one in a log or a paste, and a server can tell one
/// from a grant's token before it looks anything up.
pub const CAPABILITY_PREFIX: &str = "lh1c_";

/// The longest lifetime a destination gives a capability, seconds.
pub const MAX_LIFETIME_S: u32 = 24 * 3600;

/// The feature of a server that issues capabilities for jobs
/// ([`GrantRequest::durable`], pulls) and takes [`Revoke`] and [`Discard`]
/// (PROTOCOL.md 13.9a).
pub const FEATURE_JOB_GRANTS: &str = "job_grants";

/// What a capability lets its holder do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapabilityOp {
    /// Push into one destination (a third-party copy's, a job's).
    #[default]
    Push,
    /// Read (pull, list) beneath the named sources (a job's).
    Pull,
    /// Order one third-party copy of the named sources to the one
    /// destination of [`GrantRequest::order`] (a job between two other
    /// servers: the job server orders the source), and list beneath them.
    Order,
}

impl CapabilityOp {
    fn is_push(&self) -> bool {
        *self == CapabilityOp::Push
    }
}

/// Client -> destination server (0x50): make a capability for a source
/// server to push into `dest` of `export`, and nowhere else (or, `op`
/// pull, for a job server to read `sources` of `export`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRequest {
    pub export: String,
    /// The destination within the export, as a push's
    /// `TransferRequest.dest` will name it (`""` = the export's root).
    pub dest: String,
    /// The push will name `dest` with a trailing `/`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dest_dir: bool,
    /// How long the capability may be used, seconds (the server gives at
    /// most [`MAX_LIFETIME_S`], and never longer than this session lasts;
    /// a `durable` one at most [`crate::job::MAX_LIFETIME_S`]).
    pub lifetime_s: u32,
    /// For a job: kept (its hash) in the server's state directory, so it
    /// survives the server's restart, and not revoked when this session
    /// ends; revoked by its holder ([`Revoke`]) or its lifetime's end.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub durable: bool,
    #[serde(default, skip_serializing_if = "CapabilityOp::is_push")]
    pub op: CapabilityOp,
    /// `op` pull: the paths within `export` it reads beneath (each one
    /// as a pull's source names it; `dest` and `dest_dir` are unused);
    /// `op` order: the sources its one copy sends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    /// `op` order: where that copy goes, exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<OrderScope>,
}

/// The one destination an order capability's copy goes to: a
/// [`CopyOrder`] presented with it must name these, field for field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderScope {
    /// The destination server, `HOST:PORT`, as the submitting client
    /// reached it.
    pub target: String,
    /// The certificate the submitting client saw there (`SHA256:...`):
    /// the source pins it, so the copy cannot go to another server
    /// answering at that address.
    pub fingerprint: String,
    pub dest_export: String,
    pub dest: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dest_dir: bool,
}

/// A capability's holder -> the server that issued it (0x54): revoke the
/// capability this session presents, now. Answered by [`Revoked`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revoke {}

/// Server -> holder (0x55): the capability no longer works.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revoked {}

/// A push capability's holder -> its destination (0x56): remove the
/// partial files (and journals) of these entries, named as the push
/// announced them; only beneath the capability's destination. A cancelled
/// job's last word to its destination. Also a one-shot server's own
/// client's (a job server that reached that host over ssh), which names
/// the destination in [`Discard::into`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discard {
    pub paths: Vec<String>,
    /// The destination the entries were pushed to: from a one-shot
    /// server's own client only (a capability's holder has its
    /// capability's destination, and names none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub into: Option<DiscardInto>,
}

/// Where a one-shot server's own client pushed the entries it discards:
/// an export of that server and the destination path in it, as the push
/// named them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscardInto {
    pub export: String,
    pub dest: String,
    /// The shallowest part of `dest`'s path that did not exist before the
    /// push (its job looked before it first wrote there): removed, with
    /// the directories beneath it, while they are empty. Taken only when
    /// it is a part of `dest`'s path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made: Option<String>,
}

/// The most paths one [`Discard`] names.
pub const DISCARD_MAX: usize = 4096;

/// Destination -> holder (0x57): partial files and journals removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discarded {
    pub removed: u64,
}

/// Destination server -> client (0x51): the capability, once.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// `lh1c_` and the unpadded base64url of 32 bytes of the OS CSPRNG.
    pub capability: String,
    /// The lifetime the server gave, seconds from now.
    pub lifetime_s: u32,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("lifetime_s", &self.lifetime_s)
            .finish_non_exhaustive()
    }
}

/// The options of the copy that change what the source does, as `cp`
/// took them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyOptions {
    pub recursive: bool,
    #[serde(default)]
    pub preserve: bool,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub mkpath: bool,
    #[serde(default)]
    pub verify: bool,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_in_flight: Option<u64>,
    #[serde(default)]
    pub retries: u32,
    #[serde(default)]
    pub direct: bool,
    #[serde(default)]
    pub no_tune: bool,
    /// Relay each file as it lands (`CopyRelay` `landed`), for the
    /// ordering client's file catalogue.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub catalogue: bool,
    /// `-z`: the source's push compresses at this level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<i32>,
}

/// Client -> source server (0x52): push `sources` of `export` to the
/// destination `target`, pinning `fingerprint`, presenting `capability`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyOrder {
    /// The source server's export the sources are in.
    pub export: String,
    /// Paths within `export`; all with a trailing `/` (their contents) or
    /// none.
    pub sources: Vec<String>,
    /// The destination server, `HOST:PORT` (or `[v6]:PORT`) as the client
    /// reached it.
    pub target: String,
    /// The fingerprint of the certificate the client saw at `target`
    /// (`SHA256:...`): the source pins it.
    pub fingerprint: String,
    /// The destination's capability ([`Grant::capability`]).
    pub capability: String,
    pub dest_export: String,
    pub dest: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dest_dir: bool,
    pub options: CopyOptions,
    /// The destination can only connect out: the source listens and has
    /// it connect back (PROTOCOL.md 13.9), relaying each request to the
    /// client ([`CopyConnectBack`]). Left out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_back: Option<ConnectBackOrder>,
    /// A fleet rank's share (PROTOCOL.md 13.9, "shares"): push these
    /// entries of the sources only, as a local rank pushes its share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<Vec<CopyShareItem>>,
}

/// Where the source listens for the destination's connections back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectBackOrder {
    /// The source's address as the client reached it (an IP, no port):
    /// the source listens there (or, not being its own, on every address
    /// of its family) on a port its kernel chooses.
    pub addr: String,
}

/// Source -> client (`CopyRelay` `connect_back`): have the destination
/// connect to `addr` and send `ticket` (written as the `connect-back` line
/// on the destination's ssh channel). The ticket is a secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyConnectBack {
    /// `ADDR:PORT`: the source's listener.
    pub addr: String,
    /// `lh1b_...`: admits one connection to that listener, once.
    pub ticket: String,
}

impl std::fmt::Debug for CopyConnectBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyConnectBack")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// One entry of a share: an entry beneath one of the order's sources,
/// named by the source and the path beneath it, never by a path of its
/// own. The source derives where it reads it and the name it announces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyShareItem {
    /// The index of its source in [`CopyOrder::sources`].
    pub source: u32,
    /// Its path beneath that source, `/`-separated (`""`: the source
    /// itself); no `..`, no absolute path, no link on the way.
    pub rel: String,
    /// The chunk size the share was cut by (files; 0 otherwise).
    #[serde(default)]
    pub chunk_size: u64,
    /// Chunks `[first, end)` of a file cut in parts (PROTOCOL.md 13.6a).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<[u32; 2]>,
}

impl std::fmt::Debug for CopyOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyOrder")
            .field("export", &self.export)
            .field("sources", &self.sources)
            .field("target", &self.target)
            .field("fingerprint", &self.fingerprint)
            .field("dest_export", &self.dest_export)
            .field("dest", &self.dest)
            .field("dest_dir", &self.dest_dir)
            .field("options", &self.options)
            .field("connect_back", &self.connect_back)
            .field("share", &self.share.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}

/// The source's counters, relayed about once a second.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyProgress {
    pub bytes: u64,
    pub files: u64,
    pub announced_bytes: u64,
    pub announced_files: u64,
    pub walk_done: bool,
}

/// A file landed at the destination, relayed by the source when the order
/// asked for it ([`CopyOptions::catalogue`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyLanded {
    /// The file as the transfer named it (its root's name first).
    pub path: String,
    /// Where it was read: its path within the source's export.
    pub source: String,
    /// Where it landed: `TARGET:EXPORT/path`, the destination as the
    /// order named it.
    pub dest: String,
    pub size: u64,
    pub mtime_ns: i64,
    /// Its BLAKE3 (hex), when the copy computed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

pub use super::report::CopyReport;

/// Whether a push request stays within a capability's scope: to the
/// export, the destination and its trailing `/` the capability was made
/// for, and nothing else.
pub fn within_scope(scope: &GrantRequest, t: &super::TransferRequest) -> Result<(), String> {
    if scope.op == CapabilityOp::Order {
        return Err(
            "a job's order capability orders its one copy and lists its sources: it neither pushes nor pulls"
                .into(),
        );
    }
    if scope.op == CapabilityOp::Pull {
        return within_read_scope(scope, t.op == super::Op::Pull, &t.export, &t.sources);
    }
    if t.op != super::Op::Push {
        return Err("a third-party copy capability only pushes: it cannot read".into());
    }
    if t.export != scope.export || t.dest != scope.dest || t.dest_dir != scope.dest_dir {
        return Err(format!(
            "this third-party copy capability is for {}/{} only, not {}/{}",
            scope.export, scope.dest, t.export, t.dest
        ));
    }
    Ok(())
}

/// Whether a read (a pull of `sources`, or a listing of one path) stays
/// within a pull capability's scope: its export, and every path beneath
/// (or at) one of its sources, component by component.
pub fn within_read_scope(
    scope: &GrantRequest,
    pull: bool,
    export: &str,
    paths: &[String],
) -> Result<(), String> {
    if !pull {
        return Err("a job's read capability only reads: it cannot write".into());
    }
    let parts = |p: &str| -> Option<Vec<String>> {
        super::components(p.trim_end_matches('/'))
            .ok()
            .map(|c| c.into_iter().map(String::from).collect())
    };
    let scopes: Vec<Vec<String>> = scope.sources.iter().filter_map(|s| parts(s)).collect();
    let inside = |p: &String| {
        parts(p).is_some_and(|c| {
            scopes
                .iter()
                .any(|s| c.len() >= s.len() && c[..s.len()] == s[..])
        })
    };
    if export != scope.export || paths.is_empty() || !paths.iter().all(inside) {
        return Err(format!(
            "this job's capability reads {}/{{{}}} only",
            scope.export,
            scope.sources.join(", ")
        ));
    }
    Ok(())
}

/// Whether a copy order stays within an order capability's scope: its
/// export, sources beneath the capability's (as a read), and the
/// destination (address, certificate, export, path, trailing `/`) the
/// capability names, exactly; never a connection back or a share.
pub fn within_order_scope(scope: &GrantRequest, o: &CopyOrder) -> Result<(), String> {
    let Some(to) = scope
        .order
        .as_ref()
        .filter(|_| scope.op == CapabilityOp::Order)
    else {
        return Err("this capability orders no copy".into());
    };
    within_read_scope(scope, true, &o.export, &o.sources)?;
    let same = o.target == to.target
        && o.fingerprint == to.fingerprint
        && o.dest_export == to.dest_export
        && o.dest == to.dest
        && o.dest_dir == to.dest_dir;
    if !same {
        return Err(format!(
            "this job's capability orders a copy to {} {}/{} only",
            to.target, to.dest_export, to.dest
        ));
    }
    if o.connect_back.is_some() || o.share.is_some() {
        return Err("a job's ordered copy is dialled by its source, whole".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordered() -> (GrantRequest, CopyOrder) {
        let to = OrderScope {
            target: "198.18.0.2:5310".into(),
            fingerprint: "SHA256:b".into(),
            dest_export: "in".into(),
            dest: "run7".into(),
            dest_dir: true,
        };
        let scope = GrantRequest {
            export: "data".into(),
            op: CapabilityOp::Order,
            sources: vec!["tree".into()],
            order: Some(to.clone()),
            durable: true,
            ..GrantRequest::default()
        };
        let order = CopyOrder {
            export: "data".into(),
            sources: vec!["tree".into()],
            target: to.target,
            fingerprint: to.fingerprint,
            capability: "lh1c_b".into(),
            dest_export: to.dest_export,
            dest: to.dest,
            dest_dir: true,
            options: CopyOptions::default(),
            connect_back: None,
            share: None,
        };
        (scope, order)
    }

    /// The attacker holds an order capability (a job server's database
    /// stolen): it orders its one copy, and no copy of anything else or
    /// to anywhere else; it neither pushes nor pulls.
    #[test]
    fn an_order_capability_orders_its_one_copy_and_nothing_wider() {
        let (scope, order) = ordered();
        assert!(within_order_scope(&scope, &order).is_ok());
        let mut beneath = order.clone();
        beneath.sources = vec!["tree/sub".into()];
        assert!(within_order_scope(&scope, &beneath).is_ok());
        let widened: Vec<fn(&mut CopyOrder)> = vec![
            |o| o.sources = vec!["secret".into()],
            |o| o.sources = vec!["tree/../secret".into()],
            |o| o.sources = vec!["tree".into(), "secret".into()],
            |o| o.export = "other".into(),
            |o| o.target = "203.0.113.9:5310".into(),
            |o| o.fingerprint = "SHA256:attacker".into(),
            |o| o.dest_export = "out".into(),
            |o| o.dest = "elsewhere".into(),
            |o| o.dest_dir = false,
            |o| {
                o.connect_back = Some(ConnectBackOrder {
                    addr: "203.0.113.9".into(),
                })
            },
            |o| o.share = Some(Vec::new()),
        ];
        for (n, widen) in widened.iter().enumerate() {
            let mut o = order.clone();
            widen(&mut o);
            assert!(
                within_order_scope(&scope, &o).is_err(),
                "widening {n}: {o:?}"
            );
        }
        for op in [CapabilityOp::Push, CapabilityOp::Pull] {
            let other = GrantRequest {
                op,
                ..scope.clone()
            };
            assert!(within_order_scope(&other, &order).is_err(), "{op:?}");
        }
    }

    #[test]
    fn a_read_outside_a_pull_capability_is_refused() {
        let scope = GrantRequest {
            export: "data".into(),
            op: CapabilityOp::Pull,
            sources: vec!["tree".into(), "one/file".into()],
            ..GrantRequest::default()
        };
        let ok = |paths: &[&str]| {
            let p: Vec<String> = paths.iter().map(|s| s.to_string()).collect();
            within_read_scope(&scope, true, "data", &p).is_ok()
        };
        assert!(ok(&["tree"]));
        assert!(ok(&["tree/"]));
        assert!(ok(&["tree/a/b", "one/file"]));
        assert!(!ok(&[]));
        assert!(!ok(&["treehouse"]));
        assert!(!ok(&["tree/../secret"]));
        assert!(!ok(&["one"]));
        assert!(!ok(&[""]));
        assert!(!ok(&["/etc/passwd"]));
        assert!(within_read_scope(&scope, false, "data", &["tree".into()]).is_err());
        assert!(within_read_scope(&scope, true, "other", &["tree".into()]).is_err());
    }

    #[test]
    fn the_debug_forms_hide_the_capability() {
        let g = Grant {
            capability: "lh1c_secretsecret".into(),
            lifetime_s: 60,
        };
        assert!(!format!("{g:?}").contains("secret"));
        let o = CopyOrder {
            export: "data".into(),
            sources: vec!["a".into()],
            target: "127.0.0.1:5310".into(),
            fingerprint: "SHA256:x".into(),
            capability: "lh1c_secretsecret".into(),
            dest_export: "data".into(),
            dest: "b".into(),
            dest_dir: false,
            options: CopyOptions::default(),
            connect_back: None,
            share: None,
        };
        assert!(!format!("{o:?}").contains("secret"));
        let c = CopyConnectBack {
            addr: "127.0.0.1:1".into(),
            ticket: "lh1b_secretsecret".into(),
        };
        assert!(!format!("{c:?}").contains("secret"));
    }

    #[test]
    fn a_push_outside_the_scope_is_refused() {
        let scope = GrantRequest {
            export: "data".into(),
            dest: "in/here".into(),
            dest_dir: true,
            lifetime_s: 60,
            ..GrantRequest::default()
        };
        let mut t = super::super::TransferRequest {
            op: super::super::Op::Push,
            export: "data".into(),
            dest: "in/here".into(),
            sources: vec![],
            source_count: 1,
            recursive: true,
            preserve: false,
            streams: 1,
            chunk_size: None,
            force: false,
            sync: None,
            dry_run: false,
            verify: false,
            contents: false,
            dest_dir: true,
            mkpath: false,
            direct: false,
            tuning: Default::default(),
            bundles: false,
            parts: false,
            sealed: false,
            source_dir: false,
            filter: Vec::new(),
            compress: None,
            defer_full: false,
            tag_checks: false,
        };
        assert!(within_scope(&scope, &t).is_ok());
        type Change = fn(&mut super::super::TransferRequest);
        let changes: [Change; 6] = [
            |t| t.dest = "in".into(),
            |t| t.dest = "in/here/../../x".into(),
            |t| t.dest = "in/here/deeper".into(),
            |t| t.export = "other".into(),
            |t| t.dest_dir = false,
            |t| t.op = super::super::Op::Pull,
        ];
        for f in changes {
            let mut u = t.clone();
            f(&mut u);
            assert!(within_scope(&scope, &u).is_err(), "{u:?}");
        }
        t.sources = vec!["x".into()];
        assert!(within_scope(&scope, &t).is_ok());
        // A job's order capability for the same export neither pushes
        // there nor pulls its own sources.
        let (order_scope, _) = ordered();
        assert!(within_scope(&order_scope, &t).is_err());
        t.op = super::super::Op::Pull;
        t.sources = vec!["tree".into()];
        assert!(within_scope(&order_scope, &t).is_err());
    }
}
