//! Deletion vectors of a commit (format v3): reads the live DVs of a snapshot, merges this
//! commit's deleted positions into them, and writes them as one Puffin file.
//!
//! Sits after the planner and the
//! [`RowLocator`](crate::sinks::iceberg::rows::locator::RowLocator): positions come from located
//! keys (rows of earlier snapshots) and from `Plan::position_deletes` (rows this commit wrote and
//! superseded). The spec allows at most one DV per data file per snapshot (Iceberg spec,
//! "Deletion Vectors"), so a file that already has one gets the union, and the old entry is
//! removed from its manifest by `mod.rs` (a DELETED entry in a rewritten manifest).
//!
//! Delete-manifest entries for DVs carry `referenced_data_file`, `content_offset` and
//! `content_size_in_bytes` equal to the blob's offset and length in the Puffin footer, and
//! `record_count` = the DV's cardinality (Iceberg spec, "Delete Formats"; Puffin spec,
//! "deletion-vector-v1").

use std::collections::{BTreeMap, HashMap};

use futures::{StreamExt, TryStreamExt};
use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat};
use object_store::ObjectStoreExt;

use super::deletion_vector::DeletionVector;
use super::puffin::PuffinWriter;
use crate::changelog::TableId;
use crate::sinks::iceberg::files::manifest::{LiveFile, LiveFiles};
use crate::sinks::iceberg::files::writer::{put_bytes, Placement};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// The live DV of one data file and the delete-file entry that holds it.
#[derive(Debug, Clone)]
pub(crate) struct LiveDv {
    pub entry: LiveFile,
    pub dv: DeletionVector,
}

/// Live DVs by referenced data file location.
pub(crate) type LiveDvs = HashMap<String, LiveDv>;

/// Blobs of a cold load read at once (`load_dvs`).
const BLOB_READS_IN_FLIGHT: usize = 16;

/// Reads the DV of every live DV entry (one ranged read per blob, [`BLOB_READS_IN_FLIGHT`] at
/// once: a table's first commit in a process, or after another writer's, reads them all).
pub(crate) async fn load_dvs(
    warehouse: &Warehouse,
    table: &TableId,
    files: &LiveFiles,
) -> Result<LiveDvs, SinkError> {
    // Collected first (see `files/manifest.rs`, `load_files`).
    let reads: Vec<_> = files
        .position_deletes
        .iter()
        .map(|f| load_dv(warehouse, table, f))
        .collect();
    let loaded: Vec<(String, LiveDv)> = futures::stream::iter(reads)
        .buffered(BLOB_READS_IN_FLIGHT)
        .try_collect()
        .await?;
    let mut out = LiveDvs::with_capacity(loaded.len());
    for (data_file, dv) in loaded {
        let path = dv.entry.file.file_path().to_owned();
        if out.insert(data_file.clone(), dv).is_some() {
            return Err(SinkError::Corrupt {
                path,
                detail: format!("{data_file} has two live deletion vectors"),
            });
        }
    }
    Ok(out)
}

/// Reads the DV of one live DV entry: its data file and the vector.
async fn load_dv(
    warehouse: &Warehouse,
    table: &TableId,
    f: &LiveFile,
) -> Result<(String, LiveDv), SinkError> {
    {
        let file = &f.file;
        let location = file.file_path();
        let corrupt = |detail: String| SinkError::Corrupt {
            path: location.to_owned(),
            detail,
        };
        if file.file_format() != DataFileFormat::Puffin {
            // A v3 table written by cdcd has only DVs; position delete files would be another
            // writer's, and honouring both is not implemented.
            return Err(corrupt(format!(
                "{table} is format v3 but lists a {} position delete file; only deletion vectors are supported",
                file.file_format()
            )));
        }
        let (Some(data_file), Some(offset), Some(size)) = (
            file.referenced_data_file(),
            file.content_offset(),
            file.content_size_in_bytes(),
        ) else {
            return Err(corrupt(
                "deletion vector entry without referenced_data_file/content_offset/content_size_in_bytes"
                    .into(),
            ));
        };
        let (Ok(start), Ok(len)) = (u64::try_from(offset), u64::try_from(size)) else {
            return Err(corrupt(format!("negative blob range {offset}+{size}")));
        };
        let path = warehouse.path(location)?;
        let bytes = warehouse
            .store()
            .get_range(&path, start..start + len)
            .await
            .map_err(|source| SinkError::Storage {
                path: location.to_owned(),
                source,
            })?;
        let dv = DeletionVector::deserialize_blob(&bytes)
            .map_err(|e| corrupt(format!("blob at {offset}+{size} for {data_file}: {e}")))?;
        Ok((
            data_file,
            LiveDv {
                entry: f.clone(),
                dv,
            },
        ))
    }
}

/// This commit's new DVs by data file, each already merged with the file's live DV.
#[derive(Debug, Default)]
pub(crate) struct NewDvs {
    pub dvs: BTreeMap<String, DeletionVector>,
    /// Positions this commit deletes (new ones, not counting merged-in old positions).
    pub deleted: u64,
}

impl NewDvs {
    /// Marks `pos` of `file` deleted (a no-op when it already was).
    pub fn delete(
        &mut self,
        table: &TableId,
        file: &str,
        pos: u64,
        live: &LiveDvs,
    ) -> Result<(), SinkError> {
        if live.get(file).is_some_and(|d| d.dv.contains(pos)) {
            return Ok(());
        }
        let dv = match self.dvs.get_mut(file) {
            Some(dv) => dv,
            None => self.dvs.entry(file.to_owned()).or_default(),
        };
        let added = dv.insert(pos).map_err(|e| SinkError::Data {
            table: table.clone(),
            detail: format!("deleting row {pos} of {file}: {e}"),
        })?;
        self.deleted += u64::from(added);
        Ok(())
    }

    /// Unions each new DV with its file's live DV.
    pub fn merge_live(&mut self, live: &LiveDvs) {
        for (file, dv) in &mut self.dvs {
            if let Some(old) = live.get(file) {
                dv.merge(&old.dv);
            }
        }
    }
}

/// Writes `dvs` as one Puffin file at `location` and describes each blob as a delete file placed
/// with its data file, which all sit at `placement`: a vector's entry carries its data file's
/// spec id and partition tuple (readers such as pyiceberg match a vector to its data file by
/// partition; Iceberg spec, "Deletion Vectors").
pub(crate) async fn write_puffin(
    warehouse: &Warehouse,
    table: &TableId,
    location: &str,
    dvs: &BTreeMap<String, DeletionVector>,
    placement: &Placement,
) -> Result<Vec<DataFile>, SinkError> {
    let puffin = |e: super::puffin::PuffinError| SinkError::Data {
        table: table.clone(),
        detail: format!("writing deletion vectors to {location}: {e}"),
    };
    let mut writer = PuffinWriter::new();
    let mut blobs = Vec::with_capacity(dvs.len());
    for (data_file, dv) in dvs {
        blobs.push(writer.add_deletion_vector(data_file, dv).map_err(puffin)?);
    }
    let bytes = writer.finish().map_err(puffin)?;
    let size = bytes.len() as u64;
    put_bytes(warehouse, location, bytes.into()).await?;
    let describe = |e: String| SinkError::Data {
        table: table.clone(),
        detail: format!("describing deletion vectors in {location}: {e}"),
    };
    blobs
        .into_iter()
        .map(|b| {
            let (Ok(offset), Ok(length)) = (
                i64::try_from(b.content_offset),
                i64::try_from(b.content_size_in_bytes),
            ) else {
                return Err(describe("blob offset out of range".into()));
            };
            DataFileBuilder::default()
                .content(DataContentType::PositionDeletes)
                .file_path(location.to_owned())
                .file_format(DataFileFormat::Puffin)
                .partition(placement.partition.clone())
                .partition_spec_id(placement.spec_id)
                .record_count(b.cardinality)
                .file_size_in_bytes(size)
                .referenced_data_file(Some(b.referenced_data_file))
                .content_offset(Some(offset))
                .content_size_in_bytes(Some(length))
                .build()
                .map_err(|e| describe(e.to_string()))
        })
        .collect()
}
