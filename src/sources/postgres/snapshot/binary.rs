//! COPY binary format (Postgres docs, "COPY", "Binary Format") parsed straight into changelog
//! batches: the same Arrow builders and the same values as the text path (`types.rs`), with no
//! text to parse.
//!
//! Where it sits: `snapshot.rs` runs `COPY … TO STDOUT (FORMAT binary)` for a chunk of a table
//! whose every column has a binary decoder here ([`supports_binary`]); other tables are copied in
//! text format. Pure: CopyData chunks in, batches out.
//!
//! Why binary: no escaping, no number or date parsing, and fewer bytes on the wire; each value is
//! its type's `send` output. Only types whose `send` output is stable and simple are decoded
//! here; the rest (interval, timetz, arrays, extension types) would need Postgres internals and
//! keep the text path, whose output the replication stream also uses.
//!
//! Layout: an 11-byte signature `PGCOPY\n\xff\r\n\0`, a 32-bit flags field, a 32-bit header
//! extension length and the extension; then per row a 16-bit field count (-1 ends the data) and
//! per field a 32-bit length (-1: NULL) and the bytes. All integers are big-endian.

use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder,
    FixedSizeBinaryBuilder, Float32Builder, Float64Builder, Int16Builder, Int32Builder,
    Int64Builder, StringBuilder, Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};

use super::{new_builder, BatchLimits, SnapshotError};
use crate::changelog::{Op, TableChanges, TableChangesBuilder, TableSchema};
use crate::sources::postgres::types::ColumnType;

const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";
/// Days from 1970-01-01 (Arrow's epoch) to 2000-01-01 (Postgres's).
const PG_EPOCH_DAYS: i32 = 10_957;
/// Microseconds from 1970-01-01 to 2000-01-01.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// Whether every value of `ty` can be decoded from its binary `send` output here.
pub fn supports_binary(ty: &ColumnType) -> bool {
    match ty {
        ColumnType::Bool
        | ColumnType::Int16
        | ColumnType::Int32
        | ColumnType::Int64
        | ColumnType::Oid
        | ColumnType::Float32
        | ColumnType::Float64
        | ColumnType::Decimal { .. }
        | ColumnType::NumericText { .. }
        | ColumnType::Bytea
        | ColumnType::Date
        | ColumnType::Time
        | ColumnType::Timestamp
        | ColumnType::TimestampTz
        | ColumnType::Uuid
        | ColumnType::Json
        | ColumnType::Jsonb
        | ColumnType::Enum { .. } => true,
        // `"char"` sends a raw byte where its text output escapes high bytes.
        ColumnType::Text { type_name } => type_name != "\"char\"",
        ColumnType::Domain { base, .. } => supports_binary(base),
        ColumnType::TimeTz
        | ColumnType::Interval
        | ColumnType::List(_)
        | ColumnType::TextFallback { .. } => false,
    }
}

/// Why a binary value was refused.
type Bad = &'static str;

/// Appends one non-NULL binary value of `ty` to `builder` (the builder
/// `make_builder(&ty.data_type(), n)` returns). Values equal what `ColumnType::append_text` makes
/// of the same value's text, including the date/timestamp infinity sentinels.
pub fn append_binary(ty: &ColumnType, builder: &mut dyn ArrayBuilder, v: &[u8]) -> Result<(), Bad> {
    append_column(ty, builder, std::iter::once(Some(v))).map_err(|(_, bad)| bad)
}

/// Appends a column of binary values of `ty` (`None`: NULL) to `builder`: one downcast and one
/// type dispatch per column rather than per value. On a bad value: its index in `values` and why.
fn append_column<'v>(
    ty: &ColumnType,
    builder: &mut dyn ArrayBuilder,
    values: impl Iterator<Item = Option<&'v [u8]>>,
) -> Result<(), (usize, Bad)> {
    match ty {
        ColumnType::Bool => fill(builder, values, BooleanBuilder::append_null, |b, v| {
            b.append_value(be::<1>(v)?[0] != 0);
            Ok(())
        }),
        ColumnType::Int16 => fill(builder, values, Int16Builder::append_null, |b, v| {
            b.append_value(i16::from_be_bytes(be(v)?));
            Ok(())
        }),
        ColumnType::Int32 => fill(builder, values, Int32Builder::append_null, |b, v| {
            b.append_value(i32::from_be_bytes(be(v)?));
            Ok(())
        }),
        ColumnType::Int64 => fill(builder, values, Int64Builder::append_null, |b, v| {
            b.append_value(i64::from_be_bytes(be(v)?));
            Ok(())
        }),
        ColumnType::Oid => fill(builder, values, Int64Builder::append_null, |b, v| {
            b.append_value(i64::from(u32::from_be_bytes(be(v)?)));
            Ok(())
        }),
        ColumnType::Float32 => fill(builder, values, Float32Builder::append_null, |b, v| {
            b.append_value(f32::from_be_bytes(be(v)?));
            Ok(())
        }),
        ColumnType::Float64 => fill(builder, values, Float64Builder::append_null, |b, v| {
            b.append_value(f64::from_be_bytes(be(v)?));
            Ok(())
        }),
        ColumnType::Decimal { precision, scale } => {
            fill(builder, values, Decimal128Builder::append_null, |b, v| {
                b.append_value(Numeric::parse(v)?.to_decimal(*precision, *scale)?);
                Ok(())
            })
        }
        ColumnType::NumericText { .. } => {
            fill(builder, values, StringBuilder::append_null, |b, v| {
                Numeric::parse(v)?.write_text(b);
                Ok(())
            })
        }
        ColumnType::Bytea => fill(builder, values, BinaryBuilder::append_null, |b, v| {
            b.append_value(v);
            Ok(())
        }),
        ColumnType::Date => fill(builder, values, Date32Builder::append_null, |b, v| {
            let days = match i32::from_be_bytes(be(v)?) {
                i32::MAX => i32::MAX,
                i32::MIN => -i32::MAX,
                d => d.checked_add(PG_EPOCH_DAYS).ok_or("is out of range")?,
            };
            b.append_value(days);
            Ok(())
        }),
        ColumnType::Time => fill(
            builder,
            values,
            Time64MicrosecondBuilder::append_null,
            |b, v| {
                b.append_value(i64::from_be_bytes(be(v)?));
                Ok(())
            },
        ),
        ColumnType::Timestamp | ColumnType::TimestampTz => fill(
            builder,
            values,
            TimestampMicrosecondBuilder::append_null,
            |b, v| {
                let micros = match i64::from_be_bytes(be(v)?) {
                    i64::MAX => i64::MAX,
                    i64::MIN => -i64::MAX,
                    m => m
                        .checked_add(PG_EPOCH_MICROS)
                        .filter(|m| *m != i64::MAX)
                        .ok_or(
                            "is after 294247-01-10, the end of Arrow's microsecond timestamps",
                        )?,
                };
                b.append_value(micros);
                Ok(())
            },
        ),
        ColumnType::Uuid => fill(
            builder,
            values,
            FixedSizeBinaryBuilder::append_null,
            |b, v| {
                b.append_value(be::<16>(v)?)
                    .map_err(|_| "does not fit FixedSizeBinary(16)")
            },
        ),
        ColumnType::Jsonb => fill(builder, values, StringBuilder::append_null, |b, v| {
            // jsonb_send: a version byte (1), then the text.
            let text = match v.split_first() {
                Some((1, text)) => text,
                _ => return Err("is not version-1 jsonb"),
            };
            b.append_value(utf8(text)?);
            Ok(())
        }),
        ColumnType::Text { .. } | ColumnType::Json | ColumnType::Enum { .. } => {
            fill(builder, values, StringBuilder::append_null, |b, v| {
                b.append_value(utf8(v)?);
                Ok(())
            })
        }
        ColumnType::Domain { base, .. } => append_column(base, builder, values),
        ColumnType::TimeTz
        | ColumnType::Interval
        | ColumnType::List(_)
        | ColumnType::TextFallback { .. } => Err((0, "has no binary decoder")),
    }
}

/// Appends `values` to `builder`, which must be a `B`: NULLs with `null`, the others through
/// `value`.
fn fill<'v, B: ArrayBuilder>(
    builder: &mut dyn ArrayBuilder,
    values: impl Iterator<Item = Option<&'v [u8]>>,
    null: fn(&mut B),
    mut value: impl FnMut(&mut B, &'v [u8]) -> Result<(), Bad>,
) -> Result<(), (usize, Bad)> {
    let b = builder
        .as_any_mut()
        .downcast_mut::<B>()
        .ok_or((0, "does not match the column's Arrow builder"))?;
    for (i, v) in values.enumerate() {
        match v {
            None => null(b),
            Some(v) => value(b, v).map_err(|bad| (i, bad))?,
        }
    }
    Ok(())
}

fn be<const N: usize>(v: &[u8]) -> Result<[u8; N], Bad> {
    v.try_into().map_err(|_| "has the wrong binary length")
}

fn utf8(v: &[u8]) -> Result<&str, Bad> {
    std::str::from_utf8(v).map_err(|_| "is not valid UTF-8")
}

/// `numeric_send`: ndigits, weight, sign, dscale (16 bits each), then ndigits base-10000 digits;
/// the value is Σ digit[i] × 10000^(weight − i).
struct Numeric<'a> {
    digits: &'a [u8],
    weight: i16,
    sign: u16,
    dscale: u16,
}

const NUMERIC_NEG: u16 = 0x4000;
const NUMERIC_NAN: u16 = 0xC000;
const NUMERIC_PINF: u16 = 0xD000;
const NUMERIC_NINF: u16 = 0xF000;

/// 10^0 ..= 10^38: every power a Decimal128 value or precision uses.
const POW10: [i128; 39] = {
    let mut p = [1i128; 39];
    let mut i = 1;
    while i < p.len() {
        p[i] = p[i - 1] * 10;
        i += 1;
    }
    p
};

impl<'a> Numeric<'a> {
    fn parse(v: &'a [u8]) -> Result<Self, Bad> {
        let head: [u8; 8] = v
            .get(..8)
            .and_then(|h| h.try_into().ok())
            .ok_or("is a short numeric")?;
        let ndigits = usize::from(u16::from_be_bytes([head[0], head[1]]));
        let digits = v.get(8..).ok_or("is a short numeric")?;
        if digits.len() != ndigits * 2 {
            return Err("has a numeric digit count that does not match its length");
        }
        Ok(Numeric {
            digits,
            weight: i16::from_be_bytes([head[2], head[3]]),
            sign: u16::from_be_bytes([head[4], head[5]]),
            dscale: u16::from_be_bytes([head[6], head[7]]),
        })
    }

    fn digit(&self, i: usize) -> i128 {
        match self.digits.get(2 * i..2 * i + 2) {
            Some(&[a, b]) => i128::from(i16::from_be_bytes([a, b])),
            _ => 0,
        }
    }

    fn ndigits(&self) -> usize {
        self.digits.len() / 2
    }

    /// The unscaled Decimal128 value at `scale`, if exact and within `precision` digits.
    fn to_decimal(&self, precision: u8, scale: i8) -> Result<i128, Bad> {
        match self.sign {
            NUMERIC_NAN => return Err("is NaN, which a decimal cannot hold"),
            NUMERIC_PINF | NUMERIC_NINF => return Err("is infinite, which a decimal cannot hold"),
            _ => {}
        }
        let overflow = "does not fit the column's decimal precision";
        let mut acc: i128 = 0;
        for i in 0..self.ndigits() {
            acc = acc
                .checked_mul(10_000)
                .and_then(|a| a.checked_add(self.digit(i)))
                .ok_or(overflow)?;
        }
        // The last digit's power of ten, shifted by the scale.
        let last = i32::from(self.weight) - (self.ndigits() as i32 - 1);
        let exp = last * 4 + i32::from(scale);
        let power = |n: i32| POW10.get(n.unsigned_abs() as usize).copied();
        if exp > 0 {
            acc = power(exp)
                .and_then(|p| acc.checked_mul(p))
                .ok_or(overflow)?;
        } else if exp < 0 {
            let inexact = "has more fractional digits than the column's scale";
            acc = match power(exp) {
                // One division, in u64 when it fits (an i128 division is a library call).
                Some(p) => match (u64::try_from(acc), u64::try_from(p)) {
                    (Ok(a), Ok(p)) if a % p == 0 => i128::from(a / p),
                    (Ok(_), Ok(_)) => return Err(inexact),
                    _ if acc % p == 0 => acc / p,
                    _ => return Err(inexact),
                },
                None if acc == 0 => 0,
                None => return Err(inexact),
            };
        }
        let limit = POW10.get(usize::from(precision)).ok_or(overflow)?;
        if acc >= *limit {
            return Err(overflow);
        }
        Ok(if self.sign == NUMERIC_NEG { -acc } else { acc })
    }

    /// `numeric_out`'s text: `-`, the integer digits (at least `0`), and exactly `dscale`
    /// fractional digits; `NaN`, `Infinity`, `-Infinity`.
    fn write_text(&self, out: &mut StringBuilder) {
        use std::fmt::Write;
        match self.sign {
            NUMERIC_NAN => return out.append_value("NaN"),
            NUMERIC_PINF => return out.append_value("Infinity"),
            NUMERIC_NINF => return out.append_value("-Infinity"),
            _ => {}
        }
        if self.sign == NUMERIC_NEG {
            let _ = out.write_char('-');
        }
        let weight = i32::from(self.weight);
        if weight < 0 {
            let _ = out.write_char('0');
        } else {
            for i in 0..=weight {
                let d = self.digit(i as usize);
                if i == 0 {
                    let _ = write!(out, "{d}");
                } else {
                    let _ = write!(out, "{d:04}");
                }
            }
        }
        let dscale = usize::from(self.dscale);
        if dscale > 0 {
            let _ = out.write_char('.');
            let mut written = 0;
            let mut i = weight + 1;
            while written < dscale {
                // Digit groups before the first stored one (negative weight) are zeros.
                let d = if i < 0 { 0 } else { self.digit(i as usize) };
                let group = format!("{d:04}");
                for c in group.chars().take(dscale - written) {
                    let _ = out.write_char(c);
                    written += 1;
                }
                i += 1;
            }
        }
        out.append_value("");
    }
}

/// Parses COPY binary data into batches. Same contract as the text `CopyReader`.
pub struct BinaryCopyReader<'t> {
    schema: Arc<TableSchema>,
    types: &'t [ColumnType],
    limits: BatchLimits,
    op: Op,
    builder: TableChangesBuilder,
    /// Unparsed bytes: the header, or a row split across CopyData chunks.
    carry: Vec<u8>,
    /// (offset, length) of every field of the rows found by the current parse, row by row.
    fields: Vec<(usize, i32)>,
    header_done: bool,
    ended: bool,
    rows: u64,
    batch_bytes: usize,
}

impl<'t> BinaryCopyReader<'t> {
    /// A reader for rows of `schema` whose columns decode as `types`; every row becomes a change
    /// `op` (Insert, or Update for an upsert).
    pub fn new(
        schema: Arc<TableSchema>,
        types: &'t [ColumnType],
        limits: BatchLimits,
        op: Op,
    ) -> Result<Self, SnapshotError> {
        if types.len() != schema.columns.len() {
            return Err(SnapshotError::Schema {
                table: schema.id.clone(),
                detail: format!(
                    "{} column types for {} columns",
                    types.len(),
                    schema.columns.len()
                ),
            });
        }
        Ok(BinaryCopyReader {
            builder: new_builder(&schema, limits.rows, false)?,
            schema,
            types,
            limits,
            op,
            carry: Vec::new(),
            fields: Vec::new(),
            header_done: false,
            ended: false,
            rows: 0,
            batch_bytes: 0,
        })
    }

    pub fn schema(&self) -> &Arc<TableSchema> {
        &self.schema
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn is_full(&self) -> bool {
        self.builder.len() >= self.limits.rows || self.batch_bytes >= self.limits.bytes
    }

    /// Parses whole rows of `chunk` until the batch is full or the chunk ends; a trailing partial
    /// row is kept for the next chunk. Returns the bytes consumed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<usize, SnapshotError> {
        if self.carry.is_empty() {
            let used = self.parse(chunk)?;
            if !self.is_full() {
                self.carry
                    .extend_from_slice(chunk.get(used..).unwrap_or_default());
                return Ok(chunk.len());
            }
            return Ok(used);
        }
        // Rare: a row split across messages. Join it with this chunk and parse all whole rows
        // (the batch may overfill by one message's rows), so the carry keeps only a partial row.
        self.carry.extend_from_slice(chunk);
        let carry = std::mem::take(&mut self.carry);
        let used = self.parse_all(&carry, true);
        self.carry = carry;
        let used = used?;
        self.carry.drain(..used);
        Ok(chunk.len())
    }

    pub fn take_batch(&mut self) -> Result<TableChanges, SnapshotError> {
        let next = new_builder(&self.schema, self.limits.rows, false)?;
        let full = std::mem::replace(&mut self.builder, next);
        self.batch_bytes = 0;
        full.finish().map_err(|source| SnapshotError::Arrow {
            table: self.schema.id.clone(),
            source,
        })
    }

    /// Ends the data: the last batch, if any. Data without its trailer is an error.
    pub fn finish(mut self) -> Result<Option<TableChanges>, SnapshotError> {
        if !self.ended || !self.carry.is_empty() {
            return Err(
                self.format_err("COPY binary data ended inside a row or without its trailer")
            );
        }
        if self.builder.is_empty() {
            return Ok(None);
        }
        self.take_batch().map(Some)
    }

    fn format_err(&self, detail: &str) -> SnapshotError {
        SnapshotError::Format {
            table: self.schema.id.clone(),
            row: self.rows + 1,
            detail: detail.to_owned(),
        }
    }

    /// Parses the header and whole rows from `data` while the batch has room; returns the bytes
    /// used (a partial row is left).
    fn parse(&mut self, data: &[u8]) -> Result<usize, SnapshotError> {
        self.parse_all(data, false)
    }

    fn parse_all(&mut self, data: &[u8], overfill: bool) -> Result<usize, SnapshotError> {
        let mut at = 0usize;
        if !self.header_done {
            let Some(fixed) = data.get(..19) else {
                return Ok(0);
            };
            if fixed.get(..11) != Some(SIGNATURE.as_slice()) {
                return Err(self.format_err("not COPY binary data (bad signature)"));
            }
            let ext = fixed
                .get(15..19)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_be_bytes);
            let ext = ext.unwrap_or(0) as usize;
            if data.len() < 19 + ext {
                return Ok(0);
            }
            at = 19 + ext;
            self.header_done = true;
        }
        // Two passes: find the whole rows (and every field's place) first, then decode column by
        // column, so each column's builder is downcast once per pass, not once per value.
        self.fields.clear();
        let mut rows = 0usize;
        while !self.ended && (overfill || !self.is_full_with(rows)) {
            match self.scan_row(data, at, rows)? {
                Some(next) => {
                    self.batch_bytes += next - at;
                    at = next;
                    rows += usize::from(!self.ended);
                }
                None => break,
            }
        }
        self.decode_rows(data, rows)?;
        Ok(at)
    }

    /// Whether the batch is full once `pending` scanned rows are decoded into it.
    fn is_full_with(&self, pending: usize) -> bool {
        self.builder.len() + pending >= self.limits.rows || self.batch_bytes >= self.limits.bytes
    }

    /// Finds the row at `start` if it is complete, recording each field's (offset, length) in
    /// `fields` (length -1: NULL): the offset after the row, or `None`. `pending` rows were
    /// found before it in this pass.
    fn scan_row(
        &mut self,
        data: &[u8],
        start: usize,
        pending: usize,
    ) -> Result<Option<usize>, SnapshotError> {
        let Some(count) = data.get(start..start + 2) else {
            return Ok(None);
        };
        let count = i16::from_be_bytes([count[0], count[1]]);
        if count == -1 {
            self.ended = true;
            return Ok(Some(start + 2));
        }
        if usize::try_from(count).ok() != Some(self.types.len()) {
            return Err(SnapshotError::Format {
                table: self.schema.id.clone(),
                row: self.rows + pending as u64 + 1,
                detail: format!("{count} fields for {} columns", self.types.len()),
            });
        }
        let first = self.fields.len();
        let mut at = start + 2;
        for _ in 0..self.types.len() {
            let Some(len) = data.get(at..at + 4) else {
                self.fields.truncate(first);
                return Ok(None);
            };
            let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            self.fields.push((at + 4, len));
            at += 4 + usize::try_from(len).unwrap_or(0);
            if at > data.len() {
                self.fields.truncate(first);
                return Ok(None);
            }
        }
        Ok(Some(at))
    }

    /// Appends the `rows` rows `scan_row` found in `data` to the batch.
    fn decode_rows(&mut self, data: &[u8], rows: usize) -> Result<(), SnapshotError> {
        if rows == 0 {
            return Ok(());
        }
        let first_row = self.rows;
        self.rows += rows as u64;
        self.builder.begin_rows(self.op, rows);
        let columns = self.types.len();
        for (i, ty) in self.types.iter().enumerate() {
            let Some(builder) = self.builder.values(i, rows) else {
                return Err(self.format_err(&format!("no builder for column {i}")));
            };
            let values = self
                .fields
                .get(i..)
                .unwrap_or_default()
                .iter()
                .step_by(columns)
                .map(|&(at, len)| {
                    let len = usize::try_from(len).ok()?;
                    Some(data.get(at..at + len).unwrap_or_default())
                });
            append_column(ty, builder, values).map_err(|(r, reason)| {
                let column = self
                    .schema
                    .columns
                    .get(i)
                    .map_or_else(|| i.to_string(), |c| c.name.clone());
                SnapshotError::Binary {
                    table: self.schema.id.clone(),
                    row: first_row + r as u64 + 1,
                    column,
                    type_name: ty.source_name(),
                    reason,
                }
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "binary_tests.rs"]
mod tests;
