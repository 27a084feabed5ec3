//! `longhaul doctor` with one end's CPU capped by a cgroup quota (as in a
//! container, a Slurm job or a pod with a CPU limit): the verdict names
//! that end's CPU (or the cipher on it) and the fix names the quota. Root
//! and a cgroup CPU controller (v1 or v2) are needed; without them the
//! tests skip, or fail with `LONGHAUL_REQUIRE_CGROUP=1` (CI).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;
use common::wan::BIN;
use common::Owned;
use common::{bin, stderr, TempDir};

/// CPU time per 100 ms period: a fifth of a core for the server, a tenth
/// for the client (the doctor's sender on loopback carries about 16
/// Gbit/s a core: a tenth keeps it well below the storage it writes to).
const SERVER_QUOTA_US: u64 = 20_000;
const CLIENT_QUOTA_US: u64 = 10_000;
const PERIOD_US: u64 = 100_000;

/// Skips (returns None) where this host cannot cap a process's CPU, or
/// fails the test where that is required (`LONGHAUL_REQUIRE_CGROUP=1`).
#[track_caller]
fn unavailable(why: &str) -> Option<CpuCgroup> {
    common::require::missing("CGROUP", why);
    None
}

/// A cgroup of its own with a CPU quota, made under the CPU controller's
/// hierarchy wherever /proc/self/mountinfo says it is mounted (cgroup v1's
/// `cpu` controller, else cgroup v2 with `cpu` enabled); removed on drop,
/// its processes moved out first.
struct CpuCgroup {
    dir: PathBuf,
}

impl CpuCgroup {
    fn new(tag: &str, quota_us: u64) -> Option<CpuCgroup> {
        if let Err(why) = common::require::root("a CPU quota (cgroups)") {
            return unavailable(&why);
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mounts: Vec<(String, String, String)> = mountinfo
            .lines()
            .filter_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                let point = left.split(' ').nth(4)?.replace("\\040", " ");
                let mut r = right.split(' ');
                let fstype = r.next()?.to_string();
                let opts = r.nth(1).unwrap_or("").to_string();
                Some((point, fstype, opts))
            })
            .collect();
        let name = format!("longhaul-test-cpu-{tag}-{}", std::process::id());
        let v1 = mounts
            .iter()
            .find(|(_, t, o)| t == "cgroup" && o.split(',').any(|o| o == "cpu"));
        let v2 = mounts.iter().find(|(p, t, _)| {
            t == "cgroup2"
                && std::fs::read_to_string(Path::new(p).join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
        });
        let (dir, files) = match (v1, v2) {
            (Some((p, _, _)), _) => (
                Path::new(p).join(&name),
                vec![
                    ("cpu.cfs_period_us", PERIOD_US.to_string()),
                    ("cpu.cfs_quota_us", quota_us.to_string()),
                ],
            ),
            (None, Some((p, _, _))) => {
                let _ = std::fs::write(Path::new(p).join("cgroup.subtree_control"), "+cpu");
                (
                    Path::new(p).join(&name),
                    vec![("cpu.max", format!("{quota_us} {PERIOD_US}"))],
                )
            }
            (None, None) => return unavailable("no cgroup CPU controller is mounted"),
        };
        if let Err(e) = std::fs::create_dir(&dir) {
            return unavailable(&format!("cannot create {}: {e}", dir.display()));
        }
        let cg = CpuCgroup { dir };
        for (file, value) in files {
            if let Err(e) = std::fs::write(cg.dir.join(file), &value) {
                return unavailable(&format!("cannot set {file} of {}: {e}", cg.dir.display()));
            }
        }
        Some(cg)
    }

    /// `c` run by a shell that first enters this cgroup (its children
    /// inherit it), with the same arguments and environment.
    fn wrap(&self, c: &Command) -> Command {
        let mut s = Command::new("sh");
        s.arg("-c")
            .arg(format!(
                "echo $$ > '{}' && exec \"$0\" \"$@\"",
                self.dir.join("cgroup.procs").display()
            ))
            .arg(c.get_program())
            .args(c.get_args());
        for (k, v) in c.get_envs() {
            if let Some(v) = v {
                s.env(k, v);
            }
        }
        s
    }
}

impl Drop for CpuCgroup {
    fn drop(&mut self) {
        let parent = self.dir.parent().unwrap().join("cgroup.procs");
        for _ in 0..50 {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                let _ = std::fs::write(&parent, pid);
            }
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// `doctor --json` of `127.0.0.1:PORT:data/`, run by `c` (a wrapped one
/// runs under the quota); must succeed.
fn doctor(mut c: Command) -> Value {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

fn doctor_cmd(port: u16) -> Command {
    let mut c = bin();
    c.arg("doctor")
        .arg(format!("127.0.0.1:{port}:data/"))
        .args(["--json", "--time", "2s", "--no-remember"]);
    c
}

/// Stages and notes, for failure messages.
fn stages(v: &Value) -> String {
    format!(
        "verdict {}; stages {}; findings {}; notes {}; local_cpu {}; remote_cpu {}",
        v["verdict"], v["stages"], v["findings"], v["notes"], v["local_cpu"], v["remote_cpu"]
    )
}

/// The verdict names `who`'s CPU (`roles`: its stage as sender or
/// receiver, or the cipher on it) with the quota in the fix, and the
/// findings list the quota of `host` (`local` or `remote`).
fn assert_names_the_quota(v: &Value, roles: &[&str], who: &str, host: &str, quota_us: u64) {
    let stage = v["verdict"]["stage"].as_str().unwrap_or("");
    let fix = v["verdict"]["fix"].as_str().unwrap_or("");
    assert!(roles.contains(&stage), "verdict {stage}: {}", stages(v));
    let cores = format!(
        "{who}'s cgroup limits it to {} CPU",
        quota_us as f64 / PERIOD_US as f64
    );
    assert!(
        fix.contains(&cores) && fix.contains(&quota_us.to_string()),
        "fix without the quota ({cores}): {fix}; {}",
        stages(v)
    );
    assert!(!fix.contains("nothing on the hosts"), "{fix}");
    assert_eq!(v[host]["cpu_limits"]["quota_us"], quota_us, "{}", v[host]);
    let findings = v["findings"].as_array().unwrap();
    assert!(
        findings
            .iter()
            .any(|f| f["host"] == host && f["setting"] == "cgroup cpu quota"),
        "{}",
        stages(v)
    );
}

#[test]
fn doctor_names_the_servers_cpu_when_its_cgroup_quota_starves_it() {
    let Some(cg) = CpuCgroup::new("server", SERVER_QUOTA_US) else {
        return;
    };
    let t = TempDir::new("doctor-cpu-server");
    let state = common::prepare_state(&t.dir("state"));
    let export = t.dir("export");
    let mut served = None;
    for i in 0..20u32 {
        let port = 20_000 + ((std::process::id() * 11 + i * 137) % 40_000) as u16;
        let mut c = Command::new(BIN);
        c.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--state-dir")
            .arg(&state)
            .arg("--export")
            .arg(format!("data={}", export.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = Owned::spawn(&mut cg.wrap(&c)).unwrap();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if child.try_wait().unwrap().is_none() && TcpStream::connect(("127.0.0.1", port)).is_ok() {
            served = Some((child, port));
            break;
        }
    }
    let (srv, port) = served.expect("no server came up in the cgroup");
    let v = doctor(doctor_cmd(port));
    drop(srv);
    // A push: the server receives.
    assert_names_the_quota(
        &v,
        &["receiver_cpu", "encryption"],
        "the server",
        "remote",
        SERVER_QUOTA_US,
    );
    // The copy said where each end's CPU went, and the verdict on the
    // starved end's CPU says it too.
    let copy = &v["copy"];
    for end in ["source", "sink"] {
        let stages = &copy["cpu_stages"][end];
        let total: f64 = stages
            .as_object()
            .unwrap_or_else(|| panic!("no cpu_stages.{end} in the copy: {copy}"))
            .values()
            .filter_map(Value::as_f64)
            .sum();
        assert!(total > 0.0, "{end}: {stages}");
    }
    if v["verdict"]["stage"] == "receiver_cpu" {
        let fix = v["verdict"]["fix"].as_str().unwrap_or("");
        assert!(fix.contains("in the copy"), "{fix}");
        let r = &v["remote_cpu"];
        assert!(
            r["throttled_periods"].as_u64().unwrap_or(0) > 0
                || v["upload"]["cpu_receiver_percent"].as_f64().unwrap() >= 18.0,
            "{}",
            stages(&v)
        );
    }
    drop(cg);
}

#[test]
fn doctor_names_this_hosts_cpu_when_its_cgroup_quota_starves_it() {
    let Some(cg) = CpuCgroup::new("client", CLIENT_QUOTA_US) else {
        return;
    };
    let t = TempDir::new("doctor-cpu-client");
    // The destination on tmpfs where there is one: this VM's disk writes
    // may be slower than even a tenth of a core sends.
    let shm = Path::new("/dev/shm");
    let export = if shm.is_dir() {
        let d = shm.join(format!("longhaul-test-cpu-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    } else {
        t.dir("export")
    };
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = shm.is_dir().then(|| Remove(export.clone()));
    let s = common::xfer::spawn_server(common::xfer::data_config(&export, &t.dir("state"), false));
    let v = doctor(cg.wrap(&doctor_cmd(s.addr().port())));
    // A push: this host sends.
    assert_names_the_quota(
        &v,
        &["sender_cpu", "encryption"],
        "this host",
        "local",
        CLIENT_QUOTA_US,
    );
    assert!(
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["host"] != "remote" || !f["setting"].as_str().unwrap().contains("quota")),
        "{}",
        stages(&v)
    );
    drop(cg);
}
