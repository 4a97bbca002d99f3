//! The assembler on binlog events built byte by byte to MySQL 8's documented layouts
//! (libbinlogevents: `Gtid_event`, `Table_map_event`, `Rows_event` v2, `Xid_event`), which no
//! server on the test bed writes (MariaDB writes v1 rows events and its own GTID events).

use super::*;
use crate::changelog::GtidSet;
use crate::sources::mysql::schema::build_entry;
use crate::sources::mysql::types::ColumnInfo;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use mysql_common::binlog::consts::BinlogVersion;
use mysql_common::binlog::EventStreamReader;

const UUID: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
const TABLE_ID: u64 = 42;

fn event(type_code: u8, log_pos: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend(1_700_000_000u32.to_le_bytes());
    v.push(type_code);
    v.extend(1u32.to_le_bytes());
    v.extend(((19 + data.len()) as u32).to_le_bytes());
    v.extend(log_pos.to_le_bytes());
    v.extend(0u16.to_le_bytes());
    v.extend(data);
    v
}

fn table_id() -> Vec<u8> {
    TABLE_ID.to_le_bytes()[..6].to_vec()
}

/// GTID_LOG_EVENT (33): flags, SID, GNO, logical clock (type 2, last_committed, sequence_number).
fn gtid(gno: u64) -> Vec<u8> {
    let mut d = vec![1u8];
    d.extend(uuid::Uuid::parse_str(UUID).unwrap().as_bytes());
    d.extend(gno.to_le_bytes());
    d.push(2);
    d.extend(0u64.to_le_bytes());
    d.extend(1u64.to_le_bytes());
    event(33, 100, &d)
}

/// TABLE_MAP (19) of `shop.t (id BIGINT, v VARCHAR(20) utf8mb4, j JSON)`.
fn table_map() -> Vec<u8> {
    let mut d = table_id();
    d.extend(1u16.to_le_bytes());
    for name in ["shop", "t"] {
        d.push(name.len() as u8);
        d.extend(name.as_bytes());
        d.push(0);
    }
    d.push(3); // column count
    d.extend([8, 15, 245]); // LONGLONG, VARCHAR, JSON
    d.push(3); // metadata length
    d.extend([80, 0, 4]); // VARCHAR max 80 bytes; JSON length in 4 bytes
    d.push(0b110); // nullable: v, j
    event(19, 200, &d)
}

fn rows_head(flags: u16, bitmaps: &[u8]) -> Vec<u8> {
    let mut d = table_id();
    d.extend(flags.to_le_bytes());
    d.extend(2u16.to_le_bytes()); // extra data length (v2): none
    d.push(3);
    d.extend(bitmaps);
    d
}

fn row(id: i64, v: Option<&str>, json_true: bool) -> Vec<u8> {
    let mut r = vec![if v.is_none() { 0b010 } else { 0 }];
    r.extend(id.to_le_bytes());
    if let Some(v) = v {
        r.push(v.len() as u8);
        r.extend(v.as_bytes());
    }
    // JSONB literal: type 0x04, value 0x01 = true, 0x02 = false.
    r.extend(2u32.to_le_bytes());
    r.extend([4, if json_true { 1 } else { 2 }]);
    r
}

/// QUERY_EVENT (2) of `sql` in database `shop`, ending at `log_pos`.
fn query(sql: &str, log_pos: u32) -> Vec<u8> {
    // Post-header: thread id, exec time, db len, error code, status vars len.
    let mut d = Vec::new();
    d.extend(1u32.to_le_bytes());
    d.extend(0u32.to_le_bytes());
    d.push(4);
    d.extend(0u16.to_le_bytes());
    d.extend(0u16.to_le_bytes());
    d.extend(b"shop\0");
    d.extend(sql.as_bytes());
    event(2, log_pos, &d)
}

fn xid(log_pos: u32) -> Vec<u8> {
    event(16, log_pos, &7u64.to_le_bytes())
}

fn assembler() -> Assembler {
    let mut a = Assembler::new(
        vec!["shop.*".into()],
        ZeroDate::Null,
        Position::MySqlGtid(GtidSet::default()),
    );
    let col = |name: &str, dt: &str, ct: &str| ColumnInfo {
        name: name.into(),
        data_type: dt.into(),
        column_type: ct.into(),
        charset: Some("utf8mb4".into()),
        // A primary key column is NOT NULL, as information_schema shows it.
        nullable: name != "id",
        ..Default::default()
    };
    let entry = build_entry(
        TableId::new("shop", "t"),
        &[
            col("id", "bigint", "bigint(20)"),
            col("v", "varchar", "varchar(20)"),
            col("j", "json", "json"),
        ],
        &["id".to_owned()],
    )
    .unwrap();
    a.set_table(entry);
    a
}

fn feed(a: &mut Assembler, esr: &mut EventStreamReader, bytes: &[u8]) -> Result<Step, StreamError> {
    let ev = esr.read(bytes).unwrap().unwrap();
    let tme = match ev.read_data().unwrap() {
        Some(EventData::RowsEvent(r)) => esr.get_tme(r.table_id()).cloned(),
        _ => None,
    };
    a.on_event(&ev, tme.as_ref())
}

#[test]
fn mysql8_gtid_v2_rows_and_xid_make_a_transaction() {
    let mut a = assembler();
    let mut esr = EventStreamReader::new(BinlogVersion::Version4);
    let mut insert = rows_head(1, &[0b111]);
    insert.extend(row(1, Some("héllo"), true));
    insert.extend(row(2, None, false));
    let mut update = rows_head(1, &[0b111, 0b011]);
    // MINIMAL-style after image: id and v only; j is absent.
    update.extend(row(2, None, false));
    update.extend([0u8]);
    update.extend(3i64.to_le_bytes());
    update.push(1);
    update.extend(b"x");
    for bytes in [
        gtid(5),
        table_map(),
        event(30, 300, &insert),
        event(31, 400, &update),
    ] {
        assert!(matches!(
            feed(&mut a, &mut esr, &bytes).unwrap(),
            Step::Nothing
        ));
    }
    let Step::Transaction(t) = feed(&mut a, &mut esr, &xid(500)).unwrap() else {
        panic!("XID ends the transaction");
    };
    assert_eq!(t.position.to_string(), format!("{UUID}:5"));
    assert_eq!(t.commit_time_micros, 1_700_000_000_000_000);
    let c = &t.changes[0];
    let source = c
        .source_tx
        .as_deref()
        .map(|s| (s.commit_micros, s.id.to_string()));
    assert_eq!(
        source,
        Some((1_700_000_000_000_000, format!("{UUID}:5"))),
        "the run names its transaction by GTID"
    );
    assert_eq!(c.ops, vec![Op::Insert, Op::Insert, Op::Update]);
    assert_eq!(c.rows.column(1).as_string::<i32>().value(0), "héllo");
    assert!(c.rows.column(1).is_null(1));
    assert_eq!(c.rows.column(2).as_string::<i32>().value(0), "true");
    assert!(
        !c.is_present(2, 2),
        "column outside the after image is absent"
    );
    assert_eq!(c.key_changed, vec![false, false, true]);
    assert_eq!(c.old_keys.column(0).as_primitive::<Int64Type>().value(2), 2);
    assert_eq!(c.rows.column(0).as_primitive::<Int64Type>().value(2), 3);
}

/// Without GTIDs a transaction is named by where its first event (BEGIN) starts, and its
/// position is where its last one ends.
#[test]
fn without_gtids_a_transaction_is_named_by_its_binlog_offset() {
    let mut a = assembler();
    a.position = Position::MySqlFile(BinlogFile {
        file: "binlog.000003".into(),
        pos: 4,
    });
    a.file = "binlog.000003".into();
    let mut esr = EventStreamReader::new(BinlogVersion::Version4);
    let begin = query("BEGIN", 1000);
    let begin_starts = 1000 - begin.len() as u64;
    let mut insert = rows_head(1, &[0b111]);
    insert.extend(row(1, Some("a"), true));
    for bytes in [begin, table_map(), event(30, 1200, &insert)] {
        assert!(matches!(
            feed(&mut a, &mut esr, &bytes).unwrap(),
            Step::Nothing
        ));
    }
    let Step::Transaction(t) = feed(&mut a, &mut esr, &xid(1300)).unwrap() else {
        panic!("XID ends the transaction");
    };
    assert_eq!(t.position.to_string(), "binlog.000003:1300");
    let Some(source) = t.changes[0].source_tx.as_deref() else {
        panic!("the run names its transaction");
    };
    assert_eq!(source.position, t.position);
    assert_eq!(
        source.id.to_string(),
        format!("binlog.000003:{begin_starts}")
    );
}

#[test]
fn partial_json_updates_stop_with_the_setting_named() {
    let mut a = assembler();
    let mut esr = EventStreamReader::new(BinlogVersion::Version4);
    let mut partial = rows_head(1, &[0b111, 0b111]);
    partial.extend(row(1, Some("a"), true));
    partial.push(0); // binlog_row_value_options: none in this image
    partial.extend(row(1, Some("b"), true));
    feed(&mut a, &mut esr, &gtid(6)).unwrap();
    feed(&mut a, &mut esr, &table_map()).unwrap();
    let e = feed(&mut a, &mut esr, &event(39, 300, &partial)).unwrap_err();
    assert!(e.to_string().contains("binlog_row_value_options"), "{e}");
}

#[test]
fn ddl_on_a_captured_table_stops_and_standalone_ddl_advances() {
    let mut a = assembler();
    let mut esr = EventStreamReader::new(BinlogVersion::Version4);
    let query = |sql: &str| query(sql, 600);
    feed(&mut a, &mut esr, &gtid(7)).unwrap();
    let step = feed(&mut a, &mut esr, &query("CREATE TABLE other.x (a int)")).unwrap();
    assert!(
        matches!(step, Step::Idle(_)),
        "a DDL group ends at its statement: {step:?}"
    );
    assert_eq!(a.position().to_string(), format!("{UUID}:7"));
    // A rename applies: the column keeps its place and remembers its name.
    feed(&mut a, &mut esr, &gtid(8)).unwrap();
    feed(
        &mut a,
        &mut esr,
        &query("ALTER TABLE t RENAME COLUMN j TO k"),
    )
    .unwrap();
    let Some(renamed) = a.table(&TableId::new("shop", "t")) else {
        panic!("the table stays known");
    };
    assert_eq!(renamed.schema.columns[2].name, "k");
    assert_eq!(renamed.schema.columns[2].former_names, ["j"]);
    // A change the lake cannot follow stops, naming the statement.
    feed(&mut a, &mut esr, &gtid(9)).unwrap();
    let e = feed(&mut a, &mut esr, &query("ALTER TABLE t MODIFY v int")).unwrap_err();
    assert!(e.to_string().contains("ALTER TABLE t MODIFY v int"), "{e}");
    // A column under a dropped column's name, in a later statement: stops too.
    feed(&mut a, &mut esr, &gtid(10)).unwrap();
    feed(&mut a, &mut esr, &query("ALTER TABLE t DROP COLUMN v")).unwrap();
    feed(&mut a, &mut esr, &gtid(11)).unwrap();
    let e = feed(&mut a, &mut esr, &query("ALTER TABLE t ADD COLUMN v text")).unwrap_err();
    assert!(e.to_string().contains("dropped earlier"), "{e}");
}

/// The test table without a key (issue 23): a multiset.
fn keyless_assembler() -> Assembler {
    let mut a = assembler();
    let Some(mut entry) = a.table(&TableId::new("shop", "t")).cloned() else {
        panic!("the test table is set");
    };
    let mut schema = (*entry.schema).clone();
    schema.primary_key.clear();
    entry.schema = std::sync::Arc::new(schema);
    a.set_table(entry);
    a
}

/// A keyless table's update with whole images becomes delete(before) + insert(after), and its
/// delete a delete of the whole before image; a MySQL 8 MINIMAL after image (the unchanged
/// column left out) stops naming the table and the setting, keeping nothing of the event.
/// (MariaDB 10.11 logs both images whole for a table without a primary key even under MINIMAL
/// and NOBLOB, checked with mariadb-binlog; MySQL 8 leaves unchanged columns out of the after
/// image.)
#[test]
fn keyless_updates_and_deletes_are_whole_row_changes() {
    let mut a = keyless_assembler();
    let mut esr = EventStreamReader::new(BinlogVersion::Version4);
    let mut update = rows_head(1, &[0b111, 0b111]);
    update.extend(row(1, Some("a"), true));
    update.extend(row(1, Some("b"), true));
    let mut delete = rows_head(1, &[0b111]);
    delete.extend(row(1, Some("b"), true));
    feed(&mut a, &mut esr, &gtid(7)).unwrap();
    feed(&mut a, &mut esr, &table_map()).unwrap();
    feed(&mut a, &mut esr, &event(31, 300, &update)).unwrap();
    feed(&mut a, &mut esr, &event(32, 400, &delete)).unwrap();
    let Step::Transaction(t) = feed(&mut a, &mut esr, &xid(500)).unwrap() else {
        panic!("XID ends the transaction");
    };
    let c = &t.changes[0];
    assert_eq!(c.ops, vec![Op::Delete, Op::Insert, Op::Delete]);
    let v = c.rows.column(1).as_string::<i32>();
    assert_eq!((v.value(0), v.value(1), v.value(2)), ("a", "b", "b"));
    assert!((0..3).all(|col| (0..3).all(|r| c.is_present(col, r))));

    let mut a = keyless_assembler();
    let mut esr = EventStreamReader::new(BinlogVersion::Version4);
    let mut minimal = rows_head(1, &[0b111, 0b010]);
    minimal.extend(row(1, Some("a"), true));
    minimal.push(0);
    minimal.push(1);
    minimal.extend(b"m");
    feed(&mut a, &mut esr, &gtid(8)).unwrap();
    feed(&mut a, &mut esr, &table_map()).unwrap();
    let e = feed(&mut a, &mut esr, &event(31, 300, &minimal)).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("shop.t") && text.contains("binlog_row_image = 'FULL'"),
        "{text}"
    );
}
