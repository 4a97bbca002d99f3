//! `[sink]` with `kind = "lsm"`: the keys as written ([`RawLsm`], whose field docs are the user
//! docs), their checks, and the settings the LSM (Apache Paimon) sink runs with ([`LsmConfig`]).
//! `crate::config` reads the file and picks this struct by `kind`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::changelog::TableId;
use crate::config::context::{default_warehouse, Context};
use crate::config::error::ConfigError;
use crate::config::tables::{RawTableSettings, SinkKind, TablesConfig};
use crate::storage::s3::RawS3;

/// `[sink]` with `kind = "lsm"`: Apache Paimon primary-key tables.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLsm {
    /// `file:///path`, a bare path, or `s3://bucket/prefix` (default `./warehouse`).
    #[serde(default = "default_warehouse")]
    pub warehouse: String,
    /// Namespace (Paimon database) for every table; default: the source schema (Postgres) or
    /// database (MySQL).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Fixed buckets per table, 1 to 1024 (default 4).
    #[serde(default)]
    pub buckets: Option<u32>,
    /// "deduplicate" (default; cdcd completes partial rows) or "partial-update" (Paimon's engine
    /// fills absent columns on read, but then a column can never be set to NULL).
    #[serde(default)]
    pub merge_engine: MergeEngine,
    /// Sorted runs per bucket that trigger a compaction, 2 to 100 (default 5; commits wait at
    /// +3).
    #[serde(default)]
    pub compaction_trigger: Option<usize>,
    /// Snapshots kept by expiry (default 30).
    #[serde(default)]
    pub snapshots_retained: Option<usize>,
    /// Also keep snapshots younger than this many milliseconds.
    #[serde(default)]
    pub snapshot_time_retained_ms: Option<u64>,
    /// Paimon `deletion-vectors.enabled` tables (readers skip level 0; rows appear after the
    /// background compaction). Default false.
    #[serde(default)]
    pub deletion_vectors: bool,
    /// `[sink.s3]`: how to reach an `s3://` warehouse.
    #[serde(default)]
    pub s3: Option<RawS3>,
    /// `[sink.catalog]` is refused: read only to say why (Paimon's filesystem layout is kept).
    #[serde(default)]
    pub catalog: Option<serde::de::IgnoredAny>,
    /// `[sink.tables."<table or glob>"]`: `buckets` and `partition_by` (column names) per table.
    #[serde(default)]
    pub tables: BTreeMap<String, RawTableSettings>,
}

/// How an LSM (Paimon) table merges the versions of a key (`sink.merge_engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MergeEngine {
    /// The newest version wins; cdcd writes whole rows (completing partial ones itself).
    #[default]
    Deduplicate,
    /// Paimon's `partial-update`: NULL fields keep the previous value (so NULL cannot be set).
    PartialUpdate,
}

/// Validated LSM (Apache Paimon) sink settings.
#[derive(Debug, Clone)]
pub struct LsmConfig {
    /// The warehouse URL, normalized (`file:///abs/path` or `s3://bucket/prefix`).
    pub warehouse: String,
    pub namespace: Option<String>,
    pub buckets: u32,
    pub merge_engine: MergeEngine,
    pub compaction_trigger: usize,
    pub snapshots_retained: usize,
    pub snapshot_time_retained_ms: Option<u64>,
    /// Paimon `deletion-vectors.enabled`: readers read only compacted files.
    pub deletion_vectors: bool,
    /// `[sink.tables.*]`: each table's settings.
    pub tables: TablesConfig,
}

impl LsmConfig {
    /// Buckets of `table` when cdcd creates it: its section's `buckets`, else `sink.buckets`.
    /// (Two equally specific globs over the table are refused at start: `LsmSink::prepare`.)
    /// Whether `table` keeps a changelog (`changelog = true` in its `[sink.tables."…"]`).
    pub fn changelog_for(&self, table: &TableId) -> bool {
        self.tables.resolve(table).is_ok_and(|s| s.changelog)
    }

    pub fn buckets_for(&self, table: &TableId) -> u32 {
        self.tables
            .resolve(table)
            .ok()
            .and_then(|s| s.buckets)
            .unwrap_or(self.buckets)
    }
}

impl RawLsm {
    /// Checks every key and builds the settings (`[sink.s3]` is checked by `crate::config`).
    pub fn validate(self, ctx: &Context<'_>) -> Result<LsmConfig, ConfigError> {
        if self.catalog.is_some() {
            return Err(ctx.invalid(
                "sink.catalog",
                "the lsm sink keeps Paimon's filesystem layout (<warehouse>/<namespace>.db/<table>/) and takes no catalog; remove [sink.catalog] or use sink.kind = \"iceberg\"",
            ));
        }
        let (warehouse, namespace) = ctx.sink_location(&self.warehouse, self.namespace)?;
        let buckets = self.buckets.unwrap_or(4);
        if !(1..=1024).contains(&buckets) {
            return Err(ctx.invalid("sink.buckets", format!("{buckets}: use 1 to 1024")));
        }
        let compaction_trigger = self.compaction_trigger.unwrap_or(5);
        if !(2..=100).contains(&compaction_trigger) {
            return Err(ctx.invalid(
                "sink.compaction_trigger",
                format!("{compaction_trigger}: use 2 to 100"),
            ));
        }
        let snapshots_retained = ctx.at_least_one(
            "sink.snapshots_retained",
            self.snapshots_retained.unwrap_or(30),
        )?;
        if self.merge_engine == MergeEngine::PartialUpdate
            && self.tables.values().any(|t| t.changelog == Some(true))
        {
            // Whole before images come from the table's rows, which that engine leaves partial.
            return Err(ctx.invalid(
                "sink.merge_engine",
                "\"partial-update\" keeps partial rows, so a changelog (changelog = true in [sink.tables]) would have partial images; use \"deduplicate\"",
            ));
        }
        let tables = TablesConfig::validate(self.tables, SinkKind::Lsm, ctx)?;
        Ok(LsmConfig {
            warehouse,
            namespace,
            buckets,
            merge_engine: self.merge_engine,
            compaction_trigger,
            snapshots_retained,
            snapshot_time_retained_ms: self.snapshot_time_retained_ms,
            deletion_vectors: self.deletion_vectors,
            tables,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::MergeEngine;
    use crate::config::tests::MINIMAL;
    use crate::config::{Config, SinkConfig};

    #[test]
    fn a_changelog_needs_the_deduplicate_engine() {
        let text = MINIMAL.replace(
            "[sink]",
            "[sink]\nkind = \"lsm\"\nmerge_engine = \"partial-update\"",
        ) + "[sink.tables.\"public.t\"]\nchangelog = true\n";
        let err = Config::from_toml(&text, "p.toml").unwrap_err().to_string();
        assert!(
            err.contains("sink.merge_engine") && err.contains("changelog"),
            "{err}"
        );
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

    /// Issue 22: an `s3://` warehouse with `[sink.s3]` is accepted for the LSM sink as for Iceberg,
    /// and `[sink.s3]` is checked the same way.
    #[test]
    fn lsm_sink_takes_an_s3_warehouse() {
        let text = MINIMAL.replace("[sink]", "[sink]\nkind = \"lsm\"").replace(
            "warehouse = \"/tmp/wh\"",
            "warehouse = \"s3://bucket/wh/\"\n[sink.s3]\nendpoint = \"http://127.0.0.1:9000\"\n\
             access_key_id = \"k\"\nsecret_access_key = \"s\"",
        );
        let c = Config::from_toml(&text, "p.toml").unwrap();
        let SinkConfig::Lsm(lsm) = &c.sink else {
            panic!("lsm")
        };
        assert_eq!(lsm.warehouse, "s3://bucket/wh");
        assert_eq!(c.s3.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        let half = text.replace("access_key_id = \"k\"\n", "");
        let e = Config::from_toml(&half, "p.toml").unwrap_err().to_string();
        assert!(e.contains("sink.s3.secret_access_key"), "{e}");
    }
}
