//! The kernel's own byte counters, for tests that check a claim the
//! program makes about bytes it moved: the program's report is what is
//! under test, so the count comes from elsewhere.

/// A process's I/O as `/proc/PID/io` counts it: every `read`, `write`
/// (and their vector and positioned forms, `sendfile`, `splice`) on
/// files, pipes and sockets alike, in `rchar` and `wchar`, of all its
/// threads, the ended ones too. Not `send`/`recv`/`sendmsg`/`recvmsg`:
/// the kernel counts those nowhere per process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcIo {
    pub rchar: u64,
    pub wchar: u64,
}

impl ProcIo {
    /// Process `pid`'s counters now (it may be a zombie: a child that
    /// ended and is not reaped yet keeps them); None once it is reaped.
    pub fn of(pid: u32) -> Option<ProcIo> {
        Self::parse(&std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?)
    }

    /// This process's counters now. They include the counters of every
    /// child it has reaped (the kernel adds them at `wait`, as it adds
    /// their CPU time): read them before reaping a child whose I/O is not
    /// to count.
    pub fn own() -> ProcIo {
        Self::parse(&std::fs::read_to_string("/proc/self/io").expect("read /proc/self/io"))
            .expect("/proc/self/io has rchar and wchar")
    }

    fn parse(io: &str) -> Option<ProcIo> {
        let field = |name: &str| {
            io.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        Some(ProcIo {
            rchar: field("rchar:")?,
            wchar: field("wchar:")?,
        })
    }

    /// Both ways.
    pub fn total(&self) -> u64 {
        self.rchar + self.wchar
    }

    /// What moved since `before`.
    pub fn since(&self, before: ProcIo) -> ProcIo {
        ProcIo {
            rchar: self.rchar - before.rchar,
            wchar: self.wchar - before.wchar,
        }
    }
}

/// The rows of the kernel's TCP tables (`/proc/net/tcp` and `tcp6`, this
/// network namespace) of sockets on local `port` in state `state` (hex, as
/// the tables write it: `01` established, `0A` listening), each as its
/// `tx_queue:rx_queue` field.
fn tcp_rows(port: u16, state: &str) -> Vec<String> {
    let mut rows = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && f.get(3) == Some(&state) {
                rows.push(f.get(4).map_or(String::new(), |q| q.to_string()));
            }
        }
    }
    rows
}

/// TCP connections established to local `port` (a server's side of them).
pub fn established(port: u16) -> usize {
    tcp_rows(port, "01").len()
}

/// Connections waiting in the accept queue of the TCP listener on local
/// `port` (this network namespace, IPv4 or IPv6), as `/proc/net/tcp` counts
/// them: 0 once the server has taken every connection made to it. None if
/// nothing listens there.
pub fn accept_queue(port: u16) -> Option<u64> {
    let row = tcp_rows(port, "0A").into_iter().next()?;
    u64::from_str_radix(row.split_once(':')?.1, 16).ok()
}

/// The bytes of every TCP packet this network namespace sends to and from
/// a local port, as nftables counts them (IP headers included): the
/// kernel's count of what crossed a server's port, whichever system call
/// (`send`, `sendmsg`, `writev`, `splice`) moved it. Made with root and
/// `nft`; the counting table is removed on drop.
pub struct PortBytes {
    table: String,
}

impl PortBytes {
    /// Starts counting `port`'s packets (a table `inet longhaul_test_PORT`
    /// of its own, so tests on other ports count apart).
    pub fn count(port: u16) -> Result<PortBytes, String> {
        let table = format!("longhaul_test_{port}");
        let rules = format!(
            "table inet {table} {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n  \
             tcp dport {port} counter\n  tcp sport {port} counter\n }}\n}}\n"
        );
        nft(&["-f", "-"], Some(&rules))?;
        Ok(PortBytes { table })
    }

    /// Bytes sent to the port and from it so far.
    pub fn read(&self) -> Result<(u64, u64), String> {
        let listing = nft(&["list", "table", "inet", &self.table], None)?;
        let bytes: Vec<u64> = listing
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "bytes")
            .filter_map(|w| w[1].parse().ok())
            .collect();
        match bytes[..] {
            [to, from] => Ok((to, from)),
            _ => Err(format!("no two counters in nft's listing:\n{listing}")),
        }
    }
}

impl Drop for PortBytes {
    fn drop(&mut self) {
        let _ = nft(&["delete", "table", "inet", &self.table], None);
    }
}

/// Runs `nft ARGS` (feeding `input`), its output or why it failed.
fn nft(args: &[&str], input: Option<&str>) -> Result<String, String> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let nft =
        crate::require::find("nft").ok_or("nft is not installed (apt-get install nftables)")?;
    let mut child = Command::new(nft)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("cannot feed nft: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("nft did not finish: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nft {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_io_parses_the_kernels_format() {
        let io = "rchar: 1234\nwchar: 99\nsyscr: 3\nsyscw: 4\nread_bytes: 0\n";
        assert_eq!(
            ProcIo::parse(io),
            Some(ProcIo {
                rchar: 1234,
                wchar: 99
            })
        );
        assert_eq!(ProcIo::parse("syscr: 3\n"), None);
    }

    #[test]
    fn a_write_shows_in_this_processs_own_counter() {
        let before = ProcIo::own();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![7u8; 100_000]).unwrap();
        assert!(ProcIo::own().since(before).wchar >= 100_000);
    }

    #[test]
    fn the_accept_queue_counts_connections_not_yet_taken() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(accept_queue(port), Some(0));
        let _held: Vec<_> = (0..2)
            .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
            .collect();
        assert_eq!(accept_queue(port), Some(2));
        let _taken = l.accept().unwrap();
        assert_eq!(accept_queue(port), Some(1));
        assert_eq!(established(port), 2);
        drop(l);
        assert_eq!(accept_queue(port), None);
    }
}
