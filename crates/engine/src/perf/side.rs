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
}

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
            let thread = workers::spawn(plan, s.socket.clone(), s.io, counters.clone())
                .map_err(|e| EngineError::io("failed to start a stream thread".into(), e))?;
            workers.push(Worker {
                direction: s.direction,
                stream: s.stream,
                send,
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
        })
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
        // Once every worker is done, the test ended when the last byte
        // moved, not when this thread noticed.
        let now_us = self.start.elapsed().as_micros() as u64;
        let elapsed_us = match self.finished() {
            true => self
                .workers
                .iter()
                .map(|w| w.counters.end_us.load(Ordering::Relaxed))
                .max()
                .filter(|&e| e > 0)
                .unwrap_or(now_us),
            false => now_us,
        };
        SideSnapshot {
            elapsed_us,
            cpu_us,
            streams,
        }
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
