//! Measures each TLS 1.3 cipher suite longhaul offers: one stream over
//! loopback, 2 GiB through rustls (encrypt in one thread, decrypt in
//! another), alternating the suites over several rounds. Used to choose
//! the suites' order (BENCHMARKS.md):
//!
//!     cargo run --release --example tls_suites [ROUNDS]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use longhaul_engine::net::tls::{provider, Identity};
use rustls::pki_types::ServerName;

const BYTES: u64 = 2 << 30;

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let dir = std::env::temp_dir().join(format!("lh-tls-suites-{}", std::process::id()));
    let (id, _) = Identity::load_or_create(&dir).expect("identity");
    let suites = provider().cipher_suites.clone();
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); suites.len()];
    for round in 0..rounds {
        for (i, suite) in suites.iter().enumerate() {
            let mut p = (*provider()).clone();
            p.cipher_suites = vec![*suite];
            let gbps = run(Arc::new(p), &id);
            println!("round {round} {:?}: {gbps:.2} Gbit/s", suite.suite());
            results[i].push(gbps);
        }
    }
    println!("\nmedians over {rounds} rounds:");
    for (i, suite) in suites.iter().enumerate() {
        let mut r = results[i].clone();
        r.sort_by(f64::total_cmp);
        println!("  {:?}: {:.2} Gbit/s", suite.suite(), r[r.len() / 2]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One TLS connection over loopback moving BYTES; returns Gbit/s.
fn run(p: Arc<rustls::crypto::CryptoProvider>, id: &Identity) -> f64 {
    let server_cfg = Arc::new(
        rustls::ServerConfig::builder_with_provider(p.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(id.chain.clone(), id.key_der())
            .unwrap(),
    );
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let (tcp, _) = l.accept().unwrap();
        let conn = rustls::ServerConnection::new(server_cfg).unwrap();
        let mut s = rustls::StreamOwned::new(conn, tcp);
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        while got < BYTES {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got += n as u64,
                Err(e) => panic!("{e}"),
            }
        }
        got
    });
    let fp = id.fingerprint();
    let client_cfg = Arc::new(
        rustls::ClientConfig::builder_with_provider(p)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptPinned(fp)))
            .with_no_client_auth(),
    );
    let tcp = TcpStream::connect(addr).unwrap();
    let conn =
        rustls::ClientConnection::new(client_cfg, ServerName::try_from("localhost").unwrap())
            .unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let buf = vec![0x5au8; 1 << 20];
    let t = Instant::now();
    let mut sent = 0u64;
    while sent < BYTES {
        s.write_all(&buf).unwrap();
        sent += buf.len() as u64;
    }
    s.flush().unwrap();
    let got = rx.join().unwrap();
    got as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9
}

#[derive(Debug)]
struct AcceptPinned(String);

impl rustls::client::danger::ServerCertVerifier for AcceptPinned {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        assert_eq!(longhaul_engine::net::tls::fingerprint(end_entity), self.0);
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        // The pin is the check here, for either version.
        self.verify_tls12_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
