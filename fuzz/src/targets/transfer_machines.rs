//! Arbitrary peer messages, engine results and clock jumps against the
//! transfer session's two machines, `transfer::sink::Sink` and
//! `transfer::source::Source` (a hostile or broken peer on the other end).
//!
//! Must never panic, whatever arrives in whatever order (ids unknown or
//! reused, sizes and chunk sizes of any value, skip ranges backwards,
//! seals before wants, a done transfer fed more). Every message a machine
//! queues encodes and decodes back unchanged.

use std::time::{Duration, Instant};

use crate::roundtrip;

use arbitrary::Arbitrary;
use longhaul_proto::frame::Frame;
use longhaul_proto::msg::Message;
use longhaul_proto::transfer::sink::{Sink, SinkAction, SinkLimits};
use longhaul_proto::transfer::source::{Source, SourceLimits};
use longhaul_proto::xfer::{
    Entries, EntriesEnd, Entry, Failure, FileDone, FileSealed, FilesDone, FilesSealed, Kind,
    Resend, SinkReport, SourceDone, Want, Wants, MAX_BATCH_ITEMS, MAX_WALK_FAILURES,
};

/// An entry as a peer could announce it: any id, size, chunk size, path.
#[derive(Arbitrary, Debug)]
struct FuzzEntry {
    id: u64,
    path: String,
    kind: u8,
    size: u64,
    chunk_size: u64,
    sparse: bool,
    incomplete: bool,
    /// A part of the file (`Entry::part`), any range a peer could send.
    part: Option<[u32; 2]>,
}

impl FuzzEntry {
    fn build(self) -> Entry {
        Entry {
            id: self.id % 64,
            path: self.path,
            kind: match self.kind % 4 {
                0 => Kind::File,
                1 => Kind::Dir,
                2 => Kind::Symlink,
                _ => Kind::DirEnd,
            },
            size: self.size,
            mode: 0o644,
            mtime_ns: 0,
            target: None,
            chunk_size: self.chunk_size,
            sparse: self.sparse,
            incomplete: self.incomplete,
            digest: None,
            part: self.part,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Peer {
    /// To the sink, from a source: entries, and what its walk could not
    /// announce (any paths and reasons, any number of them).
    Entries(Vec<FuzzEntry>, Vec<(String, String)>),
    FileDone {
        id: u64,
        error: bool,
        changed: bool,
    },
    FileSealed {
        id: u64,
        resends: u32,
    },
    /// Batched (bundles negotiated): seals and dones, many at once.
    FilesSealed(Vec<(u64, u32)>),
    FilesDone(Vec<(u64, bool, bool)>),
    EntriesEnd {
        files: u64,
    },
    SourceDone {
        read_bytes: u64,
        read_us: u64,
    },
    /// To the source, from a sink.
    WantSend {
        id: u64,
        skip: Vec<(u32, u32)>,
        resumed: u64,
    },
    WantSkip {
        id: u64,
    },
    WantFail {
        id: u64,
    },
    Resend {
        id: u64,
        index: u32,
    },
    TransferDone,
    /// Raw frame: handled only if it decodes.
    Frame {
        kind: u8,
        body: Vec<u8>,
    },
}

impl Peer {
    fn build(self) -> Option<Message> {
        Some(match self {
            Peer::Entries(e, failed) => Message::Entries(Entries {
                entries: e.into_iter().take(64).map(FuzzEntry::build).collect(),
                failed: failed
                    .into_iter()
                    .take(4096)
                    .map(|(path, error)| Failure { path, error })
                    .collect(),
            }),
            Peer::FileDone { id, error, changed } => Message::FileDone(FileDone {
                id: id % 64,
                error: error.then(|| "e".into()),
                changed,
                ..FileDone::default()
            }),
            Peer::FileSealed { id, resends } => Message::FileSealed(FileSealed {
                id: id % 64,
                resends,
            }),
            Peer::FilesSealed(items) => Message::FilesSealed(FilesSealed {
                items: items
                    .into_iter()
                    .take(300)
                    .map(|(id, resends)| FileSealed {
                        id: id % 64,
                        resends,
                    })
                    .collect(),
            }),
            Peer::FilesDone(items) => Message::FilesDone(FilesDone {
                items: items
                    .into_iter()
                    .take(300)
                    .map(|(id, error, changed)| FileDone {
                        id: id % 64,
                        error: error.then(|| "e".into()),
                        changed,
                        ..FileDone::default()
                    })
                    .collect(),
            }),
            Peer::EntriesEnd { files } => Message::EntriesEnd(EntriesEnd { files }),
            Peer::SourceDone {
                read_bytes,
                read_us,
            } => Message::SourceDone(SourceDone {
                read_bytes,
                read_us,
                ..Default::default()
            }),
            Peer::WantSend { id, skip, resumed } => Message::Wants(Wants {
                wants: vec![Want::Send {
                    id: id % 64,
                    skip: skip.into_iter().take(16).map(|(a, b)| [a, b]).collect(),
                    resumed_bytes: resumed,
                }],
            }),
            Peer::WantSkip { id } => Message::Wants(Wants {
                wants: vec![Want::Skip { id: id % 64 }],
            }),
            Peer::WantFail { id } => Message::Wants(Wants {
                wants: vec![Want::Fail {
                    id: id % 64,
                    error: "no".into(),
                }],
            }),
            Peer::Resend { id, index } => Message::Resend(Resend { id: id % 64, index }),
            Peer::TransferDone => Message::TransferDone(SinkReport::default()),
            Peer::Frame { kind, body } => return Message::decode(&Frame { kind, body }).ok(),
        })
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    ToSink(Peer),
    ToSource(Peer),
    /// The engine answers the sink's next `Open` (or does nothing).
    SinkOpened {
        skip_first: u32,
    },
    SinkDamaged {
        id: u64,
        index: u32,
    },
    SinkWritten {
        bytes: u32,
        busy_us: u32,
    },
    /// The engine tells the source what its walk found.
    SourceAdd(FuzzEntry),
    SourceWalkEnded,
    /// The engine tells the source what its walk could not announce.
    SourceWalkFailed {
        path: String,
        error: String,
    },
    SourceEndBatch,
    SourceSealed {
        id: u64,
        resends: u32,
    },
    SourceChanged {
        id: u64,
    },
    SourceFileFailed {
        id: u64,
    },
    SourceSent {
        bytes: u32,
        us: u32,
    },
    Advance {
        ms: u32,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    max_files: u8,
    max_chunks_per_file: u32,
    batch: u8,
    /// Both ends agreed to bundles: seals and dones go out batched.
    batched: bool,
    /// Opens the sink's driver may have out at once (its open pool).
    opens_at_once: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let idle = Duration::from_secs(300);
    let base = Instant::now();
    let mut now = base;
    let mut sink = Sink::new(
        now,
        SinkLimits {
            max_files: u64::from(input.max_files.max(1)),
            max_chunks_per_file: u64::from(input.max_chunks_per_file.max(1)),
            max_chunks_in_flight: 1 << 20,
            idle,
        },
    );
    let mut source: Source<u64> = Source::new(
        now,
        SourceLimits {
            batch: usize::from(input.batch.max(1)),
            files_in_flight: 4,
            max_files_in_flight: 64,
            idle,
        },
    );
    sink.open_at_once(usize::from(input.opens_at_once % 8));
    if input.batched {
        sink.batch_messages();
        source.batch_messages();
    }
    let mut opened = Vec::new();
    for op in input.ops.into_iter().take(256) {
        let _ = match op {
            Op::ToSink(p) => p.build().map(|m| sink.handle(now, m).is_ok()),
            Op::ToSource(p) => p.build().map(|m| source.handle(now, m).is_ok()),
            Op::SinkOpened { skip_first } => opened.pop().map(|id| {
                sink.opened(
                    now,
                    id,
                    Want::Send {
                        id,
                        skip: if skip_first > 0 {
                            vec![[0, skip_first]]
                        } else {
                            vec![]
                        },
                        resumed_bytes: 0,
                    },
                );
                true
            }),
            Op::SinkDamaged { id, index } => {
                Some(sink.damaged(now, Resend { id: id % 64, index }).is_ok())
            }
            Op::SinkWritten { bytes, busy_us } => {
                sink.written(now, u64::from(bytes), u64::from(busy_us));
                None
            }
            Op::SourceAdd(e) => {
                let e = e.build();
                let id = e.id;
                source.add(e, id, 1);
                None
            }
            Op::SourceWalkEnded => {
                source.walk_ended();
                None
            }
            Op::SourceWalkFailed { path, error } => {
                source.walk_failed(Failure { path, error });
                None
            }
            Op::SourceEndBatch => {
                source.end_batch();
                None
            }
            Op::SourceSealed { id, resends } => {
                source.sealed(now, id % 64, resends);
                None
            }
            Op::SourceChanged { id } => {
                source.changed(now, id % 64, "fuzz");
                None
            }
            Op::SourceFileFailed { id } => {
                source.file_failed(now, id % 64, "fuzz".into());
                None
            }
            Op::SourceSent { bytes, us } => {
                source.sent(now, u64::from(bytes), u64::from(us));
                None
            }
            Op::Advance { ms } => {
                now += Duration::from_millis(u64::from(ms % 600_000));
                if sink.poll_timeout().is_some_and(|t| t <= now) {
                    let _ = sink.handle_timeout(now);
                }
                if source.poll_timeout().is_some_and(|t| t <= now) {
                    let _ = source.handle_timeout(now);
                }
                None
            }
        };
        // However many walk failures a source sends, the sink keeps its
        // budget's worth.
        assert!(sink.walk_failures().0 <= MAX_WALK_FAILURES);
        // Drain what each machine has to say or do, as the engine would.
        while let Some(m) = sink.poll_transmit() {
            roundtrip::assert_roundtrip(&m);
            assert_batch(&m, input.batched);
        }
        while let Ok(Some(a)) = sink.poll_action() {
            if let SinkAction::Open(e) = a {
                opened.push(e.id);
            }
        }
        while let Some(m) = source.poll_transmit() {
            roundtrip::assert_roundtrip(&m);
            assert_batch(&m, input.batched);
        }
        while source.poll_action().is_some() {}
        let _ = source.finished();
    }
});

/// A batched message goes out only once agreed, with 2..=256 items.
fn assert_batch(m: &Message, batched: bool) {
    let items = match m {
        Message::FilesSealed(b) => b.items.len(),
        Message::FilesDone(b) => b.items.len(),
        _ => return,
    };
    assert!(batched, "a batched message without agreement");
    assert!((2..=MAX_BATCH_ITEMS).contains(&items), "{items} items");
}
