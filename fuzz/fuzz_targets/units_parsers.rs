//! libFuzzer's entry point for `longhaul_fuzz::targets::units_parsers` (cargo-fuzz,
//! `fuzz/run.sh`): what the target checks is said there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| longhaul_fuzz::targets::units_parsers::run(data));
