//! Finding and loading a table's newest metadata file: `metadata/v<N>.metadata.json`.
//!
//! The newest N is the highest one listed in `metadata/`, then probed past (N+1, N+2… until one
//! is absent). `version-hint.text` is not read: it is only a hint, written after the metadata
//! file (a crash leaves it behind), and another writer's deletion of old metadata files
//! (`write.metadata.delete-after-commit.enabled`) can leave a gap above a stale hint that a
//! probe from the hint stops at, reading an old version as the newest. cdcd still writes the
//! hint for readers that cannot list (`catalog/filesystem.rs`).

use futures::TryStreamExt;
use iceberg::spec::TableMetadata;
use object_store::ObjectStoreExt;

use super::manifest::read;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// `metadata/version-hint.text` under a table location.
pub(crate) fn hint_location(table: &str) -> String {
    format!("{table}/metadata/version-hint.text")
}

/// `metadata/v<N>.metadata.json` under a table location.
pub(crate) fn metadata_location(table: &str, version: u64) -> String {
    format!("{table}/metadata/v{version}.metadata.json")
}

/// A loaded metadata file, where it is, and its version number.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    /// N of `v<N>.metadata.json`; for a file another writer named otherwise (a catalog's
    /// `00003-<uuid>.metadata.json`), the number it starts with, else the metadata log's length
    /// + 1. The next commit's file is named from it.
    pub version: u64,
    pub metadata: TableMetadata,
    /// The metadata file's location (what a catalog's `metadata_location` names).
    pub file: String,
}

impl Loaded {
    /// The metadata file's location.
    pub fn location(&self) -> String {
        self.file.clone()
    }
}

/// The version a metadata file's name gives: `v12.metadata.json` → 12, Iceberg-Java's
/// `00012-<uuid>.metadata.json` → 12; `None` for other names.
pub(crate) fn version_of_file(location: &str) -> Option<u64> {
    let name = location.rsplit('/').next()?;
    if let Some(v) = parse_version(name) {
        return Some(v);
    }
    let (digits, rest) = name.split_once('-')?;
    (rest.ends_with(".metadata.json") && !digits.is_empty())
        .then(|| digits.parse().ok())
        .flatten()
}

/// Reads and parses the metadata file at `location`.
pub(crate) async fn read_metadata(
    warehouse: &Warehouse,
    location: &str,
) -> Result<TableMetadata, SinkError> {
    let bytes = read(warehouse, location).await?;
    crate::sinks::iceberg::variant::parse_metadata(&bytes).map_err(|e| SinkError::Corrupt {
        path: location.to_owned(),
        detail: e.to_string(),
    })
}

/// The newest metadata of the table at `table` (its location), or `None` when it has none.
pub(crate) async fn load_latest(
    warehouse: &Warehouse,
    table: &str,
) -> Result<Option<Loaded>, SinkError> {
    // The newest version is never deleted by a writer (only versions that left a newer one's
    // metadata log are), but a version cdcd found beside a newer one is (`catalog/filesystem.rs`):
    // a file listed as the newest and gone when read is listed again.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let Some(mut version) = newest_listed(warehouse, table).await? else {
            return Ok(None);
        };
        while exists(warehouse, &metadata_location(table, version + 1)).await? {
            version += 1;
        }
        let location = metadata_location(table, version);
        match read_metadata(warehouse, &location).await {
            Ok(metadata) => {
                return Ok(Some(Loaded {
                    version,
                    metadata,
                    file: location,
                }))
            }
            Err(SinkError::Storage {
                source: object_store::Error::NotFound { .. },
                ..
            }) if attempts < LOAD_ATTEMPTS => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Listings tried by [`load_latest`] when the newest listed file is gone before it is read.
const LOAD_ATTEMPTS: u32 = 3;

/// The highest N of the `v<N>.metadata.json` files listed under the table at `table` (its
/// location), `None` when there is none. The listing starts after `metadata/v` (S3's
/// `start-after`): the manifests and manifest lists beside them (`snap-…`, `<uuid>-m0.avro`) sort
/// before it and are not returned, so one request covers the versions a table keeps.
pub(crate) async fn newest_listed(
    warehouse: &Warehouse,
    table: &str,
) -> Result<Option<u64>, SinkError> {
    let dir = format!("{table}/metadata");
    let prefix = warehouse.path(&dir)?;
    let offset = warehouse.path(&format!("{dir}/v"))?;
    let objects: Vec<_> = warehouse
        .store()
        .list_with_offset(Some(&prefix), &offset)
        .try_collect()
        .await
        .map_err(|source| SinkError::Storage { path: dir, source })?;
    Ok(objects
        .iter()
        .filter_map(|o| o.location.filename())
        .filter_map(parse_version)
        .max())
}

/// `v12.metadata.json` → 12.
fn parse_version(name: &str) -> Option<u64> {
    name.strip_prefix('v')?
        .strip_suffix(".metadata.json")?
        .parse()
        .ok()
}

async fn exists(warehouse: &Warehouse, location: &str) -> Result<bool, SinkError> {
    let path = warehouse.path(location)?;
    match warehouse.store().head(&path).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(source) => Err(SinkError::Storage {
            path: location.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        assert_eq!(parse_version("v12.metadata.json"), Some(12));
        assert_eq!(parse_version("version-hint.text"), None);
        assert_eq!(parse_version("v1.metadata.json.tmp"), None);
    }

    #[test]
    fn versions_of_catalog_named_files() {
        assert_eq!(
            version_of_file("file:///w/t/metadata/v7.metadata.json"),
            Some(7)
        );
        assert_eq!(
            version_of_file("s3://b/t/metadata/00012-0f0e-4a.metadata.json"),
            Some(12)
        );
        assert_eq!(version_of_file("s3://b/t/metadata/snap-1-2.avro"), None);
    }
}
