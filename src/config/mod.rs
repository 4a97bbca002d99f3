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
//! `kind = "postgres"`) is refused by the type; `[sink.s3]` belongs to the storage layer
//! (`storage/s3/config.rs`). This file holds the loader, `[pipeline]`, `[metrics]` and the
//! dispatch on `kind`, and re-exports the connectors' types.
//!
//! What connectors share sits in leaf modules that import nothing else of `config/`, so a
//! connector's section never imports this file back: `config/error.rs` ([`ConfigError`]),
//! `config/context.rs` (what `validate()` is handed, the source URL, table patterns, the
//! warehouse), `config/snapshot_mode.rs` and `config/schema_change.rs` (the two keys both sources
//! take). `config/messages.rs` words the load errors, `config/env.rs` reads `CDCD_*`.

use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::Deserialize;

use crate::memory_budget::{parse_size, MemoryBudget, MIN_MEMORY_BUDGET};

pub mod context;
mod env;
pub mod error;
mod messages;
pub mod schema_change;
pub mod snapshot_mode;
pub mod tables;

pub use crate::sinks::iceberg::config::{DeleteMode, IcebergConfig, RawIceberg};
pub use crate::sinks::lsm::config::{LsmConfig, MergeEngine, RawLsm};
pub use crate::sources::mysql::config::{MySqlConfig, RawMySql, ZeroDate};
pub use crate::sources::postgres::config::{PostgresConfig, RawPostgres};
pub use crate::storage::s3::{Addressing, RawS3, S3Config};
pub use context::{normalize_warehouse, redact_url, Context, SourceUrl};
pub use error::ConfigError;
use messages::describe;
pub use schema_change::{RawSchemaChange, SchemaChange, SchemaChangePolicy};
pub use snapshot_mode::SnapshotMode;
pub use tables::{
    Configured, Deletes, JsonAs, Origin, PartitionField, RawTableSettings, SinkKind, SortField,
    SpatialAs, TableSettings, TablesConfig,
};

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
    /// The process's memory budget, shared by every table (`"512MiB"`, or bytes): buffered rows,
    /// the primary-key indexes' memtables and block cache, streamed transactions
    /// (`memory_budget.rs` has the shares).
    #[serde(default)]
    pub memory_budget: Option<RawSize>,
}

/// A byte size: a whole number of bytes, or a string with a unit (`"512MiB"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawSize {
    Bytes(u64),
    Text(String),
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
    /// See [`RawPipeline::memory_budget`].
    pub memory_budget: MemoryBudget,
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
            RawSource::Postgres(raw) => {
                let stream_memory_set = raw.stream_memory_bytes.is_some();
                let mut pg = raw.validate(&ctx)?;
                if !stream_memory_set {
                    pg.stream_memory_bytes = pipeline.memory_budget.streamed_transaction();
                }
                SourceConfig::Postgres(pg)
            }
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
            memory_budget: pipeline.memory_budget,
        })
    }
}

/// The checked `[pipeline]` values that are not copied as they are.
struct Pipeline {
    name: String,
    memory_budget: MemoryBudget,
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
        let memory_budget = match &self.memory_budget {
            None => MemoryBudget::default(),
            Some(RawSize::Bytes(n)) => MemoryBudget::new(usize::try_from(*n).unwrap_or(usize::MAX)),
            Some(RawSize::Text(t)) => {
                MemoryBudget::new(parse_size(t).map_err(|e| bad("pipeline.memory_budget", e))?)
            }
        };
        if memory_budget.total < MIN_MEMORY_BUDGET {
            return Err(bad(
                "pipeline.memory_budget",
                format!(
                    "{} bytes is below the least budget, {} MiB",
                    memory_budget.total,
                    MIN_MEMORY_BUDGET >> 20
                ),
            ));
        }
        Ok(Pipeline {
            name,
            memory_budget,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::messages::{kind_names, kinds, one_of};
    use super::*;
    use crate::changelog::TableId;

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

    /// The Iceberg sink `text` configures (the `p.toml` of a test).
    pub(crate) fn iceberg_sink(text: &str) -> IcebergConfig {
        match Config::from_toml(text, "p.toml").unwrap().sink {
            SinkConfig::Iceberg(ice) => ice,
            SinkConfig::Lsm(_) => panic!("an iceberg sink"),
        }
    }

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
    fn memory_budget_defaults_takes_units_and_sets_the_stream_spill() {
        let c = Config::from_toml(MINIMAL, "p.toml").unwrap();
        assert_eq!(c.memory_budget.total, 512 << 20);
        let with = |v: &str| {
            let set = MINIMAL.replace(
                "name = \"shop\"\n",
                &format!("name = \"shop\"\nmemory_budget = {v}\n"),
            );
            Config::from_toml(&set, "p.toml")
        };
        let c = with("\"64MiB\"").unwrap();
        assert_eq!(c.memory_budget.total, 64 << 20);
        let SourceConfig::Postgres(pg) = &c.source else {
            panic!("postgres")
        };
        assert_eq!(pg.stream_memory_bytes, 8 << 20, "an eighth, unless set");
        assert_eq!(with("33554432").unwrap().memory_budget.total, 32 << 20);
        for refused in ["\"1MiB\"", "\"lots\"", "1024"] {
            let err = with(refused).unwrap_err().to_string();
            assert!(err.contains("pipeline.memory_budget"), "{refused}: {err}");
        }
        let set = MINIMAL.replace(
            "name = \"shop\"\n",
            "name = \"shop\"\nmemory_budget = \"64MiB\"\n",
        ) + "";
        let set = set.replace(
            "tables = [\"public.*\"]\n",
            "tables = [\"public.*\"]\nstream_memory_bytes = 1000\n",
        );
        let SourceConfig::Postgres(pg) = Config::from_toml(&set, "p.toml").unwrap().source else {
            panic!("postgres")
        };
        assert_eq!(pg.stream_memory_bytes, 1000, "a key set wins");
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

    /// The message a user sees for `text`.
    pub(crate) fn error(text: &str) -> String {
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
        let text = include_str!("../../config/pipeline.example.toml");
        let c = Config::from_toml(text, "pipeline.example.toml").unwrap();
        assert!(matches!(c.source, SourceConfig::Postgres(_)));
        assert!(matches!(c.sink, SinkConfig::Iceberg(_)));
    }
}
