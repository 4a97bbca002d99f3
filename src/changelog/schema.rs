//! Table identity and schema as the changelog carries them: source column types already mapped to
//! Arrow, plus the primary key.

use std::fmt;
use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};

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
    /// For a column added by a schema change with a constant default: the value rows written
    /// before the change read, as the source's text of it (Postgres `attmissingval`, MySQL's
    /// `DEFAULT` literal). Sinks that can store it keep it (Iceberg v3 `initial-default`); the
    /// others refuse the change. `None`: such rows read NULL.
    pub initial_default: Option<String>,
    /// The names this column had before, oldest first (a `RENAME COLUMN` the source declared
    /// exactly, e.g. MySQL's statement text): a sink holding the column under one of them
    /// renames it in place (its values and its Iceberg field id stay). Empty: never renamed, or
    /// renamed where the source cannot tell (a Postgres Relation message), which then looks
    /// like a drop plus an add and is refused ([`TableSchema::evolves_to`]).
    pub former_names: Vec<String>,
}

impl Column {
    /// [`initial_default`](Self::initial_default) as `n` values of the column's type; `None`
    /// without one. The text must convert exactly: a value Arrow cannot read as the type is an
    /// error, never NULL.
    pub fn initial_default_values(&self, n: usize) -> Result<Option<ArrayRef>, ArrowError> {
        let Some(text) = self.initial_default.as_deref() else {
            return Ok(None);
        };
        let texts = arrow_array::StringArray::from(vec![text; n]);
        let options = arrow_cast::CastOptions {
            safe: false,
            ..Default::default()
        };
        arrow_cast::cast_with_options(&texts, &self.data_type, &options).map(Some)
    }
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

    /// Whether rows decoded under `self` can be rewritten as rows of `newer` without losing
    /// anything the table keeps, the schema changes a sink can apply (docs/guarantees.md, "Schema
    /// changes"): the same key columns under the same names; the old columns that stay
    /// ([`columns_in`](Self::columns_in): by name, or renamed), first, in the same order, each
    /// with its type or a wider one ([`widens`]) and as nullable as before or more; then any
    /// added columns, nullable or with an [`initial_default`](Column::initial_default). Columns
    /// may be dropped (not key columns) or added, not both at once: a Postgres Relation message
    /// carries no column identity, and a column that leaves while another arrives may be a
    /// rename, which cdcd never guesses (a rename the source declares is a kept column).
    pub fn evolves_to(&self, newer: &TableSchema) -> bool {
        let key = |s: &TableSchema| -> Vec<String> {
            s.key_names().into_iter().map(str::to_owned).collect()
        };
        let Ok(map) = newer.columns_in(self.columns.iter().map(|c| c.name.as_str())) else {
            return false;
        };
        let kept: Vec<(usize, &Column, usize)> = self
            .columns
            .iter()
            .enumerate()
            .zip(&map)
            .filter_map(|((i, c), at)| at.map(|at| (i, c, at)))
            .collect();
        let dropped = kept.len() < self.columns.len();
        let added = newer.columns.len() > kept.len();
        self.id == newer.id
            && key(self) == key(newer)
            && !(dropped && added)
            && kept.iter().enumerate().all(|(n, (i, old, at))| {
                let Some(new) = newer.columns.get(*at) else {
                    return false;
                };
                let same_type = old.data_type == new.data_type
                    || (!self.primary_key.contains(i) && widens(&old.data_type, &new.data_type));
                *at == n && same_type && (new.nullable || !old.nullable)
            })
            && newer.columns[kept.len()..].iter().all(|c| {
                (c.nullable || c.initial_default.is_some()) && self.column_index(&c.name).is_none()
            })
    }

    /// Where each of `old` (a table's column names, e.g. a sink's current schema) is among
    /// `self`'s columns: under the same name, or renamed (a column whose
    /// [`former_names`](Column::former_names) hold it); `None`: dropped. An error names a
    /// column that two of `self`'s columns could be (a name given up by a rename and taken by
    /// another column while the sink held the old shape), or two old columns that would become
    /// one: such a change is never guessed.
    pub fn columns_in<'a>(
        &self,
        old: impl Iterator<Item = &'a str>,
    ) -> Result<Vec<Option<usize>>, String> {
        let mut map: Vec<Option<usize>> = Vec::new();
        for name in old {
            let candidates: Vec<usize> = self
                .columns
                .iter()
                .enumerate()
                .filter(|(_, c)| c.name == name || c.former_names.iter().any(|f| f == name))
                .map(|(i, _)| i)
                .collect();
            match candidates.as_slice() {
                [] => map.push(None),
                [one] if !map.contains(&Some(*one)) => map.push(Some(*one)),
                [one] => {
                    return Err(format!(
                        "two columns would both become column {}",
                        self.columns[*one].name
                    ))
                }
                _ => {
                    return Err(format!(
                    "column {name} could be any of {} (a name one column gave up and another took)",
                    candidates
                        .iter()
                        .map(|&i| self.columns[i].name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
                }
            }
        }
        Ok(map)
    }

    /// The renames from `old` (a table's column names) to `self`: (old name, new name).
    pub fn renames_from<'a>(
        &self,
        old: impl Iterator<Item = &'a str> + Clone,
    ) -> Vec<(String, String)> {
        let map = self.columns_in(old.clone()).unwrap_or_default();
        old.zip(map)
            .filter_map(|(name, at)| {
                let new = &self.columns.get(at?)?.name;
                (new != name).then(|| (name.to_owned(), new.clone()))
            })
            .collect()
    }

    /// The columns of `self` that `newer` no longer has.
    pub fn dropped_in(&self, newer: &TableSchema) -> Vec<&str> {
        let map = newer
            .columns_in(self.columns.iter().map(|c| c.name.as_str()))
            .unwrap_or_default();
        self.columns
            .iter()
            .zip(map.into_iter().chain(std::iter::repeat(None)))
            .filter(|(_, at)| at.is_none())
            .map(|(c, _)| c.name.as_str())
            .collect()
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

/// Whether values of Arrow type `old` convert to `new` exactly, and the table formats allow the
/// promotion (Iceberg spec, "Schema Evolution": int → long, float → double, decimal(P,S) →
/// decimal(P',S) with P' > P; Paimon's `SchemaChange.updateColumnType` allows the same).
pub fn widens(old: &DataType, new: &DataType) -> bool {
    match (old, new) {
        (DataType::Int16, DataType::Int32 | DataType::Int64) => true,
        (DataType::Int32, DataType::Int64) => true,
        (DataType::Float32, DataType::Float64) => true,
        (DataType::Decimal128(p, s), DataType::Decimal128(p2, s2)) => s == s2 && p2 >= p,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::{column, table};

    fn schema(columns: &[(&str, DataType, bool, &str)]) -> TableSchema {
        let columns = columns
            .iter()
            .map(|(name, dt, nullable, source_type)| {
                column(name, dt.clone(), *nullable, source_type)
            })
            .collect();
        table("public", "a", columns, vec![0])
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

    #[test]
    fn evolves_to_accepts_added_and_dropped_columns_and_widening_only() {
        let old = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("x", DataType::Int32, true, "int4"),
            ("f", DataType::Float32, true, "float4"),
            ("n", DataType::Decimal128(10, 2), true, "numeric(10,2)"),
        ]);
        let cols = |extra: &[(&'static str, DataType, bool, &'static str)]| {
            let mut c = vec![
                ("id", DataType::Int32, false, "int4"),
                ("x", DataType::Int32, true, "int4"),
                ("f", DataType::Float32, true, "float4"),
                ("n", DataType::Decimal128(10, 2), true, "numeric(10,2)"),
            ];
            c.extend(extra.iter().cloned());
            c
        };
        assert!(old.evolves_to(&old));
        let added = schema(&cols(&[("c", DataType::Utf8, true, "text")]));
        assert!(old.evolves_to(&added));
        // The other way is a drop of a non-key column: applied too.
        assert!(added.evolves_to(&old));
        assert_eq!(added.dropped_in(&old), ["c"]);
        // A drop and an add at once may be a rename: refused.
        let swapped = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("x", DataType::Int32, true, "int4"),
            ("f", DataType::Float32, true, "float4"),
            ("c", DataType::Utf8, true, "text"),
        ]);
        assert!(!old.evolves_to(&swapped));
        // A key column's drop changes the key.
        let keyless = schema(&[("x", DataType::Int32, true, "int4")]);
        assert!(!old.evolves_to(&keyless));
        let required = schema(&cols(&[("c", DataType::Utf8, false, "text")]));
        assert!(
            !old.evolves_to(&required),
            "an added column must be nullable"
        );
        let widened = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("x", DataType::Int64, true, "int8"),
            ("f", DataType::Float64, true, "float8"),
            ("n", DataType::Decimal128(18, 2), true, "numeric(18,2)"),
        ]);
        assert!(old.evolves_to(&widened));
        assert!(!widened.evolves_to(&old), "a narrowing");
        let rescaled = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("x", DataType::Int32, true, "int4"),
            ("f", DataType::Float32, true, "float4"),
            ("n", DataType::Decimal128(18, 4), true, "numeric(18,4)"),
        ]);
        assert!(!old.evolves_to(&rescaled), "a scale change");
        let retyped = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("x", DataType::Utf8, true, "text"),
            ("f", DataType::Float32, true, "float4"),
            ("n", DataType::Decimal128(10, 2), true, "numeric(10,2)"),
        ]);
        assert!(!old.evolves_to(&retyped), "int -> text");
        let key_widened = schema(&[
            ("id", DataType::Int64, false, "int8"),
            ("x", DataType::Int32, true, "int4"),
            ("f", DataType::Float32, true, "float4"),
            ("n", DataType::Decimal128(10, 2), true, "numeric(10,2)"),
        ]);
        assert!(!old.evolves_to(&key_widened), "key columns keep their type");
        // A rename at the end looks like a drop plus an add: refused, not guessed.
        let renamed = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("x", DataType::Int32, true, "int4"),
            ("f", DataType::Float32, true, "float4"),
            ("m", DataType::Decimal128(10, 2), true, "numeric(10,2)"),
        ]);
        assert!(!old.evolves_to(&renamed));
        let inserted = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("c", DataType::Utf8, true, "text"),
            ("x", DataType::Int32, true, "int4"),
            ("f", DataType::Float32, true, "float4"),
            ("n", DataType::Decimal128(10, 2), true, "numeric(10,2)"),
        ]);
        assert!(!old.evolves_to(&inserted), "a column not at the end");
    }

    #[test]
    fn a_declared_rename_keeps_the_column_and_an_ambiguous_one_is_refused() {
        let old = schema(&[
            ("id", DataType::Int32, false, "int4"),
            ("x", DataType::Int32, true, "int4"),
            ("y", DataType::Utf8, true, "text"),
        ]);
        let mut renamed = old.clone();
        renamed.columns[1].name = "x2".into();
        renamed.columns[1].former_names = vec!["x".into()];
        assert!(old.evolves_to(&renamed));
        assert_eq!(
            renamed.renames_from(old.columns.iter().map(|c| c.name.as_str())),
            [("x".to_owned(), "x2".to_owned())]
        );
        assert!(old.dropped_in(&renamed).is_empty());
        // Renamed and widened at once, with a column added after.
        let mut more = renamed.clone();
        more.columns[1].data_type = DataType::Int64;
        more.columns.push(Column {
            name: "z".into(),
            ..old.columns[2].clone()
        });
        assert!(old.evolves_to(&more));
        // Swapped names (x → t, y → x, t → y) seen at once: x could be either column.
        let mut swapped = old.clone();
        swapped.columns[1].name = "y".into();
        swapped.columns[1].former_names = vec!["x".into(), "t".into()];
        swapped.columns[2].name = "x".into();
        swapped.columns[2].former_names = vec!["y".into()];
        assert!(!old.evolves_to(&swapped));
        assert!(swapped
            .columns_in(old.columns.iter().map(|c| c.name.as_str()))
            .unwrap_err()
            .contains("could be any of"));
        // A key column's rename changes the key.
        let mut key = old.clone();
        key.columns[0].name = "key".into();
        key.columns[0].former_names = vec!["id".into()];
        assert!(!old.evolves_to(&key));
    }
}
