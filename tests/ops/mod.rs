//! Operating cdcd: `cdcd check`, the metrics and health endpoints, systemd notification, the
//! allocator the binary runs with.

mod allocator;
mod check;
mod copy_progress;
pub(crate) mod metrics;
mod notify;
