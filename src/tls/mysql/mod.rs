//! TLS settings for every MySQL/MariaDB connection cdcd opens (the binlog stream, the copy and
//! catalog connections, `cdcd check`), with the MySQL client's meaning: `ssl-mode`, `ssl-ca`,
//! `ssl-cert`/`ssl-key`, turned into mysql_async's [`SslOpts`].
//!
//! Where it sits: in `tls/` beside the data flow, on the rustls stack and PEM loading shared
//! with Postgres (`tls/mod.rs`). The source's `config.rs` fills [`TlsSettings`] from the URL's
//! query parameters (and `[source]` keys); its `setup::connect` makes every connection from [`TlsSettings::ssl_opts`], so all
//! of them verify the same way, and words its failures with [`TlsSettings::connect_error`].
//!
//! Why the MySQL client's semantics (MySQL 8.0 reference, "Command Options for Encrypted
//! Connections"): users paste what their cloud console shows.
//! - `disabled`: never TLS. `preferred` (the default): TLS when the server offers it, else plain.
//!   `required`: TLS or fail. These check no certificate: they protect against eavesdropping, not
//!   against a man in the middle.
//! - `verify_ca`: the chain must lead to a root in `ssl-ca`; the host name is not checked.
//! - `verify_identity`: also the host (name or IP address) must be in the certificate.
//!
//! Two differences from the mysql client, both toward failing loudly: `ssl-ca` without `ssl-mode`
//! means `verify_ca` (the client would not verify unless told), and `ssl-ca` with `disabled`,
//! `preferred` or `required` is a configuration error rather than a warning. `ssl-ca` unset
//! means the OS's roots (as the Postgres source), not mysql_async's built-in Mozilla list.
//!
//! Two mysql_async 0.37.1 facts shape [`TlsSettings::ssl_opts`]:
//! - It builds its rustls config with `ClientConfig::builder()`, which needs a process-wide
//!   crypto provider; the tree enables both ring and aws-lc-rs, so rustls picks none and that
//!   call panics. [`install_crypto_provider`](super::install_crypto_provider) installs ring (the
//!   provider cdcd names elsewhere).
//! - Its `skip_domain_validation` (our `verify_ca`) searches the rustls error's text for
//!   `NotValidForName` (mysql_async issue #404, fixed by #408 after 0.37.1). rustls 0.23 writes
//!   that error as `certificate not valid for name "<the name asked for>"; …`, so the text holds
//!   the string only when the name asked for does: `verify_ca` asks for [`CHAIN_ONLY_NAME`]. The
//!   chain is still checked in full first (webpki checks the name last). Remove the override once
//!   a release carries #408.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use mysql_async::{ClientIdentity, SslOpts};
use rustls::CertificateError;

use super::{certs_in, install_crypto_provider, key_in, non_empty_path, read, trust_anchors};
pub use super::{RootCerts, TlsError};

/// The MySQL client's `--ssl-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disabled,
    #[default]
    Preferred,
    Required,
    VerifyCa,
    VerifyIdentity,
}

impl SslMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disabled => "disabled",
            SslMode::Preferred => "preferred",
            SslMode::Required => "required",
            SslMode::VerifyCa => "verify_ca",
            SslMode::VerifyIdentity => "verify_identity",
        }
    }

    /// The certificate is checked against roots (`verify_ca`, `verify_identity`).
    pub fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyIdentity)
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = String;

    /// MySQL's names in any case (`VERIFY_IDENTITY` as the docs write them), and the libpq-style
    /// spellings cdcd accepted before (`require`, `verify-full`, …).
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "disabled" | "disable" => SslMode::Disabled,
            "preferred" | "prefer" => SslMode::Preferred,
            "required" | "require" => SslMode::Required,
            "verify_ca" => SslMode::VerifyCa,
            "verify_identity" | "verify_full" => SslMode::VerifyIdentity,
            _ => {
                return Err(format!(
                "ssl-mode={s:?}: use disabled, preferred, required, verify_ca or verify_identity"
            ))
            }
        })
    }
}

/// The TLS part of a MySQL source's settings. Holds paths only: key material is read when a
/// connection is made (so a rotated bundle is picked up by the next one), and not kept.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsSettings {
    /// `None`: unset (`preferred`, or `verify_ca` when `ca` is set).
    pub mode: Option<SslMode>,
    pub ca: Option<PathBuf>,
    /// Client certificate chain (PEM), for accounts with `REQUIRE X509`; with `key`.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
}

/// The URL query parameters [`TlsSettings::set`] understands (MySQL's option names).
pub const PARAMETERS: [&str; 4] = ["ssl-mode", "ssl-ca", "ssl-cert", "ssl-key"];

/// The name `verify_ca` asks the certificate for (see the module docs): one no certificate
/// lists, whose mismatch error mysql_async 0.37.1 recognises. Sent as SNI, which MySQL and
/// MariaDB servers ignore.
pub const CHAIN_ONLY_NAME: &str = "NotValidForName.cdcd.invalid";

impl TlsSettings {
    /// Sets the parameter `name` (one of [`PARAMETERS`], or `sslmode` as cdcd accepted before);
    /// `Ok(false)` when it is none of them.
    pub fn set(&mut self, name: &str, value: &str) -> Result<bool, String> {
        let path = |what: &str| non_empty_path(what, value).map(Some);
        match name {
            "ssl-mode" | "sslmode" => self.mode = Some(value.parse()?),
            "ssl-ca" => self.ca = path(name)?,
            "ssl-cert" => self.cert = path(name)?,
            "ssl-key" => self.key = path(name)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The mode in effect: `ssl-ca` alone means `verify_ca`.
    pub fn effective_mode(&self) -> SslMode {
        match (self.mode, &self.ca) {
            (Some(mode), _) => mode,
            (None, Some(_)) => SslMode::VerifyCa,
            (None, None) => SslMode::Preferred,
        }
    }

    /// Checks what does not need the files.
    pub fn validate(&self) -> Result<(), String> {
        let mode = self.effective_mode();
        match (&self.cert, &self.key) {
            (Some(_), None) => {
                return Err(
                    "ssl-cert is set without ssl-key (the client certificate's private key)".into(),
                )
            }
            (None, Some(_)) => {
                return Err("ssl-key is set without ssl-cert (the client certificate)".into())
            }
            (Some(_), Some(_)) if mode == SslMode::Disabled => {
                return Err("ssl-cert is set but ssl-mode=disabled never sends it".into())
            }
            _ => {}
        }
        if self.ca.is_some() && !mode.verifies() {
            return Err(format!(
                "ssl-ca is set but ssl-mode={mode} checks no certificate: use ssl-mode=verify_ca or verify_identity"
            ));
        }
        Ok(())
    }

    /// The roots verification is anchored in.
    pub fn roots(&self) -> RootCerts {
        self.ca.clone().map_or(RootCerts::System, RootCerts::File)
    }

    /// mysql_async's options for this mode; `None`: a plain connection. Reads the files named.
    pub fn ssl_opts(&self) -> Result<Option<SslOpts>, TlsError> {
        let mode = self.effective_mode();
        if mode == SslMode::Disabled {
            return Ok(None);
        }
        install_crypto_provider();
        let mut opts = SslOpts::default();
        opts = match mode {
            // mysql_async builds its verifier even when it accepts any certificate, and that
            // needs a root: its built-in ones are left in for that, and never consulted.
            SslMode::Disabled | SslMode::Preferred | SslMode::Required => opts
                .with_danger_accept_invalid_certs(true)
                .with_danger_skip_domain_validation(true),
            SslMode::VerifyCa | SslMode::VerifyIdentity => {
                let roots = trust_anchors(&self.roots(), "CA file (ssl-ca)", "ssl-ca")?;
                let opts = opts.with_disable_built_in_roots(true).with_root_certs(
                    roots
                        .into_iter()
                        .map(|c| c.as_ref().to_vec().into())
                        .collect(),
                );
                if mode == SslMode::VerifyCa {
                    opts.with_danger_skip_domain_validation(true)
                        .with_danger_tls_hostname_override(Some(CHAIN_ONLY_NAME))
                } else {
                    opts
                }
            }
        };
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            // Read and parsed here so that a bad file is named; mysql_async parses the bytes again.
            let chain = read(cert, "client certificate (ssl-cert)")?;
            certs_in(&chain, cert, "client certificate (ssl-cert)")?;
            let key_pem = read(key, "client key (ssl-key)")?;
            key_in(&key_pem, key, "client key (ssl-key)")?;
            opts =
                opts.with_client_identity(Some(ClientIdentity::new(chain.into(), key_pem.into())));
        }
        Ok(Some(opts))
    }

    /// One line for `cdcd check` and logs, in the MySQL client's words (paths, never keys).
    pub fn summary(&self) -> String {
        let mut s = format!("ssl-mode={}", self.effective_mode());
        if self.mode.is_none() {
            s.push_str(match self.ca {
                Some(_) => " (ssl-ca is set)",
                None => " (default)",
            });
        }
        for (name, path) in [
            ("ssl-ca", &self.ca),
            ("ssl-cert", &self.cert),
            ("ssl-key", &self.key),
        ] {
            if let Some(p) = path {
                s.push_str(&format!(" {name}={}", p.display()));
            }
        }
        s
    }

    /// What a failed connection to `host` means for the user, or `None` when it is not about TLS:
    /// an untrusted chain names the roots it was checked against, a name mismatch says which
    /// mode checks no names, a server without TLS says what to change.
    pub fn connect_error(&self, host: &str, e: &mysql_async::Error) -> Option<String> {
        use mysql_async::{DriverError, Error, IoError};
        let mode = self.effective_mode();
        match e {
            Error::Driver(DriverError::NoClientSslFlagFromServer) => Some(
                TlsError::Refused {
                    host: host.to_owned(),
                    mode: format!("ssl-mode={mode}"),
                    enable: "enable TLS on the server (ssl_cert, ssl_key)",
                    parameter: "ssl-mode",
                }
                .to_string(),
            ),
            Error::Io(IoError::Io(io)) => {
                let rustls_error = io
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())?;
                let reason = rustls_error.to_string();
                let host = host.to_owned();
                Some(
                    match rustls_error {
                        rustls::Error::InvalidCertificate(
                            CertificateError::NotValidForName
                            | CertificateError::NotValidForNameContext { .. },
                        ) => TlsError::WrongName {
                            host,
                            reason,
                            chain_only: "ssl-mode=verify_ca",
                        },
                        rustls::Error::InvalidCertificate(_) => TlsError::Untrusted {
                            host,
                            roots: self.roots(),
                            reason,
                            parameter: "ssl-ca",
                        },
                        _ => TlsError::Handshake {
                            host,
                            detail: reason,
                        },
                    }
                    .to_string(),
                )
            }
            Error::Io(IoError::Tls(t)) => Some(format!("TLS with {host}: {t}")),
            _ => None,
        }
    }

    /// The advice to add to an "access denied" (1045): MySQL and MariaDB refuse an account's
    /// `REQUIRE SSL` / `REQUIRE X509` with the same error as a wrong password.
    pub fn access_denied_hint(&self, used_tls: bool) -> &'static str {
        match (used_tls, &self.cert) {
            (false, _) => "check source.password; if the account requires TLS (REQUIRE SSL), set ssl-mode=required or stronger",
            (true, None) => "check source.password; if the account requires a client certificate (REQUIRE X509), set ssl-cert and ssl-key",
            (true, Some(_)) => "check source.password, and that the server's ssl_ca signed the client certificate",
        }
    }
}

#[cfg(test)]
mod tests;
