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
//! - `*` matches within one component, `**` across `/`, `?` one character
//!   but not `/`, `[...]` one character of a class (`[!...]` or `[^...]`
//!   negated, `[[:alpha:]]` and the other POSIX classes); a `\` escapes
//!   a wildcard, but only in a pattern that has one.
//!
//! Wildcard patterns are translated to the `regex` crate's syntax (the
//! matcher globset builds on): globset's own `**` is not rsync's (its
//! `a/**/b` also matches `a/b`, and `a**` does not cross `/`), so the
//! translation below keeps rsync's meaning and leaves the matching to
//! `regex`.

use regex::{Regex, RegexBuilder};

/// The most rules a filter takes, and the longest pattern: a peer's
/// request cannot make the server compile without bound.
pub const MAX_RULES: usize = 4096;
pub const MAX_PATTERN: usize = 4096;

/// One rule, compiled.
#[derive(Debug, Clone)]
struct Rule {
    include: bool,
    /// A trailing `/`: only directories match.
    dir_only: bool,
    /// A trailing `/***`: a directory matches as `dir/` would.
    wild3: bool,
    how: How,
    re: Regex,
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
#[derive(Debug, Clone)]
pub struct Filter {
    rules: Vec<Rule>,
    /// The sources were named with a trailing `/`: an entry's first
    /// component (the source's name) is not part of its path from the
    /// transfer root.
    contents: bool,
    /// The rules as given, to send on.
    text: Vec<String>,
}

impl Filter {
    /// Compiles `rules` (`+ PATTERN` / `- PATTERN`); `contents` as the
    /// transfer names its sources. An error names the rule.
    pub fn new(rules: &[String], contents: bool) -> Result<Filter, String> {
        if rules.len() > MAX_RULES {
            return Err(format!(
                "{} filter rules: at most {MAX_RULES} are taken",
                rules.len()
            ));
        }
        let compiled = rules
            .iter()
            .map(|r| Rule::parse(r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Filter {
            rules: compiled,
            contents,
            text: rules.to_vec(),
        })
    }

    /// The rules as given.
    pub fn rules(&self) -> &[String] {
        &self.text
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
        self.rules
            .iter()
            .find(|r| r.matches(path, is_dir))
            .is_some_and(|r| !r.include)
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
    fn parse(rule: &str) -> Result<Rule, String> {
        let bad = |why: &str| format!("filter rule '{rule}': {why}");
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
        let mut owned;
        let wild3 = p.ends_with("/***");
        if wild3 {
            owned = p[..p.len() - 1].to_string();
            p = &owned;
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
        owned = if wild {
            translate(body).ok_or_else(|| bad("unbalanced '['"))?
        } else {
            regex::escape(body)
        };
        let re = match how {
            How::AnySuffix => format!("^(?s:(?:.*/)?{owned})$"),
            _ => format!("^(?s:{owned})$"),
        };
        let re = RegexBuilder::new(&re)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| bad(&e.to_string()))?;
        Ok(Rule {
            include,
            dir_only,
            wild3,
            how,
            re,
        })
    }

    fn matches(&self, path: &str, is_dir: bool) -> bool {
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
        if self.wild3 && is_dir && self.re.is_match(&format!("{subject}/")) {
            return true;
        }
        self.re.is_match(&subject)
    }
}

/// rsync's wildcards as a regex (without anchors); None for a `[` with
/// no closing `]`.
fn translate(pattern: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(n) => out.push_str(&regex::escape(&n.to_string())),
                None => out.push_str(r"\\"),
            },
            '*' => {
                if chars.peek() == Some(&'*') {
                    while chars.peek() == Some(&'*') {
                        chars.next();
                    }
                    out.push_str(".*");
                } else {
                    out.push_str("[^/]*");
                }
            }
            '?' => out.push_str("[^/]"),
            '[' => {
                let mut class = String::from("[");
                if matches!(chars.peek(), Some('!' | '^')) {
                    chars.next();
                    class.push('^');
                }
                let mut first = true;
                let mut closed = false;
                while let Some(c) = chars.next() {
                    match c {
                        ']' if !first => {
                            closed = true;
                            break;
                        }
                        '[' if chars.peek() == Some(&':') => {
                            // A POSIX class, `[:alpha:]`, as regex has it.
                            let mut name = String::from("[");
                            for n in chars.by_ref() {
                                name.push(n);
                                if name.len() > 2 && name.ends_with(":]") {
                                    break;
                                }
                            }
                            class.push_str(&name);
                        }
                        '\\' => {
                            let n = chars.next()?;
                            class.push('\\');
                            class.push(n);
                        }
                        '-' => class.push('-'),
                        c if c.is_alphanumeric() => class.push(c),
                        c => {
                            class.push('\\');
                            class.push(c);
                        }
                    }
                    first = false;
                }
                if !closed {
                    return None;
                }
                class.push(']');
                out.push_str(&class);
            }
            c => out.push_str(&regex::escape(&c.to_string())),
        }
    }
    Some(out)
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
}
