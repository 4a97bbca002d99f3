//! Operating cdcd: `cdcd check`, the metrics and health endpoints, systemd notification.

mod check;
mod metrics;
mod notify;
