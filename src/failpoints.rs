//! Named crash points: places where the fault tests make cdcd abort, like a `kill -9`, to check
//! that what is on storage at that moment recovers (`docs/exactly-once.md`).
//!
//! `CDCD_FAILPOINT=<name>[:<n>]` aborts the process at the n-th time the point `<name>` is
//! reached (default: the first), after printing `cdcd: failpoint <name> (hit <n>): aborting` to
//! stderr; nothing is flushed. Unset (always, outside tests), [`crash_point`] costs one read of a
//! `OnceLock`. Each point is a constant below, and the tests (`tests/s3/crash.rs`, the crash
//! tests) name the same strings.
//!
//! `CDCD_PAUSEPOINT=<name>:<ms>` makes [`pause_point`] `<name>` sleep `<ms>` milliseconds each
//! time it is reached: the paused process that wakes up late, or a window a race test widens.
//!
//! Where the points sit and what storage holds when they fire:
//! - [`MULTIPART_AFTER_FIRST_PART`] (`storage/large.rs`): a multipart upload has sent one part
//!   and is not complete; no object is visible.
//! - [`COMMIT_BEFORE_CREATE`] (Iceberg publish, `sinks/iceberg/commit/publish.rs`): data files,
//!   manifests and the manifest list are written, `v<N>.metadata.json` is not; the commit did not
//!   happen and its files are orphans. Table creation (`v1`) passes here too.
//! - [`COMMIT_AFTER_CREATE`] (same place): the metadata file is ours (created, or found with our
//!   bytes after a retry); the commit is durable, the version hint is not yet updated.
//! - [`COMMIT_AFTER_MERGE`] (Iceberg commit, `sinks/iceberg/commit/manifests.rs`): data files,
//!   deletes and a manifest merged from the parent's are written; the manifest list and
//!   `v<N>.metadata.json` are not, so the commit did not happen and its files are orphans.
//! - [`CHANGELOG_BEFORE_TABLE`] (Iceberg commit of a table with `changelog = true`,
//!   `sinks/iceberg/mod.rs`): the changelog table's snapshot with this commit's changes and
//!   checkpoint is durable, the table's is staged and not published; the changelog is ahead of
//!   its table until the restart replays the commit. Also a pause point: the window random
//!   kills aim at (`tests/mysql/changelog_kills.rs`).
//! - [`LSM_BEFORE_SNAPSHOT`] (Paimon publish, `sinks/lsm/publish.rs`): the manifest and both
//!   manifest lists are written, `snapshot/snapshot-N` is not; the commit did not happen.
//! - [`LSM_AFTER_SNAPSHOT`] (same place): `snapshot-N` is ours, so the commit is durable;
//!   `LATEST` is not yet updated.
//! - [`LSM_SCHEMA_WRITTEN`] (Paimon schema evolution, `sinks/lsm/commit/evolve.rs`): `schema-N`
//!   of the evolved schema is written, the commit that first writes under it is not; readers see
//!   the new columns (NULL) and the restart replays the changes before the DDL into a table that
//!   is ahead.
//! - [`LSM_EXPIRE_AFTER_HINT`] (Paimon expiry, `sinks/lsm/expire.rs`): `EARLIEST` names the
//!   first retained snapshot; the expired snapshot files and every file only they name are there.
//! - [`LSM_EXPIRE_DURING_DELETE`] (same place): half of those data files and manifests (in
//!   deletion order: data files, manifests, manifest lists) are deleted; no snapshot file is.
//! - [`LSM_EXPIRE_DURING_SNAPSHOTS`] (same place): those files are all deleted and the older half
//!   of the expired snapshot files; the rest stay below `EARLIEST` for the next expiry.
//! - [`EXPIRE_AFTER_COMMIT`] (Iceberg maintenance, `sinks/iceberg/maintenance/expire_snapshots.rs`):
//!   the metadata without the expired snapshots is committed, none of their files is recorded
//!   for deletion or deleted, the expiry's journal is still there.
//! - [`EXPIRE_DURING_DELETE`] (`sinks/iceberg/maintenance/pending_deletes.rs`): the first half of
//!   the files a record of pending deletions names is deleted, the record is still there.
//! - [`COMPACT_BEFORE_COMMIT`] (Iceberg compaction, `sinks/iceberg/maintenance/compaction/`): the
//!   rewritten data files, the manifests and the manifest list are written, the metadata is not;
//!   the rewrite did not happen, the table and the index are the old ones, the files are orphans.
//! - [`COMPACT_AFTER_COMMIT`] (same place): the `replace` snapshot is committed, the index is not
//!   yet told (the next commit catches it up from the table).
//! - [`COMPACT_REWRITTEN`] (same place, a pause point): a compaction wrote its output files
//!   without the table's lock and has not taken it back to commit; streaming commits go on.
//! - [`RESYNC_COPIED`] (online resync, `daemon/resync_watch.rs`): a copy job's lineage is
//!   complete at the position the pipeline holds its acknowledgements at; the pipeline has not
//!   restarted to replay into it, the live table is still the old one.
//! - [`SCHEMA_RESYNC_REQUESTED`] (`pipeline/schema_resync.rs`): a schema change a table could
//!   not take has the table's resync request durable (written with the position the pipeline
//!   holds its acknowledgements at, renewed, or found pending); the table is not parked yet, and
//!   nothing past the change is acknowledged.
//! - [`RESYNC_BEFORE_SWAP`] (Iceberg resync, `sinks/iceberg/mod.rs`): the lineage's commit that
//!   replaces the live table is durable; the swap is not done, readers see the old table. Also
//!   on the LSM sink (`sinks/lsm/resync.rs`).
//! - [`LSM_SWAP_BEFORE_SNAPSHOT`] (Paimon resync, `sinks/lsm/resync.rs`): the lineage's schemas
//!   are written as the live table's newest and its files copied into the live table; the
//!   `OVERWRITE` snapshot is not, so readers see the old table (under a schema with the new columns).
//! - [`COPY_PLANNED`] (Postgres copy, `sources/postgres/snapshot/parallel.rs`, a pause point):
//!   the copy's snapshot is taken and its tables planned at it; no table is locked, so DDL can
//!   still commit on them (the window a migration during a long copy falls into).
//! - [`COPY_CHUNK_COPIED`] (same place, a pause point): a worker finished a chunk and holds the
//!   locks of the tables it verified; the tables queued behind are not locked.
//! - [`MYSQL_BEFORE_SNAPSHOT`] (MySQL/MariaDB copy, `sources/mysql/`, a pause point): the copied
//!   tables' columns are read from `information_schema`; the consistent snapshot is not begun.
//! - [`MYSQL_COPY_TABLE`] (same place, a pause point): the snapshot is begun and every table
//!   planned; the next table's copy has not read it yet.
//! - [`MYSQL_COPY_WHOLE`] (same place): a table is about to be copied whole at a snapshot of its
//!   own (a keyless table of a resumed copy, or one altered under the shared snapshot); nothing
//!   of this copy is sent yet, the schema history records the table's columns at the shared one.
//! - [`ROUND_IN_FLIGHT`] (`pipeline/commit.rs`, a pause point): a round of streamed changes is
//!   on its background task and none of its commits has started; the pipeline reads on beside it
//!   (the window the kills of `tests/postgres/many_tables.rs` aim at).
//! - [`ROUND_READ_BESIDE`] (`pipeline/mod.rs`): a transaction was buffered while a round is in
//!   flight; its rows are in memory only, the round's commits may or may not have landed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A multipart upload sent its first part and is not complete.
pub const MULTIPART_AFTER_FIRST_PART: &str = "multipart-after-first-part";
/// The changelog table's commit is durable, its table's is not published.
pub const CHANGELOG_BEFORE_TABLE: &str = "changelog-before-table";
/// An Iceberg commit is about to put its `v<N>.metadata.json` create-if-absent.
pub const COMMIT_BEFORE_CREATE: &str = "commit-before-create";
/// An Iceberg commit's metadata put landed; the version hint is not written yet.
pub const COMMIT_AFTER_CREATE: &str = "commit-after-create";
/// An Iceberg commit wrote a merged manifest; its manifest list and metadata are not written.
pub const COMMIT_AFTER_MERGE: &str = "commit-after-merge";
/// A Paimon (LSM) commit is about to put its `snapshot-N` create-if-absent.
pub const LSM_BEFORE_SNAPSHOT: &str = "lsm-commit-before-snapshot";
/// A Paimon (LSM) commit's snapshot put landed; `LATEST` is not written yet.
pub const LSM_AFTER_SNAPSHOT: &str = "lsm-commit-after-snapshot";
/// A Paimon schema change wrote `schema/schema-N`; no snapshot uses it yet.
pub const LSM_SCHEMA_WRITTEN: &str = "lsm-schema-written";
/// A Paimon expiry moved `EARLIEST`; no file is deleted yet.
pub const LSM_EXPIRE_AFTER_HINT: &str = "lsm-expire-after-hint";
/// A Paimon expiry deleted the first half of the data files and manifests it removes.
pub const LSM_EXPIRE_DURING_DELETE: &str = "lsm-expire-during-delete";
/// A Paimon expiry deleted every file the expired snapshots named and half of their snapshot files.
pub const LSM_EXPIRE_DURING_SNAPSHOTS: &str = "lsm-expire-during-snapshots";

/// An expiry's metadata commit landed; no file is deleted yet.
pub const EXPIRE_AFTER_COMMIT: &str = "expire-after-commit";
/// An expiry deleted the first half of its files (in deletion order) and not the rest.
pub const EXPIRE_DURING_DELETE: &str = "expire-during-delete";

/// A compaction wrote its files and manifest list; its metadata is not committed.
pub const COMPACT_BEFORE_COMMIT: &str = "compact-before-commit";
/// A compaction's snapshot is committed; the primary-key index does not know yet.
pub const COMPACT_AFTER_COMMIT: &str = "compact-after-commit";

/// A compaction's outputs are written outside the table's lock; it has not committed.
pub const COMPACT_REWRITTEN: &str = "compact-rewritten";

/// An online resync's copy is complete; the pipeline has not restarted to replay into it.
pub const RESYNC_COPIED: &str = "resync-copied";
/// A schema change a table could not take wrote its resync request; the table is not parked.
pub const SCHEMA_RESYNC_REQUESTED: &str = "schema-resync-requested";
/// A resync lineage's swapping commit is durable; the swap is not done.
pub const RESYNC_BEFORE_SWAP: &str = "resync-before-swap";
/// A Paimon swap wrote the live table's schemas and copied the files; no snapshot yet.
pub const LSM_SWAP_BEFORE_SNAPSHOT: &str = "lsm-swap-before-snapshot";

/// A Postgres copy is planned at its snapshot; no worker has locked a table yet.
pub const COPY_PLANNED: &str = "copy-planned";
/// A Postgres copy worker sent a chunk's rows and its end; it has not taken the next chunk.
pub const COPY_CHUNK_COPIED: &str = "copy-chunk-copied";
/// A MySQL/MariaDB copy read its tables' columns and has not begun its snapshot.
pub const MYSQL_BEFORE_SNAPSHOT: &str = "mysql-before-snapshot";
/// A MySQL/MariaDB copy is about to read its next table at the snapshot.
pub const MYSQL_COPY_TABLE: &str = "mysql-copy-table";

/// A MySQL/MariaDB copy is about to copy a table whole at a snapshot of its own.
pub const MYSQL_COPY_WHOLE: &str = "mysql-copy-whole";
/// A round of streamed changes waits on its background task before committing (a pause point).
pub const ROUND_IN_FLIGHT: &str = "round-in-flight";
/// A transaction was buffered beside a round in flight.
pub const ROUND_READ_BESIDE: &str = "round-read-beside";

/// The crash point named by `CDCD_FAILPOINT` and at which hit it fires, read once.
fn armed() -> Option<&'static (String, u64)> {
    static POINT: OnceLock<Option<(String, u64)>> = OnceLock::new();
    POINT
        .get_or_init(|| {
            let v = std::env::var("CDCD_FAILPOINT").ok()?;
            Some(match v.split_once(':') {
                Some((name, n)) => (name.to_owned(), n.parse().unwrap_or(1)),
                None => (v, 1),
            })
        })
        .as_ref()
}

/// Aborts the process at `name` when `CDCD_FAILPOINT` names it (tests only set it).
pub fn crash_point(name: &str) {
    static HITS: AtomicU64 = AtomicU64::new(0);
    if let Some((point, nth)) = armed() {
        if point == name && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *nth {
            eprintln!("cdcd: failpoint {name} (hit {nth}): aborting");
            std::process::abort();
        }
    }
}

/// Sleeps at `name` when `CDCD_PAUSEPOINT` names it (tests only set it).
pub async fn pause_point(name: &str) {
    static PAUSE: OnceLock<Option<(String, u64)>> = OnceLock::new();
    let armed = PAUSE.get_or_init(|| {
        let v = std::env::var("CDCD_PAUSEPOINT").ok()?;
        let (point, ms) = v.split_once(':')?;
        Some((point.to_owned(), ms.parse().ok()?))
    });
    if let Some((point, ms)) = armed {
        if point == name {
            tracing::info!(point = name, ms, "pause point");
            tokio::time::sleep(std::time::Duration::from_millis(*ms)).await;
        }
    }
}
