//! What the control thread and the senders share: the queue of reads
//! (resends first, then the planner's chunks), the files being read with
//! their read accounting, the stream picker, and the events the senders
//! report.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};

use longhaul_proto::plan::{Chunk, Planner};
use longhaul_proto::window::BufferCaps;
use longhaul_proto::xfer::compress::Governor;
use longhaul_proto::xfer::*;

use super::super::beneath::Anchor;
use super::super::storage::{ReadAt, Storage};
use super::super::Stamp;

/// Resends waiting for a sender at most: a sink asking chunks again
/// faster than the streams it does not read take them would otherwise grow
/// the queue without bound. An honest sink has at most the chunks in
/// flight (each damaged copy asks one) and the end game's rounds
/// (`proto::transfer::tail`) waiting; 262,144 chunks (6 MiB of
/// queue) leave room for 16 GiB in flight at the smallest chunk size.
pub(super) const MAX_QUEUED_RESENDS: usize = 1 << 18;

/// What a sender reads from and reports to.
#[derive(Clone, Copy)]
pub(super) struct Out<'a> {
    pub(super) storage: &'a dyn Storage,
    pub(super) anchor: &'a Option<Arc<Anchor>>,
    pub(super) tx: &'a Sender<Event>,
    /// `-z` agreed: the governor all streams share, and its level.
    pub(super) compress: Option<(&'a Mutex<Governor>, i32)>,
    /// Each chunk's XXH3-128 check is computed (else the data streams'
    /// AEAD tags are the checks: `TransferAccept::tag_checks`).
    pub(super) checked: bool,
}

/// A file announced and planned: where it is read from, the version
/// announced, and how many of its reads are done.
pub(super) struct SrcFile {
    pub(super) path: PathBuf,
    failed: AtomicBool,
    /// The version announced: every descriptor read must still show it.
    pub(super) stamp: Stamp,
    /// Chunks still to be read once (resends not counted).
    reads_left: AtomicU64,
    /// Resends of this file read so far.
    resends_read: AtomicU32,
    /// Chunks read at least once, a bit each: a resend of a chunk whose
    /// first read is stuck (its stream stalled mid-chunk, the end game)
    /// stands for that read, so the file is sealed without it.
    read_once: Vec<AtomicU64>,
    /// The file is one chunk: that chunk's value is the file's BLAKE3.
    pub(super) whole: bool,
}

impl SrcFile {
    /// A file of `size` bytes planned in chunks of `chunk_size`, with
    /// `reads` chunks to read.
    pub(super) fn new(
        path: PathBuf,
        stamp: Stamp,
        reads: u64,
        size: u64,
        chunk_size: u64,
    ) -> SrcFile {
        SrcFile {
            path,
            failed: AtomicBool::new(false),
            stamp,
            reads_left: AtomicU64::new(reads),
            resends_read: AtomicU32::new(0),
            read_once: (0..longhaul_proto::plan::chunk_count(size, chunk_size).div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            whole: size <= chunk_size,
        }
    }

    /// Whether the file failed (or changed): its chunks are dropped.
    pub(super) fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Marks the file failed: no sender reads it again.
    pub(super) fn fail(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }

    /// After a read of chunk `index`: the seal to send if every chunk of
    /// the file has now been read at least once (`resend`: this read
    /// served a resend, and is counted as one), or None while reads are
    /// left. The descriptor is then checked against the stamp.
    pub(super) fn after_read(&self, index: u32, resend: bool) -> Option<u32> {
        let n = if resend {
            self.resends_read.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            self.resends_read.load(Ordering::SeqCst)
        };
        let bit = 1u64 << (index % 64);
        let first = self
            .read_once
            .get((index / 64) as usize)
            .is_some_and(|w| w.fetch_or(bit, Ordering::SeqCst) & bit == 0);
        if first {
            (self.reads_left.fetch_sub(1, Ordering::SeqCst) == 1).then_some(n)
        } else {
            (resend && self.reads_left.load(Ordering::SeqCst) == 0).then_some(n)
        }
    }

    /// Once every read is done: sealed for the sink if the open file is
    /// still the one announced, or changed (and marked failed) otherwise.
    pub(super) fn seal_or_changed(&self, id: u64, resends: u32, reader: &dyn ReadAt) -> Event {
        match self.changed(reader) {
            None => Event::Sealed { id, resends },
            Some(why) => {
                self.fail();
                Event::Changed(id, why)
            }
        }
    }

    /// What changed between the announcement and the open file now.
    pub(super) fn changed(&self, reader: &dyn ReadAt) -> Option<String> {
        self.differs(reader.metadata())
    }

    /// What changed between the announcement and `now`.
    pub(super) fn differs(&self, now: io::Result<std::fs::Metadata>) -> Option<String> {
        match now {
            Ok(m) => self.stamp.changed(&Stamp::of(&m)),
            Err(e) => Some(format!("cannot check it after reading: {e}")),
        }
    }
}

/// The reads waiting for a sender.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) planner: Planner,
    /// Resends, served first: (chunk, true).
    pub(super) resends: VecDeque<Chunk>,
    pub(super) files: HashMap<u64, Arc<SrcFile>>,
    pub(super) closed: bool,
    /// Streams 0..active carry chunks; the rest are parked by the tuner.
    pub(super) active: u16,
    /// The stream that carried each chunk's latest copy, while it may
    /// still hold it: a resend goes on another.
    pub(super) carried: Carried,
}

/// The bytes of a stream's sender's own buffers, beyond its socket's: the
/// writer's 256 KiB, a sealed frame (1 MiB), a bundle frame, a piece.
const SENDER_BUFFERS: u64 = 4 << 20;

/// The window when the host's caps cannot be read: the largest send
/// buffer a data transfer node is commonly given.
const DEFAULT_WINDOW: u64 = 64 << 20;

/// Records of what one stream carried, at most: the memory bound of
/// [`Carried`] whatever the window (records of tiny files, bundled, are
/// many to a window): some 100 KiB a stream.
pub(super) const MAX_CARRIED_PER_STREAM: usize = 1024;

/// Which stream carried each chunk's latest copy, for the chunks a stream
/// may still hold unacknowledged: a resend goes on another stream, since
/// the one that carried it may have stalled (the end game,
/// `proto::transfer::tail`). A chunk stuck on a stream is among the last
/// bytes that stream took, since nothing after it on the stream arrives
/// either: a stream keeps the records of its chunks until it has carried
/// more than its window after them (its socket's send buffer at the most
/// the host lets it grow, and its sender's buffers), or
/// [`MAX_CARRIED_PER_STREAM`] more chunks. Bounded by the streams, not by
/// the bytes sent: a file stays open as long as its sink likes, and one
/// record a chunk grew with a 1 TiB file to some 300 MB. A chunk whose
/// record is gone goes on any stream, as with one stream; a stream
/// carries a hole's zero chunks in fewer bytes than their length, by which
/// they are counted, so a stalled one may hold some of those past its
/// records (with `-z`, where most chunks shrink, the window is not used).
pub(super) struct Carried {
    window: u64,
    /// By (file, chunk): the stream, and the record that says so.
    latest: HashMap<(u64, u32), (u16, u64)>,
    streams: Vec<Recent>,
    next_seq: u64,
}

/// One stream's records, oldest first, and the bytes they count.
#[derive(Default)]
struct Recent {
    records: VecDeque<Record>,
    bytes: u64,
}

struct Record {
    file: u64,
    index: u32,
    bytes: u64,
    seq: u64,
}

impl Default for Carried {
    fn default() -> Self {
        Carried::new(DEFAULT_WINDOW)
    }
}

impl Carried {
    /// Records kept while a stream carried at most `window` bytes after them.
    pub(super) fn new(window: u64) -> Self {
        Carried {
            window,
            latest: HashMap::new(),
            streams: Vec::new(),
            next_seq: 0,
        }
    }

    /// The window of a host with these buffer caps: what one stream can
    /// hold that its peer has not acknowledged (the kernel doubles a
    /// SO_SNDBUF setting, and autotuning stops at tcp_wmem's max). With
    /// `-z` (`compress`) a chunk takes fewer bytes of the stream than its
    /// length, by no ratio known ahead: the count bounds the records alone.
    pub(super) fn for_host(caps: &BufferCaps, compress: Option<i32>) -> Self {
        if compress.is_some() {
            return Carried::new(u64::MAX);
        }
        let kernel = caps
            .wmem_max
            .map(|w| w.saturating_mul(2))
            .max(caps.tcp_wmem_max);
        Carried::new(
            kernel
                .unwrap_or(DEFAULT_WINDOW)
                .saturating_add(SENDER_BUFFERS),
        )
    }

    /// The stream that carried the latest copy of chunk `c`, while known.
    fn stream_of(&self, c: &Chunk) -> Option<u16> {
        self.latest.get(&(c.file, c.index)).map(|&(k, _)| k)
    }

    /// Stream `stream` carries chunk `c`: its oldest records go once it
    /// has carried its window after them.
    fn carry(&mut self, c: &Chunk, stream: u16) {
        let k = usize::from(stream);
        if self.streams.len() <= k {
            self.streams.resize_with(k + 1, Recent::default);
        }
        let bytes = u64::from(c.len) + (CHUNK_HEADER_LEN + CHUNK_TRAILER_LEN) as u64;
        let recent = &mut self.streams[k];
        while let Some(old) = recent.records.front() {
            let after = recent.bytes - old.bytes + bytes;
            if recent.records.len() < MAX_CARRIED_PER_STREAM && after <= self.window {
                break;
            }
            recent.bytes -= old.bytes;
            if let Entry::Occupied(e) = self.latest.entry((old.file, old.index)) {
                if e.get().1 == old.seq {
                    e.remove();
                }
            }
            recent.records.pop_front();
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        recent.bytes += bytes;
        recent.records.push_back(Record {
            file: c.file,
            index: c.index,
            bytes,
            seq,
        });
        self.latest.insert((c.file, c.index), (stream, seq));
    }

    /// Chunks whose carrier is known.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.latest.len()
    }

    /// Records the memory held has room for.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.latest.capacity()
            + self
                .streams
                .iter()
                .map(|r| r.records.capacity())
                .sum::<usize>()
    }
}

/// A chunk a sender takes: whether it serves a resend, and its file.
pub(super) type Pick = (Chunk, bool, Arc<SrcFile>);

/// What a sender takes from the queue.
pub(super) enum Taken {
    /// One chunk, sent in a chunk frame.
    One(Pick),
    /// Whole small files gathered into the sender's bundle, and the chunk
    /// that ended it, if it was not one of them (sent next).
    Bundle(Option<Pick>),
}

impl Queue {
    /// What stream `index` sends next: resends first, then the planner's
    /// chunks (files that failed are passed over); small whole files go
    /// into `bundle` when bundles were agreed. None when there is nothing
    /// now, or the stream is parked.
    pub(super) fn take(
        &mut self,
        index: u16,
        bundles: bool,
        bundle: &mut Vec<(Chunk, Arc<SrcFile>)>,
    ) -> Option<Taken> {
        loop {
            // A parked stream takes nothing until the tuner wakes it.
            if index >= self.active {
                return None;
            }
            let (c, resend) = match self.resend_for(index) {
                Some(c) => (c, true),
                None => (self.planner.next_chunk()?, false),
            };
            let Some(f) = self.files.get(&c.file).filter(|f| !f.failed()).cloned() else {
                continue;
            };
            if !(bundles && bundled(&c, resend, &f)) {
                self.carried.carry(&c, index);
                return Some(Taken::One((c, resend, f)));
            }
            bundle.push((c, f));
            let ended = gather(self, bundle);
            for (c, _) in bundle.iter() {
                self.carried.carry(c, index);
            }
            return Some(Taken::Bundle(ended));
        }
    }
}

impl Queue {
    /// The first resend stream `index` may take: one whose latest copy
    /// another stream carried (or any, with one stream active).
    fn resend_for(&mut self, index: u16) -> Option<Chunk> {
        let at = self.resends.iter().position(|c| {
            self.active <= 1 || self.carried.stream_of(c).is_none_or(|k| k != index)
        })?;
        self.resends.remove(at)
    }

    /// The sink asks chunk `c` again: queued if its file is still read
    /// (true), or an error once [`MAX_QUEUED_RESENDS`] wait.
    pub(super) fn resend(&mut self, c: Chunk) -> Result<bool, String> {
        if !self.files.contains_key(&c.file) {
            return Ok(false);
        }
        if self.resends.len() >= MAX_QUEUED_RESENDS {
            return Err(format!(
                "the sink asked for more than {MAX_QUEUED_RESENDS} chunks again before the \
                 streams it does not read could take them: a broken or hostile peer"
            ));
        }
        self.resends.push_back(c);
        Ok(true)
    }

    /// File `id` is done with: its reads go (the records of what carried
    /// its chunks go as the streams carry more).
    pub(super) fn forget(&mut self, id: u64) -> Option<Arc<SrcFile>> {
        self.files.remove(&id)
    }
}

pub(super) type Shared = Arc<(Mutex<Queue>, Condvar)>;

/// What the senders report to the control thread.
pub(super) enum Event {
    Sent {
        read_bytes: u64,
        read_us: u64,
    },
    FileFailed(u64, String),
    /// Every read of a file so far is done and it did not change.
    Sealed {
        id: u64,
        resends: u32,
    },
    /// The file changed while it was read (what, in words).
    Changed(u64, String),
    Fatal(String),
}

/// Whether a chunk goes in a bundle: a first read (a resend goes alone)
/// of the whole of a small file without holes.
fn bundled(c: &Chunk, resend: bool, f: &SrcFile) -> bool {
    !resend
        && c.index == 0
        && u64::from(c.len) == f.stamp.size
        && c.len <= MAX_BUNDLE_FILE
        && !f.stamp.sparse
}

/// Fills `bundle` (which holds its first file) from the queue with more
/// whole small files that are ready, up to the caps; returns the chunk
/// that ended it, if it was not one of them.
fn gather(queue: &mut Queue, bundle: &mut Vec<(Chunk, Arc<SrcFile>)>) -> Option<Pick> {
    let mut payload: u64 = bundle.iter().map(|(c, _)| u64::from(c.len)).sum();
    while bundle.len() < MAX_BUNDLE_FILES as usize && queue.resends.is_empty() {
        let c = queue.planner.next_chunk()?;
        let Some(f) = queue.files.get(&c.file).filter(|f| !f.failed()) else {
            continue;
        };
        if !bundled(&c, false, f) || payload + u64::from(c.len) > u64::from(MAX_BUNDLE_PAYLOAD) {
            return Some((c, false, f.clone()));
        }
        payload += u64::from(c.len);
        bundle.push((c, f.clone()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: u64 = 64 << 10;

    fn stamp(size: u64) -> Stamp {
        Stamp {
            size,
            ..Stamp::default()
        }
    }

    /// A queue of files of these sizes (ids 1, 2, ...) in chunks of
    /// `chunk`, with streams `0..active` active.
    fn queue_of(sizes: &[u64], chunk: u64, active: u16) -> Queue {
        let mut q = Queue {
            active,
            ..Queue::default()
        };
        for (i, &size) in sizes.iter().enumerate() {
            let id = i as u64 + 1;
            let reads = q.planner.add(id, size, chunk, Vec::new()).unwrap();
            let path = PathBuf::from(format!("f{id}"));
            let f = SrcFile::new(path, stamp(size), reads, size, chunk);
            q.files.insert(id, Arc::new(f));
        }
        q
    }

    fn queue(sizes: &[u64], active: u16) -> Queue {
        queue_of(sizes, CHUNK, active)
    }

    fn one(t: Option<Taken>) -> (u64, u32, bool) {
        match t {
            Some(Taken::One((c, resend, _))) => (c.file, c.index, resend),
            Some(Taken::Bundle(_)) => panic!("a bundle, not one chunk"),
            None => panic!("nothing taken"),
        }
    }

    #[test]
    fn after_read_seals_once_every_read_is_done_counting_resends() {
        let f = SrcFile::new("f".into(), stamp(3 * CHUNK), 3, 3 * CHUNK, CHUNK);
        assert!(!f.whole);
        assert_eq!(f.after_read(0, false), None);
        // A resend read while first reads are left: not yet.
        assert_eq!(f.after_read(0, true), None);
        assert_eq!(f.after_read(1, false), None);
        // The last first read: sealed, with the one resend read so far.
        assert_eq!(f.after_read(2, false), Some(1));
        // A resend after the seal: sealed again, with both resends.
        assert_eq!(f.after_read(0, true), Some(2));
        // A late first read of a chunk read already: nothing to seal.
        assert_eq!(f.after_read(1, false), None);

        let small = SrcFile::new("s".into(), stamp(10), 1, 10, CHUNK);
        assert!(small.whole);
        assert_eq!(small.after_read(0, false), Some(0));

        // The end game: chunk 1's first read is stuck on a stalled
        // stream; its resend stands for it, and the file is sealed.
        let f = SrcFile::new("g".into(), stamp(2 * CHUNK), 2, 2 * CHUNK, CHUNK);
        assert_eq!(f.after_read(0, false), None);
        assert_eq!(f.after_read(1, true), Some(1));
        assert_eq!(f.after_read(1, false), None, "the stuck read, done late");
    }

    #[test]
    fn resends_go_first_and_failed_files_are_passed_over() {
        let mut q = queue(&[2 * CHUNK, CHUNK], 2);
        let mut bundle = Vec::new();
        assert_eq!(one(q.take(0, false, &mut bundle)), (1, 0, false));
        q.resends
            .push_back(longhaul_proto::plan::chunk_at(2, CHUNK, CHUNK, 0));
        assert_eq!(one(q.take(1, false, &mut bundle)), (2, 0, true));
        // File 1 failed: its second chunk is dropped, file 2's comes next.
        q.files[&1].fail();
        assert_eq!(one(q.take(0, false, &mut bundle)), (2, 0, false));
        assert!(q.take(0, false, &mut bundle).is_none());
        assert!(bundle.is_empty());
    }

    #[test]
    fn a_resend_goes_on_another_stream_than_the_one_that_carried_it() {
        let mut q = queue(&[2 * CHUNK], 2);
        let mut bundle = Vec::new();
        assert_eq!(one(q.take(0, false, &mut bundle)), (1, 0, false));
        assert_eq!(one(q.take(1, false, &mut bundle)), (1, 1, false));
        // Chunk 0 is asked again (its stream, 0, stalled): stream 0 passes
        // it over, stream 1 takes it.
        q.resends
            .push_back(longhaul_proto::plan::chunk_at(1, 2 * CHUNK, CHUNK, 0));
        assert!(q.take(0, false, &mut bundle).is_none());
        assert_eq!(one(q.take(1, false, &mut bundle)), (1, 0, true));
        // Asked again once more: now stream 1 carried it last.
        q.resends
            .push_back(longhaul_proto::plan::chunk_at(1, 2 * CHUNK, CHUNK, 0));
        assert!(q.take(1, false, &mut bundle).is_none());
        assert_eq!(one(q.take(0, false, &mut bundle)), (1, 0, true));
        // With one stream, it goes where it can.
        q.active = 1;
        q.resends
            .push_back(longhaul_proto::plan::chunk_at(1, 2 * CHUNK, CHUNK, 0));
        assert_eq!(one(q.take(0, false, &mut bundle)), (1, 0, true));
        assert!(q.forget(1).is_some());
    }

    /// A 1 TiB pull at 64 KiB chunks is 16M chunks on the server; which
    /// stream carried each (for a resend to go on another) is needed only
    /// while a stream may still hold it unacknowledged. Here stream 0
    /// carries one chunk and stalls, and three others carry a million:
    /// the records stay as many as the streams' windows hold (they were
    /// one a chunk, a million), the stalled stream's chunk is still known
    /// and so are each stream's last ones, and a chunk carried a window
    /// ago may go on any stream.
    #[test]
    fn what_the_streams_carried_stays_bounded_however_many_chunks_go() {
        const CHUNKS: u64 = 1 << 20;
        let size = CHUNKS * CHUNK;
        let mut q = queue(&[size], 4);
        let mut bundle = Vec::new();
        assert_eq!(one(q.take(0, false, &mut bundle)), (1, 0, false));
        for i in 1..CHUNKS {
            let stream = 1 + ((i - 1) % 3) as u16;
            assert_eq!(
                one(q.take(stream, false, &mut bundle)),
                (1, i as u32, false)
            );
        }
        assert!(q.take(1, false, &mut bundle).is_none());
        let (records, capacity) = (q.carried.len(), q.carried.capacity());
        // A record each in a stream's deque and in the table, which keeps
        // room for up to twice its length.
        assert!(
            records <= 4 * MAX_CARRIED_PER_STREAM && capacity <= 12 * MAX_CARRIED_PER_STREAM,
            "{records} records, room for {capacity}, after {CHUNKS} chunks"
        );
        let chunk = |i: u64| longhaul_proto::plan::chunk_at(1, size, CHUNK, i as u32);
        // The stalled stream's chunk: another stream takes its resend.
        q.resends.push_back(chunk(0));
        assert!(q.take(0, false, &mut bundle).is_none());
        assert_eq!(one(q.take(1, false, &mut bundle)), (1, 0, true));
        // The last chunk, on stream 1 + (CHUNKS - 2) % 3.
        let last_on = 1 + ((CHUNKS - 2) % 3) as u16;
        q.resends.push_back(chunk(CHUNKS - 1));
        assert!(q.take(last_on, false, &mut bundle).is_none());
        let other = if last_on == 1 { 2 } else { 1 };
        assert_eq!(
            one(q.take(other, false, &mut bundle)).1,
            (CHUNKS - 1) as u32
        );
        // Chunk 1 went on stream 1 a million chunks ago: acknowledged.
        q.resends.push_back(chunk(1));
        assert_eq!(one(q.take(1, false, &mut bundle)), (1, 1, true));
    }

    /// A stream's records go once it carried its window after them, or
    /// its count of them: bytes of big chunks, or many small files.
    #[test]
    fn a_streams_records_go_after_its_window_or_its_count() {
        let mut c = Carried::new(3 * (CHUNK + 100));
        for i in 0..10 {
            c.carry(&longhaul_proto::plan::chunk_at(1, 10 * CHUNK, CHUNK, i), 0);
        }
        assert_eq!(
            c.len(),
            4,
            "the last chunk and three chunks' bytes after it"
        );
        let of = |i| longhaul_proto::plan::chunk_at(1, 10 * CHUNK, CHUNK, i);
        assert_eq!(c.stream_of(&of(6)), Some(0));
        assert_eq!(c.stream_of(&of(5)), None);
        let mut c = Carried::new(u64::MAX);
        for id in 0..3 * MAX_CARRIED_PER_STREAM as u64 {
            c.carry(&longhaul_proto::plan::chunk_at(id, 10, CHUNK, 0), 2);
        }
        assert_eq!(c.len(), MAX_CARRIED_PER_STREAM);
        // A chunk carried again goes with its latest copy's stream, and
        // its older record going does not take the newer one with it.
        let mut c = Carried::new(2 * (CHUNK + 100));
        c.carry(&of(0), 0);
        c.carry(&of(0), 1);
        c.carry(&of(0), 0);
        c.carry(&of(1), 0);
        assert_eq!(c.stream_of(&of(0)), Some(0));
    }

    #[test]
    fn a_parked_stream_takes_nothing() {
        let mut q = queue(&[4 * CHUNK], 1);
        q.resends
            .push_back(longhaul_proto::plan::chunk_at(1, 4 * CHUNK, CHUNK, 3));
        let mut bundle = Vec::new();
        assert!(q.take(1, false, &mut bundle).is_none());
        assert!(q.take(5, true, &mut bundle).is_none());
        // Nothing was taken from it: the active stream gets the resend.
        assert_eq!(q.resends.len(), 1);
        assert_eq!(one(q.take(0, false, &mut bundle)), (1, 3, true));
        q.active = 2;
        assert_eq!(one(q.take(1, false, &mut bundle)), (1, 0, false));
    }

    #[test]
    fn small_whole_files_are_bundled_until_one_is_not() {
        let mut q = queue(&[100, 1, 2000, 3 * CHUNK, 50], 1);
        let mut bundle = Vec::new();
        let ended = match q.take(0, true, &mut bundle) {
            Some(Taken::Bundle(ended)) => ended,
            _ => panic!("a bundle"),
        };
        let files: Vec<u64> = bundle.iter().map(|(c, _)| c.file).collect();
        assert_eq!(files, [1, 2, 3]);
        // The large file's first chunk ended it, and goes next on its own.
        let (c, resend, _) = ended.expect("the chunk that ended the bundle");
        assert_eq!((c.file, c.index, resend), (4, 0, false));
        // Without bundles, a small file goes as one chunk frame.
        let mut q = queue(&[100], 1);
        assert_eq!(one(q.take(0, false, &mut bundle)), (1, 0, false));
    }

    #[test]
    fn a_resend_is_never_bundled() {
        let mut q = queue(&[100, 200, 300], 1);
        q.resends
            .push_back(longhaul_proto::plan::chunk_at(3, 300, CHUNK, 0));
        let mut bundle = Vec::new();
        assert_eq!(one(q.take(0, true, &mut bundle)), (3, 0, true));
        assert!(bundle.is_empty());
        assert!(matches!(
            q.take(0, true, &mut bundle),
            Some(Taken::Bundle(None))
        ));
        let files: Vec<u64> = bundle.iter().map(|(c, _)| c.file).collect();
        assert_eq!(files, [1, 2, 3]);
    }

    #[test]
    fn a_bundle_stops_at_its_payload_cap() {
        let size = u64::from(MAX_BUNDLE_FILE);
        let n = (MAX_BUNDLE_PAYLOAD / MAX_BUNDLE_FILE) as usize;
        let mut q = queue_of(&vec![size; n + 1], size, 1);
        let mut bundle = Vec::new();
        let Some(Taken::Bundle(Some((c, false, _)))) = q.take(0, true, &mut bundle) else {
            panic!("a full bundle and the file that did not fit");
        };
        assert_eq!(bundle.len(), n);
        assert_eq!(c.file, n as u64 + 1);
    }
}
