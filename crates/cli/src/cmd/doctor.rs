//! `doctor` (what limits a path) and `bench disk` (what a directory's storage does).

use std::path::PathBuf;

use longhaul_engine::net::dial::ClientOptions;
use longhaul_engine::reach::{self, End};
use longhaul_engine::results::CommandReporter;

use super::{ended, usage, Failure, Outcome};
use crate::args::{ArchiveArgs, DiskArgs, DoctorArgs};
use crate::exit;
use crate::print::{self, json::Json};
use longhaul_archive::model::NewRun;

/// `doctor`: audits this host, or measures the path to a server and names what limits it.
pub fn doctor(a: DoctorArgs, archive: &ArchiveArgs) -> Outcome {
    let run = NewRun {
        kind: "doctor".into(),
        command: super::command_line(),
        remote_host: a.targets.last().cloned(),
        source: a.source.as_ref().map(|p| p.display().to_string()),
        ..NewRun::default()
    };
    let mut printer = super::archived(archive, run, print::outcome(a.json.then(Json::doctor)));
    let outcome = diagnose(&a, printer.as_mut());
    ended(printer.as_mut(), outcome)
}

fn diagnose(a: &DoctorArgs, printer: &mut dyn CommandReporter) -> Outcome {
    use longhaul_engine::doctor;
    if let Some(server) = &a.forget {
        return forget(server, printer);
    }
    let (source, remote) = targets(a)?;
    let mut o = doctor::DoctorOptions {
        perf_time: a.time,
        source,
        pull: a.pull,
        target_bps: a.rate,
        no_copy: a.no_copy,
        dest: a.dest.clone(),
        remember: (!a.no_remember).then(longhaul_engine::state::default_pathdb_file),
    };
    let Some(r) = remote else {
        printer.doctor(&doctor::local(&o));
        return Ok(exit::OK);
    };
    let mut opts = ClientOptions {
        connect_timeout: a.connect_timeout,
        security: a.security.security()?,
        interrupt: super::interrupt_flag(),
        ..ClientOptions::default()
    };
    // `HOST:path`: a one-shot far end over ssh, whose one secret admits
    // each of the doctor's control sessions.
    let mut target = [r];
    let far = reach::reach_ends(
        &mut target,
        &mut opts,
        &a.ssh.options(),
        doctor::CONTROL_SESSIONS.into(),
    )?;
    if far.is_some() && o.remember.take().is_some() {
        tracing::debug!("over ssh the far end's port is new each run: the path is not remembered");
    }
    let Some(remote) = target[0].server() else {
        return Err(usage(format!(
            "'{}' is not remote: name it [USER@]HOST:path (ssh), or longhaul://HOST/EXPORT/path or HOST:PORT:EXPORT/path (a server)",
            target[0].arg()
        )));
    };
    printer.status(&format!(
        "measuring the path to {} (about {} s)...",
        far.as_ref().map_or(remote.host.as_str(), |f| f.dest()),
        (a.time.as_secs_f64() * 2.0 + 8.0).round()
    ));
    let measure = || doctor::remote(&remote.host, &remote.export, &remote.path, &opts, &o);
    // A one-shot far end serves one doctor: no retries against it.
    let report = match &far {
        Some(_) => measure(),
        None => longhaul_engine::report::retrying(
            a.retry.retries,
            &opts.interrupt,
            super::unreachable,
            |_| measure(),
        ),
    };
    let report = over_ssh(far, report)?;
    printer.doctor(&report);
    Ok(exit::OK)
}

/// The source on this host and the far end, from the arguments (each
/// read once, as for cp): `[USER@]HOST:path` is a host over ssh; a
/// server is `longhaul://HOST[:PORT]/EXPORT/path` or `HOST:PORT:EXPORT/path`.
fn targets(a: &DoctorArgs) -> Result<(Option<PathBuf>, Option<End>), Failure> {
    let ends: Vec<End> = a.targets.iter().map(|t| End::read(t)).collect();
    let (source, remote) = match ends.as_slice() {
        [] => (a.source.clone(), None),
        [one] if one.is_remote() => (a.source.clone(), Some(one.clone())),
        [one] => (Some(PathBuf::from(one.arg())), None),
        [src, r] => (Some(PathBuf::from(src.arg())), Some(r.clone())),
        _ => unreachable!("clap takes at most two"),
    };
    if a.source.is_some() && (ends.len() == 2 || ends.iter().any(|t| !t.is_remote())) {
        return Err(usage(
            "name the source once: as the first argument or with --source",
        ));
    }
    if let [first, _] = ends.as_slice() {
        if first.is_remote() {
            return Err(usage(format!(
                "'{}' is remote: doctor takes [SOURCE] REMOTE, the source on this host",
                first.arg()
            )));
        }
    }
    if let Some(s) = &source {
        if let Err(e) = std::fs::symlink_metadata(s) {
            return Err(usage(format!(
                "cannot read the source {}: {e}",
                s.display()
            )));
        }
    }
    Ok((source, remote))
}

/// A doctor's report measured against a one-shot far end over ssh: the
/// far end ended, its failure explained, the report's notes saying so.
fn over_ssh(
    far: Option<super::remote::FarEnd>,
    report: Result<longhaul_engine::doctor::DoctorReport, longhaul_engine::EngineError>,
) -> Result<longhaul_engine::doctor::DoctorReport, Failure> {
    match far {
        Some(far) => {
            let report = report.map_err(|e| super::remote::explain(&far, e));
            let (opened, dest) = (far.opened(), far.dest().to_string());
            far.finish();
            let mut report = report?;
            report.notes.push(format!(
                "measured over ssh against a one-shot far end on {}; its path is not remembered for later copies (its port is new each run)",
                dest
            ));
            if let Some(o) = opened.filter(|o| o.opened_by == "far_end") {
                report.notes.push(format!(
                    "connections: opened by the far end ({}); the UDP loss probe needs a path the client can send to",
                    o.reason.unwrap_or_default()
                ));
            }
            Ok(report)
        }
        None => Ok(report?),
    }
}

/// `doctor --forget HOST[:PORT]`: drops what an earlier doctor remembered of the path.
fn forget(server: &str, printer: &mut dyn CommandReporter) -> Outcome {
    let file = longhaul_engine::state::default_pathdb_file();
    let host = longhaul_engine::net::dial::host_key(server);
    let gone = longhaul_engine::pathdb::forget(&file, &host).map_err(|e| Failure {
        code: exit::FAILED,
        message: format!(
            "cannot forget {host}'s path in {}: {e}; check that the file is writable",
            file.display()
        ),
    })?;
    printer.status(&if gone == 0 {
        format!("nothing was remembered of {host}'s path")
    } else {
        format!("forgot {host}'s path: later copies size their streams by their own probe")
    });
    Ok(exit::OK)
}

/// `bench disk`: measures a directory's storage.
pub fn bench_disk(a: DiskArgs, archive: &ArchiveArgs) -> Outcome {
    let run = NewRun {
        kind: "bench-disk".into(),
        command: super::command_line(),
        dest: Some(a.path.display().to_string()),
        ..NewRun::default()
    };
    let only = |t: &str| a.only.is_empty() || a.only.iter().any(|o| o == t);
    let b = longhaul_engine::bench::disk::DiskBench {
        file_size: a.size,
        block_size: usize::try_from(a.block_size).unwrap_or(usize::MAX),
        threads: a.threads,
        direct: !a.buffered,
        files: a.files,
        small_file_size: a.file_size,
        time_limit: a.time,
        write: only("write"),
        read: only("read"),
        ..longhaul_engine::bench::disk::DiskBench::new(a.path)
    };
    let mut printer = super::archived(archive, run, print::outcome(a.json.then(Json::disk)));
    let outcome = longhaul_engine::bench::disk::run(&b)
        .map(|r| {
            printer.disk(&r);
            exit::OK
        })
        .map_err(Into::into);
    ended(printer.as_mut(), outcome)
}
