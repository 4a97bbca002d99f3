//! The end-to-end suite: the built `cdcd` binary against the real servers of the test bed
//! (`scripts/testbed.sh`: Postgres 15, MariaDB 10.11, moto S3), with the replica read back by
//! readers that share no code with cdcd (`support/lakecheck.py`: DuckDB, pyiceberg, pypaimon).
//!
//! One test binary with a module per area (it links once, and `cargo test --test e2e <area>::`
//! runs one area); every test is a drop guard over what it made (see `support`). Without the
//! test bed's environment (`CDCD_TEST_PG`, …) each test prints a note and passes.
//!
//! - `postgres`: pgoutput replication, the initial copy, the process contract, DDL inside
//!   transactions, crash recovery (parameterised by sink: Iceberg and LSM).
//! - `mysql`: the MariaDB binlog into Iceberg and LSM, the initial copy, restart positions.
//! - `lsm`: the Apache Paimon sink end to end.
//! - `s3`: every path again on S3 (moto): end to end, crashes at named points, faults, standby.
//! - `ops`: `cdcd check`, metrics and health, systemd notification.
//! - `catalog`: the Iceberg SQL catalog (SQLite and Postgres), read back through pyiceberg's
//!   `SqlCatalog`; a foreign commit, a crash before the row update.

// First, so its macro (`ground_or_skip!`) is in scope in the modules after it.
#[macro_use]
mod support;

mod catalog;
mod lsm;
mod mysql;
mod ops;
mod postgres;
mod s3;
