//! Storage: one `object_store` for a warehouse URL, and the mapping between the absolute locations
//! written into table metadata (`file:///wh/ns/t/data/x.parquet`) and object_store paths.
//!
//! Sits under the sinks: table writers read and write every file (data, deletes, manifests,
//! metadata) through a [`Warehouse`]. cdcd has one storage stack (DESIGN.md, "One storage stack"):
//! object_store 0.13, which parquet already uses. iceberg's own `Storage` trait is `typetag`-serde
//! (an implementation must be serializable and registered), so instead of implementing it the
//! Iceberg sink lets iceberg's Avro writers write into iceberg's in-memory `FileIO` and puts the
//! bytes through object_store (see `sinks/iceberg/manifest.rs`).
//!
//! Supported URLs: `file:///abs/path` (local disk; directories are created as needed) and
//! `memory://` (in-process, unit tests only). `s3://` is rejected with a clear message until S3
//! support lands.

use std::sync::Arc;

use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use url::Url;

/// A warehouse URL could not be turned into a store, or a location lies outside the warehouse.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("warehouse {url}: {scheme}:// warehouses are not supported yet; use a local path (file:///…)")]
    Unsupported { url: String, scheme: String },
    #[error("warehouse {url} is not a valid URL: {detail}")]
    BadUrl { url: String, detail: String },
    #[error("location {location} is not inside warehouse {warehouse}")]
    Outside { location: String, warehouse: String },
}

/// The store behind a warehouse URL.
#[derive(Debug, Clone)]
pub struct Warehouse {
    store: Arc<dyn ObjectStore>,
    /// The warehouse URL without a trailing slash, e.g. `file:///var/lib/cdcd/warehouse`.
    url: String,
    /// `file` or `memory`: every location handed to [`Warehouse::path`] must use it.
    scheme: String,
}

impl Warehouse {
    /// Opens the store for `url` (`file:///abs/path` or `memory://[name]`).
    pub fn from_url(url: &str) -> Result<Warehouse, StorageError> {
        let parsed = Url::parse(url).map_err(|e| StorageError::BadUrl {
            url: url.to_owned(),
            detail: e.to_string(),
        })?;
        let store: Arc<dyn ObjectStore> = match parsed.scheme() {
            // Root "/" so that the path of every absolute location is the location's URL path;
            // LocalFileSystem creates missing parent directories on put.
            "file" => Arc::new(LocalFileSystem::new()),
            "memory" => Arc::new(InMemory::new()),
            other => {
                return Err(StorageError::Unsupported {
                    url: url.to_owned(),
                    scheme: other.to_owned(),
                })
            }
        };
        if parsed.scheme() == "file" && parsed.host_str().is_some_and(|h| !h.is_empty()) {
            return Err(StorageError::BadUrl {
                url: url.to_owned(),
                detail: "a file URL needs an absolute path: file:///abs/path".into(),
            });
        }
        Ok(Warehouse {
            store,
            url: url.trim_end_matches('/').to_owned(),
            scheme: parsed.scheme().to_owned(),
        })
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The warehouse URL without a trailing slash.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The absolute location of `parts` joined under the warehouse, e.g. `file:///wh/ns/t`.
    pub fn location(&self, parts: &[&str]) -> String {
        let mut s = self.url.clone();
        for p in parts {
            s.push('/');
            s.push_str(p.trim_matches('/'));
        }
        s
    }

    /// The object_store path of an absolute location inside this warehouse.
    pub fn path(&self, location: &str) -> Result<Path, StorageError> {
        let outside = || StorageError::Outside {
            location: location.to_owned(),
            warehouse: self.url.clone(),
        };
        let parsed = Url::parse(location).map_err(|_| outside())?;
        if parsed.scheme() != self.scheme {
            return Err(outside());
        }
        // memory://name/a/b has host "name": keep it as the first segment.
        let mut url_path = String::new();
        if let Some(host) = parsed.host_str() {
            url_path.push_str(host);
        }
        url_path.push_str(parsed.path());
        Path::from_url_path(url_path.trim_start_matches('/')).map_err(|_| outside())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

    #[test]
    fn rejects_s3_with_a_clear_message() {
        let err = Warehouse::from_url("s3://bucket/wh").unwrap_err();
        assert!(err.to_string().contains("not supported yet"), "{err}");
        assert!(Warehouse::from_url("not a url").is_err());
    }

    #[test]
    fn maps_locations_to_paths() {
        let w = Warehouse::from_url("file:///tmp/wh/").unwrap();
        assert_eq!(w.url(), "file:///tmp/wh");
        let loc = w.location(&["ns", "t", "metadata"]);
        assert_eq!(loc, "file:///tmp/wh/ns/t/metadata");
        assert_eq!(w.path(&loc).unwrap().as_ref(), "tmp/wh/ns/t/metadata");
        assert!(w.path("s3://x/y").is_err());
    }

    #[tokio::test]
    async fn local_store_creates_dirs_and_create_mode_refuses_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let w = Warehouse::from_url(&url).unwrap();
        let path = w.path(&w.location(&["a", "b", "v1.json"])).unwrap();
        let opts = || PutOptions::from(PutMode::Create);
        w.store()
            .put_opts(&path, PutPayload::from_static(b"1"), opts())
            .await
            .unwrap();
        assert!(dir.path().join("a/b/v1.json").exists());
        let again = w
            .store()
            .put_opts(&path, PutPayload::from_static(b"2"), opts())
            .await;
        assert!(matches!(
            again,
            Err(object_store::Error::AlreadyExists { .. })
        ));
    }

    #[tokio::test]
    async fn memory_store_round_trips() {
        let w = Warehouse::from_url("memory://").unwrap();
        let path = w.path(&w.location(&["ns", "t", "x"])).unwrap();
        w.store()
            .put(&path, PutPayload::from_static(b"hi"))
            .await
            .unwrap();
        let got = w.store().get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"hi");
    }
}
