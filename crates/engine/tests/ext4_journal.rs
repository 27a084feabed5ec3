//! Which destinations the sink makes its files in one create at a time:
//! an ext4 without a journal only (issue 45's cause: only there does ext4
//! pass over recently freed inodes). Two real file systems on loop
//! devices, one with a journal and one without. Needs root, losetup and
//! mkfs.ext4 (`LONGHAUL_REQUIRE_ROOT=1`, `LONGHAUL_REQUIRE_LOOP=1` in CI).

use std::path::{Path, PathBuf};
use std::process::Command;

use longhaul_engine::xfer::beneath::Anchor;
use longhaul_testkit::process::run_ok as run;
use longhaul_testkit::require;

/// An ext4 on a loop device, made with `features` (mkfs.ext4's `-O`) and
/// mounted; unmounted and taken apart on drop.
struct LoopExt4 {
    base: PathBuf,
    dev: Option<String>,
    mounted: bool,
}

impl LoopExt4 {
    fn new(name: &str, features: &str) -> LoopExt4 {
        let base = std::env::temp_dir().join(format!("lh-ext4-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("mnt")).unwrap();
        let mut me = LoopExt4 {
            base,
            dev: None,
            mounted: false,
        };
        let img = me.base.join("disk.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        run(Command::new(require::find("mkfs.ext4").unwrap())
            .args(["-qF", "-O", features, "-E", "nodiscard"])
            .arg(&img));
        let dev = run(Command::new(require::find("losetup").unwrap())
            .args(["-f", "--show"])
            .arg(&img));
        me.dev = Some(dev.clone());
        run(Command::new("mount").arg(&dev).arg(me.dir()));
        me.mounted = true;
        me
    }

    fn dir(&self) -> PathBuf {
        self.base.join("mnt")
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(self.dir()).status();
        }
        if let Some(dev) = &self.dev {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn one_at_a_time(dir: &Path) -> bool {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    Anchor::open(dir)
        .unwrap()
        .dir(&dir.join("sub"), false)
        .unwrap()
        .on_ext4_without_journal()
}

#[test]
fn only_an_ext4_without_a_journal_takes_creates_one_at_a_time() {
    if !require::have(
        "ROOT",
        require::root("two ext4 file systems on loop devices"),
    ) || !require::have(
        "LOOP",
        require::program("losetup", "mount")
            .and_then(|()| require::program("mkfs.ext4", "e2fsprogs")),
    ) {
        return;
    }
    let journalled = LoopExt4::new("journal", "has_journal");
    let bare = LoopExt4::new("bare", "^has_journal");
    assert!(
        !one_at_a_time(&journalled.dir()),
        "a journalled ext4 keeps its creates side by side"
    );
    assert!(
        one_at_a_time(&bare.dir()),
        "an ext4 without a journal takes them one at a time"
    );
}
