//! The LSM (Apache Paimon) sink end to end from Postgres, read back by pypaimon.

mod changelog;
mod expiry;
mod partitioned;
mod replication;
