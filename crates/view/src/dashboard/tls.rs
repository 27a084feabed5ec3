//! HTTPS for a dashboard off loopback: the longhaul identity of the state
//! directory (the key and self-signed certificate `serve` presents, whose
//! fingerprint the browser shows), TLS 1.2 and 1.3, no client certificate.
//! Each handshake runs in a task of its own, under a time limit
//! ([`crate::http::serve`]), so a slow or silent client holds up nobody
//! else.

use std::sync::Arc;

use longhaul_engine::net::tls::{provider, Identity};

use super::DashboardError;

/// The server configuration of the dashboard's HTTPS.
pub fn config(id: &Identity) -> Result<Arc<rustls::ServerConfig>, DashboardError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| DashboardError::Runtime(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(id.chain.clone(), id.key_der())
        .map_err(|e| DashboardError::Runtime(format!("TLS: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dashboard::{Dashboard, DashboardOptions};
    use longhaul_engine::net::tls::{ClientTls, TrustOptions};
    use std::io::{Read, Write};
    use std::time::Duration;

    #[test]
    fn https_with_the_longhaul_identity() {
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("state");
        let (id, _) = Identity::load_or_create(&state).unwrap();
        let d = Dashboard::bind(DashboardOptions {
            token: Some("tls-token".into()),
            tls: Some(config(&id).unwrap()),
            ..DashboardOptions::new("127.0.0.1:0".parse().unwrap(), t.path().join("archive.db"))
        })
        .unwrap();
        let addr = d.local_addr().unwrap();
        std::thread::spawn(move || d.run());

        // A client that says nothing holds up no one.
        let _silent = std::net::TcpStream::connect(addr).unwrap();

        let trust = TrustOptions {
            pins: vec![id.fingerprint()],
            ..Default::default()
        };
        let get = |headers: &str| {
            let tcp = std::net::TcpStream::connect(addr).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut s = ClientTls::new(&trust, "127.0.0.1")
                .unwrap()
                .connect(tcp)
                .unwrap();
            write!(
                s,
                "GET /api/history HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n"
            )
            .unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        };
        let ok = get("Authorization: Bearer tls-token\r\n");
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("\"missing\":true"), "{ok}");
        assert!(get("").starts_with("HTTP/1.1 401"));

        // Plain HTTP to the HTTPS port gets no answer it could read.
        let mut plain = std::net::TcpStream::connect(addr).unwrap();
        plain
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        write!(plain, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = Vec::new();
        let _ = plain.read_to_end(&mut out);
        assert!(!String::from_utf8_lossy(&out).contains("200 OK"));
    }
}
