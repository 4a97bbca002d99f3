//! Unit tests on the text Postgres 15 actually prints (captured with `select x::text` under the
//! pinned session settings).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use arrow_array::builder::make_builder;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    Time64MicrosecondType, TimestampMicrosecondType,
};
use arrow_array::{Array, ArrayRef};

fn no_lookup(_: u32) -> Option<TypeInfo> {
    None
}

fn ty(oid: u32, typmod: i32) -> ColumnType {
    ColumnType::resolve(oid, typmod, &no_lookup)
}

/// Parses `values` (None = NULL) into one array of `ty`.
fn parse(ty: &ColumnType, values: &[Option<&str>]) -> ArrayRef {
    let mut b = make_builder(&ty.data_type(), values.len());
    for v in values {
        match v {
            Some(v) => ty.append_text(b.as_mut(), v.as_bytes()).unwrap(),
            None => append_null(b.as_mut()).unwrap(),
        }
    }
    let a = b.finish();
    assert_eq!(a.data_type(), &ty.data_type());
    a
}

fn one(ty: &ColumnType, v: &str) -> ArrayRef {
    parse(ty, &[Some(v)])
}

fn err(ty: &ColumnType, v: &str) -> ValueError {
    let mut b = make_builder(&ty.data_type(), 1);
    let e = ty.append_text(b.as_mut(), v.as_bytes()).unwrap_err();
    e
}

#[test]
fn builtin_mapping() {
    let cases: &[(u32, i32, DataType, &str)] = &[
        (16, -1, DataType::Boolean, "bool"),
        (21, -1, DataType::Int16, "int2"),
        (23, -1, DataType::Int32, "int4"),
        (20, -1, DataType::Int64, "int8"),
        (26, -1, DataType::Int64, "oid"),
        (700, -1, DataType::Float32, "float4"),
        (701, -1, DataType::Float64, "float8"),
        (
            1700,
            (12 << 16 | 2) + 4,
            DataType::Decimal128(12, 2),
            "numeric(12,2)",
        ),
        (1700, -1, DataType::Utf8, "numeric"),
        (1700, (50 << 16 | 2) + 4, DataType::Utf8, "numeric(50,2)"),
        (25, -1, DataType::Utf8, "text"),
        (1043, 24, DataType::Utf8, "varchar(20)"),
        (1042, 9, DataType::Utf8, "bpchar(5)"),
        (19, -1, DataType::Utf8, "name"),
        (17, -1, DataType::Binary, "bytea"),
        (1082, -1, DataType::Date32, "date"),
        (1083, -1, DataType::Time64(TimeUnit::Microsecond), "time"),
        (1266, -1, DataType::Utf8, "timetz"),
        (
            1114,
            -1,
            DataType::Timestamp(TimeUnit::Microsecond, None),
            "timestamp",
        ),
        (
            1184,
            -1,
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            "timestamptz",
        ),
        (2950, -1, DataType::FixedSizeBinary(16), "uuid"),
        (114, -1, DataType::Utf8, "json"),
        (3802, -1, DataType::Utf8, "jsonb"),
        (1186, -1, DataType::Utf8, "interval"),
        (142, -1, DataType::Utf8, "oid 142"),
    ];
    for (oid, typmod, dt, name) in cases {
        let t = ty(*oid, *typmod);
        assert_eq!(&t.data_type(), dt, "{name}");
        assert_eq!(&t.source_name(), name);
    }
}

#[test]
fn numeric_typmods_with_odd_scales() {
    // numeric(5,-2): whole numbers up to 7 digits. numeric(2,5): below 0.001.
    let neg = ty(1700, ((5 << 16) | (-2i32 & 0x7ff)) + 4);
    assert_eq!(neg.data_type(), DataType::Decimal128(7, 0));
    let a = one(&neg, "12300");
    assert_eq!(a.as_primitive::<Decimal128Type>().value(0), 12300);
    let small = ty(1700, ((2 << 16) | 5) + 4);
    assert_eq!(small.data_type(), DataType::Decimal128(5, 5));
    let a = one(&small, "0.00012");
    assert_eq!(a.as_primitive::<Decimal128Type>().value(0), 12);
}

#[test]
fn arrays_resolve_and_name() {
    let t = ty(1007, -1);
    assert_eq!(t, ColumnType::List(Box::new(ColumnType::Int32)));
    assert_eq!(t.source_name(), "int4[]");
    let DataType::List(field) = t.data_type() else {
        panic!("not a list")
    };
    assert_eq!(field.name(), "element");
    assert!(field.is_nullable());
    let num = ty(1231, (4 << 16 | 2) + 4);
    assert_eq!(num.source_name(), "numeric(4,2)[]");
}

fn catalog(oid: u32) -> Option<TypeInfo> {
    let info = |name: &str, typtype: u8, element, base| TypeInfo {
        oid,
        namespace: if oid == 90003 {
            "shop".into()
        } else {
            "public".into()
        },
        name: name.into(),
        typtype,
        element,
        base,
    };
    match oid {
        90001 => Some(info("mood", b'e', None, None)),
        90002 => Some(info("_mood", b'b', Some(90001), None)),
        90003 => Some(info("posint", b'd', None, Some(23))),
        90004 => Some(info("citext", b'b', None, None)),
        90005 => Some(info("_citext", b'b', Some(90004), None)),
        90006 => Some(info("_posint", b'b', Some(90003), None)),
        90007 => Some(info("loop", b'd', None, Some(90007))),
        90008 => Some(info("point", b'b', Some(701), None)),
        90009 => Some(info("geometry", b'b', None, None)),
        _ => None,
    }
}

#[test]
fn postgis_geometry_is_named_with_its_typmod() {
    // PostGIS typmods (`SELECT atttypmod` of the columns): the SRID a geometry sink takes its CRS
    // from, in the name; the values stay the text output.
    let r = |typmod| ColumnType::resolve(90009, typmod, &catalog);
    assert_eq!(r(-1).source_name(), "geometry");
    assert_eq!(r(1_107_460).source_name(), "geometry(Point,4326)");
    assert_eq!(r(987_402).source_name(), "geometry(LineStringZ,3857)");
    assert_eq!(r(8).source_name(), "geometry(LineString)");
    assert_eq!(r(1_107_460).data_type(), DataType::Utf8);
}

#[test]
fn catalog_types() {
    let r = |oid| ColumnType::resolve(oid, -1, &catalog);
    assert_eq!(r(90001).source_name(), "mood (enum)");
    assert_eq!(r(90001).data_type(), DataType::Utf8);
    assert_eq!(r(90002).source_name(), "mood (enum)[]");
    assert_eq!(r(90003).source_name(), "shop.posint (domain over int4)");
    assert_eq!(r(90003).data_type(), DataType::Int32);
    let a = one(&r(90003), "42");
    assert_eq!(a.as_primitive::<Int32Type>().value(0), 42);
    assert_eq!(
        r(90004),
        ColumnType::TextFallback {
            type_name: "citext".into()
        }
    );
    // An array of an unmapped type stays text: its delimiter may not be a comma.
    assert_eq!(
        r(90005),
        ColumnType::TextFallback {
            type_name: "citext[]".into()
        }
    );
    assert_eq!(r(90006).data_type(), ty(1007, -1).data_type());
    assert!(matches!(r(90007), ColumnType::Domain { .. }), "cycle ends");
    assert_eq!(
        r(90008).data_type(),
        DataType::Utf8,
        "typelem without _ is no array"
    );
    let a = one(&r(90002), "{happy,NULL,sad}");
    let l = a.as_list::<i32>().value(0);
    assert_eq!(l.as_string::<i32>().value(2), "sad");
    assert!(l.is_null(1));
}

#[test]
fn bools_and_ints() {
    let a = parse(&ColumnType::Bool, &[Some("t"), Some("f"), None]);
    let a = a.as_boolean();
    assert!(a.value(0) && !a.value(1) && a.is_null(2));
    let a = parse(&ColumnType::Int16, &[Some("-32768"), Some("32767")]);
    assert_eq!(
        a.as_primitive::<Int16Type>().values(),
        &[i16::MIN, i16::MAX]
    );
    let a = parse(&ColumnType::Int32, &[Some("-2147483648"), Some("0")]);
    assert_eq!(a.as_primitive::<Int32Type>().values(), &[i32::MIN, 0]);
    let a = parse(
        &ColumnType::Int64,
        &[Some("-9223372036854775808"), Some("9223372036854775807")],
    );
    assert_eq!(
        a.as_primitive::<Int64Type>().values(),
        &[i64::MIN, i64::MAX]
    );
    let a = one(&ColumnType::Oid, "4294967295");
    assert_eq!(a.as_primitive::<Int64Type>().value(0), 4_294_967_295);
    assert!(matches!(
        err(&ColumnType::Int16, "32768"),
        ValueError::Invalid {
            reason: "is out of range",
            ..
        }
    ));
    err(&ColumnType::Int64, "9223372036854775808");
    err(&ColumnType::Int32, "");
    err(&ColumnType::Int32, "-");
    err(&ColumnType::Int32, "1.0");
    err(&ColumnType::Bool, "yes");
}

#[test]
fn floats() {
    let a = parse(
        &ColumnType::Float64,
        &[
            Some("0.1"),
            Some("-0"),
            Some("NaN"),
            Some("Infinity"),
            Some("-Infinity"),
            Some("1e+300"),
        ],
    );
    let v = a.as_primitive::<Float64Type>();
    assert_eq!(v.value(0), 0.1);
    assert!(v.value(1) == 0.0 && v.value(1).is_sign_negative());
    assert!(v.value(2).is_nan());
    assert_eq!(v.value(3), f64::INFINITY);
    assert_eq!(v.value(4), f64::NEG_INFINITY);
    assert_eq!(v.value(5), 1e300);
    let a = parse(
        &ColumnType::Float32,
        &[Some("1.5"), Some("1e-07"), Some("3.4028235e+38")],
    );
    assert_eq!(
        a.as_primitive::<Float32Type>().values(),
        &[1.5, 1e-7, f32::MAX]
    );
    err(&ColumnType::Float64, "one");
}

#[test]
fn decimals() {
    let t = ColumnType::Decimal {
        precision: 12,
        scale: 2,
    };
    let a = parse(
        &t,
        &[
            Some("12.30"),
            Some("-0.05"),
            Some("9999999999.99"),
            Some("7"),
            Some("1.5"),
        ],
    );
    assert_eq!(
        a.as_primitive::<Decimal128Type>().values(),
        &[1230, -5, 999_999_999_999, 700, 150]
    );
    let big = ColumnType::Decimal {
        precision: 38,
        scale: 0,
    };
    let a = one(&big, "-99999999999999999999999999999999999999");
    assert_eq!(
        a.as_primitive::<Decimal128Type>().value(0),
        -(10i128.pow(38) - 1)
    );
    let e = err(&t, "NaN");
    assert!(e.to_string().contains("\"NaN\""), "{e}");
    assert!(e.to_string().contains("numeric(12,2)"), "{e}");
    err(&t, "Infinity");
    err(&t, "-Infinity");
    err(&t, "10000000000.00"); // 13 digits > precision 12
    err(&t, "1.234"); // more fraction than scale
    err(&t, "1.2x");
    err(&t, ".");
    err(&big, "100000000000000000000000000000000000000");
    assert_eq!(
        one(&t, "1.230").as_primitive::<Decimal128Type>().value(0),
        123
    );
    let text = ty(1700, -1);
    let a = one(&text, "0.00000000000000000001");
    assert_eq!(a.as_string::<i32>().value(0), "0.00000000000000000001");
}

#[test]
fn text_and_binary() {
    let t = ty(1042, 10);
    let a = parse(&t, &[Some("ab    "), Some("tab\there"), Some("")]);
    assert_eq!(a.as_string::<i32>().value(0), "ab    ");
    assert_eq!(a.as_string::<i32>().value(1), "tab\there");
    let mut b = make_builder(&t.data_type(), 1);
    assert!(t.append_text(b.as_mut(), b"\xff").is_err());
    let a = parse(
        &ColumnType::Bytea,
        &[Some("\\x00ff10"), Some("\\x"), Some("a\\\\b\\001"), None],
    );
    let a = a.as_binary::<i32>();
    assert_eq!(a.value(0), &[0, 0xff, 0x10]);
    assert_eq!(a.value(1), b"");
    assert_eq!(a.value(2), b"a\\b\x01");
    assert!(a.is_null(3));
    let long = format!("\\x{}", "ab".repeat(1000));
    assert_eq!(
        one(&ColumnType::Bytea, &long).as_binary::<i32>().value(0),
        vec![0xab; 1000]
    );
    // A bad value appends nothing, so the next value is intact.
    let mut b = make_builder(&DataType::Binary, 2);
    assert!(ColumnType::Bytea.append_text(b.as_mut(), b"\\x0g").is_err());
    assert!(ColumnType::Bytea
        .append_text(b.as_mut(), b"\\x012")
        .is_err());
    assert!(ColumnType::Bytea
        .append_text(b.as_mut(), b"bad\\9")
        .is_err());
    ColumnType::Bytea.append_text(b.as_mut(), b"\\x01").unwrap();
    let a = b.finish();
    assert_eq!(a.len(), 1);
    assert_eq!(a.as_binary::<i32>().value(0), &[1]);
    for (t, v) in [
        (ColumnType::Json, r#"{"a": 1}"#),
        (ColumnType::Interval, "P1Y2M3DT4H5M6.5S"),
        (ColumnType::TimeTz, "03:04:05+05:30"),
    ] {
        assert_eq!(one(&t, v).as_string::<i32>().value(0), v);
    }
}

#[test]
fn uuids() {
    let a = one(&ColumnType::Uuid, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
    assert_eq!(
        a.as_fixed_size_binary().value(0),
        &[
            0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38,
            0x0a, 0x11
        ]
    );
    err(&ColumnType::Uuid, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1");
    err(&ColumnType::Uuid, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a111");
    err(&ColumnType::Uuid, "z0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
}

#[test]
fn dates() {
    let a = parse(
        &ColumnType::Date,
        &[
            Some("1970-01-01"),
            Some("2024-01-02"),
            Some("0001-01-01"),
            Some("0001-01-01 BC"),
            Some("4713-01-01 BC"),
            Some("294276-12-31"),
            Some("infinity"),
            Some("-infinity"),
            Some("2000-02-29"),
        ],
    );
    let v = a.as_primitive::<Date32Type>();
    assert_eq!(v.value(0), 0);
    assert_eq!(v.value(1), 19724);
    assert_eq!(v.value(2), -719_162);
    // Postgres: '0001-01-01 BC'::date - '0001-01-01'::date = -366 (1 BC is a leap year).
    assert_eq!(v.value(3), -719_162 - 366);
    assert_eq!(v.value(4), -2_440_550);
    assert_eq!(v.value(5), 106_762_939);
    assert_eq!(v.value(6), i32::MAX);
    assert_eq!(v.value(7), -i32::MAX);
    assert_eq!(v.value(8), 11016);
    for bad in [
        "2023-02-29",
        "2024-13-01",
        "2024-01-32",
        "2024-1-01",
        "2024-01-01x",
        "today",
    ] {
        let e = err(&ColumnType::Date, bad);
        assert!(e.to_string().contains(bad), "{e}");
    }
}

#[test]
fn times_and_timestamps() {
    let a = parse(
        &ColumnType::Time,
        &[
            Some("00:00:00"),
            Some("03:04:05.1"),
            Some("23:59:59.999999"),
            Some("24:00:00"),
        ],
    );
    assert_eq!(
        a.as_primitive::<Time64MicrosecondType>().values(),
        &[0, 11_045_100_000, 86_399_999_999, 86_400_000_000]
    );
    err(&ColumnType::Time, "24:00:01");
    err(&ColumnType::Time, "03:04:05.1234567");
    err(&ColumnType::Time, "03:04:05.");
    err(&ColumnType::Time, "3:04:05");

    let base = 1_704_164_645_000_000i64; // 2024-01-02 03:04:05 UTC
    let fractions = ["", ".1", ".12", ".123", ".1234", ".12345", ".123456"];
    let expected = [0, 100_000, 120_000, 123_000, 123_400, 123_450, 123_456];
    for (f, e) in fractions.iter().zip(expected) {
        let a = one(&ColumnType::Timestamp, &format!("2024-01-02 03:04:05{f}"));
        assert_eq!(
            a.as_primitive::<TimestampMicrosecondType>().value(0),
            base + e,
            "{f}"
        );
        let a = one(
            &ColumnType::TimestampTz,
            &format!("2024-01-02 03:04:05{f}+00"),
        );
        assert_eq!(
            a.as_primitive::<TimestampMicrosecondType>().value(0),
            base + e,
            "{f}"
        );
    }
    let tz = |v: &str| {
        one(&ColumnType::TimestampTz, v)
            .as_primitive::<TimestampMicrosecondType>()
            .value(0)
    };
    assert_eq!(tz("2024-01-02 08:34:05.123456+05:30"), base + 123_456);
    assert_eq!(tz("2024-01-01 23:34:05-03:30"), base);
    assert_eq!(tz("2024-01-02 08:49:05+05:45"), base);
    // Postgres prints local mean time offsets with seconds (Europe/Amsterdam in 1900).
    assert_eq!(tz("1900-01-01 00:19:32+00:19:32"), -2_208_988_800_000_000);
    assert_eq!(tz("infinity"), i64::MAX);
    assert_eq!(tz("-infinity"), -i64::MAX);
    let ts = |v: &str| {
        one(&ColumnType::Timestamp, v)
            .as_primitive::<TimestampMicrosecondType>()
            .value(0)
    };
    assert_eq!(
        ts("0001-01-01 00:00:00 BC"),
        (-719_162 - 366) * 86_400_000_000
    );
    assert_eq!(
        tz("0001-01-01 00:00:00+00 BC"),
        (-719_162 - 366) * 86_400_000_000
    );
    assert_eq!(ts("4713-01-01 00:00:00 BC"), -2_440_550 * 86_400_000_000);
    // Postgres's last timestamp is past i64 microseconds since 1970 (Postgres counts from 2000).
    assert_eq!(ts("294247-01-10 04:00:54.775807"), i64::MAX);
    let e = err(&ColumnType::Timestamp, "294276-12-31 23:59:59.999999");
    assert!(e.to_string().contains("out of the timestamp range"), "{e}");
    err(&ColumnType::Timestamp, "2024-01-02 03:04:05+00");
    err(&ColumnType::TimestampTz, "2024-01-02 03:04:05");
    err(&ColumnType::TimestampTz, "2024-01-02 03:04:05+5");
    err(&ColumnType::TimestampTz, "2024-01-02T03:04:05+00");
}

fn list(ty: &ColumnType, v: &str) -> ArrayRef {
    let a = one(ty, v);
    a.as_list::<i32>().value(0)
}

#[test]
fn arrays() {
    let ints = ty(1007, -1);
    let l = list(&ints, "{1,2,NULL}");
    assert_eq!(l.len(), 3);
    assert_eq!(l.as_primitive::<Int32Type>().value(1), 2);
    assert!(l.is_null(2));
    assert_eq!(list(&ints, "{}").len(), 0);
    assert_eq!(
        list(&ints, "[2:3]={7,8}")
            .as_primitive::<Int32Type>()
            .values(),
        &[7, 8]
    );

    // Captured: array['a b','NULL','x"y','a\b',',','',null,' sp ']::text[]::text
    let texts = ty(1009, -1);
    let l = list(&texts, r#"{"a b","NULL","x\"y","a\\b",",","",NULL," sp "}"#);
    let s = l.as_string::<i32>();
    assert_eq!(s.value(0), "a b");
    assert_eq!(s.value(1), "NULL");
    assert!(!s.is_null(1), "a quoted NULL is the string");
    assert_eq!(s.value(2), "x\"y");
    assert_eq!(s.value(3), "a\\b");
    assert_eq!(s.value(4), ",");
    assert_eq!(s.value(5), "");
    assert!(s.is_null(6));
    assert_eq!(s.value(7), " sp ");
    let l = list(&texts, "{null,abc}");
    assert!(l.is_null(0));

    let uuids = ty(2951, -1);
    let l = list(&uuids, "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}");
    assert_eq!(l.as_fixed_size_binary().value(0)[0], 0xa0);
    assert!(l.is_null(1));
    let nums = ty(1231, (4 << 16 | 2) + 4);
    let l = list(&nums, "{1.50,-2.00,NULL}");
    assert_eq!(l.as_primitive::<Decimal128Type>().value(1), -200);
    let l = list(&ty(1185, -1), r#"{"2024-01-02 03:04:05+00",NULL}"#);
    assert_eq!(
        l.as_primitive::<TimestampMicrosecondType>().value(0),
        1_704_164_645_000_000
    );
    let l = list(&ty(1001, -1), r#"{"\\x01ff","\\x"}"#);
    assert_eq!(l.as_binary::<i32>().value(0), &[1, 0xff]);
    let l = list(&ty(1000, -1), "{t,f}");
    assert!(l.as_boolean().value(0));
    let l = list(&ty(1182, -1), "{1970-01-02,infinity}");
    assert_eq!(l.as_primitive::<Date32Type>().values(), &[1, i32::MAX]);
    let l = list(&ty(3807, -1), r#"{"{\"a\": 1}"}"#);
    assert_eq!(l.as_string::<i32>().value(0), r#"{"a": 1}"#);
    let l = list(&ty(1022, -1), "{NaN,-Infinity,1.5}");
    assert!(l.as_primitive::<Float64Type>().value(0).is_nan());

    // Several lists in one builder, with a NULL array between.
    let a = parse(&ints, &[Some("{1}"), None, Some("{}"), Some("{2,3}")]);
    let a = a.as_list::<i32>();
    assert_eq!(a.len(), 4);
    assert!(a.is_null(1));
    assert_eq!(a.value(3).len(), 2);

    let e = err(&ints, "{{1,2},{3,4}}");
    assert!(e.to_string().contains("multi-dimensional"), "{e}");
    assert!(e.to_string().contains("{{1,2},{3,4}}"), "{e}");
    let e = err(&ints, "[1:2][1:1]={{1},{2}}");
    assert!(e.to_string().contains("multi-dimensional"), "{e}");
    for bad in [
        "1,2", "{1,2", "{1,}", "{,1}", "{1 2}", r#"{"1}"#, "{1,x}", "{1}}",
    ] {
        err(&ints, bad);
    }
}

#[test]
fn errors_name_type_and_truncate_text() {
    let long = "x".repeat(200);
    let e = err(&ColumnType::Int32, &long);
    let ValueError::Invalid {
        type_name, text, ..
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!(type_name, "int4");
    assert_eq!(text.chars().count(), 65);
    let mut b = make_builder(&DataType::Utf8, 1);
    let e = ColumnType::Int32.append_text(b.as_mut(), b"1").unwrap_err();
    assert!(matches!(e, ValueError::Builder { .. }));
}
