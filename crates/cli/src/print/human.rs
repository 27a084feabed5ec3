//! The printer for people: perf's report lines as they come, the outcome
//! of every other command when it ends. Results go to stdout; warnings,
//! status and failures of single files to stderr.
//!
//! One reporter, [`Human`], for every command; what each command prints is
//! in the module named like the command's (`cmd/perf.rs` and [`perf`], ...).

mod cp;
mod doctor;
mod ls;
mod perf;
mod serve;
mod wan;

use longhaul_engine::doctor::DoctorReport;
use longhaul_engine::report::Reporter;
use longhaul_engine::results::{CommandReporter, WanHosts};
use longhaul_engine::server::auth::Grant;
use longhaul_engine::wan::LinkStats;
use longhaul_proto::disk::DiskReport;
use longhaul_proto::msg::{Mode, Transport};
use longhaul_proto::report::{IntervalReport, Setup, Summary};
use longhaul_proto::tune::TransferInterval;
use longhaul_proto::units::escaped as esc;
use longhaul_proto::xfer::report::CopyReport;
use longhaul_proto::xfer::ListEntry;

pub use cp::transfer_interval_line;
pub(crate) use doctor::{print_disk, print_doctor};
pub use wan::print_wan_down;

use super::FormatUnit;

fn out(line: &str) {
    crate::print::out(format_args!("{line}"));
}

/// The human-readable printer, for any command.
pub struct Human {
    /// perf: streams per direction (a line each when more than one).
    streams: u16,
    /// perf: which way the data goes (`TX`/`RX` tags for both ways).
    mode: Mode,
    /// perf: the column header is printed before the first interval.
    header_done: bool,
    /// sync -n: deletions are what would be deleted.
    dry_run: bool,
    /// cp -q: a transfer's failures only.
    quiet: bool,
    /// perf -f: the unit of every rate.
    unit: Option<FormatUnit>,
    /// perf: TCP or UDP (from the setup), which chooses the columns.
    transport: Option<Transport>,
    /// cp --intervals: a line per interval of the transfer, to stderr.
    intervals: bool,
    /// perf: whether the data streams were encrypted (from the setup), for
    /// the summary line.
    data_encrypted: Option<bool>,
    /// ls: names only, or long lines.
    list_style: ListStyle,
}

/// How `ls` prints entries.
#[derive(Clone, Copy, Default)]
pub struct ListStyle {
    /// `-l`: mode, size, time, name, link target.
    pub long: bool,
    /// `-h`: sizes in IEC units.
    pub human_sizes: bool,
}

impl Human {
    /// For a command that prints its outcome only.
    pub fn new() -> Self {
        Self::perf(1, Mode::Up)
    }

    /// For a perf test of `streams` per direction going `mode`.
    pub fn perf(streams: u16, mode: Mode) -> Self {
        Self {
            streams,
            mode,
            header_done: false,
            dry_run: false,
            quiet: false,
            unit: None,
            transport: None,
            intervals: false,
            data_encrypted: None,
            list_style: ListStyle::default(),
        }
    }

    /// For a perf test printed with `-f`'s unit.
    pub fn perf_in(streams: u16, mode: Mode, unit: Option<FormatUnit>) -> Self {
        Self {
            unit,
            ..Self::perf(streams, mode)
        }
    }

    /// For `ls`.
    pub fn listing(list_style: ListStyle) -> Self {
        Self {
            list_style,
            ..Self::new()
        }
    }

    /// For a transfer: `dry_run` for `cp -n`/`sync -n`; `intervals` prints a
    /// line per interval as it comes; `quiet` (`-q`) prints failures only.
    pub fn transfer(dry_run: bool, intervals: bool, quiet: bool) -> Self {
        Self {
            dry_run,
            intervals,
            quiet,
            ..Self::new()
        }
    }
}

impl Reporter for Human {
    fn setup(&mut self, s: &Setup) {
        self.perf_setup(s);
    }
    fn interval(&mut self, r: &IntervalReport) {
        self.perf_interval(r);
    }
    fn summary(&mut self, s: &Summary) {
        self.perf_summary(s);
    }
    fn warning(&mut self, message: &str) {
        if !self.quiet {
            errln!("longhaul: warning: {message}");
        }
    }
    fn status(&mut self, message: &str) {
        if !self.quiet {
            errln!("{message}");
        }
    }
    fn transfer_interval(&mut self, i: &TransferInterval) {
        if self.intervals {
            errln!("{}", transfer_interval_line(i));
        }
    }
}

impl CommandReporter for Human {
    fn transfer_summary(&mut self, s: &CopyReport) {
        if self.quiet {
            for f in &s.failed {
                errln!("longhaul: failed: {}: {}", esc(&f.path), esc(&f.error));
            }
            return;
        }
        cp::print_transfer(s, self.dry_run);
    }
    fn listing(&mut self, entries: &[ListEntry]) {
        ls::print_listing(self.list_style, entries);
    }
    fn doctor(&mut self, r: &DoctorReport) {
        // The far end's settings (host name, kernel, notes) are its words:
        // printed with no byte a terminal acts on, as `show` prints them.
        let mut v = serde_json::to_value(r).unwrap_or_default();
        printable(&mut v);
        match serde_json::from_value(v) {
            Ok(safe) => print_doctor(&safe),
            Err(e) => errln!("longhaul: cannot print the doctor's report: {e}; see --json"),
        }
    }
    fn disk(&mut self, r: &DiskReport) {
        print_disk(r);
    }
    fn identity(&mut self, fingerprint: &str) {
        outln!("{fingerprint}");
    }
    fn trusted(&mut self, host: &str, fingerprint: &str) {
        outln!("{host} {fingerprint}");
    }
    fn token_created(&mut self, token: &str) {
        outln!("{token}");
    }
    fn grants(&mut self, grants: &[Grant]) {
        serve::print_grants(grants);
    }
    fn section(&mut self, title: &str) {
        outln!("{title}");
    }
    fn wan_up(&mut self, h: &WanHosts) {
        wan::print_wan_up(h);
    }
    fn wan_down(&mut self, ab: &LinkStats, ba: &LinkStats) {
        print_wan_down(ab, ba);
    }
}

/// Every string in `v` escaped ([`longhaul_proto::units::escaped`]): a
/// report whose text came from a peer or a file, made safe to print.
pub(crate) fn printable(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::String(s) => *s = longhaul_proto::units::escaped(s).to_string(),
        Value::Array(a) => a.iter_mut().for_each(printable),
        Value::Object(m) => m.values_mut().for_each(printable),
        _ => {}
    }
}
