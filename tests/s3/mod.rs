//! Warehouses on S3 (the test bed's moto): end to end, crash points around each put, injected
//! faults (`support/faultproxy.py`), and a standby taking over the lease; Iceberg, and the LSM
//! (Paimon) sink read back by pypaimon from S3 (`lsm`, and the LSM variants in `crash`, `faults`).

mod crash;
mod e2e;
mod faults;
mod lsm;
mod standby;
