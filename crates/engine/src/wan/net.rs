//! The emulator's hosts: network namespaces with a TUN device each, made
//! and removed with iproute2 (`ip`), addressed from the RFC 2544
//! benchmarking range.

use std::fs::{File, OpenOptions};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;

use crate::EngineError;

/// Host `a`'s and host `b`'s addresses (198.18.0.0/15, RFC 2544).
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// Names of an emulator's namespaces and devices, from its `--name`.
#[derive(Debug, Clone)]
pub struct Names {
    pub ns_a: String,
    pub ns_b: String,
    pub dev_a: String,
    pub dev_b: String,
}

impl Names {
    pub fn new(name: &str) -> Result<Names, EngineError> {
        // Interface names are at most 15 bytes: "<name>-ta".
        if name.is_empty()
            || name.len() > 12
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(EngineError::Usage(format!(
                "invalid emulator name '{name}': 1-12 letters, digits, '-' or '_'"
            )));
        }
        Ok(Names {
            ns_a: format!("{name}-a"),
            ns_b: format!("{name}-b"),
            dev_a: format!("{name}-ta"),
            dev_b: format!("{name}-tb"),
        })
    }

    /// The namespace of host `a` or `b`.
    pub fn ns(&self, host: &str) -> Option<&str> {
        match host {
            "a" => Some(&self.ns_a),
            "b" => Some(&self.ns_b),
            _ => None,
        }
    }
}

/// Runs `ip ARGS`, with its complaint as the error.
pub fn ip(args: &[&str]) -> Result<(), EngineError> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        EngineError::Usage(format!(
            "cannot run `ip` (iproute2 is needed for `longhaul wan`): {e}"
        ))
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(EngineError::Usage(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The inode of a named namespace (`ip netns add` makes /run/netns/NAME),
/// which tells it from a later namespace of the same name.
pub fn netns_inode(ns: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/run/netns/{ns}"))
        .ok()
        .map(|m| m.ino())
}

/// A TUN device (layer 3, no packet-info header).
pub struct Tun {
    pub file: File,
}

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl Tun {
    /// Makes the device `name` in the current namespace.
    pub fn create(name: &str) -> Result<Tun, EngineError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(|e| {
                EngineError::Usage(format!(
                    "cannot open /dev/net/tun: {e} (the emulator needs root and the tun module)"
                ))
            })?;
        let mut req = IfReq {
            name: [0; 16],
            flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads (and writes back) an ifreq-sized struct
        // that lives across the call.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) };
        if r < 0 {
            return Err(EngineError::Usage(format!(
                "cannot create TUN device {name}: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Tun { file })
    }
}

/// The two hosts, made; removed again when dropped.
pub struct Hosts {
    pub names: Names,
    pub tun_a: Tun,
    pub tun_b: Tun,
}

/// Packets a TUN device queues for the forwarder before it drops.
const TUN_QUEUE_PACKETS: &str = "20000";

impl Hosts {
    /// Makes the namespaces, moves a TUN device into each, addresses them
    /// point to point and brings them up with `mtu`.
    pub fn up(names: Names, mtu: u32) -> Result<Hosts, EngineError> {
        // Leftovers of a crashed run with the same name go first.
        let _ = ip(&["netns", "del", &names.ns_a]);
        let _ = ip(&["netns", "del", &names.ns_b]);
        let tun_a = Tun::create(&names.dev_a)?;
        let tun_b = Tun::create(&names.dev_b)?;
        let hosts = Hosts {
            names,
            tun_a,
            tun_b,
        };
        let n = &hosts.names;
        let mtu = mtu.to_string();
        for (ns, dev, me, peer) in [
            (&n.ns_a, &n.dev_a, ADDR_A, ADDR_B),
            (&n.ns_b, &n.dev_b, ADDR_B, ADDR_A),
        ] {
            ip(&["netns", "add", ns])?;
            ip(&["link", "set", dev, "netns", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &me.to_string(),
                "peer",
                &format!("{peer}/32"),
                "dev",
                dev,
            ])?;
            // A TUN device holds at most txqueuelen packets for its reader
            // (default 500) and drops the rest: the burst of a few dozen
            // TSO-sized sends overflows that before the forwarder drains
            // it, a loss no real link has. The emulated queue is the
            // bottleneck's (`--queue`), not this one.
            ip(&[
                "-n",
                ns,
                "link",
                "set",
                dev,
                "mtu",
                &mtu,
                "txqueuelen",
                TUN_QUEUE_PACKETS,
                "up",
            ])?;
        }
        Ok(hosts)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace removes the devices in it.
        let _ = ip(&["netns", "del", &self.names.ns_a]);
        let _ = ip(&["netns", "del", &self.names.ns_b]);
    }
}
