//! Finding and loading a table's newest metadata file: `metadata/v<N>.metadata.json`.
//!
//! `version-hint.text` is only a hint (it is written after the metadata file, so a crash can leave
//! it one or more versions behind): loading starts at the hinted N and probes N+1, N+2… until a
//! version is absent. Without a hint, the newest N is found by listing `metadata/`.

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
    serde_json::from_slice(&bytes).map_err(|e| SinkError::Corrupt {
        path: location.to_owned(),
        detail: e.to_string(),
    })
}

/// The newest metadata of the table at `table` (its location), or `None` when it has none.
pub(crate) async fn load_latest(
    warehouse: &Warehouse,
    table: &str,
) -> Result<Option<Loaded>, SinkError> {
    let Some(mut version) = newest_version_hint(warehouse, table).await? else {
        return Ok(None);
    };
    while exists(warehouse, &metadata_location(table, version + 1)).await? {
        version += 1;
    }
    let location = metadata_location(table, version);
    let metadata = read_metadata(warehouse, &location).await?;
    Ok(Some(Loaded {
        version,
        metadata,
        file: location,
    }))
}

/// The hinted version when the hint and its file exist, else the newest listed one.
async fn newest_version_hint(warehouse: &Warehouse, table: &str) -> Result<Option<u64>, SinkError> {
    let hint = hint_location(table);
    match read(warehouse, &hint).await {
        Ok(bytes) => {
            let hinted = std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            if let Some(v) = hinted {
                if exists(warehouse, &metadata_location(table, v)).await? {
                    return Ok(Some(v));
                }
            }
        }
        Err(SinkError::Storage {
            source: object_store::Error::NotFound { .. },
            ..
        }) => {}
        Err(e) => return Err(e),
    }
    newest_listed(warehouse, table).await
}

async fn newest_listed(warehouse: &Warehouse, table: &str) -> Result<Option<u64>, SinkError> {
    let dir = format!("{table}/metadata");
    let prefix = warehouse.path(&dir)?;
    let objects: Vec<_> = warehouse
        .store()
        .list(Some(&prefix))
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
