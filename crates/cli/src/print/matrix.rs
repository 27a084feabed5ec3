//! What a matrix says under its tables, the same words for the command
//! (`longhaul matrix`) and for an archived matrix (`longhaul show`): the
//! limits measured in the same run, and each cell's note or error.

use longhaul_archive::matrix::Limits;

/// `limits in the same run: ...`, each rate in the caller's unit; None
/// when none was measured.
pub fn limits_line(l: &Limits, rate: impl Fn(f64) -> String) -> Option<String> {
    let mut lim = Vec::new();
    for (p, v) in &l.path_bytes_per_second {
        lim.push(format!("the path {p}'s rate {}", rate(*v)));
    }
    for (p, v) in &l.mem_to_mem_bytes_per_second {
        lim.push(format!("memory to memory on {p} {}", rate(*v)));
    }
    for (w, v) in &l.local_copy_bytes_per_second {
        lim.push(format!("local copy of {w} {}", rate(*v)));
    }
    if let Some(v) = l.destination_write_bytes_per_second {
        lim.push(format!("destination write {}", rate(v)));
    }
    (!lim.is_empty()).then(|| format!("limits in the same run: {}", lim.join("; ")))
}

/// A cell's note (or error), named by its tool, settings, path, workload
/// and direction.
pub fn note_line(c: &longhaul_archive::matrix::Cell) -> Option<String> {
    let text = c.note.as_deref().or(c.error.as_deref())?;
    Some(format!(
        "note: {} ({}) {} {} {}: {text}",
        c.tool, c.settings, c.path, c.workload, c.direction
    ))
}
