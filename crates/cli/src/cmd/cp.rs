//! `cp`, `sync` and `ls`: file transfers and listings.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use longhaul_engine::client::ClientOptions;
use longhaul_engine::xfer::client::CpOptions;
use longhaul_proto::units;

use super::{interrupt_flag, print_result, Failure, Outcome};
use crate::args::{CpArgs, LsArgs};
use crate::exit;
use crate::print::{human, json, progress};

pub fn cp(a: CpArgs, sync: Option<longhaul_proto::xfer::SyncOptions>, dry_run: bool) -> Outcome {
    let security = a.security.security()?;
    let mut paths = a.paths.clone();
    let dest = paths.pop().expect("clap requires two paths");
    let interrupt = interrupt_flag();
    let opts = CpOptions {
        sources: paths,
        dest,
        recursive: a.recursive,
        preserve: a.preserve,
        streams: a.streams,
        rate: a.rate,
        congestion: a.congestion.clone(),
        chunk_size: a.chunk,
        force: a.force,
        mkpath: a.mkpath,
        keep_special_modes: a.keep_special_modes,
        retries: a.retries,
        sync_files: !a.no_sync,
        direct: a.direct,
        verify: a.verify,
        sync,
        dry_run,
        tune: !a.no_tune,
        files_in_flight: a.files_in_flight,
        path_memory: Some(longhaul_engine::paths::default_file()),
        digests_to: a.digests.clone(),
        progress: Arc::new(longhaul_engine::xfer::Progress {
            interrupt: interrupt.clone(),
            ..Default::default()
        }),
        client: ClientOptions {
            connect_timeout: a.connect_timeout,
            interrupt,
            security,
            ..ClientOptions::default()
        },
    };
    let bar = (!a.json && !a.intervals && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .then(|| progress::progress_bar(opts.progress.clone()));
    let lines = a
        .intervals
        .then(|| progress::interval_printer(opts.progress.clone()));
    let result = longhaul_engine::xfer::client::cp(&opts);
    for (done, t) in [bar, lines].into_iter().flatten() {
        done.store(true, Ordering::SeqCst);
        let _ = t.join();
    }
    match result {
        Ok(s) => {
            if a.json {
                let mut v = serde_json::to_value(&s).unwrap_or_default();
                v["format"] = "longhaul-cp".into();
                v["format_version"] = json::CP_JSON_FORMAT_VERSION.into();
                outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                outln!(
                    "{} files{}, {} in {:.2} s = {} ({} skipped as up to date, {} resumed, {} stream(s), {} attempt(s))",
                    s.files,
                    match s.links {
                        0 => String::new(),
                        n => format!(" and {n} link(s)"),
                    },
                    units::format_bytes(s.bytes),
                    s.seconds,
                    units::format_rate(s.bits_per_second),
                    s.skipped,
                    units::format_bytes(s.resumed_bytes),
                    s.streams,
                    s.attempts,
                );
                outln!(
                    "stages: source read {}, network {}, destination write {}",
                    units::format_rate(s.source_read_bps),
                    units::format_rate(s.network_bps),
                    units::format_rate(s.dest_write_bps)
                );
                if let Some(t) = &s.tuning {
                    outln!(
                        "tuning: {} stream(s){}; chunks of {}; up to {} files in flight{}",
                        t.final_streams,
                        if t.online {
                            format!(
                                " carrying chunks of {} open (online, {} step(s))",
                                t.initial_streams,
                                t.steps.len()
                            )
                        } else {
                            " (fixed)".into()
                        },
                        units::format_bytes(t.chunk_size),
                        t.files_in_flight,
                        if t.files_in_flight > t.initial_files_in_flight
                            && t.initial_files_in_flight > 0
                        {
                            format!(" (grown online from {})", t.initial_files_in_flight)
                        } else {
                            String::new()
                        },
                    );
                    if t.send_buffer > 0 {
                        outln!(
                            "send buffers: {} a stream{}",
                            units::format_bytes(t.send_buffer),
                            match t.send_buffer_raises {
                                0 => String::new(),
                                n => format!(" (raised online {n} time(s))"),
                            }
                        );
                    }
                }
                if let Some(l) = human::limit_shares(&s.intervals) {
                    outln!("limited by: {l}");
                }
                if let Some(p) = &s.path {
                    let w = &p.window;
                    outln!(
                        "path: RTT {:.1} ms; {} stream(s){}, {} in flight each (up to {} per stream), {}{}",
                        f64::from(w.rtt_us) / 1e3,
                        w.streams,
                        match (&p.remembered, w.auto_streams) {
                            (Some(r), _) => format!(
                                " sized for {} (doctor measured {})",
                                units::format_rate(w.target_bps as f64),
                                units::format_rate(r.bits_per_second)
                            ),
                            (None, true) => " sized for it".into(),
                            (None, false) => String::new(),
                        },
                        units::format_bytes(w.stream_window),
                        units::format_rate(w.stream_ceiling_bps),
                        p.congestion,
                        p.pacing.map_or(String::new(), |r| format!(
                            ", paced to {} each",
                            units::format_rate(r as f64 * 8.0)
                        )),
                    );
                }
                for w in &s.warnings {
                    errln!("longhaul: warning: {w}");
                }
                for p in &s.would_send {
                    outln!("would send: {p}");
                }
                if s.resent_changed > 0 {
                    errln!(
                        "longhaul: warning: {} file(s) changed while they were read and were sent again",
                        s.resent_changed
                    );
                }
                for p in &s.deleted {
                    outln!("{}: {p}", if dry_run { "would delete" } else { "deleted" });
                }
                for f in &s.failed {
                    errln!("longhaul: failed: {}: {}", f.path, f.error);
                }
                outln!(
                    "verified: {}",
                    if s.verified {
                        "every file, chunk by chunk (BLAKE3)"
                    } else {
                        "NO: some files failed"
                    }
                );
            }
            Ok(if s.failed.is_empty() {
                exit::OK
            } else {
                exit::PARTIAL
            })
        }
        Err(e) => {
            let f = Failure::from(e);
            if a.json {
                outln!(
                    "{}",
                    serde_json::json!({"format": "longhaul-cp", "format_version": json::CP_JSON_FORMAT_VERSION,
                        "error": {"message": f.message, "exit_code": f.code}})
                );
            }
            Err(f)
        }
    }
}

pub fn ls(a: LsArgs) -> Outcome {
    let opts = ClientOptions {
        security: a.security.security()?,
        ..ClientOptions::default()
    };
    print_result(
        longhaul_engine::xfer::client::ls(&a.target, &opts),
        a.json,
        |entries| {
            for e in entries {
                let kind = match e.kind {
                    longhaul_proto::xfer::Kind::Dir => 'd',
                    longhaul_proto::xfer::Kind::Symlink => 'l',
                    longhaul_proto::xfer::Kind::File | longhaul_proto::xfer::Kind::DirEnd => '-',
                };
                outln!("{kind} {:04o} {:>14} {}", e.mode, e.size, e.name);
            }
        },
    )
}
