//! The PostgreSQL work queue against a real server: publishing once,
//! leases that exclude each other, leases that expire, failures retried
//! then given up, one finishing rank.

use std::collections::HashSet;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use longhaul_fleet::queue::{Published, Queue, QueueError};
use longhaul_fleet::shard::Unit;
use longhaul_testkit::pg::{TempPostgres, Tls};

fn units(n: u32) -> Vec<Unit> {
    (0..n)
        .map(|i| Unit {
            first: i,
            end: i + 1,
            chunks: (i % 3 == 0).then_some([0, 2]),
            bytes: 100 + u64::from(i),
        })
        .collect()
}

#[test]
fn a_run_is_published_once_and_every_unit_is_done_exactly_once_by_four_workers() {
    let Some(pg) = TempPostgres::start() else {
        return;
    };
    let url = pg.url();
    let want = units(200);
    // Four ranks publish at once: one makes the run.
    let barrier = Arc::new(Barrier::new(4));
    let made: Vec<Published> = (0..4)
        .map(|_| {
            let (url, want, b) = (url.clone(), want.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut q = Queue::connect(&url, "r1").unwrap();
                b.wait();
                q.publish("h1", b"manifest", &want).unwrap()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    assert_eq!(
        made.iter().filter(|p| **p == Published::New).count(),
        1,
        "{made:?}"
    );
    // Four workers lease until nothing is left.
    let done: Arc<Mutex<Vec<i64>>> = Arc::default();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (url, done) = (url.clone(), done.clone());
            std::thread::spawn(move || {
                let mut q = Queue::connect(&url, "r1").unwrap();
                let me = format!("w{w}");
                loop {
                    let got = q.lease(&me, 7, Duration::from_secs(60)).unwrap();
                    if got.is_empty() {
                        break;
                    }
                    let ids: Vec<i64> = got.iter().map(|l| l.id).collect();
                    done.lock().unwrap().extend(&ids);
                    q.done(&me, &ids).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let done = done.lock().unwrap();
    let unique: HashSet<i64> = done.iter().copied().collect();
    assert_eq!(done.len(), 200, "no unit leased twice");
    assert_eq!(unique.len(), 200);
    let mut q = Queue::connect(&url, "r1").unwrap();
    let c = q.counts().unwrap();
    assert_eq!((c.todo, c.leased, c.done, c.failed), (0, 0, 200, 0));
    assert_eq!(c.bytes_done, want.iter().map(|u| u.bytes).sum::<u64>());
    let (hash, bytes) = q.manifest().unwrap().unwrap();
    assert_eq!((hash.as_str(), bytes.as_slice()), ("h1", &b"manifest"[..]));
    // Units come back as they went in.
    let mut q2 = Queue::connect(&url, "r2").unwrap();
    q2.publish("h2", b"m", &want).unwrap();
    let got = q2.lease("x", 1000, Duration::from_secs(60)).unwrap();
    let back: Vec<Unit> = got.into_iter().map(|l| l.unit).collect();
    assert_eq!(back, want);
}

#[test]
fn another_manifest_under_the_same_run_is_refused() {
    let Some(pg) = TempPostgres::start() else {
        return;
    };
    let mut q = Queue::connect(&pg.url(), "r").unwrap();
    assert_eq!(q.publish("a", b"x", &units(3)).unwrap(), Published::New);
    assert_eq!(
        q.publish("a", b"x", &units(3)).unwrap(),
        Published::Existing
    );
    let e = q.publish("b", b"y", &units(3)).unwrap_err();
    assert!(matches!(e, QueueError::ManifestDiffers { .. }), "{e}");
    assert!(e.to_string().contains("--run-id"), "{e}");
}

#[test]
fn a_dead_workers_lease_expires_and_another_takes_the_unit_while_a_renewed_one_holds() {
    let Some(pg) = TempPostgres::start() else {
        return;
    };
    let mut a = Queue::connect(&pg.url(), "r").unwrap();
    let mut b = Queue::connect(&pg.url(), "r").unwrap();
    a.publish("h", b"m", &units(2)).unwrap();
    let short = Duration::from_millis(1500);
    let held = a.lease("a", 2, short).unwrap();
    assert_eq!(held.len(), 2);
    assert!(
        b.lease("b", 2, short).unwrap().is_empty(),
        "leased units are not leased twice"
    );
    // `a` keeps unit 0 alive and "dies" holding unit 1.
    let started = std::time::Instant::now();
    let mut taken = Vec::new();
    while started.elapsed() < Duration::from_secs(30) {
        assert_eq!(a.renew("a", &[held[0].id], short).unwrap(), 1);
        taken.extend(b.lease("b", 2, short).unwrap());
        if !taken.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(taken.len(), 1, "only the expired unit moves: {taken:?}");
    assert_eq!(taken[0].id, held[1].id);
    assert_eq!(taken[0].attempts, 2);
    // The dead worker's renewal no longer holds it.
    assert_eq!(a.renew("a", &[held[1].id], short).unwrap(), 0);
}

#[test]
fn a_failing_unit_is_retried_then_failed_for_good_and_one_rank_finishes() {
    let Some(pg) = TempPostgres::start() else {
        return;
    };
    let mut q = Queue::connect(&pg.url(), "r").unwrap();
    q.publish("h", b"m", &units(1)).unwrap();
    for attempt in 1..=3 {
        let got = q.lease("w", 1, Duration::from_secs(60)).unwrap();
        assert_eq!(got.len(), 1, "attempt {attempt}");
        q.failed("w", got[0].id, "disk full", 3).unwrap();
    }
    assert!(q.lease("w", 1, Duration::from_secs(60)).unwrap().is_empty());
    let c = q.counts().unwrap();
    assert_eq!((c.todo, c.failed), (0, 1));
    let winners: usize = (0..4)
        .map(|w| {
            let mut q = Queue::connect(&pg.url(), "r").unwrap();
            usize::from(q.claim_finalize(&format!("w{w}")).unwrap())
        })
        .sum();
    assert_eq!(winners, 1);
    q.report_rank(2, "w", &serde_json::json!({"bytes": 5}))
        .unwrap();
    q.report_rank(2, "w2", &serde_json::json!({"bytes": 6}))
        .unwrap();
    let r = q.rank_reports().unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].2["bytes"], 6, "a rank run again replaces its report");
    assert!(q.round_trips() > 0);
}

#[test]
fn bad_urls_and_plaintext_passwords_are_refused_with_what_to_do() {
    let e = Queue::connect("postgres://u:secret@db.example.org/x", "r")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("plaintext") && !e.contains("secret"), "{e}");
    let e = Queue::connect("postgres://127.0.0.1:1/x", "r")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("cannot reach PostgreSQL at 127.0.0.1:1"), "{e}");
    let e = Queue::connect("nonsense://", "r")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("postgres://"), "{e}");
}

/// `sslmode=verify-full` with the site's CA: the queue's connection is
/// encrypted; a CA that did not sign the server's certificate is refused
/// with what to check; a mode that would fall back to plaintext is refused.
#[test]
fn the_queue_speaks_verified_tls_and_refuses_a_server_it_cannot_verify() {
    let Some(pg) = TempPostgres::start_tls() else {
        return;
    };
    let ca = pg.ca.clone().expect("a TLS server has its CA");
    let url = |ca: &std::path::Path| {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
            pg.port,
            ca.display()
        )
    };
    let mut q = Queue::connect(&url(&ca), "tls").unwrap();
    assert!(q.encrypted().unwrap(), "the connection is TLS");
    let mut plain = Queue::connect(&pg.url(), "tls").unwrap();
    assert!(!plain.encrypted().unwrap(), "sslmode absent: plaintext");

    let other = tempfile::TempDir::new().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let other_ca = other.path().join("other.pem");
    std::fs::write(&other_ca, p.self_signed(&key).unwrap().pem()).unwrap();
    let e = Queue::connect(&url(&other_ca), "tls")
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("cannot reach PostgreSQL") && e.contains("sslrootcert"),
        "{e}"
    );
    let e = Queue::connect(
        &format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=prefer",
            pg.port
        ),
        "tls",
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("verify-full"), "{e}");
}

/// A server that asks for a client certificate: the queue without one is
/// refused; with `sslcert` and `sslkey` it connects, over TLS.
#[test]
fn the_queue_shows_its_client_certificate_when_the_server_asks() {
    let Some(pg) = TempPostgres::start_with(Tls::ClientCerts) else {
        return;
    };
    let ca = pg.ca.clone().unwrap();
    let (cert, key) = pg.client.clone().unwrap();
    let base = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        pg.port,
        ca.display()
    );
    let e = Queue::connect(&base, "certs").err().unwrap().to_string();
    assert!(
        e.contains("cannot reach PostgreSQL") && e.contains("sslcert=FILE and sslkey=FILE"),
        "{e}"
    );
    let with = format!("{base}&sslcert={}&sslkey={}", cert.display(), key.display());
    let mut q = Queue::connect(&with, "certs").unwrap();
    assert!(q.encrypted().unwrap());
    let e = Queue::connect(&format!("{base}&sslcert={}", cert.display()), "certs")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("together"), "{e}");
}

/// Every connection carries longhaul's limits (docs/SCALE.md): a
/// statement stuck behind another session's lock ends in an error naming
/// the database and where to look, and a URL's own `options` win over
/// longhaul's.
#[test]
fn a_statement_stuck_behind_a_lock_ends_in_an_error_that_says_where_to_look() {
    let Some(pg) = TempPostgres::start() else {
        return;
    };
    let url = pg.url();
    let (mut c, _) = longhaul_fleet::queue::open_client(&url).unwrap();
    for (setting, want) in [
        ("statement_timeout", "10min"),
        ("lock_timeout", "1min"),
        ("idle_in_transaction_session_timeout", "10min"),
    ] {
        let got: String = c.query_one(&format!("SHOW {setting}"), &[]).unwrap().get(0);
        assert_eq!(got, want, "{setting}");
    }
    let mut q = Queue::connect(&url, "r1").unwrap();
    q.publish("h1", b"manifest", &units(3)).unwrap();
    let short = format!("{url}?options=-c%20lock_timeout%3D1s");
    let (mut c, _) = longhaul_fleet::queue::open_client(&short).unwrap();
    let got: String = c.query_one("SHOW lock_timeout", &[]).unwrap().get(0);
    assert_eq!(got, "1s", "the URL's own setting wins");
    let mut q = Queue::connect(&short, "r1").unwrap();
    let mut holder = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut tx = holder.transaction().unwrap();
    tx.batch_execute("LOCK TABLE longhaul_work IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let e = q.counts().unwrap_err().to_string();
    assert!(
        e.contains(&format!("127.0.0.1:{}/postgres", pg.port))
            && e.contains("lock_timeout")
            && e.contains("pg_stat_activity"),
        "{e}"
    );
    tx.rollback().unwrap();
    assert_eq!(q.counts().unwrap().todo, 3);
}
