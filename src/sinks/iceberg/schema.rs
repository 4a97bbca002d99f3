//! Schema mapping: a changelog [`TableSchema`] (Arrow-typed columns plus primary key) becomes an
//! Iceberg schema with field ids, and the Arrow schemas of the Parquet files cdcd writes carry those
//! ids as `PARQUET:field_id` so every engine resolves columns by id (Iceberg spec, "Column
//! Projection").
//!
//! Field ids: top-level columns get 1..=n in source order, then nested fields (list elements) get
//! n+1… — the same order Iceberg's fresh-id assignment uses, so a table created from this schema
//! keeps these ids. The primary key becomes `identifier-field-ids`; key columns are required, the
//! others optional. A keyless table (an append table, issue 23) has no identifier fields.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema as ArrowSchema, SchemaRef, TimeUnit};
use iceberg::spec::{
    FormatVersion, ListType, Literal, NestedField, NestedFieldRef, PrimitiveType, Schema,
    TableMetadata, Type,
};

use crate::changelog::{Column, TableSchema};
#[cfg(test)]
use crate::config::JsonAs;
use crate::config::{SpatialAs, TableSettings};
use crate::sinks::iceberg::{geometry, variant};
use crate::sinks::SinkError;

/// Field id of `file_path` in a position delete file (Iceberg spec, "Position Delete Files").
pub(crate) const POS_DELETE_FILE_PATH_ID: i32 = 2147483546;
/// Field id of `pos` in a position delete file.
pub(crate) const POS_DELETE_POS_ID: i32 = 2147483545;

const SINK: &str = "iceberg";

/// The Iceberg schema for `table`: ids as described in the module doc, JSON columns as strings.
#[cfg(test)]
pub(crate) fn iceberg_schema(table: &TableSchema) -> Result<Schema, SinkError> {
    iceberg_schema_as(table, JsonAs::String, SpatialAs::Plain)
}

/// The Iceberg schema for `table`, every JSON column as `json` says and spatial columns as
/// `spatial`.
#[cfg(test)]
pub(crate) fn iceberg_schema_as(
    table: &TableSchema,
    json: JsonAs,
    spatial: SpatialAs,
) -> Result<Schema, SinkError> {
    mapped_schema(
        table,
        &|col| json == JsonAs::Variant && variant::is_json(col),
        spatial,
    )
}

/// The Iceberg schema for `table` under its `[sink.tables."…"]` settings: JSON columns as
/// `json` and `json_columns` choose, spatial columns as `spatial`.
pub(crate) fn iceberg_schema_for(
    table: &TableSchema,
    settings: &TableSettings,
) -> Result<Schema, SinkError> {
    variant::check_json_columns(table, settings)?;
    mapped_schema(
        table,
        &|col| variant::chosen(settings, col),
        settings.spatial,
    )
}

/// The Iceberg schema for `table`, the columns `as_variant` chooses as variants: a key column
/// stays what it is, a variant has no equality to delete by.
fn mapped_schema(
    table: &TableSchema,
    as_variant: &dyn Fn(&Column) -> bool,
    spatial: SpatialAs,
) -> Result<Schema, SinkError> {
    let n = i32::try_from(table.columns.len()).map_err(|_| SinkError::Data {
        table: table.id.clone(),
        detail: "too many columns".into(),
    })?;
    let mut next_id = n + 1;
    if table.primary_key.is_empty() && table.columns.iter().any(as_variant) {
        // A keyless table's deletes find their rows by comparing whole rows (`rows/multiset.rs`):
        // a variant read back is the value, not the source's text of it, so they would not match.
        return Err(SinkError::Data {
            table: table.id.clone(),
            detail: "json = \"variant\" needs a primary key: a delete of a table without one \
                     finds its row by comparing whole rows with the source's JSON text, which a \
                     variant does not keep; keep json = \"string\" for this table, or give it a \
                     key (source.key_columns)"
                .into(),
        });
    }
    let mut fields: Vec<NestedFieldRef> = Vec::with_capacity(table.columns.len());
    for (i, col) in (1..).zip(&table.columns) {
        let required = table.primary_key.contains(&((i - 1) as usize));
        let as_variant = as_variant(col);
        if as_variant && required {
            return Err(SinkError::Data {
                table: table.id.clone(),
                detail: format!(
                    "column {} is JSON and part of the primary key: json = \"variant\" cannot \
                     apply to it (a variant value has no equality to find the row by); keep \
                     json = \"string\" for this table",
                    col.name
                ),
            });
        }
        let ty = match as_variant {
            true => Some(variant::placeholder()),
            false => to_iceberg(&col.data_type, &mut next_id),
        }
        .ok_or_else(|| SinkError::UnsupportedType {
            table: table.id.clone(),
            column: col.name.clone(),
            data_type: col.data_type.to_string(),
            sink: SINK,
        })?;
        let mut field = NestedField::new(i, &col.name, ty, required);
        if spatial == SpatialAs::Geometry {
            field = geometry::column_field(table, col, field)?;
        }
        if as_variant && col.initial_default.is_some() {
            return Err(SinkError::Data {
                table: table.id.clone(),
                detail: format!(
                    "column {} is JSON added with a default, which a variant cannot hold (Iceberg \
                     v3: a variant's initial-default is null): the earlier rows would read NULL; \
                     add it without a default, or keep json = \"string\" for this table",
                    col.name
                ),
            });
        }
        if let Some(value) = default_literal(col).map_err(|detail| SinkError::Data {
            table: table.id.clone(),
            detail,
        })? {
            // Rows of files written before the column existed read `initial-default`; writers
            // that leave the column out write `write-default` (Iceberg v3, "Default values").
            field = field
                .with_initial_default(value.clone())
                .with_write_default(value);
        }
        fields.push(Arc::new(field));
    }
    let key_ids = table.primary_key.iter().map(|&k| k as i32 + 1);
    Schema::builder()
        .with_schema_id(0)
        .with_fields(fields)
        .with_identifier_field_ids(key_ids)
        .build()
        .map_err(|source| SinkError::Iceberg {
            context: format!("building the Iceberg schema of {}", table.id),
            source,
        })
}

/// A column's [`initial_default`](crate::changelog::Column::initial_default) as an Iceberg
/// literal of its type; `None` without one. The types whose defaults cdcd stores are the
/// primitives a DDL default is written in; others are an error naming the column.
fn default_literal(col: &crate::changelog::Column) -> Result<Option<Literal>, String> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    };
    let values = col.initial_default_values(1).map_err(|e| {
        format!(
            "column {}: default {:?} is not a {}: {e}",
            col.name,
            col.initial_default.as_deref().unwrap_or_default(),
            col.data_type
        )
    })?;
    let Some(values) = values else {
        return Ok(None);
    };
    if values.is_null(0) {
        return Ok(None);
    }
    let literal = match col.data_type {
        DataType::Boolean => Literal::bool(values.as_boolean().value(0)),
        DataType::Int16 => Literal::int(values.as_primitive::<Int16Type>().value(0)),
        DataType::Int32 => Literal::int(values.as_primitive::<Int32Type>().value(0)),
        DataType::Int64 => Literal::long(values.as_primitive::<Int64Type>().value(0)),
        DataType::Float32 => Literal::float(values.as_primitive::<Float32Type>().value(0)),
        DataType::Float64 => Literal::double(values.as_primitive::<Float64Type>().value(0)),
        DataType::Decimal128(..) => {
            Literal::decimal(values.as_primitive::<Decimal128Type>().value(0))
        }
        DataType::Utf8 => Literal::string(values.as_string::<i32>().value(0)),
        DataType::Date32 => Literal::date(values.as_primitive::<Date32Type>().value(0)),
        ref other => {
            return Err(format!(
                "column {} is added with a default, which cdcd stores for booleans, numbers, text and dates, not {other}",
                col.name
            ))
        }
    };
    Ok(Some(literal))
}

/// How a row of any live data file reads under the table's current schema (Iceberg spec,
/// "Column Projection"): a file column is found by its field id (`PARQUET:field_id`), so a
/// renamed column reads under its new name and a dropped one is never taken for a later column
/// of the same name; a column the file lacks reads its field's `initial-default`, or NULL.
#[derive(Debug, Clone, Default)]
pub(crate) struct Projection {
    /// The current name of each top-level field id (empty: files are matched by name).
    names: std::collections::HashMap<i32, String>,
    /// The `initial-default` of the fields that have one, by name, as text an Arrow cast reads
    /// back into the column's type ([`changelog::Column::initial_default`]'s form).
    ///
    /// [`changelog::Column::initial_default`]: crate::changelog::Column::initial_default
    defaults: std::collections::HashMap<String, String>,
}

impl Projection {
    pub(crate) fn of(schema: &Schema) -> Projection {
        let fields = schema.as_struct().fields();
        let names = fields.iter().map(|f| (f.id, f.name.clone())).collect();
        let defaults = fields
            .iter()
            .filter_map(|f| {
                let json = f
                    .initial_default
                    .clone()?
                    .try_into_json(&f.field_type)
                    .ok()?;
                let text = match json {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                Some((f.name.clone(), text))
            })
            .collect();
        Projection { names, defaults }
    }

    /// The name a file's column `field` reads under now: its field id's current name (`None`:
    /// the field was dropped), or its own name in a file without field ids.
    pub(crate) fn current_name<'a>(&'a self, field: &'a Field) -> Option<&'a str> {
        let id = field
            .metadata()
            .get(parquet::arrow::PARQUET_FIELD_ID_META_KEY)
            .and_then(|v| v.parse::<i32>().ok());
        match id {
            Some(id) if !self.names.is_empty() => self.names.get(&id).map(String::as_str),
            _ => Some(field.name().as_str()),
        }
    }

    /// The initial default of the column named `name`, as text.
    pub(crate) fn default_of(&self, name: &str) -> Option<&str> {
        self.defaults.get(name).map(String::as_str)
    }
}

/// Arrow → Iceberg type (the mapping table of the sink's contract); `None`: not storable.
fn to_iceberg(dt: &DataType, next_id: &mut i32) -> Option<Type> {
    let p = match dt {
        DataType::Boolean => PrimitiveType::Boolean,
        DataType::Int16 | DataType::Int32 => PrimitiveType::Int,
        DataType::Int64 => PrimitiveType::Long,
        DataType::Float32 => PrimitiveType::Float,
        DataType::Float64 => PrimitiveType::Double,
        DataType::Decimal128(p, s) if *s >= 0 => PrimitiveType::Decimal {
            precision: u32::from(*p),
            scale: *s as u32,
        },
        DataType::Utf8 => PrimitiveType::String,
        DataType::Binary => PrimitiveType::Binary,
        DataType::Date32 => PrimitiveType::Date,
        DataType::Time64(TimeUnit::Microsecond) => PrimitiveType::Time,
        DataType::Timestamp(TimeUnit::Microsecond, None) => PrimitiveType::Timestamp,
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => PrimitiveType::Timestamptz,
        DataType::FixedSizeBinary(16) => PrimitiveType::Uuid,
        DataType::List(element) => {
            let id = *next_id;
            *next_id += 1;
            let inner = to_iceberg(element.data_type(), next_id)?;
            let field = NestedField::list_element(id, inner, !element.is_nullable());
            return Some(Type::List(ListType::new(Arc::new(field))));
        }
        _ => return None,
    };
    Some(Type::Primitive(p))
}

/// Why `existing` (the table's current schema) does not fit `wanted`, naming the columns; `None`
/// when names and types agree (field ids and optionality are not compared).
pub(crate) fn schema_difference(existing: &Schema, wanted: &Schema) -> Option<String> {
    let mut problems = Vec::new();
    let old = existing.as_struct().fields();
    let new = wanted.as_struct().fields();
    for f in new {
        match old.iter().find(|o| o.name == f.name) {
            None => problems.push(format!("column {} added", f.name)),
            Some(o)
                if !same_shape(&o.field_type, &f.field_type)
                    || geometry::geometry_crs(o) != geometry::geometry_crs(f) =>
            {
                let (from, to) = (geometry::type_name(o), geometry::type_name(f));
                let setting = if geometry::geometry_crs(o).is_some()
                    != geometry::geometry_crs(f).is_some()
                {
                    Some("spatial = \"plain\" | \"geometry\"")
                } else if variant::is_variant(&o.field_type) != variant::is_variant(&f.field_type) {
                    Some("json = \"string\" | \"variant\"")
                } else {
                    None
                };
                // Never rewritten in place: every file holds the old form.
                let remapped = setting.map_or(String::new(), |setting| {
                    format!(
                        " ({setting} in [sink.tables.\"…\"] changed; the table's rows are \
                         stored in one form, so this takes a resync: `cdcd resync --table …`, \
                         or source.schema_change = \"resync\")"
                    )
                });
                problems.push(format!(
                    "column {} changed type from {from} to {to}{remapped}",
                    f.name
                ))
            }
            Some(_) => {}
        }
    }
    for o in old {
        if !new.iter().any(|f| f.name == o.name) {
            problems.push(format!("column {} removed", o.name));
        }
    }
    if problems.is_empty() && old.iter().zip(new).any(|(o, f)| o.name != f.name) {
        problems.push("columns reordered".to_owned());
    }
    let mut old_key: Vec<&str> = existing
        .identifier_field_ids()
        .filter_map(|id| existing.field_by_id(id).map(|f| f.name.as_str()))
        .collect();
    let mut new_key: Vec<&str> = wanted
        .identifier_field_ids()
        .filter_map(|id| wanted.field_by_id(id).map(|f| f.name.as_str()))
        .collect();
    old_key.sort_unstable();
    new_key.sort_unstable();
    if old_key != new_key {
        problems.push(format!(
            "primary key changed from ({}) to ({})",
            old_key.join(", "),
            new_key.join(", ")
        ));
    }
    (!problems.is_empty()).then(|| problems.join(", "))
}

/// The table's next schema when `wanted` (built from `table`) is `meta`'s current schema evolved
/// the ways Iceberg allows and cdcd applies (docs/guarantees.md, "Schema changes"): the same
/// columns in the same order, found by name or renamed (`table`'s
/// [`former_names`](crate::changelog::Column::former_names), [`TableSchema::columns_in`]), each
/// with its type or a promoted one (Iceberg spec, "Schema Evolution": int → long, float →
/// double, decimal(P,S) → decimal(P',S), P' ≥ P; never of a key column), the same key, then
/// added optional columns (with their `initial-default` on format v3 only); or non-key columns
/// dropped (never both at once: that may be a rename the source could not declare; never
/// re-adding a name an earlier schema had). Kept columns keep their field ids (a promotion
/// changes only the type, a rename only the name: old files are read by field id); added ones
/// get fresh ids above `last-column-id`, nested fields included, so no id is ever reused.
/// `None`: any other change, which stops the commit with [`schema_difference`]'s description.
pub(crate) fn evolve(meta: &TableMetadata, wanted: &Schema, table: &TableSchema) -> Option<Schema> {
    let existing = meta.current_schema();
    let key_ids: Vec<i32> = existing.identifier_field_ids().collect();
    let new = wanted.as_struct().fields();
    let current = existing.as_struct().fields();
    // Kept columns (by name or renamed), in the table's order; the others are dropped (metadata
    // only: the field leaves the schema, old files keep it, its id is never reused).
    let map = table
        .columns_in(current.iter().map(|o| o.name.as_str()))
        .ok()?;
    let old: Vec<(&NestedFieldRef, usize)> = current
        .iter()
        .zip(map)
        .filter_map(|(o, at)| at.map(|at| (o, at)))
        .collect();
    let dropped = old.len() < current.len();
    if dropped && new.len() > old.len() {
        // A column left while another arrived: maybe a rename, which is never guessed.
        return None;
    }
    if key_ids
        .iter()
        .any(|id| !old.iter().any(|(o, _)| o.id == *id))
    {
        return None;
    }
    let mut fields = kept_fields(meta, &old, new, &key_ids)?;
    fields.extend(added_fields(meta, &new[old.len()..], &old)?);
    let key_names = |s: &Schema| {
        let mut k: Vec<String> = s
            .identifier_field_ids()
            .filter_map(|id| s.field_by_id(id).map(|f| f.name.clone()))
            .collect();
        k.sort_unstable();
        k
    };
    let next_schema_id = meta
        .schemas_iter()
        .map(|s| s.schema_id())
        .max()
        .unwrap_or(0)
        + 1;
    let schema = Schema::builder()
        .with_schema_id(next_schema_id)
        .with_fields(fields)
        .with_identifier_field_ids(key_ids)
        .build()
        .ok()?;
    (key_names(&schema) == key_names(wanted)).then_some(schema)
}

/// The kept columns (`old`, each with its place in `new`) as the evolved schema has them: same
/// ids, a promoted type, a new name, a relaxed `required`. `None` if one changes otherwise.
fn kept_fields(
    meta: &TableMetadata,
    old: &[(&NestedFieldRef, usize)],
    new: &[NestedFieldRef],
    key_ids: &[i32],
) -> Option<Vec<NestedFieldRef>> {
    let mut fields: Vec<NestedFieldRef> = Vec::with_capacity(new.len());
    // A name some earlier schema gave another field: engines resolve by id, but a person
    // reading two snapshots would see one name for two columns.
    let named_elsewhere = |name: &str, id: i32| {
        meta.schemas_iter().any(|s| {
            s.as_struct()
                .fields()
                .iter()
                .any(|o| o.name == name && o.id != id)
        })
    };
    for (n, (o, at)) in old.iter().enumerate() {
        let f = new.get(*at)?;
        let is_key = key_ids.contains(&o.id);
        // A key column keeps its type and its name: the primary-key index and the equality
        // deletes of earlier snapshots hold keys encoded by it.
        let promoted = !is_key && promotes(&o.field_type, &f.field_type);
        let renamed = o.name != f.name;
        let kept = *at == n
            && (!renamed || (!is_key && !named_elsewhere(&f.name, o.id)))
            && (f.required == o.required || !f.required)
            && (same_shape(&o.field_type, &f.field_type) || promoted);
        if !kept {
            return None;
        }
        let mut field = o.as_ref().clone();
        // A promotion changes a primitive's type; a kept nested type keeps its nested ids.
        if !same_shape(&o.field_type, &f.field_type) {
            field.field_type = f.field_type.clone();
        }
        field.name = f.name.clone();
        field.required = f.required;
        fields.push(Arc::new(field));
    }
    Some(fields)
}

/// The `added` columns with fresh ids above `last-column-id`. `None` if one cannot be added.
fn added_fields(
    meta: &TableMetadata,
    added: &[NestedFieldRef],
    old: &[(&NestedFieldRef, usize)],
) -> Option<Vec<NestedFieldRef>> {
    let mut fields = Vec::with_capacity(added.len());
    let mut next_id = meta.last_column_id() + 1;
    for f in added {
        if f.required || old.iter().any(|(o, _)| o.name == f.name) {
            return None;
        }
        if f.initial_default.is_some() && meta.format_version() < FormatVersion::V3 {
            // Format v2 has no `initial-default`: older rows would read NULL, not the default.
            return None;
        }
        // A name some earlier schema had: cdcd reads older files by name (lookups, multiset
        // deletes, compaction), so a dropped column's old values would show through.
        if meta
            .schemas_iter()
            .any(|s| s.as_struct().fields().iter().any(|o| o.name == f.name))
        {
            return None;
        }
        fields.push(Arc::new(fresh_ids(f, &mut next_id)));
    }
    Some(fields)
}

/// A type promotion the Iceberg spec allows ("Schema Evolution"), top-level primitives only.
fn promotes(old: &Type, new: &Type) -> bool {
    use PrimitiveType as P;
    match (old, new) {
        (Type::Primitive(o), Type::Primitive(n)) => match (o, n) {
            (P::Int, P::Long) | (P::Float, P::Double) => true,
            (
                P::Decimal {
                    precision: p,
                    scale: s,
                },
                P::Decimal {
                    precision: p2,
                    scale: s2,
                },
            ) => s == s2 && p2 >= p,
            _ => false,
        },
        _ => false,
    }
}

/// `field` with new ids from `next_id` on, its own first, then its nested fields'.
fn fresh_ids(field: &NestedField, next_id: &mut i32) -> NestedField {
    let mut field = field.clone();
    field.id = *next_id;
    *next_id += 1;
    if let Type::List(list) = field.field_type.as_ref() {
        let element = fresh_ids(&list.element_field, next_id);
        field.field_type = Box::new(Type::List(ListType::new(Arc::new(element))));
    }
    field
}

fn same_shape(a: &Type, b: &Type) -> bool {
    match (a, b) {
        (a, b) if variant::is_variant(a) || variant::is_variant(b) => {
            variant::is_variant(a) && variant::is_variant(b)
        }
        (Type::List(x), Type::List(y)) => {
            same_shape(&x.element_field.field_type, &y.element_field.field_type)
        }
        (Type::Primitive(x), Type::Primitive(y)) => x == y,
        _ => false,
    }
}

/// The Arrow schema of data files: the table's columns with Iceberg types and field ids.
pub(crate) fn data_file_schema(schema: &Schema) -> Result<SchemaRef, SinkError> {
    iceberg::arrow::schema_to_arrow_schema(schema)
        .map(|s| {
            let fields: Vec<Field> = s
                .fields()
                .iter()
                .map(|f| geometry::file_field(variant::file_field(&annotate_uuid(f))))
                .collect();
            Arc::new(ArrowSchema::new_with_metadata(fields, s.metadata().clone()))
        })
        .map_err(|source| SinkError::Iceberg {
            context: "mapping the Iceberg schema to Arrow".into(),
            source,
        })
}

/// Marks 16-byte binaries as the canonical `arrow.uuid` extension type, so Parquet files carry the
/// UUID logical type as Iceberg requires for `uuid` columns (Iceberg spec, "Parquet" type mapping:
/// uuid → fixed_len_byte_array(16) with logical type UUID). Without it DuckDB reads the column of an
/// equality delete file as a blob and fails comparing it with the table's uuid column.
fn annotate_uuid(field: &Field) -> Field {
    match field.data_type() {
        DataType::FixedSizeBinary(16) => {
            let mut metadata = field.metadata().clone();
            metadata.insert("ARROW:extension:name".to_owned(), "arrow.uuid".to_owned());
            field.clone().with_metadata(metadata)
        }
        DataType::List(element) => {
            let element = Arc::new(annotate_uuid(element));
            field.clone().with_data_type(DataType::List(element))
        }
        _ => field.clone(),
    }
}

/// The Arrow schema of equality delete files: the key fields of `file_schema`, in key order.
pub(crate) fn key_file_schema(file_schema: &ArrowSchema, key: &[usize]) -> SchemaRef {
    let fields: Vec<Field> = key
        .iter()
        .filter_map(|&k| file_schema.fields().get(k))
        .map(|f| f.as_ref().clone())
        .collect();
    Arc::new(ArrowSchema::new(fields))
}

/// The Arrow schema of position delete files (`file_path`, `pos`, with their reserved ids).
pub(crate) fn position_delete_schema() -> SchemaRef {
    let id = |f: Field, id: i32| {
        f.with_metadata(
            [(
                parquet::arrow::PARQUET_FIELD_ID_META_KEY.to_owned(),
                id.to_string(),
            )]
            .into(),
        )
    };
    Arc::new(ArrowSchema::new(vec![
        id(
            Field::new("file_path", DataType::Utf8, false),
            POS_DELETE_FILE_PATH_ID,
        ),
        id(Field::new("pos", DataType::Int64, false), POS_DELETE_POS_ID),
    ]))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::changelog::Column;
    use crate::test_fixtures::col;

    fn table(cols: Vec<Column>, key: Vec<usize>) -> TableSchema {
        crate::test_fixtures::table("s", "t", cols, key)
    }

    /// A list of nullable ints, the nested type these tests need.
    fn int_list() -> DataType {
        DataType::List(Arc::new(Field::new("item", DataType::Int32, true)))
    }

    #[test]
    fn maps_types_and_ids() {
        let t = table(
            vec![
                col("id", DataType::Int64),
                col("tags", int_list()),
                col("u", DataType::FixedSizeBinary(16)),
                col(
                    "ts",
                    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                ),
                col("small", DataType::Int16),
            ],
            vec![0],
        );
        let s = iceberg_schema(&t).unwrap();
        let f = s.as_struct().fields();
        assert_eq!(f[0].id, 1);
        assert!(f[0].required);
        assert!(!f[1].required);
        let Type::List(l) = f[1].field_type.as_ref() else {
            panic!("list")
        };
        assert_eq!(
            l.element_field.id, 6,
            "element id after the 5 top-level ids"
        );
        assert_eq!(*f[2].field_type, Type::Primitive(PrimitiveType::Uuid));
        assert_eq!(
            *f[3].field_type,
            Type::Primitive(PrimitiveType::Timestamptz)
        );
        assert_eq!(*f[4].field_type, Type::Primitive(PrimitiveType::Int));
        assert_eq!(s.identifier_field_ids().collect::<Vec<_>>(), vec![1]);
        let arrow = data_file_schema(&s).unwrap();
        assert_eq!(
            arrow.field(0).metadata()[parquet::arrow::PARQUET_FIELD_ID_META_KEY],
            "1"
        );
    }

    #[test]
    fn rejects_unsupported_types_and_missing_keys() {
        let t = table(
            vec![col("id", DataType::Int64), col("x", DataType::UInt64)],
            vec![0],
        );
        match iceberg_schema(&t) {
            Err(SinkError::UnsupportedType { column, .. }) => assert_eq!(column, "x"),
            other => panic!("{other:?}"),
        }
        // A keyless table is an append table: no identifier fields, nothing required.
        let t = table(vec![col("id", DataType::Int64)], vec![]);
        let keyless = iceberg_schema(&t).unwrap();
        assert_eq!(keyless.identifier_field_ids().count(), 0);
        assert!(keyless.as_struct().fields().iter().all(|f| !f.required));
    }

    #[test]
    fn names_changed_columns() {
        let a = iceberg_schema(&table(
            vec![col("id", DataType::Int64), col("x", DataType::Utf8)],
            vec![0],
        ))
        .unwrap();
        let b = iceberg_schema(&table(
            vec![
                col("id", DataType::Int64),
                col("x", DataType::Int64),
                col("y", DataType::Utf8),
            ],
            vec![0],
        ))
        .unwrap();
        assert_eq!(schema_difference(&a, &a), None);
        let d = schema_difference(&a, &b).unwrap();
        assert!(d.contains("column x changed type"), "{d}");
        assert!(d.contains("column y added"), "{d}");
        let swapped = iceberg_schema(&table(
            vec![col("x", DataType::Utf8), col("id", DataType::Int64)],
            vec![1],
        ))
        .unwrap();
        assert_eq!(
            schema_difference(&a, &swapped).unwrap(),
            "columns reordered"
        );
        let rekeyed = iceberg_schema(&table(
            vec![col("id", DataType::Int64), col("x", DataType::Utf8)],
            vec![1],
        ))
        .unwrap();
        let d = schema_difference(&a, &rekeyed).unwrap();
        assert!(d.contains("primary key changed from (id) to (x)"), "{d}");
    }

    /// A new v2 table of `schema` at `location`.
    fn v2_table(schema: &TableSchema, location: &str) -> TableMetadata {
        crate::sinks::iceberg::commit::publish::new_table(
            &schema.id,
            location,
            iceberg_schema(schema).unwrap(),
            iceberg::spec::FormatVersion::V2,
            std::collections::HashMap::new(),
        )
        .unwrap()
    }

    #[test]
    fn evolve_keeps_ids_and_never_reuses_one() {
        let first = table(
            vec![
                col("id", DataType::Int64),
                col("x", DataType::Int32),
                col("tags", int_list()),
            ],
            vec![0],
        );
        let meta = v2_table(&first, "file:///tmp/t");
        assert_eq!(meta.last_column_id(), 4, "3 columns and a list element");
        let mut cols = first.columns.clone();
        cols[1].data_type = DataType::Int64;
        cols.push(col("c", int_list()));
        let wanted_table = table(cols, vec![0]);
        let wanted = iceberg_schema(&wanted_table).unwrap();
        let next = evolve(&meta, &wanted, &wanted_table).unwrap();
        let f = next.as_struct().fields();
        assert_eq!((f[1].id, f[1].field_type.to_string()), (2, "long".into()));
        assert_eq!(f[2].id, 3, "a kept list keeps its id");
        assert_eq!(f[3].id, 5, "the added column: after last-column-id");
        let Type::List(l) = f[3].field_type.as_ref() else {
            panic!("list")
        };
        assert_eq!(l.element_field.id, 6);
        assert_eq!(next.identifier_field_ids().collect::<Vec<_>>(), vec![1]);
        assert_eq!(next.schema_id(), 1);

        // A drop of a non-key column: the field leaves, the ids stay.
        let two = table(first.columns[..2].to_vec(), vec![0]);
        let dropped = evolve(&meta, &iceberg_schema(&two).unwrap(), &two).unwrap();
        let ids: Vec<i32> = dropped.as_struct().fields().iter().map(|f| f.id).collect();
        assert_eq!(ids, [1, 2]);
        // Refused: a narrowing, a change of type family, a rename, a key change.
        let refused = |cols: Vec<Column>, key: Vec<usize>| {
            let t = table(cols, key);
            evolve(&meta, &iceberg_schema(&t).unwrap(), &t).is_none()
        };
        assert!(refused(
            vec![
                col("id", DataType::Int64),
                col("x", DataType::Utf8),
                first.columns[2].clone()
            ],
            vec![0]
        ));
        let mut renamed = first.columns.clone();
        renamed[1].name = "y".into();
        assert!(
            refused(renamed.clone(), vec![0]),
            "a rename nobody declared"
        );
        // A declared rename keeps the field id and changes only the name.
        renamed[1].former_names = vec!["x".into()];
        let t = table(renamed.clone(), vec![0]);
        let next_renamed = evolve(&meta, &iceberg_schema(&t).unwrap(), &t).unwrap();
        let f = next_renamed.as_struct().fields();
        assert_eq!((f[1].id, f[1].name.as_str()), (2, "y"));
        // Never a key column's rename.
        let mut key_renamed = first.columns.clone();
        key_renamed[0].name = "key".into();
        key_renamed[0].former_names = vec!["id".into()];
        assert!(refused(key_renamed, vec![0]));
        // A name given up and taken by another column at once: never guessed.
        renamed.push(Column {
            name: "x".into(),
            ..col("x", DataType::Int32)
        });
        assert!(refused(renamed, vec![0]));
        assert!(refused(first.columns.clone(), vec![0, 1]));
        let int_key = table(vec![col("k", DataType::Int32)], vec![0]);
        let int_meta = v2_table(&int_key, "file:///tmp/k");
        let long_key = table(vec![col("k", DataType::Int64)], vec![0]);
        assert!(
            evolve(&int_meta, &iceberg_schema(&long_key).unwrap(), &long_key).is_none(),
            "a key column keeps its type"
        );
        let narrowed = table(
            vec![
                col("id", DataType::Int64),
                col("x", DataType::Int32),
                first.columns[2].clone(),
            ],
            vec![0],
        );
        let wide_meta = iceberg::spec::TableMetadataBuilder::new_from_metadata(meta.clone(), None)
            .add_current_schema(next)
            .unwrap()
            .build()
            .unwrap()
            .metadata;
        assert!(evolve(&wide_meta, &iceberg_schema(&narrowed).unwrap(), &narrowed).is_none());
    }
}
