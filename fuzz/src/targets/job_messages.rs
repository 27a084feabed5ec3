//! The jobs' messages (PROTOCOL.md 18) and a job's capability scopes, from
//! any bytes: a job server decodes a submission and checks it before it
//! keeps anything, so neither may panic; what decodes re-encodes to
//! itself; what `check` accepts is within the documented budgets; a read
//! checked against a decoded pull scope is within it only beneath one of
//! its sources. The rules (derived state, backoff, recurrence) take any
//! numbers without panicking.

use longhaul_proto::frame::Frame;
use longhaul_proto::job::*;
use longhaul_proto::msg::{kind, Message};
use longhaul_proto::xfer::copy::within_read_scope;

fuzz_target!(|data: &[u8]| {
    for k in [
        kind::JOB_SUBMIT,
        kind::JOB_COMMAND,
        kind::JOB_ANSWER,
        kind::GRANT_REQUEST,
        kind::DISCARD,
    ] {
        let frame = Frame {
            kind: k,
            body: data.to_vec(),
        };
        let Ok(m) = Message::decode(&frame) else {
            continue;
        };
        let mut out = Vec::new();
        m.encode(&mut out).expect("a decoded message encodes");
        let again = Message::decode(&Frame {
            kind: k,
            body: out[5..].to_vec(),
        })
        .expect("and decodes back");
        assert_eq!(m, again);
        match m {
            Message::JobSubmit(spec) if spec.check().is_ok() => {
                assert!(!spec.source.paths.is_empty() && spec.source.paths.len() <= MAX_SOURCES);
                assert_eq!(spec.dest.paths.len(), 1);
                assert!(spec.options.retries <= MAX_RETRIES);
                assert!(spec.options.filter.len() <= MAX_FILTER_RULES);
                assert_eq!(
                    format!("{:?}", with_capabilities(&spec, "lh1c_one")),
                    format!("{:?}", with_capabilities(&spec, "lh1c_two")),
                    "a job's debug form shows no capability"
                );
            }
            Message::GrantRequest(g) => {
                let paths: Vec<String> = data
                    .split(|b| *b == b'\n')
                    .take(8)
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .collect();
                if within_read_scope(&g, true, &g.export, &paths).is_ok() {
                    for p in &paths {
                        assert!(!p.split('/').any(|c| c == ".."), "{p}");
                        assert!(!p.starts_with('/'), "{p}");
                    }
                }
            }
            _ => {}
        }
    }
    if data.len() >= 16 {
        let n = |i: usize| u32::from_le_bytes(data[i..i + 4].try_into().unwrap());
        let s = Standing {
            counts: FileCounts {
                submitted: u64::from(n(0)),
                finished: u64::from(n(4)),
                failed: u64::from(n(8)),
                cancelled: 0,
            },
            due: u64::from(n(12) & 0xff),
            listed: data[0] & 1 != 0,
            attempts: n(4),
            retries: n(8) % (MAX_RETRIES + 1),
            cancelled: data[1] & 1 != 0,
            running: data[2] & 1 != 0,
            expired: data[3] & 1 != 0,
        };
        let state = derive(&s);
        assert!(!s.cancelled || state == JobState::Cancelled);
        assert!(
            backoff(n(1).into(), n(0), f64::from(data[5]) / 255.0)
                <= BACKOFF_MAX_S + BACKOFF_MAX_S / 5
        );
        let _ = next_run(u64::from(n(0)) << 32, u64::from(n(4)), u64::from(n(8)));
    }
});

/// `spec` with every credential's capability set to `capability`: its
/// debug form must not depend on it (a path may well contain `lh1c_`).
fn with_capabilities(spec: &JobSpec, capability: &str) -> JobSpec {
    let mut spec = spec.clone();
    for end in [&mut spec.source, &mut spec.dest] {
        if let Some(c) = end.credential.as_mut() {
            c.capability = capability.to_string();
        }
    }
    spec
}
