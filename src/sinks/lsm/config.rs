//! `[sink]` with `kind = "lsm"`: the validated settings the LSM (Apache Paimon) sink runs with.

use crate::config::{normalize_warehouse, valid_ident, ConfigError, RawConfig};

/// How an LSM (Paimon) table merges the versions of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeEngine {
    /// The newest version wins; cdcd writes whole rows (completing partial ones itself).
    Deduplicate,
    /// Paimon's `partial-update`: NULL fields keep the previous value (so NULL cannot be set).
    PartialUpdate,
}

/// Validated LSM (Apache Paimon) sink settings.
#[derive(Debug, Clone)]
pub struct LsmConfig {
    /// The warehouse URL, normalized (`file:///abs/path`).
    pub warehouse: String,
    pub namespace: Option<String>,
    pub buckets: u32,
    pub merge_engine: MergeEngine,
    pub compaction_trigger: usize,
    pub snapshots_retained: usize,
    pub snapshot_time_retained_ms: Option<u64>,
    /// Paimon `deletion-vectors.enabled`: readers read only compacted files.
    pub deletion_vectors: bool,
}

impl RawConfig {
    pub(crate) fn lsm(&self, file: &str) -> Result<LsmConfig, ConfigError> {
        let bad = |key: &'static str, detail: String| ConfigError::Invalid {
            file: file.to_owned(),
            key,
            detail,
        };
        let s = &self.sink;
        if s.delete_mode.is_some() {
            return Err(bad(
                "sink.delete_mode",
                "applies to iceberg sinks only".into(),
            ));
        }
        if s.s3.is_some() {
            return Err(bad(
                "sink.s3",
                "S3 warehouses are not supported by this build yet; use a local path".into(),
            ));
        }
        let warehouse = normalize_warehouse(&s.warehouse).map_err(|d| bad("sink.warehouse", d))?;
        if let Some(ns) = &s.namespace {
            if !valid_ident(ns) {
                return Err(bad(
                    "sink.namespace",
                    format!("{ns:?} must be non-empty without '/' or '.'"),
                ));
            }
        }
        let buckets = s.buckets.unwrap_or(4);
        if !(1..=1024).contains(&buckets) {
            return Err(bad("sink.buckets", format!("{buckets}: use 1 to 1024")));
        }
        let merge_engine = match s.merge_engine.as_deref() {
            None | Some("deduplicate") => MergeEngine::Deduplicate,
            Some("partial-update") => MergeEngine::PartialUpdate,
            Some(other) => {
                return Err(bad(
                    "sink.merge_engine",
                    format!("{other:?}: use \"deduplicate\" or \"partial-update\""),
                ))
            }
        };
        let compaction_trigger = s.compaction_trigger.unwrap_or(5);
        if !(2..=100).contains(&compaction_trigger) {
            return Err(bad(
                "sink.compaction_trigger",
                format!("{compaction_trigger}: use 2 to 100"),
            ));
        }
        let snapshots_retained = s.snapshots_retained.unwrap_or(30);
        if snapshots_retained == 0 {
            return Err(bad("sink.snapshots_retained", "must be at least 1".into()));
        }
        Ok(LsmConfig {
            warehouse,
            namespace: s.namespace.clone(),
            buckets,
            merge_engine,
            compaction_trigger,
            snapshots_retained,
            snapshot_time_retained_ms: s.snapshot_time_retained_ms,
            deletion_vectors: s.deletion_vectors.unwrap_or(false),
        })
    }
}
