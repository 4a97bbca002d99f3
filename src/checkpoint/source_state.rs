//! A source's durable state: `<warehouse>/_cdcd/<pipeline>/source-state.json`, the object behind
//! [`SourceStateStore`] (MySQL keeps its schema history there, `sources/mysql/history.rs`).
//!
//! Why beside the checkpoints and not in them: a table's snapshot carries only what that table
//! committed, but the state describes every table at once and changes when no table commits (an
//! `ALTER TABLE` with no rows after it). It is written through the lease fence like the tables,
//! so a fenced-off daemon cannot overwrite what the new holder wrote. A write is one put (atomic
//! on local disk and S3).

use async_trait::async_trait;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use crate::sources::{SourceError, SourceStateStore};
use crate::storage::{StorageError, Warehouse};

/// The object's name under `_cdcd/<pipeline>/`.
pub const SOURCE_STATE_FILE: &str = "source-state.json";

/// One object of source state in the warehouse.
#[derive(Debug, Clone)]
pub struct SourceStateFile {
    warehouse: Warehouse,
    path: Path,
    location: String,
}

impl SourceStateFile {
    /// `_cdcd/<pipeline>/<name>` in `warehouse`.
    pub fn new(
        warehouse: &Warehouse,
        pipeline: &str,
        name: &str,
    ) -> Result<SourceStateFile, StorageError> {
        let location = warehouse.location(&["_cdcd", pipeline, name]);
        let path = warehouse.path(&location)?;
        Ok(SourceStateFile {
            warehouse: warehouse.clone(),
            path,
            location,
        })
    }

    fn error(&self, doing: &str, e: object_store::Error) -> SourceError {
        SourceError::Server {
            context: format!("{doing} {}", self.location),
            detail: e.to_string(),
        }
    }
}

#[async_trait]
impl SourceStateStore for SourceStateFile {
    async fn read(&self) -> Result<Option<Vec<u8>>, SourceError> {
        match self.warehouse.store().get(&self.path).await {
            Ok(got) => Ok(Some(
                got.bytes()
                    .await
                    .map_err(|e| self.error("reading", e))?
                    .to_vec(),
            )),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("reading", e)),
        }
    }

    async fn write(&self, bytes: Vec<u8>) -> Result<(), SourceError> {
        self.warehouse
            .store()
            .put(&self.path, PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|e| self.error("writing", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_replace_and_read_back() {
        let wh = Warehouse::from_url("memory://").unwrap();
        let file = SourceStateFile::new(&wh, "shop", "state.json").unwrap();
        assert!(file.location.ends_with("/_cdcd/shop/state.json"));
        assert_eq!(file.read().await.unwrap(), None);
        file.write(b"one".to_vec()).await.unwrap();
        file.write(b"two".to_vec()).await.unwrap();
        assert_eq!(file.read().await.unwrap(), Some(b"two".to_vec()));
    }
}
