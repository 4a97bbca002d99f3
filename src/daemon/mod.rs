//! The daemon (`cdcd` with no command): the pipeline under the pipeline's lease, in rounds
//! (`rounds.rs`) that a resync request restarts in-process (`resync_watch.rs` supervises the
//! online copy), with the sink's maintenance in the background (`maintenance.rs`) and the
//! metrics endpoint and systemd notification beside it (`operations.rs`).

pub mod lease;
mod maintenance;
mod operations;
mod resync_watch;
mod rounds;

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::checkpoint::lease::{Lease, LeaseError, LeaseSettings};
use crate::commands::build::{build_sink, open_warehouse};
use crate::commands::CommandError;
use crate::config::Config;
use crate::storage::Warehouse;

/// Runs the pipeline until `shutdown`, with the metrics endpoint (`[metrics] listen`) and systemd
/// notification beside it, holding the pipeline's lease (`checkpoint::lease`): waits as a standby
/// while another cdcd holds it, and stops at once, without committing what is buffered, if the
/// lease is lost or not renewed in time. The sinks write through the lease's fence
/// (`storage/fence/mod.rs`), so nothing is written after the lease's deadline, also by a commit
/// already under way or one running in the background.
pub async fn run(config: &Config, shutdown: CancellationToken) -> Result<(), CommandError> {
    let (ops, notifier) = operations::start_operations(config, &shutdown).await?;
    let result = run_leased(config, shutdown).await;
    // The endpoint and notifier end with the pipeline, also when it failed.
    ops.cancel();
    // Let STOPPING=1 out before the process exits.
    let _ = tokio::time::timeout(Duration::from_secs(1), notifier).await;
    result
}

/// Takes the lease (or stands by, or ends at `shutdown` while waiting), runs the rounds while it
/// is kept, then stops the background maintenance and releases the lease.
async fn run_leased(config: &Config, shutdown: CancellationToken) -> Result<(), CommandError> {
    let warehouse = open_warehouse(config)?;
    let Some(mut lease) = acquire(config, &warehouse, &shutdown).await? else {
        return Ok(());
    };
    let fence = lease.fence();
    let sink = build_sink(config, Some(fence.clone()))?;
    let renewing = CancellationToken::new();
    let rounds = rounds::Rounds::open(config, &warehouse, &fence, std::sync::Arc::clone(&sink))?;
    // The sink's maintenance runs beside the pipeline, through the same fenced store. A stop
    // lets a running cycle finish; a lost lease or a panic drops it where it is (a cycle is
    // crash-safe at every await).
    let maintenance = maintenance::Background::start(sink);
    let outcome = lease::while_kept(&mut lease, &renewing, rounds.run(&shutdown)).await?;
    maintenance.stop().await;
    renewing.cancel();
    lease.release().await;
    outcome
}

/// The pipeline's lease, or `None` when `shutdown` came while standing by for it.
async fn acquire(
    config: &Config,
    warehouse: &Warehouse,
    shutdown: &CancellationToken,
) -> Result<Option<Lease>, LeaseError> {
    let settings = LeaseSettings {
        pipeline: config.pipeline.clone(),
        ttl: Duration::from_millis(config.lease_ttl_ms),
        standby: config.standby,
    };
    let standing_by = || crate::metrics::Health::global().set_standby();
    Lease::acquire_or_stand_by(warehouse, settings, shutdown, standing_by).await
}
