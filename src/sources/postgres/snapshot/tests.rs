//! COPY text parsing on captured bytes (split at every offset), and the whole copy against a real
//! server when `CDCD_TEST_PG` is set (e.g. `postgres://postgres@127.0.0.1:55432/cdc`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::sources::postgres::types::TypeInfo;
use crate::test_fixtures::{column, table};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    Time64MicrosecondType, TimestampMicrosecondType,
};
use arrow_array::Array;
use std::collections::HashMap;

fn schema_of(name: &str, columns: &[(&str, &ColumnType)]) -> Arc<TableSchema> {
    let columns = columns
        .iter()
        .map(|(n, t)| column(n, t.data_type(), true, &t.source_name()))
        .collect();
    Arc::new(table("public", name, columns, vec![0]))
}

fn text_ty() -> ColumnType {
    ColumnType::Text {
        type_name: "text".into(),
    }
}

#[test]
fn unescapes_copy_fields() {
    let mut out = Vec::new();
    for (input, expected) in [
        (&br"a\tb\nc\\d"[..], &b"a\tb\nc\\d"[..]),
        (br"\b\f\r\v", b"\x08\x0c\r\x0b"),
        (br"\101\0\12x", b"A\0\nx"),
        (br"\x41\x4g\xz", b"A\x04gxz"),
        (br"\.\N", b".N"),
        (br"end\", b"end\\"),
    ] {
        unescape_copy(input, &mut out);
        assert_eq!(out, expected, "{}", String::from_utf8_lossy(input));
    }
}

/// Captured `COPY (SELECT id, body, n FROM t) TO STDOUT` output.
const DATA: &[u8] = b"1\ta\\tb\\nc\\\\d\t1.50\n2\t\\N\t\\N\n3\t\t-0.25\n";

fn check_batches(batches: &[TableChanges]) {
    let ops: Vec<Op> = batches.iter().flat_map(|b| b.ops.clone()).collect();
    assert_eq!(ops, [Op::Truncate, Op::Insert, Op::Insert, Op::Insert]);
    let first = &batches[0];
    assert!(!first.is_present(0, 0), "the Truncate carries no columns");
    let mut ids = Vec::new();
    let mut bodies = Vec::new();
    for b in batches {
        for row in 0..b.len() {
            if b.ops[row] == Op::Insert {
                assert!((0..3).all(|c| b.is_present(c, row)));
                ids.push(b.rows.column(0).as_primitive::<Int32Type>().value(row));
                let body = b.rows.column(1).as_string::<i32>();
                bodies.push((!body.is_null(row)).then(|| body.value(row).to_owned()));
            }
        }
        assert!(b.key_changed.iter().all(|k| !k));
    }
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(
        bodies,
        [Some("a\tb\nc\\d".to_owned()), None, Some(String::new())]
    );
}

#[test]
fn rows_split_anywhere_across_chunks() {
    let num = ColumnType::Decimal {
        precision: 4,
        scale: 2,
    };
    let types = [ColumnType::Int32, text_ty(), num.clone()];
    let schema = schema_of("t", &[("id", &types[0]), ("body", &types[1]), ("n", &num)]);
    for batch_rows in [1, 2, 100] {
        for cut in 0..=DATA.len() {
            for cut2 in cut..=DATA.len() {
                let reader = CopyReader::new(schema.clone(), &types, batch_rows).unwrap();
                let chunks = [&DATA[..cut], &DATA[cut..cut2], &DATA[cut2..]];
                let (rows_read, batches) = Reader::Text(reader).read_all(&chunks);
                assert_eq!(rows_read, 3);
                if batch_rows == 1 {
                    assert_eq!(batches.len(), 3);
                }
                check_batches(&batches);
            }
        }
    }
}

#[test]
fn empty_table_yields_the_truncate() {
    let types = [ColumnType::Int32];
    let schema = schema_of("t", &[("id", &types[0])]);
    let reader = CopyReader::new(schema, &types, 10).unwrap();
    let last = reader.finish().unwrap().unwrap();
    assert_eq!(last.ops, [Op::Truncate]);
}

#[test]
fn bad_rows_name_table_row_and_column() {
    let types = [ColumnType::Int32, text_ty()];
    let schema = schema_of("t", &[("id", &types[0]), ("body", &types[1])]);
    let feed = |data: &[u8]| {
        let mut r = CopyReader::new(schema.clone(), &types, 10).unwrap();
        r.feed(data).and_then(|_| r.finish().map(|_| ()))
    };
    let e = feed(b"1\tx\nzz\ty\n").unwrap_err();
    assert_eq!(e.kind(), "snapshot_value");
    let msg = e.to_string();
    assert!(
        msg.contains("public.t") && msg.contains("row 2") && msg.contains("column id"),
        "{msg}"
    );
    assert!(msg.contains("\"zz\""), "{msg}");
    assert!(feed(b"1\n")
        .unwrap_err()
        .to_string()
        .contains("1 fields for 2 columns"));
    assert!(feed(b"1\ta\tb\n")
        .unwrap_err()
        .to_string()
        .contains("more fields"));
    assert!(feed(b"1\ta")
        .unwrap_err()
        .to_string()
        .contains("inside a row"));
    let wrong = CopyReader::new(schema.clone(), &types[..1], 10)
        .err()
        .unwrap();
    assert_eq!(wrong.kind(), "snapshot_schema");
}

#[test]
fn statement_quotes_identifiers() {
    let types = [ColumnType::Int32];
    let mut schema = (*schema_of("t", &[("we\"ird", &types[0])])).clone();
    schema.id = TableId::new("My\"Schema", "t");
    let schema = Arc::new(schema);
    assert_eq!(
        copy_statement(&schema),
        r#"COPY (SELECT "we""ird" FROM "My""Schema"."t") TO STDOUT"#
    );
    assert_eq!(quote_literal("a'b"), "'a''b'");
}

// ---- against a real server ----

const SETUP: &str = r#"
DROP TABLE IF EXISTS types_all;
DROP DOMAIN IF EXISTS types_posint;
DROP TYPE IF EXISTS types_mood;
CREATE TYPE types_mood AS ENUM ('happy', 'sad');
CREATE DOMAIN types_posint AS int4 CHECK (VALUE > 0);
CREATE TABLE types_all (
  id int4 PRIMARY KEY, b bool, i2 int2, i8 int8, o oid, f4 float4, f8 float8,
  n numeric(12,2), nu numeric, t text, vc varchar(10), c char(4), by bytea, d date, tm time,
  ttz timetz, ts timestamp, tstz timestamptz, u uuid, j json, jb jsonb, iv interval,
  mood types_mood, pos types_posint, ai int4[], at text[], an numeric(4,2)[], au uuid[],
  am types_mood[], ci xml
);
INSERT INTO types_all VALUES
 (1, true, -32768, 9223372036854775807, 4294967295, 1.5, 'NaN', 12.30, 1e-20, E'tab\there\nnew\\line',
  'short', 'ab', '\x00ff5c', '4713-01-01 BC', '24:00:00', '03:04:05+05:30',
  '2024-01-02 03:04:05.5', '2024-01-02 08:34:05.123456+05:30',
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": 1}', '{"b": [1, 2]}', '1 year 2 mons 3 days 04:05:06.5',
  'sad', 7, '{1,NULL,3}', ARRAY['a,b', 'NULL', NULL, E'q"\\', E'tab\t'], '{1.50,NULL}',
  '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}', '{happy,sad}', '<x>1</x>'),
 (2, NULL, NULL, NULL, NULL, NULL, '-Infinity', NULL, NULL, '', NULL, NULL, '\x', 'infinity', NULL, NULL,
  '-infinity', 'infinity', NULL, NULL, NULL, NULL, NULL, NULL, '{}', '{}', NULL, NULL, NULL, NULL);
"#;

#[tokio::test]
async fn copies_every_type_from_a_real_server() {
    let Some(url) = crate::test_ground::var("copies_every_type_from_a_real_server", "CDCD_TEST_PG")
    else {
        return;
    };
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client.batch_execute(SETUP).await.unwrap();

    // Resolve the columns as the source would: OID and typmod, plus catalog rows.
    let attrs = client
        .query(
            "SELECT attname::text, atttypid, atttypmod FROM pg_attribute \
             WHERE attrelid = 'types_all'::regclass AND attnum > 0 ORDER BY attnum",
            &[],
        )
        .await
        .unwrap();
    let catalog: HashMap<u32, TypeInfo> = client
        .query(
            "SELECT oid, typnamespace::regnamespace::text, typname::text, typtype, typelem, typbasetype \
             FROM pg_type WHERE typname IN ('types_mood', '_types_mood', 'types_posint', 'xml')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let oid: u32 = r.get(0);
            let elem: u32 = r.get(4);
            let base: u32 = r.get(5);
            let typtype: i8 = r.get(3);
            let info = TypeInfo {
                oid,
                namespace: r.get(1),
                name: r.get(2),
                typtype: typtype as u8,
                element: (elem != 0).then_some(elem),
                base: (base != 0).then_some(base),
            };
            (oid, info)
        })
        .collect();
    let lookup = |oid: u32| catalog.get(&oid).cloned();
    let names: Vec<String> = attrs.iter().map(|r| r.get(0)).collect();
    let types: Vec<ColumnType> = attrs
        .iter()
        .map(|r| ColumnType::resolve(r.get(1), r.get(2), &lookup))
        .collect();
    let cols: Vec<(&str, &ColumnType)> = names.iter().map(|n| n.as_str()).zip(&types).collect();
    let schema = schema_of("types_all", &cols);
    assert_eq!(schema.columns[29].source_type, "xml");
    assert_eq!(
        schema.columns[23].source_type,
        "types_posint (domain over int4)"
    );

    // Through an exported snapshot, as the source does: rows inserted after it stay invisible.
    let (exporter, conn2) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn2);
    exporter
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    let snap: String = exporter
        .query_one("SELECT pg_export_snapshot()", &[])
        .await
        .unwrap()
        .get(0);
    client
        .batch_execute("INSERT INTO types_all (id) VALUES (3)")
        .await
        .unwrap();

    let mut session = super::session::test_session(&url).await;
    let mut batches = Vec::new();
    let copied = copy_table(&mut session, schema.clone(), &types, Some(&snap), 1, |b| {
        batches.push(b);
        async { Ok(()) }
    })
    .await
    .unwrap();
    exporter.batch_execute("COMMIT").await.unwrap();
    assert_eq!(copied, 2);
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[0].ops, [Op::Truncate, Op::Insert]);
    check_row_one(&batches[0], 1);
    check_row_two(&batches[1], 0);

    // Without a snapshot: the current state.
    let mut count = 0;
    let copied = copy_table(&mut session, schema, &types, None, 100, |b| {
        count += b.len();
        async { Ok(()) }
    })
    .await
    .unwrap();
    assert_eq!((copied, count), (3, 4));
    client
        .batch_execute("DROP TABLE types_all; DROP DOMAIN types_posint; DROP TYPE types_mood;")
        .await
        .unwrap();
}

fn check_row_one(b: &TableChanges, r: usize) {
    let c = |i: usize| b.rows.column(i);
    let s = |i: usize| c(i).as_string::<i32>().value(r).to_owned();
    assert_eq!(c(0).as_primitive::<Int32Type>().value(r), 1);
    assert!(c(1).as_boolean().value(r));
    assert_eq!(c(2).as_primitive::<Int16Type>().value(r), i16::MIN);
    assert_eq!(c(3).as_primitive::<Int64Type>().value(r), i64::MAX);
    assert_eq!(c(4).as_primitive::<Int64Type>().value(r), 4_294_967_295);
    assert_eq!(c(5).as_primitive::<Float32Type>().value(r), 1.5);
    assert!(c(6).as_primitive::<Float64Type>().value(r).is_nan());
    assert_eq!(c(7).as_primitive::<Decimal128Type>().value(r), 1230);
    assert_eq!(s(8), "0.00000000000000000001");
    assert_eq!(s(9), "tab\there\nnew\\line");
    assert_eq!(s(10), "short");
    assert_eq!(s(11), "ab  ");
    assert_eq!(c(12).as_binary::<i32>().value(r), &[0, 0xff, b'\\']);
    assert_eq!(c(13).as_primitive::<Date32Type>().value(r), -2_440_550);
    assert_eq!(
        c(14).as_primitive::<Time64MicrosecondType>().value(r),
        86_400_000_000
    );
    assert_eq!(s(15), "03:04:05+05:30");
    let ts = |i: usize| c(i).as_primitive::<TimestampMicrosecondType>().value(r);
    assert_eq!(ts(16), 1_704_164_645_500_000);
    assert_eq!(ts(17), 1_704_164_645_123_456);
    assert_eq!(c(18).as_fixed_size_binary().value(r)[..2], [0xa0, 0xee]);
    assert_eq!(s(19), r#"{"a": 1}"#);
    assert_eq!(s(20), r#"{"b": [1, 2]}"#);
    assert_eq!(s(21), "P1Y2M3DT4H5M6.5S");
    assert_eq!(s(22), "sad");
    assert_eq!(c(23).as_primitive::<Int32Type>().value(r), 7);
    let list = |i: usize| c(i).as_list::<i32>().value(r);
    let ai = list(24);
    assert_eq!(ai.len(), 3);
    assert!(ai.is_null(1));
    assert_eq!(ai.as_primitive::<Int32Type>().value(2), 3);
    let at = list(25);
    let at = at.as_string::<i32>();
    assert_eq!(at.value(0), "a,b");
    assert_eq!(at.value(1), "NULL");
    assert!(at.is_null(2));
    assert_eq!(at.value(3), "q\"\\");
    assert_eq!(at.value(4), "tab\t");
    let an = list(26);
    assert_eq!(an.as_primitive::<Decimal128Type>().value(0), 150);
    assert!(an.is_null(1));
    assert_eq!(list(27).as_fixed_size_binary().value(0)[0], 0xa0);
    assert_eq!(list(28).as_string::<i32>().value(1), "sad");
    assert_eq!(s(29), "<x>1</x>");
}

fn check_row_two(b: &TableChanges, r: usize) {
    let c = |i: usize| b.rows.column(i);
    assert_eq!(c(0).as_primitive::<Int32Type>().value(r), 2);
    for null in [
        1, 2, 3, 4, 5, 7, 8, 10, 11, 14, 15, 18, 19, 20, 21, 22, 23, 26, 27, 28, 29,
    ] {
        assert!(c(null).is_null(r), "column {null}");
        assert!(b.is_present(null, r), "NULL is present");
    }
    assert_eq!(
        c(6).as_primitive::<Float64Type>().value(r),
        f64::NEG_INFINITY
    );
    assert_eq!(c(9).as_string::<i32>().value(r), "");
    assert_eq!(c(12).as_binary::<i32>().value(r), b"");
    assert_eq!(c(13).as_primitive::<Date32Type>().value(r), i32::MAX);
    let ts = |i: usize| c(i).as_primitive::<TimestampMicrosecondType>().value(r);
    assert_eq!((ts(16), ts(17)), (-i64::MAX, i64::MAX));
    assert_eq!(c(24).as_list::<i32>().value(r).len(), 0);
    assert_eq!(c(25).as_list::<i32>().value(r).len(), 0);
}

/// The source runs the copy inside a spawned task, so its future must be `Send`.
#[allow(dead_code)]
fn _copy_table_is_send(
    session: &mut super::CopySession,
    schema: Arc<TableSchema>,
    types: &[ColumnType],
) {
    fn is_send<T: Send>(_: T) {}
    is_send(copy_table(
        session,
        schema,
        types,
        Some("s"),
        1,
        |_| async { Ok(()) },
    ));
}

/// A copy session plans its chunk queries without parallel workers or JIT, off plain index scans
/// (`plan_for_copy`: the server defaults cost ~60 % more CPU per chunk of a large table).
#[tokio::test]
async fn copy_sessions_plan_without_workers_or_jit() {
    let test = "copy_sessions_plan_without_workers_or_jit";
    let Some(url) = crate::test_ground::var(test, "CDCD_TEST_PG") else {
        return;
    };
    let mut session = session::test_session(&url).await;
    plan_for_copy(&mut session, &TableId::new("public", "t"))
        .await
        .unwrap();
    session
        .copy_out(
            "COPY (SELECT current_setting('enable_indexscan'), \
             current_setting('max_parallel_workers_per_gather'), current_setting('jit')) TO STDOUT",
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    while session.read_copy(&mut out, 1024).await.unwrap() {}
    assert_eq!(String::from_utf8_lossy(&out), "off\t0\toff\n");
    session.close().await;
}
