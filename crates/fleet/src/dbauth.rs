//! The queue's password, found the way libpq finds it, so that it need
//! not be in the `--queue` URL (where `ps` shows it to every user of the
//! node, and the shell keeps it in its history).
//!
//! In libpq's order, the first that gives one:
//! 1. the URL's own (`postgres://user:PASSWORD@...`; works, with a warning);
//! 2. the service's (`service=NAME` in the URL, else `PGSERVICE`): its
//!    section of `PGSERVICEFILE` (else `~/.pg_service.conf`), else of
//!    `PGSYSCONFDIR/pg_service.conf` (else `/etc/postgresql-common/`);
//!    the service also gives host, port, dbname, user and the TLS settings
//!    the URL leaves out;
//! 3. `PGPASSWORD`;
//! 4. the password file: `passfile=FILE` in the URL (or the service), else
//!    `PGPASSFILE`, else `~/.pgpass`; lines `host:port:dbname:user:password`,
//!    `*` matching anything, `\:` and `\\` escaped, the first match wins.
//!    As libpq does, a file that is not a regular file, or that its group
//!    or others may read or write (mode above 0600), is ignored with a
//!    warning.
//!
//! The postgres crate reads none of these; its `Config` is filled here.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use postgres::config::Host;

/// What the URL says about the password, taken out of it (the postgres
/// crate refuses keys it does not know).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthParams {
    /// `passfile=FILE`.
    pub passfile: Option<PathBuf>,
    /// `service=NAME`.
    pub service: Option<String>,
}

/// Where the password came from (for messages; never the password).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordFrom {
    Url,
    Service(String),
    Env,
    File(PathBuf),
}

impl std::fmt::Display for PasswordFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PasswordFrom::Url => write!(f, "the URL"),
            PasswordFrom::Service(s) => write!(f, "the service {s}"),
            PasswordFrom::Env => write!(f, "PGPASSWORD"),
            PasswordFrom::File(p) => write!(f, "the password file {}", p.display()),
        }
    }
}

/// How the password was found, and what was passed over on the way.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub from: Option<PasswordFrom>,
    /// Files ignored, and why (a password file others may read).
    pub notes: Vec<String>,
}

/// What to tell a user who gave no password the server accepts.
pub const WHERE_PASSWORDS_GO: &str = "give the password in PGPASSWORD, in a line HOST:PORT:DBNAME:USER:PASSWORD of ~/.pgpass (or PGPASSFILE, or passfile=FILE in the URL; mode 0600), or in a pg_service.conf service (PGSERVICE or service=NAME), not in the URL, where ps shows it";

/// Whether `url` holds a password of its own (`user:PASSWORD@`, or a
/// `password=` key).
pub fn url_has_password(url: &str) -> bool {
    let Ok((rest, _)) = split(url) else {
        return false;
    };
    let rest = crate::dbtls::split(&rest).map_or(rest, |(r, _)| r);
    rest.parse::<postgres::Config>()
        .is_ok_and(|c| c.get_password().is_some())
}

/// `url` without its `passfile` and `service`, and what they said.
pub fn split(url: &str) -> Result<(String, AuthParams), String> {
    let mut p = AuthParams::default();
    let mut take = |k: &str, v: String| -> bool {
        match k {
            "passfile" => p.passfile = Some(PathBuf::from(v)),
            "service" => p.service = Some(v),
            _ => return false,
        }
        true
    };
    let rest = crate::dbtls::strip_params(url, |k, v| take(k, v.to_string()))?;
    Ok((rest, p))
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn home() -> Option<PathBuf> {
    env("HOME").map(PathBuf::from)
}

/// The settings of service `name`: the user's service file first, then
/// the system's. An error when neither has it (libpq's rule too).
pub fn service(name: &str) -> Result<Vec<(String, String)>, String> {
    let user_file = env("PGSERVICEFILE")
        .map(PathBuf::from)
        .or_else(|| home().map(|h| h.join(".pg_service.conf")));
    let sys_file =
        PathBuf::from(env("PGSYSCONFDIR").unwrap_or_else(|| "/etc/postgresql-common".into()))
            .join("pg_service.conf");
    let mut looked = Vec::new();
    for f in user_file.into_iter().chain([sys_file]) {
        let text = match std::fs::read_to_string(&f) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                looked.push(f.display().to_string());
                continue;
            }
            Err(e) => return Err(format!("--queue: cannot read {}: {e}", f.display())),
        };
        if let Some(s) = service_in(&text, name) {
            return Ok(s);
        }
        looked.push(f.display().to_string());
    }
    Err(format!(
        "--queue: no service {name:?} in {} (PGSERVICEFILE, ~/.pg_service.conf, PGSYSCONFDIR/pg_service.conf)",
        looked.join(" or ")
    ))
}

/// The `[name]` section of a pg_service.conf.
fn service_in(text: &str, name: &str) -> Option<Vec<(String, String)>> {
    let mut inside = false;
    let mut found = None::<Vec<(String, String)>>;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            if inside {
                break;
            }
            inside = section.trim() == name;
            if inside {
                found = Some(Vec::new());
            }
            continue;
        }
        if let (true, Some((k, v))) = (inside, line.split_once('=')) {
            if let Some(f) = found.as_mut() {
                f.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
    }
    found
}

/// The service's TLS settings as a conninfo for [`crate::dbtls::split`]
/// (empty: none).
pub fn service_tls(service: &[(String, String)]) -> String {
    service
        .iter()
        .filter(|(k, _)| matches!(k.as_str(), "sslmode" | "sslrootcert" | "sslcert" | "sslkey"))
        .map(|(k, v)| crate::dbtls::conninfo_pair(k, v))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Fills what `config` lacks from the service, then its password as libpq
/// would find it.
pub fn fill(
    config: &mut postgres::Config,
    params: &AuthParams,
    service_name: Option<&str>,
    service: &[(String, String)],
) -> Result<Found, String> {
    let mut passfile = params.passfile.clone();
    let mut service_password = None;
    for (k, v) in service {
        match k.as_str() {
            "host" if config.get_hosts().is_empty() => {
                for h in v.split(',') {
                    config.host(h);
                }
            }
            "hostaddr" if config.get_hosts().is_empty() => {
                for h in v.split(',') {
                    config.host(h);
                }
            }
            "port" if config.get_ports().is_empty() => {
                for p in v.split(',') {
                    let p = p.parse::<u16>().map_err(|_| {
                        format!("--queue: the service's port {p:?} is not a port number")
                    })?;
                    config.port(p);
                }
            }
            "dbname" if config.get_dbname().is_none() => {
                config.dbname(v);
            }
            "user" if config.get_user().is_none() => {
                config.user(v);
            }
            "password" => service_password = Some(v.clone()),
            "passfile" if passfile.is_none() => passfile = Some(PathBuf::from(v)),
            _ => {}
        }
    }
    if config.get_user().is_none() {
        if let Some(u) = env("PGUSER").or_else(|| env("USER")) {
            config.user(&u);
        }
    }
    let mut found = Found::default();
    if config.get_password().is_some() {
        found.from = Some(PasswordFrom::Url);
        return Ok(found);
    }
    if let Some(p) = service_password {
        config.password(p);
        found.from = Some(PasswordFrom::Service(
            service_name.unwrap_or_default().to_string(),
        ));
        return Ok(found);
    }
    if let Some(p) = env("PGPASSWORD") {
        config.password(p);
        found.from = Some(PasswordFrom::Env);
        return Ok(found);
    }
    let file = passfile
        .or_else(|| env("PGPASSFILE").map(PathBuf::from))
        .or_else(|| home().map(|h| h.join(".pgpass")));
    if let Some(file) = file {
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(h)) => vec![h.clone()],
            Some(Host::Unix(p)) => vec![p.display().to_string(), "localhost".into()],
            None => vec!["localhost".into()],
        };
        let port = config
            .get_ports()
            .first()
            .copied()
            .unwrap_or(5432)
            .to_string();
        let user = config.get_user().unwrap_or_default().to_string();
        let db = config.get_dbname().unwrap_or(&user).to_string();
        match pgpass(&file, &host, &port, &db, &user) {
            Ok(Some(p)) => {
                config.password(p);
                found.from = Some(PasswordFrom::File(file));
            }
            Ok(None) => {}
            Err(note) => found.notes.push(note),
        }
    }
    Ok(found)
}

/// The password of the first line of the password file `file` that
/// matches; an error (a note) when the file is there but not to be used.
fn pgpass(
    file: &Path,
    hosts: &[String],
    port: &str,
    db: &str,
    user: &str,
) -> Result<Option<String>, String> {
    let m = match std::fs::metadata(file) {
        Ok(m) => m,
        Err(_) => return Ok(None),
    };
    if !m.is_file() {
        return Err(format!(
            "the password file {} is not a plain file: ignored",
            file.display()
        ));
    }
    if m.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "the password file {} has group or world access (mode {:o}), so it was ignored, as libpq does: chmod 600 {}",
            file.display(),
            m.permissions().mode() & 0o777,
            file.display()
        ));
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read the password file {}: {e}", file.display()))?;
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = pgpass_fields(line);
        let [h, p, d, u, pw] = fields.as_slice() else {
            continue;
        };
        let is = |field: &str, v: &str| field == "*" || field == v;
        if hosts.iter().any(|host| is(h, host)) && is(p, port) && is(d, db) && is(u, user) {
            return Ok(Some(pw.clone()));
        }
    }
    Ok(None)
}

/// A pgpass line's five fields (`\:` and `\\` escaped; the password is the
/// rest of the line).
fn pgpass_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(n), Some(f)) = (chars.next(), fields.last_mut()) {
                    f.push(n);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(f) = fields.last_mut() {
                    f.push(c);
                }
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passfile_and_service_are_taken_out_of_either_form() {
        let (rest, p) =
            split("postgres://u@h/db?passfile=%2Fa%2Fpw&sslmode=require&service=s1").unwrap();
        assert_eq!(rest, "postgres://u@h/db?sslmode=require");
        assert_eq!(p.passfile, Some(PathBuf::from("/a/pw")));
        assert_eq!(p.service.as_deref(), Some("s1"));
        let (rest, p) = split("host=h service='s 2' user=u").unwrap();
        assert_eq!(rest, "host='h' user='u'");
        assert_eq!(p.service.as_deref(), Some("s 2"));
        assert!(url_has_password("host=h user=u password='p w'"));
        assert!(url_has_password("postgres://u:pw@h/db?passfile=/x"));
        assert!(url_has_password("host=h user=u password=pw"));
        assert!(!url_has_password("postgres://u@h/db?sslmode=require"));
    }

    #[test]
    fn pgpass_lines_match_as_libpq_matches_them() {
        let f = pgpass_fields(r"db\:x:5432:*:u:pa:ss\\w");
        assert_eq!(f, ["db:x", "5432", "*", "u", r"pa:ss\w"]);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(
            &file,
            "# comment\nother:*:*:*:no\n127.0.0.1:5432:q:bob:first\n*:*:*:bob:second\n",
        )
        .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let h = |s: &str| vec![s.to_string()];
        assert_eq!(
            pgpass(&file, &h("127.0.0.1"), "5432", "q", "bob").unwrap(),
            Some("first".into())
        );
        assert_eq!(
            pgpass(&file, &h("127.0.0.1"), "5433", "q", "bob").unwrap(),
            Some("second".into())
        );
        assert_eq!(pgpass(&file, &h("x"), "1", "q", "eve").unwrap(), None);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = pgpass(&file, &h("x"), "1", "q", "bob").unwrap_err();
        assert!(e.contains("chmod 600") && e.contains("640"), "{e}");
    }

    #[test]
    fn a_service_section_is_read_and_its_tls_kept_apart() {
        let text = "[a]\nhost=x\n[b]\n# c\nhost = db.example\nport=5433\nsslmode=verify-full\npassword=pw\n[c]\nhost=y\n";
        let s = service_in(text, "b").unwrap();
        assert_eq!(s[0], ("host".to_string(), "db.example".to_string()));
        assert_eq!(service_tls(&s), "sslmode='verify-full'");
        assert!(service_in(text, "z").is_none());
        let mut c: postgres::Config = "postgres://".parse().unwrap();
        let found = fill(&mut c, &AuthParams::default(), Some("b"), &s).unwrap();
        assert_eq!(found.from, Some(PasswordFrom::Service("b".into())));
        assert_eq!(c.get_ports(), [5433]);
        assert_eq!(c.get_password(), Some(&b"pw"[..]));
    }
}
