//! The data streams: dialed early (while the control handshake goes on),
//! presented, tuned, paced and sealed once the server accepts; and what
//! crossed each path, when there are several.

use std::os::fd::AsFd;

use longhaul_proto::msg::Direction;
use longhaul_proto::xfer::*;

use super::path::congestion_for;
use super::path::target_rate;
use super::{CpOptions, PathUse};
use crate::net::dial::{present, ClientOptions, Control, Dialer};
use crate::EngineError;

/// The data streams' sockets, kept (duplicated) to read at the end what
/// crossed each path.
pub(super) struct PathTaps(Vec<(String, String, std::net::TcpStream)>);

impl PathTaps {
    pub(super) fn of(streams: &[Box<dyn crate::net::conn::Stream>], o: &CpOptions) -> PathTaps {
        if !o.client.paths.several() {
            return PathTaps(Vec::new());
        }
        PathTaps(
            streams
                .iter()
                .filter_map(|s| {
                    let t = s.tcp();
                    let local = t.local_addr().ok()?.ip().to_string();
                    let remote = t.peer_addr().ok()?.to_string();
                    Some((local, remote, t.try_clone().ok()?))
                })
                .collect(),
        )
    }

    /// Bytes each path carried: sent (a push) or received (a pull).
    pub(super) fn count(&self, sent: bool) -> Vec<PathUse> {
        let mut out: Vec<PathUse> = Vec::new();
        for (local, remote, tcp) in &self.0 {
            let (acked, received) =
                crate::net::sock::tcp_bytes(crate::net::sock::fd_of(tcp)).unwrap_or_default();
            let bytes = if sent { acked } else { received };
            match out
                .iter_mut()
                .find(|p| &p.local == local && &p.remote == remote)
            {
                Some(p) => {
                    p.streams += 1;
                    p.bytes += bytes;
                }
                None => out.push(PathUse {
                    local: local.clone(),
                    remote: remote.clone(),
                    streams: 1,
                    bytes,
                }),
            }
        }
        out
    }
}

fn open_streams(
    ctl: &Control,
    token: &str,
    which: &[(Direction, u16)],
    tuning: &StreamTuning,
    o: &ClientOptions,
) -> Result<Vec<Box<dyn crate::net::conn::Stream>>, EngineError> {
    // Set before connecting, so the window scale covers the buffer.
    let sending = which.first().is_some_and(|w| w.0 == Direction::Up);
    ctl.open_data_streams(token, which, o, |s, _| {
        s.set_tcp_nodelay(false)?;
        if let Some(rate) = tuning.pacing {
            crate::net::sock::segments_for_pacing(s.as_fd(), rate)?;
        }
        crate::net::sock::tune_data_stream(s.as_fd(), tuning, sending).map(|_| ())
    })
}

/// Data streams dialed while the control handshake goes on: connected (TCP,
/// TLS) but not yet presented.
pub(super) type EarlyStreams =
    Vec<std::thread::JoinHandle<Result<Box<dyn crate::net::conn::Stream>, EngineError>>>;

/// Dials the streams a first plan wants (the RTT of the control
/// connection's TCP handshake, the server's caps taken to be this host's),
/// so that their TCP and TLS handshakes overlap the control handshake: two
/// round trips less before the first byte. This side's socket settings
/// depend only on this host's caps, so they are final; the count may not
/// be, and [`attach_streams`] adds or drops streams.
pub(super) fn dial_early(
    o: &CpOptions,
    push: bool,
    host: &str,
    dialer: &Dialer,
    rtt_us: u32,
) -> EarlyStreams {
    use longhaul_proto::window::{plan, PathInput};
    let local = crate::net::sock::buffer_caps();
    let guess = plan(&PathInput {
        rtt_us,
        target_bps: target_rate(o, host, push, rtt_us).0,
        sender: local,
        receiver: local,
        streams: o.streams,
    });
    let tuning = StreamTuning {
        congestion: congestion_for(o, push).ok().flatten(),
        send_buffer: guess.send_buffer.to_set(),
        receive_buffer: guess.receive_buffer.to_set(),
        pacing: None,
        online: false,
        intervals: true,
        ..StreamTuning::default()
    };
    // Each stream's share of the cap as first planned: the segments are
    // sized before connecting (the count may change a little later).
    let paced = o
        .rate
        .map(|r| super::path::per_stream_pacing(r, guess.streams));
    (0..guess.streams)
        .map(|k| {
            let (d, t, opts) = (dialer.clone(), tuning.clone(), o.client.clone());
            std::thread::spawn(move || {
                d.dial_nth(usize::from(k), &opts, |s| {
                    s.set_tcp_nodelay(false)?;
                    if let Some(rate) = paced {
                        crate::net::sock::segments_for_pacing(s.as_fd(), rate)?;
                    }
                    crate::net::sock::tune_data_stream(s.as_fd(), &t, push).map(|_| ())
                })
            })
        })
        .collect()
}

/// The data streams of the transfer `accept` took: the early ones that
/// connected, presented as streams 0, 1, ...; more dialed if the final plan
/// wants more, the rest closed; each paced if the plan says so, and in
/// sealed frames if the server agreed.
pub(super) fn attach_streams(
    ctl: &Control,
    early: EarlyStreams,
    accept: &TransferAccept,
    n: u16,
    direction: Direction,
    tuning: &StreamTuning,
    o: &ClientOptions,
) -> Result<Vec<Box<dyn crate::net::conn::Stream>>, EngineError> {
    let (token, sealed) = (accept.token.as_str(), accept.sealed);
    let mut data: Vec<Box<dyn crate::net::conn::Stream>> = early
        .into_iter()
        .filter_map(|h| h.join().ok()?.ok())
        .take(usize::from(n))
        .collect();
    for (i, s) in data.iter_mut().enumerate() {
        present(s, ctl.welcome.version, token, i as u16, direction)?;
        // Sized for the final plan (both hosts' caps, the streams chosen),
        // which the early guess could not know.
        let sending = direction == Direction::Up;
        if let Err(e) =
            crate::net::sock::tune_data_stream(crate::net::sock::fd_of(s.tcp()), tuning, sending)
        {
            tracing::warn!("failed to size an early data stream: {e}");
        }
    }
    let which: Vec<(Direction, u16)> = (data.len() as u16..n).map(|i| (direction, i)).collect();
    if !which.is_empty() {
        data.extend(open_streams(ctl, token, &which, tuning, o)?);
    }
    if direction == Direction::Up {
        for s in &data {
            let fd = crate::net::sock::fd_of(s.tcp());
            if let Some(rate) = tuning.pacing {
                crate::net::sock::set_pacing(fd, rate)
                    .map_err(|e| EngineError::io("failed to pace a data stream".into(), e))?;
            }
            if let Err(e) = crate::net::sock::limit_unsent(fd) {
                tracing::warn!("{e}");
            }
        }
    }
    if !sealed {
        return Ok(data);
    }
    data.into_iter()
        .enumerate()
        .map(|(i, s)| {
            crate::net::sealed::into_sealed(s, crate::net::sealed::Side::Client).map_err(|e| {
                EngineError::io(
                    format!("failed to start sealed frames on data stream {i}"),
                    e,
                )
            })
        })
        .collect()
}
