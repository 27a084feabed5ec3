//! The source of a transfer: walks the roots lazily, announces entries in
//! bounded batches, and sends the chunks the sink wants on the data
//! streams, each with its BLAKE3 hash.
//!
//! [`run_source`] starts a sender per data stream (`send`: chunk frames;
//! `bundle`: many small files to a frame) around the queue they share
//! (`queue`), and runs the control thread (`control`), which announces
//! what the walk finds (`walk`).

mod bundle;
mod control;
mod queue;
mod send;
mod walk;

use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use longhaul_proto::transfer::source::SourceTally;
use longhaul_proto::xfer::compress::{CompressReport, Governor};
use longhaul_proto::xfer::*;

use super::beneath::Anchor;
use super::prefetch::Prefetcher;
use super::storage::Storage;
use crate::net::conn::{FramedConn, Stream};
use crate::stages::{self, StageTotals};
use crate::EngineError;
use queue::{Out, Queue, Shared};
use send::send;
pub use walk::{directory_without_r, root_name, walk, walk_beneath};

pub struct SourceConfig {
    /// Send `DirEnd` markers (sync --delete) and content digests (sync --checksum).
    pub dir_ends: bool,
    pub digests: bool,
    pub digest_out: Option<super::DigestOut>,
    /// Each file that landed, for the catalogue.
    pub on_landed: Option<super::OnLanded>,
    pub progress: Arc<super::Progress>,
    pub roots: Vec<PathBuf>,
    pub recursive: bool,
    pub chunk_size: Option<u64>,
    pub streams: u16,
    pub storage: Arc<dyn Storage>,
    /// On a server: every path read resolves beneath the export root
    /// (race-free; see [`super::beneath`]). None on a client, whose own
    /// paths are its user's to choose.
    pub anchor: Option<Arc<Anchor>>,
    /// Tune the number of streams carrying chunks online.
    pub online: bool,
    /// Send each interval to the sink (a server sending to its client).
    pub send_intervals: bool,
    /// The path's RTT, for the tuner's epoch.
    pub rtt: Duration,
    /// Each stream's pacing cap, bytes/s, when the user capped the rate
    /// (`cp --rate`): intervals that carry it are named `rate_cap`.
    pub pacing: Option<u64>,
    /// Files announced and not yet finished, at most, at the start...
    pub files_in_flight: u64,
    /// ...and the sink's cap, toward which the count grows while it holds
    /// the transfer back (equal when fixed).
    pub max_files_in_flight: u64,
    /// Both ends agreed to bundles (`TransferAccept::bundles`): small
    /// whole files go many to a bundle frame, seals batched.
    pub bundles: bool,
    /// A fleet rank's share: these entries instead of a walk of `roots`.
    pub share: Option<Share>,
    /// Include/exclude rules: what they exclude is not announced, and an
    /// excluded directory is not walked.
    pub filter: Option<Arc<super::filter::Filter>>,
    /// `-z` agreed (`TransferAccept::compress`): chunks go compressed at
    /// this zstd level while the governor finds it pays.
    pub compress: Option<i32>,
    /// Both ends agreed to tag checks (`TransferAccept::tag_checks`): the
    /// data streams' AEAD proves each chunk, no XXH3 is computed.
    pub tag_checks: bool,
}

/// A fleet rank's share of a transfer (`longhaul-fleet`).
#[derive(Clone)]
pub enum Share {
    /// Entries cut before the transfer starts (static shares).
    Fixed(Arc<Vec<ShareItem>>),
    /// Entries asked for as the transfer goes (a work queue's leases): one
    /// session carries unit after unit, without a new connection and a new
    /// slow start for each.
    Fed(ShareFeed),
}

/// Asked for more of a share each time the entries it gave have all been
/// announced, with what is still in flight.
pub type ShareFeed = Arc<dyn Fn(InFlight) -> Fed + Send + Sync>;

/// Where a transfer stands when its feed is asked for more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    /// Files announced and not yet resolved by the sink.
    pub files: usize,
    /// About the bytes announced and not yet read for sending (the
    /// streams' work ahead).
    pub unsent: u64,
    /// Bytes read for sending so far in this transfer.
    pub sent: u64,
}

/// A [`ShareFeed`]'s answer.
#[derive(Debug)]
pub enum Fed {
    /// These entries next.
    More(Vec<ShareItem>),
    /// Nothing yet: ask again when more of what is in flight has landed.
    /// (Never answered while nothing is in flight, or the transfer idles.)
    Later,
    /// The share is complete: the transfer ends once what is in flight
    /// lands.
    End,
}

/// One entry of a fleet rank's share (`longhaul-fleet`): a path a walk of
/// the roots found, announced under the name that walk gave it, whole or
/// as the chunks `[first, end)` of its file ([`Entry::part`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareItem {
    pub path: PathBuf,
    pub rel: String,
    /// The chunk size the share was cut with (files only).
    pub chunk_size: u64,
    pub part: Option<[u32; 2]>,
}

/// `path` as it is to be used: through the anchor, if there is one.
fn at(anchor: &Option<Arc<Anchor>>, path: &Path) -> Result<PathBuf, EngineError> {
    match anchor {
        Some(a) => a.anchored(path),
        None => Ok(path.to_path_buf()),
    }
}

/// What the source saw of a transfer: its machine's tally, the tuning it
/// settled on, and the sink's report.
#[derive(Debug, Default, Clone)]
pub struct SourceReport {
    pub tally: SourceTally,
    pub tuning: Option<longhaul_proto::tune::TuningReport>,
    pub sink: SinkReport,
    /// Where this end's CPU went.
    pub cpu: StageCpu,
    /// What compression did, when it was agreed.
    pub compress: Option<CompressReport>,
}

/// Times a file is read in all when it changes while it is read: then it
/// is reported as changed, never sent torn.
pub use longhaul_proto::transfer::source::MAX_READS_OF_A_CHANGING_FILE;

/// Runs the source side until the sink reports the transfer done.
pub fn run_source(
    conn: &mut FramedConn,
    streams: Vec<Box<dyn Stream>>,
    cfg: SourceConfig,
) -> Result<SourceReport, EngineError> {
    let shared: Shared = Arc::new((
        Mutex::new(Queue {
            active: streams.len() as u16,
            carried: queue::Carried::for_host(&crate::net::sock::buffer_caps(), cfg.compress),
            ..Queue::default()
        }),
        Condvar::new(),
    ));
    let (tx, rx) = mpsc::channel();
    let totals = StageTotals::new();
    let governor = cfg
        .compress
        .map(|level| Arc::new(Mutex::new(Governor::new(level))));
    let mut workers = Vec::new();
    let (ended_tx, ended_rx) = mpsc::channel::<usize>();
    // The sockets under the streams, to end them from here on a failure.
    let mut sockets: Vec<TcpStream> = Vec::new();
    for (index, s) in streams.into_iter().enumerate() {
        sockets.push(crate::net::conn::socket_of(&*s)?);
        let (shared, tx, storage) = (shared.clone(), tx.clone(), cfg.storage.clone());
        let anchor = cfg.anchor.clone();
        let (bundles, tag_checks) = (cfg.bundles, cfg.tag_checks);
        let totals = totals.clone();
        let (governor, level) = (governor.clone(), cfg.compress.unwrap_or_default());
        let ended = ended_tx.clone();
        workers.push(
            std::thread::Builder::new()
                .name("lh-src".into())
                .spawn(move || {
                    let _counted = stages::count_into(&totals);
                    let out = Out {
                        storage: &*storage,
                        anchor: &anchor,
                        tx: &tx,
                        compress: governor.as_deref().map(|g| (g, level)),
                        checked: !tag_checks,
                    };
                    send(index as u16, s, &shared, &out, bundles);
                    let _ = ended.send(index);
                })
                .map_err(|e| EngineError::io("failed to start a sender".into(), e))?,
        );
    }
    let sampler = super::tune::Sampler::new(
        sockets.iter().filter_map(|s| s.try_clone().ok()).collect(),
        cfg.online,
        cfg.rtt,
        cfg.pacing,
    );
    let streams = sockets;
    drop(tx);
    // Stopped (its threads joined) when `control` returns.
    let prefetch = Prefetcher::start(&*cfg.storage, &cfg.roots, cfg.anchor.clone()).map(Arc::new);
    let result = control::control(
        conn,
        &shared,
        &rx,
        &cfg,
        sampler,
        prefetch,
        control::Meters {
            totals: &totals,
            governor: governor.as_deref(),
        },
    );
    {
        let (q, cv) = &*shared;
        q.lock().expect("poisoned").closed = true;
        cv.notify_all();
    }
    if result.is_err() {
        for s in &streams {
            let _ = s.shutdown(Shutdown::Both);
        }
    } else {
        end_stalled(&streams, &ended_rx, cfg.rtt);
    }
    for w in workers {
        let _ = w.join();
    }
    for s in &streams {
        let _ = s.shutdown(Shutdown::Write);
    }
    result
}

/// Once the sink has everything: waits for the senders to end their
/// streams, and ends from here those still writing after a few round
/// trips. Such a sender holds only copies the sink no longer needs, on a
/// stream that stalled (the end game sent its chunks again on another);
/// its write would otherwise wait out TCP's retransmissions.
fn end_stalled(streams: &[TcpStream], ended: &mpsc::Receiver<usize>, rtt: Duration) {
    let deadline = std::time::Instant::now() + (rtt * 4).max(Duration::from_secs(1));
    let mut done = vec![false; streams.len()];
    while done.iter().any(|d| !d) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match ended.recv_timeout(left) {
            Ok(i) => done[i] = true,
            Err(_) => break,
        }
    }
    for (s, _) in streams.iter().zip(&done).filter(|(_, d)| !**d) {
        tracing::info!("ending a stalled data stream: the sink has all it carried");
        let _ = s.shutdown(Shutdown::Both);
    }
}

/// What finds an announced file again: where it is, and the version of
/// it that was announced.
type Handle = (PathBuf, super::Stamp);
