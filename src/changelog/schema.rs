//! Table identity and schema as the changelog carries them: source column types already mapped to
//! Arrow, plus the primary key.

use std::fmt;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};

/// A source table: `schema.table` in Postgres, `database.table` in MySQL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableId {
    pub namespace: String,
    pub name: String,
}

impl TableId {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        TableId {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for TableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.namespace, self.name)
    }
}

/// One column: its name, its Arrow type, and the source type it came from (for messages and docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub data_type: DataType,
    pub nullable: bool,
    /// The source's own type name, e.g. `numeric(12,2)` or `varchar`.
    pub source_type: String,
}

/// The shape of a table's rows: columns in source order, and which of them form the primary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSchema {
    pub id: TableId,
    pub columns: Vec<Column>,
    /// Indexes into `columns`, in key order. Empty: the table has no primary key.
    pub primary_key: Vec<usize>,
}

impl TableSchema {
    /// The Arrow schema of this table's rows (all fields nullable except the key columns).
    pub fn arrow_schema(&self) -> SchemaRef {
        let fields: Vec<Field> = self
            .columns
            .iter()
            .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable))
            .collect();
        Arc::new(Schema::new(fields))
    }

    /// Position of the column named `name`.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// Whether rows decoded under `self` can be committed as rows of `newer`, in one batch list:
    /// the same columns in the same order with the same Arrow types and the same key, each column
    /// as nullable as before or more. Only the source's type names differ (`varchar(10)` →
    /// `varchar(200)`, `varchar` → `text`, `json` → `jsonb`), which no sink stores. A schema change
    /// that fails this test changes what the sink stores, so rows of both sides cannot share a
    /// commit.
    pub fn rows_fit(&self, newer: &TableSchema) -> bool {
        self.id == newer.id
            && self.primary_key == newer.primary_key
            && self.columns.len() == newer.columns.len()
            && self.columns.iter().zip(&newer.columns).all(|(old, new)| {
                old.name == new.name
                    && old.data_type == new.data_type
                    && (new.nullable || !old.nullable)
            })
    }

    /// The columns as `name source_type`, for messages.
    pub fn describe_columns(&self) -> String {
        self.columns
            .iter()
            .map(|c| format!("{} {}", c.name, c.source_type))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn key_names(&self) -> Vec<&str> {
        self.primary_key
            .iter()
            .filter_map(|&i| self.columns.get(i).map(|c| c.name.as_str()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(columns: &[(&str, DataType, bool, &str)]) -> TableSchema {
        TableSchema {
            id: TableId::new("public", "a"),
            columns: columns
                .iter()
                .map(|(name, data_type, nullable, source_type)| Column {
                    name: (*name).into(),
                    data_type: data_type.clone(),
                    nullable: *nullable,
                    source_type: (*source_type).into(),
                })
                .collect(),
            primary_key: vec![0],
        }
    }

    #[test]
    fn rows_fit_ignores_source_type_names_only() {
        let old = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("v", DataType::Utf8, false, "varchar(10)"),
        ]);
        let widened = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("v", DataType::Utf8, true, "varchar(200)"),
        ]);
        assert!(old.rows_fit(&widened));
        // Nullability may be relaxed, not tightened.
        assert!(!widened.rows_fit(&old));
        let retyped = schema(&[
            ("id", DataType::Int64, false, "int8"),
            ("v", DataType::Utf8, false, "varchar(10)"),
        ]);
        assert!(!old.rows_fit(&retyped));
        let added = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("v", DataType::Utf8, false, "varchar(10)"),
            ("w", DataType::Utf8, true, "text"),
        ]);
        assert!(!old.rows_fit(&added));
        let renamed = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("w", DataType::Utf8, false, "varchar(10)"),
        ]);
        assert!(!old.rows_fit(&renamed));
    }
}
