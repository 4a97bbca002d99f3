//! Changes: what happened to which rows, column-oriented in Arrow.
//!
//! A [`TableChanges`] is a run of changes to one table in source order. Values sit in an Arrow
//! [`RecordBatch`] (one row per change), and a per-column presence bitmap tells a value (possibly
//! NULL) from an *absent* column. Absent is how Postgres sends an unchanged TOASTed value and how a
//! MySQL MINIMAL/NOBLOB image leaves columns out; the sink completes absent columns from the row's
//! current values. Absent is never NULL.

use std::sync::Arc;

use arrow_array::builder::{make_builder, ArrayBuilder};
use arrow_array::{new_null_array, Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};
use arrow_schema::{ArrowError, Field, Schema, SchemaRef};

use super::schema::TableSchema;
use super::source_tx::SourceTx;

/// What a change did to its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    Insert = 0,
    Update = 1,
    Delete = 2,
    /// Every row of the table is gone. The change's columns are all absent.
    Truncate = 3,
}

impl Op {
    /// The label used in `cdcd_changes_total{op}`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Delete => "delete",
            Op::Truncate => "truncate",
        }
    }
}

/// Changes to one table, in source order.
///
/// Row `i` of [`rows`](Self::rows) is the row after change `i` for inserts and updates, and the
/// deleted row's key (other columns absent, or present when the source sent the whole old row) for
/// deletes. For an update that changed the primary key, row `i` of
/// [`old_keys`](Self::old_keys) holds the previous key.
#[derive(Debug, Clone)]
pub struct TableChanges {
    pub schema: Arc<TableSchema>,
    pub ops: Vec<Op>,
    /// One column per schema column, all nullable (a delete carries only its key).
    pub rows: RecordBatch,
    /// Per column: which rows carry the column. `None`: every row does.
    pub present: Vec<Option<BooleanBuffer>>,
    /// Key columns only. Row `i` is meaningful where `key_changed[i]`.
    pub old_keys: RecordBatch,
    pub key_changed: Vec<bool>,
    /// These changes are replayed inside an upsert window (`pipeline/upsert.rs`): a partial
    /// update of a key the table does not hold is dropped instead of stopping the sink (why that
    /// is safe: `sources/mysql/copy.rs`). False unless the pipeline sets it.
    pub upsert_window: bool,
    /// The initial-copy chunk these rows were read from (`None`: streamed changes, or a source
    /// that does not say). One chunk's rows in one commit are a contiguous stretch of its key
    /// range, which is how the LSM sink's copy placement tells one reader's rows from another's
    /// (`sinks/lsm/placement.rs`).
    pub copy_chunk: Option<u32>,
    /// The source transaction of every change of the run (a run never spans two:
    /// `changelog/source_tx.rs`). `None` for initial-copy rows, which no transaction wrote (the
    /// copy's consistent point is its table's checkpoint), and for sources that do not say.
    pub source_tx: Option<Arc<SourceTx>>,
}

impl TableChanges {
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Whether row `row` carries column `column` (a value or NULL), as opposed to absent.
    pub fn is_present(&self, column: usize, row: usize) -> bool {
        match self.present.get(column) {
            Some(Some(bits)) => bits.value(row),
            Some(None) => true,
            None => false,
        }
    }

    /// Whether any row of this run lacks any column.
    pub fn has_absent(&self) -> bool {
        self.present.iter().any(|p| p.is_some())
    }

    /// The Arrow schema of [`rows`](Self::rows): the table's columns, all nullable.
    pub fn rows_schema(schema: &TableSchema) -> SchemaRef {
        let fields: Vec<Field> = schema
            .columns
            .iter()
            .map(|c| Field::new(&c.name, c.data_type.clone(), true))
            .collect();
        Arc::new(Schema::new(fields))
    }

    /// These changes as changes of `newer`, a schema `self.schema` evolves to
    /// ([`TableSchema::evolves_to`]): widened columns cast (exact for the promotions allowed),
    /// added columns NULL or their initial default. An added column is present in inserts and
    /// updates: the row had no such column then, which once the column exists reads as NULL, or
    /// the default the source fills existing rows with; it is absent in deletes, like their
    /// other non-key columns, except in a keyless table's deletes, which carry the whole row.
    /// Used for a schema change inside one transaction, whose rows must share one commit.
    pub fn evolve(&self, newer: &Arc<TableSchema>) -> Result<TableChanges, ArrowError> {
        let rows_schema = Self::rows_schema(newer);
        let keys_schema = Self::keys_schema(newer);
        let n = self.rows.num_rows();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(rows_schema.fields().len());
        let mut present = Vec::with_capacity(rows_schema.fields().len());
        // Each new column's old one: by name or renamed (`evolves_to` has ruled out ambiguity).
        let map = newer
            .columns_in(self.schema.columns.iter().map(|c| c.name.as_str()))
            .map_err(ArrowError::SchemaError)?;
        for (i, field) in rows_schema.fields().iter().enumerate() {
            // A dropped column's values are left behind, a kept one is cast to its (maybe
            // wider) type.
            if let Some(j) = map.iter().position(|at| *at == Some(i)) {
                columns.push(arrow_cast::cast(self.rows.column(j), field.data_type())?);
                present.push(self.present.get(j).cloned().flatten());
            } else {
                // Rows from before the change read the column's initial default, as the source
                // fills them; NULL without one.
                let default = match newer.columns.get(i) {
                    Some(c) => c.initial_default_values(n)?,
                    None => None,
                };
                columns.push(default.unwrap_or_else(|| new_null_array(field.data_type(), n)));
                // A keyless table's delete carries the whole row (a multiset delete, issue 23),
                // which once the column exists reads the same there too.
                let whole = |op: &Op| {
                    matches!(op, Op::Insert | Op::Update)
                        || (*op == Op::Delete && newer.primary_key.is_empty())
                };
                let partial = self.ops.iter().any(|op| !whole(op));
                present.push(partial.then(|| BooleanBuffer::from_iter(self.ops.iter().map(whole))));
            }
        }
        let keys = keys_schema
            .fields()
            .iter()
            .zip(self.old_keys.columns())
            .map(|(f, c)| arrow_cast::cast(c, f.data_type()))
            .collect::<Result<Vec<_>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(n));
        Ok(TableChanges {
            schema: Arc::clone(newer),
            ops: self.ops.clone(),
            rows: RecordBatch::try_new_with_options(rows_schema, columns, &options)?,
            present,
            old_keys: RecordBatch::try_new_with_options(
                keys_schema,
                keys,
                &RecordBatchOptions::new().with_row_count(Some(self.old_keys.num_rows())),
            )?,
            key_changed: self.key_changed.clone(),
            upsert_window: self.upsert_window,
            copy_chunk: self.copy_chunk,
            source_tx: self.source_tx.clone(),
        })
    }

    /// The Arrow schema of [`old_keys`](Self::old_keys): the key columns, nullable.
    pub fn keys_schema(schema: &TableSchema) -> SchemaRef {
        let fields: Vec<Field> = schema
            .primary_key
            .iter()
            .filter_map(|&i| schema.columns.get(i))
            .map(|c| Field::new(&c.name, c.data_type.clone(), true))
            .collect();
        Arc::new(Schema::new(fields))
    }
}

/// Builds a [`TableChanges`] one change at a time, straight into Arrow builders.
///
/// For each change: [`begin`](Self::begin) with the op, then for every column exactly one of
/// [`value`](Self::value) (append one value or null to the returned builder) or
/// [`absent`](Self::absent), then for every key column either [`old_key`](Self::old_key) or none at
/// all (call [`no_old_key`](Self::no_old_key) once).
pub struct TableChangesBuilder {
    schema: Arc<TableSchema>,
    ops: Vec<Op>,
    columns: Vec<Box<dyn ArrayBuilder>>,
    /// Per column, which changes carry it; `None` while every change so far does (the common
    /// case costs nothing per value; the bitmap starts at the column's first absent value).
    present: Vec<Option<BooleanBufferBuilder>>,
    old_keys: Vec<Box<dyn ArrayBuilder>>,
    /// NULL old keys owed to `old_keys`: appended only when a key change follows, or made as one
    /// null array by `finish` (most runs change no key, and a null per row per key column through
    /// `append_null`'s downcasts was measurable in the initial copy).
    old_key_nulls: usize,
    key_changed: Vec<bool>,
}

impl TableChangesBuilder {
    pub fn new(schema: Arc<TableSchema>, capacity: usize) -> Self {
        let columns = schema
            .columns
            .iter()
            .map(|c| make_builder(&c.data_type, capacity))
            .collect();
        let old_keys = schema
            .primary_key
            .iter()
            .filter_map(|&i| schema.columns.get(i))
            .map(|c| make_builder(&c.data_type, 0))
            .collect();
        let n = schema.columns.len();
        TableChangesBuilder {
            present: (0..n).map(|_| None).collect(),
            columns,
            old_keys,
            old_key_nulls: 0,
            key_changed: Vec::with_capacity(capacity),
            ops: Vec::with_capacity(capacity),
            schema,
        }
    }

    pub fn schema(&self) -> &Arc<TableSchema> {
        &self.schema
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Starts a change.
    pub fn begin(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// Starts `rows` changes at once that all keep their key (`begin` and `no_old_key` for
    /// each); then fill every column with [`values`](Self::values).
    pub fn begin_rows(&mut self, op: Op, rows: usize) {
        self.ops.extend(std::iter::repeat_n(op, rows));
        self.key_changed.extend(std::iter::repeat_n(false, rows));
        self.old_key_nulls += rows;
    }

    /// The builder of column `index`: append exactly one value (or null) to it.
    pub fn value(&mut self, index: usize) -> Option<&mut dyn ArrayBuilder> {
        self.values(index, 1)
    }

    /// The builder of column `index` for the last `rows` changes begun: append exactly `rows`
    /// values (or nulls) to it.
    pub fn values(&mut self, index: usize, rows: usize) -> Option<&mut dyn ArrayBuilder> {
        if let Some(bits) = self.present.get_mut(index)?.as_mut() {
            bits.append_n(rows, true);
        }
        self.columns.get_mut(index).map(|b| b.as_mut())
    }

    /// Column `index` is absent from the current change.
    pub fn absent(&mut self, index: usize) -> Result<(), ArrowError> {
        let (Some(bits), Some(builder)) =
            (self.present.get_mut(index), self.columns.get_mut(index))
        else {
            return Err(ArrowError::InvalidArgumentError(format!(
                "column {index} out of range"
            )));
        };
        // Every earlier change of this run carried the column; the current one (the last op) is
        // the first without it when the bitmap does not exist yet.
        let earlier = self.ops.len().saturating_sub(1);
        bits.get_or_insert_with(|| {
            let mut b = BooleanBufferBuilder::new(earlier.max(64));
            b.append_n(earlier, true);
            b
        })
        .append(false);
        append_null(builder.as_mut())
    }

    /// The builder of key column `key_index` (an index into the primary key) for the old key of an
    /// update that changed its key. Call for every key column, then nothing else.
    pub fn old_key(&mut self, key_index: usize) -> Option<&mut dyn ArrayBuilder> {
        if key_index == 0 {
            self.key_changed.push(true);
            if self.pay_old_key_nulls().is_err() {
                return None;
            }
        }
        self.old_keys.get_mut(key_index).map(|b| b.as_mut())
    }

    /// The current change kept its key.
    pub fn no_old_key(&mut self) -> Result<(), ArrowError> {
        self.key_changed.push(false);
        self.old_key_nulls += 1;
        Ok(())
    }

    fn pay_old_key_nulls(&mut self) -> Result<(), ArrowError> {
        for b in &mut self.old_keys {
            for _ in 0..self.old_key_nulls {
                append_null(b.as_mut())?;
            }
        }
        self.old_key_nulls = 0;
        Ok(())
    }

    /// Finishes the run. Errors if a change did not fill every column.
    pub fn finish(mut self) -> Result<TableChanges, ArrowError> {
        let n = self.ops.len();
        let columns: Vec<ArrayRef> = self.columns.iter_mut().map(|b| b.finish()).collect();
        if let Some(bad) = columns.iter().position(|c| c.len() != n) {
            return Err(ArrowError::InvalidArgumentError(format!(
                "column {bad} of {} has {} values for {n} changes",
                self.schema.id,
                columns[bad].len()
            )));
        }
        let rows = RecordBatch::try_new_with_options(
            TableChanges::rows_schema(&self.schema),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(n)),
        )?;
        let keys_schema = TableChanges::keys_schema(&self.schema);
        let old: Vec<ArrayRef> = if self.old_keys.iter().all(|b| b.is_empty()) {
            // No change of the run changed its key: all-null columns, without a value each.
            keys_schema
                .fields()
                .iter()
                .map(|f| new_null_array(f.data_type(), n))
                .collect()
        } else {
            self.pay_old_key_nulls()?;
            self.old_keys.iter_mut().map(|b| b.finish()).collect()
        };
        let old_keys = RecordBatch::try_new_with_options(
            keys_schema,
            old,
            &RecordBatchOptions::new().with_row_count(Some(n)),
        )?;
        if self.key_changed.len() != n {
            return Err(ArrowError::InvalidArgumentError(format!(
                "{} old-key entries for {n} changes of {}",
                self.key_changed.len(),
                self.schema.id
            )));
        }
        let present = self
            .present
            .iter_mut()
            .map(|bits| bits.as_mut().map(|b| b.finish()))
            .collect();
        Ok(TableChanges {
            schema: self.schema,
            ops: self.ops,
            rows,
            present,
            old_keys,
            key_changed: self.key_changed,
            upsert_window: false,
            copy_chunk: None,
            source_tx: None,
        })
    }
}

/// Appends a null to any builder `make_builder` can return.
pub fn append_null(builder: &mut dyn ArrayBuilder) -> Result<(), ArrowError> {
    use arrow_array::builder::*;
    macro_rules! try_null {
        ($($t:ty),*) => {
            $(if let Some(b) = builder.as_any_mut().downcast_mut::<$t>() {
                b.append_null();
                return Ok(());
            })*
        };
    }
    try_null!(
        BooleanBuilder,
        Int8Builder,
        Int16Builder,
        Int32Builder,
        Int64Builder,
        UInt8Builder,
        UInt16Builder,
        UInt32Builder,
        UInt64Builder,
        Float32Builder,
        Float64Builder,
        Decimal128Builder,
        StringBuilder,
        LargeStringBuilder,
        BinaryBuilder,
        LargeBinaryBuilder,
        FixedSizeBinaryBuilder,
        Date32Builder,
        Time64MicrosecondBuilder,
        TimestampMicrosecondBuilder,
        ListBuilder<Box<dyn ArrayBuilder>>
    );
    Err(ArrowError::NotYetImplemented(
        "append_null: unsupported builder type".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changelog::schema::Column;
    use crate::test_fixtures::id_text_schema;
    use arrow_array::builder::{Int64Builder, StringBuilder};
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_schema::DataType;

    fn schema() -> Arc<TableSchema> {
        id_text_schema("t", "body")
    }

    fn int(b: Option<&mut dyn ArrayBuilder>, v: i64) {
        b.unwrap()
            .as_any_mut()
            .downcast_mut::<Int64Builder>()
            .unwrap()
            .append_value(v);
    }

    #[test]
    fn absent_is_not_null() {
        let mut b = TableChangesBuilder::new(schema(), 4);
        b.begin(Op::Insert);
        int(b.value(0), 1);
        crate::test_fixtures::cell::<StringBuilder>(&mut b, 1).append_null();
        b.no_old_key().unwrap();
        b.begin(Op::Update);
        int(b.value(0), 2);
        b.absent(1).unwrap();
        int(b.old_key(0), 1);
        let c = b.finish().unwrap();
        assert_eq!(c.len(), 2);
        assert!(c.is_present(1, 0), "NULL is a present value");
        assert!(!c.is_present(1, 1), "absent");
        assert!(c.is_present(0, 1));
        assert_eq!(c.key_changed, vec![false, true]);
        assert_eq!(c.old_keys.column(0).as_primitive::<Int64Type>().value(1), 1);
        assert!(c.has_absent());
    }

    #[test]
    fn old_keys_are_null_where_no_key_changed() {
        let body = |b: &mut TableChangesBuilder, rows: usize| {
            let s = b.values(1, rows).unwrap();
            let s = s.as_any_mut().downcast_mut::<StringBuilder>().unwrap();
            (0..rows).for_each(|_| s.append_null());
        };
        // Bulk rows only: the old-key column is one null array.
        let mut b = TableChangesBuilder::new(schema(), 4);
        b.begin_rows(Op::Insert, 3);
        let ids = b.values(0, 3).unwrap();
        let ids = ids.as_any_mut().downcast_mut::<Int64Builder>().unwrap();
        ids.append_slice(&[1, 2, 3]);
        body(&mut b, 3);
        let c = b.finish().unwrap();
        assert_eq!(c.old_keys.num_rows(), 3);
        assert_eq!(c.old_keys.column(0).null_count(), 3);
        assert_eq!(c.key_changed, vec![false; 3]);
        // Nulls owed before a key change land before its old key, and after it too.
        let mut b = TableChangesBuilder::new(schema(), 4);
        b.begin_rows(Op::Insert, 2);
        let ids = b.values(0, 2).unwrap();
        let ids = ids.as_any_mut().downcast_mut::<Int64Builder>().unwrap();
        ids.append_slice(&[1, 2]);
        body(&mut b, 2);
        b.begin(Op::Update);
        int(b.value(0), 5);
        body(&mut b, 1);
        int(b.old_key(0), 4);
        b.begin(Op::Delete);
        int(b.value(0), 5);
        body(&mut b, 1);
        b.no_old_key().unwrap();
        let c = b.finish().unwrap();
        let old = c.old_keys.column(0).as_primitive::<Int64Type>();
        assert_eq!(old.len(), 4);
        assert_eq!(
            (0..4)
                .map(|i| old.is_valid(i).then(|| old.value(i)))
                .collect::<Vec<_>>(),
            vec![None, None, Some(4), None]
        );
        assert_eq!(c.key_changed, vec![false, false, true, false]);
    }

    #[test]
    fn a_missing_column_value_is_an_error() {
        let mut b = TableChangesBuilder::new(schema(), 1);
        b.begin(Op::Insert);
        int(b.value(0), 1);
        b.no_old_key().unwrap();
        assert!(b.finish().is_err());
    }

    /// A column added inside a transaction: NULL in the earlier inserts and updates; absent in
    /// a keyed table's deletes (only the key identifies them), present NULL in a keyless
    /// table's deletes, which must stay whole rows (multiset deletes, issue 23).
    #[test]
    fn evolve_keeps_keyless_deletes_whole() {
        for keyless in [false, true] {
            let mut older = (*schema()).clone();
            if keyless {
                older.primary_key.clear();
            }
            let older = Arc::new(older);
            let mut newer = (*older).clone();
            newer.columns.push(Column {
                name: "extra".into(),
                data_type: DataType::Int64,
                nullable: true,
                source_type: "int8".into(),
                initial_default: None,
                former_names: Vec::new(),
            });
            let newer = Arc::new(newer);
            let mut b = TableChangesBuilder::new(older.clone(), 2);
            for op in [Op::Insert, Op::Delete] {
                b.begin(op);
                int(b.value(0), 1);
                crate::test_fixtures::cell::<StringBuilder>(&mut b, 1).append_value("a");
                b.no_old_key().unwrap();
            }
            let c = b.finish().unwrap().evolve(&newer).unwrap();
            assert!(c.is_present(2, 0) && c.rows.column(2).is_null(0));
            assert_eq!(c.is_present(2, 1), keyless, "keyless = {keyless}");
        }
    }
}
