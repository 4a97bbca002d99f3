//! Table schema for Paimon: the `schema/schema-0` JSON file, Arrow → Paimon type mapping, and the
//! Arrow schema of the key-value data files.
//!
//! A primary-key table's data file holds, in order (Paimon `KeyValue.schema`, pypaimon
//! `KeyValueDataWriter`): the key columns renamed `_KEY_<name>`, `_SEQUENCE_NUMBER` (BIGINT),
//! `_VALUE_KIND` (TINYINT row kind: 0 insert, 1 update-before, 2 update-after, 3 delete), then
//! every table column. Arrow types are the ones pypaimon's `PyarrowFieldParser.from_paimon_type`
//! expects, so values written by cdcd read back without a cast: TIME is `time32[ms]` (Paimon's
//! TIME is millisecond-based in Parquet), timestamps with a zone use `UTC`, UUIDs are BYTES.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef, TimeUnit};
use serde::{Deserialize, Serialize};

use crate::changelog::TableSchema;
use crate::sinks::SinkError;

pub const KEY_PREFIX: &str = "_KEY_";
pub const SEQUENCE_NUMBER: &str = "_SEQUENCE_NUMBER";
pub const VALUE_KIND: &str = "_VALUE_KIND";

/// Row kinds as stored in `_VALUE_KIND` (Paimon `RowKind.toByteValue`).
pub const KIND_INSERT: i8 = 0;
pub const KIND_DELETE: i8 = 3;

/// `schema/schema-N`, as Paimon's `TableSchema` serializes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PaimonSchema {
    pub version: i32,
    pub id: i64,
    pub fields: Vec<PaimonField>,
    pub highest_field_id: i32,
    pub partition_keys: Vec<String>,
    pub primary_keys: Vec<String>,
    pub options: BTreeMap<String, String>,
    #[serde(default)]
    pub comment: Option<String>,
    pub time_millis: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PaimonField {
    pub id: i32,
    pub name: String,
    /// Atomic types only (`BIGINT NOT NULL`, `DECIMAL(12, 2)`, …).
    #[serde(rename = "type")]
    pub data_type: serde_json::Value,
}

/// The Paimon type name of an Arrow column type; `None` when cdcd cannot store it.
fn paimon_type(dt: &DataType) -> Option<String> {
    Some(match dt {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int16 => "SMALLINT".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Float32 => "FLOAT".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Decimal128(p, s) if *s >= 0 && *p <= 38 => format!("DECIMAL({p}, {s})"),
        DataType::Utf8 => "STRING".into(),
        DataType::Binary | DataType::FixedSizeBinary(16) => "BYTES".into(),
        DataType::Date32 => "DATE".into(),
        DataType::Time64(TimeUnit::Microsecond) => "TIME(3)".into(),
        DataType::Timestamp(TimeUnit::Microsecond, None) => "TIMESTAMP(6)".into(),
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => {
            "TIMESTAMP(6) WITH LOCAL TIME ZONE".into()
        }
        dt if super::variant::is_variant(dt) => "VARIANT".into(),
        _ => return None,
    })
}

/// The stored Arrow type of a Paimon type name written by [`paimon_type`].
fn arrow_type(text: &str) -> Option<DataType> {
    let t = text.trim_end_matches("NOT NULL").trim();
    Some(match t {
        "BOOLEAN" => DataType::Boolean,
        "SMALLINT" => DataType::Int16,
        "INT" => DataType::Int32,
        "BIGINT" => DataType::Int64,
        "FLOAT" => DataType::Float32,
        "DOUBLE" => DataType::Float64,
        "STRING" => DataType::Utf8,
        "BYTES" => DataType::Binary,
        "VARIANT" => super::variant::arrow_type(),
        "DATE" => DataType::Date32,
        "TIME(3)" => DataType::Time32(TimeUnit::Millisecond),
        "TIMESTAMP(6)" => DataType::Timestamp(TimeUnit::Microsecond, None),
        "TIMESTAMP(6) WITH LOCAL TIME ZONE" => {
            DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from("UTC")))
        }
        other => {
            let inner = other.strip_prefix("DECIMAL(")?.strip_suffix(')')?;
            let (p, s) = inner.split_once(',')?;
            DataType::Decimal128(p.trim().parse().ok()?, s.trim().parse().ok()?)
        }
    })
}

/// The Paimon type of a column as schema JSON: a type name, or `{"type": "ARRAY", "element": …}`
/// for a list of atomic values (Paimon `DataTypeJsonParser`).
fn paimon_json(dt: &DataType, not_null: bool) -> Option<serde_json::Value> {
    let suffix = if not_null { " NOT NULL" } else { "" };
    match dt {
        DataType::List(element) if !not_null => Some(serde_json::json!({
            "type": "ARRAY",
            "element": paimon_type(element.data_type())?,
        })),
        DataType::List(_) => None,
        // A key column (the only NOT NULL ones): Paimon keys no VARIANT.
        dt if not_null && super::variant::is_variant(dt) => None,
        other => Some(serde_json::Value::String(format!(
            "{}{suffix}",
            paimon_type(other)?
        ))),
    }
}

/// The stored Arrow type of a schema JSON type [`paimon_json`] wrote.
fn arrow_type_json(v: &serde_json::Value) -> Option<DataType> {
    match v {
        serde_json::Value::String(s) => arrow_type(s),
        serde_json::Value::Object(o) => {
            let kind = o.get("type")?.as_str()?;
            if !kind.starts_with("ARRAY") {
                return None;
            }
            let element = arrow_type(o.get("element")?.as_str()?)?;
            Some(DataType::List(Arc::new(Field::new("item", element, true))))
        }
        _ => None,
    }
}

/// The Arrow type a column is stored as in data files.
pub(super) fn file_type(dt: &DataType) -> DataType {
    match dt {
        // pypaimon reads ARRAY as `list<item>` (`PyarrowFieldParser.from_paimon_type`).
        DataType::List(element) => DataType::List(Arc::new(Field::new(
            "item",
            file_type(element.data_type()),
            true,
        ))),
        DataType::FixedSizeBinary(_) => DataType::Binary,
        DataType::Time64(_) => DataType::Time32(TimeUnit::Millisecond),
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => {
            DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from("UTC")))
        }
        other => other.clone(),
    }
}

/// The stored (data file) type of a Paimon type in a schema file; `None` when cdcd does not
/// write it.
pub(super) fn stored_type(v: &serde_json::Value) -> Option<DataType> {
    arrow_type_json(v).map(|t| file_type(&t))
}

/// The schema file content for a new table partitioned by `partition` (column names; empty:
/// unpartitioned). Paimon's primary key holds the partition keys (a fixed-bucket table requires
/// it): the source's key, then the partition keys it lacks; its files' keys and bucket hash are
/// the primary key without the partition keys (`trimmed`), which is the source's key when that
/// holds no partition key (sinks/lsm/partition.rs).
pub fn paimon_schema(
    table: &TableSchema,
    options: BTreeMap<String, String>,
    partition: &[String],
) -> Result<PaimonSchema, SinkError> {
    let mut fields = Vec::with_capacity(table.columns.len());
    for (i, c) in table.columns.iter().enumerate() {
        // Non-key columns are nullable whatever the source says: a delete row carries only its
        // key, and Paimon stores it as a whole row with the value columns NULL. A keyless
        // (append) table's columns are all nullable too, so `DROP NOT NULL` changes nothing.
        let is_key = table.primary_key.contains(&i);
        let Some(ty) = paimon_json(&c.data_type, is_key) else {
            return Err(SinkError::UnsupportedType {
                table: table.id.clone(),
                column: c.name.clone(),
                data_type: c.data_type.to_string(),
                sink: "lsm (Paimon)",
            });
        };
        fields.push(PaimonField {
            id: i as i32,
            name: c.name.clone(),
            data_type: ty,
        });
    }
    Ok(PaimonSchema {
        version: 3,
        id: 0,
        highest_field_id: fields.len() as i32 - 1,
        fields,
        partition_keys: partition.to_vec(),
        primary_keys: table
            .key_names()
            .into_iter()
            .map(String::from)
            .chain(
                partition
                    .iter()
                    .filter(|p| !table.key_names().contains(&p.as_str()))
                    .cloned(),
            )
            .collect(),
        options,
        comment: None,
        time_millis: chrono::Utc::now().timestamp_millis(),
    })
}

/// Why an existing table's schema differs from the source's, if it does.
pub fn difference(existing: &PaimonSchema, wanted: &PaimonSchema) -> Option<String> {
    let show = |s: &PaimonSchema| {
        s.fields
            .iter()
            .map(|f| match f.data_type.as_str() {
                Some(t) => format!("{} {t}", f.name),
                None => format!("{} {}", f.name, f.data_type),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    if existing.fields.len() != wanted.fields.len()
        || existing
            .fields
            .iter()
            .zip(&wanted.fields)
            .any(|(a, b)| a.name != b.name || a.data_type != b.data_type)
        || existing.primary_keys != wanted.primary_keys
    {
        return Some(format!(
            "the Paimon table has ({}) key ({}), the source ({}) key ({})",
            show(existing),
            existing.primary_keys.join(", "),
            show(wanted),
            wanted.primary_keys.join(", ")
        ));
    }
    None
}

/// How an existing table's schema relates to the one the changes carry.
#[derive(Debug, Clone, PartialEq)]
pub enum Evolution {
    /// The same columns and types.
    Same,
    /// The changes add columns at the end or widen types: the table moves to this schema
    /// (`existing.id + 1`; kept fields keep their ids, added ones take ids after
    /// `highestFieldId`, as Paimon's `SchemaManager` assigns them).
    To(PaimonSchema),
    /// The table is already ahead: the changes' columns are a schema the table evolved from.
    /// After a schema change whose commit did not land (its schema file was written), the
    /// changes before the DDL are replayed like this; the sink checks that the table really had
    /// that schema before it widens them to the table's (a source narrowing looks the same).
    Behind,
    /// Neither: the difference, for the message.
    Incompatible(String),
}

/// Whether `wanted`'s columns are `existing`'s evolved the ways the pipeline allows
/// ([`TableSchema::evolves_to`](crate::changelog::TableSchema::evolves_to): columns added at the
/// end, dropped or renamed (`renames`: old name → new name, from the changes' declared former
/// names), non-key types widened — Paimon's `updateColumnType` accepts the same promotions,
/// `renameColumn` keeps the field id).
pub fn evolution(
    existing: &PaimonSchema,
    wanted: &PaimonSchema,
    renames: &[(String, String)],
) -> Evolution {
    if difference(existing, wanted).is_none() {
        return Evolution::Same;
    }
    if let Some(next) = evolved(existing, wanted, renames) {
        return Evolution::To(next);
    }
    let back: Vec<(String, String)> = renames
        .iter()
        .map(|(old, new)| (new.clone(), old.clone()))
        .collect();
    if evolved(wanted, existing, &back).is_some() {
        return Evolution::Behind;
    }
    Evolution::Incompatible(difference(existing, wanted).unwrap_or_default())
}

/// Whether `wanted` is a schema the table had before renames (`aliases`: older name → current
/// name) and evolved from since: changes read before a rename whose schema file landed.
pub fn behind_by_renames(
    existing: &PaimonSchema,
    wanted: &PaimonSchema,
    aliases: &HashMap<String, String>,
) -> bool {
    let renames: Vec<(String, String)> = aliases
        .iter()
        .map(|(old, now)| (old.clone(), now.clone()))
        .collect();
    evolved(wanted, existing, &renames).is_some()
}

/// `older` evolved into `newer`'s columns as the next schema, if `newer` is such an evolution.
fn evolved(
    older: &PaimonSchema,
    newer: &PaimonSchema,
    renames: &[(String, String)],
) -> Option<PaimonSchema> {
    if older.primary_keys != newer.primary_keys {
        return None;
    }
    let renamed = |name: &str| -> String {
        renames
            .iter()
            .find(|(old, _)| old == name)
            .map_or_else(|| name.to_owned(), |(_, new)| new.clone())
    };
    if older.primary_keys.iter().any(|k| renamed(k) != *k) {
        // A key column keeps its name: files hold it as `_KEY_<name>`.
        return None;
    }
    // Kept fields by name (or renamed), in the table's order; the others are dropped (old files
    // keep them).
    let kept: Vec<&PaimonField> = older
        .fields
        .iter()
        .filter(|o| newer.fields.iter().any(|f| f.name == renamed(&o.name)))
        .collect();
    let dropped = kept.len() < older.fields.len();
    if (dropped && newer.fields.len() > kept.len())
        || older
            .primary_keys
            .iter()
            .any(|k| !kept.iter().any(|f| &f.name == k))
    {
        // Dropped and added at once may be a rename, never guessed; key columns stay.
        return None;
    }
    let mut fields = Vec::with_capacity(newer.fields.len());
    for (old, new) in kept.iter().zip(&newer.fields) {
        if renamed(&old.name) != new.name {
            return None;
        }
        if old.data_type != new.data_type {
            let key = older.primary_keys.contains(&old.name);
            let (from, to) = (
                arrow_type_json(&old.data_type)?,
                arrow_type_json(&new.data_type)?,
            );
            if key || !crate::changelog::widens(&from, &to) {
                return None;
            }
        }
        fields.push(PaimonField {
            id: old.id,
            name: new.name.clone(),
            data_type: new.data_type.clone(),
        });
    }
    let mut next_id = older.highest_field_id;
    for added in &newer.fields[kept.len()..] {
        if older.fields.iter().any(|f| f.name == added.name) {
            return None;
        }
        next_id += 1;
        fields.push(PaimonField {
            id: next_id,
            name: added.name.clone(),
            data_type: added.data_type.clone(),
        });
    }
    Some(PaimonSchema {
        id: older.id + 1,
        fields,
        highest_field_id: next_id,
        time_millis: chrono::Utc::now().timestamp_millis(),
        ..older.clone()
    })
}

/// Whether a file written with field `older` reads correctly as field `newer` under one field
/// id: the same name, and the same type or one Paimon widens to (`evolved`'s rule).
pub fn same_column(older: &PaimonField, newer: &PaimonField) -> bool {
    if older.name != newer.name {
        return false;
    }
    if older.data_type == newer.data_type {
        return true;
    }
    match (
        arrow_type_json(&older.data_type),
        arrow_type_json(&newer.data_type),
    ) {
        (Some(from), Some(to)) => from == to || crate::changelog::widens(&from, &to),
        _ => false,
    }
}

/// The names `older` gave fields that `current` has under another name (renamed columns), to
/// their current names.
pub fn aliases(older: &PaimonSchema, current: &PaimonSchema) -> Vec<(String, String)> {
    older
        .fields
        .iter()
        .filter_map(|o| {
            let now = current.fields.iter().find(|f| f.id == o.id)?;
            (now.name != o.name).then(|| (o.name.clone(), now.name.clone()))
        })
        .collect()
}

/// The table's columns as the changelog describes them (for widening changes to a table that is
/// ahead of them, [`Evolution::Behind`]).
pub fn table_schema(
    id: &crate::changelog::TableId,
    schema: &PaimonSchema,
) -> Result<TableSchema, String> {
    let mut columns = Vec::with_capacity(schema.fields.len());
    for f in &schema.fields {
        let text = f.data_type.to_string();
        let dt = arrow_type_json(&f.data_type)
            .ok_or_else(|| format!("column {}: type {text} is not one cdcd writes", f.name))?;
        columns.push(crate::changelog::Column {
            name: f.name.clone(),
            nullable: !text.contains("NOT NULL"),
            data_type: dt,
            source_type: text,
            initial_default: None,
            former_names: Vec::new(),
        });
    }
    // A partitioned table's data files key rows by the primary key without the partition keys
    // (Paimon's trimmed primary key), which is what the changelog's key is here.
    let primary_key = schema
        .primary_keys
        .iter()
        .filter(|k| !schema.partition_keys.contains(k))
        .map(|k| {
            columns
                .iter()
                .position(|c| &c.name == k)
                .ok_or_else(|| format!("primary key {k} is not a column"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(TableSchema {
        id: id.clone(),
        columns,
        primary_key,
    })
}

/// An `arrow-row` converter of keys of `key_types` (stored types): encoded keys compare bytewise
/// in key order, which for cdcd's key types is Paimon's (`plan.rs`).
pub fn key_converter(key_types: &[DataType]) -> Result<RowConverter, ArrowError> {
    RowConverter::new(
        key_types
            .iter()
            .map(|t| SortField::new(t.clone()))
            .collect(),
    )
}

/// Arrow schemas of one table's data files.
#[derive(Debug, Clone)]
pub struct FileSchemas {
    /// `_KEY_*`, `_SEQUENCE_NUMBER`, `_VALUE_KIND`, then the columns.
    pub file: SchemaRef,
    /// The key columns as stored (for `BinaryRow` keys).
    pub key_types: Vec<DataType>,
    /// Index of each key column among the table columns.
    pub key: Vec<usize>,
    pub columns: usize,
    /// The Paimon schema id files written with these schemas carry.
    pub schema_id: i64,
    /// Older names of renamed columns, to their current names (`TableState::aliases`, in
    /// `table.rs`): a file written before the rename holds the column under the old name.
    pub aliases: HashMap<String, String>,
}

impl FileSchemas {
    pub fn new(table: &TableSchema) -> FileSchemas {
        let mut fields = Vec::with_capacity(table.columns.len() + table.primary_key.len() + 2);
        let mut key_types = Vec::new();
        for &k in &table.primary_key {
            if let Some(c) = table.columns.get(k) {
                let dt = file_type(&c.data_type);
                key_types.push(dt.clone());
                fields.push(Field::new(format!("{KEY_PREFIX}{}", c.name), dt, false));
            }
        }
        fields.push(Field::new(SEQUENCE_NUMBER, DataType::Int64, false));
        fields.push(Field::new(VALUE_KIND, DataType::Int8, false));
        for (i, c) in table.columns.iter().enumerate() {
            let key = table.primary_key.contains(&i);
            fields.push(Field::new(&c.name, file_type(&c.data_type), !key));
        }
        FileSchemas {
            file: Arc::new(Schema::new(fields)),
            key_types,
            key: table.primary_key.clone(),
            columns: table.columns.len(),
            schema_id: 0,
            aliases: HashMap::new(),
        }
    }

    /// These schemas reading renamed columns under their older names too.
    pub fn with_aliases(self, aliases: HashMap<String, String>) -> FileSchemas {
        FileSchemas { aliases, ..self }
    }

    /// The data file schemas of an existing table, from its schema file (the compactor has no
    /// source schema at hand).
    pub fn from_paimon(schema: &PaimonSchema) -> Result<FileSchemas, String> {
        let table = table_schema(&crate::changelog::TableId::new("", ""), schema)?;
        Ok(FileSchemas {
            schema_id: schema.id,
            ..FileSchemas::new(&table)
        })
    }

    /// These schemas for files of Paimon schema `id` (`_SCHEMA_ID` of the files written).
    pub fn with_schema_id(self, id: i64) -> FileSchemas {
        FileSchemas {
            schema_id: id,
            ..self
        }
    }

    /// An `arrow-row` converter of the key columns ([`key_converter`]).
    pub fn key_converter(&self) -> Result<RowConverter, ArrowError> {
        key_converter(&self.key_types)
    }

    /// Index of the first table column in a data file.
    pub fn values_offset(&self) -> usize {
        self.key.len() + 2
    }

    /// Casts one changelog column to its stored type.
    pub fn cast(&self, column: &ArrayRef) -> Result<ArrayRef, ArrowError> {
        let target = file_type(column.data_type());
        if &target == column.data_type() {
            return Ok(column.clone());
        }
        arrow_cast::cast(column, &target)
    }

    /// A data file batch from its parts: key columns, sequence numbers, kinds, values.
    pub fn batch(
        &self,
        keys: Vec<ArrayRef>,
        seq: ArrayRef,
        kind: ArrayRef,
        values: Vec<ArrayRef>,
    ) -> Result<RecordBatch, ArrowError> {
        let mut cols = keys;
        cols.push(seq);
        cols.push(kind);
        cols.extend(values);
        RecordBatch::try_new(self.file.clone(), cols)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::changelog::{Column, TableId};

    fn col(name: &str, dt: DataType) -> Column {
        Column {
            name: name.into(),
            data_type: dt,
            nullable: true,
            source_type: String::new(),
            initial_default: None,
            former_names: Vec::new(),
        }
    }

    #[test]
    fn maps_types_and_marks_keys_not_null() {
        let t = TableSchema {
            id: TableId::new("public", "t"),
            columns: vec![
                col("id", DataType::Int64),
                col("amount", DataType::Decimal128(12, 2)),
                col(
                    "at",
                    DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                ),
            ],
            primary_key: vec![0],
        };
        let s = paimon_schema(&t, BTreeMap::new(), &[]).unwrap();
        let types: Vec<&str> = s
            .fields
            .iter()
            .map(|f| f.data_type.as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            vec![
                "BIGINT NOT NULL",
                "DECIMAL(12, 2)",
                "TIMESTAMP(6) WITH LOCAL TIME ZONE"
            ]
        );
        assert_eq!(s.primary_keys, vec!["id"]);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["highestFieldId"], 2);
        let f = FileSchemas::new(&t);
        let names: Vec<&str> = f.file.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            vec![
                "_KEY_id",
                "_SEQUENCE_NUMBER",
                "_VALUE_KIND",
                "id",
                "amount",
                "at"
            ]
        );
        assert!(difference(&s, &s).is_none());
        let list = DataType::List(Arc::new(Field::new("element", DataType::Int32, true)));
        let t = TableSchema {
            columns: vec![col("id", DataType::Int64), col("ia", list)],
            ..t
        };
        let s = paimon_schema(&t, BTreeMap::new(), &[]).unwrap();
        assert_eq!(
            s.fields[1].data_type,
            serde_json::json!({"type": "ARRAY", "element": "INT"})
        );
        let back = FileSchemas::from_paimon(&s).unwrap();
        assert_eq!(back.file, FileSchemas::new(&t).file);
    }

    #[test]
    fn rejects_unknown_types_and_makes_keyless_tables_append_tables() {
        let t = TableSchema {
            id: TableId::new("public", "t"),
            columns: vec![col("id", DataType::Int64), col("x", DataType::UInt64)],
            primary_key: vec![0],
        };
        assert!(matches!(
            paimon_schema(&t, BTreeMap::new(), &[]),
            Err(SinkError::UnsupportedType { .. })
        ));
        // A keyless table: no primary keys, every column nullable (issue 23, `append.rs`).
        let t = TableSchema {
            id: TableId::new("public", "t"),
            columns: vec![col("id", DataType::Int64), col("x", DataType::Utf8)],
            primary_key: vec![],
        };
        let s = paimon_schema(&t, BTreeMap::new(), &[]).unwrap();
        assert!(s.primary_keys.is_empty());
        assert!(s
            .fields
            .iter()
            .all(|f| !f.data_type.to_string().contains("NOT NULL")));
    }

    #[test]
    fn evolution_adds_fields_with_new_ids_widens_in_place_and_knows_when_behind() {
        let t = |cols: Vec<Column>| {
            let t = TableSchema {
                id: TableId::new("public", "t"),
                columns: cols,
                primary_key: vec![0],
            };
            paimon_schema(&t, BTreeMap::new(), &[]).unwrap()
        };
        let v0 = t(vec![col("id", DataType::Int64), col("x", DataType::Int32)]);
        let wanted = t(vec![
            col("id", DataType::Int64),
            col("x", DataType::Int64),
            col("c", DataType::Utf8),
        ]);
        let Evolution::To(v1) = evolution(&v0, &wanted, &[]) else {
            panic!("an evolution: {:?}", evolution(&v0, &wanted, &[]));
        };
        assert_eq!(v1.id, 1);
        let ids: Vec<(i32, &str)> = v1.fields.iter().map(|f| (f.id, f.name.as_str())).collect();
        assert_eq!(ids, [(0, "id"), (1, "x"), (2, "c")]);
        assert_eq!(v1.highest_field_id, 2);
        assert_eq!(v1.fields[1].data_type, serde_json::json!("BIGINT"));
        assert_eq!(evolution(&v1, &wanted, &[]), Evolution::Same);
        assert_eq!(evolution(&v1, &v0, &[]), Evolution::Behind);
        let narrowed = t(vec![col("id", DataType::Int64), col("x", DataType::Int16)]);
        // Structurally behind; the sink takes it as a replay only when the table once had
        // exactly that schema (`LsmSink::behind`), so a source narrowing still stops.
        assert_eq!(evolution(&v0, &narrowed, &[]), Evolution::Behind);
        let renamed = t(vec![col("id", DataType::Int64), col("y", DataType::Int32)]);
        assert!(matches!(
            evolution(&v0, &renamed, &[]),
            Evolution::Incompatible(_)
        ));
        // Declared by the source: the field keeps its id under the new name, and files written
        // before read the column under its older name.
        let rename = [("x".to_owned(), "y".to_owned())];
        let Evolution::To(r1) = evolution(&v0, &renamed, &rename) else {
            panic!("a rename: {:?}", evolution(&v0, &renamed, &rename));
        };
        let ids: Vec<(i32, &str)> = r1.fields.iter().map(|f| (f.id, f.name.as_str())).collect();
        assert_eq!(ids, [(0, "id"), (1, "y")]);
        assert_eq!(aliases(&v0, &r1), [("x".to_owned(), "y".to_owned())]);
        assert!(behind_by_renames(
            &r1,
            &v0,
            &aliases(&v0, &r1).into_iter().collect()
        ));
        // Never a key column's rename.
        let key_renamed = t(vec![col("key", DataType::Int64), col("x", DataType::Int32)]);
        assert!(!matches!(
            evolution(&v0, &key_renamed, &[("id".to_owned(), "key".to_owned())]),
            Evolution::To(_)
        ));
        // Old files read under the new schema: added columns NULL, widened ones cast.
        let old_files = FileSchemas::from_paimon(&v0).unwrap();
        let new_files = FileSchemas::from_paimon(&v1).unwrap();
        assert_eq!(new_files.schema_id, 1);
        let batch = RecordBatch::try_new(
            old_files.file.clone(),
            vec![
                Arc::new(arrow_array::Int64Array::from(vec![7])),
                Arc::new(arrow_array::Int64Array::from(vec![1])),
                Arc::new(arrow_array::Int8Array::from(vec![0])),
                Arc::new(arrow_array::Int64Array::from(vec![7])),
                Arc::new(arrow_array::Int32Array::from(vec![42])),
            ],
        )
        .unwrap();
        let read = crate::sinks::lsm::writer::to_table_shape(&batch, &new_files).unwrap();
        assert_eq!(read.schema(), new_files.file);
        assert_eq!(
            read.column(4)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .unwrap()
                .value(0),
            42
        );
        assert!(read.column(5).is_null(0));
        let renamed_files = FileSchemas::from_paimon(&r1)
            .unwrap()
            .with_aliases(aliases(&v0, &r1).into_iter().collect());
        // The same old file, read under the renamed schema.
        let read = crate::sinks::lsm::writer::to_table_shape(&batch, &renamed_files).unwrap();
        assert_eq!(
            read.column(4)
                .as_any()
                .downcast_ref::<arrow_array::Int32Array>()
                .unwrap()
                .value(0),
            42,
            "the renamed column's value, read under its older name"
        );
    }
}
