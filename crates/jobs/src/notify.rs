//! Telling a job's end: a webhook POST of the job's outcome (a fixed JSON
//! document, `longhaul-job-event`, signed with HMAC-SHA256 under the job's
//! own secret so that the receiver can check it came from this server and
//! is not replayed from long ago; retried, never redirected) and a mail
//! through the host's sendmail. Nothing the submitter chose goes into a
//! request but the URL itself: the body is the job's state, and every
//! string of theirs in the mail is escaped and in its body only.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::job::JobView;
use longhaul_proto::units::escaped;
use serde::Serialize;

use crate::store::{JobRow, Tally};
use crate::JobsConfig;

/// The document's format and version.
pub const FORMAT: &str = "longhaul-job-event";
pub const FORMAT_VERSION: u32 = 1;
/// The headers of a notification.
pub const SIGNATURE_HEADER: &str = "X-Longhaul-Signature";
pub const TIMESTAMP_HEADER: &str = "X-Longhaul-Timestamp";
pub const EVENT_HEADER: &str = "X-Longhaul-Event";
/// Tries of one notification, and the longest each may take.
const TRIES: u32 = 4;
const TIMEOUT: Duration = Duration::from_secs(10);

/// What is POSTed.
#[derive(Debug, Serialize)]
pub struct Event<'a> {
    pub format: &'static str,
    pub format_version: u32,
    /// `ended` (the job is over), or `run_ended` (a run of a recurring
    /// job is; the next is due).
    pub event: &'a str,
    /// Unix seconds: also the signed timestamp.
    pub sent_at: u64,
    pub job: JobView,
}

/// The signature of `body` sent at `timestamp` under `secret`: `sha256=`
/// and the hex of HMAC-SHA256(secret, "TIMESTAMP.BODY").
pub fn signature(secret: &str, timestamp: u64, body: &[u8]) -> String {
    use aws_lc_rs::hmac;
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    format!("sha256={}", longhaul_proto::units::hex(ctx.sign().as_ref()))
}

/// Tells the job's `event` wherever it asks to be told; failures are
/// logged, never fatal.
pub fn tell(cfg: &JobsConfig, job: &JobRow, tally: &Tally, event: &str) {
    let view = crate::view::of(job, tally, true);
    if let (Some(url), Some(secret)) = (&job.spec.options.notify, &job.notify_secret) {
        match post(url, secret, event, &view) {
            Ok(()) => tracing::info!("job {}: its end was posted", job.id),
            Err(e) => tracing::warn!("job {}: the notification could not be posted: {e}", job.id),
        }
    }
    if let Some(addr) = &job.spec.options.mail {
        match mail(cfg, addr, event, &view) {
            Ok(()) => tracing::info!("job {}: its end was mailed", job.id),
            Err(e) => tracing::warn!("job {}: the mail could not be sent: {e}", job.id),
        }
    }
}

fn agent() -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .max_redirects(0)
        .http_status_as_error(false)
        .tls_config(tls)
        .build()
        .into()
}

/// POSTs the event, retried (1, 2, 4 s apart) until a 2xx answer.
pub fn post(url: &str, secret: &str, event: &str, view: &JobView) -> Result<(), String> {
    longhaul_proto::job::valid_notify_url(url)?;
    let agent = agent();
    let mut last = String::new();
    for n in 0..TRIES {
        if n > 0 {
            std::thread::sleep(Duration::from_secs(1 << (n - 1)));
        }
        let sent_at = crate::now();
        let body = serde_json::to_vec(&Event {
            format: FORMAT,
            format_version: FORMAT_VERSION,
            event,
            sent_at,
            job: view.clone(),
        })
        .map_err(|e| e.to_string())?;
        let answer = agent
            .post(url)
            .header("Content-Type", "application/json")
            .header(EVENT_HEADER, event)
            .header(TIMESTAMP_HEADER, sent_at.to_string())
            .header(SIGNATURE_HEADER, signature(secret, sent_at, &body))
            .send(&body[..]);
        match answer {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => last = format!("the receiver answered {}", r.status()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("{last} ({TRIES} tries)"))
}

/// The mail of an event: headers of our own words, the job's strings
/// (escaped) in the body.
pub fn mail_text(addr: &str, event: &str, v: &JobView) -> String {
    let what = if event == "run_ended" {
        "a run of job"
    } else {
        "job"
    };
    let state = v.state.word().replace('_', " ");
    let mut text = format!(
        "To: {addr}\nSubject: longhaul: {what} {} {state}\nAuto-Submitted: auto-generated\nContent-Type: text/plain; charset=utf-8\n\n",
        v.id
    );
    text.push_str(&format!("The longhaul {what} {} is {state}.\n\n", v.id));
    text.push_str(&format!("from:  {}\n", escaped(&v.source)));
    text.push_str(&format!("to:    {}\n", escaped(&v.dest)));
    text.push_str(&format!(
        "files: {} finished, {} failed, {} cancelled, of {}\n",
        v.files.finished,
        v.files.failed,
        v.files.cancelled,
        v.files.total()
    ));
    text.push_str(&format!(
        "bytes: {} of {}\nattempts: {}\n",
        v.bytes_done, v.bytes_total, v.attempts
    ));
    if let Some(e) = &v.error {
        text.push_str(&format!("error: {}\n", escaped(e)));
    }
    text.push_str(&format!("\n`longhaul jobs show {}` tells more.\n", v.id));
    text
}

/// Mails the event through the host's sendmail (`-i --`, the address
/// checked to be a plain one), waiting for it at most 30 s.
pub fn mail(cfg: &JobsConfig, addr: &str, event: &str, view: &JobView) -> Result<(), String> {
    if !longhaul_proto::job::valid_mail(addr) {
        return Err("not a plain mail address".into());
    }
    let mut child = Command::new(&cfg.sendmail)
        .args(["-i", "--", addr])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", cfg.sendmail.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(mail_text(addr, event, view).as_bytes())
            .map_err(|e| format!("{}: {e}", cfg.sendmail.display()))?;
    }
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match child.try_wait() {
            Ok(Some(s)) if s.success() => return Ok(()),
            Ok(Some(s)) => return Err(format!("{} ended with {s}", cfg.sendmail.display())),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} took more than 30 s", cfg.sendmail.display()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiver checks the signature with the standard HMAC-SHA256 (RFC
    /// 4231's first test vector, through the same code).
    #[test]
    fn the_signature_is_hmac_sha256_of_the_timestamp_and_body() {
        use aws_lc_rs::hmac;
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"lh1n_secret");
        let want = hmac::sign(&key, b"1700000000.{\"a\":1}");
        assert_eq!(
            signature("lh1n_secret", 1_700_000_000, b"{\"a\":1}"),
            format!("sha256={}", longhaul_proto::units::hex(want.as_ref()))
        );
        assert_ne!(
            signature("lh1n_secret", 1_700_000_001, b"{\"a\":1}"),
            signature("lh1n_secret", 1_700_000_000, b"{\"a\":1}")
        );
    }

    /// The attacker chose the paths: they reach the mail's body, escaped,
    /// and no header.
    #[test]
    fn attacker_strings_in_a_mail_stay_in_its_body() {
        let v = JobView {
            id: "0123456789abcdef".into(),
            state: longhaul_proto::job::JobState::Finished,
            kind: longhaul_proto::job::JobKind::Push,
            source: "data/x\nBcc: victim@example.org".into(),
            dest: "h:in/\u{1b}[2J".into(),
            sync: false,
            every_s: None,
            created: 0.0,
            updated: 0.0,
            expires: 0.0,
            attempts: 1,
            retries: 0,
            next_attempt: None,
            files: Default::default(),
            bytes_total: 0,
            bytes_done: 0,
            rate_bps: None,
            eta_s: None,
            error: None,
            worker: None,
            runs: 0,
            history: Vec::new(),
            discards: Vec::new(),
        };
        let text = mail_text("ops@example.org", "ended", &v);
        let (head, body) = text.split_once("\n\n").unwrap();
        assert!(!head.contains("Bcc"), "{head}");
        assert!(!text.contains("\nBcc:"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(body.contains("victim@example.org"));
    }
}
