//! Configuration: one TOML file, every key overridable by `CDCD_<SECTION>__<KEY>` (e.g.
//! `CDCD_SOURCE__PASSWORD`).
//!
//! Two layers, as in ripgrep's low/high args: [`RawConfig`] is what the file says (serde structs
//! with `deny_unknown_fields`; each field's doc is the user doc), and [`Config`] is the validated
//! form the rest of cdcd uses. Every error names the key and the file.
//!
//! `[source]` and `[sink]` are serde enums tagged by `kind` ([`RawSource`], [`RawSink`]). Each
//! connector owns its section in its own folder — the raw struct, its `validate()` and the
//! validated settings: `sources/postgres/config.rs`, `sources/mysql/config.rs`,
//! `sinks/iceberg/config.rs`, `sinks/lsm/config.rs` — so a key of another kind (`server_id` under
//! `kind = "postgres"`) is refused by the type. This file holds the loader, `[pipeline]`,
//! `[metrics]`, `[sink.s3]` and the dispatch on `kind`, and re-exports the connectors' types;
//! `config/context.rs` has what connectors share (the source URL, table patterns, the
//! warehouse), `config/messages.rs` the wording of load errors.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::Deserialize;

use crate::changelog::TableId;

mod context;
mod env;
mod messages;

pub use crate::sinks::iceberg::config::{DeleteMode, IcebergConfig, RawIceberg};
pub use crate::sinks::lsm::config::{LsmConfig, MergeEngine, RawLsm};
pub use crate::sources::mysql::config::{MySqlConfig, RawMySql, ZeroDate};
pub use crate::sources::postgres::config::{PostgresConfig, RawPostgres};
pub use context::{normalize_warehouse, redact_url, Context, SourceUrl};
use messages::describe;

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
    /// How many tables' commits of one round run at once (each table's own commits stay in
    /// order): a round costs about its slowest table, not the sum (docs/many-tables.md).
    #[serde(default = "default_commit_concurrency")]
    pub commit_concurrency: usize,
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
/// Above this, concurrent commits only queue on the object store's connections.
const MAX_COMMIT_CONCURRENCY: usize = 256;
fn default_commit_concurrency() -> usize {
    16
}

/// `[source]`: which database cdcd reads, and its kind's keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum RawSource {
    /// `kind = "postgres"`: logical replication (pgoutput).
    Postgres(RawPostgres),
    /// `kind = "mysql"`: the binlog of MySQL 8 or MariaDB 10.x+.
    Mysql(RawMySql),
}

/// `[sink]`: which table format cdcd writes, and its kind's keys. `kind` defaults to
/// [`DEFAULT_SINK_KIND`] (and a missing `[sink]` is an Iceberg sink with every default).
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum RawSink {
    /// `kind = "iceberg"`: Apache Iceberg tables.
    Iceberg(RawIceberg),
    /// `kind = "lsm"`: Apache Paimon primary-key tables.
    Lsm(RawLsm),
}

/// The sink kind when `[sink]` names none. serde's tagged enums have no default tag, so the
/// loader supplies it as the lowest-priority value of `sink.kind`.
pub const DEFAULT_SINK_KIND: &str = "iceberg";

/// `sink.warehouse` when unset (either sink).
pub(crate) fn default_warehouse() -> String {
    "./warehouse".into()
}

/// `[metrics]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    /// `host:port` serving `/metrics`, `/healthz` and `/readyz`; unset: no HTTP server.
    pub listen: Option<String>,
}

/// The file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub pipeline: RawPipeline,
    pub source: RawSource,
    pub sink: RawSink,
    #[serde(default)]
    pub metrics: RawMetrics,
}

/// `source.schema_change`: what a schema change of a captured table does (either source).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemaChange {
    /// The lake's table follows the changes it can express (README, "Schema changes"); the
    /// others stop cdcd.
    #[default]
    Evolve,
    /// Every change of a lake table's schema stops cdcd before the transaction that needs it,
    /// naming the table and the change: for pipelines whose lake schema is changed only by hand.
    Stop,
    /// As `Evolve`, and a change the lake table cannot express starts that table's online
    /// resync instead of a stop: the other tables stream on (`pipeline/schema_resync.rs`).
    Resync,
}

impl SchemaChange {
    fn parse(value: &str) -> Option<SchemaChange> {
        match value {
            "evolve" => Some(SchemaChange::Evolve),
            "stop" => Some(SchemaChange::Stop),
            "resync" => Some(SchemaChange::Resync),
            _ => None,
        }
    }
}

/// `source.schema_change` as written: one mode for every table (`"stop"`), or a map of tables to
/// modes where `"*"` names the rest (`{ "public.audit" = "stop", "*" = "resync" }`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum RawSchemaChange {
    All(String),
    PerTable(BTreeMap<String, String>),
}

impl Default for RawSchemaChange {
    fn default() -> Self {
        RawSchemaChange::All("evolve".to_owned())
    }
}

/// `source.schema_change`, validated: the mode of each table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SchemaChangePolicy {
    /// Tables not named below (`"*"`, or the single mode).
    pub rest: SchemaChange,
    pub tables: BTreeMap<TableId, SchemaChange>,
}

impl SchemaChangePolicy {
    /// One mode for every table.
    pub fn all(mode: SchemaChange) -> SchemaChangePolicy {
        SchemaChangePolicy {
            rest: mode,
            tables: BTreeMap::new(),
        }
    }

    /// What a schema change of `table` does.
    pub fn for_table(&self, table: &TableId) -> SchemaChange {
        self.tables.get(table).copied().unwrap_or(self.rest)
    }

    /// Whether any table is resynced on a change its lake table cannot express.
    pub fn resyncs_any(&self) -> bool {
        self.rest == SchemaChange::Resync
            || self.tables.values().any(|m| *m == SchemaChange::Resync)
    }

    fn validate(
        raw: RawSchemaChange,
        ctx: &Context<'_>,
        container: &str,
    ) -> Result<SchemaChangePolicy, ConfigError> {
        const KEY: &str = "source.schema_change";
        let mode = |value: &str, table: Option<&str>| {
            SchemaChange::parse(value).ok_or_else(|| {
                let at = table.map(|t| format!(" for {t:?}")).unwrap_or_default();
                ctx.invalid(
                    KEY,
                    format!("{value:?}{at} is not \"evolve\", \"stop\" or \"resync\""),
                )
            })
        };
        match raw {
            RawSchemaChange::All(value) => Ok(SchemaChangePolicy::all(mode(&value, None)?)),
            RawSchemaChange::PerTable(map) => {
                let mut policy = SchemaChangePolicy::default();
                for (table, value) in map {
                    let m = mode(&value, Some(&table))?;
                    if table == "*" {
                        policy.rest = m;
                        continue;
                    }
                    let id =
                        ctx.one_table(KEY, &table, container, " or \"*\" (every other table)")?;
                    policy.tables.insert(id, m);
                }
                Ok(policy)
            }
        }
    }
}

/// How existing rows are handled when a pipeline starts on a table for the first time
/// (`source.snapshot`, either source).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotMode {
    /// Copy the rows that exist, then stream from exactly the point the copy saw.
    #[default]
    Initial,
    /// Stream changes only.
    Never,
}

#[derive(Debug, Clone)]
pub enum SourceConfig {
    Postgres(PostgresConfig),
    MySql(MySqlConfig),
}

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
/// shared files' profile, then the instance/container credential chain (`storage/s3.rs`).
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
    /// See [`RawPipeline::commit_concurrency`].
    pub commit_concurrency: usize,
    pub source: SourceConfig,
    pub sink: SinkConfig,
    /// `source.schema_change`.
    pub schema_change: SchemaChangePolicy,
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
        extract(Toml::file(path), Some(env::SectionEnv::new()), &file)
    }

    /// Parses TOML text (tests, `check`), with no environment.
    pub fn from_toml(text: &str, file: &str) -> Result<Config, ConfigError> {
        extract(Toml::string(text), None, file)
    }
}

fn extract(
    toml: figment::providers::Data<Toml>,
    env: Option<env::SectionEnv>,
    file: &str,
) -> Result<Config, ConfigError> {
    let mut figment =
        Figment::from(Serialized::default("sink.kind", DEFAULT_SINK_KIND)).merge(toml);
    if let Some(env) = env {
        figment = figment.merge(env);
    }
    let raw: RawConfig = figment.extract().map_err(|e| ConfigError::Parse {
        file: file.to_owned(),
        detail: describe(&figment, e),
    })?;
    raw.validate(file)
}

impl RawConfig {
    /// Checks every value and builds the typed [`Config`].
    pub fn validate(self, file: &str) -> Result<Config, ConfigError> {
        let pipeline = self.pipeline.validate(file)?;
        let ctx = Context {
            file,
            pipeline: &pipeline.name,
            spill_dir: self.pipeline.spill_dir.as_deref(),
        };
        let schema_change = match &self.source {
            RawSource::Postgres(raw) => {
                SchemaChangePolicy::validate(raw.schema_change.clone(), &ctx, "schema")?
            }
            RawSource::Mysql(raw) => {
                SchemaChangePolicy::validate(raw.schema_change.clone(), &ctx, "db")?
            }
        };
        let source = match self.source {
            RawSource::Postgres(raw) => SourceConfig::Postgres(raw.validate(&ctx)?),
            RawSource::Mysql(raw) => SourceConfig::MySql(raw.validate(&ctx)?),
        };
        let snapshot = match &source {
            SourceConfig::Postgres(pg) => pg.snapshot,
            SourceConfig::MySql(my) => my.snapshot,
        };
        if schema_change.resyncs_any() && snapshot == SnapshotMode::Never {
            // A resync is a copy of the table.
            return Err(ctx.invalid(
                "source.schema_change",
                "\"resync\" copies the table again, which source.snapshot = \"never\" forbids: set source.snapshot = \"initial\", or use \"evolve\"",
            ));
        }
        let (sink, s3) = match self.sink {
            RawSink::Iceberg(raw) => {
                let s3 = raw.s3.clone();
                (SinkConfig::Iceberg(raw.validate(&ctx)?), s3)
            }
            RawSink::Lsm(raw) => {
                let s3 = raw.s3.clone();
                (SinkConfig::Lsm(raw.validate(&ctx)?), s3)
            }
        };
        let s3 = match s3 {
            Some(raw) => raw.validate(&ctx)?,
            None => S3Config::default(),
        };
        let sink = match sink {
            SinkConfig::Iceberg(mut ice) => {
                ice.catalog = ice.catalog.with_s3(&s3);
                SinkConfig::Iceberg(ice)
            }
            other => other,
        };
        Ok(Config {
            file: file.to_owned(),
            pipeline: pipeline.name,
            commit_interval_ms: self.pipeline.commit_interval_ms,
            commit_max_rows: self.pipeline.commit_max_rows,
            snapshot_commit_rows: self.pipeline.snapshot_commit_rows,
            commit_concurrency: self.pipeline.commit_concurrency,
            source,
            sink,
            schema_change,
            metrics_listen: self.metrics.listen,
            s3,
            lease_ttl_ms: self.pipeline.lease_ttl_ms,
            standby: self.pipeline.standby,
        })
    }
}

/// The checked `[pipeline]` values that are not copied as they are.
struct Pipeline {
    name: String,
}

impl RawPipeline {
    fn validate(&self, file: &str) -> Result<Pipeline, ConfigError> {
        let bad = |key: &'static str, detail: String| ConfigError::Invalid {
            file: file.to_owned(),
            key,
            detail,
        };
        let name = self.name.trim().to_owned();
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
        if self.commit_interval_ms == 0 {
            return Err(bad(
                "pipeline.commit_interval_ms",
                "must be at least 1".into(),
            ));
        }
        if self.lease_ttl_ms < 1000 {
            return Err(bad(
                "pipeline.lease_ttl_ms",
                "must be at least 1000 (a lease renewed more often than every 330 ms would \
                 spend more requests on the lease than on the data)"
                    .into(),
            ));
        }
        if self.commit_max_rows == 0 {
            return Err(bad("pipeline.commit_max_rows", "must be at least 1".into()));
        }
        if self.snapshot_commit_rows == 0 {
            return Err(bad(
                "pipeline.snapshot_commit_rows",
                "must be at least 1".into(),
            ));
        }
        if !(1..=MAX_COMMIT_CONCURRENCY).contains(&self.commit_concurrency) {
            return Err(bad(
                "pipeline.commit_concurrency",
                format!(
                    "{} must be between 1 and {MAX_COMMIT_CONCURRENCY} (each commit in flight \
                     holds its table's rows and open object-store requests)",
                    self.commit_concurrency
                ),
            ));
        }
        Ok(Pipeline { name })
    }
}

impl RawS3 {
    fn validate(self, ctx: &Context<'_>) -> Result<S3Config, ConfigError> {
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
pub(crate) mod tests {
    use super::messages::{kind_names, kinds, one_of};
    use super::*;

    /// A Postgres source and an Iceberg sink, every other key at its default.
    pub(crate) const MINIMAL: &str = r#"
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
    fn commit_concurrency_defaults_and_is_bounded() {
        let c = Config::from_toml(MINIMAL, "p.toml").unwrap();
        assert_eq!(c.commit_concurrency, 16);
        let with = |n: &str| {
            let set = MINIMAL.replace(
                "name = \"shop\"\n",
                &format!("name = \"shop\"\ncommit_concurrency = {n}\n"),
            );
            Config::from_toml(&set, "p.toml")
        };
        assert_eq!(with("4").unwrap().commit_concurrency, 4);
        for refused in ["0", "257"] {
            let err = with(refused).unwrap_err().to_string();
            assert!(err.contains("pipeline.commit_concurrency"), "{err}");
        }
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
    fn schema_change_defaults_to_evolve_and_takes_stop_and_resync() {
        let (a, b) = (TableId::new("public", "a"), TableId::new("public", "b"));
        let c = Config::from_toml(MINIMAL, "p.toml").unwrap();
        assert_eq!(c.schema_change.for_table(&a), SchemaChange::Evolve);
        let stop = MINIMAL.replace("[source]", "[source]\nschema_change = \"stop\"");
        let c = Config::from_toml(&stop, "p.toml").unwrap();
        assert_eq!(c.schema_change.for_table(&a), SchemaChange::Stop);
        let resync = MINIMAL.replace("[source]", "[source]\nschema_change = \"resync\"");
        let c = Config::from_toml(&resync, "p.toml").unwrap();
        assert_eq!(c.schema_change.for_table(&a), SchemaChange::Resync);
        assert!(c.schema_change.resyncs_any());
        // A resync is a copy: refused where copies are.
        let never = resync.replace("[source]", "[source]\nsnapshot = \"never\"");
        let err = Config::from_toml(&never, "p.toml").unwrap_err().to_string();
        assert!(
            err.contains("source.schema_change") && err.contains("snapshot"),
            "{err}"
        );
        let bad = MINIMAL.replace("[source]", "[source]\nschema_change = \"ignore\"");
        let err = Config::from_toml(&bad, "p.toml").unwrap_err().to_string();
        assert!(
            err.contains("source.schema_change") && err.contains("ignore"),
            "{err}"
        );
        // Per table, `"*"` for the rest (default: evolve).
        let per_table = MINIMAL.replace(
            "[source]",
            "[source]\nschema_change = { \"public.a\" = \"stop\" }",
        );
        let c = Config::from_toml(&per_table, "p.toml").unwrap();
        assert_eq!(c.schema_change.for_table(&a), SchemaChange::Stop);
        assert_eq!(c.schema_change.for_table(&b), SchemaChange::Evolve);
        let rest = MINIMAL.replace(
            "[source]",
            "[source]\nschema_change = { \"public.a\" = \"evolve\", \"*\" = \"stop\" }",
        );
        let c = Config::from_toml(&rest, "p.toml").unwrap();
        assert_eq!(c.schema_change.for_table(&a), SchemaChange::Evolve);
        assert_eq!(c.schema_change.for_table(&b), SchemaChange::Stop);
        for (bad, names) in [
            ("{ \"public.*\" = \"stop\" }", "public.*"),
            ("{ \"a\" = \"stop\" }", "schema.table"),
            ("{ \"public.a\" = \"halt\" }", "halt"),
        ] {
            let text = MINIMAL.replace("[source]", &format!("[source]\nschema_change = {bad}"));
            let err = Config::from_toml(&text, "p.toml").unwrap_err().to_string();
            assert!(
                err.contains("source.schema_change") && err.contains(names),
                "{bad}: {err}"
            );
        }
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
            // Digits: a text key stays text (figment alone parses it as a number).
            jail.set_env("CDCD_SOURCE__PASSWORD", "012345");
            jail.set_env("CDCD_PIPELINE__COMMIT_MAX_ROWS", "7");
            jail.set_env("CDCD_LOG", "debug");
            jail.set_env("CDCD_TB", "/tmp/x");
            let c = Config::load(&path).map_err(|e| e.to_string())?;
            let SourceConfig::Postgres(pg) = &c.source else {
                panic!("postgres source expected")
            };
            assert_eq!(pg.password.as_deref(), Some("012345"));
            assert_eq!(c.commit_max_rows, 7);
            Ok(())
        });
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

    /// The message a user sees for `text`.
    fn error(text: &str) -> String {
        match Config::from_toml(text, "p.toml") {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    const MYSQL: &str = r#"
[pipeline]
name = "shop"
[source]
kind = "mysql"
url = "mysql://cdc:s3cret@127.0.0.1:53316/shop"
tables = ["shop.*"]
server_id = 4242
"#;

    #[test]
    fn unknown_key_in_a_kind_is_named_with_the_keys_it_takes() {
        let e = error(&MINIMAL.replace("[source]", "[source]\nslott = \"x\""));
        assert!(
            e.starts_with("p.toml: key `source.slott`: unknown key;"),
            "{e}"
        );
        assert!(e.contains("`kind`, `url`") && e.contains("`slot`"), "{e}");
        let e = error(&format!("{MINIMAL}[sink.s3]\nendpointt = \"x\"\n"));
        assert!(
            e.starts_with("p.toml: key `sink.s3.endpointt`: unknown key;"),
            "{e}"
        );
        let e = error(&format!("{MINIMAL}[sinks]\nkind = \"lsm\"\n"));
        assert!(e.starts_with("p.toml: key `sinks`: unknown key;"), "{e}");
    }

    #[test]
    fn key_of_another_kind_is_refused_naming_the_kind_it_applies_to() {
        let e = error(&MINIMAL.replace("[source]", "[source]\nserver_id = 1"));
        assert_eq!(
            e,
            "p.toml: key `source.server_id`: applies to mysql sources only"
        );
        for key in ["slot = \"s\"", "heartbeat_interval_ms = 5"] {
            let e = error(&format!("{MYSQL}{key}\n"));
            assert!(e.ends_with("applies to postgres sources only"), "{e}");
            assert!(e.starts_with("p.toml: key `source."), "{e}");
        }
        // Under the default kind too: `buckets` is an LSM key.
        for sink in ["[sink]", "[sink]\nkind = \"iceberg\""] {
            let e = error(&MINIMAL.replace("[sink]", &format!("{sink}\nbuckets = 3")));
            assert_eq!(e, "p.toml: key `sink.buckets`: applies to lsm sinks only");
        }
        let e = error(&MINIMAL.replace(
            "[sink]",
            "[sink]\nkind = \"lsm\"\ndelete_mode = \"equality\"",
        ));
        assert_eq!(
            e,
            "p.toml: key `sink.delete_mode`: applies to iceberg sinks only"
        );
    }

    #[test]
    fn wrong_type_inside_a_kind_names_the_key() {
        let e = error(&MINIMAL.replace("[source]", "[source]\nsnapshot_chunk_rows = \"x\""));
        assert!(
            e.starts_with("p.toml: key `source.snapshot_chunk_rows`: invalid type"),
            "{e}"
        );
        let e = error(&MINIMAL.replace("[sink]", "[sink]\nkind = \"lsm\"\nbuckets = \"a\""));
        assert!(
            e.starts_with("p.toml: key `sink.buckets`: invalid type"),
            "{e}"
        );
        let e = error(&format!("{MINIMAL}[sink.s3]\nallow_http = \"yes\"\n"));
        assert!(
            e.starts_with("p.toml: key `sink.s3.allow_http`: invalid type"),
            "{e}"
        );
        let e = error(&format!("{MYSQL}zero_date = \"never\"\n"));
        assert_eq!(
            e,
            "p.toml: key `source.zero_date`: \"never\": use \"null\" or \"error\""
        );
    }

    #[test]
    fn missing_key_inside_a_kind_is_named() {
        let e = error(&MINIMAL.replace("tables = [\"public.*\"]", ""));
        assert_eq!(e, "p.toml: key `source.tables`: is required");
        let e = error(&MINIMAL.replace("kind = \"postgres\"", ""));
        assert_eq!(
            e,
            "p.toml: key `source.kind`: is required: use \"postgres\" or \"mysql\""
        );
    }

    #[test]
    fn unknown_kind_is_named() {
        let e = error(&MINIMAL.replace("kind = \"postgres\"", "kind = \"oracle\""));
        assert_eq!(
            e,
            "p.toml: key `source.kind`: \"oracle\" is not a source kind; use \"postgres\" or \"mysql\""
        );
        let e = error(&MINIMAL.replace("[sink]", "[sink]\nkind = \"paimon\""));
        assert_eq!(
            e,
            "p.toml: key `sink.kind`: \"paimon\" is not a sink kind; use \"iceberg\" or \"lsm\""
        );
        let e = error(&MINIMAL.replace("kind = \"postgres\"", "kind = 1"));
        assert!(
            e.starts_with("p.toml: key `source.kind`:") && e.contains("is not a source kind"),
            "{e}"
        );
    }

    #[test]
    fn every_kind_is_listed_for_messages() {
        // serde's own list of variants, from the derived enums, against `kinds()`.
        let e = error(&MINIMAL.replace("kind = \"postgres\"", "kind = \"?\""));
        assert!(e.ends_with(&one_of(&kind_names("source"))), "{e}");
        let e = error(&MINIMAL.replace("[sink]", "[sink]\nkind = \"?\""));
        assert!(e.ends_with(&one_of(&kind_names("sink"))), "{e}");
        for k in kinds() {
            assert!(!(k.keys)().is_empty(), "{} {}", k.section, k.name);
        }
    }

    #[test]
    fn secret_values_stay_out_of_type_errors() {
        let e = error(&MINIMAL.replace("[source]", "[source]\npassword = 918273"));
        assert!(e.starts_with("p.toml: key `source.password`:"), "{e}");
        assert!(!e.contains("918273"), "{e}");
        let e = error(&format!("{MINIMAL}[sink.s3]\nsecret_access_key = 918273\n"));
        assert!(!e.contains("918273"), "{e}");
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn no_sink_section_is_iceberg_and_env_picks_the_kind() {
        let text = MINIMAL.replace("[sink]\nwarehouse = \"/tmp/wh\"\n", "");
        let c = Config::from_toml(&text, "p.toml").unwrap();
        let SinkConfig::Iceberg(ice) = &c.sink else {
            panic!("iceberg is the default sink")
        };
        assert!(ice.warehouse.ends_with("/warehouse"), "{}", ice.warehouse);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(&path, MINIMAL).unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("CDCD_SINK__KIND", "lsm");
            jail.set_env("CDCD_SINK__BUCKETS", "8");
            let c = Config::load(&path).map_err(|e| e.to_string())?;
            let SinkConfig::Lsm(lsm) = &c.sink else {
                panic!("CDCD_SINK__KIND picks the lsm sink")
            };
            assert_eq!(lsm.buckets, 8);
            jail.set_env("CDCD_SINK__KIND", "iceberg");
            let e = Config::load(&path).unwrap_err().to_string();
            assert!(
                e.ends_with("key `sink.buckets`: applies to lsm sinks only"),
                "{e}"
            );
            Ok(())
        });
    }

    #[test]
    fn shipped_example_config_is_valid() {
        let text = include_str!("../config/pipeline.example.toml");
        let c = Config::from_toml(text, "pipeline.example.toml").unwrap();
        assert!(matches!(c.source, SourceConfig::Postgres(_)));
        assert!(matches!(c.sink, SinkConfig::Iceberg(_)));
    }
}
