//! The README's first command, `cargo run --release -- demo`, needs one
//! binary among the workspace's default members: a bare `cargo run` at the
//! root refuses to choose between several (the fuzz targets' binaries, when
//! the fuzz crate was a default member, broke it). This reads the manifests
//! as text, like its neighbours.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The quoted names in the array `key = [...]` of `manifest`.
fn array(manifest: &str, key: &str) -> Vec<String> {
    let start = manifest
        .lines()
        .position(|l| l.trim_start().starts_with(&format!("{key} =")))
        .unwrap_or_else(|| panic!("no `{key}` in the root Cargo.toml"));
    let text: String = manifest.lines().skip(start).collect::<Vec<_>>().join("\n");
    let list = &text[..text.find(']').expect("the array closes")];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The binaries package `dir` builds: each `[[bin]]` of its manifest (else
/// `src/main.rs`), and `src/bin/*.rs`.
fn binaries(dir: &Path) -> usize {
    let manifest = fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let declared = manifest.matches("[[bin]]").count();
    let main = usize::from(declared == 0 && dir.join("src/main.rs").exists());
    let in_bin = fs::read_dir(dir.join("src/bin")).map_or(0, |d| d.count());
    declared + main + in_bin
}

#[test]
fn the_readmes_first_command_has_one_binary_to_run() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let first: Vec<&str> = readme.lines().take(12).collect();
    assert!(
        first
            .iter()
            .any(|l| l.starts_with("cargo run --release -- demo")),
        "the README's first lines no longer give `cargo run --release -- demo`: update this test"
    );
    let manifest = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members = array(&manifest, "default-members");
    let with_bins: Vec<&String> = members
        .iter()
        .filter(|m| binaries(&root().join(m)) > 0)
        .collect();
    assert_eq!(
        with_bins,
        [&"crates/cli".to_string()],
        "`cargo run` at the root must find one binary among default-members {members:?}"
    );
    assert_eq!(binaries(&root().join("crates/cli")), 1);
}
