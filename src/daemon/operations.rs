//! What runs beside the daemon's pipeline for its operators: the health's stall limits, the
//! `/metrics` `/healthz` `/readyz` endpoint and systemd notification (`metrics/`).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::commands::CommandError;
use crate::config::Config;

/// Configures [`Health`](crate::metrics::Health)'s stall limits, serves `/metrics` `/healthz`
/// `/readyz` when `[metrics] listen` is set, and starts systemd notification. Returns the token
/// that stops both.
pub(super) async fn start_operations(
    config: &Config,
    shutdown: &CancellationToken,
) -> Result<(CancellationToken, tokio::task::JoinHandle<()>), CommandError> {
    use crate::metrics::{self as m, Health};
    let health = Health::global();
    let commit_interval = Duration::from_millis(config.commit_interval_ms);
    // Silence is normal for up to a heartbeat or status period; three of them is a stall.
    let beat = crate::sources::build(&config.source).heartbeat_period();
    health.configure(beat * 3, commit_interval);
    let ops = shutdown.child_token();
    if let Some(addr) = &config.metrics_listen {
        let handle = m::install(&config.pipeline)?;
        let listener = tokio::net::TcpListener::bind(addr.as_str())
            .await
            .map_err(|source| m::MetricsError::Listen {
                addr: addr.clone(),
                source,
            })?;
        let bound = listener
            .local_addr()
            .map_or_else(|_| addr.clone(), |a| a.to_string());
        tracing::info!(listen = %bound, "serving /metrics, /healthz and /readyz");
        tokio::spawn(m::http::serve(listener, handle, health, ops.clone()));
    }
    let notifier = tokio::spawn(m::notify::supervise(health, ops.clone()));
    Ok((ops, notifier))
}
