//! Build facts for `longhaul --version`: the commit this binary was built
//! from (`git rev-parse`, or `LONGHAUL_COMMIT` where there is no git, as in
//! a source tarball) and the Cargo features it has; and a build ID.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LONGHAUL_COMMIT");
    // Rebuilt when HEAD moves: the HEAD file (a branch switch) and the
    // branch's ref (a commit), loose or packed.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
            .unwrap_or_else(|| dir.clone());
        let mut watch = vec![PathBuf::from(&dir).join("HEAD")];
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch.push(PathBuf::from(&common).join(r));
        }
        watch.push(PathBuf::from(&common).join("packed-refs"));
        for p in watch.iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    let commit = std::env::var("LONGHAUL_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    let features: Vec<&str> = ["dashboard", "metrics", "plot", "queue"]
        .into_iter()
        .filter(|f| std::env::var_os(format!("CARGO_FEATURE_{}", f.to_uppercase())).is_some())
        .collect();
    let features = if features.is_empty() {
        "none (a data node's build)".to_owned()
    } else {
        features.join(" ")
    };
    println!("cargo:rustc-env=LONGHAUL_BUILD_COMMIT={commit}");
    println!("cargo:rustc-env=LONGHAUL_BUILD_FEATURES={features}");
    println!(
        "cargo:rustc-env=LONGHAUL_BUILD_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    // A build ID in every build, whichever linker (zig's, for scripts/release.sh, adds none of
    // its own): perf, gdb and debuginfod match a stripped binary to its debug info by it.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-Wl,--build-id=sha1");
    }
}
