//! The layout of a table's data files under its current metadata: the default partition spec's
//! transforms and the default sort order's keys, each bound to a column of the data file schema,
//! and [`Layout::arrange`], which splits one file's rows by partition tuple and orders them.
//! Pure: it sees Arrow arrays, never storage.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, UInt32Array};
use arrow_ord::sort::{lexsort_to_indices, SortColumn, SortOptions};
use arrow_row::{RowConverter, SortField as RowField};
use iceberg::spec::{
    NullOrder, PartitionSpecRef, Schema, SortDirection, Struct, StructType, TableMetadata, Type,
};
use iceberg::transform::{create_transform_function, BoxedTransformFunction};

/// Why a table's layout cannot be written (names the field; the caller names the table).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LayoutError {
    #[error("partition or sort field on source column id {0}, which is not a top-level column of the current schema")]
    NoColumn(i32),
    #[error("{0}")]
    Iceberg(#[from] iceberg::Error),
    #[error("{0}")]
    Arrow(#[from] arrow_schema::ArrowError),
}

/// A transform applied to one column of the file schema.
#[derive(Debug)]
struct Key {
    /// Index into [`Layout::columns`].
    input: usize,
    transform: BoxedTransformFunction,
}

/// A sort key: a transformed column and its direction and null order.
#[derive(Debug)]
struct SortKey {
    key: Key,
    options: SortOptions,
}

/// The rows of one partition of a file: their partition tuple and their positions in the input
/// file, in the order they are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    pub partition: Struct,
    pub rows: Vec<u32>,
}

/// How the table's current metadata lays data files out.
#[derive(Debug)]
pub(crate) struct Layout {
    pub spec: PartitionSpecRef,
    partition_type: StructType,
    /// Data file schema columns the partition and sort keys read, each once.
    columns: Vec<usize>,
    partition: Vec<Key>,
    sort: Vec<SortKey>,
    /// The default sort order's id, when it sorts.
    pub sort_order_id: Option<i32>,
}

impl Layout {
    /// The layout of `meta`'s default partition spec and sort order.
    pub fn of(meta: &TableMetadata) -> Result<Layout, LayoutError> {
        let schema = meta.current_schema();
        let spec = Arc::clone(meta.default_partition_spec());
        let partition_type = spec.partition_type(schema)?;
        let mut columns = Vec::new();
        let mut partition = Vec::new();
        for f in spec.fields() {
            partition.push(Key {
                input: input_of(schema, &mut columns, f.source_id)?,
                transform: create_transform_function(&f.transform)?,
            });
        }
        let order = meta.default_sort_order();
        let mut sort = Vec::new();
        for f in &order.fields {
            sort.push(SortKey {
                key: Key {
                    input: input_of(schema, &mut columns, f.source_id)?,
                    transform: create_transform_function(&f.transform)?,
                },
                options: SortOptions {
                    descending: f.direction == SortDirection::Descending,
                    nulls_first: f.null_order == NullOrder::First,
                },
            });
        }
        let sort_order_id = if order.is_unsorted() {
            None
        } else {
            i32::try_from(order.order_id).ok()
        };
        Ok(Layout {
            spec,
            partition_type,
            columns,
            partition,
            sort,
            sort_order_id,
        })
    }

    /// Unpartitioned (no partition field) and unsorted: files are written as planned.
    pub fn is_plain(&self) -> bool {
        self.partition.is_empty() && self.sort.is_empty()
    }

    /// The data file schema columns [`arrange`](Self::arrange) reads, in the order it expects them.
    pub fn columns(&self) -> &[usize] {
        &self.columns
    }

    /// The partition tuple of a file of this layout's spec holding no partition field.
    fn empty_partition(&self) -> Struct {
        Struct::from_iter(self.partition_type.fields().iter().map(|_| None))
    }

    /// Splits the rows of one file by partition tuple, each part's rows in the sort order (ties
    /// and unsorted tables: the input order). `columns` holds the rows' [`columns`](Self::columns),
    /// in the data file schema's types. Parts come in the order of their first row.
    pub fn arrange(&self, columns: &RecordBatch) -> Result<Vec<Part>, LayoutError> {
        let rows = columns.num_rows();
        let order: Vec<u32> = if self.sort.is_empty() {
            (0..rows as u32).collect()
        } else {
            let mut sort_columns = Vec::with_capacity(self.sort.len());
            for k in &self.sort {
                sort_columns.push(SortColumn {
                    values: self.transformed(&k.key, columns)?,
                    options: Some(k.options),
                });
            }
            lexsort_to_indices(&sort_columns, None)?.values().to_vec()
        };
        if self.partition.is_empty() {
            return Ok(vec![Part {
                partition: self.empty_partition(),
                rows: order,
            }]);
        }
        let values: Vec<ArrayRef> = self
            .partition
            .iter()
            .map(|k| self.transformed(k, columns))
            .collect::<Result<_, _>>()?;
        let converter = RowConverter::new(
            values
                .iter()
                .map(|v| RowField::new(v.data_type().clone()))
                .collect(),
        )?;
        let encoded = converter.convert_columns(&values)?;
        // Group by the encoded tuple, in order of first appearance (in write order).
        let mut groups: HashMap<arrow_row::Row<'_>, usize> = HashMap::new();
        let mut parts: Vec<Vec<u32>> = Vec::new();
        let mut first_rows: Vec<u32> = Vec::new();
        for &r in &order {
            let row = encoded.row(r as usize);
            let g = *groups.entry(row).or_insert_with(|| {
                parts.push(Vec::new());
                first_rows.push(r);
                parts.len() - 1
            });
            if let Some(p) = parts.get_mut(g) {
                p.push(r);
            }
        }
        let tuples = self.tuples(&values, &first_rows)?;
        Ok(tuples
            .into_iter()
            .zip(parts)
            .map(|(partition, rows)| Part { partition, rows })
            .collect())
    }

    /// Key `k` of every row.
    fn transformed(&self, k: &Key, columns: &RecordBatch) -> Result<ArrayRef, LayoutError> {
        let input = columns.columns().get(k.input).cloned().ok_or_else(|| {
            arrow_schema::ArrowError::InvalidArgumentError(format!(
                "layout column {} of {}",
                k.input,
                columns.num_columns()
            ))
        })?;
        Ok(k.transform.transform(input)?)
    }

    /// The partition tuples of rows `at` of the transformed partition `values`.
    fn tuples(&self, values: &[ArrayRef], at: &[u32]) -> Result<Vec<Struct>, LayoutError> {
        let indices = UInt32Array::from(at.to_vec());
        let mut fields: Vec<std::vec::IntoIter<Option<iceberg::spec::Literal>>> = Vec::new();
        for (v, f) in values.iter().zip(self.partition_type.fields()) {
            let taken = arrow_select::take::take(v.as_ref(), &indices, None)?;
            let ty: &Type = &f.field_type;
            fields.push(iceberg::arrow::arrow_primitive_to_literal(&taken, ty)?.into_iter());
        }
        Ok(at
            .iter()
            .map(|_| Struct::from_iter(fields.iter_mut().map(|f| f.next().flatten())))
            .collect())
    }
}

/// The index into `columns` of the data file column of field `source_id` (added when new).
fn input_of(
    schema: &Schema,
    columns: &mut Vec<usize>,
    source_id: i32,
) -> Result<usize, LayoutError> {
    let column = schema
        .as_struct()
        .fields()
        .iter()
        .position(|f| f.id == source_id)
        .ok_or(LayoutError::NoColumn(source_id))?;
    Ok(match columns.iter().position(|&c| c == column) {
        Some(i) => i,
        None => {
            columns.push(column);
            columns.len() - 1
        }
    })
}
