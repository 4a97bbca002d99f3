//! The manifest list of a new snapshot (Avro, via iceberg's `ManifestListWriter`), written
//! straight to the warehouse store: the writer takes any `FileWrite`, which [`StoreWrite`]
//! implements on object_store. The list is the last file a commit writes before its metadata.

use std::sync::Arc;

use bytes::Bytes;
use iceberg::io::FileWrite;
use iceberg::spec::{FormatVersion, ManifestFile, ManifestList, ManifestListWriter};
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};

use crate::sinks::SinkError;
use crate::storage::Warehouse;

fn ice(context: impl Into<String>) -> impl FnOnce(iceberg::Error) -> SinkError {
    let context = context.into();
    move |source| SinkError::Iceberg { context, source }
}

/// The snapshot a manifest list is written for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListTarget {
    /// The table's format version.
    pub version: FormatVersion,
    pub snapshot_id: i64,
    pub parent: Option<i64>,
    /// The snapshot's data sequence number.
    pub sequence: i64,
    /// v3: the table's `next-row-id`, where this snapshot's row ids start.
    pub first_row_id: u64,
}

/// Writes the manifest list of a new snapshot. For v3, `first_row_id` is the table's
/// `next-row-id`: new data manifests get row ids from it (Iceberg spec, "Row Lineage"). Returns
/// the number of row ids assigned (the snapshot's `added-rows`) and the manifests as the list
/// holds them, with the sequence numbers and first row ids the writer assigned (parsed back from
/// the bytes written, so a cached copy equals what a reader of the list sees).
pub(crate) async fn write_manifest_list(
    warehouse: &Warehouse,
    location: &str,
    list: &ListTarget,
    manifests: Vec<ManifestFile>,
) -> Result<(u64, Vec<ManifestFile>), SinkError> {
    let ListTarget {
        version,
        snapshot_id,
        parent,
        sequence,
        first_row_id,
    } = *list;
    let written = Arc::new(std::sync::Mutex::new(Bytes::new()));
    let out = StoreWrite {
        store: warehouse.store().clone(),
        path: warehouse.path(location)?,
        buf: Vec::new(),
        written: Arc::clone(&written),
    };
    let mut writer = match version {
        FormatVersion::V3 => ManifestListWriter::v3(
            Box::new(out),
            snapshot_id,
            parent,
            sequence,
            Some(first_row_id),
        ),
        _ => ManifestListWriter::v2(Box::new(out), snapshot_id, parent, sequence),
    };
    writer
        .add_manifests(manifests.into_iter())
        .map_err(ice(format!("adding manifests to {location}")))?;
    let added_rows = writer
        .next_row_id()
        .map_or(0, |next| next.saturating_sub(first_row_id));
    writer
        .close()
        .await
        .map_err(ice(format!("writing {location}")))?;
    let bytes = written.lock().map(|b| b.clone()).unwrap_or_default();
    let list = ManifestList::parse_with_version(&bytes, version)
        .map_err(ice(format!("parsing back {location}")))?;
    Ok((added_rows, list.consume_entries().into_iter().collect()))
}

/// An iceberg `FileWrite` that buffers, puts the whole object on close, and leaves the bytes in
/// `written`.
struct StoreWrite {
    store: Arc<dyn ObjectStore>,
    path: Path,
    buf: Vec<u8>,
    written: Arc<std::sync::Mutex<Bytes>>,
}

#[async_trait::async_trait]
impl FileWrite for StoreWrite {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        self.buf.extend_from_slice(&bs);
        Ok(())
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        let bytes = Bytes::from(std::mem::take(&mut self.buf));
        if let Ok(mut w) = self.written.lock() {
            *w = bytes.clone();
        }
        // Named after its snapshot and commit id: written in place on local disk.
        self.store
            .put_opts(
                &self.path,
                PutPayload::from_bytes(bytes),
                crate::storage::fresh(),
            )
            .await
            .map(|_| ())
            .map_err(|e| {
                iceberg::Error::new(
                    iceberg::ErrorKind::Unexpected,
                    format!("writing {}", self.path),
                )
                .with_source(e)
            })
    }
}
