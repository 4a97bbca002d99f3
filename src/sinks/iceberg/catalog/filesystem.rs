//! The filesystem catalog (the default): a table is found by path, its current metadata is the
//! highest `metadata/v<N>.metadata.json` (`metadata.rs`, helped by `version-hint.text`), and the
//! commit point is the create-if-absent put of `v<N+1>.metadata.json`.
//!
//! Once that create succeeds the snapshot is durable and visible; if the file already exists
//! another writer won version N+1 and the commit fails with `CommitConflict` (nothing of it is
//! referenced). The hint is rewritten afterwards and may lag after a crash; `metadata.rs` probes
//! past it.

use iceberg::spec::TableMetadata;

use crate::changelog::TableId;
use crate::sinks::iceberg::commit::publish;
use crate::sinks::iceberg::metadata::{self, metadata_location, Loaded};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// The newest metadata of the table at `location`, or `None` when it has none.
pub(crate) async fn load(
    warehouse: &Warehouse,
    location: &str,
) -> Result<Option<Loaded>, SinkError> {
    metadata::load_latest(warehouse, location).await
}

/// Publishes `metadata` as version `version` of its table: the file created create-if-absent
/// (the commit point), then the version hint.
pub(crate) async fn commit_version(
    warehouse: &Warehouse,
    table: &TableId,
    version: u64,
    metadata: TableMetadata,
) -> Result<Loaded, SinkError> {
    let file = metadata_location(metadata.location(), version);
    if !publish::create_metadata_file(warehouse, table, &file, &metadata).await? {
        return Err(publish::lost_to(warehouse, table, version, &file).await);
    }
    publish::write_hint(warehouse, table, metadata.location(), version).await;
    Ok(Loaded {
        version,
        metadata,
        file,
    })
}
