//! The one way a test asks for something this host may lack. Where it is
//! missing, the test prints `SKIP: <what> (<how to get it>)` and returns
//! without checking anything, unless `LONGHAUL_REQUIRE_<NEED>=1` is set:
//! then the test fails, naming what is missing. CI (`.ci/run`) sets every
//! one of them, so no test passes there by skipping.
//!
//! | NEED         | what                                                        |
//! |--------------|-------------------------------------------------------------|
//! | `ROOT`       | root: mounts, loop devices, a Slurm of its own               |
//! | `TUN`        | `longhaul wan`: root, /dev/net/tun and iproute2              |
//! | `CGROUP`     | a cgroup CPU controller (v1 `cpu` or v2) to cap a process    |
//! | `BLKIO`      | cgroup v1 `blkio` write throttling                           |
//! | `LOOP`       | losetup and mkfs.ext4: a file system on a loop device        |
//! | `IPV6`       | an IPv6 loopback (::1)                                       |
//! | `CPUS`       | two CPUs online                                              |
//! | `RMEM_CAP`   | net.core.rmem_max below the largest window a test asks for   |
//! | `PROMETHEUS` | the prometheus server binary                                 |
//! | `BROWSER`    | chromium and chromedriver                                    |
//! | `POSTGRES`   | a PostgreSQL server installation                             |
//! | `SLURM`      | slurmctld, slurmd and srun                                   |
//! | `MPI`        | Open MPI's mpirun                                            |
//! | `SSH`        | sshd, ssh and ssh-keygen (OpenSSH), for `HOST:path` tests    |
//! | `IPERF3`     | Debian's iperf3, for `perf --iperf3` and `serve --iperf3`    |
//! | `PEERS`      | every matrix template's peer: iperf3, iperf2, nuttcp, GridFTP, XRootD, rsync, socat, OpenSSH, python3 |
//! | `DIST`       | this build's release in target/dist (`scripts/release.sh`)   |
//!
//! Every skip is also written, one line each, to the file named by
//! `LONGHAUL_SKIP_LOG` when it is set: `scripts/test.sh` sets it and ends
//! the run by saying how many tests skipped and why, so that a run without
//! the CI's `LONGHAUL_REQUIRE_*` does not read as if every test ran.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The environment variable naming the file each skip is appended to.
pub const SKIP_LOG: &str = "LONGHAUL_SKIP_LOG";

/// Whether `LONGHAUL_REQUIRE_<need>=1`.
pub fn required(need: &str) -> bool {
    std::env::var(format!("LONGHAUL_REQUIRE_{need}")).is_ok_and(|v| v == "1")
}

/// True if `check` found what `need` names. Otherwise the test fails if
/// `LONGHAUL_REQUIRE_<need>=1`, or says SKIP and gets false (return then).
#[track_caller]
pub fn have(need: &str, check: Result<(), String>) -> bool {
    match check {
        Ok(()) => true,
        Err(why) => {
            missing(need, &why);
            false
        }
    }
}

/// Says that `need` is missing because of `why`: fails the test if it is
/// required, else prints SKIP. The caller returns without testing.
#[track_caller]
pub fn missing(need: &str, why: &str) {
    assert!(
        !required(need),
        "LONGHAUL_REQUIRE_{need}=1 but {why}; this test cannot run without it"
    );
    eprintln!("SKIP: {why} (set LONGHAUL_REQUIRE_{need}=1 to make this a failure)");
    log_skip(need, why);
}

/// Appends `NEED<TAB>why<TAB>test` to the skip log, if there is one. One
/// short `write` to a file opened for appending: lines of tests running at
/// once do not interleave.
fn log_skip(need: &str, why: &str) {
    let Some(log) = std::env::var_os(SKIP_LOG) else {
        return;
    };
    // Which test: under nextest each runs in a process of its own; under
    // cargo test each in a thread named after it.
    let test = match std::env::var("NEXTEST_RUN_ID") {
        Ok(_) => format!("pid {}", std::process::id()),
        Err(_) => std::thread::current()
            .name()
            .unwrap_or("(unnamed)")
            .to_string(),
    };
    let line = format!("{need}\t{}\t{test}\n", why.replace(['\t', '\n'], " "));
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Root, which `what` needs.
pub fn root(what: &str) -> Result<(), String> {
    // SAFETY: geteuid cannot fail and touches no memory.
    if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err(format!("{what} needs root"))
    }
}

/// `program` on PATH (or in an sbin directory).
pub fn program(program: &str, package: &str) -> Result<(), String> {
    if find(program).is_some() {
        Ok(())
    } else {
        Err(format!(
            "{program} is not installed (apt-get install {package})"
        ))
    }
}

/// Where `program` is: on PATH, or in /usr/sbin or /sbin.
pub fn find(program: &str) -> Option<PathBuf> {
    crate::process::find_program(program)
}

/// `path` exists (`why` says what it is and how to get it).
pub fn file(path: &str, why: &str) -> Result<(), String> {
    if Path::new(path).exists() {
        Ok(())
    } else {
        Err(format!("{path} is missing: {why}"))
    }
}

/// An IPv6 loopback to bind.
pub fn ipv6() -> Result<(), String> {
    std::net::TcpListener::bind("[::1]:0")
        .map(drop)
        .map_err(|e| format!("cannot bind [::1]: {e} (no IPv6 loopback here)"))
}

/// `n` CPUs online.
pub fn cpus(n: i32) -> Result<(), String> {
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if online >= libc::c_long::from(n) {
        Ok(())
    } else {
        Err(format!("{online} CPU(s) online, {n} needed"))
    }
}

/// What `longhaul wan` needs: root, /dev/net/tun and iproute2.
pub fn tun() -> Result<(), String> {
    root("`longhaul wan`")?;
    file("/dev/net/tun", "load the tun module (modprobe tun)")?;
    program("ip", "iproute2")
}
