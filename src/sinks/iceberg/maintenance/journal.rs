//! The expiry in progress: before an expiry commits `v<N+1>`, it records the metadata it expires
//! from (`v<N>`'s location) at `<warehouse>/_cdcd/<pipeline>/maintenance/<namespace>/<table>.json`
//! (pipeline state, outside the table: another engine's orphan removal must not take it), and
//! removes the record once the files the expired snapshots alone reached are deleted. A crash in
//! between leaves the record; the next cycle reads `v<N>` again and deletes what it reached that
//! the table's current snapshots do not (nothing, if the commit never landed).

use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::sinks::SinkError;
use crate::storage::Warehouse;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Expiring {
    /// The metadata file the expiry started from.
    pub before: String,
}

/// Where the record of `namespace.table` lives for `pipeline`.
pub fn location(warehouse: &Warehouse, pipeline: &str, namespace: &str, table: &str) -> String {
    warehouse.location(&[
        "_cdcd",
        pipeline,
        "maintenance",
        namespace,
        &format!("{table}.json"),
    ])
}

fn storage(location: &str) -> impl FnOnce(object_store::Error) -> SinkError + '_ {
    move |source| SinkError::Storage {
        path: location.to_owned(),
        source,
    }
}

pub async fn write(
    warehouse: &Warehouse,
    location: &str,
    record: &Expiring,
) -> Result<(), SinkError> {
    let json = serde_json::to_vec(record).map_err(|e| SinkError::Corrupt {
        path: location.to_owned(),
        detail: e.to_string(),
    })?;
    let path = warehouse.path(location)?;
    warehouse
        .store()
        .put(&path, PutPayload::from(json))
        .await
        .map_err(storage(location))?;
    Ok(())
}

/// The record, if one is left (an unreadable one is reported, not guessed at).
pub async fn read(warehouse: &Warehouse, location: &str) -> Result<Option<Expiring>, SinkError> {
    let path = warehouse.path(location)?;
    let got = match warehouse.store().get(&path).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(storage(location)(e)),
    };
    let bytes = got.bytes().await.map_err(storage(location))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| SinkError::Corrupt {
            path: location.to_owned(),
            detail: format!("{e}; delete the file (only leftovers of an interrupted expiry are at stake: `cdcd cleanup` finds them)"),
        })
}

pub async fn remove(warehouse: &Warehouse, location: &str) -> Result<(), SinkError> {
    let path = warehouse.path(location)?;
    match warehouse.store().delete(&path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(storage(location)(e)),
    }
}
