//! The page cache's dirty budget: how many bytes writers may leave dirty
//! before the kernel holds them to the device's pace. Below the "free run"
//! (halfway between the background and the hard threshold, as the kernel's
//! `balance_dirty_pages` reckons it) a buffered write returns at memory's
//! speed and the kernel writes the pages back behind it.

/// The kernel's dirty-page settings (`/proc/sys/vm/dirty_*`); a `_bytes`
/// setting above zero replaces its `_ratio`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Knobs {
    pub bytes: u64,
    pub ratio: u64,
    pub background_bytes: u64,
    pub background_ratio: u64,
}

/// Whether `len` more dirty bytes stay within the free run now. False when
/// the kernel's figures cannot be read.
pub fn fits(len: u64) -> bool {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let knob = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/vm/{name}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let knobs = Knobs {
        bytes: knob("dirty_bytes"),
        ratio: knob("dirty_ratio"),
        background_bytes: knob("dirty_background_bytes"),
        background_ratio: knob("dirty_background_ratio"),
    };
    fits_in(len, &meminfo, knobs)
}

/// [`fits`] from `/proc/meminfo`'s text and the knobs: the thresholds are
/// taken of the memory available (what the kernel counts as dirtyable, near
/// enough), the background one at most half the hard one, and what is dirty
/// or under writeback now counts against them.
pub fn fits_in(len: u64, meminfo: &str, k: Knobs) -> bool {
    let field = |name: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let kib = rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
            Some(kib.saturating_mul(1024))
        })
    };
    let (Some(available), Some(dirty), Some(writeback)) =
        (field("MemAvailable"), field("Dirty"), field("Writeback"))
    else {
        return false;
    };
    let of = |bytes: u64, ratio: u64| match bytes {
        0 => available / 100 * ratio.min(100),
        b => b,
    };
    let hard = of(k.bytes, k.ratio);
    let background = of(k.background_bytes, k.background_ratio).min(hard / 2);
    let free_run = (hard + background) / 2;
    dirty
        .saturating_add(writeback)
        .saturating_add(len)
        .le(&free_run)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn meminfo(available_gib: u64, dirty_mib: u64) -> String {
        format!(
            "MemTotal:       25000000 kB\nMemFree:        20000000 kB\nMemAvailable:   {} kB\nDirty:          {} kB\nWriteback:             0 kB\nWritebackTmp:          0 kB\n",
            available_gib << 20,
            dirty_mib << 10
        )
    }

    const DEFAULTS: Knobs = Knobs {
        bytes: 0,
        ratio: 20,
        background_bytes: 0,
        background_ratio: 10,
    };

    #[test]
    fn a_file_fits_while_what_is_dirty_stays_below_the_free_run() {
        // 20 GiB available: thresholds 4 and 2 GiB, the free run 3 GiB.
        assert!(fits_in(256 << 20, &meminfo(20, 0), DEFAULTS));
        assert!(fits_in(2 * GIB, &meminfo(20, 900), DEFAULTS));
        assert!(!fits_in(4 * GIB, &meminfo(20, 0), DEFAULTS));
        assert!(!fits_in(GIB, &meminfo(20, 2500), DEFAULTS), "dirty counts");
        assert!(
            !fits_in(256 << 20, &meminfo(1, 0), DEFAULTS),
            "little memory"
        );
    }

    #[test]
    fn byte_settings_replace_ratios_and_unknown_figures_do_not_fit() {
        let bytes = Knobs {
            bytes: 64 << 20,
            background_bytes: 32 << 20,
            ..DEFAULTS
        };
        assert!(fits_in(40 << 20, &meminfo(20, 0), bytes));
        assert!(!fits_in(64 << 20, &meminfo(20, 0), bytes));
        assert!(!fits_in(1, "", DEFAULTS));
        assert!(!fits_in(1, "MemAvailable: lots\n", DEFAULTS));
    }
}
