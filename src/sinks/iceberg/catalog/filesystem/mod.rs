//! The filesystem catalog (the default): a table is found by path, its current metadata is the
//! highest `metadata/v<N>.metadata.json` (`files/metadata.rs`), and the commit point is the
//! create-if-absent put of `v<N+1>.metadata.json` when nothing newer exists.
//!
//! A commit of version N+1 on base N, in steps:
//! 1. List `metadata/`: a version above N means another writer committed on top of the base
//!    (its older files may be gone: Iceberg-Java deletes the metadata files that leave the
//!    metadata log, so `v<N+1>` may be free although N is not the newest). `CommitConflict`;
//!    nothing is written.
//! 2. Create `v<N+1>.metadata.json` if absent. Already there: another writer won N+1,
//!    `CommitConflict` (nothing of ours is referenced).
//! 3. List again: a newer version than ours appeared between step 1 and the create, so ours
//!    sits in a gap beside the table's history (`landing.rs`, `AfterCreate::Beside`). No reader
//!    takes it as current (they take the highest version, or probe past it); it is deleted, the
//!    hint is not touched, and the commit is a `CommitConflict`: the caller plans it again on
//!    the newest version or stops (`IcebergSink::commit_inner`), and the source is not
//!    acknowledged.
//! 4. Rewrite `version-hint.text` to N+1, then list once more: a writer that built on ours
//!    meanwhile may have written its hint before ours, so the hint is written again with the
//!    newest version. The hint is never written below a version listed before the write.
//!
//! Each step's listing starts after `metadata/v` (`metadata::newest_listed`): one request on
//! S3 and on local disk, whatever the number of manifests beside the metadata files (on local
//! disk their names are read and compared, none of them is `stat`ed: `storage/local.rs`).

use iceberg::spec::TableMetadata;
use object_store::ObjectStoreExt;

use crate::changelog::TableId;
use crate::sinks::iceberg::commit::publish;
use crate::sinks::iceberg::files::metadata::{self, metadata_location, Loaded};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

mod landing;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

use landing::{AfterCreate, BeforeCreate};

/// The newest metadata of the table at `location`, or `None` when it has none.
pub(crate) async fn load(
    warehouse: &Warehouse,
    location: &str,
) -> Result<Option<Loaded>, SinkError> {
    metadata::load_latest(warehouse, location).await
}

/// Publishes `metadata` as version `version` of its table (see the module doc for the steps).
pub(crate) async fn commit_version(
    warehouse: &Warehouse,
    table: &TableId,
    version: u64,
    metadata: TableMetadata,
) -> Result<Loaded, SinkError> {
    let location = metadata.location().to_owned();
    let file = metadata_location(&location, version);
    let listed = metadata::newest_listed(warehouse, &location).await?;
    match landing::before_create(version, listed) {
        BeforeCreate::Free => {}
        BeforeCreate::Taken { newest } => {
            tracing::info!(table = %table, version, newest, "a newer metadata version exists than the commit's base");
            let winner = metadata_location(&location, newest);
            return Err(publish::lost_to(warehouse, table, version, &winner).await);
        }
        BeforeCreate::Gone => {
            tracing::warn!(table = %table, version, location = %location, "the table's metadata files are gone");
            return Err(SinkError::CommitConflict {
                table: table.clone(),
                version,
            });
        }
    }
    if !publish::create_metadata_file(warehouse, table, &file, &metadata).await? {
        return Err(publish::lost_to(warehouse, table, version, &file).await);
    }
    let ours = Loaded {
        version,
        metadata,
        file,
    };
    let listed = metadata::newest_listed(warehouse, &location).await?;
    match landing::after_create(version, listed) {
        AfterCreate::Newest => {
            write_hint(warehouse, table, &location, version).await;
            Ok(ours)
        }
        AfterCreate::Beside { newest } => settle_beside(warehouse, table, ours, newest).await,
    }
}

/// Step 3 of the module doc: our `ours` was created, and version `newest` above it exists.
async fn settle_beside(
    warehouse: &Warehouse,
    table: &TableId,
    ours: Loaded,
    newest: u64,
) -> Result<Loaded, SinkError> {
    tracing::warn!(table = %table, version = ours.version, newest, file = %ours.file, "the commit's metadata landed beside a newer version (another writer committed and deleted old metadata files meanwhile); deleting it, the commit is not the table's");
    let deleted = match warehouse.path(&ours.file) {
        Ok(path) => warehouse
            .store()
            .delete(&path)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = deleted {
        // Left in place it is still no reader's current version (a newer one exists); the
        // maintenance sweep deletes versions older than the metadata log's oldest.
        tracing::warn!(table = %table, file = %ours.file, error = %e, "could not delete the metadata file of a commit that landed beside a newer version");
    }
    let newer_file = metadata_location(ours.metadata.location(), newest);
    Err(publish::lost_to(warehouse, table, ours.version, &newer_file).await)
}

/// Step 4 of the module doc: the hint, written again when a newer version appeared meanwhile.
async fn write_hint(warehouse: &Warehouse, table: &TableId, location: &str, version: u64) {
    publish::write_hint(warehouse, table, location, version).await;
    let listed = match metadata::newest_listed(warehouse, location).await {
        Ok(listed) => listed,
        Err(e) => {
            tracing::warn!(table = %table, error = %e, "could not list the metadata versions after writing the version hint");
            return;
        }
    };
    if let Some(newest) = landing::hint_again(version, listed) {
        publish::write_hint(warehouse, table, location, newest).await;
    }
}
