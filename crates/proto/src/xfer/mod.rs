//! The file-transfer protocol: control messages, the binary chunk frame of
//! data streams, remote path syntax, path confinement and the resume journal
//! format. Pure logic; the engine does the I/O.
//!
//! A transfer has a *source* (walks and reads files) and a *sink* (creates,
//! writes, verifies); a push makes the client the source, a pull the
//! server. The source announces entries in batches, the sink answers which
//! chunks it still needs, the source sends those chunks on the data
//! streams, and the sink reports each file once every chunk is verified and
//! the file is renamed into place.
//!
//! The two ends' state machines that speak these messages are in
//! [`crate::transfer`].

pub mod back;
pub mod compress;
pub mod copy;
pub mod report;

use serde::{Deserialize, Serialize};

/// Which way a transfer goes, seen from the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Client sends local files to the server.
    Push,
    /// Client fetches files from the server.
    Pull,
}

/// What `sync` compares and does beyond `cp`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncOptions {
    /// Compare content digests instead of size and mtime.
    pub checksum: bool,
    /// Remove destination entries the source does not have.
    pub delete: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferRequest {
    pub op: Op,
    pub export: String,
    /// Push: the destination path within the export. Pull: ignored.
    pub dest: String,
    /// Pull: the source paths within the export. Push: ignored.
    pub sources: Vec<String>,
    /// How many sources the source side has (cp's rename rule needs it).
    pub source_count: u32,
    pub recursive: bool,
    /// Keep permission bits (mtime is always kept).
    pub preserve: bool,
    pub streams: u16,
    /// Chunk size in bytes; None lets the source choose per file.
    pub chunk_size: Option<u64>,
    /// Send every file even if the destination has it with the same size and mtime.
    pub force: bool,
    pub sync: Option<SyncOptions>,
    /// Report only; change nothing.
    pub dry_run: bool,
    /// Re-read every file at the destination after it is written and
    /// compare it with the verified chunk hashes.
    #[serde(default)]
    pub verify: bool,
    /// The sources' contents go into `dest`, which then mirrors them
    /// (`SRC/`, rsync's trailing-slash rule), instead of `dest/NAME`.
    #[serde(default)]
    pub contents: bool,
    /// Push: the destination was named with a trailing `/`, so it must be
    /// a directory (see [`landing`]).
    #[serde(default)]
    pub dest_dir: bool,
    /// Push: create the destination's missing directories (`--mkpath`).
    #[serde(default)]
    pub mkpath: bool,
    /// Use O_DIRECT for file data on the server's side too (`--direct`).
    #[serde(default)]
    pub direct: bool,
    /// How the server sets its ends of the data streams, as the client
    /// sized them for the path.
    #[serde(default)]
    pub tuning: StreamTuning,
    /// The client takes bundle frames (`0xC3`) on the data streams and
    /// the batched `FilesSealed` / `FilesDone` messages (PROTOCOL.md
    /// 13.5a); they are used only if the server agrees in
    /// [`TransferAccept::bundles`]. Absent from an older client.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bundles: bool,
    /// The source may announce parts of files ([`Entry::part`]): it is one
    /// rank of a fleet. A sink that does not answer `parts` in its
    /// [`TransferAccept`] would land a part as a whole file, so the source
    /// then refuses to go on. Absent from an older client.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub parts: bool,
    /// The client's TLS data streams may leave TLS's record layer for
    /// sealed frames once joined (PROTOCOL.md 13.2b), if the server agrees
    /// in [`TransferAccept::sealed`]. Absent from an older client.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sealed: bool,
    /// Push: the one source is a directory, copied recursively. It cannot
    /// go onto an existing file: the server refuses before anything moves
    /// ([`DestError::TreeOntoFile`]). Absent from an older client.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub source_dir: bool,
    /// rsync's include/exclude rules (`+ PATTERN` / `- PATTERN`, first
    /// match wins; see `longhaul_engine::xfer::filter`): the source's walk
    /// leaves out what they exclude, and `sync --delete` leaves excluded
    /// destination entries alone. Absent from an older client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filter: Vec<String>,
    /// `-z`: the source compresses chunks with zstd at this level
    /// ([`compress::MIN_LEVEL`]..=[`compress::MAX_LEVEL`]) in compressed
    /// chunk frames (`0xC4`, PROTOCOL.md 13.5c), if the server agrees in
    /// [`TransferAccept::compress`]. Absent from an older client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<i32>,
    /// This client's end (source or sink) takes [`FileDone::full`]: a file
    /// the destination had no room for while others were in flight is
    /// announced again once it can be alone. Absent from an older client.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub defer_full: bool,
    /// The client takes its TLS data streams' AEAD tags as each chunk's
    /// check (PROTOCOL.md 13.5b): neither end computes the XXH3-128 check,
    /// and a trailer's check is [`crate::digest::NO_CHECK`] (any other value marks a chunk
    /// the source could not read). Used only if the server agrees in
    /// [`TransferAccept::tag_checks`]. Absent from an older client.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tag_checks: bool,
}

/// Socket settings of the data streams, chosen by the client for the path
/// (see [`crate::window`]); each side applies what concerns its role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamTuning {
    /// Congestion control for the sending side, if its kernel has it
    /// (otherwise its default stays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion: Option<String>,
    /// SO_SNDBUF for the sending side, bytes (None: autotuning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_buffer: Option<u64>,
    /// SO_RCVBUF for the receiving side, bytes (None: autotuning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive_buffer: Option<u64>,
    /// SO_MAX_PACING_RATE of each stream on the sending side, bytes/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pacing: Option<u64>,
    /// The source tunes the number of streams carrying chunks online
    /// ([`crate::tune::Climb`]) and reports each interval.
    #[serde(default)]
    pub online: bool,
    /// The client takes `SourceInterval` messages: a server that is the
    /// source sends one each interval.
    #[serde(default)]
    pub intervals: bool,
    /// Pull: files in flight the server (the source) starts with, sized
    /// by the client for the path (None: [`crate::tune::DEFAULT_FILES_IN_FLIGHT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_in_flight: Option<u64>,
    /// Pull: the most files in flight the client (the sink) allows; the
    /// source grows toward it online. Equal to `files_in_flight` when the
    /// user fixed the count. None: the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_files_in_flight: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferAccept {
    /// Data streams present it in their hello.
    pub token: String,
    /// Push: the most files in flight the server (the sink) allows (None:
    /// [`crate::tune::DEFAULT_FILES_IN_FLIGHT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_files_in_flight: Option<u64>,
    /// The server agrees to the client's [`TransferRequest::bundles`]:
    /// from now on both ends may send bundle frames and batched messages.
    /// Never set unless the client asked; absent from an older server.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bundles: bool,
    /// Push: the server's sink puts the source's entries onto the
    /// destination (its own name replaced, [`Landing::Onto`]) rather than
    /// into it; the client's file catalogue names destinations by it.
    /// Absent from an older server (read as into).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub onto: bool,
    /// The sink takes parts of files ([`Entry::part`]). Never set unless
    /// the client asked; absent from an older server.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub parts: bool,
    /// Every data stream of this transfer goes over to sealed frames once
    /// joined (PROTOCOL.md 13.2b). Never set unless the client asked and
    /// the session is TLS; absent from an older server.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sealed: bool,
    /// The server applies the request's [`TransferRequest::filter`] (to its
    /// walk on a pull, to what `--delete` keeps on a push). Absent from an
    /// older server, which would ignore the rules: the client then refuses.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub filter: bool,
    /// The server agrees to the request's [`TransferRequest::compress`]:
    /// the source, whichever end it is, may send compressed chunk frames.
    /// Never set unless the client asked; absent from an older server,
    /// which would not decode them: the client then refuses.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compress: bool,
    /// The server agrees to the request's [`TransferRequest::defer_full`]:
    /// the sink, whichever end it is, may answer [`FileDone::full`], and
    /// the source announces such a file again once it can be alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub defer_full: bool,
    /// The server agrees to the request's [`TransferRequest::tag_checks`]:
    /// every data stream is TLS, and both ends leave each chunk's check to
    /// its AEAD tag. Never set unless the client asked and the session is
    /// TLS; absent from an older server, which checks XXH3 as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tag_checks: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// Marks the end of a directory's entries (sent only for `sync
    /// --delete`): the sink may now remove what the source did not list.
    DirEnd,
}

/// One thing the source has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Unique within the transfer.
    pub id: u64,
    /// Relative path, `/`-separated, starting with the source's own name.
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// Link target, for symlinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub chunk_size: u64,
    /// The source file has holes: the sink keeps them instead of
    /// preallocating the whole file.
    #[serde(default)]
    pub sparse: bool,
    /// On a `DirEnd`: the source could not list or read everything in this
    /// directory, so the sink must not delete anything in it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub incomplete: bool,
    /// Content digest, when the sync compares checksums.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// This transfer carries only the chunks `[first, end)` of the file:
    /// other transfers (other ranks of a fleet, `longhaul-fleet`) carry the
    /// rest into the same partial file, and whichever completes the last
    /// range renames it into place. Only sent when both ends agreed to
    /// parts ([`TransferRequest::parts`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<[u32; 2]>,
}

impl Entry {
    /// The chunk indices this transfer carries: the file's part, or all of them.
    pub fn chunk_range(&self) -> [u32; 2] {
        // `plan::chunk_count`, which stands above this module.
        let count = self.size.div_ceil(self.chunk_size.max(1)).max(1);
        self.part
            .unwrap_or([0, u32::try_from(count).unwrap_or(u32::MAX)])
    }

    /// The bytes this transfer carries of the file: its part's, or all.
    pub fn carried_bytes(&self) -> u64 {
        let Some([first, end]) = self.part else {
            return self.size;
        };
        let at = |i: u32| (u64::from(i) * self.chunk_size).min(self.size);
        at(end) - at(first)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entries {
    pub entries: Vec<Entry>,
    /// Source to sink: what the source's walk found and could not announce
    /// since its last `Entries` (a directory named without `-r`, an entry it
    /// cannot read, a special file), each [`Failure::capped`]; the sink
    /// counts each as failed and keeps at most [`MAX_WALK_FAILURES`] of
    /// them. With none to announce, `entries` is empty. Absent from an
    /// older source (its walk's failures stayed with it); an older sink
    /// ignores it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<Failure>,
}

/// Walk failures ([`Entries::failed`]) a sink keeps in its report; it
/// counts those past it, and its report says how many in one more
/// failure (a source may send millions).
pub const MAX_WALK_FAILURES: usize = 1000;
/// Bytes of a failure's path, and of its reason, a source sends and a
/// sink keeps ([`Failure::capped`]).
pub const MAX_FAILURE_PATH: usize = 4096;
pub const MAX_FAILURE_ERROR: usize = 1024;

/// The most skip ranges one [`Want::Send`] carries, so that a `Wants`
/// frame stays far below the frame limit whatever the resume pattern.
pub const MAX_SKIP_RANGES: usize = 8_192;

/// Ranges `[first, end)` of consecutive indices in a sorted list, at most
/// `max` of them (the rest are dropped: those chunks are sent again).
pub fn skip_ranges(sorted: impl IntoIterator<Item = u32>, max: usize) -> Vec<[u32; 2]> {
    let mut out: Vec<[u32; 2]> = Vec::new();
    for i in sorted {
        let full = out.len() == max;
        match out.last_mut() {
            Some(r) if r[1] == i => r[1] = i.saturating_add(1),
            Some(r) if r[1] > i => {}
            _ if full => break,
            _ => out.push([i, i.saturating_add(1)]),
        }
    }
    out
}

/// The sink's answer for one announced file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Want {
    /// Send the file's chunks except those in `skip`, ranges of chunk
    /// indices `[first, end)` verified already (resume). At most
    /// [`MAX_SKIP_RANGES`]; chunks beyond that are sent again and ignored.
    Send {
        id: u64,
        skip: Vec<[u32; 2]>,
        resumed_bytes: u64,
    },
    /// The destination has it already (or it is not a regular file).
    Skip { id: u64 },
    /// The sink cannot take it; the source counts it failed.
    Fail { id: u64, error: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wants {
    pub wants: Vec<Want>,
}

/// A chunk arrived damaged: send it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resend {
    pub id: u64,
    pub index: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDone {
    pub id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The file's BLAKE3 (hex, what `b3sum` prints), when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Source to sink: the file changed while it was read, so what arrived
    /// of it may mix two versions: the sink discards its partial file and
    /// journal.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub changed: bool,
    /// Source to sink, with `changed`: the file is announced again under a
    /// new id, which takes this one's place in [`EntriesEnd::files`]; this
    /// id is neither done nor failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retried: bool,
    /// Sink to source, with `error`, only when [`TransferAccept::defer_full`]
    /// was agreed: the destination had no room for this file while other
    /// files were in flight. Its partial file is gone; the source announces
    /// it again (a new id, in this one's place in [`EntriesEnd::files`])
    /// once nothing else is in flight, and it fails only if it does not fit
    /// then. This id is neither done nor failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub full: bool,
}

/// Source to sink: every read of file `id` so far is done, and the file
/// did not change from its announcement to the end of those reads (same
/// inode, size, mtime and ctime, checked on the open descriptor as GNU tar
/// does). `resends` counts the [`Resend`]s of this file served before the
/// check. The sink renames a file into place only once every chunk is
/// verified and it holds a seal covering every resend it asked for, so
/// that a file changed while it was read never arrives torn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSealed {
    pub id: u64,
    #[serde(default)]
    pub resends: u32,
}

/// Many [`FileSealed`] in one message, in order (only once bundles were
/// negotiated; see [`TransferAccept::bundles`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesSealed {
    pub items: Vec<FileSealed>,
}

/// Many [`FileDone`] in one message, in order, each meaning exactly what
/// it would alone (only once bundles were negotiated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesDone {
    pub items: Vec<FileDone>,
}

/// Most items one [`FilesSealed`] or [`FilesDone`] carries.
pub const MAX_BATCH_ITEMS: usize = 256;
/// About the most bytes of items one batched message carries (error
/// texts make a `FileDone` long): far below the frame limit.
pub const MAX_BATCH_BYTES: usize = 256 << 10;

/// The source has announced everything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntriesEnd {
    pub files: u64,
}

/// The sink's final account.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SinkReport {
    /// With `dry_run`: what would be sent or linked, each as `SOURCE ->
    /// DESTINATION` (where it would land, as the user named the destination).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub would_send: Vec<String>,
    /// With `dry_run`: the bytes of the files in `would_send`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub would_send_bytes: u64,
    pub files: u64,
    pub bytes: u64,
    /// Symbolic links created (or already there, pointing the same way;
    /// with `dry_run`: that would be, or are).
    #[serde(default)]
    pub links: u64,
    /// Of `links`, those already there pointing the same way: left alone
    /// (never in `would_send`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub links_up_to_date: u64,
    pub skipped: u64,
    pub resumed_bytes: u64,
    pub deleted: Vec<String>,
    pub failed: Vec<Failure>,
    /// Busy time of the sink's writes, microseconds (for dest_write_bps).
    pub write_us: u64,
    pub written_bytes: u64,
    /// Bytes of chunks asked again because the stream carrying them
    /// stalled at the transfer's end (the end game, `transfer::tail`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resent_bytes: u64,
    /// Where the sink's CPU went (absent from an older sink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<StageCpu>,
    /// The source's reads, from its `SourceDone` (not on the wire here).
    #[serde(skip)]
    pub source: Option<SourceDone>,
}

/// CPU seconds one end of a copy spent in each stage, on the threads
/// that move its data (data streams, and at a sink the threads that open
/// and finish files). Each instant of those threads counts once, in the
/// innermost stage running then (a stream's read that decrypts counts as
/// `decrypt` for the cipher's part and `receive` for the rest); what runs
/// outside every stage (frames, queues, allocation) is `other`. The
/// control thread is not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StageCpu {
    /// Source: reading storage.
    pub read: f64,
    /// Source: hashing what was read.
    pub hash: f64,
    /// Source: sealing data frames (the cipher).
    pub encrypt: f64,
    /// Source: writing to the data sockets (the kernel's copy and TCP).
    pub send: f64,
    /// Sink: reading from the data sockets.
    pub receive: f64,
    /// Sink: opening data frames (the cipher).
    pub decrypt: f64,
    /// Sink: checking what arrived against the source's hashes.
    pub verify: f64,
    /// Sink: writing storage, creating and finishing files.
    pub write: f64,
    /// Outside the stages above.
    pub other: f64,
}

impl StageCpu {
    /// All of it, seconds.
    pub fn total(&self) -> f64 {
        self.read
            + self.hash
            + self.encrypt
            + self.send
            + self.receive
            + self.decrypt
            + self.verify
            + self.write
            + self.other
    }

    /// The stages with their names, in pipeline order.
    pub fn named(&self) -> [(&'static str, f64); 9] {
        [
            ("read", self.read),
            ("hash", self.hash),
            ("encrypt", self.encrypt),
            ("send", self.send),
            ("receive", self.receive),
            ("decrypt", self.decrypt),
            ("verify", self.verify),
            ("write", self.write),
            ("other", self.other),
        ]
    }

    /// The stage that took most, with its seconds.
    pub fn heaviest(&self) -> (&'static str, f64) {
        self.named()
            .into_iter()
            .fold(("other", f64::MIN), |a, b| if b.1 > a.1 { b } else { a })
    }
}

/// CPU seconds by stage at each end of a copy (`cpu_stages` in
/// `cp --json` and the doctor's copy); an end that did not say (an older
/// server) is absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuStages {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<StageCpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<StageCpu>,
}

impl CpuStages {
    pub fn is_empty(&self) -> bool {
        self.source.is_none() && self.sink.is_none()
    }
}

/// The source's last word, after the sink's `TransferDone`: how its
/// storage reads went, so that the sink's end can report them too.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceDone {
    /// Bytes read from storage and busy time of those reads, microseconds.
    pub read_bytes: u64,
    pub read_us: u64,
    /// Files that changed while they were read and were sent again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resent_changed: u64,
    /// What the source's tuner chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<crate::tune::TuningReport>,
    /// Where the source's CPU went (absent from an older source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<StageCpu>,
    /// What compression did, when it was agreed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<compress::CompressReport>,
}

pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub path: String,
    pub error: String,
}

impl Failure {
    /// Its path cut to [`MAX_FAILURE_PATH`] bytes and its reason to
    /// [`MAX_FAILURE_ERROR`] (at a character's boundary, `…` marking the
    /// cut): what one walk failure costs on the wire and at the sink.
    pub fn capped(self) -> Failure {
        Failure {
            path: cut_to(self.path, MAX_FAILURE_PATH),
            error: cut_to(self.error, MAX_FAILURE_ERROR),
        }
    }
}

/// `s` in at most `max` bytes (`max` at least 3): cut at a character's
/// boundary, the cut marked with `…`.
fn cut_to(mut s: String, max: usize) -> String {
    const MARK: &str = "\u{2026}";
    if s.len() <= max {
        return s;
    }
    let mut at = max - MARK.len();
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.truncate(at);
    s.push_str(MARK);
    s
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRequest {
    pub export: String,
    pub path: String,
    /// Also every directory beneath, depth first (`ls -R`); entries are
    /// then named by their path from the listed directory (`sub/file`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recursive: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListEntry {
    pub name: String,
    pub kind: Kind,
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
    /// A symbolic link's target, as the link holds it (never followed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub entries: Vec<ListEntry>,
    /// False while more listing frames follow.
    pub done: bool,
}

/// Bytes of a chunk frame header on a data stream.
pub const CHUNK_HEADER_LEN: usize = 25;
/// Bytes of the trailer after a chunk's payload: its [`Trailer`].
pub const CHUNK_TRAILER_LEN: usize = 48;

/// What follows a chunk's bytes (a chunk frame's, a bundle record's):
/// the XXH3-128 check the sink compares what it received with, then the
/// chunk's BLAKE3 value (see [`crate::digest`]).
///
/// ```text
/// 0              16                 48
/// | xxh3-128 [16] | blake3 value [32] |
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    pub check: crate::digest::Check,
    pub value: crate::digest::ChunkValue,
}

impl Trailer {
    pub fn encode(&self) -> [u8; CHUNK_TRAILER_LEN] {
        let mut b = [0u8; CHUNK_TRAILER_LEN];
        b[..16].copy_from_slice(&self.check);
        b[16..].copy_from_slice(&self.value);
        b
    }

    pub fn decode(b: &[u8; CHUNK_TRAILER_LEN]) -> Trailer {
        Trailer {
            check: b[..16].try_into().expect("16 bytes"),
            value: b[16..].try_into().expect("32 bytes"),
        }
    }
}
/// First byte of a chunk frame.
pub const CHUNK_FRAME: u8 = 0xC1;
/// First byte of a chunk frame whose bytes are all zero: no payload
/// follows, only the trailer (holes of sparse files cost 73 bytes a chunk).
pub const ZERO_CHUNK_FRAME: u8 = 0xC2;
/// First byte of a compressed chunk frame: the chunk's raw bytes go as
/// blocks, each compressed or stored (only once compression was
/// negotiated; see [`compress`]).
pub const COMPRESSED_CHUNK_FRAME: u8 = 0xC4;
/// Largest chunk a frame may carry.
pub const MAX_CHUNK: u64 = 1 << 31;

/// The fixed header before each chunk's bytes on a data stream. The
/// payload follows (none for a zero chunk), then the chunk's [`Trailer`],
/// so that both ends stream a chunk through the cache in pieces, hashing
/// as they go, instead of holding all of it:
///
/// ```text
/// 0             1          9           13           21        25              25+len      +48
/// | C1, C2 or C4 | file u64 | index u32 | offset u64 | len u32 | payload (C1) | trailer [48] |
/// ```
///
/// A `C4` frame's payload is the chunk's `len` raw bytes as blocks (see
/// [`compress`]); its trailer is still that of the raw bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// All `len` bytes are zero and are not sent.
    pub zero: bool,
    /// The payload is blocks, compressed or stored (`C4`); `len` is raw.
    pub compressed: bool,
    pub file: u64,
    pub index: u32,
    pub offset: u64,
    pub len: u32,
}

/// A chunk header that cannot be right.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad chunk frame: {0}")]
pub struct FrameError(pub &'static str);

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        b[0] = if self.zero {
            ZERO_CHUNK_FRAME
        } else if self.compressed {
            COMPRESSED_CHUNK_FRAME
        } else {
            CHUNK_FRAME
        };
        b[1..9].copy_from_slice(&self.file.to_be_bytes());
        b[9..13].copy_from_slice(&self.index.to_be_bytes());
        b[13..21].copy_from_slice(&self.offset.to_be_bytes());
        b[21..25].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8; CHUNK_HEADER_LEN]) -> Result<ChunkHeader, FrameError> {
        let (zero, compressed) = match b[0] {
            CHUNK_FRAME => (false, false),
            ZERO_CHUNK_FRAME => (true, false),
            COMPRESSED_CHUNK_FRAME => (false, true),
            _ => return Err(FrameError("unknown frame type")),
        };
        let h = ChunkHeader {
            zero,
            compressed,
            file: u64::from_be_bytes(b[1..9].try_into().expect("8 bytes")),
            index: u32::from_be_bytes(b[9..13].try_into().expect("4 bytes")),
            offset: u64::from_be_bytes(b[13..21].try_into().expect("8 bytes")),
            len: u32::from_be_bytes(b[21..25].try_into().expect("4 bytes")),
        };
        if u64::from(h.len) > MAX_CHUNK {
            return Err(FrameError("chunk longer than 2 GiB"));
        }
        if h.offset.checked_add(u64::from(h.len)).is_none() {
            return Err(FrameError("chunk past the largest file offset"));
        }
        Ok(h)
    }
}

/// First byte of a bundle frame: several whole one-chunk files at once
/// (only once bundles were negotiated).
pub const BUNDLE_FRAME: u8 = 0xC3;
/// Bytes of a bundle frame's header.
pub const BUNDLE_HEADER_LEN: usize = 9;
/// Bytes of a bundle record around its payload: file id, length, trailer.
pub const BUNDLE_RECORD_OVERHEAD: usize = 8 + 4 + CHUNK_TRAILER_LEN;
/// Most records in one bundle.
pub const MAX_BUNDLE_FILES: u32 = 256;
/// Largest file a bundle record carries (larger ones go as chunk frames).
pub const MAX_BUNDLE_FILE: u32 = 256 << 10;
/// Most payload bytes (the files' bytes) of one bundle.
pub const MAX_BUNDLE_PAYLOAD: u32 = 1 << 20;
/// Most bytes of a bundle's records, header not counted.
pub const MAX_BUNDLE_BODY: u32 =
    MAX_BUNDLE_PAYLOAD + MAX_BUNDLE_FILES * BUNDLE_RECORD_OVERHEAD as u32;

/// The header of a bundle frame; `count` records of `body_len` bytes in
/// all follow, each a whole file (its chunk 0, which is all of it) with
/// its own [`Trailer`] (whose value is then the file's BLAKE3):
///
/// ```text
/// 0    1           5              9
/// | C3 | count u32 | body_len u32 | record * count
/// record: | file u64 | len u32 | payload [len] | trailer [48] |
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleHeader {
    pub count: u32,
    pub body_len: u32,
}

/// One record of a bundle: a whole file's bytes and their trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleRecord<'a> {
    pub file: u64,
    pub data: &'a [u8],
    pub trailer: Trailer,
}

impl BundleHeader {
    pub fn encode(&self) -> [u8; BUNDLE_HEADER_LEN] {
        let mut b = [0u8; BUNDLE_HEADER_LEN];
        b[0] = BUNDLE_FRAME;
        b[1..5].copy_from_slice(&self.count.to_be_bytes());
        b[5..9].copy_from_slice(&self.body_len.to_be_bytes());
        b
    }

    /// Checks the counts against the caps before anything is read.
    pub fn decode(b: &[u8; BUNDLE_HEADER_LEN]) -> Result<BundleHeader, FrameError> {
        if b[0] != BUNDLE_FRAME {
            return Err(FrameError("unknown frame type"));
        }
        let h = BundleHeader {
            count: u32::from_be_bytes(b[1..5].try_into().expect("4 bytes")),
            body_len: u32::from_be_bytes(b[5..9].try_into().expect("4 bytes")),
        };
        if h.count == 0 || h.count > MAX_BUNDLE_FILES {
            return Err(FrameError("bundle of 0 or more than 256 files"));
        }
        if h.body_len > MAX_BUNDLE_BODY {
            return Err(FrameError("bundle longer than 1 MiB of files"));
        }
        if u64::from(h.body_len) < u64::from(h.count) * BUNDLE_RECORD_OVERHEAD as u64 {
            return Err(FrameError("bundle shorter than its records"));
        }
        Ok(h)
    }

    /// Splits the `body_len` bytes after the header into its records:
    /// exactly `count`, each no longer than [`MAX_BUNDLE_FILE`], filling
    /// the body to its last byte. The driver then checks each length
    /// against the file's announced size.
    pub fn records<'a>(&self, body: &'a [u8]) -> Result<Vec<BundleRecord<'a>>, FrameError> {
        if body.len() != self.body_len as usize {
            return Err(FrameError("bundle body of the wrong length"));
        }
        let mut out = Vec::with_capacity(self.count.min(MAX_BUNDLE_FILES) as usize);
        let mut rest = body;
        for _ in 0..self.count {
            let (head, tail) = rest
                .split_at_checked(12)
                .ok_or(FrameError("bundle record cut short"))?;
            let file = u64::from_be_bytes(head[..8].try_into().expect("8 bytes"));
            let len = u32::from_be_bytes(head[8..12].try_into().expect("4 bytes"));
            if len > MAX_BUNDLE_FILE {
                return Err(FrameError("bundle record longer than 256 KiB"));
            }
            let (data, tail) = tail
                .split_at_checked(len as usize)
                .ok_or(FrameError("bundle record cut short"))?;
            let (trailer, tail) = tail
                .split_at_checked(CHUNK_TRAILER_LEN)
                .ok_or(FrameError("bundle record cut short"))?;
            out.push(BundleRecord {
                file,
                data,
                trailer: Trailer::decode(trailer.try_into().expect("48 bytes")),
            });
            rest = tail;
        }
        if !rest.is_empty() {
            return Err(FrameError("bundle body longer than its records"));
        }
        Ok(out)
    }
}

/// Appends one bundle record to `out` (the bytes after a header): the
/// driver reads the file straight into its place instead (see
/// [`bundle_record_head`]); this is for tests and small callers.
pub fn push_bundle_record(out: &mut Vec<u8>, file: u64, data: &[u8], trailer: &Trailer) {
    out.extend_from_slice(&bundle_record_head(file, data.len() as u32));
    out.extend_from_slice(data);
    out.extend_from_slice(&trailer.encode());
}

/// The 12 bytes before a record's payload.
pub fn bundle_record_head(file: u64, len: u32) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&file.to_be_bytes());
    b[8..].copy_from_slice(&len.to_be_bytes());
    b
}

/// A remote location: `longhaul://HOST[:PORT]/EXPORT/sub/path` or `HOST:EXPORT/sub/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// `HOST` or `HOST:PORT`, as the user wrote it (IPv6 in brackets).
    pub host: String,
    pub export: String,
    /// Path within the export, `/`-separated, no leading slash; "" is the root.
    pub path: String,
    /// Named with a trailing `/` (or as the export itself): a directory.
    pub dir: bool,
}

/// How sources land at a destination. One rule for `cp` and `sync`,
/// rsync's (docs/GUIDE.md, "Where files land"):
///
/// - a source named with a trailing `/` stands for its contents, which go
///   *onto* the destination (created if missing: it becomes the copy);
/// - otherwise, if the destination is an existing directory, is named with
///   a trailing `/`, or there are several sources, each source goes *into*
///   it under its own name, and the destination must already be a
///   directory;
/// - otherwise the one source is copied *onto* the destination's name
///   (a file renamed, a tree copied to a new name).
///
/// Missing directories are never created on a guess: a destination
/// directory that must exist and does not, or the parent of a new name,
/// is created only with `mkpath` (rsync's `--mkpath`); otherwise refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landing {
    /// `dest/NAME/...`: entries keep the source's own name.
    Into,
    /// `dest/...`: the source's own name is replaced by the destination.
    Onto,
}

/// What is at the destination path now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestState {
    Dir,
    /// Something that is not a directory (a file, a link).
    Other,
    /// Nothing; `parent` says whether its parent directory exists.
    Missing {
        parent: bool,
    },
}

/// What the sink must create before entries arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    Nothing,
    /// The destination directory itself, with any missing parents (mkpath).
    Dest,
    /// The missing parents of the destination (mkpath); the destination
    /// itself is made by the copy.
    Parents,
}

/// A destination the rule refuses, worded for "the destination {shown} ...".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestError {
    #[error("{0} does not exist: create it first, or pass --mkpath to create it")]
    MissingDir(String),
    #[error("the directory that would hold {0} does not exist: create it first, or pass --mkpath")]
    MissingParent(String),
    #[error("{0} is not a directory, but {1}")]
    NotADir(String, &'static str),
    #[error(
        "{0} is a file: a directory cannot replace it; name a directory (DEST/) or a new name"
    )]
    TreeOntoFile(String),
}

/// Applies the rule of [`Landing`]: `shown` names the destination in
/// errors, `sources` counts them, `contents` says they were named `SRC/`,
/// `dest_dir` that the destination was named with a trailing `/`.
pub fn landing(
    shown: &str,
    sources: u32,
    contents: bool,
    dest_dir: bool,
    state: DestState,
    mkpath: bool,
) -> Result<(Landing, Create), DestError> {
    let into = !contents && (sources > 1 || dest_dir || state == DestState::Dir);
    if into {
        return match state {
            DestState::Dir => Ok((Landing::Into, Create::Nothing)),
            DestState::Other => Err(DestError::NotADir(
                shown.to_string(),
                if sources > 1 {
                    "several sources go into a directory"
                } else {
                    "it was named with a trailing '/'"
                },
            )),
            DestState::Missing { .. } if mkpath => Ok((Landing::Into, Create::Dest)),
            DestState::Missing { .. } => Err(DestError::MissingDir(shown.to_string())),
        };
    }
    match state {
        DestState::Dir => Ok((Landing::Onto, Create::Nothing)),
        DestState::Other if contents => Err(DestError::NotADir(
            shown.to_string(),
            "a directory's contents (SRC/) go into a directory",
        )),
        DestState::Other | DestState::Missing { parent: true } => {
            Ok((Landing::Onto, Create::Nothing))
        }
        DestState::Missing { parent: false } if mkpath => Ok((Landing::Onto, Create::Parents)),
        DestState::Missing { parent: false } => Err(DestError::MissingParent(shown.to_string())),
    }
}

/// Parses an argument as a remote location; `None` means it is a local path.
pub fn parse_remote(arg: &str) -> Option<Remote> {
    let (host, rest) = if let Some(url) = arg.strip_prefix("longhaul://") {
        let (host, rest) = url.split_once('/').unwrap_or((url, ""));
        (host.to_string(), rest)
    } else {
        // HOST:EXPORT/path. A local path with a ':' after a '/' stays local,
        // as with scp and rsync.
        let (host, rest) = if let Some(stripped) = arg.strip_prefix('[') {
            let (h, r) = stripped.split_once("]:")?;
            (format!("[{h}]"), r)
        } else {
            let (h, r) = arg.split_once(':')?;
            if h.is_empty() || h.contains('/') {
                return None;
            }
            (h.to_string(), r)
        };
        // HOST:PORT:EXPORT/path
        match rest.split_once(':') {
            Some((port, r))
                if !port.is_empty()
                    && port.bytes().all(|b| b.is_ascii_digit())
                    && !port.contains('/') =>
            {
                (format!("{host}:{port}"), r)
            }
            _ => (host, rest),
        }
    };
    let rest = rest.trim_start_matches('/');
    let (export, path) = rest.split_once('/').unwrap_or((rest, ""));
    let path = path.trim_end_matches('/');
    Some(Remote {
        host,
        export: export.to_string(),
        path: path.to_string(),
        dir: path.is_empty() || rest.ends_with('/'),
    })
}

/// Longest name of one path component, as most file systems allow.
pub const MAX_NAME: usize = 255;
/// Longest relative path we accept.
pub const MAX_PATH: usize = 4096;

/// Why a path a peer sent is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("path '{path}' refused: {why}")]
pub struct PathError {
    pub path: String,
    pub why: &'static str,
}

/// Suffixes of the names a sink keeps beside a file `NAME` while it
/// arrives: `.NAME.lhpart` (the partial file), `.NAME.lhjournal` and a
/// part's `.NAME.F-E.lhjournal` (resume journals), a part's
/// `.NAME.F-E.lhdone` (its range is complete) and `.NAME.lhlink` (a link
/// being made).
pub const RESERVED_SUFFIXES: [&str; 4] = [".lhpart", ".lhjournal", ".lhdone", ".lhlink"];

/// Whether `name` (one path component) is one of the names a sink keeps
/// for itself ([`RESERVED_SUFFIXES`]). No peer may name one (see
/// [`components`]); walks, listings and pulls skip them, so a partial
/// file is never data.
pub fn is_reserved_name(name: &str) -> bool {
    name.starts_with('.') && RESERVED_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// Checks a relative path from a peer and splits it into components. It
/// must stay beneath its root: no absolute paths, no `..`, no NUL, no empty
/// or over-long components, and no name the sink keeps for its partial
/// files, journals and marks ([`is_reserved_name`]).
pub fn components(path: &str) -> Result<Vec<&str>, PathError> {
    let err = |why| PathError {
        path: path.chars().take(200).collect(),
        why,
    };
    if path.len() > MAX_PATH {
        return Err(err("longer than 4096 bytes"));
    }
    if path.contains('\0') {
        return Err(err("contains a NUL byte"));
    }
    if path.starts_with('/') {
        return Err(err("absolute paths are not allowed"));
    }
    let mut out = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => continue,
            ".." => return Err(err("'..' leaves the export")),
            c if c.len() > MAX_NAME => return Err(err("a component is longer than 255 bytes")),
            c if is_reserved_name(c) => {
                return Err(err(
                    "names of the form .NAME.lhpart, .lhjournal, .lhdone and .lhlink are longhaul's partial files and marks; rename the file",
                ))
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// First bytes of a resume journal file.
pub const JOURNAL_MAGIC: [u8; 8] = *b"LHJRNL01";

/// What a journal belongs to: a partial file is resumed only if the source
/// file still has this size, mtime and chunk size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalHeader {
    pub size: u64,
    pub mtime_ns: i64,
    pub chunk_size: u64,
}

/// Bytes of a journal header and of each record after it.
pub const JOURNAL_HEADER_LEN: usize = 32;
pub const JOURNAL_RECORD_LEN: usize = 36;

impl JournalHeader {
    pub fn encode(&self) -> [u8; JOURNAL_HEADER_LEN] {
        let mut b = [0u8; JOURNAL_HEADER_LEN];
        b[..8].copy_from_slice(&JOURNAL_MAGIC);
        b[8..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..24].copy_from_slice(&self.mtime_ns.to_be_bytes());
        b[24..32].copy_from_slice(&self.chunk_size.to_be_bytes());
        b
    }
}

/// A verified chunk: its index and BLAKE3 value.
pub type JournalRecord = (u32, [u8; 32]);

/// Encodes one journal record: a verified chunk and its value.
pub fn journal_record(index: u32, hash: &[u8; 32]) -> [u8; JOURNAL_RECORD_LEN] {
    let mut b = [0u8; JOURNAL_RECORD_LEN];
    b[..4].copy_from_slice(&index.to_be_bytes());
    b[4..].copy_from_slice(hash);
    b
}

/// Reads a journal: its header and the (index, hash) records, ignoring a
/// torn record at the end (a crash mid-append). `None` if it is not a
/// journal at all.
pub fn parse_journal(bytes: &[u8]) -> Option<(JournalHeader, Vec<JournalRecord>)> {
    let h = bytes.get(..JOURNAL_HEADER_LEN)?;
    if h[..8] != JOURNAL_MAGIC {
        return None;
    }
    let header = JournalHeader {
        size: u64::from_be_bytes(h[8..16].try_into().ok()?),
        mtime_ns: i64::from_be_bytes(h[16..24].try_into().ok()?),
        chunk_size: u64::from_be_bytes(h[24..32].try_into().ok()?),
    };
    let records = bytes[JOURNAL_HEADER_LEN..]
        .chunks_exact(JOURNAL_RECORD_LEN)
        .map(|r| {
            (
                u32::from_be_bytes(r[..4].try_into().expect("4 bytes")),
                r[4..].try_into().expect("32 bytes"),
            )
        })
        .collect();
    Some((header, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_failure_fits_its_budget_and_cuts_at_a_character() {
        let short = Failure {
            path: "a/b".into(),
            error: "e".into(),
        };
        assert_eq!(short.clone().capped(), short);
        let long = Failure {
            path: "\u{e9}".repeat(MAX_FAILURE_PATH),
            error: "x".repeat(MAX_FAILURE_ERROR + 1),
        }
        .capped();
        assert!(long.path.len() <= MAX_FAILURE_PATH && long.path.ends_with('\u{2026}'));
        assert!(long.path.starts_with("\u{e9}\u{e9}"));
        assert_eq!(long.error.len(), MAX_FAILURE_ERROR);
    }

    #[test]
    fn skip_ranges_merge_runs_and_stop_at_the_cap() {
        assert_eq!(skip_ranges([], 4), Vec::<[u32; 2]>::new());
        assert_eq!(
            skip_ranges([0, 1, 2, 5, 7, 8, 8], 4),
            vec![[0, 3], [5, 6], [7, 9]]
        );
        assert_eq!(skip_ranges([0, 2, 4, 6], 2), vec![[0, 1], [2, 3]]);
        assert_eq!(
            skip_ranges([u32::MAX - 1], 1),
            vec![[u32::MAX - 1, u32::MAX]]
        );
    }

    #[test]
    fn worst_case_wants_frames_fit() {
        // Every other chunk verified, indices near the top: the longest
        // encoding a capped skip list can have; two of them per frame.
        let mut sorted: Vec<u32> = (0..MAX_SKIP_RANGES as u32 + 10)
            .map(|i| u32::MAX - 1 - 2 * (MAX_SKIP_RANGES as u32 + 10) + 2 * i)
            .collect();
        sorted.sort_unstable();
        let skip = skip_ranges(sorted, MAX_SKIP_RANGES);
        assert_eq!(skip.len(), MAX_SKIP_RANGES);
        let want = Want::Send {
            id: u64::MAX,
            skip,
            resumed_bytes: u64::MAX,
        };
        let frame = serde_json::to_vec(&Wants {
            wants: vec![want.clone(), want],
        })
        .unwrap();
        assert!(
            frame.len() < crate::frame::MAX_FRAME_BODY as usize / 2,
            "{} bytes",
            frame.len()
        );
    }

    #[test]
    fn remote_syntax() {
        let r = parse_remote("longhaul://dtn1:5310/data/run7/a.h5").unwrap();
        assert_eq!(
            (r.host.as_str(), r.export.as_str(), r.path.as_str()),
            ("dtn1:5310", "data", "run7/a.h5")
        );
        let r = parse_remote("dtn1:data/run7/").unwrap();
        assert_eq!(
            (r.host.as_str(), r.export.as_str(), r.path.as_str()),
            ("dtn1", "data", "run7")
        );
        assert!(r.dir);
        let r = parse_remote("dtn1:data").unwrap();
        assert_eq!((r.export.as_str(), r.path.as_str()), ("data", ""));
        assert!(r.dir, "an export's root is a directory");
        assert!(!parse_remote("dtn1:data/run7").unwrap().dir);
        let r = parse_remote("[::1]:data/x").unwrap();
        assert_eq!((r.host.as_str(), r.export.as_str()), ("[::1]", "data"));
        let r = parse_remote("dtn1:5311:data/x").unwrap();
        assert_eq!(
            (r.host.as_str(), r.export.as_str(), r.path.as_str()),
            ("dtn1:5311", "data", "x")
        );
        let r = parse_remote("[::1]:5311:data").unwrap();
        assert_eq!((r.host.as_str(), r.export.as_str()), ("[::1]:5311", "data"));
        assert_eq!(parse_remote("./a:b"), None);
        assert_eq!(parse_remote("/tmp/x"), None);
        assert_eq!(parse_remote("plain"), None);
    }

    #[test]
    fn where_sources_land() {
        use DestState::*;
        let l = |n, contents, slash, st, mk| landing("D", n, contents, slash, st, mk);
        // An existing directory: into it, whatever the slash.
        assert_eq!(
            l(1, false, false, Dir, false),
            Ok((Landing::Into, Create::Nothing))
        );
        assert_eq!(
            l(1, false, true, Dir, false),
            Ok((Landing::Into, Create::Nothing))
        );
        // One source onto a new name, or over a file.
        let onto = Ok((Landing::Onto, Create::Nothing));
        assert_eq!(l(1, false, false, Missing { parent: true }, false), onto);
        assert_eq!(l(1, false, false, Other, false), onto);
        // A trailing slash names a directory: never a file, never guessed.
        assert!(matches!(
            l(1, false, true, Missing { parent: false }, false),
            Err(DestError::MissingDir(_))
        ));
        assert!(matches!(
            l(1, false, true, Missing { parent: true }, false),
            Err(DestError::MissingDir(_))
        ));
        assert_eq!(
            l(1, false, true, Missing { parent: false }, true),
            Ok((Landing::Into, Create::Dest))
        );
        assert!(matches!(
            l(1, false, true, Other, false),
            Err(DestError::NotADir(..))
        ));
        // Several sources need a directory.
        assert!(matches!(
            l(2, false, false, Missing { parent: true }, false),
            Err(DestError::MissingDir(_))
        ));
        assert!(matches!(
            l(3, false, false, Other, true),
            Err(DestError::NotADir(..))
        ));
        // A new name's parent is created only with mkpath.
        assert!(matches!(
            l(1, false, false, Missing { parent: false }, false),
            Err(DestError::MissingParent(_))
        ));
        assert_eq!(
            l(1, false, false, Missing { parent: false }, true),
            Ok((Landing::Onto, Create::Parents))
        );
        // SRC/: the contents, onto the destination, made if its parent is there.
        assert_eq!(l(1, true, true, Dir, false), onto);
        assert_eq!(l(1, true, true, Missing { parent: true }, false), onto);
        assert_eq!(l(2, true, false, Dir, false), onto);
        assert!(matches!(
            l(1, true, false, Other, false),
            Err(DestError::NotADir(..))
        ));
        assert!(matches!(
            l(1, true, false, Missing { parent: false }, false),
            Err(DestError::MissingParent(_))
        ));
    }

    #[test]
    fn confinement() {
        assert_eq!(components("a/b/./c/").unwrap(), vec!["a", "b", "c"]);
        assert_eq!(components("").unwrap(), Vec::<&str>::new());
        for bad in ["../x", "a/../../b", "/etc/passwd", "a\0b"] {
            assert!(components(bad).is_err(), "{bad}");
        }
        assert!(components(&"x".repeat(256)).is_err());
        assert!(components(&"a/".repeat(3000)).is_err());
        for reserved in [
            ".x.lhpart",
            "d/.x.lhjournal",
            ".x.0-4.lhjournal/y",
            "a/.x.0-4.lhdone",
            ".x.lhlink",
        ] {
            assert!(components(reserved).is_err(), "{reserved}");
        }
        for fine in ["x.lhpart", ".x.lhpart.bak", ".hidden", "lhdone"] {
            assert!(components(fine).is_ok(), "{fine}");
        }
    }

    #[test]
    fn chunk_header_round_trip_and_checks() {
        let h = ChunkHeader {
            zero: false,
            compressed: false,
            file: 9,
            index: 3,
            offset: 3 << 20,
            len: 1 << 20,
        };
        assert_eq!(ChunkHeader::decode(&h.encode()), Ok(h));
        let z = ChunkHeader { zero: true, ..h };
        assert_eq!(ChunkHeader::decode(&z.encode()), Ok(z));
        let c = ChunkHeader {
            compressed: true,
            ..h
        };
        assert_eq!(c.encode()[0], COMPRESSED_CHUNK_FRAME);
        assert_eq!(ChunkHeader::decode(&c.encode()), Ok(c));
        let mut b = h.encode();
        b[0] = 0;
        assert!(ChunkHeader::decode(&b).is_err());
        let bad = ChunkHeader {
            offset: u64::MAX,
            ..h
        };
        assert!(ChunkHeader::decode(&bad.encode()).is_err());
    }

    #[test]
    fn bundle_round_trip_and_checks() {
        let mut body = Vec::new();
        let t = |b: u8| Trailer {
            check: [b; 16],
            value: [b + 1; 32],
        };
        push_bundle_record(&mut body, 7, b"hello", &t(1));
        push_bundle_record(&mut body, 8, b"", &t(2));
        let h = BundleHeader {
            count: 2,
            body_len: body.len() as u32,
        };
        assert_eq!(body.len(), 2 * BUNDLE_RECORD_OVERHEAD + 5);
        let enc = h.encode();
        assert_eq!(enc, [0xC3, 0, 0, 0, 2, 0, 0, 0, 125]);
        assert_eq!(BundleHeader::decode(&enc), Ok(h));
        let recs = h.records(&body).unwrap();
        assert_eq!(
            recs,
            vec![
                BundleRecord {
                    file: 7,
                    data: b"hello",
                    trailer: t(1)
                },
                BundleRecord {
                    file: 8,
                    data: b"",
                    trailer: t(2)
                }
            ]
        );
        // Counts and lengths that cannot be right.
        for (count, body_len) in [(0, 60), (257, 257 * 60), (1, MAX_BUNDLE_BODY + 1), (2, 119)] {
            let bad = BundleHeader { count, body_len }.encode();
            assert!(BundleHeader::decode(&bad).is_err(), "{count} {body_len}");
        }
        let mut wrong_type = enc;
        wrong_type[0] = CHUNK_FRAME;
        assert!(BundleHeader::decode(&wrong_type).is_err());
        // A record longer than the body, a body with bytes left over, a
        // body cut short, a record over the size cap.
        let mut long = body.clone();
        long[8 + 4 + 5 + 48 + 11] = 50;
        assert!(h.records(&long).is_err());
        let one = BundleHeader { count: 1, ..h };
        assert!(one.records(&body).is_err());
        assert!(h.records(&body[..body.len() - 1]).is_err());
        let mut big = Vec::new();
        push_bundle_record(&mut big, 1, &vec![0; MAX_BUNDLE_FILE as usize + 1], &t(0));
        let bh = BundleHeader {
            count: 1,
            body_len: big.len() as u32,
        };
        assert!(bh.records(&big).is_err());
    }

    #[test]
    fn a_part_carries_its_chunks_bytes_and_a_whole_file_all_of_them() {
        let mut e = Entry {
            id: 1,
            path: "f".into(),
            kind: Kind::File,
            size: 10 << 20 | 5,
            mode: 0o644,
            mtime_ns: 0,
            target: None,
            chunk_size: 1 << 20,
            sparse: false,
            incomplete: false,
            digest: None,
            part: None,
        };
        assert_eq!(e.chunk_range(), [0, 11]);
        assert_eq!(e.carried_bytes(), e.size);
        e.part = Some([2, 4]);
        assert_eq!(e.carried_bytes(), 2 << 20);
        e.part = Some([10, 11]);
        assert_eq!(e.carried_bytes(), 5, "the last chunk is short");
        // Parts of one file add up to the file.
        let sum: u64 = [[0, 3], [3, 10], [10, 11]]
            .iter()
            .map(|p| {
                e.part = Some(*p);
                e.carried_bytes()
            })
            .sum();
        assert_eq!(sum, e.size);
        let json = serde_json::to_string(&e).unwrap();
        assert!(json.contains(r#""part":[10,11]"#), "{json}");
        e.part = None;
        assert!(!serde_json::to_string(&e).unwrap().contains("part"));
    }

    #[test]
    fn negotiation_fields_are_absent_unless_set() {
        let a = TransferAccept {
            token: "t".into(),
            max_files_in_flight: None,
            bundles: false,
            onto: false,
            parts: false,
            sealed: false,
            filter: false,
            compress: false,
            defer_full: false,
            tag_checks: false,
        };
        assert_eq!(serde_json::to_string(&a).unwrap(), r#"{"token":"t"}"#);
        let old: TransferAccept = serde_json::from_str(r#"{"token":"t"}"#).unwrap();
        assert!(!old.bundles);
        assert!(!old.parts, "an older server takes no parts");
        assert!(!old.sealed, "an older server keeps TLS records");
        assert!(!old.tag_checks, "an older server checks XXH3");
        let on: TransferAccept = serde_json::from_str(r#"{"token":"t","bundles":true}"#).unwrap();
        assert!(on.bundles);
    }

    #[test]
    fn journal_round_trip_with_torn_tail() {
        let h = JournalHeader {
            size: 10 << 20,
            mtime_ns: -5,
            chunk_size: 1 << 20,
        };
        let mut j = h.encode().to_vec();
        j.extend_from_slice(&journal_record(0, &[1; 32]));
        j.extend_from_slice(&journal_record(4, &[2; 32]));
        j.extend_from_slice(&journal_record(5, &[3; 32])[..10]);
        let (hh, recs) = parse_journal(&j).unwrap();
        assert_eq!(hh, h);
        assert_eq!(recs, vec![(0, [1; 32]), (4, [2; 32])]);
        assert_eq!(parse_journal(b"not a journal at all, no no no no"), None);
    }
}
