//! docs/ARCHITECTURE.md's map matches the tree: every module of every
//! crate (each `.rs` file and each module directory under `crates/*/src`)
//! is named in it. Like `layering.rs` beside it, it reads the sources and
//! the map as text.
//!
//! A module counts as named when the map holds one of:
//! - its path from its crate's `src/`, whole or without leading directories
//!   (`cmd/matrix/far.rs`, `matrix/far.rs`), or as a Rust path
//!   (`xfer::source::walk`, `archive::when`) of at least two names, or
//!   after its crate's directory (`fleet/dbauth.rs`);
//! - its file name (`walk.rs`, `source/`) on a line that also names its
//!   parent module (`source/`, `` `source` ``, `source::`, `source.rs`);
//! - for a top-level module, its file name anywhere, or its name as code
//!   (`` `when` ``).
//!
//! A crate root (`lib.rs`, `main.rs`) and a directory's `mod.rs` are the
//! crate or the directory, and not asked for on their own.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

#[test]
fn every_module_in_the_tree_is_named_in_the_architecture_map() {
    let map_path = workspace().join("docs").join("ARCHITECTURE.md");
    let map = fs::read_to_string(&map_path).expect("docs/ARCHITECTURE.md");
    let mut missing = Vec::new();
    for krate in crates() {
        for m in modules(&workspace().join("crates").join(&krate).join("src")) {
            if !m.is_named_in(&krate, &map) {
                missing.push(format!(
                    "  crates/{krate}/src/{}  (module {krate}::{}): {}",
                    m.shown(),
                    m.path.join("::"),
                    where_to_add(&krate)
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} module(s) of the tree are not named in docs/ARCHITECTURE.md's map; name each, \
         with a few words on what it holds, where the line says (the forms that count are in \
         the header of {}):\n{}",
        missing.len(),
        file!(),
        missing.join("\n")
    );
}

/// The rules hold on made-up maps, so the test above can fail.
#[test]
fn the_forms_that_count() {
    let walk = Module {
        path: vec!["xfer".into(), "source".into(), "walk".into()],
        dir: false,
    };
    assert!(walk.is_named_in("engine", "`xfer/source/walk.rs`"));
    assert!(walk.is_named_in("engine", "source/walk.rs: the walker"));
    assert!(walk.is_named_in("engine", "see xfer::source::walk"));
    assert!(walk.is_named_in("engine", "source/  mod.rs · walk.rs"));
    assert!(!walk.is_named_in("engine", "sink/  walk.rs"));
    assert!(!walk.is_named_in("engine", "source/\n  walk.rs"));
    assert!(!walk.is_named_in("engine", "source/ sidewalk.rs"));
    let when = Module {
        path: vec!["when".into()],
        dir: false,
    };
    assert!(when.is_named_in("archive", "when.rs (since)"));
    assert!(when.is_named_in("archive", "`when`: times"));
    assert!(when.is_named_in("archive", "archive::when::utc"));
    assert!(!when.is_named_in("archive", "whenever"));
    let store = Module {
        path: vec!["store".into()],
        dir: true,
    };
    assert!(store.is_named_in("jobs", "store/ (sqlite)"));
    assert!(!store.is_named_in("jobs", "restore/"));
}

/// Where in docs/ARCHITECTURE.md a crate's modules are listed.
fn where_to_add(krate: &str) -> &'static str {
    match krate {
        "proto" => {
            "add it to the table of section 1.1 (proto) and the floors in section 1's diagram"
        }
        "engine" => {
            "add it to the table of section 1.2 (engine), in its module's row, and to the \
             floors in section 1's diagram"
        }
        "cli" => "add it to the `cli` lines of section 1's diagram (cmd/, matrix/, print/)",
        _ => "add it to its crate's entry in section 1's list of crates",
    }
}

/// The workspace's root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}

/// Every crate under crates/ with a src/.
fn crates() -> Vec<String> {
    let dir = workspace().join("crates");
    let mut out: Vec<String> = fs::read_dir(&dir)
        .expect("crates/")
        .filter_map(|e| {
            let e = e.ok()?;
            e.path()
                .join("src")
                .is_dir()
                .then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect();
    out.sort();
    assert!(out.len() > 1, "found no crates under {}", dir.display());
    out
}

/// One module: its path of names from the crate's root, and whether it is
/// a directory (`xfer/`) or a file (`tune.rs`). A module with both
/// (`matrix.rs` and `matrix/`) is listed once, as its file.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Module {
    path: Vec<String>,
    dir: bool,
}

impl Module {
    fn name(&self) -> &str {
        self.path.last().expect("a module has a name")
    }

    fn suffix(&self) -> &'static str {
        if self.dir {
            "/"
        } else {
            ".rs"
        }
    }

    /// Its path from src/, as the failure shows it.
    fn shown(&self) -> String {
        format!("{}{}", self.path.join("/"), self.suffix())
    }

    fn is_named_in(&self, krate: &str, map: &str) -> bool {
        let n = self.path.len();
        let mut forms = vec![
            format!("{krate}::{}", self.path.join("::")),
            format!("{krate}/{}", self.shown()),
        ];
        for i in 0..n.saturating_sub(1) {
            forms.push(format!("{}{}", self.path[i..].join("/"), self.suffix()));
            forms.push(self.path[i..].join("::"));
        }
        if forms.iter().any(|f| mentions(map, f)) {
            return true;
        }
        let file = format!("{}{}", self.name(), self.suffix());
        if n == 1 {
            return mentions(map, &file) || mentions(map, &format!("`{}`", self.name()));
        }
        let parent = &self.path[n - 2];
        let parent_forms = [
            format!("{parent}/"),
            format!("`{parent}`"),
            format!("{parent}::"),
            format!("{parent}.rs"),
        ];
        map.lines()
            .any(|l| mentions(l, &file) && parent_forms.iter().any(|p| mentions(l, p)))
    }
}

/// `text` holds `form` as a name of its own: not inside a longer name or
/// path (`sidewalk.rs`, `sink/walk.rs`, `a::walk` for `walk`).
fn mentions(text: &str, form: &str) -> bool {
    let name_char = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(form).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + form.len()..].chars().next();
        let starts_clean = !form.starts_with(name_char)
            || before.is_none_or(|c| !(name_char(c) || matches!(c, '/' | '.' | ':')));
        let ends_clean = !form.ends_with(name_char) || after.is_none_or(|c| !name_char(c));
        starts_clean && ends_clean
    })
}

/// The modules under one crate's src/, each once.
fn modules(src: &Path) -> BTreeSet<Module> {
    let mut out = BTreeSet::new();
    walk(src, &mut Vec::new(), &mut out);
    assert!(!out.is_empty(), "found no modules in {}", src.display());
    out
}

fn walk(dir: &Path, at: &mut Vec<String>, out: &mut BTreeSet<Module>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p
            .file_name()
            .expect("an entry has a name")
            .to_string_lossy()
            .into_owned();
        if p.is_dir() {
            if !has_rust(&p) {
                continue;
            }
            at.push(name.clone());
            let has_file = dir.join(format!("{name}.rs")).is_file();
            if !has_file {
                out.insert(Module {
                    path: at.clone(),
                    dir: true,
                });
            }
            walk(&p, at, out);
            at.pop();
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let root = at.is_empty() && matches!(stem, "lib" | "main");
            if !root && stem != "mod" {
                let mut path = at.clone();
                path.push(stem.to_string());
                out.insert(Module { path, dir: false });
            }
        }
    }
}

/// A directory is a module only if Rust sources are in it (`testdata/` is not).
fn has_rust(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|rd| {
        rd.filter_map(Result::ok).any(|e| {
            let p = e.path();
            p.extension().is_some_and(|x| x == "rs") || (p.is_dir() && has_rust(&p))
        })
    })
}
