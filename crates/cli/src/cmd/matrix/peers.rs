//! The peers as templates, written once: how each tool's server starts
//! (argv, ports, files it needs), how a put and a get run (argv), how its
//! own figure is read, and its settings (`defaults` and `best`, each with
//! why). The matrix drives only these; `--tools-file` adds more of the
//! same shape (docs/JSON.md, "matrix tools").
//!
//! Placeholders, replaced in every argv element and server file:
//! `{bin}` this longhaul binary; `{host}` the server's address; `{port}`,
//! `{port1}` its ports; `{root}` the directory the servers serve (the
//! matrix's work directory); `{state}` the tool's own scratch directory;
//! `{seconds}` a memory-to-memory run's length; `{rate}` the path's
//! bottleneck in bit/s (100 Gbit/s on loopback); `{src}` the source
//! directory (absolute), `{dst}` the directory that must end up equal to it
//! (absent before the run), `{dstdir}` its parent (present), `{name}` the
//! source's last component, and `{src_rel}`, `{dst_rel}`, `{dstdir_rel}`
//! the same relative to `{root}`. An element that is exactly `{args}`
//! becomes the settings' arguments. Other braces are left alone.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    /// iperf2 -y C: the last line's bits per second.
    Iperf2,
    /// nuttcp -fparse: `rate_Mbps=`.
    Nuttcp,
    /// longhaul perf --json: `summary.bits_per_second`.
    Longhaul,
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
    #[serde(default)]
    pub figure: Figure,
    pub settings: Vec<Settings>,
    /// Runs on this host only, whatever the path (a local copy).
    #[serde(default)]
    pub local: bool,
    /// Its server is an sshd: on loopback and emulated paths the private
    /// one its `server` starts; on `--far` the far host's own, reached with
    /// the user's ssh (`{ssh}` runs it, `{sshhost}` names the host), and no
    /// server is started.
    #[serde(default)]
    pub over_ssh: bool,
    /// May run on `--far`: its server is safe on a host of a real network
    /// (authenticated, or memory to memory), or it needs none there.
    /// Anonymous writable servers (GridFTP, the rsync daemon, XRootD, tar
    /// through a socket) are kept to loopback and the emulator's namespaces.
    #[serde(default)]
    pub far: bool,
}

fn v(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn set(name: &str, why: &str, args: &[&str]) -> Settings {
    Settings {
        name: name.into(),
        why: why.into(),
        args: v(args),
    }
}

fn defaults() -> Settings {
    set("defaults", "the tool as installed, no options", &[])
}

/// The built-in tools, in the order of the table.
pub fn builtin() -> Vec<Tool> {
    let serve = Server {
        argv: v(&[
            "{bin}",
            "--no-archive",
            "serve",
            "--listen",
            "{host}:{port}",
            "--state-dir",
            "{state}",
            "--export",
            "m={root}",
        ]),
        files: BTreeMap::new(),
        hosts_file: false,
    };
    let lh_env = vec![
        EnvFrom {
            var: "LONGHAUL_TRUST".into(),
            argv: v(&["{bin}", "id", "{state}"]),
        },
        EnvFrom {
            var: "LONGHAUL_TOKEN".into(),
            argv: v(&[
                "{bin}",
                "token",
                "create",
                "--state-dir",
                "{state}",
                "--export",
                "*:rw",
                "--note",
                "longhaul matrix",
            ]),
        },
    ];
    vec![
        Tool {
            name: "longhaul".into(),
            about: "longhaul cp against longhaul serve (TLS 1.3, every file verified)".into(),
            needs: vec![],
            package: String::new(),
            kind: Kind::Files,
            server: Some(serve.clone()),
            env: lh_env.clone(),
            put: v(&[
                "{bin}",
                "--no-archive",
                "cp",
                "-r",
                "--force",
                "{args}",
                "{src}",
                "longhaul://{host}:{port}/m/{dstdir_rel}/",
            ]),
            get: v(&[
                "{bin}",
                "--no-archive",
                "cp",
                "-r",
                "--force",
                "{args}",
                "longhaul://{host}:{port}/m/{src_rel}",
                "{dstdir}/",
            ]),
            figure: Figure::Wall,
            settings: vec![
                defaults(),
                // Told the path's rate, cp sizes its streams for it instead of
                // for 10 Gbit/s (bench/wan.sh's lh-cp-rate); no fdatasync per
                // file, as the peers do not sync either.
                set(
                    "best",
                    "streams sized for the path's rate; no fdatasync per file (no peer syncs)",
                    &["--rate", "{rate}", "--no-sync"],
                ),
            ],
            local: false,
            over_ssh: false,
            far: true,
        },
        Tool {
            name: "longhaul-perf".into(),
            about: "longhaul perf against longhaul serve, memory to memory".into(),
            needs: vec![],
            package: String::new(),
            kind: Kind::Mem,
            server: Some(serve),
            env: lh_env,
            put: v(&[
                "{bin}",
                "--no-archive",
                "perf",
                "{host}",
                "-p",
                "{port}",
                "-t",
                "{seconds}",
                "--json",
                "{args}",
            ]),
            get: v(&[
                "{bin}",
                "--no-archive",
                "perf",
                "{host}",
                "-p",
                "{port}",
                "-t",
                "{seconds}",
                "--json",
                "-R",
                "{args}",
            ]),
            figure: Figure::Longhaul,
            settings: vec![
                defaults(),
                set(
                    "best",
                    "stream count chosen for the path (-P auto), as bench/wan.sh runs it",
                    &["-P", "auto"],
                ),
            ],
            local: false,
            over_ssh: false,
            far: true,
        },
        Tool {
            name: "iperf3".into(),
            about: "iperf3, memory to memory".into(),
            needs: v(&["iperf3"]),
            package: "iperf3".into(),
            kind: Kind::Mem,
            server: Some(Server {
                argv: v(&["iperf3", "-s", "-B", "{host}", "-p", "{port}"]),
                files: BTreeMap::new(),
                hosts_file: false,
            }),
            env: vec![],
            put: v(&[
                "iperf3",
                "-c",
                "{host}",
                "-p",
                "{port}",
                "-t",
                "{seconds}",
                "-J",
                "{args}",
            ]),
            get: v(&[
                "iperf3",
                "-c",
                "{host}",
                "-p",
                "{port}",
                "-t",
                "{seconds}",
                "-J",
                "-R",
                "{args}",
            ]),
            figure: Figure::Iperf3,
            settings: vec![
                defaults(),
                // 4 streams fill a long path where one stream's window (capped by
                // tcp_wmem) cannot; 1 MiB writes cut the per-call cost.
                set(
                    "best",
                    "4 streams (one window is capped by tcp_wmem on long paths), 1 MiB writes",
                    &["-P", "4", "-l", "1M"],
                ),
            ],
            local: false,
            over_ssh: false,
            far: true,
        },
        Tool {
            name: "iperf2".into(),
            about: "iperf 2, memory to memory".into(),
            needs: v(&["iperf"]),
            package: "iperf".into(),
            kind: Kind::Mem,
            server: Some(Server {
                argv: v(&["iperf", "-s", "-B", "{host}", "-p", "{port}"]),
                files: BTreeMap::new(),
                hosts_file: false,
            }),
            env: vec![],
            put: v(&[
                "iperf",
                "-c",
                "{host}",
                "-p",
                "{port}",
                "-t",
                "{seconds}",
                "-y",
                "C",
                "{args}",
            ]),
            get: v(&[
                "iperf",
                "-c",
                "{host}",
                "-p",
                "{port}",
                "-t",
                "{seconds}",
                "-y",
                "C",
                "-R",
                "{args}",
            ]),
            figure: Figure::Iperf2,
            settings: vec![
                defaults(),
                // Not -l 1M: iperf 2.1.8's reverse test (-R) with it resets
                // every stream and reports 0.
                set(
                    "best",
                    "4 streams, as iperf3's best (without its 1 MiB writes: iperf 2.1.8's -R fails with them)",
                    &["-P", "4"],
                ),
            ],
            local: false,
            over_ssh: false,
            far: true,
        },
        Tool {
            name: "nuttcp".into(),
            about: "nuttcp, memory to memory".into(),
            needs: v(&["nuttcp"]),
            package: "nuttcp".into(),
            kind: Kind::Mem,
            server: Some(Server {
                argv: v(&["nuttcp", "-S", "--nofork", "-P", "{port}", "-p", "{port1}"]),
                files: BTreeMap::new(),
                hosts_file: false,
            }),
            env: vec![],
            put: v(&[
                "nuttcp",
                "-fparse",
                "-t",
                "-T",
                "{seconds}",
                "-P",
                "{port}",
                "-p",
                "{port1}",
                "{args}",
                "{host}",
            ]),
            get: v(&[
                "nuttcp",
                "-fparse",
                "-r",
                "-T",
                "{seconds}",
                "-P",
                "{port}",
                "-p",
                "{port1}",
                "{args}",
                "{host}",
            ]),
            figure: Figure::Nuttcp,
            settings: vec![
                defaults(),
                set(
                    "best",
                    "4 streams, 1 MiB buffers (nuttcp's own tuning advice for long paths)",
                    &["-N", "4", "-l", "1048576"],
                ),
            ],
            local: false,
            over_ssh: false,
            far: true,
        },
        Tool {
            name: "gridftp".into(),
            about: "globus-url-copy against a globus-gridftp-server the matrix starts".into(),
            needs: v(&["globus-url-copy", "globus-gridftp-server"]),
            package: "globus-gass-copy-progs globus-gridftp-server-progs".into(),
            kind: Kind::Files,
            server: Some(Server {
                argv: v(&[
                    "globus-gridftp-server",
                    "-aa",
                    "-anonymous-user",
                    "root",
                    "-allow-root",
                    "-p",
                    "{port}",
                    "-control-interface",
                    "{host}",
                    "-data-interface",
                    "{host}",
                    "-d",
                    "error,warn",
                ]),
                files: BTreeMap::new(),
                hosts_file: true,
            }),
            env: vec![],
            put: v(&[
                "globus-url-copy",
                "-r",
                "-cd",
                "{args}",
                "file://{src}/",
                "ftp://{host}:{port}{dst}/",
            ]),
            get: v(&[
                "globus-url-copy",
                "-r",
                "-cd",
                "{args}",
                "ftp://{host}:{port}{src}/",
                "file://{dst}/",
            ]),
            figure: Figure::Wall,
            settings: vec![
                defaults(),
                // ../shared/peers/servers.sh's client settings: 4 parallel streams,
                // a 4 MiB TCP buffer, pipelining and 4 files at once for trees.
                set(
                    "best",
                    "4 streams, 4 MiB TCP buffer, pipelining, 4 files at once (servers.sh)",
                    &["-p", "4", "-tcp-bs", "4M", "-pp", "-cc", "4"],
                ),
            ],
            local: false,
            over_ssh: false,
            far: false,
        },
        Tool {
            name: "xrootd".into(),
            about: "xrdcp against an xrootd the matrix starts".into(),
            needs: v(&["xrdcp", "xrootd"]),
            package: "xrootd-client xrootd-server".into(),
            kind: Kind::Files,
            server: Some(Server {
                // xrootd refuses to run as root: as root it runs in a user
                // namespace as uid 65534 mapped to root outside (so it reads
                // and writes the work directory as its owner), otherwise as
                // the user. It has no bind address; on loopback the matrix
                // (as root) keeps it in a network namespace of its own.
                argv: v(&[
                    "sh",
                    "-c",
                    "if [ \"$(id -u)\" = 0 ]; then exec unshare --user --map-user=65534 \
                     --map-group=65534 \"$@\"; fi; exec \"$@\"",
                    "xrootd",
                    "xrootd",
                    "-c",
                    "{state}/xrootd.cfg",
                    "-n",
                    "matrix",
                ]),
                files: BTreeMap::from([(
                    "xrootd.cfg".to_string(),
                    "all.export {root}\nxrd.port {port}\nall.role server\n\
                     all.adminpath {state}/admin\nall.pidpath {state}/admin\n"
                        .to_string(),
                )]),
                hosts_file: false,
            }),
            env: vec![],
            // root://HOST:PORT//abs/path: the second slash starts the path.
            put: v(&[
                "xrdcp",
                "-r",
                "--nopbar",
                "{args}",
                "{src}",
                "root://{host}:{port}/{dstdir}/",
            ]),
            get: v(&[
                "xrdcp",
                "-r",
                "--nopbar",
                "{args}",
                "root://{host}:{port}/{src}",
                "{dstdir}/",
            ]),
            figure: Figure::Wall,
            settings: vec![
                defaults(),
                // ../shared/peers/servers.sh's client settings, XRootD's own
                // advice for long paths: several TCP streams per file, and
                // several files at once for trees.
                set(
                    "best",
                    "4 streams per file, 4 files at once (servers.sh)",
                    &["--streams", "4", "--parallel", "4"],
                ),
            ],
            local: false,
            over_ssh: false,
            far: false,
        },
        Tool {
            name: "rsyncd".into(),
            about: "rsync against an rsync daemon the matrix starts".into(),
            needs: v(&["rsync"]),
            package: "rsync".into(),
            kind: Kind::Files,
            server: Some(Server {
                argv: v(&[
                    "rsync",
                    "--daemon",
                    "--no-detach",
                    "--address={host}",
                    "--port={port}",
                    "--config={state}/rsyncd.conf",
                ]),
                files: BTreeMap::from([(
                    "rsyncd.conf".to_string(),
                    "use chroot = no\nuid = root\ngid = root\nread only = no\n\
                     hosts allow = 127.0.0.1 198.18.0.0/24\n[data]\n  path = {root}\n"
                        .to_string(),
                )]),
                hosts_file: false,
            }),
            env: vec![],
            put: v(&[
                "rsync",
                "-a",
                "{args}",
                "{src}",
                "rsync://{host}:{port}/data/{dstdir_rel}/",
            ]),
            get: v(&[
                "rsync",
                "-a",
                "{args}",
                "rsync://{host}:{port}/data/{src_rel}",
                "{dstdir}/",
            ]),
            figure: Figure::Wall,
            settings: vec![
                defaults(),
                // The delta algorithm costs CPU and finds nothing on a first copy.
                set(
                    "best",
                    "whole files (the delta algorithm finds nothing on a first copy)",
                    &["--whole-file"],
                ),
            ],
            local: false,
            over_ssh: false,
            far: false,
        },
        Tool {
            name: "rsync-ssh".into(),
            about: "rsync over ssh (to the matrix's private sshd; on --far the user's ssh)".into(),
            needs: v(&["rsync", "ssh", "sshd", "ssh-keygen"]),
            package: "rsync openssh-client openssh-server".into(),
            kind: Kind::Files,
            server: Some(private_sshd()),
            env: vec![],
            put: v(&[
                "rsync",
                "-a",
                "-e",
                "{ssh}",
                "{args}",
                "{src}",
                "{sshhost}:{dstdir}/",
            ]),
            get: v(&[
                "rsync",
                "-a",
                "-e",
                "{ssh}",
                "{args}",
                "{sshhost}:{src}",
                "{dstdir}/",
            ]),
            figure: Figure::Wall,
            settings: vec![
                set(
                    "defaults",
                    "the tool as installed (-e only names the ssh that reaches the sshd)",
                    &[],
                ),
                // The delta algorithm finds nothing on a first copy; AES-GCM
                // runs on the CPU's AES instructions, faster than ssh's
                // default ChaCha20-Poly1305 where they exist (every x86-64
                // and ARMv8 server). The later -e wins.
                set(
                    "best",
                    "whole files (no delta on a first copy); ssh with AES-GCM (AES instructions)",
                    &["--whole-file", "-e", "{ssh} -c aes128-gcm@openssh.com"],
                ),
            ],
            local: false,
            over_ssh: true,
            far: true,
        },
        Tool {
            name: "scp".into(),
            about: "scp (to the matrix's private sshd; on --far the user's ssh)".into(),
            needs: v(&["scp", "ssh", "sshd", "ssh-keygen"]),
            package: "openssh-client openssh-server".into(),
            kind: Kind::Files,
            server: Some(private_sshd()),
            env: vec![],
            put: v(&[
                "scp",
                "-r",
                "-q",
                "-S",
                "{ssh}",
                "{args}",
                "{src}",
                "{sshhost}:{dstdir}/",
            ]),
            get: v(&[
                "scp",
                "-r",
                "-q",
                "-S",
                "{ssh}",
                "{args}",
                "{sshhost}:{src}",
                "{dstdir}/",
            ]),
            figure: Figure::Wall,
            settings: vec![
                set(
                    "defaults",
                    "the tool as installed (-S only names the ssh that reaches the sshd)",
                    &[],
                ),
                // scp has no streams or buffers to set: its one lever is the
                // cipher (as rsync-ssh's best).
                set(
                    "best",
                    "ssh with AES-GCM (AES instructions; scp has no streams or buffers to set)",
                    &["-c", "aes128-gcm@openssh.com"],
                ),
            ],
            local: false,
            over_ssh: true,
            far: true,
        },
        // tar through a socket, the seeds' oldest baseline (`tar c | nc`).
        // socat, not netcat: Debian's two netcats (openbsd, traditional)
        // differ in how they end a stream (-N, -q), while socat half-closes
        // the same way everywhere, so the far tar sees the end of the
        // archive and the client hears when it is unpacked. longhaul has no
        // raw pipe of its own to offer instead (every longhaul copy is a
        // verified, encrypted one, already its own row).
        Tool {
            name: "tar-socket".into(),
            about: "tar piped through a TCP socket (socat) to a tar the matrix starts".into(),
            needs: v(&["tar", "socat"]),
            package: "tar socat".into(),
            kind: Kind::Files,
            server: Some(Server {
                // -t: wait for the unpacking tar to finish, however long,
                // after the client's end of stream.
                argv: v(&[
                    "socat",
                    "-t",
                    "86400",
                    "TCP-LISTEN:{port},bind={host},reuseaddr,fork",
                    "EXEC:sh {state}/tar-serve.sh",
                ]),
                files: BTreeMap::from([(
                    "tar-serve.sh".to_string(),
                    TAR_SERVE.to_string(),
                )]),
                hosts_file: false,
            }),
            env: vec![],
            put: v(&[
                "sh",
                "-c",
                "src=$1 addr=$2 rel=$3; shift 3; \
                 { echo put \"$rel\"; tar -c -C \"$(dirname \"$src\")\" \"$(basename \"$src\")\"; } \
                 | socat \"$@\" -t 86400 - \"TCP:$addr\" | grep -qx ok",
                "tar-socket",
                "{src}",
                "{host}:{port}",
                "{dstdir_rel}",
                "{args}",
            ]),
            get: v(&[
                "sh",
                "-c",
                "rel=$1 addr=$2 dstdir=$3; shift 3; \
                 echo get \"$rel\" | socat \"$@\" -t 86400 - \"TCP:$addr\" | tar -x -C \"$dstdir\"",
                "tar-socket",
                "{src_rel}",
                "{host}:{port}",
                "{dstdir}",
                "{args}",
            ]),
            figure: Figure::Wall,
            settings: vec![
                defaults(),
                // socat moves 8 KiB per system call unless told otherwise.
                set(
                    "best",
                    "1 MiB socat buffers (8 KiB by default: a system call per 8 KiB)",
                    &["-b", "1048576"],
                ),
            ],
            local: false,
            over_ssh: false,
            far: false,
        },
        Tool {
            name: "cp".into(),
            about: "a local copy of the same data on this host (a limit, on every path)".into(),
            needs: v(&["cp"]),
            package: "coreutils".into(),
            kind: Kind::Files,
            server: None,
            env: vec![],
            put: v(&["cp", "-a", "{src}", "{dstdir}/"]),
            get: v(&["cp", "-a", "{src}", "{dstdir}/"]),
            figure: Figure::Wall,
            settings: vec![defaults()],
            local: true,
            over_ssh: false,
            far: true,
        },
    ]
}

/// The tar-socket server's handler, one per connection: `put DIR` then a
/// tar stream to unpack in DIR (it answers `ok` when unpacked), or
/// `get PATH`: PATH as a tar stream. Paths are relative to `{root}`; an
/// absolute one or one with `..` is refused.
const TAR_SERVE: &str = "read -r op rel || exit 1\n\
case \"$rel\" in /*|*..*|'') echo \"refused path: $rel\" >&2; exit 1;; esac\n\
cd \"{root}\" || exit 1\n\
case \"$op\" in\n\
put) mkdir -p \"$rel\" && tar -x -C \"$rel\" && echo ok ;;\n\
get) exec tar -c -C \"$(dirname \"$rel\")\" \"$(basename \"$rel\")\" ;;\n\
*) echo \"unknown request: $op\" >&2; exit 1 ;;\n\
esac\n";

/// A private sshd on `{host}:{port}` for the tools that run over ssh, with
/// a throwaway host key and client key made in `{state}`, and `{state}/ssh`:
/// the ssh that reaches it (and only it: its known_hosts holds that host
/// key alone). Public keys only, no PAM; the user running the matrix only;
/// SFTP in the server (scp speaks it since OpenSSH 9).
fn private_sshd() -> Server {
    Server {
        argv: v(&["sh", "{state}/sshd.sh"]),
        files: BTreeMap::from([("sshd.sh".to_string(), SSHD.to_string())]),
        hosts_file: false,
    }
}

const SSHD: &str = "set -e\n\
cd \"{state}\"\n\
[ -f host_key ] || ssh-keygen -q -t ed25519 -N '' -C matrix-host -f host_key\n\
[ -f client_key ] || ssh-keygen -q -t ed25519 -N '' -C matrix-client -f client_key\n\
cp client_key.pub authorized_keys\n\
printf '* %s\\n' \"$(cut -d' ' -f1,2 host_key.pub)\" > known_hosts\n\
cat > sshd_config <<EOF\n\
Port {port}\n\
ListenAddress {host}\n\
HostKey {state}/host_key\n\
PidFile none\n\
AuthorizedKeysFile {state}/authorized_keys\n\
AllowUsers $(id -un)\n\
PubkeyAuthentication yes\n\
PasswordAuthentication no\n\
KbdInteractiveAuthentication no\n\
PermitRootLogin prohibit-password\n\
UsePAM no\n\
StrictModes no\n\
Subsystem sftp internal-sftp\n\
EOF\n\
cat > ssh_config <<EOF\n\
Host *\n\
  Port {port}\n\
  IdentityFile {state}/client_key\n\
  IdentitiesOnly yes\n\
  UserKnownHostsFile {state}/known_hosts\n\
  StrictHostKeyChecking yes\n\
  BatchMode yes\n\
  LogLevel ERROR\n\
EOF\n\
printf '#!/bin/sh\\nexec ssh -F \"%s/ssh_config\" \"$@\"\\n' \"{state}\" > ssh\n\
chmod 700 ssh\n\
# sshd's privilege separation directory, as its package's service makes it.\n\
[ -d /run/sshd ] || mkdir -p /run/sshd 2>/dev/null || true\n\
sshd=$(command -v sshd || echo /usr/sbin/sshd)\n\
exec \"$sshd\" -D -e -f \"{state}/sshd_config\"\n";

/// Whether every program `t` needs is on PATH; else the install line.
pub fn missing(t: &Tool) -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    // sshd lives in /usr/sbin, off a user's PATH.
    let dirs: Vec<std::path::PathBuf> = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(Into::into))
        .collect();
    let absent: Vec<&str> = t
        .needs
        .iter()
        .filter(|p| !dirs.iter().any(|d| is_executable(&d.join(p.as_str()))))
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

fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `s` with every known `{key}` replaced.
pub fn fill(s: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut out = s.to_string();
    for (k, val) in vars {
        out = out.replace(&format!("{{{k}}}"), val);
    }
    out
}

/// A template's argv filled in, `{args}` expanded to the settings' arguments.
pub fn argv(template: &[String], s: &Settings, vars: &BTreeMap<&str, String>) -> Vec<String> {
    let mut out = Vec::new();
    for a in template {
        if a == "{args}" {
            out.extend(s.args.iter().map(|x| fill(x, vars)));
        } else {
            out.push(fill(a, vars));
        }
    }
    out
}

/// Reads a tool's own figure (bytes per second) from its standard output.
pub fn read_figure(f: Figure, out: &str) -> Result<f64, String> {
    let rate = figure(f, out)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    /// The tar-socket handler as a client on its socket would reach it.
    fn serve(root: &std::path::Path, request: &[u8]) -> std::process::Output {
        let vars = BTreeMap::from([("root", root.display().to_string())]);
        let mut c = Command::new("sh")
            .arg("-c")
            .arg(fill(TAR_SERVE, &vars))
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
