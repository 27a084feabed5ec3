//! Every fuzz target over its corpus (`corpus`, each build's suite), and
//! over mutations of it for `LONGHAUL_FUZZ_SECONDS` seconds (2 by default;
//! `mutations`, ignored by the suite: `.ci/run` runs them in their own
//! timed phase). Each input under the runner's memory and time budgets
//! (`longhaul_fuzz::smoke`); a failure names the target, the input and
//! the seed.

use std::time::Duration;

use longhaul_fuzz::smoke;

#[global_allocator]
static COUNTING: smoke::Counting = smoke::Counting;

fn seconds() -> Duration {
    let s = std::env::var("LONGHAUL_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(s.max(0.0))
}

fn seed() -> u64 {
    std::env::var("LONGHAUL_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use super::*;

                /// Every recorded input, within the budgets.
                #[test]
                fn corpus() {
                    let n = smoke::replay(stringify!($name), longhaul_fuzz::targets::$name::run)
                        .unwrap_or_else(|f| panic!("{f}"));
                    assert!(n > 0, "no corpus in {}", smoke::corpus_dir(stringify!($name)).display());
                }

                /// Mutations of the corpus, within the budgets.
                #[test]
                #[ignore = "the fuzz phase of .ci/run (LONGHAUL_FUZZ_SECONDS)"]
                fn mutations() {
                    let seed = seed();
                    let n = smoke::mutate(
                        stringify!($name),
                        longhaul_fuzz::targets::$name::run,
                        seconds(),
                        seed,
                    )
                    .unwrap_or_else(|f| panic!("{f}"));
                    println!("{}: {n} inputs (seed {seed})", stringify!($name));
                }
            }
        )*

        /// Every target of the crate is run here.
        #[test]
        fn every_target_is_run() {
            let here = [$(stringify!($name)),*];
            for (name, _) in longhaul_fuzz::TARGETS {
                assert!(here.contains(name), "{name} is not in tests/smoke.rs");
            }
            assert_eq!(here.len(), longhaul_fuzz::TARGETS.len());
        }
    };
}

/// The runner itself: a target that panics, or holds more than its
/// budget at once, fails on that input, and says so.
#[test]
fn the_runner_fails_a_panic_and_a_budget_overrun() {
    fn panics(data: &[u8]) {
        assert!(data.is_empty(), "planted failure");
    }
    fn hogs(data: &[u8]) {
        let v = vec![data.len() as u8; smoke::MEMORY_BUDGET + (1 << 20)];
        std::hint::black_box(&v);
    }
    let e = smoke::one(panics, b"x").unwrap_err();
    assert!(e.contains("planted failure"), "{e}");
    assert!(smoke::one(panics, b"").is_ok());
    let e = smoke::one(hogs, b"").unwrap_err();
    assert!(e.contains("over its budget"), "{e}");
}

targets!(
    auth_parsers,
    client_session,
    connect_back_reader,
    filter_rules,
    frame_decoder,
    iperf3_control,
    job_messages,
    sealed_frames,
    server_session,
    transfer_machines,
    udp_receiver,
    units_parsers,
    xfer_decoders,
);
