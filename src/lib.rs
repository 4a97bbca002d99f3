//! cdcd: a change-data-capture daemon.
//!
//! # Layout
//! The folders follow the data flow, and nothing imports upstream:
//!
//! ```text
//! source reader ──► changelog ──► pipeline ──► table writer ──► commit ──► ack to source
//! (sources/)        (changelog/)  (pipeline)   (sinks/)         (checkpoint/)
//! ```
//!
//! - [`config`]: the TOML file plus `CDCD_<SECTION>__<KEY>` overrides, validated into typed settings.
//! - [`changelog`]: the one normalized model every source produces and every sink consumes:
//!   transactions of per-table change batches in Arrow, where a column can be *absent* (not NULL).
//! - [`sources`]: replication readers (`postgres/`: pgoutput over logical replication).
//! - [`pipeline`]: routes changes per table, buffers them, decides when to commit, acks the source.
//! - [`sinks`]: table writers (`iceberg/`: Parquet data files, equality and position deletes,
//!   row-delta snapshots).
//! - [`checkpoint`]: the `cdcd.pipeline` / `cdcd.position` keys every snapshot carries.
//! - [`storage`]: `object_store` from a warehouse URL, and the adapter iceberg's `FileIO` needs.
//! - [`metrics`]: metric names, the Prometheus endpoint, health/readiness, systemd notification.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod changelog;
pub mod checkpoint;
pub mod commands;
pub mod config;
pub mod malloc;
pub mod metrics;
pub mod pipeline;
pub mod sinks;
pub mod sources;
pub mod storage;
