//! What a server tells the world about what it serves: [`ServeObserver`],
//! called when a control session opens and closes, when a perf test or a
//! transfer (`cp`/`sync` push or pull, `ls`) starts and finishes, when a
//! request is refused and when something fails. Prometheus metrics
//! (`longhaul-view`'s `Metrics`) and the server-side archive
//! (`longhaul-archive`'s `ServedArchive`) implement it.
//!
//! Observers are called on the serving threads, but never on the data
//! path: only at the start and end of sessions, tests and transfers and
//! on refusals, a handful of calls per request. They must return at once
//! (count, or hand the event to a thread of their own); they are never
//! told anything per chunk or per interval.
//!
//! Every label-like value an observer is given is bounded: `kind`,
//! `result` and refusal `reason`s are fixed words, a grant is a grant id
//! from the server's grants file (or `anonymous`), and an export is one
//! the server was started with; a name a client asked for that is no
//! export is never passed on. Only [`ServedRun::client`] and the
//! free-text messages are unbounded: never make them metric labels.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use longhaul_proto::msg::RefuseCode;

/// The grant label of a client without one.
pub const ANONYMOUS: &str = "anonymous";

/// What a server saw happen; every method does nothing unless overridden.
pub trait ServeObserver: Send + Sync {
    /// A client's control session began (after authentication).
    fn session_opened(&self, _s: &Session) {}
    /// That session ended (the client closed it, or it failed).
    fn session_closed(&self, _s: &Session) {}
    /// A perf test was accepted and holds a slot.
    fn test_started(&self, _r: &ServedRun) {}
    /// The test ended (`result` and the totals are set).
    fn test_finished(&self, _r: &ServedRun) {}
    /// A transfer or listing was accepted (and holds a slot, for a transfer).
    fn transfer_started(&self, _r: &ServedRun) {}
    /// The transfer or listing ended (`result` and the totals are set).
    fn transfer_finished(&self, _r: &ServedRun) {}
    /// A connection or request was refused before anything ran.
    fn refused(&self, _r: &Refused) {}
    /// Something failed: a connection's handshake, a session, or a test or
    /// transfer that had started (which is also finished with a `failed`
    /// or `aborted` result).
    fn error(&self, _e: &Failure) {}
    /// A job server's jobs, how many in each state (`serve --jobs`; every
    /// state, every ten seconds or so).
    fn jobs(&self, _by_state: &[(&'static str, u64)]) {}
}

/// What a served run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunKind {
    /// A memory-to-memory perf test.
    Perf,
    /// `cp`/`sync` into an export: this server receives.
    Push,
    /// `cp`/`sync` out of an export: this server sends.
    Pull,
    /// `ls` of an export.
    List,
}

impl RunKind {
    /// `perf`, `push`, `pull` or `ls`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Perf => "perf",
            RunKind::Push => "push",
            RunKind::Pull => "pull",
            RunKind::List => "ls",
        }
    }

    /// Whether the run is a test ([`ServeObserver::test_started`]) rather
    /// than a transfer or listing.
    pub fn is_test(self) -> bool {
        self == RunKind::Perf
    }
}

/// How a served run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Still going (what `*_started` is given).
    Running,
    Ok,
    /// A transfer that finished with some files failed.
    Partial,
    /// It failed; `error` says why.
    Failed,
    /// Its session ended before it did (the client went away, the session
    /// broke).
    Aborted,
}

impl Outcome {
    /// `running`, `ok`, `partial`, `failed` or `aborted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Running => "running",
            Outcome::Ok => "ok",
            Outcome::Partial => "partial",
            Outcome::Failed => "failed",
            Outcome::Aborted => "aborted",
        }
    }
}

/// One test, transfer or listing this server served. The same `id` goes
/// to its `*_started` and its `*_finished`.
#[derive(Debug, Clone)]
pub struct ServedRun {
    /// Unique in this process.
    pub id: u64,
    pub kind: RunKind,
    /// The client's address (`IP:PORT`). Unbounded: never a metric label.
    pub client: String,
    /// The grant the client used (its id), or [`ANONYMOUS`].
    pub grant: String,
    /// The export, for transfers and listings.
    pub export: Option<String>,
    /// What was asked: a perf test's parameters; a transfer's paths,
    /// streams and options (JSON, for the archive).
    pub params: serde_json::Value,
    /// Bytes this server sent and received (perf: both directions' data).
    pub bytes: u64,
    /// Files moved (transfers; listings: entries listed).
    pub files: u64,
    /// From start to finish; 0 at the start.
    pub seconds: f64,
    /// `bytes * 8 / seconds`; 0 at the start.
    pub bits_per_second: f64,
    pub result: Outcome,
    pub error: Option<String>,
}

/// A control session.
#[derive(Debug, Clone)]
pub struct Session {
    /// `IP:PORT`; never a metric label.
    pub client: String,
    /// The grant id, or [`ANONYMOUS`].
    pub grant: String,
}

/// A refusal.
#[derive(Debug, Clone)]
pub struct Refused {
    /// What was refused: `connection`, `perf`, `push`, `pull`, `ls`,
    /// `probe` or `third-party`.
    pub what: &'static str,
    /// A configured export the request named (None when it named none,
    /// or a name that is no export).
    pub export: Option<String>,
    /// The grant, or [`ANONYMOUS`] (also before the client said who it is).
    pub grant: String,
    /// The refusal's code word (`busy`, `unauthorized`, `limit`,
    /// `bad_request`, `tls_required`, ...): bounded.
    pub reason: &'static str,
    /// What the client was told.
    pub message: String,
    pub client: String,
}

/// A failure.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Where: `handshake`, `session`, `perf`, `push`, `pull` or `ls`.
    pub stage: &'static str,
    pub export: Option<String>,
    pub grant: String,
    pub message: String,
    pub client: String,
}

/// The word of a refusal code, as the protocol spells it.
pub fn code_word(code: RefuseCode) -> &'static str {
    match code {
        RefuseCode::Version => "version",
        RefuseCode::Busy => "busy",
        RefuseCode::Limit => "limit",
        RefuseCode::BadRequest => "bad_request",
        RefuseCode::ThirdPartyDisabled => "third_party_disabled",
        RefuseCode::UnknownTest => "unknown_test",
        RefuseCode::Protocol => "protocol",
        RefuseCode::Timeout => "timeout",
        RefuseCode::ServerError => "server_error",
        RefuseCode::Unauthorized => "unauthorized",
        RefuseCode::TlsRequired => "tls_required",
    }
}

/// The observers of a server, called in order.
pub type Observers = Arc<[Arc<dyn ServeObserver>]>;

static NEXT_RUN: AtomicU64 = AtomicU64::new(1);

/// A served run from its start to its end: tells the observers it
/// started when made, and that it finished when [`Watch::finish`]ed, or,
/// dropped without that (the session broke), that it was aborted. So
/// every start has its end, and gauges of what runs come back down.
pub(super) struct Watch {
    observers: Observers,
    run: ServedRun,
    start: Instant,
    done: bool,
}

impl Watch {
    pub(super) fn start(
        observers: &Observers,
        kind: RunKind,
        client: &str,
        grant: &str,
        export: Option<&str>,
        params: serde_json::Value,
    ) -> Watch {
        let run = ServedRun {
            id: NEXT_RUN.fetch_add(1, Ordering::Relaxed),
            kind,
            client: client.to_string(),
            grant: grant.to_string(),
            export: export.map(str::to_string),
            params,
            bytes: 0,
            files: 0,
            seconds: 0.0,
            bits_per_second: 0.0,
            result: Outcome::Running,
            error: None,
        };
        for o in observers.iter() {
            match kind.is_test() {
                true => o.test_started(&run),
                false => o.transfer_started(&run),
            }
        }
        Watch {
            observers: observers.clone(),
            run,
            start: Instant::now(),
            done: false,
        }
    }

    /// Ends the run with its totals and how it went.
    pub(super) fn finish(mut self, bytes: u64, files: u64, result: Outcome, error: Option<String>) {
        self.end(bytes, files, result, error);
    }

    fn end(&mut self, bytes: u64, files: u64, result: Outcome, error: Option<String>) {
        if self.done {
            return;
        }
        self.done = true;
        let seconds = self.start.elapsed().as_secs_f64();
        let r = &mut self.run;
        r.bytes = bytes;
        r.files = files;
        r.seconds = seconds;
        r.bits_per_second = match seconds > 0.0 {
            true => bytes as f64 * 8.0 / seconds,
            false => 0.0,
        };
        r.result = result;
        r.error = error;
        let r = &self.run;
        if let (Outcome::Failed | Outcome::Aborted, Some(message)) = (r.result, &r.error) {
            let f = Failure {
                stage: r.kind.as_str(),
                export: r.export.clone(),
                grant: r.grant.clone(),
                message: message.clone(),
                client: r.client.clone(),
            };
            for o in self.observers.iter() {
                o.error(&f);
            }
        }
        for o in self.observers.iter() {
            match r.kind.is_test() {
                true => o.test_finished(r),
                false => o.transfer_finished(r),
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.end(
            0,
            0,
            Outcome::Aborted,
            Some("the session ended before the run finished".into()),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl ServeObserver for Log {
        fn test_started(&self, r: &ServedRun) {
            self.0.lock().unwrap().push(format!("start {}", r.id));
        }
        fn test_finished(&self, r: &ServedRun) {
            self.0
                .lock()
                .unwrap()
                .push(format!("end {} {} {}", r.id, r.result.as_str(), r.bytes));
        }
        fn error(&self, e: &Failure) {
            self.0.lock().unwrap().push(format!("error {}", e.stage));
        }
    }

    #[test]
    fn every_start_has_one_end_even_when_dropped() {
        let log = Arc::new(Log::default());
        let obs: Observers = Arc::from(vec![log.clone() as Arc<dyn ServeObserver>]);
        let w = Watch::start(
            &obs,
            RunKind::Perf,
            "1.2.3.4:5",
            "g",
            None,
            Default::default(),
        );
        let id = w.run.id;
        w.finish(100, 0, Outcome::Ok, None);
        let w = Watch::start(
            &obs,
            RunKind::Perf,
            "1.2.3.4:5",
            "g",
            None,
            Default::default(),
        );
        let id2 = w.run.id;
        drop(w);
        let got = log.0.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![
                format!("start {id}"),
                format!("end {id} ok 100"),
                format!("start {id2}"),
                "error perf".to_string(),
                format!("end {id2} aborted 0"),
            ]
        );
    }
}
