//! Built-in table maintenance for the Iceberg sink (issue 19): data files compacted, the metadata
//! log kept bounded and snapshots expired, following each table's own Iceberg properties, in the daemon beside
//! replication (`Sink::maintain`, run every `sink.maintenance_interval_ms`) or on demand
//! (`cdcd maintain`).
//!
//! Layout: the actions, each a type over the sink's `Tables` (`tables.rs`) that takes the
//! table's slot lock for its commits: `cycle.rs` ([`MaintenanceCycle`]: one cycle of one table:
//! compact, then expire, sweep, report), `compaction/` (`RewriteDataFiles`: data-file compaction:
//! pick, rewrite, commit a `replace` snapshot, move the primary-key index; its module doc has
//! the concurrency argument), `expire_snapshots.rs` (`ExpireSnapshots`: commit an expiry, delete
//! what only the expired snapshots reached, finish one a crash interrupted). What they use:
//! `properties.rs` (the properties honoured, their defaults, cdcd's defaults for new tables),
//! `expire.rs` (pure: which snapshots and refs expire), `reachable.rs` (the files a set of
//! snapshots reaches), `metadata_log.rs` (old `vN.metadata.json` files deleted after commit, and
//! swept), `journal.rs` (the expiry in progress, so a crash's leftovers are found), `pending_deletes.rs`
//! (the files an expiry left, deleted after the table's delete delay).
//!
//! The safety argument is in docs/internals.md ("Maintenance"): an expiry is a metadata commit
//! like any other (create-if-absent `v<N+1>`, serialized with this process's streaming commits
//! by the table's slot lock; a conflict reloads and decides again); files are deleted only after
//! it landed, and only those `reachable(expired) − reachable(retained)`.

pub(super) mod compaction;
mod cycle;
pub(crate) mod expire;
mod expire_snapshots;
mod journal;
pub(crate) mod metadata_log;
mod pending_deletes;
pub(crate) mod properties;
pub(super) mod reachable;

use std::collections::HashMap;

use crate::changelog::TableId;
pub(super) use cycle::{ask_if_due, MaintenanceCycle};

/// What maintenance keeps between cycles, per table (the files expiries left to delete later;
/// the tables a cycle left with nothing to do, `cycle.rs`; when the metadata directory was last
/// swept). What manifests list is kept with the table (`Tables::manifest_contents`).
#[derive(Debug, Default)]
pub(crate) struct MaintenanceState {
    pending: HashMap<TableId, pending_deletes::PendingDeletes>,
    settled: HashMap<TableId, cycle::Settled>,
    swept_ms: HashMap<TableId, i64>,
}
