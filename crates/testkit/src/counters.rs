//! The kernel's own byte counters, for tests that check a claim the
//! program makes about bytes it moved: the program's report is what is
//! under test, so the count comes from elsewhere.

/// A process's I/O as `/proc/PID/io` counts it: every `read` and `write`
/// call (files, pipes and sockets alike) in `rchar` and `wchar`, of all
/// its threads, the ended ones too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcIo {
    pub rchar: u64,
    pub wchar: u64,
}

impl ProcIo {
    /// Process `pid`'s counters now (it may be a zombie: a child that
    /// ended and is not reaped yet keeps them); None once it is reaped.
    pub fn of(pid: u32) -> Option<ProcIo> {
        Self::parse(&std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?)
    }

    /// This process's counters now.
    pub fn own() -> ProcIo {
        Self::parse(&std::fs::read_to_string("/proc/self/io").expect("read /proc/self/io"))
            .expect("/proc/self/io has rchar and wchar")
    }

    fn parse(io: &str) -> Option<ProcIo> {
        let field = |name: &str| {
            io.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        Some(ProcIo {
            rchar: field("rchar:")?,
            wchar: field("wchar:")?,
        })
    }

    /// Both ways.
    pub fn total(&self) -> u64 {
        self.rchar + self.wchar
    }

    /// What moved since `before`.
    pub fn since(&self, before: ProcIo) -> ProcIo {
        ProcIo {
            rchar: self.rchar - before.rchar,
            wchar: self.wchar - before.wchar,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_io_parses_the_kernels_format() {
        let io = "rchar: 1234\nwchar: 99\nsyscr: 3\nsyscw: 4\nread_bytes: 0\n";
        assert_eq!(
            ProcIo::parse(io),
            Some(ProcIo {
                rchar: 1234,
                wchar: 99
            })
        );
        assert_eq!(ProcIo::parse("syscr: 3\n"), None);
    }

    #[test]
    fn a_write_shows_in_this_processs_own_counter() {
        let before = ProcIo::own();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![7u8; 100_000]).unwrap();
        assert!(ProcIo::own().since(before).wchar >= 100_000);
    }
}
