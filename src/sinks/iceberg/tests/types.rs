//! Every mapped type, written, completed through a table lookup, and read back by DuckDB.

use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::*;
use arrow_buffer::BooleanBuffer;
use arrow_schema::{DataType, Field, TimeUnit};

use super::*;

const TS: i64 = 1_704_164_645_000_006; // 2024-01-02 03:04:05.000006

fn typed_schema() -> Arc<TableSchema> {
    let list = DataType::List(Arc::new(Field::new("item", DataType::Int32, true)));
    let cols = [
        ("k", DataType::Int16),
        ("s", DataType::Utf8),
        ("bo", DataType::Boolean),
        ("i", DataType::Int32),
        ("l", DataType::Int64),
        ("f", DataType::Float32),
        ("d", DataType::Float64),
        ("dec", DataType::Decimal128(12, 2)),
        ("t", DataType::Utf8),
        ("bin", DataType::Binary),
        ("day", DataType::Date32),
        ("tm", DataType::Time64(TimeUnit::Microsecond)),
        ("ts", DataType::Timestamp(TimeUnit::Microsecond, None)),
        (
            "tstz",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        ),
        ("u", DataType::FixedSizeBinary(16)),
        ("li", list),
    ];
    let columns = cols.into_iter().map(|(n, dt)| col(n, dt)).collect();
    Arc::new(table("public", "typed", columns, vec![0, 1]))
}

fn batch(
    t: &Arc<TableSchema>,
    ops: Vec<Op>,
    cols: Vec<ArrayRef>,
    present: Vec<Option<BooleanBuffer>>,
) -> TableChanges {
    let n = ops.len();
    let rows = RecordBatch::try_new(TableChanges::rows_schema(t), cols).unwrap();
    let keys_schema = TableChanges::keys_schema(t);
    let old_keys = RecordBatch::try_new(
        keys_schema,
        vec![
            Arc::new(Int16Array::from(vec![None::<i16>; n])),
            Arc::new(StringArray::from(vec![None::<&str>; n])),
        ],
    )
    .unwrap();
    TableChanges {
        schema: t.clone(),
        ops,
        rows,
        present,
        old_keys,
        key_changed: vec![false; n],
        upsert_window: false,
        copy_chunk: None,
        source_tx: None,
    }
}

#[tokio::test]
async fn every_type_reads_back_in_duckdb() {
    every_type(DeleteMode::Equality).await
}

#[tokio::test]
async fn every_type_reads_back_in_duckdb_with_deletion_vectors() {
    every_type(DeleteMode::DeletionVectors).await
}

async fn every_type(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink(dir.path(), mode);
    let t = typed_schema();
    let uuid: Vec<u8> = (0u8..16).collect();
    let first: Vec<ArrayRef> = vec![
        Arc::new(Int16Array::from(vec![1, 2])),
        Arc::new(StringArray::from(vec!["x", "y"])),
        Arc::new(BooleanArray::from(vec![Some(true), None])),
        Arc::new(Int32Array::from(vec![Some(-5), None])),
        Arc::new(Int64Array::from(vec![Some(1 << 40), None])),
        Arc::new(Float32Array::from(vec![Some(1.5), None])),
        Arc::new(Float64Array::from(vec![Some(2.25), None])),
        Arc::new(
            Decimal128Array::from(vec![Some(12345), None])
                .with_precision_and_scale(12, 2)
                .unwrap(),
        ),
        Arc::new(StringArray::from(vec![Some("héllo"), None])),
        Arc::new(BinaryArray::from(vec![Some(&[0u8, 1, 255][..]), None])),
        Arc::new(Date32Array::from(vec![Some(19724), None])),
        Arc::new(Time64MicrosecondArray::from(vec![
            Some(3_723_000_001),
            None,
        ])),
        Arc::new(TimestampMicrosecondArray::from(vec![Some(TS), None])),
        Arc::new(TimestampMicrosecondArray::from(vec![Some(TS), None]).with_timezone("UTC")),
        Arc::new(
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                vec![Some(uuid.as_slice()), None].into_iter(),
                16,
            )
            .unwrap(),
        ),
        Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1), None, Some(3)]),
            None,
        ])),
    ];
    let present = vec![None; first.len()];
    s.commit(
        &t,
        &[batch(
            &t,
            vec![Op::Insert, Op::Insert],
            first.clone(),
            present,
        )],
        &cp(1),
    )
    .await
    .unwrap();

    // Update (1, 'x'): `i` changes, `t` and `li` absent (completed from the table).
    let mut second: Vec<ArrayRef> = first.iter().map(|a| a.slice(0, 1)).collect();
    second[3] = Arc::new(Int32Array::from(vec![7]));
    second[8] = Arc::new(StringArray::from(vec![None::<&str>]));
    second[15] = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
        None::<Vec<Option<i32>>>,
    ]));
    let mut present = vec![None; second.len()];
    present[8] = Some(BooleanBuffer::from(vec![false]));
    present[15] = Some(BooleanBuffer::from(vec![false]));
    s.commit(&t, &[batch(&t, vec![Op::Update], second, present)], &cp(2))
        .await
        .unwrap();

    let td = dir.path().join("public/typed").display().to_string();
    let code = format!(
        "con = connect()\n\
         rows = con.sql(\"select k, s, bo, i, l, f, d, dec::varchar, t, hex(bin), day::varchar, tm::varchar, ts::varchar, \
         epoch_us(tstz), u::varchar, li from iceberg_scan('{td}') order by k\").fetchall()\n\
         print(repr(rows))"
    );
    if let Some(out) = python(&code) {
        assert_eq!(
            out,
            "[(1, 'x', True, 7, 1099511627776, 1.5, 2.25, '123.45', 'héllo', '0001FF', '2024-01-02', \
             '01:02:03.000001', '2024-01-02 03:04:05.000006', 1704164645000006, \
             '00010203-0405-0607-0809-0a0b0c0d0e0f', [1, None, 3]), \
             (2, 'y', None, None, None, None, None, None, None, None, None, None, None, None, None, None)]"
        );
    }
}
