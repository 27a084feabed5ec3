//! A peer's include/exclude rules (`xfer::filter`), compiled as a server
//! compiles a `TransferRequest`'s: arbitrary text, one rule a line (read
//! as an `--exclude-from` file is: a line without `- ` or `+ ` excludes).
//! Input: `RULES [\0 PATHS]`, read lossily; PATHS one a line, a trailing
//! `/` for a directory (some are tried when there are none).
//!
//! Must never panic. Properties:
//! - a filter that compiles was charged at most its budget
//!   (`xfer::filter::BUDGET`), and however many paths it then matches,
//!   its search caches stay within that charge;
//! - a refusal says what it refused (a `filter rule` and its text, or
//!   the count of rules).

use longhaul_engine::xfer::filter::{rules_from_lines, Filter, BUDGET};

const PATHS: &str =
    "a\nx.o\nsrc/deep/x.o\nfoo/\nfoo/bar\nfoo/x/bar/\n/\n.hidden\na\\b\ncaf\u{e9}\n";

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (rules, paths) = text.split_once('\0').unwrap_or((&text, PATHS));
    let Ok(rules) = rules_from_lines(rules, false) else {
        return;
    };
    for contents in [false, true] {
        match Filter::new(&rules, contents) {
            Ok(f) => {
                assert!(f.charged() <= BUDGET, "charged {}", f.charged());
                for p in paths.lines().chain(PATHS.lines()) {
                    let dir = p.ends_with('/');
                    let p = p.trim_end_matches('/');
                    let _ = f.excludes(p, dir);
                    let _ = f.excludes_entry(p, dir);
                }
                assert!(
                    f.cache_bytes() <= f.charged(),
                    "caches {} over the charge {}",
                    f.cache_bytes(),
                    f.charged()
                );
            }
            Err(e) => assert!(e.contains("filter rule"), "{e}"),
        }
    }
});
