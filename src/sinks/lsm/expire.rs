//! Snapshot expiry: drops snapshots older than the newest `snapshots_retained` (and, when a time
//! window is set, older than it too), and deletes the data files no remaining snapshot holds live
//! and the manifests and manifest lists no remaining snapshot names.
//!
//! Order makes a crash harmless: `EARLIEST` moves first (readers stop looking at the expired
//! snapshots), then the snapshot files go, then the files only they referenced; a crash leaves
//! unreferenced files at worst. It runs without the table lock: files a new snapshot can
//! reference are live in the newest snapshot (retained) or new (never a candidate).

use std::collections::{HashMap, HashSet};

use super::commit::{self, TableState};
use super::manifest::{FileKind, ManifestEntry};
use super::{Handle, Inner};
use crate::config::LsmConfig;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// Whether to try expiring after this commit: 10 snapshots or more after the last try (to batch
/// the work), counting the compactor's snapshots, which can make a commit skip every multiple of
/// 10. `last_try` is the snapshot id of the last try (0: none yet).
pub fn due(state: &TableState, config: &LsmConfig, last_try: i64) -> bool {
    let id = state.snapshot_id();
    id > config.snapshots_retained as i64 && id - last_try >= 10
}

#[derive(Default)]
pub(super) struct Refs {
    pub(super) lists: HashSet<String>,
    pub(super) manifests: HashSet<String>,
    /// (bucket, file name)
    pub(super) files: HashSet<(i32, String)>,
}

/// Adds what snapshot `id` references to `refs`: its lists and manifests, and its data files —
/// only the live ones (ADD not undone by a DELETE) when `live_only`, else every file it ever
/// listed. Returns `None` when the snapshot is gone.
pub(super) async fn collect(
    w: &Warehouse,
    location: &str,
    id: i64,
    live_only: bool,
    refs: &mut Refs,
    cache: &mut HashMap<String, Vec<ManifestEntry>>,
) -> Result<Option<()>, SinkError> {
    let Some(s) = commit::read_snapshot(w, location, id).await? else {
        return Ok(None);
    };
    let mut live: HashSet<(i32, String)> = HashSet::new();
    for list in [&s.base_manifest_list, &s.delta_manifest_list] {
        refs.lists.insert(list.clone());
        for m in commit::read_manifest_list(w, location, list).await? {
            refs.manifests.insert(m.file_name.clone());
            if !cache.contains_key(&m.file_name) {
                let entries = commit::read_manifest(w, location, &m.file_name).await?;
                cache.insert(m.file_name.clone(), entries);
            }
            for e in cache.get(&m.file_name).into_iter().flatten() {
                let key = (e.bucket, e.file.file_name.clone());
                match e.kind {
                    FileKind::Add => {
                        live.insert(key);
                    }
                    FileKind::Delete if live_only => {
                        live.remove(&key);
                    }
                    FileKind::Delete => {}
                }
            }
        }
    }
    refs.files.extend(live);
    Ok(Some(()))
}

/// Expires old snapshots of `handle`'s table. Returns how many were removed.
pub(super) async fn expire(inner: &Inner, handle: &Handle) -> Result<usize, SinkError> {
    let (location, latest) = {
        let guard = handle.state.lock().await;
        match guard.as_ref() {
            Some(s) => (s.location.clone(), s.snapshot_id()),
            None => return Ok(0),
        }
    };
    let w = &inner.warehouse;
    let Some(earliest) = commit::earliest_id(w, &location, latest).await? else {
        return Ok(0);
    };
    let keep = inner.config.snapshots_retained.max(1) as i64;
    let mut cut = (latest - keep + 1).max(earliest);
    let mut cache = HashMap::new();
    // A time window keeps younger snapshots too.
    if let Some(window) = inner.config.snapshot_time_retained_ms {
        let horizon = chrono::Utc::now().timestamp_millis() - window as i64;
        let mut id = earliest;
        while id < cut {
            if let Some(s) = commit::read_snapshot(w, &location, id).await? {
                if s.time_millis >= horizon {
                    break;
                }
            }
            id += 1;
        }
        cut = id;
    }
    if cut <= earliest {
        return Ok(0);
    }
    let mut retained = Refs::default();
    for id in cut..=latest {
        collect(w, &location, id, true, &mut retained, &mut cache).await?;
    }
    let mut expired = Refs::default();
    for id in earliest..cut {
        collect(w, &location, id, false, &mut expired, &mut cache).await?;
    }
    commit::put(
        w,
        &format!("{location}/snapshot/EARLIEST"),
        cut.to_string().into_bytes(),
    )
    .await?;
    for id in earliest..cut {
        commit::delete(w, &commit::snapshot_location(&location, id)).await?;
    }
    for (bucket, name) in expired.files.difference(&retained.files) {
        commit::delete(w, &format!("{location}/bucket-{bucket}/{name}")).await?;
    }
    for name in expired
        .manifests
        .difference(&retained.manifests)
        .chain(expired.lists.difference(&retained.lists))
    {
        commit::delete(w, &format!("{location}/manifest/{name}")).await?;
    }
    tracing::debug!(table = %handle.table, from = earliest, to = cut - 1, "expired snapshots");
    Ok((cut - earliest) as usize)
}
