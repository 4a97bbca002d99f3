//! When compaction runs: the background compactor of a table, started after a commit that leaves
//! a bucket with work (`pick.rs` decides what is work) and run by `worker.rs`, and the write
//! stall.
//!
//! One compactor per table at a time (`Handle::compacting`); it runs until the picker finds
//! nothing more, then looks once more, as a commit may have landed while it was stopping. A
//! commit waits while a bucket has `stop_trigger` sorted runs or more, so compaction can never
//! fall behind for good; a compactor that fails fails the stalled commit instead of hanging it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::worker;
use crate::sinks::lsm::compaction;
use crate::sinks::lsm::table::TableState;
use crate::sinks::lsm::tables::{Handle, Tables};
use crate::sinks::SinkError;

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
                match worker::run(&tables, &handle, false).await {
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
