//! The initial copy: a table's existing rows, read with `COPY … TO STDOUT` and parsed straight into
//! changelog batches.
//!
//! Where it sits: with `snapshot = "initial"`, the Postgres source creates its slot, which exports
//! a snapshot consistent with the slot's start; [`copy_table`] reads each captured table as of that
//! snapshot and hands the rows on as inserts (`SourceEvent::SnapshotRows`), before streaming starts
//! at the slot's consistent point. Rows therefore are neither lost nor doubled between copy and
//! stream.
//!
//! Why COPY in text format: it streams without a cursor and its text fields are exactly the types'
//! output functions, the same text pgoutput sends, so one parser ([`ColumnType::append_text`])
//! serves both paths. The session is pinned to the same settings as the replication connection
//! ([`TEXT_FORMAT_SETTINGS`]) so the text matches.
//!
//! The parsing half ([`CopyReader`]) is pure: it takes CopyData chunks as they come (a row may be
//! split across chunks) and fills a [`TableChangesBuilder`], unescaping fields into one reused
//! buffer.

use std::future::Future;
use std::sync::Arc;

use arrow_schema::ArrowError;
use futures::{pin_mut, TryStreamExt};

use super::types::{ColumnType, ValueError, TEXT_FORMAT_SETTINGS};
use crate::changelog::{append_null, Op, TableChanges, TableChangesBuilder, TableId, TableSchema};
use crate::sources::SourceError;

#[cfg(test)]
mod tests;

/// Builders are preallocated for at most this many rows, whatever `batch_rows` says.
const MAX_PREALLOCATED_ROWS: usize = 8192;

/// The copy of a table failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("initial copy of {table}: {context}: {source}")]
    Query {
        table: TableId,
        context: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("initial copy of {table}, row {row}, column {column}: {source}")]
    Value {
        table: TableId,
        /// 1-based row number within the copy.
        row: u64,
        column: String,
        #[source]
        source: Box<ValueError>,
    },
    #[error("initial copy of {table}, row {row}: {detail}")]
    Format {
        table: TableId,
        row: u64,
        detail: String,
    },
    #[error("initial copy of {table}: {detail}")]
    Schema { table: TableId, detail: String },
    #[error("initial copy of {table}: building the batch: {source}")]
    Arrow {
        table: TableId,
        #[source]
        source: ArrowError,
    },
    #[error("the pipeline stopped receiving snapshot rows")]
    Closed,
}

impl SnapshotError {
    /// A short label for `cdcd_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            SnapshotError::Query { .. } => "snapshot_query",
            SnapshotError::Value { .. } => "snapshot_value",
            SnapshotError::Format { .. } => "snapshot_format",
            SnapshotError::Schema { .. } => "snapshot_schema",
            SnapshotError::Arrow { .. } => "snapshot_arrow",
            SnapshotError::Closed => "closed",
        }
    }
}

impl From<SnapshotError> for SourceError {
    fn from(e: SnapshotError) -> Self {
        match e {
            SnapshotError::Closed => SourceError::Closed,
            SnapshotError::Query { ref table, .. }
            | SnapshotError::Value { ref table, .. }
            | SnapshotError::Format { ref table, .. }
            | SnapshotError::Schema { ref table, .. }
            | SnapshotError::Arrow { ref table, .. } => SourceError::Table {
                table: table.clone(),
                detail: e.to_string(),
            },
        }
    }
}

/// Copies `table` as seen by `snapshot_name` (a snapshot exported by the slot's creation; `None`:
/// the statement's own snapshot) and calls `emit` with a batch every `batch_rows` rows and once at
/// the end, awaiting it (that await is the backpressure). Returns the number of rows copied.
///
/// Every row is an [`Op::Insert`] with every column present and no old key. The first batch
/// starts with one [`Op::Truncate`] change (all columns absent), as `SourceEvent::SnapshotRows`
/// requires, so a retried copy replaces what an interrupted one left; an empty table yields just
/// that batch.
///
/// The client's session settings are changed to [`TEXT_FORMAT_SETTINGS`], and with a snapshot
/// name a transaction is open on it until the copy ends: give this function a connection of its
/// own. On error the transaction is rolled back (best effort) and the error names the table, and
/// for a bad value the row and column.
pub async fn copy_table<F, Fut>(
    client: &tokio_postgres::Client,
    schema: Arc<TableSchema>,
    types: &[ColumnType],
    snapshot_name: Option<&str>,
    batch_rows: usize,
    emit: F,
) -> Result<u64, SnapshotError>
where
    F: FnMut(TableChanges) -> Fut,
    Fut: Future<Output = Result<(), SnapshotError>>,
{
    let table = schema.id.clone();
    let query_err = |context| {
        let table = table.clone();
        move |source| SnapshotError::Query {
            table,
            context,
            source,
        }
    };
    let settings: String = TEXT_FORMAT_SETTINGS
        .iter()
        .map(|(name, value)| format!("SET {name} = '{value}';"))
        .collect();
    client
        .batch_execute(&settings)
        .await
        .map_err(query_err("setting the session's output formats"))?;
    if let Some(name) = snapshot_name {
        // SET TRANSACTION SNAPSHOT must be the transaction's first statement (Postgres docs,
        // "SET TRANSACTION"), and the importing transaction must be REPEATABLE READ or stricter.
        let begin = format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
            quote_literal(name)
        );
        client
            .batch_execute(&begin)
            .await
            .map_err(query_err("importing the exported snapshot"))?;
    }
    let copied = copy_rows(client, schema, types, batch_rows, emit).await;
    if snapshot_name.is_some() {
        match &copied {
            Ok(_) => client
                .batch_execute("COMMIT")
                .await
                .map_err(query_err("ending the snapshot transaction"))?,
            // The copy already failed; a failed rollback only means the connection is gone.
            Err(_) => {
                let _ = client.batch_execute("ROLLBACK").await;
            }
        }
    }
    copied
}

async fn copy_rows<F, Fut>(
    client: &tokio_postgres::Client,
    schema: Arc<TableSchema>,
    types: &[ColumnType],
    batch_rows: usize,
    mut emit: F,
) -> Result<u64, SnapshotError>
where
    F: FnMut(TableChanges) -> Fut,
    Fut: Future<Output = Result<(), SnapshotError>>,
{
    let statement = copy_statement(&schema);
    let mut reader = CopyReader::new(schema, types, batch_rows)?;
    let table = reader.schema.id.clone();
    let stream = client
        .copy_out(statement.as_str())
        .await
        .map_err(|source| SnapshotError::Query {
            table: table.clone(),
            context: "starting COPY",
            source,
        })?;
    pin_mut!(stream);
    while let Some(chunk) = stream
        .try_next()
        .await
        .map_err(|source| SnapshotError::Query {
            table: table.clone(),
            context: "reading COPY data",
            source,
        })?
    {
        let mut rest: &[u8] = &chunk;
        while !rest.is_empty() {
            let used = reader.feed(rest)?;
            rest = rest.get(used..).unwrap_or_default();
            if reader.is_full() {
                emit(reader.take_batch()?).await?;
            }
        }
    }
    let rows = reader.rows();
    if let Some(last) = reader.finish()? {
        emit(last).await?;
    }
    Ok(rows)
}

/// `COPY (SELECT "c1", "c2" FROM "schema"."table") TO STDOUT`: the columns in schema order.
fn copy_statement(schema: &TableSchema) -> String {
    let columns: Vec<String> = schema
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect();
    format!(
        "COPY (SELECT {} FROM {}.{}) TO STDOUT",
        columns.join(", "),
        quote_ident(&schema.id.namespace),
        quote_ident(&schema.id.name)
    )
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Parses COPY text-format data (tab-separated fields, `\N` for NULL, backslash escapes, rows
/// ending in `\n`; Postgres docs "COPY", "Text Format") into changelog batches. Pure: CopyData
/// chunks go in, batches come out.
pub struct CopyReader<'t> {
    schema: Arc<TableSchema>,
    types: &'t [ColumnType],
    batch_rows: usize,
    builder: TableChangesBuilder,
    /// The start of a row whose end has not arrived yet.
    carry: Vec<u8>,
    /// Unescaped field text, reused for every field that has escapes.
    field: Vec<u8>,
    rows: u64,
    /// The current batch starts with the Truncate marker (only the first batch does).
    marker_in_batch: bool,
}

impl<'t> CopyReader<'t> {
    /// A reader for rows of `schema`, whose columns decode as `types` (same length and order).
    pub fn new(
        schema: Arc<TableSchema>,
        types: &'t [ColumnType],
        batch_rows: usize,
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
        let batch_rows = batch_rows.max(1);
        Ok(CopyReader {
            builder: new_builder(&schema, batch_rows, true)?,
            schema,
            types,
            batch_rows,
            carry: Vec::new(),
            field: Vec::new(),
            rows: 0,
            marker_in_batch: true,
        })
    }

    /// Rows parsed so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Whether the current batch holds `batch_rows` rows (take it before feeding more).
    pub fn is_full(&self) -> bool {
        self.builder.len() >= self.batch_rows + usize::from(self.marker_in_batch)
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
        }
        Ok(used)
    }

    /// The rows parsed so far as a batch; the reader continues with an empty one.
    pub fn take_batch(&mut self) -> Result<TableChanges, SnapshotError> {
        let next = new_builder(&self.schema, self.batch_rows, false)?;
        self.marker_in_batch = false;
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
        self.builder.begin(Op::Insert);
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

/// An empty batch builder; `with_marker`: starting with the Truncate marker (absent columns).
fn new_builder(
    schema: &Arc<TableSchema>,
    batch_rows: usize,
    with_marker: bool,
) -> Result<TableChangesBuilder, SnapshotError> {
    let arrow = |source| SnapshotError::Arrow {
        table: schema.id.clone(),
        source,
    };
    let capacity = batch_rows.min(MAX_PREALLOCATED_ROWS) + usize::from(with_marker);
    let mut builder = TableChangesBuilder::new(schema.clone(), capacity);
    if with_marker {
        builder.begin(Op::Truncate);
        for i in 0..schema.columns.len() {
            builder.absent(i).map_err(arrow)?;
        }
        builder.no_old_key().map_err(arrow)?;
    }
    Ok(builder)
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
                            v = v * 16 + hex_digit(d);
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

fn hex_digit(d: u8) -> u8 {
    match d {
        b'0'..=b'9' => d - b'0',
        b'a'..=b'f' => d - b'a' + 10,
        b'A'..=b'F' => d - b'A' + 10,
        _ => 0,
    }
}
