//! `[sink.s3]`, the storage layer's own settings: how to reach an `s3://` warehouse, as written
//! ([`RawS3`], which either sink's section takes) and validated ([`S3Config`], which [`super::build`]
//! reads). `crate::config` checks it after the sink's section and hands it to the warehouse and to
//! a SigV4-signing REST catalog.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::context::Context;
use crate::config::error::ConfigError;

/// `[sink.s3]`: how to reach an `s3://` warehouse (either sink's section takes it). Every unset
/// key falls back to the standard `AWS_*` environment, then the AWS shared files' profile, then
/// the instance credential chain.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawS3 {
    /// `http://` or `https://` URL of an S3-compatible store (MinIO, Ceph, moto…), without the
    /// bucket; unset: AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Set with `secret_access_key`, or neither. Never logged.
    pub access_key_id: Option<String>,
    /// Never logged; prefer `CDCD_SINK__S3__SECRET_ACCESS_KEY`.
    pub secret_access_key: Option<String>,
    /// Allow plain HTTP (default: true only for an `http://` endpoint).
    pub allow_http: Option<bool>,
    /// PEM bundle of the CA(s) that signed an `https` endpoint's certificate (a private MinIO or
    /// Ceph), trusted in addition to the system's roots. Default: `AWS_CA_BUNDLE`, then the
    /// profile's `ca_bundle`.
    pub ca_file: Option<PathBuf>,
    /// `path` (`https://host/bucket/key`) or `virtual-hosted` (`https://bucket.host/key`).
    /// Default: `path` with an `endpoint`, `virtual-hosted` on AWS.
    pub addressing: Option<Addressing>,
    /// Profile of the AWS shared files (`~/.aws/credentials`, `~/.aws/config`) to take keys,
    /// region, endpoint and CA bundle from; default `AWS_PROFILE`, then `default`.
    pub profile: Option<String>,
}

/// `sink.s3.addressing`: where the bucket goes in a request URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Addressing {
    /// `https://host/bucket/key`: MinIO, Ceph, moto, and bucket names with dots.
    Path,
    /// `https://bucket.host/key`: AWS's default; stores that route by host name.
    VirtualHosted,
}

impl fmt::Debug for RawS3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawS3")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id.as_ref().map(|_| "***"))
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "***"),
            )
            .field("allow_http", &self.allow_http)
            .field("ca_file", &self.ca_file)
            .field("addressing", &self.addressing)
            .field("profile", &self.profile)
            .finish()
    }
}

/// Validated `[sink.s3]`; every unset key falls back to the standard `AWS_*` environment
/// (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_CA_BUNDLE`, …), then the AWS
/// shared files' profile, then the instance/container credential chain (`storage/s3/mod.rs`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Config {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub allow_http: Option<bool>,
    /// Checked at load time: readable, with at least one PEM certificate.
    pub ca_file: Option<PathBuf>,
    pub addressing: Option<Addressing>,
    pub profile: Option<String>,
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id.as_ref().map(|_| "***"))
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "***"),
            )
            .field("allow_http", &self.allow_http)
            .field("ca_file", &self.ca_file)
            .field("addressing", &self.addressing)
            .field("profile", &self.profile)
            .finish()
    }
}

impl RawS3 {
    /// Checks every key and builds the settings (the messages name `sink.s3.<key>`).
    pub fn validate(self, ctx: &Context<'_>) -> Result<S3Config, ConfigError> {
        if let Some(endpoint) = &self.endpoint {
            let ok = url::Url::parse(endpoint)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
            if !ok {
                return Err(ctx.invalid(
                    "sink.s3.endpoint",
                    format!("{endpoint:?} must be an http:// or https:// URL"),
                ));
            }
        }
        if self.access_key_id.is_some() != self.secret_access_key.is_some() {
            return Err(ctx.invalid(
                "sink.s3.secret_access_key",
                "set both access_key_id and secret_access_key, or neither",
            ));
        }
        if let Some(path) = &self.ca_file {
            check_ca_file(path).map_err(|d| ctx.invalid("sink.s3.ca_file", d))?;
        }
        if let Some(profile) = &self.profile {
            if profile.trim().is_empty() || profile.contains(['[', ']']) {
                return Err(ctx.invalid(
                    "sink.s3.profile",
                    format!("{profile:?}: name a profile of ~/.aws/config or ~/.aws/credentials"),
                ));
            }
        }
        if let (Some(Addressing::VirtualHosted), Some(endpoint)) = (self.addressing, &self.endpoint)
        {
            let ip = url::Url::parse(endpoint)
                .is_ok_and(|u| matches!(u.host(), Some(url::Host::Ipv4(_) | url::Host::Ipv6(_))));
            if ip {
                return Err(ctx.invalid(
                    "sink.s3.addressing",
                    format!(
                        "virtual-hosted puts the bucket in the host name, and {endpoint:?} is an \
                         IP address: use a host name or addressing = \"path\""
                    ),
                ));
            }
        }
        Ok(S3Config {
            endpoint: self.endpoint,
            region: self.region,
            access_key_id: self.access_key_id,
            secret_access_key: self.secret_access_key,
            allow_http: self.allow_http,
            ca_file: self.ca_file,
            addressing: self.addressing,
            profile: self.profile,
        })
    }
}

/// `sink.s3.ca_file` can be read and holds at least one PEM certificate (the message names the
/// file; the caller names the key).
fn check_ca_file(path: &Path) -> Result<(), String> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let shown = path.display();
    let text = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&text) {
        cert.map_err(|e| format!("{shown} is not a PEM bundle: {e}"))?;
        count += 1;
    }
    if count == 0 {
        return Err(format!(
            "{shown} holds no PEM certificate (-----BEGIN CERTIFICATE-----): give the CA bundle \
             that signed the endpoint's certificate"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{error, MINIMAL};
    use crate::config::Config;

    #[test]
    fn s3_section_is_validated_and_redacted() {
        let text = format!(
            "{MINIMAL}[sink.s3]\nendpoint = \"http://127.0.0.1:9000\"\nregion = \"eu-west-1\"\n\
             access_key_id = \"AKIDSECRETID\"\nsecret_access_key = \"topsecretkey\"\nallow_http = true\n"
        )
        .replace("warehouse = \"/tmp/wh\"", "warehouse = \"s3://bucket/wh/\"");
        let c = Config::from_toml(&text, "p.toml").unwrap();
        assert_eq!(c.sink.warehouse(), "s3://bucket/wh");
        assert_eq!(c.s3.region.as_deref(), Some("eu-west-1"));
        assert_eq!(c.s3.allow_http, Some(true));
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("topsecretkey") && !shown.contains("AKIDSECRETID"),
            "{shown}"
        );
        assert_eq!(c.lease_ttl_ms, 30_000);
        assert!(c.standby);

        let half = format!("{MINIMAL}[sink.s3]\naccess_key_id = \"x\"\n");
        let e = Config::from_toml(&half, "p.toml").unwrap_err().to_string();
        assert!(e.contains("sink.s3.secret_access_key"), "{e}");
        let bad = format!("{MINIMAL}[sink.s3]\nendpoint = \"localhost:9000\"\n");
        let e = Config::from_toml(&bad, "p.toml").unwrap_err().to_string();
        assert!(e.contains("sink.s3.endpoint"), "{e}");
    }

    #[test]
    fn s3_tls_addressing_and_profile_keys() {
        let dir = tempfile::tempdir().unwrap();
        // A certificate as PEM (the bytes need not be a valid certificate to count as one).
        let ca = dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let with = |keys: &str| format!("{MINIMAL}[sink.s3]\n{keys}\n");
        let c = Config::from_toml(
            &with(&format!(
                "endpoint = \"https://minio.internal:9000\"\nca_file = {:?}\n\
                 addressing = \"virtual-hosted\"\nprofile = \"minio\"",
                ca.display().to_string()
            )),
            "p.toml",
        )
        .unwrap();
        assert_eq!(c.s3.ca_file.as_deref(), Some(ca.as_path()));
        assert_eq!(c.s3.addressing, Some(Addressing::VirtualHosted));
        assert_eq!(c.s3.profile.as_deref(), Some("minio"));
        let c = Config::from_toml(&with("addressing = \"path\""), "p.toml").unwrap();
        assert_eq!(c.s3.addressing, Some(Addressing::Path));

        let e = error(&with("addressing = \"virtual\""));
        assert!(e.contains("sink.s3.addressing"), "{e}");
        let e = error(&with(
            "endpoint = \"http://127.0.0.1:9000\"\naddressing = \"virtual-hosted\"",
        ));
        assert!(
            e.contains("sink.s3.addressing") && e.contains("IP address"),
            "{e}"
        );
        let e = error(&with("profile = \"\""));
        assert!(e.contains("sink.s3.profile"), "{e}");

        // A CA file that is missing, or holds no certificate: the key and the file.
        let missing = dir.path().join("missing.pem");
        let e = error(&with(&format!(
            "ca_file = {:?}",
            missing.display().to_string()
        )));
        assert!(
            e.contains("key `sink.s3.ca_file`")
                && e.contains("missing.pem")
                && e.contains("cannot read"),
            "{e}"
        );
        let key = dir.path().join("key.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nMC4CAQA=\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let e = error(&with(&format!("ca_file = {:?}", key.display().to_string())));
        assert!(
            e.contains("key `sink.s3.ca_file`")
                && e.contains("key.pem")
                && e.contains("no PEM certificate"),
            "{e}"
        );
    }
}
