//! The module layering of every crate in the workspace: no import circle
//! between the top-level modules of a crate, none between the child modules
//! of any module directory (a "room": `server/*`, `xfer/sink/*`), and the
//! engine's modules on the floors `docs/ARCHITECTURE.md` draws (a module
//! uses only modules on its own floor or below).
//!
//! It lives here, in the crate at the bottom of the workspace, because that
//! one builds fastest and has no dependencies: the check reads the sources
//! of all crates as text and needs nothing of their code.
//!
//! A reference is any `crate::`, `super::` or `self::` path (and, in a
//! module with children, a path that starts with a child's name), resolved
//! to the module it names (in `use` lines and in code alike; comments and
//! string literals are skipped). In a room, a reference counts for the
//! child it lands in. The crate root (`lib.rs`, `main.rs`) is a module of
//! its own, `(root)`, and so is each room's own file (`server/mod.rs`) in
//! its room. It is left out of the circle check: it is the room's glue,
//! which a library's modules use for its error type and a binary's `main`
//! uses to dispatch to every module. In the engine it is on the bottom
//! floor: `lib.rs` holds errors and constants and uses no module.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The root module's name in the graph.
const ROOT: &str = "(root)";

/// The crates whose sources the test reads.
const CRATES: [&str; 7] = ["proto", "engine", "archive", "fleet", "jobs", "view", "cli"];

/// The engine's floors, from the bottom: a module may use modules on its
/// own floor and below, never above. A new top-level module goes on the
/// lowest floor whose modules it needs.
const ENGINE_FLOORS: &[&[&str]] = &[
    &[ROOT, "report", "state", "stages", "process", "ssh", "end"],
    &["net", "wan", "pathdb"],
    &["perf", "xfer"],
    &["bench"],
    &["doctor"],
    &["server", "results"],
    &["reach"],
];

#[test]
fn no_import_circles() {
    let mut failures = Vec::new();
    for krate in CRATES {
        let src = crates_dir().join(krate).join("src");
        let refs = References::of_crate(&src);
        let top = Graph::of_room(&refs, &[]);
        assert!(
            top.modules.len() > 1,
            "found no modules in crates/{krate}/src: has the layout changed? update this test"
        );
        for room in refs.rooms() {
            let graph = Graph::of_room(&refs, &room);
            if let Some(circle) = graph.circle() {
                let at: String = room.iter().map(|r| format!("/{r}")).collect();
                failures.push(format!(
                    "crates/{krate}/src{at}: import circle {}\n{}",
                    circle.join(" -> "),
                    graph.evidence(&circle)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{}\nbreak the circle: move what the lower module needs down (or into a leaf module), \
         never up",
        failures.join("\n")
    );
}

/// A room with a circle fails, naming it; one without passes.
#[test]
fn a_circle_inside_a_room_is_found() {
    let dir = std::env::temp_dir().join(format!("layering-room-{}", std::process::id()));
    let room = dir.join("net");
    fs::create_dir_all(&room).expect("create the test crate");
    let write = |name: &str, text: &str| fs::write(room.join(name), text).expect("write");
    fs::write(dir.join("lib.rs"), "pub mod net;\n").expect("write");
    write("mod.rs", "pub mod sealed;\npub mod tls;\n");
    write("tls.rs", "pub fn suite() {}\n");
    write(
        "sealed.rs",
        "use super::tls::suite;\npub fn seal() { suite() }\n",
    );
    let refs = References::of_crate(&dir);
    assert_eq!(
        refs.rooms(),
        vec![Vec::<String>::new(), vec!["net".to_string()]]
    );
    assert_eq!(Graph::of_room(&refs, &["net".to_string()]).circle(), None);
    write("tls.rs", "pub fn suite() { crate::net::sealed::seal() }\n");
    let refs = References::of_crate(&dir);
    let graph = Graph::of_room(&refs, &["net".to_string()]);
    let circle = graph.circle().expect("the circle is found");
    let evidence = graph.evidence(&circle);
    fs::remove_dir_all(&dir).expect("remove the test crate");
    assert_eq!(circle.len(), 3, "{circle:?}");
    assert!(evidence.contains("src/net/sealed.rs:1"), "{evidence}");
    assert!(evidence.contains("src/net/tls.rs:1"), "{evidence}");
}

#[test]
fn engine_modules_stay_on_their_floors() {
    let refs = References::of_crate(&crates_dir().join("engine").join("src"));
    let graph = Graph::of_room(&refs, &[]);
    let floor_of = |m: &str| ENGINE_FLOORS.iter().position(|f| f.contains(&m));
    let mut failures = Vec::new();
    for m in &graph.modules {
        if floor_of(m).is_none() {
            failures.push(format!(
                "module `{m}` is on no floor: add it to ENGINE_FLOORS in {} and to the \
                 diagram in docs/ARCHITECTURE.md",
                file!()
            ));
        }
    }
    for ((from, to), (file, line)) in &graph.edges {
        if let (Some(a), Some(b)) = (floor_of(from), floor_of(to)) {
            if b > a {
                failures.push(format!(
                    "`{from}` (floor {a}) uses `{to}` (floor {b}), which is above it, at \
                     crates/engine/src/{file}:{line}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Prints who uses whom in each room of each crate:
/// `cargo test -p longhaul-proto --test layering -- --ignored --nocapture`.
#[test]
#[ignore = "prints the graphs; run by hand"]
fn print_graphs() {
    for krate in CRATES {
        let refs = References::of_crate(&crates_dir().join(krate).join("src"));
        for room in refs.rooms() {
            let graph = Graph::of_room(&refs, &room);
            let at: String = room.iter().map(|r| format!("/{r}")).collect();
            println!("crates/{krate}/src{at}:");
            for m in &graph.modules {
                let used: Vec<&str> = graph
                    .edges
                    .keys()
                    .filter(|(from, _)| from == m)
                    .map(|(_, to)| to.as_str())
                    .collect();
                println!("  {m} -> {}", used.join(", "));
            }
        }
    }
}

/// The directory that holds the workspace's crates.
fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/proto has a parent")
        .to_path_buf()
}

/// Every module of one crate and every reference between them.
struct References {
    /// Each module's path below the crate root (the root's is empty).
    modules: BTreeSet<Vec<String>>,
    uses: Vec<Use>,
}

/// One reference: the module whose code makes it, the path it names
/// (resolved from the crate root), and where (file relative to src/, line).
struct Use {
    from: Vec<String>,
    to: Vec<String>,
    file: String,
    line: usize,
}

impl References {
    fn of_crate(src: &Path) -> References {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        files.sort();
        let rel = |f: &Path| f.strip_prefix(src).expect("under src").to_path_buf();
        let modules: BTreeSet<Vec<String>> = files.iter().map(|f| file_module(&rel(f))).collect();
        let mut uses = Vec::new();
        for f in &files {
            let r = rel(f);
            let text = fs::read_to_string(f)
                .unwrap_or_else(|e| panic!("failed to read {}: {e}", f.display()));
            let from = file_module(&r);
            for (line, to) in references(&strip(&text), &from, &modules) {
                uses.push(Use {
                    from: from.clone(),
                    to,
                    file: r.display().to_string(),
                    line,
                });
            }
        }
        References { modules, uses }
    }

    /// The crate root and every module with children of its own, each a
    /// room whose children must form no circle.
    fn rooms(&self) -> Vec<Vec<String>> {
        let rooms: BTreeSet<Vec<String>> = self
            .modules
            .iter()
            .flat_map(|m| (0..m.len()).map(move |k| m[..k].to_vec()))
            .collect();
        rooms.into_iter().collect()
    }
}

/// The child modules of one room (the crate root or a module directory)
/// and who uses whom among them; the room's own file is `(root)`.
struct Graph {
    modules: BTreeSet<String>,
    /// (user, used) -> the first place (file relative to src/, line) it is used.
    edges: BTreeMap<(String, String), (String, usize)>,
}

impl Graph {
    fn of_room(refs: &References, room: &[String]) -> Graph {
        let depth = room.len();
        let child = |path: &[String]| -> Option<String> {
            (path.len() > depth && path.starts_with(room)).then(|| path[depth].clone())
        };
        let mut modules: BTreeSet<String> = refs.modules.iter().filter_map(|m| child(m)).collect();
        modules.insert(ROOT.to_string());
        let mut edges = BTreeMap::new();
        for u in refs.uses.iter().filter(|u| u.from.starts_with(room)) {
            if !u.to.starts_with(room) {
                continue;
            }
            let from = child(&u.from).unwrap_or_else(|| ROOT.to_string());
            let to = child(&u.to)
                .filter(|c| modules.contains(c))
                .unwrap_or_else(|| ROOT.to_string());
            if to != from {
                edges
                    .entry((from, to))
                    .or_insert_with(|| (u.file.clone(), u.line));
            }
        }
        Graph { modules, edges }
    }

    /// One circle of the graph, as `a -> b -> ... -> a`, if there is any
    /// (uses of the root left out).
    fn circle(&self) -> Option<Vec<String>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        fn visit(
            g: &Graph,
            m: &str,
            marks: &mut BTreeMap<String, Mark>,
            stack: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            marks.insert(m.to_string(), Mark::Open);
            stack.push(m.to_string());
            for (from, to) in g.edges.keys() {
                if from != m || to == ROOT {
                    continue;
                }
                match marks[to.as_str()] {
                    Mark::Open => {
                        let at = stack
                            .iter()
                            .position(|s| s == to)
                            .expect("open is on the stack");
                        let mut c = stack[at..].to_vec();
                        c.push(to.clone());
                        return Some(c);
                    }
                    Mark::New => {
                        if let Some(c) = visit(g, to, marks, stack) {
                            return Some(c);
                        }
                    }
                    Mark::Done => {}
                }
            }
            stack.pop();
            marks.insert(m.to_string(), Mark::Done);
            None
        }
        let mut marks: BTreeMap<String, Mark> = self
            .modules
            .iter()
            .map(|m| (m.clone(), Mark::New))
            .collect();
        for m in &self.modules {
            if marks[m.as_str()] == Mark::New {
                if let Some(c) = visit(self, m, &mut marks, &mut Vec::new()) {
                    return Some(c);
                }
            }
        }
        None
    }

    /// Where each step of a circle is taken.
    fn evidence(&self, circle: &[String]) -> String {
        circle
            .windows(2)
            .map(|w| {
                let (file, line) = &self.edges[&(w[0].clone(), w[1].clone())];
                format!("  {} uses {} at src/{file}:{line}", w[0], w[1])
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|e| panic!("failed to list {}: {e}", dir.display()));
    for e in entries {
        let p = e.expect("directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file relative to src/: `net/dial.rs` is
/// `[net, dial]`, `net/mod.rs` is `[net]`, `lib.rs` is `[]` (a file of a
/// binary's `src/bin/` is a root of its own, also `[]`).
fn file_module(rel: &Path) -> Vec<String> {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    match parts.as_slice() {
        [one] if one == "lib" || one == "main" => Vec::new(),
        [bin, ..] if bin == "bin" => Vec::new(),
        _ => {
            let mut p = parts;
            if p.last().is_some_and(|l| l == "mod") {
                p.pop();
            }
            p
        }
    }
}

/// The source with comments, string and char literals blanked out (line
/// breaks kept, so line numbers still hold).
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| {
        for &c in s {
            out.push(if c == b'\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, 0);
            while j < rest.len() {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, &rest[..j]);
            i += j;
        } else if let Some(len) = raw_string(rest) {
            blank(&mut out, &rest[..len]);
            i += len;
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'\'' {
            // A char literal ('x', '\n', '\u{..}', '"'); anything else is a lifetime.
            let len = if rest.len() > 3 && rest[1] == b'\\' {
                rest[3..].iter().position(|&c| c == b'\'').map(|p| p + 4)
            } else {
                text[i + 1..]
                    .chars()
                    .next()
                    .map(char::len_utf8)
                    .filter(|&n| rest.get(1 + n) == Some(&b'\''))
                    .map(|n| n + 2)
            };
            let len = len.unwrap_or(1);
            blank(&mut out, &rest[..len]);
            i += len;
        } else {
            let n = text[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&text[i..i + n]);
            i += n;
        }
    }
    out
}

/// The length of a raw string literal (`r"…"`, `r#"…"#`, `br"…"`) at the
/// start of `s`, if one starts there.
fn raw_string(s: &[u8]) -> Option<usize> {
    let start = if s.starts_with(b"br") {
        2
    } else if s.starts_with(b"r") {
        1
    } else {
        return None;
    };
    let hashes = s[start..].iter().take_while(|&&c| c == b'#').count();
    if s.get(start + hashes) != Some(&b'"') {
        return None;
    }
    let close: Vec<u8> = std::iter::once(b'"')
        .chain(std::iter::repeat_n(b'#', hashes))
        .collect();
    let body = start + hashes + 1;
    let end = s[body..]
        .windows(close.len())
        .position(|w| w == close.as_slice())?;
    Some(body + end + close.len())
}

/// The tokens of stripped source: identifiers, `::` and single punctuation,
/// each with its line.
fn tokens(src: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut line = 1;
    let mut chars = src.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '\n' {
            line += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if !(d.is_alphanumeric() || d == '_') {
                    break;
                }
                end = j + d.len_utf8();
                chars.next();
            }
            out.push((src[i..end].to_string(), line));
        } else if c == ':' && chars.peek().is_some_and(|&(_, d)| d == ':') {
            chars.next();
            out.push(("::".to_string(), line));
        } else if !c.is_whitespace() {
            out.push((c.to_string(), line));
        }
    }
    out
}

/// Every path that code in the module `path` names through `crate::`,
/// `super::` or `self::`, or through the name of one of its own child
/// modules (`cmd::run` in a binary's root, `copy::serve` in `server/mod.rs`),
/// resolved from the crate root, with its line.
fn references(
    src: &str,
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Vec<(usize, Vec<String>)> {
    let toks = tokens(src);
    let tok = |i: usize| toks.get(i).map_or("", |t| t.0.as_str());
    // Inline modules (`mod tests { .. }`) deepen the path for `super::`:
    // each with the brace depth it opened at.
    let mut inline: Vec<(usize, String)> = Vec::new();
    let mut depth = 0usize;
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = tok(i);
        if t == "mod" && tok(i + 2) == "{" {
            inline.push((depth, tok(i + 1).to_string()));
            depth += 1;
            i += 3;
            continue;
        }
        if t == "{" {
            depth += 1;
        } else if t == "}" {
            depth = depth.saturating_sub(1);
            if inline.last().is_some_and(|(d, _)| *d == depth) {
                inline.pop();
            }
        }
        let preceded_by_path = i > 0 && tok(i - 1) == "::";
        if tok(i + 1) != "::" || preceded_by_path {
            i += 1;
            continue;
        }
        let mut here: Vec<String> = path.to_vec();
        here.extend(inline.iter().map(|(_, name)| name.clone()));
        let line = toks[i].1;
        let (base, j) = match t {
            "crate" => (Vec::new(), i + 2),
            "self" => (here, i + 2),
            "super" => {
                let mut j = i;
                while tok(j) == "super" && tok(j + 1) == "::" {
                    here.pop();
                    j += 2;
                }
                (here, j)
            }
            _ => {
                let mut child = path.to_vec();
                child.push(t.to_string());
                if inline.is_empty() && modules.contains(&child) {
                    (path.to_vec(), i)
                } else {
                    i += 1;
                    continue;
                }
            }
        };
        for tail in path_tree(&toks, j) {
            let mut full = base.clone();
            full.extend(tail);
            out.push((line, full));
        }
        i = j.max(i + 1);
    }
    out
}

/// The paths named from `at` on: `a::b::c` is one, `a::{b::c, d}` two
/// (`[a, b, c]`, `[a, d]`); `self` in a group names the group's prefix.
fn path_tree(toks: &[(String, usize)], at: usize) -> Vec<Vec<String>> {
    let tok = |i: usize| toks.get(i).map_or("", |t| t.0.as_str());
    let is_ident = |t: &str| {
        t.chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
            && t != "self"
    };
    let mut prefix = Vec::new();
    let mut k = at;
    loop {
        let t = tok(k);
        if t == "{" {
            let mut out = Vec::new();
            let mut depth = 0;
            let mut item_start = true;
            for (n, (t, _)) in toks.iter().enumerate().skip(k) {
                match t.as_str() {
                    "{" => depth += 1,
                    "}" => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    "," if depth == 1 => {
                        item_start = true;
                        continue;
                    }
                    _ => {}
                }
                if depth == 1 && item_start && t != "{" {
                    item_start = false;
                    for tail in path_tree(toks, n) {
                        let mut full = prefix.clone();
                        full.extend(tail);
                        out.push(full);
                    }
                }
            }
            return out;
        }
        if !is_ident(t) {
            break;
        }
        prefix.push(t.to_string());
        if tok(k + 1) != "::" {
            break;
        }
        k += 2;
    }
    vec![prefix]
}
