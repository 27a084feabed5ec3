//! `plot`: a run's intervals drawn to SVG or PNG (the drawing:
//! [`longhaul_view::plot`]). Reads the archive read-only.

use longhaul_archive::{Archive, ArchiveError};
use longhaul_view::plot::{self, PlotError};

use super::{usage, Failure, Outcome};
use crate::args::{ArchiveArgs, PlotArgs};
use crate::exit;

/// `longhaul plot`.
pub fn plot(a: PlotArgs, archive: &ArchiveArgs) -> Outcome {
    // The file name first: a wrong extension is told before any reading.
    plot::format_of(&a.output).map_err(plot_failure)?;
    let path = archive
        .archive
        .clone()
        .or_else(longhaul_archive::default_path)
        .ok_or_else(|| usage("no archive: HOME is not set; name one with --archive FILE"))?;
    let archive = Archive::open_read_only(&path).map_err(archive_failure)?;
    let id = archive.resolve(&a.run).map_err(archive_failure)?;
    let detail = archive.run(id).map_err(archive_failure)?;
    plot::render(&detail, &a.output).map_err(plot_failure)?;
    let counts = plot::counts(&detail);
    outln!(
        "wrote {} ({} interval{}, {} stream{})",
        a.output.display(),
        counts.intervals,
        plural(counts.intervals),
        counts.streams,
        plural(counts.streams)
    );
    Ok(exit::OK)
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A missing archive or run, a damaged or newer file: the user's to fix;
/// a read that failed: the command failed.
fn archive_failure(e: ArchiveError) -> Failure {
    let code = match e {
        ArchiveError::Io { .. } => exit::FAILED,
        _ => exit::USAGE,
    };
    Failure {
        code,
        message: e.to_string(),
    }
}

fn plot_failure(e: PlotError) -> Failure {
    match e {
        PlotError::NoIntervals(_) | PlotError::Format { .. } | PlotError::Write { .. } => {
            usage(e.to_string())
        }
        PlotError::Font | PlotError::Draw(_) => Failure::internal(e.to_string()),
    }
}
