//! Operating cdcd: `cdcd check`, the metrics and health endpoints, systemd notification.

mod check;
mod copy_progress;
pub(crate) mod metrics;
mod notify;
