//! Postgres → cdcd → Iceberg (and LSM where a test says so), against the test bed's Postgres 15.

mod crash;
mod ddl;
mod lifecycle;
mod replication;
mod snapshot;
