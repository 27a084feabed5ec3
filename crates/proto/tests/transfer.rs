//! A deterministic in-memory harness for the transfer protocol: the source
//! and sink machines of `longhaul_proto::xfer` run together over an
//! in-memory source tree and sink store, control messages travel in order,
//! chunks travel over several data streams whose deliveries a schedule
//! interleaves, duplicates, corrupts or drops, and the clock jumps to the
//! next deadline whenever nothing else can happen.

// Test scenarios are held to no length: only shipped code is (clippy.toml).
#![allow(clippy::too_many_lines)]
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use longhaul_proto::msg::Message;
use longhaul_proto::plan::{chunk_count, Chunk, Planner};
use longhaul_proto::transfer::sink::{FileLedger, Sink, SinkAction, SinkError, SinkLimits};
use longhaul_proto::transfer::source::{Source, SourceAction, SourceError, SourceLimits};
use longhaul_proto::xfer::*;
use proptest::prelude::*;

const CHUNK: u64 = 64 << 10;
const IDLE: Duration = Duration::from_secs(300);

/// A stand-in for BLAKE3: any 32 bytes that change with the content.
fn hash(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, part) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        i.hash(&mut h);
        bytes.hash(&mut h);
        part.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

fn content(seed: u64, len: usize) -> Vec<u8> {
    longhaul_proto::data::bytes(seed, len)
}

/// A chunk on a data stream: header, payload and the hash of its trailer.
#[derive(Debug, Clone)]
struct Frame {
    file: u64,
    index: u32,
    offset: u64,
    bytes: Vec<u8>,
    hash: [u8; 32],
}

/// What a data stream carries: a chunk frame, or (bundles negotiated) a
/// bundle frame's bytes, header and records, as encoded on the wire.
#[derive(Debug, Clone)]
enum Delivery {
    Chunk(Frame),
    Bundle(Vec<u8>),
}

/// What goes wrong, and when.
#[derive(Debug, Clone, Default)]
struct Faults {
    /// Deliveries (by their number) that arrive with a flipped byte.
    corrupt: Vec<usize>,
    /// Deliveries that are delivered twice.
    duplicate: Vec<usize>,
    /// Deliveries that never arrive.
    drop: Vec<usize>,
    /// Paths whose writes fail at the sink.
    write_error: Vec<String>,
    /// Paths whose reads fail at the source.
    read_error: Vec<String>,
    /// The sink's disk fills after this many chunk writes.
    full_after: Option<usize>,
    /// The sink's disk holds this many bytes (landed and partial files):
    /// a write past it finds no room for its file.
    capacity: Option<usize>,
    /// Paths that change after their first chunk is read, this many times.
    changes: Vec<(String, u32)>,
    /// Paths the source's walk finds and cannot announce (unreadable, a
    /// directory without `-r`).
    unwalkable: Vec<String>,
}

/// One source file: its content and version (the mtime stands for it).
#[derive(Debug, Clone)]
struct SrcFile {
    data: Vec<u8>,
    version: i64,
}

/// What the sink holds of a file not yet in place: its partial bytes and
/// the journal of verified chunks.
#[derive(Debug, Clone, Default)]
struct Partial {
    data: Vec<u8>,
    journal: Vec<(u32, [u8; 32])>,
}

struct SourceSide {
    machine: Source<String>,
    tree: BTreeMap<String, SrcFile>,
    walk: VecDeque<String>,
    next_id: u64,
    /// The version each id announced.
    announced: HashMap<u64, i64>,
    planner: Planner,
    resends: VecDeque<Chunk>,
    /// Per planned file: path, version announced, reads left, resends read.
    reading: HashMap<u64, (String, i64, u64, u32)>,
    /// Chunk reads per (path, index), resends included.
    reads: HashMap<(String, u32), u32>,
    /// Resends the machine asked this side to serve.
    resends_asked: usize,
    next_stream: usize,
    done: bool,
}

struct SinkSide {
    machine: Sink,
    landed: BTreeMap<String, Vec<u8>>,
    partials: HashMap<String, Partial>,
    open: HashMap<u64, (Entry, FileLedger)>,
    /// Writes per (path, index).
    writes: HashMap<(String, u32), u32>,
    /// Chunks whose hash did not match, as (path, index), in order.
    damaged: Vec<(String, u32)>,
    chunk_writes: usize,
    /// Opens answered a step later, last asked first (a driver's open
    /// pool); off: each open is answered at once.
    pool: bool,
    opening: Vec<Entry>,
    /// A sink of an earlier release: it asks a missing chunk of each file
    /// again as soon as it opens it, before its `Send` answer goes out
    /// (its end game, on a loaded machine's slow opens).
    asks_before_send: bool,
}

/// How a run ended.
#[derive(Debug)]
struct Outcome {
    source: Result<(), SourceError>,
    sink: Result<SinkReport, SinkError>,
    landed: BTreeMap<String, Vec<u8>>,
    partials: HashMap<String, Partial>,
    reads: HashMap<(String, u32), u32>,
    writes: HashMap<(String, u32), u32>,
    /// Deliveries the harness damaged (see [`Faults::corrupt`]).
    corrupted: usize,
    /// Chunks the sink found damaged, as (path, index).
    damaged: Vec<(String, u32)>,
    /// Resends the source was asked to serve.
    resends_asked: usize,
    failed: Vec<Failure>,
    elapsed: Duration,
    /// Bundle frames, items of `FilesSealed` and of `FilesDone`, and
    /// `FileSealed` / `FileDone` messages sent alone.
    wire: (usize, usize, usize, usize),
    /// The most files in flight the source's tuner allowed.
    files_limit: u64,
}

struct Pair {
    now: Instant,
    start: Instant,
    src: SourceSide,
    snk: SinkSide,
    to_sink: VecDeque<Message>,
    to_source: VecDeque<Message>,
    streams: Vec<VecDeque<Delivery>>,
    /// Bundles negotiated: small whole files go in bundle frames, seals
    /// and dones batched.
    bundles: bool,
    /// The bundle being filled by the source's reads: record bytes, count.
    bundle: (Vec<u8>, u32),
    /// What went over the wire: bundle frames, batched messages (items).
    bundles_sent: usize,
    files_sealed: usize,
    files_done: usize,
    /// Per-file control messages (`FileSealed`, `FileDone`) sent alone.
    single_messages: usize,
    /// The source's tuner: an interval ends every this many steps, and
    /// grows the files in flight if they held the transfer back.
    tune_every: Option<u64>,
    steps: u64,
    /// Whether, this interval, the files in flight were all announced
    /// while the streams had nothing to send (as the engine notes it).
    held_by_files: bool,
    /// The most files in flight the source allowed.
    files_limit_seen: u64,
    /// Which stream delivers next, cycled.
    schedule: Vec<u8>,
    deliveries: usize,
    /// Deliveries damaged so far.
    corrupted: usize,
    faults: Faults,
}

impl Pair {
    fn new(files: &[(String, Vec<u8>)], streams: usize, schedule: Vec<u8>, faults: Faults) -> Self {
        let now = Instant::now();
        let tree: BTreeMap<String, SrcFile> = files
            .iter()
            .map(|(p, d)| {
                (
                    p.clone(),
                    SrcFile {
                        data: d.clone(),
                        version: 1,
                    },
                )
            })
            .collect();
        let mut walk: VecDeque<String> = tree.keys().cloned().collect();
        walk.push_front("src".into());
        Pair {
            now,
            start: now,
            src: SourceSide {
                machine: Source::new(
                    now,
                    SourceLimits {
                        batch: 3,
                        files_in_flight: 2,
                        max_files_in_flight: 4,
                        idle: IDLE,
                    },
                ),
                tree,
                walk,
                next_id: 0,
                announced: HashMap::new(),
                planner: Planner::new(),
                resends: VecDeque::new(),
                reading: HashMap::new(),
                reads: HashMap::new(),
                resends_asked: 0,
                next_stream: 0,
                done: false,
            },
            snk: SinkSide {
                machine: Sink::new(
                    now,
                    SinkLimits {
                        max_files: 4,
                        max_chunks_per_file: 1 << 22,
                        max_chunks_in_flight: 1 << 22,
                        idle: IDLE,
                    },
                ),
                landed: BTreeMap::new(),
                partials: HashMap::new(),
                open: HashMap::new(),
                writes: HashMap::new(),
                damaged: Vec::new(),
                chunk_writes: 0,
                pool: false,
                opening: Vec::new(),
                asks_before_send: false,
            },
            to_sink: VecDeque::new(),
            to_source: VecDeque::new(),
            streams: vec![VecDeque::new(); streams.max(1)],
            bundles: false,
            bundle: (Vec::new(), 0),
            bundles_sent: 0,
            files_sealed: 0,
            files_done: 0,
            single_messages: 0,
            tune_every: None,
            steps: 0,
            held_by_files: false,
            files_limit_seen: 0,
            schedule: if schedule.is_empty() {
                vec![0]
            } else {
                schedule
            },
            deliveries: 0,
            corrupted: 0,
            faults,
        }
    }

    /// Room for many files in flight, as a small-file transfer has.
    fn wide(mut self) -> Self {
        self.src.machine = Source::new(
            self.now,
            SourceLimits {
                batch: 64,
                files_in_flight: 64,
                max_files_in_flight: 64,
                idle: IDLE,
            },
        );
        self.snk.machine = Sink::new(
            self.now,
            SinkLimits {
                max_files: 64,
                max_chunks_per_file: 1 << 22,
                max_chunks_in_flight: 1 << 22,
                idle: IDLE,
            },
        );
        self
    }

    /// Files in flight start at `start` and grow online toward the sink's
    /// `cap`, as the engine's tuner grows them: an interval ends every
    /// `every` steps, and one in which every file the source may have in
    /// flight was waiting while the streams had nothing to send doubles
    /// the count.
    fn growing(mut self, start: u64, cap: u64, every: u64) -> Self {
        self.src.machine = Source::new(
            self.now,
            SourceLimits {
                batch: 16,
                files_in_flight: start,
                max_files_in_flight: cap,
                idle: IDLE,
            },
        );
        self.snk.machine = Sink::new(
            self.now,
            SinkLimits {
                max_files: cap,
                max_chunks_per_file: 1 << 22,
                max_chunks_in_flight: 1 << 22,
                idle: IDLE,
            },
        );
        self.tune_every = Some(every);
        self
    }

    /// The engine's tuner, once a step: notes whether the files in flight
    /// hold the transfer back, and ends an interval when one is due.
    fn tune(&mut self) {
        let Some(every) = self.tune_every else {
            return;
        };
        let m = &self.src.machine;
        let limit = usize::try_from(m.files_limit()).unwrap_or(usize::MAX);
        if !m.walk_done() && m.in_flight() >= limit {
            self.held_by_files |=
                self.src.planner.pending_files() == 0 && self.src.resends.is_empty();
        }
        self.steps += 1;
        if self.steps % every == 0 {
            let limit = self.src.machine.interval(self.held_by_files);
            self.files_limit_seen = self.files_limit_seen.max(limit);
            self.held_by_files = false;
        }
    }

    /// The sink's disk holds `capacity` bytes, and both ends agreed to
    /// defer a file with no room while others are in flight.
    fn with_room(mut self, capacity: usize) -> Self {
        self.faults.capacity = Some(capacity);
        self.snk.machine.defer_full();
        self
    }

    /// The sink's driver opens on a pool: up to 3 opens out at once,
    /// answered a step later in reverse order, while messages keep coming.
    fn with_open_pool(mut self) -> Self {
        self.snk.pool = true;
        self.snk.machine.open_at_once(3);
        self
    }

    /// The sink is of an earlier release, which asked a stalled chunk
    /// again before the file's `Send` answer had gone out.
    fn with_a_sink_asking_before_its_send(mut self) -> Self {
        self.snk.asks_before_send = true;
        self
    }

    /// Both ends agreed to bundles.
    fn with_bundles(mut self) -> Self {
        self.bundles = true;
        self.src.machine.batch_messages();
        self.snk.machine.batch_messages();
        self
    }

    /// Counts what a control message says about batching.
    fn count(&mut self, m: &Message) {
        match m {
            Message::FilesSealed(b) => self.files_sealed += b.items.len(),
            Message::FilesDone(b) => self.files_done += b.items.len(),
            Message::FileSealed(_) | Message::FileDone(_) => self.single_messages += 1,
            _ => {}
        }
    }

    fn entry(&mut self, path: &str) -> Entry {
        self.src.next_id += 1;
        let (kind, size, version) = match self.src.tree.get(path) {
            Some(f) => (Kind::File, f.data.len() as u64, f.version),
            None => (Kind::Dir, 0, 0),
        };
        self.src.announced.insert(self.src.next_id, version);
        Entry {
            id: self.src.next_id,
            path: path.to_string(),
            kind,
            size,
            mode: 0o644,
            mtime_ns: version,
            target: None,
            chunk_size: CHUNK,
            sparse: false,
            incomplete: false,
            digest: None,
            part: None,
        }
    }

    /// Runs until both ends are done or one fails.
    fn run(mut self) -> Outcome {
        let mut source = Ok(());
        let mut sink = Ok(());
        for _ in 0..100_000 {
            let progressed = match self.step() {
                Ok(p) => p,
                Err(Ended::Source(e)) => {
                    source = Err(e);
                    // The sink hears nothing more; it ends by its own timer.
                    if let Err(e) = self.drain_sink_until_done() {
                        sink = Err(e);
                    }
                    break;
                }
                Err(Ended::Sink(e)) => {
                    sink = Err(e);
                    self.flush_sink();
                    if let Err(e) = self.source_reads_messages() {
                        source = Err(e);
                    }
                    break;
                }
            };
            if self.snk.machine.is_done() && self.src.done {
                break;
            }
            if !progressed {
                // Nothing can happen before the next deadline.
                let next = [
                    self.src.machine.poll_timeout(),
                    self.snk.machine.poll_timeout(),
                ]
                .into_iter()
                .flatten()
                .min();
                let Some(t) = next else { break };
                self.now = self.now.max(t);
                source = self.src.machine.handle_timeout(self.now);
                sink = self.snk.machine.handle_timeout(self.now);
                if source.is_err() || sink.is_err() {
                    // The other end hears nothing more: its own timer ends it.
                    if source.is_ok() {
                        let t = self.src.machine.poll_timeout().unwrap_or(self.now);
                        self.now = self.now.max(t);
                        source = self.src.machine.handle_timeout(self.now);
                    }
                    if sink.is_ok() {
                        sink = self.drain_sink_until_done();
                    }
                    break;
                }
            }
        }
        let source_failed = self.src.machine.tally().failed.clone();
        let sink = sink.map(|()| self.snk.machine.into_report());
        Outcome {
            source,
            sink,
            landed: self.snk.landed,
            partials: self.snk.partials,
            reads: self.src.reads,
            writes: self.snk.writes,
            corrupted: self.corrupted,
            damaged: self.snk.damaged,
            resends_asked: self.src.resends_asked,
            failed: source_failed,
            elapsed: self.now - self.start,
            wire: (
                self.bundles_sent,
                self.files_sealed,
                self.files_done,
                self.single_messages,
            ),
            files_limit: self.files_limit_seen.max(self.src.machine.files_limit()),
        }
    }

    fn step(&mut self) -> Result<bool, Ended> {
        self.now += Duration::from_millis(1);
        let mut progressed = self.answer_opens()?;
        progressed |= self.source_walks();
        progressed |= self.source_acts();
        // A tuned transfer's streams are fast: the round trips per file
        // are what hold it back, and what the window grows for.
        let reads = match (self.tune_every, self.bundles) {
            (Some(_), _) => usize::MAX,
            (None, true) => 8,
            (None, false) => 2,
        };
        progressed |= self.source_reads(reads);
        progressed |= self.source_acts();
        self.tune();
        while let Some(m) = self.src.machine.poll_transmit() {
            self.count(&m);
            self.to_sink.push_back(m);
            progressed = true;
        }
        while let Some(m) = self.to_sink.pop_front() {
            self.snk.machine.handle(self.now, m).map_err(Ended::Sink)?;
            self.sink_acts()?;
            progressed = true;
        }
        progressed |= self.deliver()?;
        while self.tune_every.is_some() && self.deliver()? {}
        self.sink_acts()?;
        while let Some(m) = self.snk.machine.poll_transmit() {
            self.count(&m);
            self.to_source.push_back(m);
            progressed = true;
        }
        progressed |= self.source_reads_messages().map_err(Ended::Source)?;
        Ok(progressed || !self.snk.opening.is_empty())
    }

    /// Answers the opens asked in the last step, last asked first.
    fn answer_opens(&mut self) -> Result<bool, Ended> {
        if self.snk.opening.is_empty() {
            return Ok(false);
        }
        while let Some(e) = self.snk.opening.pop() {
            let want = self.open(&e);
            self.snk.machine.opened(self.now, e.id, want);
        }
        self.sink_acts()?;
        Ok(true)
    }

    fn source_walks(&mut self) -> bool {
        if !self.src.machine.wants_entries() {
            return false;
        }
        while self.src.machine.batch_has_room() {
            if let Some((path, _rel, attempt)) = self.src.machine.take_again() {
                let e = self.entry(&path);
                self.src.machine.add(e, path, attempt);
                continue;
            }
            if self.src.machine.walk_done() {
                break;
            }
            match self.src.walk.pop_front() {
                Some(path) if self.faults.unwalkable.contains(&path) => {
                    self.src.machine.walk_failed(Failure {
                        path,
                        error: "cannot read: Permission denied".into(),
                    });
                }
                Some(path) => {
                    let e = self.entry(&path);
                    self.src.machine.add(e, path, 1);
                }
                None => {
                    self.src.machine.walk_ended();
                    break;
                }
            }
        }
        self.src.machine.end_batch();
        true
    }

    fn source_acts(&mut self) -> bool {
        let mut any = false;
        while let Some(a) = self.src.machine.poll_action() {
            any = true;
            match a {
                SourceAction::Plan {
                    id,
                    handle,
                    path: _,
                    size,
                    chunk_size,
                    skip,
                } => {
                    let reads = self
                        .src
                        .planner
                        .add(id, size, chunk_size, skip)
                        .expect("the harness's chunk size plans");
                    let version = self.src.tree[&handle].version;
                    let announced = self.src.announced[&id];
                    self.src
                        .reading
                        .insert(id, (handle.clone(), announced, reads, 0));
                    if reads == 0 {
                        if announced == version {
                            self.src.machine.sealed(self.now, id, 0);
                        } else {
                            self.src.machine.changed(self.now, id, "mtime changed");
                        }
                    }
                }
                SourceAction::Resend(c) => {
                    self.src.resends_asked += 1;
                    self.src.resends.push_back(c);
                }
                SourceAction::Forget(id) => {
                    self.src.reading.remove(&id);
                }
                SourceAction::Landed(_)
                | SourceAction::WalkDone
                | SourceAction::Retrying { .. }
                | SourceAction::Deferred { .. } => {}
            }
        }
        any
    }

    /// The source's data-stream threads: read up to `n` chunks and put
    /// them on the streams, round robin.
    fn source_reads(&mut self, n: usize) -> bool {
        let mut any = false;
        for _ in 0..n {
            let (c, resend) = match self.src.resends.pop_front() {
                Some(c) => (c, true),
                None => match self.src.planner.next_chunk() {
                    Some(c) => (c, false),
                    None => break,
                },
            };
            any = true;
            let Some((path, announced, _, _)) = self.src.reading.get(&c.file).cloned() else {
                continue;
            };
            *self.src.reads.entry((path.clone(), c.index)).or_insert(0) += 1;
            let f = &self.src.tree[&path];
            if f.version != announced {
                self.src.reading.remove(&c.file);
                self.src.machine.changed(self.now, c.file, "mtime changed");
                continue;
            }
            let range = c.offset as usize..(c.offset + u64::from(c.len)) as usize;
            let bytes = f.data[range].to_vec();
            let failing = self.faults.read_error.contains(&path);
            let mut h = hash(&bytes);
            if failing {
                h[0] ^= 0xff;
            }
            // A whole small file, not a resend: into the bundle.
            let whole = c.index == 0 && u64::from(c.len) == f.data.len() as u64;
            if self.bundles && !resend && whole && c.len <= MAX_BUNDLE_FILE {
                if self.bundle.1 == MAX_BUNDLE_FILES
                    || self.bundle.0.len() + bytes.len() > MAX_BUNDLE_PAYLOAD as usize
                {
                    self.flush_bundle();
                }
                let t = Trailer {
                    check: [0; 16],
                    value: h,
                };
                push_bundle_record(&mut self.bundle.0, c.file, &bytes, &t);
                self.bundle.1 += 1;
            } else {
                self.flush_bundle();
                let s = self.src.next_stream % self.streams.len();
                self.src.next_stream += 1;
                self.streams[s].push_back(Delivery::Chunk(Frame {
                    file: c.file,
                    index: c.index,
                    offset: c.offset,
                    bytes,
                    hash: h,
                }));
            }
            self.src.machine.sent(self.now, u64::from(c.len), 1);
            if failing {
                self.src.reading.remove(&c.file);
                self.src.machine.file_failed(
                    self.now,
                    c.file,
                    format!("cannot read {path} at offset {}: injected", c.offset),
                );
                continue;
            }
            // A writer changes the file once its first chunk is read.
            if let Some(left) = self
                .faults
                .changes
                .iter_mut()
                .find(|(p, n)| *p == path && *n > 0)
                .map(|(_, n)| n)
            {
                *left -= 1;
                let f = self.src.tree.get_mut(&path).expect("read above");
                f.version += 1;
                f.data = content(f.version as u64 * 7919, f.data.len());
            }
            let r = self.src.reading.get_mut(&c.file).expect("read above");
            let seal = if resend {
                r.3 += 1;
                (r.2 == 0).then_some(r.3)
            } else {
                r.2 -= 1;
                (r.2 == 0).then_some(r.3)
            };
            if let Some(resends) = seal {
                if self.src.tree[&path].version == announced {
                    self.src.machine.sealed(self.now, c.file, resends);
                } else {
                    self.src.reading.remove(&c.file);
                    self.src.machine.changed(self.now, c.file, "mtime changed");
                }
            }
        }
        self.flush_bundle();
        any
    }

    /// Puts the bundle being filled on the next stream.
    fn flush_bundle(&mut self) {
        let (body, count) = std::mem::take(&mut self.bundle);
        if count == 0 {
            return;
        }
        let h = BundleHeader {
            count,
            body_len: body.len() as u32,
        };
        let mut wire = h.encode().to_vec();
        wire.extend_from_slice(&body);
        let s = self.src.next_stream % self.streams.len();
        self.src.next_stream += 1;
        self.streams[s].push_back(Delivery::Bundle(wire));
        self.bundles_sent += 1;
    }

    fn source_reads_messages(&mut self) -> Result<bool, SourceError> {
        let mut any = false;
        while let Some(m) = self.to_source.pop_front() {
            any = true;
            self.src.machine.handle(self.now, m)?;
            self.source_acts();
            if let Some((tally, _sink)) = self.src.machine.finished() {
                self.src.done = true;
                self.to_sink.push_back(Message::SourceDone(SourceDone {
                    read_bytes: tally.read_bytes,
                    read_us: tally.read_us,
                    resent_changed: tally.resent_changed,
                    tuning: None,
                    cpu: None,
                    compress: None,
                }));
            }
        }
        Ok(any)
    }

    /// Delivers one chunk from the stream the schedule names.
    fn deliver(&mut self) -> Result<bool, Ended> {
        let n = self.streams.len();
        let pick = self.schedule[self.deliveries % self.schedule.len()] as usize % n;
        let Some(s) = (0..n)
            .map(|k| (pick + k) % n)
            .find(|&s| !self.streams[s].is_empty())
        else {
            return Ok(false);
        };
        let mut frame = self.streams[s].pop_front().expect("not empty");
        let number = self.deliveries;
        self.deliveries += 1;
        if self.faults.drop.contains(&number) {
            return Ok(true);
        }
        if self.faults.duplicate.contains(&number) {
            let other = (s + 1) % n;
            self.streams[other].push_back(frame.clone());
        }
        if self.faults.corrupt.contains(&number) {
            self.corrupted += 1;
            match &mut frame {
                Delivery::Chunk(f) if !f.bytes.is_empty() => f.bytes[0] ^= 0x55,
                // An empty chunk's damage can only be to its hash.
                Delivery::Chunk(f) => f.hash[0] ^= 0x55,
                // The first record's first byte, or, if it is empty, its
                // trailer's value (this harness's stand-in hash; the
                // XXH3 check is the engine's and not modelled here).
                Delivery::Bundle(b) => {
                    let len = &b[BUNDLE_HEADER_LEN + 8..BUNDLE_HEADER_LEN + 12];
                    let empty = len.iter().all(|&x| x == 0);
                    b[BUNDLE_HEADER_LEN + 12 + if empty { 16 } else { 0 }] ^= 0x55;
                }
            }
        }
        match frame {
            Delivery::Chunk(f) => self.receive(f)?,
            Delivery::Bundle(b) => self.receive_bundle(&b)?,
        }
        Ok(true)
    }

    /// The sink's receiver for a bundle frame: decoded and checked as the
    /// engine does, then each record booked as the file's chunk 0.
    fn receive_bundle(&mut self, wire: &[u8]) -> Result<(), Ended> {
        let bad = |m: &mut Sink, e: String| Ended::Sink(m.fatal(e));
        let head: [u8; BUNDLE_HEADER_LEN] = wire[..BUNDLE_HEADER_LEN].try_into().expect("9");
        let h =
            BundleHeader::decode(&head).map_err(|e| bad(&mut self.snk.machine, e.to_string()))?;
        let records = h
            .records(&wire[BUNDLE_HEADER_LEN..])
            .map_err(|e| bad(&mut self.snk.machine, e.to_string()))?;
        for r in records {
            if let Some((e, _)) = self.snk.open.get(&r.file) {
                if e.size != r.data.len() as u64 || chunk_count(e.size, e.chunk_size) != 1 {
                    let e = format!("a bundle record for {} does not match its size", e.path);
                    return Err(bad(&mut self.snk.machine, e));
                }
            }
            self.receive(Frame {
                file: r.file,
                index: 0,
                offset: 0,
                bytes: r.data.to_vec(),
                hash: r.trailer.value,
            })?;
        }
        Ok(())
    }

    /// The sink's receiver: check, write, journal, book; finish the file
    /// once its ledger is complete.
    fn receive(&mut self, frame: Frame) -> Result<(), Ended> {
        let Some((entry, ledger)) = self.snk.open.get_mut(&frame.file) else {
            return Ok(());
        };
        if !ledger.wants(frame.index) {
            return Ok(());
        }
        if hash(&frame.bytes) != frame.hash {
            self.snk.damaged.push((entry.path.clone(), frame.index));
            ledger.damaged();
            let r = Resend {
                id: frame.file,
                index: frame.index,
            };
            return self.snk.machine.damaged(self.now, r).map_err(Ended::Sink);
        }
        let path = entry.path.clone();
        if self
            .faults
            .full_after
            .is_some_and(|n| self.snk.chunk_writes >= n)
        {
            let e = self.snk.machine.fatal(format!(
                "destination full: failed to write {path}: No space left on device"
            ));
            return Err(Ended::Sink(e));
        }
        // A write past the disk's capacity: what was written of the file
        // goes, and the machine hears there is no room for it.
        if let Some(capacity) = self.faults.capacity {
            let landed: usize = self.snk.landed.values().map(Vec::len).sum();
            let partial: usize = self.snk.partials.values().map(|p| p.data.len()).sum();
            let mine = self.snk.partials.get(&path).map_or(0, |p| p.data.len());
            let end = frame.offset as usize + frame.bytes.len();
            if landed + partial + end.saturating_sub(mine) > capacity {
                self.snk.partials.remove(&path);
                self.snk.open.remove(&frame.file);
                let why = format!("destination full: no room for {path}");
                self.snk.machine.no_room(self.now, frame.file, why);
                return Ok(());
            }
        }
        if self.faults.write_error.contains(&path) {
            ledger.fail();
            let id = frame.file;
            self.snk.machine.file_done(
                self.now,
                FileDone {
                    id,
                    error: Some(format!("failed to write {path}: injected")),
                    ..FileDone::default()
                },
                0,
            );
            return Ok(());
        }
        self.snk.chunk_writes += 1;
        *self
            .snk
            .writes
            .entry((path.clone(), frame.index))
            .or_insert(0) += 1;
        let p = self.snk.partials.entry(path).or_default();
        let end = frame.offset as usize + frame.bytes.len();
        if p.data.len() < end {
            p.data.resize(end, 0);
        }
        p.data[frame.offset as usize..end].copy_from_slice(&frame.bytes);
        p.journal.push((frame.index, frame.hash));
        let len = frame.bytes.len() as u64;
        ledger.verified(frame.index, frame.hash);
        let complete = ledger.claim();
        self.snk.machine.written(self.now, len, 1);
        if complete {
            self.finish(frame.file);
        }
        Ok(())
    }

    /// Renames a complete file into place.
    fn finish(&mut self, id: u64) {
        let (entry, ledger) = &self.snk.open[&id];
        let mut p = self.snk.partials.remove(&entry.path).unwrap_or_default();
        p.data.resize(entry.size as usize, 0);
        let mut all = Vec::new();
        for h in ledger.hashes().iter().flatten() {
            all.extend_from_slice(h);
        }
        let digest = hash(&all).iter().map(|b| format!("{b:02x}")).collect();
        let size = entry.size;
        self.snk.landed.insert(entry.path.clone(), p.data);
        self.snk.machine.file_done(
            self.now,
            FileDone {
                id,
                digest: Some(digest),
                ..FileDone::default()
            },
            size,
        );
    }

    fn sink_acts(&mut self) -> Result<(), Ended> {
        while let Some(a) = self.snk.machine.poll_action().map_err(Ended::Sink)? {
            match a {
                SinkAction::Open(e) if self.snk.pool => self.snk.opening.push(e),
                SinkAction::Open(e) => {
                    let want = self.open(&e);
                    self.snk.machine.opened(self.now, e.id, want);
                }
                SinkAction::Check(id) => {
                    if self.snk.open.get_mut(&id).is_some_and(|(_, l)| l.claim()) {
                        self.finish(id);
                    }
                }
                SinkAction::Seal { id, resends } => {
                    let complete = self.snk.open.get_mut(&id).is_some_and(|(_, l)| {
                        l.seal(resends);
                        l.claim()
                    });
                    if complete {
                        self.finish(id);
                    }
                }
                SinkAction::Discard { id, changed } => {
                    if let Some((e, mut l)) = self.snk.open.remove(&id) {
                        l.fail();
                        if changed {
                            self.snk.partials.remove(&e.path);
                        }
                    }
                }
                SinkAction::Release(id) => {
                    self.snk.open.remove(&id);
                }
                SinkAction::Dir(_)
                | SinkAction::Link(_)
                | SinkAction::DirEnd(_)
                | SinkAction::Landed(_)
                | SinkAction::WalkDone
                | SinkAction::Interval(_) => {}
                SinkAction::SetDirectories => self.snk.machine.directories_set(),
            }
        }
        Ok(())
    }

    /// Answers an announced file: skip it if it is in place, else resume
    /// from the chunks of its journal that still check out.
    fn open(&mut self, e: &Entry) -> Want {
        if self.snk.landed.get(&e.path).is_some_and(|d| {
            d.len() as u64 == e.size && self.src.tree[&e.path].data == *d && e.mtime_ns == 1
        }) {
            return Want::Skip { id: e.id };
        }
        let count = chunk_count(e.size, e.chunk_size);
        let p = self.snk.partials.entry(e.path.clone()).or_default();
        let mut resumed = Vec::new();
        let mut resumed_bytes = 0;
        for &(index, h) in &p.journal {
            let start = u64::from(index) * e.chunk_size;
            let end = (start + e.chunk_size).min(e.size) as usize;
            if u64::from(index) < count
                && p.data.len() >= end
                && hash(&p.data[start as usize..end]) == h
                && !resumed.iter().any(|(i, _)| *i == index)
            {
                resumed.push((index, h));
                resumed_bytes += end as u64 - start;
            }
        }
        p.journal = resumed.clone();
        let mut skip: Vec<u32> = resumed.iter().map(|(i, _)| *i).collect();
        skip.sort_unstable();
        let mut ledger = FileLedger::new(count as usize, resumed);
        let missing = (0..count as u32).find(|i| skip.binary_search(i).is_err());
        if let (true, Some(index)) = (self.snk.asks_before_send, missing) {
            // Straight to the source: ahead of the `Wants` still queued.
            ledger.damaged();
            self.to_source
                .push_back(Message::Resend(Resend { id: e.id, index }));
        }
        self.snk.open.insert(e.id, (e.clone(), ledger));
        Want::Send {
            id: e.id,
            skip: skip_ranges(skip, MAX_SKIP_RANGES),
            resumed_bytes,
        }
    }

    fn flush_sink(&mut self) {
        while let Some(m) = self.snk.machine.poll_transmit() {
            self.to_source.push_back(m);
        }
    }

    fn drain_sink_until_done(&mut self) -> Result<(), SinkError> {
        let t = self.snk.machine.poll_timeout().unwrap_or(self.now);
        self.now = self.now.max(t);
        self.snk.machine.handle_timeout(self.now)
    }
}

enum Ended {
    Source(SourceError),
    Sink(SinkError),
}

fn tree(sizes: &[usize]) -> Vec<(String, Vec<u8>)> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("src/f{i}"), content(i as u64 + 1, n)))
        .collect()
}

fn expect_identical(o: &Outcome, files: &[(String, Vec<u8>)]) {
    assert!(o.source.is_ok(), "source: {:?}", o.source);
    let report = o.sink.as_ref().expect("sink finished");
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.files, files.len() as u64);
    for (p, d) in files {
        assert!(o.landed.get(p) == Some(d), "{p} differs");
    }
}

fn sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(
        prop_oneof![Just(0usize), 1..100usize, 1..(5 * CHUNK as usize)],
        1..7,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every byte lands exactly once, whatever the streams, interleaving
    /// and duplicates.
    #[test]
    fn every_byte_lands_exactly_once(
        sizes in sizes(),
        streams in 1usize..5,
        schedule in prop::collection::vec(any::<u8>(), 1..16),
        duplicate in prop::collection::vec(0usize..40, 0..6),
        bundles in any::<bool>(),
        pool in any::<bool>(),
    ) {
        let files = tree(&sizes);
        let faults = Faults { duplicate, ..Faults::default() };
        let pair = Pair::new(&files, streams, schedule, faults);
        let pair = if pool { pair.with_open_pool() } else { pair };
        let o = if bundles { pair.with_bundles() } else { pair }.run();
        expect_identical(&o, &files);
        for (p, d) in &files {
            for i in 0..chunk_count(d.len() as u64, CHUNK) as u32 {
                let w = o.writes.get(&(p.clone(), i)).copied().unwrap_or(0);
                prop_assert!(d.is_empty() || w == 1, "chunk {i} of {p} written {w} times");
            }
        }
        let written: u64 = o.sink.as_ref().map(|r| r.written_bytes).unwrap_or(0);
        prop_assert_eq!(written, sizes.iter().map(|&n| n as u64).sum::<u64>());
    }

    /// A resumed file is sent only where its journal does not vouch for
    /// the partial file.
    #[test]
    fn resume_sends_only_unverified_chunks(
        chunks in 2u64..8,
        tail in 1usize..1000,
        have in prop::collection::vec(any::<bool>(), 8),
        lie in prop::collection::vec(any::<bool>(), 8),
    ) {
        let size = ((chunks - 1) * CHUNK) as usize + tail;
        let files = tree(&[size]);
        let (path, data) = files[0].clone();
        let mut pair = Pair::new(&files, 2, vec![0, 1], Faults::default());
        let mut partial = Partial { data: vec![0; size], journal: Vec::new() };
        let mut verified = Vec::new();
        for i in 0..chunks as usize {
            if !have[i] {
                continue;
            }
            let start = i * CHUNK as usize;
            let end = (start + CHUNK as usize).min(size);
            partial.data[start..end].copy_from_slice(&data[start..end]);
            if lie[i] {
                // The journal vouches for bytes the partial file lost.
                partial.journal.push((i as u32, hash(&data[start..end])));
                partial.data[start] ^= 1;
            } else {
                partial.journal.push((i as u32, hash(&data[start..end])));
                verified.push(i as u32);
            }
        }
        pair.snk.partials.insert(path.clone(), partial);
        let o = pair.run();
        expect_identical(&o, &files);
        for i in 0..chunks as u32 {
            let reads = o.reads.get(&(path.clone(), i)).copied().unwrap_or(0);
            let want = u32::from(!verified.contains(&i));
            prop_assert_eq!(reads, want, "chunk {} read {} times", i, reads);
        }
        let report = o.sink.as_ref().expect("finished");
        let resumed: u64 = verified
            .iter()
            .map(|&i| CHUNK.min(size as u64 - u64::from(i) * CHUNK))
            .sum();
        prop_assert_eq!(report.resumed_bytes, resumed);
    }

    /// A chunk damaged on the way is detected and sent again.
    #[test]
    /// The first delivery is always damaged, so every case damages at
    /// least one; each damage is found by the sink, asked for again and
    /// read again by the source. At most `MAX_DAMAGED` deliveries are
    /// damaged: one more, all on a one-chunk tree, is a path that corrupts
    /// data, and the sink rightly gives up on it.
    fn corrupted_chunks_are_resent(
        sizes in sizes(),
        streams in 1usize..4,
        more in prop::collection::vec(1usize..30, 0..longhaul_proto::transfer::sink::MAX_DAMAGED as usize),
        bundles in any::<bool>(),
    ) {
        let files = tree(&sizes);
        let corrupt: Vec<usize> = std::iter::once(0).chain(more).collect();
        let faults = Faults { corrupt, ..Faults::default() };
        let pair = Pair::new(&files, streams, vec![0, 1, 2], faults);
        let o = if bundles { pair.with_bundles() } else { pair }.run();
        expect_identical(&o, &files);
        prop_assert!(o.corrupted >= 1, "no delivery was damaged");
        prop_assert_eq!(o.damaged.len(), o.corrupted, "damaged {:?}", o.damaged);
        prop_assert_eq!(o.resends_asked, o.corrupted);
        for (path, index) in &o.damaged {
            let times = o.damaged.iter().filter(|d| *d == &(path.clone(), *index)).count();
            let reads = o.reads.get(&(path.clone(), *index)).copied().unwrap_or(0);
            prop_assert_eq!(reads as usize, times + 1, "{} chunk {} read {} times", path, index, reads);
        }
    }

    /// A file that changes while it is read is sent again, or fails as
    /// changed after three reads; never does a mixed version land.
    #[test]
    fn a_file_changed_while_read_is_never_torn(
        chunks in 1u64..5,
        changes in 1u32..5,
        streams in 1usize..4,
        pool in any::<bool>(),
    ) {
        let size = (chunks * CHUNK) as usize - 7;
        let files = tree(&[size, 1000]);
        let path = files[0].0.clone();
        let faults = Faults { changes: vec![(path.clone(), changes)], ..Faults::default() };
        let pair = Pair::new(&files, streams, vec![1, 0], faults);
        let o = if pool { pair.with_open_pool() } else { pair }.run();
        prop_assert!(o.source.is_ok(), "{:?}", o.source);
        let report = o.sink.as_ref().expect("finished");
        if changes < 3 {
            prop_assert!(report.failed.is_empty(), "{:?}", report.failed);
            let last = content(u64::from(changes + 1) * 7919, size);
            prop_assert!(o.landed.get(&path) == Some(&last));
        } else {
            prop_assert!(!o.landed.contains_key(&path));
            prop_assert_eq!(report.failed.len(), 1);
            prop_assert!(report.failed[0].error.contains("changed while it was read"));
        }
        prop_assert!(o.landed.get(&files[1].0) == Some(&files[1].1));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// A run cut short by a full disk resumes: the rerun reads only the
    /// chunks the first run did not verify, and the file lands whole.
    #[test]
    fn a_rerun_after_a_full_disk_reads_only_what_is_missing(
        chunks in 2u64..8,
        full_after in 1usize..8,
        streams in 1usize..4,
    ) {
        let full_after = full_after.min(chunks as usize - 1);
        let size = (chunks * CHUNK) as usize - 3;
        let files = tree(&[size]);
        let path = files[0].0.clone();
        let faults = Faults { full_after: Some(full_after), ..Faults::default() };
        let first = Pair::new(&files, streams, vec![0, 1], faults).run();
        prop_assert!(first.sink.is_err());
        let kept: Vec<u32> = first.partials[&path].journal.iter().map(|(i, _)| *i).collect();
        prop_assert_eq!(kept.len(), full_after);
        let mut again = Pair::new(&files, streams, vec![1, 0], Faults::default());
        again.snk.partials = first.partials;
        let o = again.run();
        expect_identical(&o, &files);
        for i in 0..chunks as u32 {
            let reads = o.reads.get(&(path.clone(), i)).copied().unwrap_or(0);
            prop_assert_eq!(reads, u32::from(!kept.contains(&i)), "chunk {}", i);
        }
    }

    /// Whatever deliveries are lost, a wrong file never lands: the
    /// transfer completes byte-identical or ends at the idle deadline.
    #[test]
    fn lost_chunks_never_land_a_wrong_file(
        sizes in sizes(),
        streams in 1usize..4,
        drop in prop::collection::vec(0usize..20, 1..4),
        duplicate in prop::collection::vec(0usize..20, 0..4),
        bundles in any::<bool>(),
        pool in any::<bool>(),
    ) {
        let files = tree(&sizes);
        let faults = Faults { drop, duplicate, ..Faults::default() };
        let pair = Pair::new(&files, streams, vec![0, 2, 1], faults);
        let pair = if pool { pair.with_open_pool() } else { pair };
        let o = if bundles { pair.with_bundles() } else { pair }.run();
        for (p, d) in &o.landed {
            let want = &files.iter().find(|(q, _)| q == p).expect("only sources land").1;
            prop_assert!(d == want, "{} landed torn", p);
        }
        match &o.sink {
            Ok(_) => expect_identical(&o, &files),
            Err(e) => prop_assert!(matches!(e, SinkError::Idle(_)), "{:?}", e),
        }
    }

    /// On a small disk, whatever the sizes, streams and interleaving, with
    /// or without deferral agreed (an older peer: the file fails at once):
    /// what lands is whole, nothing partial stays, the transfer ends, and
    /// with deferral a file fails only if it cannot fit alone.
    #[test]
    fn a_small_disk_lands_what_fits(
        sizes in prop::collection::vec(0usize..(4 * CHUNK as usize), 1..7),
        capacity in 0usize..(8 * CHUNK as usize),
        streams in 1usize..4,
        schedule in prop::collection::vec(any::<u8>(), 1..8),
        deferred in any::<bool>(),
        pool in any::<bool>(),
    ) {
        let files = tree(&sizes);
        let faults = Faults { capacity: Some(capacity), ..Faults::default() };
        let pair = Pair::new(&files, streams, schedule, faults).wide();
        let pair = if deferred { pair.with_room(capacity) } else { pair };
        let o = if pool { pair.with_open_pool() } else { pair }.run();
        expect_room_outcome(&o, &files, capacity, deferred);
    }
}

/// The files in flight grow online from their start to the sink's cap
/// while they hold a small-file transfer back, and the transfer still ends
/// with every file landed once: no credit is lost as the window widens,
/// whether the window is full, growing or draining when the walk ends.
#[test]
fn files_in_flight_grow_to_the_cap_and_the_transfer_ends() {
    for (n, every, pool, bundles) in [
        (700, 3, true, true),
        (700, 5, false, true),
        (513, 2, true, false),
        (64, 1, true, true),
        (300, 2, false, false),
    ] {
        let sizes: Vec<usize> = (0..n).map(|i| i * 37 % 700).collect();
        let files = tree(&sizes);
        let pair = Pair::new(&files, 3, vec![0, 2, 1], Faults::default()).growing(4, 64, every);
        let pair = if pool { pair.with_open_pool() } else { pair };
        let o = if bundles { pair.with_bundles() } else { pair }.run();
        expect_identical(&o, &files);
        assert_eq!(
            o.files_limit, 64,
            "{n} files, an interval every {every} steps: grew to {}",
            o.files_limit
        );
    }
}

/// What a run on a disk of `capacity` bytes must end with: no error at
/// either end; each file landed whole or failed for want of room, and
/// failed only if it could not fit alone beside what landed; nothing
/// partial left; the disk never overfilled.
fn expect_room_outcome(o: &Outcome, files: &[(String, Vec<u8>)], capacity: usize, deferred: bool) {
    assert!(o.source.is_ok(), "source: {:?}", o.source);
    let report = o.sink.as_ref().expect("the sink finished");
    let landed: usize = o.landed.values().map(Vec::len).sum();
    assert!(landed <= capacity, "{landed} bytes on a disk of {capacity}");
    for (p, d) in files {
        match o.landed.get(p) {
            Some(got) => assert!(got == d, "{p} landed torn"),
            None => {
                let f = report
                    .failed
                    .iter()
                    .find(|f| &f.path == p)
                    .unwrap_or_else(|| panic!("{p} neither landed nor failed: {report:?}"));
                assert!(f.error.starts_with("destination full"), "{f:?}");
                if deferred {
                    assert!(
                        f.error.contains("even with no other file in flight"),
                        "{f:?}"
                    );
                    assert!(
                        d.len() > capacity - landed,
                        "{p} ({} bytes) fits beside {landed}",
                        d.len()
                    );
                }
            }
        }
    }
    assert_eq!(report.files as usize, o.landed.len());
    assert!(
        o.partials.values().all(|p| p.data.is_empty()),
        "partial files left"
    );
}

/// Files of 6 and 5 units and one of 1, pushed together to a disk of 8
/// (issue 41 A3): the file that finds no room while others are in flight
/// goes back to the source and comes again alone at the end; what fits
/// lands, and only a file that cannot fit alone fails, with the rest of
/// the transfer going on.
#[test]
fn a_file_without_room_comes_again_alone_and_fails_only_if_it_cannot_fit() {
    let files = tree(&[6 * CHUNK as usize, 5 * CHUNK as usize, CHUNK as usize]);
    let capacity = 8 * CHUNK as usize;
    for (schedule, pool, bundles) in [(vec![0, 1, 2], false, false), (vec![1, 0], true, true)] {
        let pair = Pair::new(&files, 3, schedule, Faults::default())
            .wide()
            .with_room(capacity);
        let pair = if pool { pair.with_open_pool() } else { pair };
        let o = if bundles { pair.with_bundles() } else { pair }.run();
        expect_room_outcome(&o, &files, capacity, true);
        assert_eq!(o.landed.len(), 2, "{:?}", o.landed.keys());
    }
    // Each fits alone: all land, however they met on the way.
    let files = tree(&[4 * CHUNK as usize, 4 * CHUNK as usize, 3 * CHUNK as usize]);
    let o = Pair::new(&files, 3, vec![0, 1, 2], Faults::default())
        .wide()
        .with_room(12 * CHUNK as usize)
        .run();
    expect_identical(&o, &files);
}

#[test]
fn a_dropped_chunk_ends_the_transfer_at_the_idle_deadline() {
    let files = tree(&[3 * CHUNK as usize]);
    let faults = Faults {
        drop: vec![1],
        ..Faults::default()
    };
    let o = Pair::new(&files, 2, vec![0], faults).run();
    assert!(
        matches!(o.sink, Err(SinkError::Idle(d)) if d == IDLE),
        "{:?}",
        o.sink
    );
    assert!(
        matches!(o.source, Err(SourceError::Idle(_))),
        "{:?}",
        o.source
    );
    assert!(o.elapsed >= IDLE);
    assert!(o.landed.is_empty());
}

#[test]
fn a_chunk_damaged_four_times_fails_the_transfer() {
    let files = tree(&[1000]);
    let faults = Faults {
        corrupt: vec![0, 1, 2, 3],
        ..Faults::default()
    };
    let o = Pair::new(&files, 1, vec![0], faults).run();
    match &o.sink {
        Err(SinkError::Failed(e)) => assert!(e.contains("arrived damaged 4 times"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(o.landed.is_empty());
}

#[test]
fn a_write_error_fails_one_file_and_lands_the_others() {
    let files = tree(&[1000, 2 * CHUNK as usize, 10]);
    let faults = Faults {
        write_error: vec![files[1].0.clone()],
        ..Faults::default()
    };
    let o = Pair::new(&files, 2, vec![0, 1], faults).run();
    assert!(o.source.is_ok(), "{:?}", o.source);
    let report = o.sink.as_ref().expect("finished");
    assert_eq!(report.files, 2);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].path, files[1].0);
    assert!(!o.landed.contains_key(&files[1].0));
    assert_eq!(o.landed.get(&files[0].0), Some(&files[0].1));
    assert_eq!(o.landed.get(&files[2].0), Some(&files[2].1));
    assert!(o.failed.iter().any(|f| f.path == files[1].0));
}

#[test]
fn a_read_error_fails_one_file_and_lands_the_others() {
    let files = tree(&[1000, 3 * CHUNK as usize]);
    let faults = Faults {
        read_error: vec![files[1].0.clone()],
        ..Faults::default()
    };
    let o = Pair::new(&files, 3, vec![2, 0], faults).run();
    assert!(o.source.is_ok(), "{:?}", o.source);
    let report = o.sink.as_ref().expect("finished");
    assert_eq!(report.files, 1);
    assert_eq!(report.failed.len(), 1);
    assert!(
        report.failed[0].error.contains("cannot read"),
        "{:?}",
        report.failed
    );
    assert!(!o.landed.contains_key(&files[1].0));
    // The journal stays for a retry.
    assert!(o.partials.contains_key(&files[1].0) || o.partials.is_empty());
}

#[test]
fn a_walk_failure_reaches_the_sinks_report_and_the_others_land() {
    let files = tree(&[1000, 2 * CHUNK as usize, 10]);
    let faults = Faults {
        unwalkable: vec![files[1].0.clone()],
        ..Faults::default()
    };
    let o = Pair::new(&files, 2, vec![1, 0], faults).run();
    assert!(o.source.is_ok(), "{:?}", o.source);
    let report = o.sink.as_ref().expect("finished");
    assert_eq!(report.files, 2);
    assert_eq!(report.failed.len(), 1, "{:?}", report.failed);
    assert_eq!(report.failed[0].path, files[1].0);
    assert!(report.failed[0].error.contains("cannot read"));
    assert!(!o.landed.contains_key(&files[1].0));
    assert_eq!(o.landed.get(&files[0].0), Some(&files[0].1));
    assert_eq!(o.landed.get(&files[2].0), Some(&files[2].1));
    // The source counts it once, as before.
    assert_eq!(o.failed.len(), 1, "{:?}", o.failed);
}

/// A walk that announces nothing (a directory named without `-r`) still
/// tells the sink why, and the transfer ends.
#[test]
fn a_walk_that_announces_nothing_still_reports_its_failure() {
    let faults = Faults {
        unwalkable: vec!["src".into()],
        ..Faults::default()
    };
    let o = Pair::new(&[], 1, vec![0], faults).run();
    assert!(o.source.is_ok(), "{:?}", o.source);
    let report = o.sink.as_ref().expect("finished");
    assert_eq!((report.files, report.bytes), (0, 0));
    assert_eq!(report.failed.len(), 1, "{:?}", report.failed);
    assert_eq!(report.failed[0].path, "src");
}

/// The attacker is a source sending walk failures without end, each far
/// over the byte budget: the sink keeps [`MAX_WALK_FAILURES`] of them,
/// each within [`MAX_FAILURE_PATH`] and [`MAX_FAILURE_ERROR`] bytes, and
/// counts the rest; its report says how many more there were.
#[test]
fn attacker_a_flood_of_walk_failures_stays_within_the_budget() {
    let now = Instant::now();
    let mut sink = sink_with(now, 4, 1, Vec::new());
    let huge = Failure {
        path: "p".repeat(1 << 16),
        error: "\u{1b}[2J".repeat(1 << 14),
    };
    let mut sent = 0u64;
    for round in 0..200 {
        let failed = (0..1000)
            .map(|i| match i {
                0 => huge.clone(),
                _ => Failure {
                    path: format!("src/{round}/{i}"),
                    error: "cannot read".into(),
                },
            })
            .collect::<Vec<_>>();
        sent += failed.len() as u64;
        sink.handle(
            now,
            Message::Entries(Entries {
                entries: Vec::new(),
                failed,
            }),
        )
        .unwrap();
        let (kept, unkept) = sink.walk_failures();
        assert!(kept <= MAX_WALK_FAILURES, "{kept}");
        assert_eq!(kept as u64 + unkept, sent);
    }
    sink.handle(now, Message::EntriesEnd(EntriesEnd { files: 0 }))
        .unwrap();
    while let Ok(Some(_)) = sink.poll_action() {}
    let report = sink.into_report();
    assert_eq!(report.failed.len(), MAX_WALK_FAILURES + 1);
    let bytes: usize = report
        .failed
        .iter()
        .map(|f| {
            assert!(f.path.len() <= MAX_FAILURE_PATH, "{}", f.path.len());
            f.path.len() + f.error.len()
        })
        .sum();
    assert!(
        bytes <= (MAX_WALK_FAILURES + 1) * (MAX_FAILURE_PATH + MAX_FAILURE_ERROR + 200),
        "{bytes}"
    );
    let last = &report.failed[MAX_WALK_FAILURES];
    let more = 200_000 - MAX_WALK_FAILURES as u64 - 1;
    assert!(
        last.error.contains(&format!("and {more} more")),
        "{}",
        last.error
    );
}

/// Walk failures change nothing for an older peer: an older sink reads
/// an `Entries` of failures alone as an empty batch and answers it with
/// an empty `Wants`, which the source takes; an older source's `Entries`
/// (no `failed`) reads as before.
#[test]
fn walk_failures_interoperate_with_an_older_peer() {
    #[derive(serde::Deserialize)]
    struct OlderEntries {
        entries: Vec<Entry>,
    }
    let now = Instant::now();
    let mut source = small_source(now);
    source.walk_failed(Failure {
        path: "src".into(),
        error: "data/src is a directory: use -r to copy trees".into(),
    });
    source.walk_ended();
    source.end_batch();
    let Some(Message::Entries(sent)) = source.poll_transmit() else {
        panic!("the failure goes out in an Entries")
    };
    let wire = serde_json::to_vec(&sent).unwrap();
    let older: OlderEntries = serde_json::from_slice(&wire).unwrap();
    assert!(older.entries.is_empty());
    source
        .handle(now, Message::Wants(Wants { wants: Vec::new() }))
        .expect("an older sink's empty answer is taken");
    assert!(matches!(
        source.poll_transmit(),
        Some(Message::EntriesEnd(EntriesEnd { files: 0 }))
    ));
    let from_older: Entries = serde_json::from_slice(br#"{"entries": []}"#).unwrap();
    assert!(from_older.failed.is_empty());
    assert_eq!(source.tally().failed.len(), 1);
}

#[test]
fn a_full_disk_ends_the_transfer_and_the_source_hears_why() {
    let files = tree(&[4 * CHUNK as usize]);
    let faults = Faults {
        full_after: Some(2),
        ..Faults::default()
    };
    let o = Pair::new(&files, 2, vec![0], faults).run();
    match &o.sink {
        Err(SinkError::Failed(e)) => assert!(e.contains("destination full"), "{e}"),
        other => panic!("{other:?}"),
    }
    match &o.source {
        Err(SourceError::Failed(e)) => assert!(
            e.contains("the sink ended the transfer early") && e.contains("destination full"),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }
    // What was verified is journaled: the next run resumes from it.
    assert_eq!(o.partials[&files[0].0].journal.len(), 2);
}

#[test]
fn a_file_in_place_is_skipped() {
    let files = tree(&[1000, 2 * CHUNK as usize]);
    let mut pair = Pair::new(&files, 2, vec![0], Faults::default());
    pair.snk
        .landed
        .insert(files[1].0.clone(), files[1].1.clone());
    let o = pair.run();
    let report = o.sink.as_ref().expect("finished");
    assert_eq!((report.files, report.skipped), (1, 1));
    assert!(o.reads.keys().all(|(p, _)| *p == files[0].0));
}

#[test]
fn a_source_announcing_too_many_files_is_refused() {
    let now = Instant::now();
    let mut sink = sink_with(now, 1, 1, (1..=3).map(file_entry).collect());
    let mut opened = 0;
    let err = loop {
        match sink.poll_action() {
            Ok(Some(SinkAction::Open(e))) => {
                opened += 1;
                sink.opened(now, e.id, send_all(e.id));
            }
            Ok(other) => panic!("{other:?}"),
            Err(e) => break e,
        }
    };
    assert_eq!(opened, 2);
    assert!(err.to_string().contains("more than 2 files"), "{err}");
}

fn file_entry(id: u64) -> Entry {
    Entry {
        id,
        path: format!("src/f{id}"),
        kind: Kind::File,
        size: 10,
        mode: 0o644,
        mtime_ns: 1,
        target: None,
        chunk_size: CHUNK,
        sparse: false,
        incomplete: false,
        digest: None,
        part: None,
    }
}

fn want_id(w: &Want) -> u64 {
    match w {
        Want::Send { id, .. } | Want::Skip { id } | Want::Fail { id, .. } => *id,
    }
}

fn send_all(id: u64) -> Want {
    Want::Send {
        id,
        skip: Vec::new(),
        resumed_bytes: 0,
    }
}

/// A sink allowing `max_files` in flight and `at_once` opens out, that
/// has taken one `Entries` message of `entries`.
fn sink_with(now: Instant, max_files: u64, at_once: usize, entries: Vec<Entry>) -> Sink {
    let mut sink = Sink::new(
        now,
        SinkLimits {
            max_files,
            max_chunks_per_file: 1 << 22,
            max_chunks_in_flight: 1 << 22,
            idle: IDLE,
        },
    );
    sink.open_at_once(at_once);
    sink.handle(
        now,
        Message::Entries(Entries {
            entries,
            failed: Vec::new(),
        }),
    )
    .expect("entries are welcome");
    sink
}

fn opens(sink: &mut Sink) -> Vec<u64> {
    let mut ids = Vec::new();
    while let Ok(Some(a)) = sink.poll_action() {
        match a {
            SinkAction::Open(e) => ids.push(e.id),
            other => panic!("only opens were due, got {other:?}"),
        }
    }
    ids
}

#[test]
fn opens_on_a_pool_stay_within_the_limit_and_answer_in_any_order() {
    let now = Instant::now();
    let mut sink = sink_with(now, 64, 2, (1..=3).map(file_entry).collect());
    assert_eq!(opens(&mut sink), vec![1, 2], "two out at once, no more");
    assert!(
        sink.poll_transmit().is_none(),
        "no Wants before every answer"
    );
    sink.opened(now, 2, send_all(2));
    assert_eq!(opens(&mut sink), vec![3]);
    sink.opened(now, 3, send_all(3));
    assert!(sink.poll_transmit().is_none());
    sink.opened(now, 1, send_all(1));
    let mut checked = Vec::new();
    while let Ok(Some(a)) = sink.poll_action() {
        if let SinkAction::Check(id) = a {
            checked.push(id);
        }
    }
    checked.sort_unstable();
    assert_eq!(checked, vec![1, 2, 3]);
    match sink.poll_transmit() {
        Some(Message::Wants(w)) => {
            let mut ids: Vec<u64> = w.wants.iter().map(want_id).collect();
            ids.sort_unstable();
            assert_eq!(ids, vec![1, 2, 3], "one Wants answers the whole message");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_file_announced_twice_while_in_flight_ends_the_transfer() {
    let now = Instant::now();
    let mut sink = sink_with(now, 64, 4, vec![file_entry(1), file_entry(1)]);
    assert!(matches!(sink.poll_action(), Ok(Some(SinkAction::Open(e))) if e.id == 1));
    let err = sink.poll_action().expect_err("one id, two files");
    assert!(err.to_string().contains("announced file 1 twice"), "{err}");
}

#[test]
fn a_dir_end_waits_for_the_opens_before_it() {
    let now = Instant::now();
    let mut end = file_entry(9);
    end.kind = Kind::DirEnd;
    end.path = "src".into();
    let mut sink = sink_with(now, 64, 8, vec![file_entry(1), end]);
    assert_eq!(opens(&mut sink), vec![1]);
    sink.opened(now, 1, send_all(1));
    assert!(matches!(
        sink.poll_action(),
        Ok(Some(SinkAction::DirEnd(e))) if e.path == "src"
    ));
}

#[test]
fn a_file_given_up_while_it_opens_is_dropped_when_the_answer_comes() {
    let now = Instant::now();
    let mut sink = sink_with(now, 64, 4, (1..=2).map(file_entry).collect());
    assert_eq!(opens(&mut sink), vec![1, 2]);
    sink.handle(
        now,
        Message::FileDone(FileDone {
            id: 2,
            changed: true,
            error: Some("gone".into()),
            ..FileDone::default()
        }),
    )
    .expect("a source may give a file up");
    // Nothing to discard until the driver has the file open.
    assert!(matches!(sink.poll_action(), Ok(None)));
    sink.opened(now, 2, send_all(2));
    assert!(matches!(
        sink.poll_action(),
        Ok(Some(SinkAction::Discard {
            id: 2,
            changed: true
        }))
    ));
    sink.opened(now, 1, send_all(1));
    assert!(matches!(sink.poll_action(), Ok(Some(SinkAction::Check(1)))));
    match sink.poll_transmit() {
        Some(Message::Wants(w)) => {
            assert_eq!(w.wants.iter().map(want_id).collect::<Vec<_>>(), vec![1]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sink.report_mut().failed.len(), 1, "counted once, as failed");
}

/// Many small files and two big ones: `n` small of 0..3000 bytes.
fn mixed(n: usize) -> Vec<(String, Vec<u8>)> {
    let mut sizes: Vec<usize> = (0..n).map(|i| i * 97 % 3000).collect();
    sizes.insert(n / 2, 3 * CHUNK as usize + 5);
    sizes.push(2 * CHUNK as usize);
    tree(&sizes)
}

fn reads_of(o: &Outcome, path: &str) -> u32 {
    o.reads
        .iter()
        .filter(|((p, _), _)| p == path)
        .map(|(_, n)| *n)
        .sum()
}

#[test]
fn bundles_carry_small_files_and_seals_and_dones_go_batched() {
    let files = mixed(40);
    let o = Pair::new(&files, 3, vec![0, 2, 1], Faults::default())
        .wide()
        .with_bundles()
        .run();
    expect_identical(&o, &files);
    let (bundles, sealed, done, _) = o.wire;
    assert!(
        bundles > 0 && bundles < 40,
        "{bundles} bundles for 40 small files"
    );
    assert!(sealed > 0, "no FilesSealed");
    assert!(done > 0, "no FilesDone");
    for (p, d) in &files {
        let chunks = chunk_count(d.len() as u64, CHUNK) as u32;
        assert_eq!(reads_of(&o, p), chunks, "{p} read again");
    }
}

#[test]
fn without_negotiation_nothing_new_goes_on_the_wire() {
    // What an old peer sees: chunk frames and per-file messages only.
    let files = mixed(40);
    let o = Pair::new(&files, 3, vec![0, 2, 1], Faults::default())
        .wide()
        .run();
    expect_identical(&o, &files);
    let (bundles, sealed, done, single) = o.wire;
    assert_eq!((bundles, sealed, done), (0, 0, 0));
    assert!(single >= 2 * files.len(), "{single}");
}

#[test]
fn a_damaged_bundle_record_resends_only_its_file() {
    let files = tree(&[1000, 2000, 3000, 10, 500]);
    let faults = Faults {
        corrupt: vec![0],
        ..Faults::default()
    };
    let o = Pair::new(&files, 2, vec![0], faults)
        .wide()
        .with_bundles()
        .run();
    expect_identical(&o, &files);
    assert!(o.wire.0 > 0);
    let again: Vec<&String> = files
        .iter()
        .map(|(p, _)| p)
        .filter(|p| reads_of(&o, p) > 1)
        .collect();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(reads_of(&o, again[0]), 2);
}

#[test]
fn a_duplicated_bundle_lands_each_file_once() {
    let files = tree(&[1000, 2000, 0, 10, 500, 64]);
    let faults = Faults {
        duplicate: vec![0, 1],
        ..Faults::default()
    };
    let o = Pair::new(&files, 2, vec![0, 1], faults)
        .wide()
        .with_bundles()
        .run();
    expect_identical(&o, &files);
    for (p, _) in &files {
        let w = o.writes.get(&(p.clone(), 0)).copied().unwrap_or(0);
        assert_eq!(w, 1, "{p} written {w} times");
    }
}

#[test]
fn a_bundle_record_for_a_failed_file_is_dropped_and_the_others_land() {
    // The failing file's record carries a hash that cannot match; the
    // source then fails it, and the sink drops whatever comes of it.
    let files = tree(&[1000, 2000, 3000, 4000]);
    let faults = Faults {
        read_error: vec![files[1].0.clone()],
        duplicate: vec![0],
        ..Faults::default()
    };
    let o = Pair::new(&files, 2, vec![0, 1], faults)
        .wide()
        .with_bundles()
        .run();
    assert!(o.source.is_ok(), "{:?}", o.source);
    let report = o.sink.as_ref().expect("finished");
    assert_eq!(report.files, 3);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].path, files[1].0);
    assert!(!o.landed.contains_key(&files[1].0));
    for i in [0, 2, 3] {
        assert_eq!(o.landed.get(&files[i].0), Some(&files[i].1));
    }
}

#[test]
fn a_rerun_with_bundles_reads_only_what_was_not_verified() {
    let files = mixed(12);
    let faults = Faults {
        full_after: Some(6),
        ..Faults::default()
    };
    let first = Pair::new(&files, 2, vec![0, 1], faults)
        .wide()
        .with_bundles()
        .run();
    assert!(first.sink.is_err());
    let mut again = Pair::new(&files, 2, vec![1, 0], Faults::default())
        .wide()
        .with_bundles();
    again.snk.partials = first.partials.clone();
    let o = again.run();
    expect_identical(&o, &files);
    for (p, d) in &files {
        let kept = first.partials.get(p).map_or(0, |x| x.journal.len()) as u32;
        let chunks = chunk_count(d.len() as u64, CHUNK) as u32;
        assert_eq!(reads_of(&o, p), chunks - kept, "{p}");
    }
}

/// A sink's figures are the peer's word: resumed bytes near `u64::MAX`,
/// or files whose sizes add past it, leave the source's tally at the top
/// instead of overflowing (found by the `transfer_machines` fuzz target).
#[test]
fn a_sinks_huge_figures_saturate_the_sources_tally() {
    let now = Instant::now();
    let mut source = small_source(now);
    for id in 1..=2 {
        let entry = Entry {
            id,
            path: format!("src/f{id}"),
            kind: Kind::File,
            size: u64::MAX / 2 + 1,
            mode: 0o644,
            mtime_ns: 1,
            target: None,
            chunk_size: 1 << 31,
            sparse: false,
            incomplete: false,
            digest: None,
            part: None,
        };
        source.add(entry, id, 1);
    }
    source.end_batch();
    while source.poll_transmit().is_some() {}
    let send = |id| Want::Send {
        id,
        skip: Vec::new(),
        resumed_bytes: u64::MAX,
    };
    source
        .handle(
            now,
            Message::Wants(Wants {
                wants: vec![send(1), send(2)],
            }),
        )
        .expect("wants are welcome");
    assert_eq!(source.tally().resumed_bytes, u64::MAX);
    for id in 1..=2 {
        source
            .handle(
                now,
                Message::FileDone(FileDone {
                    id,
                    digest: Some("00".repeat(32)),
                    ..FileDone::default()
                }),
            )
            .expect("a file done is welcome");
    }
    assert_eq!(source.tally().files, 2);
    assert_eq!(source.tally().bytes, u64::MAX);
}

/// The work ahead of the streams (what a fleet's feed leases by): what
/// was announced (a part's bytes, not its file's), less what was read and
/// what the sink already had; a file announced again is not counted twice.
#[test]
fn the_bytes_ahead_are_announced_less_read_and_resumed() {
    let now = Instant::now();
    let mut source = small_source(now);
    let file = |id, part| Entry {
        id,
        path: format!("src/f{id}"),
        kind: Kind::File,
        size: 400,
        mode: 0o644,
        mtime_ns: 1,
        target: None,
        chunk_size: 100,
        sparse: false,
        incomplete: false,
        digest: None,
        part,
    };
    source.add(file(1, None), 1, 1);
    source.add(file(2, Some([1, 3])), 2, 1);
    assert_eq!(source.unsent_bytes(), 600);
    source.add(file(1, None), 1, 2);
    assert_eq!(source.unsent_bytes(), 600, "announced again: counted once");
    source.end_batch();
    while source.poll_transmit().is_some() {}
    source.sent(now, 150, 10);
    assert_eq!(source.unsent_bytes(), 450);
    source
        .handle(
            now,
            Message::Wants(Wants {
                wants: vec![Want::Send {
                    id: 2,
                    skip: vec![[1, 2]],
                    resumed_bytes: 100,
                }],
            }),
        )
        .expect("wants are welcome");
    assert_eq!(source.unsent_bytes(), 350);
    source.sent(now, 10_000, 10);
    assert_eq!(source.unsent_bytes(), 0, "resends read more: never below 0");
}

/// A source taking 8 files at a time, as the tests of its tallies use.
fn small_source(now: Instant) -> Source<u64> {
    Source::new(
        now,
        SourceLimits {
            batch: 8,
            files_in_flight: 8,
            max_files_in_flight: 8,
            idle: IDLE,
        },
    )
}

/// A source with one file, `src/big` of `chunks` chunks of [`CHUNK`],
/// announced (id 1).
fn source_announcing_one_file(now: Instant, chunks: u64) -> Source<u64> {
    let mut source = small_source(now);
    source.add(
        Entry {
            path: "src/big".into(),
            size: chunks * CHUNK,
            ..file_entry(1)
        },
        1,
        1,
    );
    source.end_batch();
    while source.poll_transmit().is_some() {}
    source
}

/// A source with one file of `chunks` chunks of [`CHUNK`] announced and
/// wanted whole by the sink.
fn source_sending_one_file(now: Instant, chunks: u64) -> Source<u64> {
    let mut source = source_announcing_one_file(now, chunks);
    want_whole(&mut source, now);
    source
}

/// The sink wants file 1 whole.
fn want_whole(source: &mut Source<u64>, now: Instant) {
    source
        .handle(
            now,
            Message::Wants(Wants {
                wants: vec![send_all(1)],
            }),
        )
        .expect("wants are welcome");
}

/// What the source's driver is told to read: whole files planned, and
/// resends.
fn reads_asked(source: &mut Source<u64>) -> (usize, usize) {
    let (mut plans, mut resends) = (0, 0);
    while let Some(a) = source.poll_action() {
        match a {
            SourceAction::Plan { .. } => plans += 1,
            SourceAction::Resend(_) => resends += 1,
            _ => {}
        }
    }
    (plans, resends)
}

/// A hostile sink (a client pulling from a server) that says `send` for
/// one file again and again would have the source read and send the
/// whole file each time (a file's worth of reads for a few bytes): a file
/// is planned once, whatever the sink says after.
#[test]
fn attacker_a_file_wanted_again_is_planned_once() {
    let now = Instant::now();
    let mut source = source_sending_one_file(now, 4);
    for _ in 0..100 {
        source
            .handle(
                now,
                Message::Wants(Wants {
                    wants: vec![send_all(1)],
                }),
            )
            .expect("a repeated want is ignored, not fatal");
    }
    assert_eq!(reads_asked(&mut source), (1, 0));
}

/// A hostile sink that asks the same chunk again without end would have
/// the source read and send it without end, and queue each ask while its
/// streams are not read: an honest sink asks a chunk at most
/// `MAX_DAMAGED` times for damage and `MAX_STALL_RESENDS` for a stall,
/// so a file's resends are capped at that many per chunk, and the sink
/// asking for more ends the transfer.
#[test]
fn attacker_a_chunk_asked_again_without_end_ends_the_transfer() {
    use longhaul_proto::transfer::{sink::MAX_DAMAGED, tail::MAX_STALL_RESENDS};
    let now = Instant::now();
    let chunks = 4u64;
    let per_chunk = (MAX_DAMAGED + MAX_STALL_RESENDS) as usize;
    let mut source = source_sending_one_file(now, chunks);
    assert_eq!(reads_asked(&mut source), (1, 0));
    let mut asked = 0usize;
    let resend = Message::Resend(Resend { id: 1, index: 0 });
    let error = loop {
        match source.handle(now, resend.clone()) {
            Ok(()) => asked += 1,
            Err(e) => break e,
        }
        assert!(
            asked <= 10_000,
            "the source took 10,000 resends of one chunk"
        );
    };
    assert_eq!(asked, per_chunk * chunks as usize, "an honest sink's worst");
    assert_eq!(reads_asked(&mut source), (0, asked));
    let error = error.to_string();
    assert!(error.contains("src/big"), "{error}");
}

/// The 100k-file first copy that hung (both ends waiting on the
/// control connection): at the tail, with the walk done, the end game
/// asked a chunk of a file whose open was answered but whose `Send`
/// still waited for the rest of its message's opens (a loaded
/// machine's openers, slower than the 200 ms patience). The ask
/// reached the source before the `Wants`: the file was not planned,
/// so the ask was dropped, and the seal (0 resends) never covered the
/// one the sink's ledger waited for: the file was never finished.
#[test]
fn a_stalled_ask_waits_for_the_files_send_answer() {
    let t0 = Instant::now();
    let mut src = small_source(t0);
    for id in [1, 2] {
        src.add(file_entry(id), id, 1);
    }
    src.end_batch();
    while src.poll_transmit().is_some() {}
    let mut snk = sink_with(t0, 16, 2, vec![file_entry(1), file_entry(2)]);
    assert_eq!(opens(&mut snk), vec![1, 2]);
    let mut ledger = FileLedger::new(1, []);
    snk.opened(t0, 1, send_all(1));
    // File 1 is open at the sink; its Send waits for file 2's open.
    assert!(!snk.may_resend(1) && !snk.may_resend(2));
    if snk.stalled(t0, Resend { id: 1, index: 0 }, 10) {
        ledger.damaged();
    }
    snk.opened(t0, 2, send_all(2));
    while snk.poll_action().expect("no error").is_some() {}
    while let Some(msg) = snk.poll_transmit() {
        src.handle(t0, msg)
            .expect("the sink's messages are welcome");
    }
    let planned: Vec<u64> = std::iter::from_fn(|| src.poll_action())
        .filter_map(|a| match a {
            SourceAction::Plan { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    assert_eq!(planned, [1, 2]);
    // The first read of file 1 arrives whole; the source seals it with
    // the resends it read (none).
    assert!(ledger.verified(0, [7; 32]));
    ledger.seal(0);
    assert!(ledger.claim(), "file 1 waits for a seal that never comes");
    // Once the Send is out, a stalled chunk is asked, after it.
    assert!(snk.stalled(t0, Resend { id: 2, index: 0 }, 10));
    assert!(matches!(
        snk.poll_transmit(),
        Some(Message::Resend(Resend { id: 2, index: 0 }))
    ));
}

/// A sink of an earlier release (before the end game waited for a file's
/// `Send` answer) still asks a stalled chunk of a file whose `Send` has
/// not gone out: the source has not planned that file when the ask
/// arrives. Dropped, the ask left the sink waiting for a seal that
/// covered it until the idle time-out (300 s); counted toward the file's
/// seal, the transfer ends, and the ask costs no read: the file's planned
/// reads carry the chunk.
#[test]
fn an_older_sinks_ask_before_the_send_answer_still_ends_the_transfer() {
    let files = tree(&[
        0,
        1,
        3 * CHUNK as usize + 5,
        CHUNK as usize,
        2 * CHUNK as usize,
    ]);
    for bundles in [false, true] {
        let mut pair = Pair::new(&files, 3, vec![0, 2, 1], Faults::default())
            .with_open_pool()
            .with_a_sink_asking_before_its_send();
        if bundles {
            pair = pair.with_bundles();
        }
        let o = pair.run();
        expect_identical(&o, &files);
        assert!(
            o.elapsed < IDLE,
            "waited {:?} (bundles {bundles})",
            o.elapsed
        );
        assert_eq!(
            o.resends_asked, 0,
            "an ask before the plan is read by the plan"
        );
        assert!(o.reads.values().all(|&n| n == 1), "{:?}", o.reads);
    }
}

/// The machine's part of it: an ask for a chunk of an announced file not
/// yet planned reads nothing, and every seal of that file counts it.
#[test]
fn an_ask_before_the_send_want_is_counted_in_every_seal_of_its_file() {
    let now = Instant::now();
    let mut source = source_announcing_one_file(now, 4);
    for index in [2, 9] {
        source
            .handle(now, Message::Resend(Resend { id: 1, index }))
            .expect("an ask before the plan is welcome");
    }
    // Of a file never announced: ignored, as before.
    source
        .handle(now, Message::Resend(Resend { id: 7, index: 0 }))
        .expect("ignored");
    assert_eq!(reads_asked(&mut source), (0, 0));
    want_whole(&mut source, now);
    assert_eq!(
        reads_asked(&mut source),
        (1, 0),
        "planned; nothing read again"
    );
    source.sealed(now, 1, 0);
    assert!(matches!(
        source.poll_transmit(),
        Some(Message::FileSealed(FileSealed { id: 1, resends: 1 }))
    ));
    // A resend after the plan is served, and the next seal counts both.
    source
        .handle(now, Message::Resend(Resend { id: 1, index: 3 }))
        .expect("served");
    assert_eq!(reads_asked(&mut source), (0, 1));
    source.sealed(now, 1, 1);
    assert!(matches!(
        source.poll_transmit(),
        Some(Message::FileSealed(FileSealed { id: 1, resends: 2 }))
    ));
}

/// Asks before the plan are held to the same cap as the others: a sink
/// asking a file's chunks again before its `Send` more than an honest
/// sink can ends the transfer, and nothing was read for them.
#[test]
fn attacker_asks_before_the_send_want_are_capped_too() {
    use longhaul_proto::transfer::source::MAX_RESENDS_PER_CHUNK;
    let now = Instant::now();
    let mut source = source_announcing_one_file(now, 2);
    let mut asked = 0u64;
    let error = loop {
        match source.handle(now, Message::Resend(Resend { id: 1, index: 1 })) {
            Ok(()) => asked += 1,
            Err(e) => break e.to_string(),
        }
        assert!(asked <= 10_000, "the source took 10,000 asks");
    };
    assert_eq!(asked, 2 * MAX_RESENDS_PER_CHUNK);
    assert!(error.contains("src/big"), "{error}");
    assert_eq!(reads_asked(&mut source), (0, 0));
}
