//! Warehouses on S3 (the test bed's moto): end to end, crash points around each put, injected
//! faults (`support/faultproxy.py`), and a standby taking over the lease.

mod crash;
mod e2e;
mod faults;
mod standby;
