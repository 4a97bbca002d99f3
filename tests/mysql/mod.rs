//! MariaDB 10.11 → cdcd → Iceberg and LSM: the binlog stream, row images, the initial copy and
//! restart positions (some tests start a private mariadbd, `support::mysql::PrivateMaria`).

mod lsm;
mod replication;
mod snapshot;
