//! Running the matrix: path by path, the path's network (loopback in a
//! namespace of its own, an emulated WAN, or the far host), the peers'
//! servers it needs, then each workload's cells, their runs interleaved
//! (run `r` starts at cell `r`), each copy checked against the data's
//! manifest. A server that a failed run may have wedged is started again
//! before the next run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::peers::{self, Settings, Tool};
use super::{far, run, summarise, Cell, Doc, Params, PathSpec, RunResult};
use crate::args::MatrixArgs;

/// A file workload's manifest: each file's length and BLAKE3.
type Manifest = BTreeMap<PathBuf, (u64, [u8; 32])>;

/// Runs every cell not yet done, path by path.
#[allow(clippy::too_many_arguments)]
pub(super) fn drive(
    a: &MatrixArgs,
    bin: &Path,
    work: &Path,
    chosen: &[(Tool, Vec<String>)],
    paths: &[PathSpec],
    params: &Params,
    doc: &mut Doc,
    done: &BTreeMap<longhaul_archive::matrix::CellKey, Cell>,
    stop: &AtomicBool,
    far_ssh: Option<&(far::Ssh, String)>,
) -> Result<(), String> {
    for c in doc.cells.iter_mut() {
        if let Some(d) = done.get(&c.key()) {
            *c = d.clone();
        }
    }
    let mut m = Matrix::prepare(a, bin, work, chosen, params, stop, far_ssh)?;
    if params.workloads.iter().any(|w| w != "mem") {
        doc.limits.destination_write_bytes_per_second =
            run::write_rate(&work.join("limits"), params.elephant_bytes.min(1 << 30)).ok();
    }
    m.total = doc.cells.iter().filter(|c| c.runs.is_empty()).count() * params.runs as usize;
    for p in paths {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let pending: Vec<usize> = (0..doc.cells.len())
            .filter(|&i| doc.cells[i].path == p.name && doc.cells[i].runs.is_empty())
            .collect();
        if pending.is_empty() {
            continue;
        }
        let net = match m.open_path(p) {
            Ok(n) => n,
            Err(e) => {
                for &i in &pending {
                    doc.cells[i].error = Some(e.clone());
                }
                eprintln!("longhaul matrix: path {}: {e}", p.name);
                continue;
            }
        };
        let mut servers = m.start_servers(p, &net, &pending, doc)?;
        for w in &params.workloads {
            m.run_workload(p, &net, &mut servers, w, &pending, doc)?;
        }
        // The servers end before the network they run in.
        drop(servers);
        drop(net);
    }
    Ok(())
}

fn mk(p: &Path) -> Result<(), String> {
    std::fs::create_dir_all(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// What every run of the matrix shares.
struct Matrix<'a> {
    a: &'a MatrixArgs,
    bin: &'a Path,
    work: &'a Path,
    chosen: &'a [(Tool, Vec<String>)],
    params: &'a Params,
    stop: &'a AtomicBool,
    far_ssh: Option<&'a (far::Ssh, String)>,
    data: PathBuf,
    logs: PathBuf,
    state: PathBuf,
    /// This host's `/etc/hosts` with the emulator's two hosts added, for
    /// servers that resolve names (gridftp resolves this machine's name).
    hosts: PathBuf,
    /// Each file workload's bytes and manifest, made once.
    sizes: BTreeMap<String, u64>,
    manifests: BTreeMap<String, Manifest>,
    /// Client environments (tokens, fingerprints), once per tool.
    envs: BTreeMap<String, BTreeMap<String, String>>,
    /// Each tool's two server ports.
    ports: BTreeMap<String, (u16, u16)>,
    step: usize,
    total: usize,
}

/// The network a path runs in. Its parts end in this order: the far
/// host's work, the emulated WAN, the private namespace.
struct PathNet {
    far: Option<far::Far>,
    wan: Option<run::Wan>,
    /// Held for its end: dropped, the namespace goes.
    _private: Option<run::PrivateNs>,
    /// The clients' and the servers' namespaces.
    ns_a: Option<String>,
    ns_b: Option<String>,
    /// The servers' host, as clients reach it.
    host: String,
    /// What `{rate}` says: the path's bottleneck, or more than loopback carries.
    rate: u64,
}

/// A path's servers, and the tools whose server could not start.
struct Servers {
    running: BTreeMap<String, Served>,
    failed: BTreeMap<String, String>,
    /// How each server here was started, to start it again.
    starts: BTreeMap<String, Start>,
}

/// A server's start here (or in the emulator's namespace).
struct Start {
    argv: Vec<String>,
    hosts_file: bool,
    port: u16,
    log: PathBuf,
}

/// A peer's server: here (or in an emulator's namespace), or on the far host.
enum Served {
    Here(run::Owned),
    Far(far::FarServer),
}

impl Served {
    /// CPU seconds of its process group so far.
    fn cpu(&mut self) -> f64 {
        match self {
            Served::Here(o) => run::group_cpu(o.pid()),
            Served::Far(s) => s.cpu(),
        }
    }
}

impl<'a> Matrix<'a> {
    /// The work directory's parts and the file workloads' data.
    fn prepare(
        a: &'a MatrixArgs,
        bin: &'a Path,
        work: &'a Path,
        chosen: &'a [(Tool, Vec<String>)],
        params: &'a Params,
        stop: &'a AtomicBool,
        far_ssh: Option<&'a (far::Ssh, String)>,
    ) -> Result<Matrix<'a>, String> {
        let (data, logs, state) = (work.join("data"), work.join("logs"), work.join("state"));
        for d in [&data, &logs, &state] {
            mk(d)?;
        }
        let hosts = work.join("hosts");
        let etc = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        std::fs::write(&hosts, format!("{etc}\n198.18.0.1\ta\n198.18.0.2\tb\n"))
            .map_err(|e| format!("{}: {e}", hosts.display()))?;
        let mut manifests = BTreeMap::new();
        let mut sizes = BTreeMap::new();
        for w in params.workloads.iter().filter(|w| *w != "mem") {
            let d = data.join(w);
            if !d.exists() {
                eprintln!("longhaul matrix: making the {w} data in {}", d.display());
                run::make_data(w, &d, params.elephant_bytes, params.small_files)
                    .map_err(|e| format!("cannot make the {w} data in {}: {e}", d.display()))?;
            }
            let m = run::manifest(&d).map_err(|e| format!("cannot read {}: {e}", d.display()))?;
            sizes.insert(w.clone(), m.values().map(|(l, _)| l).sum::<u64>());
            manifests.insert(w.clone(), m);
        }
        Ok(Matrix {
            a,
            bin,
            work,
            chosen,
            params,
            stop,
            far_ssh,
            data,
            logs,
            state,
            hosts,
            sizes,
            manifests,
            envs: BTreeMap::new(),
            ports: BTreeMap::new(),
            step: 0,
            total: 0,
        })
    }

    fn remote_path(&self) -> &'a str {
        self.far_ssh.map_or("longhaul", |(_, rp)| rp.as_str())
    }

    /// A tool's placeholders here.
    fn vars(&self, t: &Tool) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("bin", self.bin.display().to_string()),
            ("root", self.work.display().to_string()),
            ("state", self.state.join(&t.name).display().to_string()),
            (
                "seconds",
                format!("{}", self.params.mem_seconds.ceil() as u64),
            ),
        ])
    }

    /// Brings up a path's network: loopback in a network namespace of its
    /// own where we may make one (root: the peers' servers, an anonymous
    /// GridFTP, an rsync daemon as root, are then out of reach of every
    /// other process on the host), an emulated WAN, or the far host's work
    /// directory with the data there.
    fn open_path(&self, p: &PathSpec) -> Result<PathNet, String> {
        let wan = match p.rate_bps.filter(|_| p.name != "loopback") {
            None => None,
            Some(r) => Some(run::wan_up(
                self.bin,
                Duration::from_secs_f64(p.rtt_ms / 1e3),
                p.loss,
                r,
            )?),
        };
        let private = if wan.is_none() && p.far.is_none() {
            run::PrivateNs::new()
        } else {
            None
        };
        let far = match (&p.far, self.far_ssh) {
            (Some(_), Some((ssh, rp))) => {
                Some(open_far(self.bin, ssh, rp, &self.data, self.params)?)
            }
            _ => None,
        };
        let (ns_a, ns_b, host) = match (&far, &wan, &private) {
            (Some(f), _, _) => (None, None, f.addr.clone()),
            (None, Some(w), _) => (Some(w.ns_a.clone()), Some(w.ns_b.clone()), w.host_b.clone()),
            (None, None, Some(n)) => (
                Some(n.name.clone()),
                Some(n.name.clone()),
                "127.0.0.1".into(),
            ),
            (None, None, None) => (None, None, "127.0.0.1".to_string()),
        };
        Ok(PathNet {
            far,
            wan,
            _private: private,
            ns_a,
            ns_b,
            host,
            rate: p.rate_bps.unwrap_or(100_000_000_000),
        })
    }

    /// Starts the servers of the tools with cells pending on this path.
    fn start_servers(
        &mut self,
        p: &PathSpec,
        net: &PathNet,
        pending: &[usize],
        doc: &Doc,
    ) -> Result<Servers, String> {
        let mut servers = Servers {
            running: BTreeMap::new(),
            failed: BTreeMap::new(),
            starts: BTreeMap::new(),
        };
        for (t, _) in self.chosen {
            let needed = pending.iter().any(|&i| doc.cells[i].tool == t.name);
            let Some(s) = t.server.as_ref().filter(|_| needed) else {
                continue;
            };
            let tstate = self.state.join(&t.name);
            mk(&tstate)?;
            if let Some(f) = &net.far {
                if t.over_ssh {
                    // The far host's own sshd, reached with the user's ssh.
                    let w = tstate.join("ssh");
                    write_script(&w, &format!("#!/bin/sh\nexec {} \"$@\"\n", f.ssh.rsh_line))?;
                    continue;
                }
            }
            // The server's side: here, or on the far host.
            let mut vars = match &net.far {
                Some(f) => far_vars(f, t, self.remote_path(), self.params),
                None => self.vars(t),
            };
            if let Err(e) = self.client_env(t, &vars, net.far.as_ref()) {
                servers.failed.insert(t.name.clone(), e);
            }
            let pp = match self.ports.get(&t.name) {
                Some(p) if net.wan.is_some() => *p,
                _ if net.far.is_some() => far_ports(),
                _ => run::free_ports()?,
            };
            self.ports.insert(t.name.clone(), pp);
            vars.insert("host", net.host.clone());
            vars.insert("rate", net.rate.to_string());
            vars.insert("port", pp.0.to_string());
            vars.insert("port1", pp.1.to_string());
            let argv: Vec<String> = s.argv.iter().map(|x| peers::fill(x, &vars)).collect();
            if let Some(f) = &net.far {
                let started = (|| {
                    for (name, text) in &s.files {
                        f.write(
                            &format!("{}/{name}", vars["state"]),
                            &peers::fill(text, &vars),
                        )?;
                    }
                    f.start_server(&argv, &format!("{}/server.log", vars["state"]), pp.0)
                })();
                match started {
                    Ok(o) => {
                        servers.running.insert(t.name.clone(), Served::Far(o));
                    }
                    Err(e) => {
                        servers.failed.insert(t.name.clone(), e);
                    }
                }
                continue;
            }
            for (name, text) in &s.files {
                let f = tstate.join(name);
                std::fs::write(&f, peers::fill(text, &vars))
                    .map_err(|e| format!("{}: {e}", f.display()))?;
            }
            let start = Start {
                argv,
                hosts_file: s.hosts_file && net.wan.is_some(),
                port: pp.0,
                log: self.logs.join(format!(
                    "{}-{}-server.log",
                    p.name.replace('/', "_"),
                    t.name
                )),
            };
            match self.start_here(&start, net) {
                Ok(o) => {
                    servers.running.insert(t.name.clone(), Served::Here(o));
                }
                Err(e) => {
                    servers.failed.insert(t.name.clone(), e);
                }
            }
            servers.starts.insert(t.name.clone(), start);
        }
        Ok(servers)
    }

    fn start_here(&self, s: &Start, net: &PathNet) -> Result<run::Owned, String> {
        let hf = s.hosts_file.then_some(self.hosts.as_path());
        run::start_server(&s.argv, net.ns_b.as_deref(), hf, &net.host, s.port, &s.log)
    }

    /// Starts a tool's server here again after one of its runs failed: a
    /// server a failed run wedged (iperf2's after `-R -P 4`) would fail
    /// every run after it.
    fn restart(&self, servers: &mut Servers, net: &PathNet, tool: &str) {
        let Some(start) = servers.starts.get(tool) else {
            return;
        };
        drop(servers.running.remove(tool));
        match self.start_here(start, net) {
            Ok(o) => {
                eprintln!("longhaul matrix: started {tool}'s server again after a failed run");
                servers.running.insert(tool.to_string(), Served::Here(o));
            }
            Err(e) => {
                servers.failed.insert(
                    tool.to_string(),
                    format!("its server, started again after a failed run: {e}"),
                );
            }
        }
    }

    /// The client environment of a tool (a token, a fingerprint), made
    /// once from its `env` commands, here or on the far host.
    fn client_env(
        &mut self,
        t: &Tool,
        vars: &BTreeMap<&'static str, String>,
        far: Option<&far::Far>,
    ) -> Result<(), String> {
        let std::collections::btree_map::Entry::Vacant(slot) =
            self.envs.entry(env_key(t, far.is_some()))
        else {
            return Ok(());
        };
        let mut env = BTreeMap::new();
        let mut failed = Ok(());
        for e in &t.env {
            let argv: Vec<String> = e.argv.iter().map(|x| peers::fill(x, vars)).collect();
            let out = match far {
                Some(f) => (|| {
                    let words: Vec<&str> = argv.iter().map(String::as_str).collect();
                    let state = far::join(&[&vars["state"]])?;
                    f.ssh
                        .run(&format!("mkdir -p {state} && {}", far::join(&words)?), None)
                })(),
                None => std::process::Command::new(&argv[0])
                    .args(&argv[1..])
                    .stderr(std::process::Stdio::null())
                    .output()
                    .map_err(|e| e.to_string())
                    .and_then(|o| {
                        if o.status.success() {
                            Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
                        } else {
                            Err(o.status.to_string())
                        }
                    }),
            };
            match out {
                Ok(o) => {
                    env.insert(e.var.clone(), o);
                }
                Err(why) => failed = Err(format!("`{}` failed: {why}", argv.join(" "))),
            }
        }
        slot.insert(env);
        failed
    }

    /// Runs one workload's pending cells on a path, `runs` times each,
    /// interleaved, and sums each cell up.
    fn run_workload(
        &mut self,
        p: &PathSpec,
        net: &PathNet,
        servers: &mut Servers,
        w: &str,
        pending: &[usize],
        doc: &mut Doc,
    ) -> Result<(), String> {
        let cells: Vec<usize> = pending
            .iter()
            .copied()
            .filter(|&i| doc.cells[i].workload == w)
            .collect();
        for &i in &cells {
            if let Some(e) = servers.failed.get(&doc.cells[i].tool) {
                doc.cells[i].error = Some(e.clone());
            }
        }
        let live: Vec<usize> = cells
            .iter()
            .copied()
            .filter(|&i| doc.cells[i].error.is_none())
            .collect();
        for r in 0..self.params.runs as usize {
            for k in 0..live.len() {
                if self.stop.load(Ordering::SeqCst) {
                    break;
                }
                let i = live[(k + r) % live.len()];
                let c = doc.cells[i].clone();
                let Some((t, _)) = self.chosen.iter().find(|(t, _)| t.name == c.tool) else {
                    continue;
                };
                let Some(s) = t.settings.iter().find(|s| s.name == c.settings) else {
                    continue;
                };
                self.step += 1;
                let res = match servers.failed.get(&t.name) {
                    Some(e) => RunResult {
                        error: Some(e.clone()),
                        ..RunResult::default()
                    },
                    None => {
                        let (res, note) = self.run_once(p, net, servers, &c, t, s, r)?;
                        if note.is_some() {
                            doc.cells[i].note = note;
                        }
                        res
                    }
                };
                eprintln!(
                    "[{}/{}] {} {w} {} {}:{}: {}",
                    self.step,
                    self.total,
                    p.name,
                    c.direction,
                    t.name,
                    s.name,
                    said(&res)
                );
                if res.error.is_some() && !servers.failed.contains_key(&t.name) {
                    self.restart(servers, net, &t.name);
                }
                doc.cells[i].runs.push(res);
            }
        }
        for &i in &live {
            // A cell cut short by an interrupt is run again whole by --resume.
            if doc.cells[i].runs.len() < self.params.runs as usize {
                doc.cells[i].runs.clear();
                doc.cells[i].error = None;
            } else {
                summarise(&mut doc.cells[i]);
            }
        }
        if let Some(f) = &self.a.resume {
            super::save(f, doc);
        }
        Ok(())
    }

    /// One run of a cell: its client, timed, with the servers' CPU over
    /// it, and a copy's check. Also a note for the cell, if the copy did
    /// not verify.
    #[allow(clippy::too_many_arguments)]
    fn run_once(
        &self,
        p: &PathSpec,
        net: &PathNet,
        servers: &mut Servers,
        c: &Cell,
        t: &Tool,
        s: &Settings,
        r: usize,
    ) -> Result<(RunResult, Option<String>), String> {
        let w = c.workload.as_str();
        let mut vars = self.vars(t);
        let pp = self.ports.get(&t.name).copied().unwrap_or((0, 0));
        vars.insert("host", net.host.clone());
        vars.insert("rate", net.rate.to_string());
        vars.insert("port", pp.0.to_string());
        vars.insert("port1", pp.1.to_string());
        let tag = format!(
            "{}-{}-{}-{}-{}-r{r}",
            p.name.replace('/', "_"),
            w,
            t.name,
            s.name,
            c.direction
        );
        // The far side of a run: the far host's work directory on --far
        // (the put's destination, the get's source), else this one's (its
        // servers serve it).
        let far_here = net.far.as_ref().filter(|_| !t.local);
        let put = c.direction == "put";
        let far_root = far_here.map(|f| PathBuf::from(&f.root));
        let root = far_root.as_deref().unwrap_or(self.work);
        let src = if put {
            self.data.join(w)
        } else {
            root.join("data").join(w)
        };
        let dstdir = if put { root } else { self.work }
            .join(&c.direction)
            .join(&tag);
        let far_dst = far_here.filter(|_| put && w != "mem");
        if w != "mem" {
            match far_dst {
                Some(f) => f.mkdir(&dstdir.display().to_string())?,
                None => {
                    let _ = std::fs::remove_dir_all(&dstdir);
                    mk(&dstdir)?;
                }
            }
        }
        let dst = dstdir.join(w);
        let rel = |x: &Path| {
            x.strip_prefix(root)
                .map(|r| r.display().to_string())
                .unwrap_or_default()
        };
        vars.insert("src", src.display().to_string());
        vars.insert("dst", dst.display().to_string());
        vars.insert("dstdir", dstdir.display().to_string());
        vars.insert("name", w.to_string());
        vars.insert("src_rel", rel(&src));
        vars.insert("dst_rel", rel(&dst));
        vars.insert("dstdir_rel", rel(&dstdir));
        vars.insert(
            "ssh",
            self.state.join(&t.name).join("ssh").display().to_string(),
        );
        vars.insert(
            "sshhost",
            far_here.map_or(net.host.clone(), |f| f.ssh.dest.clone()),
        );
        let template = if put { &t.put } else { &t.get };
        let argv = peers::argv(template, s, &vars);
        let cpu0 = servers.running.get_mut(&t.name).map_or(0.0, Served::cpu);
        let netns = if t.local { None } else { net.ns_a.as_deref() };
        let env = self
            .envs
            .get(&env_key(t, far_here.is_some()))
            .cloned()
            .unwrap_or_default();
        let ran = run::run_client(
            &argv,
            netns,
            &env,
            self.a.run_timeout,
            self.stop,
            &self.logs,
            &tag,
        );
        let cpu1 = servers.running.get_mut(&t.name).map_or(0.0, Served::cpu);
        let mut res = RunResult {
            bytes_per_second: None,
            seconds: ran.seconds,
            cpu_client_seconds: ran.cpu,
            cpu_server_seconds: (cpu1 - cpu0).max(0.0),
            verified: None,
            error: ran.error,
        };
        let mut note = None;
        if res.error.is_none() {
            if w == "mem" {
                match peers::read_figure(t.figure, &ran.stdout) {
                    Ok(b) => res.bytes_per_second = Some(b),
                    Err(e) => res.error = Some(e),
                }
            } else {
                let bytes = self.sizes.get(w).copied().unwrap_or(0);
                res.bytes_per_second = Some(bytes as f64 / ran.seconds.max(1e-9));
                let bad = self.check_copy(w, &tag, far_dst, &dst)?;
                res.verified = Some(bad.is_none());
                note = bad.map(|b| format!("not verified: {b}"));
            }
        }
        if w != "mem" {
            match far_dst {
                Some(f) => f.remove(&dstdir.display().to_string()),
                None => {
                    let _ = std::fs::remove_dir_all(&dstdir);
                }
            }
        }
        Ok((res, note))
    }

    /// What is wrong with a copy, if anything, against its workload's
    /// manifest. A far copy comes back (the far longhaul reads it) to be
    /// compared here.
    fn check_copy(
        &self,
        w: &str,
        tag: &str,
        far_dst: Option<&far::Far>,
        dst: &Path,
    ) -> Result<Option<String>, String> {
        let check = self.work.join("check").join(tag);
        let got = match far_dst {
            Some(f) => {
                let _ = std::fs::remove_dir_all(&check);
                mk(&check)?;
                f.pull(
                    self.bin,
                    self.remote_path(),
                    &dst.display().to_string(),
                    &check,
                )
                .map(|()| check.join(w))
            }
            None => Ok(dst.to_path_buf()),
        };
        let bad = match got {
            Ok(d) => self.manifests.get(w).and_then(|m| run::verify(m, &d)),
            Err(e) => Some(format!("cannot read the far copy: {e}")),
        };
        let _ = std::fs::remove_dir_all(&check);
        Ok(bad)
    }
}

/// A run's outcome in the progress line.
fn said(res: &RunResult) -> String {
    match (&res.error, res.bytes_per_second) {
        (Some(e), _) => format!("failed: {e}"),
        (None, Some(b)) => format!(
            "{:.1} MB/s{}",
            b / 1e6,
            match res.verified {
                Some(true) => ", verified",
                Some(false) => ", NOT VERIFIED",
                None => "",
            }
        ),
        (None, None) => "no figure".into(),
    }
}

/// Which client environment (token, fingerprint): a far server's differs.
fn env_key(t: &Tool, far: bool) -> String {
    if far {
        format!("{}@far", t.name)
    } else {
        t.name.clone()
    }
}

/// A server's placeholders on the far host.
fn far_vars(
    f: &far::Far,
    t: &Tool,
    remote_path: &str,
    params: &Params,
) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("bin", remote_path.to_string()),
        ("root", f.root.clone()),
        ("state", format!("{}/state/{}", f.root, t.name)),
        ("seconds", format!("{}", params.mem_seconds.ceil() as u64)),
    ])
}

/// Two ports for a far server: random, high, outside Linux's ephemeral
/// range (32768-60999), so a far client's socket is unlikely to hold one;
/// one in use is seen before the start (it already accepts) or by the
/// server's failure to bind.
fn far_ports() -> (u16, u16) {
    let mut b = [0u8; 4];
    let _ = getrandom_bytes(&mut b);
    let a = 20000 + u16::from_le_bytes([b[0], b[1]]) % 12000;
    (a, a + 1 + u16::from(b[2] % 100))
}

fn getrandom_bytes(b: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")?.read_exact(b)
}

/// A small executable script (owner only).
fn write_script(p: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(p, text)
        .and_then(|()| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// Opens the far host's work directory and copies the file workloads' data there.
fn open_far(
    bin: &Path,
    ssh: &far::Ssh,
    remote_path: &str,
    data: &Path,
    params: &Params,
) -> Result<far::Far, String> {
    let f = far::Far::open(ssh, &data.with_file_name("far-ssh.sock"))?;
    eprintln!(
        "longhaul matrix: work directory on {}: {} (its servers on {})",
        ssh.dest, f.root, f.addr
    );
    let fdata = format!("{}/data", f.root);
    f.mkdir(&fdata)?;
    for w in params.workloads.iter().filter(|w| *w != "mem") {
        eprintln!("longhaul matrix: copying the {w} data to {}", ssh.dest);
        f.push(bin, remote_path, &data.join(w), &fdata)?;
    }
    Ok(f)
}
