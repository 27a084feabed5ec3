//! `plot`: a run's intervals drawn to SVG or PNG, or a matrix run's cells
//! (the drawing: [`longhaul_view::plot`]). Reads the archive read-only.

use longhaul_view::plot::{self, PlotError};

use super::archive::archive_failure;
use super::{usage, Failure, Outcome};
use crate::args::{ArchiveArgs, PlotArgs};
use crate::exit;

/// `longhaul plot`.
pub fn plot(a: PlotArgs, archive: &ArchiveArgs) -> Outcome {
    // The file name first: a wrong extension is told before any reading.
    plot::format_of(&a.output).map_err(plot_failure)?;
    let archive = super::archive::open(archive)?;
    let id = archive.resolve(&a.run).map_err(archive_failure)?;
    let detail = archive.run(id).map_err(archive_failure)?;
    if detail.run.kind == longhaul_archive::matrix::KIND {
        let m = longhaul_archive::matrix::Document::of(&detail).unwrap_or_default();
        plot::matrix::render(&detail.run, &m, &a.output).map_err(plot_failure)?;
        let counts = plot::matrix::counts(&m);
        wrote(
            &a.output,
            (counts.cells, "cell"),
            (counts.panels, "workload panel"),
        );
        return Ok(exit::OK);
    }
    plot::render(&detail, &a.output).map_err(plot_failure)?;
    let counts = plot::counts(&detail);
    wrote(
        &a.output,
        (counts.intervals, "interval"),
        (counts.streams, "stream"),
    );
    Ok(exit::OK)
}

/// `wrote FILE (N things, M others)`.
fn wrote(file: &std::path::Path, (n, what): (usize, &str), (m, others): (usize, &str)) {
    outln!(
        "wrote {} ({n} {what}{}, {m} {others}{})",
        file.display(),
        crate::print::plural(n as u64),
        crate::print::plural(m as u64)
    );
}

fn plot_failure(e: PlotError) -> Failure {
    match e {
        PlotError::NoIntervals(_)
        | PlotError::NoCells(_)
        | PlotError::Format { .. }
        | PlotError::Write { .. } => usage(e.to_string()),
        PlotError::Font | PlotError::Draw(_) => Failure::internal(e.to_string()),
    }
}
