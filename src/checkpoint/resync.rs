//! Resync requests: `<warehouse>/_cdcd/<pipeline>/resync/<namespace>.<table>.json`, one per table
//! that `cdcd resync --table T` asked to copy again.
//!
//! Where it sits: beside the pipeline's other state (the lease, the progress file). The command
//! writes a request and exits; the daemon holding the lease finds it (it polls this folder, and
//! reads it at every start), restarts its pipeline with the table marked for a new copy, and the
//! sink copies the table into a new lineage that replaces the old one in one commit
//! (`sinks/iceberg/resync/mod.rs`). The request is removed only once the table's live metadata says
//! the new lineage replaced it (the sink's `Done`), so a crash anywhere in between finds the
//! request again and the copy resumes from the new lineage's own checkpoint.
//!
//! Each request carries an id, fresh per request: it names the new lineage's location
//! (`<table>/resync-<id>/`) and is recorded in the table's properties by the swap
//! (`cdcd.resync-id`), which is how a restart tells a finished resync from one to carry on. The
//! request is created create-if-absent, so two commands racing for one table leave one request,
//! and a second request for a table under resync is refused rather than restarting the copy.

use bytes::Bytes;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use serde::{Deserialize, Serialize};

use crate::changelog::TableId;
use crate::storage::{put_create, Created, StorageError, Warehouse};

/// A resync request could not be read, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum ResyncError {
    #[error("resync request {path}: storage error: {source}")]
    Storage {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error("resync request {path} is not a request cdcd wrote ({detail}); remove it and run `cdcd resync` again")]
    Unreadable { path: String, detail: String },
    #[error(transparent)]
    Location(#[from] StorageError),
}

/// One table to copy again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncRequest {
    pub namespace: String,
    pub name: String,
    /// Names the new lineage (`resync-<id>`), fresh per request.
    pub id: String,
    /// Wall-clock time of the request, for people reading the file.
    #[serde(default)]
    pub requested_at: String,
    /// Set by the daemon before it copies the table beside the streaming pipeline: the position
    /// the copy is complete at, where the pipeline holds its acknowledgements until the copy is
    /// done (`pipeline/resync.rs`). A restart resumes such a copy from there, never later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_at: Option<String>,
    /// Set when cdcd requested the resync itself (`source.schema_change = "resync"`): the
    /// position of the transaction whose schema change the table could not take. The source had
    /// committed it before this request was written, so every snapshot the lineage is copied at
    /// holds it, and the replay skips the table's changes up to it (`pipeline/resync.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_at: Option<String>,
}

impl ResyncRequest {
    /// A new request for `table` with a fresh id.
    pub fn new(table: &TableId) -> ResyncRequest {
        let id = uuid::Uuid::new_v4().simple().to_string();
        ResyncRequest {
            namespace: table.namespace.clone(),
            name: table.name.clone(),
            // 12 hex digits are plenty to tell one table's resyncs apart; short paths read better.
            id: id.chars().take(12).collect(),
            requested_at: unix_now(),
            held_at: None,
            received_at: None,
        }
    }

    pub fn table(&self) -> TableId {
        TableId::new(self.namespace.clone(), self.name.clone())
    }

    /// [`ResyncRequest::held_at`] as a position; `Err` names what does not parse.
    pub fn held_position(&self) -> Result<Option<crate::changelog::Position>, String> {
        self.held_at
            .as_deref()
            .map(|at| at.parse().map_err(|e| format!("held_at {at:?}: {e}")))
            .transpose()
    }

    /// [`ResyncRequest::received_at`] as a position; `Err` names what does not parse.
    pub fn received_position(&self) -> Result<Option<crate::changelog::Position>, String> {
        self.received_at
            .as_deref()
            .map(|at| at.parse().map_err(|e| format!("received_at {at:?}: {e}")))
            .transpose()
    }
}

fn unix_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{now} (seconds since the Unix epoch)")
}

/// What [`ResyncStore::request`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requested {
    /// The request is stored.
    Created(ResyncRequest),
    /// A request for the table is stored already (its resync has not finished): this one.
    Pending(ResyncRequest),
}

/// `<warehouse>/_cdcd/<pipeline>/resync/` and the store it lives in.
#[derive(Debug, Clone)]
pub struct ResyncStore {
    warehouse: Warehouse,
    /// The folder's location (`…/resync`).
    location: String,
}

impl ResyncStore {
    pub fn new(warehouse: &Warehouse, pipeline: &str) -> ResyncStore {
        ResyncStore {
            warehouse: warehouse.clone(),
            location: warehouse.location(&["_cdcd", pipeline, "resync"]),
        }
    }

    /// Where `table`'s request lives.
    pub fn request_location(&self, table: &TableId) -> String {
        format!("{}/{}.{}.json", self.location, table.namespace, table.name)
    }

    fn storage(&self, location: &str, source: object_store::Error) -> ResyncError {
        ResyncError::Storage {
            path: location.to_owned(),
            source,
        }
    }

    /// Stores a request for `table`, unless one is pending (then that one is the answer).
    pub async fn request(&self, table: &TableId) -> Result<Requested, ResyncError> {
        self.request_as(ResyncRequest::new(table)).await
    }

    /// Stores `request`, unless one for its table is pending (then that one is the answer).
    pub async fn request_as(&self, request: ResyncRequest) -> Result<Requested, ResyncError> {
        let location = self.request_location(&request.table());
        let path = self.warehouse.path(&location)?;
        let body = serde_json::to_vec_pretty(&request).map_err(|e| ResyncError::Unreadable {
            path: location.clone(),
            detail: e.to_string(),
        })?;
        let created = put_create(self.warehouse.store().as_ref(), &path, Bytes::from(body))
            .await
            .map_err(|e| self.storage(&location, e))?;
        match created {
            Created::Created | Created::AlreadyOurs => Ok(Requested::Created(request)),
            Created::Conflict => Ok(Requested::Pending(self.read(&location).await?)),
        }
    }

    async fn read(&self, location: &str) -> Result<ResyncRequest, ResyncError> {
        let path = self.warehouse.path(location)?;
        let bytes = self
            .warehouse
            .store()
            .get(&path)
            .await
            .map_err(|e| self.storage(location, e))?
            .bytes()
            .await
            .map_err(|e| self.storage(location, e))?;
        serde_json::from_slice(&bytes).map_err(|e| ResyncError::Unreadable {
            path: location.to_owned(),
            detail: e.to_string(),
        })
    }

    /// Every pending request, in path order.
    pub async fn list(&self) -> Result<Vec<ResyncRequest>, ResyncError> {
        use futures::TryStreamExt;
        let prefix = self.warehouse.path(&self.location)?;
        let listed: Vec<object_store::ObjectMeta> = self
            .warehouse
            .store()
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| self.storage(&self.location, e))?;
        let mut locations: Vec<String> = listed
            .iter()
            .filter(|o| o.location.as_ref().ends_with(".json"))
            .map(|o| self.warehouse.location_of(&o.location))
            .collect();
        locations.sort();
        let mut requests = Vec::with_capacity(locations.len());
        for location in locations {
            match self.read(&location).await {
                Ok(r) => requests.push(r),
                // Removed between the listing and the read: finished meanwhile.
                Err(ResyncError::Storage {
                    source: object_store::Error::NotFound { .. },
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(requests)
    }

    /// Rewrites `request` in place (the daemon recorded where it holds the stream). Only the
    /// daemon holding the lease writes a pending request, so a plain overwrite is safe.
    pub async fn update(&self, request: &ResyncRequest) -> Result<(), ResyncError> {
        let location = self.request_location(&request.table());
        let path = self.warehouse.path(&location)?;
        let body = serde_json::to_vec_pretty(request).map_err(|e| ResyncError::Unreadable {
            path: location.clone(),
            detail: e.to_string(),
        })?;
        self.warehouse
            .store()
            .put(&path, Bytes::from(body).into())
            .await
            .map_err(|e| self.storage(&location, e))?;
        Ok(())
    }

    /// Replaces `request` by a fresh one for the same table (a new id, so a new lineage, and no
    /// held position): the resync starts again from scratch, copied at the next start. The
    /// position the old one was requested past still holds for the fresh one, written later.
    pub async fn start_over(&self, request: &ResyncRequest) -> Result<ResyncRequest, ResyncError> {
        let fresh = ResyncRequest {
            received_at: request.received_at.clone(),
            ..ResyncRequest::new(&request.table())
        };
        self.update(&fresh).await?;
        Ok(fresh)
    }

    /// Removes `request` (its resync finished). Absent already is fine.
    pub async fn remove(&self, request: &ResyncRequest) -> Result<(), ResyncError> {
        let location = self.request_location(&request.table());
        let path: Path = self.warehouse.path(&location)?;
        match self.warehouse.store().delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.storage(&location, e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_request_finds_the_pending_one_and_remove_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let warehouse = Warehouse::from_url(&url).unwrap();
        let store = ResyncStore::new(&warehouse, "p");
        let t = TableId::new("public", "orders");
        let Requested::Created(first) = store.request(&t).await.unwrap() else {
            panic!("first request not created");
        };
        assert_eq!(first.table(), t);
        assert_eq!(
            store.request(&t).await.unwrap(),
            Requested::Pending(first.clone())
        );
        assert_eq!(store.list().await.unwrap(), vec![first.clone()]);
        store.remove(&first).await.unwrap();
        store.remove(&first).await.unwrap();
        assert!(store.list().await.unwrap().is_empty());
        let Requested::Created(second) = store.request(&t).await.unwrap() else {
            panic!("request after removal not created");
        };
        assert_ne!(second.id, first.id);
    }
}
