//! Configuration: one TOML file, every key overridable by `CDCD_<SECTION>__<KEY>` (e.g.
//! `CDCD_SOURCE__PASSWORD`).
//!
//! Two layers, as in ripgrep's low/high args: [`RawConfig`] is what the file says (serde structs
//! with `deny_unknown_fields`; each field's doc is the user doc), and [`Config`] is the validated
//! form the rest of cdcd uses. Every error names the key and the file.

use std::fmt;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::Deserialize;

pub use crate::sinks::iceberg::config::{DeleteMode, IcebergConfig};
pub use crate::sinks::lsm::config::{LsmConfig, MergeEngine};
pub use crate::sources::mysql::config::{MySqlConfig, ZeroDate};
pub use crate::sources::postgres::config::PostgresConfig;

/// A configuration problem, naming the key and where it came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {detail}")]
    Parse { file: String, detail: String },
    #[error("{file}: key `{key}`: {detail}")]
    Invalid {
        file: String,
        key: &'static str,
        detail: String,
    },
}

/// `[pipeline]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPipeline {
    /// Names the checkpoints and the default slot and publication (`cdcd_<name>`). Required.
    pub name: String,
    /// Commit what is buffered at least this often (milliseconds).
    #[serde(default = "default_commit_interval_ms")]
    pub commit_interval_ms: u64,
    /// Commit as soon as this many changes are buffered.
    #[serde(default = "default_commit_max_rows")]
    pub commit_max_rows: usize,
    /// Initial copy: commit a table's copied rows every this many rows (fewer, larger commits
    /// copy faster; a crash re-copies at most the chunks not yet committed).
    #[serde(default = "default_snapshot_commit_rows")]
    pub snapshot_commit_rows: usize,
    /// Directory for spill files of large streamed transactions (default: the system temp dir).
    #[serde(default)]
    pub spill_dir: Option<PathBuf>,
    /// Lease under `<warehouse>/_cdcd/<name>/lease.json` (milliseconds): a standby takes over when
    /// the active daemon has not renewed it for this long.
    #[serde(default = "default_lease_ttl_ms")]
    pub lease_ttl_ms: u64,
    /// When another cdcd holds the lease: `true` waits as a standby, `false` exits with a message.
    #[serde(default = "default_standby")]
    pub standby: bool,
}

fn default_lease_ttl_ms() -> u64 {
    30_000
}
fn default_standby() -> bool {
    true
}

fn default_commit_interval_ms() -> u64 {
    1000
}
fn default_snapshot_commit_rows() -> usize {
    250_000
}

fn default_commit_max_rows() -> usize {
    100_000
}

/// `[source]`
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSource {
    /// "postgres" or "mysql" (MySQL 8 and MariaDB 10.x+).
    pub kind: String,
    /// `postgres://user@host:port/db` or `mysql://user@host:port/db` (`?ssl-mode=required` or
    /// `verify_identity` for TLS).
    pub url: String,
    /// Optional; may be in the URL instead.
    #[serde(default)]
    pub password: Option<String>,
    /// `schema.table` patterns; `*` matches any run of characters.
    pub tables: Vec<String>,
    /// Postgres replication slot (default `cdcd_<pipeline>`); created if missing.
    #[serde(default)]
    pub slot: Option<String>,
    /// Postgres publication (default `cdcd_<pipeline>`); created if missing.
    #[serde(default)]
    pub publication: Option<String>,
    /// MySQL replica id.
    #[serde(default)]
    pub server_id: Option<u32>,
    /// "initial" (copy existing rows first) or "never".
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Memory bound (bytes) for one streamed transaction before it spills to disk.
    #[serde(default)]
    pub stream_memory_bytes: Option<usize>,
    /// Postgres: write a heartbeat (`pg_logical_emit_message`) and read the slot's lag this often
    /// (milliseconds; 0 turns heartbeats off, the slot is still watched every 10 s). Lets an idle
    /// or filtered slot advance and keeps `cdcd_source_lag_seconds` near 0 when idle.
    #[serde(default)]
    pub heartbeat_interval_ms: Option<u64>,
    /// Postgres initial copy: connections copying chunks in parallel (default 4).
    #[serde(default)]
    pub snapshot_parallelism: Option<usize>,
    /// Initial copy: target rows per chunk, the unit of resuming after a crash (default 250000;
    /// Postgres: also of parallelism).
    #[serde(default)]
    pub snapshot_chunk_rows: Option<u64>,
    /// MySQL: how zero dates (`0000-00-00`, and dates with a zero month or day) are written:
    /// "null" (default) or "error" (stop the pipeline, naming the table and column).
    #[serde(default)]
    pub zero_date: Option<String>,
    /// MySQL, with `snapshot = "never"`: where a pipeline whose tables have no checkpoint yet
    /// starts streaming (a MariaDB GTID list `0-1-42`, a MySQL GTID set `uuid:1-42`, or
    /// `binlog.000003:4711`), instead of the server's current position. A committed checkpoint
    /// always wins. Used to replay a known binlog range (bench/mysql_e2e.py).
    #[serde(default)]
    pub start_position: Option<String>,
}

impl fmt::Debug for RawSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawSource")
            .field("kind", &self.kind)
            .field("url", &redact_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tables", &self.tables)
            .finish_non_exhaustive()
    }
}

/// `[sink.s3]`
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawS3 {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub allow_http: Option<bool>,
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
            .finish()
    }
}

/// Validated `[sink.s3]`; every unset key falls back to the standard `AWS_*` environment
/// (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, …) and then the instance/container
/// credential chain.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Config {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub allow_http: Option<bool>,
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
            .finish()
    }
}

/// `[sink]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSink {
    /// "iceberg" (LSM comes later).
    #[serde(default = "default_sink_kind")]
    pub kind: String,
    /// `file:///path`, a bare path, or `s3://bucket/prefix`.
    #[serde(default = "default_warehouse")]
    pub warehouse: String,
    /// Namespace for every table; default: the source schema.
    #[serde(default)]
    pub namespace: Option<String>,
    /// "deletion-vectors" (format v3, the default) or "equality" (format v2).
    #[serde(default)]
    pub delete_mode: Option<String>,
    /// LSM: fixed buckets per table (default 4).
    #[serde(default)]
    pub buckets: Option<u32>,
    /// LSM: "deduplicate" (default; cdcd completes partial rows) or "partial-update" (Paimon's
    /// engine fills absent columns on read, but then a column can never be set to NULL).
    #[serde(default)]
    pub merge_engine: Option<String>,
    /// LSM: sorted runs per bucket that trigger a compaction (default 5; commits wait at +3).
    #[serde(default)]
    pub compaction_trigger: Option<usize>,
    /// LSM: snapshots kept by expiry (default 30).
    #[serde(default)]
    pub snapshots_retained: Option<usize>,
    /// LSM: also keep snapshots younger than this many milliseconds.
    #[serde(default)]
    pub snapshot_time_retained_ms: Option<u64>,
    /// LSM: Paimon `deletion-vectors.enabled` tables (readers skip level 0; rows appear after
    /// the background compaction).
    #[serde(default)]
    pub deletion_vectors: Option<bool>,
    #[serde(default)]
    pub s3: Option<RawS3>,
}

fn default_sink_kind() -> String {
    "iceberg".into()
}
fn default_warehouse() -> String {
    "./warehouse".into()
}

/// `[metrics]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    pub listen: Option<String>,
}

/// The file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub pipeline: RawPipeline,
    pub source: RawSource,
    #[serde(default = "default_sink")]
    pub sink: RawSink,
    #[serde(default)]
    pub metrics: RawMetrics,
}

fn default_sink() -> RawSink {
    RawSink {
        kind: default_sink_kind(),
        warehouse: default_warehouse(),
        namespace: None,
        delete_mode: None,
        buckets: None,
        merge_engine: None,
        compaction_trigger: None,
        snapshots_retained: None,
        snapshot_time_retained_ms: None,
        deletion_vectors: None,
        s3: None,
    }
}

/// How existing rows are handled when a pipeline starts on a table for the first time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotMode {
    /// Copy the rows that exist, then stream from exactly the point the copy saw.
    Initial,
    /// Stream changes only.
    Never,
}

#[derive(Debug, Clone)]
pub enum SourceConfig {
    Postgres(PostgresConfig),
    MySql(MySqlConfig),
}

#[derive(Debug, Clone)]
pub enum SinkConfig {
    Iceberg(IcebergConfig),
    Lsm(LsmConfig),
}

impl SinkConfig {
    /// The warehouse URL of either sink.
    pub fn warehouse(&self) -> &str {
        match self {
            SinkConfig::Iceberg(c) => &c.warehouse,
            SinkConfig::Lsm(c) => &c.warehouse,
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub file: String,
    pub pipeline: String,
    pub commit_interval_ms: u64,
    pub commit_max_rows: usize,
    /// See [`RawPipeline::snapshot_commit_rows`].
    pub snapshot_commit_rows: usize,
    pub source: SourceConfig,
    pub sink: SinkConfig,
    pub metrics_listen: Option<String>,
    /// `[sink.s3]`: how to reach an `s3://` warehouse (unset keys come from `AWS_*`).
    pub s3: S3Config,
    /// See [`RawPipeline::lease_ttl_ms`].
    pub lease_ttl_ms: u64,
    /// See [`RawPipeline::standby`].
    pub standby: bool,
}

impl Config {
    /// Reads `path` and the `CDCD_*` environment, then validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        if !path.exists() {
            return Err(ConfigError::Parse {
                file,
                detail: "file not found".into(),
            });
        }
        let raw: RawConfig = Figment::new()
            .merge(Toml::file(path))
            .merge(section_env())
            .extract()
            .map_err(|e| ConfigError::Parse {
                file: file.clone(),
                detail: describe_figment_error(e),
            })?;
        raw.validate(&file)
    }

    /// Parses TOML text (tests, `check`), with no environment.
    pub fn from_toml(text: &str, file: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = Figment::new()
            .merge(Toml::string(text))
            .extract()
            .map_err(|e| ConfigError::Parse {
                file: file.to_owned(),
                detail: describe_figment_error(e),
            })?;
        raw.validate(file)
    }
}

/// `CDCD_<SECTION>__<KEY>` variables only: other `CDCD_*` variables (`CDCD_LOG`, a test bed's
/// settings) are not configuration keys.
fn section_env() -> Env {
    Env::prefixed("CDCD_")
        .filter(|key| {
            let key = key.as_str().to_ascii_lowercase();
            ["pipeline__", "source__", "sink__", "metrics__"]
                .iter()
                .any(|section| key.starts_with(section))
        })
        .split("__")
}

fn describe_figment_error(e: figment::Error) -> String {
    e.into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let kind = e.kind.to_string();
            if key.is_empty() {
                kind
            } else {
                format!("key `{key}`: {kind}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl RawConfig {
    /// Checks every value and builds the typed [`Config`].
    pub fn validate(self, file: &str) -> Result<Config, ConfigError> {
        let bad = |key: &'static str, detail: String| ConfigError::Invalid {
            file: file.to_owned(),
            key,
            detail,
        };
        let name = self.pipeline.name.trim().to_owned();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(bad(
                "pipeline.name",
                format!("{name:?} must be non-empty and use only letters, digits, '_' or '-'"),
            ));
        }
        if self.pipeline.commit_interval_ms == 0 {
            return Err(bad(
                "pipeline.commit_interval_ms",
                "must be at least 1".into(),
            ));
        }
        if self.pipeline.lease_ttl_ms < 1000 {
            return Err(bad(
                "pipeline.lease_ttl_ms",
                "must be at least 1000 (a lease renewed more often than every 330 ms would \
                 spend more requests on the lease than on the data)"
                    .into(),
            ));
        }
        if self.pipeline.commit_max_rows == 0 {
            return Err(bad("pipeline.commit_max_rows", "must be at least 1".into()));
        }
        if self.pipeline.snapshot_commit_rows == 0 {
            return Err(bad(
                "pipeline.snapshot_commit_rows",
                "must be at least 1".into(),
            ));
        }
        let source = match self.source.kind.as_str() {
            "postgres" => SourceConfig::Postgres(self.postgres(&name, file)?),
            "mysql" => SourceConfig::MySql(self.mysql(file)?),
            other => {
                return Err(bad(
                    "source.kind",
                    format!("{other:?} is not a source kind; use \"postgres\" or \"mysql\""),
                ))
            }
        };
        let sink = match self.sink.kind.as_str() {
            "iceberg" => SinkConfig::Iceberg(self.iceberg(file)?),
            "lsm" => SinkConfig::Lsm(self.lsm(file)?),
            other => {
                return Err(bad(
                    "sink.kind",
                    format!("{other:?} is not a sink kind; use \"iceberg\" or \"lsm\""),
                ))
            }
        };
        Ok(Config {
            file: file.to_owned(),
            pipeline: name,
            commit_interval_ms: self.pipeline.commit_interval_ms,
            commit_max_rows: self.pipeline.commit_max_rows,
            snapshot_commit_rows: self.pipeline.snapshot_commit_rows,
            source,
            sink,
            metrics_listen: self.metrics.listen.clone(),
            s3: self.s3(file)?,
            lease_ttl_ms: self.pipeline.lease_ttl_ms,
            standby: self.pipeline.standby,
        })
    }

    fn s3(&self, file: &str) -> Result<S3Config, ConfigError> {
        let Some(raw) = &self.sink.s3 else {
            return Ok(S3Config::default());
        };
        if let Some(endpoint) = &raw.endpoint {
            let ok = url::Url::parse(endpoint)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
            if !ok {
                return Err(ConfigError::Invalid {
                    file: file.to_owned(),
                    key: "sink.s3.endpoint",
                    detail: format!("{endpoint:?} must be an http:// or https:// URL"),
                });
            }
        }
        if raw.access_key_id.is_some() != raw.secret_access_key.is_some() {
            return Err(ConfigError::Invalid {
                file: file.to_owned(),
                key: "sink.s3.secret_access_key",
                detail: "set both access_key_id and secret_access_key, or neither".into(),
            });
        }
        Ok(S3Config {
            endpoint: raw.endpoint.clone(),
            region: raw.region.clone(),
            access_key_id: raw.access_key_id.clone(),
            secret_access_key: raw.secret_access_key.clone(),
            allow_http: raw.allow_http,
        })
    }

    /// share; `source.password` wins over a password in the URL.
    pub(crate) fn source_url(
        &self,
        file: &str,
        schemes: [&str; 2],
        default_port: u16,
        default_user: &str,
    ) -> Result<SourceUrl, ConfigError> {
        let bad = |detail: String| ConfigError::Invalid {
            file: file.to_owned(),
            key: "source.url",
            detail,
        };
        let expected = format!("expected {}://user@host:port/db", schemes[0]);
        let s = &self.source;
        let url = url::Url::parse(&s.url).map_err(|e| {
            bad(format!(
                "{:?} is not a URL ({e}); {expected}",
                redact_url(&s.url)
            ))
        })?;
        if !schemes.contains(&url.scheme()) {
            return Err(bad(format!("scheme {:?}: {expected}", url.scheme())));
        }
        let database = url.path().trim_start_matches('/').to_owned();
        if database.is_empty() {
            return Err(bad(format!("names no database: {expected}")));
        }
        Ok(SourceUrl {
            host: url.host_str().unwrap_or("localhost").to_owned(),
            port: url.port().unwrap_or(default_port),
            user: match url.username() {
                "" => default_user.to_owned(),
                u => percent_decode(u),
            },
            password: s
                .password
                .clone()
                .or_else(|| url.password().map(percent_decode)),
            database,
            url,
        })
    }
}

pub(crate) fn valid_ident(s: &str) -> bool {
    !s.is_empty() && !s.contains(['/', '.', '\\'])
}

/// What [`RawConfig::source_url`] takes from `source.url`.
pub(crate) struct SourceUrl {
    pub url: url::Url,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub database: String,
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| s.to_owned())
}

/// A warehouse URL in canonical form: `file:///absolute/path` (a bare path is made absolute) or
/// `s3://bucket/prefix`.
pub fn normalize_warehouse(w: &str) -> Result<String, String> {
    let w = w.trim().trim_end_matches('/');
    if w.is_empty() {
        return Err("is empty".into());
    }
    if let Some(rest) = w.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(format!(
                "{w:?}: a file URL needs an absolute path (file:///…)"
            ));
        }
        return Ok(format!("file://{rest}"));
    }
    if w.starts_with("s3://") {
        return Ok(w.to_owned());
    }
    if w.contains("://") {
        return Err(format!(
            "{w:?}: use file:///path, a local path, or s3://bucket/prefix"
        ));
    }
    let path = Path::new(w);
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| format!("cannot resolve {w:?}: {e}"))?
            .join(path)
    };
    let text = abs.display().to_string();
    let text = text.trim_end_matches('/').replace("/./", "/");
    Ok(format!("file://{text}"))
}

/// The URL with any password replaced by `***`, for messages.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => "<unparsable url>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[pipeline]
name = "shop"
[source]
kind = "postgres"
url = "postgres://cdc:s3cret@127.0.0.1:55432/cdc"
tables = ["public.*"]
[sink]
warehouse = "/tmp/wh"
"#;

    #[test]
    fn mysql_source_validates() {
        let text = r#"
[pipeline]
name = "shop"
[source]
kind = "mysql"
url = "mysql://cdc:pw@127.0.0.1:53316/shop?ssl-mode=required"
tables = ["shop.*"]
server_id = 4242
zero_date = "error"
"#;
        let c = Config::from_toml(text, "p.toml").unwrap();
        let SourceConfig::MySql(my) = &c.source else {
            panic!("mysql source expected")
        };
        assert_eq!((my.port, my.server_id, my.tls), (53316, 4242, Some(false)));
        assert_eq!(my.password.as_deref(), Some("pw"));
        assert_eq!(my.zero_date, ZeroDate::Error);
        let missing = text.replace("server_id = 4242\n", "");
        let err = Config::from_toml(&missing, "p.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("source.server_id"), "{err}");
    }

    #[test]
    fn snapshot_commit_rows_defaults_and_must_be_positive() {
        let c = Config::from_toml(MINIMAL, "p.toml").unwrap();
        assert_eq!(c.snapshot_commit_rows, 250_000);
        let set = MINIMAL.replace(
            "name = \"shop\"\n",
            "name = \"shop\"\nsnapshot_commit_rows = 5000\n",
        );
        assert_eq!(
            Config::from_toml(&set, "p.toml")
                .unwrap()
                .snapshot_commit_rows,
            5000
        );
        let zero = MINIMAL.replace(
            "name = \"shop\"\n",
            "name = \"shop\"\nsnapshot_commit_rows = 0\n",
        );
        let err = Config::from_toml(&zero, "p.toml").unwrap_err().to_string();
        assert!(err.contains("pipeline.snapshot_commit_rows"), "{err}");
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::from_toml(MINIMAL, "p.toml").unwrap();
        assert_eq!(c.pipeline, "shop");
        assert_eq!(c.commit_interval_ms, 1000);
        assert_eq!(c.commit_max_rows, 100_000);
        let SourceConfig::Postgres(pg) = &c.source else {
            panic!("postgres source expected")
        };
        assert_eq!(pg.slot, "cdcd_shop");
        assert_eq!(pg.publication, "cdcd_shop");
        assert_eq!(pg.port, 55432);
        assert_eq!(pg.user, "cdc");
        assert_eq!(pg.password.as_deref(), Some("s3cret"));
        let SinkConfig::Iceberg(ice) = &c.sink else {
            panic!("iceberg is the default sink")
        };
        assert_eq!(ice.warehouse, "file:///tmp/wh");
    }

    #[test]
    fn heartbeat_interval_defaults_and_turns_off() {
        let c = Config::from_toml(MINIMAL, "p.toml").unwrap();
        let SourceConfig::Postgres(pg) = &c.source else {
            panic!("postgres")
        };
        assert_eq!(
            pg.heartbeat_interval,
            Some(std::time::Duration::from_secs(10))
        );
        let off = MINIMAL.replace("[source]", "[source]\nheartbeat_interval_ms = 0");
        let c = Config::from_toml(&off, "p.toml").unwrap();
        let SourceConfig::Postgres(pg) = &c.source else {
            panic!("postgres")
        };
        assert_eq!(pg.heartbeat_interval, None);
    }

    #[test]
    fn unknown_key_is_named() {
        let text = MINIMAL.replace("[sink]", "[sink]\nwarehous = \"x\"");
        let e = Config::from_toml(&text, "p.toml").unwrap_err().to_string();
        assert!(e.contains("p.toml") && e.contains("warehous"), "{e}");
    }

    #[test]
    fn missing_required_key_is_named() {
        let text = MINIMAL.replace("name = \"shop\"", "");
        let e = Config::from_toml(&text, "p.toml").unwrap_err().to_string();
        assert!(e.contains("name"), "{e}");
    }

    #[test]
    fn delete_mode_defaults_to_deletion_vectors() {
        let c = Config::from_toml(MINIMAL, "p.toml").unwrap();
        let SinkConfig::Iceberg(ice) = &c.sink else {
            panic!("iceberg")
        };
        assert_eq!(ice.delete_mode, DeleteMode::DeletionVectors);
        let text = MINIMAL.replace("[sink]", "[sink]\ndelete_mode = \"equality\"");
        let c = Config::from_toml(&text, "p.toml").unwrap();
        let SinkConfig::Iceberg(ice) = &c.sink else {
            panic!("iceberg")
        };
        assert_eq!(ice.delete_mode, DeleteMode::Equality);
    }

    #[test]
    fn bad_value_is_named() {
        let text = MINIMAL.replace("[sink]", "[sink]\ndelete_mode = \"sometimes\"");
        let e = Config::from_toml(&text, "p.toml").unwrap_err().to_string();
        assert!(
            e.contains("sink.delete_mode") && e.contains("sometimes"),
            "{e}"
        );
        let text = MINIMAL.replace(
            "name = \"shop\"",
            "name = \"shop\"\ncommit_interval_ms = \"soon\"",
        );
        let e = Config::from_toml(&text, "p.toml").unwrap_err().to_string();
        assert!(e.contains("commit_interval_ms"), "{e}");
    }

    #[test]
    fn password_never_in_debug_or_errors() {
        let c = Config::from_toml(MINIMAL, "p.toml").unwrap();
        assert!(!format!("{c:?}").contains("s3cret"));
        let text = MINIMAL.replace("tables = [\"public.*\"]", "tables = [\"orders\"]");
        let e = Config::from_toml(&text, "p.toml").unwrap_err().to_string();
        assert!(!e.contains("s3cret"));
        assert_eq!(
            redact_url("postgres://cdc:s3cret@h/db"),
            "postgres://cdc:***@h/db"
        );
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn env_overrides_keys_and_ignores_other_cdcd_variables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(&path, MINIMAL).unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("CDCD_SOURCE__PASSWORD", "from-env");
            jail.set_env("CDCD_PIPELINE__COMMIT_MAX_ROWS", "7");
            jail.set_env("CDCD_LOG", "debug");
            jail.set_env("CDCD_TB", "/tmp/x");
            let c = Config::load(&path).map_err(|e| e.to_string())?;
            let SourceConfig::Postgres(pg) = &c.source else {
                panic!("postgres source expected")
            };
            assert_eq!(pg.password.as_deref(), Some("from-env"));
            assert_eq!(c.commit_max_rows, 7);
            Ok(())
        });
    }

    #[test]
    fn lsm_sink_keys() {
        let text = MINIMAL.replace("[sink]", "[sink]\nkind = \"lsm\"\nbuckets = 2");
        let c = Config::from_toml(&text, "p.toml").unwrap();
        let SinkConfig::Lsm(lsm) = &c.sink else {
            panic!("lsm")
        };
        assert_eq!(lsm.buckets, 2);
        assert_eq!(lsm.merge_engine, MergeEngine::Deduplicate);
        let text = MINIMAL.replace(
            "[sink]",
            "[sink]\nkind = \"lsm\"\nmerge_engine = \"first-row\"",
        );
        let e = Config::from_toml(&text, "p.toml").unwrap_err().to_string();
        assert!(e.contains("sink.merge_engine"), "{e}");
    }

    #[test]
    fn warehouse_forms() {
        assert_eq!(normalize_warehouse("/a/b/").unwrap(), "file:///a/b");
        assert_eq!(normalize_warehouse("file:///a").unwrap(), "file:///a");
        assert!(normalize_warehouse("file://rel").is_err());
        assert!(normalize_warehouse("gs://x").is_err());
        assert!(normalize_warehouse("rel").unwrap().starts_with("file:///"));
    }

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
}
