//! Postgres column types to Arrow, and Postgres text values straight into Arrow builders.
//!
//! Where it sits: the pgoutput decoder (`assembler/mod.rs`) and the initial copy (`snapshot.rs`) both
//! receive each column as the type's *text output*. A table's Relation message gives each column's
//! type OID and typmod; [`ColumnType::resolve`] turns that into a [`ColumnType`] once per table, and
//! [`ColumnType::append_text`] then parses every value from `&[u8]` directly into the column's
//! Arrow builder (no per-value allocation for scalars; STYLE rule 11). Pure: no I/O.
//!
//! Why text: pgoutput's binary mode (protocol option `binary`) is refused for types without a
//! binary send function and ties cdcd to Postgres's internal representations; text output is
//! stable and documented. The replication and copy sessions pin `DateStyle=ISO`,
//! `IntervalStyle=iso_8601`, `TimeZone=UTC`, `extra_float_digits=3` and `bytea_output=hex`, so the
//! formats below are the only ones to parse.
//!
//! # Type mapping
//!
//! | Postgres type | Arrow type | Notes |
//! |---|---|---|
//! | `bool` | `Boolean` | |
//! | `int2`, `int4`, `int8` | `Int16`, `Int32`, `Int64` | |
//! | `oid` | `Int64` | unsigned 32-bit in Postgres |
//! | `float4`, `float8` | `Float32`, `Float64` | `NaN`, `Infinity`, `-Infinity`, `-0` kept |
//! | `numeric(p,s)`, p ≤ 38 | `Decimal128(p,s)` | `NaN`/`±Infinity` are an error naming the value; a negative scale `numeric(p,-k)` becomes `Decimal128(p+k,0)`; a scale above the precision becomes `Decimal128(s,s)` |
//! | `numeric` (no typmod), `numeric(p,s)` with p > 38 | `Utf8` | Postgres's text, exactly (no precision is lost) |
//! | `text`, `varchar(n)`, `bpchar`/`char(n)`, `name`, `"char"` | `Utf8` | `char(n)` keeps Postgres's blank padding |
//! | `bytea` | `Binary` | from the hex (`\x…`) or escape output |
//! | `date` | `Date32` | BC dates exact (proleptic Gregorian); `infinity`/`-infinity` → `i32::MAX`/`-i32::MAX` days |
//! | `time` | `Time64(µs)` | `24:00:00` is 86 400 000 000 µs |
//! | `timetz` | `Utf8` | the text, e.g. `03:04:05+05:30` |
//! | `timestamp` | `Timestamp(µs, None)` | BC exact; `infinity`/`-infinity` → `i64::MAX`/`-i64::MAX` µs; after 294247-01-10 (the end of i64 µs since 1970; Postgres goes to 294276) an error |
//! | `timestamptz` | `Timestamp(µs, "+00:00")` | converted to UTC from whatever offset the text carries; infinities as `timestamp` |
//! | `uuid` | `FixedSizeBinary(16)` | |
//! | `json`, `jsonb` | `Utf8` | the text as sent |
//! | `interval` | `Utf8` | ISO 8601 as sent, e.g. `P1Y2M3DT4H5M6.5S` |
//! | enum types | `Utf8` | the label |
//! | domains | their base type | a domain's own typmod is not known, so a domain over `numeric(p,s)` maps as `numeric` |
//! | one-dimensional arrays of any type above | `List(element)` | field name `element`, nullable; a `[m:n]=` lower-bound prefix is dropped; a multi-dimensional value is an error naming it |
//! | PostGIS `geometry`, `geography` | `Utf8` | the text output (hex EWKB), named with the typmod (`geometry(Point,4326)`) |
//! | anything else (`citext`, `xml`, geometric, ranges, composites, arrays of those…) | `Utf8` | the type's text output |
//!
//! The infinity sentinels for `date`/`timestamp` are the values DuckDB uses for its own infinities.
//!
//! A value that does not parse is a [`ValueError`] naming the type and the text (never a panic).
//! On error a scalar appends nothing; an array may have appended some elements to the list's child
//! builder, so the caller must discard the batch (a value error stops the pipeline anyway).

use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder,
    FixedSizeBinaryBuilder, Float32Builder, Float64Builder, Int16Builder, Int32Builder,
    Int64Builder, ListBuilder, StringBuilder, Time64MicrosecondBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_schema::{DataType, Field, TimeUnit};

use crate::changelog::append_null;

mod text;

pub(crate) use text::hex_value;

#[cfg(test)]
mod tests;

/// The session settings every connection that produces text values must use, so the text is in
/// the formats parsed here: replication startup options, and `SET` on the copy connection.
pub const TEXT_FORMAT_SETTINGS: &[(&str, &str)] = &[
    ("DateStyle", "ISO"),
    ("IntervalStyle", "iso_8601"),
    ("TimeZone", "UTC"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
];

/// The largest Decimal128 precision.
const MAX_DECIMAL_PRECISION: i32 = 38;
/// Domains over domains are followed this deep; deeper (or a cycle in a bad catalog) falls back
/// to text.
const MAX_RESOLVE_DEPTH: u8 = 16;
/// `VARHDRSZ`: numeric, varchar and bpchar typmods are offset by the varlena header size.
const VARHDRSZ: i32 = 4;
/// Error texts are cut to this many characters.
const ERROR_TEXT_CHARS: usize = 64;

/// A row of `pg_type`, for OIDs that are not built in: enums, domains, arrays of them, extension
/// types. The source loads it from the catalog (`oid, typnamespace::regnamespace, typname,
/// typtype, typelem, typbasetype`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeInfo {
    pub oid: u32,
    pub namespace: String,
    pub name: String,
    /// `typtype`: `b'b'` base, `b'e'` enum, `b'd'` domain, `b'c'` composite, `b'r'` range, …
    pub typtype: u8,
    /// `typelem` when non-zero. Arrays are the types named `_<element>` with an element; other
    /// types with a `typelem` (`point`, `int2vector`) have their own text syntax.
    pub element: Option<u32>,
    /// `typbasetype` of a domain.
    pub base: Option<u32>,
}

/// How one column is decoded: its Arrow type and its parser. Resolved once per table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnType {
    Bool,
    Int16,
    Int32,
    Int64,
    /// `oid`, widened to Int64 because it is unsigned.
    Oid,
    Float32,
    Float64,
    /// `numeric(p,s)` that fits Decimal128; these are the Arrow precision and scale.
    Decimal {
        precision: u8,
        scale: i8,
    },
    /// `numeric` without a typmod, or with a precision above 38: Utf8 holding Postgres's text.
    NumericText {
        type_name: String,
    },
    /// `text`, `varchar(n)`, `bpchar(n)`, `name`, `"char"`.
    Text {
        type_name: String,
    },
    Bytea,
    Date,
    Time,
    /// `timetz`: Utf8 text (Arrow has no time-with-offset type).
    TimeTz,
    Timestamp,
    TimestampTz,
    Uuid,
    Json,
    Jsonb,
    /// ISO 8601 text as sent.
    Interval,
    /// An enum type: Utf8 holding the label.
    Enum {
        type_name: String,
    },
    /// A domain: decoded as its base type.
    Domain {
        type_name: String,
        base: Box<ColumnType>,
    },
    /// A one-dimensional array.
    List(Box<ColumnType>),
    /// Any other type: Utf8 holding its text output.
    TextFallback {
        type_name: String,
    },
}

/// A value could not be stored in its column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("{type_name} value {text:?} {reason}")]
    Invalid {
        /// [`ColumnType::source_name`] of the type being parsed.
        type_name: String,
        /// The offending text, cut to 64 characters.
        text: String,
        reason: &'static str,
    },
    #[error("{type_name}: the Arrow builder is not a {expected} (batch schema and column type disagree)")]
    Builder {
        type_name: String,
        expected: &'static str,
    },
}

impl ValueError {
    fn invalid(ty: &ColumnType, text: &[u8], reason: &'static str) -> Self {
        let lossy = String::from_utf8_lossy(text);
        let text = match lossy.char_indices().nth(ERROR_TEXT_CHARS) {
            Some((cut, _)) => format!("{}…", &lossy[..cut]),
            None => lossy.into_owned(),
        };
        ValueError::Invalid {
            type_name: ty.source_name(),
            text,
            reason,
        }
    }
}

/// Built-in type OIDs (`pg_type.dat`); stable across Postgres versions.
mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const CHAR: u32 = 18;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIME: u32 = 1083;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const INTERVAL: u32 = 1186;
    pub const TIMETZ: u32 = 1266;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
    pub const JSONB: u32 = 3802;

    /// Array type OID → element type OID, for the built-in arrays cdcd maps.
    pub fn array_element(array: u32) -> Option<u32> {
        Some(match array {
            1000 => BOOL,
            1001 => BYTEA,
            1002 => CHAR,
            1003 => NAME,
            1005 => INT2,
            1007 => INT4,
            1009 => TEXT,
            1014 => BPCHAR,
            1015 => VARCHAR,
            1016 => INT8,
            1021 => FLOAT4,
            1022 => FLOAT8,
            1028 => OID,
            1115 => TIMESTAMP,
            1182 => DATE,
            1183 => TIME,
            1185 => TIMESTAMPTZ,
            1187 => INTERVAL,
            1231 => NUMERIC,
            1270 => TIMETZ,
            199 => JSON,
            2951 => UUID,
            3807 => JSONB,
            _ => return None,
        })
    }
}

impl ColumnType {
    /// From the Relation message's type OID and typmod (`-1`: none); `lookup` resolves OIDs that
    /// are not built in (enums, domains, arrays of them, extension types) from the catalog.
    pub fn resolve(type_oid: u32, typmod: i32, lookup: &dyn Fn(u32) -> Option<TypeInfo>) -> Self {
        Self::resolve_at(type_oid, typmod, lookup, 0)
    }

    fn resolve_at(
        type_oid: u32,
        typmod: i32,
        lookup: &dyn Fn(u32) -> Option<TypeInfo>,
        depth: u8,
    ) -> Self {
        if let Some(ty) = Self::builtin(type_oid, typmod) {
            return ty;
        }
        if let Some(element) = oid::array_element(type_oid) {
            return Self::list_of(Self::resolve_at(element, typmod, lookup, depth + 1));
        }
        let Some(info) = lookup(type_oid) else {
            return ColumnType::TextFallback {
                type_name: format!("oid {type_oid}"),
            };
        };
        let type_name = qualified(&info);
        if depth >= MAX_RESOLVE_DEPTH {
            return ColumnType::TextFallback { type_name };
        }
        match (info.typtype, info.base, info.element) {
            (b'e', _, _) => ColumnType::Enum { type_name },
            (b'b', _, _) if matches!(info.name.as_str(), "geometry" | "geography") => {
                ColumnType::TextFallback {
                    type_name: postgis_name(type_name, typmod),
                }
            }
            (b'd', Some(base), _) => ColumnType::Domain {
                type_name,
                base: Box::new(Self::resolve_at(base, typmod, lookup, depth + 1)),
            },
            (_, _, Some(element)) if info.name.starts_with('_') => {
                match Self::list_of(Self::resolve_at(element, typmod, lookup, depth + 1)) {
                    list @ ColumnType::List(_) => list,
                    _ => ColumnType::TextFallback { type_name },
                }
            }
            _ => ColumnType::TextFallback { type_name },
        }
    }

    /// An array of `element`, or text when the element has no mapping of its own: an unknown
    /// element type may use another delimiter than `,` (`box[]` uses `;`).
    fn list_of(element: ColumnType) -> Self {
        match element {
            ColumnType::TextFallback { type_name } => ColumnType::TextFallback {
                type_name: format!("{type_name}[]"),
            },
            ColumnType::List(_) => ColumnType::TextFallback {
                type_name: format!("{}[]", element.source_name()),
            },
            element => ColumnType::List(Box::new(element)),
        }
    }

    fn builtin(type_oid: u32, typmod: i32) -> Option<Self> {
        let text = |name: &str| ColumnType::Text {
            type_name: match typmod {
                m if m > VARHDRSZ => format!("{name}({})", m - VARHDRSZ),
                _ => name.to_owned(),
            },
        };
        Some(match type_oid {
            oid::BOOL => ColumnType::Bool,
            oid::INT2 => ColumnType::Int16,
            oid::INT4 => ColumnType::Int32,
            oid::INT8 => ColumnType::Int64,
            oid::OID => ColumnType::Oid,
            oid::FLOAT4 => ColumnType::Float32,
            oid::FLOAT8 => ColumnType::Float64,
            oid::NUMERIC => numeric(typmod),
            oid::TEXT => text("text"),
            oid::VARCHAR => text("varchar"),
            oid::BPCHAR => text("bpchar"),
            oid::NAME => text("name"),
            oid::CHAR => text("\"char\""),
            oid::BYTEA => ColumnType::Bytea,
            oid::DATE => ColumnType::Date,
            oid::TIME => ColumnType::Time,
            oid::TIMETZ => ColumnType::TimeTz,
            oid::TIMESTAMP => ColumnType::Timestamp,
            oid::TIMESTAMPTZ => ColumnType::TimestampTz,
            oid::UUID => ColumnType::Uuid,
            oid::JSON => ColumnType::Json,
            oid::JSONB => ColumnType::Jsonb,
            oid::INTERVAL => ColumnType::Interval,
            _ => return None,
        })
    }

    /// The Arrow type of this column's values.
    pub fn data_type(&self) -> DataType {
        match self {
            ColumnType::Bool => DataType::Boolean,
            ColumnType::Int16 => DataType::Int16,
            ColumnType::Int32 => DataType::Int32,
            ColumnType::Int64 | ColumnType::Oid => DataType::Int64,
            ColumnType::Float32 => DataType::Float32,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::Decimal { precision, scale } => DataType::Decimal128(*precision, *scale),
            ColumnType::Bytea => DataType::Binary,
            ColumnType::Date => DataType::Date32,
            ColumnType::Time => DataType::Time64(TimeUnit::Microsecond),
            ColumnType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            ColumnType::TimestampTz => {
                DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from("+00:00")))
            }
            ColumnType::Uuid => DataType::FixedSizeBinary(16),
            ColumnType::Domain { base, .. } => base.data_type(),
            ColumnType::List(element) => {
                DataType::List(Arc::new(Field::new("element", element.data_type(), true)))
            }
            ColumnType::NumericText { .. }
            | ColumnType::Text { .. }
            | ColumnType::TimeTz
            | ColumnType::Json
            | ColumnType::Jsonb
            | ColumnType::Interval
            | ColumnType::Enum { .. }
            | ColumnType::TextFallback { .. } => DataType::Utf8,
        }
    }

    /// The Postgres type as users know it, for `Column::source_type` and messages: `int4`,
    /// `numeric(12,2)`, `int4[]`, `mood (enum)`.
    pub fn source_name(&self) -> String {
        let fixed = match self {
            ColumnType::Bool => "bool",
            ColumnType::Int16 => "int2",
            ColumnType::Int32 => "int4",
            ColumnType::Int64 => "int8",
            ColumnType::Oid => "oid",
            ColumnType::Float32 => "float4",
            ColumnType::Float64 => "float8",
            ColumnType::Bytea => "bytea",
            ColumnType::Date => "date",
            ColumnType::Time => "time",
            ColumnType::TimeTz => "timetz",
            ColumnType::Timestamp => "timestamp",
            ColumnType::TimestampTz => "timestamptz",
            ColumnType::Uuid => "uuid",
            ColumnType::Json => "json",
            ColumnType::Jsonb => "jsonb",
            ColumnType::Interval => "interval",
            ColumnType::Decimal { precision, scale } => {
                return format!("numeric({precision},{scale})")
            }
            ColumnType::NumericText { type_name }
            | ColumnType::Text { type_name }
            | ColumnType::TextFallback { type_name } => return type_name.clone(),
            ColumnType::Enum { type_name } => return format!("{type_name} (enum)"),
            ColumnType::Domain { type_name, base } => {
                return format!("{type_name} (domain over {})", base.source_name())
            }
            ColumnType::List(element) => return format!("{}[]", element.source_name()),
        };
        fixed.to_owned()
    }

    /// Appends one non-NULL text-format value to `builder`, which must be the builder
    /// `arrow_array::builder::make_builder(&self.data_type(), n)` returns. NULLs are appended by
    /// the caller (`changelog::append_null`).
    pub fn append_text(
        &self,
        builder: &mut dyn ArrayBuilder,
        value: &[u8],
    ) -> Result<(), ValueError> {
        let bad = |reason| ValueError::invalid(self, value, reason);
        match self {
            ColumnType::Bool => {
                let v = match value {
                    b"t" | b"true" => true,
                    b"f" | b"false" => false,
                    _ => return Err(bad("is not a boolean (t/f)")),
                };
                self.builder::<BooleanBuilder>(builder, "BooleanBuilder")?
                    .append_value(v);
            }
            ColumnType::Int16 => {
                let v = text::parse_i64(value).ok_or_else(|| bad("is not an integer"))?;
                let v = i16::try_from(v).map_err(|_| bad("is out of range"))?;
                self.builder::<Int16Builder>(builder, "Int16Builder")?
                    .append_value(v);
            }
            ColumnType::Int32 => {
                let v = text::parse_i64(value).ok_or_else(|| bad("is not an integer"))?;
                let v = i32::try_from(v).map_err(|_| bad("is out of range"))?;
                self.builder::<Int32Builder>(builder, "Int32Builder")?
                    .append_value(v);
            }
            ColumnType::Int64 | ColumnType::Oid => {
                let v = text::parse_i64(value).ok_or_else(|| bad("is not an integer"))?;
                self.builder::<Int64Builder>(builder, "Int64Builder")?
                    .append_value(v);
            }
            ColumnType::Float32 => {
                let v = text::utf8(value)
                    .and_then(|s| s.parse::<f32>().ok())
                    .ok_or_else(|| bad("is not a float"))?;
                self.builder::<Float32Builder>(builder, "Float32Builder")?
                    .append_value(v);
            }
            ColumnType::Float64 => {
                let v = text::utf8(value)
                    .and_then(|s| s.parse::<f64>().ok())
                    .ok_or_else(|| bad("is not a float"))?;
                self.builder::<Float64Builder>(builder, "Float64Builder")?
                    .append_value(v);
            }
            ColumnType::Decimal { precision, scale } => {
                let v = text::parse_decimal(value, *precision, *scale).map_err(bad)?;
                self.builder::<Decimal128Builder>(builder, "Decimal128Builder")?
                    .append_value(v);
            }
            ColumnType::Bytea => {
                let b = self.builder::<BinaryBuilder>(builder, "BinaryBuilder")?;
                text::append_bytea(b, value).map_err(bad)?;
            }
            ColumnType::Date => {
                let v = text::parse_date(value).map_err(bad)?;
                self.builder::<Date32Builder>(builder, "Date32Builder")?
                    .append_value(v);
            }
            ColumnType::Time => {
                let v = text::parse_time(value).map_err(bad)?;
                self.builder::<Time64MicrosecondBuilder>(builder, "Time64MicrosecondBuilder")?
                    .append_value(v);
            }
            ColumnType::Timestamp | ColumnType::TimestampTz => {
                let with_offset = matches!(self, ColumnType::TimestampTz);
                let v = text::parse_timestamp(value, with_offset).map_err(bad)?;
                self.builder::<TimestampMicrosecondBuilder>(
                    builder,
                    "TimestampMicrosecondBuilder",
                )?
                .append_value(v);
            }
            ColumnType::Uuid => {
                let v = text::parse_uuid(value).ok_or_else(|| bad("is not a UUID"))?;
                self.builder::<FixedSizeBinaryBuilder>(builder, "FixedSizeBinaryBuilder")?
                    .append_value(v)
                    .map_err(|_| ValueError::Builder {
                        type_name: self.source_name(),
                        expected: "FixedSizeBinaryBuilder(16)",
                    })?;
            }
            ColumnType::Domain { base, .. } => base.append_text(builder, value)?,
            ColumnType::List(element) => {
                let b =
                    self.builder::<ListBuilder<Box<dyn ArrayBuilder>>>(builder, "ListBuilder")?;
                append_array(element, b, value)?;
            }
            ColumnType::NumericText { .. }
            | ColumnType::Text { .. }
            | ColumnType::TimeTz
            | ColumnType::Json
            | ColumnType::Jsonb
            | ColumnType::Interval
            | ColumnType::Enum { .. }
            | ColumnType::TextFallback { .. } => {
                let v = text::utf8(value).ok_or_else(|| bad("is not valid UTF-8"))?;
                self.builder::<StringBuilder>(builder, "StringBuilder")?
                    .append_value(v);
            }
        }
        Ok(())
    }

    fn builder<'b, B: ArrayBuilder>(
        &self,
        builder: &'b mut dyn ArrayBuilder,
        expected: &'static str,
    ) -> Result<&'b mut B, ValueError> {
        builder
            .as_any_mut()
            .downcast_mut::<B>()
            .ok_or_else(|| ValueError::Builder {
                type_name: self.source_name(),
                expected,
            })
    }
}

/// `numeric` with typmod `((p << 16) | (s & 0x7ff)) + VARHDRSZ`; the scale is an 11-bit signed
/// field since Postgres 15 (`numeric.c`, `NUMERIC_TYPMOD_SCALE`).
fn numeric(typmod: i32) -> ColumnType {
    if typmod < VARHDRSZ {
        return ColumnType::NumericText {
            type_name: "numeric".into(),
        };
    }
    let m = typmod - VARHDRSZ;
    let p = (m >> 16) & 0xffff;
    let s = ((m & 0x7ff) ^ 1024) - 1024;
    // Negative scale: values are whole numbers of up to p - s digits. Scale above precision:
    // values are below 10^(p-s), so `s` digits all after the point hold them.
    let (precision, scale) = if s < 0 { (p - s, 0) } else { (p.max(s), s) };
    match (u8::try_from(precision), i8::try_from(scale)) {
        (Ok(precision), Ok(scale))
            if (1..=MAX_DECIMAL_PRECISION).contains(&i32::from(precision)) =>
        {
            ColumnType::Decimal { precision, scale }
        }
        _ => ColumnType::NumericText {
            type_name: format!("numeric({p},{s})"),
        },
    }
}

/// PostGIS `geometry`/`geography` named with its typmod as `format_type` shows it
/// (`geometry(PointZ,4326)`): the SRID is what a sink storing the column as a geometry takes its
/// CRS from. PostGIS `gserialized.h`: SRID in bits 8–28 (sign in bit 28), the shape in bits 2–7,
/// Z bit 1, M bit 0.
fn postgis_name(type_name: String, typmod: i32) -> String {
    if typmod < 0 {
        return type_name;
    }
    let srid = ((typmod & 0x0FFF_FF00) - (typmod & 0x1000_0000)) >> 8;
    let shape = match (typmod & 0xFC) >> 2 {
        1 => "Point",
        2 => "LineString",
        3 => "Polygon",
        4 => "MultiPoint",
        5 => "MultiLineString",
        6 => "MultiPolygon",
        7 => "GeometryCollection",
        _ => "Geometry",
    };
    let z = if typmod & 2 != 0 { "Z" } else { "" };
    let m = if typmod & 1 != 0 { "M" } else { "" };
    match srid {
        0 => format!("{type_name}({shape}{z}{m})"),
        srid => format!("{type_name}({shape}{z}{m},{srid})"),
    }
}

/// `name`, schema-qualified unless it lives in `pg_catalog` or `public`.
fn qualified(info: &TypeInfo) -> String {
    let name = info
        .name
        .strip_prefix('_')
        .filter(|_| info.element.is_some());
    let name = match name {
        Some(element) => format!("{element}[]"),
        None => info.name.clone(),
    };
    match info.namespace.as_str() {
        "pg_catalog" | "public" | "" => name,
        ns => format!("{ns}.{name}"),
    }
}

/// Parses Postgres's array output (`array_out`): `{1,2,NULL}`, `{"a b","x\"y",NULL}`, `{}`,
/// optionally prefixed by its bounds (`[2:3]={1,2}`), and appends one list.
fn append_array(
    element: &ColumnType,
    list: &mut ListBuilder<Box<dyn ArrayBuilder>>,
    value: &[u8],
) -> Result<(), ValueError> {
    let array_ty = || ColumnType::List(Box::new(element.clone()));
    let bad = |reason| ValueError::invalid(&array_ty(), value, reason);
    let mut body = value;
    if body.first() == Some(&b'[') {
        // Bounds decoration: one `[lo:hi]` per dimension, then `=`.
        let eq = body
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| bad("has unterminated array bounds"))?;
        let bounds = body.get(..eq).unwrap_or_default();
        if bounds.iter().filter(|&&b| b == b'[').count() > 1 {
            return Err(bad("is a multi-dimensional array"));
        }
        body = body.get(eq + 1..).unwrap_or_default();
    }
    let inner = match body {
        [b'{', inner @ .., b'}'] => inner,
        _ => return Err(bad("is not an array literal {…}")),
    };
    let mut rest = text::trim_start(inner);
    if rest.is_empty() {
        list.append(true);
        return Ok(());
    }
    loop {
        let (item, after) = text::array_item(rest).map_err(bad)?;
        let values = list.values();
        match item {
            text::ArrayItem::Null => {
                append_null(values.as_mut()).map_err(|_| ValueError::Builder {
                    type_name: array_ty().source_name(),
                    expected: "nullable element builder",
                })?
            }
            text::ArrayItem::Value(v) => element.append_text(values.as_mut(), &v)?,
        }
        let after = text::trim_start(after);
        match after.split_first() {
            None => break,
            Some((b',', next)) => rest = text::trim_start(next),
            Some(_) => return Err(bad("has a malformed element")),
        }
    }
    list.append(true);
    Ok(())
}
