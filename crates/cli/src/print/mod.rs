//! The one way the binary writes lines to stdout and stderr. A reader that
//! goes away (`longhaul ls ... | head`) is a normal end of the output, not
//! an error and never a panic: once a stream reports a broken pipe, later
//! lines to it are dropped and the command finishes its work.
//!
//! The printers are below it, each a [`Reporter`]: [`human::Human`] for
//! people, [`progress::Bar`] for a transfer under way on a terminal,
//! [`json`] for machines. A command picks one with the functions here.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use longhaul_engine::results::CommandReporter;
use longhaul_proto::msg::Mode;
use longhaul_proto::units::{json_safe, terminal_safe};

/// A command's printer.
pub type Printer = Box<dyn CommandReporter + Send>;

/// perf `-f` (parsed by `args::format_unit`): one unit for every rate (and size) printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatUnit {
    /// Bits (k, m, g) or bytes (K, M, G).
    pub bytes: bool,
    /// 1 (kilo), 2 (mega) or 3 (giga).
    pub power: u8,
}

/// perf: `--json`, `--json-stream` or lines for people (rates in `-f`'s
/// unit if given).
pub fn perf(
    json: bool,
    json_stream: bool,
    streams: u16,
    mode: Mode,
    unit: Option<FormatUnit>,
) -> Printer {
    if json {
        Box::new(json::JsonDoc::default())
    } else if json_stream {
        Box::new(json::JsonStream)
    } else {
        Box::new(human::Human::perf_in(streams, mode, unit))
    }
}

/// How cp and sync print: their options that choose it.
#[derive(Clone, Copy, Default)]
pub struct TransferLook {
    /// `--json`: one document at the end.
    pub json: bool,
    /// `--intervals`: a line per interval (to stderr).
    pub intervals: bool,
    /// `-n`: what would be sent and deleted.
    pub dry_run: bool,
    /// `-q`: errors only.
    pub quiet: bool,
    /// `--progress`: the bar even when stderr is not a terminal.
    pub progress: bool,
}

/// cp, sync: `--json`, or lines for people (errors only with `-q`); with a
/// progress bar when stderr is a terminal and no `--intervals` lines go
/// there, or always with `--progress` (a line a second where stderr is
/// not a terminal, as for a log).
pub fn transfer(look: TransferLook) -> Printer {
    let inner: Printer = if look.json {
        Box::new(json::Json::transfer(look.intervals))
    } else {
        Box::new(human::Human::transfer(
            look.dry_run,
            look.intervals,
            look.quiet,
        ))
    };
    let terminal = io::IsTerminal::is_terminal(&io::stderr());
    if look.progress {
        Box::new(progress::Bar::new(inner, terminal))
    } else if !look.json && !look.quiet && !look.intervals && terminal {
        Box::new(progress::Bar::new(inner, true))
    } else {
        inner
    }
}

/// The plural ending of a count's noun: `""` for one, `"s"` otherwise
/// ("1 file", "2 files").
pub fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// How the log reads at a client command (not `serve`, not with `-v` or
/// `RUST_LOG`): a warning as `longhaul: warning: ...`, as every other
/// warning a command prints, without the timestamp and module path that
/// a daemon's log wants and a person reading a command's output does not.
pub struct PlainLog;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for PlainLog
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut w: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let word = match *event.metadata().level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warning",
            tracing::Level::INFO => "info",
            _ => "debug",
        };
        write!(w, "longhaul: {word}: ")?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

static QUIET: AtomicBool = AtomicBool::new(false);

/// `-q`: from now on, only errors are said (no warnings, notices or
/// retries; the log only at ERROR).
pub fn set_quiet() {
    QUIET.store(true, Ordering::Relaxed);
}

/// Whether `-q` asked for errors only.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// The one wording of a retry, in every command (cp, sync, ls, perf,
/// doctor): `longhaul: ERROR; retrying (1/3) in 1 s`.
pub fn retry_line(n: &longhaul_engine::report::RetryNotice) -> String {
    format!(
        "longhaul: {}; retrying ({}/{}) in {} s",
        n.error,
        n.attempt,
        n.retries,
        n.wait.as_secs()
    )
}

/// Tells a retry on stderr (not with `-q`); set as the engine's
/// [`longhaul_engine::report::on_retry`] by `main`.
pub fn retry_notice(n: &longhaul_engine::report::RetryNotice) {
    if !quiet() {
        err(format_args!("{}", retry_line(n)));
    }
}

/// A command whose outcome is one document with `--json`.
pub fn outcome(json: Option<json::Json>) -> Printer {
    match json {
        Some(j) => Box::new(j),
        None => Box::new(human::Human::new()),
    }
}

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

fn write_line(w: &mut dyn Write, closed: &AtomicBool, args: fmt::Arguments) {
    write_text(w, closed, &terminal_safe(&args.to_string()).to_string());
}

fn write_text(w: &mut dyn Write, closed: &AtomicBool, text: &str) {
    if closed.load(Ordering::Relaxed) {
        return;
    }
    let r = w
        .write_all(text.as_bytes())
        .and_then(|()| w.write_all(b"\n"))
        .and_then(|()| w.flush());
    // Any failure to write is the reader's business: a broken pipe ends the
    // output, other errors (a full disk behind a redirect) lose the line.
    if r.is_err_and(|e| e.kind() == io::ErrorKind::BrokenPipe) {
        closed.store(true, Ordering::Relaxed);
    }
}

/// Writes one line to stdout, every terminal control in it shown, never
/// acted on ([`terminal_safe`]): a peer's words reach a line in many ways
/// (its refusals, names, paths, notes), and none of them may set a title,
/// clear the screen or overwrite a line. Those words are also [`escaped`]
/// where they are put in (their line breaks too).
///
/// [`escaped`]: longhaul_proto::units::escaped
pub fn out(args: fmt::Arguments) {
    write_line(&mut io::stdout().lock(), &STDOUT_CLOSED, args);
}

/// Writes one line to stderr, as [`out`].
pub fn err(args: fmt::Arguments) {
    write_line(&mut io::stderr().lock(), &STDERR_CLOSED, args);
}

/// Writes a JSON document (one line) to stdout, made safe for a terminal
/// without changing what it says ([`json_safe`]).
pub fn out_json(text: &str) {
    write_text(
        &mut io::stdout().lock(),
        &STDOUT_CLOSED,
        &json_safe(text).to_string(),
    );
}

/// Prints a failure the way every command does: `longhaul: error: MESSAGE`.
pub fn error(message: &str) {
    err(format_args!("longhaul: error: {message}"));
}

/// `println!` through [`out`].
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::print::out(format_args!($($t)*))
    };
}

/// `eprintln!` through [`err`].
#[macro_export]
macro_rules! errln {
    ($($t:tt)*) => {
        $crate::print::err(format_args!($($t)*))
    };
}

// After the macros: the printers use them.
pub mod archived;
pub mod fleet;
pub mod human;
pub mod jobs;
pub mod json;
pub mod matrix;
pub mod progress;

#[cfg(test)]
mod tests {
    use super::*;

    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_retry_is_said_plainly() {
        let line = retry_line(&longhaul_engine::report::RetryNotice {
            attempt: 1,
            retries: 3,
            wait: std::time::Duration::from_secs(2),
            error: "cannot connect to 127.0.0.1:9: Connection refused".into(),
        });
        assert_eq!(
            line,
            "longhaul: cannot connect to 127.0.0.1:9: Connection refused; retrying (1/3) in 2 s"
        );
    }

    #[test]
    fn a_broken_pipe_ends_the_output_quietly() {
        let closed = AtomicBool::new(false);
        write_line(&mut Closed, &closed, format_args!("one"));
        assert!(closed.load(Ordering::Relaxed));
        // Dropped, not written and not a panic.
        write_line(&mut Closed, &closed, format_args!("two"));
    }
}
