//! One side of a running test: its stream workers, the clock of the test,
//! and snapshots of everything they count. Client and server run the same
//! code; only who sends differs.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::msg::{Direction, TestParams, Transport};
use longhaul_proto::report::{SideSnapshot, StreamSample};
use longhaul_proto::udp;

use crate::net::sock;
use crate::perf::workers::{self, Counters, DataSocket, Plan};
use crate::EngineError;

/// Which end of the test this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Client,
    Server,
}

impl End {
    pub fn sends(self, d: Direction) -> bool {
        matches!(
            (self, d),
            (End::Client, Direction::Up) | (End::Server, Direction::Down)
        )
    }
}

/// A data stream ready to run.
pub struct ReadyStream {
    pub direction: Direction,
    pub stream: u16,
    pub socket: DataSocket,
    /// The TLS layer over `socket`, which then carries the data; None in
    /// plaintext (and for UDP).
    pub io: Option<Box<dyn crate::net::conn::Stream>>,
}

struct Worker {
    direction: Direction,
    stream: u16,
    send: bool,
    /// TLS runs over `socket`: its write side is not ours to shut.
    tls: bool,
    socket: DataSocket,
    counters: Arc<Counters>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A running side of a test.
pub struct SideRun {
    pub start: Instant,
    workers: Vec<Worker>,
    stop: Arc<AtomicBool>,
    control_cpu_base: u64,
    transport: Transport,
    /// The planned end (after any omitted time) of a time-bound test.
    until: Option<Instant>,
    ending: Ending,
}

/// How far [`SideRun::end_on_time`] has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Running,
    /// The senders' write sides are shut; whatever still runs at the
    /// instant is stopped.
    SendersShut(Instant),
    Stopped,
}

/// The least a stream may run past the test's planned end, besides two
/// round trips of its path: time for a busy host's threads to see the end.
const END_GRACE: Duration = Duration::from_millis(500);

impl SideRun {
    /// Starts one worker per stream, now.
    pub fn start(
        end: End,
        params: &TestParams,
        streams: Vec<ReadyStream>,
        cpu: Option<u32>,
        token: &str,
        active: Option<Arc<std::sync::atomic::AtomicU16>>,
    ) -> Result<SideRun, EngineError> {
        let start = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let until = params
            .duration_ms
            .map(|d| start + Duration::from_millis(d + params.omit_ms));
        let per_stream_bytes = |i: u16| {
            params.bytes.map(|b| {
                let n = u64::from(params.streams);
                b / n + u64::from(u64::from(i) < b % n)
            })
        };
        let udp_rate = params
            .udp_rate_bps
            .map(|r| r / 8 / u64::from(params.streams.max(1)));
        let mut workers = Vec::with_capacity(streams.len());
        for s in streams {
            let send = end.sends(s.direction);
            let counters = Arc::new(Counters::default());
            let plan = Plan {
                direction: s.direction,
                stream: s.stream,
                send,
                length: params.length as usize,
                until,
                bytes: per_stream_bytes(s.stream),
                send_mode: params.send_mode,
                recv_mode: params.recv_mode,
                cpu,
                udp_rate,
                udp_tag: udp::tag_of(token),
                stop: stop.clone(),
                epoch: start,
                active: active.clone().filter(|_| send),
            };
            let tls = s.io.is_some();
            let thread = workers::spawn(plan, s.socket.clone(), s.io, counters.clone())
                .map_err(|e| EngineError::io("failed to start a stream thread".into(), e))?;
            workers.push(Worker {
                direction: s.direction,
                stream: s.stream,
                send,
                tls,
                socket: s.socket,
                counters,
                thread: Some(thread),
            });
        }
        Ok(SideRun {
            start,
            workers,
            stop,
            control_cpu_base: sock::thread_cpu_us(),
            transport: params.transport,
            until,
            ending: Ending::Running,
        })
    }

    /// Ends a time-bound run on time, whatever its streams wait in; the
    /// control thread calls it as it goes round. At the planned end it
    /// shuts the write side of every plaintext TCP stream still sending:
    /// a write blocked on a full socket buffer (the path or the receiver
    /// slower than the sender) returns, and the stream ends with the bytes
    /// it had handed over. Two round trips and [`END_GRACE`] later, a TCP
    /// test's streams still running are stopped: a receiver still taking
    /// what a sender had queued before its end, a sender waiting for its
    /// peer to close. The bytes queued then are not the test's, as at
    /// iperf3's `TEST_END`.
    pub fn end_on_time(&mut self, now: Instant) {
        let Some(until) = self.until else { return };
        match self.ending {
            Ending::Running if now >= until => {
                for w in &self.workers {
                    if let (DataSocket::Tcp(s), true, false) = (&w.socket, w.send, w.tls) {
                        if !w.counters.done.load(Ordering::Acquire) {
                            let _ = s.shutdown(std::net::Shutdown::Write);
                        }
                    }
                }
                self.ending = Ending::SendersShut(until + self.grace());
            }
            Ending::SendersShut(at) if now >= at => {
                if self.transport == Transport::Tcp && !self.finished() {
                    self.stop();
                }
                self.ending = Ending::Stopped;
            }
            _ => {}
        }
    }

    /// How long past the planned end the streams may run: the far end's
    /// clock started up to a one-way delay after this one, and its last
    /// bytes cross the path once more.
    fn grace(&self) -> Duration {
        let rtt_us = self
            .workers
            .iter()
            .filter_map(|w| match &w.socket {
                DataSocket::Tcp(s) => sock::tcp_info(s.as_fd()),
                _ => None,
            })
            .map(|i| i.min_rtt_us)
            .filter(|&r| r != u32::MAX)
            .max()
            .unwrap_or(0);
        END_GRACE + Duration::from_micros(u64::from(rtt_us).min(5_000_000)) * 2
    }

    /// Counters of every stream now, cumulative since start. Call it from
    /// the control thread that started the run (its CPU time counts).
    pub fn snapshot(&self) -> SideSnapshot {
        let mut cpu_us = sock::thread_cpu_us().saturating_sub(self.control_cpu_base);
        let mut streams = Vec::with_capacity(self.workers.len());
        for w in &self.workers {
            cpu_us += w.counters.cpu_us();
            let tcp = match (&w.socket, w.send) {
                (DataSocket::Tcp(s), true) => sock::tcp_info(s.as_fd()),
                _ => None,
            };
            let (packets_sent, udp) = match self.transport {
                Transport::Udp if w.send => {
                    (Some(w.counters.packets_sent.load(Ordering::Relaxed)), None)
                }
                Transport::Udp => (None, Some(*w.counters.udp.lock().expect("poisoned"))),
                Transport::Tcp => (None, None),
            };
            streams.push(StreamSample {
                direction: w.direction,
                stream: w.stream,
                bytes: w.counters.bytes.load(Ordering::Relaxed),
                packets_sent,
                tcp,
                udp,
                cpu_us: w.counters.cpu_us(),
            });
        }
        // Once every worker has moved its last byte, the test ended
        // then, not when this thread noticed, nor when the workers' threads
        // end (a sender waits for its peer's close).
        let elapsed_us = match self.last_byte_us() {
            Some(e) if e > 0 => e,
            _ => self.start.elapsed().as_micros() as u64,
        };
        SideSnapshot {
            elapsed_us,
            cpu_us,
            streams,
        }
    }

    /// When the last byte of the run moved, microseconds after its start,
    /// once every worker has moved its last (0: none moved any).
    fn last_byte_us(&self) -> Option<u64> {
        let mut last = 0;
        for w in &self.workers {
            let end = w.counters.end_us.load(Ordering::Relaxed);
            if end == 0 && !w.counters.done.load(Ordering::Acquire) {
                return None;
            }
            last = last.max(end);
        }
        Some(last)
    }

    /// True once every worker has ended.
    pub fn finished(&self) -> bool {
        self.workers
            .iter()
            .all(|w| w.counters.done.load(Ordering::Acquire))
    }

    /// The first error a worker hit, if any.
    pub fn error(&self) -> Option<String> {
        self.workers
            .iter()
            .find_map(|w| w.counters.error.lock().expect("poisoned").clone())
    }

    /// Asks every worker to stop now.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        for w in &self.workers {
            if let DataSocket::Tcp(s) = &w.socket {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// Waits for the workers to end.
    pub fn join(&mut self) {
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for SideRun {
    fn drop(&mut self) {
        if !self.finished() {
            self.stop();
        }
        self.join();
    }
}

/// When interval samples and the end-of-omit baseline are due.
#[derive(Debug)]
pub struct Ticker {
    start: Instant,
    interval: Option<Duration>,
    omit: Duration,
    next_index: u32,
    baseline_taken: bool,
}

/// A sample that is due.
#[derive(Debug, PartialEq, Eq)]
pub enum Tick {
    Interval { index: u32, omitted: bool },
    Baseline,
}

impl Ticker {
    pub fn new(start: Instant, params: &TestParams) -> Self {
        Self {
            start,
            interval: (params.interval_ms > 0).then(|| Duration::from_millis(params.interval_ms)),
            omit: Duration::from_millis(params.omit_ms),
            next_index: 0,
            baseline_taken: params.omit_ms == 0,
        }
    }

    /// The next moment a sample is due.
    pub fn next_due(&self) -> Option<Instant> {
        let i = self
            .interval
            .map(|iv| self.start + iv * (self.next_index + 1));
        let b = (!self.baseline_taken).then(|| self.start + self.omit);
        match (i, b) {
            (Some(i), Some(b)) => Some(i.min(b)),
            (i, b) => i.or(b),
        }
    }

    /// Samples due at `now`, in time order.
    pub fn due(&mut self, now: Instant) -> Vec<Tick> {
        let mut out = Vec::new();
        loop {
            let b = (!self.baseline_taken).then(|| self.start + self.omit);
            let i = self
                .interval
                .map(|iv| self.start + iv * (self.next_index + 1));
            match (b, i) {
                (Some(b), i) if b <= now && i.is_none_or(|i| b <= i) => {
                    self.baseline_taken = true;
                    out.push(Tick::Baseline);
                }
                (_, Some(i)) if i <= now => {
                    let iv = self.interval.expect("interval set");
                    let omitted = iv * self.next_index < self.omit;
                    out.push(Tick::Interval {
                        index: self.next_index,
                        omitted,
                    });
                    self.next_index += 1;
                }
                _ => break,
            }
        }
        out
    }

    /// The baseline was not taken because the run ended first.
    pub fn baseline_pending(&self) -> bool {
        !self.baseline_taken
    }
}

/// Where an interval that a side sampled at `sample_us` ends, after one
/// that ended at `prev_us`, in a run that ended at `end_us` once known: not
/// after the run's end, and never before the previous interval's end (a
/// sample taken once the streams had moved their last bytes is dated to
/// the last byte, which can precede a sample taken a moment earlier).
/// None when nothing of the run is left for it: no interval to report.
pub fn interval_end(prev_us: u64, sample_us: u64, end_us: Option<u64>) -> Option<u64> {
    let end = end_us.map_or(sample_us, |e| sample_us.min(e));
    (end > prev_us).then_some(end)
}

/// A side's interval sample as an interval's end ([`interval_end`]):
/// dated no later than the run's end; None when it adds nothing after
/// `prev`.
pub fn clip_sample(
    prev: Option<&SideSnapshot>,
    sample: &SideSnapshot,
    end_us: Option<u64>,
) -> Option<SideSnapshot> {
    let elapsed_us = interval_end(prev.map_or(0, |p| p.elapsed_us), sample.elapsed_us, end_us)?;
    Some(SideSnapshot {
        elapsed_us,
        ..sample.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiving side whose control thread looks a while after the last
    /// byte came (a busy host) still ends the test when the data ended:
    /// its time, and the rate of its last interval, are the data's.
    #[test]
    fn a_receiver_ends_when_its_last_byte_came_not_when_its_side_looked() {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        let params = TestParams {
            duration_ms: Some(60_000),
            ..TestParams::default()
        };
        let stream = ReadyStream {
            direction: Direction::Up,
            stream: 0,
            socket: DataSocket::Tcp(Arc::new(rx)),
            io: None,
        };
        let run = SideRun::start(End::Server, &params, vec![stream], None, "", None).unwrap();
        tx.write_all(&[7u8; 1 << 20]).unwrap();
        drop(tx);
        let until = Instant::now() + Duration::from_secs(30);
        while !run.finished() {
            assert!(Instant::now() < until, "the receiver never saw the end");
            std::thread::sleep(Duration::from_millis(5));
        }
        let seen_us = run.start.elapsed().as_micros() as u64;
        // The side looks late, as a busy control thread does.
        std::thread::sleep(Duration::from_millis(300));
        let end = run.snapshot();
        assert_eq!(end.streams[0].bytes, 1 << 20);
        assert!(
            end.elapsed_us <= seen_us,
            "the side's end is {} us, after the stream had ended ({} us)",
            end.elapsed_us,
            seen_us
        );
    }

    #[test]
    fn an_interval_never_ends_before_the_last_nor_after_the_run() {
        assert_eq!(interval_end(1_000_000, 1_500_000, None), Some(1_500_000));
        // Sampled after the streams' last byte, dated to it: earlier than
        // the previous sample, so nothing to report.
        assert_eq!(interval_end(2_000_000, 1_900_000, None), None);
        assert_eq!(interval_end(2_000_000, 2_000_000, None), None);
        // Past the run's end: clipped to it.
        assert_eq!(
            interval_end(2_000_000, 2_600_000, Some(2_250_000)),
            Some(2_250_000)
        );
        assert_eq!(interval_end(2_250_000, 2_600_000, Some(2_250_000)), None);
        assert_eq!(interval_end(0, 500_000, Some(2_000_000)), Some(500_000));
    }

    #[test]
    fn a_sequence_of_samples_gives_monotonic_intervals_ending_at_the_run_end() {
        let snap = |us| SideSnapshot {
            elapsed_us: us,
            cpu_us: 0,
            streams: Vec::new(),
        };
        // A sender blocked past its end: samples at 1, 2, 3, 4 s, then
        // (its last byte dated 2.25 s) one at 5 s dated 2.25 s.
        let samples = [1_000_000, 2_000_000, 3_000_000, 4_000_000, 2_250_000];
        let end = Some(2_250_000);
        let mut prev: Option<SideSnapshot> = None;
        let mut spans = Vec::new();
        for us in samples {
            if let Some(s) = clip_sample(prev.as_ref(), &snap(us), end) {
                spans.push((prev.as_ref().map_or(0, |p| p.elapsed_us), s.elapsed_us));
                prev = Some(s);
            }
        }
        assert_eq!(
            spans,
            vec![
                (0, 1_000_000),
                (1_000_000, 2_000_000),
                (2_000_000, 2_250_000)
            ]
        );
    }

    #[test]
    fn ticker_orders_baseline_and_intervals() {
        let t0 = Instant::now();
        let p = TestParams {
            interval_ms: 1000,
            omit_ms: 1500,
            ..TestParams::default()
        };
        let mut t = Ticker::new(t0, &p);
        assert_eq!(t.next_due(), Some(t0 + Duration::from_millis(1000)));
        assert_eq!(t.due(t0 + Duration::from_millis(999)), vec![]);
        assert_eq!(
            t.due(t0 + Duration::from_millis(2000)),
            vec![
                Tick::Interval {
                    index: 0,
                    omitted: true
                },
                Tick::Baseline,
                Tick::Interval {
                    index: 1,
                    omitted: true
                }
            ]
        );
        assert!(!t.baseline_pending());
        assert_eq!(
            t.due(t0 + Duration::from_millis(3000)),
            vec![Tick::Interval {
                index: 2,
                omitted: false
            }]
        );
    }
}
