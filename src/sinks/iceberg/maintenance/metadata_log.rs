//! The metadata log kept bounded: `write.metadata.previous-versions-max` (the metadata builder
//! trims `metadata-log` to it on every build) and `write.metadata.delete-after-commit.enabled`
//! (the `vN.metadata.json` files that left the log are deleted), both read from the table's
//! current properties (Iceberg-Java's `TableOperations` does the same after each commit).
//!
//! Order: a file is deleted only after the metadata without it in the log is committed, never
//! before (the commit may fail, and then the old metadata is still the newest one a reader or
//! the retry needs). A crash between the two leaves files nobody lists; [`sweep`] (a table's first
//! maintenance cycle in a process, then every ten minutes) removes every `vK.metadata.json` older than the oldest one the log names.

use std::collections::HashSet;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;

use super::properties::Retention;
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// The metadata files that left the log when `next` was committed on top of `prev` (when the
/// table's properties ask for their deletion; otherwise none). `keep_previous`: the catalog
/// names `prev`'s file as the previous metadata (the SQL catalog's
/// `previous_metadata_location`), so it stays whatever the log says.
pub fn left_the_log(prev: &Loaded, next: &Loaded, keep_previous: bool) -> Vec<String> {
    let props = next.metadata.properties();
    if !Retention::from_properties(props).is_ok_and(|r| r.delete_after_commit) {
        return Vec::new();
    }
    let kept: HashSet<&str> = next
        .metadata
        .metadata_log()
        .iter()
        .map(|l| l.metadata_file.as_str())
        .collect();
    let current = next.location();
    let previous = prev.location();
    std::iter::once(prev.location())
        .chain(
            prev.metadata
                .metadata_log()
                .iter()
                .map(|l| l.metadata_file.clone()),
        )
        .filter(|f| !kept.contains(f.as_str()) && *f != current)
        .filter(|f| !(keep_previous && *f == previous))
        .collect()
}

/// After a commit of `next` on `prev` landed: deletes the metadata files that left the log, in
/// the background (a failure only leaves a file for [`sweep`]; the commit stands).
pub fn delete_after_commit(
    warehouse: &Warehouse,
    prev: &Loaded,
    next: &Loaded,
    keep_previous: bool,
) {
    let doomed = left_the_log(prev, next, keep_previous);
    if doomed.is_empty() {
        return;
    }
    let warehouse = warehouse.clone();
    tokio::spawn(async move {
        if let Err(e) = delete_all(&warehouse, &doomed).await {
            tracing::warn!(error = %e, "could not delete a metadata file that left the metadata log; a maintenance cycle's sweep removes it");
        }
    });
}

/// Deletes at once at most this many files of one call: an object store answers a DELETE in
/// a round trip, and an expiry of a table committing every second deletes hundreds of files.
const CONCURRENT_DELETES: usize = 16;

/// Deletes `locations`, [`CONCURRENT_DELETES`] at a time and in no particular order (absent ones
/// count as deleted); returns how many were deleted or absent.
pub async fn delete_all(warehouse: &Warehouse, locations: &[String]) -> Result<usize, SinkError> {
    let paths = locations
        .iter()
        .map(|l| Ok((l.clone(), warehouse.path(l)?)))
        .collect::<Result<Vec<_>, SinkError>>()?;
    futures::stream::iter(paths)
        .map(|(location, path)| async move {
            match warehouse.store().delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(source) => Err(SinkError::Storage {
                    path: location,
                    source,
                }),
            }
        })
        .buffer_unordered(CONCURRENT_DELETES)
        .try_collect::<()>()
        .await?;
    Ok(locations.len())
}

/// Every object under `dir` (a location).
pub(super) async fn list(
    warehouse: &Warehouse,
    dir: &str,
) -> Result<Vec<object_store::ObjectMeta>, SinkError> {
    let prefix = warehouse.path(dir)?;
    warehouse
        .store()
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(|source| SinkError::Storage {
            path: dir.to_owned(),
            source,
        })
}

/// `…/v12.metadata.json` → 12.
pub fn version_of(location: &str) -> Option<u64> {
    let name = location.rsplit('/').next()?;
    name.strip_prefix('v')?
        .strip_suffix(".metadata.json")?
        .parse()
        .ok()
}

/// Deletes the metadata files of `loaded`'s table older than the oldest one its log names (left
/// by a crash between a commit and its deletions), when the table deletes after commit.
/// Returns how many were deleted. `keep_previous` (SQL catalog): the previous metadata, the
/// log's newest entry, is named by the catalog row and must stay; with an empty log it is not
/// known here, so nothing is swept. The current file is never older than the log's entries.
pub async fn sweep(
    warehouse: &Warehouse,
    loaded: &Loaded,
    keep_previous: bool,
) -> Result<usize, SinkError> {
    let props = loaded.metadata.properties();
    if !Retention::from_properties(props).is_ok_and(|r| r.delete_after_commit) {
        return Ok(0);
    }
    if keep_previous && loaded.metadata.metadata_log().is_empty() {
        return Ok(0);
    }
    let oldest = loaded
        .metadata
        .metadata_log()
        .iter()
        .filter_map(|l| version_of(&l.metadata_file))
        .min()
        .unwrap_or(loaded.version);
    let dir = format!("{}/metadata", loaded.metadata.location());
    let listed = list(warehouse, &dir).await?;
    let doomed: Vec<String> = listed
        .iter()
        .map(|o| warehouse.location_of(&o.location))
        .filter(|l| version_of(l).is_some_and(|v| v < oldest))
        .filter(|l| *l != loaded.file)
        .collect();
    delete_all(warehouse, &doomed).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_locations() {
        assert_eq!(version_of("s3://b/t/metadata/v12.metadata.json"), Some(12));
        assert_eq!(version_of("file:///w/t/metadata/snap-1.avro"), None);
        assert_eq!(version_of("file:///w/t/metadata/version-hint.text"), None);
    }

    /// A commit whose metadata log no longer names its base (trimmed): the base's file leaves
    /// the log, but a catalog that names it as the previous metadata keeps it.
    #[test]
    fn the_catalogs_previous_file_is_kept() {
        use std::collections::HashMap;
        use std::sync::Arc;

        use iceberg::spec::{
            FormatVersion, NestedField, PrimitiveType, Schema, TableMetadataBuilder, Type,
        };

        let table = crate::changelog::TableId::new("public", "t");
        let schema = Schema::builder()
            .with_fields(vec![Arc::new(NestedField::required(
                1,
                "id",
                Type::Primitive(PrimitiveType::Long),
            ))])
            .build()
            .unwrap();
        let props = HashMap::from([(
            "write.metadata.delete-after-commit.enabled".to_owned(),
            "true".to_owned(),
        )]);
        let meta = crate::sinks::iceberg::commit::publish::new_table(
            &table,
            "file:///w/t",
            schema,
            FormatVersion::V2,
            props,
        )
        .unwrap();
        let prev = Loaded {
            version: 4,
            file: "file:///w/t/metadata/v4.metadata.json".into(),
            metadata: meta.clone(),
        };
        // Built without the base's location: the new log does not name it.
        let next = Loaded {
            version: 5,
            file: "file:///w/t/metadata/v5.metadata.json".into(),
            metadata: TableMetadataBuilder::new_from_metadata(meta, None)
                .build()
                .unwrap()
                .metadata,
        };
        assert_eq!(left_the_log(&prev, &next, false), vec![prev.file.clone()]);
        assert!(left_the_log(&prev, &next, true).is_empty());
    }
}
