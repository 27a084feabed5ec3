//! A measured best for every tool: on each path and workload, `best` is
//! the fastest candidate of the tool's grid ([`Sweep`]), each run once
//! (a put) before the cells' runs, for longhaul as for every peer. Every
//! tool is told the same about the path: its rate and its
//! bandwidth-delay product, as `{rate}`, `{bdp}`, `{bdp_streams}` and the
//! candidates' `{window}`. The winners and every candidate's figure go in
//! the document (`sweeps`); `--quick` may take a path's winners from the
//! last archived matrix that swept them.

use std::collections::BTreeMap;

use super::peers::{self, Sweep};

/// The least window a candidate is given, whatever the path.
const MIN_WINDOW: u64 = 64 << 10;
/// The most streams a candidate is given.
const MAX_STREAMS: u64 = 64;

/// What every tool is told about a path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathFacts {
    /// The path's rate, bit/s.
    pub rate_bps: u64,
    /// Its round trip, seconds (at least 0.1 ms: loopback's).
    pub rtt_s: f64,
    /// The largest socket buffer a process may set here (`rmem_max`,
    /// `wmem_max`), bytes: one stream's window at most.
    pub socket_cap: u64,
}

impl PathFacts {
    pub fn bdp(&self) -> u64 {
        (self.rate_bps as f64 / 8.0 * self.rtt_s.max(1e-4)).ceil() as u64
    }

    /// Streams the product needs under the socket cap.
    pub fn bdp_streams(&self) -> u64 {
        self.bdp()
            .div_ceil(self.socket_cap.max(1))
            .clamp(1, MAX_STREAMS)
    }

    /// `{rate}`, `{bdp}`, `{bdp_streams}`.
    pub fn vars(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("rate", self.rate_bps.to_string()),
            ("bdp", self.bdp().to_string()),
            ("bdp_streams", self.bdp_streams().to_string()),
        ])
    }
}

/// The host's socket buffer cap: the least of `rmem_max` and `wmem_max`.
pub fn socket_cap() -> u64 {
    ["/proc/sys/net/core/rmem_max", "/proc/sys/net/core/wmem_max"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok()?.trim().parse::<u64>().ok())
        .min()
        .unwrap_or(4 << 20)
}

/// Every candidate of a grid on a path, most tuned first (more streams, a
/// window, an axis's later alternative), so that a candidate much slower
/// than the best so far can be cut short; duplicates once.
pub fn candidates(s: &Sweep, facts: &PathFacts) -> Vec<Vec<String>> {
    let vars = facts.vars();
    let streams: Vec<Option<u64>> = if s.streams.is_empty() {
        vec![None]
    } else {
        s.streams
            .iter()
            .rev()
            .filter_map(|x| peers::fill(x, &vars).parse::<u64>().ok())
            .map(|n| Some(n.clamp(1, s.max_streams.map_or(MAX_STREAMS, u64::from))))
            .collect()
    };
    let windows: &[bool] = if s.window.is_empty() {
        &[false]
    } else {
        &[true, false]
    };
    let mut axes: Vec<Vec<String>> = vec![vec![]];
    for axis in &s.axes {
        axes = axes
            .iter()
            .flat_map(|pre| {
                axis.iter().rev().map(move |alt| {
                    let mut a = pre.clone();
                    a.extend(alt.iter().cloned());
                    a
                })
            })
            .collect();
    }
    let mut out: Vec<Vec<String>> = Vec::new();
    for n in &streams {
        for &w in windows {
            for alt in &axes {
                let mut v = vars.clone();
                let per = n.unwrap_or(1);
                let window =
                    (facts.bdp() / per).clamp(MIN_WINDOW, facts.socket_cap.max(MIN_WINDOW));
                v.insert("streams", per.to_string());
                v.insert("window", window.to_string());
                v.insert("window_kib", (window / 1024).to_string());
                let mut args = s.base.clone();
                if n.is_some() {
                    args.extend(s.per_stream.iter().cloned());
                }
                if w {
                    args.extend(s.window.iter().cloned());
                }
                args.extend(alt.iter().cloned());
                let args = peers::fill_all(&args, &v);
                if !out.contains(&args) {
                    out.push(args);
                }
            }
        }
    }
    out
}

pub use longhaul_archive::matrix::{Swept, Tried};

/// How long a candidate may run: a file candidate 3 times slower than the
/// best so far (and past 10 s) has lost, and is cut short.
pub fn cut_after(best_seconds: Option<f64>, run_timeout: f64, timed: bool) -> f64 {
    match best_seconds {
        Some(b) if timed => (3.0 * b).max(10.0).min(run_timeout),
        _ => run_timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(rate_bps: u64, rtt_ms: f64) -> PathFacts {
        PathFacts {
            rate_bps,
            rtt_s: rtt_ms / 1e3,
            socket_cap: 4 << 20,
        }
    }

    #[test]
    fn the_path_tells_every_tool_its_bdp_and_the_streams_it_needs() {
        let sat = facts(1_000_000_000, 540.0);
        assert_eq!(sat.bdp(), 67_500_000);
        assert_eq!(sat.bdp_streams(), 17);
        let wan = facts(1_000_000_000, 80.0);
        assert_eq!((wan.bdp(), wan.bdp_streams()), (10_000_000, 3));
        let lo = facts(100_000_000_000, 0.0);
        assert_eq!((lo.bdp(), lo.bdp_streams()), (1_250_000, 1));
        assert_eq!(facts(u64::MAX / 2, 10_000.0).bdp_streams(), MAX_STREAMS);
    }

    #[test]
    fn a_grid_is_every_stream_count_window_and_alternative_most_tuned_first() {
        let s = Sweep {
            streams: vec!["1".into(), "4".into(), "{bdp_streams}".into()],
            per_stream: vec!["-p".into(), "{streams}".into()],
            window: vec!["-tcp-bs".into(), "{window}".into()],
            axes: vec![vec![
                vec!["-fast".into()],
                vec!["-fast".into(), "-pp".into()],
            ]],
            base: vec!["-vb".into()],
            ..Sweep::default()
        };
        let c = candidates(&s, &facts(1_000_000_000, 540.0));
        assert_eq!(c.len(), 12);
        let w17 = (67_500_000u64 / 17).to_string();
        assert_eq!(
            c[0],
            ["-vb", "-p", "17", "-tcp-bs", w17.as_str(), "-fast", "-pp"]
        );
        assert_eq!(c[11], ["-vb", "-p", "1", "-fast"]);
        // One stream's window is capped by the host's socket buffers.
        assert!(c.contains(
            &["-vb", "-p", "1", "-tcp-bs", "4194304", "-fast"]
                .map(String::from)
                .to_vec()
        ));
        // On loopback the BDP's streams are 1: the same candidates once.
        let c = candidates(&s, &facts(100_000_000_000, 0.0));
        assert_eq!(c.len(), 8);
        let s = Sweep {
            streams: vec!["{bdp_streams}".into()],
            max_streams: Some(15),
            per_stream: vec!["--streams".into(), "{streams}".into()],
            ..Sweep::default()
        };
        assert_eq!(
            candidates(&s, &facts(1_000_000_000, 540.0)),
            [["--streams", "15"]]
        );
        let none = Sweep::default();
        assert_eq!(candidates(&none, &facts(1, 1.0)), [Vec::<String>::new()]);
    }

    #[test]
    fn the_winner_is_the_fastest_candidate_that_ran() {
        let t = |a: &str, r: Option<f64>, e: Option<&str>| Tried {
            args: vec![a.into()],
            bytes_per_second: r,
            seconds: 1.0,
            error: e.map(Into::into),
        };
        let mut s = Swept {
            candidates: vec![
                t("a", Some(5.0), None),
                t("b", Some(9.0), Some("not verified")),
                t("c", Some(7.0), None),
                t("d", None, Some("timed out")),
            ],
            ..Swept::default()
        };
        s.decide();
        assert_eq!(s.winner, Some(vec!["c".to_string()]));
        s.candidates.truncate(0);
        s.decide();
        assert_eq!(s.winner, None);
        assert_eq!(cut_after(Some(2.0), 120.0, true), 10.0);
        assert_eq!(cut_after(Some(20.0), 120.0, true), 60.0);
        assert_eq!(cut_after(Some(60.0), 120.0, true), 120.0);
        assert_eq!(cut_after(None, 120.0, true), 120.0);
        assert_eq!(cut_after(Some(2.0), 120.0, false), 120.0);
    }
}
