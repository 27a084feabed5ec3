//! The matrix printed, one printer for the command (`longhaul matrix`)
//! and for an archived matrix (`longhaul show`): its tables, the ratio
//! lines ([`ratios`]) and the words under them (the limits measured in
//! the same run, each cell's note or error, the settings' arguments).

use longhaul_archive::matrix::Document;

pub(crate) mod ratios;
mod table;

pub use table::{print, tables, Form};

/// `limits in the same run: ...` (of a merged document, `limits measured
/// by the merged pieces`: its cells are theirs), each rate in the caller's
/// unit, the memory-to-memory one with its runs' length; None when none
/// was measured.
pub fn limits_line(doc: &Document, rate: impl Fn(f64) -> String) -> Option<String> {
    let l = &doc.limits;
    let mut lim = Vec::new();
    for (p, v) in &l.path_bytes_per_second {
        lim.push(format!("the path {p}'s rate {}", rate(*v)));
    }
    for (p, v) in &l.mem_to_mem_bytes_per_second {
        lim.push(format!(
            "memory to memory on {p} {} (runs of {} s, --seconds)",
            rate(*v),
            doc.params.mem_seconds
        ));
    }
    for (w, v) in &l.local_copy_bytes_per_second {
        lim.push(format!("local copy of {w} at its fastest {}", rate(*v)));
    }
    if let Some(v) = l.destination_write_bytes_per_second {
        lim.push(format!("destination write {}", rate(v)));
    }
    let whose = if doc.merged.is_empty() {
        "limits in the same run"
    } else {
        "limits measured by the merged pieces"
    };
    (!lim.is_empty()).then(|| format!("{whose}: {}", lim.join("; ")))
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

/// Arguments as a reader would type them (quoted where needed).
pub fn args_text(args: &[String]) -> String {
    if args.is_empty() {
        return "(no options)".into();
    }
    shlex::try_join(args.iter().map(String::as_str)).unwrap_or_else(|_| args.join(" "))
}
