//! One attempt at a `cp`: the control connection (the request pipelined
//! behind the Hello), the data streams, and the local side of a push or a
//! pull, summed up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::msg::{Direction, Message};
use longhaul_proto::xfer::*;

use super::super::sink::{run_sink, SinkConfig};
use super::super::source::{run_source, SourceConfig};
use super::super::storage::{Direct, Local, Storage};
use super::path::{files_in_flight, shortfall_with_server, size_for_path, PathFacts};
use super::plan::{local_dest, transfer_request, Place, Plan};
use super::streams::{attach_streams, dial_early, PathTaps};
use super::{stage_rate, CpOptions, CpSummary};
use crate::net::dial::{open_control_early, ClientOptions, Control};
use crate::EngineError;

/// The server's answer to the `TransferRequest` sent on `ctl`.
fn accepted(ctl: &mut Control, o: &ClientOptions) -> Result<TransferAccept, EngineError> {
    let deadline = Instant::now() + o.handshake_timeout;
    ctl.answer(deadline, "the transfer request", |m| match m {
        Message::TransferAccept(a) => Some(a),
        _ => None,
    })
}

pub(super) fn cp_once(
    o: &CpOptions,
    plan: &Plan,
    digest_out: &Option<super::super::DigestOut>,
    pipeline: bool,
) -> Result<CpSummary, EngineError> {
    let started = Instant::now();
    let host = match plan {
        Plan::Push { host, .. } | Plan::Pull { host, .. } => host,
    };
    let push = matches!(plan, Plan::Push { .. });
    // What can fail here fails before the server is asked anything.
    let pull_dest = match plan {
        Plan::Push { roots, .. } => {
            for r in roots {
                std::fs::symlink_metadata(r)
                    .map_err(|e| EngineError::Usage(format!("cannot read {}: {e}", r.display())))?;
            }
            None
        }
        Plan::Pull { dest, .. } => Some(local_dest(o, dest)?),
    };
    // Sized from the RTT of the TCP handshake and this host's caps (the
    // server's are not known before its Welcome), the request goes out
    // right behind the Hello: a round trip less before data flows.
    let mut pipelined = None;
    let (mut ctl, early) = open_control_early(
        host,
        &o.client,
        |d, rtt_us| dial_early(o, push, host, d, rtt_us),
        |rtt_us| {
            if !pipeline {
                return None;
            }
            let facts = PathFacts::before_welcome(rtt_us);
            // An error is asked again below, where it is reported.
            let sized = size_for_path(o, facts, host, push).ok()?;
            let req = transfer_request(o, plan, sized.0.window.streams, &sized.1);
            pipelined = Some(sized);
            Some(Message::TransferRequest(req))
        },
    )?;
    let (mut path, tuning, warnings) = match pipelined {
        Some((path, tuning, _)) => {
            if ctl
                .welcome
                .max_streams
                .is_some_and(|max| path.window.streams > max)
            {
                // The server refuses that many (`limit`) and closes: ask
                // again, sized with its Welcome.
                drop(ctl);
                return cp_once(o, plan, digest_out, false);
            }
            let warnings = shortfall_with_server(&path, PathFacts::of(&ctl), push);
            (path, tuning, warnings)
        }
        None => {
            let sized = size_for_path(o, PathFacts::of(&ctl), host, push)?;
            let req = transfer_request(o, plan, sized.0.window.streams, &sized.1);
            ctl.conn.send(&Message::TransferRequest(req))?;
            sized
        }
    };
    let streams = path.window.streams;
    let storage: Arc<dyn Storage> = if o.direct {
        Arc::new(Direct)
    } else {
        Arc::new(Local)
    };
    let mut s = CpSummary {
        streams,
        warnings,
        dry_run: o.dry_run,
        encryption: ctl.conn.encryption(),
        ..CpSummary::default()
    };
    match plan {
        Plan::Push { roots, .. } => {
            let accept = accepted(&mut ctl, &o.client)?;
            if o.share.is_some() && !accept.parts {
                return Err(EngineError::Failed(format!(
                    "the server at {host} does not take parts of files (it is older than this client): upgrade it to move a fleet's share"
                )));
            }
            let bundles = accept.bundles;
            let cap = accept
                .max_files_in_flight
                .unwrap_or(longhaul_proto::tune::DEFAULT_FILES_IN_FLIGHT)
                .min(longhaul_proto::tune::MAX_FILES_IN_FLIGHT);
            let (files_start, files_most) = files_in_flight(o, &path.window, cap);
            let data = attach_streams(
                &ctl,
                early,
                &accept,
                streams,
                Direction::Up,
                &tuning,
                &o.client,
            )?;
            if let Some(first) = data.first() {
                path.congestion =
                    crate::net::sock::congestion(crate::net::sock::fd_of(first.tcp()));
                s.encryption = first.encryption();
            }
            let taps = PathTaps::of(&data, o);
            let r = run_source(
                &mut ctl.conn,
                data,
                SourceConfig {
                    dir_ends: o.sync.as_ref().is_some_and(|s| s.delete),
                    digests: o.sync.as_ref().is_some_and(|s| s.checksum),
                    digest_out: digest_out.clone(),
                    on_landed: o
                        .catalogue
                        .clone()
                        .map(|c| Place::push(plan, accept.onto).hook(c)),
                    progress: o.progress.clone(),
                    roots: roots.clone(),
                    recursive: o.recursive,
                    chunk_size: o.chunk_size,
                    streams,
                    storage,
                    anchor: None,
                    online: tuning.online,
                    send_intervals: false,
                    rtt: Duration::from_micros(u64::from(path.window.rtt_us)),
                    pacing: tuning.pacing,
                    files_in_flight: files_start,
                    max_files_in_flight: files_most,
                    bundles,
                    share: o.share.clone(),
                },
            )?;
            s.tuning = r.tuning.clone();
            let t = r.tally;
            s.files = t.files;
            s.links = r.sink.links;
            s.resent_changed = t.resent_changed;
            s.bytes = t.bytes;
            s.skipped = t.skipped;
            s.resumed_bytes = t.resumed_bytes;
            s.failed = t.failed;
            for f in r.sink.failed {
                if !s.failed.iter().any(|g| g.path == f.path) {
                    s.failed.push(f);
                }
            }
            s.source_read_bps = stage_rate(t.read_bytes, t.read_us, streams);
            s.cpu_stages = CpuStages {
                source: Some(r.cpu),
                sink: r.sink.cpu,
            };
            s.deleted = r.sink.deleted.clone();
            s.would_send = r.sink.would_send.clone();
            s.would_send_bytes = r.sink.would_send_bytes;
            s.dest_write_bps = stage_rate(r.sink.written_bytes, r.sink.write_us, streams);
            s.paths = taps.count(true);
        }
        Plan::Pull { .. } => {
            let (dest, landing, anchor) = pull_dest.expect("made for a pull");
            let dest = &dest;
            let accept = accepted(&mut ctl, &o.client)?;
            let data = attach_streams(
                &ctl,
                early,
                &accept,
                streams,
                Direction::Down,
                &tuning,
                &o.client,
            )?;
            let bundles = accept.bundles;
            if let Some(first) = data.first() {
                s.encryption = first.encryption();
            }
            let taps = PathTaps::of(&data, o);
            let r = run_sink(
                &mut ctl.conn,
                data,
                SinkConfig {
                    digest_out: digest_out.clone(),
                    on_landed: o
                        .catalogue
                        .clone()
                        .map(|c| Place::pull(plan, o, landing).hook(c)),
                    progress: o.progress.clone(),
                    landing,
                    dest: dest.clone(),
                    dest_shown: o.dest.clone(),
                    preserve: o.preserve,
                    keep_special_modes: o.keep_special_modes,
                    force: o.force,
                    sync_files: o.sync_files,
                    verify: o.verify,
                    storage,
                    umask: super::super::umask(),
                    delete: o.sync.as_ref().is_some_and(|s| s.delete),
                    dry_run: o.dry_run,
                    anchor,
                    max_files: super::super::files_in_flight_cap(),
                    bundles,
                },
            )?;
            s.files = r.files;
            s.links = r.links;
            s.bytes = r.bytes;
            s.skipped = r.skipped;
            s.resumed_bytes = r.resumed_bytes;
            s.failed = r.failed.clone();
            s.deleted = r.deleted.clone();
            s.would_send = r.would_send.clone();
            s.would_send_bytes = r.would_send_bytes;
            s.dest_write_bps = stage_rate(r.written_bytes, r.write_us, streams);
            s.cpu_stages = CpuStages {
                source: r.source.as_ref().and_then(|d| d.cpu),
                sink: r.cpu,
            };
            if let Some(d) = &r.source {
                s.source_read_bps = stage_rate(d.read_bytes, d.read_us, streams);
                s.tuning = d.tuning.clone();
                s.resent_changed = d.resent_changed;
            }
            s.paths = taps.count(false);
        }
    }
    s.path = Some(path);
    // Cloned, not taken: the reporter reads the last ones after this.
    s.intervals = o.progress.intervals.lock().expect("poisoned").clone();
    s.verdict = longhaul_proto::tune::verdict(&s.intervals);
    s.seconds = started.elapsed().as_secs_f64();
    s.sent_bytes = s.bytes.saturating_sub(s.resumed_bytes);
    s.bits_per_second = s.sent_bytes as f64 * 8.0 / s.seconds.max(1e-9);
    s.network_bps = s.bits_per_second;
    s.verified = s.failed.is_empty();
    Ok(s)
}
