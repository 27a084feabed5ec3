//! [`Archived`]: a printer with the archive beside it. Every event goes to
//! the printer first (what the person or program reading sees), then to
//! the run's [`ArchiveReporter`]. When the run ends, what the archive
//! could not keep (a full disk) is said on stderr; the command's outcome
//! does not change.

use longhaul_archive::reporter::ArchiveReporter;
use longhaul_engine::doctor::DoctorReport;
use longhaul_engine::report::{Reporter, TransferProgress};
use longhaul_engine::results::{CommandReporter, WanHosts};
use longhaul_engine::server::auth::Grant;
use longhaul_engine::wan::LinkStats;
use longhaul_proto::disk::DiskReport;
use longhaul_proto::report::{IntervalReport, Setup, Summary};
use longhaul_proto::tune::TransferInterval;
use longhaul_proto::xfer::report::CopyReport;
use longhaul_proto::xfer::ListEntry;

use super::Printer;

/// A printer, and the archive's reporter for this run.
pub struct Archived {
    pub printer: Printer,
    pub archive: ArchiveReporter,
    /// A success that is not a plain one (6: partial, 130: interrupted).
    code: i32,
}

impl Archived {
    pub fn new(printer: Printer, archive: ArchiveReporter) -> Archived {
        Archived {
            printer,
            archive,
            code: 0,
        }
    }
}

impl Reporter for Archived {
    fn setup(&mut self, s: &Setup) {
        self.printer.setup(s);
        self.archive.setup(s);
    }
    fn interval(&mut self, r: &IntervalReport) {
        self.printer.interval(r);
        self.archive.interval(r);
    }
    fn summary(&mut self, s: &Summary) {
        self.printer.summary(s);
        self.archive.summary(s);
    }
    fn warning(&mut self, m: &str) {
        self.printer.warning(m);
        self.archive.warning(m);
    }
    fn status(&mut self, m: &str) {
        self.printer.status(m);
    }
    fn transfer_progress(&mut self, p: &TransferProgress) {
        self.printer.transfer_progress(p);
        self.archive.transfer_progress(p);
    }
    fn transfer_interval(&mut self, i: &TransferInterval) {
        self.printer.transfer_interval(i);
        self.archive.transfer_interval(i);
    }
    fn end(&mut self, failure: Option<(&str, i32)>) {
        self.printer.end(failure);
        // A success with another code ended the run all the same.
        let interrupted = ("interrupted", self.code);
        let failure = failure.or((self.code == 130).then_some(interrupted));
        self.archive.end(failure);
        if let Some(loss) = self.archive.loss().filter(|l| l.rows > 0) {
            crate::errln!(
                "longhaul: warning: the archive {} kept this run without {} of its rows{}",
                self.archive.path().display(),
                loss.rows,
                loss.error
                    .as_ref()
                    .map(|e| format!(" ({e}); free space there, or use --archive elsewhere"))
                    .unwrap_or_default()
            );
        }
    }
}

impl CommandReporter for Archived {
    fn exit_code(&mut self, code: i32) {
        self.code = code;
        self.printer.exit_code(code);
    }
    fn transfer_summary(&mut self, s: &CopyReport) {
        self.printer.transfer_summary(s);
        self.archive.transfer_summary(s);
    }
    fn listing(&mut self, e: &[ListEntry]) {
        self.printer.listing(e);
    }
    fn doctor(&mut self, r: &DoctorReport) {
        self.printer.doctor(r);
        self.archive.doctor(r);
    }
    fn disk(&mut self, r: &DiskReport) {
        self.printer.disk(r);
        self.archive.disk(r);
    }
    fn identity(&mut self, f: &str) {
        self.printer.identity(f);
    }
    fn trusted(&mut self, h: &str, f: &str) {
        self.printer.trusted(h, f);
    }
    fn token_created(&mut self, t: &str) {
        self.printer.token_created(t);
    }
    fn grants(&mut self, g: &[Grant]) {
        self.printer.grants(g);
    }
    fn section(&mut self, t: &str) {
        self.printer.section(t);
    }
    fn wan_up(&mut self, h: &WanHosts) {
        self.printer.wan_up(h);
    }
    fn wan_down(&mut self, a: &LinkStats, b: &LinkStats) {
        self.printer.wan_down(a, b);
    }
}
