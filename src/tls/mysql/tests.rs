//! The pure part of MySQL TLS: the client's parameters, the mode table, the errors' words, and
//! the rustls fact the `verify_ca` work-around rests on.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::io;

use rustls::pki_types::ServerName;

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
fn every_mysql_mode_parses_in_any_case_and_prints_back() {
    for text in [
        "disabled",
        "preferred",
        "required",
        "verify_ca",
        "verify_identity",
    ] {
        let mode: SslMode = text.parse().unwrap();
        assert_eq!(mode.to_string(), text);
        let upper: SslMode = text.to_ascii_uppercase().parse().unwrap();
        assert_eq!(upper, mode, "MySQL's docs write the modes in capitals");
    }
    // The libpq-style spellings cdcd took before this module.
    for (old, mode) in [
        ("disable", SslMode::Disabled),
        ("prefer", SslMode::Preferred),
        ("require", SslMode::Required),
        ("verify-ca", SslMode::VerifyCa),
        ("verify-full", SslMode::VerifyIdentity),
    ] {
        assert_eq!(old.parse::<SslMode>().unwrap(), mode);
    }
    let e = "on".parse::<SslMode>().unwrap_err();
    assert!(e.contains("\"on\"") && e.contains("verify_identity"), "{e}");
    assert_eq!(
        TlsSettings::default().effective_mode(),
        SslMode::Preferred,
        "the mysql client's default"
    );
}

#[test]
fn ssl_ca_alone_means_verify_ca_and_with_a_non_verifying_mode_is_refused() {
    let s = settings(&[("ssl-ca", "/etc/cdcd/rds-ca.pem")]).unwrap();
    assert_eq!(s.effective_mode(), SslMode::VerifyCa);
    assert_eq!(
        s.summary(),
        "ssl-mode=verify_ca (ssl-ca is set) ssl-ca=/etc/cdcd/rds-ca.pem"
    );
    assert_eq!(s.roots(), RootCerts::File("/etc/cdcd/rds-ca.pem".into()));
    for mode in ["required", "preferred", "disabled"] {
        let e = settings(&[("ssl-mode", mode), ("ssl-ca", "/ca.pem")]).unwrap_err();
        assert!(
            e.contains(&format!("ssl-mode={mode}")) && e.contains("verify_ca"),
            "{e}"
        );
    }
    let s = settings(&[("ssl-mode", "VERIFY_IDENTITY")]).unwrap();
    assert_eq!(s.roots(), RootCerts::System);
    assert_eq!(s.summary(), "ssl-mode=verify_identity");
}

#[test]
fn a_client_certificate_needs_its_key_and_tls() {
    let e = settings(&[("ssl-mode", "required"), ("ssl-cert", "/c.pem")]).unwrap_err();
    assert!(e.contains("ssl-key"), "{e}");
    let e = settings(&[("ssl-key", "/k.pem")]).unwrap_err();
    assert!(e.contains("ssl-cert"), "{e}");
    let e = settings(&[
        ("ssl-mode", "disabled"),
        ("ssl-cert", "/c.pem"),
        ("ssl-key", "/k.pem"),
    ])
    .unwrap_err();
    assert!(e.contains("disabled"), "{e}");
    let e = settings(&[("ssl-ca", "")]).unwrap_err();
    assert!(e.contains("ssl-ca is empty"), "{e}");
    assert!(!TlsSettings::default().set("sslrootcert", "/x").unwrap());
}

#[test]
fn disabled_makes_no_tls_options_and_required_verifies_nothing() {
    let s = settings(&[("ssl-mode", "disabled")]).unwrap();
    assert!(s.ssl_opts().unwrap().is_none());
    let opts = settings(&[("ssl-mode", "required")])
        .unwrap()
        .ssl_opts()
        .unwrap()
        .unwrap();
    assert!(opts.accept_invalid_certs() && opts.skip_domain_validation());
    assert!(
        !opts.disable_built_in_roots(),
        "mysql_async's verifier needs a root"
    );
    let opts = TlsSettings::default().ssl_opts().unwrap().unwrap();
    assert!(opts.accept_invalid_certs(), "preferred verifies nothing");
}

#[test]
fn a_missing_or_useless_ca_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pem");
    let s = settings(&[("ssl-ca", missing.to_str().unwrap())]).unwrap();
    let e = s.ssl_opts().unwrap_err().to_string();
    assert!(
        e.contains("CA file (ssl-ca)") && e.contains(missing.to_str().unwrap()),
        "{e}"
    );
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let s = settings(&[
        ("ssl-mode", "verify_identity"),
        ("ssl-ca", empty.to_str().unwrap()),
    ])
    .unwrap();
    let e = s.ssl_opts().unwrap_err().to_string();
    assert!(e.contains("no PEM certificate"), "{e}");
}

#[test]
fn a_bad_key_file_is_named_but_not_shown() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("c.pem");
    let key = dir.path().join("k.pem");
    // A PEM certificate block is all this step checks (rustls parses the DER at the handshake).
    std::fs::write(
        &cert,
        "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    std::fs::write(&key, "secret-bytes-that-are-no-key\n").unwrap();
    let s = settings(&[
        ("ssl-mode", "required"),
        ("ssl-cert", cert.to_str().unwrap()),
        ("ssl-key", key.to_str().unwrap()),
    ])
    .unwrap();
    let e = s.ssl_opts().unwrap_err().to_string();
    assert!(
        e.contains("client key (ssl-key)") && e.contains(key.to_str().unwrap()),
        "{e}"
    );
    assert!(!e.contains("secret-bytes"), "{e}");
}

fn handshake_failure(e: rustls::Error) -> mysql_async::Error {
    mysql_async::Error::Io(mysql_async::IoError::Io(io::Error::new(
        io::ErrorKind::InvalidData,
        e,
    )))
}

#[test]
fn an_untrusted_certificate_names_the_host_and_the_ca_file() {
    let s = settings(&[
        ("ssl-mode", "verify_identity"),
        ("ssl-ca", "/etc/cdcd/ca.pem"),
    ])
    .unwrap();
    let e = handshake_failure(rustls::Error::InvalidCertificate(
        CertificateError::UnknownIssuer,
    ));
    let text = s.connect_error("db.example.com", &e).unwrap();
    assert!(
        text.contains("db.example.com")
            && text.contains("the CA file /etc/cdcd/ca.pem")
            && text.contains("set ssl-ca"),
        "{text}"
    );
}

#[test]
fn a_name_mismatch_says_which_name_and_what_to_do() {
    let s = settings(&[("ssl-mode", "verify_identity")]).unwrap();
    let e = handshake_failure(rustls::Error::InvalidCertificate(
        CertificateError::NotValidForNameContext {
            expected: ServerName::try_from("127.0.0.2").unwrap(),
            presented: vec!["DnsName(\"localhost\")".into()],
        },
    ));
    let text = s.connect_error("127.0.0.2", &e).unwrap();
    assert!(
        text.contains("not valid for the name \"127.0.0.2\"") && text.contains("verify_ca"),
        "{text}"
    );
}

#[test]
fn a_server_without_tls_says_what_to_change() {
    let s = settings(&[("ssl-mode", "required")]).unwrap();
    let e = mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer);
    let text = s.connect_error("db", &e).unwrap();
    assert!(
        text.contains("does not accept TLS") && text.contains("ssl-mode=required"),
        "{text}"
    );
    let other = mysql_async::Error::Driver(mysql_async::DriverError::ConnectionClosed);
    assert!(s.connect_error("db", &other).is_none());
    assert!(TlsSettings::default()
        .access_denied_hint(false)
        .contains("set ssl-mode=required or stronger"));
}

/// The premise of `verify_ca` with mysql_async 0.37.1 (module docs): rustls's text for a name
/// mismatch carries the name asked for, and so `NotValidForName` when asked for
/// [`CHAIN_ONLY_NAME`]; no other certificate error's text does.
#[test]
fn the_chain_only_name_makes_mysql_async_skip_the_name_check() {
    let expected = ServerName::try_from(CHAIN_ONLY_NAME).unwrap();
    for presented in [vec![], vec!["DnsName(\"localhost\")".to_owned()]] {
        let e = rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected: expected.clone(),
            presented,
        });
        assert!(e.to_string().contains("NotValidForName"), "{e}");
    }
    for other in [
        CertificateError::UnknownIssuer,
        CertificateError::BadSignature,
        CertificateError::Expired,
        CertificateError::NotValidYet,
        CertificateError::Revoked,
        CertificateError::InvalidPurpose,
    ] {
        let e = rustls::Error::InvalidCertificate(other);
        assert!(!e.to_string().contains("NotValidForName"), "{e}");
    }
}
