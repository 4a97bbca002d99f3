//! Manifests and manifest lists: writes a commit's data manifest and delete manifest (Avro, via
//! iceberg's writers), and reads a snapshot's manifest list, manifests and live files back. The
//! manifest list of a new snapshot is written by the commit (`commit/manifest_list.rs`).
//!
//! iceberg's `ManifestWriter` writes through an `OutputFile`, which needs an iceberg `Storage`;
//! that trait is `typetag`-serialized, so rather than implement it on object_store, manifests are
//! written into iceberg's in-memory `FileIO` and the bytes are then put through the warehouse store
//! (one extra copy of a small file).
//!
//! Reading: a manifest entry's data sequence number may be null, meaning "inherit the manifest's"
//! (Iceberg spec, "Sequence Number Inheritance"); [`load_files`] resolves that.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use iceberg::io::FileIO;
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, FormatVersion, Manifest, ManifestFile,
    ManifestList, ManifestWriter, ManifestWriterBuilder, PartitionSpecRef, SchemaRef,
};
use object_store::ObjectStoreExt;

use super::writer::put_bytes;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

fn ice(context: impl Into<String>) -> impl FnOnce(iceberg::Error) -> SinkError {
    let context = context.into();
    move |source| SinkError::Iceberg { context, source }
}

/// Reads a whole object; `location` is its absolute location (for messages).
pub(crate) async fn read(warehouse: &Warehouse, location: &str) -> Result<Bytes, SinkError> {
    let path = warehouse.path(location)?;
    let storage = |source| SinkError::Storage {
        path: location.to_owned(),
        source,
    };
    let got = warehouse.store().get(&path).await.map_err(storage)?;
    got.bytes().await.map_err(storage)
}

/// What a new manifest is for: the table's format version, the snapshot writing it, and whether
/// it lists delete files.
#[derive(Debug, Clone)]
pub(crate) struct ManifestTarget {
    pub version: FormatVersion,
    pub schema: SchemaRef,
    pub spec: PartitionSpecRef,
    pub snapshot_id: i64,
    pub deletes: bool,
}

impl ManifestTarget {
    fn writer(&self, output: iceberg::io::OutputFile) -> ManifestWriter {
        let builder = ManifestWriterBuilder::new(
            output,
            Some(self.snapshot_id),
            self.schema.clone(),
            self.spec.as_ref().clone(),
        );
        match (self.version, self.deletes) {
            (FormatVersion::V3, true) => builder.build_v3_deletes(),
            (FormatVersion::V3, false) => builder.build_v3_data(),
            (_, true) => builder.build_v2_deletes(),
            (_, false) => builder.build_v2_data(),
        }
    }
}

/// Writes one manifest holding `files` as ADDED entries of `target.snapshot_id` with data
/// sequence number `sequence`.
pub(crate) async fn write_manifest(
    warehouse: &Warehouse,
    location: String,
    target: &ManifestTarget,
    sequence: i64,
    files: Vec<DataFile>,
) -> Result<ManifestFile, SinkError> {
    let known = KnownEntries::new();
    write_manifest_with(
        warehouse,
        location,
        target,
        sequence,
        files,
        (&[], &known),
        |_| false,
    )
    .await
    .map(|w| w.manifest)
}

/// A live manifest entry with what it may inherit from its manifest resolved: what a manifest
/// that carries it forward as EXISTING writes ([`carry_entries`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CarriedEntry {
    pub file: DataFile,
    pub snapshot_id: i64,
    pub sequence: i64,
    pub file_sequence: i64,
}

/// The live entries of manifests this process wrote, by manifest path (manifests are never
/// changed once written, so an entry here is right for as long as the manifest exists). A
/// commit folding one of them takes its entries from here instead of reading it back and
/// parsing its Avro, which was a tenth of a small commit's CPU (issue 37).
pub(crate) type KnownEntries = HashMap<String, Arc<[CarriedEntry]>>;

/// What [`write_manifest_with`] wrote.
pub(crate) struct Written {
    pub manifest: ManifestFile,
    /// The live entries of `olds` that `remove` accepted, left out.
    pub removed: Vec<DataFile>,
    /// Every entry of the new manifest, resolved ([`KnownEntries`]).
    pub entries: Arc<[CarriedEntry]>,
}

/// [`write_manifest`], followed by the live entries of `olds.0` (same content and spec as
/// `target`) as EXISTING entries, except those `remove` accepts ([`carry_entries`]): the
/// manifests a commit folds into its own (`commit/manifests.rs`). An old manifest found in
/// `olds.1` is not read; the others are read concurrently.
pub(crate) async fn write_manifest_with(
    warehouse: &Warehouse,
    location: String,
    target: &ManifestTarget,
    sequence: i64,
    files: Vec<DataFile>,
    olds: (&[&ManifestFile], &KnownEntries),
    remove: impl Fn(&DataFile) -> bool,
) -> Result<Written, SinkError> {
    let io = FileIO::new_with_memory();
    let output = io
        .new_output(&location)
        .map_err(ice(format!("opening {location}")))?;
    let mut writer = target.writer(output);
    // An ADDED entry inherits the manifest's sequence numbers, which the manifest list gives as
    // this commit's (`sequence`).
    let mut entries: Vec<CarriedEntry> = files
        .iter()
        .map(|f| CarriedEntry {
            file: f.clone(),
            snapshot_id: target.snapshot_id,
            sequence,
            file_sequence: sequence,
        })
        .collect();
    for f in files {
        writer
            .add_file(f, sequence)
            .map_err(ice(format!("adding a file to {location}")))?;
    }
    let (olds, known) = olds;
    let resolved = futures::future::try_join_all(olds.iter().map(|old| async move {
        match known.get(&old.manifest_path) {
            Some(entries) => Ok(Arc::clone(entries)),
            None => read_entries(warehouse, old).await.map(Arc::from),
        }
    }))
    .await?;
    let mut removed = Vec::new();
    for old_entries in &resolved {
        let (kept, gone) = carry_entries(&mut writer, &location, old_entries, &remove)?;
        entries.extend(kept);
        removed.extend(gone);
    }
    let manifest = finish_manifest(warehouse, &io, location, writer).await?;
    Ok(Written {
        manifest,
        removed,
        entries: Arc::from(entries),
    })
}

/// Rewrites manifest `old` for a new snapshot: the live entries whose file `remove` accepts are
/// left out, the other live entries stay EXISTING ([`carry_entries`]); earlier DELETED entries
/// are dropped. Returns the new manifest (`None` when nothing is left) and the removed files.
///
/// Removed entries are omitted rather than kept as DELETED (as a manifest rewrite does), so
/// readers never have to skip them and a manifest emptied by replacements disappears instead of
/// riding along in every later manifest list; scans are unaffected.
pub(crate) async fn rewrite_manifest(
    warehouse: &Warehouse,
    location: String,
    target: &ManifestTarget,
    old: &ManifestFile,
    remove: impl Fn(&DataFile) -> bool,
) -> Result<(Option<ManifestFile>, Vec<DataFile>), SinkError> {
    rewrite_manifests(warehouse, location, target, &[old], remove).await
}

/// Writes one manifest holding the live entries of `olds` (same content and partition spec, in
/// list order) as EXISTING entries ([`carry_entries`]): Iceberg's manifest merge. DELETED entries
/// are dropped: they only told readers of the snapshot that wrote them what it removed. `None`
/// when the inputs hold no live entry.
pub(crate) async fn merge_manifests(
    warehouse: &Warehouse,
    location: String,
    target: &ManifestTarget,
    olds: &[&ManifestFile],
) -> Result<Option<ManifestFile>, SinkError> {
    Ok(
        rewrite_manifests(warehouse, location, target, olds, |_| false)
            .await?
            .0,
    )
}

/// [`rewrite_manifest`] of several manifests (same content and partition spec, in list order)
/// into one: a rewrite and a merge at once.
pub(crate) async fn rewrite_manifests(
    warehouse: &Warehouse,
    location: String,
    target: &ManifestTarget,
    olds: &[&ManifestFile],
    remove: impl Fn(&DataFile) -> bool,
) -> Result<(Option<ManifestFile>, Vec<DataFile>), SinkError> {
    let io = FileIO::new_with_memory();
    let output = io
        .new_output(&location)
        .map_err(ice(format!("opening {location}")))?;
    let mut writer = target.writer(output);
    let mut kept = 0;
    let mut removed = Vec::new();
    for old in olds {
        let entries = read_entries(warehouse, old).await?;
        let (k, r) = carry_entries(&mut writer, &location, &entries, &remove)?;
        kept += k.len();
        removed.extend(r);
    }
    if kept == 0 {
        return Ok((None, removed));
    }
    let manifest = finish_manifest(warehouse, &io, location, writer).await?;
    Ok((Some(manifest), removed))
}

async fn read_manifest(warehouse: &Warehouse, old: &ManifestFile) -> Result<Manifest, SinkError> {
    let bytes = read(warehouse, &old.manifest_path).await?;
    Manifest::parse_avro(&bytes).map_err(ice(format!("parsing {}", old.manifest_path)))
}

/// The live entries of manifest `old`, read and resolved ([`resolve_entries`]).
async fn read_entries(
    warehouse: &Warehouse,
    old: &ManifestFile,
) -> Result<Vec<CarriedEntry>, SinkError> {
    resolve_entries(old, &read_manifest(warehouse, old).await?)
}

/// The live entries of `parsed` (the content of `old`), each with its snapshot id and its data
/// and file sequence numbers resolved from `old` where the entry inherits them (Iceberg spec,
/// "Sequence Number Inheritance"), and, v3 data, its first row id, made explicit where the entry
/// inherits it: in a new manifest it would inherit a different one (spec, "First Row ID
/// Inheritance": the manifest's `first_row_id` plus the record counts of the live entries
/// before it that have none).
pub(crate) fn resolve_entries(
    old: &ManifestFile,
    parsed: &Manifest,
) -> Result<Vec<CarriedEntry>, SinkError> {
    let mut out = Vec::new();
    let mut next_row_id = old.first_row_id;
    for e in parsed.entries().iter().filter(|e| e.is_alive()) {
        let mut file = e.data_file().clone();
        if file.first_row_id().is_none() {
            if let Some(inherited) = inherit_first_row_id(&mut next_row_id, &file) {
                file = with_first_row_id(&file, inherited, old)?;
            }
        }
        out.push(CarriedEntry {
            file,
            snapshot_id: e.snapshot_id().unwrap_or(old.added_snapshot_id),
            sequence: e.sequence_number().unwrap_or(old.sequence_number),
            file_sequence: e.file_sequence_number.unwrap_or(old.sequence_number),
        });
    }
    Ok(out)
}

/// Adds `entries` to `writer` as EXISTING, keeping their snapshot ids and sequence numbers,
/// except those whose file `remove` accepts. Returns the kept entries and the removed files.
fn carry_entries(
    writer: &mut ManifestWriter,
    location: &str,
    entries: &[CarriedEntry],
    remove: impl Fn(&DataFile) -> bool,
) -> Result<(Vec<CarriedEntry>, Vec<DataFile>), SinkError> {
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    for e in entries {
        if remove(&e.file) {
            removed.push(e.file.clone());
            continue;
        }
        writer
            .add_existing_file(
                e.file.clone(),
                e.snapshot_id,
                e.sequence,
                Some(e.file_sequence),
            )
            .map_err(ice(format!("adding an entry to {location}")))?;
        kept.push(e.clone());
    }
    Ok((kept, removed))
}

/// The first row id of data file `file`, the next live entry of a manifest (Iceberg spec, "First
/// Row ID Inheritance"): its own, or, when it has none, `next` (the manifest's `first_row_id`
/// plus the record counts of the live entries before it that had none), which it advances.
/// `None` for a delete file, or a manifest without row ids (written before v3).
pub(crate) fn inherit_first_row_id(next: &mut Option<u64>, file: &DataFile) -> Option<u64> {
    if file.content_type() != DataContentType::Data {
        return None;
    }
    if let Some(own) = file.first_row_id() {
        return u64::try_from(own).ok();
    }
    let inherited = *next;
    *next = inherited.map(|n| n.saturating_add(file.record_count()));
    inherited
}

/// `file`, listed by `old`, with an explicit first row id (iceberg's `DataFile` has no setter).
fn with_first_row_id(
    file: &DataFile,
    first_row_id: u64,
    old: &ManifestFile,
) -> Result<DataFile, SinkError> {
    let mut b = DataFileBuilder::default();
    b.content(file.content_type())
        .file_path(file.file_path().to_owned())
        .file_format(file.file_format())
        .partition(file.partition().clone())
        .partition_spec_id(old.partition_spec_id)
        .record_count(file.record_count())
        .file_size_in_bytes(file.file_size_in_bytes())
        .column_sizes(file.column_sizes().clone())
        .value_counts(file.value_counts().clone())
        .null_value_counts(file.null_value_counts().clone())
        .nan_value_counts(file.nan_value_counts().clone())
        .lower_bounds(file.lower_bounds().clone())
        .upper_bounds(file.upper_bounds().clone())
        .key_metadata(file.key_metadata().map(<[u8]>::to_vec))
        .split_offsets(file.split_offsets().map(<[i64]>::to_vec))
        .equality_ids(file.equality_ids())
        .first_row_id(i64::try_from(first_row_id).ok())
        .referenced_data_file(file.referenced_data_file())
        .content_offset(file.content_offset())
        .content_size_in_bytes(file.content_size_in_bytes());
    if let Some(order) = file.sort_order_id() {
        b.sort_order_id(order);
    }
    b.build().map_err(|e| SinkError::Corrupt {
        path: old.manifest_path.clone(),
        detail: format!("entry {}: {e}", file.file_path()),
    })
}

async fn finish_manifest(
    warehouse: &Warehouse,
    io: &FileIO,
    location: String,
    writer: ManifestWriter,
) -> Result<ManifestFile, SinkError> {
    let manifest = writer
        .write_manifest_file()
        .await
        .map_err(ice(format!("writing {location}")))?;
    let bytes = io
        .new_input(&location)
        .map_err(ice(format!("reading back {location}")))?
        .read()
        .await
        .map_err(ice(format!("reading back {location}")))?;
    put_bytes(warehouse, &location, bytes).await?;
    Ok(manifest)
}

/// The manifests of a snapshot's manifest list.
pub(crate) async fn load_manifests(
    warehouse: &Warehouse,
    manifest_list: &str,
    version: FormatVersion,
) -> Result<Vec<ManifestFile>, SinkError> {
    let bytes = read(warehouse, manifest_list).await?;
    let list = ManifestList::parse_with_version(&bytes, version)
        .map_err(ice(format!("parsing {manifest_list}")))?;
    Ok(list.consume_entries().into_iter().collect())
}

/// A live file of a snapshot with its data sequence number and the manifest listing it.
#[derive(Debug, Clone)]
pub(crate) struct LiveFile {
    pub file: DataFile,
    pub sequence: i64,
    /// The snapshot that added the file (inherited from the manifest when the entry has none).
    pub snapshot_id: i64,
    /// Path of the manifest that lists it (a rewrite of that manifest moves the entry).
    pub manifest: Arc<str>,
    /// The partition spec of that manifest, which the file is written under.
    pub spec_id: i32,
}

impl LiveFile {
    /// Where the file sits in the table's partitioning.
    pub fn placement(&self) -> crate::sinks::iceberg::files::writer::Placement {
        crate::sinks::iceberg::files::writer::Placement::of(self.spec_id, &self.file)
    }
}

/// The live data files and delete files of a snapshot.
#[derive(Debug, Default)]
pub(crate) struct LiveFiles {
    pub data: Vec<LiveFile>,
    pub position_deletes: Vec<LiveFile>,
    pub equality_deletes: Vec<LiveFile>,
}

impl LiveFiles {
    /// The bytes of every live file, as the snapshot summary counts them
    /// (`commit/summary.rs`, `bytes_of`: a deletion vector counts its blob).
    pub fn bytes(&self) -> u64 {
        self.data
            .iter()
            .chain(&self.position_deletes)
            .chain(&self.equality_deletes)
            .map(|f| crate::sinks::iceberg::commit::summary::bytes_of(&f.file))
            .sum()
    }
}

/// Manifests of a cold load read at once (`load_files`).
const MANIFEST_READS_IN_FLIGHT: usize = 16;

/// Reads every manifest ([`MANIFEST_READS_IN_FLIGHT`] at once) and collects the live (ADDED or
/// EXISTING) files, in manifest order.
pub(crate) async fn load_files(
    warehouse: &Warehouse,
    manifests: &[ManifestFile],
) -> Result<LiveFiles, SinkError> {
    let mut out = LiveFiles::default();
    // Collected first: a stream mapping with a closure is not `Send` for every lifetime, which
    // the sink's `async_trait` futures need.
    let reads: Vec<_> = manifests
        .iter()
        .map(|m| read_manifest(warehouse, m))
        .collect();
    let mut read_all = futures::stream::iter(reads).buffered(MANIFEST_READS_IN_FLIGHT);
    for m in manifests {
        let manifest_path: Arc<str> = Arc::from(m.manifest_path.as_str());
        let Some(manifest) = read_all.next().await else {
            break;
        };
        let manifest = manifest?;
        for e in manifest.entries().iter().filter(|e| e.is_alive()) {
            let live = LiveFile {
                sequence: e.sequence_number().unwrap_or(m.sequence_number),
                snapshot_id: e.snapshot_id().unwrap_or(m.added_snapshot_id),
                file: e.data_file().clone(),
                manifest: Arc::clone(&manifest_path),
                spec_id: m.partition_spec_id,
            };
            match e.content_type() {
                DataContentType::Data => out.data.push(live),
                DataContentType::PositionDeletes => out.position_deletes.push(live),
                DataContentType::EqualityDeletes => out.equality_deletes.push(live),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::sinks::iceberg::files::writer::Placement;
    use iceberg::spec::{
        Literal, NestedField, PrimitiveType, Schema, Struct, Transform, Type, UnboundPartitionSpec,
    };

    /// Issue 36: a manifest of a partitioned spec lists its entries' tuples, and its summary in
    /// the manifest list has each field's bounds and whether a NULL occurs.
    #[tokio::test]
    async fn a_partitioned_manifest_summarises_its_tuples() {
        let dir = tempfile::tempdir().unwrap();
        let wh = Warehouse::from_url(&format!("file://{}", dir.path().display())).unwrap();
        let schema = Arc::new(
            Schema::builder()
                .with_fields(vec![
                    NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                    NestedField::optional(2, "ts", Type::Primitive(PrimitiveType::Timestamptz))
                        .into(),
                ])
                .build()
                .unwrap(),
        );
        let spec = UnboundPartitionSpec::builder()
            .with_spec_id(3)
            .add_partition_field(2, "ts_day", Transform::Day)
            .unwrap()
            .add_partition_field(1, "id_bucket", Transform::Bucket(4))
            .unwrap()
            .build()
            .bind(Arc::clone(&schema))
            .unwrap();
        let target = ManifestTarget {
            version: FormatVersion::V3,
            schema,
            spec: Arc::new(spec),
            snapshot_id: 7,
            deletes: false,
        };
        let file = |n: usize, day: Option<i32>, bucket: i32| {
            let placement = Placement {
                spec_id: 3,
                partition: Struct::from_iter([day.map(Literal::date), Some(Literal::int(bucket))]),
                sort_order_id: None,
            };
            DataFileBuilder::default()
                .content(DataContentType::Data)
                .file_path(format!("file:///t/data/{n}.parquet"))
                .file_format(iceberg::spec::DataFileFormat::Parquet)
                .partition(placement.partition)
                .partition_spec_id(placement.spec_id)
                .record_count(1)
                .file_size_in_bytes(10)
                .build()
                .unwrap()
        };
        let location = format!("file://{}/m.avro", dir.path().display());
        let files = vec![
            file(0, Some(19724), 3),
            file(1, Some(19730), 0),
            file(2, None, 1),
        ];
        let m = write_manifest(&wh, location, &target, 1, files)
            .await
            .unwrap();
        assert_eq!(m.partition_spec_id, 3);
        let summary = m.partitions.clone().unwrap();
        assert_eq!(summary.len(), 2);
        assert!(summary[0].contains_null);
        assert_eq!(
            summary[0].lower_bound.as_deref().map(|b| b.as_slice()),
            Some(&19724i32.to_le_bytes()[..])
        );
        assert_eq!(
            summary[0].upper_bound.as_deref().map(|b| b.as_slice()),
            Some(&19730i32.to_le_bytes()[..])
        );
        assert!(!summary[1].contains_null);
        assert_eq!(
            summary[1].lower_bound.as_deref().map(|b| b.as_slice()),
            Some(&0i32.to_le_bytes()[..])
        );
        assert_eq!(
            summary[1].upper_bound.as_deref().map(|b| b.as_slice()),
            Some(&3i32.to_le_bytes()[..])
        );
        let live = load_files(&wh, &[m]).await.unwrap();
        let tuples: Vec<Placement> = live.data.iter().map(LiveFile::placement).collect();
        assert_eq!(
            tuples[0].partition,
            Struct::from_iter([Some(Literal::date(19724)), Some(Literal::int(3))])
        );
        assert_eq!(
            tuples[2].partition,
            Struct::from_iter([None, Some(Literal::int(1))])
        );
        assert!(tuples.iter().all(|p| p.spec_id == 3));
    }
}
