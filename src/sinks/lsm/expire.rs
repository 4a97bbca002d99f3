//! Snapshot expiry: drops snapshots older than the newest `snapshots_retained` (and, when a time
//! window is set, older than it too), and deletes the data files no remaining snapshot holds live
//! and the manifests and manifest lists no remaining snapshot names.
//!
//! Order makes a crash harmless and the next expiry finish it: `EARLIEST` moves first (readers
//! stop looking at the expired snapshots), then the data files only the expired snapshots
//! referenced go, then their manifests, then their manifest lists, and the snapshot files last
//! (Paimon's `ExpireSnapshotsImpl` also deletes snapshot files after what they name). An expiry
//! starts at the lowest snapshot file still there, below the `EARLIEST` hint when a crash left
//! some, and skips the manifests and lists an interrupted expiry already deleted: every file
//! they named went before them. It runs without the table lock: files a new snapshot can
//! reference are live in the newest snapshot (retained) or new (never a candidate).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use super::manifest::{FileKind, ManifestEntry};
use super::partition::{PartitionKeys, Slot};
use super::snapshot;
use super::store;
use super::table::TableState;
use super::tables::{Handle, Tables};
use crate::config::LsmConfig;
use crate::failpoints;
use crate::metrics::maintenance as maintenance_metrics;
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
    /// (`_PARTITION` row, bucket, file name)
    pub(super) files: HashSet<(Vec<u8>, i32, String)>,
}

/// `<partition dirs>bucket-<n>/<name>`, the path under the table of `file` (a [`Refs`] entry)
/// of a table partitioned by `partitions`.
pub(super) fn file_path(
    partitions: &PartitionKeys,
    (row, bucket, name): &(Vec<u8>, i32, String),
) -> Result<String, String> {
    let slot = Slot {
        partition: partitions.decode(row)?,
        bucket: *bucket,
    };
    Ok(format!("{}/{name}", slot.dir()))
}

/// Which files of a snapshot [`collect`] adds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    /// Its live data files (ADD not undone by a DELETE), lists and manifests.
    Live,
    /// Every data file it ever listed, its lists and manifests.
    Listed,
    /// As `Listed`, for a snapshot being expired: a manifest list or manifest that is gone was
    /// deleted by an interrupted expiry, after every file it named.
    Expiring,
}

/// Adds what snapshot `id` references to `refs` (which files: `scope`). Returns `None` when the
/// snapshot is gone.
pub(super) async fn collect(
    w: &Warehouse,
    location: &str,
    id: i64,
    scope: Scope,
    refs: &mut Refs,
    cache: &mut HashMap<String, Vec<ManifestEntry>>,
) -> Result<Option<()>, SinkError> {
    let Some(s) = snapshot::read_snapshot(w, location, id).await? else {
        return Ok(None);
    };
    let live_only = scope == Scope::Live;
    let mut live: HashSet<(Vec<u8>, i32, String)> = HashSet::new();
    // A snapshot's changelog files go and stay with it (Paimon's changelog retention is the
    // snapshots': `changelog.num-retained.*` above them is refused, docs/table-settings.md).
    let lists = [&s.base_manifest_list, &s.delta_manifest_list]
        .into_iter()
        .chain(s.changelog_manifest_list.as_ref());
    for list in lists {
        refs.lists.insert(list.clone());
        let manifests = match scope {
            Scope::Expiring => snapshot::read_manifest_list_if_present(w, location, list).await?,
            Scope::Live | Scope::Listed => {
                Some(snapshot::read_manifest_list(w, location, list).await?)
            }
        };
        for m in manifests.into_iter().flatten() {
            refs.manifests.insert(m.file_name.clone());
            if !cache.contains_key(&m.file_name) {
                let entries = match scope {
                    Scope::Expiring => {
                        snapshot::read_manifest_if_present(w, location, &m.file_name).await?
                    }
                    Scope::Live | Scope::Listed => {
                        Some(snapshot::read_manifest(w, location, &m.file_name).await?)
                    }
                };
                let Some(entries) = entries else {
                    continue;
                };
                cache.insert(m.file_name.clone(), entries);
            }
            for e in cache.get(&m.file_name).into_iter().flatten() {
                let key = (e.partition.clone(), e.bucket, e.file.file_name.clone());
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

/// Expires old snapshots after the commit of `snapshot_id` when due ([`due`]); a failure is
/// logged and retried after a later commit (the commit itself stands).
pub(super) async fn expire_if_due(tables: &Tables, handle: &Handle, snapshot_id: i64) {
    let due = {
        let guard = handle.state.lock().await;
        guard.as_ref().is_some_and(|state| {
            due(
                state,
                &tables.config,
                handle.expiry_tried.load(Ordering::Acquire),
            )
        })
    };
    if !due {
        return;
    }
    handle.expiry_tried.store(snapshot_id, Ordering::Release);
    if let Err(e) = expire(tables, handle).await {
        tracing::warn!(table = %handle.table, error = %e, "snapshot expiry failed; retried after a later commit");
    }
}

/// Expires old snapshots of `handle`'s table. Returns how many were removed.
pub(super) async fn expire(tables: &Tables, handle: &Handle) -> Result<usize, SinkError> {
    let (location, latest, partitions, changelog) = {
        let guard = handle.state.lock().await;
        match guard.as_ref() {
            Some(s) => (
                s.location.clone(),
                s.snapshot_id(),
                s.partitions.clone(),
                ChangelogRetention::of(&s.schema.options),
            ),
            None => return Ok(0),
        }
    };
    let w = &tables.warehouse;
    let Some(hinted) = snapshot::earliest_id(w, &location, latest).await? else {
        return Ok(0);
    };
    let earliest = lowest_present(w, &location, hinted).await?;
    if earliest < hinted {
        tracing::info!(
            table = %handle.table,
            from = earliest,
            to = hinted - 1,
            "finishing an interrupted snapshot expiry"
        );
    }
    let own = Retention {
        min: tables.config.snapshots_retained.max(1) as i64,
        max: None,
        window_ms: tables.config.snapshot_time_retained_ms,
    };
    let mut cut = first_kept(w, own, &location, earliest, latest).await?;
    if let Some(changelog) = changelog {
        // A snapshot kept is its changelog kept (expire.rs deletes a snapshot's changelog files
        // with it): the changelog's retention keeps snapshots too.
        cut = cut.min(first_kept(w, changelog, &location, earliest, latest).await?);
    }
    // The hint never moves back: a time window may keep snapshots an interrupted count-based
    // expiry had already hinted past.
    let cut = cut.max(hinted);
    if cut <= earliest {
        return Ok(0);
    }
    let mut cache = HashMap::new();
    let mut retained = Refs::default();
    collect(w, &location, latest, Scope::Live, &mut retained, &mut cache).await?;
    let (live_files, manifests) = (retained.files.len(), retained.manifests.len());
    for id in cut..latest {
        collect(w, &location, id, Scope::Live, &mut retained, &mut cache).await?;
    }
    let mut expired = Refs::default();
    for id in earliest..cut {
        collect(w, &location, id, Scope::Expiring, &mut expired, &mut cache).await?;
    }
    if cut > hinted {
        store::put(
            w,
            &format!("{location}/snapshot/EARLIEST"),
            cut.to_string().into_bytes(),
        )
        .await?;
    }
    failpoints::crash_point(failpoints::LSM_EXPIRE_AFTER_HINT);
    let deleted_files = delete_unreferenced(w, &location, &partitions, &expired, &retained).await?;
    delete_snapshots(w, &location, earliest, cut).await?;
    tracing::debug!(table = %handle.table, from = earliest, to = cut - 1, "expired snapshots");
    let table = handle.table.to_string();
    let expired = (cut - earliest) as u64;
    maintenance_metrics::expiry(&table, expired, deleted_files as u64 + expired);
    maintenance_metrics::table_shape(
        &table,
        (latest - cut + 1) as u64,
        live_files as u64,
        manifests as u64,
    );
    Ok(expired as usize)
}

/// The lowest snapshot present, from the `EARLIEST` hint down: snapshot files below the hint are
/// an expiry that crashed after moving it (module doc).
async fn lowest_present(w: &Warehouse, location: &str, hinted: i64) -> Result<i64, SinkError> {
    let mut earliest = hinted;
    while earliest > 1
        && store::read(w, &snapshot::snapshot_location(location, earliest - 1))
            .await?
            .is_some()
    {
        earliest -= 1;
    }
    Ok(earliest)
}

/// How many snapshots (or changelogs) to keep: the newest `min`, those younger than
/// `window_ms` too, but never more than `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Retention {
    pub(super) min: i64,
    pub(super) max: Option<i64>,
    pub(super) window_ms: Option<u64>,
}

/// A changelog table's retention (`changelog-producer = input`): Paimon's
/// `changelog.num-retained.min` (default 1), `changelog.num-retained.max` and
/// `changelog.time-retained` table options, or `None` when the table keeps no changelog or sets
/// none of them. Unreadable values are left out with a warning (another writer's word).
pub(super) struct ChangelogRetention;

impl ChangelogRetention {
    pub(super) fn of(options: &std::collections::BTreeMap<String, String>) -> Option<Retention> {
        if options.get("changelog-producer").map(String::as_str) != Some("input") {
            return None;
        }
        let number = |name: &str| -> Option<i64> {
            let v = options.get(name)?;
            let n = v.trim().parse::<i64>().ok().filter(|&n| n > 0);
            if n.is_none() {
                tracing::warn!(option = name, value = %v, "unreadable Paimon table option; ignored");
            }
            n
        };
        let (min, max) = (
            number("changelog.num-retained.min"),
            number("changelog.num-retained.max"),
        );
        let window_ms = options.get("changelog.time-retained").and_then(|v| {
            let d = duration_ms(v);
            if d.is_none() {
                tracing::warn!(option = "changelog.time-retained", value = %v, "unreadable Paimon table option; ignored");
            }
            d
        });
        if min.is_none() && max.is_none() && window_ms.is_none() {
            return None;
        }
        Some(Retention {
            min: min.unwrap_or(1),
            max,
            window_ms,
        })
    }
}

/// A Paimon duration text (`TimeUtils.parseDuration`: `500 ms`, `30 s`, `10 min`, `1 h`, `2 d`,
/// long unit names too; a bare number is milliseconds) in milliseconds.
pub(super) fn duration_ms(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_lowercase();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let per: u64 = match unit.trim() {
        "" | "ms" | "milli" | "millis" | "millisecond" | "milliseconds" => 1,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000,
        "h" | "hour" | "hours" => 3_600_000,
        "d" | "day" | "days" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(per)
}

/// The oldest snapshot to keep under `keep`: the newest `keep.min`, with a time window any
/// younger than it too, and with a `max` no more than that many.
async fn first_kept(
    w: &Warehouse,
    keep: Retention,
    location: &str,
    earliest: i64,
    latest: i64,
) -> Result<i64, SinkError> {
    let cut = (latest - keep.min.max(1) + 1).max(earliest);
    let at_most = keep
        .max
        .map_or(earliest, |max| (latest - max + 1).max(earliest));
    // A time window keeps younger snapshots too.
    let Some(window) = keep.window_ms else {
        return Ok(cut.max(at_most));
    };
    let horizon = chrono::Utc::now().timestamp_millis() - window as i64;
    let mut id = earliest;
    while id < cut {
        if let Some(s) = snapshot::read_snapshot(w, location, id).await? {
            if s.time_millis >= horizon {
                break;
            }
        }
        id += 1;
    }
    Ok(id.max(at_most))
}

/// Deletes what the expired snapshots referenced and no retained one does, in dependency order:
/// what a file names goes before it (module doc). Returns how many files that was.
async fn delete_unreferenced(
    w: &Warehouse,
    location: &str,
    partitions: &PartitionKeys,
    expired: &Refs,
    retained: &Refs,
) -> Result<usize, SinkError> {
    let mut doomed: Vec<String> = expired
        .files
        .difference(&retained.files)
        .map(|file| {
            file_path(partitions, file)
                .map(|path| format!("{location}/{path}"))
                .map_err(|e| store::corrupt(&format!("{location}/manifest"), e))
        })
        .collect::<Result<_, _>>()?;
    doomed.extend(
        expired
            .manifests
            .difference(&retained.manifests)
            .chain(expired.lists.difference(&retained.lists))
            .map(|name| format!("{location}/manifest/{name}")),
    );
    let half = doomed.len() / 2;
    for (i, file) in doomed.iter().enumerate() {
        if i == half {
            failpoints::crash_point(failpoints::LSM_EXPIRE_DURING_DELETE);
        }
        store::delete(w, file).await?;
    }
    Ok(doomed.len())
}

/// Deletes snapshot files `earliest..cut`, oldest first.
async fn delete_snapshots(
    w: &Warehouse,
    location: &str,
    earliest: i64,
    cut: i64,
) -> Result<(), SinkError> {
    let middle = earliest + (cut - earliest) / 2;
    for id in earliest..cut {
        if id == middle {
            failpoints::crash_point(failpoints::LSM_EXPIRE_DURING_SNAPSHOTS);
        }
        store::delete(w, &snapshot::snapshot_location(location, id)).await?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod retention_tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn paimon_durations_read_in_milliseconds() {
        assert_eq!(duration_ms("500 ms"), Some(500));
        assert_eq!(duration_ms("30s"), Some(30_000));
        assert_eq!(duration_ms("10 min"), Some(600_000));
        assert_eq!(duration_ms("1 h"), Some(3_600_000));
        assert_eq!(duration_ms("2 days"), Some(172_800_000));
        assert_eq!(duration_ms("1500"), Some(1500));
        assert_eq!(duration_ms("a while"), None);
    }

    #[test]
    fn changelog_options_count_only_on_a_changelog_table() {
        let mut o = BTreeMap::from([("changelog.num-retained.min".to_owned(), "50".to_owned())]);
        assert_eq!(ChangelogRetention::of(&o), None, "no changelog-producer");
        o.insert("changelog-producer".into(), "input".into());
        let want = Retention {
            min: 50,
            max: None,
            window_ms: None,
        };
        assert_eq!(ChangelogRetention::of(&o), Some(want));
        o.insert("changelog.num-retained.max".into(), "80".into());
        o.insert("changelog.time-retained".into(), "1 h".into());
        let want = Retention {
            min: 50,
            max: Some(80),
            window_ms: Some(3_600_000),
        };
        assert_eq!(ChangelogRetention::of(&o), Some(want));
        let bare = BTreeMap::from([("changelog-producer".to_owned(), "input".to_owned())]);
        assert_eq!(
            ChangelogRetention::of(&bare),
            None,
            "the snapshots' retention"
        );
    }
}
