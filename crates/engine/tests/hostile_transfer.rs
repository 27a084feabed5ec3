//! A peer that speaks the transfer protocol badly loses its own transfer,
//! promptly and without taking a server thread down with it.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_engine::conn::FramedConn;
use longhaul_engine::server::{ServeConfig, Server};
use longhaul_engine::xfer::storage::Local;
use longhaul_engine::xfer::Export;
use longhaul_proto::frame::MAGIC;
use longhaul_proto::msg::{Direction, Hello, Message, Role};
use longhaul_proto::xfer::*;

fn hello(role: Role) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    Message::Hello(Hello {
        min_version: 1,
        max_version: 1,
        software: "hostile test".into(),
        role,
        token: None,
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
    }
}

/// Opens a push (request accepted, one data stream attached).
fn open_push(addr: SocketAddr) -> (FramedConn, TcpStream) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.write_all(&hello(Role::Control)).unwrap();
    let mut c = FramedConn::new(Box::new(tcp), addr.to_string());
    assert!(matches!(next(&mut c), Message::Welcome(_)));
    c.send(&Message::TransferRequest(TransferRequest {
        op: Op::Push,
        export: "data".into(),
        dest: "f.bin".into(),
        sources: vec![],
        source_count: 1,
        recursive: false,
        preserve: false,
        streams: 1,
        chunk_size: Some(1 << 20),
        force: false,
        sync: None,
        dry_run: false,
        verify: false,
        contents: false,
        direct: false,
    }))
    .unwrap();
    let Message::TransferAccept(a) = next(&mut c) else {
        panic!("no accept")
    };
    let mut data = TcpStream::connect(addr).unwrap();
    data.write_all(&hello(Role::Data {
        token: a.token,
        stream: 0,
        direction: Direction::Up,
    }))
    .unwrap();
    (c, data)
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
            file: 1,
            index,
            offset,
            len: 0,
        };
        data.write_all(&header.encode()).unwrap();
        data.write_all(blake3::hash(b"").as_bytes()).unwrap();
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
