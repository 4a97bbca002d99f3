//! Built-in table maintenance for the Iceberg sink (issue 19): data files compacted, the metadata
//! log kept bounded and snapshots expired, following each table's own Iceberg properties, in the daemon beside
//! replication (`Sink::maintain`, run every `sink.maintenance_interval_ms`) or on demand
//! (`cdcd maintain`).
//!
//! Layout: `properties.rs` (the properties honoured, their defaults, cdcd's defaults for new
//! tables), `expire.rs` (pure: which snapshots and refs expire), `reachable.rs` (the files a set
//! of snapshots reaches), `metadata_log.rs` (old `vN.metadata.json` files deleted after commit,
//! and swept), `journal.rs` (the expiry in progress, so a crash's leftovers are found),
//! `cycle.rs` (one cycle of one table: compact, then expire, delete, report), `compaction/`
//! (data-file compaction of v3 tables: pick, rewrite, commit a `replace` snapshot, move the
//! primary-key index; its module doc has the concurrency argument).
//!
//! The safety argument is in docs/internals.md ("Maintenance"): an expiry is a metadata commit
//! like any other (create-if-absent `v<N+1>`, serialized with this process's streaming commits
//! by the table's slot lock; a conflict reloads and decides again); files are deleted only after
//! it landed, and only those `reachable(expired) − reachable(retained)`.

mod compaction;
mod cycle;
pub(crate) mod expire;
mod journal;
pub(crate) mod metadata_log;
pub(crate) mod properties;
mod reachable;

use std::collections::HashMap;

use crate::changelog::TableId;

/// What maintenance keeps between cycles, per table (the manifests' file lists).
#[derive(Debug, Default)]
pub(crate) struct MaintenanceState {
    manifests: HashMap<TableId, reachable::ManifestCache>,
}
