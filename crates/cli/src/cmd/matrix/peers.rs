//! The tools as templates: their shape ([`Tool`]), the built-in ones read
//! from `tools.toml` (data, beside this file) by the same code that reads
//! `--tools-file` ([`parse_tools`]), the placeholders they are filled with,
//! and the parsers of the tools' own figures and reports, each tested on
//! outputs recorded from the real tools (`testdata/`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The built-in tools, as data.
const BUILTIN: &str = include_str!("tools.toml");

/// What a tool moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Memory to memory: the `mem` workload only.
    Mem,
    /// Files: the `elephant`, `smallfiles` and `tree` workloads.
    Files,
}

/// How a run's rate is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Figure {
    /// Bytes of the workload over the client's wall time (every file tool,
    /// so that all are timed alike).
    #[default]
    Wall,
    /// iperf3 -J: `end.sum_received.bits_per_second`.
    Iperf3,
    /// iperf2 -y C: the SUM line's bits per second, else the streams' added.
    Iperf2,
    /// nuttcp -fparse: `rate_Mbps=`.
    Nuttcp,
    /// longhaul perf --json: `summary.bits_per_second`.
    Longhaul,
}

/// A file tool's own report of its rate, kept beside the wall-clock one
/// for reference (it leaves out the tool's start, its listing, its end).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Report {
    /// rsync --stats: `sent N bytes  received M bytes  R bytes/sec`.
    RsyncStats,
    /// globus-url-copy -vb: the last performance marker's `R MB/sec avg`
    /// (MB of 2^20 bytes): the elephant's rate; a tree's last marked file's.
    GlobusUrlCopy,
}

/// One way of running a tool.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Settings {
    pub name: String,
    /// Why these values.
    #[serde(default)]
    pub why: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Run only when `--tools NAME:SETTINGS` names it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_request: bool,
}

/// The grid `best` is swept from (section 16 of docs/ARCHITECTURE.md):
/// every combination of a stream count (with `per_stream`), a window or
/// none (with `window`), and one alternative of each axis, after `base`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Sweep {
    pub why: String,
    /// Arguments of every candidate.
    pub base: Vec<String>,
    /// Stream counts tried (`{bdp_streams}` allowed); none: no stream axis.
    pub streams: Vec<String>,
    /// The most streams the tool takes.
    pub max_streams: Option<u32>,
    /// Arguments that set `{streams}`.
    pub per_stream: Vec<String>,
    /// Arguments that set the window (`{window}`, `{window_kib}`): each
    /// candidate is tried with them and without (the kernel's autotuning).
    pub window: Vec<String>,
    /// More axes, each a list of alternatives (argument lists).
    pub axes: Vec<Vec<Vec<String>>>,
}

/// What a tool claims to keep of a tree: where it claims to and does not,
/// the copy did not verify; where it does not claim to, the cell is marked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Keeps {
    pub empty_dirs: bool,
    pub symlinks: bool,
    pub modes: bool,
}

/// A tool's server, started once per path and ended by its process id.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Server {
    pub argv: Vec<String>,
    /// Files written into `{state}` before the start: name -> contents.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// It must resolve its own address: inside an emulated path it runs in
    /// a mount namespace of its own with an /etc/hosts that names both hosts.
    #[serde(default)]
    pub hosts_file: bool,
}

/// A client's environment variable, set from a command's output (run once
/// per matrix, before the server starts).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EnvFrom {
    pub var: String,
    pub argv: Vec<String>,
}

/// How a tool's version is asked: one command, or one per program of a
/// tool of several (tar and socat), each an argv (`{bin}` filled in).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Version {
    One(Vec<String>),
    Many(Vec<Vec<String>>),
}

impl Version {
    pub fn commands(&self) -> Vec<&[String]> {
        match self {
            Version::One(a) => vec![a.as_slice()],
            Version::Many(v) => v.iter().map(Vec::as_slice).collect(),
        }
    }
}

/// One tool.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    #[serde(default)]
    pub about: String,
    /// Programs it needs on PATH (`{bin}` is always there).
    #[serde(default)]
    pub needs: Vec<String>,
    /// The Debian package(s) that bring them.
    #[serde(default)]
    pub package: String,
    pub kind: Kind,
    #[serde(default)]
    pub server: Option<Server>,
    #[serde(default)]
    pub env: Vec<EnvFrom>,
    pub put: Vec<String>,
    /// Empty: the tool has no get.
    #[serde(default)]
    pub get: Vec<String>,
    /// A sync into a destination that already holds a copy (the
    /// `W+same` and `W+changed` workloads); empty: the tool has no sync.
    #[serde(default)]
    pub sync: Vec<String>,
    /// The longhaul program `{bin}` names for this tool (another build, for
    /// an A/B of two builds in one run); default: the one running the matrix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bin: Option<String>,
    #[serde(default)]
    pub figure: Figure,
    #[serde(default)]
    pub report: Option<Report>,
    /// Fixed settings; `best` comes from `sweep` when there is one.
    pub settings: Vec<Settings>,
    #[serde(default)]
    pub sweep: Option<Sweep>,
    #[serde(default)]
    pub keeps: Keeps,
    /// Runs on this host only, whatever the path (a local copy).
    #[serde(default)]
    pub local: bool,
    /// Its server is a private sshd its `server` starts (here, in the
    /// emulator's namespace or on the far host), reached by `{ssh}` at
    /// `{sshhost}`; on the far host its keys come back here to reach it.
    #[serde(default)]
    pub over_ssh: bool,
    /// May run on `--far`: its server is safe on a host of a real network
    /// (authenticated, or memory to memory), or it needs none there.
    /// Anonymous writable servers (GridFTP, the rsync daemon, XRootD, tar
    /// through a socket) are kept to loopback and the emulator's namespaces.
    #[serde(default)]
    pub far: bool,
    /// The command(s) that print its version, run once per matrix outside
    /// any clock; the document's tool row keeps what they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<Version>,
}

/// The settings `best`: the sweep's winner on each path and workload.
pub const BEST: &str = "best";

impl Tool {
    /// Every settings name: the fixed ones, and `best` with a sweep.
    pub fn setting_names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.settings.iter().map(|s| s.name.clone()).collect();
        if self.sweep.is_some() {
            n.push(BEST.into());
        }
        n
    }

    /// The settings run when none is named: all but those run on request.
    pub fn default_settings(&self) -> Vec<String> {
        let mut n: Vec<String> = self
            .settings
            .iter()
            .filter(|s| !s.on_request)
            .map(|s| s.name.clone())
            .collect();
        if self.sweep.is_some() {
            n.push(BEST.into());
        }
        n
    }

    /// A fixed settings by name.
    pub fn fixed(&self, name: &str) -> Option<&Settings> {
        self.settings.iter().find(|s| s.name == name)
    }
}

/// A file of templates as written: TOML (`[[tool]]` tables, and
/// `[scripts]`: texts a server file names as `{NAME}`), or JSON (the same
/// as an object, or just the list of tools).
#[derive(Deserialize)]
#[serde(untagged)]
enum ToolsFile {
    List(Vec<Tool>),
    Doc {
        tool: Vec<Tool>,
        #[serde(default)]
        scripts: BTreeMap<String, String>,
    },
}

/// Parses a tools file (the built-in one and `--tools-file` alike): TOML
/// when `toml`, else JSON. Checks what serde cannot.
pub fn parse_tools(text: &str, toml: bool) -> Result<Vec<Tool>, String> {
    let file: ToolsFile = if toml {
        ::toml::from_str(text).map_err(|e| e.to_string())?
    } else {
        serde_json::from_str(text).map_err(|e| e.to_string())?
    };
    let (mut tools, scripts) = match file {
        ToolsFile::List(t) => (t, BTreeMap::new()),
        ToolsFile::Doc { tool, scripts } => (tool, scripts),
    };
    for t in &mut tools {
        check(t)?;
        if let Some(s) = &mut t.server {
            for text in s.files.values_mut() {
                if let Some(script) = text
                    .strip_prefix('{')
                    .and_then(|n| n.strip_suffix('}'))
                    .and_then(|n| scripts.get(n))
                {
                    *text = script.clone();
                }
            }
        }
    }
    Ok(tools)
}

fn check(t: &Tool) -> Result<(), String> {
    let bad = |why: &str| Err(format!("tool '{}': {why}", t.name));
    // `--tools NAME:SETTINGS,...` must be able to name it.
    if t.name.is_empty() || t.name.contains([':', ',']) || t.name.trim() != t.name {
        return bad("a name must be non-empty, without ':', ',' or edge spaces");
    }
    if t.put.is_empty() {
        return bad("'put' is empty");
    }
    if t.server.as_ref().is_some_and(|s| s.argv.is_empty()) {
        return bad("its server's 'argv' is empty (it names no program)");
    }
    if let Some(e) = t
        .env
        .iter()
        .find(|e| e.argv.first().is_none_or(String::is_empty))
    {
        return bad(&format!(
            "the 'argv' of its client variable {} names no program",
            e.var
        ));
    }
    if t.version.as_ref().is_some_and(|v| {
        v.commands()
            .iter()
            .any(|a| a.first().is_none_or(|p| p.is_empty()))
    }) {
        return bad("a 'version' command names no program");
    }
    if t.sweep.is_some() && t.fixed(BEST).is_some() {
        return bad("both a sweep and a fixed 'best': 'best' is the sweep's winner");
    }
    if t.setting_names().is_empty() {
        return bad("no settings");
    }
    if let Some(s) = &t.sweep {
        if !s.streams.is_empty() && s.per_stream.is_empty() {
            return bad("a sweep with 'streams' needs 'per_stream' (the arguments that set them)");
        }
    }
    let sweep = t.sweep.iter().flat_map(|s| {
        let axes = s.axes.iter().flatten().flatten();
        s.base
            .iter()
            .chain(&s.per_stream)
            .chain(&s.window)
            .chain(axes)
    });
    let items = t.settings.iter().flat_map(|s| &s.args).chain(sweep);
    if let Some(a) = items
        .filter(|a| a.starts_with(ENV_ITEM))
        .find(|a| env_item(a).is_none_or(|(k, _)| !env_name_ok(k)))
    {
        return bad(&format!(
            "'{a}': an item that sets a variable is {ENV_ITEM}NAME=VALUE, NAME of letters, digits \
             and '_' (not first a digit)"
        ));
    }
    Ok(())
}

/// The built-in tools, in the order of the table.
pub fn builtin() -> Vec<Tool> {
    parse_tools(BUILTIN, true).expect("tools.toml parses (tested)")
}

/// Reads `--tools-file`: TOML when its name ends in `.toml`, else JSON.
pub fn read_tools_file(path: &std::path::Path) -> Result<Vec<Tool>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --tools-file {}: {e}", path.display()))?;
    let toml = path.extension().is_some_and(|e| e == "toml");
    parse_tools(&text, toml).map_err(|e| {
        format!(
            "--tools-file {}: not a list of tool templates (docs/JSON.md, \"matrix tools\"): {e}",
            path.display()
        )
    })
}

/// `--build NAME=PATH`: each tool whose templates name `{bin}` (longhaul's
/// own) again as `TOOL@NAME`, with the program at PATH as its client and
/// server: two builds compared in one run. Not run on --far (PATH is a file
/// here).
pub fn builds(tools: &[Tool], specs: &[String]) -> Result<Vec<Tool>, String> {
    let mut out: Vec<Tool> = Vec::new();
    for spec in specs {
        let (name, path) = spec
            .split_once('=')
            .filter(|(n, p)| !n.is_empty() && !p.is_empty())
            .ok_or_else(|| {
                format!("--build {spec}: NAME=PATH, e.g. old=/opt/longhaul-old/bin/longhaul")
            })?;
        if name.contains([':', ',', '@', '/']) || name.trim() != name {
            return Err(format!(
                "--build {spec}: a name without ':', ',', '@', '/' or edge spaces"
            ));
        }
        let path = std::path::absolute(path).map_err(|e| format!("--build {spec}: {e}"))?;
        if !path.is_file() {
            return Err(format!(
                "--build {spec}: {} is not a file (the other build's longhaul program)",
                path.display()
            ));
        }
        for t in tools.iter().filter(|t| t.bin.is_none() && names_bin(t)) {
            let mut b = t.clone();
            b.name = format!("{}@{name}", t.name);
            if out.iter().any(|o| o.name == b.name) {
                return Err(format!("--build {spec}: the name {name} is given twice"));
            }
            b.about = format!("{}, the build {}", t.about, path.display());
            b.bin = Some(path.display().to_string());
            b.far = false;
            out.push(b);
        }
    }
    Ok(out)
}

/// Whether a tool runs this longhaul (`{bin}` in its client or server).
fn names_bin(t: &Tool) -> bool {
    let server = t.server.iter().flat_map(|s| s.argv.iter());
    t.put.iter().chain(server).any(|a| a.contains("{bin}"))
}

/// Whether every program `t` needs is on PATH; else the install line.
pub fn missing(t: &Tool) -> Option<String> {
    // sshd lives in /usr/sbin, off a user's PATH: the lookup looks there too.
    let absent: Vec<&str> = t
        .needs
        .iter()
        .filter(|p| longhaul_engine::process::find_program(p).is_none())
        .map(String::as_str)
        .collect();
    if absent.is_empty() {
        return None;
    }
    Some(if t.package.is_empty() {
        format!("not installed ({} not on PATH)", absent.join(", "))
    } else {
        format!(
            "not installed ({} not on PATH): apt-get install {}",
            absent.join(", "),
            t.package
        )
    })
}

/// The most of a version's words the document keeps.
const VERSION_CHARS: usize = 200;

/// What a version command said that names the version: its first line
/// holding a digit (socat's first names its authors), with a `commit:`
/// line (longhaul's) after it; standard output first, else standard error
/// (ssh -V, iperf -v and xrdcp --version write there).
pub fn version_line(stdout: &str, stderr: &str) -> Option<String> {
    let pick = |text: &str| {
        let mut lines = text.lines().map(str::trim);
        let first = lines.find(|l| l.contains(|c: char| c.is_ascii_digit()))?;
        Some(match lines.find(|l| l.starts_with("commit:")) {
            Some(commit) => format!("{first}, {commit}"),
            None => first.to_string(),
        })
    };
    pick(stdout).or_else(|| pick(stderr))
}

/// A tool's version as its commands say it (`{bin}` is `bin`), within 10 s
/// each, whatever their exit status (globus-url-copy -version exits 1);
/// escaped (a program's words, shown on a terminal and in Markdown) and at
/// most [`VERSION_CHARS`] characters. None: no `version`, or none answered.
pub fn tool_version(t: &Tool, bin: &str) -> Option<String> {
    let vars = BTreeMap::from([("bin", bin.to_string())]);
    let said: Vec<String> = t
        .version
        .as_ref()?
        .commands()
        .into_iter()
        .filter_map(|argv| {
            let argv = fill_all(argv, &vars);
            let mut c = std::process::Command::new(argv.first()?);
            c.args(&argv[1..]);
            let ran = longhaul_engine::process::output_within(
                longhaul_engine::process::own(&mut c),
                None,
                Some(std::time::Duration::from_secs(10)),
            )
            .ok()?;
            let longhaul_engine::process::Within::Ended { output, .. } = ran else {
                return None;
            };
            version_line(
                &String::from_utf8_lossy(&output.stdout),
                &String::from_utf8_lossy(&output.stderr),
            )
        })
        .collect();
    let text = longhaul_proto::units::escaped(&said.join("; ")).to_string();
    (!text.is_empty()).then(|| text.chars().take(VERSION_CHARS).collect())
}

/// `s` with every known `{key}` replaced.
pub fn fill(s: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut out = s.to_string();
    for (k, val) in vars {
        out = out.replace(&format!("{{{k}}}"), val);
    }
    out
}

/// Arguments with every known `{key}` replaced.
pub fn fill_all(args: &[String], vars: &BTreeMap<&str, String>) -> Vec<String> {
    args.iter().map(|a| fill(a, vars)).collect()
}

/// The start of a settings' or a sweep's item that sets a variable of the
/// client's environment instead of giving it an argument: `env:NAME=VALUE`
/// (a tool whose lever is a variable, as xrdcp's `XRD_CPCHUNKSIZE`).
pub const ENV_ITEM: &str = "env:";

/// An `env:NAME=VALUE` item's name and value; None for an argument.
fn env_item(a: &str) -> Option<(&str, &str)> {
    a.strip_prefix(ENV_ITEM)?.split_once('=')
}

/// Whether `name` may name a variable: letters, digits and `_`, not
/// starting with a digit (what a shell's `NAME=VALUE` takes).
fn env_name_ok(name: &str) -> bool {
    !name.starts_with(|c: char| c.is_ascii_digit())
        && !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A template's argv filled in, `{args}` expanded to `args` but for their
/// `env:` items (the variables [`env_of`] gives).
pub fn argv(template: &[String], args: &[String], vars: &BTreeMap<&str, String>) -> Vec<String> {
    let mut out = Vec::new();
    for a in template {
        if a == "{args}" {
            out.extend(
                args.iter()
                    .filter(|x| env_item(x).is_none())
                    .map(|x| fill(x, vars)),
            );
        } else {
            out.push(fill(a, vars));
        }
    }
    out
}

/// The client's variables that `args`' `env:NAME=VALUE` items set, their
/// values filled in; a later item of a name wins.
pub fn env_of(args: &[String], vars: &BTreeMap<&str, String>) -> BTreeMap<String, String> {
    args.iter()
        .filter_map(|a| env_item(a))
        .map(|(k, v)| (k.to_string(), fill(v, vars)))
        .collect()
}

/// Reads a tool's own figure (bytes per second) from its standard output.
pub fn read_figure(f: Figure, out: &str) -> Result<f64, String> {
    positive(figure(f, out)?)
}

/// Reads a file tool's own report of its rate (bytes per second).
pub fn read_report(r: Report, out: &str) -> Result<f64, String> {
    positive(match r {
        Report::RsyncStats => out
            .lines()
            .rev()
            .find(|l| l.starts_with("sent ") && l.ends_with("bytes/sec"))
            .and_then(|l| l.split_whitespace().rev().nth(1))
            .and_then(|n| n.replace(',', "").parse::<f64>().ok())
            .ok_or("no 'sent ... bytes/sec' line (rsync --stats)")?,
        Report::GlobusUrlCopy => {
            out.split(['\r', '\n'])
                .rev()
                .find_map(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    let at = w.windows(2).position(|p| p == ["MB/sec", "avg"])?;
                    w.get(at.checked_sub(1)?)?.parse::<f64>().ok()
                })
                .ok_or("no performance marker ('MB/sec avg'; globus-url-copy -vb)")?
                * 1048576.0
        }
    })
}

fn positive(rate: f64) -> Result<f64, String> {
    if rate > 0.0 && rate.is_finite() {
        Ok(rate)
    } else {
        Err(format!("it reported {rate} bytes/s: no measurement"))
    }
}

fn figure(f: Figure, out: &str) -> Result<f64, String> {
    let num = |v: Option<f64>, what: &str| v.ok_or_else(|| format!("no {what} in its output"));
    match f {
        Figure::Wall => Err("wall-clock tools have no figure".into()),
        // Both print one JSON document; the rate is bits/s at a known place.
        Figure::Iperf3 | Figure::Longhaul => {
            let (pointer, name) = if matches!(f, Figure::Iperf3) {
                (
                    "/end/sum_received/bits_per_second",
                    "end.sum_received.bits_per_second",
                )
            } else {
                ("/summary/bits_per_second", "summary.bits_per_second")
            };
            let j: serde_json::Value =
                serde_json::from_str(out).map_err(|e| format!("its JSON did not parse: {e}"))?;
            if let Some(e) = j.get("error").and_then(|e| e.as_str()) {
                return Err(format!("it said: {e}"));
            }
            num(j.pointer(pointer).and_then(|v| v.as_f64()), name).map(|b| b / 8.0)
        }
        Figure::Iperf2 => {
            // One line per stream, and with several a SUM line (id -1) in
            // some versions: the SUM if there is one, else the streams added.
            let rows: Vec<(String, f64)> = out
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(',').collect();
                    Some((f.get(5)?.to_string(), f.get(8)?.trim().parse().ok()?))
                })
                .collect();
            let sum = rows.iter().rev().find(|(id, _)| id == "-1").map(|r| r.1);
            num(
                sum.or_else(|| (!rows.is_empty()).then(|| rows.iter().map(|r| r.1).sum())),
                "bits per second (CSV field 9)",
            )
            .map(|b: f64| b / 8.0)
        }
        Figure::Nuttcp => num(
            out.split_whitespace()
                .rev()
                .find_map(|w| w.strip_prefix("rate_Mbps="))
                .and_then(|r| r.parse().ok()),
            "rate_Mbps=",
        )
        .map(|m: f64| m * 1e6 / 8.0),
    }
}

/// What a failed run said, for the document: its lines that name an error
/// (the first and the last of them), else its last two lines; escaped, at
/// most 300 characters. Protocol chatter around the cause (GridFTP's
/// `500 End.`) is left out.
pub fn error_text(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "500 End.")
        .collect();
    let says = |l: &&str| {
        let l = l.to_ascii_lowercase();
        [
            "error", "failed", "denied", "refused", "no such", "cannot", "unable",
        ]
        .iter()
        .any(|w| l.contains(w))
    };
    let named: Vec<&str> = lines.iter().copied().filter(says).collect();
    let mut picked: Vec<&str> = match (named.first(), named.last()) {
        (Some(a), Some(b)) if a != b => vec![a, b],
        (Some(a), _) => vec![a],
        _ => lines.iter().rev().take(2).rev().copied().collect(),
    };
    picked.dedup();
    longhaul_proto::units::escaped(&picked.join(" | "))
        .to_string()
        .chars()
        .take(300)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    fn rec(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/cmd/matrix/testdata")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() <= b.abs() * 1e-9
    }

    #[test]
    fn the_builtin_tools_parse_with_their_scripts_and_sweeps() {
        let tools = builtin();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "longhaul",
                "longhaul-ssh",
                "longhaul-perf",
                "iperf3",
                "iperf2",
                "nuttcp",
                "gridftp",
                "xrootd",
                "rsyncd",
                "rsync-ssh",
                "scp",
                "tar-socket",
                "cp"
            ]
        );
        for t in &tools {
            assert!(t.fixed("defaults").is_some(), "{}", t.name);
            if t.name != "cp" {
                assert!(t.sweep.is_some(), "{}: no sweep", t.name);
                assert_eq!(t.default_settings(), ["defaults", "best"], "{}", t.name);
            }
        }
        let scp = tools.iter().find(|t| t.name == "scp").unwrap();
        let sshd = &scp.server.as_ref().unwrap().files["sshd.sh"];
        assert!(sshd.starts_with("set -e\n") && sshd.contains("exec \"$sshd\" -D"));
        let tar = tools.iter().find(|t| t.name == "tar-socket").unwrap();
        assert!(tar.server.as_ref().unwrap().files["tar-serve.sh"].contains("refused path"));
    }

    #[test]
    fn a_tools_file_is_read_as_json_or_toml_by_the_same_checks() {
        let json = r#"[{"name": "t", "kind": "files", "put": ["true"], "settings": [{"name": "defaults"}]}]"#;
        assert_eq!(parse_tools(json, false).unwrap()[0].name, "t");
        let toml = "[[tool]]\nname = \"t\"\nkind = \"mem\"\nput = [\"true\"]\nsettings = [{name = \"defaults\"}]\n";
        assert_eq!(parse_tools(toml, true).unwrap()[0].kind, Kind::Mem);
        for (bad, why) in [
            (
                r#"[{"name": "a:b", "kind": "files", "put": ["x"], "settings": [{"name": "d"}]}]"#,
                "name",
            ),
            (
                r#"[{"name": "a", "kind": "files", "put": [], "settings": [{"name": "d"}]}]"#,
                "'put'",
            ),
            (
                r#"[{"name": "a", "kind": "files", "put": ["x"], "settings": [{"name": "best"}], "sweep": {}}]"#,
                "fixed 'best'",
            ),
            (
                r#"[{"name": "a", "kind": "files", "put": ["x"], "settings": [], "sweep": {"streams": ["1"]}}]"#,
                "per_stream",
            ),
            (
                r#"[{"name": "a", "kind": "files", "put": ["x"], "settings": [{"name": "d"}], "env": [{"var": "T", "argv": []}]}]"#,
                "client variable T names no program",
            ),
            (
                r#"[{"name": "a", "kind": "files", "put": ["x"], "settings": [{"name": "d"}], "server": {"argv": []}}]"#,
                "server's 'argv' is empty",
            ),
            (r#"{"tool": 3}"#, ""),
        ] {
            let e = parse_tools(bad, false).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn iperf3_figures_from_its_recorded_json() {
        for (file, want) in [
            ("iperf3-put-P1.json", 10685225221.156258),
            ("iperf3-put-P4.json", 7184464534.158392),
            ("iperf3-get-P2.json", 10946553272.676548),
        ] {
            let out = rec(file);
            let j: serde_json::Value = serde_json::from_str(&out).unwrap();
            let bits = j["end"]["sum_received"]["bits_per_second"]
                .as_f64()
                .unwrap();
            let got = read_figure(Figure::Iperf3, &out).unwrap();
            assert!(near(got, bits / 8.0), "{file}: {got}");
            assert!((bits - want).abs() < 1.0, "{file}: {bits}");
        }
        // -w above the host's cap: iperf3 says so in the document's "error".
        let e = read_figure(Figure::Iperf3, &rec("iperf3-w64M.json")).unwrap_err();
        assert!(e.contains("socket buffer size not set correctly"), "{e}");
    }

    #[test]
    fn iperf2_nuttcp_and_longhaul_figures_from_their_recorded_outputs() {
        let one = read_figure(Figure::Iperf2, &rec("iperf2-put-P1.csv")).unwrap();
        assert!(near(one, 22214889100.0 / 8.0), "{one}");
        // -P 4 without a SUM line (iperf 2.1.8): the four streams added.
        let four = read_figure(Figure::Iperf2, &rec("iperf2-put-P4.csv")).unwrap();
        let sum = 6567418834.0 + 5594681235.0 + 2255323471.0 + 1767584442.0;
        assert!(near(four, sum / 8.0), "{four}");
        let sum_line = "x,a,1,b,2,3,0.0-1.0,10,800\nx,a,1,b,2,4,0.0-1.0,10,800\nx,a,1,b,2,-1,0.0-1.0,20,1000\n";
        assert!(near(read_figure(Figure::Iperf2, sum_line).unwrap(), 125.0));
        let get = read_figure(Figure::Iperf2, &rec("iperf2-get-P1.csv")).unwrap();
        assert!(near(get, 28404706115.0 / 8.0), "{get}");
        let n = read_figure(Figure::Nuttcp, &rec("nuttcp-put.txt")).unwrap();
        assert!(near(n, 10991.2770e6 / 8.0), "{n}");
        let n4 = read_figure(Figure::Nuttcp, &rec("nuttcp-get-N4.txt")).unwrap();
        assert!(near(n4, 5424.7139e6 / 8.0), "{n4}");
        let lh = rec("longhaul-perf-P2.json");
        let j: serde_json::Value = serde_json::from_str(&lh).unwrap();
        let bits = j["summary"]["bits_per_second"].as_f64().unwrap();
        assert!(near(
            read_figure(Figure::Longhaul, &lh).unwrap(),
            bits / 8.0
        ));
        for f in [
            Figure::Iperf2,
            Figure::Nuttcp,
            Figure::Iperf3,
            Figure::Longhaul,
        ] {
            assert!(read_figure(f, "").is_err(), "{f:?} of nothing");
        }
        assert!(read_figure(Figure::Nuttcp, "rate_Mbps=0.0000").is_err());
    }

    #[test]
    fn rsync_and_gridftp_reports_from_their_recorded_outputs() {
        let r = read_report(Report::RsyncStats, &rec("rsync-put-elephant-stats.txt")).unwrap();
        assert!(near(r, 400_097_920.0), "{r}");
        let t = read_report(Report::RsyncStats, &rec("rsync-put-stats.txt")).unwrap();
        assert!(near(t, 613_302.0), "{t}");
        let g = read_report(
            Report::GlobusUrlCopy,
            &rec("globus-url-copy-elephant-vb.txt"),
        )
        .unwrap();
        assert!(near(g, 119.21 * 1048576.0), "{g}");
        let tree = read_report(Report::GlobusUrlCopy, &rec("globus-url-copy-tree-vb.txt")).unwrap();
        assert!(near(tree, 286.10 * 1048576.0), "{tree}");
        assert!(read_report(Report::RsyncStats, &rec("rsync-error.txt")).is_err());
        assert!(read_report(Report::GlobusUrlCopy, &rec("globus-url-copy-error.txt")).is_err());
    }

    #[test]
    fn a_failed_runs_error_names_the_cause_from_recorded_failures() {
        let g = error_text(&rec("globus-url-copy-error.txt"));
        assert!(g.starts_with("error: globus_ftp_client"), "{g}");
        assert!(
            g.contains("No such file or directory") && !g.contains("500 End."),
            "{g}"
        );
        let x = error_text(&rec("xrdcp-error.txt"));
        assert!(
            x.contains("[3010] Stating path '/nonexistent/dir/big.bin' is disallowed"),
            "{x}"
        );
        let r = error_text(&rec("rsync-error.txt"));
        assert!(
            r.contains("mkdir \"nonexistent/dir\" (in data) failed"),
            "{r}"
        );
        assert!(r.contains("rsync error: error in file IO (code 11)"), "{r}");
        assert_eq!(error_text("one\ntwo\nthree\n"), "two | three");
        assert!(error_text(&"error \u{1b}[2J".repeat(100)).len() <= 300);
        assert!(!error_text("error \u{1b}[2J").contains('\u{1b}'));
    }

    /// Each built-in tool says how its version is asked; the line kept is
    /// the one that names it, from outputs of the real tools.
    #[test]
    fn a_tools_version_is_the_line_that_names_it() {
        for t in builtin() {
            assert!(t.version.is_some(), "{}: no version command", t.name);
        }
        let socat = "socat by Gerhard Rieger and contributors - see www.dest-unreach.org\n\
                     socat version 1.7.4.4 on 06 Nov 2022 08:15:51\n   running on Linux 6.1\n";
        assert_eq!(
            version_line(socat, "").as_deref(),
            Some("socat version 1.7.4.4 on 06 Nov 2022 08:15:51")
        );
        let lh = "longhaul 0.1.0\ncommit: 5381ac1eeee0\nfeatures: dashboard\n";
        assert_eq!(
            version_line(lh, "").as_deref(),
            Some("longhaul 0.1.0, commit: 5381ac1eeee0")
        );
        let ssh = "OpenSSH_9.2p1 Debian-2+deb12u10, OpenSSL 3.0.19 27 Jan 2026\n";
        assert_eq!(version_line("", ssh).as_deref(), Some(ssh.trim()));
        assert_eq!(version_line("no digits here", "nor here"), None);
    }

    /// The attacker: a tool (a `--tools-file`'s, or a program planted on
    /// PATH) whose version command prints terminal controls. What the
    /// document keeps is escaped: no control character reaches a terminal
    /// or a Markdown page, and it is bounded.
    #[test]
    fn a_hostile_version_is_kept_escaped_and_bounded() {
        let json = r#"[{"name": "evil", "kind": "mem", "put": ["true"],
            "settings": [{"name": "d"}],
            "version": [["sh", "-c", "printf 'evil 1.0 \\033]0;pwned\\007\\033[2J\\r\\n' >&2"],
                        ["sh", "-c", "yes 'x 2' | tr -d '\\n' | head -c 100000; echo"],
                        ["/nonexistent/program", "-V"]]
        }]"#;
        let t = &parse_tools(json, false).unwrap()[0];
        let v = tool_version(t, "longhaul").expect("a version");
        assert!(v.starts_with("evil 1.0 "), "{v}");
        assert!(!v.chars().any(char::is_control), "{v:?}");
        assert!(v.contains("\\x1b") || v.contains("\\u{1b}"), "{v:?}");
        assert!(v.chars().count() <= VERSION_CHARS, "{}", v.len());
        let none = r#"[{"name": "n", "kind": "mem", "put": ["true"], "settings": [{"name": "d"}], "version": []}]"#;
        assert!(parse_tools(none, false)
            .unwrap_err()
            .contains("'version' command names no program"));
    }

    /// The tar-socket handler as a client on its socket would reach it.
    fn serve(root: &std::path::Path, request: &[u8]) -> std::process::Output {
        let vars = BTreeMap::from([("root", root.display().to_string())]);
        let tools = builtin();
        let tar = tools.iter().find(|t| t.name == "tar-socket").unwrap();
        let script = &tar.server.as_ref().unwrap().files["tar-serve.sh"];
        let mut c = Command::new("sh")
            .arg("-c")
            .arg(fill(script, &vars))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(request).unwrap();
        c.wait_with_output().unwrap()
    }

    /// The attacker: a stranger on the tar-socket port asks to unpack
    /// outside the work directory, or to read a file outside it.
    #[test]
    fn tar_serve_refuses_paths_outside_its_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(t.path().join("secret"), "s").unwrap();
        for req in [
            "put ../escaped\n",
            "put /tmp/escaped\n",
            "get ../secret\n",
            "get /etc/passwd\n",
            "get a/../../secret\n",
            "rm x\n",
        ] {
            let o = serve(&root, req.as_bytes());
            assert!(!o.status.success(), "{req}: {o:?}");
            assert!(o.stdout.is_empty(), "{req}: it answered {:?}", o.stdout);
        }
        assert!(!t.path().join("escaped").exists());
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        // And a fair request works: a get of a directory inside.
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), "data").unwrap();
        let o = serve(&root, b"get d\n");
        assert!(o.status.success(), "{o:?}");
        assert!(o.stdout.len() >= 512, "no tar stream");
    }
}
