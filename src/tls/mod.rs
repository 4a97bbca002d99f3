//! TLS for every connection cdcd opens to a database: one rustls stack, the roots and
//! certificates it loads, the verifiers it needs, and the errors' words, shared by the two client
//! dialects users configure it in.
//!
//! Where it sits: beside the data flow, not in it. Three parts of the flow talk to databases: the
//! Postgres source, the MySQL/MariaDB source and the Iceberg sink's SQL catalog (Postgres). A
//! sink may not import a source, so the TLS they use lives here, at the crate's top, and knows
//! none of them.
//!
//! - `postgres/mod.rs` (+ `postgres/stream.rs`): libpq's `sslmode`, `sslrootcert`, `sslcert`/`sslkey`,
//!   `sslsni` as one rustls `ClientConfig`, the SSLRequest handshake and tokio-postgres's
//!   connector (the Postgres source and the SQL catalog).
//! - `mysql.rs`: the MySQL client's `ssl-mode`, `ssl-ca`, `ssl-cert`/`ssl-key` as mysql_async's
//!   `SslOpts` (the MySQL/MariaDB source).
//! - this file: what both dialects share: where roots come from ([`RootCerts`]), reading PEM
//!   files ([`load_certs`], [`load_key`], [`trust_anchors`]), the verifiers of the modes that
//!   check less than WebPKI ([`LenientVerifier`]), and [`TlsError`].
//!
//! Why two dialects and not one: users paste what their cloud console shows, and the two
//! clients name and order their modes differently (libpq's `verify-full` is MySQL's
//! `verify_identity`; libpq's `require` with a CA file verifies, MySQL's does not). Each dialect
//! keeps its own mode table and parameter names; nothing below them is written twice.
//!
//! Why rustls with ring named: one TLS stack for the whole binary (mysql_async and object_store
//! use rustls), and the tree enables both of rustls's crypto providers, so rustls picks no
//! default.

pub mod mysql;
pub mod postgres;
mod verifiers;

use std::fmt;
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

pub use verifiers::LenientVerifier;

/// Where the certificates that anchor verification come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// The operating system's store (libpq `sslrootcert=system`, MySQL `ssl-ca` unset).
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

/// Setting up or carrying out TLS failed. Every message names what to change, in the words of
/// the dialect the user configured (`parameter`: the setting to change, e.g. `sslrootcert`).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the {what} {}: {detail}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("the system's CA certificates cannot be loaded ({detail}): set {parameter} to a CA bundle file")]
    SystemRoots {
        detail: String,
        parameter: &'static str,
    },
    #[error("TLS setup: {0}")]
    Setup(String),
    #[error("{host:?} cannot be checked against a certificate (not a DNS name or IP address)")]
    ServerName { host: String },
    /// `mode`: the setting that requires TLS (`sslmode=require`); `enable`: what to do on the
    /// server.
    #[error("the server {host} does not accept TLS connections, and {mode} requires TLS: {enable}, or lower {parameter}")]
    Refused {
        host: String,
        mode: String,
        enable: &'static str,
        parameter: &'static str,
    },
    #[error("the certificate of the server {host} does not verify against {roots} ({reason}): set {parameter} to the CA bundle that signed it")]
    Untrusted {
        host: String,
        roots: RootCerts,
        reason: String,
        parameter: &'static str,
    },
    /// `chain_only`: the mode that checks the chain and no name (`sslmode=verify-ca`).
    #[error("the certificate of the server {host} is not valid for the name {host:?} ({reason}): connect with a name the certificate lists, or use {chain_only}")]
    WrongName {
        host: String,
        reason: String,
        chain_only: &'static str,
    },
    #[error("TLS handshake with {host} failed: {detail}")]
    Handshake { host: String, detail: String },
}

/// The certificates of the PEM file `path` (`what` names it in errors).
pub fn load_certs(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    certs_in(&read(path, what)?, path, what)
}

/// The certificates in `pem`, read from `path`.
pub fn certs_in(
    pem: &[u8],
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |detail: String| TlsError::File {
        what,
        path: path.to_owned(),
        detail,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(file_error("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// The private key in `pem`, read from `path`. The key's own bytes never reach a message: pem
/// errors name sections, not contents.
pub fn key_in(
    pem: &[u8],
    path: &Path,
    what: &'static str,
) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::File {
        what,
        path: path.to_owned(),
        detail: match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no PEM private key in it (PKCS#8, PKCS#1 or SEC1)".to_owned()
            }
            other => other.to_string(),
        },
    })
}

/// The private key of the PEM file `path`.
pub fn load_key(path: &Path, what: &'static str) -> Result<PrivateKeyDer<'static>, TlsError> {
    key_in(&read(path, what)?, path, what)
}

/// The bytes of `path`.
pub fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        what,
        path: path.to_owned(),
        detail: e.to_string(),
    })
}

/// The roots of `roots`, each one rustls accepts as a trust anchor (OS stores hold odd ones, and
/// mysql_async fails a connection on the first root it cannot parse). `what` names the CA file
/// in errors, `parameter` the setting that names another.
pub fn trust_anchors(
    roots: &RootCerts,
    what: &'static str,
    parameter: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let usable = |c: &CertificateDer<'static>| RootCertStore::empty().add(c.clone()).is_ok();
    match roots {
        RootCerts::File(path) => {
            let certs: Vec<_> = load_certs(path, what)?.into_iter().filter(usable).collect();
            if certs.is_empty() {
                return Err(TlsError::File {
                    what,
                    path: path.clone(),
                    detail: "no usable CA certificate in it".into(),
                });
            }
            Ok(certs)
        }
        RootCerts::System => {
            let found = rustls_native_certs::load_native_certs();
            let certs: Vec<_> = found.certs.into_iter().filter(usable).collect();
            if certs.is_empty() {
                let detail = match found.errors.first() {
                    Some(e) => e.to_string(),
                    None => "none found".to_owned(),
                };
                return Err(TlsError::SystemRoots { detail, parameter });
            }
            Ok(certs)
        }
    }
}

/// `path` as a file name parameter `name` gave, refused when empty.
pub fn non_empty_path(name: &str, value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        Err(format!("{name} is empty: a PEM file path"))
    } else {
        Ok(PathBuf::from(value))
    }
}

/// Installs ring as the process's rustls provider, once: a library that builds its config with
/// `ClientConfig::builder()` (mysql_async) needs a process-wide provider, and the tree enables
/// both ring and aws-lc-rs, so rustls picks none and that call panics. A provider installed
/// before (by anything) stays.
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
