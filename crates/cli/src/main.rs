//! `longhaul`: the command-line front end. `main` parses the arguments,
//! dispatches to a command in [`cmd`], prints a failure once and ends
//! the process with the command's exit code ([`exit`]).
// Unit tests are scenarios, not shipped functions: only shipped code is held to 100 lines.
#![cfg_attr(test, allow(clippy::too_many_lines))]

#[macro_use]
mod print;
mod args;
mod cmd;
mod exit;

use args::{BenchCommand, Command, CpArgs};

/// Raises the open-file limit to its hard maximum: a sink keeps up to
/// 2048 partial files open, and a server serves many clients.
fn raise_nofile_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let l = getrlimit(Resource::Nofile);
    // None is RLIM_INFINITY.
    if l.current.unwrap_or(u64::MAX) < l.maximum.unwrap_or(u64::MAX) {
        let _ = setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: l.maximum,
                ..l
            },
        );
    }
}

fn main() {
    let cli = args::parse();
    raise_nofile_limit();
    if cli.quiet() {
        print::set_quiet();
    }
    longhaul_engine::report::on_retry(print::retry_notice);
    let filter = match cli.verbose {
        _ if print::quiet() => "error",
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let from_env = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    // A daemon's log keeps its times and sources; so does a log asked for.
    let plain = from_env.is_none()
        && cli.verbose == 0
        && !matches!(&cli.command, Command::Serve(a) if !a.one_shot);
    let log = tracing_subscriber::fmt()
        .with_env_filter(from_env.unwrap_or_else(|| filter.into()))
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, never into a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if plain {
        log.event_format(print::PlainLog).init();
    } else {
        log.init();
    }
    let result = match cli.command {
        Command::Serve(a) if a.one_shot => cmd::remote::serve_one_shot(a),
        Command::Serve(a) => cmd::serve(a, &cli.archive),
        Command::Perf(a) => cmd::perf(a, &cli.archive),
        Command::Cp(a) => {
            let dry_run = a.dry_run;
            cmd::cp(a, None, dry_run, &cli.archive)
        }
        Command::Sync(a) => {
            let dry_run = a.cp.dry_run;
            cmd::cp(
                CpArgs {
                    recursive: true,
                    ..a.cp
                },
                Some(longhaul_proto::xfer::SyncOptions {
                    checksum: a.checksum,
                    delete: a.delete,
                }),
                dry_run,
                &cli.archive,
            )
        }
        Command::Ls(a) => cmd::ls(a),
        Command::Submit(a) => cmd::submit(a),
        Command::Jobs(a) => cmd::jobs(a),
        Command::Demo => cmd::demo(),
        Command::Id(a) => cmd::id(a),
        Command::Trust(a) => cmd::trust(a),
        Command::Token(a) => cmd::token(a),
        Command::Wan(a) => cmd::wan(a),
        Command::Doctor(a) => cmd::doctor(a, &cli.archive),
        Command::Bench(a) => match a.command {
            BenchCommand::Disk(d) => cmd::bench_disk(d, &cli.archive),
        },
        Command::History(a) => cmd::history(a, &cli.archive),
        Command::Show(a) => cmd::show(a, &cli.archive),
        Command::Where(a) => cmd::where_(a, &cli.archive),
        Command::Dashboard(a) => cmd::dashboard(a, &cli.archive),
        Command::Plot(a) => cmd::plot(a, &cli.archive),
        Command::Completions(a) => cmd::completions(a),
        Command::Man(a) => cmd::man(a),
        Command::Matrix(a) => cmd::matrix(a, &cli.archive, cli.verbose),
    };
    let code = match result {
        Ok(code) => code,
        Err(f) => {
            print::error(&f.message);
            f.code
        }
    };
    leave(code)
}

/// Ends the process with `code`. Other threads may still run (data
/// streams in a TLS handshake when the server refused the request, say):
/// the C library's exit handlers would tear down the crypto library's
/// state under them, and a process that said "refused" could then die of
/// a signal instead of exiting with its code. So: our output flushed, then
/// `_exit`, without those handlers; nothing of ours needs them (every
/// temporary directory and emulator is removed before this point).
pub fn leave(code: i32) -> ! {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit has no preconditions; our buffers are flushed above.
    unsafe { libc::_exit(code) }
}
