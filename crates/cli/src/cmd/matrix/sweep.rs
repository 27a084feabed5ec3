//! A measured best for every tool: on each path and workload, `best` is
//! the fastest candidate of the tool's grid ([`Sweep`]), for longhaul as
//! for every peer, found before the cells' runs by puts: every candidate
//! warms up, then runs `--sweep-rounds` rounds (3 unless told) alternated
//! with the others (the order rotating each round), and its figure is the
//! median of its rounds;
//! after round one a candidate is pruned only when even its fastest run is
//! behind the leader's slowest by many times the noise ([`run_rounds`]).
//! Every tool is told the same about the path: its rate and its
//! bandwidth-delay product, as `{rate}`, `{bdp}`, `{bdp_streams}` and the
//! candidates' `{window}`. The winners and every candidate's rounds go in
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

/// After round one a candidate is pruned only if even its fastest run so
/// far trails the leader's slowest by this factor at least...
const MIN_PRUNE_MARGIN: f64 = 2.0;
/// ... and by this many times the noise seen so far (the median over the
/// candidates of the spread between their warm-up and round one).
const NOISE_TIMES: f64 = 4.0;

use longhaul_archive::matrix::mb;
pub use longhaul_archive::matrix::{median, Outcome, Swept, Tried};

/// About how many runs a sweep of `n` candidates over `rounds` rounds
/// makes: a warm-up and a round each, then the other rounds of those not
/// pruned (about half on the grids here; all of them on a host whose noise
/// prunes none).
pub fn expected_runs(n: usize, rounds: u32) -> usize {
    2 * n + (rounds.max(1) as usize - 1) * n.div_ceil(2)
}

/// How a sweep runs: its rounds, and what bounds a run.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Rounds after the warm-ups.
    pub rounds: u32,
    /// The longest any run may take, seconds.
    pub run_timeout: f64,
    /// Runs are timed copies (a slow one can be cut short), not fixed-length.
    pub timed: bool,
}

/// Runs a sweep: every candidate's warm-up, then `plan.rounds` rounds,
/// each in the order of the one before rotated by one (every candidate
/// alternates with every other, and none always runs first); after round
/// one the clear losers are pruned. `run(k, round, cut)` runs candidate k
/// (round 0: its warm-up) for at most `cut` seconds; None stops the sweep.
pub fn run_rounds(
    grid: Vec<Vec<String>>,
    plan: Plan,
    mut run: impl FnMut(usize, u32, f64) -> Option<Outcome>,
) -> Vec<Tried> {
    let mut tried: Vec<Tried> = grid.into_iter().map(Tried::new).collect();
    let n = tried.len();
    for round in 0..=plan.rounds {
        for i in 0..n {
            let k = (i + round as usize) % n;
            if !tried[k].alive() {
                continue;
            }
            let fastest = tried
                .iter()
                .filter(|t| t.error.is_none())
                .flat_map(|t| t.round_seconds.iter().chain(t.warmup_seconds()))
                .copied()
                .min_by(f64::total_cmp);
            let cut = cut_after(fastest, plan.run_timeout, plan.timed);
            let Some(o) = run(k, round, cut) else {
                return tried;
            };
            tried[k].record(round, o);
        }
        if round == 1 {
            prune(&mut tried);
        }
    }
    tried
}

/// After round one: prunes every candidate whose fastest run so far trails
/// the leader's slowest by the margin (at least [`MIN_PRUNE_MARGIN`], and
/// [`NOISE_TIMES`] the noise: a candidate that might still win stays).
fn prune(tried: &mut [Tried]) {
    let noise = median(
        &tried
            .iter()
            .filter(|t| t.alive())
            .filter_map(|t| {
                let lo = t.seen().min_by(f64::total_cmp)?;
                let hi = t.seen().max_by(f64::total_cmp)?;
                (lo > 0.0).then(|| hi / lo - 1.0)
            })
            .collect::<Vec<_>>(),
    )
    .unwrap_or(0.0);
    let margin = MIN_PRUNE_MARGIN.max(1.0 + NOISE_TIMES * noise);
    let Some(leader) = tried
        .iter()
        .filter(|t| t.alive())
        .filter_map(|t| t.seen().min_by(f64::total_cmp))
        .max_by(f64::total_cmp)
    else {
        return;
    };
    for t in tried.iter_mut().filter(|t| t.alive()) {
        let best = t.seen().max_by(f64::total_cmp).unwrap_or(0.0);
        if best * margin < leader {
            t.pruned = Some(format!(
                "pruned after round 1: at most {} MB/s against the leader's {} at least (the \
                 margin {margin:.1}x: {NOISE_TIMES} times the noise {:.0}%, at least \
                 {MIN_PRUNE_MARGIN}x)",
                mb(best),
                mb(leader),
                noise * 100.0
            ));
        }
    }
}

/// How long a candidate may run: a file candidate 3 times slower than the
/// fastest run so far (and past 10 s) has lost, and is cut short.
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

    /// Runs a sweep on recorded figures: `figs[k][round]`, MB/s (round 0
    /// the warm-up; NaN: that run failed). Also the runs, in order.
    fn replay(figs: &[&[f64]], rounds: u32) -> (Swept, Vec<(usize, u32)>) {
        let grid: Vec<Vec<String>> = (0..figs.len()).map(|k| vec![format!("c{k}")]).collect();
        let plan = Plan {
            rounds,
            run_timeout: 120.0,
            timed: false,
        };
        let mut ran = Vec::new();
        let candidates = run_rounds(grid, plan, |k, round, _| {
            ran.push((k, round));
            let f = figs[k][round as usize];
            Some(Outcome {
                bytes_per_second: (!f.is_nan()).then_some(f * 1e6),
                seconds: 2.0,
                error: f.is_nan().then(|| "timed out after 60 s".into()),
            })
        });
        let mut s = Swept {
            candidates,
            ..Swept::default()
        };
        s.decide();
        (s, ran)
    }

    fn won(s: &Swept) -> &str {
        &s.winner.as_ref().unwrap()[0]
    }

    /// Every candidate warms up, then runs its rounds alternated with the
    /// others, the order rotating every round.
    #[test]
    fn candidates_warm_up_then_alternate_over_rounds() {
        let same: &[f64] = &[10.0; 4];
        let (s, ran) = replay(&[same, same, same], 3);
        let want: Vec<(usize, u32)> = [(0, 0), (1, 0), (2, 0)]
            .into_iter()
            .chain([(1, 1), (2, 1), (0, 1)])
            .chain([(2, 2), (0, 2), (1, 2)])
            .chain([(0, 3), (1, 3), (2, 3)])
            .collect();
        assert_eq!(ran, want);
        for c in &s.candidates {
            assert_eq!(c.rounds.len(), 3);
            assert_eq!(c.warmup_bytes_per_second, Some(10e6));
        }
    }

    /// Noise: a candidate with one lucky round (the fastest run of the
    /// sweep, which a sweep of one run each could have crowned) loses to
    /// the one that is faster round after round; on a noisy host none is
    /// pruned, as none is clearly behind.
    #[test]
    fn with_noise_the_median_of_the_rounds_wins_not_a_lucky_run() {
        let steady: &[f64] = &[60.0, 95.0, 100.0, 98.0];
        let lucky: &[f64] = &[50.0, 160.0, 70.0, 72.0];
        let slow: &[f64] = &[30.0, 45.0, 40.0, 50.0];
        let (s, _) = replay(&[lucky, steady, slow], 3);
        assert_eq!(won(&s), "c1");
        assert!(s.candidates.iter().all(|c| c.pruned.is_none()));
        assert!(s.candidates.iter().all(|c| c.rounds.len() == 3));
        assert_eq!(s.candidates[0].spread(), Some((70e6, 160e6)));
        let sum = s.summary();
        assert!(
            sum.starts_with("of 3 swept, 3 round(s) each after a warm-up: 98 (95-100) MB/s, the next 72 (70-160)"),
            "{sum}"
        );
    }

    /// A real winner: the clear loser is pruned after round one (its best
    /// run is many times the noise behind the leader's worst), the close
    /// one runs every round, a failed one is out, and the fastest median wins.
    #[test]
    fn with_a_real_winner_clear_losers_are_pruned_after_round_one() {
        let best: &[f64] = &[200.0, 210.0, 205.0, 190.0];
        let close: &[f64] = &[100.0, 105.0, 110.0, 98.0];
        let far_behind: &[f64] = &[10.0, 11.0, 12.0, 12.0];
        let fails: &[f64] = &[300.0, f64::NAN, 300.0, 300.0];
        let (s, ran) = replay(&[far_behind, close, best, fails], 3);
        assert_eq!(won(&s), "c2");
        let [fb, cl, be, fa] = &s.candidates[..] else {
            panic!()
        };
        assert_eq!(fb.rounds.len(), 1);
        assert!(fb
            .pruned
            .as_deref()
            .unwrap()
            .starts_with("pruned after round 1: at most 11 MB/s"));
        assert_eq!((cl.rounds.len(), be.rounds.len()), (3, 3));
        assert!(cl.pruned.is_none());
        assert!(fa.error.is_some() && fa.rounds.is_empty());
        assert_eq!(ran.len(), 4 + 4 + 2 + 2);
        let sum = s.summary();
        assert!(
            sum.contains("1 pruned after round 1, 1 failed: 205 (190-210) MB/s, the next 105"),
            "{sum}"
        );
        assert!(!sum.contains("tie"), "{sum}");
        assert!(fa.said().starts_with("failed after its warm-up: timed out"));
        // The margin grows with the noise: with a noisy leader, not pruned.
        let noisy: &[f64] = &[80.0, 210.0, 205.0, 190.0];
        let (s, _) = replay(&[far_behind, noisy, &[40.0, 60.0, 50.0, 50.0]], 3);
        assert!(s.candidates[0].pruned.is_some());
        assert!(s.candidates[2].pruned.is_none(), "{:?}", s.candidates[2]);
    }

    /// A tie: medians within each other's spread. The choice is the same
    /// whatever the order (the higher median; of equal ones, the faster
    /// slowest round), and the line says it was a tie.
    #[test]
    fn with_a_tie_the_choice_is_stable_and_said_to_be_a_tie() {
        let a: &[f64] = &[100.0, 101.0, 99.0, 100.0];
        let b: &[f64] = &[100.0, 100.0, 102.0, 98.0];
        for order in [[a, b], [b, a]] {
            let (s, _) = replay(&order, 3);
            let want = if order[0] == a { "c0" } else { "c1" };
            assert_eq!(won(&s), want);
            let sum = s.summary();
            assert!(sum.ends_with("(1 within its spread: a tie)"), "{sum}");
        }
        // Nothing ran: no winner.
        let (s, _) = replay(&[&[f64::NAN]], 3);
        assert_eq!(s.winner, None);
        assert_eq!(
            s.summary(),
            "of 1 swept, 0 round(s) each after a warm-up, 1 failed"
        );
    }

    #[test]
    fn a_timed_candidate_far_slower_than_the_fastest_run_is_cut_short() {
        assert_eq!(cut_after(Some(2.0), 120.0, true), 10.0);
        assert_eq!(cut_after(Some(20.0), 120.0, true), 60.0);
        assert_eq!(cut_after(Some(60.0), 120.0, true), 120.0);
        assert_eq!(cut_after(None, 120.0, true), 120.0);
        assert_eq!(cut_after(Some(2.0), 120.0, false), 120.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    /// A built-in tool's sweep candidates on the satellite preset (1 Gbit/s,
    /// 540 ms, 4 MiB socket buffers).
    fn grid_on_satellite(t: &peers::Tool) -> Vec<Vec<String>> {
        let sat = PathFacts {
            rate_bps: 1_000_000_000,
            rtt_s: 0.54,
            socket_cap: 4 << 20,
        };
        candidates(t.sweep.as_ref().expect("a sweep"), &sat)
    }

    /// GridFTP's grid on a long path: -fast alone, or pipelined with 4 or
    /// 16 files at once (Globus's advice for many small files), each at
    /// every stream count, with and without a window: 18 candidates.
    #[test]
    fn gridftps_grid_has_more_files_at_once_for_many_small_files() {
        let tools = peers::builtin();
        let g = tools.iter().find(|t| t.name == "gridftp").unwrap();
        let grid = grid_on_satellite(g);
        assert_eq!(grid.len(), 18);
        let cc16 = grid
            .iter()
            .filter(|c| c.ends_with(&["-fast", "-pp", "-cc", "16"].map(String::from)))
            .count();
        assert_eq!(cc16, 6);
        assert!(g.sweep.as_ref().unwrap().why.contains("18 candidates"));
    }

    /// iperf3's grid tries its zero-copy sender (-Z) at every stream count
    /// and window; iperf 2's -Z is a congestion control, not in its grid.
    #[test]
    fn iperf3s_grid_tries_zero_copy_and_iperf2s_does_not() {
        let tools = peers::builtin();
        let by = |n: &str| tools.iter().find(|t| t.name == n).unwrap();
        let grid = grid_on_satellite(by("iperf3"));
        assert_eq!(grid.len(), 12);
        let z = grid.iter().filter(|c| c.last().is_some_and(|a| a == "-Z"));
        assert_eq!(z.count(), 6);
        let two = grid_on_satellite(by("iperf2"));
        assert!(two.iter().flatten().all(|a| a != "-Z"), "{two:?}");
    }

    /// xrdcp's long-path lever is two variables: a candidate's
    /// `env:NAME=VALUE` items set the client's environment, filled in like
    /// its arguments, and never reach its argv; a malformed one is refused
    /// when the tools file is read.
    #[test]
    fn env_items_set_the_clients_variables_not_its_arguments() {
        let tools = peers::builtin();
        let x = tools.iter().find(|t| t.name == "xrootd").unwrap();
        let grid = grid_on_satellite(x);
        assert_eq!(grid.len(), 12);
        let chunky = &grid[0];
        assert_eq!(
            chunky,
            &[
                "--streams",
                "15",
                "--parallel",
                "4",
                "env:XRD_CPCHUNKSIZE=16777216",
                "env:XRD_CPPARALLELCHUNKS=8"
            ]
        );
        let vars = BTreeMap::from([("host", "h".to_string()), ("window", "9".to_string())]);
        let argv = peers::argv(&x.put, chunky, &vars);
        assert!(argv.iter().all(|a| !a.contains("XRD_")), "{argv:?}");
        assert!(
            argv.windows(2).any(|w| w == ["--streams", "15"]),
            "{argv:?}"
        );
        let env = peers::env_of(chunky, &vars);
        assert_eq!(env["XRD_CPCHUNKSIZE"], "16777216");
        assert_eq!(env["XRD_CPPARALLELCHUNKS"], "8");
        let sized = ["env:WIN={window}".to_string(), "-x".to_string()];
        assert_eq!(peers::env_of(&sized, &vars)["WIN"], "9");
        for bad in ["env:1X=3", "env:NOVALUE", "env:A-B=1", "env:=1"] {
            let json = format!(
                r#"[{{"name": "a", "kind": "files", "put": ["x", "{{args}}"], "settings": [{{"name": "d"}}], "sweep": {{"axes": [[[], ["{bad}"]]]}}}}]"#
            );
            let e = peers::parse_tools(&json, false).unwrap_err();
            assert!(e.contains("env:NAME=VALUE"), "{bad}: {e}");
        }
    }
}
