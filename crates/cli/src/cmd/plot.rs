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
        outln!(
            "wrote {} ({} cell{}, {} workload panel{})",
            a.output.display(),
            counts.cells,
            crate::print::plural(counts.cells as u64),
            counts.panels,
            crate::print::plural(counts.panels as u64)
        );
        return Ok(exit::OK);
    }
    plot::render(&detail, &a.output).map_err(plot_failure)?;
    let counts = plot::counts(&detail);
    outln!(
        "wrote {} ({} interval{}, {} stream{})",
        a.output.display(),
        counts.intervals,
        crate::print::plural(counts.intervals as u64),
        counts.streams,
        crate::print::plural(counts.streams as u64)
    );
    Ok(exit::OK)
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
