//! `ls` for people: names, or `-l`'s long lines.

use longhaul_proto::units::format_bytes;
use longhaul_proto::xfer::{Kind, ListEntry};

use super::ListStyle;

/// The entries of a listing, in `style`.
pub(super) fn print_listing(style: ListStyle, entries: &[ListEntry]) {
    let size = |e: &ListEntry| match style.human_sizes {
        true => format_bytes(e.size),
        false => e.size.to_string(),
    };
    let width = entries.iter().map(|e| size(e).len()).max().unwrap_or(0);
    for e in entries {
        let name = longhaul_proto::units::escaped(&e.name);
        if !style.long {
            outln!("{name}");
            continue;
        }
        let when = longhaul_archive::when::utc(e.mtime_ns as f64 / 1e9)
            .map(|t| t[..16].to_string())
            .unwrap_or_else(|| "????-??-?? ??:??".into());
        let link = match &e.target {
            Some(t) => format!(" -> {}", longhaul_proto::units::escaped(t)),
            None => String::new(),
        };
        outln!(
            "{} {:>width$} {when} {name}{link}",
            mode_string(e.kind, e.mode),
            size(e)
        );
    }
}

/// `drwxr-xr-x`, as `ls -l` shows a type and mode (setuid and setgid as
/// `s`/`S`, sticky as `t`/`T`).
fn mode_string(kind: Kind, mode: u32) -> String {
    let mut out = String::with_capacity(10);
    out.push(match kind {
        Kind::Dir => 'd',
        Kind::Symlink => 'l',
        Kind::File | Kind::DirEnd => '-',
    });
    // (read, write, execute bits, the special bit over this triple, its letter)
    let triples = [
        (0o400, 0o200, 0o100, 0o4000, 's'),
        (0o040, 0o020, 0o010, 0o2000, 's'),
        (0o004, 0o002, 0o001, 0o1000, 't'),
    ];
    for (r, w, x, special, letter) in triples {
        out.push(if mode & r != 0 { 'r' } else { '-' });
        out.push(if mode & w != 0 { 'w' } else { '-' });
        out.push(match (mode & x != 0, mode & special != 0) {
            (true, true) => letter,
            (false, true) => letter.to_ascii_uppercase(),
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    out
}

#[cfg(test)]
mod list_tests {
    use super::*;

    #[test]
    fn modes_read_as_ls_shows_them() {
        assert_eq!(mode_string(Kind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(Kind::File, 0o644), "-rw-r--r--");
        assert_eq!(mode_string(Kind::Symlink, 0o777), "lrwxrwxrwx");
        assert_eq!(mode_string(Kind::File, 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_string(Kind::File, 0o2644), "-rw-r-Sr--");
        assert_eq!(mode_string(Kind::Dir, 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(Kind::Dir, 0o1770), "drwxrwx--T");
        assert_eq!(mode_string(Kind::File, 0), "----------");
    }
}
