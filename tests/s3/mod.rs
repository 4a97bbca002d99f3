//! Warehouses on S3 (the test bed's moto): end to end, crash points around each put, injected
//! faults (`support/faultproxy.py`), a standby taking over the lease, and how cdcd reaches the
//! store: https with a private CA, virtual-hosted addressing, credentials from an AWS profile; Iceberg,
//! and the LSM (Paimon) sink read back by pypaimon from S3 (`lsm`, and the LSM variants in `crash`,
//! `faults`).

mod access;
mod addressing;
mod crash;
mod e2e;
mod faults;
mod lsm;
mod profile;
mod standby;
mod tls;
