//! Runs written beside the index and installed later as its newest: how a data-file compaction
//! moves the keys it rewrote without holding the table's lock for it.
//!
//! Why: a compaction moves every key of the rows it rewrote to its output file and position
//! (`sinks/iceberg/maintenance/compaction`). Applied to the memtable after the compaction's commit,
//! under the table's lock, that was ~2M memtable inserts, their sort and a run written per cycle
//! on a 100M-row table: 1.0-2.6 s during which the table's streaming commits waited
//! (docs/performance.md, "A 100M-row table"). The moved keys are known before the commit (the
//! outputs' key columns, in position order), so their runs are sorted and written while the
//! streaming commits go on, and the commit only installs them: the memtable is flushed (it holds
//! older changes), the prepared runs become the newest, and the few keys whose rows a commit
//! deleted meanwhile get their current entry back on top (the caller's corrections).
//!
//! Protocol, each step naming what keeps it safe:
//! 1. [`PrimaryKeyIndex::reserve_runs`] (under the table's lock): interns the outputs' paths and
//!    takes run ids, then writes a manifest naming the next run id past them, so an index reopened
//!    on the same root meanwhile (after an error) never writes a run of those ids
//!    (`compaction/background.rs` has the race this closes).
//! 2. [`Reservation`] writes the runs (no lock): the outputs' rows as entries, sorted, a run per
//!    [`PREPARED_RUN_ENTRIES`], so memory stays bounded however large the rewrite.
//! 3. [`PrimaryKeyIndex::install_prepared`] (under the lock, after the table commit): only into the index
//!    instance and generation that reserved them (a reopened or cleared index has other file ids
//!    and other runs; the caller then moves the keys the old way). Until a manifest names them
//!    the runs are unnamed: a crash leaves orphans the next open removes, and
//!    [`PreparedRuns::discard`] deletes them when the compaction does not commit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use object_store::path::Path;
use object_store::ObjectStore;

use super::manifest::run_path;
use super::memtable::{MemTable, Slot};
use super::meta::RunMeta;
use super::run::RunWriter;
use super::{delete_files, IndexError, PrimaryKeyIndex};

/// Entries per prepared run: bounds the memory that sorts them (~50 bytes an entry with its
/// key and sort slot, so ~50 MiB) whatever the rewrite's size.
pub(crate) const PREPARED_RUN_ENTRIES: usize = 1 << 20;

/// Which index in memory a reservation belongs to: the instance (one per open) and its
/// generation (bumped by every `clear`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) instance: u64,
    pub(crate) generation: u64,
}

static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

impl Owner {
    pub(crate) fn new_instance() -> Owner {
        Owner {
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            generation: 0,
        }
    }
}

/// Run ids and file ids reserved for rows that land in files the index does not know yet.
pub struct Reservation {
    owner: Owner,
    store: Arc<dyn ObjectStore>,
    root: Path,
    /// The reserved run ids, `next..end`.
    next: u64,
    end: u64,
    /// The file id of each file named at reservation, in order.
    files: Vec<u32>,
    /// Entries per run ([`PREPARED_RUN_ENTRIES`]; smaller in tests).
    run_entries: usize,
    memtable: MemTable,
    written: Vec<RunMeta>,
}

/// Runs written for a reservation, oldest first, to [`install_prepared`](PrimaryKeyIndex::install_prepared) or
/// [`discard`](PreparedRuns::discard).
pub struct PreparedRuns {
    owner: Owner,
    store: Arc<dyn ObjectStore>,
    runs: Vec<RunMeta>,
}

impl PreparedRuns {
    /// Entries over every run.
    pub fn entries(&self) -> u64 {
        self.runs.iter().map(|r| r.entries).sum()
    }
}

impl Reservation {
    /// Records that file `file` (its ordinal at reservation) holds `key` at `position`, in the
    /// order the rows were written (a later entry of a key wins); writes a run when
    /// [`PREPARED_RUN_ENTRIES`] are buffered.
    pub async fn add(&mut self, file: usize, key: &[u8], position: u64) -> Result<(), IndexError> {
        let Some(&id) = self.files.get(file) else {
            return Err(IndexError::Corrupt {
                path: self.root.to_string(),
                detail: format!(
                    "a prepared run names file {file} of {} reserved",
                    self.files.len()
                ),
            });
        };
        self.memtable.insert(key, Slot { file: id, position });
        if self.memtable.len() >= self.run_entries {
            self.write_run().await?;
        }
        Ok(())
    }

    /// Writes what is buffered and hands over the runs.
    pub async fn finish(mut self) -> Result<PreparedRuns, IndexError> {
        self.write_run().await?;
        Ok(PreparedRuns {
            owner: self.owner,
            store: Arc::clone(&self.store),
            runs: std::mem::take(&mut self.written),
        })
    }

    /// Deletes the runs written so far (the rest of the rewrite failed).
    pub async fn discard(self) {
        delete_files(
            &self.store,
            self.written.iter().map(|r| &r.path),
            "prepared run",
        )
        .await;
    }

    async fn write_run(&mut self) -> Result<(), IndexError> {
        if self.memtable.is_empty() {
            return Ok(());
        }
        if self.next >= self.end {
            return Err(IndexError::Corrupt {
                path: self.root.to_string(),
                detail: "a prepared rewrite holds more entries than its reserved runs".into(),
            });
        }
        let id = self.next;
        let mut writer = RunWriter::new(&self.store, run_path(&self.root, id), id);
        for (key, slot) in self.memtable.sorted() {
            writer.add(key, slot).await?;
        }
        self.written.push(writer.finish().await?);
        self.next += 1;
        self.memtable.clear();
        Ok(())
    }
}

impl PrimaryKeyIndex {
    /// Reserves, for a rewrite of `rows` rows into `files`, the file ids of `files` and enough
    /// run ids for its entries, and writes a manifest naming the next run id past them (still
    /// covering the snapshot it covered). See the module doc.
    pub async fn reserve_runs(
        &mut self,
        files: &[&str],
        rows: u64,
    ) -> Result<Reservation, IndexError> {
        self.reserve_runs_of(files, rows, PREPARED_RUN_ENTRIES)
            .await
    }

    /// [`reserve_runs`](Self::reserve_runs) with `run_entries` entries per run.
    pub(crate) async fn reserve_runs_of(
        &mut self,
        files: &[&str],
        rows: u64,
        run_entries: usize,
    ) -> Result<Reservation, IndexError> {
        let run_entries = run_entries.max(1);
        let ids = files
            .iter()
            .map(|f| self.files.intern_str(f))
            .collect::<Result<Vec<u32>, IndexError>>()?;
        let runs = rows.div_ceil(run_entries as u64).max(1);
        let next = self.next_run_id;
        self.next_run_id += runs;
        self.write_manifest(self.covered).await?;
        self.delete_obsolete().await;
        Ok(Reservation {
            owner: self.owner,
            store: Arc::clone(&self.store),
            root: self.root.clone(),
            next,
            end: next + runs,
            files: ids,
            run_entries,
            memtable: MemTable::default(),
            written: Vec::new(),
        })
    }

    /// Whether `prepared` was reserved by this index as it is now (same instance, not cleared
    /// since): only then can it be installed.
    pub fn owns(&self, prepared: &PreparedRuns) -> bool {
        prepared.owner == self.owner
    }

    /// Makes `prepared` the newest runs: the memtable is written first (its changes are older),
    /// then the prepared runs go on top, newest last. The caller applies, right after, the
    /// entries that must stay on top of them (keys whose rows were deleted meanwhile), then
    /// persists. Returns `prepared` untouched if this index did not reserve it
    /// ([`owns`](Self::owns)).
    pub async fn install_prepared(&mut self, prepared: PreparedRuns) -> Result<(), InstallError> {
        if !self.owns(&prepared) {
            return Err(InstallError::NotOurs(prepared));
        }
        self.write_memtable().await.map_err(InstallError::Index)?;
        for run in prepared.runs {
            self.runs.insert(0, Arc::new(run));
        }
        self.account_runs();
        Ok(())
    }
}

impl PreparedRuns {
    /// Deletes the runs (the compaction did not commit, or its index is gone).
    pub async fn discard(self) {
        delete_files(
            &self.store,
            self.runs.iter().map(|r| &r.path),
            "prepared run",
        )
        .await;
    }
}

/// Why [`PrimaryKeyIndex::install_prepared`] did not install.
pub enum InstallError {
    /// Reserved by another index instance or generation: handed back to discard.
    NotOurs(PreparedRuns),
    /// Writing the memtable failed; the index is as before (the prepared runs are lost with the
    /// error: the caller drops the index, and the runs are orphans the next open removes).
    Index(IndexError),
}
