//! Puffin writer/reader tests, and byte-compatibility with Iceberg-Java.
//!
//! The fixture `tests/fixtures/iceberg-java-dv/` was made by `scripts/make-java-dv-fixture.sh`:
//! Spark 3.5.8 + Iceberg-Java 1.10.2 created a format-v3 merge-on-read table, appended ids 0..19
//! as one Parquet file (row position = id), then ran two DELETEs: ids {3, 7, 8, 9, 15} (Puffin #1,
//! an array container), then ids 12..=19 (Puffin #2: Java merged the first vector in; run-length
//! encoding made a run container). Checked here against that fixture:
//!
//! * (a) our reader parses both of Java's Puffin footers, and each vector holds exactly the
//!   positions Spark deleted: the `_pos` values Spark reported for the deleted ids (recorded in
//!   `expected.json`), and the positions of those ids in the Parquet file read here;
//! * (b) re-encoding those positions gives blob bytes identical to Java's, and our writer's footer
//!   entry for the same data file equals Java's (type, fields `[2147483645]`, snapshot-id and
//!   sequence-number -1, offset 4, length, both properties in Java's order); given Java's
//!   `created-by`, our whole Puffin file equals Java's byte for byte;
//! * (c) in every snapshot's delete manifest, the live DV entry's `referenced_data_file`,
//!   `content_offset`, `content_size_in_bytes`, `record_count` and `file_size_in_bytes` equal the
//!   Puffin footer's `referenced-data-file`, blob offset, blob length, `cardinality` and the file's
//!   size; in snapshot 3 the first vector's entry is DELETED and the second ADDED;
//! * `many-deletes.puffin`, from a second table of 200,000 rows: 73,337 positions in four 16-bit
//!   containers (bitmap, run made from a bitmap, run, array) decode to exactly the rule's ids, and
//!   re-encode to Java's blob and (with Java's `created-by`) Java's whole file.
//!
//! Independent readers of the fixture table at generation time (`expected.json`): Spark 8 rows,
//! DuckDB 1.5.5 8 rows, pyiceberg 0.12.0 8 rows, the same ids {0, 1, 2, 4, 5, 6, 10, 11}; of the
//! 200,000-row table, all three read 126,663 rows.

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use iceberg::spec::{
    DataContentType, DataFileFormat, FormatVersion, Manifest, ManifestContentType, ManifestList,
    ManifestStatus, TableMetadata,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;

use super::*;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/iceberg-java-dv")
}

fn expected() -> Value {
    serde_json::from_slice(&std::fs::read(fixture().join("expected.json")).unwrap()).unwrap()
}

/// A location recorded in the fixture's metadata (absolute, at generation time) → the file in the
/// fixture directory.
fn local(location: &str) -> PathBuf {
    let exp = expected();
    let table = exp["table_location"]
        .as_str()
        .unwrap()
        .trim_start_matches("file:");
    let rel = location
        .trim_start_matches("file:")
        .strip_prefix(table)
        .unwrap();
    fixture().join("table").join(rel.trim_start_matches('/'))
}

fn positions(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect()
}

fn sample() -> (Vec<u8>, Vec<DeletionVectorBlob>) {
    let mut w = PuffinWriter::new();
    let a = DeletionVector::from_positions([0, 5, 6, 7]).unwrap();
    let b = DeletionVector::from_positions((0..10_000).chain([1 << 32])).unwrap();
    let ba = w
        .add_deletion_vector("s3://b/t/data/a.parquet", &a)
        .unwrap();
    let bb = w
        .add_deletion_vector("s3://b/t/data/b.parquet", &b)
        .unwrap();
    assert_eq!(w.blob_count(), 2);
    (w.finish().unwrap(), vec![ba, bb])
}

#[test]
fn writer_then_reader_round_trip() {
    let (file, blobs) = sample();
    assert_eq!(&file[..4], b"PFA1");
    assert_eq!(&file[file.len() - 4..], b"PFA1");
    assert_eq!(&file[file.len() - 8..file.len() - 4], &[0, 0, 0, 0]);
    assert_eq!(blobs[0].content_offset, 4);
    assert_eq!(blobs[1].content_offset, 4 + blobs[0].content_size_in_bytes);
    assert_eq!(blobs[0].cardinality, 4);
    assert_eq!(blobs[1].cardinality, 10_001);

    let r = PuffinReader::new(Bytes::from(file)).unwrap();
    assert_eq!(r.blobs().len(), 2);
    assert_eq!(
        r.metadata().properties.get(CREATED_BY),
        Some(concat!("cdcd ", env!("CARGO_PKG_VERSION")))
    );
    for (meta, placed) in r.blobs().iter().zip(&blobs) {
        assert_eq!(meta.offset, placed.content_offset);
        assert_eq!(meta.length, placed.content_size_in_bytes);
        assert_eq!((meta.snapshot_id, meta.sequence_number), (-1, -1));
        assert_eq!(meta.fields, vec![ROW_POSITION_FIELD_ID]);
        assert_eq!(meta.compression_codec, None);
        let (file, dv) = r.read_deletion_vector(meta).unwrap();
        assert_eq!(file, placed.referenced_data_file);
        assert_eq!(dv.cardinality(), placed.cardinality);
        // What a delete manifest entry points at decodes on its own.
        let raw = r
            .read_blob(placed.content_offset, placed.content_size_in_bytes)
            .unwrap();
        assert_eq!(DeletionVector::deserialize_blob(&raw).unwrap(), dv);
    }
    let b = r
        .deletion_vector_for("s3://b/t/data/b.parquet")
        .unwrap()
        .unwrap();
    assert!(b.contains(1 << 32) && b.contains(9_999) && !b.contains(10_000));
    assert!(r
        .deletion_vector_for("s3://b/t/data/c.parquet")
        .unwrap()
        .is_none());
}

#[test]
fn footer_json_uses_spec_keys() {
    let (file, _) = sample();
    let r = PuffinReader::new(Bytes::from(file.clone())).unwrap();
    let footer_start = r.blobs_end as usize;
    let json: Value = serde_json::from_slice(&file[footer_start + 4..file.len() - 12]).unwrap();
    let blob = &json["blobs"][0];
    assert_eq!(blob["type"], "deletion-vector-v1");
    assert_eq!(blob["fields"], serde_json::json!([2147483645]));
    assert_eq!(blob["snapshot-id"], -1);
    assert_eq!(blob["sequence-number"], -1);
    assert_eq!(blob["offset"], 4);
    assert!(blob.get("compression-codec").is_none());
    assert_eq!(
        blob["properties"]["referenced-data-file"],
        "s3://b/t/data/a.parquet"
    );
    assert_eq!(blob["properties"]["cardinality"], "4");
}

#[test]
fn properties_keep_their_json_order() {
    let json = r#"{"z":"1","a":"2","m":"3","a":"4"}"#;
    let p: Properties = serde_json::from_str(json).unwrap();
    assert_eq!(
        p.iter().collect::<Vec<_>>(),
        vec![("z", "1"), ("a", "4"), ("m", "3")]
    );
    assert_eq!(
        serde_json::to_string(&p).unwrap(),
        r#"{"z":"1","a":"4","m":"3"}"#
    );
    assert!(serde_json::from_str::<Properties>(r#"{"n":1}"#).is_err());
}

#[test]
fn writer_refuses_a_second_vector_for_one_data_file() {
    let mut w = PuffinWriter::new();
    let dv = DeletionVector::from_positions([1]).unwrap();
    w.add_deletion_vector("f.parquet", &dv).unwrap();
    let err = w.add_deletion_vector("f.parquet", &dv).unwrap_err();
    assert!(matches!(err, PuffinError::DuplicateDataFile { .. }));
    assert_eq!(err.kind(), "puffin_write");
    // The failed add left the file as it was.
    let r = PuffinReader::new(Bytes::from(w.finish().unwrap())).unwrap();
    assert_eq!(r.blobs().len(), 1);
}

#[test]
fn empty_file_has_only_header_and_footer() {
    let file = PuffinWriter::new().finish().unwrap();
    let r = PuffinReader::new(Bytes::from(file)).unwrap();
    assert!(r.blobs().is_empty());
    assert!(matches!(r.read_blob(4, 0), Ok(b) if b.is_empty()));
    assert!(matches!(
        r.read_blob(4, 1),
        Err(PuffinError::BlobOutOfRange { .. })
    ));
}

/// Rebuilds a file with `payload` as footer JSON and `flags`.
fn with_footer(blobs: &[u8], payload: &[u8], flags: [u8; 4]) -> Bytes {
    let mut f = MAGIC.to_vec();
    f.extend_from_slice(blobs);
    f.extend_from_slice(&MAGIC);
    f.extend_from_slice(payload);
    f.extend_from_slice(&(payload.len() as i32).to_le_bytes());
    f.extend_from_slice(&flags);
    f.extend_from_slice(&MAGIC);
    Bytes::from(f)
}

#[test]
fn malformed_files_are_typed_errors() {
    let (file, _) = sample();
    // Every truncation fails cleanly.
    for len in 0..file.len() {
        assert!(PuffinReader::new(Bytes::copy_from_slice(&file[..len])).is_err());
    }
    let mut head = file.clone();
    head[0] = b'X';
    assert!(matches!(
        PuffinReader::new(Bytes::from(head)),
        Err(PuffinError::BadMagic { offset: 0, .. })
    ));
    let mut size = file.clone();
    let at = size.len() - 12;
    size[at..at + 4].copy_from_slice(&(-1i32).to_le_bytes());
    assert!(matches!(
        PuffinReader::new(Bytes::from(size.clone())),
        Err(PuffinError::FooterSize { size: -1, .. })
    ));
    size[at..at + 4].copy_from_slice(&i32::MAX.to_le_bytes());
    assert!(matches!(
        PuffinReader::new(Bytes::from(size)),
        Err(PuffinError::FooterSize { .. })
    ));

    let ok = br#"{"blobs":[]}"#;
    assert!(PuffinReader::new(with_footer(&[], ok, [0; 4])).is_ok());
    // Reserved flag bits are ignored; the compression bit is not supported.
    assert!(PuffinReader::new(with_footer(&[], ok, [0, 0, 0, 0x80])).is_ok());
    assert!(matches!(
        PuffinReader::new(with_footer(&[], ok, [1, 0, 0, 0])),
        Err(PuffinError::CompressedFooter { .. })
    ));
    assert!(matches!(
        PuffinReader::new(with_footer(&[], b"{\"blobs\":", [0; 4])),
        Err(PuffinError::FooterJson(_))
    ));

    let blob = |extra: &str| {
        format!(
            r#"{{"blobs":[{{"type":"deletion-vector-v1","fields":[],"snapshot-id":-1,"sequence-number":-1,"offset":4,"length":20{extra}}}]}}"#
        )
    };
    let dv = DeletionVector::from_positions([1, 2])
        .unwrap()
        .serialize_blob()
        .unwrap();
    let props = r#","properties":{"referenced-data-file":"f","cardinality":"2"}"#;
    let len_ok = blob(props).replace("\"length\":20", &format!("\"length\":{}", dv.len()));
    let r = PuffinReader::new(with_footer(&dv, len_ok.as_bytes(), [0; 4])).unwrap();
    assert_eq!(
        r.read_deletion_vector(&r.blobs()[0])
            .unwrap()
            .1
            .cardinality(),
        2
    );

    // Blob beyond the blob area.
    assert!(matches!(
        PuffinReader::new(with_footer(&[0; 10], blob("").as_bytes(), [0; 4])),
        Err(PuffinError::BlobOutOfRange { .. })
    ));
    let check = |footer: String, want: &str| {
        let r = PuffinReader::new(with_footer(&dv, footer.as_bytes(), [0; 4])).unwrap();
        let err = r.read_deletion_vector(&r.blobs()[0]).unwrap_err();
        assert!(err.to_string().contains(want), "{err} lacks {want:?}");
    };
    let sized = |f: String| f.replace("\"length\":20", &format!("\"length\":{}", dv.len()));
    check(sized(blob("")), "\"referenced-data-file\" is missing");
    check(
        sized(blob(r#","properties":{"referenced-data-file":"f"}"#)),
        "\"cardinality\" is missing",
    );
    check(
        sized(blob(
            r#","properties":{"referenced-data-file":"f","cardinality":"x"}"#,
        )),
        "not a count",
    );
    check(
        sized(blob(
            r#","properties":{"referenced-data-file":"f","cardinality":"3"}"#,
        )),
        "cardinality 3 but the vector holds 2",
    );
    check(
        sized(blob(&format!(r#"{props},"compression-codec":"zstd""#))),
        "compressed with \"zstd\"",
    );
    check(
        sized(blob(props)).replace("deletion-vector-v1", "apache-datasketches-theta-v1"),
        "expected \"deletion-vector-v1\"",
    );
    let mut corrupt = dv.clone();
    corrupt[10] ^= 1;
    let r =
        PuffinReader::new(with_footer(&corrupt, sized(blob(props)).as_bytes(), [0; 4])).unwrap();
    let err = r.read_deletion_vector(&r.blobs()[0]).unwrap_err();
    assert!(matches!(err, PuffinError::DeletionVector { .. }));
    assert_eq!(err.kind(), "deletion_vector_corrupt");
}

#[tokio::test]
async fn iceberg_rust_reads_our_file() {
    let (file, blobs) = sample();
    let io = iceberg::io::FileIO::new_with_memory();
    let path = "memory:///t/data/dv.puffin";
    io.new_output(path)
        .unwrap()
        .write(Bytes::from(file))
        .await
        .unwrap();
    let reader = iceberg::puffin::PuffinReader::new(io.new_input(path).unwrap());
    let meta = reader.file_metadata().await.unwrap();
    assert_eq!(meta.blobs().len(), 2);
    for (m, placed) in meta.blobs().iter().zip(&blobs) {
        assert_eq!(m.blob_type(), iceberg::puffin::DELETION_VECTOR_V1);
        assert_eq!(
            (m.offset(), m.length()),
            (placed.content_offset, placed.content_size_in_bytes)
        );
        assert_eq!(m.snapshot_id(), -1);
        assert_eq!(
            m.properties().get(REFERENCED_DATA_FILE),
            Some(&placed.referenced_data_file)
        );
        let blob = reader.blob(m).await.unwrap();
        let dv = DeletionVector::deserialize_blob(blob.data()).unwrap();
        assert_eq!(dv.cardinality(), placed.cardinality);
    }
}

/// The Java Puffin files of the fixture, in the order Spark wrote them, with their expectations.
fn java_puffins() -> Vec<(PuffinReader, Value, Vec<u8>)> {
    let exp = expected();
    exp["deletes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let bytes = std::fs::read(local(d["file_path"].as_str().unwrap())).unwrap();
            (
                PuffinReader::new(Bytes::from(bytes.clone())).unwrap(),
                d.clone(),
                bytes,
            )
        })
        .collect()
}

#[test]
fn java_fixture_a_reader_gets_the_positions_spark_deleted() {
    let exp = expected();
    let data_file = exp["data_file"].as_str().unwrap();
    // Positions of the deleted ids in the Parquet file itself (Spark's _pos is recorded too).
    let parquet = std::fs::File::open(local(data_file)).unwrap();
    let mut ids = Vec::new();
    for batch in ParquetRecordBatchReaderBuilder::try_new(parquet)
        .unwrap()
        .build()
        .unwrap()
    {
        let batch = batch.unwrap();
        ids.extend(
            batch
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .copied(),
        );
    }
    assert_eq!(ids.len(), 20);

    let mut cumulative: Vec<u64> = Vec::new();
    for (reader, step, _) in java_puffins() {
        assert_eq!(reader.blobs().len(), 1);
        let (referenced, dv) = reader.read_deletion_vector(&reader.blobs()[0]).unwrap();
        assert_eq!(referenced, data_file);
        assert_eq!(referenced, step["referenced_data_file"].as_str().unwrap());
        // Iceberg v3 keeps one vector per data file: each new vector holds all deletes so far.
        cumulative.extend(positions(&step["deleted_positions"]));
        cumulative.sort_unstable();
        cumulative.dedup();
        assert_eq!(dv.iter().collect::<Vec<_>>(), cumulative);
        let from_parquet: Vec<u64> = ids
            .iter()
            .enumerate()
            .filter(|(_, id)| {
                step["deleted_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|d| d.as_i64() == Some(**id))
            })
            .map(|(pos, _)| pos as u64)
            .collect();
        assert!(from_parquet.iter().all(|p| dv.contains(*p)));
        let survivors: Vec<i64> = ids
            .iter()
            .enumerate()
            .filter(|(p, _)| !dv.contains(*p as u64))
            .map(|(_, id)| *id)
            .collect();
        let spark: Vec<i64> = step["ids_after"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_eq!(survivors, spark);
        assert_eq!(dv.cardinality(), step["record_count"].as_u64().unwrap());
    }
    for reader in ["spark", "duckdb", "pyiceberg"] {
        assert_eq!(exp[format!("{reader}_rows_after")], 8, "{reader}");
    }
}

#[test]
fn java_fixture_b_reencoding_is_byte_identical() {
    for (reader, _, file) in java_puffins() {
        let java = &reader.blobs()[0];
        let (referenced, dv) = reader.read_deletion_vector(java).unwrap();
        let java_blob = reader.read_blob(java.offset, java.length).unwrap();
        // From the positions alone, as the sink will build it.
        let fresh = DeletionVector::from_positions(dv.iter()).unwrap();
        assert_eq!(fresh.serialize_blob().unwrap(), java_blob.as_ref());
        // Our Puffin file for the same data file: same blob bytes at the same offset, same footer
        // entry; only `created-by` differs, so the file is as long as Java's up to that string.
        let mut w = PuffinWriter::new();
        let placed = w.add_deletion_vector(&referenced, &fresh).unwrap();
        let ours = w.finish().unwrap();
        assert_eq!(ours[..4 + java_blob.len()], file[..4 + java_blob.len()]);
        let ours = PuffinReader::new(Bytes::from(ours)).unwrap();
        assert_eq!(ours.blobs(), reader.blobs());
        // With Java's `created-by`, the whole file is Java's, byte for byte.
        let java_created_by = reader.metadata().properties.get(CREATED_BY).unwrap();
        assert!(java_created_by.starts_with("Apache Iceberg 1.10.2"));
        let mut w = PuffinWriter::new().with_created_by(java_created_by);
        w.add_deletion_vector(&referenced, &fresh).unwrap();
        assert_eq!(w.finish().unwrap(), file);
        assert_eq!(
            (placed.content_offset, placed.content_size_in_bytes),
            (java.offset, java.length)
        );
    }
    // The second vector exercised a run container (cookie 12347), the first an array container
    // (the cookie follows PFA1, length, magic, count and key: file byte 24).
    let puffins = java_puffins();
    assert_eq!(&puffins[0].2[24..28], &12346u32.to_le_bytes());
    assert_eq!(&puffins[1].2[24..26], &12347u16.to_le_bytes());
}

#[test]
fn java_fixture_c_delete_manifest_entries_match_the_footers() {
    let exp = expected();
    let meta_path = fixture()
        .join("table/metadata")
        .join(exp["metadata"].as_str().unwrap());
    let meta: TableMetadata = serde_json::from_slice(&std::fs::read(meta_path).unwrap()).unwrap();
    assert_eq!(meta.format_version(), FormatVersion::V3);
    let puffins = java_puffins();
    let mut snapshots: Vec<_> = meta.snapshots().collect();
    snapshots.sort_by_key(|s| s.sequence_number());
    assert_eq!(snapshots.len(), 3);

    for (i, snapshot) in snapshots.iter().enumerate().skip(1) {
        let list = std::fs::read(local(snapshot.manifest_list())).unwrap();
        let list = ManifestList::parse_with_version(&list, FormatVersion::V3).unwrap();
        let mut live = Vec::new();
        let mut removed = Vec::new();
        for mf in list
            .entries()
            .iter()
            .filter(|m| m.content == ManifestContentType::Deletes)
        {
            let manifest =
                Manifest::parse_avro(&std::fs::read(local(&mf.manifest_path)).unwrap()).unwrap();
            for e in manifest.entries() {
                match e.status() {
                    ManifestStatus::Deleted => removed.push(e.data_file().clone()),
                    _ => live.push(e.data_file().clone()),
                }
            }
        }
        assert_eq!(live.len(), 1, "snapshot {}", snapshot.sequence_number());
        let entry = &live[0];
        let (reader, step, file) = &puffins[i - 1];
        let blob = &reader.blobs()[0];
        assert_eq!(entry.content_type(), DataContentType::PositionDeletes);
        assert_eq!(entry.file_format(), DataFileFormat::Puffin);
        assert_eq!(entry.file_path(), step["file_path"].as_str().unwrap());
        assert_eq!(entry.file_size_in_bytes(), file.len() as u64);
        assert_eq!(
            entry.referenced_data_file().as_deref(),
            blob.properties.get(REFERENCED_DATA_FILE)
        );
        assert_eq!(entry.content_offset(), Some(blob.offset as i64));
        assert_eq!(entry.content_size_in_bytes(), Some(blob.length as i64));
        assert_eq!(
            Some(entry.record_count().to_string()),
            blob.properties.get(CARDINALITY).map(str::to_owned)
        );
        if i == 2 {
            // The merged vector replaced the first one in the same commit.
            assert_eq!(removed.len(), 1);
            assert_eq!(
                removed[0].file_path(),
                puffins[0].1["file_path"].as_str().unwrap()
            );
        } else {
            assert!(removed.is_empty());
        }
    }
}

#[test]
fn java_fixture_many_containers_are_byte_identical() {
    // 200,000 rows, position = id; deleted: `expected.json` many.rule.
    let exp = expected();
    let many = &exp["many"];
    let rule = |id: u64| {
        (id < 70_000 && id.is_multiple_of(3))
            || (100_000..150_000).contains(&id)
            || [190_001, 190_003, 199_999].contains(&id)
    };
    let file = std::fs::read(fixture().join("many-deletes.puffin")).unwrap();
    let reader = PuffinReader::new(Bytes::from(file.clone())).unwrap();
    let java = &reader.blobs()[0];
    let (referenced, dv) = reader.read_deletion_vector(java).unwrap();
    assert_eq!(referenced, many["referenced_data_file"].as_str().unwrap());
    assert!(dv.iter().eq((0..200_000).filter(|id| rule(*id))));
    assert_eq!(dv.cardinality(), many["record_count"].as_u64().unwrap());
    assert_eq!(
        (java.offset, java.length),
        (
            many["content_offset"].as_u64().unwrap(),
            many["content_size_in_bytes"].as_u64().unwrap()
        )
    );
    // Four containers with run containers among them: cookie 12347 | (4 - 1) << 16, then the
    // run-flag byte (containers 1 and 2), so the offset header is present too.
    assert_eq!(&file[24..28], &(12347u32 | (3 << 16)).to_le_bytes());
    assert_eq!(file[28], 0b0110);

    let fresh = DeletionVector::from_positions((0..200_000).filter(|id| rule(*id))).unwrap();
    let java_blob = reader.read_blob(java.offset, java.length).unwrap();
    assert_eq!(fresh.serialize_blob().unwrap(), java_blob.as_ref());
    let created_by = reader.metadata().properties.get(CREATED_BY).unwrap();
    let mut w = PuffinWriter::new().with_created_by(created_by);
    w.add_deletion_vector(&referenced, &fresh).unwrap();
    assert_eq!(w.finish().unwrap(), file);
    for reader in ["spark", "duckdb", "pyiceberg"] {
        assert_eq!(
            many[format!("{reader}_rows_after")].as_u64(),
            Some(200_000 - dv.cardinality()),
            "{reader}"
        );
    }
}
