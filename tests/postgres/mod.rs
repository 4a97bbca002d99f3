//! Postgres → cdcd → Iceberg (and LSM where a test says so), against the test bed's Postgres 15.
//! `tls`: TLS with verification, md5 and client certificates (the test bed's second cluster).

pub(crate) mod changelog;
mod changelog_bounded;
mod changelog_resync;
mod copy_ddl;
mod crash;
mod ddl;
mod geometry;
mod json_variant;
mod keyless;
mod keys;
mod lifecycle;
pub(crate) mod maintenance;
mod many_tables;
mod memory_budget;
mod multiset;
pub(crate) mod partitioned;
mod partitioned_copy;
pub(crate) mod puffin_layout;
pub(crate) mod replication;
pub(crate) mod resync;
mod resync_partitioned;
mod schema_evolution;
mod schema_resync;
mod snapshot;
mod soft_deletes;
mod table_settings;
mod tls;
mod type_mapping;
