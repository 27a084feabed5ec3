//! `wan`: the emulated WAN between two network namespaces.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use longhaul_engine::report::Reporter;
use longhaul_engine::results::{CommandReporter, WanHosts};
use longhaul_engine::EngineError;
use longhaul_proto::units;

use super::{ended, interrupt_flag, Outcome};
use crate::args::{WanArgs, WanCommand, WanSetArgs, WanUpArgs};
use crate::exit;
use crate::print::{self, human::Human, json::Json};

/// `wan`: brings an emulated WAN up, changes it, runs commands in its hosts, removes it.
pub fn wan(a: WanArgs) -> Outcome {
    use longhaul_engine::wan::net;
    let fail = |e: EngineError| -> Outcome { Err(e.into()) };
    match a.command {
        WanCommand::Exec {
            host,
            name,
            command,
        } => {
            let names = match net::Names::new(&name) {
                Ok(n) => n,
                Err(e) => return fail(e),
            };
            let Some(ns) = names.ns(&host) else {
                return fail(EngineError::Usage(format!(
                    "unknown host '{host}': the emulator's hosts are a and b"
                )));
            };
            use std::os::unix::process::CommandExt;
            let e = std::process::Command::new("ip")
                .args(["netns", "exec", ns])
                .args(&command)
                .exec();
            fail(EngineError::Usage(format!(
                "cannot run `ip netns exec {ns}`: {e}"
            )))
        }
        WanCommand::Set(s) => {
            use std::io::{BufRead, Write};
            let path = match wan_socket(&s.name) {
                Ok(p) => p,
                Err(e) => return fail(EngineError::Usage(e)),
            };
            let reply = std::os::unix::net::UnixStream::connect(&path)
                .and_then(|mut c| {
                    c.set_read_timeout(Some(SET_WAIT * 2))?;
                    writeln!(c, "{}", serde_json::to_string(&s).unwrap_or_default())?;
                    let mut line = String::new();
                    std::io::BufReader::new(c).read_line(&mut line)?;
                    Ok(line)
                })
                .map_err(|e| {
                    EngineError::Usage(format!(
                        "no running emulator '{}' ({}: {e}); start one with `longhaul wan up`",
                        s.name,
                        path.display()
                    ))
                });
            match reply {
                Ok(l) if l.trim() == "ok" => Ok(exit::OK),
                Ok(l) => fail(EngineError::Usage(l.trim().to_string())),
                Err(e) => fail(e),
            }
        }
        WanCommand::Reap { name, inodes } => {
            // Out of the terminal's process group: a Ctrl-C meant for `up`
            // must not end the reaper before `up` has cleaned up.
            let _ = rustix::process::setsid();
            let mut sink = [0u8; 64];
            use std::io::Read as _;
            while !matches!(std::io::stdin().read(&mut sink), Ok(0) | Err(_)) {}
            let Ok(n) = net::Names::new(&name) else {
                return Ok(exit::USAGE);
            };
            for (ns, ino) in [&n.ns_a, &n.ns_b].into_iter().zip(inodes) {
                // Only the namespace `up` made: a new emulator of the same
                // name may have replaced it since.
                if net::netns_inode(ns) == Some(ino) {
                    let _ = net::ip(&["netns", "del", ns]);
                }
            }
            if let Ok(sock) = wan_socket(&name) {
                let _ = std::fs::remove_file(sock);
            }
            Ok(exit::OK)
        }
        WanCommand::Down { name } => match net::Names::new(&name) {
            Ok(n) => {
                let gone = [&n.ns_a, &n.ns_b]
                    .iter()
                    .filter(|ns| net::ip(&["netns", "del", ns]).is_ok())
                    .count();
                Human::new().status(&format!("longhaul: removed {gone} namespace(s) of {name}"));
                Ok(exit::OK)
            }
            Err(e) => fail(e),
        },
        WanCommand::Up(u) => {
            let mut printer = print::outcome(u.json.then(Json::wan));
            let outcome = up(u, printer.as_mut());
            ended(printer.as_mut(), outcome)
        }
    }
}

/// `wan up`: makes the hosts, forwards until Ctrl-C, removes everything.
fn up(u: WanUpArgs, printer: &mut dyn CommandReporter) -> Outcome {
    use longhaul_engine::wan::{forward::Forwarder, net};
    let fail = |e: EngineError| -> Outcome { Err(e.into()) };
    let p = match link_params(&u) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let names = match net::Names::new(&u.name) {
        Ok(n) => n,
        Err(e) => return fail(e),
    };
    let stop = interrupt_flag();
    let hosts = match net::Hosts::up(names, mtu_of(&u)) {
        Ok(h) => h,
        Err(e) => return fail(e),
    };
    // A reaper removes the hosts should this process die without
    // cleaning up (SIGKILL, a crash): it waits for its stdin to close.
    let _reaper = spawn_reaper(&hosts.names, &u.name, printer);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let fwd = match Forwarder::start(&hosts, p.clone(), p.clone(), seed) {
        Ok(f) => Arc::new(f),
        Err(e) => return fail(e),
    };
    let sock = listen_for_set(&u.name, fwd.clone(), p, (u.queue, mtu_of(&u)), printer);
    printer.wan_up(&WanHosts {
        a: net::ADDR_A,
        b: net::ADDR_B,
        ns_a: hosts.names.ns_a.clone(),
        ns_b: hosts.names.ns_b.clone(),
    });
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
    fwd.stop();
    let [ab, ba] = fwd.stats();
    drop(hosts);
    drop(fwd);
    if let Some(sock) = &sock {
        let _ = std::fs::remove_file(sock);
    }
    printer.wan_down(&ab, &ba);
    Ok(exit::OK)
}

/// The link's MTU: as asked, or the default for its rate.
fn mtu_of(u: &WanUpArgs) -> u32 {
    u.mtu
        .unwrap_or_else(|| longhaul_engine::wan::model::default_mtu(u.rate))
}

/// The link `wan up` asks for, each way: delay, jitter, loss, the rate
/// and its queue, the outages.
fn link_params(u: &WanUpArgs) -> Result<longhaul_engine::wan::LinkParams, EngineError> {
    use longhaul_engine::wan::LinkParams;
    let mut outages = Vec::new();
    for o in &u.outage {
        let parsed = o.split_once('+').and_then(|(s, d)| {
            Some((
                units::parse_duration(s).ok()?,
                units::parse_duration(d).ok()?,
            ))
        });
        match parsed {
            Some((s, d)) => outages.push((s, s + d)),
            None => {
                return Err(EngineError::Usage(format!(
                    "invalid outage '{o}': expected START+DURATION, e.g. 5s+3s"
                )))
            }
        }
    }
    for (what, p) in [("loss", u.loss), ("corrupt", u.corrupt)] {
        if !(0.0..=1.0).contains(&p) {
            return Err(EngineError::Usage(format!(
                "--{what} {p} is not a probability (0 to 1)"
            )));
        }
    }
    let mut p = LinkParams {
        delay: u.rtt / 2,
        jitter: u.jitter,
        reorder: u.reorder,
        loss: u.loss,
        corrupt: u.corrupt,
        rate_bps: u.rate,
        outages,
        ..LinkParams::default()
    };
    p.queue_for(u.queue, mtu_of(u));
    Ok(p)
}

/// `wan set` from other processes: one JSON line in, `ok` or an error out,
/// on the emulator's socket (returned, to remove when it ends; none, with
/// a warning, where it cannot be made safely).
fn listen_for_set(
    name: &str,
    fwd: Arc<longhaul_engine::wan::forward::Forwarder>,
    p: longhaul_engine::wan::LinkParams,
    (queue, mtu): (Duration, u32),
    printer: &mut dyn CommandReporter,
) -> Option<PathBuf> {
    let sock = match wan_socket(name) {
        Ok(s) => s,
        Err(e) => {
            printer.warning(&format!("`wan set` will not reach this emulator: {e}"));
            return None;
        }
    };
    let _ = std::fs::remove_file(&sock);
    match std::os::unix::net::UnixListener::bind(&sock) {
        Ok(l) => {
            let (mut p, mut queue) = (p, queue);
            std::thread::spawn(move || {
                use std::io::Write;
                for c in l.incoming().flatten() {
                    let Some(line) = set_request(&c, SET_WAIT) else {
                        continue;
                    };
                    let answer = serde_json::from_str::<WanSetArgs>(&line)
                        .map_err(|e| format!("bad request: {e}"))
                        .and_then(|s| s.apply(&mut p, &mut queue, mtu))
                        .map(|()| fwd.set(p.clone(), p.clone()));
                    let mut w = &c;
                    let _ = match answer {
                        Ok(()) => writeln!(w, "ok"),
                        Err(e) => writeln!(w, "{e}"),
                    };
                }
            });
        }
        Err(e) => printer.warning(&format!(
            "`wan set` will not reach this emulator: cannot listen on {}: {e}",
            sock.display()
        )),
    }
    Some(sock)
}

/// How long the emulator waits for a `wan set` request's line (and the
/// client for its answer): one connection that says nothing must not keep
/// every later `wan set` waiting.
const SET_WAIT: Duration = Duration::from_secs(5);

/// The most a `wan set` request's line may hold: its JSON is a few dozen bytes.
const SET_MAX: u64 = 64 << 10;

/// A `wan set` request's one line, of at most [`SET_MAX`] bytes, no read
/// of it waiting over `wait`; None if it did not come whole.
fn set_request(c: &std::os::unix::net::UnixStream, wait: Duration) -> Option<String> {
    use std::io::{BufRead, Read};
    c.set_read_timeout(Some(wait)).ok()?;
    let mut line = String::new();
    std::io::BufReader::new(c.take(SET_MAX))
        .read_line(&mut line)
        .ok()?;
    line.ends_with('\n').then_some(line)
}

impl WanSetArgs {
    /// `p` with the given changes.
    fn apply(
        &self,
        p: &mut longhaul_engine::wan::LinkParams,
        queue: &mut Duration,
        mtu: u32,
    ) -> Result<(), String> {
        for (what, v) in [("loss", self.loss), ("corrupt", self.corrupt)] {
            if v.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
                return Err(format!("--{what} must be a probability (0 to 1)"));
            }
        }
        if let Some(r) = self.rtt {
            p.delay = r / 2;
        }
        if let Some(j) = self.jitter {
            p.jitter = j;
        }
        if let Some(l) = self.loss {
            p.loss = l;
        }
        if let Some(c) = self.corrupt {
            p.corrupt = c;
        }
        if self.rate.is_some() {
            p.rate_bps = self.rate;
        }
        if self.no_rate {
            p.rate_bps = None;
        }
        if let Some(q) = self.queue {
            *queue = q;
        }
        p.queue_for(*queue, mtu);
        Ok(())
    }
}

/// Starts `longhaul wan reap` with a pipe as its stdin; the pipe closes
/// when this process ends, however it ends.
fn spawn_reaper(
    names: &longhaul_engine::wan::net::Names,
    name: &str,
    printer: &mut dyn CommandReporter,
) -> Option<std::process::Child> {
    use longhaul_engine::wan::net::netns_inode;
    let (a, b) = (netns_inode(&names.ns_a)?, netns_inode(&names.ns_b)?);
    let exe = std::env::current_exe().ok()?;
    let child = std::process::Command::new(exe)
        .args(["wan", "reap", "--name", name, "--inodes"])
        .args([a.to_string(), b.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn();
    match child {
        Ok(c) => Some(c),
        Err(e) => {
            printer.warning(&format!(
                "no cleanup should this process be killed: cannot start the reaper: {e}"
            ));
            None
        }
    }
}

/// Where a running emulator takes `wan set` requests, in a directory of
/// this user's alone ([`control_dir`]).
fn wan_socket(name: &str) -> Result<PathBuf, String> {
    let dir = if std::path::Path::new("/run").is_dir() {
        PathBuf::from("/run/longhaul-wan")
    } else {
        std::env::temp_dir().join("longhaul-wan")
    };
    control_dir(&dir)?;
    Ok(dir.join(format!("{name}.sock")))
}

/// Makes `dir` (0700) if it is missing, and refuses it unless it is this
/// user's alone: in a shared directory such as /tmp another user could
/// make it first, then take the emulator's socket or answer its requests.
fn control_dir(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot make {}: {e}", dir.display())),
    }
    longhaul_engine::state::private_dir(dir).map_err(|why| {
        format!(
            "refusing the control directory {}: {why}; remove it (another user may have made it)",
            dir.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    /// Another local user makes the control directory first (as in /tmp):
    /// open to all, or theirs, it is refused; a fresh one is made 0700.
    #[test]
    fn attacker_a_control_dir_made_by_another_or_open_to_all_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let fresh = t.path().join("fresh");
        control_dir(&fresh).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        control_dir(&fresh).unwrap();
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = control_dir(&open).unwrap_err();
        assert!(e.contains("writable by others (mode 0777)"), "{e}");
        assert!(e.contains(&open.display().to_string()), "{e}");
        let theirs = if rustix::process::geteuid().is_root() {
            let d = t.path().join("theirs");
            std::fs::create_dir(&d).unwrap();
            std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
            d
        } else {
            PathBuf::from("/")
        };
        let e = control_dir(&theirs).unwrap_err();
        assert!(e.contains("belongs to uid"), "{e}");
        let file = t.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(control_dir(&file).unwrap_err().contains("not a directory"));
    }

    #[test]
    fn a_set_request_that_never_comes_whole_is_given_up() {
        let (silent, _held) = std::os::unix::net::UnixStream::pair().unwrap();
        let wait = Duration::from_millis(200);
        assert_eq!(set_request(&silent, wait), None);
        let (endless, mut writer) = std::os::unix::net::UnixStream::pair().unwrap();
        let flood = std::thread::spawn(move || {
            let chunk = [b'x'; 4096];
            while writer.write_all(&chunk).is_ok() {}
        });
        assert_eq!(set_request(&endless, wait), None);
        drop(endless);
        flood.join().unwrap();
        let (asked, mut client) = std::os::unix::net::UnixStream::pair().unwrap();
        client.write_all(b"{\"name\":\"x\"}\n").unwrap();
        assert_eq!(
            set_request(&asked, wait).as_deref(),
            Some("{\"name\":\"x\"}\n")
        );
    }
}
