//! The compaction worker: carries out what `pick.rs` picks, one bucket at a time, and
//! publishes each result as a `COMPACT` snapshot.
//!
//! Reading and merging happen without the table lock, so commits keep flowing. Before publishing
//! it re-takes the lock and checks that every input file is still live (a TRUNCATE may have
//! removed them); if not, the output is deleted and nothing is published. Files added meanwhile
//! are level-0 runs with higher sequence numbers, so merging without them is correct. A
//! `COMPACT` snapshot carries the checkpoint of the snapshot it follows: the table's content, and
//! so its position, is unchanged.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::metrics::maintenance as maintenance_metrics;
use crate::sinks::lsm::compaction::{self, merge, CompactStats, Unit};
use crate::sinks::lsm::files::{self, file_location};
use crate::sinks::lsm::manifest::DataFileMeta;
use crate::sinks::lsm::partition::Slot;
use crate::sinks::lsm::placement;
use crate::sinks::lsm::publish;
use crate::sinks::lsm::schema::FileSchemas;
use crate::sinks::lsm::store;
use crate::sinks::lsm::table::Change;
use crate::sinks::lsm::tables::{Handle, Tables};
use crate::sinks::lsm::writer::{self, FileError, RunStats};
use crate::sinks::SinkError;

/// Compacts buckets of `handle`'s table until the picker (or, when `full`, the full-compaction
/// rule) finds nothing more to do.
pub(in crate::sinks::lsm) async fn run(
    tables: &Tables,
    handle: &Handle,
    full: bool,
) -> Result<CompactStats, SinkError> {
    let mut worker = Worker {
        tables,
        handle,
        full,
        stats: CompactStats::default(),
        done: Vec::new(),
    };
    while let Some(job) = worker.next_job().await? {
        if full {
            worker.done.push(job.slot.clone());
        }
        let merged = worker.merge(&job).await?;
        if !worker.publish(job, merged).await? {
            break;
        }
    }
    Ok(worker.stats)
}

/// One pass of a table's compactor.
struct Worker<'a> {
    tables: &'a Tables,
    handle: &'a Handle,
    /// Merge every bucket into one bottom run (deletes dropped), not only what the picker asks.
    full: bool,
    stats: CompactStats,
    /// Buckets a full pass already did (a full pass visits each once).
    done: Vec<Slot>,
}

/// One bucket's compaction, as picked.
struct Job {
    slot: Slot,
    unit: Unit,
    /// The files `unit` names.
    inputs: Vec<DataFileMeta>,
    /// The table (or resync lineage) the inputs are in.
    location: String,
    schemas: FileSchemas,
}

/// What a job's merge put: the output file (none when every row was a dropped delete).
struct Merged {
    output: Option<DataFileMeta>,
    bytes_in: u64,
    rows_out: u64,
}

impl Worker<'_> {
    /// The next bucket with work, under the table's lock; `None` when there is none (or no
    /// table, or an append table: keyless, `append.rs`, it has no sorted runs to merge).
    async fn next_job(&self) -> Result<Option<Job>, SinkError> {
        let (tables, handle) = (self.tables, self.handle);
        let mut guard = handle.state.lock().await;
        tables.ensure_loaded(&handle.table, &mut guard).await?;
        let Some(state) = guard.as_ref() else {
            return Ok(None);
        };
        if state.schema.primary_keys.is_empty() {
            return Ok(None);
        }
        let picked = state
            .files
            .iter()
            .filter(|(slot, _)| !self.done.contains(slot))
            .find_map(|(slot, files)| Some((slot.clone(), files, self.unit(files)?)));
        let Some((slot, files, unit)) = picked else {
            return Ok(None);
        };
        let inputs = unit
            .files
            .iter()
            .filter_map(|&i| files.get(i).cloned())
            .collect();
        let location = state.location.clone();
        let schemas =
            FileSchemas::from_paimon(&state.schema).map(|s| s.with_aliases(state.aliases.clone()));
        drop(guard);
        let schemas = schemas.map_err(|detail| SinkError::Corrupt {
            path: format!("{location}/schema/schema-0"),
            detail,
        })?;
        Ok(Some(Job {
            slot,
            unit,
            inputs,
            location,
            schemas,
        }))
    }

    /// What to merge in a bucket holding `files`, if anything.
    fn unit(&self, files: &[DataFileMeta]) -> Option<Unit> {
        let options = &self.tables.compaction;
        let runs = compaction::runs(files);
        // Deletion-vector tables keep one bottom run per bucket (see mod.rs).
        let dv = self.tables.config.deletion_vectors && files.iter().any(|f| f.level == 0);
        let unit = if self.full || dv {
            compaction::full(&runs, files, options)
        } else {
            compaction::pick(&runs, options)
        };
        // An initial copy's many bottom files, once the copy is done.
        let copying = self.handle.copying.load(Ordering::Acquire);
        unit.or_else(|| {
            (!copying)
                .then(|| compaction::consolidate(&runs, options))
                .flatten()
        })
    }

    /// Reads the job's inputs, merges them off the async workers and puts the output; without
    /// the table's lock.
    async fn merge(&self, job: &Job) -> Result<Merged, SinkError> {
        let (table, slot) = (&self.handle.table, &job.slot);
        let warehouse = &self.tables.warehouse;
        let mut encoded = Vec::with_capacity(job.inputs.len());
        let mut bytes_in = 0;
        let chains = placement::chains(&job.inputs, &job.schemas.key_types);
        for f in &job.inputs {
            let data = files::read_bytes(warehouse, &job.location, slot, f).await?;
            bytes_in += data.len() as u64;
            encoded.push(data);
        }
        // CPU-bound: off the async workers.
        let merge_schemas = job.schemas.clone();
        let drop_deletes = job.unit.drop_deletes;
        let (task, what) = (
            format!("compaction task of {}", slot.dir()),
            format!("merging {}", slot.dir()),
        );
        let (bytes, run) = files::off_runtime(table, task, &what, move || {
            merge_chains(encoded, &chains, &merge_schemas, drop_deletes)
        })
        .await?;
        let rows_out = run.rows();
        let output = if rows_out > 0 {
            let level = job.unit.output_level;
            Some(
                files::put_run(warehouse, table, &job.location, slot, bytes, &run, level, 1)
                    .await?,
            )
        } else {
            None
        };
        Ok(Merged {
            output,
            bytes_in,
            rows_out: rows_out as u64,
        })
    }

    /// Publishes the merge as a `COMPACT` snapshot under the table's lock, if its inputs are
    /// still live (else its output is deleted). `Ok(false)`: the table is gone, the pass ends.
    async fn publish(&mut self, job: Job, merged: Merged) -> Result<bool, SinkError> {
        let (tables, handle) = (self.tables, self.handle);
        let table = &handle.table;
        let Job {
            slot,
            inputs,
            location,
            ..
        } = job;
        let mut guard = handle.state.lock().await;
        tables.ensure_loaded(table, &mut guard).await?;
        let Some(state) = guard.as_mut() else {
            return Ok(false);
        };
        let live = state.files.get(&slot);
        // The same table too: a resync's swap (resync.rs) gives the live table copies of the
        // lineage's files under their names, while this output went to the lineage.
        let all_live = state.location == location
            && inputs
                .iter()
                .all(|f| live.is_some_and(|l| l.iter().any(|x| x.file_name == f.file_name)));
        if !all_live {
            if let Some(o) = &merged.output {
                let loc = file_location(&location, &slot, &o.file_name);
                store::delete(&tables.warehouse, &loc).await?;
            }
            tracing::info!(table = %table, slot = %slot.dir(), "compaction inputs changed meanwhile; result dropped");
            return Ok(true);
        }
        let properties = state
            .snapshot
            .as_ref()
            .and_then(|s| s.properties.clone())
            .unwrap_or_default();
        let buckets = state.buckets(tables.config.buckets_for(&handle.table)) as i32;
        let files_in = inputs.len() as u64;
        let stats = &mut self.stats;
        stats.files_in += files_in;
        stats.bytes_in += merged.bytes_in;
        stats.files_out += u64::from(merged.output.is_some());
        stats.rows_out += merged.rows_out;
        let change = Change {
            added: merged
                .output
                .into_iter()
                .map(|f| (slot.clone(), f))
                .collect(),
            deleted: inputs.into_iter().map(|f| (slot.clone(), f)).collect(),
            ..Change::default()
        };
        let published = publish::publish(
            &tables.warehouse,
            table,
            state,
            change,
            "COMPACT",
            properties,
            buckets,
        )
        .await;
        if let Err(e) = published {
            *guard = None;
            return Err(e);
        }
        stats.snapshots += 1;
        maintenance_metrics::compaction(
            &table.to_string(),
            maintenance_metrics::KIND_COMPACT,
            files_in,
            merged.bytes_in,
        );
        drop(guard);
        handle.progress.notify_waiters();
        Ok(true)
    }
}

/// Merges the encoded input files, grouped into sorted runs by `chains` (indexes into
/// `encoded`), into one run.
fn merge_chains(
    encoded: Vec<Bytes>,
    chains: &[Vec<usize>],
    schemas: &FileSchemas,
    drop_deletes: bool,
) -> Result<(Vec<u8>, RunStats), FileError> {
    let mut out = writer::RunWriter::new(schemas)?;
    let mut encoded: Vec<Option<Bytes>> = encoded.into_iter().map(Some).collect();
    let runs = chains
        .iter()
        .map(|chain| {
            chain
                .iter()
                .filter_map(|&i| encoded.get_mut(i).and_then(Option::take))
                .collect()
        })
        .collect();
    merge::merge_runs(runs, schemas, drop_deletes, &mut out)?;
    out.finish()
}
