//! Where each key a commit writes lives now, in a partitioned table: the partition holding the
//! key's current row, if any.
//!
//! A Paimon primary-key table merges a key's versions within one (partition, bucket) only, so a
//! row whose partition value changes must be deleted from the partition it leaves, and a delete
//! (whose image may hold only the key) must go to the partition the row is in. The source's
//! change does not say where that is (Postgres sends the old key only, MySQL's MINIMAL image
//! the key only), so the commit looks the key up here: it reads the files of the key's bucket in
//! every partition, skipping files whose key range holds none of the keys, one file at a time,
//! and keeps per key the partition of its newest version. The key's current partition is that
//! of its newest row when that row is not a delete; at one sequence number an insert wins over a
//! delete, as cdcd writes a move as a delete in the old partition and an insert in the new one
//! under the same sequence number.

use std::collections::{BTreeSet, HashMap};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, Int8Type};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_row::{OwnedRow, RowConverter};

use super::binary_row;
use super::files::read_file_at;
use super::manifest::DataFileMeta;
use super::partition::Partition;
use super::schema::{FileSchemas, KIND_DELETE};
use super::table::TableState;
use crate::changelog::TableId;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// The newest version of one key seen so far: its sequence number, whether it is a delete, and
/// its partition.
type Newest = (i64, bool, Partition);

/// The current partition of each row's key in `batch` (data file shape; row `i` hashes to
/// `buckets[i]`), `None` where the table holds no live row with that key.
pub async fn current_partitions(
    w: &Warehouse,
    table: &TableId,
    state: &TableState,
    schemas: &FileSchemas,
    batch: &RecordBatch,
    buckets: &[i32],
) -> Result<Vec<Option<Partition>>, SinkError> {
    let n = batch.num_rows();
    if state.files.is_empty() || n == 0 {
        return Ok(vec![None; n]);
    }
    let nk = schemas.key.len();
    let arrow = |what: &'static str| {
        let table = table.clone();
        move |source| SinkError::Arrow {
            context: format!("{what} of {table}"),
            source,
        }
    };
    let converter = schemas.key_converter().map_err(arrow("key encoding"))?;
    let wanted = converter
        .convert_columns(batch.columns().get(..nk).unwrap_or_default())
        .map_err(arrow("key encoding"))?;
    let index: HashMap<&[u8], usize> = (0..n).map(|i| (wanted.row(i).data(), i)).collect();
    let mut sorted: Vec<OwnedRow> = (0..n).map(|i| wanted.row(i).owned()).collect();
    sorted.sort();
    let touched: BTreeSet<i32> = buckets.iter().copied().collect();
    let mut newest: Vec<Option<Newest>> = vec![None; n];
    for (slot, files) in &state.files {
        if !touched.contains(&slot.bucket) {
            continue;
        }
        for f in files {
            if !may_hold(&converter, &schemas.key_types, f, &sorted) {
                continue;
            }
            let data = read_file_at(w, table, &state.location, schemas, slot, f).await?;
            let rows = converter
                .convert_columns(data.columns().get(..nk).unwrap_or_default())
                .map_err(arrow("key encoding"))?;
            let (Some(seq), Some(kind)) = (
                data.column(nk).as_primitive_opt::<Int64Type>(),
                data.column(nk + 1).as_primitive_opt::<Int8Type>(),
            ) else {
                continue;
            };
            for r in 0..data.num_rows() {
                let Some(&i) = index.get(rows.row(r).data()) else {
                    continue;
                };
                let (s, delete) = (seq.value(r), kind.value(r) == KIND_DELETE);
                if let Some(best) = newest.get_mut(i) {
                    let newer = best.as_ref().is_none_or(|(old, was_delete, _)| {
                        s > *old || (s == *old && *was_delete && !delete)
                    });
                    if newer {
                        *best = Some((s, delete, slot.partition.clone()));
                    }
                }
            }
        }
    }
    Ok(newest
        .into_iter()
        .map(|b| b.and_then(|(_, delete, p)| (!delete).then_some(p)))
        .collect())
}

/// Whether file `f`'s key range may hold one of the `sorted` keys; `true` when its bounds do
/// not decode (read it).
fn may_hold(
    converter: &RowConverter,
    key_types: &[arrow_schema::DataType],
    f: &DataFileMeta,
    sorted: &[OwnedRow],
) -> bool {
    let bound = |row: &[u8]| -> Option<OwnedRow> {
        let arrays: Vec<ArrayRef> = binary_row::decode(row, key_types).ok()?;
        let rows = converter.convert_columns(&arrays).ok()?;
        Some(rows.row(0).owned())
    };
    let (Some(min), Some(max)) = (bound(&f.min_key), bound(&f.max_key)) else {
        return true;
    };
    let first = sorted.partition_point(|k| k.row() < min.row());
    sorted.get(first).is_some_and(|k| k.row() <= max.row())
}
