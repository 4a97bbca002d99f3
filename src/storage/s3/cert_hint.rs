//! [`CertHint`]: an `ObjectStore` wrapper that turns a TLS certificate that did not verify into
//! an error a user can act on.
//!
//! object_store reports such a failure as "error sending request" with rustls's verdict
//! (`invalid peer certificate: UnknownIssuer`) several sources down; nothing in it says which
//! endpoint or which setting. This wrapper finds rustls's verdict in the chain (the typed
//! `rustls::Error`, or its words where the HTTP stack boxed it away) and replaces the error with
//! one naming the endpoint and the
//! fix: `sink.s3.ca_file` for an unknown CA, the endpoint's host name for a name mismatch. Every
//! other error passes unchanged (the commit path matches on `AlreadyExists`/`Precondition`).
//! The parts of a multipart upload are not wrapped: a TLS failure shows on a store's first
//! request, which is never a part.

use std::error::Error as StdError;
use std::fmt;

use async_trait::async_trait;
use futures::StreamExt;
use object_store::{ObjectStore, Result};
use rustls::CertificateError;

use crate::storage::layer::{Answers, Layer, Layered, Request, Sent};

/// A certificate that did not verify, with the endpoint it came from.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CertRefused(String);

/// `e`, or the error that explains a refused certificate of `endpoint`.
pub fn explain(endpoint: &str, e: object_store::Error) -> object_store::Error {
    let Some(verdict) = verdict(&e) else { return e };
    let message = match verdict {
        Verdict::Name(detail) => format!(
            "the TLS certificate of {endpoint} does not name its host ({detail}): set \
             sink.s3.endpoint to a host name the certificate was issued for"
        ),
        Verdict::Issuer(detail) => format!(
            "the TLS certificate of {endpoint} did not verify ({detail}): set sink.s3.ca_file \
             (or AWS_CA_BUNDLE) to the PEM bundle of the CA that signed it"
        ),
        Verdict::Other(detail) => format!(
            "the TLS certificate of {endpoint} did not verify ({detail}); a private CA goes in \
             sink.s3.ca_file (or AWS_CA_BUNDLE)"
        ),
    };
    object_store::Error::Generic {
        store: "S3",
        source: Box::new(CertRefused(message)),
    }
}

/// What was wrong with the certificate, as rustls put it.
enum Verdict {
    /// Valid, but for other names.
    Name(String),
    /// Signed by a CA the client does not trust (or not validly signed).
    Issuer(String),
    Other(String),
}

impl Verdict {
    fn of(cert: &CertificateError) -> Verdict {
        let detail = format!("{cert:?}");
        match cert {
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                Verdict::Name(detail)
            }
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                Verdict::Issuer(detail)
            }
            _ => Verdict::Other(detail),
        }
    }

    /// From rustls's wording, `invalid peer certificate: <CertificateError as Debug>`.
    fn from_text(text: &str) -> Option<Verdict> {
        let (_, rest) = text.split_once("invalid peer certificate: ")?;
        let detail: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        Some(match detail.as_str() {
            d if d.starts_with("NotValidForName") => Verdict::Name(detail),
            "UnknownIssuer" | "BadSignature" => Verdict::Issuer(detail),
            _ => Verdict::Other(detail),
        })
    }
}

/// The certificate verdict somewhere in `e`'s sources: the `rustls::Error` itself where the chain
/// exposes it, else rustls's words. reqwest and hyper box the connector's error on the way up,
/// and the typed error does not always survive as a `source()` (the e2e test against the test
/// bed's https moto only ever saw the words), so both are looked for.
fn verdict(e: &object_store::Error) -> Option<Verdict> {
    let mut next: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = next {
        let found = err.downcast_ref::<rustls::Error>().or_else(|| {
            // `io::Error::source` skips the error it wraps: look inside it.
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls::Error::InvalidCertificate(cert)) = found {
            return Some(Verdict::of(cert));
        }
        if let Some(v) = Verdict::from_text(&err.to_string()) {
            return Some(v);
        }
        next = err.source();
    }
    None
}

/// The wrapped store, naming `endpoint` in its certificate errors.
#[derive(Debug)]
pub struct CertHint<S> {
    inner: S,
    endpoint: String,
}

impl<S: ObjectStore> CertHint<S> {
    #[allow(clippy::new_ret_no_self)] // the wrapper is only ever used as a store
    pub fn new(inner: S, endpoint: String) -> Layered<CertHint<S>> {
        Layered(CertHint { inner, endpoint })
    }
}

impl<S: ObjectStore> fmt::Display for CertHint<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

#[async_trait]
impl<S: ObjectStore> Layer for CertHint<S> {
    async fn send<T: Send>(&self, _request: Request<'_>, sent: Sent<'_, T>) -> Result<T> {
        sent.await.map_err(|e| explain(&self.endpoint, e))
    }

    fn stream<T: Send + 'static>(&self, _request: Request<'_>, answers: Answers<T>) -> Answers<T> {
        let endpoint = self.endpoint.clone();
        answers
            .map(move |r| r.map_err(|e| explain(&endpoint, e)))
            .boxed()
    }

    fn inner(&self) -> &dyn ObjectStore {
        &self.inner
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn wrapped(cert: CertificateError) -> object_store::Error {
        // As it arrives: rustls inside an io::Error inside the client's error.
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(cert),
        );
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(io),
        }
    }

    #[test]
    fn an_unknown_issuer_names_the_endpoint_and_ca_file() {
        let e = explain(
            "https://minio:9000",
            wrapped(CertificateError::UnknownIssuer),
        );
        let text = e.to_string();
        assert!(
            text.contains("https://minio:9000") && text.contains("sink.s3.ca_file"),
            "{text}"
        );
        let e = explain(
            "https://minio:9000",
            wrapped(CertificateError::NotValidForName),
        );
        assert!(e.to_string().contains("does not name its host"), "{e}");
    }

    #[test]
    fn rustls_words_are_enough() {
        let e = object_store::Error::Generic {
            store: "S3",
            source: "error sending request: client error (Connect): invalid peer certificate: \
                     UnknownIssuer"
                .into(),
        };
        let text = explain("https://localhost:59012", e).to_string();
        assert!(
            text.contains("(UnknownIssuer)") && text.contains("sink.s3.ca_file"),
            "{text}"
        );
        let e = object_store::Error::Generic {
            store: "S3",
            source: "invalid peer certificate: NotValidForNameContext { expected: .. }".into(),
        };
        let text = explain("https://h", e).to_string();
        assert!(text.contains("does not name its host"), "{text}");
    }

    #[test]
    fn other_errors_pass_unchanged() {
        let e = object_store::Error::NotFound {
            path: "x".into(),
            source: "gone".into(),
        };
        assert!(matches!(
            explain("https://h", e),
            object_store::Error::NotFound { .. }
        ));
    }
}
