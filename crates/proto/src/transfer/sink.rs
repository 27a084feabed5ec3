//! The sink's side of the transfer protocol as a state machine, with no
//! I/O and no clock (quinn-proto style).
//!
//! The driver (the engine, or the test harness) feeds control messages in
//! with [`Sink::handle`], tells the machine what came of the file work it
//! asked for ([`Sink::opened`], [`Sink::file_done`], [`Sink::damaged`]),
//! performs what [`Sink::poll_action`] yields, sends what
//! [`Sink::poll_transmit`] yields, and calls [`Sink::handle_timeout`] once
//! `now` passes [`Sink::poll_timeout`].
//!
//! Chunks themselves never pass through the machine: data streams are read
//! on threads of their own, each chunk checked against its hash and booked
//! in the file's [`FileLedger`] (a pure type, held by the driver beside the
//! file, so that a receiver thread completes a file without a round trip
//! through the control thread). The machine tells the driver when the
//! ledger must change for a protocol reason ([`SinkAction::Seal`],
//! [`SinkAction::Discard`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::msg::Message;
use crate::plan::chunk_count;
use crate::xfer::*;

/// Times one chunk may arrive damaged before the path is declared broken.
pub const MAX_DAMAGED: u32 = 3;

/// How long the sink waits for the source's last word after its report.
pub const SOURCE_DONE_WAIT: Duration = Duration::from_secs(2);

/// What one sink allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkLimits {
    /// Files in flight this side advertised; a source may announce twice
    /// as many before their answers arrive, never more.
    pub max_files: u64,
    /// Chunks one file may have (its ledger is kept while it is in flight).
    pub max_chunks_per_file: u64,
    /// Chunks of all files in flight together.
    pub max_chunks_in_flight: u64,
    /// The transfer fails once nothing moved for this long.
    pub idle: Duration,
}

/// Why the sink gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// Nothing moved for the idle time.
    #[error("the transfer: nothing moved for {} s", .0.as_secs())]
    Idle(Duration),
    /// The peer broke the protocol or the path corrupts data.
    #[error("{0}")]
    Failed(String),
}

/// What the driver must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkAction {
    /// Create this directory (its mode and mtime are set at the end,
    /// [`SinkAction::SetDirectories`]); report failures with [`Sink::failed`].
    Dir(Entry),
    /// Create this symbolic link; count it in [`Sink::report_mut`] or
    /// report a failure with [`Sink::failed`].
    Link(Entry),
    /// The source listed everything of this directory (sync --delete).
    DirEnd(Entry),
    /// Open this file (resuming from its journal) and answer with
    /// [`Sink::opened`]. Up to [`Sink::open_at_once`] opens may be out at
    /// once, answered in any order; a `DirEnd` waits for every answer.
    Open(Entry),
    /// Finish the file if its ledger is complete (every chunk was there
    /// already): its `Open` answer has gone to the source.
    Check(u64),
    /// Book the source's seal in the file's ledger; finish the file if
    /// that completes it.
    Seal { id: u64, resends: u32 },
    /// The source gave the file up: mark its ledger failed and drop it;
    /// `changed`: what arrived may mix two versions, so remove its partial
    /// file and journal.
    Discard { id: u64, changed: bool },
    /// The file is resolved: release what the driver holds of it.
    Release(u64),
    /// A file landed: count it (progress) and record its digest.
    Landed(super::Landed),
    /// The source announced everything.
    WalkDone,
    /// An interval report of the source, for the progress display.
    Interval(crate::tune::TransferInterval),
    /// Every file is resolved: give the directories their modes and
    /// times, record what failed with [`Sink::failed`], then call
    /// [`Sink::directories_set`]: the report goes to the source next.
    SetDirectories,
}

/// A file the source announced and the sink has not resolved yet.
struct InFlight {
    path: String,
    /// Its modification time as announced (the catalogue records it).
    mtime_ns: i64,
    /// Its chunk count, held against `max_chunks_in_flight` once opened.
    slots: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// The report is out; waiting up to the deadline for `SourceDone`.
    Closing {
        deadline: Instant,
    },
    Done,
}

/// What the source's walk could not announce ([`Entries::failed`]).
#[derive(Default)]
struct WalkFailures {
    /// The first [`MAX_WALK_FAILURES`]...
    kept: Vec<Failure>,
    /// ...then a count of the others, and the first of them.
    unkept: u64,
    first_unkept: Option<Failure>,
}

/// The sink's end of one transfer.
pub struct Sink {
    limits: SinkLimits,
    phase: Phase,
    report: SinkReport,
    walk_failures: WalkFailures,
    files: HashMap<u64, InFlight>,
    /// Files the source said it announced in all ([`EntriesEnd`]).
    expected: Option<u64>,
    resolved: u64,
    /// Chunk slots of the opened files in flight.
    slots: u64,
    damaged: HashMap<(u64, u32), u32>,
    /// Entries of the message being worked through, and its answers.
    batch: VecDeque<Entry>,
    /// Files asked to be opened, not answered yet.
    awaiting: HashSet<u64>,
    /// How many opens may be out at once (1 unless the driver has a pool).
    opens_at_once: usize,
    /// Files the source gave up while their open was out: dropped when
    /// the answer comes (`changed` as the source said).
    given_up_opening: HashMap<u64, bool>,
    wants: Vec<Want>,
    ranges: usize,
    opened_now: Vec<u64>,
    batch_open: bool,
    actions: VecDeque<SinkAction>,
    transmits: VecDeque<Message>,
    /// Bundles were negotiated: dones go out batched.
    batched: bool,
    /// [`TransferAccept::defer_full`] was agreed: a file with no room while
    /// others are in flight goes back to the source, to come again alone.
    defer_full: bool,
    last_activity: Instant,
}

impl Sink {
    pub fn new(now: Instant, limits: SinkLimits) -> Self {
        Self {
            limits,
            phase: Phase::Running,
            report: SinkReport::default(),
            walk_failures: WalkFailures::default(),
            files: HashMap::new(),
            expected: None,
            resolved: 0,
            slots: 0,
            damaged: HashMap::new(),
            batch: VecDeque::new(),
            awaiting: HashSet::new(),
            opens_at_once: 1,
            given_up_opening: HashMap::new(),
            wants: Vec::new(),
            ranges: 0,
            opened_now: Vec::new(),
            batch_open: false,
            actions: VecDeque::new(),
            transmits: VecDeque::new(),
            batched: false,
            defer_full: false,
            last_activity: now,
        }
    }

    /// Both ends agreed to [`TransferAccept::defer_full`].
    pub fn defer_full(&mut self) {
        self.defer_full = true;
    }

    /// Both ends agreed to bundles ([`TransferAccept::bundles`]): runs of
    /// `FileDone` leave as one `FilesDone`.
    pub fn batch_messages(&mut self) {
        self.batched = true;
    }

    /// The driver opens files on a pool: up to `n` opens may be out at
    /// once (at least 1), and their answers come in any order.
    pub fn open_at_once(&mut self, n: usize) {
        self.opens_at_once = n.max(1);
    }

    /// A control message from the source.
    pub fn handle(&mut self, now: Instant, msg: Message) -> Result<(), SinkError> {
        self.last_activity = now;
        if let Phase::Closing { .. } = self.phase {
            match msg {
                Message::SourceInterval(i) => self.actions.push_back(SinkAction::Interval(i)),
                Message::SourceDone(d) => {
                    self.report.source = Some(d);
                    self.phase = Phase::Done;
                }
                _ => self.phase = Phase::Done,
            }
            return Ok(());
        }
        match msg {
            Message::SourceInterval(i) => self.actions.push_back(SinkAction::Interval(i)),
            Message::Entries(batch) => {
                for f in batch.failed {
                    self.walk_failed(f);
                }
                if !batch.entries.is_empty() {
                    self.batch.extend(batch.entries);
                    self.batch_open = true;
                }
            }
            Message::FileSealed(seal) => self.seal(seal),
            Message::FilesSealed(seals) => {
                for seal in seals.items {
                    self.seal(seal);
                }
            }
            Message::FileDone(d) => self.source_gave_up(d),
            Message::FilesDone(ds) => {
                for d in ds.items {
                    self.source_gave_up(d);
                }
            }
            Message::EntriesEnd(end) => {
                self.actions.push_back(SinkAction::WalkDone);
                self.expected = Some(end.files);
            }
            m => {
                return Err(SinkError::Failed(format!(
                    "peer sent an unexpected {} message during the transfer",
                    m.name()
                )))
            }
        }
        self.check_end(now);
        Ok(())
    }

    fn seal(&mut self, seal: FileSealed) {
        if self.files.contains_key(&seal.id) {
            self.actions.push_back(SinkAction::Seal {
                id: seal.id,
                resends: seal.resends,
            });
        }
    }

    /// The source could not read this file (its journal stays for a
    /// retry), or it changed while it was read (what arrived is dropped;
    /// `retried`: it comes again, new id).
    fn source_gave_up(&mut self, d: FileDone) {
        if let Some(f) = self.files.remove(&d.id) {
            self.slots = self.slots.saturating_sub(f.slots);
            if self.awaiting.contains(&d.id) {
                // Dropped once the driver has opened it.
                self.given_up_opening.insert(d.id, d.changed);
            } else {
                self.actions.push_back(SinkAction::Discard {
                    id: d.id,
                    changed: d.changed,
                });
            }
            if !d.retried {
                self.resolved += 1;
                self.failed(&f.path, d.error.unwrap_or_else(|| "source failed".into()));
            }
        }
    }

    /// The answer to [`SinkAction::Open`] for file `id`.
    pub fn opened(&mut self, now: Instant, id: u64, want: Want) {
        self.last_activity = now;
        if !self.awaiting.remove(&id) {
            debug_assert!(false, "an answer for file {id}, which was not asked");
            return;
        }
        if let Some(changed) = self.given_up_opening.remove(&id) {
            // Resolved when the source gave it up: only the driver's file
            // is left to drop.
            if matches!(want, Want::Send { .. }) {
                self.actions.push_back(SinkAction::Discard { id, changed });
            }
            self.check_end(now);
            return;
        }
        self.answer(want);
        self.check_end(now);
    }

    /// A received chunk of file `id` did not match its hash: it is asked
    /// again, unless it arrived damaged too often.
    pub fn damaged(&mut self, now: Instant, r: Resend) -> Result<(), SinkError> {
        self.last_activity = now;
        let n = self.damaged.entry((r.id, r.index)).or_insert(0);
        *n += 1;
        if *n > MAX_DAMAGED {
            let path = self.files.get(&r.id).map(|f| f.path.clone());
            return Err(SinkError::Failed(format!(
                "chunk {} of {} arrived damaged {} times: the path corrupts data",
                r.index,
                path.unwrap_or_default(),
                MAX_DAMAGED + 1
            )));
        }
        self.transmits.push_back(Message::Resend(r));
        Ok(())
    }

    /// A chunk of `bytes` stuck on a stalled stream is asked again (the
    /// end game, [`super::tail`]): not counted as damage. True if it was
    /// asked: only of a file whose `Send` answer is on its way to the
    /// source. Before that the source has not planned the file: this
    /// release's source counts the ask in the file's seal
    /// ([`super::source`]'s `resend`), but an earlier one drops it, while
    /// the driver would wait for a seal covering it
    /// ([`FileLedger::damaged`]): the file would never be finished (an
    /// opener slower than the patience at a transfer's tail).
    pub fn stalled(&mut self, now: Instant, r: Resend, bytes: u64) -> bool {
        if !self.may_resend(r.id) {
            return false;
        }
        self.last_activity = now;
        self.report.resent_bytes = self.report.resent_bytes.saturating_add(bytes);
        self.transmits.push_back(Message::Resend(r));
        true
    }

    /// Whether a chunk of file `id` may be asked again: the file is in
    /// flight and its `Send` answer has gone out, or is queued to.
    pub fn may_resend(&self, id: u64) -> bool {
        self.files.contains_key(&id)
            && !self.awaiting.contains(&id)
            && !self
                .wants
                .iter()
                .any(|w| matches!(w, Want::Send { id: wanted, .. } if *wanted == id))
    }

    /// A file is finished: landed (`done.error` None; `bytes` its size),
    /// or failed while it was written or finished.
    pub fn file_done(&mut self, now: Instant, done: FileDone, bytes: u64) {
        self.last_activity = now;
        let Some(f) = self.files.remove(&done.id) else {
            return;
        };
        self.resolved += 1;
        self.slots = self.slots.saturating_sub(f.slots);
        match &done.error {
            Some(e) => self.failed(&f.path, e.clone()),
            None => {
                self.report.files += 1;
                self.report.bytes = self.report.bytes.saturating_add(bytes);
                self.actions.push_back(SinkAction::Landed(super::Landed {
                    path: f.path.clone(),
                    size: bytes,
                    mtime_ns: f.mtime_ns,
                    digest: done.digest.clone(),
                }));
            }
        }
        self.actions.push_back(SinkAction::Release(done.id));
        self.transmits.push_back(Message::FileDone(done));
        self.check_end(now);
    }

    /// The destination has no room for file `id` (creating, sizing or
    /// writing it failed with ENOSPC; the driver has removed what it wrote
    /// of it), as `error` says. With other files in flight, and
    /// [`Sink::defer_full`], it goes back to the source
    /// ([`FileDone::full`]) to come again once it can be alone: they may
    /// fit without it, and it may fit alone. Alone, it fails. Its open may
    /// still be out (an opener found no room) or done.
    pub fn no_room(&mut self, now: Instant, id: u64, error: String) {
        self.last_activity = now;
        let opening = self.awaiting.remove(&id);
        if opening && self.given_up_opening.remove(&id).is_some() {
            self.check_end(now);
            return;
        }
        let Some(f) = self.files.remove(&id) else {
            return;
        };
        if !opening {
            self.slots = self.slots.saturating_sub(f.slots);
        }
        let full = self.defer_full && !self.files.is_empty();
        let error = if full {
            error
        } else {
            self.resolved += 1;
            let error = format!(
                "{error}, even with no other file in flight: free space and run the same command again (files in place are skipped)"
            );
            self.failed(&f.path, error.clone());
            error
        };
        self.actions.push_back(SinkAction::Release(id));
        self.transmits.push_back(Message::FileDone(FileDone {
            id,
            error: Some(error),
            full,
            ..FileDone::default()
        }));
        self.check_end(now);
    }

    /// Bytes written to storage, and how long the writes took.
    pub fn written(&mut self, now: Instant, bytes: u64, busy_us: u64) {
        self.last_activity = now;
        self.report.written_bytes = self.report.written_bytes.saturating_add(bytes);
        self.report.write_us += busy_us;
    }

    /// Something failed that ends the transfer: the source hears it in
    /// the report this queues.
    pub fn fatal(&mut self, error: String) -> SinkError {
        self.report.failed.push(Failure {
            path: String::new(),
            error: error.clone(),
        });
        self.transmits
            .push_back(Message::TransferDone(self.report.clone()));
        self.phase = Phase::Done;
        SinkError::Failed(error)
    }

    /// Records an entry that could not be laid down.
    pub fn failed(&mut self, path: &str, error: String) {
        self.report.failed.push(Failure {
            path: path.to_string(),
            error,
        });
    }

    /// The directories are set ([`SinkAction::SetDirectories`]): the
    /// report, with what failed there, goes to the source.
    pub fn directories_set(&mut self) {
        self.transmits
            .push_back(Message::TransferDone(self.report.clone()));
    }

    /// The report, for counts only the driver sees (links, deletions,
    /// what a dry run would send).
    pub fn report_mut(&mut self) -> &mut SinkReport {
        &mut self.report
    }

    pub fn poll_transmit(&mut self) -> Option<Message> {
        super::next_transmit(&mut self.transmits, self.batched)
    }

    /// The next thing to do. While [`Sink::open_at_once`] opens wait for
    /// their answers, no more come; a `DirEnd`, and the `Wants` of a
    /// message, wait for every answer. An error ends the transfer (a
    /// source announcing files beyond what this side allows).
    pub fn poll_action(&mut self) -> Result<Option<SinkAction>, SinkError> {
        if let Some(a) = self.actions.pop_front() {
            return Ok(Some(a));
        }
        loop {
            if self.awaiting.len() >= self.opens_at_once {
                return Ok(None);
            }
            let Some(e) = self.batch.pop_front() else {
                if self.batch_open && self.awaiting.is_empty() {
                    self.close_batch();
                    return Ok(self.actions.pop_front());
                }
                return Ok(None);
            };
            match e.kind {
                // Everything of the directory is opened before its
                // leftovers are pruned.
                Kind::DirEnd if !self.awaiting.is_empty() => {
                    self.batch.push_front(e);
                    return Ok(None);
                }
                Kind::DirEnd => return Ok(Some(SinkAction::DirEnd(e))),
                Kind::Dir => return Ok(Some(SinkAction::Dir(e))),
                Kind::Symlink => return Ok(Some(SinkAction::Link(e))),
                Kind::File => {
                    if let Some(a) = self.announce(e)? {
                        return Ok(Some(a));
                    }
                }
            }
        }
    }

    /// When [`Sink::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Running => Some(self.last_activity + self.limits.idle),
            Phase::Closing { deadline } => Some(deadline),
            Phase::Done => None,
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), SinkError> {
        match self.phase {
            Phase::Running if now >= self.last_activity + self.limits.idle => {
                Err(SinkError::Idle(self.limits.idle))
            }
            Phase::Closing { deadline } if now >= deadline => {
                self.phase = Phase::Done;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Whether opens are out, waiting for [`Sink::opened`].
    pub fn is_opening(&self) -> bool {
        !self.awaiting.is_empty()
    }

    /// The report has gone out; the source's last word may follow.
    pub fn is_closing(&self) -> bool {
        matches!(self.phase, Phase::Closing { .. })
    }

    /// The report has gone out and the source's last word is in (or was
    /// not waited for any longer): [`Sink::into_report`] is final.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The report, with what the source's walk could not announce (kept
    /// out of the `TransferDone` the source gets: they are its own).
    pub fn into_report(mut self) -> SinkReport {
        self.report.failed.append(&mut self.walk_failures.kept);
        if let Some(first) = self.walk_failures.first_unkept.take() {
            let more = self.walk_failures.unkept - 1;
            self.report.failed.push(Failure {
                path: first.path,
                error: format!(
                    "{}; and {more} more entries the source could not send, not listed (a report lists the first {MAX_WALK_FAILURES})",
                    first.error
                ),
            });
        }
        self.report
    }

    /// One thing the source's walk could not announce: a failed entry,
    /// kept within the budget ([`MAX_WALK_FAILURES`], [`Failure::capped`]),
    /// counted past it.
    fn walk_failed(&mut self, f: Failure) {
        let w = &mut self.walk_failures;
        if w.kept.len() < MAX_WALK_FAILURES {
            w.kept.push(f.capped());
            return;
        }
        w.unkept = w.unkept.saturating_add(1);
        if w.first_unkept.is_none() {
            w.first_unkept = Some(f.capped());
        }
    }

    /// The source's walk failures heard so far: those kept, and a count
    /// of the rest.
    pub fn walk_failures(&self) -> (usize, u64) {
        (self.walk_failures.kept.len(), self.walk_failures.unkept)
    }

    /// A file entry: refused at once on its numbers, or opened.
    fn announce(&mut self, e: Entry) -> Result<Option<SinkAction>, SinkError> {
        // Twice what this side advertised: a source counts a file until
        // its answer arrives.
        let most = self.limits.max_files.saturating_mul(2);
        if self.files.len() as u64 >= most {
            // A broken peer: nothing more of this transfer is done.
            self.batch.clear();
            self.batch_open = false;
            self.phase = Phase::Done;
            return Err(SinkError::Failed(format!(
                "the source announced more than {most} files without waiting for answers (this side allows {} in flight)",
                self.limits.max_files
            )));
        }
        if self.files.contains_key(&e.id) || self.awaiting.contains(&e.id) {
            self.batch.clear();
            self.batch_open = false;
            self.phase = Phase::Done;
            return Err(SinkError::Failed(format!(
                "the source announced file {} twice while it was in flight",
                e.id
            )));
        }
        let count = chunk_count(e.size, e.chunk_size);
        let [first, end] = e.chunk_range();
        self.files.insert(
            e.id,
            InFlight {
                path: e.path.clone(),
                mtime_ns: e.mtime_ns,
                slots: u64::from(end.saturating_sub(first)),
            },
        );
        let count_in_flight = u64::from(end.saturating_sub(first));
        let refuse = if !(64 << 10..=1 << 31).contains(&e.chunk_size) {
            Some(format!(
                "chunk size {} is outside 64 KiB..=2 GiB",
                e.chunk_size
            ))
        } else if !crate::digest::chunk_size_ok(e.size, e.chunk_size) {
            Some(format!(
                "chunk size {} of a file of several chunks is not a power of two (its chunks' values would not combine into the file's BLAKE3)",
                e.chunk_size
            ))
        } else if count > self.limits.max_chunks_per_file {
            Some(format!(
                "{count} chunks of {} bytes is more than the {} a file may have: use a larger --chunk",
                e.chunk_size, self.limits.max_chunks_per_file
            ))
        } else if e.part.is_some()
            && (e.kind != Kind::File || first >= end || u64::from(end) > count)
        {
            Some(format!(
                "part [{first}, {end}) is not a range of the file's {count} chunks"
            ))
        } else if self.slots + count_in_flight > self.limits.max_chunks_in_flight && self.slots > 0
        {
            Some(format!(
                "too many chunks in flight at once ({} + {count_in_flight}); copy this file on its own or with a larger --chunk",
                self.slots
            ))
        } else {
            None
        };
        match refuse {
            Some(error) => {
                self.answer(Want::Fail { id: e.id, error });
                Ok(None)
            }
            None => {
                self.awaiting.insert(e.id);
                Ok(Some(SinkAction::Open(e)))
            }
        }
    }

    fn answer(&mut self, want: Want) {
        match &want {
            Want::Send {
                id,
                skip,
                resumed_bytes,
            } => {
                if let Some(f) = self.files.get(id) {
                    self.slots += f.slots;
                }
                self.report.resumed_bytes =
                    self.report.resumed_bytes.saturating_add(*resumed_bytes);
                self.opened_now.push(*id);
                self.ranges += skip.len();
            }
            Want::Skip { id } => {
                self.report.skipped += 1;
                self.resolved += 1;
                self.files.remove(id);
            }
            Want::Fail { id, error } => {
                self.resolved += 1;
                if let Some(f) = self.files.remove(id) {
                    self.failed(&f.path, error.clone());
                }
            }
        }
        self.wants.push(want);
        // Keep each Wants frame well under the limit.
        if self.ranges >= 2 * MAX_SKIP_RANGES {
            self.transmits.push_back(Message::Wants(Wants {
                wants: std::mem::take(&mut self.wants),
            }));
            self.ranges = 0;
        }
    }

    /// Every entry of a message is answered: the answers go out, then the
    /// files of this message whose chunks were all there are checked
    /// (only this message's: a scan of every file in flight per message
    /// costs a small-file transfer a third of its rate).
    fn close_batch(&mut self) {
        self.batch_open = false;
        self.transmits.push_back(Message::Wants(Wants {
            wants: std::mem::take(&mut self.wants),
        }));
        self.ranges = 0;
        for id in self.opened_now.drain(..) {
            self.actions.push_back(SinkAction::Check(id));
        }
        self.check_end(self.last_activity);
    }

    /// Once the source announced everything and every file is resolved,
    /// the directories get their modes and the report goes out.
    fn check_end(&mut self, now: Instant) {
        if self.phase == Phase::Running
            && !self.batch_open
            && self.awaiting.is_empty()
            && self.expected.is_some_and(|n| self.resolved >= n)
            && self.files.is_empty()
        {
            self.actions.push_back(SinkAction::SetDirectories);
            self.phase = Phase::Closing {
                deadline: now + SOURCE_DONE_WAIT,
            };
        }
    }
}

/// What the sink knows of one file's chunks: which are verified (and their
/// hashes), whether the source sealed it, and whether it may be finished.
/// The driver holds it beside the file, shared with the threads that
/// receive chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLedger {
    hashes: Vec<Option<[u8; 32]>>,
    remaining: u64,
    failed: bool,
    /// Set by whoever finishes the file, so that it is finished once.
    claimed: bool,
    /// The source's latest seal: every read it made of the file, this
    /// many resends included, showed the file unchanged.
    sealed: Option<u32>,
    /// Resends of this file asked of the source.
    resends_asked: u32,
    /// Chunks a copy is being written of: the copy that may write it.
    /// A chunk can arrive twice (a resend after a stall, the first copy
    /// late): the latest copy to start takes the chunk, and the one it
    /// took it from writes nothing more and is not booked, so that what
    /// lands is one copy's bytes, checked whole.
    writing: HashMap<u32, u64>,
    copies: u64,
}

/// One copy of a chunk being received ([`FileLedger::take`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkCopy(u64);

impl FileLedger {
    /// A ledger of `count` chunks; `resumed` lists chunks verified in an
    /// earlier run (from the journal, hashed again), with their hashes.
    pub fn new(count: usize, resumed: impl IntoIterator<Item = (u32, [u8; 32])>) -> Self {
        let mut hashes = vec![None; count];
        for (i, h) in resumed {
            if let Some(slot) = hashes.get_mut(i as usize) {
                *slot = Some(h);
            }
        }
        let verified = hashes.iter().filter(|h| h.is_some()).count();
        Self {
            remaining: (count - verified) as u64,
            hashes,
            failed: false,
            claimed: false,
            sealed: None,
            resends_asked: 0,
            writing: HashMap::new(),
            copies: 0,
        }
    }

    /// A copy of chunk `index` starts to arrive: it may write the chunk
    /// (None if the chunk is not wanted: verified already, or the file
    /// failed). It takes the chunk from any copy still arriving.
    pub fn take(&mut self, index: u32) -> Option<ChunkCopy> {
        if !self.wants(index) {
            return None;
        }
        self.copies += 1;
        self.writing.insert(index, self.copies);
        Some(ChunkCopy(self.copies))
    }

    /// Whether `copy` still holds its chunk: it may write, and be booked.
    pub fn holds(&self, index: u32, copy: ChunkCopy) -> bool {
        self.wants(index) && self.writing.get(&index) == Some(&copy.0)
    }

    /// Books `copy` of chunk `index`, verified against `hash`: true if it
    /// counted (it still held the chunk); a copy that lost it counts
    /// nothing, nor does one after the chunk is verified.
    pub fn verified_copy(&mut self, index: u32, copy: ChunkCopy, hash: [u8; 32]) -> bool {
        if !self.holds(index, copy) {
            return false;
        }
        self.writing.remove(&index);
        self.verified(index, hash)
    }

    /// `copy` of chunk `index` arrived damaged: the chunk is free again.
    pub fn release(&mut self, index: u32, copy: ChunkCopy) {
        if self.writing.get(&index) == Some(&copy.0) {
            self.writing.remove(&index);
        }
    }

    /// Whether the source sealed the file (every chunk is on its way).
    pub fn is_sealed(&self) -> bool {
        self.sealed.is_some()
    }

    /// The chunks not verified yet, in order.
    pub fn missing(&self) -> impl Iterator<Item = u32> + '_ {
        self.hashes
            .iter()
            .enumerate()
            .filter(|(_, h)| h.is_none())
            .map(|(i, _)| i as u32)
    }

    /// Whether chunk `index` is still wanted: the file has not failed and
    /// the chunk is not verified yet (a duplicate is dropped).
    pub fn wants(&self, index: u32) -> bool {
        !self.failed && self.hashes.get(index as usize).is_some_and(Option::is_none)
    }

    /// Books chunk `index`, verified against `hash`. True if it counted
    /// (it was still wanted); the driver journals it first.
    pub fn verified(&mut self, index: u32, hash: [u8; 32]) -> bool {
        if !self.wants(index) {
            return false;
        }
        self.hashes[index as usize] = Some(hash);
        self.remaining -= 1;
        true
    }

    /// A chunk is asked again (it arrived damaged, or it is stuck on a
    /// stalled stream): the file may not be finished before a seal covers
    /// that resend.
    pub fn damaged(&mut self) {
        self.resends_asked += 1;
    }

    /// Books a seal of the source.
    pub fn seal(&mut self, resends: u32) {
        self.sealed = self.sealed.max(Some(resends));
    }

    pub fn fail(&mut self) {
        self.failed = true;
    }

    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// Chunks not verified yet.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// The verified hashes, by chunk index.
    pub fn hashes(&self) -> &[Option<[u8; 32]>] {
        &self.hashes
    }

    /// Claims the file for finishing if it is complete: every chunk
    /// verified, and sealed by the source after every read it was asked
    /// for. True once, for the one caller that finishes it.
    pub fn claim(&mut self) -> bool {
        let take = self.remaining == 0
            && !self.claimed
            && !self.failed
            && self.sealed.is_some_and(|s| s >= self.resends_asked);
        self.claimed |= take;
        take
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_is_claimed_once_every_chunk_is_verified_and_sealed() {
        let mut l = FileLedger::new(2, [(1, [1; 32])]);
        assert_eq!(l.remaining(), 1);
        assert!(!l.wants(1), "a resumed chunk is not wanted again");
        l.seal(0);
        assert!(!l.claim(), "a chunk is missing");
        assert!(l.verified(0, [0; 32]));
        assert!(!l.verified(0, [0; 32]), "a duplicate counts once");
        assert!(l.claim());
        assert!(!l.claim(), "claimed once");
    }

    #[test]
    fn a_ledger_waits_for_a_seal_covering_every_resend() {
        let mut l = FileLedger::new(1, []);
        l.seal(0);
        l.damaged();
        assert!(l.verified(0, [0; 32]));
        assert!(!l.claim(), "the seal predates the resend");
        l.seal(1);
        assert!(l.claim());
    }

    #[test]
    fn a_failed_ledger_takes_nothing_and_is_never_claimed() {
        let mut l = FileLedger::new(1, []);
        l.seal(0);
        l.fail();
        assert!(!l.wants(0));
        assert!(!l.verified(0, [0; 32]));
        assert!(!l.claim());
    }

    #[test]
    fn a_chunk_sent_twice_is_written_and_booked_once() {
        let mut l = FileLedger::new(2, []);
        // The first copy starts on a stream that stalls mid-chunk...
        let first = l.take(0).expect("wanted");
        assert!(l.holds(0, first));
        // ...the resend starts on another stream and takes the chunk: the
        // first copy writes nothing more from here on.
        let second = l.take(0).expect("still wanted");
        assert!(!l.holds(0, first));
        assert!(l.holds(0, second));
        assert!(l.verified_copy(0, second, [2; 32]));
        // The first copy, arriving late and whole, is discarded: not
        // booked, nothing taken.
        assert!(!l.verified_copy(0, first, [2; 32]));
        assert_eq!(l.take(0), None, "a verified chunk is not taken again");
        assert_eq!(l.hashes()[0], Some([2; 32]));
        assert_eq!(l.missing().collect::<Vec<_>>(), [1]);
        // A damaged copy frees the chunk for the next one.
        let bad = l.take(1).expect("wanted");
        l.release(1, bad);
        assert!(!l.holds(1, bad));
        let good = l.take(1).expect("wanted again");
        assert!(!l.verified_copy(1, bad, [9; 32]));
        assert!(l.verified_copy(1, good, [1; 32]));
        assert_eq!(l.remaining(), 0);
        assert!(!l.is_sealed());
        l.seal(0);
        assert!(l.is_sealed() && l.claim());
    }

    #[test]
    fn an_index_past_the_end_is_not_wanted() {
        let l = FileLedger::new(1, [(7, [0; 32])]);
        assert!(!l.wants(1));
        assert_eq!(l.remaining(), 1);
    }
}
