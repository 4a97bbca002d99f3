//! Binlog row images read in place (pure): the fast path between a rows event's bytes and the
//! Arrow builders of the changelog.
//!
//! `mysql_common` turns every row into a `BinlogRow`: a `Vec` of owned values plus, per column and
//! per row, a `Column` carrying the schema, table and column names, with DECIMAL and TIMESTAMP
//! formatted as text that cdcd then parses back. Profiles of the MariaDB benchmark
//! (`bench/mysql_e2e.py`) put most of the source's time there. This module instead plans each
//! column's byte layout once per rows event from the TABLE_MAP ([`ImagePlan::new`]), finds where
//! each value of an image sits without copying it ([`ImagePlan::scan`]), and converts the bytes
//! straight into the column's builder ([`append_cell`]).
//!
//! The layouts are MySQL's binary row format (`sql/log_event.cc`, `Field::pack`): little-endian
//! integers and floats, DECIMAL in its packed base-10⁹ form, DATETIME2/TIMESTAMP2/TIME2 big-endian
//! with fractional bytes by precision, strings and blobs behind a 1–4 byte length. Only the
//! common layouts are planned; a table with any other column type (pre-5.6 temporal types,
//! MySQL's binary JSON, DECIMAL wider than 38 digits) or whose TABLE_MAP disagrees with the
//! catalog has no plan, and its events go through `mysql_common` as before (`assembler/mod.rs`).

use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, Date32Builder, Decimal128Builder, Float32Builder, Float64Builder,
    Int16Builder, StringBuilder, Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};
use mysql_common::binlog::events::TableMapEvent;
use mysql_common::constants::ColumnType;

use crate::changelog::append_null;
use crate::config::ZeroDate;

use super::types::{append_int, days_from_civil, push_as, Kind, ValueError};

/// How one column's value is laid out in a row image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A little-endian integer of this many bytes (TINY 1 … LONGLONG 8).
    Int(u8),
    Float,
    Double,
    /// Packed DECIMAL(precision, scale).
    Decimal {
        precision: u8,
        scale: u8,
    },
    /// DATE: 3 bytes, day | month << 5 | year << 9.
    Date,
    /// DATETIME2 with `fsp` fractional digits: 5 big-endian bytes, then (fsp + 1) / 2 bytes.
    DateTime2 {
        fsp: u8,
    },
    /// TIMESTAMP2: 4 big-endian bytes of epoch seconds, then (fsp + 1) / 2 bytes.
    Timestamp2 {
        fsp: u8,
    },
    /// TIME2: 3 big-endian bytes (sign, hour, minute, second, offset by 0x800000), then
    /// (fsp + 1) / 2 bytes of fraction.
    Time2 {
        fsp: u8,
    },
    /// YEAR: one byte, 1900 + byte (0 is YEAR 0000).
    Year,
    /// A length (1 or 2 bytes, little-endian) and that many bytes: VARCHAR, CHAR, BINARY.
    Var {
        len_bytes: u8,
    },
    /// A length of 1 to 4 bytes and that many bytes: BLOB, TEXT, GEOMETRY, MariaDB's JSON.
    Blob {
        len_bytes: u8,
    },
    /// BIT(n): (n + 7) / 8 bytes.
    Bit {
        bytes: u8,
    },
    /// ENUM: its 1-based index in 1 or 2 bytes.
    Enum {
        bytes: u8,
    },
    /// SET: a bitmask of 1 to 8 bytes.
    Set {
        bytes: u8,
    },
}

/// Bytes of a packed DECIMAL group of `n` leftover digits (MySQL's `dig2bytes`).
const DIG2BYTES: [usize; 10] = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4];
/// Digits per full 4-byte DECIMAL group.
const DIG_PER_DEC: usize = 9;

/// Buffers reused by the few conversions that build a value (SET names, latin1, BINARY padding).
#[derive(Debug, Default)]
pub struct Scratch {
    text: String,
    bytes: Vec<u8>,
}

/// Where column `i`'s value of one image is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    /// Not in this image (its bit in the image's column bitmap is clear).
    Absent,
    Null,
    /// The value's bytes are `data[start..end]` of the rows event's row data.
    At {
        start: usize,
        end: usize,
    },
}

/// Per column of one table's TABLE_MAP, the layout of its values; reused across rows events.
#[derive(Debug, Default)]
pub struct ImagePlan {
    layouts: Vec<Layout>,
}

impl ImagePlan {
    /// Plans `tme`'s columns, checking each against the catalog's `kinds`. `false` (and an empty
    /// plan) when a column needs the general path.
    pub fn plan(&mut self, tme: &TableMapEvent<'_>, kinds: &[Kind]) -> bool {
        self.layouts.clear();
        for (i, kind) in kinds.iter().enumerate() {
            match layout_of(tme, i).filter(|l| fits(kind, *l)) {
                Some(l) => self.layouts.push(l),
                None => {
                    self.layouts.clear();
                    return false;
                }
            }
        }
        true
    }

    pub fn layout(&self, column: usize) -> Option<Layout> {
        self.layouts.get(column).copied()
    }

    /// Reads one image at `*pos` of `data`: `present` are the image's columns (its bitmap's set
    /// bits, ascending); `cells[i]` says where column `i`'s value is. Advances `*pos` past it.
    pub fn scan(
        &self,
        data: &[u8],
        pos: &mut usize,
        present: &[usize],
        cells: &mut Vec<Cell>,
    ) -> Result<(), String> {
        cells.clear();
        cells.resize(self.layouts.len(), Cell::Absent);
        let null_bytes = present.len().div_ceil(8);
        let nulls = data
            .get(*pos..*pos + null_bytes)
            .ok_or_else(|| format!("row image cut short at byte {pos}"))?;
        let mut at = *pos + null_bytes;
        for (n, &col) in present.iter().enumerate() {
            let is_null = nulls.get(n / 8).is_some_and(|b| b & (1 << (n % 8)) != 0);
            let (Some(cell), Some(layout)) = (cells.get_mut(col), self.layouts.get(col)) else {
                return Err(format!("image column {col} beyond the table's columns"));
            };
            if is_null {
                *cell = Cell::Null;
                continue;
            }
            let len = value_len(*layout, data.get(at..).unwrap_or_default())
                .ok_or_else(|| format!("value of column {col} cut short at byte {at}"))?;
            let end = at + len;
            if end > data.len() {
                return Err(format!(
                    "value of column {col} runs past the event ({end} > {})",
                    data.len()
                ));
            }
            *cell = Cell::At { start: at, end };
            at = end;
        }
        *pos = at;
        Ok(())
    }
}

/// The layout of `tme`'s column `i`, if this module reads it.
fn layout_of(tme: &TableMapEvent<'_>, i: usize) -> Option<Layout> {
    use ColumnType::*;
    let ty = tme.get_column_type(i).ok()??;
    let meta = tme.get_column_metadata(i).unwrap_or_default();
    let m0 = meta.first().copied();
    let m1 = meta.get(1).copied();
    Some(match ty {
        MYSQL_TYPE_TINY => Layout::Int(1),
        MYSQL_TYPE_SHORT => Layout::Int(2),
        MYSQL_TYPE_INT24 => Layout::Int(3),
        MYSQL_TYPE_LONG => Layout::Int(4),
        MYSQL_TYPE_LONGLONG => Layout::Int(8),
        MYSQL_TYPE_FLOAT => Layout::Float,
        MYSQL_TYPE_DOUBLE => Layout::Double,
        MYSQL_TYPE_NEWDECIMAL => Layout::Decimal {
            precision: m0?,
            scale: m1?,
        },
        MYSQL_TYPE_NEWDATE | MYSQL_TYPE_DATE => Layout::Date,
        MYSQL_TYPE_DATETIME2 => Layout::DateTime2 { fsp: m0? },
        MYSQL_TYPE_TIMESTAMP2 => Layout::Timestamp2 { fsp: m0? },
        MYSQL_TYPE_TIME2 => Layout::Time2 { fsp: m0? },
        MYSQL_TYPE_YEAR => Layout::Year,
        MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING => {
            let max = u16::from(m0?) | (u16::from(m1?) << 8);
            Layout::Var {
                len_bytes: if max < 256 { 1 } else { 2 },
            }
        }
        MYSQL_TYPE_STRING => {
            // CHAR(n)/BINARY(n): meta is (real type | high length bits, length low byte); a
            // length of 256 or more (4-byte charsets) takes a 2-byte prefix.
            let (b0, b1) = (usize::from(m0?), usize::from(m1?));
            let max = if b0 & 0x30 != 0x30 {
                b1 | (((b0 & 0x30) ^ 0x30) << 4)
            } else {
                b1
            };
            Layout::Var {
                len_bytes: if max < 256 { 1 } else { 2 },
            }
        }
        MYSQL_TYPE_TINY_BLOB
        | MYSQL_TYPE_MEDIUM_BLOB
        | MYSQL_TYPE_LONG_BLOB
        | MYSQL_TYPE_BLOB
        | MYSQL_TYPE_GEOMETRY => match m0? {
            n @ 1..=4 => Layout::Blob { len_bytes: n },
            _ => return None,
        },
        MYSQL_TYPE_BIT => {
            let bits = usize::from(m1?) * 8 + usize::from(m0?);
            Layout::Bit {
                bytes: u8::try_from(bits.div_ceil(8)).ok()?,
            }
        }
        MYSQL_TYPE_ENUM => match m1? {
            n @ 1..=2 => Layout::Enum { bytes: n },
            _ => return None,
        },
        MYSQL_TYPE_SET => match m1? {
            n @ 1..=8 => Layout::Set { bytes: n },
            _ => return None,
        },
        _ => return None,
    })
}

/// Whether [`append_cell`] converts `layout` for a column of `kind`.
fn fits(kind: &Kind, layout: Layout) -> bool {
    match (kind, layout) {
        (Kind::Int { bits, .. }, Layout::Int(w)) => u32::from(w) * 8 == *bits,
        (Kind::BigUnsigned, Layout::Int(8)) => true,
        (
            Kind::Decimal { precision, scale },
            Layout::Decimal {
                precision: p,
                scale: s,
            },
        ) => *precision <= 38 && p <= 38 && i16::from(*scale) >= i16::from(s),
        (Kind::Float, Layout::Float) | (Kind::Double, Layout::Double) => true,
        (Kind::Date, Layout::Date) => true,
        (
            Kind::DateTime | Kind::Timestamp,
            Layout::DateTime2 { fsp } | Layout::Timestamp2 { fsp },
        ) => fsp <= 6,
        (Kind::Time, Layout::Time2 { fsp }) => fsp <= 6,
        (Kind::Year, Layout::Year) => true,
        (
            Kind::Text { .. } | Kind::Json | Kind::Binary | Kind::FixedBinary(_),
            Layout::Var { .. } | Layout::Blob { .. },
        ) => true,
        (Kind::Geometry(_), Layout::Blob { .. }) => true,
        (Kind::Bit | Kind::Binary, Layout::Bit { .. }) => true,
        (Kind::Enum(_), Layout::Enum { .. }) | (Kind::Set(_), Layout::Set { .. }) => true,
        _ => false,
    }
}

fn le_uint(b: &[u8], n: usize) -> Option<u64> {
    let bytes = b.get(..n)?;
    Some(
        bytes
            .iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)),
    )
}

fn be_uint(b: &[u8]) -> u64 {
    b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
}

/// Bytes of a packed DECIMAL(precision, scale).
fn decimal_len(precision: u8, scale: u8) -> usize {
    let (p, s) = (usize::from(precision), usize::from(scale));
    let intg = p.saturating_sub(s);
    let pick = |n: usize| DIG2BYTES.get(n).copied().unwrap_or(4);
    (intg / DIG_PER_DEC) * 4
        + pick(intg % DIG_PER_DEC)
        + (s / DIG_PER_DEC) * 4
        + pick(s % DIG_PER_DEC)
}

/// The length of the value at the start of `b`.
fn value_len(layout: Layout, b: &[u8]) -> Option<usize> {
    Some(match layout {
        Layout::Int(w) => usize::from(w),
        Layout::Float => 4,
        Layout::Double => 8,
        Layout::Decimal { precision, scale } => decimal_len(precision, scale),
        Layout::Date => 3,
        Layout::DateTime2 { fsp } => 5 + usize::from(fsp).div_ceil(2),
        Layout::Timestamp2 { fsp } => 4 + usize::from(fsp).div_ceil(2),
        Layout::Time2 { fsp } => 3 + usize::from(fsp).div_ceil(2),
        Layout::Year => 1,
        Layout::Var { len_bytes } | Layout::Blob { len_bytes } => {
            let n = usize::from(len_bytes);
            n + usize::try_from(le_uint(b, n)?).ok()?
        }
        Layout::Bit { bytes } | Layout::Enum { bytes } | Layout::Set { bytes } => {
            usize::from(bytes)
        }
    })
}

/// A packed DECIMAL as an integer scaled by 10^scale (MySQL `bin2decimal`): groups of 9 digits
/// in 4 big-endian bytes, a shorter leading and trailing group, the sign in the first bit
/// (inverted), and every byte inverted for negatives.
pub fn decimal_from_bin(b: &[u8], precision: u8, scale: u8) -> Option<i128> {
    let len = decimal_len(precision, scale);
    let mut buf = [0u8; 32];
    let raw = b.get(..len)?;
    buf.get_mut(..len)?.copy_from_slice(raw);
    let bytes = buf.get_mut(..len)?;
    let first = bytes.first_mut()?;
    let negative = *first & 0x80 == 0;
    *first ^= 0x80;
    if negative {
        for x in bytes.iter_mut() {
            *x = !*x;
        }
    }
    let (p, s) = (usize::from(precision), usize::from(scale));
    let intg = p.saturating_sub(s);
    let (lead, tail) = (intg % DIG_PER_DEC, s % DIG_PER_DEC);
    let width = |digits: usize| DIG2BYTES.get(digits).copied().unwrap_or(4);
    // (groups, digits each, bytes each): the leading int group, the full int groups, the full
    // fraction groups, the trailing fraction group.
    let groups = [
        (usize::from(lead > 0), lead, width(lead)),
        (intg / DIG_PER_DEC, DIG_PER_DEC, 4),
        (s / DIG_PER_DEC, DIG_PER_DEC, 4),
        (usize::from(tail > 0), tail, width(tail)),
    ];
    let mut v: i128 = 0;
    let mut at = 0;
    for (count, digits, bytes_each) in groups {
        let base = 10i128.pow(u32::try_from(digits).ok()?);
        for _ in 0..count {
            let g = be_uint(bytes.get(at..at + bytes_each)?);
            at += bytes_each;
            v = v.checked_mul(base)?.checked_add(i128::from(g))?;
        }
    }
    Some(if negative { -v } else { v })
}

/// Appends the value `b` (its bytes, as [`ImagePlan::scan`] found them) of a column of `kind`
/// laid out as `layout`.
pub fn append_cell(
    builder: &mut dyn ArrayBuilder,
    kind: &Kind,
    layout: Layout,
    b: &[u8],
    zero_date: ZeroDate,
    scratch: &mut Scratch,
) -> Result<(), ValueError> {
    let any = builder.as_any_mut();
    let short = || {
        ValueError(format!(
            "{layout:?} value of {} bytes is too short",
            b.len()
        ))
    };
    macro_rules! push {
        ($b:ty, $v:expr) => {
            push_as!(any, kind, $b, $v)
        };
    }
    match (kind, layout) {
        (Kind::Int { unsigned, .. }, Layout::Int(w)) => {
            let n = usize::from(w);
            let raw = le_uint(b, n).ok_or_else(short)?;
            let v = if *unsigned || n == 8 {
                raw as i64
            } else {
                // Sign-extend from the column's width.
                let shift = 64 - 8 * n as u32;
                ((raw << shift) as i64) >> shift
            };
            append_int(any, v, kind)
        }
        (Kind::BigUnsigned, Layout::Int(8)) => {
            push!(
                Decimal128Builder,
                i128::from(le_uint(b, 8).ok_or_else(short)?)
            )
        }
        (
            Kind::Decimal { scale, .. },
            Layout::Decimal {
                precision: p,
                scale: s,
            },
        ) => {
            let v = decimal_from_bin(b, p, s).ok_or_else(short)?;
            let up = u32::try_from(i16::from(*scale) - i16::from(s)).unwrap_or(0);
            let v = v
                .checked_mul(10i128.pow(up))
                .ok_or_else(|| ValueError(format!("DECIMAL {v} out of range for {kind:?}")))?;
            push!(Decimal128Builder, v)
        }
        (Kind::Float, Layout::Float) => {
            let raw = u32::try_from(le_uint(b, 4).ok_or_else(short)?).unwrap_or(0);
            push!(Float32Builder, f32::from_bits(raw))
        }
        (Kind::Double, Layout::Double) => {
            push!(
                Float64Builder,
                f64::from_bits(le_uint(b, 8).ok_or_else(short)?)
            )
        }
        (Kind::Date, Layout::Date) => {
            let v = le_uint(b, 3).ok_or_else(short)?;
            let (y, m, d) = ((v >> 9) as u16, ((v >> 5) & 15) as u8, (v & 31) as u8);
            match days_from_civil(y, m, d) {
                Some(days) => push!(Date32Builder, days),
                None => zero(builder, zero_date, format_args!("{y:04}-{m:02}-{d:02}")),
            }
        }
        (Kind::DateTime | Kind::Timestamp, Layout::DateTime2 { fsp }) => {
            // 1 sign bit (set for non-negative), 17 bits year*13+month, 5 day, 5 hour, 6 minute,
            // 6 second; then the fraction.
            let packed = be_uint(b.get(..5).ok_or_else(short)?) as i64 - 0x80_0000_0000;
            let frac = b
                .get(5..5 + usize::from(fsp).div_ceil(2))
                .ok_or_else(short)?;
            let ymd = packed >> 17;
            let (ym, d) = (ymd >> 5, (ymd & 31) as u8);
            let (y, m) = ((ym / 13) as u16, (ym % 13) as u8);
            let hms = packed & 0x1_FFFF;
            let (h, mi, s) = (hms >> 12, (hms >> 6) & 63, hms & 63);
            match days_from_civil(y, m, d) {
                Some(days) => {
                    let micros = ((i64::from(days) * 24 + h) * 60 + mi) * 60 * 1_000_000
                        + s * 1_000_000
                        + fraction_micros(frac);
                    push!(TimestampMicrosecondBuilder, micros)
                }
                None => zero(builder, zero_date, format_args!("{y:04}-{m:02}-{d:02}")),
            }
        }
        (Kind::DateTime | Kind::Timestamp, Layout::Timestamp2 { fsp }) => {
            let secs = be_uint(b.get(..4).ok_or_else(short)?) as i64;
            let frac = b
                .get(4..4 + usize::from(fsp).div_ceil(2))
                .ok_or_else(short)?;
            let us = fraction_micros(frac);
            if secs == 0 && us == 0 {
                // MySQL's zero timestamp.
                return zero(builder, zero_date, format_args!("0000-00-00 00:00:00"));
            }
            push!(TimestampMicrosecondBuilder, secs * 1_000_000 + us)
        }
        (Kind::Time, Layout::Time2 { fsp }) => {
            // Below the offset is a negative time; Iceberg's time is a time of day.
            let packed = be_uint(b.get(..3).ok_or_else(short)?) as i64 - 0x80_0000;
            let frac = b
                .get(3..3 + usize::from(fsp).div_ceil(2))
                .ok_or_else(short)?;
            let (h, m, s) = ((packed >> 12) & 0x3FF, (packed >> 6) & 63, packed & 63);
            let micros = ((h * 60 + m) * 60 + s) * 1_000_000 + fraction_micros(frac);
            if packed < 0 || micros >= 86_400_000_000 {
                return Err(ValueError(format!(
                    "TIME value {}{h}:{m:02}:{s:02} is outside 00:00:00-23:59:59.999999, which an Iceberg time cannot hold",
                    if packed < 0 { "-" } else { "" },
                )));
            }
            push!(Time64MicrosecondBuilder, micros)
        }
        (Kind::Year, Layout::Year) => {
            let y = b.first().copied().ok_or_else(short)?;
            push!(Int16Builder, if y == 0 { 0 } else { 1900 + i16::from(y) })
        }
        (kind, Layout::Var { len_bytes } | Layout::Blob { len_bytes }) => {
            let v = b.get(usize::from(len_bytes)..).ok_or_else(short)?;
            append_bytes(any, kind, v, scratch)
        }
        (Kind::Bit | Kind::Binary, Layout::Bit { .. }) => push!(BinaryBuilder, b),
        (Kind::Enum(names), Layout::Enum { bytes }) => {
            let i = le_uint(b, usize::from(bytes)).ok_or_else(short)?;
            // Index 0 is the empty string MySQL stores for an invalid value.
            let name = match usize::try_from(i).ok().and_then(|i| i.checked_sub(1)) {
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
        (Kind::Set(names), Layout::Set { .. }) => {
            let text = &mut scratch.text;
            text.clear();
            for (i, name) in names.iter().enumerate() {
                if b.get(i / 8).is_some_and(|byte| byte & (1 << (i % 8)) != 0) {
                    if !text.is_empty() {
                        text.push(',');
                    }
                    text.push_str(name);
                }
            }
            push!(StringBuilder, text.as_str())
        }
        (kind, layout) => Err(ValueError(format!(
            "{layout:?} is not planned for {kind:?}"
        ))),
    }
}

/// The fraction bytes of a DATETIME2/TIMESTAMP2/TIME2 (big-endian; 1 byte for fsp 1–2 in units of
/// 10 ms, 2 bytes for 3–4 in 100 µs, 3 bytes for 5–6 in µs) as microseconds.
fn fraction_micros(frac: &[u8]) -> i64 {
    let v = be_uint(frac) as i64;
    match frac.len() {
        1 => v * 10_000,
        2 => v * 100,
        _ => v,
    }
}

/// Character and binary data: the value's bytes after its length.
fn append_bytes(
    any: &mut dyn std::any::Any,
    kind: &Kind,
    v: &[u8],
    scratch: &mut Scratch,
) -> Result<(), ValueError> {
    let wrong = || ValueError(format!("builder does not fit {kind:?}"));
    match kind {
        Kind::Text { latin1: true } => {
            // The binlog holds the column's own bytes; latin1 maps byte for byte to U+0000–U+00FF.
            scratch.text.clear();
            scratch.text.extend(v.iter().map(|&c| char::from(c)));
            let b = any.downcast_mut::<StringBuilder>().ok_or_else(wrong)?;
            b.append_value(scratch.text.as_str());
        }
        Kind::Text { latin1: false } | Kind::Json => {
            let s = std::str::from_utf8(v)
                .map_err(|e| ValueError(format!("text is not UTF-8: {e}")))?;
            let b = any.downcast_mut::<StringBuilder>().ok_or_else(wrong)?;
            b.append_value(s);
        }
        Kind::Binary | Kind::Bit => {
            let b = any.downcast_mut::<BinaryBuilder>().ok_or_else(wrong)?;
            b.append_value(v);
        }
        Kind::FixedBinary(n) => {
            // The binlog drops BINARY(n)'s trailing zero bytes: pad them back.
            let b = any.downcast_mut::<BinaryBuilder>().ok_or_else(wrong)?;
            if v.len() < *n {
                let padded = &mut scratch.bytes;
                padded.clear();
                padded.extend_from_slice(v);
                padded.resize(*n, 0);
                b.append_value(padded.as_slice());
            } else {
                b.append_value(v);
            }
        }
        Kind::Geometry(declared) => {
            let b = any.downcast_mut::<BinaryBuilder>().ok_or_else(wrong)?;
            b.append_value(crate::sources::mysql::types::geometry_wkb(v, *declared));
        }
        other => return Err(ValueError(format!("bytes are not planned for {other:?}"))),
    }
    Ok(())
}

fn zero(
    builder: &mut dyn ArrayBuilder,
    zero_date: ZeroDate,
    value: std::fmt::Arguments<'_>,
) -> Result<(), ValueError> {
    match zero_date {
        ZeroDate::Null => append_null(builder).map_err(|e| ValueError(e.to_string())),
        ZeroDate::Error => Err(ValueError(format!(
            "zero date {value} (source.zero_date = \"error\"; set it to \"null\" to write NULL)"
        ))),
    }
}

#[cfg(test)]
mod tests;
