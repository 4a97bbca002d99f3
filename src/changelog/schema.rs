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

    pub fn key_names(&self) -> Vec<&str> {
        self.primary_key
            .iter()
            .filter_map(|&i| self.columns.get(i).map(|c| c.name.as_str()))
            .collect()
    }
}
