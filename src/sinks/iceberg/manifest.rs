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

use std::sync::Arc;

use bytes::Bytes;
use iceberg::io::FileIO;
use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, Manifest, ManifestFile, ManifestList, ManifestWriter,
    ManifestWriterBuilder, PartitionSpecRef, SchemaRef,
};
use object_store::{ObjectStoreExt, PutPayload};

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
    let io = FileIO::new_with_memory();
    let output = io
        .new_output(&location)
        .map_err(ice(format!("opening {location}")))?;
    let mut writer = target.writer(output);
    for f in files {
        writer
            .add_file(f, sequence)
            .map_err(ice(format!("adding a file to {location}")))?;
    }
    finish_manifest(warehouse, &io, location, writer).await
}

/// Rewrites manifest `old` for a new snapshot: the live entries whose file `remove` accepts are
/// left out, the other live entries stay EXISTING (keeping their snapshot and sequence numbers,
/// resolved from the manifest where inherited); earlier DELETED entries are dropped. Returns the
/// new manifest (`None` when nothing is left) and the removed files.
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
    let bytes = read(warehouse, &old.manifest_path).await?;
    let parsed =
        Manifest::parse_avro(&bytes).map_err(ice(format!("parsing {}", old.manifest_path)))?;
    let io = FileIO::new_with_memory();
    let output = io
        .new_output(&location)
        .map_err(ice(format!("opening {location}")))?;
    let mut writer = target.writer(output);
    let mut removed = Vec::new();
    let mut kept = 0usize;
    for e in parsed.entries().iter().filter(|e| e.is_alive()) {
        let sequence = e.sequence_number().unwrap_or(old.sequence_number);
        let file_sequence = Some(e.file_sequence_number.unwrap_or(old.sequence_number));
        let file = e.data_file().clone();
        let added = ice(format!("adding an entry to {location}"));
        if remove(&file) {
            removed.push(file);
        } else {
            kept += 1;
            let snapshot = e.snapshot_id().unwrap_or(old.added_snapshot_id);
            writer
                .add_existing_file(file, snapshot, sequence, file_sequence)
                .map_err(added)?;
        }
    }
    if kept == 0 {
        return Ok((None, removed));
    }
    let manifest = finish_manifest(warehouse, &io, location, writer).await?;
    Ok((Some(manifest), removed))
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
    put(warehouse, &location, bytes).await?;
    Ok(manifest)
}

async fn put(warehouse: &Warehouse, location: &str, bytes: Bytes) -> Result<(), SinkError> {
    let path = warehouse.path(location)?;
    warehouse
        .store()
        .put(&path, PutPayload::from_bytes(bytes))
        .await
        .map_err(|source| SinkError::Storage {
            path: location.to_owned(),
            source,
        })?;
    Ok(())
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
}

/// The live data files and delete files of a snapshot.
#[derive(Debug, Default)]
pub(crate) struct LiveFiles {
    pub data: Vec<LiveFile>,
    pub position_deletes: Vec<LiveFile>,
    pub equality_deletes: Vec<LiveFile>,
}

/// Reads every manifest and collects the live (ADDED or EXISTING) files.
pub(crate) async fn load_files(
    warehouse: &Warehouse,
    manifests: &[ManifestFile],
) -> Result<LiveFiles, SinkError> {
    let mut out = LiveFiles::default();
    for m in manifests {
        let manifest_path: Arc<str> = Arc::from(m.manifest_path.as_str());
        let bytes = read(warehouse, &m.manifest_path).await?;
        let manifest =
            Manifest::parse_avro(&bytes).map_err(ice(format!("parsing {}", m.manifest_path)))?;
        for e in manifest.entries().iter().filter(|e| e.is_alive()) {
            let live = LiveFile {
                sequence: e.sequence_number().unwrap_or(m.sequence_number),
                snapshot_id: e.snapshot_id().unwrap_or(m.added_snapshot_id),
                file: e.data_file().clone(),
                manifest: Arc::clone(&manifest_path),
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
