//! The archive's own rules, without the binary: credentials scrubbed as
//! rows are written and read, the file private, a digest prefix that
//! names one digest or says it names several.

use std::os::unix::fs::PermissionsExt;

use longhaul_archive::model::{FileRow, NewRun};
use longhaul_archive::writer::{RunEnd, Writer};
use longhaul_archive::{Archive, ArchiveError};

fn file(path: &str, digest: &str) -> FileRow {
    FileRow {
        path: path.into(),
        source: format!("/src/{path}"),
        dest: format!("far:data/{path}"),
        size: 1,
        mtime_ns: None,
        digest: Some(digest.into()),
        verified: true,
    }
}

#[test]
fn a_digest_prefix_names_one_digest_or_says_which_it_could_be() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    let a = Archive::open(&path).unwrap();
    let id = a
        .begin_run(&NewRun {
            kind: "cp".into(),
            command: "longhaul cp".into(),
            ..NewRun::default()
        })
        .unwrap();
    let one = format!("abcdef0123456789{}", "1".repeat(48));
    let two = format!("abcdef0123456789{}", "2".repeat(48));
    let three = format!("ffffffff00000000{}", "3".repeat(48));
    let (w, fin) = Writer::start(a, id);
    for (p, d) in [("one", &one), ("two", &two), ("three", &three)] {
        w.file_waiting(file(p, d));
    }
    w.end(RunEnd {
        status: "ok".into(),
        ..RunEnd::default()
    });
    drop(w);
    fin.finish();
    let a = Archive::open_read_only(&path).unwrap();
    // Unique: any length from 8 digits, any case; the top half of the keys too.
    for prefix in ["ffffffff", "FFFFFFFF0000", &three[..20], &three] {
        let hits = a.find(prefix).unwrap();
        assert_eq!(hits.len(), 1, "{prefix}");
        assert_eq!(hits[0].file.path, "three");
    }
    assert_eq!(a.find(&one[..17]).unwrap()[0].file.path, "one");
    // Shared by two digests: said, with both.
    for prefix in ["abcdef01", "abcdef0123456789", &one[..16]] {
        match a.find(prefix) {
            Err(e @ ArchiveError::AmbiguousDigest { .. }) => {
                let m = e.to_string();
                assert!(m.contains(&one) && m.contains(&two), "{m}");
                assert!(m.contains("more of its hex digits"), "{m}");
            }
            other => panic!("{prefix}: {other:?}"),
        }
    }
    // Too short to be a digest, or matching none: a name, not found.
    assert!(a.find("abcdef0").unwrap().is_empty());
    assert!(a.find("0123456789").unwrap().is_empty());
}

#[test]
fn rows_are_scrubbed_as_written_and_the_file_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    let a = Archive::open(&path).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let id = a
        .begin_run(&NewRun {
            kind: "cp".into(),
            command: "longhaul cp --queue postgres://u:SECRET1@h/x --api-key=SECRET2 a b".into(),
            params: Some(serde_json::json!({"dsn": "host=h password=SECRET3"})),
            ..NewRun::default()
        })
        .unwrap();
    let (w, fin) = Writer::start(a, id);
    w.end(RunEnd {
        status: "failed".into(),
        error: Some("cannot reach postgres://u:SECRET4@h/x".into()),
        warnings: vec!["token lh1_0badc0de_SECRET5SECRET5SECRET5 refused".into()],
        ..RunEnd::default()
    });
    drop(w);
    fin.finish();
    let a = Archive::open_read_only(&path).unwrap();
    let d = serde_json::to_string(&a.run(id).unwrap()).unwrap();
    assert!(!d.contains("SECRET"), "{d}");
    assert!(
        d.contains("postgres://u:***@h/x") && d.contains("lh1_0badc0de_***"),
        "{d}"
    );
    drop(a);
    for suffix in ["", "-wal", "-shm"] {
        let f = format!("{}{suffix}", path.display());
        if let Ok(b) = std::fs::read(&f) {
            assert!(!b.windows(6).any(|w| w == b"SECRET"), "{f}");
        }
    }
}
