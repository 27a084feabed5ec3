//! Running the matrix: path by path, the path's network (loopback in a
//! namespace of its own, an emulated WAN, or the far host), the peers'
//! servers it needs (each in a cgroup of its own), then each workload:
//! the sweeps that find each tool's `best` on it, then its cells' runs
//! interleaved (run `r` starts at cell `r`), each copy checked against the
//! data's manifest. A server that a failed run may have wedged is started
//! again before the next run; a cell whose run timed out runs no more.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::cgroup::{Accounting, Group};
use super::peers::{self, Tool, BEST};
use super::sweep::{self, PathFacts, Swept};
use super::verify::{self, Manifest};
use super::{far, run, Cell, Doc, Params, PathSpec, RunResult};
use crate::args::MatrixArgs;
use crate::print::matrix::args_text as shown_args;

/// What every part of a matrix's run shares.
pub(super) struct Setup<'a> {
    pub a: &'a MatrixArgs,
    pub bin: &'a Path,
    pub work: &'a Path,
    pub chosen: &'a [(Tool, Vec<String>)],
    pub params: &'a Params,
    pub stop: &'a AtomicBool,
    pub far_ssh: Option<&'a (far::Ssh, String)>,
    /// `-v`: each run's command line, and every candidate of a sweep.
    pub verbose: u8,
}

/// What every tool is told about a path.
pub(super) fn facts(p: &PathSpec, rate: u64) -> PathFacts {
    PathFacts {
        rate_bps: rate,
        rtt_s: p.rtt_ms / 1e3,
        socket_cap: sweep::socket_cap(),
    }
}

/// Runs every cell not yet done, path by path.
pub(super) fn drive(
    s: &Setup,
    paths: &[PathSpec],
    doc: &mut Doc,
    done: &BTreeMap<longhaul_archive::matrix::CellKey, Cell>,
) -> Result<(), String> {
    for c in doc.cells.iter_mut() {
        if let Some(d) = done.get(&c.key()) {
            *c = d.clone();
        }
    }
    // Nothing left to run (a --resume or --merge of finished pieces): no data to make.
    if !doc.cells.iter().any(Cell::pending) {
        return Ok(());
    }
    let (mut m, given) = Matrix::prepare(s)?;
    doc.params.given = given;
    m.total = doc.cells.iter().filter(|c| c.pending()).count() * s.params.runs as usize;
    // Nothing left to run (a --resume of a finished matrix): only its table.
    if m.total > 0 && s.params.workloads.iter().any(|w| w != "mem") {
        doc.limits.destination_write_bytes_per_second =
            run::write_rate(&s.work.join("limits"), s.params.elephant_bytes.min(1 << 30)).ok();
    }
    for (i, p) in paths.iter().enumerate() {
        if s.stop.load(Ordering::SeqCst) {
            break;
        }
        let pending: Vec<usize> = (0..doc.cells.len())
            .filter(|&i| doc.cells[i].path == p.name && doc.cells[i].pending())
            .collect();
        if pending.is_empty() {
            continue;
        }
        let mut net = match m.open_path(p) {
            Ok(n) => n,
            Err(e) => {
                for &i in &pending {
                    doc.cells[i].error = Some(e.clone());
                }
                eprintln!("longhaul matrix: path {}: {e}", p.name);
                continue;
            }
        };
        let mut servers = m.start_servers(i, p, &net, &pending, doc)?;
        if net.far.is_some() {
            net.facts.rtt_s = servers.round_trip(&net.host).unwrap_or(0.0);
        }
        for w in &s.params.workloads {
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
    s: &'a Setup<'a>,
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
    /// Where each end's CPU is counted; None: CPU unknown.
    acct: Option<Accounting>,
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
    /// What the tools are told about the path.
    facts: PathFacts,
}

/// A path's servers, and the tools whose server could not start.
struct Servers {
    running: BTreeMap<String, Served>,
    failed: BTreeMap<String, String>,
    /// How each server here was started, to start it again.
    starts: BTreeMap<String, Start>,
    /// Each server's cgroup here.
    groups: BTreeMap<String, Group>,
}

impl Servers {
    /// The path's round trip, seconds: the quickest of 5 connections to
    /// one of its servers (the far host's, whose RTT the matrix does not set).
    fn round_trip(&self, host: &str) -> Option<f64> {
        let port = self.running.values().find_map(|s| match s {
            Served::Far(f) => Some(f.port),
            Served::Here(..) => None,
        })?;
        (0..5)
            .filter_map(|_| run::connect_seconds(host, port))
            .min_by(f64::total_cmp)
    }

    /// CPU seconds of a tool's server so far: Some(0) for a tool with no
    /// server, None where it could not be measured.
    fn cpu(&mut self, tool: &Tool) -> Option<f64> {
        match self.running.get_mut(&tool.name) {
            Some(Served::Here(_)) => self.groups.get(&tool.name)?.usage(),
            Some(Served::Far(s)) => s.cpu(),
            None if tool.server.is_none() => Some(0.0),
            None => None,
        }
    }
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
    Here(#[allow(dead_code)] run::Owned),
    Far(far::FarServer),
}

/// One run of a tool: what, how, for how long.
struct Job<'a> {
    tool: &'a Tool,
    workload: &'a str,
    direction: &'a str,
    args: &'a [String],
    tag: String,
    timeout: Duration,
}

impl<'a> Matrix<'a> {
    /// The work directory's parts and the file workloads' data, made
    /// before any clock starts.
    fn prepare(s: &'a Setup<'a>) -> Result<(Matrix<'a>, Vec<String>), String> {
        let work = s.work;
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
        let mut given = Vec::new();
        for w in data_names(&s.params.workloads) {
            let d = data.join(w);
            if d.exists() {
                eprintln!(
                    "longhaul matrix: the {w} data is the tree already in {}",
                    d.display()
                );
                given.push(w.to_string());
            } else {
                eprintln!("longhaul matrix: making the {w} data in {}", d.display());
                run::make_data(w, &d, s.params.elephant_bytes, s.params.small_files)
                    .map_err(|e| format!("cannot make the {w} data in {}: {e}", d.display()))?;
            }
            let m =
                verify::manifest(&d).map_err(|e| format!("cannot read {}: {e}", d.display()))?;
            sizes.insert(w.to_string(), verify::bytes(&m));
            manifests.insert(w.to_string(), m);
        }
        let m = Matrix {
            s,
            data,
            logs,
            state,
            hosts,
            sizes,
            manifests,
            envs: BTreeMap::new(),
            ports: BTreeMap::new(),
            acct: Accounting::new(),
            step: 0,
            total: 0,
        };
        Ok((m, given))
    }

    /// The longhaul program a tool's `{bin}` names: its own build, or this one.
    fn bin(&self, t: &Tool) -> String {
        t.bin
            .clone()
            .unwrap_or_else(|| self.s.bin.display().to_string())
    }

    fn remote_path(&self) -> &'a str {
        self.s.far_ssh.map_or("longhaul", |(_, rp)| rp.as_str())
    }

    /// A tool's placeholders here.
    fn vars(&self, t: &Tool) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("bin", self.bin(t)),
            ("root", self.s.work.display().to_string()),
            (
                "state",
                self.state.join(file_name(&t.name)).display().to_string(),
            ),
            (
                "seconds",
                format!("{}", self.s.params.mem_seconds.ceil() as u64),
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
                self.s.bin,
                Duration::from_secs_f64(p.rtt_ms / 1e3),
                p.loss,
                r,
                run::WAN_UP_LIMIT,
            )?),
        };
        let private = if wan.is_none() && p.far.is_none() {
            run::PrivateNs::new()
        } else {
            None
        };
        let far = match (&p.far, self.s.far_ssh) {
            (Some(_), Some((ssh, rp))) => Some(open_far(self.s, ssh, rp, &self.data)?),
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
        // On --far the rate is --rate's (the matrix does not know it).
        let rate = p.rate_bps.unwrap_or(if far.is_some() {
            self.s.a.rate
        } else {
            100_000_000_000
        });
        Ok(PathNet {
            far,
            wan,
            _private: private,
            ns_a,
            ns_b,
            host,
            facts: facts(p, rate),
        })
    }

    /// Starts the servers of the tools with cells pending on this path.
    fn start_servers(
        &mut self,
        index: usize,
        p: &PathSpec,
        net: &PathNet,
        pending: &[usize],
        doc: &Doc,
    ) -> Result<Servers, String> {
        let mut servers = Servers {
            running: BTreeMap::new(),
            failed: BTreeMap::new(),
            starts: BTreeMap::new(),
            groups: BTreeMap::new(),
        };
        for (t, _) in self.s.chosen {
            let needed = pending.iter().any(|&i| doc.cells[i].tool == t.name);
            let Some(s) = t.server.as_ref().filter(|_| needed) else {
                continue;
            };
            let tstate = self.state.join(file_name(&t.name));
            mk(&tstate)?;
            // The server's side: here, or on the far host.
            let mut vars = match &net.far {
                Some(f) => far_vars(f, t, self.remote_path(), self.s.params),
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
            vars.extend(net.facts.vars());
            vars.insert("host", net.host.clone());
            vars.insert("port", pp.0.to_string());
            vars.insert("port1", pp.1.to_string());
            let argv: Vec<String> = s.argv.iter().map(|x| peers::fill(x, &vars)).collect();
            if let Some(f) = &net.far {
                let started = (|| {
                    f.mkdir(&vars["state"])?;
                    for (name, text) in &s.files {
                        f.write(
                            &format!("{}/{name}", vars["state"]),
                            &peers::fill(text, &vars),
                        )?;
                    }
                    let o =
                        f.start_server(&argv, &format!("{}/server.log", vars["state"]), pp.0)?;
                    if t.over_ssh {
                        far_ssh_client(f, &vars["state"], &tstate, pp.0)?;
                    }
                    Ok(o)
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
                log: self
                    .logs
                    .join(file_name(&format!("{}-{}-server.log", p.name, t.name))),
            };
            if let Some(g) = self
                .acct
                .as_ref()
                .and_then(|a| a.group(&format!("server-{index}-{}", file_name(&t.name))))
            {
                servers.groups.insert(t.name.clone(), g);
            }
            match self.start_here(&start, net, servers.groups.get(&t.name)) {
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

    fn start_here(
        &self,
        s: &Start,
        net: &PathNet,
        g: Option<&Group>,
    ) -> Result<run::Owned, String> {
        let hf = s.hosts_file.then_some(self.hosts.as_path());
        run::start_server(
            &s.argv,
            net.ns_b.as_deref(),
            hf,
            (&net.host, s.port),
            &s.log,
            g,
        )
    }

    /// Starts a tool's server here again after one of its runs failed: a
    /// server a failed run wedged (iperf2's after `-R -P 4`) would fail
    /// every run after it.
    fn restart(&self, servers: &mut Servers, net: &PathNet, tool: &str) {
        let Some(start) = servers.starts.get(tool) else {
            return;
        };
        drop(servers.running.remove(tool));
        if let Some(g) = servers.groups.get(tool) {
            g.kill_all();
        }
        match self.start_here(start, net, servers.groups.get(tool)) {
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
            match env_output(&argv, &vars["state"], far, self.s.a.run_timeout) {
                Ok(o) => {
                    env.insert(e.var.clone(), o);
                }
                Err(why) => {
                    failed = Err(format!(
                        "{}'s client variable {}: `{}` failed: {why}",
                        t.name,
                        e.var,
                        argv.join(" ")
                    ))
                }
            }
        }
        slot.insert(env);
        failed
    }

    /// Runs one workload's pending cells on a path: the sweeps of their
    /// tools' `best`, then the cells `runs` times each, interleaved; sums
    /// each cell up.
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
        self.sweep_all(p, net, servers, w, &live, doc)?;
        let runs = self.s.params.runs as usize;
        for r in 0..runs {
            for k in 0..live.len() {
                if self.s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let i = live[(k + r) % live.len()];
                self.run_cell(p, net, servers, i, r, doc)?;
            }
        }
        for &i in live.iter().filter(|_| runs > 0) {
            // A cell cut short by an interrupt is run again whole by --resume.
            if doc.cells[i].runs.len() < runs {
                doc.cells[i].runs.clear();
                doc.cells[i].error = None;
            } else {
                doc.cells[i].summarise(runs as u32);
            }
        }
        if let Some(f) = &self.s.a.resume {
            super::save(f, doc);
        }
        Ok(())
    }

    /// Run `r` of cell `i`; none after a run that timed out (it would again).
    fn run_cell(
        &mut self,
        p: &PathSpec,
        net: &PathNet,
        servers: &mut Servers,
        i: usize,
        r: usize,
        doc: &mut Doc,
    ) -> Result<(), String> {
        let c = doc.cells[i].clone();
        let Some((t, _)) = self.s.chosen.iter().find(|(t, _)| t.name == c.tool) else {
            return Ok(());
        };
        self.step += 1;
        let timed_out = c
            .runs
            .iter()
            .find_map(|r| r.error.as_deref().filter(|e| e.starts_with("timed out")));
        let args = settings_args(t, &c, doc);
        let res = match (servers.failed.get(&t.name), timed_out, &args) {
            (Some(e), _, _) => failed_run(e.clone()),
            (_, Some(e), _) => failed_run(format!("not run: an earlier run {e}")),
            (_, _, Err(e)) => failed_run(e.clone()),
            (None, None, Ok(args)) => {
                let job = Job {
                    tool: t,
                    workload: &c.workload,
                    direction: &c.direction,
                    args,
                    tag: tag(
                        p,
                        &c.workload,
                        t,
                        &c.settings,
                        &c.direction,
                        &format!("r{r}"),
                    ),
                    timeout: self.s.a.run_timeout,
                };
                let (res, filled, note) = self.run_once(net, servers, &job)?;
                doc.cells[i].cell.args = Some(filled);
                if note.is_some() {
                    doc.cells[i].note = note;
                }
                res
            }
        };
        eprintln!(
            "[{}/{}] {} {} {} {}:{}: {}",
            self.step,
            self.total,
            p.name,
            c.workload,
            c.direction,
            t.name,
            c.settings,
            said(&res)
        );
        let ran = res
            .error
            .as_deref()
            .is_some_and(|e| !e.starts_with("not run"));
        if ran && !servers.failed.contains_key(&t.name) {
            self.restart(servers, net, &t.name);
        }
        doc.cells[i].runs.push(res);
        Ok(())
    }

    /// The sweeps of this workload's `best` cells on the path: each tool's
    /// grid ([`Matrix::sweep_tool`]), unless a winner is known (`--resume`,
    /// or remembered by `--quick`).
    fn sweep_all(
        &mut self,
        p: &PathSpec,
        net: &PathNet,
        servers: &mut Servers,
        w: &str,
        live: &[usize],
        doc: &mut Doc,
    ) -> Result<(), String> {
        for (t, _) in self.s.chosen {
            let Some(grid) = t.sweep.as_ref() else {
                continue;
            };
            let wanted = live
                .iter()
                .any(|&i| doc.cells[i].tool == t.name && doc.cells[i].settings == BEST);
            let known = doc
                .sweeps
                .iter()
                .any(|s| s.tool == t.name && s.path == p.name && s.workload == w);
            if !wanted || known || servers.failed.contains_key(&t.name) {
                continue;
            }
            let bytes = self.sizes.get(super::split_workload(w).0).copied();
            let grid = sweep::candidates(&fitted(grid, bytes, &net.facts), &net.facts);
            let candidates = self.sweep_tool(p, net, servers, w, t, &grid)?;
            if self.s.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let mut swept = Swept {
                tool: t.name.clone(),
                path: p.name.clone(),
                workload: w.into(),
                candidates,
                ..Swept::default()
            };
            swept.decide();
            if let Some(win) = &swept.winner {
                eprintln!(
                    "longhaul matrix: {} {w} {}: best is {} ({})",
                    p.name,
                    t.name,
                    shown_args(win),
                    swept.summary()
                );
            }
            doc.sweeps.push(swept);
            // A finished sweep is kept even if the run ends before its cells.
            if let Some(f) = &self.s.a.resume {
                super::save(f, doc);
            }
        }
        Ok(())
    }

    /// One tool's sweep on a path and workload: its candidates' puts, a
    /// warm-up each then rounds alternated between them ([`sweep::run_rounds`]).
    fn sweep_tool(
        &mut self,
        p: &PathSpec,
        net: &PathNet,
        servers: &mut Servers,
        w: &str,
        t: &Tool,
        grid: &[Vec<String>],
    ) -> Result<Vec<sweep::Tried>, String> {
        let n = grid.len();
        let plan = sweep::Plan {
            rounds: self.s.a.sweep_rounds,
            run_timeout: self.s.a.run_timeout.as_secs_f64(),
            timed: w != "mem",
        };
        let mut failed: Result<(), String> = Ok(());
        let candidates = sweep::run_rounds(grid.to_vec(), plan, |k, round, cut| {
            if self.s.stop.load(Ordering::SeqCst) || failed.is_err() {
                return None;
            }
            let job = Job {
                tool: t,
                workload: w,
                direction: "put",
                args: &grid[k],
                tag: tag(p, w, t, BEST, "put", &format!("sweep{k}-{round}")),
                timeout: Duration::from_secs_f64(cut),
            };
            let (res, filled, _) = match self.run_once(net, servers, &job) {
                Ok(r) => r,
                Err(e) => {
                    failed = Err(e);
                    return None;
                }
            };
            let ok = res.ok();
            if !ok && !servers.failed.contains_key(&t.name) {
                self.restart(servers, net, &t.name);
            }
            let when = match round {
                0 => "warm-up".to_string(),
                r => format!("round {r}"),
            };
            eprintln!(
                "[sweep {}/{n} {when}] {} {w} {}: {}: {}",
                k + 1,
                p.name,
                t.name,
                shown_args(&filled),
                said(&res)
            );
            Some(sweep::Outcome {
                bytes_per_second: res.bytes_per_second,
                seconds: res.seconds,
                error: (!ok).then(|| res.error.clone().unwrap_or_else(|| "did not verify".into())),
            })
        });
        failed.map(|()| candidates)
    }

    /// Where a run reads and writes, as its placeholders: the far side of
    /// a run is the far host's work directory on --far (the put's
    /// destination, the get's source), else this one's (its servers serve
    /// it). A copy's destination directory is made afresh. Also the
    /// destination, its directory, and the far host when it is there.
    #[allow(clippy::type_complexity)]
    fn place<'n>(
        &self,
        net: &'n PathNet,
        j: &Job,
    ) -> Result<
        (
            BTreeMap<&'static str, String>,
            PathBuf,
            PathBuf,
            Option<&'n far::Far>,
        ),
        String,
    > {
        let (w, t) = (super::split_workload(j.workload).0, j.tool);
        let mut vars = self.vars(t);
        let pp = self.ports.get(&t.name).copied().unwrap_or((0, 0));
        vars.extend(net.facts.vars());
        vars.insert("host", net.host.clone());
        vars.insert("port", pp.0.to_string());
        vars.insert("port1", pp.1.to_string());
        let far_here = net.far.as_ref().filter(|_| !t.local);
        let put = j.direction == "put";
        let far_root = far_here.map(|f| PathBuf::from(&f.root));
        let root = far_root.as_deref().unwrap_or(self.s.work);
        let src = if put {
            self.data.join(w)
        } else {
            root.join("data").join(w)
        };
        let dstdir = if put { root } else { self.s.work }
            .join(j.direction)
            .join(&j.tag);
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
            self.state
                .join(file_name(&t.name))
                .join("ssh")
                .display()
                .to_string(),
        );
        vars.insert("sshhost", net.host.clone());
        let remote_bin = match far_here {
            Some(_) => self.remote_path().to_string(),
            None => self.bin(t),
        };
        vars.insert("remote_bin", remote_bin);
        Ok((vars, dst, dstdir, far_dst))
    }

    /// One run of a tool: its client, timed, in a cgroup of its own, with
    /// its server's CPU over it, and a copy's check. Also the arguments as
    /// run, and a note for the cell if the copy did not verify.
    fn run_once(
        &self,
        net: &PathNet,
        servers: &mut Servers,
        j: &Job,
    ) -> Result<(RunResult, Vec<String>, Option<String>), String> {
        let t = j.tool;
        let (w, step) = super::split_workload(j.workload);
        let (vars, dst, dstdir, far_dst) = self.place(net, j)?;
        let far_here = net.far.as_ref().filter(|_| !t.local);
        let template = match (step, j.direction) {
            (Some(_), _) => &t.sync,
            (None, "put") => &t.put,
            (None, _) => &t.get,
        };
        let argv = peers::argv(template, j.args, &vars);
        let filled = peers::fill_all(j.args, &shown_vars(&vars));
        let set = peers::env_of(j.args, &vars);
        if self.s.verbose > 0 {
            let set: String = set
                .iter()
                .map(|(k, v)| format!("{k}={} ", shown_args(std::slice::from_ref(v))))
                .collect();
            eprintln!("  $ {set}{}", shown_args(&argv));
        }
        let mut env = self
            .envs
            .get(&env_key(t, far_here.is_some()))
            .cloned()
            .unwrap_or_default();
        env.extend(set);
        if let Some(e) = self.before_clock(net, j, &vars, &env, far_dst.is_some(), &dst)? {
            let _ = std::fs::remove_dir_all(&dstdir);
            return Ok((failed_run(e), filled, None));
        }
        let client = self
            .acct
            .as_ref()
            .and_then(|a| a.group(&format!("client-{}", j.tag)));
        let load = super::loadavg()
            .split_whitespace()
            .next()
            .and_then(|l| l.parse().ok());
        let cpu0 = servers.cpu(t);
        let ran = run::run_client(&run::Client {
            argv: &argv,
            netns: if t.local { None } else { net.ns_a.as_deref() },
            env: &env,
            timeout: j.timeout,
            stop: self.s.stop,
            logdir: &self.logs,
            tag: &j.tag,
            cgroup: client.as_ref(),
        });
        let cpu1 = servers.cpu(t);
        drop(client);
        let mut res = RunResult {
            seconds: ran.seconds,
            cpu_client_seconds: ran.cpu,
            cpu_server_seconds: cpu0.zip(cpu1).map(|(a, b)| (b - a).max(0.0)),
            loadavg_1m: load,
            error: ran.error,
            ..RunResult::default()
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
                res.reported_bytes_per_second = t.report.and_then(|r| {
                    peers::read_report(r, &format!("{}\n{}", ran.stdout, ran.stderr)).ok()
                });
                let v = self.check_copy(w, &j.tag, far_dst, &dst, t)?;
                res.verified = Some(v.wrong.is_none());
                res.not_kept = v.not_kept.iter().map(|s| s.to_string()).collect();
                note = v.wrong.map(|b| format!("not verified: {b}"));
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
        Ok((res, filled, note))
    }

    /// What a run needs before its clock starts: a sync's first copy (the
    /// tool's own put, at the same settings) and for `W+changed` 1% of that
    /// copy's files made to differ; with `--cold`, the page cache dropped.
    /// Some(why) when the run cannot go on.
    fn before_clock(
        &self,
        net: &PathNet,
        j: &Job,
        vars: &BTreeMap<&'static str, String>,
        env: &BTreeMap<String, String>,
        far: bool,
        dst: &Path,
    ) -> Result<Option<String>, String> {
        let (w, step) = super::split_workload(j.workload);
        if let Some(step) = step {
            if far {
                return Ok(Some(
                    "a sync runs on loopback and emulated paths, not on --far".into(),
                ));
            }
            let first = run::run_client(&run::Client {
                argv: &peers::argv(&j.tool.put, j.args, vars),
                netns: if j.tool.local {
                    None
                } else {
                    net.ns_a.as_deref()
                },
                env,
                // Untimed, so not a sweep candidate's cut (3x its fastest
                // sync): a first copy of a big tree takes far longer.
                timeout: self.s.a.run_timeout,
                stop: self.s.stop,
                logdir: &self.logs,
                tag: &format!("{}-first", j.tag),
                cgroup: None,
            });
            if let Some(e) = first.error {
                return Ok(Some(format!("its first copy, before the sync: {e}")));
            }
            let changed = match self.manifests.get(w).filter(|_| step == "changed") {
                Some(m) => run::change_files(dst, m, self.step as u64).err(),
                None => None,
            };
            if let Some(e) = changed {
                return Ok(Some(format!(
                    "cannot change 1% of the first copy's files in {}: {e}",
                    dst.display()
                )));
            }
        }
        if self.s.params.cold {
            run::drop_caches()?;
        }
        Ok(None)
    }

    /// How a copy compares with its workload's manifest. A far copy comes
    /// back (the far longhaul reads it, with its modes and links) to be
    /// compared here.
    fn check_copy(
        &self,
        w: &str,
        tag: &str,
        far_dst: Option<&far::Far>,
        dst: &Path,
        t: &Tool,
    ) -> Result<verify::Verdict, String> {
        let check = self.s.work.join("check").join(tag);
        let got = match far_dst {
            Some(f) => {
                let _ = std::fs::remove_dir_all(&check);
                mk(&check)?;
                f.pull(
                    self.s.bin,
                    self.remote_path(),
                    &dst.display().to_string(),
                    &check,
                )
                .map(|()| check.join(w))
            }
            None => Ok(dst.to_path_buf()),
        };
        let verdict = match got.and_then(|d| {
            verify::manifest(&d)
                .map_err(|e| format!("cannot read the destination {}: {e}", d.display()))
        }) {
            Ok(m) => match self.manifests.get(w) {
                Some(src) => verify::compare(src, &m, t.keeps),
                None => verify::Verdict::default(),
            },
            Err(e) => verify::Verdict {
                wrong: Some(e),
                ..verify::Verdict::default()
            },
        };
        let _ = std::fs::remove_dir_all(&check);
        Ok(verdict)
    }
}

/// A tool's grid for a workload of `bytes` (None: memory to memory, no
/// end) on a path: without its window axis when the whole workload fits
/// in one window, the path's bandwidth-delay product and the host's
/// socket buffer cap both. Such a copy ends inside TCP's slow start, each
/// stream bounded by its congestion window, never by a socket buffer; a
/// window set from the BDP changes nothing but the sweep's length (on the
/// satellite path, a round trip of 540 ms, it doubled it). Every tool's
/// grid alike; the stream counts and the tools' own options stay.
pub(super) fn fitted(s: &peers::Sweep, bytes: Option<u64>, facts: &PathFacts) -> peers::Sweep {
    let fits = bytes.is_some_and(|b| b <= facts.bdp().min(facts.socket_cap));
    let mut s = s.clone();
    if fits {
        s.window.clear();
    }
    s
}

/// A cell's settings' arguments: a fixed settings', or `best`'s: its
/// tool's sweep winner on this path and workload.
fn settings_args(t: &Tool, c: &Cell, doc: &Doc) -> Result<Vec<String>, String> {
    if let Some(s) = t.fixed(&c.settings) {
        return Ok(s.args.clone());
    }
    doc.sweeps
        .iter()
        .find(|s| s.tool == c.tool && s.path == c.path && s.workload == c.workload)
        .and_then(|s| s.winner.clone())
        .ok_or_else(|| "no candidate of its sweep ran (see the sweep's lines)".to_string())
}

fn failed_run(e: String) -> RunResult {
    RunResult {
        error: Some(e),
        ..RunResult::default()
    }
}

/// The placeholders a run's arguments are shown (and kept in the
/// document) with: the path's facts and the tool's ports, not this host's
/// files (`{ssh}` stays `{ssh}`, not the work directory's script).
pub(super) fn shown_vars(vars: &BTreeMap<&'static str, String>) -> BTreeMap<&'static str, String> {
    const HOST_FILES: [&str; 10] = [
        "bin",
        "root",
        "state",
        "ssh",
        "src",
        "dst",
        "dstdir",
        "src_rel",
        "dst_rel",
        "dstdir_rel",
    ];
    vars.iter()
        .filter(|(k, _)| !HOST_FILES.contains(k))
        .map(|(k, v)| (*k, v.clone()))
        .collect()
}

/// The data the workloads read, each once: a sync's is its file workload's.
fn data_names(workloads: &[String]) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for w in workloads {
        let data = super::split_workload(w).0;
        if data != "mem" && !names.contains(&data) {
            names.push(data);
        }
    }
    names
}

/// A run's name in the logs (and its directories' names).
fn tag(p: &PathSpec, w: &str, t: &Tool, settings: &str, dir: &str, run: &str) -> String {
    file_name(&format!("{}-{w}-{}-{settings}-{dir}-{run}", p.name, t.name))
}

/// A name (a tool's, from a tools file) as one file name: no `/`, not `..`.
fn file_name(name: &str) -> String {
    match name.replace('/', "_") {
        n if n == "." || n == ".." || n.is_empty() => "_".into(),
        n => n,
    }
}

/// A run's outcome in the progress line.
fn said(res: &RunResult) -> String {
    let cpu = |c: Option<f64>| c.map_or("?".into(), |c| format!("{c:.2}"));
    match (&res.error, res.bytes_per_second) {
        (Some(e), _) => format!("failed: {e}"),
        (None, Some(b)) => format!(
            "{:.1} MB/s, CPU {} + {} s{}{}",
            b / 1e6,
            cpu(res.cpu_client_seconds),
            cpu(res.cpu_server_seconds),
            match res.verified {
                Some(true) => ", verified",
                Some(false) => ", NOT VERIFIED",
                None => "",
            },
            if res.not_kept.is_empty() {
                String::new()
            } else {
                format!(" (not kept: {})", res.not_kept.join(", "))
            }
        ),
        (None, None) => "no figure".into(),
    }
}

/// The output of a tool's `env` command (a token, a fingerprint), here or
/// on the far host (in its state directory `state` there), within `limit`.
fn env_output(
    argv: &[String],
    state: &str,
    far: Option<&far::Far>,
    limit: Duration,
) -> Result<String, String> {
    if argv.first().is_none_or(String::is_empty) {
        return Err(
            "an empty command (its template's `argv` names no program): give it one in the tools \
             file"
                .into(),
        );
    }
    let words: Vec<&str> = argv.iter().map(String::as_str).collect();
    if let Some(f) = far {
        let st = far::join(&[state])?;
        return f.run(
            &format!("mkdir -p {st} && {}", far::join(&words)?),
            None,
            "its client's variable",
        );
    }
    let mut c = std::process::Command::new(&argv[0]);
    c.args(&argv[1..]);
    let ran = longhaul_engine::process::output_within(
        longhaul_engine::process::own(&mut c),
        None,
        Some(limit),
    )
    .map_err(|e| e.to_string())?;
    match ran {
        longhaul_engine::process::Within::Ended { output, .. } if output.status.success() => {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
        }
        longhaul_engine::process::Within::Ended { output, .. } => Err(output.status.to_string()),
        longhaul_engine::process::Within::TimedOut { .. } => Err(format!(
            "did not end within {:.0} s (--run-timeout)",
            limit.as_secs_f64()
        )),
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
        ("state", format!("{}/state/{}", f.root, file_name(&t.name))),
        ("seconds", format!("{}", params.mem_seconds.ceil() as u64)),
    ])
}

/// Two ports for a far server: random, high, outside Linux's ephemeral
/// range (32768-60999), so a far client's socket is unlikely to hold one;
/// one in use is seen before the start (it already accepts) or by the
/// server's failure to bind.
fn far_ports() -> (u16, u16) {
    let a = fastrand::u16(20000..32000);
    (a, a + 1 + fastrand::u16(..100))
}

/// The client's side of a private sshd the over-ssh tools' template
/// started on the far host (as it starts one here): its throwaway client
/// key and host key come back over the matrix's ssh into `here` (the
/// tool's state directory, owner only), with an ssh config that reaches
/// that sshd alone, as the far user, and `here/ssh`, the script `{ssh}` names.
fn far_ssh_client(f: &far::Far, far_state: &str, here: &Path, port: u16) -> Result<(), String> {
    let st = far::join(&[far_state])?;
    let out = f.run(
        &format!(
            "cd {st} && cat client_key && echo LH-CUT && cut -d' ' -f1,2 host_key.pub && id -un"
        ),
        None,
        "the keys of its private sshd",
    )?;
    let (key, rest) = out
        .split_once("LH-CUT\n")
        .ok_or("the far sshd's keys could not be read")?;
    let mut rest = rest.lines();
    let (Some(host_key), Some(user)) = (rest.next(), rest.next()) else {
        return Err("the far sshd's keys could not be read".into());
    };
    let write = |name: &str, text: String, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        let p = here.join(name);
        std::fs::write(&p, text)
            .and_then(|()| std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)))
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    write("client_key", format!("{}\n", key.trim_end()), 0o600)?;
    write("known_hosts", format!("* {host_key}\n"), 0o600)?;
    let h = here.display();
    write(
        "ssh_config",
        format!(
            "Host *\n  Port {port}\n  User {user}\n  IdentityFile {h}/client_key\n  IdentitiesOnly yes\n  \
             UserKnownHostsFile {h}/known_hosts\n  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n"
        ),
        0o600,
    )?;
    write_script(
        &here.join("ssh"),
        &format!("#!/bin/sh\nexec ssh -F \"{h}/ssh_config\" \"$@\"\n"),
    )
}

/// A small executable script (owner only).
fn write_script(p: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(p, text)
        .and_then(|()| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// Opens the far host's work directory and copies the file workloads' data there.
fn open_far(s: &Setup, ssh: &far::Ssh, remote_path: &str, data: &Path) -> Result<far::Far, String> {
    let (bin, params) = (s.bin, s.params);
    let f = far::Far::open(ssh, &data.with_file_name("far-ssh.sock"), s.a.run_timeout)?;
    eprintln!(
        "longhaul matrix: work directory on {}: {} (its servers on {})",
        ssh.dest, f.root, f.addr
    );
    let fdata = format!("{}/data", f.root);
    f.mkdir(&fdata)?;
    for w in data_names(&params.workloads) {
        eprintln!("longhaul matrix: copying the {w} data to {}", ssh.dest);
        f.push(bin, remote_path, &data.join(w), &fdata)?;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `env` command with no program (a template or a tools file that
    /// left it empty) is an error that says so, not a panic.
    #[test]
    fn an_empty_env_command_is_an_error_not_a_panic() {
        let limit = Duration::from_secs(5);
        for argv in [vec![], vec![String::new(), "x".into()]] {
            let e = env_output(&argv, "/nonexistent", None, limit).expect_err("an error");
            assert!(e.contains("an empty command"), "{e}");
        }
        let out = env_output(
            &["echo".into(), " tok ".into()],
            "/nonexistent",
            None,
            limit,
        );
        assert_eq!(out.as_deref(), Ok("tok"));
        let e = env_output(
            &["sleep".into(), "60".into()],
            "/x",
            None,
            Duration::from_millis(300),
        )
        .expect_err("past its limit");
        assert!(e.contains("did not end within"), "{e}");
    }
}
