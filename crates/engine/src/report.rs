//! Where every command reports. Whatever a command has to say (a perf
//! test's setup, intervals and summary; a transfer's progress, intervals
//! and outcome; a listing; the doctor's findings; a disk benchmark; an
//! emulated WAN coming up and down) goes to a [`Reporter`]. The human
//! printer, the progress bar, `--json`, `--json-stream`, the third-party
//! relay and (later) the results archive and the dashboard implement it;
//! the engine formats nothing for humans.
//!
//! Every method has an empty default: a reporter takes the events it
//! cares about and ignores the others.

use longhaul_proto::msg::Relay;
use longhaul_proto::report::{IntervalReport, Setup, Summary};
use longhaul_proto::tune::TransferInterval;

/// Receives the events of a command as they happen, then its end. What
/// a command found when it is done (a transfer's outcome, the doctor's
/// report, ...) goes to the same reporter through its extension
/// [`crate::results::CommandReporter`], on the top floor beside the
/// commands whose results it names.
pub trait Reporter {
    /// perf: the test as set up (parameters, both ends' sockets).
    fn setup(&mut self, _setup: &Setup) {}
    /// perf: one interval of the test, every stream and direction.
    fn interval(&mut self, _report: &IntervalReport) {}
    /// perf: the whole test.
    fn summary(&mut self, _summary: &Summary) {}
    /// A condition worth knowing that does not stop the command (a socket
    /// buffer capped by the kernel, a file changed while it was read).
    fn warning(&mut self, _message: &str) {}
    /// What the command is doing now, for a person watching ("measuring
    /// the path to ..."); not part of any result.
    fn status(&mut self, _message: &str) {}

    /// cp, sync: the transfer's counters, sampled while it runs (every
    /// [`PROGRESS_TICK`]) and once when it ends.
    fn transfer_progress(&mut self, _progress: &TransferProgress) {}
    /// cp, sync: one interval of the sending side (rate, streams carrying
    /// chunks, what limited it), in order, as it arrives.
    fn transfer_interval(&mut self, _interval: &TransferInterval) {}
    /// The command has ended: `None` when it succeeded, or the message
    /// and exit code of the failure that ended it. Called once, last; a
    /// reporter that collects (`--json`) writes its document here.
    fn end(&mut self, _failure: Option<(&str, i32)>) {}
}

/// How often a transfer's counters are sampled for its reporter.
pub const PROGRESS_TICK: std::time::Duration = std::time::Duration::from_millis(200);

/// A transfer's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TransferProgress {
    /// Payload bytes moved so far (sent by a local source, written by a
    /// local sink).
    pub bytes: u64,
    /// Files finished so far.
    pub files: u64,
    /// What the source has announced so far (grows while it walks).
    pub announced_bytes: u64,
    pub announced_files: u64,
    /// True once the source has announced everything.
    pub walk_done: bool,
}

/// A reporter that keeps nothing.
pub struct Discard;

impl Reporter for Discard {}

/// Turns reporter calls into relay messages, for a server that runs a
/// third-party test on a requester's behalf.
pub struct RelaySink<F: FnMut(Relay)>(pub F);

impl<F: FnMut(Relay)> Reporter for RelaySink<F> {
    fn setup(&mut self, setup: &Setup) {
        (self.0)(Relay::Start(Box::new(setup.clone())));
    }
    fn interval(&mut self, report: &IntervalReport) {
        (self.0)(Relay::Interval(report.clone()));
    }
    fn summary(&mut self, summary: &Summary) {
        (self.0)(Relay::Summary(Box::new(summary.clone())));
    }
    fn warning(&mut self, message: &str) {
        (self.0)(Relay::Warning {
            message: message.to_string(),
        });
    }
}
