//! TLS to the queue's PostgreSQL server.
//!
//! The `--queue` URL names TLS as libpq does (`sslmode`, `sslrootcert`);
//! the postgres crate reads neither a root file nor a verifying mode, so
//! both are taken out of the URL here and the connection is made with a
//! rustls connector that always verifies the server's certificate chain
//! and name:
//!
//! * `sslmode=require`, `verify-ca` and `verify-full` all verify in full,
//!   so a password never goes to a server a man in the middle could stand
//!   in for;
//! * `sslmode=disable`, or none, speaks plaintext (a password is then
//!   refused unless the database is on this host: [`crate::queue`]);
//! * `allow` and `prefer`, which fall back to plaintext without a word,
//!   are refused.
//!
//! The roots: `sslrootcert=FILE` (PEM), else `~/.postgresql/root.crt` as
//! libpq reads it, else the system's certificate store. A client
//! certificate (a server's `cert` authentication, or `clientcert=`):
//! `sslcert=FILE` and `sslkey=FILE` (PEM), both or neither.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

/// A verified TLS connection to make, and what to verify it against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbTls {
    /// `sslrootcert`, if the URL named one.
    roots: Option<PathBuf>,
    /// `sslcert` and `sslkey`: this client's certificate chain and key.
    client: Option<(PathBuf, PathBuf)>,
}

/// What a `--queue` URL looks like, for errors.
pub(crate) const URL_FORMS: &str = "write postgres://USER@HOST[:PORT]/DB[?sslmode=verify-full&sslrootcert=CA.pem], or libpq's host=HOST dbname=DB user=USER (quote a value with spaces: 'a b')";

/// `url` (a URL, or libpq's `key=value` form) without the parameters that
/// `take(key, value)` takes (it says whether it took one). A URL's query
/// values are percent-decoded (`+` stays a `+`, as libpq reads it); the
/// `key=value` form is read as libpq reads it ([`conninfo_pairs`]: quoted
/// values may hold spaces) and what is kept is written back quoted, for
/// the driver's own parser (`postgres::Config`'s `FromStr`), which keeps
/// its tokenizer to itself and refuses the keys taken here.
pub(crate) fn strip_params(
    url: &str,
    mut take: impl FnMut(&str, &str) -> bool,
) -> Result<String, String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(match url.split_once('?') {
            None => url.to_string(),
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|kv| {
                        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                        !take(
                            k,
                            &percent_encoding::percent_decode_str(v).decode_utf8_lossy(),
                        )
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        });
    }
    let kept: Vec<String> = conninfo_pairs(url)?
        .into_iter()
        .filter(|(k, v)| !take(k, v))
        .map(|(k, v)| conninfo_pair(&k, &v))
        .collect();
    Ok(kept.join(" "))
}

/// `key='value'`, quoted as [`conninfo_pairs`] (and libpq) read it back.
pub(crate) fn conninfo_pair(key: &str, value: &str) -> String {
    format!(
        "{key}='{}'",
        value.replace('\\', "\\\\").replace('\'', "\\'")
    )
}

/// The `key=value` pairs of a libpq connection string, as libpq's
/// `conninfo_parse` reads them: spaces around `=` allowed; a value is a
/// run of non-spaces or a single-quoted string, in both of which `\`
/// takes the next character as it is.
pub(crate) fn conninfo_pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut it = s.chars().peekable();
    let skip_spaces = |it: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while it.next_if(|c| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_spaces(&mut it);
        if it.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = it.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        skip_spaces(&mut it);
        if it.next() != Some('=') {
            // The word is not echoed: it may be a password written without its key.
            return Err(format!(
                "--queue: neither a postgres:// URL nor key=value settings (a word has no =VALUE); {URL_FORMS}"
            ));
        }
        skip_spaces(&mut it);
        let mut value = String::new();
        if it.next_if_eq(&'\'').is_some() {
            loop {
                match it.next() {
                    Some('\\') => value.extend(it.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => {
                        return Err(format!(
                            "--queue: the quoted value of {key} has no closing quote; {URL_FORMS}"
                        ))
                    }
                }
            }
        } else {
            while let Some(c) = it.next_if(|c| !c.is_whitespace()) {
                match c {
                    '\\' => value.extend(it.next()),
                    c => value.push(c),
                }
            }
        }
        pairs.push((key, value));
    }
}

/// `url` without its `sslmode` and `sslrootcert`, and the TLS they ask
/// for (`None`: plaintext).
pub fn split(url: &str) -> Result<(String, Option<DbTls>), String> {
    let (mut mode, mut roots) = (None::<String>, None::<PathBuf>);
    let (mut cert, mut key) = (None::<PathBuf>, None::<PathBuf>);
    let mut take = |k: &str, value: &str| -> bool {
        match k {
            "sslmode" => mode = Some(value.to_string()),
            "sslrootcert" => roots = Some(PathBuf::from(value)),
            "sslcert" => cert = Some(PathBuf::from(value)),
            "sslkey" => key = Some(PathBuf::from(value)),
            _ => return false,
        }
        true
    };
    let rest = strip_params(url, &mut take)?;
    let client =
        match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err(
                "--queue: give sslcert and sslkey together (this client's certificate and its key)"
                    .into(),
            ),
        };
    let tls = match mode.as_deref() {
        None | Some("disable") => {
            if roots.is_some() || client.is_some() {
                return Err(
                    "--queue: a certificate is given (sslrootcert, sslcert) but TLS is not: add sslmode=verify-full"
                        .into(),
                );
            }
            None
        }
        Some("require" | "verify-ca" | "verify-full") => Some(DbTls { roots, client }),
        Some(m @ ("allow" | "prefer")) => {
            return Err(format!(
                "--queue: sslmode={m} falls back to plaintext without a word; write sslmode=verify-full (TLS, the server's certificate verified) or sslmode=disable"
            ))
        }
        Some(m) => {
            return Err(format!(
                "--queue: sslmode={m} is not one of disable, require, verify-ca, verify-full"
            ))
        }
    };
    Ok((rest, tls))
}

impl DbTls {
    /// The connector: TLS 1.3 (this build's rustls), the server's chain and name checked
    /// against the roots.
    pub fn connector(&self) -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
        let mut store = rustls::RootCertStore::empty();
        let home_root = std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".postgresql/root.crt"))
            .filter(|p| p.exists());
        match self.roots.as_ref().or(home_root.as_ref()) {
            Some(file) => {
                let certs = CertificateDer::pem_file_iter(file)
                    .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| {
                        format!(
                            "--queue: cannot read CA certificates from {} (sslrootcert): {e}",
                            file.display()
                        )
                    })?;
                store.add_parsable_certificates(certs);
                if store.is_empty() {
                    return Err(format!(
                        "--queue: {} (sslrootcert) holds no usable CA certificate",
                        file.display()
                    ));
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                store.add_parsable_certificates(found.certs);
                if store.is_empty() {
                    return Err("--queue: no CA certificates in this system's store to verify the database against: give sslrootcert=FILE (the CA that signed its certificate)".into());
                }
            }
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("--queue: TLS set-up failed: {e}"))?
            .with_root_certificates(store);
        let config = match &self.client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| {
                        format!(
                            "--queue: cannot read the client certificate {} (sslcert): {e}",
                            cert.display()
                        )
                    })?;
                if chain.is_empty() {
                    return Err(format!(
                        "--queue: {} (sslcert) holds no certificate",
                        cert.display()
                    ));
                }
                let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    format!(
                        "--queue: cannot read the client key {} (sslkey): {e}",
                        key.display()
                    )
                })?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                    format!(
                        "--queue: the client certificate {} and key {} do not go together: {e}",
                        cert.display(),
                        key.display()
                    )
                })?
            }
        };
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    }
}

/// A connection error, with what to check when it is the TLS handshake.
pub fn explained(e: &postgres::Error) -> String {
    let mut why = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        why = format!("{why}: {s}");
        source = s.source();
    }
    if why.contains("client certificate") {
        why.push_str(" (the server asks for this client's certificate: give sslcert=FILE and sslkey=FILE, signed by a CA the server trusts, naming the user)");
    } else if why.contains("certificate") || why.contains("CertificateUnknown") {
        why.push_str(
            " (TLS: is sslrootcert the CA that signed the server's certificate, and is the URL's host a name in it?)",
        );
    } else if why.contains("server does not support TLS") {
        why.push_str(" (turn on ssl in its postgresql.conf, or reach it over a private network with sslmode=disable)");
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_is_taken_out_of_the_url_and_the_rest_kept() {
        let (rest, tls) =
            split("postgres://u:p@db.example/q?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem").unwrap();
        assert_eq!(rest, "postgres://u:p@db.example/q?application_name=x");
        assert_eq!(
            tls,
            Some(DbTls {
                roots: Some("/etc/ca.pem".into()),
                client: None
            })
        );
        let (rest, tls) = split("postgres://db/q?sslmode=require").unwrap();
        assert_eq!(
            (rest.as_str(), tls),
            (
                "postgres://db/q",
                Some(DbTls {
                    roots: None,
                    client: None
                })
            )
        );
        let (_, tls) =
            split("postgres://db/q?sslmode=verify-full&sslcert=/c.pem&sslkey=/k.pem").unwrap();
        assert_eq!(
            tls.unwrap().client,
            Some(("/c.pem".into(), "/k.pem".into()))
        );
        let (rest, tls) = split("postgres://db/q").unwrap();
        assert_eq!((rest.as_str(), tls), ("postgres://db/q", None));
        let (rest, tls) = split("host=db user=u sslmode=verify-ca sslrootcert=/ca.pem").unwrap();
        assert_eq!(rest, "host='db' user='u'");
        assert_eq!(
            tls,
            Some(DbTls {
                roots: Some("/ca.pem".into()),
                client: None
            })
        );
        assert_eq!(split("postgres://db/q?sslmode=disable").unwrap().1, None);
    }

    #[test]
    fn quoted_values_keep_their_spaces_and_reach_the_driver_whole() {
        let (rest, tls) = split(
            r"host = db user=u password='a b\'c' sslmode = verify-full sslrootcert='/my certs/ca.pem' dbname=x\ y",
        )
        .unwrap();
        assert_eq!(tls.unwrap().roots, Some("/my certs/ca.pem".into()));
        let c: postgres::Config = rest.parse().unwrap();
        assert_eq!(c.get_password(), Some(&b"a b'c"[..]));
        assert_eq!(c.get_user(), Some("u"));
        assert_eq!(c.get_dbname(), Some("x y"));
        assert_eq!(
            conninfo_pairs("a='' b=\\\\").unwrap(),
            [("a".into(), String::new()), ("b".into(), "\\".into())]
        );
        for bad in ["nonsense://", "host=db hunter2", "password='open"] {
            let e = split(bad).unwrap_err();
            assert!(e.contains("postgres://USER@HOST"), "{bad}: {e}");
            assert!(!e.contains("hunter2") && !e.contains("open"), "{e}");
        }
        let (rest, _) = split("postgres://db/q?sslmode=require&sslrootcert=%2Fa+b.pem").unwrap();
        assert_eq!(rest, "postgres://db/q");
        let (_, tls) = split("postgres://db/q?sslmode=require&sslrootcert=%2Fa+b.pem").unwrap();
        assert_eq!(tls.unwrap().roots, Some("/a+b.pem".into()));
    }

    #[test]
    fn modes_that_fall_back_to_plaintext_or_are_unknown_are_refused() {
        for m in ["prefer", "allow"] {
            let e = split(&format!("postgres://db/q?sslmode={m}")).unwrap_err();
            assert!(e.contains("verify-full"), "{e}");
        }
        assert!(split("postgres://db/q?sslmode=maybe")
            .unwrap_err()
            .contains("not one of"));
        assert!(split("postgres://db/q?sslrootcert=/ca.pem")
            .unwrap_err()
            .contains("add sslmode"));
        assert!(split("postgres://db/q?sslmode=require&sslcert=/c.pem")
            .unwrap_err()
            .contains("together"));
    }

    #[test]
    fn a_root_file_that_is_not_there_or_holds_nothing_is_named() {
        let missing = DbTls {
            roots: Some("/nonexistent/ca.pem".into()),
            client: None,
        };
        let e = missing.connector().err().unwrap();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let empty = tempfile::NamedTempFile::new().unwrap();
        let e = DbTls {
            roots: Some(empty.path().to_path_buf()),
            client: None,
        }
        .connector()
        .err()
        .unwrap();
        assert!(e.contains("no usable CA certificate"), "{e}");
    }
}
