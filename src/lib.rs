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
//! - [`sources`]: replication readers (`postgres/`: pgoutput over logical replication; `mysql/`:
//!   the MySQL/MariaDB binlog, as a replica).
//! - [`pipeline`]: routes changes per table, buffers them, decides when to commit, acks the source.
//! - [`sinks`]: table writers (`iceberg/`: Parquet data files with deletion vectors or equality
//!   deletes, row-delta snapshots; `lsm/`: Apache Paimon primary-key tables; `index/`: the
//!   primary-key index that locates rows for deletion vectors).
//! - [`checkpoint`]: the `cdcd.*` keys every snapshot carries, and the pipeline's lease.
//! - [`tls`]: one rustls stack for every database connection, in libpq's words (`sslmode`: the
//!   Postgres source and the SQL catalog) and the MySQL client's (`ssl-mode`), beside the flow so
//!   that a sink need not import a source.
//! - [`storage`]: one `object_store` from a warehouse URL (local or S3), multipart uploads, the
//!   one create-if-absent publish (`put_create`), Iceberg orphan cleanup.
//! - [`metrics`]: metric names, the Prometheus endpoint, health/readiness, systemd notification.
//! - [`daemon`]: what `cdcd` alone runs: the pipeline under the lease, in rounds, with online
//!   resyncs supervised and the sink's maintenance in the background.
//! - [`commands`]: the other commands (`check`, `status`, `cleanup`, `maintain`, `resync`), one
//!   file each with its output; [`malloc`]: the arena cap; [`memory_budget`]: the process's one
//!   memory budget and its shares; [`failpoints`]: the named crash points the fault tests abort at.
//!
//! The house in more detail: `docs/architecture.md`.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod changelog;
pub mod checkpoint;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod failpoints;
pub mod malloc;
pub mod memory_budget;
pub mod metrics;
pub mod pipeline;
pub mod sinks;
pub mod sources;
pub mod storage;
pub mod tls;

#[cfg(test)]
#[path = "../tests/support/ground.rs"]
pub(crate) mod test_ground;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) mod test_fixtures;
