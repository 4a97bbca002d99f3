//! `[sink]` with `kind = "iceberg"`: the keys as written ([`RawIceberg`], whose field docs are the
//! user docs), their checks, and the settings the Iceberg sink runs with ([`IcebergConfig`]).
//! `crate::config` reads the file and picks this struct by `kind`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::context::{default_warehouse, Context};
use crate::config::error::ConfigError;
use crate::config::tables::{JsonAs, RawTableSettings, SinkKind, SpatialAs, TablesConfig};
pub use crate::sinks::iceberg::catalog::config::{CatalogConfig, RawCatalog, SqlUri};
use crate::storage::s3::RawS3;

/// `[sink]` with `kind = "iceberg"` (the default kind).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIceberg {
    /// `file:///path`, a bare path, or `s3://bucket/prefix` (default `./warehouse`).
    #[serde(default = "default_warehouse")]
    pub warehouse: String,
    /// Namespace for every table; default: the source schema (Postgres) or database (MySQL).
    #[serde(default)]
    pub namespace: Option<String>,
    /// "deletion-vectors" (format v3, the default) or "equality" (format v2).
    #[serde(default)]
    pub delete_mode: DeleteMode,
    /// `[sink.s3]`: how to reach an `s3://` warehouse.
    #[serde(default)]
    pub s3: Option<RawS3>,
    /// `[sink.table_properties]`: Iceberg table properties (name → string value) set on the
    /// tables cdcd creates, over cdcd's defaults (`write.metadata.delete-after-commit.enabled =
    /// true`, `history.expire.max-snapshot-age-ms = 60000`, `cdcd.expiry.delete-delay-ms = 240000`). Maintenance reads each table's
    /// current properties, so a later `ALTER TABLE … SET TBLPROPERTIES` applies too.
    #[serde(default)]
    pub table_properties: BTreeMap<String, String>,
    /// How often the daemon runs a maintenance cycle on each table (milliseconds; 0: never).
    #[serde(default = "default_maintenance_interval_ms")]
    pub maintenance_interval_ms: u64,
    /// `[sink.catalog]`: where tables are found and committed (default: the filesystem).
    #[serde(default)]
    pub catalog: Option<RawCatalog>,
    /// `[sink.tables."<table or glob>"]`: partition spec, sort order and properties per table.
    #[serde(default)]
    pub tables: BTreeMap<String, RawTableSettings>,
}

fn default_maintenance_interval_ms() -> u64 {
    60_000
}

/// How Iceberg deletes are written (`sink.delete_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeleteMode {
    /// Format v2: equality deletes for rows of earlier snapshots, position deletes within a commit.
    Equality,
    /// Format v3: deletion vectors. The default (`docs/performance.md`, "Deletion vectors against
    /// equality deletes"): engines that refuse or slow down on equality deletes read deletion
    /// vectors well; the primary-key index locates rows.
    #[default]
    DeletionVectors,
}

/// Validated Iceberg sink settings.
#[derive(Debug, Clone)]
pub struct IcebergConfig {
    /// The warehouse URL, normalized (`file:///abs/path` or `s3://bucket/prefix`).
    pub warehouse: String,
    pub namespace: Option<String>,
    pub delete_mode: DeleteMode,
    pub table_properties: BTreeMap<String, String>,
    pub maintenance_interval_ms: u64,
    pub catalog: CatalogConfig,
    /// `[sink.tables.*]` over `[sink.table_properties]`: each table's settings.
    pub tables: TablesConfig,
}

impl RawIceberg {
    /// Checks every key and builds the settings (`[sink.s3]` is checked by `crate::config`).
    pub fn validate(self, ctx: &Context<'_>) -> Result<IcebergConfig, ConfigError> {
        let (warehouse, namespace) = ctx.sink_location(&self.warehouse, self.namespace)?;
        crate::sinks::iceberg::maintenance::properties::check(&self.table_properties)
            .map_err(|e| ctx.invalid("sink.table_properties", e.to_string()))?;
        for (key, section) in &self.tables {
            crate::sinks::iceberg::maintenance::properties::check(&section.properties).map_err(
                |e| {
                    crate::config::Origin {
                        file: ctx.file.to_owned(),
                        key: format!("sink.tables.{key:?}.properties"),
                    }
                    .invalid(e)
                },
            )?;
        }
        if self.delete_mode == DeleteMode::Equality {
            // Iceberg v3 types, per table; delete_mode = "equality" writes format v2 tables.
            type IsSet = fn(&RawTableSettings) -> bool;
            let v3_only: [(&str, &str, &str, IsSet); 2] = [
                ("json", "variant", "string", |s| {
                    s.json == Some(JsonAs::Variant)
                }),
                ("spatial", "geometry", "plain", |s| {
                    s.spatial == Some(SpatialAs::Geometry)
                }),
            ];
            for (name, v3, plain, set) in v3_only {
                if let Some(key) = self.tables.iter().find(|(_, s)| set(s)).map(|(k, _)| k) {
                    return Err(crate::config::Origin {
                        file: ctx.file.to_owned(),
                        key: format!("sink.tables.{key:?}.{name}"),
                    }
                    .invalid(format!(
                        "\"{v3}\" is an Iceberg v3 type and delete_mode = \"equality\" writes \
                         format v2 tables: use delete_mode = \"deletion-vectors\" (v3), or \
                         {name} = \"{plain}\""
                    )));
                }
            }
        }
        let tables = TablesConfig::validate(self.tables, SinkKind::Iceberg, ctx)?;
        Ok(IcebergConfig {
            warehouse,
            namespace,
            delete_mode: self.delete_mode,
            table_properties: self.table_properties,
            maintenance_interval_ms: self.maintenance_interval_ms,
            catalog: match self.catalog {
                Some(raw) => raw.validate(ctx)?,
                None => CatalogConfig::Filesystem,
            },
            tables,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::DeleteMode;
    use crate::config::tests::{iceberg_sink, MINIMAL};

    #[test]
    fn delete_mode_defaults_to_deletion_vectors() {
        let ice = iceberg_sink(MINIMAL);
        assert_eq!(ice.delete_mode, DeleteMode::DeletionVectors);
        let text = MINIMAL.replace("[sink]", "[sink]\ndelete_mode = \"equality\"");
        let ice = iceberg_sink(&text);
        assert_eq!(ice.delete_mode, DeleteMode::Equality);
    }
}
