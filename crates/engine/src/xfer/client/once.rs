//! One attempt at a `cp`: the control connection (the request pipelined
//! behind the Hello), the data streams, and the local side of a push or a
//! pull, summed up.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::msg::{Direction, Message};
use longhaul_proto::xfer::*;

use super::super::beneath::Anchor;
use super::super::sink::{run_sink, SinkConfig};
use super::super::source::{run_source, SourceConfig, SourceReport};
use super::super::storage::{Direct, Local, Storage};
use super::super::DigestOut;
use super::path::{files_in_flight, shortfall_with_server, size_for_path, PathFacts};
use super::plan::{local_dest, transfer_request, Place, Plan};
use super::streams::{attach_streams, dial_early, EarlyStreams, PathTaps};
use super::{stage_rate, CopyReport, CpOptions, PathTuning};
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

/// A path as sized: its figures, the streams' settings, and the warnings
/// of its shortfall.
type Sized = (PathTuning, StreamTuning, Vec<String>);

/// One attempt: the request out (`pipeline`: right behind the Hello,
/// sized before the server's Welcome), the data streams attached once it
/// is accepted, and the local side run to its end.
pub(super) fn cp_once(
    o: &CpOptions,
    plan: &Plan,
    digest_out: &Option<DigestOut>,
    pipeline: bool,
) -> Result<CopyReport, EngineError> {
    let started = Instant::now();
    let (host, push) = (plan.host(), matches!(plan, Plan::Push { .. }));
    // What can fail here fails before the server is asked anything.
    let pull_dest = check_local(o, plan)?;
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
            // An error is asked again below, where it is reported.
            let sized = size_for_path(o, PathFacts::before_welcome(rtt_us), host, push).ok()?;
            let req = transfer_request(o, plan, sized.0.window.streams, &sized.1);
            pipelined = Some(sized);
            Some(Message::TransferRequest(req))
        },
    )?;
    let Some((path, tuning, warnings)) = request(o, plan, &mut ctl, pipelined)? else {
        // The server refuses that many streams (`limit`) and closes: ask
        // again, sized with its Welcome.
        drop(ctl);
        return cp_once(o, plan, digest_out, false);
    };
    let mut s = CopyReport {
        streams: path.window.streams,
        warnings,
        dry_run: o.dry_run,
        encryption: ctl.conn.encryption(),
        ..CopyReport::default()
    };
    let mut side = Side {
        o,
        plan,
        ctl,
        early,
        path,
        tuning,
        digest_out,
    };
    match plan {
        Plan::Push { roots, .. } => side.push(roots, &mut s)?,
        Plan::Pull { .. } => side.pull(pull_dest.expect("made for a pull"), &mut s)?,
    }
    s.path = Some(side.path);
    // Cloned, not taken: the reporter reads the last ones after this.
    s.intervals = o.progress.intervals.lock().expect("poisoned").clone();
    s.seconds = started.elapsed().as_secs_f64();
    sum_up(&mut s);
    Ok(s)
}

/// What is checked locally before the server is asked anything: a push's
/// roots are there; a pull's destination, by the landing rule (and made,
/// if it is to be).
fn check_local(
    o: &CpOptions,
    plan: &Plan,
) -> Result<Option<(PathBuf, Landing, Anchor)>, EngineError> {
    match plan {
        Plan::Push { roots, .. } => {
            for r in roots {
                std::fs::symlink_metadata(r)
                    .map_err(|e| EngineError::Usage(format!("cannot read {}: {e}", r.display())))?;
            }
            Ok(None)
        }
        Plan::Pull { dest, .. } => Some(local_dest(o, dest)).transpose(),
    }
}

/// The path as sized for the request: the pipelined one, checked against
/// the server's Welcome (None if the server allows fewer streams: the
/// attempt starts over), or else sized now and sent.
fn request(
    o: &CpOptions,
    plan: &Plan,
    ctl: &mut Control,
    pipelined: Option<Sized>,
) -> Result<Option<Sized>, EngineError> {
    let (host, push) = (plan.host(), matches!(plan, Plan::Push { .. }));
    match pipelined {
        Some((path, tuning, _)) => {
            if ctl
                .welcome
                .max_streams
                .is_some_and(|max| path.window.streams > max)
            {
                return Ok(None);
            }
            let warnings = shortfall_with_server(&path, PathFacts::of(ctl), push);
            Ok(Some((path, tuning, warnings)))
        }
        None => {
            let sized = size_for_path(o, PathFacts::of(ctl), host, push)?;
            let req = transfer_request(o, plan, sized.0.window.streams, &sized.1);
            ctl.conn.send(&Message::TransferRequest(req))?;
            Ok(Some(sized))
        }
    }
}

/// An attempt once its request is out.
struct Side<'a> {
    o: &'a CpOptions,
    plan: &'a Plan,
    ctl: Control,
    early: EarlyStreams,
    path: PathTuning,
    tuning: StreamTuning,
    digest_out: &'a Option<DigestOut>,
}

impl Side<'_> {
    /// Include/exclude rules were sent: the server must say it applies them
    /// (an older one would ignore them: a pull would bring everything, and
    /// `sync --delete` would delete what the rules keep).
    fn filter_applied(&self, accept: &TransferAccept) -> Result<(), EngineError> {
        if self.o.filter.is_empty() || accept.filter {
            return Ok(());
        }
        Err(EngineError::Failed(format!(
            "the server at {} does not apply --exclude/--include rules (it is older than this client): upgrade it, or copy without the rules",
            self.plan.host()
        )))
    }

    /// `-z` was asked: the server must say it takes (and sends) compressed
    /// chunk frames; an older one would refuse them mid-transfer, or send
    /// raw ones while the user thinks otherwise. Refused before any data
    /// moves, rather than going on uncompressed: the user asked for it,
    /// perhaps because the path is metered.
    fn compress_agreed(&self, accept: &TransferAccept) -> Result<(), EngineError> {
        if self.o.compress.is_none() || accept.compress {
            return Ok(());
        }
        Err(EngineError::Failed(format!(
            "the server at {} does not take compressed chunks (-z; it is older than this client): upgrade it, or copy without -z",
            self.plan.host()
        )))
    }

    /// A push: this end is the source.
    fn push(&mut self, roots: &[PathBuf], s: &mut CopyReport) -> Result<(), EngineError> {
        let o = self.o;
        let streams = self.path.window.streams;
        let accept = accepted(&mut self.ctl, &o.client)?;
        self.filter_applied(&accept)?;
        self.compress_agreed(&accept)?;
        if o.share.is_some() && !accept.parts {
            return Err(EngineError::Failed(format!(
                "the server at {} does not take parts of files (it is older than this client): upgrade it to move a fleet's share",
                self.plan.host()
            )));
        }
        let cap = accept
            .max_files_in_flight
            .unwrap_or(longhaul_proto::tune::DEFAULT_FILES_IN_FLIGHT)
            .min(longhaul_proto::tune::MAX_FILES_IN_FLIGHT);
        let (files_start, files_most) = files_in_flight(o, &self.path.window, cap);
        let data = self.attach(&accept, Direction::Up)?;
        if let Some(first) = data.first() {
            self.path.congestion =
                crate::net::sock::congestion(crate::net::sock::fd_of(first.tcp()));
            s.encryption = first.encryption();
        }
        let taps = PathTaps::of(&data, o);
        let tag_checks = tag_checked(&accept, &data);
        let r = run_source(
            &mut self.ctl.conn,
            data,
            SourceConfig {
                dir_ends: o.sync.as_ref().is_some_and(|s| s.delete),
                digests: o.sync.as_ref().is_some_and(|s| s.checksum),
                digest_out: self.digest_out.clone(),
                on_landed: o
                    .catalogue
                    .clone()
                    .map(|c| Place::push(self.plan, accept.onto).hook(c)),
                progress: o.progress.clone(),
                roots: roots.to_vec(),
                recursive: o.recursive,
                chunk_size: o.chunk_size,
                streams,
                storage: storage(o),
                anchor: o.source_anchor.clone(),
                online: self.tuning.online,
                send_intervals: false,
                rtt: Duration::from_micros(u64::from(self.path.window.rtt_us)),
                pacing: self.tuning.pacing,
                files_in_flight: files_start,
                max_files_in_flight: files_most,
                bundles: accept.bundles,
                share: o.share.clone(),
                filter: o.filter()?,
                compress: o.compress.filter(|_| accept.compress),
                tag_checks,
            },
        )?;
        pushed(s, r, streams);
        s.paths = taps.count(true);
        Ok(())
    }

    /// A pull: this end is the sink, landing entries at `dest`.
    fn pull(
        &mut self,
        (dest, landing, anchor): (PathBuf, Landing, Anchor),
        s: &mut CopyReport,
    ) -> Result<(), EngineError> {
        let o = self.o;
        let streams = self.path.window.streams;
        let accept = accepted(&mut self.ctl, &o.client)?;
        self.filter_applied(&accept)?;
        self.compress_agreed(&accept)?;
        let data = self.attach(&accept, Direction::Down)?;
        if let Some(first) = data.first() {
            s.encryption = first.encryption();
        }
        let taps = PathTaps::of(&data, o);
        let tag_checks = tag_checked(&accept, &data);
        let r = run_sink(
            &mut self.ctl.conn,
            data,
            SinkConfig {
                digest_out: self.digest_out.clone(),
                on_landed: o
                    .catalogue
                    .clone()
                    .map(|c| Place::pull(self.plan, o, landing).hook(c)),
                progress: o.progress.clone(),
                landing,
                dest,
                dest_shown: o.dest.arg().to_string(),
                preserve: o.preserve,
                keep_special_modes: o.keep_special_modes,
                force: o.force,
                sync_files: o.sync_files,
                verify: o.verify,
                storage: storage(o),
                umask: super::super::umask(),
                delete: o.sync.as_ref().is_some_and(|s| s.delete),
                filter: o.filter()?,
                dry_run: o.dry_run,
                anchor,
                max_files: super::super::files_in_flight_cap(),
                bundles: accept.bundles,
                compress: accept.compress,
                defer_full: accept.defer_full,
                tag_checks,
            },
        )?;
        pulled(s, r, streams);
        s.paths = taps.count(false);
        Ok(())
    }

    /// The data streams of the accepted transfer, going `direction`.
    fn attach(
        &mut self,
        accept: &TransferAccept,
        direction: Direction,
    ) -> Result<Vec<Box<dyn crate::net::conn::Stream>>, EngineError> {
        attach_streams(
            &self.ctl,
            std::mem::take(&mut self.early),
            accept,
            self.path.window.streams,
            direction,
            &self.tuning,
            &self.o.client,
        )
    }
}

/// Whether the chunks' checks are left to the data streams' AEAD tags: the
/// server agreed, and every stream is TLS (never on a word alone over
/// plaintext, where nothing would prove the bytes).
fn tag_checked(accept: &TransferAccept, data: &[Box<dyn crate::net::conn::Stream>]) -> bool {
    crate::xfer::tags_prove(accept.tag_checks, data)
}

/// The storage of this end's files: O_DIRECT with `--direct`.
fn storage(o: &CpOptions) -> Arc<dyn Storage> {
    if o.direct {
        Arc::new(Direct)
    } else {
        Arc::new(Local)
    }
}

/// A push's outcome, from the source's report (with the sink's in it).
fn pushed(s: &mut CopyReport, r: SourceReport, streams: u16) {
    s.tuning = r.tuning.clone();
    let t = r.tally;
    s.files = t.files;
    s.links = r.sink.links;
    s.links_up_to_date = r.sink.links_up_to_date;
    s.resent_changed = t.resent_changed;
    s.resent_bytes = r.sink.resent_bytes;
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
    s.compression = r.compress;
}

/// A pull's outcome, from the sink's report (with the source's in it).
fn pulled(s: &mut CopyReport, r: SinkReport, streams: u16) {
    s.files = r.files;
    s.links = r.links;
    s.links_up_to_date = r.links_up_to_date;
    s.resent_bytes = r.resent_bytes;
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
        s.compression = d.compress.clone();
    }
}

/// The figures made of the others: the verdict of the intervals, the
/// bytes this run sent and their rate, and whether all was verified.
fn sum_up(s: &mut CopyReport) {
    s.verdict = longhaul_proto::tune::verdict(&s.intervals);
    s.sent_bytes = s.bytes.saturating_sub(s.resumed_bytes);
    s.bits_per_second = s.sent_bytes as f64 * 8.0 / s.seconds.max(1e-9);
    s.network_bps = s.bits_per_second;
    s.verified = s.failed.is_empty();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(path: &str) -> Failure {
        Failure {
            path: path.into(),
            error: "e".into(),
        }
    }

    #[test]
    fn a_push_counts_each_failure_once_whichever_end_saw_it() {
        let mut r = SourceReport::default();
        r.tally.files = 3;
        r.tally.bytes = 300;
        r.tally.failed = vec![failure("a"), failure("b")];
        r.sink.failed = vec![failure("b"), failure("c")];
        r.sink.links = 2;
        let mut s = CopyReport::default();
        pushed(&mut s, r, 4);
        let failed: Vec<&str> = s.failed.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(failed, ["a", "b", "c"]);
        assert_eq!((s.files, s.bytes, s.links), (3, 300, 2));
    }

    #[test]
    fn a_pull_takes_the_sources_figures_when_it_sent_them() {
        let mut r = SinkReport {
            files: 2,
            bytes: 2000,
            resumed_bytes: 500,
            ..SinkReport::default()
        };
        let mut s = CopyReport::default();
        pulled(&mut s, r.clone(), 1);
        assert_eq!((s.files, s.source_read_bps, s.resent_changed), (2, 0.0, 0));
        r.source = Some(SourceDone {
            read_bytes: 1000,
            read_us: 1_000_000,
            resent_changed: 1,
            tuning: None,
            cpu: None,
            compress: None,
        });
        pulled(&mut s, r, 1);
        assert_eq!(s.source_read_bps, 8000.0);
        assert_eq!(s.resent_changed, 1);
    }

    #[test]
    fn the_summary_counts_only_what_this_run_sent() {
        let mut s = CopyReport {
            bytes: 3000,
            resumed_bytes: 1000,
            seconds: 2.0,
            ..CopyReport::default()
        };
        sum_up(&mut s);
        assert_eq!(s.sent_bytes, 2000);
        assert_eq!(s.bits_per_second, 8000.0);
        assert_eq!(s.network_bps, s.bits_per_second);
        assert!(s.verified);
        s.failed.push(failure("x"));
        sum_up(&mut s);
        assert!(!s.verified);
    }
}
