//! The stable smoke runner: what CI runs of the fuzz targets on every
//! build, where cargo-fuzz cannot run (it needs a nightly toolchain for
//! its sanitizers; CI has the stable one).
//!
//! For a target it runs every input of its corpus (`fuzz/corpus/NAME/`,
//! kept in the repository), then mutations of them for a few seconds
//! (bit flips, bytes set, inserted and deleted, ranges repeated, words of
//! the target's dictionary, splices of two inputs, edge values), each
//! under two budgets: the memory it may hold at once beyond what was held
//! before it ([`MEMORY_BUDGET`], counted by [`Counting`], the allocator
//! the test binary installs) and its time ([`TIME_BUDGET`]). A panic or an
//! input over a budget fails the run, saying the target, why, the seed of
//! the mutations and where the input was saved (copy it into the corpus
//! to keep it as a regression input). It is not coverage-guided: that is
//! libFuzzer's part (`fuzz/run.sh`), for long runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The most one input may make a target hold at once, beyond what was
/// held before it.
pub const MEMORY_BUDGET: usize = 256 << 20;
/// The longest one input may take.
pub const TIME_BUDGET: Duration = Duration::from_secs(5);
/// The longest input a mutation makes.
pub const MAX_LEN: usize = 16 << 10;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting what is held and its peak; a test
/// binary installs it with `#[global_allocator]` so that each input's
/// memory is measured (without it nothing is counted).
pub struct Counting;

fn grew(n: usize) {
    let now = HELD.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrank(n: usize) {
    HELD.fetch_sub(n, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator with the
// caller's arguments; only counters are kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from this allocator with layout `l`.
        unsafe { System.dealloc(p, l) };
        shrank(l.size());
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: `p` came from this allocator with layout `l`.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            match new.cmp(&l.size()) {
                std::cmp::Ordering::Greater => grew(new - l.size()),
                std::cmp::Ordering::Less => shrank(l.size() - new),
                std::cmp::Ordering::Equal => {}
            }
        }
        q
    }
}

/// An input that failed its target.
#[derive(Debug)]
pub struct Failed {
    pub target: &'static str,
    pub why: String,
    pub input: Vec<u8>,
    /// Where the input was saved.
    pub saved: Option<PathBuf>,
    /// The mutations' seed (None: a corpus input).
    pub seed: Option<u64>,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fuzz target {}: {}", self.target, self.why)?;
        match &self.saved {
            Some(p) => write!(f, "; the input is in {}", p.display())?,
            None => write!(f, "; the input could not be saved")?,
        }
        if let Some(seed) = self.seed {
            write!(
                f,
                " (mutations of seed {seed}: LONGHAUL_FUZZ_SEED={seed} runs them again)"
            )?;
        }
        if self.input.len() <= 512 {
            write!(
                f,
                "; its bytes: {}",
                longhaul_proto::units::hex(&self.input)
            )?;
        }
        write!(
            f,
            "; copy it into fuzz/corpus/{}/ to keep it as a regression input",
            self.target
        )
    }
}

/// Runs `run` on one input within the budgets; why not, if not.
pub fn one(run: fn(&[u8]), input: &[u8]) -> Result<(), String> {
    let before = HELD.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let started = Instant::now();
    let result = std::panic::catch_unwind(|| run(input));
    let took = started.elapsed();
    let held = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    match result {
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            Err(format!("panicked: {what}"))
        }
        Ok(()) if held > MEMORY_BUDGET => Err(format!(
            "held {} MiB at once, over its budget of {} MiB",
            held >> 20,
            MEMORY_BUDGET >> 20
        )),
        Ok(()) if took > TIME_BUDGET => Err(format!(
            "took {:.1} s, over its budget of {} s",
            took.as_secs_f64(),
            TIME_BUDGET.as_secs()
        )),
        Ok(()) => Ok(()),
    }
}

/// Where a target's corpus is kept.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// A target's corpus, in the order of its file names.
pub fn corpus(target: &str) -> Vec<Vec<u8>> {
    let Ok(dir) = std::fs::read_dir(corpus_dir(target)) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
    files.sort();
    files.iter().filter_map(|f| std::fs::read(f).ok()).collect()
}

/// The words of the dictionary a target's inputs are made of (libFuzzer's
/// `-dict` format: `"..."` or `name="..."` a line, `\"`, `\\` and `\xHH`
/// escapes).
pub fn dictionary(target: &str) -> Vec<Vec<u8>> {
    let file = match target {
        "frame_decoder" | "server_session" | "client_session" => "frame.dict",
        "auth_parsers" => "auth.dict",
        _ => return Vec::new(),
    };
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let start = l.find('"')?;
            let body = l[start + 1..].strip_suffix('"')?;
            Some(unescape(body))
        })
        .collect()
}

fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match (b[i], b.get(i + 1)) {
            (b'\\', Some(b'x')) => {
                let hex = s
                    .get(i + 2..i + 4)
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(v) => {
                        out.push(v);
                        i += 4;
                    }
                    None => {
                        out.push(b'\\');
                        i += 1;
                    }
                }
            }
            (b'\\', Some(&c)) => {
                out.push(c);
                i += 2;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Keeps a failing input where a person can find it.
fn save(target: &str, input: &[u8]) -> Option<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    input.hash(&mut h);
    let path = std::env::temp_dir().join(format!("longhaul-fuzz-{target}-{:016x}", h.finish()));
    std::fs::write(&path, input).ok().map(|()| path)
}

fn failed(target: &'static str, why: String, input: &[u8], seed: Option<u64>) -> Failed {
    Failed {
        target,
        why,
        input: input.to_vec(),
        saved: save(target, input),
        seed,
    }
}

/// Runs every input of `target`'s corpus; how many there were.
pub fn replay(target: &'static str, run: fn(&[u8])) -> Result<usize, Failed> {
    let inputs = corpus(target);
    for input in &inputs {
        one(run, input).map_err(|why| failed(target, why, input, None))?;
    }
    Ok(inputs.len())
}

/// Runs mutations of `target`'s corpus for `time` (seed `seed`); how many.
pub fn mutate(
    target: &'static str,
    run: fn(&[u8]),
    time: Duration,
    seed: u64,
) -> Result<u64, Failed> {
    let inputs = corpus(target);
    let words = dictionary(target);
    let mut rng = fastrand::Rng::with_seed(seed);
    let until = Instant::now() + time;
    let mut n = 0u64;
    while Instant::now() < until {
        let input = mutated(&mut rng, &inputs, &words);
        one(run, &input).map_err(|why| failed(target, why, &input, Some(seed)))?;
        n += 1;
    }
    Ok(n)
}

/// A range of `len` bytes: its start and end.
fn range(rng: &mut fastrand::Rng, len: usize) -> (usize, usize) {
    let a = rng.usize(..len);
    (a, rng.usize(a..=len))
}

/// One input made from the corpus by a few mutations.
pub fn mutated(rng: &mut fastrand::Rng, inputs: &[Vec<u8>], words: &[Vec<u8>]) -> Vec<u8> {
    let mut v = match inputs.is_empty() || rng.u8(..8) == 0 {
        true => Vec::new(),
        false => inputs[rng.usize(..inputs.len())].clone(),
    };
    for _ in 0..rng.usize(1..=8) {
        let len = v.len();
        match rng.u8(..9) {
            0 if len > 0 => {
                let i = rng.usize(..len);
                v[i] ^= 1 << rng.u8(..8);
            }
            1 if len > 0 => {
                let i = rng.usize(..len);
                v[i] = rng.u8(..);
            }
            2 => {
                let at = rng.usize(..=len);
                let bytes: Vec<u8> = (0..rng.usize(1..=16)).map(|_| rng.u8(..)).collect();
                v.splice(at..at, bytes);
            }
            3 if len > 0 => {
                let (a, b) = range(rng, len);
                v.drain(a..b);
            }
            4 if len > 0 => {
                let (a, b) = range(rng, len);
                let copy = v[a..b].to_vec();
                let at = rng.usize(..=len);
                v.splice(at..at, copy);
            }
            5 if !words.is_empty() => {
                let w = words[rng.usize(..words.len())].clone();
                let at = rng.usize(..=len);
                v.splice(at..at, w);
            }
            6 if !inputs.is_empty() => {
                let other = &inputs[rng.usize(..inputs.len())];
                v.truncate(rng.usize(..=len));
                if !other.is_empty() {
                    v.extend_from_slice(&other[rng.usize(..other.len())..]);
                }
            }
            7 if len > 0 => {
                let edge: [u8; 8] = match rng.u8(..4) {
                    0 => [0; 8],
                    1 => [0xff; 8],
                    2 => [0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0x7f],
                    _ => [0, 0, 0, 0x80, 0, 0, 0, 0x80],
                };
                let n = [1, 2, 4, 8][rng.usize(..4)].min(len);
                let at = rng.usize(..=len - n);
                v[at..at + n].copy_from_slice(&edge[..n]);
            }
            _ => {
                let keep = rng.usize(..=len);
                v.truncate(keep);
            }
        }
    }
    v.truncate(MAX_LEN);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_words_are_unescaped() {
        assert_eq!(unescape(r#"\"busy\""#), b"\"busy\"");
        assert_eq!(unescape(r"a\x00b\\"), b"a\x00b\\");
        assert!(!dictionary("frame_decoder").is_empty());
    }

    #[test]
    fn mutations_stay_within_their_length_and_vary() {
        let mut rng = fastrand::Rng::with_seed(7);
        let inputs = vec![vec![1u8; 100], Vec::new()];
        let made: Vec<Vec<u8>> = (0..200).map(|_| mutated(&mut rng, &inputs, &[])).collect();
        assert!(made.iter().all(|m| m.len() <= MAX_LEN));
        assert!(made.iter().any(|m| m != &inputs[0]));
    }
}
