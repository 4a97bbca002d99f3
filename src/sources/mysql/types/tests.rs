use super::*;
use arrow_array::builder::make_builder;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Int16Type, Int32Type, TimestampMicrosecondType,
};

fn info(data_type: &str, column_type: &str) -> ColumnInfo {
    ColumnInfo {
        name: "c".into(),
        data_type: data_type.into(),
        column_type: column_type.into(),
        numeric_precision: Some(10),
        numeric_scale: Some(2),
        charset: Some("utf8mb4".into()),
        nullable: true,
        json_check: false,
        default: None,
        former_names: Vec::new(),
        srid: None,
    }
}

fn convert(dt: &str, ct: &str, values: &[Value], origin: Origin) -> arrow_array::ArrayRef {
    let (kind, data_type) = map_column(&info(dt, ct)).unwrap();
    let mut b = make_builder(&data_type, 4);
    for v in values {
        append(b.as_mut(), &kind, v, origin, ZeroDate::Null).unwrap();
    }
    b.finish()
}

#[test]
fn integers_keep_their_unsigned_range() {
    let a = convert(
        "tinyint",
        "tinyint(3) unsigned",
        &[Value::Int(-56)],
        Origin::Binlog,
    );
    assert_eq!(a.as_primitive::<Int16Type>().value(0), 200);
    let a = convert("int", "int(10) unsigned", &[Value::Int(-1)], Origin::Binlog);
    assert_eq!(
        a.as_primitive::<arrow_array::types::Int64Type>().value(0),
        4_294_967_295
    );
    let a = convert(
        "mediumint",
        "mediumint(9)",
        &[Value::Int(-5)],
        Origin::Binlog,
    );
    assert_eq!(a.as_primitive::<Int32Type>().value(0), -5);
    let a = convert(
        "mediumint",
        "mediumint(9)",
        &[Value::Int(8_388_608)],
        Origin::Binlog,
    );
    assert_eq!(a.as_primitive::<Int32Type>().value(0), -8_388_608);
    let a = convert(
        "bigint",
        "bigint(20) unsigned",
        &[Value::Int(-1)],
        Origin::Binlog,
    );
    assert_eq!(
        a.as_primitive::<Decimal128Type>().value(0),
        i128::from(u64::MAX)
    );
}

#[test]
fn decimals_dates_and_timestamps() {
    let a = convert(
        "decimal",
        "decimal(10,2)",
        &[Value::Bytes(b"-12.5".to_vec())],
        Origin::Binlog,
    );
    assert_eq!(a.as_primitive::<Decimal128Type>().value(0), -1250);
    let a = convert(
        "date",
        "date",
        &[
            Value::Date(2024, 2, 29, 0, 0, 0, 0),
            Value::Date(0, 0, 0, 0, 0, 0, 0),
        ],
        Origin::Binlog,
    );
    assert_eq!(a.as_primitive::<Date32Type>().value(0), 19782);
    assert!(a.is_null(1), "zero date is NULL by default");
    let a = convert(
        "timestamp",
        "timestamp(6)",
        &[Value::Bytes(b"1700000000.000123".to_vec()), Value::Int(0)],
        Origin::Binlog,
    );
    assert_eq!(
        a.as_primitive::<TimestampMicrosecondType>().value(0),
        1_700_000_000_000_123
    );
    assert!(a.is_null(1));
    let a = convert(
        "year",
        "year(4)",
        &[Value::Bytes(b"1900".to_vec())],
        Origin::Binlog,
    );
    assert_eq!(a.as_primitive::<Int16Type>().value(0), 0);
}

#[test]
fn enum_and_set_become_names() {
    let a = convert(
        "enum",
        "enum('a','b''c')",
        &[Value::Int(2), Value::Int(0)],
        Origin::Binlog,
    );
    assert_eq!(a.as_string::<i32>().value(0), "b'c");
    assert_eq!(a.as_string::<i32>().value(1), "");
    let a = convert(
        "set",
        "set('x','y','z')",
        &[Value::Bytes(vec![0b101])],
        Origin::Binlog,
    );
    assert_eq!(a.as_string::<i32>().value(0), "x,z");
    let a = convert(
        "set",
        "set('x','y')",
        &[Value::Bytes(b"x,y".to_vec())],
        Origin::Query,
    );
    assert_eq!(a.as_string::<i32>().value(0), "x,y");
}

#[test]
fn zero_date_error_names_the_policy() {
    let (kind, dt) = map_column(&info("date", "date")).unwrap();
    let mut b = make_builder(&dt, 1);
    let e = append(
        b.as_mut(),
        &kind,
        &Value::Date(0, 0, 0, 0, 0, 0, 0),
        Origin::Binlog,
        ZeroDate::Error,
    )
    .unwrap_err();
    assert!(e.0.contains("zero_date"), "{e}");
}

#[test]
fn latin1_is_transcoded_and_other_charsets_refused() {
    let mut i = info("varchar", "varchar(10)");
    i.charset = Some("latin1".into());
    let (kind, dt) = map_column(&i).unwrap();
    let mut b = make_builder(&dt, 1);
    append(
        b.as_mut(),
        &kind,
        &Value::Bytes(vec![0xe9]),
        Origin::Binlog,
        ZeroDate::Null,
    )
    .unwrap();
    assert_eq!(b.finish().as_string::<i32>().value(0), "é");
    i.charset = Some("sjis".into());
    assert!(map_column(&i).is_err());
}

#[test]
fn a_geometry_keeps_its_srid_as_ewkb_only_against_a_declared_other() {
    // POINT(1 2), little-endian WKB, stored after MySQL's u32 SRID.
    let mut wkb = vec![1u8, 1, 0, 0, 0];
    wkb.extend_from_slice(&1f64.to_le_bytes());
    wkb.extend_from_slice(&2f64.to_le_bytes());
    let stored = |srid: u32| [srid.to_le_bytes().as_slice(), &wkb].concat();
    assert_eq!(
        geometry_wkb(&stored(3857), 0).as_ref(),
        wkb,
        "none declared"
    );
    assert_eq!(
        geometry_wkb(&stored(4326), 4326).as_ref(),
        wkb,
        "the declared"
    );
    assert_eq!(geometry_wkb(&stored(0), 4326).as_ref(), wkb, "none given");
    let other = stored(3857);
    let ewkb = geometry_wkb(&other, 4326);
    assert_eq!(
        &ewkb[..9],
        &[1, 1, 0, 0, 0x20, 0x11, 0x0f, 0, 0],
        "flag, then 3857"
    );
    assert_eq!(&ewkb[9..], &wkb[5..]);
    assert!(geometry_wkb(&[1, 2], 4326).is_empty(), "truncated: no WKB");

    let mut i = info("point", "point");
    i.srid = Some(4326);
    let entry = crate::sources::mysql::schema::build_entry(
        crate::changelog::TableId::new("d", "t"),
        &[i],
        &[],
    )
    .unwrap();
    assert_eq!(entry.schema.columns[0].source_type, "point srid 4326");
}
