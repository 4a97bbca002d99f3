//! `[sink]` with `kind = "iceberg"`: the keys as written ([`RawIceberg`], whose field docs are the
//! user docs), their checks, and the settings the Iceberg sink runs with ([`IcebergConfig`]).
//! `crate::config` reads the file and picks this struct by `kind`.

use serde::Deserialize;

use crate::config::{default_warehouse, ConfigError, Context, RawS3};

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
}

/// How Iceberg deletes are written (`sink.delete_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeleteMode {
    /// Format v2: equality deletes for rows of earlier snapshots, position deletes within a commit.
    Equality,
    /// Format v3: deletion vectors. The default (DESIGN.md): engines that refuse or slow down on
    /// equality deletes read deletion vectors well; the primary-key index locates rows.
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
}

impl RawIceberg {
    /// Checks every key and builds the settings (`[sink.s3]` is checked by `crate::config`).
    pub fn validate(self, ctx: &Context<'_>) -> Result<IcebergConfig, ConfigError> {
        let (warehouse, namespace) = ctx.sink_location(&self.warehouse, self.namespace)?;
        Ok(IcebergConfig {
            warehouse,
            namespace,
            delete_mode: self.delete_mode,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::DeleteMode;
    use crate::config::tests::MINIMAL;
    use crate::config::{Config, SinkConfig};

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
}
