//! Which snapshots and refs expire: a pure decision over the table's snapshots, refs and
//! retention properties (no I/O; `expire_snapshots.rs` carries it out). Follows Iceberg-Java's
//! `RemoveSnapshots`:
//!
//! - a ref other than `main` whose snapshot is older than its `max-ref-age-ms` (the ref's own or
//!   the table's `history.expire.max-ref-age-ms`) is removed;
//! - each remaining branch keeps the ancestors of its head while fewer than
//!   `min-snapshots-to-keep` are kept or the ancestor is younger than `max-snapshot-age-ms`
//!   (the branch's own values or the table's); a tag keeps its snapshot;
//! - a snapshot no ref reaches is kept while younger than the table's `max-snapshot-age-ms`;
//! - everything else expires.
//!
//! cdcd adds two rules: the current snapshot is always kept (it carries `cdcd.position`), and so
//! is the newest ancestor of `main` carrying this pipeline's checkpoint (another engine's commit
//! on top of cdcd's has none, and the checkpoint is how cdcd resumes). At most `limit` snapshots
//! expire per cycle, the oldest first, so a cycle's work is bounded.

use std::collections::{BTreeSet, HashMap, HashSet};

use iceberg::spec::{SnapshotReference, SnapshotRetention};

use super::properties::Retention;

/// `main`: never removed by age.
pub const MAIN: &str = "main";

/// What the decision needs to know of one snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub id: i64,
    pub parent: Option<i64>,
    pub timestamp_ms: i64,
}

/// What expires.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expiry {
    /// Snapshot ids removed from the metadata, oldest first.
    pub snapshots: Vec<i64>,
    /// Refs removed (too old).
    pub refs: Vec<String>,
}

impl Expiry {
    pub fn is_empty(&self) -> bool {
        self.snapshots.is_empty() && self.refs.is_empty()
    }
}

/// What to keep pinned beside the properties' rules.
#[derive(Debug, Clone, Copy)]
pub struct Pins {
    pub current: Option<i64>,
    /// The newest snapshot carrying this pipeline's checkpoint.
    pub checkpoint: Option<i64>,
}

/// Decides what expires at `now_ms`; see the module doc.
pub fn choose(
    snapshots: &[SnapshotInfo],
    refs: &HashMap<String, SnapshotReference>,
    retention: &Retention,
    pins: Pins,
    now_ms: i64,
    limit: usize,
) -> Expiry {
    if !retention.gc_enabled || !retention.expiry_enabled {
        return Expiry::default();
    }
    let by_id: HashMap<i64, &SnapshotInfo> = snapshots.iter().map(|s| (s.id, s)).collect();
    let older_than = |age: i64| now_ms.saturating_sub(age);
    let mut removed_refs = Vec::new();
    let mut kept_refs = Vec::new();
    for (name, r) in refs {
        let Some(head) = by_id.get(&r.snapshot_id) else {
            continue;
        };
        let max_ref_age = match &r.retention {
            SnapshotRetention::Branch { max_ref_age_ms, .. }
            | SnapshotRetention::Tag { max_ref_age_ms } => {
                max_ref_age_ms.unwrap_or(retention.max_ref_age_ms)
            }
        };
        if name != MAIN && head.timestamp_ms < older_than(max_ref_age) {
            removed_refs.push(name.clone());
        } else {
            kept_refs.push(r);
        }
    }
    removed_refs.sort();

    let mut retain: HashSet<i64> = HashSet::new();
    // Every snapshot some kept ref reaches through its ancestry (retained or not).
    let mut referenced: HashSet<i64> = HashSet::new();
    for r in &kept_refs {
        match &r.retention {
            SnapshotRetention::Tag { .. } => {
                retain.insert(r.snapshot_id);
                referenced.insert(r.snapshot_id);
            }
            SnapshotRetention::Branch {
                min_snapshots_to_keep,
                max_snapshot_age_ms,
                ..
            } => {
                let min = min_snapshots_to_keep
                    .and_then(|m| usize::try_from(m).ok())
                    .unwrap_or(retention.min_snapshots_to_keep)
                    .max(1);
                let cutoff =
                    older_than(max_snapshot_age_ms.unwrap_or(retention.max_snapshot_age_ms));
                let mut kept = 0usize;
                let mut keeping = true;
                for s in ancestors(r.snapshot_id, &by_id) {
                    referenced.insert(s.id);
                    if keeping && (kept < min || s.timestamp_ms >= cutoff) {
                        retain.insert(s.id);
                        kept += 1;
                    } else {
                        keeping = false;
                    }
                }
            }
        }
    }
    let cutoff = older_than(retention.max_snapshot_age_ms);
    for s in snapshots {
        if !referenced.contains(&s.id) && s.timestamp_ms >= cutoff {
            retain.insert(s.id);
        }
    }
    retain.extend(pins.current);
    retain.extend(pins.checkpoint);

    let mut expired: Vec<&SnapshotInfo> = snapshots
        .iter()
        .filter(|s| !retain.contains(&s.id))
        .collect();
    expired.sort_by_key(|s| (s.timestamp_ms, s.id));
    expired.truncate(limit);
    Expiry {
        snapshots: expired.iter().map(|s| s.id).collect(),
        refs: removed_refs,
    }
}

/// The first time (ms, after `now_ms`) at which [`choose`] would expire a snapshot or remove a
/// ref if the table stays as it is (`None`: never, e.g. only the current snapshot is left). What
/// lets maintenance leave an idle table alone until then (`cycle.rs`).
///
/// Exact: whether something expires changes only when a cutoff (`now` minus one of the ages the
/// rules use) passes a snapshot's timestamp, so the candidates are `timestamp + age + 1` for every
/// snapshot and age; and `choose` only expires more as time passes (every cutoff moves forward),
/// so the first candidate at which it expires something is found by bisection.
pub fn next_due(
    snapshots: &[SnapshotInfo],
    refs: &HashMap<String, SnapshotReference>,
    retention: &Retention,
    pins: Pins,
    now_ms: i64,
) -> Option<i64> {
    let mut ages = vec![retention.max_snapshot_age_ms, retention.max_ref_age_ms];
    for r in refs.values() {
        match &r.retention {
            SnapshotRetention::Branch {
                max_snapshot_age_ms,
                max_ref_age_ms,
                ..
            } => ages.extend(max_snapshot_age_ms.iter().chain(max_ref_age_ms)),
            SnapshotRetention::Tag { max_ref_age_ms } => ages.extend(max_ref_age_ms),
        }
    }
    ages.sort_unstable();
    ages.dedup();
    let mut candidates: Vec<i64> = snapshots
        .iter()
        .flat_map(|s| {
            ages.iter()
                .map(move |a| s.timestamp_ms.saturating_add(*a).saturating_add(1))
        })
        .filter(|&t| t > now_ms)
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    let expires = |t: i64| !choose(snapshots, refs, retention, pins, t, 1).is_empty();
    let first = candidates.partition_point(|&t| !expires(t));
    candidates.get(first).copied()
}

/// `head` and its ancestors, newest first (stops at a missing parent or a cycle).
fn ancestors<'a>(
    head: i64,
    by_id: &'a HashMap<i64, &'a SnapshotInfo>,
) -> impl Iterator<Item = &'a SnapshotInfo> + 'a {
    let mut seen = BTreeSet::new();
    let mut next = by_id.get(&head).copied();
    std::iter::from_fn(move || {
        let s = next?;
        if !seen.insert(s.id) {
            return None;
        }
        next = s.parent.and_then(|p| by_id.get(&p).copied());
        Some(s)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    /// A chain of `n` snapshots, ids 1..=n, one a minute, the newest at `now`.
    fn chain(n: i64, now: i64) -> Vec<SnapshotInfo> {
        (1..=n)
            .map(|id| SnapshotInfo {
                id,
                parent: (id > 1).then_some(id - 1),
                timestamp_ms: now - (n - id) * MIN,
            })
            .collect()
    }

    fn main_at(id: i64) -> HashMap<String, SnapshotReference> {
        HashMap::from([(
            MAIN.to_owned(),
            SnapshotReference::new(id, SnapshotRetention::branch(None, None, None)),
        )])
    }

    fn retention(min: usize, age_ms: i64) -> Retention {
        Retention {
            delete_after_commit: true,
            previous_versions_max: 100,
            max_snapshot_age_ms: age_ms,
            min_snapshots_to_keep: min,
            max_ref_age_ms: i64::MAX,
            gc_enabled: true,
            expiry_enabled: true,
            delete_delay_ms: 0,
        }
    }

    fn pins(current: i64) -> Pins {
        Pins {
            current: Some(current),
            checkpoint: Some(current),
        }
    }

    #[test]
    fn keeps_the_minimum_when_all_are_old() {
        let now = 100 * MIN;
        let s = chain(10, now);
        let e = choose(&s, &main_at(10), &retention(3, 1), pins(10), now, 1000);
        assert_eq!(e.snapshots, vec![1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn keeps_what_is_younger_than_the_age() {
        let now = 100 * MIN;
        let four_minutes = |s: &[SnapshotInfo]| {
            choose(s, &main_at(10), &retention(1, 4 * MIN), pins(10), now, 1000)
        };
        let s = chain(10, now);
        // Snapshots 6..=10 are at most 4 minutes old.
        let e = four_minutes(&s);
        assert_eq!(e.snapshots, vec![1, 2, 3, 4, 5]);
        // An old one stops the walk even if a younger ancestor follows (Iceberg-Java).
        let mut s = chain(10, now);
        s[2].timestamp_ms = now; // snapshot 3 claims to be young
        let e = four_minutes(&s);
        // (Oldest first by timestamp: 3 comes last.)
        assert_eq!(e.snapshots, vec![1, 2, 4, 5, 3]);
    }

    #[test]
    fn current_and_checkpoint_are_always_kept() {
        let now = 100 * MIN;
        let s = chain(10, now);
        let p = Pins {
            current: Some(10),
            checkpoint: Some(8),
        };
        let e = choose(&s, &main_at(10), &retention(1, 1), p, now, 1000);
        assert_eq!(e.snapshots, vec![1, 2, 3, 4, 5, 6, 7, 9]);
    }

    #[test]
    fn limit_takes_the_oldest_first() {
        let now = 100 * MIN;
        let s = chain(10, now);
        let e = choose(&s, &main_at(10), &retention(1, 1), pins(10), now, 3);
        assert_eq!(e.snapshots, vec![1, 2, 3]);
    }

    #[test]
    fn gc_disabled_expires_nothing() {
        let now = 100 * MIN;
        let s = chain(10, now);
        let mut r = retention(1, 1);
        r.gc_enabled = false;
        assert!(choose(&s, &main_at(10), &r, pins(10), now, 1000).is_empty());
        // cdcd's own expiry off (another engine expires this table).
        let mut r = retention(1, 1);
        r.expiry_enabled = false;
        assert!(choose(&s, &main_at(10), &r, pins(10), now, 1000).is_empty());
    }

    #[test]
    fn tags_and_branches_keep_their_snapshots_until_the_ref_ages_out() {
        let now = 100 * MIN;
        let s = chain(10, now);
        let mut refs = main_at(10);
        refs.insert(
            "audit".into(),
            SnapshotReference::new(
                3,
                SnapshotRetention::Tag {
                    max_ref_age_ms: None,
                },
            ),
        );
        refs.insert(
            "old".into(),
            SnapshotReference::new(
                2,
                SnapshotRetention::Tag {
                    max_ref_age_ms: Some(MIN),
                },
            ),
        );
        let e = choose(&s, &refs, &retention(1, 1), pins(10), now, 1000);
        assert_eq!(e.refs, vec!["old".to_owned()]);
        assert_eq!(e.snapshots, vec![1, 2, 4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn unreferenced_snapshots_follow_the_table_age() {
        let now = 100 * MIN;
        let mut s = chain(5, now);
        // A rolled-back snapshot off 3, young, and an old one off 2.
        s.push(SnapshotInfo {
            id: 20,
            parent: Some(3),
            timestamp_ms: now,
        });
        s.push(SnapshotInfo {
            id: 21,
            parent: Some(2),
            timestamp_ms: 0,
        });
        let e = choose(&s, &main_at(5), &retention(5, 10 * MIN), pins(5), now, 1000);
        assert_eq!(e.snapshots, vec![21]);
    }

    /// Issue 37: an idle table is left alone until its next expiry is due, and that time is
    /// exact: nothing expires a millisecond before it, something at it.
    #[test]
    fn next_due_is_the_first_moment_something_expires() {
        let now = 100 * MIN;
        // Five snapshots a minute apart, the newest now; kept while younger than 10 minutes.
        let s = chain(5, now);
        let r = retention(1, 10 * MIN);
        assert!(choose(&s, &main_at(5), &r, pins(5), now, 1000).is_empty());
        let due = next_due(&s, &main_at(5), &r, pins(5), now).unwrap();
        assert_eq!(due, s[0].timestamp_ms + 10 * MIN + 1);
        assert!(choose(&s, &main_at(5), &r, pins(5), due - 1, 1000).is_empty());
        assert_eq!(
            choose(&s, &main_at(5), &r, pins(5), due, 1000).snapshots,
            vec![1]
        );
        // Only the current snapshot, or every one kept by min-snapshots-to-keep: never.
        assert_eq!(next_due(&s[4..], &main_at(5), &r, pins(5), now), None);
        let all = retention(5, 10 * MIN);
        assert_eq!(next_due(&s, &main_at(5), &all, pins(5), now), None);
        // A branch's own shorter age counts: the ref leaves a minute from now.
        let mut refs = main_at(5);
        refs.insert(
            "audit".to_owned(),
            SnapshotReference::new(5, SnapshotRetention::branch(None, None, Some(MIN))),
        );
        let due = next_due(&s, &refs, &r, pins(5), now).unwrap();
        assert_eq!(due, now + MIN + 1);
        assert!(choose(&s, &refs, &r, pins(5), due - 1, 1000).is_empty());
        assert!(!choose(&s, &refs, &r, pins(5), due, 1000).is_empty());
    }
}
