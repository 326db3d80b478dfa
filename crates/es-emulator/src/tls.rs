//! Optional HTTPS for this TEST DOUBLE: a listener that completes a TLS handshake (rustls, with
//! the certificate and key given in PEM) before handing the connection to the HTTP server, so
//! tests can check that a client trusts the emulator only through the CA it was told about.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The server's certificate chain (leaf first) and its private key, in PEM.
#[derive(Clone)]
pub struct TlsConfig {
    pub cert_chain_pem: String,
    pub key_pem: String,
}

/// Never prints the private key.
impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig").finish_non_exhaustive()
    }
}

/// A handshake that takes longer than this is dropped (a client that connected and said
/// nothing must not stall the accept loop).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: &TlsConfig) -> io::Result<Self> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{what}: {e}"))
        };
        let chain = CertificateDer::pem_slice_iter(config.cert_chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("certificate PEM", &e))?;
        let key = PrivateKeyDer::from_pem_slice(config.key_pem.as_bytes())
            .map_err(|e| invalid("private key PEM", &e))?;
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let server = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("TLS versions", &e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| invalid("certificate and key", &e))?;
        Ok(TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(Arc::new(server)),
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    /// The next connection whose handshake succeeds; failed handshakes (a client that does not
    /// trust the certificate) are dropped, as a server does.
    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (tcp, addr) = match self.tcp.accept().await {
                Ok(accepted) => accepted,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            if let Ok(Ok(tls)) =
                tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(tcp)).await
            {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
