//! A commit's input, checked before anything is planned or written: every change batch must
//! have the table's columns and types (the writer gathers rows across batches), and a planning
//! error is turned into a sink error that names the table, the key and the column.
//!
//! Sits at the start of the commit (`commit/mod.rs`, `RowDelta::new`), before `plan.rs`.

#![allow(clippy::result_large_err)]

use super::files::writer;
use super::plan::{KeyRef, PlanError};
use super::rows::lookup;
use crate::changelog::{TableChanges, TableSchema};
use crate::sinks::SinkError;

/// Every batch must have the columns and types of `schema` (the writer gathers across batches).
pub(super) fn check_batches(
    schema: &TableSchema,
    changes: &[TableChanges],
) -> Result<(), SinkError> {
    let rows = TableChanges::rows_schema(schema);
    let keys = TableChanges::keys_schema(schema);
    let same = |a: &arrow_schema::Schema, b: &arrow_schema::Schema| {
        a.fields().len() == b.fields().len()
            && a.fields()
                .iter()
                .zip(b.fields())
                .all(|(x, y)| x.data_type() == y.data_type())
    };
    for c in changes {
        if !same(&c.rows.schema(), &rows) || !same(&c.old_keys.schema(), &keys) {
            return Err(SinkError::SchemaChanged {
                table: schema.id.clone(),
                detail: format!(
                    "a change batch has columns ({}) but the table has ({})",
                    c.schema
                        .columns
                        .iter()
                        .map(|c| format!("{} {}", c.name, c.data_type))
                        .collect::<Vec<_>>()
                        .join(", "),
                    schema
                        .columns
                        .iter()
                        .map(|c| format!("{} {}", c.name, c.data_type))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        if c.ops.len() != c.rows.num_rows() || c.key_changed.len() != c.rows.num_rows() {
            return Err(SinkError::Data {
                table: schema.id.clone(),
                detail: "a change batch's ops, rows and key flags differ in length".into(),
            });
        }
    }
    Ok(())
}

/// A planning error as a sink error naming the table and key.
pub(super) fn plan_error(
    schema: &TableSchema,
    changes: &[TableChanges],
    e: PlanError,
) -> SinkError {
    let key_text = |k: KeyRef| {
        writer::key_batch(
            changes,
            &[k],
            &schema.primary_key,
            &TableChanges::keys_schema(schema),
        )
        .map(|b| lookup::key_text(&b, 0))
        .unwrap_or_else(|_| "?".into())
    };
    let detail = match &e {
        PlanError::NullKey { key } => format!("{e} (key {})", key_text(*key)),
        PlanError::Incomplete { key, column } => format!(
            "{e} (key {}, column {})",
            key_text(*key),
            schema.columns.get(*column).map_or("?", |c| c.name.as_str())
        ),
        PlanError::KeylessAbsent { column } | PlanError::PartialImage { column } => format!(
            "{e} (column {})",
            schema.columns.get(*column).map_or("?", |c| c.name.as_str())
        ),
        PlanError::NoSuchRow { row } => {
            let rows = TableChanges::rows_schema(schema);
            let text = super::rows::multiset::gather(changes, &[*row], &rows)
                .map(|b| lookup::key_text(&b, 0))
                .unwrap_or_else(|_| "?".into());
            format!("{e} (row {text})")
        }
        PlanError::Arrow(_) | PlanError::TooLarge | PlanError::Keyless { .. } => e.to_string(),
    };
    SinkError::Data {
        table: schema.id.clone(),
        detail,
    }
}
