//! libFuzzer's entry point for `longhaul_fuzz::targets::job_messages` (cargo-fuzz,
//! `fuzz/run.sh`): what the target checks is said there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| longhaul_fuzz::targets::job_messages::run(data));
