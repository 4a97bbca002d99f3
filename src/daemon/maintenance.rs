//! The sink's maintenance in the background of the daemon: a cycle every
//! [`Sink::maintenance_interval`] and whenever commits ask for one (`sinks/wanted.rs`), through
//! the same fenced store as the pipeline.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::changelog::TableId;
use crate::sinks::Sink;

/// How long a stop waits for a running maintenance cycle before aborting it. A cycle is
/// crash-safe at every await, so the abort loses nothing; waiting lets the usual short cycle
/// end with its outputs committed (or its snapshot create's retry answered) instead of leaving
/// orphans for `cdcd cleanup`.
const MAINTENANCE_GRACE: Duration = Duration::from_secs(10);

/// The running background task. [`Background::stop`] lets a running cycle finish (within
/// [`MAINTENANCE_GRACE`]); dropping it (a lost lease, a panic) aborts the cycle where it is.
pub(super) struct Background {
    stop: CancellationToken,
    task: AbortOnDropHandle<()>,
}

impl Background {
    pub(super) fn start(sink: Arc<dyn Sink>) -> Self {
        let stop = CancellationToken::new();
        let task = AbortOnDropHandle::new(tokio::spawn(maintain_in_background(sink, stop.clone())));
        Background { stop, task }
    }

    /// Asks the task to stop between cycles and waits up to [`MAINTENANCE_GRACE`] for it.
    pub(super) async fn stop(mut self) {
        self.stop.cancel();
        if tokio::time::timeout(MAINTENANCE_GRACE, &mut self.task)
            .await
            .is_err()
        {
            tracing::info!("stopping a maintenance cycle that is still running (its outputs become orphans for `cdcd cleanup`)");
        }
    }
}

/// Runs the sink's maintenance every [`Sink::maintenance_interval`] on the tables it commits to,
/// and when commits ask for it; ends at `stop`, which it notices between cycles (the caller
/// bounds how long it waits for the running one), or at an error (a broken fence: the daemon
/// is stopping then).
async fn maintain_in_background(sink: Arc<dyn Sink>, stop: CancellationToken) {
    let Some(interval) = sink.maintenance_interval() else {
        return;
    };
    let wanted = sink.maintenance_wanted();
    // Asked cycles (`sinks/wanted.rs`) come at most this often, so a table that stays above its
    // trigger (a cycle that cannot rewrite enough) does not take a core.
    let gap = interval / 20;
    let mut scheduled = tokio::time::Instant::now() + interval;
    loop {
        let asked = tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(scheduled) => None,
            asked = asked_tables(wanted.as_deref()) => Some(asked),
        };
        let outcome = match &asked {
            None => {
                scheduled = tokio::time::Instant::now() + interval;
                sink.maintain(None).await
            }
            Some(tables) => sink.maintain(Some(tables)).await,
        };
        if let Err(e) = outcome {
            tracing::warn!(error = %e, "maintenance stopped");
            return;
        }
        if asked.is_some() {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(gap) => {}
            }
        }
    }
}

/// The next tables that ask for a cycle; never, for a sink that asks for none.
async fn asked_tables(wanted: Option<&crate::sinks::MaintenanceWanted>) -> Vec<TableId> {
    match wanted {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}
