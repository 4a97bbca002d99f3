//! Publishing a snapshot: the one way every change to a table (a commit, a compaction, a
//! resync's swap) becomes visible.
//!
//! Publishing writes this snapshot's manifest, both manifest lists (`snapshot.rs`), then
//! `snapshot-N` create-if-absent (`storage::put_create`, atomic on local disk and S3): that
//! single put is the commit point, so a crash before it leaves only unreferenced files, a second
//! writer loses with a conflict instead of overwriting, and a retried put that finds its own
//! bytes is a success. `LATEST` (and `EARLIEST` on the first snapshot) are hints written
//! afterwards; readers verify them (pypaimon `SnapshotManager`). Crash points
//! `failpoints::LSM_BEFORE_SNAPSHOT` / `LSM_AFTER_SNAPSHOT` bracket the snapshot put. The
//! checkpoint rides in the snapshot's `properties` (docs/exactly-once.md, section 1).

use std::collections::BTreeMap;

use bytes::Bytes;

use super::binary_row;
use super::manifest::{self, DataFileMeta, FileKind, ManifestEntry, ManifestFileMeta, Stats};
use super::partition::{PartitionKeys, Slot};
use super::schema::PaimonSchema;
use super::snapshot::{read_snapshot, snapshot_location, Snapshot};
use super::store::{corrupt, put, storage};
use super::table::{Change, TableState, LINEAGE_SCHEMA_PROPERTY};
use crate::changelog::TableId;
use crate::failpoints;
use crate::sinks::resync::RESYNC_ID_PROPERTY;
use crate::sinks::SinkError;
use crate::storage::{put_create, Created, Warehouse};

/// Paimon's default `manifest.merge-min-count`: above this many manifests the base list is
/// rewritten as manifests of the live files.
const MERGE_MIN_COUNT: usize = 30;

/// Paimon's default `manifest.target-file-size` (8 MiB).
const MANIFEST_TARGET_BYTES: usize = 8 << 20;

/// When a commit rewrites its base manifest list, and how large each rewritten manifest may be:
/// the table's own options `manifest.merge-min-count` and `manifest.target-file-size` (Paimon's
/// names, so a table another Paimon writer tuned keeps its tuning), else Paimon's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManifestMerge {
    pub min_count: usize,
    pub target_bytes: usize,
}

impl ManifestMerge {
    /// The settings of the table whose schema is `schema`; a value that does not parse keeps the
    /// default (with a warning: a table option is another writer's word, not cdcd's config).
    pub fn of(schema: &PaimonSchema) -> ManifestMerge {
        let option = |name: &str, parse: fn(&str) -> Option<usize>, default: usize| {
            match schema.options.get(name) {
                None => default,
                Some(v) => parse(v).filter(|&n| n > 0).unwrap_or_else(|| {
                    tracing::warn!(option = name, value = %v, "unreadable Paimon table option; using the default");
                    default
                }),
            }
        };
        ManifestMerge {
            min_count: option(
                "manifest.merge-min-count",
                |v| v.trim().parse().ok(),
                MERGE_MIN_COUNT,
            ),
            target_bytes: option(
                "manifest.target-file-size",
                memory_size,
                MANIFEST_TARGET_BYTES,
            ),
        }
    }
}

/// A Paimon `MemorySize` text (`8 mb`, `8MB`, `512kb`, `1048576`, `2 gb`) in bytes.
pub fn memory_size(text: &str) -> Option<usize> {
    let t = text.trim().to_ascii_lowercase();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let n: usize = number.parse().ok()?;
    let shift = match unit.trim() {
        "" | "b" | "bytes" => 0,
        "k" | "kb" | "kibibytes" => 10,
        "m" | "mb" | "mebibytes" => 20,
        "g" | "gb" | "gibibytes" => 30,
        _ => return None,
    };
    n.checked_mul(1usize << shift)
}

/// `entries` cut into consecutive runs whose manifests stay near `target_bytes`, judged by the
/// size of all of them encoded as one (`encoded`): equal entry counts per manifest.
pub fn split_for_target<T>(entries: &[T], encoded: usize, target_bytes: usize) -> Vec<&[T]> {
    let parts = encoded.div_ceil(target_bytes.max(1)).max(1);
    let per = entries.len().div_ceil(parts).max(1);
    entries.chunks(per).collect()
}

/// Publishes `change` as snapshot `state.snapshot_id() + 1` of kind `kind`, carrying
/// `properties`, and applies it to `state`. On `Err` nothing was published (or a conflict: another
/// writer took the id) and `state` is unchanged.
pub async fn publish(
    w: &Warehouse,
    table: &TableId,
    state: &mut TableState,
    change: Change,
    kind: &str,
    properties: BTreeMap<String, String>,
    buckets: i32,
) -> Result<i64, SinkError> {
    let properties = carried(state, w.lease_epoch(), properties);
    let manifests = Manifests {
        w,
        location: state.location.clone(),
        commit: uuid::Uuid::new_v4(),
        buckets,
        partitions: &state.partitions,
    };
    let delta = manifests.write_delta(&change).await?;
    let mut base = manifests.write_base(state).await?;
    let lists = manifests.write_lists(&base, &delta).await?;
    let changelog = manifests.write_changelog(&change.changelog).await?;
    drop(manifests);
    let mut snapshot = snapshot(state, lists, &change, kind, properties);
    if let Some((list, size)) = changelog {
        snapshot.changelog_manifest_list = Some(list);
        snapshot.changelog_manifest_list_size = Some(size);
        snapshot.changelog_record_count =
            Some(change.changelog.iter().map(|(_, f)| f.row_count).sum());
    }
    let id = snapshot.id;
    put_snapshot(w, table, &state.location, &snapshot).await?;
    write_hints(w, table, &state.location, id).await;
    base.extend(delta);
    apply(state, change, base, snapshot);
    Ok(id)
}

/// `properties` with what every snapshot of the table carries on: a resync's marks stay on
/// every later snapshot (resync.rs): which resync's lineage the table is, and where its schema
/// history starts; and the writer's lease epoch.
fn carried(
    state: &TableState,
    epoch: u64,
    mut properties: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    if let Some(before) = state.snapshot.as_ref().and_then(|s| s.properties.as_ref()) {
        for key in [RESYNC_ID_PROPERTY, LINEAGE_SCHEMA_PROPERTY] {
            if let Some(value) = before.get(key) {
                properties
                    .entry(key.to_owned())
                    .or_insert_with(|| value.clone());
            }
        }
    }
    if epoch > 0 {
        // Also on compaction snapshots, which copy the properties of the one before.
        properties.insert(
            crate::checkpoint::LEASE_EPOCH_KEY.to_owned(),
            epoch.to_string(),
        );
    }
    properties
}

/// The manifests and manifest lists one publish writes before its snapshot, all under
/// `manifest/` and named after a fresh commit uuid, so no two publishes' files collide.
struct Manifests<'a> {
    w: &'a Warehouse,
    location: String,
    commit: uuid::Uuid,
    /// `_TOTAL_BUCKETS` of the manifest entries.
    buckets: i32,
    /// The table's partition keys, for the manifests' partition statistics.
    partitions: &'a PartitionKeys,
}

/// The two manifest lists a snapshot names, as written.
struct Lists {
    base_name: String,
    base_size: i64,
    delta_name: String,
    delta_size: i64,
}

impl Manifests<'_> {
    fn enc(&self) -> impl Fn(manifest::ManifestError) -> SinkError + '_ {
        |e| corrupt(&format!("{}/manifest", self.location), e)
    }

    fn entry(&self, kind: FileKind, slot: &Slot, file: &DataFileMeta) -> ManifestEntry {
        ManifestEntry {
            kind,
            partition: slot.partition.row.to_vec(),
            bucket: slot.bucket,
            total_buckets: self.buckets,
            file: file.clone(),
        }
    }

    /// `_PARTITION_STATS` of a manifest whose entries lie in `slots`.
    fn stats<'s>(&self, slots: impl Iterator<Item = &'s Slot>) -> Result<Stats, SinkError> {
        let mut seen = std::collections::BTreeSet::new();
        let partitions = slots.map(|s| &s.partition).filter(|p| seen.insert(*p));
        self.partitions
            .stats(partitions)
            .map_err(|e| corrupt(&format!("{}/manifest", self.location), e))
    }

    async fn put_manifest_file(&self, name: &str, bytes: Vec<u8>) -> Result<(), SinkError> {
        put(self.w, &format!("{}/manifest/{name}", self.location), bytes).await
    }

    /// This snapshot's manifest: the files `change` deletes, then those it adds (none for an
    /// empty change).
    async fn write_delta(&self, change: &Change) -> Result<Vec<ManifestFileMeta>, SinkError> {
        let entries: Vec<ManifestEntry> = change
            .deleted
            .iter()
            .map(|(b, f)| self.entry(FileKind::Delete, b, f))
            .chain(
                change
                    .added
                    .iter()
                    .map(|(b, f)| self.entry(FileKind::Add, b, f)),
            )
            .collect();
        let slots = change.deleted.iter().chain(&change.added).map(|(s, _)| s);
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let name = format!("manifest-{}-0", self.commit);
        let bytes =
            manifest::encode_entries(&entries, &binary_row::empty_row()).map_err(self.enc())?;
        let meta = manifest::describe(name.clone(), bytes.len(), &entries, self.stats(slots)?);
        self.put_manifest_file(&name, bytes).await?;
        Ok(vec![meta])
    }

    /// The base list: the previous snapshot's manifests, rewritten as manifests of the live
    /// files (of about the target size) once there are many: otherwise every commit would make
    /// every reader open more.
    async fn write_base(&self, state: &TableState) -> Result<Vec<ManifestFileMeta>, SinkError> {
        let merge = ManifestMerge::of(&state.schema);
        if state.manifests.len() <= merge.min_count {
            return Ok(state.manifests.clone());
        }
        let live: Vec<(&Slot, ManifestEntry)> = state
            .files
            .iter()
            .flat_map(|(b, fs)| fs.iter().map(move |f| (b, self.entry(FileKind::Add, b, f))))
            .collect();
        let mut base = Vec::new();
        if live.is_empty() {
            return Ok(base);
        }
        let (slots, live): (Vec<&Slot>, Vec<ManifestEntry>) = live.into_iter().unzip();
        let empty = binary_row::empty_row();
        let whole = manifest::encode_entries(&live, &empty).map_err(self.enc())?;
        let parts = split_for_target(&live, whole.len(), merge.target_bytes);
        let mut at = 0;
        for (i, part) in parts.into_iter().enumerate() {
            let name = format!("manifest-{}-{}", self.commit, i + 1);
            let bytes = if part.len() == live.len() {
                whole.clone()
            } else {
                manifest::encode_entries(part, &empty).map_err(self.enc())?
            };
            let part_slots = slots.get(at..at + part.len()).unwrap_or_default();
            at += part.len();
            let stats = self.stats(part_slots.iter().copied())?;
            base.push(manifest::describe(name.clone(), bytes.len(), part, stats));
            self.put_manifest_file(&name, bytes).await?;
        }
        Ok(base)
    }

    /// The changelog manifest and the list naming it (`manifest-list-<commit>-2`), for a commit
    /// that wrote changelog files: the list's name and size.
    async fn write_changelog(
        &self,
        files: &[(Slot, DataFileMeta)],
    ) -> Result<Option<(String, i64)>, SinkError> {
        if files.is_empty() {
            return Ok(None);
        }
        let entries: Vec<ManifestEntry> = files
            .iter()
            .map(|(b, f)| self.entry(FileKind::Add, b, f))
            .collect();
        let name = format!("manifest-{}-changelog-0", self.commit);
        let bytes =
            manifest::encode_entries(&entries, &binary_row::empty_row()).map_err(self.enc())?;
        let stats = self.stats(files.iter().map(|(s, _)| s))?;
        let meta = manifest::describe(name.clone(), bytes.len(), &entries, stats);
        self.put_manifest_file(&name, bytes).await?;
        let list = format!("manifest-list-{}-2", self.commit);
        let list_bytes = manifest::encode_list(&[meta]).map_err(self.enc())?;
        let size = list_bytes.len() as i64;
        self.put_manifest_file(&list, list_bytes).await?;
        Ok(Some((list, size)))
    }

    async fn write_lists(
        &self,
        base: &[ManifestFileMeta],
        delta: &[ManifestFileMeta],
    ) -> Result<Lists, SinkError> {
        let base_name = format!("manifest-list-{}-0", self.commit);
        let delta_name = format!("manifest-list-{}-1", self.commit);
        let base_bytes = manifest::encode_list(base).map_err(self.enc())?;
        let delta_bytes = manifest::encode_list(delta).map_err(self.enc())?;
        let (base_size, delta_size) = (base_bytes.len() as i64, delta_bytes.len() as i64);
        self.put_manifest_file(&base_name, base_bytes).await?;
        self.put_manifest_file(&delta_name, delta_bytes).await?;
        Ok(Lists {
            base_name,
            base_size,
            delta_name,
            delta_size,
        })
    }
}

/// `LATEST`, and `EARLIEST` for the first snapshot: failures here do not undo the commit
/// (readers verify hints).
async fn write_hints(w: &Warehouse, table: &TableId, loc: &str, id: i64) {
    if let Err(e) = put(
        w,
        &format!("{loc}/snapshot/LATEST"),
        id.to_string().into_bytes(),
    )
    .await
    {
        tracing::warn!(table = %table, error = %e, "could not update snapshot/LATEST");
    }
    if id == 1 {
        let _ = put(w, &format!("{loc}/snapshot/EARLIEST"), b"1".to_vec()).await;
    }
}

/// The snapshot after `state`'s newest, naming `lists`.
fn snapshot(
    state: &TableState,
    lists: Lists,
    change: &Change,
    kind: &str,
    properties: BTreeMap<String, String>,
) -> Snapshot {
    let added_rows: i64 = change.added.iter().map(|(_, f)| f.row_count).sum();
    let deleted_rows: i64 = change.deleted.iter().map(|(_, f)| f.row_count).sum();
    let id = state.snapshot_id() + 1;
    Snapshot {
        version: 3,
        id,
        schema_id: state.schema.id,
        base_manifest_list: lists.base_name,
        base_manifest_list_size: Some(lists.base_size),
        delta_manifest_list: lists.delta_name,
        delta_manifest_list_size: Some(lists.delta_size),
        changelog_manifest_list: None,
        changelog_manifest_list_size: None,
        index_manifest: None,
        commit_user: state.commit_user.clone(),
        commit_identifier: id,
        commit_kind: kind.to_owned(),
        time_millis: chrono::Utc::now().timestamp_millis(),
        total_record_count: state.live_rows() + added_rows - deleted_rows,
        delta_record_count: added_rows - deleted_rows,
        changelog_record_count: None,
        properties: Some(properties),
    }
}

/// Advances `state` to the published `snapshot`: `change` applied to the live files, `manifests`
/// (base, then delta) as the snapshot's.
fn apply(
    state: &mut TableState,
    change: Change,
    manifests: Vec<ManifestFileMeta>,
    snapshot: Snapshot,
) {
    for (b, f) in &change.deleted {
        if let Some(files) = state.files.get_mut(b) {
            files.retain(|x| x.file_name != f.file_name);
        }
    }
    for (b, f) in change.added {
        state.next_sequence = state.next_sequence.max(f.max_sequence + 1);
        state.files.entry(b).or_default().push(f);
    }
    state.files.retain(|_, fs| !fs.is_empty());
    state.manifests = manifests;
    state.snapshot = Some(snapshot);
}

/// The commit point: puts `snapshot` as `snapshot/snapshot-<id>` of the table at `location`,
/// create-if-absent. `Ok`: the commit is durable; `CommitConflict` (or `Fenced`, when the winner
/// holds a newer lease epoch): another writer took the id; any other error leaves the outcome
/// unknown.
async fn put_snapshot(
    w: &Warehouse,
    table: &TableId,
    location: &str,
    snapshot: &Snapshot,
) -> Result<(), SinkError> {
    let id = snapshot.id;
    let snap_loc = snapshot_location(location, id);
    let body = serde_json::to_vec_pretty(snapshot).map_err(|e| corrupt(&snap_loc, e))?;
    let path = w.path(&snap_loc)?;
    failpoints::crash_point(failpoints::LSM_BEFORE_SNAPSHOT);
    let created = put_create(w.store().as_ref(), &path, Bytes::from(body)).await;
    if created.as_ref().is_ok_and(|c| c.is_ours()) {
        failpoints::crash_point(failpoints::LSM_AFTER_SNAPSHOT);
    }
    match created {
        Ok(Created::Created) => Ok(()),
        // The snapshot names this commit's manifest lists (fresh uuids): equal bytes are this
        // very commit, landed by an attempt object_store retried.
        Ok(Created::AlreadyOurs) => {
            tracing::info!(table = %table, path = %snap_loc, "commit landed on an earlier attempt");
            Ok(())
        }
        Ok(Created::Conflict) => {
            let winner = read_snapshot(w, location, id)
                .await
                .ok()
                .flatten()
                .and_then(|s| {
                    s.properties?
                        .get(crate::checkpoint::LEASE_EPOCH_KEY)?
                        .parse()
                        .ok()
                });
            if let Some(fenced) = crate::sinks::fenced_by_winner(w, table, winner) {
                return Err(fenced);
            }
            Err(SinkError::CommitConflict {
                table: table.clone(),
                version: id as u64,
            })
        }
        Err(e) => Err(storage(&snap_loc)(e)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod merge_tests {
    use super::*;

    #[test]
    fn memory_sizes_read_as_paimon_writes_them() {
        assert_eq!(memory_size("8 mb"), Some(8 << 20));
        assert_eq!(memory_size("8MB"), Some(8 << 20));
        assert_eq!(memory_size("512kb"), Some(512 << 10));
        assert_eq!(memory_size("1048576"), Some(1 << 20));
        assert_eq!(memory_size("2 gb"), Some(2 << 30));
        assert_eq!(memory_size("lots"), None);
        assert_eq!(memory_size("8 parsecs"), None);
    }

    #[test]
    fn table_options_override_the_defaults_and_bad_values_keep_them() {
        let mut schema = PaimonSchema {
            version: 3,
            id: 0,
            fields: Vec::new(),
            highest_field_id: -1,
            partition_keys: Vec::new(),
            primary_keys: Vec::new(),
            options: BTreeMap::new(),
            comment: None,
            time_millis: 0,
        };
        let defaults = ManifestMerge {
            min_count: 30,
            target_bytes: 8 << 20,
        };
        assert_eq!(ManifestMerge::of(&schema), defaults);
        schema
            .options
            .insert("manifest.merge-min-count".into(), "5".into());
        schema
            .options
            .insert("manifest.target-file-size".into(), "1 mb".into());
        let tuned = ManifestMerge {
            min_count: 5,
            target_bytes: 1 << 20,
        };
        assert_eq!(ManifestMerge::of(&schema), tuned);
        schema
            .options
            .insert("manifest.merge-min-count".into(), "0".into());
        schema
            .options
            .insert("manifest.target-file-size".into(), "big".into());
        assert_eq!(ManifestMerge::of(&schema), defaults);
    }

    #[test]
    fn live_entries_split_into_manifests_near_the_target() {
        let entries: Vec<u32> = (0..10).collect();
        assert_eq!(split_for_target(&entries, 100, 1000).len(), 1);
        let parts = split_for_target(&entries, 2500, 1000);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.concat(), entries);
        assert!(split_for_target::<u32>(&[], 0, 1000)
            .iter()
            .all(|p| p.is_empty()));
    }
}
