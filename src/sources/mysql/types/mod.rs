//! MySQL/MariaDB column types to Arrow, and values into Arrow builders (pure).
//!
//! A column's [`Kind`] comes from `information_schema.columns` (`DATA_TYPE`, `COLUMN_TYPE`,
//! precision, charset), the one description every server version has, whatever
//! `binlog_row_metadata` says. Values arrive as `mysql_common` [`Value`]s from two places that
//! encode a few types differently ([`Origin`]): binlog row images (ENUM as its index, SET as a
//! bitmask, TIMESTAMP as epoch seconds, YEAR as text) and the binary protocol of the initial copy
//! (ENUM and SET as names, TIMESTAMP as a date in the session's UTC zone).
//!
//! Mapping (the sink's Iceberg types have no unsigned integers and no 8-bit integer):
//! TINYINT, SMALLINT → Int16; TINYINT/SMALLINT UNSIGNED → Int16/Int32; MEDIUMINT, INT → Int32;
//! MEDIUMINT/INT UNSIGNED → Int32/Int64; BIGINT → Int64; **BIGINT UNSIGNED → Decimal(20,0)** so
//! values above 2^63 stay exact; DECIMAL(p,s) → Decimal128(p,s) (p ≤ 38; wider as text);
//! FLOAT/DOUBLE → Float32/Float64; BIT(n) → Binary (big-endian bytes, as MySQL sends them);
//! DATE → Date32; TIME → Time64(µs) (values outside 00:00–24:00 stop the pipeline: Iceberg's time
//! is a time of day); DATETIME(fsp) → Timestamp(µs) without zone; TIMESTAMP(fsp) → Timestamp(µs,
//! UTC); YEAR → Int16; CHAR/VARCHAR/TEXT → Utf8 (utf8mb4, utf8mb3, ascii as is; latin1 transcoded;
//! other charsets stop with an error naming the column); BINARY/VARBINARY/BLOB → Binary (BINARY(n)
//! padded back to n bytes: the binlog drops trailing zero bytes); JSON →
//! Utf8 (MySQL's binary JSON decoded to text; MariaDB's JSON is already text); ENUM, SET → Utf8
//! names (`a,b` for a SET); GEOMETRY → Binary WKB (MySQL's 4-byte SRID prefix is dropped).
//! Zero dates (`0000-00-00`, zero month or day) follow `source.zero_date`: NULL or an error.

use std::any::Any;
use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, Date32Builder, Decimal128Builder, Float32Builder, Float64Builder,
    Int16Builder, Int32Builder, Int64Builder, StringBuilder, Time64MicrosecondBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_schema::{DataType, TimeUnit};
use mysql_common::value::Value;

use crate::changelog::append_null;
use crate::config::ZeroDate;

/// Where a value was read: the two encodings differ for ENUM, SET, TIMESTAMP and YEAR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Binlog,
    Query,
}

/// How one column's values are converted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A signed or unsigned integer `bits` wide.
    Int {
        unsigned: bool,
        bits: u32,
    },
    /// BIGINT UNSIGNED, as Decimal(20,0).
    BigUnsigned,
    Decimal {
        precision: u8,
        scale: i8,
    },
    /// DECIMAL wider than 38 digits, as its text.
    DecimalText,
    Float,
    Double,
    Bit,
    Date,
    Time,
    DateTime,
    Timestamp,
    Year,
    /// Character data; `latin1` is transcoded to UTF-8.
    Text {
        latin1: bool,
    },
    Binary,
    /// BINARY(n): the binlog drops trailing 0x00 bytes, which are padded back to `n`.
    FixedBinary(usize),
    Json,
    Enum(Arc<[String]>),
    Set(Arc<[String]>),
    /// A spatial column and its declared SRID (0: none declared).
    Geometry(u32),
}

/// A type cdcd cannot map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {column}: {detail}")]
pub struct TypeError {
    pub column: String,
    pub detail: String,
}

/// One row of `information_schema.columns`, what [`map_column`] needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ColumnInfo {
    pub name: String,
    /// `DATA_TYPE`, e.g. `int`.
    pub data_type: String,
    /// `COLUMN_TYPE`, e.g. `int(10) unsigned` or `enum('a','b')`.
    pub column_type: String,
    pub numeric_precision: Option<u64>,
    pub numeric_scale: Option<u64>,
    pub charset: Option<String>,
    pub nullable: bool,
    /// MariaDB's JSON is LONGTEXT with a `json_valid()` check.
    pub json_check: bool,
    /// `COLUMN_DEFAULT` as the server shows it (MariaDB quotes strings and writes `NULL`).
    pub default: Option<String>,
    /// The names a `RENAME COLUMN` or `CHANGE` gave up, oldest first (not in
    /// `information_schema`: kept by the schema history, `changelog::Column::former_names`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub former_names: Vec<String>,
    /// A spatial column's declared SRID (MySQL 8 `SRID n`, MariaDB `REF_SYSTEM_ID=n`; not in
    /// `information_schema.columns`: `ST_GEOMETRY_COLUMNS` / `GEOMETRY_COLUMNS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub srid: Option<u32>,
}

/// A stored geometry (MySQL's little-endian u32 SRID, then WKB) as the WKB the source emits.
/// In a column that declares an SRID, a value of another non-zero SRID (MariaDB does not
/// enforce `REF_SYSTEM_ID`) keeps it as EWKB, so a sink that labels the column with its CRS
/// (`spatial = "geometry"`) sees it and refuses it, as it does a PostGIS value's.
pub fn geometry_wkb(stored: &[u8], declared: u32) -> std::borrow::Cow<'_, [u8]> {
    let wkb = stored.get(4..).unwrap_or_default();
    let srid = stored
        .get(..4)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map_or(0, u32::from_le_bytes);
    let (Some(&order), Some(ty)) = (wkb.first(), wkb.get(1..5)) else {
        return wkb.into();
    };
    if declared == 0 || srid == 0 || srid == declared {
        return wkb.into();
    }
    // EWKB: the type word with the SRID flag, then the SRID, in the WKB's byte order.
    const SRID_FLAG: u32 = 0x2000_0000;
    let little = order == 1;
    let ty = <[u8; 4]>::try_from(ty).unwrap_or_default();
    let ty = if little {
        u32::from_le_bytes(ty)
    } else {
        u32::from_be_bytes(ty)
    } | SRID_FLAG;
    let word = |v: u32| {
        if little {
            v.to_le_bytes()
        } else {
            v.to_be_bytes()
        }
    };
    let mut out = Vec::with_capacity(wkb.len() + 4);
    out.push(order);
    out.extend_from_slice(&word(ty));
    out.extend_from_slice(&word(srid));
    out.extend_from_slice(wkb.get(5..).unwrap_or_default());
    out.into()
}

/// A column's default, for INSERTs whose MINIMAL image leaves the column out.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnDefault {
    /// A constant (NULL, a number, a string), converted like a queried value.
    Value(Value),
    /// An expression (`current_timestamp()`, …) cdcd cannot evaluate.
    Expr(String),
}

/// Reads `COLUMN_DEFAULT`: SQL NULL or `NULL` → NULL, `'text'` → text, numbers as they are,
/// anything else an expression.
pub fn parse_default(raw: Option<&str>, nullable: bool) -> ColumnDefault {
    let Some(raw) = raw else {
        return if nullable {
            ColumnDefault::Value(Value::NULL)
        } else {
            ColumnDefault::Expr("(no default)".into())
        };
    };
    if raw.eq_ignore_ascii_case("null") {
        return ColumnDefault::Value(Value::NULL);
    }
    if let Some(inner) = raw.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        return ColumnDefault::Value(Value::Bytes(inner.replace("''", "'").into_bytes()));
    }
    if !raw.is_empty()
        && raw
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E'))
    {
        return ColumnDefault::Value(Value::Bytes(raw.as_bytes().to_vec()));
    }
    ColumnDefault::Expr(raw.to_owned())
}

/// The Arrow type and converter of a column.
pub fn map_column(info: &ColumnInfo) -> Result<(Kind, DataType), TypeError> {
    let err = |detail: String| TypeError {
        column: info.name.clone(),
        detail,
    };
    let unsigned = info.column_type.to_ascii_lowercase().contains("unsigned");
    let int = |bits: u32| {
        let dt = match (bits, unsigned) {
            (8, _) | (16, false) => DataType::Int16,
            (16, true) | (24, _) | (32, false) => DataType::Int32,
            _ => DataType::Int64,
        };
        (Kind::Int { unsigned, bits }, dt)
    };
    let charset = info
        .charset
        .as_deref()
        .unwrap_or("binary")
        .to_ascii_lowercase();
    let text = || -> Result<(Kind, DataType), TypeError> {
        match charset.as_str() {
            "binary" => Ok((Kind::Binary, DataType::Binary)),
            "utf8mb4" | "utf8mb3" | "utf8" | "ascii" => {
                Ok((Kind::Text { latin1: false }, DataType::Utf8))
            }
            "latin1" => Ok((Kind::Text { latin1: true }, DataType::Utf8)),
            other => Err(err(format!(
                "character set {other} is not supported (utf8mb4, utf8mb3, ascii, latin1 are)"
            ))),
        }
    };
    Ok(match info.data_type.to_ascii_lowercase().as_str() {
        "tinyint" => int(8),
        "smallint" => int(16),
        "mediumint" => int(24),
        "int" | "integer" => int(32),
        "bigint" if unsigned => (Kind::BigUnsigned, DataType::Decimal128(20, 0)),
        "bigint" => int(64),
        "decimal" | "numeric" => {
            let p = info.numeric_precision.unwrap_or(10);
            let s = info.numeric_scale.unwrap_or(0);
            match (u8::try_from(p), i8::try_from(s)) {
                (Ok(p), Ok(s)) if p <= 38 => (
                    Kind::Decimal {
                        precision: p,
                        scale: s,
                    },
                    DataType::Decimal128(p, s),
                ),
                _ => (Kind::DecimalText, DataType::Utf8),
            }
        }
        "float" => (Kind::Float, DataType::Float32),
        "double" | "real" => (Kind::Double, DataType::Float64),
        "bit" => (Kind::Bit, DataType::Binary),
        "date" => (Kind::Date, DataType::Date32),
        "time" => (Kind::Time, DataType::Time64(TimeUnit::Microsecond)),
        "datetime" => (
            Kind::DateTime,
            DataType::Timestamp(TimeUnit::Microsecond, None),
        ),
        "timestamp" => (
            Kind::Timestamp,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        ),
        "year" => (Kind::Year, DataType::Int16),
        "json" => (Kind::Json, DataType::Utf8),
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => {
            if info.json_check {
                (Kind::Json, DataType::Utf8)
            } else {
                text()?
            }
        }
        "binary" => {
            let n = info
                .column_type
                .split(['(', ')'])
                .nth(1)
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(1);
            (Kind::FixedBinary(n), DataType::Binary)
        }
        "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
            (Kind::Binary, DataType::Binary)
        }
        "enum" => (
            Kind::Enum(parse_members(&info.column_type).into()),
            DataType::Utf8,
        ),
        "set" => (
            Kind::Set(parse_members(&info.column_type).into()),
            DataType::Utf8,
        ),
        "geometry" | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring"
        | "multipolygon" | "geometrycollection" | "geomcollection" => {
            (Kind::Geometry(info.srid.unwrap_or(0)), DataType::Binary)
        }
        other => return Err(err(format!("type {other} is not supported"))),
    })
}

/// The members of `enum('a','b''c')` / `set(...)`, unquoted, in declaration order.
pub fn parse_members(column_type: &str) -> Vec<String> {
    let inner = column_type
        .find('(')
        .and_then(|i| column_type.get(i + 1..))
        .and_then(|s| s.rfind(')').and_then(|j| s.get(..j)))
        .unwrap_or("");
    let mut out = Vec::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            continue;
        }
        let mut member = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\'' if chars.peek() == Some(&'\'') => {
                    chars.next();
                    member.push('\'');
                }
                '\'' => break,
                '\\' => {
                    if let Some(n) = chars.next() {
                        member.push(n);
                    }
                }
                c => member.push(c),
            }
        }
        out.push(member);
    }
    out
}

/// A value could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ValueError(pub String);

fn bad<T>(kind: &Kind, v: &Value) -> Result<T, ValueError> {
    Err(ValueError(format!("unexpected value {v:?} for {kind:?}")))
}

/// Appends `$v` to `$any` (a builder's `as_any_mut`), which must be a `$b`; else an error naming
/// the column's `$kind`. Shared by both row decoders ([`append`] and `image::append_cell`).
macro_rules! push_as {
    ($any:expr, $kind:expr, $b:ty, $v:expr) => {
        match $any.downcast_mut::<$b>() {
            Some(b) => {
                b.append_value($v);
                Ok(())
            }
            None => Err(ValueError(format!(
                "builder is not {} for {:?}",
                stringify!($b),
                $kind
            ))),
        }
    };
}
pub(crate) use push_as;

/// Appends the integer `v` of a column of `kind` to the Int16, Int32 or Int64 builder
/// [`map_column`] chose for it, refusing a value the builder's width cannot hold.
pub(crate) fn append_int(any: &mut dyn Any, v: i64, kind: &Kind) -> Result<(), ValueError> {
    if let Some(b) = any.downcast_mut::<Int16Builder>() {
        b.append_value(narrow(v)?);
    } else if let Some(b) = any.downcast_mut::<Int32Builder>() {
        b.append_value(narrow(v)?);
    } else if let Some(b) = any.downcast_mut::<Int64Builder>() {
        b.append_value(v);
    } else {
        return Err(ValueError(format!("no integer builder for {kind:?}")));
    }
    Ok(())
}

/// Appends `value` (of a column of `kind`) to `builder`, whose type [`map_column`] chose.
pub fn append(
    builder: &mut dyn ArrayBuilder,
    kind: &Kind,
    value: &Value,
    origin: Origin,
    zero_date: ZeroDate,
) -> Result<(), ValueError> {
    if matches!(value, Value::NULL) {
        return append_null(builder).map_err(|e| ValueError(e.to_string()));
    }
    let any = builder.as_any_mut();
    macro_rules! push {
        ($b:ty, $v:expr) => {
            push_as!(any, kind, $b, $v)
        };
    }
    match kind {
        Kind::Int { unsigned, bits } => {
            let v = int_value(value, *unsigned, *bits)
                .ok_or_else(|| ValueError(format!("unexpected value {value:?} for {kind:?}")))?;
            append_int(any, v, kind)
        }
        Kind::BigUnsigned => {
            let v: i128 = match value {
                Value::Int(i) => i128::from(*i as u64),
                Value::UInt(u) => i128::from(*u),
                Value::Bytes(b) => parse_decimal(b, 0).ok_or_else(|| text_err(b))?,
                v => return bad(kind, v),
            };
            push!(Decimal128Builder, v)
        }
        Kind::Decimal { scale, .. } => {
            let v = match value {
                Value::Bytes(b) => parse_decimal(b, *scale).ok_or_else(|| text_err(b))?,
                Value::Int(i) => i128::from(*i) * 10i128.pow(u32::from(scale.unsigned_abs())),
                v => return bad(kind, v),
            };
            push!(Decimal128Builder, v)
        }
        Kind::Float => match value {
            Value::Float(f) => push!(Float32Builder, *f),
            Value::Bytes(b) => push!(
                Float32Builder,
                std::str::from_utf8(b)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| text_err(b))?
            ),
            Value::Double(d) => push!(Float32Builder, *d as f32),
            v => bad(kind, v),
        },
        Kind::Double => match value {
            Value::Double(d) => push!(Float64Builder, *d),
            Value::Bytes(b) => push!(
                Float64Builder,
                std::str::from_utf8(b)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| text_err(b))?
            ),
            Value::Float(f) => push!(Float64Builder, f64::from(*f)),
            v => bad(kind, v),
        },
        Kind::Date => match value {
            Value::Date(y, m, d, ..) => match days_from_civil(*y, *m, *d) {
                Some(days) => push!(Date32Builder, days),
                None => zero(builder, zero_date, value),
            },
            v => bad(kind, v),
        },
        Kind::DateTime | Kind::Timestamp => {
            let micros = match (value, origin) {
                (Value::Date(y, mo, d, h, mi, s, us), _) => {
                    days_from_civil(*y, *mo, *d).map(|days| {
                        ((i64::from(days) * 24 + i64::from(*h)) * 60 + i64::from(*mi))
                            * 60
                            * 1_000_000
                            + i64::from(*s) * 1_000_000
                            + i64::from(*us)
                    })
                }
                // Binlog TIMESTAMP: epoch seconds; 0 is MySQL's zero timestamp.
                (Value::Int(secs), Origin::Binlog) => (*secs != 0).then_some(secs * 1_000_000),
                (Value::Bytes(b), Origin::Binlog) => parse_epoch(b)?,
                (v, _) => return bad(kind, v),
            };
            match micros {
                Some(m) => push!(TimestampMicrosecondBuilder, m),
                None => zero(builder, zero_date, value),
            }
        }
        Kind::Time => match value {
            Value::Time(neg, days, h, m, s, us) => {
                let micros =
                    ((i64::from(*days) * 24 + i64::from(*h)) * 60 + i64::from(*m)) * 60 * 1_000_000
                        + i64::from(*s) * 1_000_000
                        + i64::from(*us);
                if *neg || micros >= 86_400_000_000 {
                    return Err(ValueError(format!(
                        "TIME value {}{}:{m:02}:{s:02} is outside 00:00:00-23:59:59.999999, which an Iceberg time cannot hold",
                        if *neg { "-" } else { "" },
                        i64::from(*days) * 24 + i64::from(*h)
                    )));
                }
                push!(Time64MicrosecondBuilder, micros)
            }
            v => bad(kind, v),
        },
        Kind::Year => {
            let y = match value {
                Value::Int(y) => *y,
                Value::UInt(y) => *y as i64,
                // mysql_common writes the binlog's year byte as 1900 + byte; byte 0 is YEAR 0000.
                Value::Bytes(b) => match std::str::from_utf8(b).ok().and_then(|t| t.parse().ok()) {
                    Some(1900) => 0,
                    Some(y) => y,
                    None => return Err(text_err(b)),
                },
                v => return bad(kind, v),
            };
            push!(Int16Builder, narrow(y)?)
        }
        Kind::Text { latin1 } => match value {
            Value::Bytes(b) => {
                // Queries run with SET NAMES utf8mb4, so the server already converted; the binlog
                // holds the column's own bytes.
                if *latin1 && origin == Origin::Binlog {
                    let s: String = b.iter().map(|&c| char::from(c)).collect();
                    push!(StringBuilder, s)
                } else {
                    let s = std::str::from_utf8(b)
                        .map_err(|e| ValueError(format!("text is not UTF-8: {e}")))?;
                    push!(StringBuilder, s)
                }
            }
            v => bad(kind, v),
        },
        Kind::DecimalText => match value {
            Value::Bytes(b) => {
                let s = std::str::from_utf8(b).map_err(|_| text_err(b))?;
                push!(StringBuilder, s)
            }
            v => bad(kind, v),
        },
        Kind::Json => match value {
            Value::Bytes(b) => {
                let s = std::str::from_utf8(b)
                    .map_err(|e| ValueError(format!("JSON is not UTF-8: {e}")))?;
                push!(StringBuilder, s)
            }
            v => bad(kind, v),
        },
        Kind::Binary | Kind::Bit => match value {
            Value::Bytes(b) => push!(BinaryBuilder, b),
            v => bad(kind, v),
        },
        Kind::FixedBinary(n) => match value {
            Value::Bytes(b) if b.len() < *n => {
                let mut padded = Vec::with_capacity(*n);
                padded.extend_from_slice(b);
                padded.resize(*n, 0);
                push!(BinaryBuilder, padded)
            }
            Value::Bytes(b) => push!(BinaryBuilder, b),
            v => bad(kind, v),
        },
        Kind::Geometry(declared) => match value {
            Value::Bytes(b) => push!(BinaryBuilder, geometry_wkb(b, *declared).as_ref()),
            v => bad(kind, v),
        },
        Kind::Enum(names) => match (value, origin) {
            (Value::Int(i), Origin::Binlog) => {
                // Index 0 is the empty string MySQL stores for an invalid value.
                let name = match usize::try_from(*i).ok().and_then(|i| i.checked_sub(1)) {
                    None => "",
                    Some(i) => names.get(i).map(String::as_str).ok_or_else(|| {
                        ValueError(format!(
                            "ENUM index {} beyond {} members",
                            i + 1,
                            names.len()
                        ))
                    })?,
                };
                push!(StringBuilder, name)
            }
            (Value::Bytes(b), _) => {
                let s = std::str::from_utf8(b).map_err(|_| text_err(b))?;
                push!(StringBuilder, s)
            }
            (v, _) => bad(kind, v),
        },
        Kind::Set(names) => match (value, origin) {
            (Value::Bytes(b), Origin::Binlog) => {
                let mut s = String::new();
                for (i, name) in names.iter().enumerate() {
                    let bit = b.get(i / 8).is_some_and(|byte| byte & (1 << (i % 8)) != 0);
                    if bit {
                        if !s.is_empty() {
                            s.push(',');
                        }
                        s.push_str(name);
                    }
                }
                push!(StringBuilder, s)
            }
            (Value::Bytes(b), Origin::Query) => {
                let s = std::str::from_utf8(b).map_err(|_| text_err(b))?;
                push!(StringBuilder, s)
            }
            (v, _) => bad(kind, v),
        },
    }
}

fn text_err(b: &[u8]) -> ValueError {
    ValueError(format!("unexpected text {:?}", String::from_utf8_lossy(b)))
}

fn narrow<T: TryFrom<i64>>(v: i64) -> Result<T, ValueError> {
    T::try_from(v).map_err(|_| ValueError(format!("integer {v} out of range for the column")))
}

/// Binlog rows images carry integers as their bit pattern read signed; `unsigned` columns are
/// reinterpreted at their width.
fn int_value(value: &Value, unsigned: bool, bits: u32) -> Option<i64> {
    let v = match value {
        Value::Int(i) => *i,
        Value::UInt(u) => i64::try_from(*u).ok()?,
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.parse().ok()?,
        _ => return None,
    };
    if unsigned && v < 0 && bits < 64 {
        Some(v & ((1i64 << bits) - 1))
    } else if !unsigned && bits < 64 && v >= 1i64 << (bits - 1) {
        // mysql_common reads a MEDIUMINT unsigned when the row metadata's signedness does not
        // line up with the column; a signed column never holds 2^(bits-1) or more.
        Some(v - (1i64 << bits))
    } else {
        Some(v)
    }
}

/// `[-]digits[.digits]` as an integer scaled by `10^scale`.
pub fn parse_decimal(text: &[u8], scale: i8) -> Option<i128> {
    let s = std::str::from_utf8(text).ok()?.trim();
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let scale = usize::try_from(scale).ok()?;
    if frac.len() > scale || (int.is_empty() && frac.is_empty()) {
        return None;
    }
    let mut v: i128 = 0;
    for c in int.bytes().chain(frac.bytes()) {
        let d = (c as char).to_digit(10)?;
        v = v.checked_mul(10)?.checked_add(i128::from(d))?;
    }
    for _ in frac.len()..scale {
        v = v.checked_mul(10)?;
    }
    Some(if neg { -v } else { v })
}

/// `secs[.frac]` (mysql_common's text of a binlog TIMESTAMP2) as microseconds; `None` for the
/// zero timestamp.
fn parse_epoch(b: &[u8]) -> Result<Option<i64>, ValueError> {
    let s = std::str::from_utf8(b).map_err(|_| text_err(b))?;
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = secs.parse().map_err(|_| text_err(b))?;
    let mut us: i64 = 0;
    for i in 0..6 {
        let d = frac
            .as_bytes()
            .get(i)
            .map_or(0, |c| i64::from(c.saturating_sub(b'0')));
        us = us * 10 + d;
    }
    Ok((secs != 0 || us != 0).then_some(secs * 1_000_000 + us))
}

/// Days since 1970-01-01 of a proleptic Gregorian date; `None` for a zero month or day.
pub fn days_from_civil(y: u16, m: u8, d: u8) -> Option<i32> {
    if m == 0 || d == 0 || m > 12 || d > 31 {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = i64::from(y) - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    i32::try_from(era * 146_097 + doe - 719_468).ok()
}

fn zero(
    builder: &mut dyn ArrayBuilder,
    zero_date: ZeroDate,
    value: &Value,
) -> Result<(), ValueError> {
    match zero_date {
        ZeroDate::Null => append_null(builder).map_err(|e| ValueError(e.to_string())),
        ZeroDate::Error => Err(ValueError(format!(
            "zero date {value:?} (source.zero_date = \"error\"; set it to \"null\" to write NULL)"
        ))),
    }
}

#[cfg(test)]
mod tests;
