//! Schemas, changes and checkpoints for unit tests, built one way for every test module: the
//! sinks, the planner and the pipeline all feed on the same changelog shapes, so a test states only
//! what differs (a column's type, a key, the ops) and the builder plumbing lives here.

use std::sync::Arc;

use arrow_array::builder::{Int64Builder, StringBuilder};
use arrow_schema::DataType;

use crate::changelog::{Column, Lsn, Op, Position, TableChanges, TableChangesBuilder};
use crate::changelog::{TableId, TableSchema};
use crate::checkpoint::progress::Progress;
use crate::checkpoint::Checkpoint;

/// A nullable column with no source type, the shape most tests need.
pub fn col(name: &str, data_type: DataType) -> Column {
    column(name, data_type, true, "")
}

/// A column with its nullability and the source's type name.
pub fn column(name: &str, data_type: DataType, nullable: bool, source_type: &str) -> Column {
    Column {
        name: name.into(),
        data_type,
        nullable,
        source_type: source_type.into(),
        initial_default: None,
        former_names: Vec::new(),
    }
}

/// The table `namespace.name` with `columns`, keyed on the columns at `key`.
pub fn table(namespace: &str, name: &str, columns: Vec<Column>, key: Vec<usize>) -> TableSchema {
    TableSchema {
        id: TableId::new(namespace, name),
        columns,
        primary_key: key,
    }
}

/// `public.<name> (id int8 not null key, <text> text)`: a key and one text column, with source
/// types as Postgres names them.
pub fn id_text_schema(name: &str, text: &str) -> Arc<TableSchema> {
    Arc::new(table(
        "public",
        name,
        vec![
            column("id", DataType::Int64, false, "int8"),
            column(text, DataType::Utf8, true, "text"),
        ],
        vec![0],
    ))
}

/// `schema` with the same columns and no primary key.
pub fn without_key(schema: &TableSchema) -> Arc<TableSchema> {
    Arc::new(TableSchema {
        primary_key: Vec::new(),
        ..schema.clone()
    })
}

/// `public.t (id int64 key, a utf8, b int64)`, all nullable: the sinks' and the planner's table.
pub fn schema() -> Arc<TableSchema> {
    Arc::new(table(
        "public",
        "t",
        vec![
            col("id", DataType::Int64),
            col("a", DataType::Utf8),
            col("b", DataType::Int64),
        ],
        vec![0],
    ))
}

/// One change of [`schema`]: op, key, old key (key change), `a` and `b` (None = absent).
pub type C = (Op, i64, Option<i64>, Option<&'static str>, Option<i64>);

/// An insert of `id` with `a`, and `b = id * 10`.
pub fn ins(id: i64, a: &'static str) -> C {
    (Op::Insert, id, None, Some(a), Some(id * 10))
}

/// An update of `id`: `a` (None = absent) and `b`.
pub fn upd(id: i64, a: Option<&'static str>, b: i64) -> C {
    (Op::Update, id, None, a, Some(b))
}

/// A delete of `id` (key only).
pub fn del(id: i64) -> C {
    (Op::Delete, id, None, None, None)
}

/// The builder of column `col` in `b`'s current change, as a `B` (panics on another type).
pub fn cell<B: 'static>(b: &mut TableChangesBuilder, col: usize) -> &mut B {
    b.value(col)
        .unwrap()
        .as_any_mut()
        .downcast_mut::<B>()
        .unwrap()
}

/// The builder of old-key column `col` in `b`'s current change, as a `B`.
pub fn old_key_cell<B: 'static>(b: &mut TableChangesBuilder, col: usize) -> &mut B {
    b.old_key(col)
        .unwrap()
        .as_any_mut()
        .downcast_mut::<B>()
        .unwrap()
}

/// The changes `cs` of [`schema`] as one batch; a truncate carries no values.
pub fn changes(cs: &[C]) -> TableChanges {
    let mut b = TableChangesBuilder::new(schema(), cs.len());
    let int = |b: &mut TableChangesBuilder, col: usize, v: Option<i64>| match v {
        Some(v) => crate::test_fixtures::cell::<Int64Builder>(b, col).append_value(v),
        None => b.absent(col).unwrap(),
    };
    for &(op, id, old, a, bv) in cs {
        b.begin(op);
        if op == Op::Truncate {
            (0..3).for_each(|c| b.absent(c).unwrap());
            b.no_old_key().unwrap();
            continue;
        }
        int(&mut b, 0, Some(id));
        match a {
            Some(a) => crate::test_fixtures::cell::<StringBuilder>(&mut b, 1).append_value(a),
            None => b.absent(1).unwrap(),
        }
        int(&mut b, 2, bv);
        match old {
            Some(o) => {
                crate::test_fixtures::old_key_cell::<Int64Builder>(&mut b, 0).append_value(o)
            }
            None => b.no_old_key().unwrap(),
        }
    }
    b.finish().unwrap()
}

/// Rows 1 `a`, 2 `b`, … `n` inserted (`n` ≤ 26): the first commit of many tests.
pub fn first_rows(n: usize) -> TableChanges {
    const LETTERS: [&str; 26] = [
        "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r",
        "s", "t", "u", "v", "w", "x", "y", "z",
    ];
    let rows: Vec<C> = (1..).zip(&LETTERS[..n]).map(|(id, a)| ins(id, a)).collect();
    changes(&rows)
}

/// Postgres LSN `lsn` as a position, the position most tests need.
/// The settings of `table` on an Iceberg sink under `section` (the body of its
/// `[sink.tables."<table>"]`).
pub fn table_settings(table: &TableId, section: &str) -> crate::config::TableSettings {
    let text = format!(
        "{}[sink.tables.\"{table}\"]\n{section}\n",
        crate::config::tests::MINIMAL
    );
    crate::config::tests::iceberg_sink(&text)
        .tables
        .resolve(table)
        .unwrap()
}

pub fn pg_position(lsn: u64) -> Position {
    Position::Postgres(Lsn(lsn))
}

/// A position written in its `cdcd.position` text.
pub fn position(text: &str) -> Position {
    text.parse().unwrap()
}

/// Progress acknowledged at `position`, with `tables` (of namespace `db`) at their positions; all
/// in `cdcd.position` text.
pub fn progress(position: &str, tables: &[(&str, &str)]) -> Progress {
    Progress {
        position: self::position(position),
        tables: tables
            .iter()
            .map(|(t, p)| (TableId::new("db", *t), self::position(p)))
            .collect(),
    }
}

/// The checkpoint of pipeline `shop` at Postgres LSN `lsn`.
pub fn cp(lsn: u64) -> Checkpoint {
    Checkpoint::new("shop", pg_position(lsn))
}

/// An Iceberg schema of one required `long`, `id` (field 1): the table of tests about metadata
/// rather than rows.
pub fn iceberg_id_schema() -> iceberg::spec::Schema {
    use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
    let id = NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long));
    Schema::builder()
        .with_fields(vec![Arc::new(id)])
        .build()
        .unwrap()
}

/// Runs `code` with the test bed venv's python (it holds the independent readers) and returns
/// its stdout; `None` when the venv is missing and `check` may skip ([`crate::test_ground`]: under
/// CI or `scripts/test.sh` it fails instead).
pub fn run_reader(check: &str, code: &str) -> Option<String> {
    let python = format!("{}/venv/bin/python", test_bed());
    if !std::path::Path::new(&python).exists() {
        crate::test_ground::missing(
            check,
            &format!("{python} is missing (scripts/testbed.sh up; CDCD_TB names another test bed)"),
        );
        return None;
    }
    let out = std::process::Command::new(&python)
        .arg("-c")
        .arg(code)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{check} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

/// The test bed's folder (`scripts/testbed.sh`): its venv holds the independent readers.
pub fn test_bed() -> String {
    std::env::var("CDCD_TB").unwrap_or_else(|_| "/tmp/cdcd-tb".into())
}
