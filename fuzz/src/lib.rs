//! longhaul's fuzz targets, each `targets::NAME::run(bytes)`: every decoder
//! a peer or a file feeds (docs/ARCHITECTURE.md, "fuzz/"). Two drivers run
//! them:
//!
//! - libFuzzer, through cargo-fuzz (`fuzz/run.sh`; the binaries in
//!   `fuzz_targets/`, built with the `libfuzzer` feature and a nightly or
//!   sanitizer-capable toolchain): coverage-guided, for long runs;
//! - the smoke runner ([`smoke`], `tests/smoke.rs`), on the stable
//!   toolchain: every input of the target's corpus in `fuzz/corpus/NAME/`,
//!   then a few seconds of mutations of it, with a memory and a time
//!   budget on every input; CI runs it on every build (`.ci/run`).
//!
//! A target written with typed input (`|input: Input|`) decodes it from
//! the bytes with `arbitrary` as libFuzzer's `fuzz_target!` does, so one
//! corpus serves both drivers.
// Unit tests are scenarios, not shipped functions: only shipped code is held to 100 lines.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod roundtrip;
pub mod smoke;

/// Defines a target's `run`: libfuzzer-sys's `fuzz_target!` forms, each
/// as a plain function of the input's bytes.
#[macro_export]
macro_rules! fuzz_target {
    (|$data:ident: &[u8]| $body:block) => {
        /// Runs the target on one input.
        pub fn run($data: &[u8]) $body
    };
    (|$input:ident: $ty:ty| $body:block) => {
        /// Runs the target on one input (its typed form, decoded with
        /// `arbitrary` as libFuzzer's entry point decodes it).
        pub fn run(bytes: &[u8]) {
            let u = arbitrary::Unstructured::new(bytes);
            if let Ok($input) = <$ty as arbitrary::Arbitrary>::arbitrary_take_rest(u) $body
        }
    };
}

pub mod targets {
    pub mod auth_parsers;
    pub mod client_session;
    pub mod connect_back_reader;
    pub mod filter_rules;
    pub mod frame_decoder;
    pub mod iperf3_control;
    pub mod job_messages;
    pub mod sealed_frames;
    pub mod server_session;
    mod test_params;
    pub mod transfer_machines;
    pub mod udp_receiver;
    pub mod units_parsers;
    pub mod xfer_decoders;
}

/// A target: its name (its corpus directory and cargo-fuzz binary) and
/// its `run`.
pub type Target = (&'static str, fn(&[u8]));

/// Every target.
pub const TARGETS: &[Target] = &[
    ("auth_parsers", targets::auth_parsers::run),
    ("client_session", targets::client_session::run),
    ("connect_back_reader", targets::connect_back_reader::run),
    ("filter_rules", targets::filter_rules::run),
    ("frame_decoder", targets::frame_decoder::run),
    ("iperf3_control", targets::iperf3_control::run),
    ("job_messages", targets::job_messages::run),
    ("sealed_frames", targets::sealed_frames::run),
    ("server_session", targets::server_session::run),
    ("transfer_machines", targets::transfer_machines::run),
    ("udp_receiver", targets::udp_receiver::run),
    ("units_parsers", targets::units_parsers::run),
    ("xfer_decoders", targets::xfer_decoders::run),
];
