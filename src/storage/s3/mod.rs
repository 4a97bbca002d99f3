//! The S3 client behind an `s3://bucket/prefix` warehouse: object_store's `AmazonS3` with cdcd's
//! retry and timeout policy, addressing style, CA bundle and shared-file profile.
//!
//! Settings, first match wins:
//! - endpoint: `sink.s3.endpoint`, `AWS_ENDPOINT_URL`, the profile's `endpoint_url`, else AWS;
//! - region: `sink.s3.region`, `AWS_REGION` / `AWS_DEFAULT_REGION`, the profile's `region`;
//! - credentials: `sink.s3.access_key_id` + `secret_access_key`; the profile named by
//!   `sink.s3.profile`; `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`);
//!   the profile named by `AWS_PROFILE`, or `default` (its static keys, else its
//!   `credential_process`: [`credential_process`]); then object_store's chain (web identity
//!   `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`, ECS container credentials, EC2 instance
//!   metadata). An explicit `profile` key beats the environment's keys, as `--profile` does in
//!   the AWS CLI; `AWS_PROFILE` does not, as in the SDKs. Profiles: [`profile`].
//! - CA bundle: `sink.s3.ca_file`, `AWS_CA_BUNDLE` (the AWS CLI's variable), the profile's
//!   `ca_bundle`. Its certificates are added to the system's roots (object_store's client only
//!   adds roots), so one bundle can name a private CA without losing AWS itself.
//! - addressing: `sink.s3.addressing`, `AWS_VIRTUAL_HOSTED_STYLE_REQUEST`, else path-style when
//!   an endpoint is set (MinIO, moto, Ceph use it) and virtual-hosted on AWS itself, except for a
//!   bucket name with dots (AWS's wildcard certificate cannot cover `a.b.s3.amazonaws.com`, so
//!   the SDKs use path-style for those too). Virtual-hosted with an endpoint puts the bucket in
//!   front of the endpoint's host (`https://bucket.minio.example.com`), as the SDKs do.
//!
//! Why these policies:
//! - Conditional put is `S3ConditionalPut::ETagMatch`: `PutMode::Create` sends `If-None-Match: *`
//!   (create-if-absent, the commit point) and `PutMode::Update` sends `If-Match: <etag>` (lease
//!   renewal). AWS S3 supports both since 2024; MinIO and moto do too.
//! - Retries (object_store `RetryConfig`): exponential backoff from 100 ms to 15 s, up to 10
//!   retries within 3 minutes, for throttling (503 SlowDown, 429), other 5xx, connection errors and
//!   timeouts. A retried create whose first attempt did land answers 412; the commit path checks
//!   whether the existing object is its own (`sinks/iceberg/commit/publish.rs`).
//! - Timeouts: 5 s to connect, 120 s per request (a 10 MiB multipart part over a slow link).
//! - `http://` endpoints are allowed only when `allow_http` (or `AWS_ALLOW_HTTP`) says so; an
//!   `http://` endpoint with `allow_http` unset allows it, since the user named the scheme.
//! - A certificate that does not verify comes back naming the endpoint and `ca_file`
//!   ([`cert_hint`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
use object_store::{BackoffConfig, Certificate, ClientOptions, RetryConfig};
use url::Url;

use super::layer::Layered;
use super::StorageError;

mod cert_hint;
pub mod config;
mod credential_process;
pub mod profile;

pub use cert_hint::CertHint;
pub use config::{Addressing, RawS3, S3Config};
use credential_process::ProcessCredentials;
use profile::{Chosen, Profile};

/// The S3 store [`build`] makes.
pub type S3Store = Layered<CertHint<AmazonS3>>;

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

/// Builds the client for `url` (`s3://bucket/prefix`) from `config` and the process environment.
pub fn build(url: &Url, config: &S3Config) -> Result<S3Store, StorageError> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let (builder, endpoint) = builder(url, config, &env)?;
    // The builder's errors name keys and the URL, never credential values.
    let store = builder.build().map_err(|e| StorageError::S3 {
        url: url.to_string(),
        detail: e.to_string(),
    })?;
    Ok(CertHint::new(store, endpoint))
}

/// The AWS credentials an `s3://` warehouse with `config` would use (the same order: `[sink.s3]`
/// keys, `AWS_*`, the profile, web identity, the container or instance role), and the region,
/// for signing other AWS requests (an Iceberg REST catalog with SigV4).
pub fn credentials(
    config: &S3Config,
) -> Result<(object_store::aws::AwsCredentialProvider, Option<String>), StorageError> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    // Any bucket: the provider does not depend on it.
    let url = Url::parse("s3://cdcd-signing").map_err(|e| StorageError::S3 {
        url: "s3://cdcd-signing".into(),
        detail: e.to_string(),
    })?;
    let (builder, _) = builder(&url, config, &env)?;
    let region = builder.get_config_value(&AmazonS3ConfigKey::Region);
    let store = builder.build().map_err(|e| StorageError::S3 {
        url: "(catalog signing)".into(),
        detail: e.to_string(),
    })?;
    Ok((std::sync::Arc::clone(store.credentials()), region))
}

/// The configured builder and the endpoint to name in messages, from `config` and `env` (the
/// process environment as pairs; tests pass their own).
fn builder(
    url: &Url,
    config: &S3Config,
    env: &[(String, String)],
) -> Result<(AmazonS3Builder, String), StorageError> {
    let failed = |detail: String| StorageError::S3 {
        url: url.to_string(),
        detail,
    };
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    let bucket = url
        .host_str()
        .filter(|b| !b.is_empty())
        .ok_or_else(|| failed("the URL names no bucket: use s3://bucket/prefix".into()))?;

    let (profile, profile_keys) = profile_and_keys(config, &var).map_err(failed)?;
    let config_keys = config.access_key_id.is_some() && config.secret_access_key.is_some();
    let skip_env_keys = config_keys || profile_keys;

    let mut client = ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(120));
    for cert in ca_bundle(config, &var, profile.as_ref()).map_err(failed)? {
        client = client.with_root_certificate(cert);
    }
    // Client options first: `with_client_options` replaces them, and the environment may set
    // client keys (AWS_ALLOW_HTTP, AWS_PROXY_URL) that must survive.
    let builder = AmazonS3Builder::new()
        .with_client_options(client)
        .with_retry(retry_config())
        .with_conditional_put(S3ConditionalPut::ETagMatch);
    let (builder, from_env) = with_environment(builder, env, skip_env_keys);
    let builder = builder.with_bucket_name(bucket);
    let (builder, endpoint) =
        with_endpoint(builder, config, bucket, from_env, profile.as_ref()).map_err(failed)?;
    let builder = with_region(builder, config, profile.as_ref());
    let builder = with_keys(builder, config, profile.as_ref().filter(|_| profile_keys));
    let shown = endpoint.unwrap_or_else(|| "AWS S3".to_owned());
    Ok((builder, shown))
}

/// The profile of the AWS shared files (`sink.s3.profile`, `AWS_PROFILE`, else `default`), and
/// whether its credentials are the ones used (see the module doc for the order).
fn profile_and_keys(
    config: &S3Config,
    var: &impl Fn(&str) -> Option<String>,
) -> Result<(Option<Profile>, bool), String> {
    let chosen = match (&config.profile, var("AWS_PROFILE")) {
        (Some(p), _) => Chosen::Key(p.clone()),
        (None, Some(p)) => Chosen::Env(p),
        (None, None) => Chosen::Default,
    };
    let (config_file, credentials_file) = profile::file_paths(var);
    let profile = profile::load(&chosen, config_file.as_deref(), credentials_file.as_deref())?;
    // Which credentials: see the module doc for the order.
    let config_keys = config.access_key_id.is_some() && config.secret_access_key.is_some();
    let env_keys = var("AWS_ACCESS_KEY_ID").is_some();
    let profile_wanted = !config_keys && (matches!(chosen, Chosen::Key(_)) || !env_keys);
    let profile_keys = match &profile {
        Some(p) if profile_wanted => {
            if let Some(why) = p.unusable(&chosen) {
                return Err(why);
            }
            p.access_key_id.is_some() || p.credential_process.is_some()
        }
        _ => false,
    };
    Ok((profile, profile_keys))
}

/// What the `AWS_*` environment says about the endpoint and addressing, which `sink.s3` keys
/// override (the builder takes the rest of the environment as it is).
#[derive(Default)]
struct FromEnv {
    endpoint: Option<String>,
    virtual_hosted: Option<bool>,
}

/// `builder` with every `AWS_*` variable object_store knows, except the keys when `skip_keys`
/// (keys from `[sink.s3]` or a profile win).
fn with_environment(
    mut builder: AmazonS3Builder,
    env: &[(String, String)],
    skip_keys: bool,
) -> (AmazonS3Builder, FromEnv) {
    let mut from_env = FromEnv::default();
    for (key, value) in env {
        // An empty variable counts as unset (as `var` in `builder`), not as an empty region or key.
        if !key.starts_with("AWS_") || value.is_empty() {
            continue;
        }
        // Unknown AWS_* variables (AWS_PROFILE, AWS_PAGER, …) belong to other tools.
        let Ok(k) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() else {
            continue;
        };
        match k {
            AmazonS3ConfigKey::Endpoint => from_env.endpoint = Some(value.clone()),
            AmazonS3ConfigKey::VirtualHostedStyleRequest => {
                from_env.virtual_hosted = Some(value.eq_ignore_ascii_case("true"));
                continue;
            }
            AmazonS3ConfigKey::AccessKeyId
            | AmazonS3ConfigKey::SecretAccessKey
            | AmazonS3ConfigKey::Token
                if skip_keys =>
            {
                continue;
            }
            _ => {}
        }
        builder = builder.with_config(k, value);
    }
    (builder, from_env)
}

/// `builder` with the endpoint (`sink.s3.endpoint`, `AWS_ENDPOINT_URL`, the profile's), the
/// addressing style and `allow_http`; the endpoint is returned for messages.
fn with_endpoint(
    mut builder: AmazonS3Builder,
    config: &S3Config,
    bucket: &str,
    from_env: FromEnv,
    profile: Option<&Profile>,
) -> Result<(AmazonS3Builder, Option<String>), String> {
    let endpoint = config
        .endpoint
        .clone()
        .or(from_env.endpoint)
        .or_else(|| profile.and_then(|p| p.endpoint_url.clone()));
    let virtual_hosted = match config.addressing {
        Some(a) => a == Addressing::VirtualHosted,
        None => from_env
            .virtual_hosted
            .unwrap_or(endpoint.is_none() && !bucket.contains('.')),
    };
    builder = builder.with_virtual_hosted_style_request(virtual_hosted);
    if let Some(endpoint) = &endpoint {
        builder = if virtual_hosted {
            builder.with_endpoint(bucket_endpoint(endpoint, bucket)?)
        } else {
            builder.with_endpoint(endpoint)
        };
        if config.allow_http.is_none() && endpoint.starts_with("http://") {
            builder = builder.with_allow_http(true);
        }
    }
    if let Some(allow) = config.allow_http {
        builder = builder.with_allow_http(allow);
    }
    Ok((builder, endpoint))
}

/// `builder` with `sink.s3.region`, else the environment's (already in it), else the profile's.
fn with_region(
    mut builder: AmazonS3Builder,
    config: &S3Config,
    profile: Option<&Profile>,
) -> AmazonS3Builder {
    if let Some(region) = &config.region {
        builder = builder.with_region(region);
    } else if builder
        .get_config_value(&AmazonS3ConfigKey::Region)
        .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::DefaultRegion))
        .is_none()
    {
        if let Some(region) = profile.and_then(|p| p.region.clone()) {
            builder = builder.with_region(region);
        }
    }
    builder
}

/// `builder` with the `[sink.s3]` keys, else those of `profile` (given only when its keys are
/// the ones used): static keys and session token, or its `credential_process`.
fn with_keys(
    mut builder: AmazonS3Builder,
    config: &S3Config,
    profile: Option<&Profile>,
) -> AmazonS3Builder {
    if let (Some(id), Some(secret)) = (&config.access_key_id, &config.secret_access_key) {
        builder = builder
            .with_access_key_id(id)
            .with_secret_access_key(secret);
    } else if let Some(p) = profile {
        if let (Some(id), Some(secret)) = (&p.access_key_id, &p.secret_access_key) {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
        }
        if let Some(token) = &p.session_token {
            builder = builder.with_token(token);
        }
        if let (None, Some(command)) = (&p.access_key_id, &p.credential_process) {
            let process = ProcessCredentials::new(command.clone(), p.name.clone());
            builder = builder.with_credentials(std::sync::Arc::new(process));
        }
    }
    builder
}

/// The certificates to add to the roots: `sink.s3.ca_file`, else `AWS_CA_BUNDLE`, else the
/// profile's `ca_bundle`; none of them: none.
fn ca_bundle(
    config: &S3Config,
    var: &impl Fn(&str) -> Option<String>,
    profile: Option<&Profile>,
) -> Result<Vec<Certificate>, String> {
    let (path, origin): (PathBuf, String) = if let Some(p) = &config.ca_file {
        (p.clone(), "sink.s3.ca_file".into())
    } else if let Some(p) = var("AWS_CA_BUNDLE") {
        (p.into(), "AWS_CA_BUNDLE".into())
    } else if let Some((p, name)) = profile.and_then(|p| Some((p.ca_bundle.clone()?, &p.name))) {
        (p.into(), format!("ca_bundle of profile {name:?}"))
    } else {
        return Ok(Vec::new());
    };
    read_ca_bundle(&path).map_err(|e| format!("{origin}: {e}"))
}

/// The PEM certificates in `path`; an unreadable file or one without any is an error.
fn read_ca_bundle(path: &Path) -> Result<Vec<Certificate>, String> {
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let certs = Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("{shown} is not a PEM bundle: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{shown} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok(certs)
}

/// `endpoint` with `bucket.` in front of its host, for virtual-hosted requests.
fn bucket_endpoint(endpoint: &str, bucket: &str) -> Result<String, String> {
    let mut url = Url::parse(endpoint).map_err(|e| format!("endpoint {endpoint:?}: {e}"))?;
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_owned(),
        _ => {
            return Err(format!(
                "virtual-hosted addressing puts the bucket in the host name, and endpoint \
                 {endpoint:?} has none: use a host name or addressing = \"path\""
            ))
        }
    };
    url.set_host(Some(&format!("{bucket}.{host}")))
        .map_err(|e| format!("bucket {bucket:?} with endpoint {endpoint:?}: {e}"))?;
    // object_store appends `/<key>`: no trailing slash.
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The builder for `s3://b/p`, with no home directory unless `pairs` set one.
    fn built(config: &S3Config, pairs: &[(&str, &str)]) -> Result<AmazonS3Builder, StorageError> {
        let url = Url::parse("s3://b/p").unwrap();
        builder(&url, config, &env(pairs)).map(|(b, _)| b)
    }

    fn value(b: &AmazonS3Builder, key: AmazonS3ConfigKey) -> Option<String> {
        b.get_config_value(&key)
    }

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

    #[test]
    fn addressing_defaults_to_path_with_an_endpoint_and_virtual_hosted_on_aws() {
        use AmazonS3ConfigKey::{Endpoint, VirtualHostedStyleRequest as Vh};
        let minio = S3Config {
            endpoint: Some("https://minio.example.com:9000".into()),
            ..S3Config::default()
        };
        let b = built(&minio, &[]).unwrap();
        assert_eq!(value(&b, Vh).as_deref(), Some("false"));
        assert_eq!(
            value(&b, Endpoint).as_deref(),
            Some("https://minio.example.com:9000")
        );
        let b = built(&S3Config::default(), &[]).unwrap();
        assert_eq!(value(&b, Vh).as_deref(), Some("true"));
        // A dotted bucket cannot be under AWS's wildcard certificate.
        let url = Url::parse("s3://my.bucket/p").unwrap();
        let (b, _) = builder(&url, &S3Config::default(), &[]).unwrap();
        assert_eq!(value(&b, Vh).as_deref(), Some("false"));
        // The environment's choice, then the key's.
        let b = built(&minio, &[("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "true")]).unwrap();
        assert_eq!(value(&b, Vh).as_deref(), Some("true"));
        let path = S3Config {
            addressing: Some(Addressing::Path),
            ..S3Config::default()
        };
        let b = built(&path, &[("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "true")]).unwrap();
        assert_eq!(value(&b, Vh).as_deref(), Some("false"));
    }

    #[test]
    fn virtual_hosted_with_an_endpoint_puts_the_bucket_in_the_host() {
        let config = S3Config {
            endpoint: Some("https://minio.example.com:9000/".into()),
            addressing: Some(Addressing::VirtualHosted),
            ..S3Config::default()
        };
        let b = built(&config, &[]).unwrap();
        assert_eq!(
            value(&b, AmazonS3ConfigKey::Endpoint).as_deref(),
            Some("https://b.minio.example.com:9000")
        );
        let ip = S3Config {
            endpoint: Some("http://127.0.0.1:9000".into()),
            ..config
        };
        let e = built(&ip, &[]).unwrap_err().to_string();
        assert!(e.contains("addressing = \"path\""), "{e}");
    }

    /// A home directory with `credentials` holding `text`.
    fn home_with(text: &str) -> tempfile::TempDir {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".aws")).unwrap();
        std::fs::write(home.path().join(".aws/credentials"), text).unwrap();
        home
    }

    const PROFILES: &str =
        "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\
        [x]\naws_access_key_id = XID\naws_secret_access_key = xsecret\naws_session_token = xtok\n\
        region = eu-north-1\nendpoint_url = https://x.example.com\n";

    #[test]
    fn credentials_come_in_the_documented_order() {
        use AmazonS3ConfigKey::{AccessKeyId, Region, Token};
        let home = home_with(PROFILES);
        let h = home.path().to_str().unwrap();
        let none = S3Config::default();
        // No keys anywhere else: the default profile.
        let b = built(&none, &[("HOME", h)]).unwrap();
        assert_eq!(value(&b, AccessKeyId).as_deref(), Some("DEF"));
        // AWS_PROFILE names another.
        let b = built(&none, &[("HOME", h), ("AWS_PROFILE", "x")]).unwrap();
        assert_eq!(value(&b, AccessKeyId).as_deref(), Some("XID"));
        assert_eq!(value(&b, Token).as_deref(), Some("xtok"));
        assert_eq!(value(&b, Region).as_deref(), Some("eu-north-1"));
        assert_eq!(
            value(&b, AmazonS3ConfigKey::Endpoint).as_deref(),
            Some("https://x.example.com")
        );
        // The environment's keys beat AWS_PROFILE, as in the SDKs…
        let keys = [
            ("HOME", h),
            ("AWS_PROFILE", "x"),
            ("AWS_ACCESS_KEY_ID", "ENV"),
            ("AWS_SECRET_ACCESS_KEY", "envsecret"),
            ("AWS_SESSION_TOKEN", "envtok"),
            ("AWS_REGION", "us-west-2"),
        ];
        let b = built(&none, &keys).unwrap();
        assert_eq!(value(&b, AccessKeyId).as_deref(), Some("ENV"));
        assert_eq!(value(&b, Region).as_deref(), Some("us-west-2"));
        // …but not the profile key, and the environment's token is not mixed in.
        let key = S3Config {
            profile: Some("x".into()),
            ..S3Config::default()
        };
        let b = built(&key, &keys).unwrap();
        assert_eq!(value(&b, AccessKeyId).as_deref(), Some("XID"));
        assert_eq!(value(&b, Token).as_deref(), Some("xtok"));
        // [sink.s3] keys beat everything.
        let own = S3Config {
            access_key_id: Some("OWN".into()),
            secret_access_key: Some("ownsecret".into()),
            profile: Some("x".into()),
            ..S3Config::default()
        };
        let b = built(&own, &keys).unwrap();
        assert_eq!(value(&b, AccessKeyId).as_deref(), Some("OWN"));
        assert_eq!(value(&b, Token), None);
    }

    #[test]
    fn a_named_profile_must_exist_and_be_usable() {
        let home = home_with(PROFILES);
        let h = home.path().to_str().unwrap();
        let e = built(
            &S3Config::default(),
            &[("HOME", h), ("AWS_PROFILE", "nope")],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"nope\"") && e.contains("AWS_PROFILE"), "{e}");
        assert!(!e.contains("secret"), "{e}");
        let creds = home.path().join("sso");
        std::fs::write(&creds, "[s]\nsso_session = corp\n").unwrap();
        let files = [
            ("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap()),
            ("AWS_PROFILE", "s"),
        ];
        let e = built(&S3Config::default(), &files).unwrap_err().to_string();
        assert!(e.contains("sso_session"), "{e}");
        // With the environment's keys the profile's credentials are not wanted: no error.
        let mut with_keys = files.to_vec();
        with_keys.extend([("AWS_ACCESS_KEY_ID", "a"), ("AWS_SECRET_ACCESS_KEY", "b")]);
        assert!(built(&S3Config::default(), &with_keys).is_ok());
    }

    #[test]
    fn a_ca_bundle_must_hold_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = built(
            &S3Config::default(),
            &[("AWS_CA_BUNDLE", empty.to_str().unwrap())],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("AWS_CA_BUNDLE") && e.contains("empty.pem") && e.contains("no PEM"),
            "{e}"
        );
        let missing = S3Config {
            ca_file: Some(dir.path().join("missing.pem")),
            ..S3Config::default()
        };
        let e = built(&missing, &[]).unwrap_err().to_string();
        assert!(
            e.contains("sink.s3.ca_file") && e.contains("missing.pem"),
            "{e}"
        );
    }
}
