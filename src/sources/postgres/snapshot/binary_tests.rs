//! Binary COPY decoding: numeric on hand-built values, the reader on a stream split at every
//! offset, and, against a real server (`CDCD_TEST_PG`), binary equal to text for every type with a
//! binary decoder, plus key-range chunks that cover a table exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::changelog::TableId;
use crate::sources::postgres::snapshot::session::test_session;
use crate::sources::postgres::snapshot::{copy_chunk, ChunkCopy, Reader};
use crate::test_fixtures::{column, table};
use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int32Type};

fn numeric(weight: i16, sign: u16, dscale: u16, digits: &[i16]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend((digits.len() as u16).to_be_bytes());
    v.extend(weight.to_be_bytes());
    v.extend(sign.to_be_bytes());
    v.extend(dscale.to_be_bytes());
    for d in digits {
        v.extend(d.to_be_bytes());
    }
    v
}

fn decode(ty: &ColumnType, v: &[u8]) -> Result<arrow_array::ArrayRef, Bad> {
    let mut b = arrow_array::builder::make_builder(&ty.data_type(), 1);
    append_binary(ty, b.as_mut(), v)?;
    Ok(b.finish())
}

#[test]
fn numeric_to_decimal_and_text() {
    let dec = ColumnType::Decimal {
        precision: 12,
        scale: 2,
    };
    // 12345.67 = 1·10000^1 + 2345·10000^0 + 6700·10000^-1
    let v = numeric(1, 0, 2, &[1, 2345, 6700]);
    let a = decode(&dec, &v).unwrap();
    assert_eq!(a.as_primitive::<Decimal128Type>().value(0), 1_234_567);
    let neg = numeric(0, NUMERIC_NEG, 2, &[12, 3000]);
    assert_eq!(
        decode(&dec, &neg)
            .unwrap()
            .as_primitive::<Decimal128Type>()
            .value(0),
        -1230
    );
    assert!(decode(&dec, &numeric(0, NUMERIC_NAN, 0, &[])).is_err());
    assert!(
        decode(&dec, &numeric(3, 0, 0, &[1])).is_err(),
        "10^12 overflows 12 digits"
    );
    assert!(
        decode(&dec, &numeric(0, 0, 3, &[1, 2340])).is_err(),
        "1.234 has a digit past scale 2"
    );
    // Past u64 (the i128 path): 10^20 + 0.5 at scale 2.
    let wide = ColumnType::Decimal {
        precision: 38,
        scale: 2,
    };
    let big = numeric(5, 0, 1, &[1, 0, 0, 0, 0, 0, 5000]);
    assert_eq!(
        decode(&wide, &big)
            .unwrap()
            .as_primitive::<Decimal128Type>()
            .value(0),
        10i128.pow(22) + 50
    );
    // 10^-40 is no decimal(38, 2) value; 0 with a huge negative weight still is.
    assert!(decode(&wide, &numeric(-10, 0, 40, &[1])).is_err());
    let zero = numeric(0, 0, 0, &[]);
    assert_eq!(
        decode(&dec, &zero)
            .unwrap()
            .as_primitive::<Decimal128Type>()
            .value(0),
        0
    );

    let text = ColumnType::NumericText {
        type_name: "numeric".into(),
    };
    let s = |v: &[u8]| {
        decode(&text, v)
            .unwrap()
            .as_string::<i32>()
            .value(0)
            .to_owned()
    };
    assert_eq!(s(&v), "12345.67");
    assert_eq!(s(&neg), "-12.30");
    assert_eq!(s(&zero), "0");
    // 1e-20 with dscale 20: weight -5, one digit 1 (0.0000 0000 0000 0000 0001).
    assert_eq!(s(&numeric(-5, 0, 20, &[1])), "0.00000000000000000001");
    assert_eq!(s(&numeric(2, 0, 0, &[7])), "700000000");
    assert_eq!(s(&numeric(0, NUMERIC_PINF, 0, &[])), "Infinity");
    assert_eq!(s(&numeric(0, NUMERIC_NAN, 0, &[])), "NaN");
    assert!(decode(&text, &[0, 1]).is_err(), "short");
}

#[test]
fn dates_and_timestamps_match_the_text_sentinels() {
    let d = |v: i32| {
        decode(&ColumnType::Date, &v.to_be_bytes())
            .unwrap()
            .as_primitive::<arrow_array::types::Date32Type>()
            .value(0)
    };
    assert_eq!(d(0), 10_957);
    assert_eq!(d(i32::MAX), i32::MAX);
    assert_eq!(d(i32::MIN), -i32::MAX);
    let ts = |v: i64| {
        decode(&ColumnType::Timestamp, &v.to_be_bytes()).map(|a| {
            a.as_primitive::<arrow_array::types::TimestampMicrosecondType>()
                .value(0)
        })
    };
    assert_eq!(ts(0), Ok(PG_EPOCH_MICROS));
    assert_eq!(ts(i64::MIN), Ok(-i64::MAX));
    assert!(ts(i64::MAX - 1).is_err());
    assert!(decode(&ColumnType::Int32, &[0, 1]).is_err(), "wrong length");
}

fn schema(types: &[ColumnType]) -> Arc<TableSchema> {
    let columns = types
        .iter()
        .enumerate()
        .map(|(i, t)| column(&format!("c{i}"), t.data_type(), true, &t.source_name()))
        .collect();
    Arc::new(table("public", "t", columns, vec![0]))
}

/// Header, three rows (one with a NULL), trailer.
fn stream() -> Vec<u8> {
    let mut v = SIGNATURE.to_vec();
    v.extend(0u32.to_be_bytes());
    v.extend(4u32.to_be_bytes());
    v.extend([9, 9, 9, 9]); // a header extension to skip
    for (id, text) in [(1, Some("a")), (2, None), (3, Some("ccc"))] {
        v.extend(2i16.to_be_bytes());
        v.extend(4i32.to_be_bytes());
        v.extend(i32::to_be_bytes(id));
        match text {
            Some(t) => {
                v.extend((t.len() as i32).to_be_bytes());
                v.extend(t.as_bytes());
            }
            None => v.extend((-1i32).to_be_bytes()),
        }
    }
    v.extend((-1i16).to_be_bytes());
    v
}

#[test]
fn reader_handles_rows_split_at_any_offset() {
    let types = [
        ColumnType::Int32,
        ColumnType::Text {
            type_name: "text".into(),
        },
    ];
    let data = stream();
    for split in 0..=data.len() {
        for rows in [1, 2, 10] {
            let limits = BatchLimits {
                rows,
                bytes: usize::MAX,
            };
            let r = BinaryCopyReader::new(schema(&types), &types, limits, Op::Update).unwrap();
            let (rows_read, batches) =
                Reader::Binary(r).read_all(&[&data[..split], &data[split..]]);
            assert_eq!(rows_read, 3);
            let ids: Vec<i32> = batches
                .iter()
                .flat_map(|b| {
                    b.rows
                        .column(0)
                        .as_primitive::<Int32Type>()
                        .values()
                        .to_vec()
                })
                .collect();
            assert_eq!(ids, [1, 2, 3], "split {split}, rows {rows}");
            assert!(batches
                .iter()
                .all(|b| b.ops.iter().all(|o| *o == Op::Update)));
            let texts: Vec<Option<&str>> = batches
                .iter()
                .flat_map(|b| b.rows.column(1).as_string::<i32>().iter())
                .collect();
            assert_eq!(texts, [Some("a"), None, Some("ccc")]);
        }
    }
    let limits = BatchLimits { rows: 10, bytes: 1 };
    let mut r = BinaryCopyReader::new(schema(&types), &types, limits, Op::Insert).unwrap();
    r.feed(&data[..data.len() - 2]).unwrap();
    let truncated = r.finish();
    assert!(truncated.is_err(), "no trailer");
}

// ---- against a real server ----

const SETUP: &str = r#"
DROP TABLE IF EXISTS binary_types;
DROP DOMAIN IF EXISTS binary_posint;
DROP TYPE IF EXISTS binary_mood;
CREATE TYPE binary_mood AS ENUM ('happy', 'sad');
CREATE DOMAIN binary_posint AS int4 CHECK (VALUE > 0);
CREATE TABLE binary_types (
  id int4 PRIMARY KEY, b bool, i2 int2, i8 int8, o oid, f4 float4, f8 float8,
  n numeric(12,2), nu numeric, nb numeric(38,10), t text, vc varchar(10), c char(4), nm name,
  by bytea, d date, tm time, ts timestamp, tstz timestamptz, u uuid, j json, jb jsonb,
  mood binary_mood, pos binary_posint
);
INSERT INTO binary_types VALUES
 (1, true, -32768, 9223372036854775807, 4294967295, 1.5, 'NaN', 12.30, 1e-20, -1234567890.0123456789,
  E'tab\there\nnew\\line', 'short', 'ab', 'nm', '\x00ff5c', '4713-01-01 BC', '24:00:00',
  '2024-01-02 03:04:05.5', '2024-01-02 08:34:05.123456+05:30',
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": 1}', '{"b": [1, 2], "a": "x"}', 'sad', 7),
 (2, NULL, NULL, NULL, NULL, '-Infinity', '-Infinity', NULL, 'Infinity', 0, '', NULL, NULL, NULL,
  '\x', 'infinity', NULL, '-infinity', 'infinity', NULL, NULL, NULL, NULL, NULL),
 (3, false, 7, -1, 0, -0.0, 1e308, -0.01, 123456789012345678901234567890.5, 99.5, 'ü', 'x', 'abcd', '',
  '\xdeadbeef', '2000-01-01', '00:00:00.000001', '1999-12-31 23:59:59.999999', '1970-01-01 00:00:00+00',
  '00000000-0000-0000-0000-000000000000', '[]', 'null', 'happy', 1);
INSERT INTO binary_types (id, nu) SELECT g, g * 1.5 FROM generate_series(4, 1000) g;
-- Keys of 1 to 6 digits: their text order is not their numeric order.
INSERT INTO binary_types (id, nu) SELECT g * 997, 0 FROM generate_series(2, 1000) g;
"#;

/// The test server's URL and a client to it, or `None` (the test is skipped) without one.
async fn test_client() -> Option<(String, tokio_postgres::Client)> {
    let url = crate::test_ground::var("the binary COPY test", "CDCD_TEST_PG")?;
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    Some((url, client))
}

#[tokio::test]
async fn binary_equals_text_and_chunks_cover_the_table_once() {
    let Some((url, client)) = test_client().await else {
        return;
    };
    // Other tests share the server: a schema of our own.
    let ns = format!("binary_{}", std::process::id());
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {ns} CASCADE; CREATE SCHEMA {ns}; SET search_path = {ns}; {SETUP} ANALYZE binary_types;"
        ))
        .await
        .unwrap();
    let table = TableId::new(ns.clone(), "binary_types");
    let cols = crate::sources::postgres::catalog::table_columns(&client, &table)
        .await
        .unwrap();
    let oids: Vec<u32> = cols.iter().map(|c| c.type_oid).collect();
    let catalog = crate::sources::postgres::catalog::lookup_types(&client, &oids)
        .await
        .unwrap();
    let lookup = |oid: u32| catalog.get(&oid).cloned();
    let keys = vec!["id".to_owned()];
    let (schema, types) = crate::sources::postgres::relation::build_schema(
        table.clone(),
        &cols,
        Some(keys.as_slice()),
        &lookup,
    )
    .unwrap();
    let schema = Arc::new(schema);
    assert!(types.iter().all(supports_binary), "{types:?}");

    let copy = |binary: bool, filter: String| {
        let schema = schema.clone();
        let rows_schema = schema.clone();
        let types = &types;
        let url = &url;
        async move {
            let mut session = test_session(url).await;
            let mut batches = Vec::new();
            let spec = ChunkCopy {
                schema,
                types,
                filter,
                binary,
                op: Op::Insert,
                marker: false,
                limits: BatchLimits {
                    rows: 100_000,
                    bytes: usize::MAX,
                },
            };
            copy_chunk(&mut session, spec, |b| {
                batches.push(b);
                async { Ok(()) }
            })
            .await
            .unwrap();
            let schema = crate::changelog::TableChanges::rows_schema(&rows_schema);
            let rows: Vec<_> = batches.iter().map(|b| b.rows.clone()).collect();
            arrow_select::concat::concat_batches(&schema, &rows).unwrap()
        }
    };
    let order = " ORDER BY id".to_owned();
    let text = copy(false, order.clone()).await;
    let binary = copy(true, order).await;
    assert_eq!(text.num_rows(), 1999);
    for (i, (t, b)) in text.columns().iter().zip(binary.columns()).enumerate() {
        assert_eq!(t, b, "column {} differs", schema.columns[i].name);
    }

    // Key ranges from a sample: every row in exactly one chunk.
    let shape = crate::sources::postgres::catalog::table_shape(&client, &table)
        .await
        .unwrap();
    let plan = super::super::parallel::plan_table(
        &client,
        schema.clone(),
        types.clone(),
        shape,
        None,
        100,
    )
    .await
    .unwrap();
    assert!(plan.chunks.len() > 2, "{}", plan.chunks.len());
    let mut ids = Vec::new();
    for range in &plan.chunks {
        let part = copy(true, range.where_clause(&plan.key)).await;
        ids.extend(
            part.column(0)
                .as_primitive::<Int32Type>()
                .values()
                .iter()
                .copied(),
        );
    }
    let copied = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(copied, ids.len(), "a row in two chunks");
    let mut want: Vec<i32> = (1..=1000).chain((2..=1000).map(|g| g * 997)).collect();
    want.sort_unstable();
    want.dedup();
    assert_eq!(ids, want);
    client
        .batch_execute(&format!("DROP SCHEMA {ns} CASCADE"))
        .await
        .unwrap();
}

/// A plan's chunks hold similar row counts: the sample behind the bounds is one key from each of
/// many pages, not many keys from a few pages (which left chunks of a few dozen rows beside
/// chunks of many thousands).
#[tokio::test]
async fn sampled_chunks_are_even() {
    let Some((_, client)) = test_client().await else {
        return;
    };
    let ns = format!("chunks_{}", std::process::id());
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {ns} CASCADE; CREATE SCHEMA {ns};
             CREATE TABLE {ns}.t (id int8 PRIMARY KEY, pad text);
             INSERT INTO {ns}.t SELECT g, md5(g::text) FROM generate_series(1, 200000) g;
             ANALYZE {ns}.t;"
        ))
        .await
        .unwrap();
    let columns = vec![
        column("id", arrow_schema::DataType::Int64, false, ""),
        column("pad", arrow_schema::DataType::Utf8, true, ""),
    ];
    let schema = Arc::new(table(&ns, "t", columns, vec![0]));
    let types = vec![
        ColumnType::Int64,
        ColumnType::Text {
            type_name: "text".into(),
        },
    ];
    let chunk_rows = 10_000;
    let shape = crate::sources::postgres::catalog::table_shape(&client, &schema.id)
        .await
        .unwrap();
    let plan = super::super::parallel::plan_table(&client, schema, types, shape, None, chunk_rows)
        .await
        .unwrap();
    assert!(plan.chunks.len() >= 15, "{} chunks", plan.chunks.len());
    for range in &plan.chunks {
        let sql = format!(
            "SELECT count(*) FROM {ns}.t{}",
            range.where_clause(&plan.key)
        );
        let rows: i64 = client.query_one(sql.as_str(), &[]).await.unwrap().get(0);
        assert!(
            (2_500..=30_000).contains(&rows),
            "a chunk of {rows} rows ({:?}); chunks of ~{chunk_rows} expected",
            range
        );
    }
    client
        .batch_execute(&format!("DROP SCHEMA {ns} CASCADE"))
        .await
        .unwrap();
}
