//! A new lineage's partition specs and sort orders: the live table's, under the same ids, so the
//! manifests the swap carries into the live table (each names its spec by id: the manifest
//! list's `partition_spec_id`, the manifest file's `partition-spec-id` header that Iceberg-Java's
//! `ManifestReader` reads) mean there what they meant in the lineage.
//!
//! Each live spec and order is bound to the lineage's schema by column name (the lineage's field
//! ids are fresh, 1..n: `schema.rs`), keeping its spec id, partition field ids, field names and
//! transforms; `last-partition-id` is the live table's. A spec or order whose source column the
//! lineage's schema no longer has is left out; when that is the live default spec, the lineage
//! keeps the configured layout it was created with, and the swap's check (`rebase.rs`) refuses
//! a spec that differs rather than carry it.

use iceberg::spec::TableMetadata;
use serde_json::{json, Value};

use crate::changelog::TableId;
use crate::sinks::SinkError;

/// `fresh` (a lineage's metadata as created) with `live`'s specs and sort orders, as the module
/// doc says.
pub(in crate::sinks::iceberg) fn like_live(
    table: &TableId,
    fresh: TableMetadata,
    live: &TableMetadata,
) -> Result<TableMetadata, SinkError> {
    let (from, to) = (live.current_schema(), fresh.current_schema());
    // A live field id -> the lineage's field id of the column of the same name.
    let rebind = |id: i32| {
        from.name_by_field_id(id)
            .and_then(|name| to.field_by_name(name))
            .map(|f| f.id)
    };
    let mut specs = Vec::new();
    for spec in live.partition_specs_iter() {
        let fields: Option<Vec<Value>> = spec
            .fields()
            .iter()
            .map(|f| {
                let source = rebind(f.source_id)?;
                let ty = &to.field_by_id(source)?.field_type;
                f.transform.result_type(ty).ok()?;
                let mut f = f.clone();
                f.source_id = source;
                serde_json::to_value(f).ok()
            })
            .collect();
        if let Some(fields) = fields {
            specs.push(json!({"spec-id": spec.spec_id(), "fields": fields}));
        }
    }
    let mut orders = Vec::new();
    for order in live.sort_orders_iter() {
        let fields: Option<Vec<Value>> = order
            .fields
            .iter()
            .map(|f| {
                let source = rebind(f.source_id)?;
                let mut f = f.clone();
                f.source_id = source;
                serde_json::to_value(f).ok()
            })
            .collect();
        if let Some(fields) = fields {
            orders.push(json!({"order-id": order.order_id, "fields": fields}));
        }
    }
    let has = |list: &[Value], key: &str, id: i64| list.iter().any(|v| v[key] == id);
    let spec_kept = has(&specs, "spec-id", live.default_partition_spec_id().into());
    let order_kept = has(&orders, "order-id", live.default_sort_order_id());
    if !spec_kept && !order_kept {
        return Ok(fresh);
    }
    let corrupt = |e: serde_json::Error| SinkError::Data {
        table: table.clone(),
        detail: format!("resync: giving the lineage the live table's partition specs: {e}"),
    };
    let mut meta = serde_json::to_value(&fresh).map_err(corrupt)?;
    if spec_kept {
        meta["partition-specs"] = Value::Array(specs);
        meta["default-spec-id"] = live.default_partition_spec_id().into();
        meta["last-partition-id"] = live.last_partition_id().into();
        if let Some(m) = meta.as_object_mut() {
            // v1's single `partition-spec` field, if the serializer wrote one.
            m.remove("partition-spec");
        }
    }
    if order_kept {
        meta["sort-orders"] = Value::Array(orders);
        meta["default-sort-order-id"] = live.default_sort_order_id().into();
    }
    serde_json::from_value(meta).map_err(corrupt)
}
