//! JSON columns as Paimon `VARIANT` (`json = "variant"` in `[sink.tables."…"]`,
//! docs/table-settings.md).
//!
//! Paimon's VARIANT is, in a Parquet data file, an unannotated group of two required binaries,
//! `value` then `metadata`, holding the variant binary encoding (Spark's, which Parquet's
//! variant spec took over): what pypaimon 2.1 writes for a VARIANT column and reads back as
//! `struct<value: binary not null, metadata: binary not null>` (checked against the test bed's
//! pypaimon). No shredding.
//!
//! The sink converts at its entry ([`with_variants`]): a JSON column of a table that opts in
//! becomes that struct in the table's schema and in the run's rows, with the values the Iceberg
//! sink writes (`sinks/iceberg/variant.rs`: numbers keep their digits, keys sorted). Below it
//! the column is a struct like any stored type: the schema file says `VARIANT`, files hold it,
//! the lookup that completes a partial update reads it back as it was written.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, StructArray};
use arrow_schema::{ArrowError, DataType, Field, Fields, Schema};

use crate::changelog::{TableChanges, TableSchema};
use crate::config::{JsonAs, TableSettings};
use crate::sinks::cdc_columns::WithColumns;
use crate::sinks::iceberg::variant as iceberg_variant;
use crate::sinks::SinkError;

/// The stored Arrow type of a Paimon VARIANT column.
pub(super) fn arrow_type() -> DataType {
    DataType::Struct(Fields::from(vec![
        Field::new("value", DataType::Binary, false),
        Field::new("metadata", DataType::Binary, false),
    ]))
}

/// Whether `dt` is [`arrow_type`].
pub(super) fn is_variant(dt: &DataType) -> bool {
    *dt == arrow_type()
}

/// `schema` and `changes` with the JSON columns the table's `json` (and `json_columns`) choose as
/// [`arrow_type`]; `None` when nothing changes.
pub(super) fn with_variants(
    settings: &TableSettings,
    schema: &Arc<TableSchema>,
    changes: &[TableChanges],
) -> Result<Option<WithColumns>, SinkError> {
    if settings.json != JsonAs::Variant {
        return Ok(None);
    }
    iceberg_variant::check_json_columns(schema, settings)?;
    let at: Vec<usize> = (0..schema.columns.len())
        .filter(|&i| {
            schema
                .columns
                .get(i)
                .is_some_and(|c| iceberg_variant::chosen(settings, c))
        })
        .collect();
    if at.is_empty() {
        return Ok(None);
    }
    let mut table = schema.as_ref().clone();
    for &i in &at {
        if let Some(c) = table.columns.get_mut(i) {
            c.data_type = arrow_type();
        }
    }
    let table = Arc::new(table);
    let arrow = |source| SinkError::Arrow {
        context: format!("{}: JSON as Paimon variant", schema.id),
        source,
    };
    let mut out = Vec::with_capacity(changes.len());
    for c in changes {
        let mut fields: Vec<Field> = c
            .rows
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        let mut columns: Vec<ArrayRef> = c.rows.columns().to_vec();
        for &i in &at {
            if let (Some(f), Some(col)) = (fields.get_mut(i), columns.get_mut(i)) {
                *col = to_variant(col).map_err(arrow)?;
                *f = f.clone().with_data_type(arrow_type()).with_nullable(true);
            }
        }
        let rows = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(arrow)?;
        out.push(TableChanges {
            schema: Arc::clone(&table),
            rows,
            ..c.clone()
        });
    }
    Ok(Some((table, out)))
}

/// JSON texts as Paimon variant values (SQL NULL stays NULL).
fn to_variant(texts: &ArrayRef) -> Result<ArrayRef, ArrowError> {
    let values = crate::sinks::iceberg::variant::json_to_variant(texts)?;
    let values = values
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or_else(|| ArrowError::CastError("a variant array".into()))?;
    let (metadata, value) = (values.column(0), values.column(1));
    let DataType::Struct(fields) = arrow_type() else {
        return Err(ArrowError::CastError("the Paimon variant type".into()));
    };
    Ok(Arc::new(StructArray::try_new(
        fields,
        vec![Arc::clone(value), Arc::clone(metadata)],
        values.nulls().cloned(),
    )?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::sinks::lsm::schema::{evolution, paimon_schema, Evolution};
    use crate::test_fixtures::{column, table};

    #[test]
    fn a_variant_column_is_paimon_variant_never_a_key_and_no_evolution_of_a_string() {
        let t = |j: DataType, key: Vec<usize>| {
            table(
                "public",
                "t",
                vec![
                    column("id", DataType::Int64, false, "int8"),
                    column("j", j, true, "jsonb"),
                ],
                key,
            )
        };
        let variant = paimon_schema(&t(arrow_type(), vec![0]), BTreeMap::new(), &[]).unwrap();
        assert_eq!(variant.fields[1].data_type, "VARIANT");
        assert_eq!(
            crate::sinks::lsm::schema::stored_type(&variant.fields[1].data_type),
            Some(arrow_type())
        );
        assert!(paimon_schema(&t(arrow_type(), vec![1]), BTreeMap::new(), &[]).is_err());
        let string = paimon_schema(&t(DataType::Utf8, vec![0]), BTreeMap::new(), &[]).unwrap();
        assert!(matches!(
            evolution(&string, &variant, &[]),
            Evolution::Incompatible(_)
        ));
    }
}
