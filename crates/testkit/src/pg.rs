//! A throwaway PostgreSQL server for tests: Debian's binaries, a data
//! directory in a temporary directory, a free port on 127.0.0.1 and a
//! socket beside the data; stopped by its PID when dropped. As root (CI),
//! it runs as the `postgres` user, since PostgreSQL refuses to run as root.
//!
//! Absent PostgreSQL, [`TempPostgres::start`] says SKIP and gives `None`,
//! unless `LONGHAUL_REQUIRE_POSTGRES=1` (CI), when it panics.
//!
//! One server per test, not one per test binary: tests change its
//! `pg_hba.conf`, its roles and its TLS settings, and nextest runs each
//! test in a process of its own, so a shared server would need a lock and
//! a keeper outliving every test. What was slow in a server per test was
//! `initdb` (4.3 s at a load of 29 on the 2-core CI machine, against 0.3 s
//! to start the server): it runs once per user and server version, and
//! each test copies its cluster ([`template`]; docs/TESTING.md).

use crate::require;

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct TempPostgres {
    dir: PathBuf,
    child: Child,
    pub port: u16,
    /// With TLS on ([`TempPostgres::start_tls`]): the PEM file of the CA
    /// that signed the server's certificate (for 127.0.0.1 and localhost).
    pub ca: Option<PathBuf>,
    /// With TLS on: a client certificate for the user `postgres` signed by
    /// the same CA, and its key (PEM files).
    pub client: Option<(PathBuf, PathBuf)>,
}

/// What TLS the server runs with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    Off,
    On,
    /// On, and TCP connections over TLS must show a client certificate of
    /// the CA naming their user (`clientcert=verify-full`).
    ClientCerts,
}

/// The newest installed server's binaries.
fn bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|d| d.path().join("bin"))
        .filter(|p| p.join("postgres").exists() && p.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

fn is_root() -> bool {
    // SAFETY: getuid cannot fail and touches no memory.
    unsafe { libc::getuid() == 0 }
}

/// `cmd` as the postgres user when we are root.
fn as_postgres(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--clear-groups",
            "--",
        ])
        .arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// The files TLS needs, and the `-c` settings that turn it on.
struct TlsFiles {
    ca: PathBuf,
    client: (PathBuf, PathBuf),
    args: Vec<String>,
}

/// A CA, a server certificate it signed for 127.0.0.1 and localhost (the
/// key owned by the server's user, mode 0600 as PostgreSQL demands) and a
/// client certificate for the user `postgres`, written into `dir`.
fn tls_files(dir: &Path) -> TlsFiles {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "longhaul test CA");
    let ca = p.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
    let (ca_pem, crt, pem) = (
        dir.join("ca.pem"),
        dir.join("server.crt"),
        dir.join("server.key"),
    );
    std::fs::write(&ca_pem, ca.pem()).unwrap();
    std::fs::write(&crt, cert.pem()).unwrap();
    std::fs::write(&pem, key.serialize_pem()).unwrap();
    std::fs::set_permissions(&pem, std::fs::Permissions::from_mode(0o600)).unwrap();
    if is_root() {
        for f in [&crt, &pem] {
            let out = Command::new("chown")
                .arg("postgres:postgres")
                .arg(f)
                .output()
                .unwrap();
            assert!(out.status.success(), "chown {}", f.display());
        }
    }
    let client_key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "postgres");
    let client_cert = p.signed_by(&client_key, &ca, &ca_key).unwrap();
    let client = (dir.join("client.crt"), dir.join("client.key"));
    std::fs::write(&client.0, client_cert.pem()).unwrap();
    std::fs::write(&client.1, client_key.serialize_pem()).unwrap();
    let set = |k: &str, v: &Path| format!("{k}={}", v.display());
    let args = vec![
        "-c".into(),
        "ssl=on".into(),
        "-c".into(),
        set("ssl_cert_file", &crt),
        "-c".into(),
        set("ssl_key_file", &pem),
        "-c".into(),
        set("ssl_ca_file", &ca_pem),
    ];
    TlsFiles {
        ca: ca_pem,
        client,
        args,
    }
}

/// A cluster made by `initdb` once for every test of this user and this
/// server version (in the temporary directory, made under a lock, renamed
/// into place whole), which each server copies: `initdb` takes seconds on
/// a busy machine, a copy a fraction of that, and each test still has a
/// server of its own to change as it likes.
fn template(bin: &Path) -> PathBuf {
    let version = bin
        .parent()
        .and_then(|v| v.file_name())
        .map_or_else(|| "pg".into(), |v| v.to_string_lossy().into_owned());
    // SAFETY: geteuid cannot fail and touches no memory.
    let uid = unsafe { libc::geteuid() };
    let base = std::env::temp_dir().join(format!("longhaul-pg-template-{version}-{uid}"));
    let data = base.join("data");
    if data.join("PG_VERSION").exists() {
        return data;
    }
    std::fs::create_dir_all(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let lock = std::fs::File::create(base.join("lock")).unwrap();
    // SAFETY: flock on a descriptor this function owns; released when
    // `lock` is closed.
    let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    assert_eq!(locked, 0, "lock {}", base.display());
    if data.join("PG_VERSION").exists() {
        return data;
    }
    let fresh = base.join(format!("fresh-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&fresh);
    std::fs::create_dir(&fresh).unwrap();
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = as_postgres(&bin.join("initdb"))
        .arg("-D")
        .arg(fresh.join("data"))
        .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
        .stdout(Stdio::null())
        .output()
        .expect("run initdb");
    assert!(
        out.status.success(),
        "initdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(fresh.join("data"), &data).unwrap();
    let _ = std::fs::remove_dir_all(&fresh);
    data
}

impl TempPostgres {
    pub fn start() -> Option<TempPostgres> {
        Self::start_with(Tls::Off)
    }

    /// The same, with TLS on (its CA in [`TempPostgres::ca`]).
    pub fn start_tls() -> Option<TempPostgres> {
        Self::start_with(Tls::On)
    }

    pub fn start_with(tls: Tls) -> Option<TempPostgres> {
        let Some(bin) = bin_dir() else {
            require::missing(
                "POSTGRES",
                "PostgreSQL is not installed (apt-get install postgresql)",
            );
            return None;
        };
        let dir = std::env::temp_dir().join(format!(
            "lh-pg-{}-{}",
            std::process::id(),
            fastrand_suffix()
        ));
        std::fs::create_dir_all(dir.join("sock")).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(dir.join("sock"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let data = dir.join("data");
        let out = Command::new("cp")
            .arg("-a")
            .arg(template(&bin))
            .arg(&data)
            .output()
            .expect("run cp");
        assert!(
            out.status.success(),
            "copying the template cluster failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let files = (tls != Tls::Off).then(|| tls_files(&dir));
        if tls == Tls::ClientCerts {
            // First match wins: TCP over TLS needs the client certificate.
            let hba = data.join("pg_hba.conf");
            let rest = std::fs::read_to_string(&hba).unwrap();
            std::fs::write(
                &hba,
                format!("hostssl all all 127.0.0.1/32 trust clientcert=verify-full\n{rest}"),
            )
            .unwrap();
        }
        let tls_args = files.as_ref().map(|f| f.args.clone()).unwrap_or_default();
        let child = as_postgres(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(dir.join("sock"))
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ])
            .args(&tls_args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).unwrap())
            .spawn()
            .expect("start postgres");
        let pg = TempPostgres {
            dir,
            child,
            port,
            ca: files.as_ref().map(|f| f.ca.clone()),
            client: files.map(|f| f.client),
        };
        let started = Instant::now();
        loop {
            if postgres::Client::connect(&pg.url(), postgres::NoTls).is_ok() {
                return Some(pg);
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "PostgreSQL did not come up: {}",
                std::fs::read_to_string(pg.dir.join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Over TCP on loopback.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Through the socket (reachable from network namespaces too).
    pub fn socket_url(&self) -> String {
        format!(
            "postgresql://postgres@{}:{}/postgres",
            percent(&self.dir.join("sock").display().to_string()),
            self.port
        )
    }
}

fn percent(s: &str) -> String {
    s.replace('/', "%2F")
}

fn fastrand_suffix() -> u64 {
    use std::time::SystemTime;
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64)
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        // SIGQUIT: immediate shutdown; by PID, never by name.
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) on our own child's PID.
        unsafe {
            libc::kill(pid, libc::SIGQUIT);
        }
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TempPostgres {
    /// Makes a role that must give `password` (SCRAM) over TCP and the
    /// socket, while every other role stays `trust`; returns its URL
    /// without the password.
    pub fn password_user(&self, user: &str, password: &str) -> String {
        let mut c = postgres::Client::connect(&self.url(), postgres::NoTls).unwrap();
        c.batch_execute(&format!(
            "SET password_encryption = 'scram-sha-256'; CREATE ROLE {user} LOGIN SUPERUSER PASSWORD '{password}'"
        ))
        .unwrap();
        let hba = self.dir.join("data/pg_hba.conf");
        let rest = std::fs::read_to_string(&hba).unwrap();
        std::fs::write(
            &hba,
            format!("local all {user} scram-sha-256\nhost all {user} 127.0.0.1/32 scram-sha-256\n{rest}"),
        )
        .unwrap();
        c.batch_execute("SELECT pg_reload_conf()").unwrap();
        let url = format!("postgres://{user}@127.0.0.1:{}/postgres", self.port);
        // The reload is asynchronous: wait until the role is asked for its password.
        let started = Instant::now();
        while postgres::Client::connect(&url, postgres::NoTls).is_ok() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "pg_hba.conf was not reloaded"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        url
    }
}
