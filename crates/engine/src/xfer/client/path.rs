//! Sizing the data streams for the path: the rate to aim at, the
//! congestion control, the socket buffers and stream count from the RTT
//! and both hosts' caps, and the files in flight.

use longhaul_proto::msg::Direction;
use longhaul_proto::xfer::*;

use super::{CpOptions, PathTuning};
use crate::net::dial::Control;
use crate::EngineError;

/// The rate to size the streams for: `--rate`; else, unless `-P` fixed
/// them, what the doctor measured of this path if that still applies
/// (with headroom); else None (the default target).
pub(super) fn target_rate(
    o: &CpOptions,
    host: &str,
    push: bool,
    rtt_us: u32,
) -> (Option<u64>, Option<crate::pathdb::PathRecord>) {
    if o.rate.is_some() || o.streams.is_some() {
        return (o.rate, None);
    }
    let direction = if push { Direction::Up } else { Direction::Down };
    let rec = o.path_memory.as_deref().and_then(|f| {
        crate::pathdb::recall(
            f,
            &crate::net::dial::host_key(host),
            direction,
            crate::pathdb::now(),
            rtt_us,
        )
    });
    (rec.as_ref().map(crate::pathdb::PathRecord::target_bps), rec)
}

/// The sending side's congestion control: `--cc`, else BBR where the
/// sender has it (asked of the server on a pull).
pub(super) fn congestion_for(o: &CpOptions, push: bool) -> Result<Option<String>, EngineError> {
    use crate::net::sock;
    Ok(match &o.congestion {
        Some(cc) => {
            if push {
                sock::check_congestion(cc).map_err(EngineError::Usage)?;
            }
            Some(cc.clone())
        }
        // BBR holds its rate through random loss where CUBIC backs off.
        None if !push || sock::available_congestion().iter().any(|c| c == "bbr") => {
            Some("bbr".to_string())
        }
        None => None,
    })
}

/// What sizing for the path starts from.
#[derive(Clone, Copy)]
pub(super) struct PathFacts {
    /// The smallest RTT the control connection has seen, microseconds.
    rtt_us: u32,
    local: crate::net::sock::BufferCaps,
    /// The server's caps (`Welcome.buffers`); None before its `Welcome`,
    /// when they are taken to be this host's.
    remote: Option<crate::net::sock::BufferCaps>,
    /// The server's `--max-streams`, when known.
    max_streams: Option<u16>,
}

impl PathFacts {
    /// Before the server's `Welcome`: the RTT of the TCP handshake, and
    /// this host's caps taken to be the server's.
    pub(super) fn before_welcome(rtt_us: u32) -> PathFacts {
        PathFacts {
            rtt_us,
            local: crate::net::sock::buffer_caps(),
            remote: None,
            max_streams: None,
        }
    }

    pub(super) fn of(ctl: &Control) -> PathFacts {
        let (rtt_us, local, remote) = ctl.path_facts();
        PathFacts {
            rtt_us,
            local,
            remote: Some(remote),
            max_streams: ctl.welcome.max_streams,
        }
    }

    /// (sender, receiver) caps.
    fn sides(&self, push: bool) -> (crate::net::sock::BufferCaps, crate::net::sock::BufferCaps) {
        let remote = self.remote.unwrap_or(self.local);
        if push {
            (self.local, remote)
        } else {
            (remote, self.local)
        }
    }
}

/// Sizes the data streams for the path: RTT from the control connection,
/// both hosts' buffer caps, the rate if given (see [`longhaul_proto::window`]).
pub(super) fn size_for_path(
    o: &CpOptions,
    facts: PathFacts,
    host: &str,
    push: bool,
) -> Result<(PathTuning, StreamTuning, Vec<String>), EngineError> {
    use longhaul_proto::window::{plan, PathInput};
    let rtt_us = facts.rtt_us;
    let (sender, receiver) = facts.sides(push);
    let (target_bps, remembered) = target_rate(o, host, push, rtt_us);
    let mut window = plan(&PathInput {
        rtt_us,
        target_bps,
        sender,
        receiver,
        streams: o.streams,
    });
    // Within the server's --max-streams when the count was ours to choose.
    if let (true, Some(max)) = (window.auto_streams, facts.max_streams) {
        window.streams = window.streams.min(max.max(1));
        window.ceiling_bps = window.stream_ceiling_bps * f64::from(window.streams);
    }
    let congestion = congestion_for(o, push)?;
    // The user's rate is a ceiling on the whole transfer: each stream is
    // paced to its share of it, no more, so that together they never pass
    // it over any second (the kernel paces each smoothly; parked streams
    // only leave the total lower).
    let pacing = o.rate.map(|r| per_stream_pacing(r, window.streams));
    let mut tuning = StreamTuning {
        congestion: congestion.clone(),
        send_buffer: window.send_buffer.to_set(),
        receive_buffer: window.receive_buffer.to_set(),
        pacing,
        // Online tuning unless the streams were fixed (-P) or it is off.
        online: o.tune && o.streams.is_none(),
        intervals: true,
        ..StreamTuning::default()
    };
    let warnings = window.shortfall(&sender, &receiver).into_iter().collect();
    // A pulling client is the sink: it tells the source where to start and
    // how far it may grow.
    if !push {
        let (start, most) = files_in_flight(o, &window, super::super::files_in_flight_cap());
        tuning.files_in_flight = Some(start);
        tuning.max_files_in_flight = Some(most);
    }
    let path = PathTuning {
        window,
        congestion: congestion.unwrap_or_else(|| "default".into()),
        pacing,
        remembered,
    };
    Ok((path, tuning, warnings))
}

/// Each of `streams` streams' pacing, bytes/s, for a ceiling of `rate`
/// bit/s on all of them together (rounded down: never over).
pub(super) fn per_stream_pacing(rate: u64, streams: u16) -> u64 {
    (rate / 8 / u64::from(streams.max(1))).max(1)
}

/// The warnings of a plan sized before the server's `Welcome`, with the
/// server's caps as they are: the streams stay as requested.
pub(super) fn shortfall_with_server(
    path: &PathTuning,
    facts: PathFacts,
    push: bool,
) -> Vec<String> {
    use longhaul_proto::window::{plan, PathInput};
    let (sender, receiver) = facts.sides(push);
    plan(&PathInput {
        rtt_us: path.window.rtt_us,
        target_bps: Some(path.window.target_bps),
        sender,
        receiver,
        streams: Some(path.window.streams),
    })
    .shortfall(&sender, &receiver)
    .into_iter()
    .collect()
}

/// Files in flight to start with and the most to grow to, for a sink
/// that allows `cap`: fixed by `--files-in-flight` or `--no-tune`, else
/// sized for the path and free to grow to the cap.
pub(super) fn files_in_flight(
    o: &CpOptions,
    window: &longhaul_proto::window::WindowPlan,
    cap: u64,
) -> (u64, u64) {
    use longhaul_proto::tune::initial_files_in_flight;
    match o.files_in_flight {
        Some(n) => (n.clamp(1, cap), n.clamp(1, cap)),
        None => {
            let start = initial_files_in_flight(window.target_bps, window.rtt_us, cap);
            (start, if o.tune { cap } else { start })
        }
    }
}

#[cfg(test)]
mod tests {
    use longhaul_proto::tune::{initial_files_in_flight, DEFAULT_FILES_IN_FLIGHT};
    use longhaul_proto::window::{plan, BufferCaps, PathInput};

    use super::*;
    use crate::end::End;
    use crate::net::dial::ClientOptions;

    #[test]
    fn the_streams_paced_together_never_pass_the_users_rate() {
        for (rate, streams) in [
            (167_772_160, 4),
            (100_000_000, 1),
            (1_000_000_007, 7),
            (8, 32),
        ] {
            let each = per_stream_pacing(rate, streams);
            assert!(each * 8 * u64::from(streams) <= rate.max(8 * u64::from(streams)));
            assert!(each * 8 * u64::from(streams) + 8 * u64::from(streams) > rate);
        }
    }

    fn window(target_bps: u64, rtt_us: u32) -> longhaul_proto::window::WindowPlan {
        plan(&PathInput {
            rtt_us,
            target_bps: Some(target_bps),
            sender: BufferCaps::default(),
            receiver: BufferCaps::default(),
            streams: Some(4),
        })
    }

    #[test]
    fn files_in_flight_are_fixed_by_the_user_or_grow_from_the_paths_need() {
        let mut o = CpOptions::new(
            vec![End::local("a")],
            End::read_server("srv:d/x"),
            ClientOptions::default(),
        );
        let w = window(10_000_000_000, 100_000);
        let cap = DEFAULT_FILES_IN_FLIGHT * 4;
        let start = initial_files_in_flight(w.target_bps, w.rtt_us, cap);
        assert!((DEFAULT_FILES_IN_FLIGHT..=cap).contains(&start));
        assert_eq!(files_in_flight(&o, &w, cap), (start, cap));
        // Not tuned: the start is the most.
        o.tune = false;
        assert_eq!(files_in_flight(&o, &w, cap), (start, start));
        // Fixed, within the sink's cap and at least one.
        o.files_in_flight = Some(cap + 1);
        assert_eq!(files_in_flight(&o, &w, cap), (cap, cap));
        o.files_in_flight = Some(0);
        assert_eq!(files_in_flight(&o, &w, cap), (1, 1));
    }

    #[test]
    fn a_rate_or_fixed_streams_need_no_memory_of_the_path() {
        let mut o = CpOptions::new(
            vec![End::local("a")],
            End::read_server("srv:d/x"),
            ClientOptions::default(),
        );
        o.path_memory = Some("/nonexistent/paths.json".into());
        o.rate = Some(1_000_000);
        assert_eq!(target_rate(&o, "srv", true, 1000).0, Some(1_000_000));
        o.rate = None;
        o.streams = Some(3);
        assert_eq!(target_rate(&o, "srv", true, 1000).0, None);
        // --cc names the pull's sender's: the server checks it.
        o.congestion = Some("no-such-cc".into());
        assert_eq!(
            congestion_for(&o, false).unwrap().as_deref(),
            Some("no-such-cc")
        );
        assert!(congestion_for(&o, true).is_err());
    }
}
