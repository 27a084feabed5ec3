//! Socket tuning and the kernel's view of a socket: buffer sizes and their
//! caps, congestion control, MSS, pacing, TCP_INFO, thread CPU time and
//! affinity. Thin wrappers over setsockopt/getsockopt and /proc.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use longhaul_proto::report::TcpSample;
use socket2::SockRef;

/// Reads a number from a file under /proc/sys, if it exists.
pub fn sysctl_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Reads the three numbers of tcp_rmem / tcp_wmem.
pub fn sysctl_triple(path: &str) -> Option<[u64; 3]> {
    let s = std::fs::read_to_string(path).ok()?;
    let v: Vec<u64> = s
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    (v.len() == 3).then(|| [v[0], v[1], v[2]])
}

pub use longhaul_proto::window::BufferCaps;

/// The kernel's caps on socket buffers, as this host (this network
/// namespace) has them.
pub fn buffer_caps() -> BufferCaps {
    BufferCaps {
        rmem_max: sysctl_u64("/proc/sys/net/core/rmem_max"),
        wmem_max: sysctl_u64("/proc/sys/net/core/wmem_max"),
        tcp_rmem_max: sysctl_triple("/proc/sys/net/ipv4/tcp_rmem").map(|t| t[2]),
        tcp_wmem_max: sysctl_triple("/proc/sys/net/ipv4/tcp_wmem").map(|t| t[2]),
    }
}

/// Congestion control algorithms this kernel offers.
pub fn available_congestion() -> Vec<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Checks a congestion control name against this kernel; the error names
/// the choices and how to load another.
pub fn check_congestion(name: &str) -> Result<(), String> {
    let avail = available_congestion();
    if avail.is_empty() || avail.iter().any(|a| a == name) {
        Ok(())
    } else {
        Err(format!(
            "unknown congestion control '{name}' on this host: available are {} (load another with `modprobe tcp_{name}`)",
            avail.join(", ")
        ))
    }
}

/// Socket options a data stream asks for.
#[derive(Debug, Clone, Default)]
pub struct Tuning {
    /// The user's window (`perf -w`): SO_SNDBUF and SO_RCVBUF set as
    /// asked, autotuning or not.
    pub window: Option<u32>,
    pub congestion: Option<String>,
    /// Bytes per second, for SO_MAX_PACING_RATE.
    pub pacing_bytes_per_sec: Option<u64>,
    pub mss: Option<u32>,
}

/// Applies what must be set before connect or on a fresh socket.
pub fn apply_tcp(sock: &socket2::Socket, t: &Tuning) -> io::Result<()> {
    apply_tcp_ref(&SockRef::from(sock), t)
}

/// Applies tuning to a socket we do not own (an accepted stream).
pub fn apply_tcp_ref(sock: &SockRef<'_>, t: &Tuning) -> io::Result<()> {
    if let Some(w) = t.window {
        sock.set_send_buffer_size(w as usize)?;
        sock.set_recv_buffer_size(w as usize)?;
    }
    if let Some(mss) = t.mss {
        setsockopt_u32(sock.as_fd(), libc::IPPROTO_TCP, libc::TCP_MAXSEG, mss)
            .map_err(|e| io::Error::new(e.kind(), format!("failed to set MSS {mss}: {e}")))?;
    }
    if let Some(cc) = &t.congestion {
        set_congestion(sock.as_fd(), cc)?;
    }
    if let Some(rate) = t.pacing_bytes_per_sec {
        set_pacing(sock.as_fd(), rate)?;
    }
    // Nagle stays on for data: full-size writes follow each other at once,
    // and it merges each write's tail into the next write's first segment.
    sock.set_tcp_nodelay(false)?;
    Ok(())
}

/// Applies a transfer's stream settings to one data socket: the sender's
/// part (`sending`) or the receiver's. A congestion control this kernel
/// lacks leaves its default (the reason is logged); a buffer size is set
/// only where the setting gives more than this namespace's autotuning
/// reaches ([`size_buffer`]). Returns the congestion control in use.
pub fn tune_data_stream(
    fd: BorrowedFd<'_>,
    t: &longhaul_proto::xfer::StreamTuning,
    sending: bool,
) -> io::Result<String> {
    let wanted = if sending {
        t.send_buffer
    } else {
        t.receive_buffer
    };
    if let Some(b) = wanted {
        size_buffer(fd, b, sending, &buffer_caps())?;
    }
    if sending {
        if let Some(cc) = &t.congestion {
            // Only one the kernel already has: a name it lacks would make a
            // privileged process load the module `tcp_NAME`, on a peer's word.
            if available_congestion().iter().any(|c| c == cc) {
                if let Err(e) = set_congestion(fd, cc) {
                    tracing::warn!("{e}; keeping {}", congestion(fd));
                }
            } else {
                tracing::warn!(
                    "congestion control '{}' is not available here; keeping {}",
                    cc.escape_debug(),
                    congestion(fd)
                );
            }
        }
        if let Some(rate) = t.pacing {
            set_pacing(fd, rate)?;
        }
    }
    Ok(congestion(fd))
}

/// Sets a data socket's send (`sending`) or receive buffer to `wanted`
/// bytes, a size longhaul computed for the path, where that gives more
/// than autotuning reaches under `caps` (this namespace's); else leaves
/// autotuning on, which a setting would turn off. Says whether it set it.
fn size_buffer(
    fd: BorrowedFd<'_>,
    wanted: u64,
    sending: bool,
    caps: &BufferCaps,
) -> io::Result<bool> {
    let sock = SockRef::from(&fd);
    let set = if sending {
        caps.send_buffer_to_set(wanted)
    } else {
        caps.receive_buffer_to_set(wanted)
    };
    let Some(b) = set.map(|b| usize::try_from(b).unwrap_or(usize::MAX)) else {
        return Ok(false);
    };
    if sending {
        sock.set_send_buffer_size(b)?;
    } else {
        sock.set_recv_buffer_size(b)?;
    }
    Ok(true)
}

/// Data a sending data stream may hold unsent, on a long path
/// ([`LONG_PATH_US`] and more): chunks wait in the shared queue instead of
/// in one stream's send buffer, where a stream that BBR paces at a small
/// share of the path would drain them alone at the end (measured at
/// 120 ms with 28 streams: 7 MB unsent in one stream paced at 30 Mbit/s,
/// 2-3 s of tail). At a tenth of a gigabit per stream this is still 80 ms
/// of data, ample time for its thread to write more.
pub const UNSENT_LIMIT: u32 = 1 << 20;
/// The RTT from which [`limit_unsent`] applies, microseconds: below it a
/// stream's pacing follows the path within milliseconds and a full send
/// buffer drains at once.
pub const LONG_PATH_US: u32 = 10_000;

/// True when a connected TCP socket's path is long ([`LONG_PATH_US`] and
/// more, by the smallest RTT it measured, from its handshake on).
pub fn long_path(fd: BorrowedFd<'_>) -> bool {
    tcp_info(fd).map_or(0, |i| i.min_rtt_us) >= LONG_PATH_US
}

/// Sets TCP_NOTSENT_LOWAT to [`UNSENT_LIMIT`] on a connected sending data
/// stream whose path is long (its handshake's RTT); says whether it did.
pub fn limit_unsent(fd: BorrowedFd<'_>) -> io::Result<bool> {
    if !long_path(fd) {
        return Ok(false);
    }
    setsockopt_u32(fd, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, UNSENT_LIMIT)
        .map_err(|e| io::Error::new(e.kind(), format!("failed to limit unsent data: {e}")))?;
    Ok(true)
}

/// Sizes the segments of a data stream paced to `bytes_per_sec`; set
/// before connecting, as the SYN advertises it, so that it holds whichever
/// end sends. The kernel leaves a connection's first 10 segments unpaced
/// (`tcp_update_skb_after_send`: "Original sch_fq does not pace first 10
/// MSS"), and on loopback a segment is 64 KiB: those ten ran a capped
/// copy's first second 6-12% over its cap. Segments of a millisecond of
/// the pacing (536 B to 32 KiB, the most the option takes) make them at
/// most 1% of a second where the path's own MTU does not already.
pub fn segments_for_pacing(fd: BorrowedFd<'_>, bytes_per_sec: u64) -> io::Result<()> {
    const MIN_MSS: u64 = 536;
    const MAX_MSS: u64 = 32 * 1024 - 1;
    let mss = (bytes_per_sec / 1000).clamp(MIN_MSS, MAX_MSS) as u32;
    setsockopt_u32(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG, mss)
        .map_err(|e| io::Error::new(e.kind(), format!("failed to size paced segments: {e}")))
}

pub fn set_congestion(fd: BorrowedFd<'_>, cc: &str) -> io::Result<()> {
    rustix::net::sockopt::set_tcp_congestion(fd, cc).map_err(|e| {
        let e = io::Error::from(e);
        io::Error::new(
            e.kind(),
            format!("failed to set congestion control '{cc}': {e}"),
        )
    })
}

/// The socket's congestion control, empty if unknown. Not rustix's
/// `tcp_congestion`: that one panics on a 16-byte name the kernel did not
/// NUL-terminate.
pub fn congestion(fd: BorrowedFd<'_>) -> String {
    let mut buf = [0u8; 16];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf is writable for len bytes.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return String::new();
    }
    let n = buf[..len as usize]
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(len as usize);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

pub fn set_pacing(fd: BorrowedFd<'_>, bytes_per_sec: u64) -> io::Result<()> {
    // SAFETY: the option takes a u64 on current kernels (u32 on old ones, which read the low half).
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&bytes_per_sec as *const u64).cast(),
            std::mem::size_of::<u64>() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("failed to set pacing rate: {e}"),
        ));
    }
    Ok(())
}

pub fn setsockopt_u32(fd: BorrowedFd<'_>, level: i32, opt: i32, v: u32) -> io::Result<()> {
    let v = v as libc::c_int;
    // SAFETY: v is a c_int on the stack, passed with its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub fn getsockopt_u32(fd: BorrowedFd<'_>, level: i32, opt: i32) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v is writable, len is its size.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(v as u32)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Buffer sizes the kernel granted, as getsockopt reports them (twice
/// what was asked, for bookkeeping overhead), and the MSS.
pub fn granted(fd: BorrowedFd<'_>) -> (u64, u64, u32) {
    let s = SockRef::from(&fd);
    (
        s.send_buffer_size().unwrap_or(0) as u64,
        s.recv_buffer_size().unwrap_or(0) as u64,
        getsockopt_u32(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG).unwrap_or(0),
    )
}

/// `struct tcp_info` as in linux/tcp.h (through tcpi_delivered_ce and the
/// later fields we read); the kernel fills as much as it has and reports
/// the length, so older kernels leave the tail zero.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RawTcpInfo {
    state: u8,
    ca_state: u8,
    retransmits: u8,
    probes: u8,
    backoff: u8,
    options: u8,
    wscale: u8,
    flags: u8,
    rto: u32,
    ato: u32,
    snd_mss: u32,
    rcv_mss: u32,
    unacked: u32,
    sacked: u32,
    lost: u32,
    retrans: u32,
    fackets: u32,
    last_data_sent: u32,
    last_ack_sent: u32,
    last_data_recv: u32,
    last_ack_recv: u32,
    pmtu: u32,
    rcv_ssthresh: u32,
    rtt: u32,
    rttvar: u32,
    snd_ssthresh: u32,
    snd_cwnd: u32,
    advmss: u32,
    reordering: u32,
    rcv_rtt: u32,
    rcv_space: u32,
    total_retrans: u32,
    pacing_rate: u64,
    max_pacing_rate: u64,
    bytes_acked: u64,
    bytes_received: u64,
    segs_out: u32,
    segs_in: u32,
    notsent_bytes: u32,
    min_rtt: u32,
    data_segs_in: u32,
    data_segs_out: u32,
    delivery_rate: u64,
    busy_time: u64,
    rwnd_limited: u64,
    sndbuf_limited: u64,
    delivered: u32,
    delivered_ce: u32,
    bytes_sent: u64,
    bytes_retrans: u64,
    dsack_dups: u32,
    reord_seen: u32,
    rcv_ooopack: u32,
    snd_wnd: u32,
}

/// The kernel's TCP_INFO of a socket.
fn raw_tcp_info(fd: BorrowedFd<'_>) -> Option<RawTcpInfo> {
    let mut info = RawTcpInfo::default();
    let mut len = std::mem::size_of::<RawTcpInfo>() as libc::socklen_t;
    // SAFETY: info is a plain repr(C) struct, writable for len bytes.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut RawTcpInfo).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(info)
}

/// Reads TCP_INFO of a socket.
pub fn tcp_info(fd: BorrowedFd<'_>) -> Option<TcpSample> {
    let info = raw_tcp_info(fd)?;
    Some(TcpSample {
        retransmits: u64::from(info.total_retrans),
        rtt_us: info.rtt,
        rttvar_us: info.rttvar,
        min_rtt_us: info.min_rtt,
        cwnd_bytes: u64::from(info.snd_cwnd) * u64::from(info.snd_mss),
        busy_us: info.busy_time,
        rwnd_limited_us: info.rwnd_limited,
        sndbuf_limited_us: info.sndbuf_limited,
        delivery_rate: info.delivery_rate,
        pacing_rate: info.pacing_rate,
        bytes_acked: info.bytes_acked,
        snd_wnd: info.snd_wnd,
        bytes_sent: info.bytes_sent,
        bytes_retrans: info.bytes_retrans,
    })
}

/// Bytes a socket's peer acknowledged, and bytes it received
/// (tcpi_bytes_acked, tcpi_bytes_received): what crossed its path.
pub fn tcp_bytes(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    raw_tcp_info(fd).map(|i| (i.bytes_acked, i.bytes_received))
}

/// What a receiving socket shows of its stream: bytes received, the
/// segment size it receives, and the path's smallest round trip seen.
pub fn tcp_receiving(fd: BorrowedFd<'_>) -> Option<(u64, u32, u32)> {
    raw_tcp_info(fd).map(|i| (i.bytes_received, i.rcv_mss, i.min_rtt))
}

/// CPU time (user + system) of the calling thread, microseconds.
pub fn thread_cpu_us() -> u64 {
    crate::stages::thread_cpu_ns() / 1000
}

fn clock_us(clock: libc::clockid_t) -> Option<u64> {
    crate::stages::clock_ns(clock).map(|ns| ns / 1000)
}

/// A handle on another thread's CPU clock.
#[derive(Debug, Clone, Copy)]
pub struct ThreadClock(libc::clockid_t);

impl ThreadClock {
    /// The clock of the calling thread, readable from any thread while it lives.
    pub fn current() -> Option<Self> {
        let mut id: libc::clockid_t = 0;
        // SAFETY: pthread_self is always valid for the calling thread.
        let r = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
        (r == 0).then_some(Self(id))
    }

    pub fn read_us(self) -> Option<u64> {
        clock_us(self.0)
    }
}

/// Pins the calling thread to one CPU.
pub fn pin_to_cpu(cpu: u32) -> io::Result<()> {
    if cpu as usize >= rustix::thread::CpuSet::MAX_CPU {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} out of range"),
        ));
    }
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu as usize);
    rustix::thread::sched_setaffinity(None, &set).map_err(|e| {
        let e = io::Error::from(e);
        io::Error::new(e.kind(), format!("failed to pin thread to CPU {cpu}: {e}"))
    })
}

/// The host name, for reports.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The path MTU the kernel knows for `peer` (IP_MTU / IPV6_MTU of a
/// connected UDP socket: the route's MTU, lowered by what path MTU
/// discovery learned, as after a TCP test to it); None if unknown.
pub fn path_mtu(peer: std::net::IpAddr) -> Option<u32> {
    let bind = match peer {
        std::net::IpAddr::V4(_) => "0.0.0.0:0",
        std::net::IpAddr::V6(_) => "[::]:0",
    };
    let u = std::net::UdpSocket::bind(bind).ok()?;
    u.connect((peer, 9)).ok()?;
    let mtu = match peer {
        std::net::IpAddr::V4(_) => rustix::net::sockopt::ip_mtu(&u),
        std::net::IpAddr::V6(_) => rustix::net::sockopt::ipv6_mtu(&u),
    };
    mtu.ok().filter(|&m| m > 0)
}

pub fn fd_of<T: AsFd>(t: &T) -> BorrowedFd<'_> {
    t.as_fd()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh TCP socket: its buffers as the kernel starts them.
    fn fresh() -> socket2::Socket {
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap()
    }

    #[test]
    fn a_buffer_autotuning_covers_is_left_to_autotuning() {
        // tcp_*mem raised to 128 MiB, the core caps at 4 MiB: a setting
        // would lock each buffer at 8 MiB at most.
        let small_core = BufferCaps {
            rmem_max: Some(4 << 20),
            wmem_max: Some(4 << 20),
            tcp_rmem_max: Some(128 << 20),
            tcp_wmem_max: Some(128 << 20),
        };
        let (s, untouched) = (fresh(), fresh());
        for (sending, wanted) in [(true, 4 << 20), (false, 4 << 20), (true, 1), (false, 1)] {
            let set = size_buffer(s.as_fd(), wanted, sending, &small_core).unwrap();
            assert!(!set, "{sending} {wanted}");
        }
        assert_eq!(
            s.send_buffer_size().unwrap(),
            untouched.send_buffer_size().unwrap()
        );
        assert_eq!(
            s.recv_buffer_size().unwrap(),
            untouched.recv_buffer_size().unwrap()
        );
    }

    #[test]
    fn a_buffer_beyond_autotuning_is_set() {
        // This host as the review found it: tcp_wmem to 4 MiB, wmem_max 4 MiB.
        let here = BufferCaps {
            rmem_max: Some(4 << 20),
            wmem_max: Some(4 << 20),
            tcp_rmem_max: Some(32 << 20),
            tcp_wmem_max: Some(4 << 20),
        };
        let s = fresh();
        let before = s.send_buffer_size().unwrap();
        assert!(size_buffer(s.as_fd(), 1 << 20, true, &here).is_ok_and(|set| !set));
        assert_eq!(s.send_buffer_size().unwrap(), before);
        // 2 x 3 MiB beats autotuning's 4 MiB: set (and doubled by the kernel,
        // within the real wmem_max of the machine running the test).
        assert!(size_buffer(s.as_fd(), 3 << 20, true, &here).unwrap());
        assert_ne!(s.send_buffer_size().unwrap(), before);
        // Receiving, tcp_rmem's 32 MiB beats any setting.
        assert!(!size_buffer(s.as_fd(), 4 << 20, false, &here).unwrap());
    }
}
