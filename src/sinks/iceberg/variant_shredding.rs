//! Shredding of variant columns (`json = "variant"`): the object fields that recur in a data
//! file's values are written as Parquet `typed_value` columns beside the variant's `value`
//! (Parquet "Variant Shredding" spec), so a reader of one path reads a typed column, with its
//! statistics, instead of decoding every value. A file-level layout: the table's schema stays
//! `variant`, and each file picks its own paths.
//!
//! **How paths are picked** ([`Shredding::pick`]), per variant column of a file, from the first
//! [`SAMPLE_ROWS`] values of the file's first batch: an object field (top-level, or nested up to
//! [`MAX_DEPTH`] levels in an object field picked the same way) is shredded when at least half of
//! the sampled non-NULL values hold it with one type: boolean, integer (any width, shredded as
//! 64 bits), double, string, or an exact decimal of one scale. At most [`MAX_PATHS`] such fields
//! a column, the most frequent first. A column whose sample has none stays unshredded.
//!
//! **How values are written** ([`Shredding::apply`]): a field's value of the picked type goes to
//! its `typed_value`; any other (another type, a JSON `null`, an array) stays in its `value`,
//! encoded with the row's metadata; a field a row lacks has both NULL; the fields nobody picked
//! stay in the row's `value` as an object of those fields only (NULL when there are none); a row
//! that is not an object keeps its whole value in `value`. The types are checked exactly rather
//! than cast (parquet-variant-compute's `shred_variant` casts `true` into an integer column as 1
//! and truncates 1.5 to 1), so every value reads back as written: an integer narrower than 64
//! bits reads back as the same number in a wider type, which JSON does not tell apart.
//!
//! The initial copy, the stream and compaction (which re-picks for its output) all write through
//! here ([`crate::sinks::iceberg::files::encode`]); cdcd reads its own files back unshredded
//! (`variant::cast`).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Decimal128Builder, Float64Builder, Int64Builder, StringBuilder,
};
use arrow_array::{Array, ArrayRef, RecordBatch, StructArray};
use arrow_buffer::NullBufferBuilder;
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use parquet_variant::{ObjectBuilder, ReadOnlyMetadataBuilder, Variant, VariantObject};
use parquet_variant_compute::{VariantArray, VariantValueArrayBuilder};

/// Values of a file's first batch that pick its shredded paths.
const SAMPLE_ROWS: usize = 1000;
/// At most this many shredded fields a column (nested ones included).
const MAX_PATHS: usize = 16;
/// Object nesting below the top level that is looked into.
const MAX_DEPTH: usize = 2;
/// The Arrow extension type name of a variant column.
const EXTENSION: &str = "arrow.parquet.variant";

/// A shredded field's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Scalar {
    Boolean,
    Int,
    Double,
    String,
    Decimal(u8),
}

impl Scalar {
    /// The type `v` shreds as, if any.
    fn of(v: &Variant) -> Option<Scalar> {
        Some(match v {
            Variant::BooleanTrue | Variant::BooleanFalse => Scalar::Boolean,
            Variant::Int8(_) | Variant::Int16(_) | Variant::Int32(_) | Variant::Int64(_) => {
                Scalar::Int
            }
            Variant::Double(_) => Scalar::Double,
            Variant::String(_) | Variant::ShortString(_) => Scalar::String,
            Variant::Decimal4(d) => Scalar::Decimal(d.scale()),
            Variant::Decimal8(d) => Scalar::Decimal(d.scale()),
            Variant::Decimal16(d) => Scalar::Decimal(d.scale()),
            _ => return None,
        })
    }

    fn data_type(self) -> DataType {
        match self {
            Scalar::Boolean => DataType::Boolean,
            Scalar::Int => DataType::Int64,
            Scalar::Double => DataType::Float64,
            Scalar::String => DataType::Utf8,
            // The spec's largest decimal: every variant decimal of that scale fits.
            Scalar::Decimal(scale) => DataType::Decimal128(38, scale as i8),
        }
    }
}

/// A shredded field: a scalar, or an object with shredded fields of its own.
#[derive(Debug, Clone, PartialEq)]
enum Shape {
    Scalar(Scalar),
    Object(Vec<(String, Shape)>),
}

/// What the sample held at one object field.
#[derive(Default)]
struct Seen {
    scalars: BTreeMap<Scalar, usize>,
    objects: usize,
    fields: BTreeMap<String, Seen>,
}

impl Seen {
    /// Counts the fields of `object`, nested objects down to [`MAX_DEPTH`].
    fn object(&mut self, object: &VariantObject, depth: usize) {
        for (name, value) in object.iter() {
            let seen = self.fields.entry(name.to_owned()).or_default();
            match &value {
                Variant::Object(inner) => {
                    seen.objects += 1;
                    if depth < MAX_DEPTH {
                        seen.object(inner, depth + 1);
                    }
                }
                v => {
                    if let Some(s) = Scalar::of(v) {
                        *seen.scalars.entry(s).or_default() += 1;
                    }
                }
            }
        }
    }

    /// The fields held by at least half of `rows`, the most frequent first, within `budget`.
    fn shape(&self, rows: usize, budget: &mut usize) -> Vec<(String, Shape)> {
        let mut candidates: Vec<(usize, &String, Shape)> = Vec::new();
        for (name, seen) in &self.fields {
            let top = seen.scalars.iter().max_by_key(|(_, n)| **n);
            match top {
                Some((s, n)) if *n * 2 >= rows && *n >= seen.objects => {
                    candidates.push((*n, name, Shape::Scalar(*s)));
                }
                _ if seen.objects * 2 >= rows => {
                    candidates.push((seen.objects, name, Shape::Object(Vec::new())));
                }
                _ => {}
            }
        }
        candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
        let mut picked = Vec::new();
        for (_, name, shape) in candidates {
            if *budget == 0 {
                break;
            }
            match shape {
                Shape::Scalar(_) => {
                    *budget -= 1;
                    picked.push((name.clone(), shape));
                }
                Shape::Object(_) => {
                    let inner = match self.fields.get(name) {
                        Some(seen) => seen.shape(rows, budget),
                        None => Vec::new(),
                    };
                    if !inner.is_empty() {
                        picked.push((name.clone(), Shape::Object(inner)));
                    }
                }
            }
        }
        picked.sort_by(|a, b| a.0.cmp(&b.0));
        picked
    }
}

/// The shredded layout of one file: the fields picked per variant column (none for other
/// columns), and the file's Arrow schema with them.
#[derive(Debug, Clone)]
pub(crate) struct Shredding {
    columns: Vec<Vec<(String, Shape)>>,
    schema: SchemaRef,
}

/// Whether `field` is a variant column as cdcd writes it (`variant::file_field`).
fn is_variant(field: &Field) -> bool {
    field
        .metadata()
        .get("ARROW:extension:name")
        .is_some_and(|n| n == EXTENSION)
}

impl Shredding {
    /// The layout for a file whose first batch is `sample` (see the module doc).
    pub(crate) fn pick(sample: &RecordBatch) -> Result<Shredding, ArrowError> {
        let schema = sample.schema();
        let mut columns = Vec::with_capacity(schema.fields().len());
        let mut fields = Vec::with_capacity(schema.fields().len());
        for (field, column) in schema.fields().iter().zip(sample.columns()) {
            let picked = if is_variant(field) {
                pick_column(column)?
            } else {
                Vec::new()
            };
            fields.push(match picked.is_empty() {
                true => field.clone(),
                false => Arc::new(
                    field
                        .as_ref()
                        .clone()
                        .with_data_type(shredded_type(&picked)),
                ),
            });
            columns.push(picked);
        }
        let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
        Ok(Shredding { columns, schema })
    }

    /// `batch` (the sample's schema) in this layout.
    pub(crate) fn apply(&self, batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
        if self.columns.iter().all(Vec::is_empty) {
            return Ok(batch.clone());
        }
        let mut columns = Vec::with_capacity(batch.num_columns());
        for (column, picked) in batch.columns().iter().zip(&self.columns) {
            columns.push(match picked.is_empty() {
                true => column.clone(),
                false => shred_column(column, picked)?,
            });
        }
        RecordBatch::try_new(self.schema.clone(), columns)
    }
}

/// `batches` (one schema) shredded with the layout their first batch picks.
pub(crate) fn shred(batches: &[RecordBatch]) -> Result<Vec<RecordBatch>, ArrowError> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let shredding = Shredding::pick(first)?;
    batches.iter().map(|b| shredding.apply(b)).collect()
}

fn pick_column(column: &ArrayRef) -> Result<Vec<(String, Shape)>, ArrowError> {
    let values = VariantArray::try_new(column.as_ref())?;
    let mut seen = Seen::default();
    let mut rows = 0;
    for i in 0..values.len().min(SAMPLE_ROWS) {
        if values.is_null(i) {
            continue;
        }
        rows += 1;
        if let Variant::Object(object) = values.try_value(i)? {
            seen.object(&object, 0);
        }
    }
    if rows == 0 {
        return Ok(Vec::new());
    }
    let mut budget = MAX_PATHS;
    Ok(seen.shape(rows, &mut budget))
}

/// The Arrow type of a column shredded as `fields`.
fn shredded_type(fields: &[(String, Shape)]) -> DataType {
    DataType::Struct(Fields::from(vec![
        Field::new("metadata", DataType::Binary, false),
        Field::new("value", DataType::Binary, true),
        Field::new("typed_value", object_type(fields), true),
    ]))
}

fn object_type(fields: &[(String, Shape)]) -> DataType {
    let fields: Vec<FieldRef> = fields
        .iter()
        .map(|(name, shape)| {
            let typed = match shape {
                Shape::Scalar(s) => s.data_type(),
                Shape::Object(inner) => object_type(inner),
            };
            Arc::new(Field::new(
                name,
                DataType::Struct(Fields::from(vec![
                    Field::new("value", DataType::Binary, true),
                    Field::new("typed_value", typed, true),
                ])),
                false,
            ))
        })
        .collect();
    DataType::Struct(Fields::from(fields))
}

/// A variant column (unshredded) written as `fields`.
fn shred_column(column: &ArrayRef, fields: &[(String, Shape)]) -> Result<ArrayRef, ArrowError> {
    let values = VariantArray::try_new(column.as_ref())?;
    let shape = Shape::Object(fields.to_vec());
    let mut root = FieldBuilder::new(&shape, values.len());
    for i in 0..values.len() {
        if values.is_null(i) {
            root.missing();
        } else {
            root.append(values.try_value(i)?)?;
        }
    }
    let (value, typed_value) = root.finish()?;
    let DataType::Struct(children) = shredded_type(fields) else {
        return Err(ArrowError::CastError("a shredded variant's type".into()));
    };
    let metadata = arrow_cast::cast(values.metadata_field(), &DataType::Binary)?;
    Ok(Arc::new(StructArray::try_new(
        children,
        vec![metadata, value, typed_value],
        values.inner().nulls().cloned(),
    )?))
}

/// The `typed_value` of one shredded field.
enum Typed<'s> {
    Boolean(BooleanBuilder),
    Int(Int64Builder),
    Double(Float64Builder),
    String(StringBuilder),
    Decimal(u8, Decimal128Builder),
    Object(Vec<(&'s str, FieldBuilder<'s>)>, NullBufferBuilder),
}

/// One shredded field's `value` and `typed_value`, row by row.
struct FieldBuilder<'s> {
    value: VariantValueArrayBuilder,
    typed: Typed<'s>,
}

impl<'s> FieldBuilder<'s> {
    fn new(shape: &'s Shape, rows: usize) -> FieldBuilder<'s> {
        let typed = match shape {
            Shape::Scalar(Scalar::Boolean) => Typed::Boolean(BooleanBuilder::with_capacity(rows)),
            Shape::Scalar(Scalar::Int) => Typed::Int(Int64Builder::with_capacity(rows)),
            Shape::Scalar(Scalar::Double) => Typed::Double(Float64Builder::with_capacity(rows)),
            Shape::Scalar(Scalar::String) => Typed::String(StringBuilder::new()),
            Shape::Scalar(Scalar::Decimal(scale)) => Typed::Decimal(
                *scale,
                Decimal128Builder::with_capacity(rows)
                    .with_data_type(Scalar::Decimal(*scale).data_type()),
            ),
            Shape::Object(fields) => Typed::Object(
                fields
                    .iter()
                    .map(|(name, s)| (name.as_str(), FieldBuilder::new(s, rows)))
                    .collect(),
                NullBufferBuilder::new(rows),
            ),
        };
        FieldBuilder {
            value: VariantValueArrayBuilder::new(rows),
            typed,
        }
    }

    /// A row without this field (or a NULL row): both NULL.
    fn missing(&mut self) {
        self.value.append_null();
        self.typed_null();
    }

    fn typed_null(&mut self) {
        match &mut self.typed {
            Typed::Boolean(b) => b.append_null(),
            Typed::Int(b) => b.append_null(),
            Typed::Double(b) => b.append_null(),
            Typed::String(b) => b.append_null(),
            Typed::Decimal(_, b) => b.append_null(),
            Typed::Object(fields, nulls) => {
                nulls.append_null();
                for (_, f) in fields {
                    f.missing();
                }
            }
        }
    }

    fn append(&mut self, v: Variant) -> Result<(), ArrowError> {
        let typed = match (&mut self.typed, &v) {
            (Typed::Boolean(b), Variant::BooleanTrue | Variant::BooleanFalse) => {
                b.append_value(matches!(v, Variant::BooleanTrue));
                true
            }
            (
                Typed::Int(b),
                Variant::Int8(_) | Variant::Int16(_) | Variant::Int32(_) | Variant::Int64(_),
            ) => match v.as_int64() {
                Some(i) => {
                    b.append_value(i);
                    true
                }
                None => false,
            },
            (Typed::Double(b), Variant::Double(d)) => {
                b.append_value(*d);
                true
            }
            (Typed::String(b), Variant::String(_) | Variant::ShortString(_)) => {
                match v.as_string() {
                    Some(s) => {
                        b.append_value(s);
                        true
                    }
                    None => false,
                }
            }
            (Typed::Decimal(scale, b), _) => match unscaled(&v, *scale) {
                Some(d) => {
                    b.append_value(d);
                    true
                }
                None => false,
            },
            (Typed::Object(fields, nulls), Variant::Object(object)) => {
                nulls.append_non_null();
                for (name, f) in fields.iter_mut() {
                    match object.get(name) {
                        Some(fv) => f.append(fv)?,
                        None => f.missing(),
                    }
                }
                let picked: Vec<&str> = fields.iter().map(|(n, _)| *n).collect();
                self.residual(object, &picked);
                return Ok(());
            }
            _ => false,
        };
        if typed {
            self.value.append_null();
        } else {
            self.typed_null();
            self.value.append_value(v);
        }
        Ok(())
    }

    /// The row's `value` for an object whose `picked` fields went to `typed_value`: the other
    /// fields, NULL when there are none.
    fn residual(&mut self, object: &VariantObject, picked: &[&str]) {
        let rest: Vec<(&str, Variant)> = object
            .iter()
            .filter(|(name, _)| !picked.contains(name))
            .collect();
        if rest.is_empty() {
            self.value.append_null();
            return;
        }
        let mut metadata = ReadOnlyMetadataBuilder::new(&object.metadata);
        let state = self.value.parent_state(&mut metadata);
        let mut out = ObjectBuilder::new(state, false);
        for (name, value) in rest {
            out.insert_bytes(name, value);
        }
        out.finish();
    }

    /// The field's `value` and `typed_value` arrays.
    fn finish(self) -> Result<(ArrayRef, ArrayRef), ArrowError> {
        let value: ArrayRef = Arc::new(self.value.build()?);
        let value = arrow_cast::cast(&value, &DataType::Binary)?;
        let typed: ArrayRef = match self.typed {
            Typed::Boolean(mut b) => Arc::new(b.finish()),
            Typed::Int(mut b) => Arc::new(b.finish()),
            Typed::Double(mut b) => Arc::new(b.finish()),
            Typed::String(mut b) => Arc::new(b.finish()),
            Typed::Decimal(_, mut b) => Arc::new(b.finish()),
            Typed::Object(fields, mut nulls) => {
                let mut children = Vec::with_capacity(fields.len());
                let mut arrays = Vec::with_capacity(fields.len());
                for (name, f) in fields {
                    let (value, typed) = f.finish()?;
                    let inner = Fields::from(vec![
                        Field::new("value", DataType::Binary, true),
                        Field::new("typed_value", typed.data_type().clone(), true),
                    ]);
                    let pair = StructArray::try_new(inner.clone(), vec![value, typed], None)?;
                    children.push(Field::new(name, DataType::Struct(inner), false));
                    arrays.push(Arc::new(pair) as ArrayRef);
                }
                Arc::new(StructArray::try_new(
                    Fields::from(children),
                    arrays,
                    nulls.finish(),
                )?)
            }
        };
        Ok((value, typed))
    }
}

/// `v`'s unscaled value when it is an exact decimal of `scale`.
fn unscaled(v: &Variant, scale: u8) -> Option<i128> {
    match v {
        Variant::Decimal4(d) if d.scale() == scale => Some(i128::from(d.integer())),
        Variant::Decimal8(d) if d.scale() == scale => Some(i128::from(d.integer())),
        Variant::Decimal16(d) if d.scale() == scale => Some(d.integer()),
        _ => None,
    }
}

#[cfg(test)]
#[path = "variant_shredding_tests.rs"]
mod tests;
