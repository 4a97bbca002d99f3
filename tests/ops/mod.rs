//! Operating cdcd: `cdcd check`, the metrics and health endpoints, systemd notification.

mod check;
pub(crate) mod metrics;
mod notify;
