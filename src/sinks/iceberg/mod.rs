//! Iceberg sink (in progress).
