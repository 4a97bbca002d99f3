//! The layout of a new table, its evolution, and the refusals that name the column and its type.

use std::collections::HashMap;

use iceberg::spec::{
    FormatVersion, NestedField, PrimitiveType, Schema, SortOrder, TableMetadata,
    TableMetadataBuilder, Transform, Type, UnboundPartitionSpec,
};

use super::{bind, describe, evolve, Layout};
use crate::changelog::TableId;
use crate::config::TableSettings;

fn schema() -> Schema {
    Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)).into(),
            NestedField::optional(3, "created_at", Type::Primitive(PrimitiveType::Timestamptz))
                .into(),
            NestedField::optional(4, "amount", Type::Primitive(PrimitiveType::Double)).into(),
        ])
        .build()
        .unwrap()
}

fn table() -> TableId {
    TableId::new("public", "orders")
}

/// The settings of public.orders under `section` (the body of its `[sink.tables.*]`).
fn settings(section: &str) -> TableSettings {
    crate::test_fixtures::table_settings(&table(), section)
}

fn created(layout: Layout) -> TableMetadata {
    let (spec, order) = layout.for_new_table();
    created_with(spec, order)
}

/// public.orders's first metadata with `spec` and `order`.
fn created_with(spec: UnboundPartitionSpec, order: SortOrder) -> TableMetadata {
    TableMetadataBuilder::new(
        schema(),
        spec,
        order,
        "memory://wh/public/orders".into(),
        FormatVersion::V2,
        HashMap::new(),
    )
    .unwrap()
    .build()
    .unwrap()
    .metadata
}

fn ids(meta: &TableMetadata) -> Vec<(i32, String, Transform)> {
    meta.default_partition_spec()
        .fields()
        .iter()
        .map(|f| (f.field_id, f.name.clone(), f.transform))
        .collect()
}

#[test]
fn a_new_table_gets_spec_0_and_sort_order_1() {
    let s = settings("partition_by = [\"day(created_at)\", \"bucket(4, id)\"]\nsort_by = [\"id\"]");
    let meta = created(bind(&table(), &s, &schema(), None).unwrap());
    assert_eq!(meta.default_partition_spec_id(), 0);
    assert_eq!(
        ids(&meta),
        vec![
            (1000, "created_at_day".to_owned(), Transform::Day),
            (1001, "id_bucket_4".to_owned(), Transform::Bucket(4)),
        ]
    );
    assert_eq!(meta.default_sort_order_id(), 1);
    let shown = describe(&meta);
    assert_eq!(
        shown.partition_spec,
        "spec 0: day(created_at), bucket(4, id)"
    );
    assert_eq!(shown.sort_order, "order 1: id asc nulls first");
    // Nothing configured: unpartitioned, unsorted, as before.
    let meta = created(bind(&table(), &settings(""), &schema(), None).unwrap());
    let shown = describe(&meta);
    assert_eq!(
        (shown.partition_spec.as_str(), shown.sort_order.as_str()),
        ("spec 0: unpartitioned", "order 0: unsorted")
    );
}

#[test]
fn a_changed_partition_by_adds_a_spec_keeping_the_ids_of_kept_fields() {
    let first = settings("partition_by = [\"day(created_at)\", \"bucket(4, id)\"]");
    let meta = created(bind(&table(), &first, &schema(), None).unwrap());
    let layout = bind(&table(), &first, meta.current_schema(), Some(&meta)).unwrap();
    assert_eq!(evolve(&meta, "v1.metadata.json", &layout).unwrap(), None);

    // Spark's DROP PARTITION FIELD days(created_at), ADD PARTITION FIELD truncate(2, name).
    let second = settings("partition_by = [\"bucket(4, id)\", \"truncate(2, name)\"]\nsort_by = [\"created_at desc\"]");
    let layout = bind(&table(), &second, meta.current_schema(), Some(&meta)).unwrap();
    let evolved = evolve(&meta, "v1.metadata.json", &layout)
        .unwrap()
        .expect("a new spec");
    assert_eq!(evolved.spec_id, Some(1));
    assert_eq!(evolved.order_id, Some(1));
    let next = &evolved.metadata;
    assert_eq!(
        ids(next),
        vec![
            (1001, "id_bucket_4".to_owned(), Transform::Bucket(4)),
            (1002, "name_trunc_2".to_owned(), Transform::Truncate(2)),
        ]
    );
    assert_eq!(next.last_partition_id(), 1002);
    assert_eq!(next.partition_specs_iter().len(), 2);
    let shown = describe(next);
    assert_eq!(
        shown.partition_spec,
        "spec 1: bucket(4, id), truncate(2, name)"
    );
    assert_eq!(shown.sort_order, "order 1: created_at desc nulls last");

    // Back to the first: its spec (and field ids) again, as Iceberg-Java reuses a spec.
    let layout = bind(&table(), &first, next.current_schema(), Some(next)).unwrap();
    let back = evolve(next, "v2.metadata.json", &layout).unwrap().unwrap();
    assert_eq!(back.spec_id, Some(0));
    assert_eq!(back.order_id, None);
    assert_eq!(ids(&back.metadata)[0].0, 1000);

    // partition_by = []: unpartitioned from now on (a new, empty spec).
    let layout = bind(
        &table(),
        &settings("partition_by = []"),
        next.current_schema(),
        Some(next),
    )
    .unwrap();
    let none = evolve(next, "v2.metadata.json", &layout).unwrap().unwrap();
    assert!(none.metadata.default_partition_spec().fields().is_empty());
    // Unset keys leave the table's spec and order alone.
    let layout = bind(&table(), &settings(""), next.current_schema(), Some(next)).unwrap();
    assert_eq!(
        (layout.spec.is_none(), layout.order.is_none()),
        (true, true)
    );
    assert_eq!(evolve(next, "v2.metadata.json", &layout).unwrap(), None);
}

#[test]
fn a_field_another_engine_named_keeps_its_name() {
    // Spark names days(created_at) `created_at_day` too, but a spec may name it anything.
    let spec = UnboundPartitionSpec::builder()
        .add_partition_field(3, "by_day", Transform::Day)
        .unwrap()
        .build();
    let meta = created_with(spec, SortOrder::unsorted_order());
    let s = settings("partition_by = [\"day(created_at)\", \"identity(name)\"]");
    let layout = bind(&table(), &s, meta.current_schema(), Some(&meta)).unwrap();
    let evolved = evolve(&meta, "v1.metadata.json", &layout).unwrap().unwrap();
    assert_eq!(
        ids(&evolved.metadata),
        vec![
            (1000, "by_day".to_owned(), Transform::Day),
            (1001, "name".to_owned(), Transform::Identity),
        ]
    );
}

#[test]
fn unknown_columns_and_transforms_that_do_not_apply_are_refused() {
    let e = bind(
        &table(),
        &settings("partition_by = [\"day(nope)\"]"),
        &schema(),
        None,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "p.toml: key `sink.tables.\"public.orders\".partition_by`: public.orders has no column \
         \"nope\" (its columns: id, name, created_at, amount)"
    );
    let e = bind(
        &table(),
        &settings("partition_by = [\"day(name)\"]"),
        &schema(),
        None,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "p.toml: key `sink.tables.\"public.orders\".partition_by`: public.orders: day(name) does \
         not apply to column \"name\" of type string; what applies to string: name, \
         bucket(N, name), truncate(W, name), void(name)"
    );
    let e = bind(
        &table(),
        &settings("sort_by = [\"bucket(4, amount) desc\"]"),
        &schema(),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("p.toml: key `sink.tables.\"public.orders\".sort_by`: public.orders: bucket(4, amount) desc nulls last does not apply to column \"amount\" of type double")
            && e.ends_with("what applies to double: amount, void(amount)"),
        "{e}"
    );
    let e = bind(
        &table(),
        &settings("partition_by = [\"day(created_at)\", \"hour(created_at)\"]"),
        &schema(),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("p.toml: key `sink.tables.\"public.orders\".partition_by`: public.orders: hour(created_at): "),
        "{e}"
    );
}
