//! v3 row lineage through a rewrite (Iceberg spec, "Row Lineage"): every row of a v3 table has a
//! `_row_id` and a `_last_updated_sequence_number`. A file that stores neither gives its rows
//! `first_row_id + _pos` and its data sequence number; a rewrite moves rows to new files at new
//! positions, so it writes both values explicitly into its outputs (the reserved field ids below),
//! and the rows keep their identity for engines that read it (Spark's `_row_id`, CDC on lineage).
//!
//! A data file's `first_row_id` is inherited when its manifest entry has none (spec, "First Row
//! ID Inheritance"): the manifest's `first_row_id` plus the record counts of the live entries
//! before it that have none (`manifest::inherit_first_row_id`, which a manifest rewrite also uses
//! to make them explicit).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field};
use iceberg::spec::{Manifest, TableMetadata};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

use crate::sinks::iceberg::files::manifest::{inherit_first_row_id, load_manifests, read};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// `_row_id` (Iceberg spec, "Reserved Field IDs").
pub(crate) const ROW_ID: (i32, &str) = (2147483540, "_row_id");
/// `_last_updated_sequence_number` (Iceberg spec, "Reserved Field IDs").
pub(crate) const LAST_UPDATED: (i32, &str) = (2147483539, "_last_updated_sequence_number");

/// The two lineage columns as output file fields (optional longs, field ids in the metadata the
/// Parquet writer turns into field ids).
pub(crate) fn fields() -> [Field; 2] {
    [ROW_ID, LAST_UPDATED].map(|(id, name)| {
        Field::new(name, DataType::Int64, true).with_metadata(HashMap::from([(
            PARQUET_FIELD_ID_META_KEY.to_owned(),
            id.to_string(),
        )]))
    })
}

/// The first row id of each of `paths` (data files of `meta`'s current snapshot), explicit or
/// inherited; a file with none (written before the table was v3) is absent.
pub(crate) async fn first_row_ids(
    warehouse: &Warehouse,
    meta: &TableMetadata,
    paths: &HashSet<&str>,
) -> Result<HashMap<String, u64>, SinkError> {
    let mut out = HashMap::new();
    let Some(snapshot) = meta.current_snapshot() else {
        return Ok(out);
    };
    let manifests =
        load_manifests(warehouse, snapshot.manifest_list(), meta.format_version()).await?;
    for m in manifests {
        let parse = |e| SinkError::Corrupt {
            path: m.manifest_path.clone(),
            detail: format!("parsing: {e}"),
        };
        let manifest =
            Manifest::parse_avro(&read(warehouse, &m.manifest_path).await?).map_err(parse)?;
        let mut next = m.first_row_id;
        for e in manifest.entries().iter().filter(|e| e.is_alive()) {
            let file = e.data_file();
            let first = inherit_first_row_id(&mut next, file);
            if let Some(first) = first.filter(|_| paths.contains(file.file_path())) {
                out.insert(file.file_path().to_owned(), first);
            }
        }
    }
    Ok(out)
}

/// The lineage columns of `batch`, rows `start..` of a file whose first row id is `first_row_id`
/// (`None`: its rows have none) and whose data sequence number is `sequence`: the values the
/// file stores where it has them, else the inherited ones.
pub(crate) fn columns(
    batch: &RecordBatch,
    start: u64,
    first_row_id: Option<u64>,
    sequence: i64,
) -> [ArrayRef; 2] {
    let stored = |id: i32| -> Option<Int64Array> {
        let schema = batch.schema();
        let i = schema.fields().iter().position(|f| {
            f.metadata()
                .get(PARQUET_FIELD_ID_META_KEY)
                .map(String::as_str)
                == Some(id.to_string().as_str())
        })?;
        batch
            .column(i)
            .as_any()
            .downcast_ref::<Int64Array>()
            .cloned()
    };
    let (row_ids, sequences) = (stored(ROW_ID.0), stored(LAST_UPDATED.0));
    let n = batch.num_rows();
    let row_id: Int64Array = (0..n)
        .map(|i| match &row_ids {
            Some(a) if a.is_valid(i) => Some(a.value(i)),
            _ => first_row_id.and_then(|f| i64::try_from(f + start + i as u64).ok()),
        })
        .collect();
    let last_updated: Int64Array = (0..n)
        .map(|i| match &sequences {
            Some(a) if a.is_valid(i) => Some(a.value(i)),
            _ => Some(sequence),
        })
        .collect();
    [Arc::new(row_id), Arc::new(last_updated)]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use arrow_schema::Schema;

    fn batch(stored: Option<Vec<Option<i64>>>) -> RecordBatch {
        let mut fields = vec![Field::new("id", DataType::Int64, false)];
        let mut columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![10, 11, 12]))];
        if let Some(values) = stored {
            fields.push(fields_row_id());
            columns.push(Arc::new(Int64Array::from(values)));
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    fn fields_row_id() -> Field {
        let [row_id, _] = fields();
        row_id
    }

    fn values(a: &ArrayRef) -> Vec<Option<i64>> {
        a.as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .iter()
            .collect()
    }

    #[test]
    fn inherited_ids_count_from_the_files_first_row_id_and_position() {
        let [ids, seqs] = columns(&batch(None), 5, Some(100), 7);
        assert_eq!(values(&ids), vec![Some(105), Some(106), Some(107)]);
        assert_eq!(values(&seqs), vec![Some(7); 3]);
        let [ids, _] = columns(&batch(None), 0, None, 7);
        assert_eq!(values(&ids), vec![None; 3], "a file without row ids");
    }

    #[test]
    fn stored_ids_win_and_nulls_inherit() {
        let [ids, _] = columns(&batch(Some(vec![Some(3), None, Some(1)])), 0, Some(100), 7);
        assert_eq!(values(&ids), vec![Some(3), Some(101), Some(1)]);
    }
}
