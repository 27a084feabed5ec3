//! `dashboard`: the web page of live runs, history and run graphs.

use super::{usage, Failure, Outcome};
use crate::args::{ArchiveArgs, DashboardArgs};
use crate::exit;
use longhaul_view::dashboard::{serve_dashboard, DashboardError, DashboardOptions};

/// `longhaul dashboard`.
pub fn dashboard(a: DashboardArgs, archive: &ArchiveArgs) -> Outcome {
    let Some(archive_path) = archive
        .archive
        .clone()
        .or_else(longhaul_archive::default_path)
    else {
        return Err(usage(
            "dashboard: no archive to read: HOME is not set; give --archive FILE",
        ));
    };
    let token = match &a.token_file {
        Some(p) => {
            let t = std::fs::read_to_string(p).map_err(|e| {
                usage(format!(
                    "dashboard: cannot read the token file {}: {e}",
                    p.display()
                ))
            })?;
            Some(t.trim().to_string())
        }
        None => None,
    };
    let opts = DashboardOptions {
        listen: a.listen,
        archive_path,
        token,
    };
    let path = opts.archive_path.clone();
    let off_loopback = !opts.listen.ip().is_loopback();
    serve_dashboard(opts, |addr| {
        crate::outln!("dashboard: http://{addr}/");
        crate::errln!("dashboard: reading {}", path.display());
        if off_loopback {
            crate::errln!(
                "dashboard: serving plain HTTP off loopback: the token and the runs cross the network unencrypted; put it behind a TLS proxy or reach it through an SSH tunnel"
            );
        }
    })
    .map_err(|e| match e {
        DashboardError::OpenOffLoopback(_) | DashboardError::EmptyToken => usage(e.to_string()),
        DashboardError::Bind { .. } | DashboardError::Runtime(_) => Failure {
            code: exit::FAILED,
            message: e.to_string(),
        },
    })?;
    Ok(exit::OK)
}
