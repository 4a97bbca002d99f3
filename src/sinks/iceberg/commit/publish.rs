//! The publish step's parts: the metadata of a new table and of a new snapshot on top of the
//! old, the metadata file `v<N>.metadata.json` written create-if-absent, `version-hint.text`.
//! Which of them is the commit point is the catalog's (`catalog/`): the filesystem catalog's is
//! the create, the SQL catalog's the row update that names the file.
//!
//! A create that object_store retried after a timeout may find its own first attempt: equal
//! bytes count as success (`storage::put_create`). Crash points
//! `failpoints::COMMIT_BEFORE_CREATE` / `COMMIT_AFTER_CREATE` bracket the metadata put.

use std::collections::HashMap;

use iceberg::spec::{
    FormatVersion, Schema, Snapshot, SortOrder, TableMetadata, TableMetadataBuilder,
    UnboundPartitionSpec,
};
use object_store::{ObjectStoreExt, PutPayload};

use crate::changelog::TableId;
use crate::failpoints;
use crate::sinks::iceberg::files::metadata::{hint_location, Loaded};
use crate::sinks::SinkError;
use crate::storage::{put_create, Created, Warehouse};

fn ice(table: &TableId, what: &str) -> impl FnOnce(iceberg::Error) -> SinkError {
    let context = format!("{what} of {table}");
    move |source| SinkError::Iceberg { context, source }
}

/// Metadata of a new, empty table at `location` (format v2 or v3, unpartitioned, Parquet),
/// with `properties` (`maintenance/properties.rs`: cdcd's defaults and `[sink.table_properties]`).
pub(crate) fn new_table(
    table: &TableId,
    location: &str,
    schema: Schema,
    version: FormatVersion,
    properties: HashMap<String, String>,
) -> Result<TableMetadata, SinkError> {
    let unpartitioned = (
        UnboundPartitionSpec::builder().build(),
        SortOrder::unsorted_order(),
    );
    new_table_with(table, location, schema, version, properties, unpartitioned)
}

/// [`new_table`] with a partition spec and sort order (`layout.rs`), bound to `schema`'s field
/// ids: the table's spec 0 and, if sorted, its sort order 1.
pub(crate) fn new_table_with(
    table: &TableId,
    location: &str,
    schema: Schema,
    version: FormatVersion,
    properties: HashMap<String, String>,
    (spec, order): (UnboundPartitionSpec, SortOrder),
) -> Result<TableMetadata, SinkError> {
    TableMetadataBuilder::new(
        schema,
        spec,
        order,
        location.to_owned(),
        version,
        properties,
    )
    .and_then(|b| b.build())
    .map(|r| r.metadata)
    .map_err(ice(table, "creating the metadata"))
}

/// `prev` with `schema` added as the current schema (`schemas`, `current-schema-id` and
/// `last-column-id` advance); same version: it is published with the snapshot that first writes
/// rows under it ([`with_snapshot`]), never alone, so the schema change and the checkpoint land in
/// one commit.
pub(crate) fn with_schema(
    table: &TableId,
    prev: &Loaded,
    schema: Schema,
) -> Result<Loaded, SinkError> {
    TableMetadataBuilder::new_from_metadata(prev.metadata.clone(), None)
        .add_current_schema(schema)
        .and_then(|b| b.build())
        .map(|r| Loaded {
            version: prev.version,
            metadata: r.metadata,
            file: prev.file.clone(),
        })
        .map_err(ice(table, "adding the new schema"))
}

/// `prev` with a spec without fields added (not made the default), and its id: where a v2
/// commit writes equality deletes that must apply in every partition (`files/writer.rs`,
/// `V2Targets::equality_spec`). An existing spec without fields is reused (the builder reuses
/// an equal spec), so this changes nothing on a table that has one. Published with the snapshot
/// that first uses it, as a schema is ([`with_schema`]).
pub(crate) fn with_unpartitioned_spec(
    table: &TableId,
    prev: &Loaded,
) -> Result<(Loaded, i32), SinkError> {
    if let Some(spec) = prev
        .metadata
        .partition_specs_iter()
        .find(|s| s.fields().is_empty())
    {
        return Ok((prev.clone(), spec.spec_id()));
    }
    let built = TableMetadataBuilder::new_from_metadata(prev.metadata.clone(), None)
        .add_partition_spec(UnboundPartitionSpec::builder().build())
        .and_then(|b| b.build())
        .map_err(ice(table, "adding an unpartitioned spec"))?;
    let metadata = built.metadata;
    let spec_id = metadata
        .partition_specs_iter()
        .find(|s| s.fields().is_empty())
        .map(|s| s.spec_id())
        .ok_or_else(|| SinkError::Data {
            table: table.clone(),
            detail: "adding an unpartitioned spec left none".into(),
        })?;
    Ok((
        Loaded {
            version: prev.version,
            metadata,
            file: prev.file.clone(),
        },
        spec_id,
    ))
}

/// The metadata after `prev` with `snapshot` as the new head of `main`.
pub(crate) fn with_snapshot(
    table: &TableId,
    prev: &Loaded,
    snapshot: Snapshot,
) -> Result<TableMetadata, SinkError> {
    TableMetadataBuilder::new_from_metadata(prev.metadata.clone(), Some(prev.location()))
        .set_branch_snapshot(snapshot, "main")
        .and_then(|b| b.build())
        .map(|r| r.metadata)
        .map_err(ice(table, "adding the snapshot"))
}

/// The `cdcd.lease-epoch` of the current snapshot in the metadata file at `path`, if readable
/// and written under this daemon's pipeline (`cdcd.pipeline`): an epoch is a count of one
/// pipeline's lease, so another pipeline's (a second cdcd maintaining or sharing the table)
/// says nothing about this one's.
async fn winner_epoch(warehouse: &Warehouse, path: &object_store::path::Path) -> Option<u64> {
    let bytes = warehouse.store().get(path).await.ok()?.bytes().await.ok()?;
    let meta: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let current = meta.get("current-snapshot-id")?.as_i64()?;
    let snapshot = meta
        .get("snapshots")?
        .as_array()?
        .iter()
        .find(|s| s.get("snapshot-id").and_then(|v| v.as_i64()) == Some(current))?;
    let summary = snapshot.get("summary")?;
    let pipeline = summary.get(crate::checkpoint::PIPELINE_KEY)?.as_str()?;
    if pipeline != warehouse.fence()?.pipeline() {
        return None;
    }
    summary
        .get(crate::checkpoint::LEASE_EPOCH_KEY)?
        .as_str()?
        .parse()
        .ok()
}

/// Creates the metadata file at `location` create-if-absent: `Ok(true)` when it holds
/// `metadata` now (created, or found with equal bytes: an attempt object_store retried),
/// `Ok(false)` when another file is there. Who makes it the table's current metadata is the
/// catalog's business (`catalog/`): for the filesystem catalog this create is the commit point.
pub(crate) async fn create_metadata_file(
    warehouse: &Warehouse,
    table: &TableId,
    location: &str,
    metadata: &TableMetadata,
) -> Result<bool, SinkError> {
    let json = crate::sinks::iceberg::variant::metadata_file_bytes(metadata).map_err(|e| {
        SinkError::Data {
            table: table.clone(),
            detail: format!("serializing {location}: {e}"),
        }
    })?;
    let path = warehouse.path(location)?;
    failpoints::crash_point(failpoints::COMMIT_BEFORE_CREATE);
    let created = put_create(warehouse.store().as_ref(), &path, bytes::Bytes::from(json)).await;
    if created.as_ref().is_ok_and(|c| c.is_ours()) {
        failpoints::crash_point(failpoints::COMMIT_AFTER_CREATE);
    }
    match created {
        Ok(Created::Created) => Ok(true),
        // Our metadata carries a fresh snapshot id and timestamp: equal bytes are this very
        // commit, landed by an attempt object_store retried.
        Ok(Created::AlreadyOurs) => {
            tracing::info!(table = %table, path = %location, "metadata file landed on an earlier attempt");
            Ok(true)
        }
        Ok(Created::Conflict) => Ok(false),
        Err(source) => Err(SinkError::Storage {
            path: location.to_owned(),
            source,
        }),
    }
}

/// The error for a commit another writer won: `Fenced` when the winner (whose metadata is at
/// `winner_file`) holds a newer lease epoch, else `CommitConflict`.
pub(crate) async fn lost_to(
    warehouse: &Warehouse,
    table: &TableId,
    version: u64,
    winner_file: &str,
) -> SinkError {
    let winner = match warehouse.path(winner_file) {
        Ok(path) => winner_epoch(warehouse, &path).await,
        Err(_) => None,
    };
    if let Some(fenced) = crate::sinks::fenced_by_winner(warehouse, table, winner) {
        return fenced;
    }
    SinkError::CommitConflict {
        table: table.clone(),
        version,
    }
}

/// Rewrites `version-hint.text` of the table at `table_location` to `version`. Only a hint:
/// a failure is logged, never returned (the commit it follows is durable).
pub(crate) async fn write_hint(
    warehouse: &Warehouse,
    table: &TableId,
    table_location: &str,
    version: u64,
) {
    let hint = hint_location(table_location);
    let written = match warehouse.path(&hint) {
        Ok(hint_path) => warehouse
            .store()
            .put(&hint_path, PutPayload::from(version.to_string()))
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = written {
        tracing::warn!(table = %table, path = %hint, error = %e, "could not update the version hint");
    }
}
