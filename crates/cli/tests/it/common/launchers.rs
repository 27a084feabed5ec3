//! Real launchers on this one machine: a one-node Slurm (Debian's
//! slurm-wlm: slurmctld and slurmd started here with a minimal
//! configuration in a temporary directory, no munge), Open MPI's `mpirun`,
//! and a Kubernetes indexed Job's variables. Daemons are stopped by PID.
//!
//! Absent a launcher, its helper says SKIP and gives `None`, unless
//! `LONGHAUL_REQUIRE_SLURM=1` / `LONGHAUL_REQUIRE_MPI=1` (CI): then it
//! panics naming what to install (see [`super::require`]).

use super::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::require;

fn sbin(program: &str) -> PathBuf {
    ["/usr/sbin", "/usr/bin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(program))
}

/// A one-node Slurm cluster of its own.
pub struct Slurm {
    dir: PathBuf,
    conf: PathBuf,
    daemons: Vec<Child>,
}

impl Slurm {
    pub fn start() -> Option<Slurm> {
        let installed = ["slurmctld", "slurmd", "srun"]
            .into_iter()
            .try_for_each(|p| require::program(p, "slurm-wlm"));
        if !require::have("SLURM", installed)
            || !require::have(
                "ROOT",
                require::root("a Slurm of its own (slurmd runs jobs as their user)"),
            )
        {
            return None;
        }
        let dir =
            std::env::temp_dir().join(format!("lh-slurm-{}-{}", std::process::id(), free_port()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("state")).unwrap();
        std::fs::create_dir_all(dir.join("spool")).unwrap();
        let host = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string();
        let d = dir.display();
        let conf = dir.join("slurm.conf");
        std::fs::write(
            &conf,
            format!(
                "ClusterName=lhtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
NodeName={host} NodeAddr=127.0.0.1 CPUs=16 State=UNKNOWN
PartitionName=lh Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
",
                ctld = free_port(),
                slurmd = free_port(),
            ),
        )
        .unwrap();
        let daemon = |program: &str, args: &[&str], log: &str| {
            Command::new(sbin(program))
                .args(args)
                .env("SLURM_CONF", &conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join(log)).unwrap())
                .spawn()
                .unwrap_or_else(|e| panic!("start {program}: {e}"))
        };
        let mut s = Slurm {
            daemons: Vec::new(),
            conf: conf.clone(),
            dir: dir.clone(),
        };
        s.daemons
            .push(daemon("slurmctld", &["-D", "-i"], "slurmctld.out"));
        s.daemons
            .push(daemon("slurmd", &["-D", "-N", &host], "slurmd.out"));
        let started = Instant::now();
        loop {
            let idle = Command::new("sinfo")
                .args(["-h", "-o", "%T"])
                .env("SLURM_CONF", &conf)
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("idle"));
            if idle {
                return Some(s);
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "Slurm did not come up: {}",
                std::fs::read_to_string(dir.join("slurmctld.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `srun -n N PROGRAM ARGS...`, the caller's environment exported.
    pub fn srun(&self, n: u32, program: &Path, args: &[&str], env: &[(&str, String)]) -> Output {
        let mut c = Command::new("srun");
        c.args(["-n", &n.to_string(), "--kill-on-bad-exit=0", "--export=ALL"])
            .arg(program)
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("run srun")
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            // SAFETY: kill(2) on our own children's PIDs.
            unsafe {
                libc::kill(d.id() as i32, libc::SIGTERM);
            }
        }
        for d in &mut self.daemons {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = d.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `mpirun -np N PROGRAM ARGS...` (Open MPI, oversubscribed, as root),
/// with `env` passed to every rank; None (SKIP) without Open MPI.
pub fn mpirun(n: u32, program: &Path, args: &[&str], env: &[(&str, String)]) -> Option<Output> {
    if !require::have("MPI", require::program("mpirun", "openmpi-bin")) {
        return None;
    }
    let mut c = Command::new("mpirun");
    c.args([
        "--oversubscribe",
        "--allow-run-as-root",
        "-np",
        &n.to_string(),
    ])
    .args([
        "--mca",
        "btl",
        "self,tcp",
        "--mca",
        "btl_tcp_if_include",
        "lo",
    ])
    .args(["--mca", "oob_tcp_if_include", "lo"]);
    for (k, v) in env {
        c.env(k, v).args(["-x", k]);
    }
    c.arg(program).args(args).stdin(Stdio::null());
    Some(c.output().expect("run mpirun"))
}

/// N processes as a Kubernetes indexed Job starts them: each with
/// `JOB_COMPLETION_INDEX` set (no variable gives the size).
pub fn indexed_job(n: u32, program: &Path, args: &[&str], env: &[(&str, String)]) -> Vec<Output> {
    let children: Vec<Child> = (0..n)
        .map(|i| {
            let mut c = Command::new(program);
            c.args(args)
                .env("JOB_COMPLETION_INDEX", i.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env {
                c.env(k, v);
            }
            c.spawn().expect("start a pod's process")
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect()
}
