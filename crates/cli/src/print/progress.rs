//! A transfer's progress bar on a terminal: drawn from the counters the
//! engine reports on its tick, cleared before the outcome is printed;
//! with `--progress` off a terminal, a line a second instead.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use longhaul_engine::doctor::DoctorReport;
use longhaul_engine::report::{Reporter, TransferProgress};
use longhaul_engine::results::{CommandReporter, WanHosts};
use longhaul_engine::wan::LinkStats;
use longhaul_proto::disk::DiskReport;
use longhaul_proto::report::{IntervalReport, Setup, Summary};
use longhaul_proto::tune::TransferInterval;
use longhaul_proto::units::{format_bytes, format_rate};
use longhaul_proto::xfer::report::CopyReport;
use longhaul_proto::xfer::ListEntry;

use super::Printer;

/// Draws the bar, and hands every event on to the printer it wraps.
pub struct Bar {
    /// At a terminal: the bar drawn in place. None: a line a second
    /// (`--progress` into a log or a pipe).
    bar: Option<indicatif::ProgressBar>,
    /// The rate, measured over the last seconds of the counters.
    rate: Rate,
    /// When the last line went to a log.
    line_at: Option<Instant>,
    /// Streams carrying chunks and what limited them, from the last interval.
    limit: String,
    inner: Printer,
}

/// How far back the bar's rate looks: long enough to smooth a second's
/// bursts, short enough to follow a change of pace.
const RATE_WINDOW: Duration = Duration::from_secs(5);
/// A line at most this often into a log (`--progress` off a terminal).
const LINE_EVERY: Duration = Duration::from_secs(1);

/// A transfer's rate from its own counters: bytes moved over the time
/// they took, the last [`RATE_WINDOW`] of it. The counters are what has
/// reached the far end, so no socket buffer filled at the start counts
/// as moved.
#[derive(Default)]
struct Rate {
    seen: VecDeque<(Instant, u64)>,
}

impl Rate {
    /// Takes the counter at `now`; the rate, bits/s, once the points span
    /// half a second.
    fn update(&mut self, now: Instant, bytes: u64) -> Option<f64> {
        self.seen.push_back((now, bytes));
        while self
            .seen
            .get(1)
            .is_some_and(|&(t, _)| now.duration_since(t) >= RATE_WINDOW)
        {
            self.seen.pop_front();
        }
        let (t0, b0) = *self.seen.front()?;
        let span = now.duration_since(t0).as_secs_f64();
        (span >= 0.5).then(|| bytes.saturating_sub(b0) as f64 * 8.0 / span)
    }
}

/// What is left, in words: the time at the rate, `finishing` once every
/// byte is at the far end (which writes, syncs and renames the last
/// files), `?` while the total or the rate is not known.
fn eta(p: &TransferProgress, bps: Option<f64>) -> String {
    let left = p.announced_bytes.saturating_sub(p.bytes);
    match bps {
        _ if !p.walk_done => "ETA ?".into(),
        _ if left == 0 => "finishing".into(),
        Some(r) if r > 0.0 => format!("ETA {} s", (left as f64 * 8.0 / r).ceil() as u64),
        _ => "ETA ?".into(),
    }
}

/// The bar's words: done of total, the rate, what is left, the files.
fn status(p: &TransferProgress, bps: Option<f64>, limit: &str) -> String {
    let more = if p.walk_done { "" } else { "+" };
    format!(
        "{}/{}{more} {} {} {}/{}{more} files{limit}",
        format_bytes(p.bytes),
        format_bytes(p.announced_bytes),
        bps.map_or_else(|| "-".to_string(), format_rate),
        eta(p, bps),
        p.files,
        p.announced_files,
    )
}

impl Bar {
    /// The bar over `inner`: drawn in place on a `terminal`, else (with
    /// `--progress`) as a line a second.
    pub fn new(inner: Printer, terminal: bool) -> Self {
        let bar = terminal.then(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        Self {
            bar,
            rate: Rate::default(),
            line_at: None,
            limit: String::new(),
            inner,
        }
    }

    /// A line for a log, at most one a [`LINE_EVERY`]: the share done,
    /// then the bar's words; none before the first file is announced.
    fn line(&mut self, now: Instant, p: &TransferProgress, words: &str) {
        let nothing_yet = p.announced_files == 0 && !p.walk_done;
        if nothing_yet
            || self
                .line_at
                .is_some_and(|t| now.duration_since(t) < LINE_EVERY)
        {
            return;
        }
        self.line_at = Some(now);
        let share = match p.announced_bytes {
            0 => 0,
            all => p.bytes.min(all) * 100 / all,
        };
        crate::errln!("{share:>3}% {words}");
    }

    /// Runs `f` with the bar off the screen, so that its line stays whole.
    fn aside(&mut self, f: impl FnOnce(&mut Printer)) {
        match &self.bar {
            Some(bar) => bar.suspend(|| f(&mut self.inner)),
            None => f(&mut self.inner),
        }
    }

    fn clear(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Reporter for Bar {
    fn transfer_progress(&mut self, p: &TransferProgress) {
        let now = Instant::now();
        let bps = self.rate.update(now, p.bytes);
        let words = status(p, bps, &self.limit);
        match &self.bar {
            Some(bar) => {
                bar.set_length(p.announced_bytes);
                bar.set_position(p.bytes);
                bar.set_message(words);
            }
            None => self.line(now, p, &words),
        }
        self.inner.transfer_progress(p);
    }
    fn transfer_interval(&mut self, i: &TransferInterval) {
        self.limit = format!(
            ", {} stream(s), limited by {}",
            i.active_streams,
            i.limit.label()
        );
        self.inner.transfer_interval(i);
    }
    fn end(&mut self, failure: Option<(&str, i32)>) {
        self.clear();
        self.inner.end(failure);
    }
    fn setup(&mut self, s: &Setup) {
        self.inner.setup(s);
    }
    fn interval(&mut self, r: &IntervalReport) {
        self.inner.interval(r);
    }
    fn summary(&mut self, s: &Summary) {
        self.inner.summary(s);
    }
    fn warning(&mut self, m: &str) {
        self.aside(|p| p.warning(m));
    }
    fn status(&mut self, m: &str) {
        self.aside(|p| p.status(m));
    }
}

impl CommandReporter for Bar {
    fn transfer_summary(&mut self, s: &CopyReport) {
        self.clear();
        self.inner.transfer_summary(s);
    }
    fn listing(&mut self, e: &[ListEntry]) {
        self.inner.listing(e);
    }
    fn doctor(&mut self, r: &DoctorReport) {
        self.inner.doctor(r);
    }
    fn disk(&mut self, r: &DiskReport) {
        self.inner.disk(r);
    }
    fn identity(&mut self, f: &str) {
        self.inner.identity(f);
    }
    fn trusted(&mut self, h: &str, f: &str) {
        self.inner.trusted(h, f);
    }
    fn token_created(&mut self, t: &str) {
        self.inner.token_created(t);
    }
    fn grants(&mut self, g: &[longhaul_engine::server::auth::Grant]) {
        self.inner.grants(g);
    }
    fn section(&mut self, t: &str) {
        self.aside(|p| p.section(t));
    }
    fn wan_up(&mut self, h: &WanHosts) {
        self.inner.wan_up(h);
    }
    fn wan_down(&mut self, ab: &LinkStats, ba: &LinkStats) {
        self.inner.wan_down(ab, ba);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(p: &TransferProgress) -> String {
        status(p, Some(80e6), "")
    }

    /// The time left is what the rate takes for the bytes left; once all
    /// of them are at the far end, the bar says it finishes, not "0 s".
    #[test]
    fn the_time_left_follows_the_rate_and_ends_in_finishing() {
        let p = TransferProgress {
            bytes: 10 << 20,
            files: 0,
            announced_bytes: 110 << 20,
            announced_files: 1,
            walk_done: true,
        };
        // 100 MiB left at 10 MB/s.
        assert!(at(&p).contains("ETA 11 s"), "{}", at(&p));
        let done = TransferProgress {
            bytes: 110 << 20,
            ..p.clone()
        };
        assert!(at(&done).contains("finishing"), "{}", at(&done));
        let walking = TransferProgress {
            walk_done: false,
            ..p
        };
        assert!(at(&walking).contains("ETA ?"), "{}", at(&walking));
    }

    /// The rate is the counter's over the window: a burst long past
    /// falls out of it.
    #[test]
    fn the_rate_is_the_last_seconds_of_the_counter() {
        let mut r = Rate::default();
        let t0 = Instant::now();
        assert_eq!(r.update(t0, 0), None);
        // 100 MB in the first second, then 1 MB a second for ten.
        let mut bytes = 100_000_000u64;
        let mut last = r.update(t0 + Duration::from_secs(1), bytes);
        for s in 2..=11 {
            bytes += 1_000_000;
            last = r.update(t0 + Duration::from_secs(s), bytes);
        }
        let bps = last.expect("a rate");
        assert!((7.9e6..=8.1e6).contains(&bps), "{bps}");
    }
}
