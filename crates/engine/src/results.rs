//! What each command found, when it is done: the second half of the one
//! reporting path. [`CommandReporter`] extends [`Reporter`] (the events
//! of a running command, on the bottom floor, which perf, xfer and the
//! doctor report into) with the results of the commands, whose types live
//! in the modules that make them; so this module is on the top floor and
//! nothing below it names it. Every printer (human, progress bar, JSON) and
//! (later) the results archive and the dashboard implement both.

use std::net::Ipv4Addr;

use longhaul_proto::disk::DiskReport;
use longhaul_proto::xfer::ListEntry;

use crate::doctor::DoctorReport;
use crate::report::Reporter;
use crate::server::auth::Grant;
use crate::wan::LinkStats;
use crate::xfer::client::CopyReport;

/// A [`Reporter`] that also takes each command's result. Every method has
/// an empty default, like [`Reporter`]'s.
pub trait CommandReporter: Reporter {
    /// The command succeeded with this exit code (6: some files failed,
    /// 130: interrupted); called before [`Reporter::end`], not for 0.
    fn exit_code(&mut self, _code: i32) {}
    /// cp, sync: the outcome of the transfer.
    fn transfer_summary(&mut self, _summary: &CopyReport) {}

    /// ls: the entries of a remote directory, in the server's order.
    fn listing(&mut self, _entries: &[ListEntry]) {}
    /// doctor: everything it found, the verdict last.
    fn doctor(&mut self, _report: &DoctorReport) {}
    /// bench disk: what the storage did.
    fn disk(&mut self, _report: &DiskReport) {}
    /// id: the identity's fingerprint (`SHA256:...`).
    fn identity(&mut self, _fingerprint: &str) {}
    /// trust: the host as the known-hosts file keys it, and the
    /// fingerprint it presented (now trusted).
    fn trusted(&mut self, _host: &str, _fingerprint: &str) {}
    /// token create: the new grant's token, shown this once.
    fn token_created(&mut self, _token: &str) {}
    /// token list: a server's grants.
    fn grants(&mut self, _grants: &[Grant]) {}
    /// A line that opens one part of a command that runs several (demo).
    fn section(&mut self, _title: &str) {}
    /// wan up: the emulated hosts are up and the link forwards.
    fn wan_up(&mut self, _hosts: &WanHosts) {}
    /// wan up: the link is down again (Ctrl-C), with what it carried
    /// each way.
    fn wan_down(&mut self, _a_to_b: &LinkStats, _b_to_a: &LinkStats) {}
}

/// The hosts of an emulated WAN (`wan up`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct WanHosts {
    pub a: Ipv4Addr,
    pub b: Ipv4Addr,
    /// The network namespaces they live in.
    pub ns_a: String,
    pub ns_b: String,
}

/// Says nothing of what it is told (a fleet rank's sessions, whose one
/// result the fleet prints).
impl CommandReporter for crate::report::Discard {}
