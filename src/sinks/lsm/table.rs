//! One Paimon table as the sink holds it: [`TableState`], what the table is as of its newest
//! snapshot, loaded from storage ([`load`]); the schema files (`schema/schema-N`); [`Change`],
//! the files one snapshot adds and deletes.
//!
//! The bottom floor of the sink: the commit, the compactor, expiry and resync all read and
//! advance a `TableState`, so it imports none of them. A state is a cache of what is durable: a
//! failed publish drops it and the next user reloads it.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

use super::manifest::{DataFileMeta, FileKind, ManifestFileMeta};
use super::partition::{Partition, PartitionKeys, Slot};
use super::schema::PaimonSchema;
use super::snapshot::{
    latest_id, read_manifest, read_manifest_list, read_snapshot, snapshot_location, Snapshot,
};
use super::store::{corrupt, highest_numbered, read_json, storage};
use crate::sinks::SinkError;
use crate::storage::{put_create, Created, Warehouse};

/// The snapshot property naming the first schema of the table's current lineage (`resync.rs`):
/// [`TableState::lineage_start`].
pub const LINEAGE_SCHEMA_PROPERTY: &str = "cdcd.lineage-first-schema";

/// What a table holds as of its newest snapshot: the schema, the live files per (partition,
/// bucket) and the manifests that list them.
#[derive(Debug, Clone)]
pub struct TableState {
    pub location: String,
    pub schema: PaimonSchema,
    /// The schema's partition keys (none: unpartitioned).
    pub partitions: PartitionKeys,
    pub snapshot: Option<Snapshot>,
    /// Every manifest of the newest snapshot (its base list, then its delta list).
    pub manifests: Vec<ManifestFileMeta>,
    /// Live data files by (partition, bucket).
    pub files: BTreeMap<Slot, Vec<DataFileMeta>>,
    /// The next unused sequence number.
    pub next_sequence: i64,
    pub commit_user: String,
    /// Names earlier schemas gave fields the current schema has under another name (a
    /// `RENAME COLUMN`), to the current name: files written under those schemas hold the old
    /// name (cdcd's files carry no field ids; Paimon readers map by the file's `_SCHEMA_ID`).
    pub aliases: HashMap<String, String>,
    /// The oldest schema of the table's current lineage (its newest snapshot's
    /// `cdcd.lineage-first-schema`, else 0): a resync's swap (`resync.rs`) starts a new one, and
    /// schemas before it describe files no snapshot from the swap on holds, so they say nothing
    /// about names the table had (renames, dropped columns).
    pub lineage_start: i64,
}

impl TableState {
    pub fn live_rows(&self) -> i64 {
        self.files.values().flatten().map(|f| f.row_count).sum()
    }

    pub fn snapshot_id(&self) -> i64 {
        self.snapshot.as_ref().map_or(0, |s| s.id)
    }

    /// The table's bucket count (its `bucket` option), else the configured one.
    pub fn buckets(&self, configured: u32) -> u32 {
        self.schema
            .options
            .get("bucket")
            .and_then(|b| b.parse::<u32>().ok())
            .filter(|&b| b > 0)
            .unwrap_or(configured.max(1))
    }
}

/// One commit's file changes.
#[derive(Debug, Default)]
pub struct Change {
    pub added: Vec<(Slot, DataFileMeta)>,
    pub deleted: Vec<(Slot, DataFileMeta)>,
    /// Changelog files (`changelog = true`), listed in the snapshot's `changelogManifestList`.
    pub changelog: Vec<(Slot, DataFileMeta)>,
}

/// Loads the table at `location`; `Ok(None)` when it has no schema yet.
pub async fn load(w: &Warehouse, location: &str) -> Result<Option<TableState>, SinkError> {
    let Some(schema_id) = latest_schema_id(w, location).await? else {
        return Ok(None);
    };
    let Some(schema) = read_schema(w, location, schema_id).await? else {
        return Err(corrupt(
            &schema_location(location, schema_id),
            "listed but vanished",
        ));
    };
    let partitions = PartitionKeys::of(&schema)
        .map_err(|e| corrupt(&schema_location(location, schema_id), e))?;
    let mut state = TableState {
        location: location.to_owned(),
        schema,
        partitions,
        snapshot: None,
        manifests: Vec::new(),
        files: BTreeMap::new(),
        next_sequence: 0,
        commit_user: uuid::Uuid::new_v4().to_string(),
        aliases: HashMap::new(),
        lineage_start: 0,
    };
    let snapshot =
        match latest_id(w, location).await? {
            Some(id) => Some(read_snapshot(w, location, id).await?.ok_or_else(|| {
                corrupt(&snapshot_location(location, id), "vanished while loading")
            })?),
            None => None,
        };
    state.lineage_start = snapshot
        .as_ref()
        .and_then(|s| {
            s.properties
                .as_ref()?
                .get(LINEAGE_SCHEMA_PROPERTY)?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    for id in state.lineage_start..schema_id {
        if let Some(older) = read_schema(w, location, id).await? {
            state
                .aliases
                .extend(super::schema::aliases(&older, &state.schema));
        }
    }
    let Some(snapshot) = snapshot else {
        return Ok(Some(state));
    };
    let mut manifests = read_manifest_list(w, location, &snapshot.base_manifest_list).await?;
    manifests.extend(read_manifest_list(w, location, &snapshot.delta_manifest_list).await?);
    let mut live: HashMap<(Slot, String), DataFileMeta> = HashMap::new();
    let mut decoded: HashMap<Vec<u8>, Partition> = HashMap::new();
    for m in &manifests {
        for e in read_manifest(w, location, &m.file_name).await? {
            let partition = match decoded.get(&e.partition) {
                Some(p) => p.clone(),
                None => {
                    let p = state
                        .partitions
                        .decode(&e.partition)
                        .map_err(|d| corrupt(&format!("{location}/manifest/{}", m.file_name), d))?;
                    decoded.insert(e.partition.clone(), p.clone());
                    p
                }
            };
            let slot = Slot {
                partition,
                bucket: e.bucket,
            };
            let id = (slot, e.file.file_name.clone());
            match e.kind {
                FileKind::Add => {
                    live.insert(id, e.file);
                }
                FileKind::Delete => {
                    live.remove(&id);
                }
            }
        }
    }
    for ((slot, _), f) in live {
        state.next_sequence = state.next_sequence.max(f.max_sequence + 1);
        state.files.entry(slot).or_default().push(f);
    }
    state.manifests = manifests;
    state.snapshot = Some(snapshot);
    Ok(Some(state))
}

/// The table's newest schema; `None` when it has none.
pub async fn load_schema(w: &Warehouse, location: &str) -> Result<Option<PaimonSchema>, SinkError> {
    match latest_schema_id(w, location).await? {
        Some(id) => read_schema(w, location, id).await,
        None => Ok(None),
    }
}

/// `schema/schema-<id>`.
fn schema_location(location: &str, id: i64) -> String {
    format!("{location}/schema/schema-{id}")
}

/// The newest schema id (Paimon's `SchemaManager.latest`: the highest `schema-N` file);
/// `None` when the table has no schema yet.
async fn latest_schema_id(w: &Warehouse, location: &str) -> Result<Option<i64>, SinkError> {
    highest_numbered(w, &format!("{location}/schema"), "schema-").await
}

/// Schema file `schema-<id>`, if it exists.
pub async fn read_schema(
    w: &Warehouse,
    location: &str,
    id: i64,
) -> Result<Option<PaimonSchema>, SinkError> {
    read_json(w, &schema_location(location, id)).await
}

/// Creates schema file `schema-<schema.id>` (create-if-absent: schema 0 makes the table, a later
/// one evolves it, as Paimon's `SchemaManager` commits a schema change). A file that is already
/// there (a concurrent creator's, or ours from an attempt whose commit did not land) wins: the
/// caller reloads the table and compares.
pub async fn create_schema(
    w: &Warehouse,
    location: &str,
    schema: &PaimonSchema,
) -> Result<(), SinkError> {
    let loc = schema_location(location, schema.id);
    let body = serde_json::to_vec_pretty(schema).map_err(|e| corrupt(&loc, e))?;
    let path = w.path(&loc)?;
    match put_create(w.store().as_ref(), &path, Bytes::from(body)).await {
        Ok(Created::Created | Created::AlreadyOurs | Created::Conflict) => Ok(()),
        Err(e) => Err(storage(&loc)(e)),
    }
}
