//! MariaDB 10.11 → cdcd → Iceberg and LSM: the binlog stream, row images, the initial copy and
//! restart positions (some tests start a private mariadbd, `support::mysql::PrivateMaria`), and
//! the lease fencing a paused or cut-off holder (`fencing`, issue 17.3).

mod changelog;
mod changelog_kills;
mod changelog_retention;
mod copy_ddl;
mod ddl;
mod fencing;
mod geometry;
pub(crate) mod json_variant;
mod keys;
mod lsm;
mod maintenance;
mod multiset;
mod partitioned;
mod replication;
pub(crate) mod resync;
mod schema_resync;
mod snapshot;
pub(crate) mod soft_deletes;
mod tls;
