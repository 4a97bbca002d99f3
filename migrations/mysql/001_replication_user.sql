-- Least-privilege setup for cdcd on MySQL 8 or MariaDB 10.x+ (run as an administrator).
-- Requires in the server's config (restart): log_bin, binlog_format = ROW, server_id <> 0.
-- Recommended: binlog_row_image = FULL (MINIMAL and NOBLOB work: the sink completes the rows),
-- binlog_row_metadata = FULL (column names in the binlog), and on MySQL gtid_mode = ON with
-- enforce_gtid_consistency = ON (positions as GTID sets; otherwise binlog file:offset).
-- Keep the binlog long enough for cdcd to be down and catch up: binlog_expire_logs_seconds
-- (MySQL 8, MariaDB 10.6+) or expire_logs_days.

-- 1. A login user; the host part must match how cdcd connects.
CREATE USER 'cdc'@'10.0.0.%' IDENTIFIED BY 'change-me';

-- 2. Reading the binlog as a replica, and the server's binlog status.
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'cdc'@'10.0.0.%';
--    MariaDB 10.5+: REPLICATION CLIENT is called BINLOG MONITOR:
-- GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'cdc'@'10.0.0.%';

-- 3. Reading the captured tables (the initial copy, and column names from information_schema).
GRANT SELECT ON shop.* TO 'cdc'@'10.0.0.%';

-- 4. MySQL only, for snapshot = "initial": the copy briefly takes FLUSH TABLES WITH READ LOCK to
--    learn the snapshot's binlog position (MariaDB reports it without a lock).
GRANT RELOAD ON *.* TO 'cdc'@'10.0.0.%';

-- cdcd registers as a replica with source.server_id: pick a number no server or replica uses.
