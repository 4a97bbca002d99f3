//! Storage: one `object_store` for a warehouse URL, and the mapping between the absolute locations
//! written into table metadata (`s3://bucket/wh/ns/t/data/x.parquet`) and object_store paths.
//!
//! Sits under the sinks and the checkpoint lease: table writers read and write every file (data,
//! deletes, manifests, metadata) and the lease lives through a [`Warehouse`]. cdcd has one storage
//! stack (`docs/architecture.md`, "Decisions, briefly"): object_store 0.13, which parquet
//! already uses.
//!
//! Why iceberg's `FileIO` is not served by an object_store adapter: iceberg 0.10's `Storage`
//! trait is `typetag`-serde (an implementation must be serializable and registered globally, and
//! `FileIO` rebuilds it from a scheme + properties map, so it cannot carry our configured client).
//! Instead the Iceberg sink lets iceberg's Avro writers write into iceberg's in-memory `FileIO`
//! and puts the bytes through this store (see `sinks/iceberg/files/manifest.rs`); iceberg never
//! opens a network connection, and every byte cdcd writes goes through the one store built here,
//! with its retries, timeouts and credentials.
//!
//! Supported URLs: `file:///abs/path` (local disk; directories are created as needed),
//! `s3://bucket/prefix` (see [`s3`]: `[sink.s3]`, then the `AWS_*` environment) and `memory://`
//! (in-process, unit tests only). Every store is wrapped in [`LargePuts`], which turns a large
//! single put into a multipart upload, over [`CountedRequests`], which counts the requests sent
//! (`cdcd_object_store_requests_total{op}`); local disk is [`LocalFiles`], which writes a small
//! file under a fresh name ([`fresh`]) in place. Every commit point (a create-if-absent put) goes through
//! [`put_create`] (`publish.rs`), which also recognises a retried create that found its own bytes.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use url::Url;

pub mod cleanup;
mod fence;
mod large;
pub mod layer;
mod local;
mod publish;
pub mod requests;
pub mod s3;

use s3::S3Config;

pub use fence::{Fence, Fenced, FencedStore};
pub use large::LargePuts;
pub use local::{fresh, LocalFiles};
#[cfg(test)]
pub(crate) use publish::LostAnswer;
pub use publish::{put_create, Created};
pub use requests::CountedRequests;

/// A warehouse URL could not be turned into a store, or a location lies outside the warehouse.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("warehouse {url}: {scheme}:// warehouses are not supported; use file:///path or s3://bucket/prefix")]
    Unsupported { url: String, scheme: String },
    #[error("warehouse {url}: cannot set up the S3 client: {detail}")]
    S3 { url: String, detail: String },
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
    /// `file`, `s3` or `memory`: every location handed to [`Warehouse::path`] must use it.
    scheme: String,
    /// `s3`: the bucket; a location's host must be it, and it is not part of the store path.
    bucket: Option<String>,
    /// The lease fence every write passes ([`Warehouse::fenced`]); `None`: unfenced.
    fence: Option<Fence>,
}

impl Warehouse {
    /// Opens the store for `url` (`file:///abs/path`, `s3://bucket/prefix` with settings from the
    /// `AWS_*` environment only, or `memory://[name]`).
    pub fn from_url(url: &str) -> Result<Warehouse, StorageError> {
        Warehouse::open(url, &S3Config::default())
    }

    /// Opens the store for `url`; an `s3://` warehouse uses `s3` (`[sink.s3]`) before `AWS_*`.
    pub fn open(url: &str, s3_config: &S3Config) -> Result<Warehouse, StorageError> {
        let parsed = Url::parse(url).map_err(|e| StorageError::BadUrl {
            url: url.to_owned(),
            detail: e.to_string(),
        })?;
        let store: Arc<dyn ObjectStore> = match parsed.scheme() {
            // Root "/" so that the path of every absolute location is the location's URL path;
            // LocalFileSystem creates missing parent directories on put.
            "file" => Arc::new(LargePuts::new(CountedRequests::new(LocalFiles::new()))),
            "memory" => Arc::new(LargePuts::new(CountedRequests::new(InMemory::new()))),
            "s3" => Arc::new(LargePuts::new(CountedRequests::new(s3::build(
                &parsed, s3_config,
            )?))),
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
        let bucket =
            (parsed.scheme() == "s3").then(|| parsed.host_str().unwrap_or_default().to_owned());
        Ok(Warehouse {
            store,
            url: url.trim_end_matches('/').to_owned(),
            scheme: parsed.scheme().to_owned(),
            bucket,
            fence: None,
        })
    }

    /// This warehouse with every write going through `fence` (fence.rs): what the sinks write
    /// while the pipeline holds its lease.
    pub fn fenced(mut self, fence: Fence) -> Warehouse {
        self.store = Arc::new(FencedStore::new(self.store, fence.clone()));
        self.fence = Some(fence);
        self
    }

    /// This warehouse over another store (tests put fault-injecting wrappers in between).
    #[cfg(test)]
    pub(crate) fn with_store(mut self, store: Arc<dyn ObjectStore>) -> Warehouse {
        self.store = store;
        self
    }

    /// The fence writes go through, if any.
    pub fn fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }

    /// The lease epoch writes are fenced with; 0 when unfenced (tools, tests).
    pub fn lease_epoch(&self) -> u64 {
        self.fence.as_ref().map_or(0, Fence::epoch)
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
        // Callers pass names (namespace, table, file), never URLs: joining keeps them inside.
        let mut s = self.url.clone();
        for p in parts {
            s.push('/');
            s.push_str(p.trim_matches('/'));
        }
        s
    }

    /// The absolute location of a store path (the inverse of [`Warehouse::path`]).
    pub fn location_of(&self, path: &Path) -> String {
        match &self.bucket {
            Some(bucket) => format!("{}://{bucket}/{path}", self.scheme),
            None if self.scheme == "memory" => format!("memory://{path}"),
            None => format!("{}:///{path}", self.scheme),
        }
    }

    /// Whether the warehouse is on local disk (`file://`), where reading bytes costs more than
    /// making requests.
    pub fn is_local_disk(&self) -> bool {
        self.scheme == "file"
    }

    /// The local file of a location in a `file://` warehouse; `None` for other stores.
    pub fn local_file(&self, location: &str) -> Option<std::path::PathBuf> {
        if self.scheme != "file" {
            return None;
        }
        let path = self.path(location).ok()?;
        Some(std::path::PathBuf::from(format!("/{}", path.as_ref())))
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
        let mut url_path = String::new();
        match &self.bucket {
            // s3://bucket/a/b: the store is the bucket's, so the path is `a/b`.
            Some(bucket) => {
                if parsed.host_str() != Some(bucket.as_str()) {
                    return Err(outside());
                }
            }
            // memory://name/a/b has host "name": keep it as the first segment.
            None => {
                if let Some(host) = parsed.host_str() {
                    url_path.push_str(host);
                }
            }
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
    fn rejects_unknown_schemes_with_a_clear_message() {
        let err = Warehouse::from_url("gs://bucket/wh").unwrap_err();
        assert!(err.to_string().contains("not supported"), "{err}");
        assert!(Warehouse::from_url("not a url").is_err());
    }

    #[test]
    fn maps_s3_locations_to_bucket_relative_paths() {
        let cfg = S3Config {
            endpoint: Some("http://127.0.0.1:1".into()),
            region: Some("us-east-1".into()),
            access_key_id: Some("k".into()),
            secret_access_key: Some("s".into()),
            allow_http: None,
            ..S3Config::default()
        };
        let w = Warehouse::open("s3://bkt/pre/fix/", &cfg).unwrap();
        assert_eq!(w.url(), "s3://bkt/pre/fix");
        let loc = w.location(&["ns", "t", "metadata", "v1.metadata.json"]);
        assert_eq!(
            w.path(&loc).unwrap().as_ref(),
            "pre/fix/ns/t/metadata/v1.metadata.json"
        );
        assert!(w.path("s3://other/pre/fix/x").is_err());
        assert_eq!(w.location_of(&w.path(&loc).unwrap()), loc);
        assert!(w.path("file:///pre/fix/x").is_err());
    }

    #[test]
    fn maps_locations_to_paths() {
        let w = Warehouse::from_url("file:///tmp/wh/").unwrap();
        assert_eq!(w.url(), "file:///tmp/wh");
        let loc = w.location(&["ns", "t", "metadata"]);
        assert_eq!(loc, "file:///tmp/wh/ns/t/metadata");
        assert_eq!(w.path(&loc).unwrap().as_ref(), "tmp/wh/ns/t/metadata");
        assert_eq!(w.location_of(&w.path(&loc).unwrap()), loc);
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
