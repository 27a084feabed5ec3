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
    /// Payload bytes moved so far: arrived at the far end (acknowledged,
    /// for a local source), or written (a local sink).
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

/// One failed attempt that will be made again: the `attempt`-th of
/// `1 + retries` failed with `error`, and the next starts after `wait`.
#[derive(Debug, Clone)]
pub struct RetryNotice {
    pub attempt: u32,
    pub retries: u32,
    pub wait: std::time::Duration,
    pub error: String,
}

/// Where [`retrying`] tells its notices: the CLI sets it once (its one
/// wording, "retrying (1/3)", for every command); without it they go to
/// the log as warnings.
static RETRY_NOTICE: std::sync::OnceLock<fn(&RetryNotice)> = std::sync::OnceLock::new();

/// Sets where every retry is told (the first call wins).
pub fn on_retry(tell: fn(&RetryNotice)) {
    let _ = RETRY_NOTICE.set(tell);
}

/// The wait before retry `n` (1-based): 1 s, 2 s, 4 s, ... up to 32 s.
pub fn retry_wait(n: u32) -> std::time::Duration {
    std::time::Duration::from_secs(1 << n.saturating_sub(1).min(5))
}

/// Runs `attempt` (given its number, from 1) until it succeeds, fails with
/// an error `worth` retrying no more than `retries` times, or `interrupt`
/// is set; each retry is told ([`on_retry`]) and waits [`retry_wait`]
/// first (Ctrl-C ends the wait). The one retry loop of every client
/// command: cp, sync, ls, perf, doctor.
pub fn retrying<T, E: std::fmt::Display>(
    retries: u32,
    interrupt: &std::sync::atomic::AtomicBool,
    worth: impl Fn(&E) -> bool,
    mut attempt: impl FnMut(u32) -> Result<T, E>,
) -> Result<T, E> {
    use std::sync::atomic::Ordering;
    let mut n = 0;
    loop {
        n += 1;
        let e = match attempt(n) {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        if n > retries || !worth(&e) || interrupt.load(Ordering::Relaxed) {
            return Err(e);
        }
        let notice = RetryNotice {
            attempt: n,
            retries,
            wait: retry_wait(n),
            error: e.to_string(),
        };
        match RETRY_NOTICE.get() {
            Some(tell) => tell(&notice),
            None => tracing::warn!(
                "{}; retrying ({n}/{retries}) in {} s",
                notice.error,
                notice.wait.as_secs()
            ),
        }
        let until = std::time::Instant::now() + notice.wait;
        while std::time::Instant::now() < until {
            if interrupt.load(Ordering::Relaxed) {
                return Err(e);
            }
            std::thread::sleep(
                until
                    .saturating_duration_since(std::time::Instant::now())
                    .min(std::time::Duration::from_millis(100)),
            );
        }
    }
}
