//! The three ways the Postgres source copies tables, each at one snapshot that the copy is also
//! planned at:
//! - [`initial_copy`]: a fresh slot's exported snapshot, every table, streaming starts at the
//!   slot's consistent point;
//! - [`copy_at_new_snapshot`]: an interrupted copy's remaining chunks and added tables, at a
//!   snapshot exported while the slot stays, with an upsert window (`snapshot.rs` argues why
//!   that converges);
//! - [`copy_exactly`]: tables copied whole at a temporary slot's exported snapshot, complete at
//!   its consistent point: keyless tables, a resync's copy job, and any table the other two
//!   found changed after their snapshot.
//!
//! Why the plan is read at the snapshot, not before it: `COPY (SELECT "c1", "c2" …)` reads the
//! planned columns only, so a column added (and filled) between a plan read earlier and the
//! snapshot would be copied as NULL, with no change left in the stream to fill it. And why a
//! table can still be found changed: the snapshot is taken before the tables are locked, and a
//! DDL that commits in between (a rewrite above all) is not in the snapshot. Each worker locks a
//! table and compares its shape with the plan's before it copies it (`snapshot/parallel.rs`);
//! a changed table is copied again by [`copy_exactly`] at a newer snapshot, until one holds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use super::catalog::{self, TableShape};
use super::relation::{build_schema, unresolved_types};
use super::replication::ReplicationConnection;
use super::setup;
use super::snapshot::held::{NewSnapshot, SnapshotReader};
use super::snapshot::parallel::{copy_tables, plan_table, CopyRun, TablePlan};
use super::types::{ColumnType, TypeInfo};
use super::{deliver, PreparedState, SNAPSHOT_BATCH};
use crate::changelog::{Lsn, Position, TableId, TableSchema};
use crate::config::PostgresConfig;
use crate::sources::{SourceError, SourceEvent, TableCopy};

/// How many snapshots [`copy_exactly`] tries for a table that keeps changing between its
/// snapshot and its lock before it stops and names the table.
const EXACT_COPY_ATTEMPTS: u32 = 5;
/// How long a temporary slot of a previous process may take to go (`await_gone`).
const TEMPORARY_SLOT_GRACE: Duration = Duration::from_secs(30);

/// Drops and re-creates the slot with an exported snapshot, copies every table as of it, and
/// returns the consistent point to stream from (`None`: shutdown during the copy).
pub(super) async fn initial_copy(
    cfg: &PostgresConfig,
    state: &PreparedState,
    types: &mut HashMap<u32, Option<TypeInfo>>,
    conn: &mut ReplicationConnection,
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<Option<Lsn>, SourceError> {
    if setup::slot_exists(&state.client, &cfg.slot)
        .await?
        .is_some()
    {
        conn.drop_slot(&cfg.slot).await?;
        tracing::info!(slot = %cfg.slot, "dropped replication slot for a new initial copy");
    }
    let copies = whole(state.tables.iter().cloned());
    // The exported snapshot lives until the next command on `conn`, which is START_REPLICATION
    // after the copy: the plan reads it through an importing transaction.
    let (point, snapshot_name) = conn.create_slot(&cfg.slot).await?;
    tracing::info!(slot = %cfg.slot, consistent_point = %point, snapshot = %snapshot_name, "created replication slot; copying tables");
    let plans = plan_at(cfg, &snapshot_name, state, types, &copies).await;
    let run = copy_run(cfg, &snapshot_name, events, shutdown);
    let Some(copied) = copy_tables(plans?, run).await? else {
        return Ok(None);
    };
    if !deliver_done(&copied.tables, point, events, shutdown).await? {
        return Ok(None);
    }
    if !copy_changed(cfg, state, types, copied.changed, events, shutdown).await? {
        return Ok(None);
    }
    Ok(Some(point))
}

/// Copies `copies` (an interrupted copy's remaining chunks, added tables) at a snapshot exported
/// now, while the slot stays. Each table ends "complete at" the position streaming starts from,
/// with an upsert window up to the WAL position read after the snapshot (the argument is in
/// `snapshot.rs`). False: shutdown during the copy.
pub(super) async fn copy_at_new_snapshot(
    cfg: &PostgresConfig,
    state: &PreparedState,
    types: &mut HashMap<u32, Option<TypeInfo>>,
    start: Lsn,
    copies: &[TableCopy],
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<bool, SourceError> {
    // Streaming starts at `start`, or where the slot stands.
    let from = if start.is_zero() {
        setup::slot_exists(&state.client, &cfg.slot)
            .await?
            .and_then(|s| s.confirmed_flush)
            .ok_or_else(|| SourceError::Server {
                context: format!("replication slot {}", cfg.slot),
                detail: "has no confirmed position to stream from".into(),
            })?
    } else {
        start
    };
    // A keyless table's copy cannot take an upsert window (nothing tells a doubled row apart in a
    // multiset), so it is copied again whole at the exported snapshot of a temporary slot: every
    // transaction committed before that slot's consistent point is in the snapshot and none after
    // (the same argument as the fresh copy, snapshot.rs), so the table is complete at that point
    // and the stream's changes to it at or below it are skipped as committed.
    let (keyless, keyed): (Vec<TableCopy>, Vec<TableCopy>) = copies
        .iter()
        .cloned()
        .partition(|c| state.keys.get(&c.table).is_some_and(|k| k.is_empty()));
    if !keyless.is_empty()
        && !copy_exactly(
            cfg,
            state,
            types,
            &keyless,
            events,
            shutdown,
            &temporary(cfg),
        )
        .await?
    {
        return Ok(false);
    }
    if keyed.is_empty() {
        return Ok(true);
    }
    let snapshot = NewSnapshot::export(cfg).await?;
    let plans = plan_at(cfg, &snapshot.name, state, types, &keyed).await;
    let plans = match plans {
        Ok(plans) => plans,
        Err(e) => {
            snapshot.close().await;
            return Err(e);
        }
    };
    tracing::info!(tables = keyed.len(), stream_from = %from, upsert_until = %snapshot.lsn, "copying tables at a new snapshot while the slot stays");
    let run = copy_run(cfg, &snapshot.name, events, shutdown);
    let copied = copy_tables(plans, run).await;
    let until = snapshot.lsn;
    snapshot.close().await;
    let Some(copied) = copied? else {
        return Ok(false);
    };
    for plan in copied.tables {
        let table = plan.schema.id.clone();
        let window = SourceEvent::SnapshotUpsertUntil {
            table: table.clone(),
            until: Position::Postgres(until),
        };
        let done = SourceEvent::SnapshotDone {
            table,
            position: Position::Postgres(from),
        };
        if !deliver(events, window, shutdown).await? || !deliver(events, done, shutdown).await? {
            return Ok(false);
        }
    }
    copy_changed(cfg, state, types, copied.changed, events, shutdown).await
}

/// A copy run at `snapshot` in batches of [`SNAPSHOT_BATCH`].
fn copy_run<'a>(
    cfg: &'a PostgresConfig,
    snapshot: &'a str,
    events: &'a mpsc::Sender<SourceEvent>,
    shutdown: &'a CancellationToken,
) -> CopyRun<'a> {
    CopyRun {
        cfg,
        snapshot,
        events,
        shutdown,
        limits: SNAPSHOT_BATCH,
    }
}

/// Tells that `tables`, copied whole, are complete at `point`. False: shutdown.
async fn deliver_done(
    tables: &[TablePlan],
    point: Lsn,
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<bool, SourceError> {
    for plan in tables {
        let done = SourceEvent::SnapshotDone {
            table: plan.schema.id.clone(),
            position: Position::Postgres(point),
        };
        if !deliver(events, done, shutdown).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Copies the tables a copy found changed after its snapshot again, whole, at a newer one
/// ([`copy_exactly`]). True when there are none.
async fn copy_changed(
    cfg: &PostgresConfig,
    state: &PreparedState,
    types: &mut HashMap<u32, Option<TypeInfo>>,
    changed: Vec<TableId>,
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<bool, SourceError> {
    if changed.is_empty() {
        return Ok(true);
    }
    let copies = whole(changed);
    copy_exactly(
        cfg,
        state,
        types,
        &copies,
        events,
        shutdown,
        &temporary(cfg),
    )
    .await
}

/// The temporary slot of a copy beside the stream (keyless and changed tables).
fn temporary(cfg: &PostgresConfig) -> String {
    format!("{}_copy", cfg.slot)
}

/// `tables` copied from scratch: the first batch replaces what the table holds.
fn whole(tables: impl IntoIterator<Item = TableId>) -> Vec<TableCopy> {
    tables
        .into_iter()
        .map(|table| TableCopy {
            table,
            progress: None,
        })
        .collect()
}

/// Copies `copies` whole (from scratch: the first batch replaces what the table holds) at the
/// snapshot a temporary logical slot named `temporary` exports, and declares each complete at
/// that slot's consistent point: keyless tables beside streamed ones, a resync's copy job, and
/// tables changed after another copy's snapshot. A table found changed after this snapshot too
/// is copied again at a newer one, up to [`EXACT_COPY_ATTEMPTS`] snapshots. False: shutdown
/// during the copy.
pub(super) async fn copy_exactly(
    cfg: &PostgresConfig,
    state: &PreparedState,
    types: &mut HashMap<u32, Option<TypeInfo>>,
    copies: &[TableCopy],
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
    temporary: &str,
) -> Result<bool, SourceError> {
    let mut tables: Vec<TableId> = copies.iter().map(|c| c.table.clone()).collect();
    for attempt in 1..=EXACT_COPY_ATTEMPTS {
        // The slot lives as long as this connection, which stays idle (so the exported snapshot
        // stays valid) until the copy is done.
        await_gone(state, temporary).await?;
        let mut conn = ReplicationConnection::connect(cfg).await?;
        let (consistent, snapshot) = conn.create_temporary_slot(temporary).await?;
        let plans = plan_at(cfg, &snapshot, state, types, &whole(tables.clone())).await;
        tracing::info!(tables = tables.len(), complete_at = %consistent, attempt, "copying tables whole at a temporary slot's snapshot");
        let run = copy_run(cfg, &snapshot, events, shutdown);
        let copied = copy_tables(plans?, run).await;
        drop(conn);
        let Some(copied) = copied? else {
            return Ok(false);
        };
        if !deliver_done(&copied.tables, consistent, events, shutdown).await? {
            return Ok(false);
        }
        if copied.changed.is_empty() {
            return Ok(true);
        }
        tables = copied.changed;
    }
    let names: Vec<String> = tables.iter().map(ToString::to_string).collect();
    Err(SourceError::Server {
        context: format!("copying {}", names.join(", ")),
        detail: format!(
            "the table changed (DDL, TRUNCATE, CLUSTER or VACUUM FULL) after each of {EXACT_COPY_ATTEMPTS} copy snapshots, before the copy could lock it; nothing of those copies was kept. Start cdcd again when the migration is over"
        ),
    })
}

/// Waits until no slot named `slot` exists. A temporary slot lives as long as its session, and
/// the session of a process that was killed ends only when the server notices (the lease says
/// no other cdcd of this pipeline runs): creating it again meanwhile fails with "already exists".
/// After [`TEMPORARY_SLOT_GRACE`] the create is tried anyway and names the slot if it fails.
async fn await_gone(state: &PreparedState, slot: &str) -> Result<(), SourceError> {
    let deadline = tokio::time::Instant::now() + TEMPORARY_SLOT_GRACE;
    while setup::slot_exists(&state.client, slot).await?.is_some() {
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The copy plan of each table in `copies` at the exported snapshot `snapshot`, read by a
/// transaction that imports it and ends with the plan. It ends because planning locks the tables
/// it samples (`ACCESS SHARE`, until the transaction ends): a migration's `ALTER` would queue
/// behind a lock held for the whole copy, and a worker's lock behind the `ALTER`, a wait no
/// deadlock detector sees (the holder is idle, not waiting).
async fn plan_at(
    cfg: &PostgresConfig,
    snapshot: &str,
    state: &PreparedState,
    types: &mut HashMap<u32, Option<TypeInfo>>,
    copies: &[TableCopy],
) -> Result<Vec<TablePlan>, SourceError> {
    let reader = SnapshotReader::import(cfg, snapshot).await?;
    let plans = plan_tables(cfg, reader.client(), state, types, copies).await;
    reader.close().await;
    plans
}

/// The copy plan of each table in `copies`, read by `at`: a transaction at the copy's snapshot,
/// so the columns planned are the columns the snapshot's rows have.
async fn plan_tables(
    cfg: &PostgresConfig,
    at: &Client,
    state: &PreparedState,
    types: &mut HashMap<u32, Option<TypeInfo>>,
    copies: &[TableCopy],
) -> Result<Vec<TablePlan>, SourceError> {
    let mut plans = Vec::with_capacity(copies.len());
    for c in copies {
        let (schema, col_types, shape) =
            table_schema(at, &c.table, state.keys.get(&c.table), types).await?;
        let plan = plan_table(
            at,
            schema,
            col_types,
            shape,
            c.progress.as_ref(),
            cfg.snapshot_chunk_rows,
        )
        .await?;
        tracing::info!(table = %c.table, chunks = plan.chunks.len(), to_copy = plan.todo.len(), estimated_rows = plan.estimated_rows, binary = plan.binary, "planned initial copy");
        plans.push(plan);
    }
    Ok(plans)
}

/// The schema, column types and shape of `table` from the catalog `client` sees, looking up
/// non-builtin types.
async fn table_schema(
    client: &Client,
    table: &TableId,
    keys: Option<&Vec<String>>,
    types: &mut HashMap<u32, Option<TypeInfo>>,
) -> Result<(Arc<TableSchema>, Vec<ColumnType>, TableShape), SourceError> {
    let shape = catalog::table_shape(client, table).await?;
    loop {
        let missing = unresolved_types(&shape.columns, &|oid| types.get(&oid).cloned());
        if missing.is_empty() {
            break;
        }
        let found = catalog::lookup_types(client, &missing).await?;
        for oid in &missing {
            types.insert(*oid, found.get(oid).cloned());
        }
    }
    let lookup = |oid: u32| types.get(&oid).cloned().flatten();
    let (schema, col_types) = build_schema(
        table.clone(),
        &shape.columns,
        keys.map(Vec::as_slice),
        &lookup,
    )?;
    Ok((Arc::new(schema), col_types, shape))
}
