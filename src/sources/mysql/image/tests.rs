//! The planned path against `mysql_common` on the same bytes: each value is decoded both ways
//! (`BinlogValue` + `types::append` with `Origin::Binlog`, the general path, versus
//! [`append_cell`]) and the Arrow arrays must be equal.

use super::*;
use crate::sources::mysql::types::{append, map_column, ColumnInfo, Origin};
use arrow_array::builder::make_builder;
use arrow_array::Array;
use mysql_common::binlog::value::BinlogValue;
use mysql_common::io::ParseBuf;
use mysql_common::proto::MyDeserialize;

fn info(
    data_type: &str,
    column_type: &str,
    precision: Option<u64>,
    scale: Option<u64>,
) -> ColumnInfo {
    ColumnInfo {
        name: "c".into(),
        data_type: data_type.into(),
        column_type: column_type.into(),
        numeric_precision: precision,
        numeric_scale: scale,
        charset: Some("utf8mb4".into()),
        nullable: true,
        ..Default::default()
    }
}

/// Decodes `bytes` both ways and compares the arrays (and that the layout's length is right).
fn same(col: &ColumnInfo, ty: ColumnType, meta: &[u8], layout: Layout, values: &[Vec<u8>]) {
    let (kind, dt) = map_column(col).unwrap();
    assert!(fits(&kind, layout), "{kind:?} {layout:?}");
    let mut general = make_builder(&dt, 4);
    let mut planned = make_builder(&dt, 4);
    let mut scratch = Scratch::default();
    for bytes in values {
        assert_eq!(
            value_len(layout, bytes),
            Some(bytes.len()),
            "{layout:?} {bytes:?}"
        );
        let unsigned = col.column_type.contains("unsigned");
        let v =
            BinlogValue::deserialize((ty, meta, unsigned, false), &mut ParseBuf(bytes)).unwrap();
        let BinlogValue::Value(v) = v else {
            panic!("{v:?}")
        };
        append(general.as_mut(), &kind, &v, Origin::Binlog, ZeroDate::Null).unwrap();
        append_cell(
            planned.as_mut(),
            &kind,
            layout,
            bytes,
            ZeroDate::Null,
            &mut scratch,
        )
        .unwrap();
    }
    let (g, p) = (general.finish(), planned.finish());
    assert_eq!(g.to_data(), p.to_data(), "{kind:?}: {g:?} vs {p:?}");
}

/// MySQL's packed DECIMAL of `digits` (unsigned digit string, `scale` of them after the point).
fn pack_decimal(negative: bool, int: &str, frac: &str, precision: usize, scale: usize) -> Vec<u8> {
    let intg = precision - scale;
    let int = format!("{int:0>intg$}");
    let frac = format!("{frac:0<scale$}");
    let mut out: Vec<u8> = Vec::new();
    let mut group = |digits: &str| {
        let n = digits.len();
        let width = DIG2BYTES[n];
        let v: u64 = digits.parse().unwrap_or(0);
        out.extend(&v.to_be_bytes()[8 - width..]);
    };
    let lead = intg % 9;
    if lead > 0 {
        group(&int[..lead]);
    }
    for c in int.as_bytes()[lead..].chunks(9) {
        group(std::str::from_utf8(c).unwrap());
    }
    let full = scale / 9 * 9;
    for c in frac.as_bytes()[..full].chunks(9) {
        group(std::str::from_utf8(c).unwrap());
    }
    if !scale.is_multiple_of(9) {
        group(&frac[full..]);
    }
    out[0] ^= 0x80;
    if negative {
        for b in &mut out {
            *b = !*b;
        }
    }
    out
}

#[test]
fn integers_and_floats_match_mysql_common() {
    use ColumnType::*;
    let ints: [(&str, &str, ColumnType, u8); 9] = [
        ("tinyint", "tinyint(4)", MYSQL_TYPE_TINY, 1),
        ("tinyint", "tinyint(3) unsigned", MYSQL_TYPE_TINY, 1),
        ("smallint", "smallint(6)", MYSQL_TYPE_SHORT, 2),
        ("smallint", "smallint(5) unsigned", MYSQL_TYPE_SHORT, 2),
        ("mediumint", "mediumint(9)", MYSQL_TYPE_INT24, 3),
        ("mediumint", "mediumint(8) unsigned", MYSQL_TYPE_INT24, 3),
        ("int", "int(11)", MYSQL_TYPE_LONG, 4),
        ("int", "int(10) unsigned", MYSQL_TYPE_LONG, 4),
        ("bigint", "bigint(20)", MYSQL_TYPE_LONGLONG, 8),
    ];
    for (dt, ct, ty, w) in ints {
        let w = usize::from(w);
        let values: Vec<Vec<u8>> = [0i64, 1, -1, 100, -100, i64::MAX, i64::MIN]
            .iter()
            .map(|v| v.to_le_bytes()[..w].to_vec())
            .collect();
        same(
            &info(dt, ct, None, None),
            ty,
            &[],
            Layout::Int(w as u8),
            &values,
        );
    }
    let big: Vec<Vec<u8>> = [0u64, 1, u64::MAX, 1 << 63]
        .iter()
        .map(|v| v.to_le_bytes().to_vec())
        .collect();
    same(
        &info("bigint", "bigint(20) unsigned", None, None),
        MYSQL_TYPE_LONGLONG,
        &[],
        Layout::Int(8),
        &big,
    );
    let f: Vec<Vec<u8>> = [0.0f32, -1.5, 3.25e10]
        .iter()
        .map(|v| v.to_le_bytes().to_vec())
        .collect();
    same(
        &info("float", "float", None, None),
        MYSQL_TYPE_FLOAT,
        &[4],
        Layout::Float,
        &f,
    );
    let d: Vec<Vec<u8>> = [0.0f64, -1.0 / 3.0, 1e300]
        .iter()
        .map(|v| v.to_le_bytes().to_vec())
        .collect();
    same(
        &info("double", "double", None, None),
        MYSQL_TYPE_DOUBLE,
        &[8],
        Layout::Double,
        &d,
    );
}

#[test]
fn decimals_match_mysql_common() {
    for (p, s, cases) in [
        (
            12usize,
            2usize,
            vec![
                (false, "0", "0"),
                (false, "1234567890", "99"),
                (true, "42", "5"),
                (true, "0", "01"),
            ],
        ),
        (
            30,
            10,
            vec![
                (false, "12345678901234567890", "1234567891"),
                (true, "1", "0000000001"),
            ],
        ),
        (
            38,
            0,
            vec![
                (false, "99999999999999999999999999999999999999", ""),
                (true, "7", ""),
            ],
        ),
        (10, 10, vec![(false, "", "0123456789"), (true, "", "9")]),
        (5, 3, vec![(false, "12", "345"), (true, "0", "5")]),
    ] {
        let values: Vec<Vec<u8>> = cases
            .iter()
            .map(|(neg, i, f)| pack_decimal(*neg, i, f, p, s))
            .collect();
        same(
            &info(
                "decimal",
                &format!("decimal({p},{s})"),
                Some(p as u64),
                Some(s as u64),
            ),
            ColumnType::MYSQL_TYPE_NEWDECIMAL,
            &[p as u8, s as u8],
            Layout::Decimal {
                precision: p as u8,
                scale: s as u8,
            },
            &values,
        );
    }
}

#[test]
fn temporal_values_match_mysql_common() {
    use ColumnType::*;
    let date = |y: u32, m: u32, d: u32| (d | (m << 5) | (y << 9)).to_le_bytes()[..3].to_vec();
    same(
        &info("date", "date", None, None),
        MYSQL_TYPE_NEWDATE,
        &[],
        Layout::Date,
        &[
            date(2024, 2, 29),
            date(1970, 1, 1),
            date(1, 1, 1),
            date(9999, 12, 31),
            date(0, 0, 0),
        ],
    );
    // DATETIME2(fsp): 40 bits (sign, year*13+month, day, hour, minute, second), then the fraction.
    let dt = |y: u64, mo: u64, d: u64, h: u64, mi: u64, s: u64, frac: &[u8]| {
        let ymd = ((y * 13 + mo) << 5) | d;
        let v = (ymd << 17) | (h << 12) | (mi << 6) | s;
        let mut b = (v + 0x80_0000_0000).to_be_bytes()[3..].to_vec();
        b.extend(frac);
        b
    };
    for (fsp, frac) in [
        (0u8, vec![]),
        (3, vec![0x03, 0xe7]),
        (6, vec![0x0f, 0x42, 0x3f]),
        (2, vec![99]),
    ] {
        same(
            &info("datetime", &format!("datetime({fsp})"), None, None),
            MYSQL_TYPE_DATETIME2,
            &[fsp],
            Layout::DateTime2 { fsp },
            &[
                dt(2024, 2, 29, 23, 59, 58, &frac),
                dt(1970, 1, 1, 0, 0, 0, &frac),
                dt(0, 0, 0, 0, 0, 0, &frac),
            ],
        );
    }
    let ts = |secs: u32, frac: &[u8]| {
        let mut b = secs.to_be_bytes().to_vec();
        b.extend(frac);
        b
    };
    for (fsp, frac) in [
        (0u8, vec![]),
        (6, vec![0x00, 0x00, 0x07]),
        (4, vec![0x27, 0x0f]),
    ] {
        same(
            &info("timestamp", &format!("timestamp({fsp})"), None, None),
            MYSQL_TYPE_TIMESTAMP2,
            &[fsp],
            Layout::Timestamp2 { fsp },
            &[ts(1_700_000_000, &frac), ts(1, &frac)],
        );
    }
    same(
        &info("year", "year(4)", None, None),
        MYSQL_TYPE_YEAR,
        &[],
        Layout::Year,
        &[vec![0], vec![124], vec![255]],
    );
    // TIME2(fsp): 24 bits (sign, 10 bits hour, 6 minute, 6 second) offset by 0x800000, then the
    // fraction.
    let time = |h: u32, m: u32, s: u32, frac: &[u8]| {
        let mut b = (((h << 12) | (m << 6) | s) + 0x80_0000).to_be_bytes()[1..].to_vec();
        b.extend(frac);
        b
    };
    for (fsp, frac) in [
        (0u8, vec![]),
        (3, vec![0x27, 0x0f]),
        (6, vec![0x0f, 0x42, 0x3f]),
    ] {
        same(
            &info("time", &format!("time({fsp})"), None, None),
            MYSQL_TYPE_TIME2,
            &[fsp],
            Layout::Time2 { fsp },
            &[
                time(23, 59, 59, &frac),
                time(0, 0, 0, &frac),
                time(12, 30, 1, &frac),
            ],
        );
    }
}

#[test]
fn strings_enums_sets_and_bits_match_mysql_common() {
    use ColumnType::*;
    let short = |s: &[u8]| {
        let mut b = vec![s.len() as u8];
        b.extend(s);
        b
    };
    same(
        &info("varchar", "varchar(32)", None, None),
        MYSQL_TYPE_VARCHAR,
        &[128, 0],
        Layout::Var { len_bytes: 1 },
        &[short(b""), short("héllo".as_bytes())],
    );
    let long = |s: &[u8]| {
        let mut b = (s.len() as u16).to_le_bytes().to_vec();
        b.extend(s);
        b
    };
    same(
        &info("varchar", "varchar(300)", None, None),
        MYSQL_TYPE_VARCHAR,
        &[0xb0, 0x04],
        Layout::Var { len_bytes: 2 },
        &[long(b"x"), long(&[b'a'; 300])],
    );
    let mut latin1 = info("char", "char(4)", None, None);
    latin1.charset = Some("latin1".into());
    same(
        &latin1,
        MYSQL_TYPE_STRING,
        &[0xfe, 4],
        Layout::Var { len_bytes: 1 },
        &[short(&[0xe9, b'a'])],
    );
    let mut binary = info("binary", "binary(4)", None, None);
    binary.charset = None;
    same(
        &binary,
        MYSQL_TYPE_STRING,
        &[0xfe, 4],
        Layout::Var { len_bytes: 1 },
        &[short(&[1, 2]), short(&[1, 2, 3, 4])],
    );
    let mut blob = info("blob", "blob", None, None);
    blob.charset = None;
    same(
        &blob,
        MYSQL_TYPE_BLOB,
        &[2],
        Layout::Blob { len_bytes: 2 },
        &[long(&[0, 1, 2, 255])],
    );
    let en = info("enum", "enum('a','b''c')", None, None);
    same(
        &en,
        MYSQL_TYPE_ENUM,
        &[0xf7, 1],
        Layout::Enum { bytes: 1 },
        &[vec![0], vec![1], vec![2]],
    );
    let set = info("set", "set('x','y','z')", None, None);
    same(
        &set,
        MYSQL_TYPE_SET,
        &[0xf8, 1],
        Layout::Set { bytes: 1 },
        &[vec![0], vec![0b101], vec![0b111]],
    );
    let mut bit = info("bit", "bit(10)", None, None);
    bit.charset = None;
    same(
        &bit,
        MYSQL_TYPE_BIT,
        &[2, 1],
        Layout::Bit { bytes: 2 },
        &[vec![3, 255]],
    );
}

#[test]
fn scan_finds_values_nulls_and_absent_columns() {
    let plan = ImagePlan {
        layouts: vec![Layout::Int(8), Layout::Var { len_bytes: 1 }, Layout::Double],
    };
    // Image of columns 0 and 1 (2 absent); column 1 NULL.
    let mut data = vec![0b10];
    data.extend(7i64.to_le_bytes());
    // A second image: all three columns, none NULL.
    data.push(0);
    data.extend(8i64.to_le_bytes());
    data.extend([2, b'h', b'i']);
    data.extend(1.5f64.to_le_bytes());
    let mut cells = Vec::new();
    let mut pos = 0;
    plan.scan(&data, &mut pos, &[0, 1], &mut cells).unwrap();
    assert_eq!(
        cells,
        vec![Cell::At { start: 1, end: 9 }, Cell::Null, Cell::Absent]
    );
    plan.scan(&data, &mut pos, &[0, 1, 2], &mut cells).unwrap();
    assert_eq!(cells[1], Cell::At { start: 18, end: 21 });
    assert_eq!(pos, data.len());
    // A value running past the event is an error, not a panic.
    let mut pos = 9;
    assert!(plan
        .scan(&data[..20], &mut pos, &[0, 1, 2], &mut cells)
        .is_err());
}
