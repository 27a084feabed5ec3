//! The server's side of file transfers: `cp` and `sync` pushed into or
//! pulled from an export, `ls` of an export, and the storage probe of
//! `longhaul doctor`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::msg::*;
use longhaul_proto::units::escaped;
use longhaul_proto::xfer::{
    Kind, ListEntry, ListRequest, Listing, Op, TransferAccept, TransferRequest,
};

use super::observe::{Outcome, RunKind};
use super::slots::register;
use super::{auth, peer_ip, Shared};
use crate::net::conn::FramedConn;
use crate::net::sock;
use crate::xfer::beneath::Anchor;
use crate::xfer::sink::{prepare_dest, run_sink, SinkConfig};
use crate::xfer::source::{run_source, SourceConfig};
use crate::xfer::storage::Storage;
use crate::xfer::{beneath, kind_of, mtime_ns, Export};
use crate::EngineError;

/// Why a transfer did not happen.
pub(super) enum Refusal {
    /// Refused before anything moved: the client is told why.
    Refuse(RefuseCode, String),
    /// Failed after it started.
    Failed(EngineError),
}

pub(super) fn export<'a>(
    shared: &'a Shared,
    name: &str,
    access: &auth::Access,
) -> Result<&'a Export, (RefuseCode, String)> {
    shared.cfg.exports.iter().find(|e| e.name == name).ok_or_else(|| {
        // Only the names this client may see.
        let names: Vec<&str> = shared
            .cfg
            .exports
            .iter()
            .filter(|e| access.check_read(e).is_ok())
            .map(|e| e.name.as_str())
            .collect();
        (
            RefuseCode::BadRequest,
            if names.is_empty() {
                format!("no export named '{name}': this server exports nothing (start it with --export NAME=PATH)")
            } else {
                format!("no export named '{name}': this server exports {}", names.join(", "))
            },
        )
    })
}

/// Runs a transfer on this control connection: the server is the sink of
/// a push and the source of a pull.
pub(super) fn serve_transfer(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    t: &TransferRequest,
    access: &auth::Access,
) -> Result<(), Refusal> {
    let refuse = |(c, m): (RefuseCode, String)| Refusal::Refuse(c, m);
    let bad = |e: EngineError| Refusal::Refuse(RefuseCode::BadRequest, e.to_string());
    let place = place_transfer(shared, t, access)?;
    let (guard, rx) = register(shared, conn, access).map_err(refuse)?;
    // The client's include/exclude rules, compiled under their budget
    // (`xfer::filter::BUDGET`) only now that the request holds its slot:
    // `--max-tests` and the queue bound the compiles as every request.
    let filter = crate::xfer::client::compile_filter(&t.filter, t.contents)
        .map_err(|e| bad(EngineError::Usage(e)))?;
    // From here on the transfer runs: its end (or its abort, should this
    // return early) reaches the observers.
    let kind = match t.op {
        Op::Push => RunKind::Push,
        Op::Pull => RunKind::Pull,
    };
    let watch = shared.watch(
        kind,
        conn.peer(),
        access,
        Some(&place.ex.name),
        transfer_params(t),
    );
    let max_files = crate::xfer::files_in_flight_cap();
    let accept = acceptance(
        t,
        conn.is_tls(),
        guard.token.clone(),
        max_files,
        place.landing,
    );
    let streams = match conn
        .send(&Message::TransferAccept(accept))
        .and_then(|()| await_streams(shared, conn, t, &rx))
    {
        Ok(streams) => streams,
        Err(e) => {
            // An early end tells the observers why, not just that it ended.
            watch.finish(0, 0, Outcome::Failed, Some(e.to_string()));
            return Err(Refusal::Failed(e));
        }
    };
    let cc = tune_streams(conn, t, &streams);
    tracing::info!(
        "{:?} of {} on export {} with {} stream(s), {cc}",
        t.op,
        conn.peer(),
        place.ex.name,
        t.streams
    );
    let result = match t.op {
        Op::Push => run_push(shared, conn, t, place, streams, filter, max_files),
        Op::Pull => run_pull(shared, conn, t, place, streams, filter),
    };
    drop(guard);
    match &result {
        Ok((bytes, files, 0)) => watch.finish(*bytes, *files, Outcome::Ok, None),
        Ok((bytes, files, failed)) => watch.finish(
            *bytes,
            *files,
            Outcome::Partial,
            Some(format!("{failed} file(s) failed")),
        ),
        Err(e) => watch.finish(0, 0, Outcome::Failed, Some(e.to_string())),
    }
    result.map(|_| ()).map_err(Refusal::Failed)
}

/// Where a transfer reads or writes, checked: its export, the anchor
/// everything resolves beneath, a pull's roots, the destination and how a
/// push lands there.
struct Place<'a> {
    ex: &'a Export,
    anchor: Anchor,
    roots: Vec<std::path::PathBuf>,
    dest: std::path::PathBuf,
    landing: longhaul_proto::xfer::Landing,
}

/// Checks that `access` may make the transfer `t` and resolves what it
/// touches beneath its export's root; `Err`: the refusal.
fn place_transfer<'a>(
    shared: &'a Arc<Shared>,
    t: &TransferRequest,
    access: &auth::Access,
) -> Result<Place<'a>, Refusal> {
    let refuse = |(c, m): (RefuseCode, String)| Refusal::Refuse(c, m);
    // A third-party copy's capability: one push into its destination,
    // while it lives; checked at every request.
    if let Some(scope) = &access.scope {
        shared
            .capabilities
            .check(scope, t)
            .map_err(|m| Refusal::Refuse(RefuseCode::Unauthorized, m))?;
    }
    let ex = export(shared, &t.export, access).map_err(refuse)?;
    // A push to a read-only export this client can see (a public one, or
    // one its grant reads) is refused for what it is: no credential would
    // let it write there.
    if t.op == Op::Push && ex.read_only && access.check_read(ex).is_ok() {
        return Err(Refusal::Refuse(
            RefuseCode::BadRequest,
            format!("export '{}' is read-only", ex.name),
        ));
    }
    let allowed = match t.op {
        Op::Push => access.check_write(ex),
        Op::Pull => access.check_read(ex),
    };
    allowed.map_err(|m| Refusal::Refuse(RefuseCode::Unauthorized, m))?;
    let bad = |e: EngineError| Refusal::Refuse(RefuseCode::BadRequest, e.to_string());
    if t.op == Op::Push && ex.read_only {
        return Err(Refusal::Refuse(
            RefuseCode::BadRequest,
            format!("export '{}' is read-only", ex.name),
        ));
    }
    // Everything this transfer touches resolves beneath the export root.
    let anchor = Anchor::open_as(&ex.root, &shared.cfg.shown_root(ex)).map_err(bad)?;
    let roots = match t.op {
        Op::Push => Vec::new(),
        Op::Pull => {
            let mut roots = Vec::new();
            for p in &t.sources {
                // Links on the way are followed beneath the export; a
                // source named `SRC/` stands for what its link leads to.
                let named = beneath(&ex.root, p).map_err(bad)?;
                let r = anchor.resolve(&named, t.contents).map_err(bad)?;
                let there = anchor
                    .anchored(&r)
                    .is_ok_and(|at| std::fs::symlink_metadata(at).is_ok());
                if !there {
                    return Err(Refusal::Refuse(
                        RefuseCode::BadRequest,
                        format!("{} does not exist", shared.cfg.show(ex, p)),
                    ));
                }
                super::auth::reads_within(access, &anchor, &ex.root, &[(p, &r)])
                    .map_err(|m| Refusal::Refuse(RefuseCode::Unauthorized, m))?;
                roots.push(r);
            }
            roots
        }
    };
    let dest = match t.op {
        Op::Push => anchor.resolve_dest(&beneath(&ex.root, &t.dest).map_err(bad)?),
        Op::Pull => beneath(&ex.root, &t.dest),
    }
    .map_err(bad)?;
    // `-z`: a level this server's CPU will run (on a pull) or that the
    // client's will.
    if let Some(level) = t.compress {
        longhaul_proto::xfer::compress::check_level(level)
            .map_err(|e| bad(EngineError::Usage(e)))?;
    }
    let landing = match t.op {
        Op::Push => {
            let slash = if t.dest_dir && !t.dest.is_empty() {
                "/"
            } else {
                ""
            };
            let shown = format!("{}{slash}", shared.cfg.show(ex, &t.dest));
            prepare_dest(&anchor, &dest, &shown, t).map_err(bad)?
        }
        Op::Pull => longhaul_proto::xfer::Landing::Into,
    };
    Ok(Place {
        ex,
        anchor,
        roots,
        dest,
        landing,
    })
}

/// The server's answer to a transfer's request: what it agrees to.
fn acceptance(
    t: &TransferRequest,
    tls: bool,
    token: String,
    max_files: u64,
    landing: longhaul_proto::xfer::Landing,
) -> TransferAccept {
    TransferAccept {
        token,
        max_files_in_flight: Some(max_files),
        // This server takes and sends bundles: agreed if asked.
        bundles: t.bundles,
        onto: t.op == Op::Push && landing == longhaul_proto::xfer::Landing::Onto,
        // This server's sink takes parts of files (a fleet's ranks).
        parts: t.parts && t.op == Op::Push,
        // Sealed frames under keys exported from each stream's TLS session.
        sealed: t.sealed && tls,
        // The include/exclude rules compiled above are applied.
        filter: !t.filter.is_empty(),
        // This server's source compresses and its sink decodes.
        compress: t.compress.is_some(),
        // This server's sink defers, and its source re-announces, files the
        // destination had no room for while others were in flight.
        defer_full: t.defer_full,
        // Offered on a TLS session only; whether the data streams that join
        // are TLS decides whether their tags stand for the checks (tags_prove).
        tag_checks: t.tag_checks && tls,
    }
}

/// The transfer's data streams as they join, within the handshake's
/// time-out (each in sealed frames when agreed).
fn await_streams(
    shared: &Shared,
    conn: &FramedConn,
    t: &TransferRequest,
    rx: &std::sync::mpsc::Receiver<super::Attach>,
) -> Result<Vec<Box<dyn crate::net::conn::Stream>>, EngineError> {
    let deadline = Instant::now() + shared.cfg.limits.handshake_timeout;
    let mut streams = Vec::new();
    while streams.len() < usize::from(t.streams) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(a) if t.sealed && conn.is_tls() => {
                match crate::net::sealed::into_sealed(
                    a.stream,
                    crate::net::sealed::Side::Server {
                        sends: t.op == Op::Pull,
                    },
                ) {
                    Ok(s) => streams.push(s),
                    Err(e) => {
                        let e = EngineError::io(
                            "failed to start sealed frames on a data stream".into(),
                            e,
                        );
                        return Err(e);
                    }
                }
            }
            Ok(a) => streams.push(a.stream),
            Err(_) => {
                let e = EngineError::Timeout(format!(
                    "{} of {} data streams connected",
                    streams.len(),
                    t.streams
                ));
                return Err(e);
            }
        }
    }
    Ok(streams)
}

/// Sizes the data streams as the client asked; the congestion control
/// they run.
fn tune_streams(
    conn: &FramedConn,
    t: &TransferRequest,
    streams: &[Box<dyn crate::net::conn::Stream>],
) -> String {
    // The client sized the streams for the path; this side sends on a pull.
    let sending = t.op == Op::Pull;
    let mut cc = String::new();
    for s in streams {
        match sock::tune_data_stream(sock::fd_of(s.tcp()), &t.tuning, sending) {
            Ok(c) => cc = c,
            Err(e) => tracing::warn!("failed to tune a data stream of {}: {e}", conn.peer()),
        }
        if sending {
            if let Err(e) = sock::limit_unsent(sock::fd_of(s.tcp())) {
                tracing::warn!("{e} on a data stream of {}", conn.peer());
            }
        }
    }
    cc
}

/// This server as the sink of a push: files, bytes and failures.
fn run_push(
    shared: &Shared,
    conn: &mut FramedConn,
    t: &TransferRequest,
    place: Place,
    streams: Vec<Box<dyn crate::net::conn::Stream>>,
    filter: Option<Arc<crate::xfer::filter::Filter>>,
    max_files: u64,
) -> Result<(u64, u64, usize), EngineError> {
    let Place {
        ex,
        anchor,
        dest,
        landing,
        ..
    } = place;
    let storage = storage_for(shared, t);
    let tag_checks = crate::xfer::tags_prove(t.tag_checks && conn.is_tls(), &streams);
    run_sink(
        conn,
        streams,
        SinkConfig {
            digest_out: None,
            on_landed: None,
            progress: Default::default(),
            landing,
            dest_shown: shared.cfg.show(ex, &t.dest),
            dest,
            preserve: t.preserve,
            keep_special_modes: shared.cfg.keep_special_modes,
            force: t.force,
            sync_files: shared.cfg.sync_files,
            verify: t.verify,
            storage,
            umask: crate::xfer::umask(),
            delete: t.sync.as_ref().is_some_and(|s| s.delete),
            filter,
            dry_run: t.dry_run,
            anchor,
            max_files,
            bundles: t.bundles,
            compress: t.compress.is_some(),
            defer_full: t.defer_full,
            tag_checks,
        },
    )
    .map(|r| {
        tracing::info!(
            "received {} files, {} bytes, {} failed",
            r.files,
            r.bytes,
            r.failed.len()
        );
        (r.bytes, r.files, r.failed.len())
    })
}

/// This server as the source of a pull: files, bytes and failures.
fn run_pull(
    shared: &Shared,
    conn: &mut FramedConn,
    t: &TransferRequest,
    place: Place,
    streams: Vec<Box<dyn crate::net::conn::Stream>>,
    filter: Option<Arc<crate::xfer::filter::Filter>>,
) -> Result<(u64, u64, usize), EngineError> {
    let Place { anchor, roots, .. } = place;
    let storage = storage_for(shared, t);
    let tag_checks = crate::xfer::tags_prove(t.tag_checks && conn.is_tls(), &streams);
    run_source(
        conn,
        streams,
        SourceConfig {
            dir_ends: t.sync.as_ref().is_some_and(|s| s.delete),
            digests: t.sync.as_ref().is_some_and(|s| s.checksum),
            digest_out: None,
            on_landed: None,
            progress: Default::default(),
            roots,
            recursive: t.recursive,
            chunk_size: t.chunk_size,
            streams: t.streams,
            storage,
            anchor: Some(Arc::new(anchor)),
            bundles: t.bundles,
            share: None,
            filter,
            compress: t.compress,
            tag_checks,
            online: t.tuning.online,
            send_intervals: t.tuning.intervals,
            rtt: Duration::from_micros(u64::from(
                crate::net::sock::tcp_info(crate::net::sock::fd_of(conn.tcp()))
                    .map_or(0, |i| i.min_rtt_us),
            )),
            pacing: t.tuning.pacing,
            // As the client (the sink) sized them: an older client
            // says nothing and gets what every sink allowed.
            files_in_flight: t
                .tuning
                .files_in_flight
                .unwrap_or(longhaul_proto::tune::DEFAULT_FILES_IN_FLIGHT),
            max_files_in_flight: t
                .tuning
                .max_files_in_flight
                .unwrap_or(longhaul_proto::tune::DEFAULT_FILES_IN_FLIGHT)
                .min(longhaul_proto::tune::MAX_FILES_IN_FLIGHT),
        },
    )
    .map(|r| {
        tracing::info!(
            "sent {} files, {} bytes, {} failed",
            r.tally.files,
            r.tally.bytes,
            r.tally.failed.len()
        );
        (r.tally.bytes, r.tally.files, r.tally.failed.len())
    })
}

/// The storage a transfer reads or writes through: `--direct` asked for
/// O_DIRECT, else the server's.
fn storage_for(shared: &Shared, t: &TransferRequest) -> Arc<dyn Storage> {
    if t.direct {
        Arc::new(crate::xfer::storage::Direct)
    } else {
        shared.cfg.storage.clone()
    }
}

/// What the archive keeps of a transfer's request: the paths and the
/// options that change what it does, not its tuning.
fn transfer_params(t: &TransferRequest) -> serde_json::Value {
    const SHOWN: usize = 100;
    serde_json::json!({
        "direction": match t.op { Op::Push => "push", Op::Pull => "pull" },
        "dest": t.dest,
        "sources": t.sources.iter().take(SHOWN).collect::<Vec<_>>(),
        "source_count": t.source_count,
        "recursive": t.recursive,
        "preserve": t.preserve,
        "streams": t.streams,
        "sync": t.sync.is_some(),
        "delete": t.sync.as_ref().is_some_and(|s| s.delete),
        "checksum": t.sync.as_ref().is_some_and(|s| s.checksum),
        "dry_run": t.dry_run,
        "verify": t.verify,
        "direct": t.direct,
    })
}

/// Answers `doctor`'s probe: this host's settings and, on the export, the
/// storage benchmark in a scratch directory (writes need write access).
pub(super) fn serve_probe(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    p: &longhaul_proto::disk::ProbeRequest,
    access: &auth::Access,
) -> Result<(), (RefuseCode, String)> {
    let t = p.tests;
    let touches = t.write || t.read || t.create || p.remove.is_some();
    let result = if touches {
        let ex = export(shared, &p.export, access)?;
        if t.write || t.create || p.remove.is_some() {
            if ex.read_only {
                return Err((
                    RefuseCode::Unauthorized,
                    format!(
                        "export '{}' is read-only: its storage can only be read",
                        ex.name
                    ),
                ));
            }
            access
                .check_write(ex)
                .map_err(|m| (RefuseCode::Unauthorized, m))?;
        } else {
            access
                .check_read(ex)
                .map_err(|m| (RefuseCode::Unauthorized, m))?;
        }
        let bad = |e: EngineError| (RefuseCode::BadRequest, e.to_string());
        // Through a descriptor opened beneath the export root, so a symlink
        // swapped in cannot take the benchmark outside it.
        let anchor = Anchor::open_as(&ex.root, &shared.cfg.shown_root(ex)).map_err(bad)?;
        // A path that does not exist yet (where a transfer will create
        // it) is measured in the nearest directory above it that does.
        let mut used = p.path.trim_matches('/').to_string();
        let dir = loop {
            let path = beneath(&ex.root, &used).map_err(bad)?;
            let path = anchor.resolve(&path, true).map_err(bad)?;
            match anchor.dir(&path, false) {
                Ok(d) => break d,
                Err(e) if used.is_empty() => return Err(bad(e)),
                Err(_) => used = used.rsplit_once('/').map_or("", |(up, _)| up).to_string(),
            }
        };
        tracing::info!("{} probes {}:{}", conn.peer(), ex.name, escaped(&used));
        let shown = shared.cfg.show(ex, &used);
        let mut r = crate::doctor::serve_probe(&dir.path(), p, peer_ip(conn))
            .map_err(|e| (RefuseCode::ServerError, format!("probing {shown}: {e}")))?;
        if used != p.path.trim_matches('/') {
            r.report.warnings.push(format!(
                "{} does not exist yet: measured in {shown}, the nearest directory above it",
                shared.cfg.show(ex, &p.path)
            ));
        }
        // Named as the client knows it, not by the descriptor used.
        r.report.path = shown;
        r.dir = Some(used);
        r
    } else {
        crate::doctor::serve_probe(std::path::Path::new("/"), p, peer_ip(conn))
            .map_err(|e| (RefuseCode::ServerError, e.to_string()))?
    };
    conn.send(&Message::ProbeResult(Box::new(result)))
        .map_err(|e| (RefuseCode::ServerError, e.to_string()))
}

/// Answers `ls`: the entries of a directory (or the one file), in batches.
pub(super) fn serve_list(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    l: &ListRequest,
    access: &auth::Access,
) -> Result<(), (RefuseCode, String)> {
    if let Some(scope) = &access.scope {
        shared
            .capabilities
            .alive(scope)
            .and_then(|()| {
                longhaul_proto::xfer::copy::within_read_scope(
                    &scope.request,
                    true,
                    &l.export,
                    std::slice::from_ref(&l.path),
                )
            })
            .map_err(|m| (RefuseCode::Unauthorized, m))?;
    }
    let ex = export(shared, &l.export, access)?;
    access
        .check_read(ex)
        .map_err(|m| (RefuseCode::Unauthorized, m))?;
    // A recursive listing walks as far as the tree goes: it waits for a
    // slot as a transfer does. One directory's listing is one read,
    // streamed, and needs none.
    let _slot = match l.recursive {
        true => Some(super::slots::take_slot(shared, conn, access)?),
        false => None,
    };
    let watch = shared.watch(
        RunKind::List,
        conn.peer(),
        access,
        Some(&ex.name),
        serde_json::json!({ "path": l.path }),
    );
    let listed = list(conn, ex, &shared.cfg.shown_root(ex), l, access);
    match &listed {
        Ok(n) => watch.finish(0, *n, Outcome::Ok, None),
        Err((_, m)) => watch.finish(0, 0, Outcome::Failed, Some(m.clone())),
    }
    listed.map(|_| ())
}

/// The listing itself; how many entries it sent.
fn list(
    conn: &mut FramedConn,
    ex: &Export,
    shown: &Path,
    l: &ListRequest,
    access: &auth::Access,
) -> Result<u64, (RefuseCode, String)> {
    // Looked at through descriptors opened beneath the export root.
    let bad = |e: EngineError| (RefuseCode::BadRequest, e.to_string());
    let anchor = Anchor::open_as(&ex.root, shown).map_err(bad)?;
    // Links on the way are followed beneath the export; `DIR/` lists what
    // a link of that name leads to, `DIR` the link itself (as `ls -l`).
    let named = beneath(&ex.root, &l.path).map_err(bad)?;
    let path = anchor.resolve(&named, l.path.ends_with('/')).map_err(bad)?;
    super::auth::reads_within(access, &anchor, &ex.root, &[(&l.path, &path)])
        .map_err(|m| (RefuseCode::Unauthorized, m))?;
    let at = anchor.anchored(&path).map_err(bad)?;
    let meta = std::fs::symlink_metadata(&at).map_err(|e| {
        (
            RefuseCode::BadRequest,
            format!("cannot list {}: {e}", shown.join(&l.path).display()),
        )
    })?;
    let send = |conn: &mut FramedConn, entries: Vec<ListEntry>, done: bool| {
        conn.send(&Message::Listing(Listing { entries, done }))
            .map_err(|e| (RefuseCode::ServerError, e.to_string()))
    };
    if !meta.is_dir() {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let target = meta
            .is_symlink()
            .then(|| std::fs::read_link(&at).ok())
            .flatten();
        return send(conn, vec![list_entry(name, &meta, target)], true).map(|()| 1);
    }
    let cannot = |e: std::io::Error| {
        (
            RefuseCode::BadRequest,
            format!("cannot list {}: {e}", shown.join(&l.path).display()),
        )
    };
    // Depth first, each directory opened from its parent without following
    // a link when its turn comes (so the walk holds a descriptor for each
    // directory with subdirectories still to visit, not one for each of
    // those); entries named from the listed directory (`sub/file`).
    let top = anchor.dir(&path, false).map_err(bad)?;
    let mut todo = vec![(top, None::<std::ffi::OsString>, String::new())];
    let mut batch = Vec::new();
    let mut sent = 0u64;
    while let Some((parent, name, prefix)) = todo.pop() {
        let dir = match name {
            None => parent,
            Some(name) => match parent.child(&name) {
                Ok(d) => Arc::new(d),
                Err(_) => continue,
            },
        };
        let rd = match std::fs::read_dir(dir.path()) {
            Ok(rd) => rd,
            // The top must be listable; a subdirectory that is not (its
            // mode, or gone since) is left out, as `ls -R` goes on.
            Err(e) if prefix.is_empty() => return Err(cannot(e)),
            Err(_) => continue,
        };
        let mut subdirs = Vec::new();
        for de in rd.flatten() {
            let file_name = de.file_name();
            let name = file_name.to_string_lossy();
            // A sink's partial files, journals and marks are not the export's.
            if longhaul_proto::xfer::is_reserved_name(&name) {
                continue;
            }
            let Ok(m) = dir.join(&file_name).symlink_metadata() else {
                continue;
            };
            let target = m
                .is_symlink()
                .then(|| std::fs::read_link(dir.join(&file_name)).ok())
                .flatten();
            let shown = format!("{prefix}{name}");
            if l.recursive && m.is_dir() {
                subdirs.push((file_name.clone(), format!("{shown}/")));
            }
            batch.push(list_entry(shown, &m, target));
            if batch.len() == 1000 {
                sent += 1000;
                send(conn, std::mem::take(&mut batch), false)?;
            }
        }
        // Reversed onto the stack: visited in the order read.
        for (name, prefix) in subdirs.into_iter().rev() {
            todo.push((dir.clone(), Some(name), prefix));
        }
    }
    sent += batch.len() as u64;
    send(conn, batch, true).map(|()| sent)
}

/// What a listing says of one entry.
fn list_entry(
    name: String,
    m: &std::fs::Metadata,
    target: Option<std::path::PathBuf>,
) -> ListEntry {
    ListEntry {
        name,
        kind: kind_of(m).unwrap_or(Kind::File),
        size: m.len(),
        mode: std::os::unix::fs::MetadataExt::mode(m) & 0o7777,
        mtime_ns: mtime_ns(m),
        target: target.map(|t| t.to_string_lossy().into_owned()),
    }
}
