//! `perf` (memory to memory, one server or third party) and `demo`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use longhaul_engine::net::dial::{ClientOptions, Family, Paths, Security};
use longhaul_engine::net::tls::TrustOptions;
use longhaul_engine::perf::client::{run_perf, run_third_party};
use longhaul_engine::reach::End;
use longhaul_engine::results::CommandReporter;
use longhaul_engine::server::{ServeConfig, Server};
use longhaul_engine::xfer::client::CpOptions;
use longhaul_proto::msg::{Mode, RecvMode, SendMode, TestParams, Transport};

use super::{ended, interrupt_flag, usage, Failure, Outcome};
use crate::args::{PerfArgs, StreamCount};
use crate::exit;
use crate::print::{self, human};

/// `perf`: a memory-to-memory test against one server, or from one server to another.
pub fn perf(mut a: PerfArgs, archive: &crate::args::ArchiveArgs) -> Outcome {
    if a.server {
        return Err(usage(
            "longhaul's server is a command of its own: `longhaul serve` (with `--iperf3 5201` it also answers iperf3 clients)",
        ));
    }
    if let Some(host) = a.client.take() {
        a.hosts = vec![host];
    }
    if let Some(file) = &a.logfile {
        log_to(file)?;
    }
    let new = longhaul_archive::model::NewRun {
        kind: "perf".into(),
        command: super::command_line(),
        remote_host: Some(a.hosts.join(" -> ")),
        ..Default::default()
    };
    let printer = print::perf(
        a.json,
        a.json_stream,
        a.streams.initial(),
        mode_of(&a),
        a.format,
    );
    let mut printer = super::archived(archive, new, printer);
    let outcome = run(&a, printer.as_mut());
    ended(printer.as_mut(), outcome)
}

/// `--logfile FILE`: from here on, standard output and standard error go
/// to FILE (appended), as iperf3's option does.
fn log_to(file: &std::path::Path) -> Result<(), Failure> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .map_err(|e| usage(format!("cannot open the log file {}: {e}", file.display())))?;
    rustix::stdio::dup2_stdout(&f)
        .and_then(|()| rustix::stdio::dup2_stderr(&f))
        .map_err(|e| {
            usage(format!(
                "cannot write to the log file {}: {e}",
                file.display()
            ))
        })?;
    Ok(())
}

fn run(a: &PerfArgs, printer: &mut dyn CommandReporter) -> Outcome {
    let (params, local_cpu) = params_of(a)?;
    let family = match (a.ipv4, a.ipv6) {
        (true, _) => Some(Family::V4),
        (_, true) => Some(Family::V6),
        _ => None,
    };
    let paths = Paths {
        bind: a.bind.into_iter().collect(),
        ..Paths::default()
    };
    if a.iperf3 {
        let opts = ClientOptions {
            connect_timeout: a.connect_timeout,
            local_cpu,
            interrupt: interrupt_flag(),
            paths,
            family,
            ..ClientOptions::default()
        };
        return iperf3(a, &params, &opts, printer);
    }
    let mut opts = ClientOptions {
        connect_timeout: a.connect_timeout,
        local_cpu,
        interrupt: interrupt_flag(),
        security: a.security.security()?,
        auto_streams: matches!(a.streams, StreamCount::Auto),
        paths,
        family,
        ..ClientOptions::default()
    };
    // `HOST:`: over ssh, through a one-shot far end (see `remote`).
    let mut named = a.hosts.clone();
    let far = super::remote::reach_host(&mut named, &mut opts, &a.ssh)?;
    let hosts: Vec<String> = named.iter().map(|h| with_port(h, a.port)).collect();
    // A far end over ssh serves one client: no second attempt at it.
    let retries = if far.is_some() { 0 } else { a.retry.retries };
    let ran =
        longhaul_engine::report::retrying(retries, &opts.interrupt, super::unreachable, |_| {
            match hosts.as_slice() {
                [one] => run_perf(one, &params, &opts, printer),
                [from, to] => run_third_party(from, to, &params, &opts, printer),
                _ => unreachable!("clap allows one or two hosts"),
            }
        });
    match far {
        Some(far) => {
            let ran = ran.map_err(|e| super::remote::explain(&far, e));
            far.finish();
            ran?
        }
        None => ran?,
    };
    Ok(if opts.interrupt.load(Ordering::SeqCst) {
        exit::INTERRUPTED
    } else {
        exit::OK
    })
}

/// `perf --iperf3`: one test against a stock iperf3 server.
fn iperf3(
    a: &PerfArgs,
    params: &TestParams,
    opts: &ClientOptions,
    printer: &mut dyn CommandReporter,
) -> Outcome {
    let [host] = a.hosts.as_slice() else {
        return Err(usage(
            "--iperf3 tests against one iperf3 server: give one HOST[:PORT]",
        ));
    };
    let port = match a.port {
        longhaul_engine::DEFAULT_PORT => longhaul_proto::iperf3::DEFAULT_PORT,
        p => p,
    };
    let target = with_port(host, port);
    longhaul_engine::report::retrying(
        a.retry.retries,
        &opts.interrupt,
        super::unreachable,
        |_| longhaul_engine::perf::iperf3::run_iperf3(&target, params, opts, printer),
    )?;
    Ok(exit::OK)
}

/// Which way the data goes: `-R`, `--bidir` or up.
fn mode_of(a: &PerfArgs) -> Mode {
    if a.bidir {
        Mode::Bidir
    } else if a.reverse {
        Mode::Down
    } else {
        Mode::Up
    }
}

fn parse_affinity(s: &str) -> Result<(Option<u32>, Option<u32>), Failure> {
    let bad = || {
        usage(format!(
            "invalid affinity '{s}': expected a CPU number, or LOCAL,REMOTE like 0,1"
        ))
    };
    let mut it = s.split(',');
    let local = it
        .next()
        .filter(|x| !x.is_empty())
        .map(|x| x.trim().parse().map_err(|_| bad()))
        .transpose()?;
    let remote = it
        .next()
        .map(|x| x.trim().parse().map_err(|_| bad()))
        .transpose()?;
    if it.next().is_some() {
        return Err(bad());
    }
    Ok((local, remote))
}

fn params_of(a: &PerfArgs) -> Result<(TestParams, Option<u32>), Failure> {
    let transport = if a.udp {
        Transport::Udp
    } else {
        Transport::Tcp
    };
    let directions = if a.bidir { 2 } else { 1 };
    let length = a.length.unwrap_or(match transport {
        Transport::Tcp => default_tcp_length(u32::from(a.streams.initial()) * directions),
        Transport::Udp => 1472,
    });
    let length =
        u32::try_from(length).map_err(|_| usage(format!("buffer length {length} is too large")))?;
    if let Some(t) = a.time {
        if t.is_zero() {
            return Err(usage("duration 0: give a positive test length, like -t 10"));
        }
    }
    if a.bytes == Some(0) {
        return Err(usage("byte count 0: give a positive size, like -n 1G"));
    }
    if a.streams.initial() == 0 {
        return Err(usage("0 streams: use -P 1 or more, or -P auto"));
    }
    let window = a
        .window
        .map(|w| u32::try_from(w).map_err(|_| usage(format!("window {w} bytes does not fit a socket buffer size (at most 4 GiB - 1, and the kernel caps it lower: `longhaul doctor` shows the cap); use -w 1G or less"))))
        .transpose()?;
    if !a.udp && a.rate.is_some() {
        return Err(usage(
            "-b/--bitrate applies to UDP tests (-u); for TCP use --pacing",
        ));
    }
    let (local_cpu, server_cpu) = match &a.affinity {
        Some(s) => parse_affinity(s)?,
        None => (None, None),
    };
    let ms = |d: Duration| d.as_millis() as u64;
    let params = TestParams {
        transport,
        mode: mode_of(a),
        streams: a.streams.initial(),
        duration_ms: match (a.time, a.bytes) {
            (_, Some(_)) => None,
            (Some(t), None) => Some(ms(t).max(1)),
            (None, None) => Some(10_000),
        },
        bytes: a.bytes,
        length,
        window,
        congestion: a.congestion.clone(),
        pacing_bps: a.pacing,
        mss: a.mss,
        server_cpu,
        send_mode: match (a.copy, a.zerocopy) {
            (true, _) => SendMode::Copy,
            (false, Some(m)) => m,
            (false, None) => SendMode::default(),
        },
        recv_mode: if a.copy {
            RecvMode::Copy
        } else {
            a.recv_mode.unwrap_or_default()
        },
        interval_ms: ms(a.interval),
        omit_ms: ms(a.omit),
        udp_rate_bps: if a.udp {
            Some(a.rate.unwrap_or(1_000_000))
        } else {
            None
        },
        data_tls: Some(a.tls),
        // The engine's, for a far end that sends the first datagram.
        udp_back_ports: Vec::new(),
    };
    Ok((params, local_cpu))
}

/// Default bytes per write: 1 MiB for one stream; with more streams the
/// buffers together stay near 1 MiB (at least 128 KiB each), so they stay in
/// cache. Measured on loopback: see BENCHMARKS.md.
fn default_tcp_length(streams: u32) -> u64 {
    ((1u64 << 20) / u64::from(streams.max(1))).max(128 << 10)
}

fn with_port(host: &str, port: u16) -> String {
    let has_port = host.starts_with('[') && host.contains("]:")
        || host
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok());
    if has_port {
        host.to_string()
    } else if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `demo`: a server in this process, three short perf tests and a copy against it.
pub fn demo() -> Outcome {
    // A throw-away identity (the client pins it, as `--trust` would), an
    // export and a tree to copy into it.
    // A private directory (0700, a name nobody could plant first), removed
    // when the demo ends however it ends.
    let scratch = match tempfile::Builder::new().prefix("longhaul-demo-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            return Err(Failure::internal(format!(
                "cannot make the demo's directory in {}: {e}",
                std::env::temp_dir().display()
            )))
        }
    };
    let state = scratch.path().to_path_buf();
    let (export_dir, tree) = (state.join("export"), state.join("run7"));
    if let Err(e) = demo_tree(&tree).and_then(|()| std::fs::create_dir_all(&export_dir)) {
        return Err(Failure::internal(format!(
            "cannot make the demo's files in {}: {e}",
            state.display()
        )));
    }
    let server = demo_server(&state, &export_dir)?;
    let addr = server.addr().to_string();
    let fp = server.fingerprint().unwrap_or_default();
    let mut printer = crate::print::outcome(None);
    printer.section(&format!(
        "longhaul demo: server started in-process on {addr}, TLS 1.3, identity {fp}"
    ));
    let opts = ClientOptions {
        security: Security {
            trust: TrustOptions {
                pins: vec![fp],
                ..TrustOptions::default()
            },
            ..Security::default()
        },
        ..ClientOptions::default()
    };
    let mut code = exit::OK;
    for (title, params) in demo_tests() {
        printer.section(&format!(
            "\n== {title}: {} ==",
            perf_command(&addr, &params)
        ));
        let mut human = human::Human::perf(params.streams, params.mode);
        if let Err(e) = run_perf(&addr, &params, &opts, &mut human) {
            let f = Failure::from(e);
            crate::print::error(&f.message);
            code = f.code;
        }
    }
    printer.section("\n== cp -r: a 256 MiB file and 500 small ones, 4 streams, TLS ==");
    let cp = CpOptions::new(
        vec![End::Local(tree.display().to_string())],
        End::on_server(longhaul_proto::xfer::Remote {
            host: addr.to_string(),
            export: "demo".into(),
            path: String::new(),
            dir: true,
        }),
        opts.clone(),
    );
    match longhaul_engine::xfer::client::cp(&cp) {
        Ok(s) => printer.transfer_summary(&s),
        Err(e) => {
            let f = Failure::from(e);
            crate::print::error(&f.message);
            code = f.code;
        }
    }
    server.shutdown();
    drop(scratch);
    Ok(code)
}

/// The demo's server, in this process on loopback: its identity in
/// `state`, `export_dir` exported as `demo`, open to all.
fn demo_server(
    state: &std::path::Path,
    export_dir: &std::path::Path,
) -> Result<longhaul_engine::server::ServerHandle, Failure> {
    let export =
        match longhaul_engine::xfer::parse_export(&format!("demo={}", export_dir.display())) {
            Ok(e) => e,
            Err(e) => return Err(Failure::internal(e.to_string())),
        };
    match Server::bind(
        &[SocketAddr::from(([127, 0, 0, 1], 0))],
        ServeConfig {
            state_dir: state.to_path_buf(),
            exports: vec![export],
            open_access: true,
            ..ServeConfig::default()
        },
    ) {
        Ok(s) => Ok(s.spawn()),
        Err(e) => Err(Failure::internal(e.to_string())),
    }
}

/// The demo's perf tests: a title and the test.
fn demo_tests() -> [(&'static str, TestParams); 3] {
    [
        (
            "TCP, 1 stream, TLS, 3 s",
            TestParams {
                duration_ms: Some(3000),
                data_tls: Some(true),
                ..TestParams::default()
            },
        ),
        (
            "TCP, 4 streams, reverse, TLS, 2 s",
            TestParams {
                duration_ms: Some(2000),
                streams: 4,
                mode: Mode::Down,
                data_tls: Some(true),
                ..TestParams::default()
            },
        ),
        (
            "UDP at 500 Mbit/s, 2 s",
            TestParams {
                transport: Transport::Udp,
                duration_ms: Some(2000),
                length: 1472,
                udp_rate_bps: Some(500_000_000),
                ..TestParams::default()
            },
        ),
    ]
}

/// The `longhaul perf` command line that runs the test `p` against
/// `addr` (the demo's titles): what a user types to run it again.
fn perf_command(addr: &str, p: &TestParams) -> String {
    let mut c = format!("longhaul perf {addr}");
    if p.transport == Transport::Udp {
        c += " -u";
        if let Some(r) = p.udp_rate_bps {
            let rate = longhaul_proto::units::format_rate(r as f64);
            c += &format!(" -b {}", rate.replace(' ', "").replace("bit/s", ""));
        }
        c += &format!(" -l {}", p.length);
    }
    if p.streams != 1 {
        c += &format!(" -P {}", p.streams);
    }
    match p.mode {
        Mode::Down => c += " -R",
        Mode::Bidir => c += " --bidir",
        Mode::Up => {}
    }
    if let Some(ms) = p.duration_ms {
        c += &format!(" -t {}", ms as f64 / 1000.0);
    }
    if p.data_tls == Some(true) {
        c += " --tls";
    }
    c
}

/// The demo's tree: one 256 MiB file and 500 files of 1-64 KiB.
fn demo_tree(dir: &std::path::Path) -> std::io::Result<()> {
    use longhaul_proto::data;
    use std::io::Write;
    std::fs::create_dir_all(dir.join("small"))?;
    let mut big = std::io::BufWriter::new(std::fs::File::create(dir.join("big.bin"))?);
    data::write_random(&mut big, 256 << 20, 1)?;
    big.flush()?;
    let mut sizes = data::Rng::new(2);
    for i in 0..500u64 {
        let len = 1024 + sizes.below(63 * 1024) as usize;
        std::fs::write(
            dir.join("small").join(format!("f{i:03}.dat")),
            data::bytes(3 + i, len),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn perf_args(argv: &[&str]) -> PerfArgs {
        let cli = crate::args::Cli::try_parse_from(argv).expect("parses");
        match cli.command {
            crate::args::Command::Perf(p) => p,
            _ => panic!("not perf"),
        }
    }

    /// `--recv-mode` reaches the test's parameters (it was parsed and then
    /// ignored: every receiver discarded).
    #[test]
    fn recv_mode_is_the_receivers_mode_and_copy_copies_both_ways() {
        let mode = |argv: &[&str]| params_of(&perf_args(argv)).ok().unwrap().0.recv_mode;
        assert_eq!(mode(&["longhaul", "perf", "h"]), RecvMode::Discard);
        assert_eq!(
            mode(&["longhaul", "perf", "h", "--recv-mode", "copy"]),
            RecvMode::Copy
        );
        assert_eq!(mode(&["longhaul", "perf", "h", "--copy"]), RecvMode::Copy);
    }
}
