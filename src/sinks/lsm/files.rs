//! Data files in storage: where a bucket's file lives (`<partition dirs>bucket-<n>/<name>`
//! under the table, as a Paimon reader finds it from a manifest entry), putting a new one and
//! reading a live one back.
//!
//! The commit, the compactor, the row lookup and the append commit all write or read data files;
//! their bytes are made and parsed by `writer.rs` (pure), and only this module moves them.

use bytes::Bytes;

use super::manifest::DataFileMeta;
use super::partition::Slot;
use super::schema::FileSchemas;
use super::store;
use super::writer::{self, FileError, RunStats};
use crate::changelog::TableId;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// A data file error of `table`, saying what was being done.
pub fn file_error(table: &TableId, what: &str) -> impl FnOnce(FileError) -> SinkError {
    let table = table.clone();
    let what = what.to_owned();
    move |e| SinkError::Data {
        table,
        detail: format!("{what}: {e}"),
    }
}

/// `<partition dirs>bucket-<n>/<name>` under the table.
pub fn file_location(location: &str, slot: &Slot, name: &str) -> String {
    format!("{location}/{}/{name}", slot.dir())
}

/// A fresh data file name: a new uuid, so no two writers' files collide.
pub fn new_file_name() -> String {
    format!("data-{}-0.parquet", uuid::Uuid::new_v4())
}

/// A fresh changelog file name (Paimon's `changelog.file.prefix`, `changelog-`).
pub fn new_changelog_file_name() -> String {
    format!("changelog-{}-0.parquet", uuid::Uuid::new_v4())
}

/// Runs `work`, encoding or merging data files, on the blocking pool: a large file is CPU work
/// of a second or more, which the source's connections on the runtime workers must not wait
/// for. `task` names the work in a failure of the task, `what` in a failure of the work.
pub async fn off_runtime<T: Send + 'static>(
    table: &TableId,
    task: String,
    what: &str,
    work: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, SinkError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SinkError::Data {
            table: table.clone(),
            detail: format!("{task}: {e}"),
        })?
        .map_err(file_error(table, what))
}

/// Encodes `batch` as one Parquet run off the runtime ([`off_runtime`]); `what` names the file
/// in errors ("a data file").
async fn encode(
    table: &TableId,
    schemas: &FileSchemas,
    slot: &Slot,
    batch: arrow_array::RecordBatch,
    what: &'static str,
) -> Result<(Vec<u8>, writer::RunStats), SinkError> {
    let encode_schemas = schemas.clone();
    let task = format!("encoding {what} of {}", slot.dir());
    off_runtime(table, task, &format!("encoding {what}"), move || {
        let mut w = writer::RunWriter::new(&encode_schemas)?;
        w.write(&batch)?;
        w.finish()
    })
    .await
}

/// What [`write_file`] adds to a slot.
pub enum NewFile<'a> {
    /// A data file at `level` (its rows sorted, one per key).
    Data { level: i32 },
    /// A changelog file named `name` (its rows sorted by key; `commit/changelog.rs`).
    Changelog { name: &'a str },
}

/// Encodes `batch` off the runtime ([`off_runtime`]) and puts it as a new file of `slot`.
pub async fn write_file(
    w: &Warehouse,
    table: &TableId,
    location: &str,
    schemas: &FileSchemas,
    slot: &Slot,
    batch: arrow_array::RecordBatch,
    file: NewFile<'_>,
) -> Result<DataFileMeta, SinkError> {
    match file {
        NewFile::Data { level } => {
            let (bytes, run) = encode(table, schemas, slot, batch, "a data file").await?;
            put_run(w, table, location, slot, bytes, &run, level, 0).await
        }
        NewFile::Changelog { name } => {
            let (bytes, run) = encode(table, schemas, slot, batch, "a changelog file").await?;
            let size = bytes.len();
            store::put(w, &file_location(location, slot, name), bytes).await?;
            run.describe(name.to_owned(), size, 0, 0)
                .map_err(file_error(table, "describing a changelog file"))
        }
    }
}

/// Puts an encoded sorted run as a new data file of `slot` and describes it.
#[allow(clippy::too_many_arguments)]
pub async fn put_run(
    w: &Warehouse,
    table: &TableId,
    location: &str,
    slot: &Slot,
    bytes: Vec<u8>,
    run: &RunStats,
    level: i32,
    file_source: i32,
) -> Result<DataFileMeta, SinkError> {
    let name = new_file_name();
    let size = bytes.len();
    store::put(w, &file_location(location, slot, &name), bytes).await?;
    run.describe(name, size, level, file_source)
        .map_err(file_error(table, "describing a data file"))
}

/// The bytes of a live data file of `slot`; its absence is corruption.
pub async fn read_bytes(
    w: &Warehouse,
    location: &str,
    slot: &Slot,
    file: &DataFileMeta,
) -> Result<Bytes, SinkError> {
    let loc = file_location(location, slot, &file.file_name);
    store::read(w, &loc)
        .await?
        .ok_or_else(|| SinkError::Corrupt {
            path: loc,
            detail: "a live data file is missing".into(),
        })
}

/// Reads a live data file of `slot`.
pub async fn read_file_at(
    w: &Warehouse,
    table: &TableId,
    location: &str,
    schemas: &FileSchemas,
    slot: &Slot,
    file: &DataFileMeta,
) -> Result<arrow_array::RecordBatch, SinkError> {
    let data = read_bytes(w, location, slot, file).await?;
    let loc = file_location(location, slot, &file.file_name);
    writer::decode(data, schemas).map_err(file_error(table, &format!("reading {loc}")))
}
