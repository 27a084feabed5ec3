//! One transfer striped over several paths into one server (`--bind`,
//! `--via`): nuttcp's multilink, SC12's several links into one host. On
//! loopback the paths are 127.0.0.1, .2 and .3.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::xfer::*;
use common::*;
use longhaul_engine::server::{ServeConfig, Server};
use longhaul_engine::xfer::storage::Local;

#[test]
fn a_push_is_striped_over_two_server_addresses_and_two_local_ones() {
    let t = TempDir::new("paths");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("big.bin"), 48 << 20, 3);
    // One server listening on two addresses (two NICs).
    let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = first.local_addr().unwrap().port();
    drop(first);
    let server = Server::bind(
        &[
            SocketAddr::from(([127, 0, 0, 1], port)),
            SocketAddr::from(([127, 0, 0, 2], port)),
        ],
        ServeConfig {
            exports: vec![export("data", &dst, false)],
            storage: Arc::new(Local),
            sync_files: false,
            state_dir: prepare_state(&t.dir("state")),
            ..ServeConfig::default()
        },
    )
    .expect("bind two loopback addresses")
    .spawn();
    let v = cp_ok(&[
        "-P",
        "4",
        "--bind",
        "127.0.0.1",
        "--bind",
        "127.0.0.3",
        "--via",
        "127.0.0.2",
        src.join("big.bin").to_str().unwrap(),
        &remote(server.addr(), ""),
    ]);
    assert_same_file(&src.join("big.bin"), &dst.join("big.bin"));
    let paths = v["paths"]
        .as_array()
        .unwrap_or_else(|| panic!("no paths: {v}"));
    let remotes: std::collections::BTreeSet<&str> = paths
        .iter()
        .map(|p| p["remote"].as_str().unwrap().rsplit_once(':').unwrap().0)
        .collect();
    assert_eq!(
        remotes.len(),
        2,
        "both server addresses carried streams: {v}"
    );
    let locals: std::collections::BTreeSet<&str> =
        paths.iter().map(|p| p["local"].as_str().unwrap()).collect();
    assert_eq!(locals.len(), 2, "both local addresses carried streams: {v}");
    let total: u64 = paths.iter().map(|p| p["bytes"].as_u64().unwrap()).sum();
    assert!(total >= 48 << 20, "the paths carried the file: {v}");
    for p in paths {
        assert!(
            p["bytes"].as_u64().unwrap() > 0,
            "every path carried bytes: {v}"
        );
    }
}

#[test]
fn a_bind_address_not_of_this_host_is_named() {
    let t = TempDir::new("paths-bad");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    std::fs::write(src.join("f"), b"x").unwrap();
    let s = data_server(&dst, &t.dir("state"));
    let o = longhaul(&[
        "cp",
        "--bind",
        "192.0.2.77",
        src.join("f").to_str().unwrap(),
        &remote(s.addr(), ""),
    ]);
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains("cannot bind") && stderr(&o).contains("192.0.2.77"),
        "{}",
        stderr(&o)
    );
    let o = longhaul(&["cp", "--via", "not-an-address", "a", "h:data/b"]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("not an address"), "{}", stderr(&o));
}
