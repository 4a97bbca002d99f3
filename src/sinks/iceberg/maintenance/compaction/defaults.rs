//! The `initial-default` of columns a rewritten file predates (Iceberg v3, "Default values":
//! rows of a data file written before a field existed read its `initial-default`). A rewrite
//! writes those rows into a file that has the column, where readers take the stored value, so
//! it must store the default, not NULL. Pure.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, Decimal128Array, Float32Array, Float64Array, Int32Array, Int64Array,
    RecordBatch, StringArray,
};
use arrow_schema::{ArrowError, DataType};
use iceberg::spec::{Literal, PrimitiveLiteral, Schema};

/// The current schema's top-level columns with an `initial-default`, by name.
pub(crate) fn initial_defaults(schema: &Schema) -> Vec<(String, Literal)> {
    schema
        .as_struct()
        .fields()
        .iter()
        .filter_map(|f| f.initial_default.clone().map(|d| (f.name.clone(), d)))
        .collect()
}

/// `projected` (rows of `original`, projected onto the table's file schema, where a column the
/// file lacks reads NULL) with each such column that has an initial default filled with it.
pub(crate) fn fill(
    original: &RecordBatch,
    projected: RecordBatch,
    defaults: &[(String, Literal)],
) -> Result<RecordBatch, ArrowError> {
    if defaults.is_empty() {
        return Ok(projected);
    }
    let schema = projected.schema();
    let mut columns = projected.columns().to_vec();
    for (name, value) in defaults {
        if original.column_by_name(name).is_some() {
            continue;
        }
        let Ok(i) = schema.index_of(name) else {
            continue;
        };
        if let (Some(slot), Some(field)) = (columns.get_mut(i), schema.fields().get(i)) {
            *slot = repeated(value, field.data_type(), projected.num_rows())?;
        }
    }
    RecordBatch::try_new(schema, columns)
}

/// `n` copies of `value` as an array of `data_type` (the types cdcd stores defaults for:
/// booleans, numbers, text, dates).
fn repeated(value: &Literal, data_type: &DataType, n: usize) -> Result<ArrayRef, ArrowError> {
    let unsupported =
        || ArrowError::NotYetImplemented(format!("an initial default {value:?} for {data_type}"));
    let Literal::Primitive(p) = value else {
        return Err(unsupported());
    };
    let natural: ArrayRef = match p {
        PrimitiveLiteral::Boolean(b) => Arc::new(BooleanArray::from(vec![*b; n])),
        PrimitiveLiteral::Int(v) => Arc::new(Int32Array::from(vec![*v; n])),
        PrimitiveLiteral::Long(v) => Arc::new(Int64Array::from(vec![*v; n])),
        PrimitiveLiteral::Float(v) => Arc::new(Float32Array::from(vec![v.0; n])),
        PrimitiveLiteral::Double(v) => Arc::new(Float64Array::from(vec![v.0; n])),
        PrimitiveLiteral::String(s) => Arc::new(StringArray::from(vec![s.as_str(); n])),
        PrimitiveLiteral::Int128(v) => match data_type {
            DataType::Decimal128(precision, scale) => Arc::new(
                Decimal128Array::from(vec![*v; n]).with_precision_and_scale(*precision, *scale)?,
            ),
            _ => return Err(unsupported()),
        },
        _ => return Err(unsupported()),
    };
    // Int → date, string → large string, and the like; an exact cast or an error, never NULL.
    let options = arrow_cast::CastOptions {
        safe: false,
        ..Default::default()
    };
    arrow_cast::cast_with_options(&natural, data_type, &options)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Date32Type, Decimal128Type, Int64Type};
    use arrow_array::Array;
    use arrow_schema::{Field, Schema as ArrowSchema};

    #[test]
    fn only_columns_the_file_lacks_take_their_default() {
        let file = RecordBatch::try_new(
            Arc::new(ArrowSchema::new(vec![Field::new(
                "id",
                DataType::Int64,
                true,
            )])),
            vec![Arc::new(Int64Array::from(vec![1, 2]))],
        )
        .unwrap();
        let table = Arc::new(ArrowSchema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("c", DataType::Int64, true),
            Field::new("d", DataType::Date32, true),
            Field::new("n", DataType::Decimal128(10, 2), true),
            Field::new("e", DataType::Utf8, true),
        ]));
        let projected = RecordBatch::try_new(
            Arc::clone(&table),
            table
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    if i == 0 {
                        Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef
                    } else {
                        arrow_array::new_null_array(f.data_type(), 2)
                    }
                })
                .collect(),
        )
        .unwrap();
        let defaults = vec![
            ("id".to_owned(), Literal::long(9)),
            ("c".to_owned(), Literal::long(42)),
            ("d".to_owned(), Literal::date(19000)),
            ("n".to_owned(), Literal::decimal(1250)),
        ];
        let filled = fill(&file, projected, &defaults).unwrap();
        // `id` is in the file: its values stay; `e` has no default: NULL.
        assert_eq!(filled.column(0).as_primitive::<Int64Type>().value(1), 2);
        assert_eq!(filled.column(1).as_primitive::<Int64Type>().value(1), 42);
        assert_eq!(
            filled.column(2).as_primitive::<Date32Type>().value(0),
            19000
        );
        let n = filled.column(3).as_primitive::<Decimal128Type>();
        assert_eq!((n.value(0), n.scale()), (1250, 2));
        assert_eq!(filled.column(4).null_count(), 2);
    }
}
