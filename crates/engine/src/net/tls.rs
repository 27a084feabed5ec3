//! TLS 1.3 on every connection (rustls), and who trusts whom.
//!
//! A server has an [`Identity`]: a key and a certificate, self-signed and
//! made on first start in its state directory, or CA-issued (`--cert`,
//! `--key`). Clients check it by its fingerprint (`SHA256:` and the base64
//! of the certificate's SHA-256, as ssh prints keys): pinned on the command
//! line (`--trust`), or found in a known-hosts file that an explicit
//! `longhaul trust HOST` fills; or by a CA (`--ca`). A changed certificate
//! is refused loudly. A client may present an identity of its own (mutual
//! TLS); the server then knows it by its fingerprint.
//!
//! Plaintext exists only when both ends ask for it; the server tells the
//! two apart by the first byte a client sends (a TLS record starts with
//! 0x16, longhaul's preamble with `L`), so there is no negotiation that an
//! attacker could downgrade.

use crate::stages::{timed, Stage};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::net::conn::Stream;
use crate::EngineError;

/// The first byte of a TLS handshake record.
pub const TLS_RECORD_HANDSHAKE: u8 = 0x16;

/// The crypto provider: aws-lc-rs, TLS 1.3 suites in the order measured
/// fastest on x86 with AES-NI/VAES (BENCHMARKS.md): AES-128-GCM, then
/// AES-256-GCM, then ChaCha20-Poly1305 (first on CPUs without AES
/// instructions, where the client's order decides).
pub fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::aws_lc_rs::cipher_suite as cs;
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    p.cipher_suites = vec![
        cs::TLS13_AES_128_GCM_SHA256,
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

/// Seeds aws-lc's random generator in the background, once a process.
/// Its first use draws the process's root seed from CPU jitter (some 30 ms
/// of CPU, more on a busy host; BENCHMARKS.md, issue 45); begun while a
/// TCP connection or an ssh login is under way, the first handshake's key
/// share no longer waits for it. Only when that first use comes: a
/// handshake that needs the generator before this thread has it waits for
/// the same seed, as it would have anyway.
pub fn seed_random_early() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("lh-seed".into())
            .spawn(|| {
                let mut warm = [0u8; 16];
                let _ = aws_lc_rs::rand::fill(&mut warm);
            });
    });
}

/// `SHA256:` and the unpadded base64 of the SHA-256 of a certificate.
pub fn fingerprint(cert: &[u8]) -> String {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, cert);
    format!(
        "SHA256:{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(d)
    )
}

/// The forms [`parse_fingerprint`] takes, for its error messages.
pub const FINGERPRINT_FORMS: &str = "a server's fingerprint is SHA256: and 43 base64 characters, as `longhaul serve` prints it at start and `longhaul id STATE_DIR` on the server (the 64 hex digits of a SHA-256 of the certificate, with or without colons, as `openssl x509 -fingerprint -sha256` prints it, are taken too); give several comma-separated";

/// Checks a fingerprint given on the command line (`--trust`,
/// `LONGHAUL_TRUST`, `--client-cert`) and returns it in the one form
/// compared: `SHA256:` and unpadded base64. Takes that form (any case of
/// the prefix, padding or not) and the 64 hex digits of the SHA-256, with
/// or without colons. A refusal says what is wrong with the value and
/// which forms are taken ([`FINGERPRINT_FORMS`]).
pub fn parse_fingerprint(s: &str) -> Result<String, String> {
    let s = s.trim();
    let encode = |raw: &[u8]| {
        format!(
            "SHA256:{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw)
        )
    };
    let bad = |what: String| {
        Err(format!(
            "'{s}' is not a fingerprint: {what}; {FINGERPRINT_FORMS}"
        ))
    };
    if s.is_empty() {
        return bad("it is empty".into());
    }
    if let Some((host, rest)) = s.split_once(char::is_whitespace) {
        return bad(
            if rest
                .trim_start()
                .to_ascii_uppercase()
                .starts_with("SHA256:")
            {
                format!("it looks like a known-hosts line; give only the part after '{host} '")
            } else {
                "it holds a space".into()
            },
        );
    }
    let hex: String = s.chars().filter(|&c| c != ':').collect();
    if let Some(raw) = longhaul_proto::units::from_hex::<32>(&hex) {
        return Ok(encode(&raw));
    }
    let Some(b64) = s
        .get(..7)
        .filter(|p| p.eq_ignore_ascii_case("SHA256:"))
        .map(|_| &s[7..])
    else {
        return bad(match s.split_once(':') {
            Some((algo, _)) if !algo.is_empty() && algo.len() < 10 => {
                format!("'{algo}:' is not SHA256: (longhaul pins SHA-256 fingerprints only)")
            }
            _ => "it does not start with SHA256:".into(),
        });
    };
    let b64 = b64.trim_end_matches('=');
    if b64.chars().count() != 43 {
        return bad(format!(
            "it has {} characters after SHA256:, not 43 (cut short or run on when copied?)",
            b64.chars().count()
        ));
    }
    let raw = match base64::engine::general_purpose::STANDARD_NO_PAD.decode(b64) {
        Ok(raw) => raw,
        Err(e) => return bad(format!("the part after SHA256: is not base64 ({e})")),
    };
    Ok(encode(&raw))
}

/// A key and its certificate chain (leaf first).
#[derive(Clone, Debug)]
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

/// The key and the self-signed certificate, in one PEM file (so that it
/// appears whole, atomically).
pub const IDENTITY_FILE: &str = "identity.pem";

impl Identity {
    /// The leaf certificate's fingerprint.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.chain[0])
    }

    /// A copy of the private key (for building TLS configurations).
    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key()
    }

    /// Loads the identity kept in `dir`, making one (a P-256 key and a
    /// self-signed certificate) if there is none. Returns it and whether it
    /// is new.
    pub fn load_or_create(dir: &Path) -> Result<(Identity, bool), EngineError> {
        crate::state::named_state_dir(dir)?;
        let file = dir.join(IDENTITY_FILE);
        if file.exists() {
            return Ok((Identity::load(&file, &file)?, false));
        }
        crate::state::make_state_dir(dir)?;
        let (pair, c) = self_signed()?;
        let tmp = dir.join(format!(".{IDENTITY_FILE}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        write_private(
            &tmp,
            format!("{}{}", pair.serialize_pem(), c.pem()).as_bytes(),
        )?;
        // Link, not rename: if another process made one meanwhile, theirs
        // stays and both use it.
        let linked = std::fs::hard_link(&tmp, &file);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok((Identity::load(&file, &file)?, true)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Ok((Identity::load(&file, &file)?, false))
            }
            Err(e) => Err(EngineError::Usage(format!(
                "cannot write {}: {e}",
                file.display()
            ))),
        }
    }

    /// A fresh identity kept only in memory (the one-shot server's: it
    /// lives as long as its process, and its fingerprint reaches the
    /// client over ssh).
    pub fn ephemeral() -> Result<Identity, EngineError> {
        let (pair, c) = self_signed()?;
        Ok(Identity {
            chain: vec![c.der().clone()],
            key: Arc::new(PrivateKeyDer::Pkcs8(pair.serialize_der().into())),
        })
    }

    /// Loads a PEM certificate chain and its PEM private key.
    pub fn load(cert: &Path, key: &Path) -> Result<Identity, EngineError> {
        let chain = pem_certificates(cert, "certificates")?;
        if chain.is_empty() {
            return Err(EngineError::Usage(format!(
                "{} holds no PEM certificate",
                cert.display()
            )));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
            EngineError::Usage(format!(
                "cannot read a private key from {}: {e}",
                key.display()
            ))
        })?;
        Ok(Identity {
            chain,
            key: Arc::new(key),
        })
    }
}

/// A P-256 key and a self-signed certificate naming this host.
fn self_signed() -> Result<(rcgen::KeyPair, rcgen::Certificate), EngineError> {
    let pair = rcgen::KeyPair::generate()
        .map_err(|e| EngineError::Usage(format!("cannot generate a key: {e}")))?;
    let host = crate::net::sock::hostname();
    let mut params = rcgen::CertificateParams::new(vec![host.clone()])
        .map_err(|e| EngineError::Usage(format!("cannot make a certificate: {e}")))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("longhaul {host}"));
    let c = params
        .self_signed(&pair)
        .map_err(|e| EngineError::Usage(format!("cannot make a certificate: {e}")))?;
    Ok((pair, c))
}

/// Writes a file only its owner can read, replacing none.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| EngineError::Usage(format!("cannot create {}: {e}", path.display())))?;
    f.write_all(bytes)
        .map_err(|e| EngineError::Usage(format!("cannot write {}: {e}", path.display())))
}

fn tls_error(e: rustls::Error) -> EngineError {
    EngineError::Usage(format!("TLS configuration: {e}"))
}

/// The server's TLS configuration: its identity, TLS 1.3 only, and an
/// optional client certificate (any; the server authorizes it by
/// fingerprint after the handshake).
pub fn server_config(id: &Identity) -> Result<Arc<rustls::ServerConfig>, EngineError> {
    let p = provider();
    let cfg = rustls::ServerConfig::builder_with_provider(p.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .with_client_cert_verifier(Arc::new(AnyClientCert { provider: p }))
        .with_single_cert(id.chain.clone(), id.key.clone_key())
        .map_err(tls_error)?;
    Ok(Arc::new(cfg))
}

/// How a client decides to trust a server.
#[derive(Clone, Debug, Default)]
pub struct TrustOptions {
    /// Fingerprints given with `--trust` (or `LONGHAUL_TRUST`).
    pub pins: Vec<String>,
    /// The known-hosts file (`--known-hosts`, default
    /// `~/.config/longhaul/known_hosts`).
    pub known_hosts: Option<PathBuf>,
    /// PEM CA certificates (`--ca`): the server's certificate must chain to
    /// one and name the host.
    pub ca: Option<PathBuf>,
    /// The client's own identity, for mutual TLS.
    pub identity: Option<Identity>,
    /// Accept any certificate (`longhaul trust`, which shows it first).
    pub accept_any: bool,
}

/// The fingerprint a known-hosts file lists for `host` (`HOST:PORT`).
pub fn known_host(file: &Path, host: &str) -> Option<String> {
    known_host_in(&std::fs::read_to_string(file).ok()?, host)
}

/// The fingerprint the text of a known-hosts file lists for `host`.
pub fn known_host_in(text: &str, host: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once(char::is_whitespace))
        .find(|(h, _)| *h == host)
        .map(|(_, fp)| fp.trim().to_string())
}

/// Records `host` with `fp` in a known-hosts file; refuses to replace a
/// different entry unless `replace`.
pub fn add_known_host(
    file: &Path,
    host: &str,
    fp: &str,
    replace: bool,
) -> Result<bool, EngineError> {
    let old = std::fs::read_to_string(file).unwrap_or_default();
    let mut out = String::new();
    let mut found = false;
    for line in old.lines() {
        match line.trim().split_once(char::is_whitespace) {
            Some((h, f)) if h == host && !line.trim_start().starts_with('#') => {
                if f.trim() == fp {
                    return Ok(false);
                }
                if !replace {
                    return Err(EngineError::Trust(format!(
                        "{} already lists {host} with {}; the server now presents {fp}. If the server's key really changed, run again with --replace",
                        file.display(),
                        f.trim()
                    )));
                }
                found = true;
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    let _ = found;
    out.push_str(&format!("{host} {fp}\n"));
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| EngineError::Usage(format!("cannot create {}: {e}", dir.display())))?;
    }
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, out)
        .and_then(|()| std::fs::rename(&tmp, file))
        .map_err(|e| EngineError::Usage(format!("cannot write {}: {e}", file.display())))?;
    Ok(true)
}

/// A client's TLS set-up for one server, reused for its data streams.
pub struct ClientTls {
    pub config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    verifier: Option<Arc<PinVerifier>>,
    host: String,
    known_hosts: Option<PathBuf>,
}

impl ClientTls {
    /// Prepares to connect to `host` (`HOST:PORT`, as the user named it).
    pub fn new(t: &TrustOptions, host: &str) -> Result<ClientTls, EngineError> {
        seed_random_early();
        let p = provider();
        let builder = rustls::ClientConfig::builder_with_provider(p.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error)?;
        let hostname = host_part(host);
        let name = ServerName::try_from(hostname.to_string())
            .unwrap_or_else(|_| ServerName::try_from("longhaul").expect("a valid name"));
        let mut verifier = None;
        let known = t.known_hosts.as_deref().and_then(|f| known_host(f, host));
        let pinned = t.accept_any || !t.pins.is_empty() || known.is_some();
        let wants_cert = match &t.ca {
            Some(ca) if !pinned => {
                let mut roots = rustls::RootCertStore::empty();
                let certs = pem_certificates(ca, "CA certificates")?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(EngineError::Usage(format!(
                        "{} holds no usable CA certificate",
                        ca.display()
                    )));
                }
                builder.with_root_certificates(roots)
            }
            _ => {
                // Fingerprints given on the command line decide alone; the
                // known-hosts file only when there are none.
                let mut expected = t.pins.clone();
                if expected.is_empty() {
                    expected.extend(known);
                }
                let v = Arc::new(PinVerifier {
                    from_command_line: !t.pins.is_empty(),
                    expected,
                    accept_any: t.accept_any,
                    seen: Mutex::new(None),
                    provider: p.clone(),
                });
                verifier = Some(v.clone());
                builder.dangerous().with_custom_certificate_verifier(v)
            }
        };
        let config = match &t.identity {
            Some(id) => wants_cert
                .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
                .map_err(tls_error)?,
            None => wants_cert.with_no_client_auth(),
        };
        Ok(ClientTls {
            config: Arc::new(config),
            name,
            verifier,
            host: host.to_string(),
            known_hosts: t.known_hosts.clone(),
        })
    }

    /// The fingerprint the server presented, once a handshake got that far.
    pub fn seen(&self) -> Option<String> {
        self.verifier
            .as_ref()
            .and_then(|v| v.seen.lock().expect("poisoned").clone())
    }

    /// Runs the TLS handshake on a connected socket.
    pub fn connect(&self, tcp: TcpStream) -> Result<Box<dyn Stream>, EngineError> {
        let conn = rustls::ClientConnection::new(self.config.clone(), self.name.clone())
            .map_err(tls_error)?;
        let mut s = rustls::StreamOwned::new(conn, Sock::new(tcp));
        while s.conn.is_handshaking() {
            if let Err(e) = s.conn.complete_io(&mut s.sock) {
                return Err(self.explain(e));
            }
        }
        Ok(Box::new(Tls::Client(Box::new(s))))
    }

    /// Turns a failed handshake into what the user should know and do.
    fn explain(&self, e: io::Error) -> EngineError {
        let host = &self.host;
        let tls = e
            .get_ref()
            .and_then(|i| i.downcast_ref::<rustls::Error>())
            .cloned();
        if let (Some(v), Some(seen)) = (&self.verifier, self.seen()) {
            if !v.accept_any && !v.expected.contains(&seen) {
                let kh = self
                    .known_hosts
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "the known-hosts file".into());
                return EngineError::Trust(if v.expected.is_empty() {
                    format!(
                        "{host} is not a known server; it presents {seen}. Check that against `longhaul id STATE_DIR` on the server, then run `longhaul trust {host}` (adds it to {kh}) or pass --trust {seen}"
                    )
                } else if v.from_command_line {
                    format!(
                        "{host} presents {seen}, not the fingerprint given with --trust (or LONGHAUL_TRUST): {}. Check the value against `longhaul id STATE_DIR` on the server: if it was mistyped or meant for another server, pass the right one; if it is right, THE IDENTITY OF {host} HAS CHANGED: someone may be intercepting the connection (man in the middle), or the server's key was replaced",
                        v.expected.join(" or ")
                    )
                } else {
                    format!(
                        "THE IDENTITY OF {host} HAS CHANGED: expected {}, the server presents {seen}. Someone may be intercepting the connection (man in the middle), or the server's key was replaced. If you know it was replaced, update {kh} (`longhaul trust --replace {host}`)",
                        v.expected.join(" or ")
                    )
                });
            }
        }
        match tls {
            Some(rustls::Error::InvalidMessage(_)) | Some(rustls::Error::InappropriateMessage { .. }) => {
                EngineError::Connect(format!(
                    "{host} did not answer with TLS: it may be a plaintext-only peer or not longhaul. longhaul never falls back to plaintext by itself; use --insecure-plaintext here and --allow-plaintext on the server to allow it"
                ))
            }
            Some(rustls::Error::InvalidCertificate(c)) => EngineError::Trust(format!(
                "the certificate of {host} is not valid: {c:?} (check --ca and the host name)"
            )),
            Some(rustls::Error::AlertReceived(a)) => EngineError::Trust(format!(
                "{host} ended the TLS handshake ({a:?}): does it accept this client?"
            )),
            Some(other) => EngineError::Trust(format!("TLS handshake with {host} failed: {other}")),
            None => match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    EngineError::Timeout(format!("the TLS handshake with {host}"))
                }
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => EngineError::Connect(format!(
                    "{host} closed the connection during the TLS handshake: it may speak plaintext only, or refuse this client"
                )),
                _ => EngineError::io(format!("TLS handshake with {host} failed"), e),
            },
        }
    }
}

/// `host` of `host:port` or `[v6]:port`.
fn host_part(target: &str) -> &str {
    if let Some(rest) = target.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match target.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') && p.parse::<u16>().is_ok() => h,
        _ => target,
    }
}

/// Runs the server side of the TLS handshake; the socket's read time-out
/// (the handshake deadline) bounds it.
pub fn accept(
    cfg: &Arc<rustls::ServerConfig>,
    tcp: TcpStream,
    deadline: std::time::Instant,
) -> Result<Box<dyn Stream>, EngineError> {
    let conn = rustls::ServerConnection::new(cfg.clone()).map_err(tls_error)?;
    let mut s = rustls::StreamOwned::new(conn, Sock::new(tcp));
    while s.conn.is_handshaking() {
        // One deadline for the whole handshake: a client trickling bytes
        // cannot stretch it.
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(EngineError::Timeout("TLS handshake".into()));
        }
        let _ = s.sock.tcp.set_read_timeout(Some(left));
        s.conn
            .complete_io(&mut s.sock)
            .map_err(|e| match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    EngineError::Timeout("TLS handshake".into())
                }
                _ => EngineError::io("TLS handshake failed".into(), e),
            })?;
    }
    Ok(Box::new(Tls::Server(Box::new(s))))
}

/// The PEM certificates in `path`; `what` names them in the error.
fn pem_certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, EngineError> {
    CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| EngineError::Usage(format!("cannot read {what} from {}: {e}", path.display())))
}

/// A verifier's signature checks, in its trait's impl: rustls's own, with
/// the algorithms of the verifier's `provider` (both verifiers below check
/// signatures alike; only whose certificate they take differs).
macro_rules! signatures_by_provider {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.provider.signature_verification_algorithms;
            verify_tls12_signature(message, cert, dss, algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.provider.signature_verification_algorithms;
            verify_tls13_signature(message, cert, dss, algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}

/// Checks the server's certificate against fingerprints, recording what it
/// saw so that a refusal can name it.
#[derive(Debug)]
struct PinVerifier {
    expected: Vec<String>,
    /// `expected` came from `--trust` (or `LONGHAUL_TRUST`), not from the
    /// known-hosts file: a refusal names the option, not the file.
    from_command_line: bool,
    accept_any: bool,
    seen: Mutex<Option<String>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let fp = fingerprint(end_entity);
        let ok = self.accept_any || self.expected.contains(&fp);
        *self.seen.lock().expect("poisoned") = Some(fp);
        if ok {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    signatures_by_provider!();
}

/// Asks for a client certificate without requiring one, and takes any
/// that proves possession of its key: the server authorizes it by
/// fingerprint (`token create --client-cert`).
#[derive(Debug)]
struct AnyClientCert {
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for AnyClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    signatures_by_provider!();
}

/// The socket under a TLS connection, with a receive buffer: rustls reads
/// 4 KiB at a time, which at tens of Gbit/s would be a syscall per 4 KiB;
/// here one `read` takes up to 256 KiB and rustls is served from memory.
///
/// While `records` is on, rustls is never handed bytes past the end of the
/// TLS record it is reading: whatever follows the last record stays here,
/// so a data stream can leave TLS for sealed frames ([`crate::net::sealed`])
/// at a record boundary without rustls having swallowed the first frame.
pub struct Sock {
    tcp: TcpStream,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Hand rustls whole records at most (see above).
    pub(crate) records: bool,
    /// Bytes of the current record not yet handed out.
    record_left: usize,
}

/// A TLS record's header: type, version, length.
const RECORD_HEADER: usize = 5;

impl Sock {
    fn new(tcp: TcpStream) -> Sock {
        Sock {
            tcp,
            buf: vec![0u8; 256 << 10].into_boxed_slice(),
            start: 0,
            end: 0,
            records: true,
            record_left: 0,
        }
    }

    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Whether bytes read from the socket wait here.
    pub(crate) fn buffered(&self) -> bool {
        self.start < self.end
    }

    /// Reads more from the socket behind what is buffered; 0 at its end.
    fn fill(&mut self) -> io::Result<usize> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        let n = self.tcp.read(&mut self.buf[self.end..])?;
        self.end += n;
        Ok(n)
    }

    /// How much of the buffer belongs to the record being read (reading
    /// the next record's header if one starts here); None at the
    /// socket's end.
    fn record_span(&mut self) -> io::Result<Option<usize>> {
        if self.record_left == 0 {
            while self.end - self.start < RECORD_HEADER {
                if self.fill()? == 0 {
                    // Cut short: rustls sees what there is, then the end.
                    return Ok((self.start < self.end).then_some(self.end - self.start));
                }
            }
            let len = u16::from_be_bytes([self.buf[self.start + 3], self.buf[self.start + 4]]);
            self.record_left = RECORD_HEADER + usize::from(len);
        }
        if self.start == self.end && self.fill()? == 0 {
            return Ok(None);
        }
        Ok(Some(self.record_left.min(self.end - self.start)))
    }
}

/// Under rustls (records), the socket's reads count as receiving: the
/// read is timed inside rustls's, which counts as the cipher's. Sealed
/// frames read the socket inside the sink's own `receive` stage, so their
/// reads are not timed again (a clock read per socket read is not free).
impl Read for Sock {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.records {
            timed(Stage::Receive, || self.read_socket(out))
        } else {
            self.read_socket(out)
        }
    }
}

impl Sock {
    /// [`Read::read`], untimed.
    fn read_socket(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.records {
            let Some(span) = self.record_span()? else {
                return Ok(0);
            };
            let n = out.len().min(span);
            out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
            self.start += n;
            self.record_left = self.record_left.saturating_sub(n);
            return Ok(n);
        }
        if self.start == self.end {
            // Past the records (sealed frames), reads go straight into the
            // caller's buffer whatever its size: through this buffer, the
            // part of a frame a header's read brought along would be
            // copied once more (3-5% of a sink's CPU).
            return self.tcp.read(out);
        }
        let n = out.len().min(self.end - self.start);
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }
}

impl Sock {
    /// Writes all of `buf` to the socket, untimed: for sealed frames,
    /// sent inside the source's own `send` stage.
    pub(crate) fn send_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.tcp.write_all(buf)
    }
}

/// rustls's writes count as sending, inside its own (the cipher's) stage.
impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        timed(Stage::Send, || self.tcp.write(buf))
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        timed(Stage::Send, || self.tcp.write_vectored(bufs))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// A TLS connection over TCP, either end.
pub enum Tls {
    Client(Box<rustls::StreamOwned<rustls::ClientConnection, Sock>>),
    Server(Box<rustls::StreamOwned<rustls::ServerConnection, Sock>>),
}

impl Drop for Tls {
    /// A clean end for the peer (close_notify), if the socket takes it at
    /// once; never blocks for long.
    fn drop(&mut self) {
        let _ = self
            .tcp()
            .set_write_timeout(Some(std::time::Duration::from_millis(100)));
        match self {
            Tls::Client(s) => {
                s.conn.send_close_notify();
                while s.conn.wants_write() {
                    if s.conn.write_tls(&mut s.sock).is_err() {
                        break;
                    }
                }
            }
            Tls::Server(s) => {
                s.conn.send_close_notify();
                while s.conn.wants_write() {
                    if s.conn.write_tls(&mut s.sock).is_err() {
                        break;
                    }
                }
            }
        }
    }
}

impl Tls {
    pub(crate) fn sock(&mut self) -> &mut Sock {
        match self {
            Tls::Client(s) => &mut s.sock,
            Tls::Server(s) => &mut s.sock,
        }
    }

    pub(crate) fn is_client(&self) -> bool {
        matches!(self, Tls::Client(_))
    }

    /// Keying material exported from the session (RFC 8446 section 7.5).
    pub(crate) fn export(&self, label: &[u8], out: &mut [u8]) -> Result<(), rustls::Error> {
        match self {
            Tls::Client(s) => s.conn.export_keying_material(out, label, None).map(|_| ()),
            Tls::Server(s) => s.conn.export_keying_material(out, label, None).map(|_| ()),
        }
    }

    /// The AEAD of the negotiated suite, for data sealed outside TLS.
    pub(crate) fn aead(&self) -> &'static aws_lc_rs::aead::Algorithm {
        use rustls::CipherSuite as C;
        let suite = match self {
            Tls::Client(s) => s.conn.negotiated_cipher_suite(),
            Tls::Server(s) => s.conn.negotiated_cipher_suite(),
        };
        match suite.map(|s| s.suite()) {
            Some(C::TLS13_AES_256_GCM_SHA384) => &aws_lc_rs::aead::AES_256_GCM,
            Some(C::TLS13_CHACHA20_POLY1305_SHA256) => &aws_lc_rs::aead::CHACHA20_POLY1305,
            _ => &aws_lc_rs::aead::AES_128_GCM,
        }
    }

    /// Whether rustls holds plaintext not yet read (or an error).
    pub(crate) fn plaintext_pending(&mut self) -> bool {
        fn held<D>(conn: &mut rustls::ConnectionCommon<D>) -> bool {
            !conn
                .process_new_packets()
                .is_ok_and(|st| st.plaintext_bytes_to_read() == 0)
        }
        match self {
            Tls::Client(s) => held(&mut s.conn),
            Tls::Server(s) => held(&mut s.conn),
        }
    }
}

/// rustls's work (records, the cipher, their copies) counts as the
/// cipher's stage; the socket's reads and writes inside it count as
/// receiving and sending ([`Sock`]).
impl Read for Tls {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        timed(Stage::Decrypt, || match self {
            Tls::Client(s) => s.read(buf),
            Tls::Server(s) => s.read(buf),
        })
    }
}

impl Write for Tls {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        timed(Stage::Encrypt, || match self {
            Tls::Client(s) => s.write(buf),
            Tls::Server(s) => s.write(buf),
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        timed(Stage::Encrypt, || match self {
            Tls::Client(s) => s.flush(),
            Tls::Server(s) => s.flush(),
        })
    }
}

impl Stream for Tls {
    fn tcp(&self) -> &TcpStream {
        match self {
            Tls::Client(s) => &s.sock.tcp,
            Tls::Server(s) => &s.sock.tcp,
        }
    }

    fn close_write(&mut self) -> io::Result<()> {
        match self {
            Tls::Client(s) => {
                s.conn.send_close_notify();
                s.flush()?;
            }
            Tls::Server(s) => {
                s.conn.send_close_notify();
                s.flush()?;
            }
        }
        self.tcp().shutdown(Shutdown::Write)
    }

    fn is_tls(&self) -> bool {
        true
    }

    fn pending(&mut self) -> bool {
        // Records read into the socket's buffer, or plaintext rustls holds
        // (an error too: the next read reports it).
        self.sock().buffered() || self.plaintext_pending()
    }

    fn peer_fingerprint(&self) -> Option<String> {
        let certs = match self {
            Tls::Client(s) => s.conn.peer_certificates(),
            Tls::Server(s) => s.conn.peer_certificates(),
        }?;
        certs.first().map(|c| fingerprint(c))
    }

    fn into_plain(self: Box<Self>) -> Result<TcpStream, Box<dyn Stream>> {
        Err(self)
    }

    fn encryption(&self) -> String {
        let suite = match self {
            Tls::Client(s) => s.conn.negotiated_cipher_suite(),
            Tls::Server(s) => s.conn.negotiated_cipher_suite(),
        };
        match suite {
            Some(s) => format!("TLS1.3 {:?}", s.suite()),
            None => "TLS1.3".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generator_seeded_early_gives_every_thread_fresh_bytes() {
        seed_random_early();
        seed_random_early();
        let draw = || {
            let mut b = [0u8; 32];
            aws_lc_rs::rand::fill(&mut b).unwrap();
            b
        };
        let other = std::thread::spawn(draw);
        let (a, b) = (draw(), other.join().unwrap());
        assert_ne!(a, b);
        assert_ne!(a, [0u8; 32]);
    }

    #[test]
    fn fingerprints_in_every_taken_form_and_clear_refusals() {
        let fp = fingerprint(b"a certificate");
        assert_eq!(parse_fingerprint(&fp).unwrap(), fp);
        assert_eq!(parse_fingerprint(&format!("  {fp}=\n")).unwrap(), fp);
        assert_eq!(
            parse_fingerprint(&fp.replace("SHA256:", "sha256:")).unwrap(),
            fp
        );
        let raw = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b"a certificate");
        let raw = raw.as_ref();
        let hex: Vec<String> = raw.iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(parse_fingerprint(&hex.concat()).unwrap(), fp);
        assert_eq!(parse_fingerprint(&hex.join(":")).unwrap(), fp);

        let refused = |s: &str, why: &str| {
            let e = parse_fingerprint(s).unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
            assert!(e.contains("SHA256: and 43 base64"), "{s}: {e}");
            assert!(!e.contains("known_hosts"), "{s}: {e}");
        };
        refused("", "empty");
        refused(&fp[7..], "does not start with SHA256:");
        refused("MD5:abcd", "'MD5:' is not SHA256:");
        refused(&fp[..30], "has 23 characters after SHA256:, not 43");
        refused(&format!("{}*", &fp[..49]), "not base64");
        refused(&format!("far.example.org:5310 {fp}"), "known-hosts line");
    }
}
