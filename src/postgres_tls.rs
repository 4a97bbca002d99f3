//! TLS settings for every Postgres connection cdcd opens, with libpq's meaning: `sslmode`,
//! `sslrootcert`, `sslcert`/`sslkey` and `sslsni`, turned into one rustls `ClientConfig`.
//!
//! Where it sits: beside the data flow, not in it. Both ends of the flow talk to Postgres: the
//! source (`sources/postgres`) and the Iceberg sink's SQL catalog (`sinks/iceberg/catalog/sql`).
//! A sink may not import a source, so the TLS both use lives here, at the crate's top, and knows
//! neither of them. Each fills [`TlsSettings`] from its URL's query parameters (the source also
//! from `[source]` keys); `postgres_tls/stream.rs` uses [`TlsSettings::client_config`] both for
//! the source's own start-up exchange (walsender and copy sessions) and as tokio-postgres's
//! connector (the source's catalog queries, heartbeats, `cdcd check`; the SQL catalog), so every
//! connection verifies the same way and fails with the same words. Nothing in this file touches
//! the network: the mode table, the certificate verifiers, and the texts of the errors.
//!
//! Why libpq's semantics: users paste what their cloud console shows. So (libpq "SSL Support"):
//! - `disable`: never TLS. `allow`: plain first, TLS if the server refuses plain. `prefer` (the
//!   default): TLS if the server offers it, else plain. `require`: TLS or fail. These verify no
//!   certificate: they protect against eavesdropping, not against a man in the middle.
//! - `verify-ca`: the chain must lead to a root in `sslrootcert`; the name is not checked.
//! - `verify-full`: also the host (name or IP address) must be in the certificate.
//! - As in libpq, `require` with an explicit `sslrootcert` file behaves like `verify-ca`.
//!
//! One difference: `sslrootcert` unset means the OS's roots (as `sslrootcert=system`), where libpq
//! would read `~/.postgresql/root.crt`; cdcd runs as a service, with no such home.
//!
//! Why rustls with ring named: one TLS stack for the whole binary (mysql_async and object_store use
//! rustls), and the tree enables both of rustls's crypto providers, so rustls picks no default.

pub mod stream;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disable,
    Allow,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    const ALL: [SslMode; 6] = [
        SslMode::Disable,
        SslMode::Allow,
        SslMode::Prefer,
        SslMode::Require,
        SslMode::VerifyCa,
        SslMode::VerifyFull,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// The first attempt asks for TLS (SSLRequest); `disable` and `allow` start plain.
    pub fn tls_first(self) -> bool {
        !matches!(self, SslMode::Disable | SslMode::Allow)
    }

    /// A server that answers the SSLRequest with `N` may be spoken to in plain text.
    pub fn plain_allowed(self) -> bool {
        matches!(self, SslMode::Disable | SslMode::Allow | SslMode::Prefer)
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        SslMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "sslmode={s:?}: use disable, allow, prefer, require, verify-ca or verify-full"
                )
            })
    }
}

/// Where the certificates that anchor verification come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// The operating system's store (`sslrootcert=system`).
    System,
    /// A PEM bundle (e.g. the RDS CA bundle).
    File(PathBuf),
}

impl fmt::Display for RootCerts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RootCerts::System => f.write_str("the system's CA certificates"),
            RootCerts::File(p) => write!(f, "the CA file {}", p.display()),
        }
    }
}

/// The TLS part of a Postgres source's settings. Holds paths only: no key material is read
/// until a connection is made, and none is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// `None`: unset (the system's roots when verifying).
    pub root_cert: Option<RootCerts>,
    /// Client certificate chain (PEM) for `cert` authentication; with `key`.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// Send the host name as SNI (`sslsni=1`, the default; never sent for an IP address).
    pub sni: bool,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings {
            mode: SslMode::Prefer,
            root_cert: None,
            cert: None,
            key: None,
            sni: true,
        }
    }
}

/// The libpq parameter names [`TlsSettings::set`] understands.
pub const PARAMETERS: [&str; 5] = ["sslmode", "sslrootcert", "sslcert", "sslkey", "sslsni"];

/// Setting up or carrying out TLS failed. Every message names what to change.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {}: {detail}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("the system's CA certificates cannot be loaded ({detail}): set sslrootcert to a CA bundle file")]
    SystemRoots { detail: String },
    #[error("TLS setup: {0}")]
    Setup(String),
    #[error("{host:?} cannot be checked against a certificate (not a DNS name or IP address)")]
    ServerName { host: String },
    #[error("the server {host} does not accept TLS connections, and sslmode={mode} requires TLS: enable ssl on the server, or lower sslmode")]
    Refused { host: String, mode: SslMode },
    #[error("the certificate of the server {host} does not verify against {roots} ({reason}): set sslrootcert to the CA bundle that signed it")]
    Untrusted {
        host: String,
        roots: RootCerts,
        reason: String,
    },
    #[error("the certificate of the server {host} is not valid for the name {host:?} ({reason}): connect with a name the certificate lists, or use sslmode=verify-ca")]
    WrongName { host: String, reason: String },
    #[error("TLS handshake with {host} failed: {detail}")]
    Handshake { host: String, detail: String },
}

impl TlsSettings {
    /// Sets the libpq parameter `name`; `Ok(false)` when it is not one of [`PARAMETERS`].
    pub fn set(&mut self, name: &str, value: &str) -> Result<bool, String> {
        match name {
            "sslmode" => self.mode = value.parse()?,
            "sslrootcert" => {
                self.root_cert = Some(match value {
                    "" => return Err("sslrootcert is empty: a PEM file path, or \"system\"".into()),
                    "system" => RootCerts::System,
                    path => RootCerts::File(path.into()),
                })
            }
            "sslcert" => self.cert = Some(non_empty_path(name, value)?),
            "sslkey" => self.key = Some(non_empty_path(name, value)?),
            "sslsni" => {
                self.sni = match value {
                    "1" => true,
                    "0" => false,
                    other => return Err(format!("sslsni={other:?}: use 1 or 0")),
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks what does not need the files: a certificate needs its key and the other way round.
    pub fn validate(&self) -> Result<(), String> {
        match (&self.cert, &self.key) {
            (Some(_), None) => {
                Err("sslcert is set without sslkey (the client certificate's private key)".into())
            }
            (None, Some(_)) => Err("sslkey is set without sslcert (the client certificate)".into()),
            _ if self.mode == SslMode::Disable && self.cert.is_some() => {
                Err("sslcert is set but sslmode=disable never sends it".into())
            }
            _ => Ok(()),
        }
    }

    /// The mode in effect: libpq's `require` with an explicit CA file verifies the chain.
    pub fn effective_mode(&self) -> SslMode {
        match (self.mode, &self.root_cert) {
            (SslMode::Require, Some(RootCerts::File(_))) => SslMode::VerifyCa,
            (mode, _) => mode,
        }
    }

    /// The roots verification is anchored in.
    pub fn roots(&self) -> RootCerts {
        self.root_cert.clone().unwrap_or(RootCerts::System)
    }

    /// One line for `cdcd check` and logs: the parameters in libpq's words (paths, never keys).
    pub fn summary(&self) -> String {
        let mut s = format!("sslmode={}", self.mode);
        if self.effective_mode() != self.mode {
            s.push_str(&format!(
                " (as {}: sslrootcert is set)",
                self.effective_mode()
            ));
        }
        match &self.root_cert {
            Some(RootCerts::System) => s.push_str(" sslrootcert=system"),
            Some(RootCerts::File(p)) => s.push_str(&format!(" sslrootcert={}", p.display())),
            None => {}
        }
        if let Some(p) = &self.cert {
            s.push_str(&format!(" sslcert={}", p.display()));
        }
        if let Some(p) = &self.key {
            s.push_str(&format!(" sslkey={}", p.display()));
        }
        if !self.sni {
            s.push_str(" sslsni=0");
        }
        s
    }

    /// The rustls configuration for this mode: which verifier, which roots, which client
    /// certificate. Reads the files named (so a rotated CA bundle is picked up by the next
    /// connection).
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setup(e.to_string()))?;
        let verifier: Arc<dyn ServerCertVerifier> = match self.effective_mode() {
            SslMode::VerifyFull | SslMode::VerifyCa => {
                let roots = Arc::new(load_roots(&self.roots())?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| TlsError::Setup(e.to_string()))?;
                if self.effective_mode() == SslMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(ChainOnly { inner: webpki })
                }
            }
            _ => Arc::new(NoVerification { provider }),
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = load_certs(cert, "client certificate (sslcert)")?;
                let key_der = load_key(key)?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| TlsError::File {
                        what: "client certificate and key (sslcert, sslkey)",
                        path: cert.clone(),
                        detail: e.to_string(),
                    })?
            }
            _ => builder.with_no_client_auth(),
        };
        config.enable_sni = self.sni;
        Ok(Arc::new(config))
    }

    /// The name the server's certificate is checked against (and sent as SNI when a DNS name).
    pub fn server_name(&self, host: &str) -> Result<ServerName<'static>, TlsError> {
        ServerName::try_from(host.to_owned()).map_err(|_| TlsError::ServerName {
            host: host.to_owned(),
        })
    }

    /// What a failed handshake with `host` means for the user: an untrusted chain names the
    /// roots it was checked against, a name mismatch says which modes check names.
    pub fn handshake_error(&self, host: &str, e: &std::io::Error) -> TlsError {
        let rustls_error = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        match rustls_error {
            Some(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => TlsError::WrongName {
                host: host.to_owned(),
                reason: e.to_string(),
            },
            Some(rustls::Error::InvalidCertificate(_)) => TlsError::Untrusted {
                host: host.to_owned(),
                roots: self.roots(),
                reason: e.to_string(),
            },
            _ => TlsError::Handshake {
                host: host.to_owned(),
                detail: e.to_string(),
            },
        }
    }
}

/// The advice to add to a server's refusal of a plain connection: Postgres says "no pg_hba.conf
/// entry for host …, no encryption" when only `hostssl` lines would match.
pub fn requires_tls_hint(server_message: &str) -> Option<&'static str> {
    (server_message.contains("no pg_hba.conf entry") && server_message.contains("no encryption"))
        .then_some("the server requires TLS: set sslmode=require or stronger")
}

fn non_empty_path(name: &str, value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        Err(format!("{name} is empty: a PEM file path"))
    } else {
        Ok(PathBuf::from(value))
    }
}

fn load_roots(roots: &RootCerts) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    match roots {
        RootCerts::File(path) => {
            let certs = load_certs(path, "CA file (sslrootcert)")?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(TlsError::File {
                    what: "CA file (sslrootcert)",
                    path: path.clone(),
                    detail: "no usable CA certificate in it".into(),
                });
            }
        }
        RootCerts::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let detail = match found.errors.first() {
                    Some(e) => e.to_string(),
                    None => "none found".to_owned(),
                };
                return Err(TlsError::SystemRoots { detail });
            }
        }
    }
    Ok(store)
}

fn load_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |detail: String| TlsError::File {
        what,
        path: path.to_owned(),
        detail,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(file_error("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// The key's own bytes never reach a message: pem errors name sections, not contents.
fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        what: "client key (sslkey)",
        path: path.to_owned(),
        detail: match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no PEM private key in it (PKCS#8, PKCS#1 or SEC1)".to_owned()
            }
            other => other.to_string(),
        },
    })
}

/// `prefer`, `allow` and `require`: any certificate, as libpq. The handshake signature is still
/// checked against the certificate's key, so the peer holds the key of what it presented.
#[derive(Debug)]
struct NoVerification {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `verify-ca`: the full WebPKI check except the name (libpq checks no name in this mode).
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            // webpki checks the name last, after the chain, validity and usage.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests;
