//! Which build of longhaul runs on a far host, for `--copy-binary`: what
//! that host says it is (its machine type and C library, [`PROBE`]), what
//! a binary needs (its machine and the newest glibc symbol version it
//! links, read from its ELF headers), and where the portable build of this
//! version lies when this binary is not one.
//!
//! A binary built on a recent distribution links that distribution's
//! glibc symbol versions (`GLIBC_2.34`, ...) and the dynamic loader of an
//! older host refuses it. `scripts/release.sh` builds one that links
//! nothing newer than [`PORTABLE_FLOOR`]; a checkout keeps it in
//! `target/dist/`, where [`candidates`] looks beside a build of the same
//! checkout.

use std::fmt;
use std::path::{Path, PathBuf};

use object::elf::{self, FileHeader64};
use object::read::elf::FileHeader;
use object::Endianness;

/// A glibc version: `GLIBC_2.17` in a symbol version, `glibc 2.17` from
/// `getconf GNU_LIBC_VERSION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Glibc(pub u32, pub u32);

impl Glibc {
    /// `2.17` (a third part, as in `2.3.4`, is ignored: glibc's symbol
    /// versions that have one are far older than any floor here).
    fn parse(s: &str) -> Option<Glibc> {
        let mut parts = s.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(Glibc(major, minor))
    }
}

impl fmt::Display for Glibc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// The oldest glibc a longhaul build runs on: Rust's own floor for Linux
/// on x86_64, and what `scripts/release.sh` builds for.
pub const PORTABLE_FLOOR: Glibc = Glibc(2, 17);

/// Asks the far host for its machine type (`uname -m`) and its C library:
/// `getconf GNU_LIBC_VERSION` on glibc, else the first line of `ldd
/// --version` (musl's names musl). One ssh command, run by `sh` whatever
/// the login shell is.
pub const PROBE: &str =
    "sh -c 'uname -m; getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>&1 | head -n 1'";

/// A far host by its own account ([`PROBE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FarHost {
    /// As `uname -m` names it: `x86_64`, `aarch64`, ...
    pub machine: String,
    pub libc: FarLibc,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FarLibc {
    Glibc(Glibc),
    Musl,
    /// What it said, when that names neither.
    Unknown(String),
}

impl fmt::Display for FarLibc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FarLibc::Glibc(v) => write!(f, "glibc {v}"),
            FarLibc::Musl => f.write_str("musl libc"),
            FarLibc::Unknown(said) => write!(
                f,
                "a C library it did not name ({})",
                longhaul_proto::units::escaped(said)
            ),
        }
    }
}

/// Reads what [`PROBE`] printed: the machine on the first line, the C
/// library on the second (`glibc 2.36`; `ldd (GNU libc) 2.17`; `musl libc
/// (x86_64)`).
pub fn parse_probe(out: &str) -> Result<FarHost, String> {
    let mut lines = out.lines().map(str::trim).filter(|l| !l.is_empty());
    let machine = lines
        .next()
        .filter(|m| {
            m.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
        .ok_or_else(|| {
            format!(
                "`uname -m` said '{}', not a machine type",
                longhaul_proto::units::escaped(out.trim())
            )
        })?;
    let said = lines.next().unwrap_or_default();
    let lower = said.to_ascii_lowercase();
    let libc = if lower.contains("musl") {
        FarLibc::Musl
    } else if let Some(v) = lower
        .strip_prefix("glibc ")
        .or_else(|| {
            lower
                .contains("libc")
                .then(|| lower.rsplit(' ').next())
                .flatten()
        })
        .and_then(Glibc::parse)
    {
        FarLibc::Glibc(v)
    } else {
        FarLibc::Unknown(said.to_string())
    };
    Ok(FarHost {
        machine: machine.to_string(),
        libc,
    })
}

/// What a binary needs to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    /// Its machine type, as `uname -m` names it.
    pub machine: String,
    /// The newest glibc symbol version it links; None if it links none
    /// (static, or another C library).
    pub glibc: Option<Glibc>,
}

/// Why a binary cannot run on a far host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Misfit {
    Machine { far: String, built: String },
    NotGlibc(FarLibc),
    OldGlibc { far: Glibc, needs: Glibc },
}

impl fmt::Display for Misfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Misfit::Machine { far, built } => write!(f, "it is for {built}, that host is {far}"),
            Misfit::NotGlibc(libc) => write!(f, "it links glibc, that host has {libc}"),
            Misfit::OldGlibc { far, needs } => {
                write!(f, "it needs glibc {needs}, that host has {far}")
            }
        }
    }
}

impl Needs {
    /// Why this binary cannot run on `far`, or None if it can. A C
    /// library the host did not name is not held against it: the start
    /// says what is wrong, if anything.
    pub fn misfit(&self, far: &FarHost) -> Option<Misfit> {
        if self.machine != far.machine {
            return Some(Misfit::Machine {
                far: far.machine.clone(),
                built: self.machine.clone(),
            });
        }
        let needs = self.glibc?;
        match &far.libc {
            FarLibc::Glibc(v) if *v < needs => Some(Misfit::OldGlibc { far: *v, needs }),
            FarLibc::Musl => Some(Misfit::NotGlibc(FarLibc::Musl)),
            _ => None,
        }
    }
}

/// What the ELF binary `bytes` needs: its machine from the header, and
/// the newest `GLIBC_x.y` among the versions it requires of its libraries
/// (`.gnu.version_r`).
pub fn needs(bytes: &[u8]) -> Result<Needs, String> {
    let bad = |e: object::read::Error| format!("not a 64-bit ELF binary ({e})");
    let header = FileHeader64::<Endianness>::parse(bytes).map_err(bad)?;
    let endian = header.endian().map_err(bad)?;
    let machine = machine_name(header.e_machine(endian), endian).to_string();
    let sections = header.sections(endian, bytes).map_err(bad)?;
    let mut glibc = None;
    if let Some((mut needed, link)) = sections.gnu_verneed(endian, bytes).map_err(bad)? {
        let strings = sections.strings(endian, bytes, link).map_err(bad)?;
        while let Some((_, mut versions)) = needed.next().map_err(bad)? {
            while let Some(v) = versions.next().map_err(bad)? {
                let name = v.name(endian, strings).map_err(bad)?;
                let found = std::str::from_utf8(name)
                    .ok()
                    .and_then(|n| n.strip_prefix("GLIBC_"))
                    .and_then(Glibc::parse);
                glibc = glibc.max(found);
            }
        }
    }
    Ok(Needs { machine, glibc })
}

/// An ELF machine as `uname -m` names it.
fn machine_name(e_machine: elf::Machine, endian: Endianness) -> String {
    match e_machine {
        elf::EM_X86_64 => "x86_64".into(),
        elf::EM_AARCH64 => "aarch64".into(),
        elf::EM_PPC64 if endian == Endianness::Little => "ppc64le".into(),
        elf::EM_PPC64 => "ppc64".into(),
        elf::EM_S390 => "s390x".into(),
        elf::EM_RISCV => "riscv64".into(),
        elf::EM_LOONGARCH => "loongarch64".into(),
        other => format!("ELF machine {other:?}"),
    }
}

/// The directory `scripts/release.sh` makes for this version's portable
/// build (`longhaul-0.1.0-x86_64-linux-gnu`), under `target/dist/`.
pub fn dist_name() -> String {
    format!(
        "longhaul-{}-{}-linux-gnu",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    )
}

/// The builds `--copy-binary` may copy, in its order: the one it names;
/// else this binary (`exe`), then the portable build of this version in
/// the `target/dist/` beside it (it being `target/PROFILE/longhaul` or
/// `target/TRIPLE/PROFILE/longhaul`) or in the checkout it was built from
/// (where `scripts/release.sh` puts it, whatever `CARGO_TARGET_DIR` was).
pub fn candidates(named: Option<&Path>, exe: &Path) -> Vec<PathBuf> {
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    candidates_in(named, exe, &checkout)
}

fn candidates_in(named: Option<&Path>, exe: &Path, checkout: &Path) -> Vec<PathBuf> {
    if let Some(p) = named {
        return vec![p.to_path_buf()];
    }
    let mut found = vec![exe.to_path_buf()];
    let portable = Path::new("dist").join(dist_name()).join("longhaul");
    let built_in = checkout.join("target");
    for target in exe.ancestors().skip(2).take(2).chain([built_in.as_path()]) {
        let p = target.join(&portable);
        if p.is_file() && !found.iter().any(|f| same_file(f, &p)) {
            found.push(p);
        }
    }
    found
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// What to do when no build fits `far` (`dest`), each tried one with why
/// not.
pub fn advice(dest: &str, far: &FarHost, tried: &[(PathBuf, Misfit)]) -> String {
    let why: Vec<String> = tried
        .iter()
        .map(|(p, m)| format!("{}: {m}", p.display()))
        .collect();
    let install = format!(
        "install longhaul {v} on {dest} (the Debian package, the release archive, or `cargo install --locked --path crates/cli` there) and name it with --remote-path PATH if it is not on the PATH",
        v = env!("CARGO_PKG_VERSION")
    );
    let old_glibc = tried
        .iter()
        .any(|(_, m)| matches!(m, Misfit::OldGlibc { .. }));
    let what = match &far.libc {
        FarLibc::Glibc(v) if old_glibc && *v >= PORTABLE_FLOOR => format!(
            "copy the portable build, which runs on glibc {PORTABLE_FLOOR} and newer: `bash scripts/release.sh` in a checkout of this version makes target/dist/{d}/longhaul, which --copy-binary finds beside a build of that checkout; or name one with --copy-binary=PATH (the release archive's longhaul, or /usr/bin/longhaul of the Debian package); or {install}",
            d = dist_name()
        ),
        FarLibc::Glibc(v) if old_glibc => format!(
            "glibc {v} is older than any longhaul build runs on ({PORTABLE_FLOOR}): {install}, if it builds there"
        ),
        _ if far.machine != std::env::consts::ARCH => format!(
            "{install}, or name a build for {} with --copy-binary=PATH",
            far.machine
        ),
        _ => install,
    };
    format!(
        "no build of longhaul here runs on {dest} ({}, {}): {}; {what}",
        far.machine,
        far.libc,
        why.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(machine: &str, libc: FarLibc) -> FarHost {
        FarHost {
            machine: machine.into(),
            libc,
        }
    }

    #[test]
    fn the_probe_names_glibc_from_getconf_or_ldd_and_musl_from_ldd() {
        let glibc = |v| host("x86_64", FarLibc::Glibc(v));
        assert_eq!(parse_probe("x86_64\nglibc 2.36\n"), Ok(glibc(Glibc(2, 36))));
        assert_eq!(
            parse_probe("x86_64\nldd (GNU libc) 2.17\n"),
            Ok(glibc(Glibc(2, 17)))
        );
        assert_eq!(
            parse_probe("x86_64\nldd (Debian GLIBC 2.36-9+deb12u14) 2.36\n"),
            Ok(glibc(Glibc(2, 36)))
        );
        assert_eq!(
            parse_probe("aarch64\nmusl libc (aarch64)\n"),
            Ok(host("aarch64", FarLibc::Musl))
        );
        assert_eq!(
            parse_probe("x86_64\nsh: ldd: not found\n"),
            Ok(host(
                "x86_64",
                FarLibc::Unknown("sh: ldd: not found".into())
            ))
        );
        assert!(parse_probe("").is_err());
        assert!(parse_probe("x86 64; rm -rf\n").is_err());
    }

    #[test]
    fn a_build_fits_the_same_machine_with_as_new_a_glibc() {
        let needs = Needs {
            machine: "x86_64".into(),
            glibc: Some(Glibc(2, 34)),
        };
        let fits = |far: FarHost| needs.misfit(&far);
        assert_eq!(fits(host("x86_64", FarLibc::Glibc(Glibc(2, 34)))), None);
        assert_eq!(fits(host("x86_64", FarLibc::Glibc(Glibc(2, 40)))), None);
        assert_eq!(
            fits(host("x86_64", FarLibc::Glibc(Glibc(2, 28)))),
            Some(Misfit::OldGlibc {
                far: Glibc(2, 28),
                needs: Glibc(2, 34)
            })
        );
        assert_eq!(
            fits(host("x86_64", FarLibc::Musl)),
            Some(Misfit::NotGlibc(FarLibc::Musl))
        );
        assert!(matches!(
            fits(host("aarch64", FarLibc::Glibc(Glibc(2, 40)))),
            Some(Misfit::Machine { .. })
        ));
        assert_eq!(fits(host("x86_64", FarLibc::Unknown("?".into()))), None);
        // 2.9 is older than 2.17: versions compare by number, not text.
        assert!(Glibc(2, 9) < PORTABLE_FLOOR);
    }

    #[test]
    fn this_binary_is_read_as_an_elf_for_this_machine() {
        let bytes = std::fs::read("/proc/self/exe").unwrap();
        let n = needs(&bytes).unwrap();
        assert_eq!(n.machine, std::env::consts::ARCH);
        let v = n
            .glibc
            .expect("a glibc build links glibc's symbol versions");
        assert!(v >= PORTABLE_FLOOR, "{v}");
        assert!(needs(b"#!/bin/sh\necho hi\n").is_err());
        assert!(needs(&bytes[..100]).is_err());
    }

    #[test]
    fn the_portable_build_is_found_in_the_target_dist_of_this_builds_checkout() {
        let t = tempfile::tempdir().unwrap();
        let portable = t
            .path()
            .join("target/dist")
            .join(dist_name())
            .join("longhaul");
        std::fs::create_dir_all(portable.parent().unwrap()).unwrap();
        std::fs::write(&portable, b"").unwrap();
        let elsewhere = t.path().join("another-checkout");
        for exe in [
            "target/release/longhaul",
            "target/x86_64-unknown-linux-gnu/ci/longhaul",
        ] {
            let exe = t.path().join(exe);
            let found = candidates_in(None, &exe, &elsewhere);
            assert_eq!(found, vec![exe.clone(), portable.clone()]);
        }
        // Built with CARGO_TARGET_DIR elsewhere: the checkout's target/dist, once.
        let exe = t.path().join("cache/target-1/ci/longhaul");
        let found = candidates_in(None, &exe, t.path());
        assert_eq!(found, vec![exe.clone(), portable.clone()]);
        let exe = t.path().join("target/release/longhaul");
        assert_eq!(candidates_in(None, &exe, t.path()).len(), 2);
        // Elsewhere (installed), only this binary; named, only that one.
        let exe = t.path().join("usr/bin/longhaul");
        assert_eq!(candidates_in(None, &exe, &elsewhere), vec![exe.clone()]);
        let named = Path::new("/opt/longhaul");
        let found = candidates_in(Some(named), &exe, t.path());
        assert_eq!(found, vec![named.to_path_buf()]);
        // The portable build itself is not offered twice.
        assert_eq!(
            candidates_in(None, &portable, t.path()),
            vec![portable.clone()]
        );
    }

    #[test]
    fn the_advice_for_an_old_glibc_is_the_portable_build() {
        let far = host("x86_64", FarLibc::Glibc(Glibc(2, 28)));
        let tried = [(
            PathBuf::from("/x/target/release/longhaul"),
            Misfit::OldGlibc {
                far: Glibc(2, 28),
                needs: Glibc(2, 34),
            },
        )];
        let a = advice("dtn1", &far, &tried);
        assert!(a.contains("needs glibc 2.34, that host has 2.28"), "{a}");
        assert!(a.contains("scripts/release.sh"), "{a}");
        assert!(a.contains("--copy-binary=PATH"), "{a}");
        let far = host("x86_64", FarLibc::Glibc(Glibc(2, 12)));
        let tried = [(
            PathBuf::from("/x/target/dist/longhaul"),
            Misfit::OldGlibc {
                far: Glibc(2, 12),
                needs: PORTABLE_FLOOR,
            },
        )];
        let a = advice("dtn1", &far, &tried);
        assert!(a.contains("older than any longhaul build"), "{a}");
        assert!(a.contains("--remote-path"), "{a}");
    }
}
