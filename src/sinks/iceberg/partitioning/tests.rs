//! Partition values and order of the pure layout (`layout.rs`) and the plan split (`split.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use iceberg::spec::{
    FormatVersion, Literal, NestedField, NullOrder, PrimitiveType, Schema, SortDirection,
    SortField, SortOrder, Struct, TableMetadata, TableMetadataBuilder, Transform, Type,
    UnboundPartitionSpec,
};

use super::*;
use crate::sinks::iceberg::plan::{CellSource, Fill, Plan, PlannedFile, RowRef};

fn schema() -> Schema {
    Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "ts", Type::Primitive(PrimitiveType::Timestamptz)).into(),
            NestedField::optional(3, "name", Type::Primitive(PrimitiveType::String)).into(),
            NestedField::optional(4, "n", Type::Primitive(PrimitiveType::Int)).into(),
        ])
        .build()
        .unwrap()
}

fn table(fields: &[(i32, &str, Transform)], sort: &[(i32, SortDirection)]) -> TableMetadata {
    let mut spec = UnboundPartitionSpec::builder();
    for (source, name, t) in fields {
        spec = spec.add_partition_field(*source, *name, *t).unwrap();
    }
    let mut order = SortOrder::builder();
    for (source, direction) in sort {
        order.with_sort_field(SortField {
            source_id: *source,
            transform: Transform::Identity,
            direction: *direction,
            null_order: NullOrder::First,
        });
    }
    let order = if sort.is_empty() {
        SortOrder::unsorted_order()
    } else {
        order.with_order_id(1).build_unbound().unwrap()
    };
    TableMetadataBuilder::new(
        schema(),
        spec.build(),
        order,
        "memory://t".to_owned(),
        FormatVersion::V3,
        HashMap::new(),
    )
    .unwrap()
    .build()
    .unwrap()
    .metadata
}

/// `2024-01-02T03:04:05Z` plus `days`, in microseconds.
fn ts(days: i64) -> i64 {
    (1_704_164_645 + days * 86_400) * 1_000_000
}

/// The layout's columns of four rows: ids 34, 35, 36, 34; ts day 0, 1, 0, NULL; names.
fn rows(layout: &Layout, file_schema_cols: usize) -> RecordBatch {
    assert_eq!(file_schema_cols, 4);
    let all: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![34, 35, 36, 34])),
        Arc::new(
            TimestampMicrosecondArray::from(vec![Some(ts(0)), Some(ts(1)), Some(ts(0)), None])
                .with_timezone("+00:00"),
        ),
        Arc::new(StringArray::from(vec!["apple", "apricot", "banana", "apx"])),
        Arc::new(Int32Array::from(vec![7, 12, 5, 9])),
    ];
    let columns: Vec<ArrayRef> = layout.columns().iter().map(|&c| all[c].clone()).collect();
    RecordBatch::try_from_iter(
        columns
            .into_iter()
            .enumerate()
            .map(|(i, c)| (format!("c{i}"), c)),
    )
    .unwrap()
}

fn tuple(values: Vec<Option<Literal>>) -> Struct {
    Struct::from_iter(values)
}

#[test]
fn an_unpartitioned_unsorted_table_is_plain() {
    let layout = Layout::of(&table(&[], &[])).unwrap();
    assert!(layout.is_plain());
    assert!(layout.sort_order_id.is_none());
}

/// Iceberg spec, "Appendix B": bucket(34) of an int or long hashes to 2017239379, so bucket 3 of
/// 4; day(2024-01-02) is 19724 days after the epoch; truncate(2) of "apple" is "ap".
#[test]
fn rows_split_by_day_bucket_and_truncate_in_first_row_order() {
    let layout = Layout::of(&table(
        &[
            (2, "ts_day", Transform::Day),
            (1, "id_bucket", Transform::Bucket(4)),
            (3, "name_trunc", Transform::Truncate(2)),
        ],
        &[],
    ))
    .unwrap();
    assert!(!layout.is_plain());
    let parts = layout.arrange(&rows(&layout, 4)).unwrap();
    let got: Vec<(Struct, Vec<u32>)> = parts.into_iter().map(|p| (p.partition, p.rows)).collect();
    let day = |d: i32| Some(Literal::date(19724 + d));
    let bucket = |b: i32| Some(Literal::int(b));
    let s = |v: &str| Some(Literal::string(v));
    assert_eq!(got[0], (tuple(vec![day(0), bucket(3), s("ap")]), vec![0]));
    assert_eq!(got[1].0.fields().len(), 3);
    assert_eq!(got.len(), 4, "{got:?}");
    // Row 3: NULL ts, same bucket and truncation as row 0.
    assert_eq!(got[3], (tuple(vec![None, bucket(3), s("ap")]), vec![3]));
}

#[test]
fn year_month_hour_identity_and_void_give_their_values() {
    let first = |fields: &[(i32, &str, Transform)]| {
        let layout = Layout::of(&table(fields, &[])).unwrap();
        layout.arrange(&rows(&layout, 4)).unwrap()
    };
    // 2024 is 54 years after 1970; January 2024 is month 648; 2024-01-02T03 is hour 473379.
    let parts = first(&[
        (2, "y", Transform::Year),
        (4, "n", Transform::Identity),
        (3, "v", Transform::Void),
    ]);
    assert_eq!(
        parts[0].partition,
        tuple(vec![Some(Literal::int(54)), Some(Literal::int(7)), None])
    );
    assert_eq!(parts.len(), 4, "every row has its own n");
    let parts = first(&[(2, "m", Transform::Month)]);
    assert_eq!(parts[0].partition, tuple(vec![Some(Literal::int(648))]));
    assert_eq!(parts.len(), 2, "January 2024 and NULL");
    let parts = first(&[(2, "h", Transform::Hour)]);
    assert_eq!(parts[0].partition, tuple(vec![Some(Literal::int(473_379))]));
    assert_eq!(parts[0].rows, vec![0, 2]);
}

#[test]
fn rows_of_a_part_follow_the_sort_order() {
    let layout = Layout::of(&table(
        &[(1, "id_bucket", Transform::Bucket(1))],
        &[(4, SortDirection::Descending)],
    ))
    .unwrap();
    assert_eq!(layout.sort_order_id, Some(1));
    let parts = layout.arrange(&rows(&layout, 4)).unwrap();
    assert_eq!(parts.len(), 1);
    // n = 7, 12, 5, 9 descending: rows 1, 3, 0, 2.
    assert_eq!(parts[0].rows, vec![1, 3, 0, 2]);
    let sorted_only = Layout::of(&table(&[], &[(4, SortDirection::Ascending)])).unwrap();
    let parts = sorted_only.arrange(&rows(&sorted_only, 4)).unwrap();
    assert_eq!(parts[0].partition, Struct::empty());
    assert_eq!(parts[0].rows, vec![2, 0, 3, 1]);
}

fn r(batch: u32, row: u32) -> RowRef {
    RowRef { batch, row }
}

/// Fills and position deletes move with their rows into the partition files.
#[test]
fn split_moves_fills_and_position_deletes_with_their_rows() {
    let mut plan = Plan {
        files: vec![
            PlannedFile {
                rows: vec![r(0, 0), r(0, 1), r(0, 2)],
                fills: vec![Fill {
                    pos: 2,
                    column: 3,
                    source: CellSource::Table(0),
                }],
            },
            PlannedFile {
                rows: vec![r(0, 3)],
                fills: Vec::new(),
            },
        ],
        position_deletes: vec![(0, 0), (0, 2)],
        ..Plan::default()
    };
    let p = |n: i32| tuple(vec![Some(Literal::int(n))]);
    let arranged = vec![
        vec![
            Part {
                partition: p(1),
                rows: vec![2, 0],
            },
            Part {
                partition: p(2),
                rows: vec![1],
            },
        ],
        vec![Part {
            partition: p(1),
            rows: vec![0],
        }],
    ];
    let partitions = split_plan(&mut plan, arranged).unwrap();
    assert_eq!(partitions, vec![p(1), p(2), p(1)]);
    assert_eq!(plan.files[0].rows, vec![r(0, 2), r(0, 0)]);
    assert_eq!(plan.files[1].rows, vec![r(0, 1)]);
    assert_eq!(plan.files[2].rows, vec![r(0, 3)]);
    assert_eq!(
        plan.files[0].fills,
        vec![Fill {
            pos: 0,
            column: 3,
            source: CellSource::Table(0)
        }]
    );
    assert_eq!(plan.position_deletes, vec![(0, 0), (0, 1)]);
    let mut short = plan.clone();
    assert!(split_plan(&mut short, vec![]).is_err());
}
