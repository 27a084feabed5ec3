//! What a matrix says under its tables, the same words for the command
//! (`longhaul matrix`) and for an archived matrix (`longhaul show`): the
//! limits measured in the same run, each cell's note or error, what a
//! tool did not keep, the settings' arguments; and `show`'s line per cell.

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

/// A cell's `*` line: what of the tree its tool did not keep.
pub fn not_kept_line(c: &longhaul_archive::matrix::Cell) -> Option<String> {
    (!c.not_kept.is_empty()).then(|| {
        format!(
            "* {} ({}) {} {} {}: does not keep {} (nor claims to; marked, not failed)",
            c.tool,
            c.settings,
            c.path,
            c.workload,
            c.direction,
            c.not_kept.join(", ")
        )
    })
}

/// Arguments as a reader would type them (quoted where needed).
pub fn args_text(args: &[String]) -> String {
    if args.is_empty() {
        return "(no options)".into();
    }
    shlex::try_join(args.iter().map(String::as_str)).unwrap_or_else(|_| args.join(" "))
}
