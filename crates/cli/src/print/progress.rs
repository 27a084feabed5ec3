//! A transfer's progress bar on a terminal: drawn from the counters the
//! engine reports on its tick, cleared before the outcome is printed.

use longhaul_engine::doctor::DoctorReport;
use longhaul_engine::report::{Reporter, TransferProgress};
use longhaul_engine::results::{CommandReporter, WanHosts};
use longhaul_engine::wan::LinkStats;
use longhaul_engine::xfer::client::CpSummary;
use longhaul_proto::disk::DiskReport;
use longhaul_proto::report::{IntervalReport, Setup, Summary};
use longhaul_proto::tune::TransferInterval;
use longhaul_proto::xfer::ListEntry;

use super::Printer;

/// Draws the bar, and hands every event on to the printer it wraps.
pub struct Bar {
    bar: indicatif::ProgressBar,
    /// Streams carrying chunks and what limited them, from the last interval.
    limit: String,
    inner: Printer,
}

/// `--progress` where stderr is no terminal (a log, a pipe): each draw
/// of the bar a line of its own, once a second, with no cursor movement.
#[derive(Debug)]
struct Lines;

impl indicatif::TermLike for Lines {
    fn width(&self) -> u16 {
        100
    }
    fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.write_str(s)
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        if !s.trim().is_empty() {
            crate::errln!("{}", s.trim_end());
        }
        Ok(())
    }
    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Bar {
    /// The bar over `inner`: drawn in place on a `terminal`, else (with
    /// `--progress`) as a line a second.
    pub fn new(inner: Printer, terminal: bool) -> Self {
        let bar = if terminal {
            indicatif::ProgressBar::new(0)
        } else {
            indicatif::ProgressBar::with_draw_target(
                Some(0),
                indicatif::ProgressDrawTarget::term_like_with_hz(Box::new(Lines), 1),
            )
        };
        bar.set_style(
            // Sizes in IEC units, the rate in bit/s: as every summary prints them.
            indicatif::ProgressStyle::with_template(
                "{bar:30} {binary_bytes}/{binary_total_bytes} {bit_rate} ETA {eta} {msg}",
            )
            .map(|style| {
                style.with_key(
                    "bit_rate",
                    |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = w.write_str(&longhaul_proto::units::format_rate(s.per_sec() * 8.0));
                    },
                )
            })
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Self {
            bar,
            limit: String::new(),
            inner,
        }
    }
}

impl Reporter for Bar {
    fn transfer_progress(&mut self, p: &TransferProgress) {
        self.bar.set_length(p.announced_bytes);
        self.bar.set_position(p.bytes);
        let walking = if p.walk_done { "" } else { "+" };
        self.bar.set_message(format!(
            "{}/{}{walking} files{}",
            p.files, p.announced_files, self.limit
        ));
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
        self.bar.finish_and_clear();
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
        self.bar.suspend(|| self.inner.warning(m));
    }
    fn status(&mut self, m: &str) {
        self.bar.suspend(|| self.inner.status(m));
    }
}

impl CommandReporter for Bar {
    fn transfer_summary(&mut self, s: &CpSummary) {
        self.bar.finish_and_clear();
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
        self.bar.suspend(|| self.inner.section(t));
    }
    fn wan_up(&mut self, h: &WanHosts) {
        self.inner.wan_up(h);
    }
    fn wan_down(&mut self, ab: &LinkStats, ba: &LinkStats) {
        self.inner.wan_down(ab, ba);
    }
}
