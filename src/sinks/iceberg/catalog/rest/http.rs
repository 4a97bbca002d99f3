//! The REST catalog's HTTP side: one `reqwest` client, the catalog's paths (`/v1/{prefix}/…`,
//! the prefix from `GET /v1/config`), authentication, and answers sorted into what the catalog
//! protocol needs to tell apart (Iceberg REST spec, "Errors"):
//! - [`Reply::Ok`] (2xx) with its body;
//! - [`Reply::Refused`]: a 4xx the server decided on (409 conflict, 404 not found, 400 bad
//!   request, 403): nothing was applied;
//! - [`HttpError::Unknown`]: a 5xx, a timeout, a dropped connection: a write may or may not
//!   have been applied, and the caller finds out by reading (`rest.rs`).
//!
//! Authentication: a fixed bearer token, OAuth2 client credentials (RFC 6749 §4.4) exchanged for
//! a token that is renewed before it expires and once after a 401 (a 401 is answered before
//! anything is applied, so the request is sent again as it was), or AWS SigV4 (the `aws-sigv4`
//! crate; credentials from the chain an `s3://` warehouse uses, `storage/s3/mod.rs`), as AWS Glue's
//! and S3 Tables' REST endpoints require. Secrets appear in no message.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Mutex;

use super::wire::{ConfigResponse, ErrorResponse, TokenResponse};
use crate::sinks::iceberg::catalog::config::{RestAuth, RestConfig};

/// How long one request may take before its outcome counts as unknown.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A token is renewed this long before the server said it expires.
const RENEW_EARLY: Duration = Duration::from_secs(60);

/// The multi-table commit endpoint, as `GET /v1/config` lists it.
pub(crate) const TRANSACTIONS_ENDPOINT: &str = "POST /v1/{prefix}/transactions/commit";

/// A request that got no usable answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    /// The request may have been applied (5xx, timeout, connection lost after sending).
    #[error("{0}")]
    Unknown(String),
    /// Not applied: the request could not be built or sent, or the answer was not the spec's.
    #[error("{0}")]
    Failed(String),
}

/// A server's answer with a status the spec defines.
pub(crate) enum Reply {
    Ok(bytes::Bytes),
    /// A 4xx: the status and the server's message.
    Refused(StatusCode, String),
}

/// What `GET /v1/config` told: the path prefix and whether multi-table commits are offered.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServerConfig {
    pub prefix: Option<String>,
    pub transactions: bool,
}

/// A token and when it must be renewed (`None`: it never expires as far as cdcd knows).
struct Token {
    value: String,
    renew_at: Option<Instant>,
}

pub(crate) struct Client {
    http: reqwest::Client,
    config: RestConfig,
    token: Mutex<Option<Token>>,
    server: tokio::sync::OnceCell<ServerConfig>,
    /// SigV4: where the credentials come from, the service and the region.
    aws: Option<Signer>,
}

struct Signer {
    credentials: object_store::aws::AwsCredentialProvider,
    name: String,
    region: String,
}

impl Client {
    pub fn new(config: &RestConfig) -> Result<Client, HttpError> {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| HttpError::Failed(format!("building the HTTP client: {e}")))?;
        let aws = match &config.auth {
            RestAuth::SigV4 { name, region, s3 } => {
                let (credentials, s3_region) = crate::storage::s3::credentials(s3)
                    .map_err(|e| HttpError::Failed(format!("AWS credentials for SigV4: {e}")))?;
                let region = region
                    .clone()
                    .or(s3_region)
                    .unwrap_or_else(|| "us-east-1".to_owned());
                Some(Signer {
                    credentials,
                    name: name.clone(),
                    region,
                })
            }
            _ => None,
        };
        Ok(Client {
            http,
            config: config.clone(),
            token: Mutex::new(None),
            server: tokio::sync::OnceCell::new(),
            aws,
        })
    }

    /// The server's configuration, fetched once.
    pub async fn server(&self) -> Result<&ServerConfig, HttpError> {
        self.server
            .get_or_try_init(|| async {
                let mut url = format!("{}/v1/config", self.config.uri);
                if let Some(w) = &self.config.warehouse {
                    url.push_str("?warehouse=");
                    url.push_str(&encode(w));
                }
                let body = match self.send_url(Method::GET, &url, None, None).await? {
                    Reply::Ok(body) => body,
                    Reply::Refused(status, message) => {
                        return Err(HttpError::Failed(format!(
                            "GET /v1/config: {status}: {message}"
                        )))
                    }
                };
                let config: ConfigResponse = parse(&body, "GET /v1/config")?;
                let prefix = config
                    .overrides
                    .get("prefix")
                    .or_else(|| config.defaults.get("prefix"))
                    .filter(|p| !p.is_empty())
                    .cloned();
                let transactions = config
                    .endpoints
                    .as_ref()
                    .is_some_and(|e| e.iter().any(|e| e == TRANSACTIONS_ENDPOINT));
                Ok(ServerConfig {
                    prefix,
                    transactions,
                })
            })
            .await
    }

    /// `/v1/{prefix}/<path>` as a URL (`path` without a leading `/`; its parts already encoded).
    async fn url(&self, path: &str) -> Result<String, HttpError> {
        let server = self.server().await?;
        Ok(match &server.prefix {
            Some(prefix) => format!("{}/v1/{}/{path}", self.config.uri, encode(prefix)),
            None => format!("{}/v1/{path}", self.config.uri),
        })
    }

    /// Sends `body` (JSON) to `/v1/{prefix}/<path>`.
    pub async fn send<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        idempotency_key: Option<&str>,
    ) -> Result<Reply, HttpError> {
        // A schema's variant columns are held as cdcd's placeholder: sent as the spec's type.
        let body = body
            .map(|b| {
                serde_json::to_value(b).and_then(|mut json| {
                    crate::sinks::iceberg::variant::to_spec(&mut json);
                    serde_json::to_vec(&json)
                })
            })
            .transpose()
            .map_err(|e| HttpError::Failed(format!("encoding the request to {path}: {e}")))?;
        let url = self.url(path).await?;
        self.send_url(method, &url, body, idempotency_key).await
    }

    async fn send_url(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
        idempotency_key: Option<&str>,
    ) -> Result<Reply, HttpError> {
        let what = format!("{method} {}", path_of(url));
        for renewed in [false, true] {
            let mut request = self.http.request(method.clone(), url);
            if let Some(token) = self.bearer(renewed).await? {
                request = request.bearer_auth(token);
            }
            if let Some(key) = idempotency_key {
                request = request.header("Idempotency-Key", key);
            }
            if let Some(body) = &body {
                request = request
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone());
            }
            if let Some(signer) = &self.aws {
                let signed = signer
                    .sign(&method, url, body.as_deref(), idempotency_key)
                    .await
                    .map_err(|e| HttpError::Failed(format!("{what}: signing: {e}")))?;
                for (name, value) in signed {
                    request = request.header(name, value);
                }
            }
            let response = match request.send().await {
                Ok(r) => r,
                // Refused before it was sent: nothing applied.
                Err(e) if e.is_connect() || e.is_builder() => {
                    return Err(HttpError::Failed(format!("{what}: {}", chain(&e))))
                }
                Err(e) => return Err(HttpError::Unknown(format!("{what}: {}", chain(&e)))),
            };
            let status = response.status();
            let bytes = response.bytes().await;
            if status.is_success() {
                return bytes
                    .map(Reply::Ok)
                    .map_err(|e| HttpError::Unknown(format!("{what}: reading the answer: {e}")));
            }
            let message = bytes.map(|b| message_of(&b)).unwrap_or_default();
            if status == StatusCode::UNAUTHORIZED && !renewed && self.renewable() {
                tracing::info!(request = %what, "the catalog refused the token (401); getting a new one");
                continue;
            }
            if status.is_server_error() {
                return Err(HttpError::Unknown(format!("{what}: {status}: {message}")));
            }
            return Ok(Reply::Refused(status, message));
        }
        Err(HttpError::Failed(format!(
            "{what}: 401 Unauthorized with a new token too; check sink.catalog.credential"
        )))
    }

    fn renewable(&self) -> bool {
        // SigV4: a 401/403 is not cured by asking again.
        matches!(self.config.auth, RestAuth::ClientCredentials { .. })
    }

    /// The bearer token to send (`None`: no authentication); `renew`: fetch a new one.
    async fn bearer(&self, renew: bool) -> Result<Option<String>, HttpError> {
        let RestAuth::ClientCredentials {
            client_id,
            client_secret,
            server_uri,
            scope,
        } = &self.config.auth
        else {
            return Ok(match &self.config.auth {
                RestAuth::Token(t) => Some(t.clone()),
                _ => None,
            });
        };
        let mut token = self.token.lock().await;
        let fresh = token
            .as_ref()
            .is_some_and(|t| t.renew_at.is_none_or(|at| Instant::now() < at));
        if renew || !fresh {
            let endpoint = server_uri
                .clone()
                .unwrap_or_else(|| format!("{}/v1/oauth/tokens", self.config.uri));
            let form = url::form_urlencoded::Serializer::new(String::new())
                .append_pair("grant_type", "client_credentials")
                .append_pair("client_id", client_id)
                .append_pair("client_secret", client_secret)
                .append_pair("scope", scope)
                .finish();
            let what = format!("POST {} (OAuth2 client credentials)", path_of(&endpoint));
            let response = self
                .http
                .post(&endpoint)
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(form)
                .send()
                .await
                .map_err(|e| HttpError::Failed(format!("{what}: {}", chain(&e))))?;
            let status = response.status();
            let body = response
                .bytes()
                .await
                .map_err(|e| HttpError::Failed(format!("{what}: {e}")))?;
            if !status.is_success() {
                return Err(HttpError::Failed(format!(
                    "{what}: {status}: {}; check sink.catalog.credential and oauth2_server_uri",
                    message_of(&body)
                )));
            }
            let answer: TokenResponse = parse(&body, &what)?;
            let renew_at = answer.expires_in.map(|s| {
                let lifetime = Duration::from_secs(s);
                Instant::now() + lifetime.saturating_sub(RENEW_EARLY.min(lifetime / 2))
            });
            *token = Some(Token {
                value: answer.access_token,
                renew_at,
            });
        }
        Ok(token.as_ref().map(|t| t.value.clone()))
    }
}

impl Signer {
    /// The SigV4 headers (`authorization`, `x-amz-date`, `x-amz-security-token`) for a request
    /// with these parts; the content type and idempotency key are signed too.
    async fn sign(
        &self,
        method: &Method,
        url: &str,
        body: Option<&[u8]>,
        idempotency_key: Option<&str>,
    ) -> Result<Vec<(String, String)>, String> {
        use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
        let credential = self
            .credentials
            .get_credential()
            .await
            .map_err(|e| format!("getting AWS credentials: {e}"))?;
        let identity = aws_credential_types::Credentials::new(
            credential.key_id.clone(),
            credential.secret_key.clone(),
            credential.token.clone(),
            None,
            "cdcd",
        )
        .into();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(&self.name)
            .time(std::time::SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| e.to_string())?
            .into();
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if body.is_some() {
            headers.push(("content-type", "application/json"));
        }
        if let Some(key) = idempotency_key {
            headers.push(("idempotency-key", key));
        }
        let signable = SignableRequest::new(
            method.as_str(),
            url,
            headers.into_iter(),
            SignableBody::Bytes(body.unwrap_or_default()),
        )
        .map_err(|e| e.to_string())?;
        let (instructions, _) = sign(signable, &params)
            .map_err(|e| e.to_string())?
            .into_parts();
        Ok(instructions
            .headers()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect())
    }
}

/// Parses a JSON answer; an answer that is not the spec's is an error naming the request.
pub(crate) fn parse<T: DeserializeOwned>(body: &[u8], what: &str) -> Result<T, HttpError> {
    serde_json::from_slice(body)
        .and_then(|mut json: serde_json::Value| {
            crate::sinks::iceberg::variant::from_spec(&mut json);
            serde_json::from_value(json)
        })
        .map_err(|e| HttpError::Failed(format!("{what}: the answer is not the spec's ({e})")))
}

/// One path segment, percent-encoded (RFC 3986 unreserved characters kept).
pub(crate) fn encode(segment: &str) -> String {
    url::form_urlencoded::byte_serialize(segment.as_bytes())
        .collect::<String>()
        // form encoding writes a space as '+', which a path would keep as a plus sign.
        .replace('+', "%20")
}

/// The server's error message (its `IcebergErrorResponse`), else the body's first 200 bytes.
fn message_of(body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorResponse>(body) {
        Ok(e) if e.error.kind.is_empty() => e.error.message,
        Ok(e) => format!("{} ({})", e.error.message, e.error.kind),
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
    }
}

/// A URL's path, for messages: no query, no credentials.
fn path_of(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => u.path().to_owned(),
        Err(_) => "(unparsable URL)".to_owned(),
    }
}

/// An error with its sources (reqwest's own message is only the outermost).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}
