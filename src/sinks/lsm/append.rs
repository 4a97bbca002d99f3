//! Keyless tables as Paimon append tables (issue 23): `primaryKeys = []`, option `bucket = -1`
//! (Paimon's "unaware-bucket" append table), every data file in `bucket-0/` at level 0, holding
//! the table's columns only — no `_KEY_*`, `_SEQUENCE_NUMBER` or `_VALUE_KIND`, as Paimon's
//! `AppendOnlyWriter` (and pypaimon's `AppendOnlyDataWriter`) write them, and each manifest entry
//! with `_TOTAL_BUCKETS = -1`. Readers (pypaimon, Flink, Spark) read every file of such a table
//! without merging, so duplicate rows stay duplicates.
//!
//! Why only inserts and truncates: nothing identifies a keyless row, so an update or delete
//! cannot be applied without guessing which of several equal rows it meant. The sources publish
//! such tables insert-only and stop on an update or delete of one (`sources/*/assembler.rs`);
//! [`plan`] refuses one that got here anyway, and an insert with an absent cell (no earlier row
//! to complete it from). A TRUNCATE drops every earlier row: its commit is an `OVERWRITE` that
//! deletes every live file.
//!
//! Not done: Paimon's append-table compaction (merging small files); each commit adds one file
//! per [`MAX_FILE_ROWS`] rows, and snapshot expiry removes only files no retained snapshot holds.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::{Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;

use super::binary_row;
use super::manifest::{DataFileMeta, Stats};
use super::writer::{writer_properties, FileError};
use crate::changelog::{Op, TableChanges, TableSchema};

/// Rows per data file at most: an initial copy's large commits become several files.
pub const MAX_FILE_ROWS: usize = 1 << 20;

/// Paimon's bucket number for an unaware-bucket append table (`BucketMode.BUCKET_UNAWARE`).
pub const UNAWARE_BUCKETS: i32 = -1;

/// The table options cdcd sets on an append table it creates.
pub fn table_options() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("bucket".to_owned(), UNAWARE_BUCKETS.to_string()),
        ("file.format".to_owned(), "parquet".to_owned()),
    ])
}

/// Why a keyless table's changes cannot be appended.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("{op:?} of a table without a key: on the lsm sink cdcd replicates keyless tables insert-only (a Paimon table cannot apply a delete of one of several equal rows); give the table a primary key or name unique NOT NULL columns in source.key_columns, or use the iceberg sink, which applies it to one equal row")]
    NotInsert { op: Op },
    #[error("an insert into a table without a key lacks column {column}: there is no earlier row to take it from")]
    Absent { column: String },
    #[error(transparent)]
    Arrow(#[from] arrow_schema::ArrowError),
}

/// What one commit to an append table writes.
#[derive(Debug, Default)]
pub struct AppendPlan {
    /// A TRUNCATE came first: every existing file is removed by this commit.
    pub truncate: bool,
    /// The rows to append, in source order, as stored (`file_schema`), at most
    /// [`MAX_FILE_ROWS`] per batch: one data file each.
    pub files: Vec<RecordBatch>,
    /// Changes consumed (the sequence number advance).
    pub changes: u64,
}

impl AppendPlan {
    pub fn rows(&self) -> usize {
        self.files.iter().map(RecordBatch::num_rows).sum()
    }
}

/// The Arrow schema of an append table's data files: the table's columns as Paimon stores them,
/// all nullable (as the table's schema declares them: `schema::paimon_schema`).
pub fn file_schema(table: &TableSchema) -> SchemaRef {
    Arc::new(Schema::new(
        table
            .columns
            .iter()
            .map(|c| Field::new(&c.name, super::schema::file_type(&c.data_type), true))
            .collect::<Vec<_>>(),
    ))
}

/// The plan of `changes` (all of one keyless table, in order). Pure.
pub fn plan(changes: &[TableChanges], schema: &SchemaRef) -> Result<AppendPlan, AppendError> {
    let mut plan = AppendPlan::default();
    let mut pending: Vec<RecordBatch> = Vec::new();
    for c in changes {
        plan.changes += c.len() as u64;
        let mut take: Vec<u32> = Vec::new();
        for (r, op) in c.ops.iter().enumerate() {
            match op {
                Op::Truncate => {
                    plan.truncate = true;
                    pending.clear();
                    take.clear();
                    continue;
                }
                Op::Insert => {}
                Op::Update | Op::Delete => return Err(AppendError::NotInsert { op: *op }),
            }
            if let Some(column) = (0..c.schema.columns.len()).find(|&col| !c.is_present(col, r)) {
                let name = c.schema.columns.get(column).map(|c| c.name.clone());
                return Err(AppendError::Absent {
                    column: name.unwrap_or_else(|| column.to_string()),
                });
            }
            // Row indexes of a batch fit u32: a run is cut far below that (`TableChangesBuilder`).
            take.push(r as u32);
        }
        if take.is_empty() {
            continue;
        }
        let indices = UInt32Array::from(take);
        let columns = c
            .rows
            .columns()
            .iter()
            .zip(schema.fields())
            .map(|(col, field)| {
                let taken = arrow_select::take::take(col.as_ref(), &indices, None)?;
                if taken.data_type() == field.data_type() {
                    Ok(taken)
                } else {
                    arrow_cast::cast(&taken, field.data_type())
                }
            })
            .collect::<Result<Vec<ArrayRef>, _>>()?;
        pending.push(RecordBatch::try_new(schema.clone(), columns)?);
    }
    let all = arrow_select::concat::concat_batches(schema, &pending)?;
    let mut start = 0;
    while start < all.num_rows() {
        let len = MAX_FILE_ROWS.min(all.num_rows() - start);
        plan.files.push(all.slice(start, len));
        start += len;
    }
    Ok(plan)
}

/// Encodes one append data file and describes it: rows numbered from `first_sequence` (Paimon's
/// `AppendOnlyWriter` gives each row the next sequence number), no key range or key statistics
/// (the empty row, as Paimon writes for a table without keys), level 0.
pub fn encode(
    batch: &RecordBatch,
    file_name: String,
    first_sequence: i64,
    schema_id: i64,
) -> Result<(Vec<u8>, DataFileMeta), FileError> {
    let mut w = ArrowWriter::try_new(Vec::new(), batch.schema(), Some(writer_properties(batch)?))?;
    w.write(batch)?;
    let bytes = w.into_inner()?;
    let rows = batch.num_rows() as i64;
    let empty = binary_row::empty_row();
    let meta = DataFileMeta {
        file_name,
        file_size: bytes.len() as i64,
        row_count: rows,
        min_key: empty.clone(),
        max_key: empty.clone(),
        key_stats: Stats {
            min: empty.clone(),
            max: empty,
            null_counts: Vec::new(),
        },
        min_sequence: first_sequence,
        max_sequence: first_sequence + rows - 1,
        schema_id,
        level: 0,
        creation_time_ms: chrono::Utc::now().timestamp_millis(),
        delete_row_count: 0,
        file_source: 0,
    };
    Ok((bytes, meta))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::changelog::{Column, TableChangesBuilder, TableId};
    use arrow_array::builder::{Int32Builder, StringBuilder};
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    use arrow_schema::DataType;

    fn keyless() -> Arc<TableSchema> {
        Arc::new(TableSchema {
            id: TableId::new("public", "log"),
            columns: vec![
                Column {
                    name: "x".into(),
                    nullable: true,
                    data_type: DataType::Int32,
                    source_type: "int4".into(),
                    initial_default: None,
                    former_names: Vec::new(),
                },
                Column {
                    name: "s".into(),
                    nullable: true,
                    data_type: DataType::Utf8,
                    source_type: "text".into(),
                    initial_default: None,
                    former_names: Vec::new(),
                },
            ],
            primary_key: vec![],
        })
    }

    fn changes(ops: &[(Op, i32)]) -> TableChanges {
        let mut b = TableChangesBuilder::new(keyless(), ops.len());
        for &(op, x) in ops {
            b.begin(op);
            if op == Op::Truncate {
                (0..2).for_each(|c| b.absent(c).unwrap());
            } else {
                crate::test_fixtures::cell::<Int32Builder>(&mut b, 0).append_value(x);
                crate::test_fixtures::cell::<StringBuilder>(&mut b, 1)
                    .append_value(format!("r{x}"));
            }
            b.no_old_key().unwrap();
        }
        b.finish().unwrap()
    }

    fn xs(plan: &AppendPlan) -> Vec<i32> {
        plan.files
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int32Type>().values().to_vec())
            .collect()
    }

    #[test]
    fn inserts_are_appended_in_order_duplicates_kept() {
        let t = keyless();
        let schema = file_schema(&t);
        let plan = plan(
            &[
                changes(&[(Op::Insert, 1), (Op::Insert, 1)]),
                changes(&[(Op::Insert, 2)]),
            ],
            &schema,
        )
        .unwrap();
        assert!(!plan.truncate);
        assert_eq!(xs(&plan), vec![1, 1, 2]);
        assert_eq!(plan.changes, 3);
    }

    #[test]
    fn a_truncate_drops_the_rows_before_it() {
        let t = keyless();
        let schema = file_schema(&t);
        let plan = plan(
            &[
                changes(&[(Op::Insert, 1)]),
                changes(&[(Op::Truncate, 0), (Op::Insert, 3)]),
            ],
            &schema,
        )
        .unwrap();
        assert!(plan.truncate);
        assert_eq!(xs(&plan), vec![3]);
    }

    #[test]
    fn an_update_or_delete_is_refused_naming_the_operation() {
        let t = keyless();
        let schema = file_schema(&t);
        for op in [Op::Update, Op::Delete] {
            let err = plan(&[changes(&[(Op::Insert, 1), (op, 1)])], &schema).unwrap_err();
            assert!(
                matches!(err, AppendError::NotInsert { op: o } if o == op),
                "{err}"
            );
            assert!(err.to_string().contains("without a key"), "{err}");
        }
    }

    #[test]
    fn a_file_has_no_key_columns_and_numbers_its_rows() {
        let t = keyless();
        let schema = file_schema(&t);
        let plan = plan(&[changes(&[(Op::Insert, 1), (Op::Insert, 2)])], &schema).unwrap();
        let (bytes, meta) = encode(&plan.files[0], "f.parquet".into(), 7, 0).unwrap();
        assert_eq!((meta.min_sequence, meta.max_sequence), (7, 8));
        assert_eq!(meta.row_count, 2);
        assert_eq!(meta.min_key, binary_row::empty_row());
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            bytes::Bytes::from(bytes),
        )
        .unwrap();
        let names: Vec<String> = reader
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, vec!["x", "s"]);
    }
}
