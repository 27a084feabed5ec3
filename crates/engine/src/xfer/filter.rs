//! rsync's include/exclude rules (`cp`/`sync` `--exclude`, `--include`,
//! `--exclude-from`): which entries the source's walk leaves out, and
//! which destination entries `sync --delete` leaves alone.
//!
//! The rules are rsync's (rsync(1), "FILTER RULES" and "PATTERN MATCHING
//! RULES"): the first rule that matches decides, and an entry no rule
//! matches is included. Each rule is `+ PATTERN` (include) or
//! `- PATTERN` (exclude), as rsync's short filter syntax writes them and
//! as they travel in `TransferRequest.filter` (PROTOCOL.md 13.4).
//!
//! A pattern is matched against an entry's path from the transfer root
//! (the source's own name is its first component, unless the source was
//! named with a trailing `/`, whose contents are the root):
//! - a trailing `/` matches only directories; a trailing `/***` matches a
//!   directory and everything in it;
//! - a leading `/` anchors the pattern at the transfer root;
//! - a pattern with no other `/` and no `**` matches the final name
//!   component at any depth; one with a `/` matches the path's last
//!   components (as many as it has), and one with `**` matches the
//!   path's end after any `/`;
//! - `*` matches within one component, `**` across `/`, `?` one byte but
//!   not `/`, `[...]` one byte of a class (`[!...]` or `[^...]` negated,
//!   `[[:alpha:]]` and the other POSIX classes); a `\` escapes a wildcard,
//!   but only in a pattern that has one.
//!
//! Patterns are read as rsync's `wildmatch` reads them: byte by byte
//! (`?` is one byte, as in rsync, not one character), `[...]` with
//! rsync's ranges, escapes and the twelve POSIX class names only (any
//! other `[:name:]` is refused, as rsync aborts on it), and a class never
//! matching `/`. Nothing of a pattern is copied into a regular
//! expression: each wildcard pattern is translated, byte by byte, into
//! `regex-automata`'s syntax (every byte escaped, every class built here
//! as a set of bytes), so a peer's text can never reach that syntax's own
//! constructs (counted repeats, Unicode classes). Patterns without a
//! wildcard are compared as strings.
//!
//! **The compile budget.** A peer (the client of a pull or a push) sends
//! the rules, and the server compiles them, so one request's rules are
//! compiled under one budget ([`BUDGET`], 4 MiB): every wildcard rule is
//! charged what its automaton takes (`meta::Regex::memory_usage`) plus
//! what its search cache can grow to ([`DFA_CACHE`] for each of its lazy
//! DFAs), a literal rule its length. The automaton of each rule is built
//! under what is left (`nfa_size_limit`), so a rule that would exceed it
//! fails while it is built, not after; the first rule over the budget
//! refuses the whole list, naming it. The server compiles only once the
//! request holds its slot (`server::files`), so `--max-tests` and the
//! queue bound how many compiles run at once.

use std::sync::Mutex;

use regex_automata::meta;
use regex_automata::util::syntax;
use regex_automata::Input;

/// The most rules a filter takes, and the longest pattern.
pub const MAX_RULES: usize = 4096;
pub const MAX_PATTERN: usize = 4096;
/// What one request's rules may take once compiled, in bytes: their
/// automata and their search caches at their largest (see the module's
/// documentation).
pub const BUDGET: usize = 4 << 20;
/// The capacity of each lazy DFA's cache of a wildcard rule (a rule's
/// anchored searches run its forward one; the reverse one is charged as
/// well); a rule that needs more clears it or falls back to the PikeVM,
/// whose cache is charged as built.
pub const DFA_CACHE: usize = 4 << 10;
/// Lazy DFAs a rule's search cache holds, each capped at [`DFA_CACHE`].
const DFAS_PER_RULE: usize = 2;

/// The twelve POSIX character classes rsync's `wildmatch` knows (ASCII,
/// as in the C locale).
const POSIX_CLASSES: [&str; 12] = [
    "alnum", "alpha", "blank", "cntrl", "digit", "graph", "lower", "print", "punct", "space",
    "upper", "xdigit",
];

/// One rule, compiled.
#[derive(Debug)]
struct Rule {
    include: bool,
    /// A trailing `/`: only directories match.
    dir_only: bool,
    /// A trailing `/***`: a directory matches as `dir/` would.
    wild3: bool,
    how: How,
    pattern: Pattern,
}

/// A rule's pattern, as it is matched.
#[derive(Debug)]
enum Pattern {
    /// No wildcard: the subject must equal it.
    Literal(String),
    /// A wildcard pattern's automaton; its search cache is the filter's
    /// (`Filter::caches`, same index).
    Wild(meta::Regex),
}

/// What a rule's pattern is matched against.
#[derive(Debug, Clone, Copy, PartialEq)]
enum How {
    /// The final component.
    Name,
    /// The last `n` components.
    Last(usize),
    /// The whole path, from the root (anchored, or a leading `**` with a
    /// `/` put before the path so that `**/x` matches `x` too).
    Whole { slash_first: bool },
    /// The path's end after any `/` (a `**` that is not leading).
    AnySuffix,
}

/// An ordered list of include/exclude rules.
#[derive(Debug)]
pub struct Filter {
    rules: Vec<Rule>,
    /// One search cache per rule (None for a literal one): held here, not
    /// in a pool per thread, so that the budget counts each once.
    caches: Mutex<Vec<Option<meta::Cache>>>,
    /// The sources were named with a trailing `/`: an entry's first
    /// component (the source's name) is not part of its path from the
    /// transfer root.
    contents: bool,
    /// The rules as given, to send on.
    text: Vec<String>,
    /// What the compiled rules are charged against [`BUDGET`].
    charged: usize,
}

impl Filter {
    /// Compiles `rules` (`+ PATTERN` / `- PATTERN`) under one
    /// [`BUDGET`]; `contents` as the transfer names its sources. An error
    /// names the rule.
    pub fn new(rules: &[String], contents: bool) -> Result<Filter, String> {
        if rules.len() > MAX_RULES {
            return Err(format!(
                "{} filter rules: at most {MAX_RULES} are taken",
                rules.len()
            ));
        }
        let mut compiled = Vec::with_capacity(rules.len());
        let mut caches = Vec::with_capacity(rules.len());
        let mut charged = 0usize;
        for (n, text) in rules.iter().enumerate() {
            let (rule, cost) = Rule::parse(text, BUDGET - charged)?;
            if charged + cost > BUDGET {
                return Err(over_budget(n, text));
            }
            charged += cost;
            caches.push(match &rule.pattern {
                Pattern::Wild(re) => Some(re.create_cache()),
                Pattern::Literal(_) => None,
            });
            compiled.push(rule);
        }
        Ok(Filter {
            rules: compiled,
            caches: Mutex::new(caches),
            contents,
            text: rules.to_vec(),
            charged,
        })
    }

    /// The rules as given.
    pub fn rules(&self) -> &[String] {
        &self.text
    }

    /// What the compiled rules are charged against [`BUDGET`], in bytes.
    pub fn charged(&self) -> usize {
        self.charged
    }

    /// What the rules' search caches hold now, in bytes (within their
    /// charge, however many paths were matched).
    pub fn cache_bytes(&self) -> usize {
        self.caches.lock().map_or(0, |c| {
            c.iter().flatten().map(meta::Cache::memory_usage).sum()
        })
    }

    /// Whether an entry, named as the walk announces it (`NAME/sub/x`,
    /// starting with the source's own name), is excluded.
    pub fn excludes_entry(&self, entry_path: &str, is_dir: bool) -> bool {
        let path = if self.contents {
            match entry_path.split_once('/') {
                Some((_, rest)) => rest,
                // The transfer root itself: never filtered.
                None => return false,
            }
        } else {
            entry_path
        };
        self.excludes(path, is_dir)
    }

    /// Whether a path from the transfer root (`a/b/c`, no leading `/`)
    /// is excluded: the first rule that matches decides.
    pub fn excludes(&self, path: &str, is_dir: bool) -> bool {
        if path.is_empty() {
            return false;
        }
        let Ok(mut caches) = self.caches.lock() else {
            return false;
        };
        self.rules
            .iter()
            .zip(caches.iter_mut())
            .find_map(|(r, cache)| r.matches(path, is_dir, cache.as_mut()).then_some(r))
            .is_some_and(|r| !r.include)
    }
}

fn over_budget(n: usize, rule: &str) -> String {
    format!(
        "filter rule {} ('{}'): the rules take more than the {} MiB a transfer's rules may (each wildcard rule about 11 KiB, more for long ones): use fewer wildcard rules, or rules without wildcards",
        n + 1,
        shorten(rule),
        BUDGET >> 20
    )
}

/// A rule as an error quotes it: at most 80 bytes of it.
fn shorten(rule: &str) -> String {
    match rule.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &rule[..i]),
        None => rule.to_string(),
    }
}

/// Rules read from an `--exclude-from`/`--include-from` file's text, as
/// rsync reads them: one pattern a line; blank lines and lines starting
/// with `;` or `#` skipped; a line starting with `- ` or `+ ` says its
/// kind, any other is of `default_include`'s kind. (rsync's `!`, which
/// clears the rules so far, is refused: say what to do instead.)
pub fn rules_from_lines(text: &str, default_include: bool) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if line == "!" {
            return Err(format!(
                "line {}: '!' (clear the rules so far) is not supported: remove the rules above it instead",
                n + 1
            ));
        }
        if line.starts_with("- ") || line.starts_with("+ ") {
            out.push(line.to_string());
        } else {
            out.push(format!(
                "{} {line}",
                if default_include { '+' } else { '-' }
            ));
        }
    }
    Ok(out)
}

impl Rule {
    /// The rule and what it is charged; its automaton, if it has one, is
    /// built under `left` bytes.
    fn parse(rule: &str, left: usize) -> Result<(Rule, usize), String> {
        let bad = |why: &str| format!("filter rule '{}': {why}", shorten(rule));
        let (include, pattern) = if let Some(p) = rule.strip_prefix("+ ") {
            (true, p)
        } else if let Some(p) = rule.strip_prefix("- ") {
            (false, p)
        } else {
            return Err(bad("must start with '+ ' (include) or '- ' (exclude)"));
        };
        if pattern.len() > MAX_PATTERN {
            return Err(bad(&format!("longer than {MAX_PATTERN} bytes")));
        }
        let mut p = pattern;
        let mut dir_only = false;
        while let Some(rest) = p.strip_suffix('/') {
            dir_only = true;
            p = rest;
        }
        let wild3 = p.ends_with("/***");
        if wild3 {
            p = &p[..p.len() - 1];
        }
        let anchored = p.starts_with('/');
        let body = p.trim_start_matches('/');
        if body.is_empty() {
            return Err(bad("the pattern is empty"));
        }
        let wild = body.contains(['*', '?', '[']);
        let wild2 = body.contains("**");
        let slashes = body.matches('/').count();
        let how = if !anchored && slashes == 0 && !wild2 {
            How::Name
        } else if !anchored && !wild2 {
            How::Last(slashes + 1)
        } else if !anchored && !body.starts_with("**") {
            How::AnySuffix
        } else {
            How::Whole {
                slash_first: !anchored,
            }
        };
        let fixed = std::mem::size_of::<Rule>() + rule.len();
        let (pattern, cost) = if wild {
            let translated = translate(body.as_bytes()).map_err(|e| bad(&e))?;
            let re = match how {
                How::AnySuffix => format!("^(?:.*/)?{translated}$"),
                _ => format!("^{translated}$"),
            };
            let re = compile(&re, left.saturating_sub(fixed)).map_err(|e| bad(&e))?;
            let cost =
                re.memory_usage() + re.create_cache().memory_usage() + DFAS_PER_RULE * DFA_CACHE;
            (Pattern::Wild(re), fixed + cost)
        } else {
            (Pattern::Literal(body.to_string()), fixed + body.len())
        };
        let rule = Rule {
            include,
            dir_only,
            wild3,
            how,
            pattern,
        };
        Ok((rule, cost))
    }

    fn matches(&self, path: &str, is_dir: bool, cache: Option<&mut meta::Cache>) -> bool {
        if self.dir_only && !is_dir {
            return false;
        }
        let subject: std::borrow::Cow<str> = match self.how {
            How::Name => path.rsplit('/').next().unwrap_or(path).into(),
            How::Last(n) => {
                let at = path
                    .char_indices()
                    .rev()
                    .filter(|&(_, c)| c == '/')
                    .nth(n - 1)
                    .map(|(i, _)| i + 1);
                match at {
                    Some(i) => path[i..].into(),
                    // As many components as the pattern, or fewer.
                    None if path.matches('/').count() + 1 == n => path.into(),
                    None => return false,
                }
            }
            How::Whole { slash_first: true } => format!("/{path}").into(),
            How::Whole { .. } | How::AnySuffix => path.into(),
        };
        match (&self.pattern, cache) {
            (Pattern::Literal(l), _) => *subject == **l,
            (Pattern::Wild(re), Some(cache)) => {
                let mut hit = |s: &str| {
                    re.search_half_with(cache, &Input::new(s).earliest(true))
                        .is_some()
                };
                (self.wild3 && is_dir && hit(&format!("{subject}/"))) || hit(&subject)
            }
            (Pattern::Wild(re), None) => re.is_match(&*subject),
        }
    }
}

/// A translated pattern's automaton, built within `limit` bytes: bytes,
/// not characters (rsync's `wildmatch` compares bytes), `.` any byte; no
/// full DFA, one-pass DFA or backtracker (their memory is not charged),
/// lazy DFAs with a cache of [`DFA_CACHE`] each.
fn compile(re: &str, limit: usize) -> Result<meta::Regex, String> {
    meta::Regex::builder()
        .configure(
            meta::Config::new()
                .nfa_size_limit(Some(limit))
                .hybrid_cache_capacity(DFA_CACHE)
                .dfa(false)
                .onepass(false)
                .backtrack(false),
        )
        .syntax(
            syntax::Config::new()
                .unicode(false)
                .utf8(false)
                .dot_matches_new_line(true),
        )
        .build(re)
        .map_err(|e| match e.size_limit() {
            Some(_) => format!(
                "it would take more than what is left of the {} MiB a transfer's rules may take: use fewer or shorter wildcard rules",
                BUDGET >> 20
            ),
            None => format!("cannot be compiled: {e}"),
        })
}

/// rsync's wildcards (its `wildmatch`) as a regular expression over bytes,
/// without anchors: `*` any bytes but `/`, `**` (or more stars) any bytes,
/// `?` one byte but `/`, `[...]` a class, `\` escaping the next byte; any
/// other byte stands for itself. An error for a `[` without its `]` or an
/// unknown `[:name:]`.
fn translate(pattern: &[u8]) -> Result<String, String> {
    let mut out = String::new();
    let mut i = 0;
    while let Some(&b) = pattern.get(i) {
        i += 1;
        match b {
            b'\\' => match pattern.get(i) {
                Some(&n) => {
                    i += 1;
                    push_byte(&mut out, n);
                }
                None => push_byte(&mut out, b'\\'),
            },
            b'*' if pattern.get(i) == Some(&b'*') => {
                while pattern.get(i) == Some(&b'*') {
                    i += 1;
                }
                out.push_str(".*");
            }
            b'*' => out.push_str("[^/]*"),
            b'?' => out.push_str("[^/]"),
            b'[' => {
                let (set, next) = class(pattern, i)?;
                i = next;
                push_class(&mut out, &set);
            }
            b => push_byte(&mut out, b),
        }
    }
    Ok(out)
}

/// The bytes of the class whose `[` is just before `pattern[start]`, and
/// where the pattern goes on after its `]` (rsync's `wildmatch`: a `!`
/// or `^` first negates; the first member may be `]`; `a-z` is a range
/// of bytes, empty if reversed; `\x` is `x`; `[:name:]` a POSIX class, and
/// a `[:` with no `:]` before the next `]` a plain `[`). A class never
/// matches `/`.
fn class(pattern: &[u8], start: usize) -> Result<([bool; 256], usize), String> {
    let unclosed = || "unbalanced '['".to_string();
    let mut set = [false; 256];
    let mut i = start;
    let negated = matches!(pattern.get(i), Some(b'!' | b'^'));
    if negated {
        i += 1;
    }
    let mut prev: Option<u8> = None;
    let mut first = true;
    loop {
        let c = *pattern.get(i).ok_or_else(unclosed)?;
        i += 1;
        if c == b']' && !first {
            break;
        }
        first = false;
        match c {
            b'\\' => {
                let n = *pattern.get(i).ok_or_else(unclosed)?;
                i += 1;
                set[usize::from(n)] = true;
                prev = Some(n);
            }
            b'-' if prev.is_some() && pattern.get(i).is_some_and(|&n| n != b']') => {
                let mut hi = pattern[i];
                i += 1;
                if hi == b'\\' {
                    hi = *pattern.get(i).ok_or_else(unclosed)?;
                    i += 1;
                }
                for b in prev.unwrap_or(hi)..=hi {
                    set[usize::from(b)] = true;
                }
                prev = None;
            }
            b'[' if pattern.get(i) == Some(&b':') => {
                let names = i + 1;
                let close = pattern[names..]
                    .iter()
                    .position(|&x| x == b']')
                    .map(|k| names + k)
                    .ok_or_else(unclosed)?;
                if close > names && pattern[close - 1] == b':' {
                    posix(&pattern[names..close - 1], &mut set)?;
                    i = close + 1;
                    prev = None;
                } else {
                    set[usize::from(b'[')] = true;
                    prev = Some(b'[');
                }
            }
            c => {
                set[usize::from(c)] = true;
                prev = Some(c);
            }
        }
    }
    if negated {
        for b in set.iter_mut() {
            *b = !*b;
        }
    }
    set[usize::from(b'/')] = false;
    Ok((set, i))
}

/// Adds POSIX class `name`'s bytes to `set`; an error for a name rsync
/// does not know.
fn posix(name: &[u8], set: &mut [bool; 256]) -> Result<(), String> {
    let is: fn(u8) -> bool = match name {
        b"alnum" => |b| b.is_ascii_alphanumeric(),
        b"alpha" => |b| b.is_ascii_alphabetic(),
        b"blank" => |b| b == b' ' || b == b'\t',
        b"cntrl" => |b| b.is_ascii_control(),
        b"digit" => |b| b.is_ascii_digit(),
        b"graph" => |b| b.is_ascii_graphic(),
        b"lower" => |b| b.is_ascii_lowercase(),
        b"print" => |b| b.is_ascii_graphic() || b == b' ',
        b"punct" => |b| b.is_ascii_punctuation(),
        b"space" => |b| matches!(b, b' ' | b'\t'..=b'\r'),
        b"upper" => |b| b.is_ascii_uppercase(),
        b"xdigit" => |b| b.is_ascii_hexdigit(),
        _ => {
            return Err(format!(
                "'[:{}:]' is not a character class (rsync's are {})",
                String::from_utf8_lossy(name),
                POSIX_CLASSES.join(", ")
            ))
        }
    };
    for b in 0..=255u8 {
        if is(b) {
            set[usize::from(b)] = true;
        }
    }
    Ok(())
}

/// One byte as the regular expression's syntax reads it literally.
fn push_byte(out: &mut String, b: u8) {
    if b.is_ascii_alphanumeric() {
        out.push(char::from(b));
    } else {
        out.push_str(&format!("\\x{b:02x}"));
    }
}

/// A set of bytes as a class of ranges (one that matches nothing when
/// the set is empty).
fn push_class(out: &mut String, set: &[bool; 256]) {
    out.push('[');
    let mut b = 0usize;
    let mut any = false;
    while b < 256 {
        if !set[b] {
            b += 1;
            continue;
        }
        let lo = b;
        while b + 1 < 256 && set[b + 1] {
            b += 1;
        }
        out.push_str(&format!("\\x{lo:02x}-\\x{b:02x}"));
        any = true;
        b += 1;
    }
    if !any {
        out.push_str("^\\x00-\\xff");
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(rules: &[&str], contents: bool) -> Filter {
        let rules: Vec<String> = rules.iter().map(|s| s.to_string()).collect();
        Filter::new(&rules, contents).expect("rules compile")
    }

    /// The paths of `tree` (directories end in `/`) the rules keep, as a
    /// walk would find them: an excluded directory's contents are never
    /// looked at.
    fn kept(rules: &[&str], tree: &[&str]) -> Vec<String> {
        let f = filter(rules, false);
        let mut out = Vec::new();
        let mut dropped: Vec<String> = Vec::new();
        for t in tree {
            let is_dir = t.ends_with('/');
            let path = t.trim_end_matches('/');
            if dropped.iter().any(|d| path.starts_with(&format!("{d}/"))) {
                continue;
            }
            if f.excludes(path, is_dir) {
                if is_dir {
                    dropped.push(path.to_string());
                }
                continue;
            }
            out.push(t.to_string());
        }
        out
    }

    /// rsync(1), "PATTERN MATCHING RULES": each documented example, with
    /// paths it names as matching and paths it says do not.
    #[test]
    fn rsyncs_documented_pattern_examples() {
        // (rule, path, is_dir, excluded)
        let table: &[(&str, &str, bool, bool)] = &[
            // "-f'- *.o' would exclude all filenames ending with .o"
            ("- *.o", "x.o", false, true),
            ("- *.o", "src/deep/x.o", false, true),
            ("- *.o", "x.c", false, false),
            ("- *.o", "x.o/y", false, false),
            // "-f'- /foo' would exclude a file (or directory) named foo in
            // the transfer-root directory"
            ("- /foo", "foo", false, true),
            ("- /foo", "foo", true, true),
            ("- /foo", "a/foo", false, false),
            // "-f'- foo/' would exclude any directory named foo"
            ("- foo/", "foo", true, true),
            ("- foo/", "a/b/foo", true, true),
            ("- foo/", "foo", false, false),
            // "-f'- foo/*/bar' would exclude any file/directory named bar
            // which is at two levels below a directory named foo"
            ("- foo/*/bar", "foo/x/bar", false, true),
            ("- foo/*/bar", "top/foo/x/bar", true, true),
            ("- foo/*/bar", "foo/bar", false, false),
            ("- foo/*/bar", "foo/x/y/bar", false, false),
            // "-f'- /foo/**/bar' would exclude any file/directory named bar
            // that was two or more levels below a top-level directory named
            // foo (note that /foo/bar is not excluded by this)"
            ("- /foo/**/bar", "foo/x/bar", false, true),
            ("- /foo/**/bar", "foo/x/y/z/bar", false, true),
            ("- /foo/**/bar", "foo/bar", false, false),
            ("- /foo/**/bar", "top/foo/x/bar", false, false),
            // "foo means that the final path component must be foo while
            // foo/bar would match the last 2 elements of the path"
            ("- foo", "a/b/foo", false, true),
            ("- foo", "a/foo/b", false, false),
            ("- foo", "xfoo", false, false),
            ("- foo/bar", "a/foo/bar", false, true),
            ("- foo/bar", "foo/bar", false, true),
            ("- foo/bar", "a/xfoo/bar", false, false),
            // "a '?' matches any single character except a slash"
            ("- a?c", "abc", false, true),
            ("- /a?c", "a/c", false, false),
            // "a '*' matches zero or more non-slash characters"
            ("- /a*", "abc", false, true),
            ("- /a*", "a/c", false, false),
            // "a '**' matches zero or more characters, including slashes"
            ("- /a**", "a/b/c", false, true),
            ("- /a**z", "a/b/z", false, true),
            // "a '[' introduces a character class, such as [a-z] or
            // [[:alpha:]]"
            ("- [a-z].txt", "q.txt", false, true),
            ("- [a-z].txt", "Q.txt", false, false),
            ("- [[:alpha:]]1", "Q1", false, true),
            ("- [[:alpha:]]1", "71", false, false),
            ("- [!a]x", "bx", false, true),
            ("- [!a]x", "ax", false, false),
            // "dir_name/*** will match both the dir_name directory (as if
            // dir_name/ had been specified) and everything in the directory"
            ("- dir_name/***", "dir_name", true, true),
            ("- dir_name/***", "dir_name/a/b", false, true),
            ("- dir_name/***", "dir_name", false, false),
            // "the pattern foo\bar matches that single backslash literally,
            // while the pattern foo\bar* would need to be changed to
            // foo\\bar* ..."
            ("- foo\\bar", "foo\\bar", false, true),
            ("- foo\\bar*", "foobarx", false, true),
            ("- foo\\\\bar*", "foo\\barx", false, true),
            // Not a wildcard: rsync's `*` and `?` only.
            ("- {a,b}", "{a,b}", false, true),
            ("- {a,b}", "a", false, false),
        ];
        for &(rule, path, is_dir, excluded) in table {
            assert_eq!(
                filter(&[rule], false).excludes(path, is_dir),
                excluded,
                "rule {rule:?} on {path:?} (dir: {is_dir})"
            );
        }
    }

    /// rsync(1)'s rule-list examples: first match wins, an excluded
    /// directory's contents are not walked.
    #[test]
    fn rsyncs_documented_rule_lists() {
        // The SIMPLE INCLUDE/EXCLUDE EXAMPLE's tree, sent as `x`.
        let tree = [
            "x/",
            "x/file.txt",
            "x/y/",
            "x/y/file.txt",
            "x/y/zzz.txt",
            "x/z/",
            "x/z/file.txt",
        ];
        // "-f'+ x/' -f'+ x/y/' -f'+ x/y/file.txt' -f'- *' x host:/tmp/"
        // transfers x/y/file.txt and the directories needed to hold it.
        assert_eq!(
            kept(&["+ x/", "+ x/y/", "+ x/y/file.txt", "- *"], &tree),
            ["x/", "x/y/", "x/y/file.txt"]
        );
        // "-f'- zzz.txt' x" omits the zzz.txt file.
        assert_eq!(
            kept(&["- zzz.txt"], &tree),
            [
                "x/",
                "x/file.txt",
                "x/y/",
                "x/y/file.txt",
                "x/z/",
                "x/z/file.txt"
            ]
        );
        // "-f'+ file.txt' -f'- *' x/" copies just x/file.txt: y and z are
        // excluded (the transfer root is x's contents).
        let f = filter(&["+ file.txt", "- *"], true);
        assert!(!f.excludes_entry("x", true));
        assert!(!f.excludes_entry("x/file.txt", false));
        assert!(f.excludes_entry("x/y", true));
        assert!(f.excludes_entry("x/z", true));
        // "-f'+ */' -f'+ *.c' -f'- *' would include all directories and .c
        // source files but nothing else"
        assert_eq!(
            kept(
                &["+ */", "+ *.c", "- *"],
                &["a/", "a/m.c", "a/m.h", "a/b/", "a/b/n.c", "README"]
            ),
            ["a/", "a/m.c", "a/b/", "a/b/n.c"]
        );
        // "-f'+ foo/' -f'+ foo/bar.c' -f'- *' would include only the foo
        // directory and foo/bar.c"
        assert_eq!(
            kept(
                &["+ foo/", "+ foo/bar.c", "- *"],
                &["foo/", "foo/bar.c", "foo/baz.c", "other/", "other/bar.c"]
            ),
            ["foo/", "foo/bar.c"]
        );
        // An include after the exclude that matches has no effect.
        assert_eq!(kept(&["- *.c", "+ m.c"], &["a/", "a/m.c"]), ["a/"]);
    }

    /// ANCHORING INCLUDE/EXCLUDE PATTERNS: `/me/foo/bar` for
    /// `rsync -a /home/me /home/you /dest`, `/foo/bar` for `/home/me/`.
    #[test]
    fn anchoring_follows_the_trailing_slash() {
        let by_name = filter(&["- /me/foo/bar"], false);
        assert!(by_name.excludes_entry("me/foo/bar", false));
        assert!(!by_name.excludes_entry("you/me/foo/bar", false));
        let contents = filter(&["- /foo/bar"], true);
        assert!(contents.excludes_entry("me/foo/bar", false));
        assert!(!contents.excludes_entry("me/x/foo/bar", false));
    }

    #[test]
    fn from_lines_reads_rsyncs_file_format() {
        let text = "# comment\n; also\n\n*.o\n+ keep.o\n- drop\n";
        assert_eq!(
            rules_from_lines(text, false).unwrap(),
            ["- *.o", "+ keep.o", "- drop"]
        );
        assert!(rules_from_lines("!\n", false).is_err());
    }

    #[test]
    fn bad_rules_are_refused_with_their_text() {
        for bad in ["* x", "- ", "- [abc", "- /"] {
            let e = Filter::new(&[bad.to_string()], false).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        let many = vec!["- x".to_string(); MAX_RULES + 1];
        assert!(Filter::new(&many, false).is_err());
        let long = format!("- {}", "a".repeat(MAX_PATTERN + 1));
        assert!(Filter::new(&[long], false).is_err());
    }

    /// rsync's classes, read as its `wildmatch` reads them (recorded
    /// against rsync 3.2's): the twelve POSIX names and nothing else; a
    /// `[:` with no `:]` before the next `]` is a plain `[`; `/` never.
    #[test]
    fn classes_take_rsyncs_syntax_and_its_posix_names_only() {
        let table: &[(&str, &str, bool)] = &[
            ("- [[:digit:]]x", "7x", true),
            ("- [[:digit:]]x", "ax", false),
            ("- [[:upper:][:digit:]]", "Q", true),
            ("- [![:alnum:]]", "_", true),
            ("- [![:alnum:]]", "a", false),
            ("- [[:space:]]", " ", true),
            ("- [[:punct:]]", "!", true),
            ("- [[:xdigit:]]", "F", true),
            ("- [[:xdigit:]]", "g", false),
            // `[[:a]]`: no `:]` before the first `]`, so `[`, `:` and `a`,
            // then a literal `]`.
            ("- [[:a]]", "a]", true),
            ("- [[:a]]", "[]", true),
            ("- [[:a]]", "a", false),
            // The pattern: its `\w{20}` is `w{20}` literally.
            ("- [[:a]]\\w{20}[[b:]]", "a]w{20}b]", true),
            ("- [[:a]]\\w{20}[[b:]]", "a]wwwwwwwwwwwwwwwwwwwwb]", false),
            // The first member may be `]`; `-` first or last is literal.
            ("- []a]", "]", true),
            ("- [-a]", "-", true),
            ("- [a-]", "-", true),
            // A reversed range is empty, as in rsync.
            ("- x[z-a]", "xm", false),
            // A class never matches `/`, negated or not.
            ("- /a[!x]b", "a/b", false),
            ("- /a[/]b", "a/b", false),
            ("- /a[[:punct:]]b", "a/b", false),
            // `?` is one byte, as rsync's: two for an e with an acute.
            ("- caf?", "caf\u{e9}", false),
            ("- caf??", "caf\u{e9}", true),
            ("- caf\u{e9}*", "caf\u{e9}s", true),
        ];
        for &(rule, path, excluded) in table {
            assert_eq!(
                filter(&[rule], false).excludes(path, false),
                excluded,
                "rule {rule:?} on {path:?}"
            );
        }
        for bad in [
            "- [[:alpha]]",
            "- [[:a:]]",
            "- [[:ALPHA:]]x",
            "- x[[:word:]]",
        ] {
            match Filter::new(&[bad.to_string()], false) {
                Err(e) => assert!(e.contains("not a character class"), "{bad}: {e}"),
                Ok(_) if bad == "- [[:alpha]]" => {}
                Ok(_) => panic!("{bad} taken"),
            }
        }
        // `[[:alpha]]` is `[`, `:`, `a`, `l`, `p`, `h` then `]`: rsync's
        // reading too.
        assert!(filter(&["- [[:alpha]]"], false).excludes("h]", false));
    }

    /// Recorded requests of issue 40, as a peer sent them: each is taken
    /// or refused under the one budget, never compiled beyond it.
    #[test]
    fn attacker_one_budget_bounds_every_request() {
        let question_marks = vec![format!("- {}", "?".repeat(200)); 1000];
        let posix_trick = vec![format!("- {}", "[[:a]]\\w{20}[[b:]]".repeat(200)); 4096];
        let stars = vec![format!("- {}", "*a".repeat(2000)); 4096];
        let ranges = vec![format!("- {}", "[!a-z]*".repeat(500)); 4096];
        for rules in [question_marks, posix_trick, stars, ranges] {
            match Filter::new(&rules, false) {
                Err(e) => assert!(e.contains("MiB"), "{e}"),
                Ok(f) => assert!(f.charged() <= BUDGET, "{}", f.charged()),
            }
        }
        // What a user's long exclude list looks like fits: two hundred
        // wildcard rules and four thousand plain names.
        let mut rules: Vec<String> = (0..200).map(|i| format!("- *.x{i}")).collect();
        rules.extend((0..3800).map(|i| format!("- name{i}")));
        let f = Filter::new(&rules, false).expect("a long exclude list fits");
        assert!(f.charged() <= BUDGET);
        assert!(f.excludes("a/b.x17", false));
        assert!(f.excludes("a/name3799", true));
        assert!(!f.excludes("a/b.x200", false));
    }

    /// However many and whatever paths are matched, the search caches
    /// stay within what the rules were charged.
    #[test]
    fn the_caches_stay_within_their_charge() {
        // Patterns whose DFA has many states (the `a` 12 bytes from the
        // end), matched against varied names.
        let rules: Vec<String> = (0..20)
            .map(|i| format!("- *a{}{i}", "?".repeat(12)))
            .chain([
                "- **/x*y*z/**".to_string(),
                "+ [[:alpha:]]*[!q]".to_string(),
            ])
            .collect();
        let f = Filter::new(&rules, false).unwrap();
        let mut rng = longhaul_proto::data::Rng::new(1);
        for n in 0..20_000u32 {
            let x = rng.next();
            let name: String = (0..40)
                .map(|k| char::from(b"ab/xyzq"[((x >> (k % 60)) as usize + k) % 7]))
                .collect();
            f.excludes(&format!("d{n}/{name}"), n % 3 == 0);
        }
        let automata: usize = f
            .rules
            .iter()
            .map(|r| match &r.pattern {
                Pattern::Wild(re) => re.memory_usage(),
                Pattern::Literal(_) => 0,
            })
            .sum();
        assert!(
            automata + f.cache_bytes() <= f.charged(),
            "automata {automata} + caches {} over the charge {}",
            f.cache_bytes(),
            f.charged()
        );
    }
}
