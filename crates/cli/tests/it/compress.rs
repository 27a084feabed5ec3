//! `cp -z`: compression with zstd per chunk, negotiated with the server,
//! turned off by itself where it does not pay. Servers in this process
//! (so a pull's source, the server, compresses here too).

use std::process::Stdio;
use std::time::Duration;

use longhaul_engine::xfer::storage::Faults;
use serde_json::Value;

use crate::common;
use common::counters::PortBytes;
use common::xfer::*;
use common::{assert_exit, bin, stderr, stdout, TempDir};

fn compression(v: &Value) -> &Value {
    let c = &v["compression"];
    assert!(c.is_object(), "no compression account: {v}");
    c
}

#[test]
fn compressible_data_moves_far_fewer_bytes_both_ways_and_arrives_identical() {
    let t = TempDir::new("zcomp");
    let src = t.dir("src");
    let exp = t.dir("export");
    let back = t.dir("back");
    // 8 MiB of text and 4 MiB of zeros: below the governor's speed
    // window, so this busy machine's timings cannot turn it off.
    write_text(&src.join("log.txt"), 8 * MIB as usize);
    std::fs::write(src.join("zeros.bin"), vec![0u8; 4 * MIB as usize]).unwrap();
    let s = data_server(&exp, &t.dir("state"));
    let raw = 12 * MIB;

    // What the kernel counted at the server's port (nftables), whatever
    // system call moved the bytes: not the program's own account.
    let counted = common::require::have(
        "ROOT",
        common::require::root("counting the server port's bytes with nftables")
            .and_then(|()| common::require::program("nft", "nftables")),
    );
    let port = counted.then(|| PortBytes::count(s.addr().port()).expect("an nftables counter"));
    let v = cp_ok(&["-z", "-r", src.to_str().unwrap(), &remote(s.addr(), "")]);
    assert_eq!(v["bytes"], raw, "{v}");
    let c = compression(&v);
    assert_eq!(c["level"], 1, "{v}");
    assert_eq!(c["raw_bytes"], raw, "{v}");
    let wire = c["wire_bytes"].as_u64().unwrap();
    assert!(wire < raw / 5, "{wire} bytes on the wire for {raw}: {v}");
    let pushed = port.as_ref().map(|p| p.read().expect("nft's counters"));
    if let Some((to_server, _)) = pushed {
        assert!(
            to_server < raw / 5 && to_server >= wire,
            "{to_server} bytes crossed to the server's port, for {raw} of data and {wire} \
             the client says went on the wire"
        );
    }
    assert!(c.get("off_reason").is_none(), "{v}");
    assert_eq!(c["off_at_end"], false, "{v}");
    assert_same_tree(&src, &exp.join("src"), false);
    assert_no_leftovers(&exp);

    // The pull: the server compresses, at the level asked.
    let v = cp_ok(&[
        "--compress-level",
        "-3",
        "-r",
        &remote(s.addr(), "src"),
        back.to_str().unwrap(),
    ]);
    let c = compression(&v);
    assert_eq!(c["level"], -3, "{v}");
    assert_eq!(c["raw_bytes"], raw, "{v}");
    let wire = c["wire_bytes"].as_u64().unwrap();
    assert!(wire < raw / 2, "{v}");
    if let (Some(p), Some((_, from_before))) = (&port, pushed) {
        let from_server = p.read().expect("nft's counters").1 - from_before;
        assert!(
            from_server < raw / 2 && from_server >= wire,
            "{from_server} bytes crossed from the server's port, for {raw} of data and {wire} \
             the client says went on the wire"
        );
    }
    assert_same_tree(&src, &back.join("src"), false);
    assert_no_leftovers(&back);

    // The human summary says what it did.
    let o = common::xfer::longhaul(&[
        "cp",
        "-z",
        "--force",
        src.join("log.txt").to_str().unwrap(),
        &remote(s.addr(), ""),
    ]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(
        out.contains("compression: zstd level 1,") && out.contains("on throughout"),
        "{out}"
    );
    // Without -z: no account, plain frames.
    let v = cp_ok(&[
        "--force",
        "-r",
        src.to_str().unwrap(),
        &remote(s.addr(), ""),
    ]);
    assert!(v.get("compression").is_none(), "{v}");
    s.shutdown();
}

#[test]
fn random_data_turns_compression_off_and_still_arrives_intact() {
    let t = TempDir::new("zrand");
    let src = t.dir("src");
    let exp = t.dir("export");
    let back = t.dir("back");
    let file = src.join("noise.bin");
    // Past the governor's run of incompressible bytes (4 MiB).
    write_random(&file, 10 * MIB as usize, 32);
    let s = data_server(&exp, &t.dir("state"));
    for (from, to, at) in [
        (
            file.to_str().unwrap().to_string(),
            remote(s.addr(), ""),
            exp.join("noise.bin"),
        ),
        (
            remote(s.addr(), "noise.bin"),
            back.to_str().unwrap().to_string(),
            back.join("noise.bin"),
        ),
    ] {
        let v = cp_ok(&["-z", "--chunk", "1M", &from, &to]);
        let c = compression(&v);
        assert_eq!(c["off_reason"], "incompressible", "{v}");
        assert_eq!(c["off_at_end"], true, "{v}");
        assert_eq!(c["raw_bytes"], 10 * MIB, "{v}");
        // Stored, not inflated: at most a word per block over raw.
        let wire = c["wire_bytes"].as_u64().unwrap();
        assert!((10 * MIB..=10 * MIB + 20 * 4).contains(&wire), "{v}");
        assert_eq!(c["compressed_bytes"], 0, "{v}");
        assert_same_file(&file, &at);
    }
    s.shutdown();
}

/// Bytes that compress about 2x: in every 4 KiB, 2 KiB of noise and 2
/// KiB of zeros (so that what is in flight when the client dies cannot
/// be the whole file).
fn write_half(path: &std::path::Path, len: usize) {
    let mut rng = Rng::new(77);
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        v.extend_from_slice(&rng.bytes(2048));
        v.extend_from_slice(&[0u8; 2048]);
    }
    v.truncate(len);
    std::fs::write(path, v).unwrap();
}

#[test]
fn a_compressed_push_killed_midway_resumes_with_z() {
    let t = TempDir::new("zresume");
    let srcd = t.dir("src");
    let exp = t.dir("export");
    let file = srcd.join("big.bin");
    let size = 64 * MIB;
    write_half(&file, size as usize);
    let slow = server_with(
        vec![export("data", &exp, false)],
        faulty(Faults {
            write_delay: Some(Duration::from_millis(60)),
            ..Faults::default()
        }),
        &t.dir("state"),
    );
    let target = exp.join("big.bin");
    let journal = side(&target, "lhjournal");
    let mut child = bin()
        .args(["cp", "-z", "--chunk", "1M", "-P", "2", "--retries", "0"])
        .arg(&file)
        .arg(remote(slow.addr(), ""))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_records(&journal, 2, &mut child, Duration::from_secs(60));
    child.kill().unwrap();
    child.wait().unwrap();
    wait_quiet(&journal, Duration::from_millis(500));
    slow.shutdown();
    assert!(!target.exists());
    let mut indices = journal_indices(&journal);
    indices.sort_unstable();
    indices.dedup();
    assert!(!indices.is_empty());

    let s = data_server(&exp, &t.dir("state2"));
    let v = cp_ok(&[
        "-z",
        "--chunk",
        "1M",
        file.to_str().unwrap(),
        &remote(s.addr(), ""),
    ]);
    let resumed = indices.len() as u64 * MIB;
    assert_eq!(v["resumed_bytes"], resumed, "{v}");
    assert_eq!(v["files"], 1, "{v}");
    // Only what was missing went, compressed.
    let c = compression(&v);
    assert_eq!(c["raw_bytes"], size - resumed, "{v}");
    assert!(c["compressed_bytes"].as_u64().unwrap() > 0, "{v}");
    assert_same_file(&file, &target);
    assert!(!side(&target, "lhpart").exists());
    s.shutdown();
}

#[test]
fn the_options_parse_and_a_bad_level_is_refused_before_anything_connects() {
    for bad in ["0", "10", "-51", "fast"] {
        let o = common::xfer::longhaul(&["cp", "--compress-level", bad, "a", "127.0.0.1:1:x/"]);
        assert_exit(&o, 2);
        assert!(
            stderr(&o).contains("--compress-level"),
            "{bad}: {}",
            stderr(&o)
        );
    }
    let o = common::xfer::longhaul(&["cp", "--help"]);
    let help = stdout(&o);
    assert!(help.contains("-z, --compress"), "{help}");
    assert!(help.contains("--compress-level <LEVEL>"), "{help}");
    // sync takes them too.
    let o = common::xfer::longhaul(&["sync", "--help"]);
    assert!(stdout(&o).contains("-z, --compress"));
}

#[test]
fn a_third_party_copy_passes_z_to_the_source_and_reports_it() {
    let t = TempDir::new("z3rd");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    std::fs::create_dir_all(ra.join("logs")).unwrap();
    write_text(&ra.join("logs/log.txt"), 6 * MIB as usize);
    let server = |root: &std::path::Path, state: &str| {
        let mut cfg = data_config(root, &t.dir(state), false);
        cfg.third_party_copies = true;
        spawn_server(cfg)
    };
    let (a, b) = (server(&ra, "state-a"), server(&rb, "state-b"));
    let (src, dst) = (remote(a.addr(), "logs"), remote(b.addr(), ""));
    let mut args: Vec<String> = vec!["-z".into(), "-r".into()];
    args.extend(tokens_for(&[&src, &dst]));
    args.extend([src, dst]);
    let v = cp_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(v["verified"], true, "{v}");
    let c = compression(&v);
    assert_eq!(c["raw_bytes"], 6 * MIB, "{v}");
    assert!(c["wire_bytes"].as_u64().unwrap() < MIB, "{v}");
    assert_same_tree(&ra.join("logs"), &rb.join("logs"), false);
    a.shutdown();
    b.shutdown();
}
