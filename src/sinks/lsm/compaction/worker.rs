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
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::metrics::maintenance as maintenance_metrics;
use crate::sinks::lsm::compaction::{self, CompactStats, Unit};
use crate::sinks::lsm::files::{self, file_error, file_location};
use crate::sinks::lsm::manifest::DataFileMeta;
use crate::sinks::lsm::publish;
use crate::sinks::lsm::schema::FileSchemas;
use crate::sinks::lsm::store;
use crate::sinks::lsm::table::{Change, TableState};
use crate::sinks::lsm::tables::{Handle, Tables};
use crate::sinks::lsm::writer;
use crate::sinks::SinkError;

/// Compacts buckets of `handle`'s table until the picker (or, when `full`, the full-compaction
/// rule) finds nothing more to do.
pub(in crate::sinks::lsm) async fn run(
    tables: &Tables,
    handle: &Handle,
    full: bool,
) -> Result<CompactStats, SinkError> {
    let table = &handle.table;
    let mut stats = CompactStats::default();
    // Buckets a full pass already did (a full pass visits each once).
    let mut done: Vec<i32> = Vec::new();
    loop {
        let job = {
            let mut guard = handle.state.lock().await;
            tables.ensure_loaded(table, &mut guard).await?;
            let Some(state) = guard.as_ref() else {
                return Ok(stats);
            };
            // An append table (keyless, `append.rs`) has no sorted runs to merge.
            if state.schema.primary_keys.is_empty() {
                return Ok(stats);
            }
            let mut job: Option<(i32, Unit, Vec<DataFileMeta>, String)> = None;
            for (bucket, files) in &state.files {
                if done.contains(bucket) {
                    continue;
                }
                let runs = compaction::runs(files);
                // Deletion-vector tables keep one bottom run per bucket (see mod.rs).
                let dv = tables.config.deletion_vectors && files.iter().any(|f| f.level == 0);
                let unit = if full || dv {
                    compaction::full(&runs, files, &tables.compaction)
                } else {
                    compaction::pick(&runs, &tables.compaction)
                };
                // An initial copy's many bottom files, once the copy is done.
                let copying = handle.copying.load(Ordering::Acquire);
                let unit = unit.or_else(|| {
                    (!copying)
                        .then(|| compaction::consolidate(&runs, &tables.compaction))
                        .flatten()
                });
                if let Some(u) = unit {
                    let inputs = u
                        .files
                        .iter()
                        .filter_map(|&i| files.get(i).cloned())
                        .collect();
                    job = Some((*bucket, u, inputs, state.location.clone()));
                    break;
                }
            }
            match job {
                Some(j) => (
                    j,
                    FileSchemas::from_paimon(&state.schema)
                        .map(|s| s.with_aliases(state.aliases.clone())),
                ),
                None => return Ok(stats),
            }
        };
        let ((bucket, unit, inputs, location), schemas) = job;
        let schemas = schemas.map_err(|detail| SinkError::Corrupt {
            path: format!("{location}/schema/schema-0"),
            detail,
        })?;
        if full {
            done.push(bucket);
        }
        let mut encoded = Vec::with_capacity(inputs.len());
        let mut bytes_in = 0;
        let chains = crate::sinks::lsm::placement::chains(&inputs, &schemas.key_types);
        for f in &inputs {
            let data = files::read_bytes(&tables.warehouse, &location, bucket, f).await?;
            bytes_in += data.len() as u64;
            encoded.push(data);
        }
        // CPU-bound: off the async workers.
        let merge_schemas = schemas.clone();
        let drop_deletes = unit.drop_deletes;
        let merged = tokio::task::spawn_blocking(move || {
            let mut out = writer::RunWriter::new(&merge_schemas)?;
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
            compaction::merge_runs(runs, &merge_schemas, drop_deletes, &mut out)?;
            out.finish()
        })
        .await
        .map_err(|e| SinkError::Data {
            table: table.clone(),
            detail: format!("compaction task of bucket {bucket}: {e}"),
        })?
        .map_err(file_error(table, &format!("merging bucket {bucket}")))?;
        let (bytes, run) = merged;
        let rows_out = run.rows();
        let output = if rows_out > 0 {
            Some(
                files::put_run(
                    &tables.warehouse,
                    table,
                    &location,
                    bucket,
                    bytes,
                    &run,
                    unit.output_level,
                    1,
                )
                .await?,
            )
        } else {
            None
        };
        let mut guard = handle.state.lock().await;
        tables.ensure_loaded(table, &mut guard).await?;
        let Some(state) = guard.as_mut() else {
            return Ok(stats);
        };
        let live = state.files.get(&bucket);
        // The same table too: a resync's swap (resync.rs) gives the live table copies of the
        // lineage's files under their names, while this output went to the lineage.
        let all_live = state.location == location
            && inputs
                .iter()
                .all(|f| live.is_some_and(|l| l.iter().any(|x| x.file_name == f.file_name)));
        if !all_live {
            if let Some(o) = &output {
                store::delete(
                    &tables.warehouse,
                    &file_location(&location, bucket, &o.file_name),
                )
                .await?;
            }
            tracing::info!(table = %table, bucket, "compaction inputs changed meanwhile; result dropped");
            continue;
        }
        let properties = state
            .snapshot
            .as_ref()
            .and_then(|s| s.properties.clone())
            .unwrap_or_default();
        let buckets = state.buckets(tables.config.buckets) as i32;
        let files_in = inputs.len() as u64;
        stats.files_in += files_in;
        stats.bytes_in += bytes_in;
        stats.files_out += u64::from(output.is_some());
        stats.rows_out += rows_out as u64;
        let change = Change {
            added: output.into_iter().map(|f| (bucket, f)).collect(),
            deleted: inputs.into_iter().map(|f| (bucket, f)).collect(),
        };
        match publish::publish(
            &tables.warehouse,
            table,
            state,
            change,
            "COMPACT",
            properties,
            buckets,
        )
        .await
        {
            Ok(_) => {
                stats.snapshots += 1;
                maintenance_metrics::compaction(
                    &table.to_string(),
                    maintenance_metrics::KIND_COMPACT,
                    files_in,
                    bytes_in,
                );
            }
            Err(e) => {
                *guard = None;
                return Err(e);
            }
        }
        drop(guard);
        handle.progress.notify_waiters();
    }
}

/// Scheduling: the write stall and the background compactor of a table.
impl Tables {
    /// Waits while any bucket has `stop_trigger` sorted runs or more (write stall).
    pub(in crate::sinks::lsm) async fn stall(
        self: &Arc<Self>,
        handle: &Arc<Handle>,
    ) -> Result<(), SinkError> {
        let mut warned = false;
        loop {
            let worst = {
                let mut guard = handle.state.lock().await;
                self.ensure_loaded(&handle.table, &mut guard).await?;
                guard.as_ref().map_or(0, |s| {
                    s.files
                        .values()
                        .map(|f| compaction::runs(f).len())
                        .max()
                        .unwrap_or(0)
                })
            };
            if worst < self.compaction.stop_trigger {
                return Ok(());
            }
            // A stalled commit cannot wait for a compactor that fails: fail the commit instead
            // (the pipeline retries from its checkpoint) rather than hang.
            let failed = handle.failure.lock().ok().and_then(|mut f| f.take());
            if let Some(detail) = failed.filter(|_| warned) {
                return Err(SinkError::Data {
                    table: handle.table.clone(),
                    detail: format!(
                        "{worst} sorted runs in a bucket and compaction fails: {detail}"
                    ),
                });
            }
            if !warned {
                tracing::info!(table = %handle.table, runs = worst, "write stall: waiting for compaction");
                warned = true;
            }
            self.spawn_compaction(handle);
            let _ =
                tokio::time::timeout(Duration::from_millis(500), handle.progress.notified()).await;
        }
    }

    /// Starts the table's background compactor unless it is running.
    pub(in crate::sinks::lsm) fn spawn_compaction(self: &Arc<Self>, handle: &Arc<Handle>) {
        if handle.compacting.swap(true, Ordering::AcqRel) {
            return;
        }
        let tables = self.clone();
        let handle = handle.clone();
        tokio::spawn(async move {
            loop {
                let started = std::time::Instant::now();
                match run(&tables, &handle, false).await {
                    Ok(stats) => {
                        if let Ok(mut t) = handle.totals.lock() {
                            t.0.add(&stats);
                            t.1 += started.elapsed();
                        }
                    }
                    Err(e) => {
                        tracing::warn!(table = %handle.table, error = %e, "compaction failed; retried after the next commit");
                        if let Ok(mut f) = handle.failure.lock() {
                            *f = Some(e.to_string());
                        }
                        handle.compacting.store(false, Ordering::Release);
                        break;
                    }
                }
                handle.compacting.store(false, Ordering::Release);
                // A commit that landed between the last pick and the store above saw the flag
                // set and started nothing: look again before leaving.
                let more = {
                    let guard = handle.state.lock().await;
                    guard
                        .as_ref()
                        .is_some_and(|s| tables.needs_compaction(s, &handle))
                };
                if !more || handle.compacting.swap(true, Ordering::AcqRel) {
                    break;
                }
            }
            handle.progress.notify_waiters();
        });
    }

    /// Whether any bucket of `state` has compaction work.
    pub(in crate::sinks::lsm) fn needs_compaction(
        &self,
        state: &TableState,
        handle: &Handle,
    ) -> bool {
        let copying = handle.copying.load(Ordering::Acquire);
        state.files.values().any(|f| {
            let runs = compaction::runs(f);
            let merge = if self.config.deletion_vectors {
                f.iter().any(|f| f.level == 0)
            } else {
                compaction::pick(&runs, &self.compaction).is_some()
            };
            merge || (!copying && compaction::consolidate(&runs, &self.compaction).is_some())
        })
    }
}
