//! TLS settings for every Postgres connection cdcd opens, with libpq's meaning: `sslmode`,
//! `sslrootcert`, `sslcert`/`sslkey` and `sslsni`, turned into one rustls `ClientConfig`.
//!
//! Where it sits: in `tls/` beside the data flow (the module doc there says why). Both ends of
//! the flow talk to Postgres: the source (`sources/postgres`) and the Iceberg sink's SQL catalog
//! (`sinks/iceberg/catalog/sql`). Each fills [`TlsSettings`] from its URL's query parameters (the
//! source also from `[source]` keys); `tls/postgres/stream.rs` uses [`TlsSettings::client_config`] both for
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

pub mod stream;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::ServerName;
use rustls::{CertificateError, ClientConfig, RootCertStore};

use super::{load_certs, load_key, non_empty_path, trust_anchors, LenientVerifier};
pub use super::{RootCerts, TlsError};

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
                let mut roots = RootCertStore::empty();
                roots.add_parsable_certificates(trust_anchors(
                    &self.roots(),
                    "CA file (sslrootcert)",
                    "sslrootcert",
                )?);
                let roots = Arc::new(roots);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| TlsError::Setup(e.to_string()))?;
                if self.effective_mode() == SslMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(LenientVerifier::chain_only(provider, webpki))
                }
            }
            _ => Arc::new(LenientVerifier::any_certificate(provider)),
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = load_certs(cert, "client certificate (sslcert)")?;
                let key_der = load_key(key, "client key (sslkey)")?;
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
                chain_only: "sslmode=verify-ca",
            },
            Some(rustls::Error::InvalidCertificate(_)) => TlsError::Untrusted {
                host: host.to_owned(),
                roots: self.roots(),
                reason: e.to_string(),
                parameter: "sslrootcert",
            },
            _ => TlsError::Handshake {
                host: host.to_owned(),
                detail: e.to_string(),
            },
        }
    }
}

/// The error for a server that refuses TLS while `mode` requires it.
pub fn tls_refused(host: &str, mode: SslMode) -> TlsError {
    TlsError::Refused {
        host: host.to_owned(),
        mode: format!("sslmode={mode}"),
        enable: "enable ssl on the server",
        parameter: "sslmode",
    }
}

/// The advice to add to a server's refusal of a plain connection: Postgres says "no pg_hba.conf
/// entry for host …, no encryption" when only `hostssl` lines would match.
pub fn requires_tls_hint(server_message: &str) -> Option<&'static str> {
    (server_message.contains("no pg_hba.conf entry") && server_message.contains("no encryption"))
        .then_some("the server requires TLS: set sslmode=require or stronger")
}

#[cfg(test)]
mod tests;
