//! Object I/O for a Paimon table's files, with every error naming the path.
//!
//! Every other module of the sink reads and writes through these few calls, so a missing object
//! (`Ok(None)` on read, nothing to do on delete) and a storage failure mean the same everywhere.
//! The one create-if-absent write, a snapshot's or a schema's, goes through
//! `storage::put_create` instead (`publish.rs`, `table.rs`).

use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload};

use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// The error of a storage call on the object at `path`.
pub fn storage(path: &str) -> impl FnOnce(object_store::Error) -> SinkError + '_ {
    move |source| SinkError::Storage {
        path: path.to_owned(),
        source,
    }
}

/// Reads an object; `Ok(None)` when it does not exist.
pub async fn read(w: &Warehouse, location: &str) -> Result<Option<Bytes>, SinkError> {
    let path = w.path(location)?;
    match w.store().get(&path).await {
        Ok(r) => Ok(Some(r.bytes().await.map_err(storage(location))?)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(storage(location)(e)),
    }
}

pub async fn put(w: &Warehouse, location: &str, data: Vec<u8>) -> Result<(), SinkError> {
    let path = w.path(location)?;
    w.store()
        .put(&path, PutPayload::from(data))
        .await
        .map_err(storage(location))?;
    Ok(())
}

/// Copies the object at `from` to `to`, replacing what is there (server-side on S3, a hard link
/// on local disk where it can).
pub async fn copy(w: &Warehouse, from: &str, to: &str) -> Result<(), SinkError> {
    let (source, target) = (w.path(from)?, w.path(to)?);
    w.store()
        .copy(&source, &target)
        .await
        .map_err(storage(from))
}

pub async fn delete(w: &Warehouse, location: &str) -> Result<(), SinkError> {
    let path = w.path(location)?;
    match w.store().delete(&path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(storage(location)(e)),
    }
}

/// The object at `location` does not hold what the format says it must.
pub fn corrupt(location: &str, detail: impl ToString) -> SinkError {
    SinkError::Corrupt {
        path: location.to_owned(),
        detail: detail.to_string(),
    }
}

/// The JSON object at `loc`, if it exists.
pub async fn read_json<T: serde::de::DeserializeOwned>(
    w: &Warehouse,
    loc: &str,
) -> Result<Option<T>, SinkError> {
    match read(w, loc).await? {
        Some(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| corrupt(loc, e)),
        None => Ok(None),
    }
}

/// The highest `N` of the files `<dir>/<prefix>N`; `None` when there are none.
pub async fn highest_numbered(
    w: &Warehouse,
    dir: &str,
    prefix: &str,
) -> Result<Option<i64>, SinkError> {
    use futures::TryStreamExt;
    let listed: Vec<_> = w
        .store()
        .list(Some(&w.path(dir)?))
        .try_collect()
        .await
        .map_err(storage(dir))?;
    Ok(listed
        .iter()
        .filter_map(|m| {
            m.location
                .filename()?
                .strip_prefix(prefix)?
                .parse::<i64>()
                .ok()
        })
        .max())
}
