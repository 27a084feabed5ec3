//! Credentials out of what the archive keeps and shows. One function
//! decides what a credential looks like, and every way into or out of the
//! archive goes through it: the command line a run records
//! ([`command_line`]), the rows as they are written, the rows an older
//! build wrote (a migration, and again as they are read:
//! [`scrub_command`], [`scrub_text`]).
//!
//! What is hidden (replaced by [`HIDDEN`]):
//! * the password of a URL's userinfo (`postgres://user:PASSWORD@host`);
//! * the value of a secret-looking key, `KEY=VALUE` in a query string, a
//!   libpq conninfo or an option (`password=`, `sslpassword=`, `token=`,
//!   `--api-key=`, ...): a key naming a password, passwd, secret, token,
//!   api key or credential, unless it names a file, path or directory;
//! * the argument after such an option (`--password VALUE`);
//! * the secret part of a longhaul token (`lh1_ID_SECRET`).
//!
//! Hiding too much is harmless, too little is not: the rules err that way.

/// What a hidden credential reads as.
pub const HIDDEN: &str = "***";

/// Whether an option or key (without its dashes) names a credential.
fn secret_key(key: &str) -> bool {
    let k = key
        .trim_start_matches('-')
        .to_ascii_lowercase()
        .replace('-', "_");
    if k.is_empty() {
        return false;
    }
    let names_a_place = ["file", "path", "dir", "_env", "_var"]
        .iter()
        .any(|s| k.ends_with(s));
    let secret = [
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "api_key",
        "credential",
    ]
    .iter()
    .any(|s| k.contains(s))
        || matches!(k.as_str(), "pass" | "pwd" | "auth" | "authorization");
    secret && !names_a_place
}

/// Ends a value or a URL's authority.
fn ends_value(c: char) -> bool {
    c.is_whitespace() || matches!(c, '&' | ';' | ',' | '"' | '\'' | '#')
}

/// `s` with every URL password, secret `KEY=VALUE` and longhaul token
/// hidden: for one argument, or for free text (an error message, JSON).
pub fn scrub_text(s: &str) -> String {
    scrub(s, false)
}

/// [`scrub_text`] for one argument of a command: a URL's password may
/// hold spaces there.
pub fn scrub_arg(s: &str) -> String {
    scrub(s, true)
}

fn scrub(s: &str, one_arg: bool) -> String {
    let s = url_passwords(s, one_arg);
    let s = secret_values(&s);
    longhaul_tokens(&s)
}

/// `scheme://user:PASSWORD@host` -> `scheme://user:***@host`. The
/// userinfo runs to the last `@` before the query: a password may hold
/// `/` or `@` (and, in one argument, spaces and quotes).
fn url_passwords(s: &str, one_arg: bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '?' || c == '#' || (!one_arg && ends_value(c)))
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(userinfo_end) => {
                let userinfo = &authority[..userinfo_end];
                match userinfo.split_once(':') {
                    Some((user, pw)) if !pw.is_empty() && pw != HIDDEN => {
                        out.push_str(user);
                        out.push(':');
                        out.push_str(HIDDEN);
                    }
                    _ => out.push_str(userinfo),
                }
                out.push_str(&authority[userinfo_end..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `password=VALUE` (any secret key, `'quoted values'` too) -> `password=***`.
fn secret_values(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(eq) = rest.find('=') {
        let (head, tail) = rest.split_at(eq);
        out.push_str(head);
        out.push('=');
        let tail = &tail[1..];
        let key_start = head
            .char_indices()
            .rev()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .map_or(0, |(i, c)| i + c.len_utf8());
        if !secret_key(&head[key_start..]) {
            rest = tail;
            continue;
        }
        let end = if let Some(q) = tail.strip_prefix('\'') {
            // A libpq quoted value: 'it''s' or 'it\'s', up to the closing quote.
            let b = q.as_bytes();
            let mut i = 0;
            while i < b.len() {
                match (b[i], b.get(i + 1)) {
                    (b'\\', _) | (b'\'', Some(b'\'')) => i += 2,
                    (b'\'', _) => break,
                    _ => i += 1,
                }
            }
            let mut end = (i + 2).min(tail.len());
            while !tail.is_char_boundary(end) {
                end += 1;
            }
            end
        } else {
            tail.find(ends_value).unwrap_or(tail.len())
        };
        if end > 0 && &tail[..end] != HIDDEN {
            out.push_str(HIDDEN);
        } else {
            out.push_str(&tail[..end]);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `lh1_ID_SECRET` -> `lh1_ID_***`.
fn longhaul_tokens(s: &str) -> String {
    const PREFIX: &str = "lh1_";
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(PREFIX) {
        let boundary = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let (head, tail) = rest.split_at(at + PREFIX.len());
        out.push_str(head);
        rest = tail;
        if !boundary {
            continue;
        }
        let Some(id_end) = tail.find('_') else {
            continue;
        };
        let id = &tail[..id_end];
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            continue;
        }
        let secret = &tail[id_end + 1..];
        let len = secret
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(secret.len());
        out.push_str(id);
        out.push('_');
        out.push_str(if len == 0 { "" } else { HIDDEN });
        rest = &secret[len..];
    }
    out.push_str(rest);
    out
}

/// A command's arguments with their credentials hidden: each argument as
/// [`scrub_text`] does it, and the argument after a secret option given
/// apart from its value (`--password VALUE`).
pub fn scrub_args<S: AsRef<str>>(args: &[S]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut hide_next = false;
    for a in args {
        let a = a.as_ref();
        if hide_next && !a.starts_with('-') {
            out.push(HIDDEN.to_string());
            hide_next = false;
            continue;
        }
        hide_next = a.starts_with("--") && !a.contains('=') && secret_key(a);
        out.push(scrub_arg(a));
    }
    out
}

/// One argument as a shell reads it back: quoted when it has to be.
fn quoted(a: &str) -> String {
    if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
        format!("'{}'", a.replace('\'', "'\\''"))
    } else {
        a.to_string()
    }
}

/// The command line a run records: `args` scrubbed and joined, each
/// quoted as a shell needs it.
pub fn command_line<S: AsRef<str>>(args: &[S]) -> String {
    scrub_args(args)
        .iter()
        .map(|a| quoted(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The words of a recorded command line (as [`command_line`] quotes them:
/// `'...'`, `\x` outside quotes).
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    cur.push(q);
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

/// A recorded command line (by this build or an older one) with its
/// credentials hidden; a scrubbed line comes back unchanged.
pub fn scrub_command(line: &str) -> String {
    let scrubbed = command_line(&words(line));
    // A line this build did not quote (an older one, written by hand)
    // still loses what the text rules find.
    if words(&scrubbed) == scrub_args(&words(line)) {
        scrubbed
    } else {
        scrub_text(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_hidden_wherever_they_are() {
        for (given, want) in [
            (
                "postgres://u:SECRET@db:5432/x?sslmode=verify-full",
                "postgres://u:***@db:5432/x?sslmode=verify-full",
            ),
            ("postgres://u@db/x", "postgres://u@db/x"),
            ("postgresql://u:p%40ss/w@ss@h/x", "postgresql://u:***@h/x"),
            ("--queue=postgres://u:S@h/x", "--queue=postgres://u:***@h/x"),
            (
                "failed at https://a:b@x.org and ftp://c:d@y",
                "failed at https://a:***@x.org and ftp://c:***@y",
            ),
            ("h://:pw@x", "h://:***@x"),
            ("no url at all: a:b@c", "no url at all: a:b@c"),
        ] {
            assert_eq!(scrub_text(given), want, "{given}");
        }
    }

    #[test]
    fn secret_keys_lose_their_values_and_paths_do_not() {
        for (given, want) in [
            (
                "host=db user=u password=SECRET dbname=x",
                "host=db user=u password=*** dbname=x",
            ),
            ("password='it''s a secret' host=db", "password=*** host=db"),
            (
                "postgres://u@h/x?password=SECRET&sslmode=require",
                "postgres://u@h/x?password=***&sslmode=require",
            ),
            ("--token=lh1_ab12_zzzz", "--token=***"),
            ("--api-key=K", "--api-key=***"),
            ("PGPASSWORD=S", "PGPASSWORD=***"),
            ("sslpassword=S", "sslpassword=***"),
            ("--token-file=/t", "--token-file=/t"),
            ("passfile=/home/u/.pgpass", "passfile=/home/u/.pgpass"),
            ("--password-file=/p", "--password-file=/p"),
            ("sslkey=/k.pem", "sslkey=/k.pem"),
            ("a=b", "a=b"),
        ] {
            assert_eq!(scrub_text(given), want, "{given}");
        }
    }

    #[test]
    fn longhaul_tokens_keep_their_id_only() {
        assert_eq!(
            scrub_text("token lh1_7e570000_testsecret-testsecret-0123 given"),
            "token lh1_7e570000_*** given"
        );
        assert_eq!(scrub_text("xlh1_a_b"), "xlh1_a_b");
        // Never a panic, whatever the text.
        for odd in [
            "password='\\é",
            "password='",
            "lh1_",
            "lh1__",
            "://@",
            "=",
            "password=",
            "a://é:é@é",
            "épassword=x",
        ] {
            let _ = scrub_text(odd);
            let _ = scrub_command(odd);
        }
    }

    #[test]
    fn an_option_apart_from_its_value_hides_the_value() {
        let args = [
            "longhaul",
            "x",
            "--password",
            "S",
            "--token",
            "T",
            "--token-file",
            "/f",
            "--secret",
            "--no",
        ];
        assert_eq!(
            scrub_args(&args),
            [
                "longhaul",
                "x",
                "--password",
                "***",
                "--token",
                "***",
                "--token-file",
                "/f",
                "--secret",
                "--no"
            ]
        );
    }

    #[test]
    fn a_recorded_line_is_scrubbed_and_a_scrubbed_one_stays() {
        let args = [
            "longhaul",
            "cp",
            "--queue",
            "postgres://u:SEC RET@h/x",
            "odd 'name'",
            "--password",
            "S2",
        ];
        let line = command_line(&args);
        assert!(!line.contains("SEC") && !line.contains("S2"), "{line}");
        assert!(line.contains("'odd '\\''name'\\'''"), "{line}");
        assert_eq!(scrub_command(&line), line);
        let old = "longhaul cp --queue 'postgres://u:SEC RET@h/x' a b --password S2";
        let new = scrub_command(old);
        assert_eq!(
            new,
            "longhaul cp --queue postgres://u:***@h/x a b --password ***"
        );
        assert_eq!(scrub_command(&new), new);
        assert!(!scrub_command("x postgres://u:SECRET@h").contains("SECRET"));
    }
}
