//! A peer that speaks the transfer protocol badly loses its own transfer,
//! promptly and without taking a server thread down with it.

// Test scenarios are held to no length: only shipped code is (clippy.toml).
#![allow(clippy::too_many_lines)]
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_engine::net::conn::FramedConn;
use longhaul_engine::server::{ServeConfig, Server};
use longhaul_engine::xfer::storage::Local;
use longhaul_engine::xfer::Export;
use longhaul_proto::frame::MAGIC;
use longhaul_proto::msg::{Direction, Hello, Message, Role};
use longhaul_proto::xfer::*;

fn hello(role: Role) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    Message::Hello(Hello {
        min_version: longhaul_proto::msg::PROTOCOL_VERSION,
        max_version: longhaul_proto::msg::PROTOCOL_VERSION,
        software: "hostile test".into(),
        role,
        token: None,
        token_id: None,
    })
    .encode(&mut b)
    .unwrap();
    b
}

fn next(c: &mut FramedConn) -> Message {
    c.recv_until(Instant::now() + Duration::from_secs(5))
        .expect("connection alive")
        .expect("an answer within 5 s")
}

/// Opens a push of one announced 10-byte file and returns the control
/// connection and the data stream, after the sink said it wants the file.
fn start_push(addr: SocketAddr) -> (FramedConn, TcpStream) {
    let (mut c, data) = open_push(addr);
    c.send(&Message::Entries(Entries {
        entries: vec![file_entry(1, 10, 1 << 20)],
        failed: Vec::new(),
    }))
    .unwrap();
    assert!(matches!(next(&mut c), Message::Wants(_)));
    (c, data)
}

fn file_entry(id: u64, size: u64, chunk_size: u64) -> Entry {
    Entry {
        id,
        path: format!("f{id}.bin"),
        kind: Kind::File,
        size,
        mode: 0o644,
        mtime_ns: 0,
        target: None,
        chunk_size,
        sparse: false,
        incomplete: false,
        digest: None,
        part: None,
    }
}

/// Opens a push to `f.bin` (request accepted, one data stream attached).
fn open_push(addr: SocketAddr) -> (FramedConn, TcpStream) {
    push_to(addr, "f.bin")
}

fn hostile_server(dir: &std::path::Path) -> longhaul_engine::server::ServerHandle {
    Server::bind(
        &[SocketAddr::from(([127, 0, 0, 1], 0))],
        ServeConfig {
            exports: vec![Export {
                name: "data".into(),
                root: dir.canonicalize().unwrap(),
                read_only: false,
                public: false,
            }],
            storage: Arc::new(Local),
            state_dir: dir.join("state"),
            // Hostile frames on raw TCP: the framing, not TLS, is under test.
            allow_plaintext: true,
            open_access: true,
            ..ServeConfig::default()
        },
    )
    .unwrap()
    .spawn()
}

#[test]
fn announced_sizes_cannot_make_the_sink_allocate_without_bound() {
    let dir = std::env::temp_dir().join(format!("lh-hostile-alloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = hostile_server(&dir);
    let (mut c, _data) = open_push(s.addr());
    // A petabyte in 64 KiB chunks, chunks of one byte, and a sane file.
    c.send(&Message::Entries(Entries {
        entries: vec![
            file_entry(1, 1 << 50, 64 << 10),
            file_entry(2, 1 << 20, 1),
            file_entry(3, 10, 1 << 20),
        ],
        failed: Vec::new(),
    }))
    .unwrap();
    let Message::Wants(w) = next(&mut c) else {
        panic!("no wants")
    };
    match &w.wants[..] {
        [Want::Fail { id: 1, error: e1 }, Want::Fail { id: 2, error: e2 }, Want::Send { id: 3, .. }] =>
        {
            assert!(e1.contains("larger --chunk"), "{e1}");
            assert!(e2.contains("outside 64 KiB"), "{e2}");
        }
        other => panic!("unexpected wants: {other:?}"),
    }
    s.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn chunk_index_past_the_end_ends_the_transfer_promptly() {
    let dir = std::env::temp_dir().join(format!("lh-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = hostile_server(&dir);
    for (index, offset) in [(5u32, 5u64 << 20), (u32::MAX, u64::from(u32::MAX) << 20)] {
        let (mut c, mut data) = start_push(s.addr());
        let header = ChunkHeader {
            zero: false,
            compressed: false,
            file: 1,
            index,
            offset,
            len: 0,
        };
        data.write_all(&header.encode()).unwrap();
        data.write_all(&trailer(b"").encode()).unwrap();
        let started = Instant::now();
        // The sink reports the broken transfer (or closes); it does not hang.
        let end = c.recv_until(Instant::now() + Duration::from_secs(5));
        match end {
            Ok(Some(Message::TransferDone(r))) => {
                assert!(!r.failed.is_empty(), "{r:?}");
                assert!(r.failed[0].error.contains("does not match"), "{r:?}");
            }
            Ok(Some(m)) => panic!("unexpected {}", m.name()),
            Ok(None) => panic!("no answer in 5 s: the sink hung"),
            Err(_) => {}
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!dir.join("f.bin").exists());
    }
    // The server still serves.
    let (mut c, _data) = start_push(s.addr());
    c.send(&Message::EntriesEnd(EntriesEnd { files: 1 }))
        .unwrap();
    s.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A control connection that has been welcomed.
fn control(addr: SocketAddr) -> FramedConn {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.write_all(&hello(Role::Control)).unwrap();
    let mut c = FramedConn::new(Box::new(tcp), addr.to_string());
    assert!(matches!(next(&mut c), Message::Welcome(_)));
    c
}

/// A push to `dest` in the export, accepted, with its one data stream.
fn push_to(addr: SocketAddr, dest: &str) -> (FramedConn, TcpStream) {
    push_with(addr, dest, false)
}

/// A push to `dest`, asking for bundles or not (an older client).
fn push_with(addr: SocketAddr, dest: &str, bundles: bool) -> (FramedConn, TcpStream) {
    push_asking(addr, dest, |t| t.bundles = bundles)
}

/// A push whose request `ask` adjusts; the server must agree to its bundles.
fn push_asking(
    addr: SocketAddr,
    dest: &str,
    ask: impl FnOnce(&mut TransferRequest),
) -> (FramedConn, TcpStream) {
    let mut c = control(addr);
    let Message::TransferRequest(mut t) = request(Op::Push, dest, vec![]) else {
        unreachable!()
    };
    ask(&mut t);
    let bundles = t.bundles;
    c.send(&Message::TransferRequest(t)).unwrap();
    let Message::TransferAccept(a) = next(&mut c) else {
        panic!("no accept")
    };
    assert_eq!(a.bundles, bundles, "the server agrees to what was asked");
    let mut data = TcpStream::connect(addr).unwrap();
    data.write_all(&hello(Role::Data {
        token: a.token,
        stream: 0,
        direction: Direction::Up,
    }))
    .unwrap();
    (c, data)
}

fn request(op: Op, dest: &str, sources: Vec<String>) -> Message {
    Message::TransferRequest(TransferRequest {
        op,
        export: "data".into(),
        dest: dest.into(),
        sources,
        source_count: 1,
        recursive: true,
        preserve: false,
        streams: 1,
        chunk_size: Some(1 << 20),
        force: false,
        sync: None,
        dry_run: false,
        verify: false,
        contents: false,
        dest_dir: false,
        mkpath: false,
        direct: false,
        tuning: Default::default(),
        bundles: false,
        parts: false,
        sealed: false,
        source_dir: false,
        filter: Vec::new(),
        compress: None,
        defer_full: false,
        tag_checks: false,
    })
}

/// Every file below `dir`, relative, sorted (links not followed).
fn listing(dir: &std::path::Path) -> Vec<String> {
    fn walk(base: &std::path::Path, d: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                walk(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The table of traversal payloads, as a listing path, a pull
/// source, a push destination and a pushed entry's path: each is refused,
/// nothing lands outside the export, and the server serves on.
#[test]
fn traversal_payloads_are_refused_and_nothing_lands_outside() {
    let base = std::env::temp_dir().join(format!("lh-traversal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (export, outside) = (base.join("export"), base.join("outside"));
    std::fs::create_dir_all(export.join("a")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), b"secret").unwrap();
    std::os::unix::fs::symlink(&outside, export.join("up")).unwrap();
    std::os::unix::fs::symlink("/", export.join("slash")).unwrap();
    let s = hostile_server(&export);
    let long = "n".repeat(4096);
    let payloads = [
        "../x",
        "../outside/secret.txt",
        "/etc/passwd",
        "a/../../b",
        "a/../../outside/secret.txt",
        "up/secret.txt",
        "up/new.txt",
        "slash/etc/passwd",
        "slash/tmp/lh-escape",
        "a\0b",
        long.as_str(),
    ];
    let refused = |m: Message, what: &str, p: &str| match m {
        Message::Refuse(r) => assert!(!r.message.is_empty()),
        other => panic!("{what} {p:?} not refused: {other:?}"),
    };
    for p in payloads {
        let mut c = control(s.addr());
        c.send(&Message::ListRequest(ListRequest {
            export: "data".into(),
            path: p.into(),
            recursive: false,
        }))
        .unwrap();
        refused(next(&mut c), "listing", p);
        let mut c = control(s.addr());
        c.send(&request(Op::Pull, "", vec![p.into()])).unwrap();
        refused(next(&mut c), "pull of", p);
        let mut c = control(s.addr());
        c.send(&request(Op::Push, p, vec![])).unwrap();
        refused(next(&mut c), "push to", p);
    }
    // Pushed entries with those paths, into the export's root: each one
    // fails on its own (or is dropped lexically), none is written.
    let (mut c, data) = push_to(s.addr(), "");
    let entries: Vec<Entry> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| Entry {
            path: p.to_string(),
            ..file_entry(i as u64 + 1, 6, 1 << 20)
        })
        .collect();
    let n = entries.len();
    c.send(&Message::Entries(Entries {
        entries,
        failed: Vec::new(),
    }))
    .unwrap();
    let Message::Wants(w) = next(&mut c) else {
        panic!("no wants")
    };
    for want in &w.wants {
        assert!(
            matches!(want, Want::Fail { .. }),
            "a traversal entry was accepted: {want:?}"
        );
    }
    assert_eq!(w.wants.len(), n);
    drop((c, data));
    assert_eq!(listing(&outside), vec!["secret.txt".to_string()]);
    assert_eq!(
        std::fs::read(outside.join("secret.txt")).unwrap(),
        b"secret"
    );
    assert!(!std::path::Path::new("/tmp/lh-escape").exists());
    // The server still takes a legitimate push.
    let (mut c, _data) = start_push(s.addr());
    c.send(&Message::EntriesEnd(EntriesEnd { files: 1 }))
        .unwrap();
    s.shutdown();
    let _ = std::fs::remove_dir_all(&base);
}

/// A directory swapped for a symlink to the outside after the sink opened
/// it: the file still lands in the directory that was checked.
#[test]
fn a_symlink_swapped_in_mid_transfer_leads_nowhere() {
    let base = std::env::temp_dir().join(format!("lh-swap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (export, outside) = (base.join("export"), base.join("outside"));
    std::fs::create_dir_all(&export).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let s = hostile_server(&export);
    let (mut c, mut data) = push_to(s.addr(), "");
    let dir = Entry {
        path: "d".into(),
        kind: Kind::Dir,
        size: 0,
        mode: 0o755,
        ..file_entry(1, 0, 1 << 20)
    };
    let file = Entry {
        path: "d/f".into(),
        ..file_entry(2, 10, 1 << 20)
    };
    c.send(&Message::Entries(Entries {
        entries: vec![dir, file],
        failed: Vec::new(),
    }))
    .unwrap();
    let Message::Wants(w) = next(&mut c) else {
        panic!("no wants")
    };
    assert!(matches!(w.wants[..], [Want::Send { id: 2, .. }]), "{w:?}");
    // The swap, between the check and the use.
    std::fs::rename(export.join("d"), base.join("moved")).unwrap();
    std::os::unix::fs::symlink(&outside, export.join("d")).unwrap();
    let payload = b"0123456789";
    let header = ChunkHeader {
        zero: false,
        compressed: false,
        file: 2,
        index: 0,
        offset: 0,
        len: 10,
    };
    data.write_all(&header.encode()).unwrap();
    data.write_all(payload).unwrap();
    data.write_all(&trailer(payload).encode()).unwrap();
    // The source read it whole and it did not change: the sink may finish it.
    c.send(&Message::FileSealed(FileSealed { id: 2, resends: 0 }))
        .unwrap();
    c.send(&Message::EntriesEnd(EntriesEnd { files: 1 }))
        .unwrap();
    loop {
        match next(&mut c) {
            Message::FileDone(d) => {
                assert_eq!(d.id, 2);
                assert!(d.error.is_none(), "{d:?}");
            }
            Message::TransferDone(_) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(listing(&outside).is_empty(), "{:?}", listing(&outside));
    assert_eq!(std::fs::read(base.join("moved/f")).unwrap(), payload);
    s.shutdown();
    let _ = std::fs::remove_dir_all(&base);
}

/// A bundle frame of `records` (file id, bytes, hash).
/// The trailer of a file's only chunk (its check, and its BLAKE3).
fn trailer(data: &[u8]) -> Trailer {
    Trailer {
        check: longhaul_proto::digest::check(data),
        value: *blake3::hash(data).as_bytes(),
    }
}

fn bundle(records: &[(u64, &[u8], Trailer)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (id, data, t) in records {
        push_bundle_record(&mut body, *id, data, t);
    }
    let mut wire = BundleHeader {
        count: records.len() as u32,
        body_len: body.len() as u32,
    }
    .encode()
    .to_vec();
    wire.extend_from_slice(&body);
    wire
}

/// Announces directory `d` and files `d/f1..` of `sizes` (ids 2..), and
/// waits for the sink's answers.
fn announce_small(c: &mut FramedConn, sizes: &[u64]) {
    let mut entries = vec![Entry {
        kind: Kind::Dir,
        path: "d".into(),
        mode: 0o755,
        ..file_entry(1, 0, 1 << 20)
    }];
    for (i, &size) in sizes.iter().enumerate() {
        let id = i as u64 + 2;
        entries.push(Entry {
            path: format!("d/f{id}"),
            ..file_entry(id, size, 1 << 20)
        });
    }
    c.send(&Message::Entries(Entries {
        entries,
        failed: Vec::new(),
    }))
    .unwrap();
    let Message::Wants(w) = next(c) else {
        panic!("no wants")
    };
    assert!(
        w.wants.iter().all(|w| matches!(w, Want::Send { .. })),
        "{w:?}"
    );
}

/// Messages until `done` says enough, within 5 s each.
fn until(c: &mut FramedConn, mut done: impl FnMut(&Message) -> bool) -> Vec<Message> {
    let mut out = Vec::new();
    loop {
        let m = next(c);
        let stop = done(&m);
        out.push(m);
        if stop {
            return out;
        }
    }
}

fn done_ids(msgs: &[Message]) -> Vec<u64> {
    let mut ids = Vec::new();
    for m in msgs {
        match m {
            Message::FileDone(d) => ids.push(d.id),
            Message::FilesDone(ds) => ids.extend(ds.items.iter().map(|d| d.id)),
            _ => {}
        }
    }
    ids.sort_unstable();
    ids
}

#[test]
fn a_bundle_lands_its_files_and_a_damaged_record_is_asked_again_alone() {
    let dir = std::env::temp_dir().join(format!("lh-hostile-bundle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = hostile_server(&dir);
    let (mut c, mut data) = push_with(s.addr(), "out", true);
    announce_small(&mut c, &[10, 5, 0]);
    let (a, b): (&[u8], &[u8]) = (b"0123456789", b"abcde");
    let mut bad = trailer(b);
    bad.check[0] ^= 1;
    let frame = bundle(&[(2, a, trailer(a)), (3, b, bad), (4, b"", trailer(b""))]);
    data.write_all(&frame).unwrap();
    // The same bundle again: every record is dropped or asked again.
    data.write_all(&frame).unwrap();
    c.send(&Message::FilesSealed(FilesSealed {
        items: [2, 3, 4].map(|id| FileSealed { id, resends: 0 }).to_vec(),
    }))
    .unwrap();
    let mut seen = Vec::new();
    until(&mut c, |m| {
        seen.push(m.clone());
        let resends = seen
            .iter()
            .filter(|m| matches!(m, Message::Resend(Resend { id: 3, index: 0 })))
            .count();
        resends == 2 && done_ids(&seen) == [2, 4]
    });
    assert!(
        seen.iter().all(|m| matches!(
            m,
            Message::Resend(_) | Message::FileDone(_) | Message::FilesDone(_)
        )),
        "{seen:?}"
    );
    // Each file's digest is as with chunk frames: its BLAKE3 (what
    // `cp --digests` writes and `b3sum` prints).
    let digest_of = |data: &[u8]| blake3::hash(data).to_hex().to_string();
    let digests: Vec<(u64, Option<String>)> = seen
        .iter()
        .flat_map(|m| match m {
            Message::FileDone(d) => vec![d.clone()],
            Message::FilesDone(ds) => ds.items.clone(),
            _ => vec![],
        })
        .map(|d| (d.id, d.digest))
        .collect();
    for (id, data) in [(2, a), (4, &b""[..])] {
        assert!(
            digests.contains(&(id, Some(digest_of(data)))),
            "file {id}: {digests:?}"
        );
    }
    // The damaged file, sent again alone as a chunk frame.
    let header = ChunkHeader {
        zero: false,
        compressed: false,
        file: 3,
        index: 0,
        offset: 0,
        len: 5,
    };
    data.write_all(&header.encode()).unwrap();
    data.write_all(b).unwrap();
    data.write_all(&trailer(b).encode()).unwrap();
    c.send(&Message::FileSealed(FileSealed { id: 3, resends: 2 }))
        .unwrap();
    let msgs = until(&mut c, |m| done_ids(std::slice::from_ref(m)) == [3]);
    assert!(msgs.iter().all(|m| !matches!(m, Message::TransferDone(_))));
    c.send(&Message::EntriesEnd(EntriesEnd { files: 3 }))
        .unwrap();
    let msgs = until(&mut c, |m| matches!(m, Message::TransferDone(_)));
    let Some(Message::TransferDone(r)) = msgs.last() else {
        unreachable!()
    };
    assert!(r.failed.is_empty(), "{r:?}");
    assert_eq!(r.files, 3);
    let out = dir.join("out");
    assert_eq!(std::fs::read(out.join("f2")).unwrap(), a);
    assert_eq!(std::fs::read(out.join("f3")).unwrap(), b);
    assert_eq!(std::fs::read(out.join("f4")).unwrap(), b"");
    s.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bundle_record_off_the_plan_or_unagreed_ends_the_transfer() {
    let dir = std::env::temp_dir().join(format!("lh-hostile-bundle2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = hostile_server(&dir);
    let eleven: &[u8] = b"01234567890";
    let frame = bundle(&[(2, eleven, trailer(eleven))]);
    // A record longer than its file was announced; then a bundle an
    // older client's transfer never agreed to; then a header over the caps.
    let mut huge = frame.clone();
    huge[5..9].copy_from_slice(&u32::MAX.to_be_bytes());
    for (bundles, bytes, why) in [
        (true, &frame, "bundle record of 11 bytes"),
        (false, &frame, "not agreed"),
        (true, &huge, "longer than 1 MiB"),
    ] {
        let (mut c, mut data) = push_with(s.addr(), "out", bundles);
        announce_small(&mut c, &[10]);
        data.write_all(bytes).unwrap();
        let started = Instant::now();
        match c.recv_until(Instant::now() + Duration::from_secs(5)) {
            Ok(Some(Message::TransferDone(r))) => {
                assert!(r.failed.iter().any(|f| f.error.contains(why)), "{r:?}");
            }
            Ok(Some(m)) => panic!("unexpected {}", m.name()),
            Ok(None) => panic!("no answer in 5 s: the sink hung"),
            Err(_) => {}
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!dir.join("out/f2").exists());
    }
    s.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Parts of files (a fleet's ranks) with ranges no file has, or on
/// entries that are not files: each refused on its own, nothing written,
/// and a part named where a link was planted never writes through it.
#[test]
fn parts_out_of_range_or_through_links_are_refused_one_by_one() {
    let base = std::env::temp_dir().join(format!("lh-parts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (export, outside) = (base.join("export"), base.join("outside"));
    std::fs::create_dir_all(&export).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("victim"), b"keep").unwrap();
    // A link where the shared partial file of `big` would be.
    std::os::unix::fs::symlink(outside.join("victim"), export.join(".big.lhpart")).unwrap();
    let s = hostile_server(&export);
    let mut c = control(s.addr());
    let Message::TransferRequest(mut t) = request(Op::Push, "", vec![]) else {
        unreachable!()
    };
    t.parts = true;
    c.send(&Message::TransferRequest(t)).unwrap();
    let Message::TransferAccept(a) = next(&mut c) else {
        panic!("no accept")
    };
    assert!(a.parts, "a server takes parts when asked, on a push");
    let mut data = TcpStream::connect(s.addr()).unwrap();
    data.write_all(&hello(Role::Data {
        token: a.token,
        stream: 0,
        direction: Direction::Up,
    }))
    .unwrap();
    // 4 MiB in 1 MiB chunks: 4 chunks.
    let file = |id: u64, path: &str, part: [u32; 2]| Entry {
        path: path.into(),
        part: Some(part),
        ..file_entry(id, 4 << 20, 1 << 20)
    };
    let entries = vec![
        file(1, "a", [0, 5]),
        file(2, "b", [3, 3]),
        file(3, "c", [u32::MAX - 1, u32::MAX]),
        Entry {
            kind: Kind::Dir,
            ..file(4, "d", [0, 1])
        },
        file(5, "big", [0, 2]),
    ];
    c.send(&Message::Entries(Entries {
        entries,
        failed: Vec::new(),
    }))
    .unwrap();
    let Message::Wants(w) = next(&mut c) else {
        panic!("no wants")
    };
    for want in &w.wants {
        assert!(matches!(want, Want::Fail { .. }), "accepted: {want:?}");
    }
    // The directory is a directory (its part means nothing); four files.
    assert_eq!(w.wants.len(), 4, "{w:?}");
    drop((c, data));
    assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"keep");
    for n in ["a", "b", "c"] {
        assert!(!export.join(n).exists(), "{n} was made");
    }
    s.shutdown();
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_source_whose_values_lie_is_caught_by_verify_which_recomputes_them() {
    // The sink checks XXH3-128 and records the source's BLAKE3 values
    // (PROTOCOL.md 13.5b): a dishonest source can send bytes whose check
    // matches and claim another file's value. Without --verify that claim
    // is what is recorded (the documented limit); with it the sink
    // recomputes every value from what it wrote and the file fails.
    let (real, claimed): (&[u8], &[u8]) = (b"hello", b"HELLO");
    for verify in [false, true] {
        let dir =
            std::env::temp_dir().join(format!("lh-hostile-lie-{verify}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = hostile_server(&dir);
        let (mut c, mut data) = push_asking(s.addr(), "out", |t| t.verify = verify);
        announce_small(&mut c, &[5]);
        let header = ChunkHeader {
            zero: false,
            compressed: false,
            file: 2,
            index: 0,
            offset: 0,
            len: 5,
        };
        let lie = Trailer {
            check: longhaul_proto::digest::check(real),
            value: *blake3::hash(claimed).as_bytes(),
        };
        data.write_all(&header.encode()).unwrap();
        data.write_all(real).unwrap();
        data.write_all(&lie.encode()).unwrap();
        c.send(&Message::FileSealed(FileSealed { id: 2, resends: 0 }))
            .unwrap();
        c.send(&Message::EntriesEnd(EntriesEnd { files: 1 }))
            .unwrap();
        let msgs = until(&mut c, |m| matches!(m, Message::TransferDone(_)));
        let done: Vec<FileDone> = msgs
            .iter()
            .flat_map(|m| match m {
                Message::FileDone(d) => vec![d.clone()],
                Message::FilesDone(ds) => ds.items.clone(),
                _ => vec![],
            })
            .filter(|d| d.id == 2)
            .collect();
        // The entries go onto the destination: d/f2 lands as out/f2.
        let landed = dir.join("out/f2");
        if verify {
            let error = done
                .iter()
                .find_map(|d| d.error.clone())
                .unwrap_or_default();
            assert!(error.contains("verification failed"), "{done:?}");
            assert!(!landed.exists(), "a file whose values lie must not land");
        } else {
            let claim = blake3::hash(claimed).to_hex().to_string();
            assert!(
                done.iter()
                    .any(|d| d.digest.as_deref() == Some(claim.as_str())),
                "{done:?}"
            );
            assert_eq!(std::fs::read(&landed).unwrap(), real);
        }
        s.shutdown();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Include/exclude rules a peer sends (issue 32): too many, too long, or
/// not a rule, each is refused before anything moves, and the server
/// serves on; rules that only exclude can never reach outside the export.
#[test]
fn hostile_filter_rules_are_refused() {
    let base = std::env::temp_dir().join(format!("lh-filter-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let export = base.join("export");
    std::fs::create_dir_all(export.join("a")).unwrap();
    let s = hostile_server(&export);
    let long = format!(
        "- {}",
        "*".repeat(longhaul_engine::xfer::filter::MAX_PATTERN + 1)
    );
    let payloads: Vec<Vec<String>> = vec![
        vec!["- x".into(); longhaul_engine::xfer::filter::MAX_RULES + 1],
        vec![long],
        vec!["x".into()],
        vec!["- [unclosed".into()],
        vec!["- ".into()],
    ];
    for rules in payloads {
        for op in [Op::Pull, Op::Push] {
            let mut c = control(s.addr());
            let Message::TransferRequest(mut t) = request(op, "in", vec!["a".into()]) else {
                unreachable!()
            };
            t.filter = rules.clone();
            c.send(&Message::TransferRequest(t)).unwrap();
            match next(&mut c) {
                Message::Refuse(r) => assert!(r.message.contains("filter"), "{}", r.message),
                other => panic!("{op:?} with bad rules not refused: {other:?}"),
            }
        }
    }
    // Served on.
    let mut c = control(s.addr());
    c.send(&Message::ListRequest(ListRequest {
        export: "data".into(),
        path: "".into(),
        recursive: false,
    }))
    .unwrap();
    assert!(!matches!(next(&mut c), Message::Refuse(_)));
    assert!(!export.join("in").exists());
    let _ = std::fs::remove_dir_all(&base);
}

/// The rest of a transfer the sink broke: a `TransferDone` whose failure
/// holds `needle` (or the connection closed), within 5 s.
fn broken_with(c: &mut FramedConn, needle: &str) -> String {
    match c.recv_until(Instant::now() + Duration::from_secs(5)) {
        Ok(Some(Message::TransferDone(r))) => {
            let e = r
                .failed
                .first()
                .map(|f| f.error.clone())
                .unwrap_or_default();
            assert!(e.contains(needle), "{needle}: {r:?}");
            e
        }
        Ok(Some(m)) => panic!("unexpected {}", m.name()),
        Ok(None) => panic!("no answer in 5 s: the sink hung"),
        Err(e) => panic!("closed without saying why: {e}"),
    }
}

/// A hostile source's compressed chunk frames (`cp -z`, PROTOCOL.md
/// 13.5c): a zstd bomb (128 frames of 512 KiB of zeros, 64 MiB in a few
/// KiB) behind a block of 512 KiB, a frame that decodes to 512 KiB behind
/// a block of 1000 bytes, one that decodes to fewer bytes than its block,
/// a stored block of the wrong length, and a compressed frame on a
/// transfer that did not agree to them. Each ends its transfer with an
/// error naming the chunk and the file; the decoder writes only into the
/// block's room (no memory grows), nothing lands, and the server serves on.
#[test]
fn hostile_compressed_chunks_end_the_transfer_naming_the_file() {
    use longhaul_proto::xfer::compress::{Block, Encoder, BLOCK};
    let dir = std::env::temp_dir().join(format!("lh-hostile-z-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let s = hostile_server(&dir);
    let mut enc = Encoder::new(1).unwrap();
    let zeros = enc.compress(&vec![0u8; BLOCK]).unwrap().to_vec();
    let bomb: Vec<u8> = zeros
        .iter()
        .copied()
        .cycle()
        .take(zeros.len() * 128)
        .collect();
    let text: Vec<u8> = b"hostile text ".iter().copied().cycle().take(500).collect();
    let short = enc.compress(&text).unwrap().to_vec();
    // (file size, the payload after the header, what the error says)
    let block = |b: Block, bytes: &[u8]| [&b.encode()[..], bytes].concat();
    let cases: Vec<(u64, Vec<u8>, &str)> = vec![
        (
            BLOCK as u64,
            block(Block::Compressed(bomb.len() as u32), &bomb),
            "does not decode within its declared length",
        ),
        (
            1000,
            block(Block::Compressed(zeros.len() as u32), &zeros),
            "does not decode within its declared length",
        ),
        (
            1000,
            block(Block::Compressed(short.len() as u32), &short),
            "decodes to fewer bytes",
        ),
        (
            1000,
            block(Block::Stored(999), &[7u8; 999]),
            "stored block of a length other than its own",
        ),
    ];
    for (size, payload, needle) in cases {
        let (mut c, mut data) = push_asking(s.addr(), "", |t| t.compress = Some(1));
        c.send(&Message::Entries(Entries {
            entries: vec![file_entry(1, size, 1 << 20)],
            failed: Vec::new(),
        }))
        .unwrap();
        assert!(matches!(next(&mut c), Message::Wants(_)));
        let header = ChunkHeader {
            zero: false,
            compressed: true,
            file: 1,
            index: 0,
            offset: 0,
            len: size.min(BLOCK as u64) as u32,
        };
        data.write_all(&header.encode()).unwrap();
        // The sink may stop reading once it sees the lie.
        let _ = data.write_all(&payload);
        let _ = data.write_all(&trailer(&[]).encode());
        let e = broken_with(&mut c, needle);
        assert!(e.contains("chunk 0") && e.contains("f1.bin"), "{e}");
        assert!(!dir.join("f1.bin").exists());
    }
    // Not agreed: refused as a frame that was not negotiated.
    let (mut c, mut data) = push_to(s.addr(), "");
    c.send(&Message::Entries(Entries {
        entries: vec![file_entry(1, 1000, 1 << 20)],
        failed: Vec::new(),
    }))
    .unwrap();
    assert!(matches!(next(&mut c), Message::Wants(_)));
    let header = ChunkHeader {
        zero: false,
        compressed: true,
        file: 1,
        index: 0,
        offset: 0,
        len: 1000,
    };
    data.write_all(&header.encode()).unwrap();
    let _ = data.write_all(&[0u8; 1004]);
    broken_with(&mut c, "a compressed chunk frame, which was not agreed");
    // The server still serves.
    let (mut c, _data) = start_push(s.addr());
    c.send(&Message::EntriesEnd(EntriesEnd { files: 1 }))
        .unwrap();
    s.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Asks to push `out` with tag checks on control connection `c`, and
/// returns the server's answer.
fn tag_checked_push(c: &mut FramedConn) -> TransferAccept {
    let Message::TransferRequest(mut t) = request(Op::Push, "out", vec![]) else {
        unreachable!()
    };
    t.tag_checks = true;
    c.send(&Message::TransferRequest(t)).unwrap();
    let Message::TransferAccept(a) = next(c) else {
        panic!("no accept")
    };
    a
}

/// Joins a plaintext data stream to the push `token` names and sends a
/// chunk of bytes that are not the file's, with the check a tag-checked
/// stream would carry: the sink must check them still, and ask again.
fn forged_chunk_is_asked_again(
    c: &mut FramedConn,
    addr: SocketAddr,
    token: String,
    dir: &std::path::Path,
) {
    let mut data = TcpStream::connect(addr).unwrap();
    data.write_all(&hello(Role::Data {
        token,
        stream: 0,
        direction: Direction::Up,
    }))
    .unwrap();
    c.send(&Message::Entries(Entries {
        entries: vec![file_entry(1, 5, 1 << 20)],
        failed: Vec::new(),
    }))
    .unwrap();
    assert!(matches!(next(c), Message::Wants(_)));
    let header = ChunkHeader {
        zero: false,
        compressed: false,
        file: 1,
        index: 0,
        offset: 0,
        len: 5,
    };
    data.write_all(&header.encode()).unwrap();
    data.write_all(b"forge").unwrap();
    let forged = Trailer {
        check: longhaul_proto::digest::NO_CHECK,
        value: *blake3::hash(b"forge").as_bytes(),
    };
    data.write_all(&forged.encode()).unwrap();
    let msgs = until(c, |m| matches!(m, Message::Resend(_)));
    assert!(
        matches!(
            msgs.last(),
            Some(Message::Resend(Resend { id: 1, index: 0 }))
        ),
        "{msgs:?}"
    );
    assert!(!dir.join("out").exists(), "a forged chunk landed");
}

#[test]
fn a_plaintext_session_cannot_leave_the_chunk_checks_to_a_tag_it_lacks() {
    let dir = std::env::temp_dir().join(format!("lh-hostile-tagcheck-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = hostile_server(&dir);
    let mut c = control(s.addr());
    let a = tag_checked_push(&mut c);
    assert!(!a.tag_checks, "agreed to tag checks without TLS: {a:?}");
    forged_chunk_is_asked_again(&mut c, s.addr(), a.token, &dir);
    s.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A control connection in TLS (any certificate taken), welcomed.
fn tls_control(addr: SocketAddr) -> FramedConn {
    use longhaul_engine::net::tls::{ClientTls, TrustOptions};
    let trust = TrustOptions {
        accept_any: true,
        ..TrustOptions::default()
    };
    let tls = ClientTls::new(&trust, &addr.to_string()).unwrap();
    let mut s = tls.connect(TcpStream::connect(addr).unwrap()).unwrap();
    s.write_all(&hello(Role::Control)).unwrap();
    let mut c = FramedConn::new(s, addr.to_string());
    assert!(matches!(next(&mut c), Message::Welcome(_)));
    c
}

#[test]
fn a_tls_control_cannot_leave_the_checks_to_tags_a_plaintext_data_stream_lacks() {
    let dir = std::env::temp_dir().join(format!("lh-hostile-tagplain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = hostile_server(&dir);
    let mut c = tls_control(s.addr());
    let a = tag_checked_push(&mut c);
    assert!(a.tag_checks, "a TLS session is offered tag checks: {a:?}");
    // The server takes plaintext (--allow-plaintext): the data stream
    // joins in the clear, where no AEAD tag proves anything.
    forged_chunk_is_asked_again(&mut c, s.addr(), a.token, &dir);
    s.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pulls `src` from the export with chunks of `chunk_size` (one data
/// stream, joined and never read) and says `send` for the file it
/// announces: the control connection, the data stream and the file's id.
fn pull_wanting(addr: SocketAddr, src: &str, chunk_size: u64) -> (FramedConn, TcpStream, u64) {
    let mut c = control(addr);
    let Message::TransferRequest(mut t) = request(Op::Pull, "", vec![src.into()]) else {
        unreachable!()
    };
    t.chunk_size = Some(chunk_size);
    c.send(&Message::TransferRequest(t)).unwrap();
    let Message::TransferAccept(a) = next(&mut c) else {
        panic!("no accept")
    };
    let mut data = TcpStream::connect(addr).unwrap();
    data.write_all(&hello(Role::Data {
        token: a.token,
        stream: 0,
        direction: Direction::Down,
    }))
    .unwrap();
    let id = loop {
        if let Message::Entries(e) = next(&mut c) {
            if let Some(f) = e.entries.iter().find(|e| e.kind == Kind::File) {
                break f.id;
            }
        }
    };
    c.send(&Message::Wants(Wants {
        wants: vec![Want::Send {
            id,
            skip: Vec::new(),
            resumed_bytes: 0,
        }],
    }))
    .unwrap();
    (c, data, id)
}

/// The end of a pull the hostile sink broke: the source's error in a
/// `TransferDone` (which must hold `needle`), or the connection closed
/// (a source that fails closes), within 10 s.
fn pull_broken(c: &mut FramedConn, needle: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match c.recv_until(until) {
            Ok(Some(Message::TransferDone(r))) => {
                assert!(format!("{r:?}").contains(needle), "{needle}: {r:?}");
                break;
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("the source served it all for 10 s"),
            Err(_) => break,
        }
    }
}

/// A hostile sink pulling a file (a client of a `:public` export, PROTOCOL
/// 13.2 step 6b) asks its chunks again: one chunk past what an honest sink
/// ever asks (the source would read and send it without end), or a huge
/// file's chunks by the hundred thousand while it reads none of them (the
/// resends would queue without end, a few bytes asked for each). Either
/// way its transfer ends at once (the source fails: MAX_RESENDS_PER_CHUNK,
/// MAX_QUEUED_RESENDS), and the server serves on.
#[test]
fn attacker_a_pulling_sink_that_asks_chunks_again_without_end_loses_its_transfer() {
    let dir = std::env::temp_dir().join(format!("lh-hostile-resend-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("small.bin"), vec![7u8; 10]).unwrap();
    // 64 GiB of hole: 1,048,576 chunks of 64 KiB, nothing on disk.
    let big = std::fs::File::create(dir.join("big.bin")).unwrap();
    big.set_len(64 << 30).unwrap();
    drop(big);
    let s = hostile_server(&dir);

    let (mut c, _data, id) = pull_wanting(s.addr(), "small.bin", 64 << 10);
    for _ in 0..100 {
        if c.send(&Message::Resend(Resend { id, index: 0 })).is_err() {
            break;
        }
    }
    pull_broken(&mut c, "again more than 6 times each");

    let (mut c, _data, id) = pull_wanting(s.addr(), "big.bin", 64 << 10);
    let mut index = 0u32;
    for _ in 0..400_000 {
        if c.send(&Message::Resend(Resend { id, index })).is_err() {
            break;
        }
        index = (index + 1) % (1 << 20);
    }
    pull_broken(&mut c, "262144 chunks again");

    // The server still serves.
    let (mut c, _data) = start_push(s.addr());
    c.send(&Message::EntriesEnd(EntriesEnd { files: 1 }))
        .unwrap();
    s.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
