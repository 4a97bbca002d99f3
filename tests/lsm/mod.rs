//! The LSM (Apache Paimon) sink end to end from Postgres (and MariaDB for the changelog), read
//! back by pypaimon.

mod changelog;
mod changelog_bounded;
mod changelog_kills;
mod expiry;
mod json_variant;
mod partitioned;
mod replication;
mod row_metadata;
mod soft_deletes;
