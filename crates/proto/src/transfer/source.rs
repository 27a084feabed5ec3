//! The source's side of the transfer protocol as a state machine, with no
//! I/O and no clock (quinn-proto style).
//!
//! The driver walks the file tree and reads chunks; the machine decides
//! what is announced when (files in flight), what the sink's answers and
//! resend requests mean for the reads, when a file is sealed, failed or
//! announced again after it changed while it was read, and when the
//! transfer is over. `H` is what the driver needs to find a file again
//! (its path and the version announced); the machine only hands it back.
//!
//! A batch of entries is built with [`Source::batch_has_room`],
//! [`Source::take_again`], [`Source::add`] and [`Source::end_batch`];
//! everything else comes in through `handle` and the event methods, and
//! goes out through [`Source::poll_transmit`] and [`Source::poll_action`].

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::msg::Message;
use crate::plan::{chunk_at, chunk_count, Chunk};
use crate::xfer::*;

/// Times a file is read in all when it changes while it is read: then it
/// is reported as changed, never sent torn.
pub const MAX_READS_OF_A_CHANGING_FILE: u32 = 3;

/// Resends of a file the source serves, per chunk of it: all an honest
/// sink can ask (a chunk [`MAX_DAMAGED`](super::sink::MAX_DAMAGED) times
/// damaged, and [`MAX_STALL_RESENDS`](super::tail::MAX_STALL_RESENDS)
/// times stuck on a stalled stream), counted over the file; a sink asking
/// more ends the transfer.
pub const MAX_RESENDS_PER_CHUNK: u64 =
    (super::sink::MAX_DAMAGED + super::tail::MAX_STALL_RESENDS) as u64;

/// Bytes of entries one `Entries` message carries at most (paths can be
/// 4 KiB each: a batch stays well inside one frame).
pub const BATCH_BYTES: usize = 256 << 10;

/// What one source allows and starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLimits {
    /// Entries per `Entries` message.
    pub batch: usize,
    /// Files announced and not yet resolved, at the start...
    pub files_in_flight: u64,
    /// ...and at most (the sink's cap, toward which the count grows while
    /// it holds the transfer back).
    pub max_files_in_flight: u64,
    /// The transfer fails once nothing moved for this long.
    pub idle: Duration,
}

/// Why the source gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("the transfer: nothing moved for {} s", .0.as_secs())]
    Idle(Duration),
    /// A file's chunk size cannot be planned (the driver's own numbers).
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Failed(String),
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceAction<H> {
    /// Queue the file's chunks for reading, except the `skip` ranges; if
    /// that leaves nothing to read, check the file now and answer with
    /// [`Source::sealed`] or [`Source::changed`].
    Plan {
        id: u64,
        /// Its path as announced.
        path: String,
        handle: H,
        size: u64,
        chunk_size: u64,
        skip: Vec<[u32; 2]>,
    },
    /// Read this chunk again and send it (it arrived damaged).
    Resend(Chunk),
    /// Stop reading the file: it is resolved or given up.
    Forget(u64),
    /// A file landed at the sink: count it and record its digest.
    Landed(super::Landed),
    /// Every entry is announced.
    WalkDone,
    /// The file changed while it was read (`why`) and is announced again.
    Retrying { path: String, why: String },
    /// The destination had no room for the file while others were in
    /// flight (`why`): it is announced again once nothing else is.
    Deferred { path: String, why: String },
}

/// An announced file the sink has not resolved yet.
struct Announced<H> {
    rel: String,
    handle: H,
    size: u64,
    /// The bytes this transfer carries of it (its part's, or all).
    carried: u64,
    mtime_ns: i64,
    chunk_size: u64,
    /// Times it was announced (1 the first time).
    attempt: u32,
    planned: bool,
    /// Resends the sink asked of it (capped: [`MAX_RESENDS_PER_CHUNK`]).
    resends: u64,
    /// Of those, asked before it was planned: read by nothing but the
    /// plan, and counted in each of its seals.
    asked_unplanned: u32,
}

/// What the source counts of a transfer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SourceTally {
    pub files: u64,
    pub bytes: u64,
    /// Files that changed while they were read and were sent again.
    pub resent_changed: u64,
    pub skipped: u64,
    pub resumed_bytes: u64,
    pub failed: Vec<Failure>,
    /// Bytes read and the summed busy time of the reads.
    pub read_bytes: u64,
    pub read_us: u64,
}

/// The source's end of one transfer.
pub struct Source<H> {
    limits: SourceLimits,
    files_limit: u64,
    open: HashMap<u64, Announced<H>>,
    /// Files that changed while they were read, to announce again: (what
    /// finds them, name, times announced so far).
    again: VecDeque<(H, String, u32)>,
    /// Files the sink had no room for while others were in flight
    /// ([`FileDone::full`]): announced again one at a time, once the walk
    /// is done and nothing else is in flight, so that each has the room
    /// to itself.
    later: VecDeque<(H, String, u32)>,
    walk_done: bool,
    end_sent: bool,
    files_announced: u64,
    /// The bytes the files announced carry (first announcements).
    announced_bytes: u64,
    largest_chunk: u64,
    batch: Vec<Entry>,
    /// What the walk could not announce, told with the batch.
    batch_failed: Vec<Failure>,
    batch_bytes: usize,
    tally: SourceTally,
    sink_report: Option<SinkReport>,
    actions: VecDeque<SourceAction<H>>,
    transmits: VecDeque<Message>,
    /// Bundles were negotiated: seals and dones go out batched.
    batched: bool,
    last_activity: Instant,
}

impl<H: Clone> Source<H> {
    pub fn new(now: Instant, limits: SourceLimits) -> Self {
        let max = limits.max_files_in_flight.max(1);
        Self {
            files_limit: limits.files_in_flight.clamp(1, max),
            limits,
            open: HashMap::new(),
            again: VecDeque::new(),
            later: VecDeque::new(),
            walk_done: false,
            end_sent: false,
            files_announced: 0,
            announced_bytes: 0,
            largest_chunk: 0,
            batch: Vec::new(),
            batch_failed: Vec::new(),
            batch_bytes: 0,
            tally: SourceTally::default(),
            sink_report: None,
            actions: VecDeque::new(),
            transmits: VecDeque::new(),
            batched: false,
            last_activity: now,
        }
    }

    /// Both ends agreed to bundles ([`TransferAccept::bundles`]): runs of
    /// seals leave as one `FilesSealed`.
    pub fn batch_messages(&mut self) {
        self.batched = true;
    }

    /// Whether entries may be announced now: the walk (or a file to
    /// announce again) has more, and the files in flight leave room.
    pub fn wants_entries(&self) -> bool {
        (!self.walk_done || !self.again.is_empty() || self.later_due())
            && self.open.len() < self.limit()
    }

    /// Whether a file deferred for room is to be announced now: the walk
    /// is done, nothing else waits to be announced, nothing is in flight.
    fn later_due(&self) -> bool {
        self.walk_done
            && self.again.is_empty()
            && self.open.is_empty()
            && self.batch.is_empty()
            && !self.later.is_empty()
    }

    /// Whether the batch being built takes another entry.
    pub fn batch_has_room(&self) -> bool {
        self.batch.len() < self.limits.batch
            && self.batch_bytes < BATCH_BYTES
            && self.open.len() < self.limit()
    }

    /// A file to announce again (it changed while it was read), before
    /// the walk goes on: what finds it, its name and its next attempt.
    pub fn take_again(&mut self) -> Option<(H, String, u32)> {
        let next = match self.again.pop_front() {
            Some(a) => Some(a),
            None if self.later_due() => self.later.pop_front(),
            None => None,
        };
        next.map(|(h, rel, n)| (h, rel, n + 1))
    }

    /// Whether the walk has ended (no more entries but those announced again).
    pub fn walk_done(&self) -> bool {
        self.walk_done
    }

    /// The walk found no more entries.
    pub fn walk_ended(&mut self) {
        self.walk_done = true;
    }

    /// Adds an entry to the batch; a file is `attempt`th announcement
    /// (1 the first time) and `handle` finds it again.
    pub fn add(&mut self, entry: Entry, handle: H, attempt: u32) {
        if entry.kind == Kind::File {
            // A file announced again takes its first id's place.
            if attempt == 1 {
                self.files_announced += 1;
                self.announced_bytes = self.announced_bytes.saturating_add(entry.carried_bytes());
            }
            self.largest_chunk = self.largest_chunk.max(entry.chunk_size);
            self.open.insert(
                entry.id,
                Announced {
                    rel: entry.path.clone(),
                    handle,
                    size: entry.size,
                    carried: entry.carried_bytes(),
                    mtime_ns: entry.mtime_ns,
                    chunk_size: entry.chunk_size,
                    attempt,
                    planned: false,
                    resends: 0,
                    asked_unplanned: 0,
                },
            );
        }
        self.batch_bytes += entry.path.len() + entry.target.as_ref().map_or(0, String::len) + 200;
        self.batch.push(entry);
    }

    /// Something the walk could not announce: counted failed here, and
    /// told to the sink with the batch ([`Entries::failed`]), so that the
    /// end that reports (the client, on a pull) counts it too.
    pub fn walk_failed(&mut self, f: Failure) {
        let sent = f.clone().capped();
        self.batch_bytes += sent.path.len() + sent.error.len() + 64;
        self.batch_failed.push(sent);
        self.tally.failed.push(f);
    }

    /// Sends the batch (with what the walk could not announce), and
    /// `EntriesEnd` once the walk is done.
    pub fn end_batch(&mut self) {
        self.batch_bytes = 0;
        if !self.batch.is_empty() || !self.batch_failed.is_empty() {
            self.transmits.push_back(Message::Entries(Entries {
                entries: std::mem::take(&mut self.batch),
                failed: std::mem::take(&mut self.batch_failed),
            }));
        }
        if self.walk_done && !self.end_sent {
            self.end_sent = true;
            self.actions.push_back(SourceAction::WalkDone);
            self.transmits.push_back(Message::EntriesEnd(EntriesEnd {
                files: self.files_announced,
            }));
        }
    }

    /// A control message from the sink.
    pub fn handle(&mut self, now: Instant, msg: Message) -> Result<(), SourceError> {
        self.last_activity = now;
        match msg {
            Message::Wants(w) => {
                for want in w.wants {
                    match want {
                        Want::Send {
                            id,
                            skip,
                            resumed_bytes,
                        } => {
                            // Planned once: a `send` said again would have the
                            // whole file read again.
                            let Some(a) = self.open.get_mut(&id).filter(|a| !a.planned) else {
                                continue;
                            };
                            self.tally.resumed_bytes =
                                self.tally.resumed_bytes.saturating_add(resumed_bytes);
                            a.planned = true;
                            self.actions.push_back(SourceAction::Plan {
                                id,
                                path: a.rel.clone(),
                                handle: a.handle.clone(),
                                size: a.size,
                                chunk_size: a.chunk_size,
                                skip,
                            });
                        }
                        Want::Skip { id } => {
                            if self.open.remove(&id).is_some() {
                                self.tally.skipped += 1;
                            }
                        }
                        Want::Fail { id, error } => {
                            if let Some(a) = self.open.remove(&id) {
                                self.tally.failed.push(Failure { path: a.rel, error });
                            }
                        }
                    }
                }
            }
            Message::Resend(r) => self.resend(&r)?,
            Message::FileDone(d) => self.done(d),
            Message::FilesDone(ds) => {
                for d in ds.items {
                    self.done(d);
                }
            }
            Message::TransferDone(sink) => {
                if !self.walk_done
                    || !self.open.is_empty()
                    || !self.again.is_empty()
                    || !self.later.is_empty()
                {
                    let why = sink
                        .failed
                        .iter()
                        .map(|f| f.error.clone())
                        .collect::<Vec<_>>()
                        .join("; ");
                    return Err(SourceError::Failed(format!(
                        "the sink ended the transfer early: {why}"
                    )));
                }
                self.sink_report = Some(sink);
            }
            Message::Refuse(r) => {
                return Err(SourceError::Failed(format!(
                    "peer ended the transfer: {}",
                    r.message
                )));
            }
            m => {
                return Err(SourceError::Failed(format!(
                    "peer sent an unexpected {} message during the transfer",
                    m.name()
                )))
            }
        }
        Ok(())
    }

    /// The sink's word on one file: landed, failed, or no room for it
    /// while others were in flight (announced again later, alone).
    fn done(&mut self, d: FileDone) {
        self.actions.push_back(SourceAction::Forget(d.id));
        if let Some(a) = self.open.remove(&d.id) {
            if let (true, Some(why)) = (d.full, &d.error) {
                self.actions.push_back(SourceAction::Deferred {
                    path: a.rel.clone(),
                    why: why.clone(),
                });
                self.later.push_back((a.handle, a.rel, a.attempt));
                return;
            }
            match d.error {
                Some(error) => self.tally.failed.push(Failure { path: a.rel, error }),
                None => {
                    self.tally.files += 1;
                    self.tally.bytes = self.tally.bytes.saturating_add(a.carried);
                    self.actions.push_back(SourceAction::Landed(super::Landed {
                        path: a.rel,
                        size: a.size,
                        mtime_ns: a.mtime_ns,
                        digest: d.digest,
                    }));
                }
            }
        }
    }

    /// The sink asks a chunk again: queued for the driver if it names a
    /// chunk of a file planned for sending, and the sink has not asked
    /// more of that file than an honest sink can.
    ///
    /// An ask for a file announced but not yet planned (its `send` want
    /// not yet here) is counted toward the file's seals and reads nothing:
    /// a sink of an earlier release asked a stalled chunk before its
    /// `send` want had gone out, and waited for a seal covering the ask.
    /// The plan reads every chunk the sink did not say it holds, and the
    /// seal goes out after those reads and the check that the file did
    /// not change, so it covers what the ask asked for; served instead,
    /// the ask would read the chunk twice. Held to the same cap.
    fn resend(&mut self, r: &Resend) -> Result<(), SourceError> {
        let Some(a) = self.open.get_mut(&r.id) else {
            return Ok(());
        };
        let count = chunk_count(a.size, a.chunk_size);
        if u64::from(r.index) >= count {
            return Ok(());
        }
        if a.resends >= count.saturating_mul(MAX_RESENDS_PER_CHUNK) {
            return Err(SourceError::Failed(format!(
                "the sink asked for the chunks of {} again more than {MAX_RESENDS_PER_CHUNK} \
                 times each: a broken or hostile peer",
                a.rel
            )));
        }
        a.resends += 1;
        if !a.planned {
            a.asked_unplanned = a.asked_unplanned.saturating_add(1);
            return Ok(());
        }
        self.actions.push_back(SourceAction::Resend(chunk_at(
            r.id,
            a.size,
            a.chunk_size,
            r.index,
        )));
        Ok(())
    }

    /// A chunk was read and sent.
    pub fn sent(&mut self, now: Instant, read_bytes: u64, read_us: u64) {
        self.last_activity = now;
        self.tally.read_bytes = self.tally.read_bytes.saturating_add(read_bytes);
        self.tally.read_us += read_us;
    }

    /// Every read of file `id` so far is done (`resends` of them serving
    /// resends) and the file did not change. The seal also counts the
    /// asks that came before the file was planned (see `resend`).
    pub fn sealed(&mut self, now: Instant, id: u64, resends: u32) {
        self.last_activity = now;
        if let Some(a) = self.open.get(&id) {
            let resends = resends.saturating_add(a.asked_unplanned);
            self.transmits
                .push_back(Message::FileSealed(FileSealed { id, resends }));
        }
    }

    /// File `id` could not be read.
    pub fn file_failed(&mut self, now: Instant, id: u64, error: String) {
        self.last_activity = now;
        if let Some(a) = self.open.remove(&id) {
            self.tally.failed.push(Failure {
                path: a.rel,
                error: error.clone(),
            });
            self.transmits.push_back(Message::FileDone(FileDone {
                id,
                error: Some(error),
                ..FileDone::default()
            }));
        }
    }

    /// File `id` changed while it was read (`why`, in words): what arrived
    /// of it is discarded at the sink, and it is announced again (a new
    /// id, read afresh) until it has been read
    /// [`MAX_READS_OF_A_CHANGING_FILE`] times; then it fails as changed.
    /// Never sealed, so never renamed into place torn.
    pub fn changed(&mut self, now: Instant, id: u64, why: &str) {
        self.last_activity = now;
        self.actions.push_back(SourceAction::Forget(id));
        let Some(a) = self.open.remove(&id) else {
            return;
        };
        let retried = a.attempt < MAX_READS_OF_A_CHANGING_FILE;
        let error = if retried {
            self.tally.resent_changed += 1;
            format!("changed while it was read ({why}); sent again")
        } else {
            let error = format!(
                "changed while it was read, {} times in a row ({why}): not copied; copy it again once nothing writes to it",
                a.attempt
            );
            self.tally.failed.push(Failure {
                path: a.rel.clone(),
                error: error.clone(),
            });
            error
        };
        if retried {
            self.actions.push_back(SourceAction::Retrying {
                path: a.rel.clone(),
                why: why.to_string(),
            });
            self.again.push_back((a.handle, a.rel, a.attempt));
        }
        // Before the file is announced again: the sink must drop this
        // id's partial file before the new id opens one of that name.
        self.transmits.push_back(Message::FileDone(FileDone {
            id,
            error: Some(error),
            changed: true,
            retried,
            ..FileDone::default()
        }));
    }

    /// One tuning interval ended; `held_by_files`: the files in flight
    /// were all announced while the streams had nothing left to send, so
    /// their count grows (up to the sink's cap).
    pub fn interval(&mut self, held_by_files: bool) -> u64 {
        self.files_limit = crate::tune::grow_files_in_flight(
            self.files_limit,
            held_by_files,
            self.limits.max_files_in_flight.max(1),
        );
        self.files_limit
    }

    /// Files in flight allowed now.
    pub fn files_limit(&self) -> u64 {
        self.files_limit
    }

    /// Files announced and not resolved.
    pub fn in_flight(&self) -> usize {
        self.open.len()
    }

    /// About the bytes announced and not yet read for sending: what was
    /// announced, less what was read and what the sink already had.
    pub fn unsent_bytes(&self) -> u64 {
        self.announced_bytes
            .saturating_sub(self.tally.read_bytes)
            .saturating_sub(self.tally.resumed_bytes)
    }

    /// The largest chunk size announced.
    pub fn largest_chunk(&self) -> u64 {
        self.largest_chunk
    }

    pub fn tally(&self) -> &SourceTally {
        &self.tally
    }

    pub fn poll_transmit(&mut self) -> Option<Message> {
        super::next_transmit(&mut self.transmits, self.batched)
    }

    pub fn poll_action(&mut self) -> Option<SourceAction<H>> {
        self.actions.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.sink_report
            .is_none()
            .then_some(self.last_activity + self.limits.idle)
    }

    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), SourceError> {
        match self.poll_timeout() {
            Some(t) if now >= t => Err(SourceError::Idle(self.limits.idle)),
            _ => Ok(()),
        }
    }

    /// The sink's report, once the transfer is over.
    pub fn finished(&mut self) -> Option<(SourceTally, SinkReport)> {
        let sink = self.sink_report.take()?;
        Some((self.tally.clone(), sink))
    }

    fn limit(&self) -> usize {
        usize::try_from(self.files_limit).unwrap_or(usize::MAX)
    }
}
