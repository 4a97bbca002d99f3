//! Paimon manifests (Avro): `ManifestEntry` files listing data files added or deleted per bucket,
//! and manifest lists (`ManifestFileMeta`) naming the manifests of a snapshot.
//!
//! Pure encoding and decoding (bytes in, bytes out); `snapshot.rs` reads and `publish.rs` writes
//! them. Field names, order and types are Paimon's (`ManifestEntrySerializer`,
//! `DataFileMetaSerializer`, `ManifestFileMetaSerializer`; the Avro schemas below are the writer
//! schemas pypaimon 2.1 emits, captured from a table it wrote). Readers decode with the writer schema embedded in each file,
//! so optional trailing fields cdcd does not use are written as NULL.

use apache_avro::types::Value;
use apache_avro::{Codec, Reader, Schema, Writer};

/// A manifest could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ManifestError(pub String);

impl From<apache_avro::Error> for ManifestError {
    fn from(e: apache_avro::Error) -> Self {
        ManifestError(e.to_string())
    }
}

const STATS: &str = r#"[{"name":"_MIN_VALUES","type":"bytes"},{"name":"_MAX_VALUES","type":"bytes"},{"default":null,"name":"_NULL_COUNTS","type":["null",{"type":"array","items":["null","long"]}]}]"#;

fn entry_schema() -> String {
    format!(
        r#"{{"type":"record","name":"ManifestEntry","fields":[
{{"name":"_VERSION","type":"int"}},{{"name":"_KIND","type":"int"}},{{"name":"_PARTITION","type":"bytes"}},
{{"name":"_BUCKET","type":"int"}},{{"name":"_TOTAL_BUCKETS","type":"int"}},
{{"name":"_FILE","type":{{"type":"record","name":"DataFileMeta","fields":[
{{"name":"_FILE_NAME","type":"string"}},{{"name":"_FILE_SIZE","type":"long"}},{{"name":"_ROW_COUNT","type":"long"}},
{{"name":"_MIN_KEY","type":"bytes"}},{{"name":"_MAX_KEY","type":"bytes"}},
{{"name":"_KEY_STATS","type":{{"type":"record","name":"record_KEY_STATS","fields":{STATS}}}}},
{{"name":"_VALUE_STATS","type":{{"type":"record","name":"record_VALUE_STATS","fields":{STATS}}}}},
{{"name":"_MIN_SEQUENCE_NUMBER","type":"long"}},{{"name":"_MAX_SEQUENCE_NUMBER","type":"long"}},
{{"name":"_SCHEMA_ID","type":"long"}},{{"name":"_LEVEL","type":"int"}},
{{"name":"_EXTRA_FILES","type":{{"type":"array","items":"string"}}}},
{{"default":null,"name":"_CREATION_TIME","type":["null",{{"logicalType":"timestamp-millis","type":"long"}}]}},
{{"default":null,"name":"_DELETE_ROW_COUNT","type":["null","long"]}},
{{"default":null,"name":"_EMBEDDED_FILE_INDEX","type":["null","bytes"]}},
{{"default":null,"name":"_FILE_SOURCE","type":["null","int"]}},
{{"default":null,"name":"_VALUE_STATS_COLS","type":["null",{{"type":"array","items":"string"}}]}},
{{"default":null,"name":"_EXTERNAL_PATH","type":["null","string"]}},
{{"default":null,"name":"_FIRST_ROW_ID","type":["null","long"]}},
{{"default":null,"name":"_WRITE_COLS","type":["null",{{"type":"array","items":"string"}}]}},
{{"default":null,"name":"_WRITE_COLS_SEQUENCES","type":["null",{{"type":"array","items":"long"}}]}}
]}}}}]}}"#
    )
}

fn list_schema() -> String {
    format!(
        r#"{{"type":"record","name":"ManifestFileMeta","fields":[
{{"name":"_VERSION","type":"int"}},{{"name":"_FILE_NAME","type":"string"}},{{"name":"_FILE_SIZE","type":"long"}},
{{"name":"_NUM_ADDED_FILES","type":"long"}},{{"name":"_NUM_DELETED_FILES","type":"long"}},
{{"name":"_PARTITION_STATS","type":{{"type":"record","name":"record_PARTITION_STATS","fields":{STATS}}}}},
{{"name":"_SCHEMA_ID","type":"long"}},
{{"default":null,"name":"_MIN_BUCKET","type":["null","int"]}},{{"default":null,"name":"_MAX_BUCKET","type":["null","int"]}},
{{"default":null,"name":"_MIN_LEVEL","type":["null","int"]}},{{"default":null,"name":"_MAX_LEVEL","type":["null","int"]}},
{{"default":null,"name":"_MIN_ROW_ID","type":["null","long"]}},{{"default":null,"name":"_MAX_ROW_ID","type":["null","long"]}},
{{"default":null,"name":"_TOTAL_BUCKETS","type":["null","int"]}},
{{"default":null,"name":"_EXTRA_FILES","type":["null",{{"type":"array","items":"string"}}]}}
]}}"#
    )
}

/// Min/max `BinaryRow`s and per-field null counts (Paimon `SimpleStats`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stats {
    pub min: Vec<u8>,
    pub max: Vec<u8>,
    pub null_counts: Vec<i64>,
}

/// One data file (Paimon `DataFileMeta`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFileMeta {
    pub file_name: String,
    pub file_size: i64,
    pub row_count: i64,
    pub min_key: Vec<u8>,
    pub max_key: Vec<u8>,
    pub key_stats: Stats,
    pub min_sequence: i64,
    pub max_sequence: i64,
    pub schema_id: i64,
    pub level: i32,
    pub creation_time_ms: i64,
    pub delete_row_count: i64,
    /// 0 = written by a commit (APPEND), 1 = written by a compaction (Paimon `FileSource`).
    pub file_source: i32,
}

/// Whether an entry adds or removes a file (Paimon `FileKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Add = 0,
    Delete = 1,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    pub kind: FileKind,
    /// `_PARTITION`: the serialized `BinaryRow` of the file's partition values (the empty row
    /// for an unpartitioned table).
    pub partition: Vec<u8>,
    pub bucket: i32,
    pub total_buckets: i32,
    pub file: DataFileMeta,
}

/// One manifest in a manifest list (Paimon `ManifestFileMeta`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestFileMeta {
    pub file_name: String,
    pub file_size: i64,
    pub num_added: i64,
    pub num_deleted: i64,
    pub schema_id: i64,
    pub min_bucket: i32,
    pub max_bucket: i32,
    pub min_level: i32,
    pub max_level: i32,
    pub total_buckets: i32,
    /// `_PARTITION_STATS`: least and greatest partition values of the entries.
    pub partition_stats: Stats,
}

fn some(v: Value) -> Value {
    Value::Union(1, Box::new(v))
}
fn none() -> Value {
    Value::Union(0, Box::new(Value::Null))
}

fn stats_value(s: &Stats) -> Value {
    Value::Record(vec![
        ("_MIN_VALUES".into(), Value::Bytes(s.min.clone())),
        ("_MAX_VALUES".into(), Value::Bytes(s.max.clone())),
        (
            "_NULL_COUNTS".into(),
            some(Value::Array(
                s.null_counts
                    .iter()
                    .map(|&n| some(Value::Long(n)))
                    .collect(),
            )),
        ),
    ])
}

fn file_value(f: &DataFileMeta, empty_row: &[u8]) -> Value {
    let empty_stats = Stats {
        min: empty_row.to_vec(),
        max: empty_row.to_vec(),
        null_counts: Vec::new(),
    };
    Value::Record(vec![
        ("_FILE_NAME".into(), Value::String(f.file_name.clone())),
        ("_FILE_SIZE".into(), Value::Long(f.file_size)),
        ("_ROW_COUNT".into(), Value::Long(f.row_count)),
        ("_MIN_KEY".into(), Value::Bytes(f.min_key.clone())),
        ("_MAX_KEY".into(), Value::Bytes(f.max_key.clone())),
        ("_KEY_STATS".into(), stats_value(&f.key_stats)),
        // No value statistics: `_VALUE_STATS_COLS = []` tells readers none are kept.
        ("_VALUE_STATS".into(), stats_value(&empty_stats)),
        ("_MIN_SEQUENCE_NUMBER".into(), Value::Long(f.min_sequence)),
        ("_MAX_SEQUENCE_NUMBER".into(), Value::Long(f.max_sequence)),
        ("_SCHEMA_ID".into(), Value::Long(f.schema_id)),
        ("_LEVEL".into(), Value::Int(f.level)),
        ("_EXTRA_FILES".into(), Value::Array(Vec::new())),
        (
            "_CREATION_TIME".into(),
            some(Value::TimestampMillis(f.creation_time_ms)),
        ),
        (
            "_DELETE_ROW_COUNT".into(),
            some(Value::Long(f.delete_row_count)),
        ),
        ("_EMBEDDED_FILE_INDEX".into(), none()),
        ("_FILE_SOURCE".into(), some(Value::Int(f.file_source))),
        ("_VALUE_STATS_COLS".into(), some(Value::Array(Vec::new()))),
        ("_EXTERNAL_PATH".into(), none()),
        ("_FIRST_ROW_ID".into(), none()),
        ("_WRITE_COLS".into(), none()),
        ("_WRITE_COLS_SEQUENCES".into(), none()),
    ])
}

/// Encodes a manifest file.
pub fn encode_entries(
    entries: &[ManifestEntry],
    empty_row: &[u8],
) -> Result<Vec<u8>, ManifestError> {
    let schema = Schema::parse_str(&entry_schema())?;
    let mut w = Writer::with_codec(&schema, Vec::new(), Codec::Null);
    for e in entries {
        w.append(Value::Record(vec![
            ("_VERSION".into(), Value::Int(2)),
            ("_KIND".into(), Value::Int(e.kind as i32)),
            ("_PARTITION".into(), Value::Bytes(e.partition.clone())),
            ("_BUCKET".into(), Value::Int(e.bucket)),
            ("_TOTAL_BUCKETS".into(), Value::Int(e.total_buckets)),
            ("_FILE".into(), file_value(&e.file, empty_row)),
        ]))?;
    }
    Ok(w.into_inner()?)
}

/// Encodes a manifest list.
pub fn encode_list(metas: &[ManifestFileMeta]) -> Result<Vec<u8>, ManifestError> {
    let schema = Schema::parse_str(&list_schema())?;
    let mut w = Writer::with_codec(&schema, Vec::new(), Codec::Null);
    for m in metas {
        w.append(Value::Record(vec![
            ("_VERSION".into(), Value::Int(2)),
            ("_FILE_NAME".into(), Value::String(m.file_name.clone())),
            ("_FILE_SIZE".into(), Value::Long(m.file_size)),
            ("_NUM_ADDED_FILES".into(), Value::Long(m.num_added)),
            ("_NUM_DELETED_FILES".into(), Value::Long(m.num_deleted)),
            ("_PARTITION_STATS".into(), stats_value(&m.partition_stats)),
            ("_SCHEMA_ID".into(), Value::Long(m.schema_id)),
            ("_MIN_BUCKET".into(), some(Value::Int(m.min_bucket))),
            ("_MAX_BUCKET".into(), some(Value::Int(m.max_bucket))),
            ("_MIN_LEVEL".into(), some(Value::Int(m.min_level))),
            ("_MAX_LEVEL".into(), some(Value::Int(m.max_level))),
            ("_MIN_ROW_ID".into(), none()),
            ("_MAX_ROW_ID".into(), none()),
            ("_TOTAL_BUCKETS".into(), some(Value::Int(m.total_buckets))),
            ("_EXTRA_FILES".into(), none()),
        ]))?;
    }
    Ok(w.into_inner()?)
}

/// The manifest-list entry for a manifest holding `entries`, `size` bytes long, whose
/// partitions' statistics are `partition_stats`.
pub fn describe(
    file_name: String,
    size: usize,
    entries: &[ManifestEntry],
    partition_stats: Stats,
) -> ManifestFileMeta {
    let bucket = |f: fn(i32, i32) -> i32| entries.iter().map(|e| e.bucket).reduce(f).unwrap_or(0);
    let level =
        |f: fn(i32, i32) -> i32| entries.iter().map(|e| e.file.level).reduce(f).unwrap_or(0);
    ManifestFileMeta {
        file_name,
        file_size: size as i64,
        num_added: entries.iter().filter(|e| e.kind == FileKind::Add).count() as i64,
        num_deleted: entries
            .iter()
            .filter(|e| e.kind == FileKind::Delete)
            .count() as i64,
        // Paimon's ManifestFileMeta.schemaId: the newest schema among the entries' files.
        schema_id: entries.iter().map(|e| e.file.schema_id).max().unwrap_or(0),
        min_bucket: bucket(i32::min),
        max_bucket: bucket(i32::max),
        min_level: level(i32::min),
        max_level: level(i32::max),
        total_buckets: entries.first().map_or(0, |e| e.total_buckets),
        partition_stats,
    }
}

fn field<'a>(fields: &'a [(String, Value)], name: &str) -> Result<&'a Value, ManifestError> {
    let v = fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
        .ok_or_else(|| ManifestError(format!("field {name} missing")))?;
    Ok(match v {
        Value::Union(_, inner) => inner,
        other => other,
    })
}

fn long(fields: &[(String, Value)], name: &str) -> Result<i64, ManifestError> {
    match field(fields, name)? {
        Value::Long(v) | Value::TimestampMillis(v) => Ok(*v),
        Value::Int(v) => Ok(i64::from(*v)),
        Value::Null => Ok(0),
        other => Err(ManifestError(format!(
            "field {name}: expected a number, got {other:?}"
        ))),
    }
}

fn int(fields: &[(String, Value)], name: &str) -> Result<i32, ManifestError> {
    i32::try_from(long(fields, name)?)
        .map_err(|_| ManifestError(format!("field {name} out of range")))
}

fn bytes(fields: &[(String, Value)], name: &str) -> Result<Vec<u8>, ManifestError> {
    match field(fields, name)? {
        Value::Bytes(b) | Value::Fixed(_, b) => Ok(b.clone()),
        other => Err(ManifestError(format!(
            "field {name}: expected bytes, got {other:?}"
        ))),
    }
}

fn string(fields: &[(String, Value)], name: &str) -> Result<String, ManifestError> {
    match field(fields, name)? {
        Value::String(s) => Ok(s.clone()),
        other => Err(ManifestError(format!(
            "field {name}: expected a string, got {other:?}"
        ))),
    }
}

fn record<'a>(
    fields: &'a [(String, Value)],
    name: &str,
) -> Result<&'a [(String, Value)], ManifestError> {
    match field(fields, name)? {
        Value::Record(r) => Ok(r),
        other => Err(ManifestError(format!(
            "field {name}: expected a record, got {other:?}"
        ))),
    }
}

fn stats(fields: &[(String, Value)]) -> Result<Stats, ManifestError> {
    let null_counts = match field(fields, "_NULL_COUNTS")? {
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::Union(_, b) => match b.as_ref() {
                    Value::Long(n) => *n,
                    _ => 0,
                },
                Value::Long(n) => *n,
                _ => 0,
            })
            .collect(),
        _ => Vec::new(),
    };
    Ok(Stats {
        min: bytes(fields, "_MIN_VALUES")?,
        max: bytes(fields, "_MAX_VALUES")?,
        null_counts,
    })
}

fn records(data: &[u8]) -> Result<Vec<Vec<(String, Value)>>, ManifestError> {
    let reader = Reader::new(data)?;
    let mut out = Vec::new();
    for v in reader {
        match v? {
            Value::Record(r) => out.push(r),
            other => return Err(ManifestError(format!("expected a record, got {other:?}"))),
        }
    }
    Ok(out)
}

/// Decodes a manifest file.
pub fn decode_entries(data: &[u8]) -> Result<Vec<ManifestEntry>, ManifestError> {
    records(data)?
        .into_iter()
        .map(|r| {
            let f = record(&r, "_FILE")?;
            let kind = match int(&r, "_KIND")? {
                0 => FileKind::Add,
                1 => FileKind::Delete,
                k => {
                    return Err(ManifestError(format!(
                        "_KIND {k} is neither ADD nor DELETE"
                    )))
                }
            };
            Ok(ManifestEntry {
                kind,
                partition: bytes(&r, "_PARTITION")?,
                bucket: int(&r, "_BUCKET")?,
                total_buckets: int(&r, "_TOTAL_BUCKETS")?,
                file: DataFileMeta {
                    file_name: string(f, "_FILE_NAME")?,
                    file_size: long(f, "_FILE_SIZE")?,
                    row_count: long(f, "_ROW_COUNT")?,
                    min_key: bytes(f, "_MIN_KEY")?,
                    max_key: bytes(f, "_MAX_KEY")?,
                    key_stats: stats(record(f, "_KEY_STATS")?)?,
                    min_sequence: long(f, "_MIN_SEQUENCE_NUMBER")?,
                    max_sequence: long(f, "_MAX_SEQUENCE_NUMBER")?,
                    schema_id: long(f, "_SCHEMA_ID")?,
                    level: int(f, "_LEVEL")?,
                    creation_time_ms: long(f, "_CREATION_TIME").unwrap_or(0),
                    delete_row_count: long(f, "_DELETE_ROW_COUNT").unwrap_or(0),
                    file_source: int(f, "_FILE_SOURCE").unwrap_or(0),
                },
            })
        })
        .collect()
}

/// Decodes a manifest list.
pub fn decode_list(data: &[u8]) -> Result<Vec<ManifestFileMeta>, ManifestError> {
    records(data)?
        .into_iter()
        .map(|r| {
            Ok(ManifestFileMeta {
                file_name: string(&r, "_FILE_NAME")?,
                file_size: long(&r, "_FILE_SIZE")?,
                num_added: long(&r, "_NUM_ADDED_FILES")?,
                num_deleted: long(&r, "_NUM_DELETED_FILES")?,
                schema_id: long(&r, "_SCHEMA_ID")?,
                min_bucket: int(&r, "_MIN_BUCKET").unwrap_or(0),
                max_bucket: int(&r, "_MAX_BUCKET").unwrap_or(0),
                min_level: int(&r, "_MIN_LEVEL").unwrap_or(0),
                max_level: int(&r, "_MAX_LEVEL").unwrap_or(0),
                total_buckets: int(&r, "_TOTAL_BUCKETS").unwrap_or(0),
                partition_stats: stats(record(&r, "_PARTITION_STATS")?)?,
            })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn file(name: &str, level: i32) -> DataFileMeta {
        DataFileMeta {
            file_name: name.into(),
            file_size: 100,
            row_count: 3,
            min_key: vec![1, 2],
            max_key: vec![3, 4],
            key_stats: Stats {
                min: vec![1, 2],
                max: vec![3, 4],
                null_counts: vec![0],
            },
            min_sequence: 5,
            max_sequence: 7,
            schema_id: 0,
            level,
            creation_time_ms: 1_700_000_000_000,
            delete_row_count: 1,
            file_source: 0,
        }
    }

    #[test]
    fn entries_and_lists_round_trip() {
        let empty = crate::sinks::lsm::binary_row::empty_row();
        let entries = vec![
            ManifestEntry {
                kind: FileKind::Add,
                partition: empty.clone(),
                bucket: 1,
                total_buckets: 4,
                file: file("data-a.parquet", 0),
            },
            ManifestEntry {
                kind: FileKind::Delete,
                partition: empty.clone(),
                bucket: 3,
                total_buckets: 4,
                file: file("data-b.parquet", 5),
            },
        ];
        let bytes = encode_entries(&entries, &empty).unwrap();
        assert_eq!(decode_entries(&bytes).unwrap(), entries);
        let stats = Stats {
            min: empty.clone(),
            max: empty.clone(),
            null_counts: Vec::new(),
        };
        let meta = describe("manifest-x-0".into(), bytes.len(), &entries, stats);
        assert_eq!(
            (meta.min_bucket, meta.max_bucket, meta.max_level),
            (1, 3, 5)
        );
        let list = encode_list(std::slice::from_ref(&meta)).unwrap();
        assert_eq!(decode_list(&list).unwrap(), vec![meta]);
    }
}
