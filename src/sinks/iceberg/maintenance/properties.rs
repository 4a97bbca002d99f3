//! The Iceberg table properties cdcd's maintenance honours, read from a table's *current*
//! metadata on every commit and every cycle (so `ALTER TABLE … SET TBLPROPERTIES` from Spark or
//! Trino applies at once), with Iceberg-Java's defaults where a table does not set one; and the
//! properties cdcd writes into the tables it creates (its own defaults, then
//! `[sink.table_properties]`).
//!
//! Names and defaults: Iceberg's "Table properties" page (`TableProperties.java`).

use std::collections::{BTreeMap, HashMap};

pub const DELETE_AFTER_COMMIT: &str = "write.metadata.delete-after-commit.enabled";
pub const PREVIOUS_VERSIONS_MAX: &str = "write.metadata.previous-versions-max";
pub const MAX_SNAPSHOT_AGE_MS: &str = "history.expire.max-snapshot-age-ms";
pub const MIN_SNAPSHOTS_TO_KEEP: &str = "history.expire.min-snapshots-to-keep";
pub const MAX_REF_AGE_MS: &str = "history.expire.max-ref-age-ms";
pub const GC_ENABLED: &str = "gc.enabled";
/// cdcd's own snapshot expiry on this table (default true); false leaves expiry to another
/// engine (Spark's `expire_snapshots`, which `gc.enabled = false` would refuse too).
pub const EXPIRY_ENABLED: &str = "cdcd.expiry.enabled";
/// How long after an expiry committed the files only its snapshots reached are deleted (default
/// 0: at once, as Iceberg-Java's `ExpireSnapshots`). What keeps a reader's scan of a snapshot
/// safe once the snapshot has left the metadata (`pending_deletes.rs`).
pub const DELETE_DELAY_MS: &str = "cdcd.expiry.delete-delay-ms";
pub const MANIFEST_MERGE_ENABLED: &str = "commit.manifest-merge.enabled";
pub const MIN_COUNT_TO_MERGE: &str = "commit.manifest.min-count-to-merge";
pub const MANIFEST_TARGET_SIZE_BYTES: &str = "commit.manifest.target-size-bytes";
pub const TARGET_FILE_SIZE_BYTES: &str = "write.target-file-size-bytes";
/// cdcd's own (Iceberg has no table property for them: Iceberg-Java's `rewrite_data_files`
/// takes them as options of each call; a daemon needs them per table, so they live beside it).
pub const COMPACTION_ENABLED: &str = "cdcd.compaction.enabled";
pub const COMPACTION_MAX_BYTES_PER_CYCLE: &str = "cdcd.compaction.max-bytes-per-cycle";
pub const COMPACTION_MAX_ROWS_PER_CYCLE: &str = "cdcd.compaction.max-rows-per-cycle";
pub const COMPACTION_MIN_INPUT_FILES: &str = "cdcd.compaction.min-input-files";
/// Small data files at which a commit asks for a cycle of its table before the next interval.
pub const COMPACTION_TRIGGER_SMALL_FILES: &str = "cdcd.compaction.trigger-small-files";
pub const COMPACTION_DELETE_RATIO_PERCENT: &str = "cdcd.compaction.delete-ratio-percent";

/// Iceberg-Java's defaults.
const DEFAULT_PREVIOUS_VERSIONS_MAX: usize = 100;
const DEFAULT_MAX_SNAPSHOT_AGE_MS: i64 = 5 * 24 * 60 * 60 * 1000;
const DEFAULT_MIN_SNAPSHOTS_TO_KEEP: usize = 1;
const DEFAULT_MIN_COUNT_TO_MERGE: usize = 100;
pub(crate) const DEFAULT_MANIFEST_TARGET_SIZE_BYTES: u64 = 8 * 1024 * 1024;
/// Iceberg-Java's `RewriteDataFiles` defaults: `min-input-files` 5, `delete-ratio-threshold` 0.3.
const DEFAULT_MIN_INPUT_FILES: usize = 5;
/// A streaming commit adds one small file: at the default cadence (a commit per second, a cycle
/// per 60 s) a table never reaches 64 between cycles, so the trigger adds no work there; a table
/// committing faster gets a cycle per 64 commits instead of per interval, which bounds the files a
/// reader opens whatever the commit rate. (At 16 the bench ran a cycle every ~11 commits, cost 15 %
/// of the streaming rate and left DuckDB's local scan where it was: docs/performance.md.)
const DEFAULT_TRIGGER_SMALL_FILES: usize = 64;
const DEFAULT_DELETE_RATIO_PERCENT: u64 = 30;

/// The target data file size when a table does not set `write.target-file-size-bytes`: 128 MiB,
/// the size cdcd's writer rolls files at, instead of Iceberg-Java's 512 MiB. A compaction holds
/// its output's encoded bytes in memory until it puts the file, and Iceberg's default is sized
/// for Spark executors, not for a daemon beside replication.
pub const CDCD_TARGET_FILE_SIZE_BYTES: u64 = 128 * 1024 * 1024;
/// Input bytes one compaction cycle rewrites at most, per table: 64 MiB. The streaming commits
/// of the table wait while its compaction runs (compaction/mod.rs says why), so this bounds that
/// wait (a few seconds) and the encoded output the cycle holds.
pub const CDCD_COMPACTION_MAX_BYTES_PER_CYCLE: u64 = 64 * 1024 * 1024;
/// Input rows one compaction cycle rewrites at most, per table: 2M. After its commit the
/// rewritten rows' keys move in the primary-key index while the table's commits wait, and the
/// outputs' keys are held until then; bytes do not bound rows where rows compress well (64 MiB
/// of pgbench's accounts is 24M rows, whose move held the table's commits 70 s). About 64 MiB
/// of rows of ~30 compressed bytes, so it rarely binds before the byte budget.
pub const CDCD_COMPACTION_MAX_ROWS_PER_CYCLE: u64 = 2_000_000;

/// The snapshot age cdcd writes into the tables it creates: one minute instead of Iceberg's 5
/// days, and [`CDCD_DELETE_DELAY_MS`] beside it. A CDC table commits about once a second, and
/// every snapshot kept is an entry (~1 KB) in every `vN.metadata.json` each commit writes: five
/// days are ~430,000 entries (~600 MB per commit); ten minutes, cdcd's default until issue 37,
/// were ~600 entries, ~0.8 MB serialized and written per commit and per table, which is what made
/// the 1,000-table run fall behind from its fifth minute (docs/performance.md). A snapshot in the
/// metadata serves time travel; what a reader's running scan needs is the snapshot's *files*,
/// which the delete delay keeps. A table that wants time travel sets the property (config or
/// `ALTER TABLE`).
pub const CDCD_MAX_SNAPSHOT_AGE_MS: i64 = 60 * 1000;

/// The delete delay cdcd writes into the tables it creates: four minutes. A scan planned on a
/// snapshot finds its files for at least the snapshot's age in the metadata plus this delay
/// (five minutes at cdcd's defaults), while the metadata holds one minute of snapshots; the
/// files on disk are those of the last five minutes' snapshots, so they stop growing five
/// minutes into a steady load.
pub const CDCD_DELETE_DELAY_MS: i64 = 4 * 60 * 1000;

/// The manifest count that triggers a merge in the tables cdcd creates: 16 instead of Iceberg's
/// 100. Iceberg's default suits batch writers that commit a few times an hour; a CDC table
/// commits about once a second, adding a data and a delete manifest each time, so with 100 a
/// reader plans up to ~200 manifests per scan (one GET each) and the list is merged only every
/// ~100 s. With 16 the current snapshot names at most ~17 small manifests of each kind besides
/// the merged ones, and a merge reads only those few small files (and the newest merged
/// manifest while it is under `commit.manifest.target-size-bytes`).
pub const CDCD_MIN_COUNT_TO_MERGE: usize = 16;

/// The properties a table cdcd creates starts with: cdcd's maintenance defaults, overridden by
/// `configured` (`[sink.table_properties]`).
pub fn for_new_table(configured: &BTreeMap<String, String>) -> HashMap<String, String> {
    let mut properties = HashMap::from([
        ("write.format.default".to_owned(), "parquet".to_owned()),
        (DELETE_AFTER_COMMIT.to_owned(), "true".to_owned()),
        (
            PREVIOUS_VERSIONS_MAX.to_owned(),
            DEFAULT_PREVIOUS_VERSIONS_MAX.to_string(),
        ),
        (
            MAX_SNAPSHOT_AGE_MS.to_owned(),
            CDCD_MAX_SNAPSHOT_AGE_MS.to_string(),
        ),
        (DELETE_DELAY_MS.to_owned(), CDCD_DELETE_DELAY_MS.to_string()),
        (
            MIN_COUNT_TO_MERGE.to_owned(),
            CDCD_MIN_COUNT_TO_MERGE.to_string(),
        ),
    ]);
    properties.extend(configured.iter().map(|(k, v)| (k.clone(), v.clone())));
    properties
}

/// What a table's properties say about its maintenance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Delete metadata files that leave the metadata log after a commit.
    pub delete_after_commit: bool,
    /// Previous metadata files kept in the metadata log (at least 1).
    pub previous_versions_max: usize,
    /// Snapshots older than this may expire (milliseconds).
    pub max_snapshot_age_ms: i64,
    /// Ancestors of each branch head kept whatever their age (at least 1).
    pub min_snapshots_to_keep: usize,
    /// Refs other than `main` older than this are removed (milliseconds).
    pub max_ref_age_ms: i64,
    /// `gc.enabled`: when false, nothing is expired or deleted (Iceberg refuses expiry then).
    pub gc_enabled: bool,
    /// `cdcd.expiry.enabled`: when false, cdcd expires nothing (another engine does).
    pub expiry_enabled: bool,
    /// `cdcd.expiry.delete-delay-ms`: how long an expiry's files wait before deletion.
    pub delete_delay_ms: i64,
}

/// A property that is set but not a value of its type; cdcd stops maintaining the table rather
/// than guess (the table's data is unaffected).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("table property {key} = {value:?} is not {expected}: set it to {expected} (ALTER TABLE … SET TBLPROPERTIES or [sink.table_properties])")]
pub struct BadProperty {
    pub key: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl Retention {
    /// The retention `properties` (a table's current ones) describe.
    pub fn from_properties(properties: &HashMap<String, String>) -> Result<Retention, BadProperty> {
        let get = |key: &'static str| properties.get(key).map(|v| (key, v.trim()));
        Ok(Retention {
            delete_after_commit: flag(get(DELETE_AFTER_COMMIT), false)?,
            previous_versions_max: number(
                get(PREVIOUS_VERSIONS_MAX),
                DEFAULT_PREVIOUS_VERSIONS_MAX,
            )?
            .max(1),
            max_snapshot_age_ms: number(get(MAX_SNAPSHOT_AGE_MS), DEFAULT_MAX_SNAPSHOT_AGE_MS)?,
            min_snapshots_to_keep: number(
                get(MIN_SNAPSHOTS_TO_KEEP),
                DEFAULT_MIN_SNAPSHOTS_TO_KEEP,
            )?
            .max(1),
            max_ref_age_ms: number(get(MAX_REF_AGE_MS), i64::MAX)?,
            gc_enabled: flag(get(GC_ENABLED), true)?,
            expiry_enabled: flag(get(EXPIRY_ENABLED), true)?,
            delete_delay_ms: number(get(DELETE_DELAY_MS), 0)?,
        })
    }
}

/// What a table's properties say about merging manifests at commit (Iceberg-Java's
/// `MergingSnapshotProducer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Merging {
    /// `commit.manifest-merge.enabled`.
    pub enabled: bool,
    /// `commit.manifest.min-count-to-merge`: the newest bin of a kind is merged only when it
    /// holds at least this many manifests (at least 2: one manifest is never "merged").
    pub min_count: usize,
    /// `commit.manifest.target-size-bytes`: manifests are packed into bins of about this size.
    pub target_size_bytes: u64,
}

impl Merging {
    /// The merging `properties` (a table's current ones) describe.
    pub fn from_properties(properties: &HashMap<String, String>) -> Result<Merging, BadProperty> {
        let get = |key: &'static str| properties.get(key).map(|v| (key, v.trim()));
        Ok(Merging {
            enabled: flag(get(MANIFEST_MERGE_ENABLED), true)?,
            min_count: number(get(MIN_COUNT_TO_MERGE), DEFAULT_MIN_COUNT_TO_MERGE)?.max(2),
            target_size_bytes: number(
                get(MANIFEST_TARGET_SIZE_BYTES),
                DEFAULT_MANIFEST_TARGET_SIZE_BYTES,
            )?
            .max(1),
        })
    }
}

/// What a table's properties say about data-file compaction (Iceberg-Java's `RewriteDataFiles`
/// with its bin-pack strategy, bounded per cycle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    /// `cdcd.compaction.enabled` (default true).
    pub enabled: bool,
    /// `write.target-file-size-bytes`: the size rewritten files are packed to.
    pub target_file_size_bytes: u64,
    /// Files below this are small: 75% of the target (Iceberg's `min-file-size-bytes` default).
    pub min_file_size_bytes: u64,
    /// `cdcd.compaction.max-bytes-per-cycle`: input bytes rewritten per cycle at most (at least
    /// one file is, if it alone is larger).
    pub max_bytes_per_cycle: u64,
    /// `cdcd.compaction.max-rows-per-cycle`: input rows rewritten per cycle at most (at least
    /// one file is, if it alone has more).
    pub max_rows_per_cycle: u64,
    /// `cdcd.compaction.min-input-files`: small files needed for a rewrite that removes no
    /// deleted rows (at least 2: one file rewritten alone stays one file).
    pub min_input_files: usize,
    /// `cdcd.compaction.delete-ratio-percent`: a file whose deletion vector deletes at least this
    /// share of its rows is rewritten whatever its size (Iceberg's `delete-ratio-threshold`).
    pub delete_ratio_percent: u64,
    /// `cdcd.compaction.trigger-small-files`: a commit that leaves this many small data files in
    /// its table asks for a cycle of it before the next interval (0: never; at least
    /// `min_input_files`, so the cycle it asks for has something to rewrite).
    pub trigger_small_files: usize,
}

impl Compaction {
    /// The compaction `properties` (a table's current ones) describe.
    pub fn from_properties(
        properties: &HashMap<String, String>,
    ) -> Result<Compaction, BadProperty> {
        let get = |key: &'static str| properties.get(key).map(|v| (key, v.trim()));
        let target = number(get(TARGET_FILE_SIZE_BYTES), CDCD_TARGET_FILE_SIZE_BYTES)?.max(1);
        Ok(Compaction {
            enabled: flag(get(COMPACTION_ENABLED), true)?,
            target_file_size_bytes: target,
            min_file_size_bytes: target / 4 * 3,
            max_bytes_per_cycle: number(
                get(COMPACTION_MAX_BYTES_PER_CYCLE),
                CDCD_COMPACTION_MAX_BYTES_PER_CYCLE,
            )?
            .max(1),
            max_rows_per_cycle: number(
                get(COMPACTION_MAX_ROWS_PER_CYCLE),
                CDCD_COMPACTION_MAX_ROWS_PER_CYCLE,
            )?
            .max(1),
            min_input_files: number(get(COMPACTION_MIN_INPUT_FILES), DEFAULT_MIN_INPUT_FILES)?
                .max(2),
            delete_ratio_percent: number(
                get(COMPACTION_DELETE_RATIO_PERCENT),
                DEFAULT_DELETE_RATIO_PERCENT,
            )?
            .clamp(1, 100),
            trigger_small_files: number(
                get(COMPACTION_TRIGGER_SMALL_FILES),
                DEFAULT_TRIGGER_SMALL_FILES,
            )?,
        })
    }

    /// Whether a table whose live data files have `sizes` (bytes) asks for a cycle now.
    pub fn triggered(&self, sizes: impl Iterator<Item = u64>) -> bool {
        if !self.enabled || self.trigger_small_files == 0 {
            return false;
        }
        let at = self.trigger_small_files.max(self.min_input_files);
        sizes.filter(|&s| s < self.min_file_size_bytes).count() >= at
    }
}

/// Checks the properties cdcd honours in `configured` (`[sink.table_properties]`), so a typo
/// fails at start-up instead of at the first cycle.
pub fn check(configured: &BTreeMap<String, String>) -> Result<(), BadProperty> {
    let map: HashMap<String, String> = configured.clone().into_iter().collect();
    Retention::from_properties(&map)?;
    Compaction::from_properties(&map)?;
    Merging::from_properties(&map).map(|_| ())
}

fn flag(value: Option<(&'static str, &str)>, default: bool) -> Result<bool, BadProperty> {
    match value {
        None => Ok(default),
        Some((key, v)) => match v.to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(BadProperty {
                key,
                value: v.to_owned(),
                expected: "true or false",
            }),
        },
    }
}

fn number<T: std::str::FromStr + PartialOrd + Default>(
    value: Option<(&'static str, &str)>,
    default: T,
) -> Result<T, BadProperty> {
    match value {
        None => Ok(default),
        Some((key, v)) => match v.parse::<T>() {
            Ok(n) if n >= T::default() => Ok(n),
            _ => Err(BadProperty {
                key,
                value: v.to_owned(),
                expected: "a non-negative integer",
            }),
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unset_properties_take_iceberg_defaults() {
        let r = Retention::from_properties(&HashMap::new()).unwrap();
        assert!(!r.delete_after_commit);
        assert_eq!(r.previous_versions_max, 100);
        assert_eq!(r.max_snapshot_age_ms, 5 * 24 * 3600 * 1000);
        assert_eq!(r.min_snapshots_to_keep, 1);
        assert_eq!(r.max_ref_age_ms, i64::MAX);
        assert!(r.gc_enabled);
        assert_eq!(r.delete_delay_ms, 0, "Iceberg deletes at once");
    }

    #[test]
    fn new_tables_get_cdcd_defaults_then_the_config() {
        let configured = BTreeMap::from([(MIN_SNAPSHOTS_TO_KEEP.to_owned(), "3".to_owned())]);
        let p = for_new_table(&configured);
        let r = Retention::from_properties(&p).unwrap();
        assert!(r.delete_after_commit);
        assert_eq!(r.max_snapshot_age_ms, CDCD_MAX_SNAPSHOT_AGE_MS);
        assert_eq!(r.delete_delay_ms, CDCD_DELETE_DELAY_MS);
        assert_eq!(r.min_snapshots_to_keep, 3);
        let overridden = BTreeMap::from([(DELETE_AFTER_COMMIT.to_owned(), "false".to_owned())]);
        assert!(
            !Retention::from_properties(&for_new_table(&overridden))
                .unwrap()
                .delete_after_commit
        );
    }

    #[test]
    fn merging_defaults_then_cdcd_then_the_table() {
        let iceberg = Merging::from_properties(&HashMap::new()).unwrap();
        assert!(iceberg.enabled);
        assert_eq!(iceberg.min_count, 100);
        assert_eq!(iceberg.target_size_bytes, 8 << 20);
        let created = Merging::from_properties(&for_new_table(&BTreeMap::new())).unwrap();
        assert_eq!(created.min_count, CDCD_MIN_COUNT_TO_MERGE);
        let set = Merging::from_properties(&props(&[
            (MANIFEST_MERGE_ENABLED, "FALSE"),
            (MIN_COUNT_TO_MERGE, "5"),
            (MANIFEST_TARGET_SIZE_BYTES, "1024"),
        ]))
        .unwrap();
        assert_eq!(
            set,
            Merging {
                enabled: false,
                min_count: 5,
                target_size_bytes: 1024
            }
        );
        let e = Merging::from_properties(&props(&[(MIN_COUNT_TO_MERGE, "ten")])).unwrap_err();
        assert_eq!(e.key, MIN_COUNT_TO_MERGE);
        let bad = BTreeMap::from([(MANIFEST_TARGET_SIZE_BYTES.to_owned(), "8MB".to_owned())]);
        assert_eq!(check(&bad).unwrap_err().key, MANIFEST_TARGET_SIZE_BYTES);
    }

    #[test]
    fn compaction_defaults_then_the_table() {
        let d = Compaction::from_properties(&HashMap::new()).unwrap();
        assert!(d.enabled);
        assert_eq!(d.target_file_size_bytes, CDCD_TARGET_FILE_SIZE_BYTES);
        assert_eq!(d.min_file_size_bytes, 96 << 20);
        assert_eq!(d.max_bytes_per_cycle, CDCD_COMPACTION_MAX_BYTES_PER_CYCLE);
        assert_eq!(d.max_rows_per_cycle, CDCD_COMPACTION_MAX_ROWS_PER_CYCLE);
        assert_eq!((d.min_input_files, d.delete_ratio_percent), (5, 30));
        let set = Compaction::from_properties(&props(&[
            (TARGET_FILE_SIZE_BYTES, "4000"),
            (COMPACTION_ENABLED, "false"),
            (COMPACTION_MIN_INPUT_FILES, "1"),
            (COMPACTION_DELETE_RATIO_PERCENT, "500"),
        ]))
        .unwrap();
        assert_eq!(
            (set.enabled, set.min_file_size_bytes, set.min_input_files),
            (false, 3000, 2)
        );
        assert_eq!(set.delete_ratio_percent, 100);
        let bad = BTreeMap::from([(TARGET_FILE_SIZE_BYTES.to_owned(), "1GB".to_owned())]);
        assert_eq!(check(&bad).unwrap_err().key, TARGET_FILE_SIZE_BYTES);
    }

    #[test]
    fn enough_small_files_trigger_a_cycle() {
        let small = |n: usize| std::iter::repeat_n(10u64, n).chain([200 << 20]);
        let d = Compaction::from_properties(&HashMap::new()).unwrap();
        assert_eq!(d.trigger_small_files, 64);
        assert!(!d.triggered(small(63)));
        assert!(d.triggered(small(64)));
        let off = Compaction::from_properties(&props(&[(COMPACTION_TRIGGER_SMALL_FILES, "0")]));
        assert!(!off.unwrap().triggered(small(100)));
        // Never below what a rewrite needs.
        let low = Compaction::from_properties(&props(&[
            (COMPACTION_TRIGGER_SMALL_FILES, "2"),
            (COMPACTION_MIN_INPUT_FILES, "6"),
        ]))
        .unwrap();
        assert!(!low.triggered(small(5)) && low.triggered(small(6)));
        let disabled = Compaction::from_properties(&props(&[(COMPACTION_ENABLED, "false")]));
        assert!(!disabled.unwrap().triggered(small(100)));
    }

    #[test]
    fn a_bad_value_names_the_property() {
        let e =
            Retention::from_properties(&props(&[(MIN_SNAPSHOTS_TO_KEEP, "three")])).unwrap_err();
        assert_eq!(e.key, MIN_SNAPSHOTS_TO_KEEP);
        assert!(e
            .to_string()
            .contains("history.expire.min-snapshots-to-keep"));
        assert!(Retention::from_properties(&props(&[(GC_ENABLED, "yes")])).is_err());
        assert!(Retention::from_properties(&props(&[(MAX_SNAPSHOT_AGE_MS, "-5")])).is_err());
        // Zero minimums mean one: the current snapshot is always kept.
        let r = Retention::from_properties(&props(&[(MIN_SNAPSHOTS_TO_KEEP, "0")])).unwrap();
        assert_eq!(r.min_snapshots_to_keep, 1);
    }
}
