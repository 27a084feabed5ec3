//! `longhaul serve` as a process of its own, as a test starts it: owned
//! ([`Owned`]: its process group ended when the test is done with it or
//! panics) and its stderr kept in a file, from which the addresses it says
//! it serves on are read.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Owned, TempDir};

/// A `longhaul serve` a test started, with its log.
pub struct Served {
    proc: Owned,
    log: PathBuf,
    _dir: TempDir,
}

impl Served {
    /// Starts `c` (a `longhaul serve` command line: its stdout is the
    /// caller's to set), its stderr into a log of its own.
    pub fn start(c: &mut Command) -> Served {
        let dir = TempDir::new("serve-log");
        let log = dir.path().join("serve.log");
        let file = std::fs::File::create(&log).unwrap();
        let proc = Owned::spawn(c.stdin(Stdio::null()).stderr(file)).expect("start longhaul serve");
        Served {
            proc,
            log,
            _dir: dir,
        }
    }

    /// Its log so far (bytes that are not UTF-8 shown as U+FFFD).
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// The word after `marker` on the first whole line of the log that
    /// has it (the log may be read while a line is written).
    pub fn said(&self, marker: &str) -> Option<String> {
        let text = self.log();
        let line = text
            .split_inclusive('\n')
            .find(|l| l.contains(marker) && l.ends_with('\n'))?;
        let after = line.split(marker).nth(1)?;
        after.split_whitespace().next().map(str::to_string)
    }

    /// Waits until the log says `marker` and a word after it: that word.
    /// Panics, showing the log, when the server ends first or `limit`
    /// passes.
    pub fn wait_said(&mut self, marker: &str, limit: Duration) -> String {
        let until = Instant::now() + limit;
        loop {
            if let Some(word) = self.said(marker) {
                return word;
            }
            if let Ok(Some(st)) = self.proc.try_wait() {
                panic!("longhaul serve exited ({st}): {}", self.log());
            }
            assert!(
                Instant::now() < until,
                "longhaul serve did not say '{marker}' within {limit:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for `serving on ADDR`: its address.
    pub fn addr(&mut self) -> SocketAddr {
        let addr = self.wait_said("serving on ", Duration::from_secs(60));
        addr.parse()
            .unwrap_or_else(|e| panic!("'{addr}' is not an address: {e}"))
    }
}

impl std::ops::Deref for Served {
    type Target = Owned;
    fn deref(&self) -> &Owned {
        &self.proc
    }
}

impl std::ops::DerefMut for Served {
    fn deref_mut(&mut self) -> &mut Owned {
        &mut self.proc
    }
}
