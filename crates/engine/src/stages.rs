//! Where a copy's CPU goes: each data thread's CPU time, split by stage
//! (read, hash, encrypt, send at a source; receive, decrypt, verify,
//! write at a sink), read from the thread's own CPU clock.
//!
//! A thread opts in with [`count_into`]; then [`timed`] credits the
//! thread's CPU while a closure runs to its stage. Stages nest (a socket
//! read that decrypts runs `decrypt` inside `receive`): each instant goes
//! to the innermost stage running, so the stages add up to the thread's
//! CPU without counting anything twice, and what runs outside every stage
//! is `other`. Two clock reads a stage; on a thread that did not opt in,
//! `timed` only runs the closure. On the bottom floor: the CPU clocks
//! every module reads are here.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use longhaul_proto::xfer::StageCpu;

/// A stage of a copy's data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Read,
    Hash,
    Encrypt,
    Send,
    Receive,
    Decrypt,
    Verify,
    Write,
}

/// Slots: the stages, then `other`.
const SLOTS: usize = 9;
const OTHER: usize = 8;
/// Deepest nesting kept (deeper stages count to the one below).
const DEPTH: usize = 4;

/// The CPU nanoseconds of one end's counted threads, by stage.
#[derive(Debug, Default)]
pub struct StageTotals([AtomicU64; SLOTS]);

impl StageTotals {
    pub fn new() -> Arc<StageTotals> {
        Arc::new(StageTotals::default())
    }

    /// What the counted threads have spent so far, in seconds (a thread's
    /// time since its last stage change is not in yet).
    pub fn report(&self) -> StageCpu {
        let s = |i: usize| self.0[i].load(Ordering::Relaxed) as f64 / 1e9;
        StageCpu {
            read: s(Stage::Read as usize),
            hash: s(Stage::Hash as usize),
            encrypt: s(Stage::Encrypt as usize),
            send: s(Stage::Send as usize),
            receive: s(Stage::Receive as usize),
            decrypt: s(Stage::Decrypt as usize),
            verify: s(Stage::Verify as usize),
            write: s(Stage::Write as usize),
            other: s(OTHER),
        }
    }
}

/// This thread's counting: where its totals go, the stages running
/// (innermost last), and the clock when the innermost began.
struct Counting {
    totals: Arc<StageTotals>,
    stack: [usize; DEPTH],
    depth: usize,
    mark: u64,
}

impl Counting {
    /// Credits the time since the last mark to the stage running.
    fn credit(&mut self) {
        let now = thread_cpu_ns();
        let slot = match self.depth {
            0 => OTHER,
            d => self.stack[d.min(DEPTH) - 1],
        };
        self.totals.0[slot].fetch_add(now.saturating_sub(self.mark), Ordering::Relaxed);
        self.mark = now;
    }
}

thread_local! {
    static COUNTING: RefCell<Option<Counting>> = const { RefCell::new(None) };
}

/// Whether stages are counted: `LONGHAUL_STAGE_CPU=off` turns it off, to
/// measure what the counting itself costs (the same copy with and without it).
fn counting_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("LONGHAUL_STAGE_CPU").is_none_or(|v| v != "off"))
}

/// Counts this thread's CPU into `totals` until the returned guard drops.
#[must_use = "counting stops when the guard drops"]
pub fn count_into(totals: &Arc<StageTotals>) -> Counted {
    if !counting_on() {
        return Counted(());
    }
    COUNTING.with_borrow_mut(|c| {
        *c = Some(Counting {
            totals: totals.clone(),
            stack: [OTHER; DEPTH],
            depth: 0,
            mark: thread_cpu_ns(),
        })
    });
    Counted(())
}

/// Ends this thread's counting when dropped.
pub struct Counted(());

impl Drop for Counted {
    fn drop(&mut self) {
        COUNTING.with_borrow_mut(|c| {
            if let Some(c) = c.as_mut() {
                c.credit();
            }
            *c = None;
        });
    }
}

/// Runs `f`, crediting this thread's CPU meanwhile to `stage` (less any
/// stage timed inside it).
pub fn timed<T>(stage: Stage, f: impl FnOnce() -> T) -> T {
    let counting = COUNTING.with_borrow_mut(|c| match c.as_mut() {
        Some(c) => {
            c.credit();
            if c.depth < DEPTH {
                c.stack[c.depth] = stage as usize;
            }
            c.depth += 1;
            true
        }
        None => false,
    });
    let out = f();
    if counting {
        COUNTING.with_borrow_mut(|c| {
            if let Some(c) = c.as_mut() {
                c.credit();
                c.depth -= 1;
            }
        });
    }
    out
}

/// CPU time (user + system) of the calling thread, nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

/// A clock's time, nanoseconds (`clock_gettime`).
pub fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is writable.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    (r == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin(ms: u64) {
        let start = thread_cpu_ns();
        let mut x = 0u64;
        while thread_cpu_ns() - start < ms * 1_000_000 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    #[test]
    fn nested_stages_count_each_instant_once_in_the_innermost() {
        let totals = StageTotals::new();
        let t = totals.clone();
        std::thread::spawn(move || {
            let _c = count_into(&t);
            timed(Stage::Receive, || {
                spin(30);
                timed(Stage::Decrypt, || spin(60));
            });
            spin(20);
        })
        .join()
        .unwrap();
        let r = totals.report();
        // CPU clocks on a busy machine: each stage got at least what it
        // spun, and nothing went where nothing ran.
        assert!(r.receive >= 0.030 && r.receive < 0.060, "{r:?}");
        assert!(r.decrypt >= 0.060, "{r:?}");
        assert!(r.other >= 0.020, "{r:?}");
        assert_eq!(
            r.read + r.hash + r.encrypt + r.send + r.verify + r.write,
            0.0
        );
        assert!(r.total() >= 0.110);
    }

    #[test]
    fn a_thread_that_did_not_opt_in_counts_nothing() {
        let totals = StageTotals::new();
        let v = timed(Stage::Write, || 7);
        assert_eq!(v, 7);
        assert_eq!(totals.report().total(), 0.0);
    }
}
