//! COPY text format (Postgres docs, "COPY", "Text Format") parsed straight into changelog
//! batches: tab-separated fields, `\N` for NULL, backslash escapes, one row per line. Each field is
//! the type's output function, the same text pgoutput sends, so `ColumnType::append_text` parses
//! both. Pure: CopyData chunks in, batches out. Used for tables with a column that has no binary
//! decoder (`binary.rs`), and by `copy_table`.

use std::sync::Arc;

use super::{new_builder, BatchLimits, SnapshotError};
use crate::changelog::{append_null, Op, TableChanges, TableChangesBuilder, TableSchema};
use crate::sources::postgres::types::{hex_value, ColumnType};

/// Parses COPY text-format data (tab-separated fields, `\N` for NULL, backslash escapes, rows
/// ending in `\n`; Postgres docs "COPY", "Text Format") into changelog batches. Pure: CopyData
/// chunks go in, batches come out.
pub struct CopyReader<'t> {
    schema: Arc<TableSchema>,
    types: &'t [ColumnType],
    limits: BatchLimits,
    op: Op,
    builder: TableChangesBuilder,
    /// The start of a row whose end has not arrived yet.
    carry: Vec<u8>,
    /// Unescaped field text, reused for every field that has escapes.
    field: Vec<u8>,
    rows: u64,
    /// The current batch starts with the Truncate marker (only the first batch does).
    marker_in_batch: bool,
    /// COPY bytes of the rows in the current batch.
    batch_bytes: usize,
}

impl<'t> CopyReader<'t> {
    /// A reader for rows of `schema`, whose columns decode as `types` (same length and order):
    /// inserts, the first batch starting with the Truncate marker.
    pub fn new(
        schema: Arc<TableSchema>,
        types: &'t [ColumnType],
        batch_rows: usize,
    ) -> Result<Self, SnapshotError> {
        let limits = BatchLimits {
            rows: batch_rows,
            bytes: usize::MAX,
        };
        Self::with_options(schema, types, limits, true, Op::Insert)
    }

    /// A reader whose rows are changes `op` (Insert, or Update for an upsert), with a Truncate
    /// marker first if `marker`, and batches cut at `limits`.
    pub fn with_options(
        schema: Arc<TableSchema>,
        types: &'t [ColumnType],
        limits: BatchLimits,
        marker: bool,
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
        let limits = BatchLimits {
            rows: limits.rows.max(1),
            bytes: limits.bytes,
        };
        Ok(CopyReader {
            builder: new_builder(&schema, limits.rows, marker)?,
            schema,
            types,
            limits,
            op,
            carry: Vec::new(),
            field: Vec::new(),
            rows: 0,
            marker_in_batch: marker,
            batch_bytes: 0,
        })
    }

    pub fn schema(&self) -> &Arc<TableSchema> {
        &self.schema
    }

    /// Rows parsed so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Whether the current batch holds its limit of rows or bytes (take it before feeding more).
    pub fn is_full(&self) -> bool {
        self.builder.len() >= self.limits.rows + usize::from(self.marker_in_batch)
            || self.batch_bytes >= self.limits.bytes
    }

    /// Parses complete rows from the start of `chunk` until the batch is full or the chunk ends,
    /// keeping a trailing partial row for the next chunk. Returns the bytes consumed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<usize, SnapshotError> {
        let mut used = 0;
        while !self.is_full() {
            let rest = chunk.get(used..).unwrap_or_default();
            let Some(end) = rest.iter().position(|&b| b == b'\n') else {
                self.carry.extend_from_slice(rest);
                return Ok(chunk.len());
            };
            let line = rest.get(..end).unwrap_or_default();
            if self.carry.is_empty() {
                self.append_row(line)?;
            } else {
                let mut row = std::mem::take(&mut self.carry);
                row.extend_from_slice(line);
                let appended = self.append_row(&row);
                row.clear();
                self.carry = row;
                appended?;
            }
            used += end + 1;
            self.batch_bytes += end + 1;
        }
        Ok(used)
    }

    /// The rows parsed so far as a batch; the reader continues with an empty one.
    pub fn take_batch(&mut self) -> Result<TableChanges, SnapshotError> {
        let next = new_builder(&self.schema, self.limits.rows, false)?;
        self.marker_in_batch = false;
        self.batch_bytes = 0;
        let full = std::mem::replace(&mut self.builder, next);
        full.finish().map_err(|source| SnapshotError::Arrow {
            table: self.schema.id.clone(),
            source,
        })
    }

    /// Ends the data: the last batch, if it holds anything (the first batch always does: its
    /// Truncate). A row without its final newline is an error.
    pub fn finish(mut self) -> Result<Option<TableChanges>, SnapshotError> {
        if !self.carry.is_empty() {
            return Err(SnapshotError::Format {
                table: self.schema.id.clone(),
                row: self.rows + 1,
                detail: "COPY data ended inside a row".into(),
            });
        }
        if self.builder.is_empty() {
            return Ok(None);
        }
        self.take_batch().map(Some)
    }

    fn append_row(&mut self, line: &[u8]) -> Result<(), SnapshotError> {
        // The end-of-data marker of the old protocol; never data (a data backslash is `\\`).
        if line == b"\\." {
            return Ok(());
        }
        self.rows += 1;
        let row = self.rows;
        let table = &self.schema.id;
        let format_err = |detail: String| SnapshotError::Format {
            table: table.clone(),
            row,
            detail,
        };
        self.builder.begin(self.op);
        let mut fields = line.split(|&b| b == b'\t');
        for (i, ty) in self.types.iter().enumerate() {
            let field = fields.next().ok_or_else(|| {
                format_err(format!("{i} fields for {} columns", self.types.len()))
            })?;
            let builder = self
                .builder
                .value(i)
                .ok_or_else(|| format_err(format!("no builder for column {i}")))?;
            let appended = if field == b"\\N" {
                append_null(builder).map_err(|e| format_err(e.to_string()))
            } else {
                let text = if field.contains(&b'\\') {
                    unescape_copy(field, &mut self.field);
                    self.field.as_slice()
                } else {
                    field
                };
                ty.append_text(builder, text).map_err(|source| {
                    let column = self
                        .schema
                        .columns
                        .get(i)
                        .map_or_else(|| i.to_string(), |c| c.name.clone());
                    SnapshotError::Value {
                        table: table.clone(),
                        row,
                        column,
                        source: Box::new(source),
                    }
                })
            };
            appended?;
        }
        if fields.next().is_some() {
            return Err(format_err(format!(
                "more fields than the {} columns",
                self.types.len()
            )));
        }
        self.builder
            .no_old_key()
            .map_err(|e| format_err(e.to_string()))
    }
}

/// Undoes COPY text escaping into `out` (cleared first): `\b \f \n \r \t \v`, `\NNN` (1–3 octal
/// digits), `\xHH` (1–2 hex digits), and `\c` for any other `c` is `c` (Postgres docs "COPY",
/// "Text Format").
pub fn unescape_copy(field: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let mut i = 0;
    while let Some(&b) = field.get(i) {
        i += 1;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let Some(&c) = field.get(i) else {
            // A lone trailing backslash: keep it (the server never sends one).
            out.push(b'\\');
            break;
        };
        i += 1;
        match c {
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(0x0b),
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                for _ in 0..2 {
                    match field.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                // Postgres keeps the low byte of an octal escape above \377.
                out.push((v & 0xff) as u8);
            }
            b'x' if field.get(i).is_some_and(u8::is_ascii_hexdigit) => {
                let mut v = 0u8;
                for _ in 0..2 {
                    match field.get(i) {
                        Some(&d) if d.is_ascii_hexdigit() => {
                            v = v * 16 + hex_value(d);
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v);
            }
            other => out.push(other),
        }
    }
}
