//! The pure part of Postgres TLS: libpq's parameters, the mode table, the errors' words.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::io;
use std::path::PathBuf;

use rustls::CertificateError;

use super::*;

fn settings(pairs: &[(&str, &str)]) -> Result<TlsSettings, String> {
    let mut s = TlsSettings::default();
    for (k, v) in pairs {
        assert!(s.set(k, v)?, "{k} is a TLS parameter");
    }
    s.validate()?;
    Ok(s)
}

#[test]
fn every_libpq_mode_parses_and_prints_back() {
    for text in [
        "disable",
        "allow",
        "prefer",
        "require",
        "verify-ca",
        "verify-full",
    ] {
        let mode: SslMode = text.parse().unwrap();
        assert_eq!(mode.to_string(), text);
    }
    let e = "verify_full".parse::<SslMode>().unwrap_err();
    assert!(
        e.contains("verify-full") && e.contains("verify_full"),
        "{e}"
    );
    assert_eq!(
        TlsSettings::default().mode,
        SslMode::Prefer,
        "libpq's default"
    );
}

#[test]
fn which_modes_start_in_tls_and_which_accept_plain() {
    use SslMode::*;
    let first: Vec<_> = SslMode::ALL.iter().map(|m| m.tls_first()).collect();
    assert_eq!(first, [false, false, true, true, true, true]);
    let plain: Vec<_> = SslMode::ALL.iter().map(|m| m.plain_allowed()).collect();
    assert_eq!(plain, [true, true, true, false, false, false]);
    assert!(!Require.plain_allowed() && !VerifyFull.plain_allowed());
}

#[test]
fn url_parameters_set_the_settings() {
    let s = settings(&[
        ("sslmode", "verify-full"),
        ("sslrootcert", "/etc/cdcd/rds-ca.pem"),
        ("sslcert", "/c.pem"),
        ("sslkey", "/k.pem"),
        ("sslsni", "0"),
    ])
    .unwrap();
    assert_eq!(s.mode, SslMode::VerifyFull);
    assert_eq!(
        s.root_cert,
        Some(RootCerts::File(PathBuf::from("/etc/cdcd/rds-ca.pem")))
    );
    assert_eq!(s.cert.as_deref(), Some(std::path::Path::new("/c.pem")));
    assert!(!s.sni);
    assert_eq!(
        s.summary(),
        "sslmode=verify-full sslrootcert=/etc/cdcd/rds-ca.pem sslcert=/c.pem sslkey=/k.pem sslsni=0"
    );
    let system = settings(&[("sslmode", "verify-ca"), ("sslrootcert", "system")]).unwrap();
    assert_eq!(system.roots(), RootCerts::System);
    assert_eq!(TlsSettings::default().roots(), RootCerts::System);

    let mut s = TlsSettings::default();
    assert_eq!(s.set("application_name", "x"), Ok(false));
    assert!(s.set("sslsni", "yes").is_err());
    assert!(s.set("sslrootcert", "").is_err());
    assert!(s.set("sslkey", "").is_err());
}

#[test]
fn a_certificate_needs_its_key() {
    let e = settings(&[("sslcert", "/c.pem")]).unwrap_err();
    assert!(e.contains("sslkey"), "{e}");
    let e = settings(&[("sslkey", "/k.pem")]).unwrap_err();
    assert!(e.contains("sslcert"), "{e}");
    let e = settings(&[("sslmode", "disable"), ("sslcert", "/c"), ("sslkey", "/k")]).unwrap_err();
    assert!(e.contains("disable"), "{e}");
}

/// libpq: "if a root CA file exists, sslmode=require behaves like verify-ca".
#[test]
fn require_with_a_ca_file_verifies_the_chain() {
    let s = settings(&[("sslmode", "require"), ("sslrootcert", "/ca.pem")]).unwrap();
    assert_eq!(s.effective_mode(), SslMode::VerifyCa);
    assert!(s.summary().contains("as verify-ca"), "{}", s.summary());
    let s = settings(&[("sslmode", "require"), ("sslrootcert", "system")]).unwrap();
    assert_eq!(s.effective_mode(), SslMode::Require);
    let s = settings(&[("sslmode", "require")]).unwrap();
    assert_eq!(s.effective_mode(), SslMode::Require);
}

#[test]
fn a_missing_or_empty_ca_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pem");
    let s = settings(&[
        ("sslmode", "verify-full"),
        ("sslrootcert", missing.to_str().unwrap()),
    ])
    .unwrap();
    let e = s.client_config().unwrap_err().to_string();
    assert!(e.contains("nope.pem") && e.contains("sslrootcert"), "{e}");

    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let s = settings(&[
        ("sslmode", "verify-ca"),
        ("sslrootcert", empty.to_str().unwrap()),
    ])
    .unwrap();
    let e = s.client_config().unwrap_err().to_string();
    assert!(
        e.contains("empty.pem") && e.contains("no PEM certificate"),
        "{e}"
    );

    // Modes that verify nothing read no CA file.
    let s = settings(&[("sslmode", "prefer")]).unwrap();
    s.client_config().unwrap();
}

/// A broken key file's error names the file, never what is in it.
#[test]
fn a_bad_key_file_is_named_but_not_shown() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("c.pem");
    let key = dir.path().join("k.pem");
    std::fs::write(
        &cert,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nS3CR3TKEYMATERIAL\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let s = settings(&[
        ("sslmode", "require"),
        ("sslcert", cert.to_str().unwrap()),
        ("sslkey", key.to_str().unwrap()),
    ])
    .unwrap();
    let e = s.client_config().unwrap_err().to_string();
    assert!(!e.contains("S3CR3TKEYMATERIAL"), "{e}");
    assert!(e.contains("c.pem") || e.contains("k.pem"), "{e}");
    assert!(!format!("{s:?}").contains("S3CR3T"));
}

fn handshake_failure(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

#[test]
fn an_untrusted_certificate_names_the_host_and_the_ca_file() {
    let s = settings(&[
        ("sslmode", "verify-full"),
        ("sslrootcert", "/etc/cdcd/ca.pem"),
    ])
    .unwrap();
    let e = s.handshake_error(
        "db.example.com",
        &handshake_failure(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer,
        )),
    );
    let text = e.to_string();
    assert!(matches!(e, TlsError::Untrusted { .. }), "{text}");
    assert!(
        text.contains("db.example.com") && text.contains("/etc/cdcd/ca.pem"),
        "{text}"
    );
    let system = TlsSettings {
        mode: SslMode::VerifyFull,
        ..TlsSettings::default()
    };
    let text = system
        .handshake_error(
            "h",
            &handshake_failure(rustls::Error::InvalidCertificate(CertificateError::Expired)),
        )
        .to_string();
    assert!(text.contains("system's CA certificates"), "{text}");
}

#[test]
fn a_name_mismatch_says_which_name_and_what_to_do() {
    let s = settings(&[("sslmode", "verify-full")]).unwrap();
    let e = s.handshake_error(
        "127.0.0.2",
        &handshake_failure(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName,
        )),
    );
    let text = e.to_string();
    assert!(matches!(e, TlsError::WrongName { .. }), "{text}");
    assert!(
        text.contains("127.0.0.2") && text.contains("verify-ca"),
        "{text}"
    );
    let other = s.handshake_error("h", &io::Error::other("reset"));
    assert!(matches!(other, TlsError::Handshake { .. }), "{other}");
}

#[test]
fn a_refused_plain_connection_gets_the_tls_hint() {
    let pg15 = "no pg_hba.conf entry for host \"127.0.0.1\", user \"cdcd_tls\", database \"cdcd_test\", no encryption";
    assert_eq!(
        requires_tls_hint(pg15),
        Some("the server requires TLS: set sslmode=require or stronger")
    );
    let encrypted =
        "no pg_hba.conf entry for host \"127.0.0.1\", user \"x\", database \"y\", SSL encryption";
    assert_eq!(requires_tls_hint(encrypted), None);
    assert_eq!(
        requires_tls_hint("password authentication failed for user \"x\""),
        None
    );
}

#[test]
fn server_names_for_names_and_addresses() {
    let s = TlsSettings::default();
    assert!(matches!(
        s.server_name("db.example.com").unwrap(),
        ServerName::DnsName(_)
    ));
    assert!(matches!(
        s.server_name("127.0.0.1").unwrap(),
        ServerName::IpAddress(_)
    ));
    assert!(s.server_name("bad name!").is_err());
}
