//! What a transfer under way shows: a progress bar on a terminal, or a
//! line per interval (`cp --intervals`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::human;

/// Draws a progress bar from the engine's counters until told to stop.
pub fn progress_bar(
    p: std::sync::Arc<longhaul_engine::xfer::Progress>,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let done = Arc::new(AtomicBool::new(false));
    let stop = done.clone();
    let t = std::thread::spawn(move || {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        while !stop.load(Ordering::SeqCst) {
            bar.set_length(p.announced_bytes.load(Ordering::Relaxed));
            bar.set_position(p.bytes.load(Ordering::Relaxed));
            let walking = if p.walk_done.load(Ordering::Relaxed) {
                ""
            } else {
                "+"
            };
            let limit = p
                .intervals
                .lock()
                .ok()
                .and_then(|i| i.last().cloned())
                .map(|i| {
                    format!(
                        ", {} stream(s), limited by {}",
                        i.active_streams,
                        i.limit.name()
                    )
                })
                .unwrap_or_default();
            bar.set_message(format!(
                "{}/{}{walking} files{limit}",
                p.files.load(Ordering::Relaxed),
                p.announced_files.load(Ordering::Relaxed)
            ));
            std::thread::sleep(Duration::from_millis(200));
        }
        bar.finish_and_clear();
    });
    (done, t)
}

/// Prints each interval of a transfer as it arrives (`cp --intervals`), to stderr.
pub fn interval_printer(
    p: std::sync::Arc<longhaul_engine::xfer::Progress>,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let done = Arc::new(AtomicBool::new(false));
    let stop = done.clone();
    let t = std::thread::spawn(move || {
        let mut shown = 0;
        loop {
            let finished = stop.load(Ordering::SeqCst);
            let new: Vec<_> = p
                .intervals
                .lock()
                .map(|i| i[shown.min(i.len())..].to_vec())
                .unwrap_or_default();
            for i in &new {
                errln!("{}", human::transfer_interval_line(i));
            }
            shown += new.len();
            if finished {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    (done, t)
}
