//! Row location for deletion vectors: where (data file, row position) the current row of a key
//! lives, so that an update or delete of a committed row can be written as a deletion vector on
//! that file (Iceberg v3 writers must not write equality deletes for this; DESIGN.md).
//!
//! Sits between the planner and the DV writer: the planner names keys whose row lives in an
//! earlier snapshot (`Plan::equality_deletes`), a [`RowLocator`] turns them into positions, and
//! `dv.rs` groups those per file. The seam is a trait because the scan below reads every live
//! data file's key columns; the primary-key index (`sinks/index/`) will implement it without
//! rereading files.

use std::collections::HashMap;

use arrow_array::RecordBatch;
use arrow_row::{RowConverter, SortField};
use arrow_schema::{ArrowError, SchemaRef};
use async_trait::async_trait;

use super::dv::LiveDvs;
use super::lookup::{decode, project};
use super::manifest::{read, LiveFile};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// Where a row is: the data file's location and the row's position in it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct RowAddress {
    pub file: String,
    pub pos: u64,
}

/// Finds the live row of each key.
///
/// Contract: `keys` is a batch in the table's key schema (key columns, change-row types);
/// the answer has one entry per key row, in order, `None` when the key has no live row. A row is
/// live when its file is in the snapshot and its position is not in the file's deletion vector.
/// Read-only: calling it again (e.g. after a failed commit) is safe and gives the same answer
/// for the same snapshot. Cancel-safe (nothing is written).
#[async_trait]
pub(crate) trait RowLocator: Send + Sync {
    async fn locate(&self, keys: &RecordBatch) -> Result<Vec<Option<RowAddress>>, SinkError>;
}

/// Locates keys by scanning the key columns of every live data file of a snapshot.
pub(crate) struct ScanLocator<'a> {
    pub warehouse: &'a Warehouse,
    pub data: &'a [LiveFile],
    pub dvs: &'a LiveDvs,
}

#[async_trait]
impl RowLocator for ScanLocator<'_> {
    async fn locate(&self, keys: &RecordBatch) -> Result<Vec<Option<RowAddress>>, SinkError> {
        let mut out = vec![None; keys.num_rows()];
        if keys.num_rows() == 0 {
            return Ok(out);
        }
        let key_schema: SchemaRef = keys.schema();
        let arrow = |context: &str| {
            let context = context.to_owned();
            move |source: ArrowError| SinkError::Arrow { context, source }
        };
        let converter = RowConverter::new(
            key_schema
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )
        .map_err(arrow("encoding keys to locate"))?;
        let wanted_rows = converter
            .convert_columns(keys.columns())
            .map_err(arrow("encoding keys to locate"))?;
        let wanted: HashMap<_, usize> = wanted_rows
            .iter()
            .enumerate()
            .map(|(i, r)| (r, i))
            .collect();
        let names: Vec<&str> = key_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        // Newest data sequence number wins should a key somehow be live twice.
        let mut best: Vec<i64> = vec![i64::MIN; keys.num_rows()];
        for f in self.data {
            let path = f.file.file_path();
            let bytes = read(self.warehouse, path).await?;
            let dv = self.dvs.get(path).map(|d| &d.dv);
            let mut offset = 0u64;
            for batch in decode(&bytes, path, Some(&names))? {
                let cols = project(&batch, &key_schema).map_err(arrow(path))?;
                let rows = converter.convert_columns(&cols).map_err(arrow(path))?;
                for (r, row) in rows.iter().enumerate() {
                    let pos = offset + r as u64;
                    let Some(&i) = wanted.get(&row) else {
                        continue;
                    };
                    if dv.is_some_and(|d| d.contains(pos)) {
                        continue;
                    }
                    if let (Some(slot), Some(seq)) = (out.get_mut(i), best.get_mut(i)) {
                        if f.sequence >= *seq {
                            *seq = f.sequence;
                            *slot = Some(RowAddress {
                                file: path.to_owned(),
                                pos,
                            });
                        }
                    }
                }
                offset += batch.num_rows() as u64;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seam stays usable as a trait object (the index will be one).
    #[allow(dead_code)]
    fn object_safe(_: &dyn RowLocator) {}
}
