//! `bench disk` on storage that fails its writes behind the page cache (an
//! ext4 on a loop device whose backing file sits on a full tmpfs): every
//! write lands in memory, every writeback fails. The sync before a cold
//! read's pages are dropped then fails, and the run says so instead of
//! timing a "cold" read from memory. Needs root, losetup and mkfs.ext4
//! (`LONGHAUL_REQUIRE_ROOT=1`, `LONGHAUL_REQUIRE_LOOP=1` in CI).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use longhaul_engine::bench::disk::{self, DiskBench};

use longhaul_testkit::process::run_ok as run;
use longhaul_testkit::require;

/// The failing disk, taken apart on drop (space freed first, so that the
/// unmount's own writes succeed).
struct FailingDisk {
    base: PathBuf,
    filler: PathBuf,
    dev: Option<String>,
    mounted: bool,
}

impl FailingDisk {
    fn new() -> Option<FailingDisk> {
        if !require::have("ROOT", require::root("a disk that fails its writes"))
            || !require::have(
                "LOOP",
                require::program("losetup", "mount")
                    .and_then(|()| require::program("mkfs.ext4", "e2fsprogs")),
            )
        {
            return None;
        }
        let base = std::env::temp_dir().join(format!("lh-failing-disk-{}", std::process::id()));
        let back = base.join("back");
        let mnt = base.join("mnt");
        std::fs::create_dir_all(&back).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        let mut me = FailingDisk {
            filler: back.join("filler"),
            base,
            dev: None,
            mounted: false,
        };
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
            .arg(&back));
        let img = back.join("disk.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(128 << 20)
            .unwrap();
        run(Command::new(require::find("mkfs.ext4").unwrap())
            .args(["-qF", "-O", "^has_journal", "-N", "1024", "-E", "nodiscard"])
            .arg(&img));
        let dev = run(Command::new(require::find("losetup").unwrap())
            .args(["-f", "--show"])
            .arg(&img));
        me.dev = Some(dev.clone());
        run(Command::new("mount")
            .args(["-o", "errors=continue", &dev])
            .arg(&mnt));
        me.mounted = true;
        // The backing tmpfs filled: from now on no write reaches the image.
        let mut f = std::fs::File::create(&me.filler).unwrap();
        let block = vec![0x5a_u8; 64 << 10];
        while f.write_all(&block).is_ok() {}
        Some(me)
    }

    fn dir(&self) -> PathBuf {
        self.base.join("mnt")
    }
}

impl Drop for FailingDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.filler);
        if self.mounted {
            let _ = Command::new("umount").arg(self.dir()).status();
        }
        if let Some(dev) = &self.dev {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
        let _ = Command::new("umount").arg(self.base.join("back")).status();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

#[test]
fn a_failed_sync_before_a_cold_read_is_an_error_not_a_warm_figure() {
    let Some(disk) = FailingDisk::new() else {
        return;
    };
    let mut b = DiskBench::new(disk.dir());
    b.write = false;
    b.read = false;
    b.files = 64;
    b.small_file_size = 64 << 10;
    b.time_limit = Duration::from_secs(20);
    let e = disk::run(&b).expect_err("the small files' writeback fails");
    let e = format!("{e:#}");
    assert!(e.contains("reading files in"), "{e}");
    assert!(
        e.contains("syncing it before its cached pages are dropped"),
        "{e}"
    );
    assert!(Path::new(&disk.dir()).exists());
}
