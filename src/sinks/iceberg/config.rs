//! `[sink]` with `kind = "iceberg"`: the validated settings the Iceberg sink runs with.

use crate::config::{normalize_warehouse, valid_ident, ConfigError, RawConfig};

/// How Iceberg deletes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteMode {
    /// Format v2: equality deletes for rows of earlier snapshots, position deletes within a commit.
    Equality,
    /// Format v3: deletion vectors.
    DeletionVectors,
}

#[derive(Debug, Clone)]
pub struct IcebergConfig {
    /// The warehouse URL, normalized (`file:///abs/path` or `s3://bucket/prefix`).
    pub warehouse: String,
    pub namespace: Option<String>,
    pub delete_mode: DeleteMode,
}

impl RawConfig {
    pub(crate) fn iceberg(&self, file: &str) -> Result<IcebergConfig, ConfigError> {
        let bad = |key: &'static str, detail: String| ConfigError::Invalid {
            file: file.to_owned(),
            key,
            detail,
        };
        let delete_mode =
            match self.sink.delete_mode.as_deref() {
                Some("equality") => DeleteMode::Equality,
                // The default (DESIGN.md): engines that refuse or slow down on equality
                // deletes read deletion vectors well; the primary-key index locates rows.
                None | Some("deletion-vectors") => DeleteMode::DeletionVectors,
                Some(other) => return Err(bad(
                    "sink.delete_mode",
                    format!(
                        "{other:?} is not a delete mode; use \"equality\" or \"deletion-vectors\""
                    ),
                )),
            };
        let warehouse =
            normalize_warehouse(&self.sink.warehouse).map_err(|d| bad("sink.warehouse", d))?;
        if let Some(ns) = &self.sink.namespace {
            if !valid_ident(ns) {
                return Err(bad(
                    "sink.namespace",
                    format!("{ns:?} must be non-empty without '/' or '.'"),
                ));
            }
        }
        Ok(IcebergConfig {
            warehouse,
            namespace: self.sink.namespace.clone(),
            delete_mode,
        })
    }
}
