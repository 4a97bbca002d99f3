//! The certificate verifiers of the modes that check less than WebPKI does: none (libpq's
//! `prefer`/`allow`/`require`, MySQL's `preferred`/`required`) and the chain without the name
//! (libpq's `verify-ca`). Both still check the handshake signature against the certificate's key.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// The verifier of a mode that checks less than WebPKI does. The handshake signature is always
/// checked against the certificate's key with `provider`'s algorithms (what WebPKI's own check
/// uses), so the peer holds the key of what it presented; the certificate itself is checked as
/// far as `chain` says.
#[derive(Debug)]
pub struct LenientVerifier {
    provider: Arc<CryptoProvider>,
    /// `None`: any certificate (libpq's `prefer`, `allow` and `require`). `Some`: the full
    /// WebPKI check except the name (libpq's `verify-ca` checks no name).
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl LenientVerifier {
    /// Accepts any certificate.
    pub fn any_certificate(provider: Arc<CryptoProvider>) -> LenientVerifier {
        LenientVerifier {
            provider,
            chain: None,
        }
    }

    /// Checks the chain with `webpki` (built on `provider`), not the name.
    pub fn chain_only(
        provider: Arc<CryptoProvider>,
        webpki: Arc<WebPkiServerVerifier>,
    ) -> LenientVerifier {
        LenientVerifier {
            provider,
            chain: Some(webpki),
        }
    }
}

impl ServerCertVerifier for LenientVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
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
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
