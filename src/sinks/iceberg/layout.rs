//! A table's layout, its partition spec and sort order, from its `[sink.tables.*]` settings
//! (`config/tables.rs`). Pure: [`bind`] checks the settings against the table's schema and
//! builds iceberg's types; [`evolve`] gives the metadata that makes them the table's defaults,
//! as Spark's `ALTER TABLE … ADD/DROP PARTITION FIELD` and `WRITE ORDERED BY` would; [`describe`]
//! words them for `cdcd check` and `cdcd status`.
//!
//! A new table gets spec 0 = the configured spec and sort order 1 (if any) from
//! `TableMetadataBuilder::new`. On an existing table a changed `partition_by` adds a spec whose
//! fields keep the field ids of equal fields (same source column and transform) of any earlier
//! spec and take new ids above `last-partition-id` otherwise (iceberg's
//! `TableMetadataBuilder::add_partition_spec` does both, as Iceberg-Java's); kept fields keep
//! their names. A setting left unset leaves the table's spec or order alone, whoever set it.

use iceberg::spec::{
    NestedField, PartitionSpec, Schema, SortField as IcebergSortField, SortOrder, TableMetadata,
    TableMetadataBuilder, Transform, Type, UnboundPartitionSpec,
};

use crate::changelog::TableId;
use crate::config::{ConfigError, Origin, PartitionField, SortField, TableSettings};
use crate::sinks::TableLayout;

/// The configured spec and order of one table, bound to a schema's field ids. `None`: not
/// configured.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Layout {
    pub spec: Option<UnboundPartitionSpec>,
    pub order: Option<SortOrder>,
}

impl Layout {
    /// For a new table: the configured spec and order, else unpartitioned and unsorted.
    pub fn for_new_table(self) -> (UnboundPartitionSpec, SortOrder) {
        (
            self.spec
                .unwrap_or_else(|| UnboundPartitionSpec::builder().build()),
            self.order.unwrap_or_else(SortOrder::unsorted_order),
        )
    }
}

/// Checks `settings` against `schema` (the table's current one) and builds its layout. A field
/// of an existing table (`existing`) with the same source column and transform keeps its name.
/// Errors name the file, the key, the table, the column, its type and what applies to it.
pub(crate) fn bind(
    table: &TableId,
    settings: &TableSettings,
    schema: &Schema,
    existing: Option<&TableMetadata>,
) -> Result<Layout, ConfigError> {
    let spec = match &settings.partition_by {
        None => None,
        Some(configured) => {
            let columns = Columns::of(table, schema, &configured.origin);
            Some(partition_spec(&columns, &configured.value, existing)?)
        }
    };
    let order = match &settings.sort_by {
        None => None,
        Some(configured) => {
            let columns = Columns::of(table, schema, &configured.origin);
            Some(sort_order(&columns, &configured.value)?)
        }
    };
    Ok(Layout { spec, order })
}

/// `fields` as a partition spec; a field keeps the name `existing` gave it.
fn partition_spec(
    columns: &Columns<'_>,
    fields: &[PartitionField],
    existing: Option<&TableMetadata>,
) -> Result<UnboundPartitionSpec, ConfigError> {
    let mut builder = UnboundPartitionSpec::builder();
    for field in fields {
        let shown = field.to_string();
        let source = columns.get(&field.column, field.transform, &shown)?;
        let name = existing
            .and_then(|meta| kept_name(meta, source.id, field.transform))
            .unwrap_or_else(|| field_name(&field.column, field.transform));
        builder = builder
            .add_partition_field(source.id, name, field.transform)
            .map_err(|e| columns.invalid(format!("{shown}: {}", e.message())))?;
    }
    Ok(builder.build())
}

/// `fields` as a sort order.
fn sort_order(columns: &Columns<'_>, fields: &[SortField]) -> Result<SortOrder, ConfigError> {
    let mut builder = SortOrder::builder();
    for field in fields {
        let source = columns.get(&field.column, field.transform, &field.to_string())?;
        builder.with_sort_field(IcebergSortField {
            source_id: source.id,
            transform: field.transform,
            direction: field.direction,
            null_order: field.null_order,
        });
    }
    builder
        .build(columns.schema)
        .map_err(|e| columns.invalid(e.message().to_owned()))
}

/// The columns a table's configured fields name, and the setting that names them (for errors).
struct Columns<'a> {
    table: &'a TableId,
    schema: &'a Schema,
    origin: &'a Origin,
}

impl<'a> Columns<'a> {
    fn of(table: &'a TableId, schema: &'a Schema, origin: &'a Origin) -> Columns<'a> {
        Columns {
            table,
            schema,
            origin,
        }
    }

    /// The setting is invalid for this table: `detail`.
    fn invalid(&self, detail: String) -> ConfigError {
        self.origin.invalid(format!("{}: {detail}", self.table))
    }

    /// The column `name`, checked to take `transform` (the field is written `shown`).
    fn get(
        &self,
        name: &str,
        transform: Transform,
        shown: &str,
    ) -> Result<&'a NestedField, ConfigError> {
        let (table, schema, origin) = (self.table, self.schema, self.origin);
        let Some(field) = schema.as_struct().field_by_name(name) else {
            let columns: Vec<&str> = schema
                .as_struct()
                .fields()
                .iter()
                .map(|f| f.name.as_str())
                .collect();
            return Err(origin.invalid(format!(
                "{table} has no column {name:?} (its columns: {})",
                columns.join(", ")
            )));
        };
        if crate::sinks::iceberg::variant::is_variant(&field.field_type) {
            // Iceberg spec: a variant column is never a partition or sort source.
            return Err(origin.invalid(format!(
            "{table}: {shown}: column {name:?} is a variant (json = \"variant\"), which cannot \
             be partitioned or sorted by"
        )));
        }
        if crate::sinks::iceberg::geometry::geometry_crs(field).is_some() {
            // Iceberg spec: no transform applies to a geometry.
            return Err(origin.invalid(format!(
                "{table}: {shown}: column {name:?} is a geometry (spatial = \"geometry\"), which \
             cannot be partitioned or sorted by"
            )));
        }
        if transform.result_type(&field.field_type).is_err() {
            let ty = &field.field_type;
            let applies = applicable(ty, name);
            let applies = if applies.is_empty() {
                "none: the column cannot be partitioned or sorted by".to_owned()
            } else {
                applies.join(", ")
            };
            return Err(origin.invalid(format!(
            "{table}: {shown} does not apply to column {name:?} of type {ty}; what applies to {ty}: \
             {applies}"
        )));
        }
        Ok(field)
    }
}

/// The transforms that take a column of type `ty`, as the config writes them.
fn applicable(ty: &Type, column: &str) -> Vec<String> {
    let candidates = [
        Transform::Identity,
        Transform::Bucket(16),
        Transform::Truncate(10),
        Transform::Year,
        Transform::Month,
        Transform::Day,
        Transform::Hour,
        Transform::Void,
    ];
    candidates
        .into_iter()
        .filter(|t| t.result_type(ty).is_ok())
        .map(|t| match t {
            Transform::Bucket(_) => format!("bucket(N, {column})"),
            Transform::Truncate(_) => format!("truncate(W, {column})"),
            other => PartitionField {
                column: column.to_owned(),
                transform: other,
            }
            .to_string(),
        })
        .collect()
}

/// The name of an equal field (same source column and transform) of `meta`'s default spec,
/// else of its newest earlier spec that has one.
fn kept_name(meta: &TableMetadata, source_id: i32, transform: Transform) -> Option<String> {
    let find = |spec: &PartitionSpec| {
        spec.fields()
            .iter()
            .find(|f| f.source_id == source_id && f.transform == transform)
            .map(|f| f.name.clone())
    };
    if let Some(name) = find(meta.default_partition_spec()) {
        return Some(name);
    }
    let mut specs: Vec<_> = meta.partition_specs_iter().collect();
    specs.sort_by_key(|s| std::cmp::Reverse(s.spec_id()));
    specs.into_iter().find_map(|s| find(s))
}

/// A new partition field's name, as Iceberg-Java's and pyiceberg's spec updates name it:
/// `id_bucket_16`, `name_trunc_4`, `created_at_day`, `x_null`; identity keeps the column's.
fn field_name(column: &str, transform: Transform) -> String {
    match transform {
        Transform::Identity => column.to_owned(),
        Transform::Bucket(n) => format!("{column}_bucket_{n}"),
        Transform::Truncate(w) => format!("{column}_trunc_{w}"),
        Transform::Void => format!("{column}_null"),
        other => format!("{column}_{other}"),
    }
}

/// What [`evolve`] changed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Evolved {
    pub metadata: TableMetadata,
    /// The new default spec's id, when the spec changed.
    pub spec_id: Option<i32>,
    /// The new default order's id, when the order changed.
    pub order_id: Option<i64>,
}

/// The metadata after `meta` with `layout`'s spec and order as the defaults (one metadata
/// change, to be committed on its own); `None` when they are the defaults already. `file` is
/// `meta`'s metadata file, for the metadata log.
pub(crate) fn evolve(
    meta: &TableMetadata,
    file: &str,
    layout: &Layout,
) -> Result<Option<Evolved>, iceberg::Error> {
    let spec = layout
        .spec
        .as_ref()
        .filter(|spec| !same_spec(meta.default_partition_spec(), spec));
    let order = layout
        .order
        .as_ref()
        .filter(|order| meta.default_sort_order().fields != order.fields);
    if spec.is_none() && order.is_none() {
        return Ok(None);
    }
    let mut builder = TableMetadataBuilder::new_from_metadata(meta.clone(), Some(file.to_owned()));
    if let Some(spec) = spec {
        builder = builder.add_default_partition_spec(spec.clone())?;
    }
    if let Some(order) = order {
        builder = builder
            .add_sort_order(order.clone())?
            .set_default_sort_order(TableMetadataBuilder::LAST_ADDED as i64)?;
    }
    let metadata = builder.build()?.metadata;
    Ok(Some(Evolved {
        spec_id: spec.map(|_| metadata.default_partition_spec_id()),
        order_id: order.map(|_| metadata.default_sort_order_id()),
        metadata,
    }))
}

/// Same fields, in order, by source column and transform (names aside: a spec another engine
/// named otherwise is still the configured one).
fn same_spec(current: &PartitionSpec, wanted: &UnboundPartitionSpec) -> bool {
    current.fields().len() == wanted.fields().len()
        && current
            .fields()
            .iter()
            .zip(wanted.fields())
            .all(|(a, b)| a.source_id == b.source_id && a.transform == b.transform)
}

/// `meta`'s default spec and sort order in the config's words, for `cdcd check` and `status`:
/// (`spec 1: day(created_at), bucket(4, id)`, `order 1: id asc nulls first`).
pub(crate) fn describe(meta: &TableMetadata) -> TableLayout {
    let schema = meta.current_schema();
    let name = |id: i32| {
        schema
            .name_by_field_id(id)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("#{id}"))
    };
    let spec = meta.default_partition_spec();
    let fields: Vec<String> = spec
        .fields()
        .iter()
        .map(|f| {
            PartitionField {
                column: name(f.source_id),
                transform: f.transform,
            }
            .to_string()
        })
        .collect();
    let spec = match fields.is_empty() {
        true => format!("spec {}: unpartitioned", spec.spec_id()),
        false => format!("spec {}: {}", spec.spec_id(), fields.join(", ")),
    };
    let order = meta.default_sort_order();
    let fields: Vec<String> = order
        .fields
        .iter()
        .map(|f| {
            crate::config::SortField {
                column: name(f.source_id),
                transform: f.transform,
                direction: f.direction,
                null_order: f.null_order,
            }
            .to_string()
        })
        .collect();
    let order = match fields.is_empty() {
        true => format!("order {}: unsorted", order.order_id),
        false => format!("order {}: {}", order.order_id, fields.join(", ")),
    };
    TableLayout {
        partition_spec: spec,
        sort_order: order,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "layout_tests.rs"]
mod tests;
