//! The sink's tables: what every task of the sink shares ([`Tables`]: the warehouse, the
//! config, the compaction options, the resyncs under way) and one [`Handle`] per table, which
//! holds the table's cached [`TableState`] and its background compactor's flags.
//!
//! Each table has one handle, whose state sits behind a tokio mutex held across the awaits of one
//! commit: a commit is read-modify-write of the table's newest snapshot, so the writer, the
//! compactor and a resync's swap take turns (mod.rs, "Concurrency"). The handles themselves sit
//! behind a std mutex held only to find or add one.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::compaction::{self, CompactStats};
use super::table::{self, TableState};
use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::config::{LsmConfig, MergeEngine};
use crate::sinks::cdc_columns::{self, CdcColumns};
use crate::sinks::resync::Lineage;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// One table: its state as of the newest snapshot, and its compactor's flags.
pub(super) struct Handle {
    pub(super) table: TableId,
    pub(super) state: tokio::sync::Mutex<Option<TableState>>,
    pub(super) compacting: AtomicBool,
    /// Signalled whenever the compactor publishes or stops.
    pub(super) progress: Notify,
    /// What the background compactor did so far, and the time it spent.
    pub(super) totals: Mutex<(CompactStats, Duration)>,
    /// The background compactor's last failure, for a commit stalled on it.
    pub(super) failure: Mutex<Option<String>>,
    /// The snapshot id after which expiry was last tried (0: not yet).
    pub(super) expiry_tried: AtomicI64,
    /// The last commit carried initial-copy progress: its bottom files stay as they are until
    /// the copy is done (`compaction::consolidate`).
    pub(super) copying: AtomicBool,
}

/// What the sink's commits, compactors, expiries and resyncs share, and the tables' handles.
pub(super) struct Tables {
    pub(super) warehouse: Warehouse,
    pub(super) config: LsmConfig,
    pub(super) pipeline: String,
    pub(super) compaction: compaction::Options,
    handles: Mutex<HashMap<TableId, Arc<Handle>>>,
    /// `source.schema_change`: with `stop`, a commit that would change a table's schema fails.
    pub(super) schema_change: crate::config::SchemaChangePolicy,
    /// Tables under resync ([`crate::sinks::Sink::resync`]): their commits go to the lineage at
    /// `<table>/resync-<id>` (resync.rs) until it replaces the live table.
    pub(super) resyncs: Mutex<HashMap<TableId, Lineage>>,
}

impl Tables {
    pub(super) fn new(config: &LsmConfig, pipeline: &str, warehouse: Warehouse) -> Tables {
        let trigger = config.compaction_trigger.max(2);
        Tables {
            warehouse,
            config: config.clone(),
            pipeline: pipeline.to_owned(),
            compaction: compaction::Options {
                trigger,
                stop_trigger: trigger + 3,
                max_level: trigger as i32,
                ..compaction::Options::default()
            },
            handles: Mutex::new(HashMap::new()),
            schema_change: crate::config::SchemaChangePolicy::default(),
            resyncs: Mutex::new(HashMap::new()),
        }
    }

    /// Where `table`'s commits go now: its resync lineage while one is under way (resync.rs),
    /// else the live table.
    pub(super) fn table_location(&self, table: &TableId) -> String {
        let live = self.live_location(table);
        match self.lineage(table) {
            Some(lineage) => crate::sinks::resync::lineage_location(&live, &lineage.id),
            None => live,
        }
    }

    /// `<warehouse>/<namespace>.db/<table>`: the table readers read.
    pub(super) fn live_location(&self, table: &TableId) -> String {
        let ns = self.config.namespace.as_deref().unwrap_or(&table.namespace);
        self.warehouse.location(&[&format!("{ns}.db"), &table.name])
    }

    /// `table`'s handle, made on first use.
    pub(super) fn handle(&self, table: &TableId) -> Arc<Handle> {
        let mut handles = match self.handles.lock() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        handles
            .entry(table.clone())
            .or_insert_with(|| {
                Arc::new(Handle {
                    table: table.clone(),
                    state: tokio::sync::Mutex::new(None),
                    compacting: AtomicBool::new(false),
                    progress: Notify::new(),
                    totals: Mutex::new((CompactStats::default(), Duration::ZERO)),
                    failure: Mutex::new(None),
                    expiry_tried: AtomicI64::new(0),
                    copying: AtomicBool::new(false),
                })
            })
            .clone()
    }

    /// Every table's handle so far.
    pub(super) fn handles(&self) -> Vec<Arc<Handle>> {
        match self.handles.lock() {
            Ok(t) => t.values().cloned().collect(),
            Err(poisoned) => poisoned.into_inner().values().cloned().collect(),
        }
    }

    /// Paimon table options cdcd sets on `table` when it creates it.
    pub(super) fn table_options(&self, table: &TableId) -> BTreeMap<String, String> {
        let o = &self.compaction;
        let mut m = BTreeMap::from([
            (
                "bucket".to_owned(),
                self.config.buckets_for(table).max(1).to_string(),
            ),
            ("file.format".to_owned(), "parquet".to_owned()),
            (
                "num-sorted-run.compaction-trigger".to_owned(),
                o.trigger.to_string(),
            ),
            (
                "num-sorted-run.stop-trigger".to_owned(),
                o.stop_trigger.to_string(),
            ),
            ("num-levels".to_owned(), (o.max_level + 1).to_string()),
        ]);
        let partitioned = self
            .config
            .tables
            .resolve(table)
            .ok()
            .and_then(|s| s.partition_by)
            .is_some_and(|p| !p.value.is_empty());
        if partitioned {
            // Partition directories named by the value's text, as pypaimon names them
            // (partition.rs).
            m.insert(super::partition::LEGACY_NAME_OPTION.into(), "false".into());
        }
        if self.config.deletion_vectors {
            m.insert("deletion-vectors.enabled".into(), "true".into());
        }
        if self.config.changelog_for(table) {
            // The changelog files are the changes as they came in (commit/changelog.rs).
            m.insert("changelog-producer".into(), "input".into());
        }
        match self.config.merge_engine {
            MergeEngine::Deduplicate => {
                m.insert("merge-engine".into(), "deduplicate".into());
            }
            MergeEngine::PartialUpdate => {
                m.insert("merge-engine".into(), "partial-update".into());
                m.insert(
                    "partial-update.remove-record-on-delete".into(),
                    "true".into(),
                );
            }
        }
        m
    }

    /// The partition keys `schema`'s table is written with: its `partition_by` when set, else
    /// the existing table's (none for a new one). Refused, naming the table and the setting: a
    /// column the table lacks or of a type cdcd does not partition by, a column of the source's
    /// primary key, a keyless table, the partial-update engine, and a `partition_by` other than
    /// the existing table's (Paimon cannot change a table's partitioning).
    pub(super) async fn partition_keys(
        &self,
        handle: &Handle,
        schema: &TableSchema,
    ) -> Result<Vec<String>, SinkError> {
        let table = &schema.id;
        let configured = self.config.tables.resolve(table)?.partition_by;
        let existing = {
            let mut guard = handle.state.lock().await;
            self.ensure_loaded(table, &mut guard).await?;
            guard.as_ref().map(|s| s.schema.partition_keys.clone())
        };
        let Some(configured) = configured else {
            return Ok(existing.unwrap_or_default());
        };
        let names: Vec<String> = configured.value.iter().map(|f| f.column.clone()).collect();
        let refuse = |why: String| -> SinkError {
            configured.origin.invalid(format!("{table}: {why}")).into()
        };
        if let Some(existing) = existing.filter(|e| *e != names) {
            let has = if existing.is_empty() {
                "unpartitioned".to_owned()
            } else {
                format!("partitioned by [{}]", existing.join(", "))
            };
            return Err(refuse(format!(
                "the Paimon table is {has}, and Paimon cannot change a table's partitioning: \
                 set partition_by to that, or drop the table to copy it again partitioned"
            )));
        }
        if names.is_empty() {
            return Ok(names);
        }
        if schema.primary_key.is_empty() {
            return Err(refuse(
                "a keyless table becomes a Paimon append table, which cdcd writes unpartitioned"
                    .into(),
            ));
        }
        if self.config.merge_engine == MergeEngine::PartialUpdate {
            // That engine's rows leave absent columns NULL, a partition column among them: the
            // row's partition would be the NULL one.
            return Err(refuse(
                "sink.merge_engine = \"partial-update\" writes the columns an update leaves \
                 out as NULL, so a row's partition is not known: use the deduplicate engine for \
                 partitioned tables"
                    .into(),
            ));
        }
        for name in &names {
            let Some((i, column)) = schema
                .columns
                .iter()
                .enumerate()
                .find(|(_, c)| &c.name == name)
            else {
                return Err(refuse(format!("the table has no column {name:?}")));
            };
            if schema.primary_key.contains(&i) {
                return Err(refuse(format!(
                    "{name:?} is a column of the primary key: cdcd partitions Paimon tables by \
                     columns outside the key only (a partition key inside it changes the files' \
                     key and bucket hash, which cdcd does not write yet)"
                )));
            }
            let stored = super::schema::file_type(&column.data_type);
            if let Some(why) = super::partition::type_refusal(&stored) {
                return Err(refuse(format!(
                    "column {name:?} ({}): {why}",
                    column.source_type
                )));
            }
        }
        Ok(names)
    }

    /// `table`'s resync under way in this sink, if any.
    pub(super) fn lineage(&self, table: &TableId) -> Option<Lineage> {
        self.resyncs.lock().ok()?.get(table).cloned()
    }

    /// `changes` with the columns `[sink.tables."…"]` adds to the table's rows
    /// (`sinks/cdc_columns.rs`: `deletes = "soft"`, `row_metadata`); `None` when it adds none.
    /// Paimon has no initial default: rows written before the columns were added read NULL
    /// (`_cdc_deleted` NULL reads as live).
    pub(super) async fn with_cdc_columns(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<Option<cdc_columns::WithColumns>, SinkError> {
        let table = &schema.id;
        let cdc = CdcColumns::of(&self.config.tables.resolve(table)?, false);
        let handle = self.handle(table);
        let existing: Option<Vec<String>> = {
            let mut guard = handle.state.lock().await;
            self.ensure_loaded(table, &mut guard).await?;
            guard
                .as_ref()
                .map(|s| s.schema.fields.iter().map(|f| f.name.clone()).collect())
        };
        let has_deleted = existing
            .iter()
            .flatten()
            .any(|name| name == cdc_columns::DELETED);
        cdc_columns::refuse_unflagging(table, has_deleted, cdc.soft_deletes, schema)?;
        if cdc.is_none() {
            return Ok(None);
        }
        cdc.apply_to_commit(schema, changes, checkpoint, existing.as_deref())
    }

    /// Loads the table into `slot` when it is not cached.
    pub(super) async fn ensure_loaded(
        &self,
        table: &TableId,
        slot: &mut Option<TableState>,
    ) -> Result<(), SinkError> {
        if slot.is_none() {
            *slot = table::load(&self.warehouse, &self.table_location(table)).await?;
        }
        Ok(())
    }
}
