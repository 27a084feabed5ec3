//! Where the engine reports. Printers, `--json`, `--json-stream`, the
//! third-party relay and (later) the archive implement [`Reporter`]; the
//! engine formats nothing for humans.

use longhaul_proto::msg::Relay;
use longhaul_proto::report::{IntervalReport, Setup, Summary};

/// Receives the events of a test as they happen.
pub trait Reporter {
    fn setup(&mut self, _setup: &Setup) {}
    fn interval(&mut self, _report: &IntervalReport) {}
    fn summary(&mut self, _summary: &Summary) {}
    fn warning(&mut self, _message: &str) {}
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
