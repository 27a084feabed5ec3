//! `doctor` (what limits a path) and `bench disk` (what a directory's storage does).

use std::path::PathBuf;

use longhaul_engine::net::dial::ClientOptions;
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
    let is_remote = |t: &String| longhaul_proto::xfer::parse_remote(t).is_some();
    let (source, remote) = match a.targets.as_slice() {
        [] => (a.source.clone(), None),
        [one] if is_remote(one) => (a.source.clone(), Some(one.clone())),
        [one] => (Some(PathBuf::from(one)), None),
        [src, r] => (Some(PathBuf::from(src)), Some(r.clone())),
        _ => unreachable!("clap takes at most two"),
    };
    if a.source.is_some() && (a.targets.len() == 2 || a.targets.iter().any(|t| !is_remote(t))) {
        return Err(usage(
            "name the source once: as the first argument or with --source",
        ));
    }
    if let [first, _] = a.targets.as_slice() {
        if is_remote(first) {
            return Err(usage(format!(
                "'{first}' is remote: doctor takes [SOURCE] REMOTE, the source on this host"
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
    let o = doctor::DoctorOptions {
        perf_time: a.time,
        source,
        pull: a.pull,
        target_bps: a.rate,
        no_copy: a.no_copy,
        dest: a.dest.clone(),
        remember: (!a.no_remember).then(longhaul_engine::state::default_pathdb_file),
    };
    let report = match &remote {
        None => Ok(doctor::local(&o)),
        Some(r) => {
            let Some(remote) = longhaul_proto::xfer::parse_remote(r) else {
                return Err(usage(format!(
                    "'{r}' is not remote: name it HOST:EXPORT/path or longhaul://HOST/EXPORT/path"
                )));
            };
            let security = a.security.security()?;
            let opts = ClientOptions {
                connect_timeout: a.connect_timeout,
                security,
                interrupt: super::interrupt_flag(),
                ..ClientOptions::default()
            };
            printer.status(&format!(
                "measuring the path to {} (about {} s)...",
                remote.host,
                (a.time.as_secs_f64() * 2.0 + 8.0).round()
            ));
            longhaul_engine::report::retrying(
                a.retry.retries,
                &opts.interrupt,
                super::unreachable,
                |_| doctor::remote(&remote.host, &remote.export, &remote.path, &opts, &o),
            )
        }
    };
    printer.doctor(&report?);
    Ok(exit::OK)
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
