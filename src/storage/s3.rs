//! The S3 client behind an `s3://bucket/prefix` warehouse: object_store's `AmazonS3` with cdcd's
//! retry and timeout policy.
//!
//! Settings, first match wins: `[sink.s3]` (endpoint, region, access_key_id, secret_access_key,
//! allow_http), then the standard `AWS_*` environment (`AWS_ENDPOINT_URL`, `AWS_REGION`,
//! `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_ALLOW_HTTP`, `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`, …), then object_store's
//! credential chain (web identity, ECS container credentials, EC2 instance metadata).
//! object_store 0.13 does not read `~/.aws/config` profiles: export the profile's keys (e.g.
//! `eval "$(aws configure export-credentials --format env)"`) or use a role.
//!
//! Why these policies:
//! - Conditional put is `S3ConditionalPut::ETagMatch`: `PutMode::Create` sends `If-None-Match: *`
//!   (create-if-absent, the commit point) and `PutMode::Update` sends `If-Match: <etag>` (lease
//!   renewal). AWS S3 supports both since 2024; MinIO and moto do too.
//! - Retries (object_store `RetryConfig`): exponential backoff from 100 ms to 15 s, up to 10
//!   retries within 3 minutes, for throttling (503 SlowDown, 429), other 5xx, connection errors and
//!   timeouts. A retried create whose first attempt did land answers 412; the commit path checks
//!   whether the existing object is its own (`sinks/iceberg/commit.rs`).
//! - Timeouts: 5 s to connect, 120 s per request (a 10 MiB multipart part over a slow link).
//! - Path-style requests when an endpoint is set (MinIO, moto, Ceph use them); virtual-hosted
//!   style on AWS itself.
//! - `http://` endpoints are allowed only when `allow_http` (or `AWS_ALLOW_HTTP`) says so; an
//!   `http://` endpoint with `allow_http` unset allows it, since the user named the scheme.

use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
use object_store::{BackoffConfig, ClientOptions, RetryConfig};
use url::Url;

use super::StorageError;
use crate::config::S3Config;

/// The retry policy for every S3 request.
pub fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
            base: 2.0,
        },
        max_retries: 10,
        retry_timeout: Duration::from_secs(180),
    }
}

/// Builds the client for `url` (`s3://bucket/prefix`).
pub fn build(url: &Url, config: &S3Config) -> Result<AmazonS3, StorageError> {
    let failed = |detail: String| StorageError::S3 {
        url: url.to_string(),
        detail,
    };
    let bucket = url
        .host_str()
        .filter(|b| !b.is_empty())
        .ok_or_else(|| failed("the URL names no bucket: use s3://bucket/prefix".into()))?;
    let client = ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(120));
    // Client options first: `with_client_options` replaces them, and the environment may set
    // client keys (AWS_ALLOW_HTTP) that must survive.
    let mut builder = AmazonS3Builder::new()
        .with_client_options(client)
        .with_retry(retry_config())
        .with_conditional_put(S3ConditionalPut::ETagMatch);
    let mut env_endpoint = None;
    for (key, value) in std::env::vars() {
        if !key.starts_with("AWS_") {
            continue;
        }
        // Unknown AWS_* variables (AWS_PROFILE, AWS_PAGER, …) belong to other tools.
        if let Ok(k) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
            if k == AmazonS3ConfigKey::Endpoint {
                env_endpoint = Some(value.clone());
            }
            builder = builder.with_config(k, value);
        }
    }
    builder = builder.with_bucket_name(bucket);
    let endpoint = config.endpoint.clone().or(env_endpoint);
    if let Some(endpoint) = &endpoint {
        builder = builder
            .with_endpoint(endpoint)
            .with_virtual_hosted_style_request(false);
        if config.allow_http.is_none() && endpoint.starts_with("http://") {
            builder = builder.with_allow_http(true);
        }
    }
    if let Some(allow) = config.allow_http {
        builder = builder.with_allow_http(allow);
    }
    if let Some(region) = &config.region {
        builder = builder.with_region(region);
    }
    if let (Some(id), Some(secret)) = (&config.access_key_id, &config.secret_access_key) {
        builder = builder
            .with_access_key_id(id)
            .with_secret_access_key(secret);
    }
    // The builder's errors name keys and the URL, never credential values.
    builder.build().map_err(|e| failed(e.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn needs_a_bucket() {
        let url = Url::parse("s3:///prefix").unwrap();
        let err = build(&url, &S3Config::default()).unwrap_err();
        assert!(err.to_string().contains("no bucket"), "{err}");
    }

    #[test]
    fn errors_do_not_show_the_secret() {
        let url = Url::parse("s3://b/p").unwrap();
        let config = S3Config {
            endpoint: Some("ftp://x".into()),
            secret_access_key: Some("topsecret".into()),
            access_key_id: Some("id".into()),
            ..S3Config::default()
        };
        if let Err(e) = build(&url, &config) {
            assert!(!e.to_string().contains("topsecret"), "{e}");
        }
    }
}
