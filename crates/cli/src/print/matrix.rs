//! The matrix printed, one printer for the command (`longhaul matrix`)
//! and for an archived matrix (`longhaul show`): its tables, the ratio
//! lines ([`ratios`]) and the words under them (the limits measured in
//! the same run, each cell's note or error, the settings' arguments).

use longhaul_archive::matrix::{Document, HostTuning};

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

/// How the paths' hosts were set up, when the matrix tuned an emulated
/// path's two hosts ([`HostTuning`]) or ran on a far host: the TCP
/// autotuning maxima it set, the host's net.core caps (not per
/// namespace), loopback's and a far host's own settings. None for a
/// document with neither.
pub fn hosts_line(doc: &Document) -> Option<String> {
    use longhaul_proto::units::format_bytes;
    let tuned = &doc.limits.host_tuning;
    let mut parts = Vec::new();
    for p in &doc.paths {
        if let Some(t) = tuned.get(&p.name) {
            parts.push(format!("{}: {}", p.name, host_tuning_text(t)));
        } else if p.far.is_some() {
            parts.push(format!("{}: a real host, with its own settings", p.name));
        } else if p.name == "loopback" {
            parts.push("loopback: this host's own settings".into());
        }
    }
    if tuned.is_empty() && doc.paths.iter().all(|p| p.far.is_none()) {
        return None;
    }
    let cap = |v: Option<u64>| v.map_or("?".into(), format_bytes);
    if let Some(core) = tuned.values().next() {
        parts.push(format!(
            "net.core.wmem_max and rmem_max, which bound an explicit SO_SNDBUF or SO_RCVBUF (the kernel doubles it), are not per namespace: the host's {} and {}",
            cap(core.wmem_max),
            cap(core.rmem_max)
        ));
    }
    Some(format!("hosts: {}", parts.join("; ")))
}

/// `both hosts' TCP autotuning maximum raised to N (2x the path's BDP)`,
/// for sending and receiving where they differ.
pub fn host_tuning_text(t: &HostTuning) -> String {
    use longhaul_proto::units::format_bytes;
    let twice = t.bdp_bytes.saturating_mul(2);
    let one = |max: u64| {
        if max == twice {
            format!("raised to {} (2x the path's BDP)", format_bytes(max))
        } else {
            format!(
                "at {} (more than 2x the path's BDP, {})",
                format_bytes(max),
                format_bytes(twice)
            )
        }
    };
    if t.tcp_wmem_max == t.tcp_rmem_max {
        format!("both hosts' TCP autotuning maximum {}", one(t.tcp_wmem_max))
    } else {
        format!(
            "both hosts' TCP autotuning maximum for sending (tcp_wmem) {}, for receiving (tcp_rmem) {}",
            one(t.tcp_wmem_max),
            one(t.tcp_rmem_max)
        )
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_archive::matrix::PathSpec;

    #[test]
    fn the_hosts_line_says_how_each_paths_hosts_were_tuned() {
        let path = |name: &str, far: Option<&str>| PathSpec {
            name: name.into(),
            far: far.map(Into::into),
            ..PathSpec::default()
        };
        let mut doc = Document {
            paths: vec![
                path("loopback", None),
                path("80ms", None),
                path("satellite", None),
                path("far:dtn2", Some("dtn2")),
            ],
            ..Document::default()
        };
        assert_eq!(
            hosts_line(&Document {
                paths: vec![path("loopback", None), path("80ms", None)],
                ..Document::default()
            }),
            None,
            "an older document says nothing"
        );
        assert_eq!(
            hosts_line(&doc).as_deref(),
            Some("hosts: loopback: this host's own settings; far:dtn2: a real host, with its own settings")
        );
        let tuned = |bdp: u64, w: u64, r: u64| HostTuning {
            tcp_wmem_max: w,
            tcp_rmem_max: r,
            bdp_bytes: bdp,
            wmem_max: Some(4 << 20),
            rmem_max: Some(4 << 20),
        };
        doc.limits
            .host_tuning
            .insert("80ms".into(), tuned(10 << 20, 20 << 20, 32 << 20));
        doc.limits
            .host_tuning
            .insert("satellite".into(), tuned(64 << 20, 128 << 20, 128 << 20));
        let l = hosts_line(&doc).unwrap();
        for want in [
            "loopback: this host's own settings",
            "80ms: both hosts' TCP autotuning maximum for sending (tcp_wmem) raised to 20.0 MiB (2x the path's BDP), for receiving (tcp_rmem) at 32.0 MiB (more than 2x the path's BDP, 20.0 MiB)",
            "satellite: both hosts' TCP autotuning maximum raised to 128 MiB (2x the path's BDP)",
            "far:dtn2: a real host, with its own settings",
            "not per namespace: the host's 4.00 MiB and 4.00 MiB",
        ] {
            assert!(l.contains(want), "{want}\n{l}");
        }
    }
}
