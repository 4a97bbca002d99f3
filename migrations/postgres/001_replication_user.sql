-- Least-privilege setup for cdcd on Postgres (run as a superuser or the table owner).
-- Requires in postgresql.conf: wal_level = logical (restart), max_replication_slots >= 1 free,
-- max_wal_senders >= 1 free. Replace the names and the password; keep the password out of files
-- checked into version control.

-- 1. A login role that may open replication connections, and nothing more.
CREATE ROLE cdc WITH LOGIN REPLICATION PASSWORD 'change-me';

-- 2. Read access to the captured tables (needed for the initial copy, and to read key columns).
GRANT CONNECT ON DATABASE shop TO cdc;
GRANT USAGE ON SCHEMA public TO cdc;
GRANT SELECT ON public.orders, public.customers TO cdc;   -- or: ON ALL TABLES IN SCHEMA public

-- 3. The publication cdcd reads (cdcd creates it itself if the role may; creating a publication
--    requires table ownership, so a DBA usually runs this). Tables with a key go here; cdcd needs
--    publish_via_partition_root = true when a captured table is partitioned.
CREATE PUBLICATION cdcd_shop FOR TABLE public.orders, public.customers;
--    Later, to capture another table:  ALTER PUBLICATION cdcd_shop ADD TABLE public.invoices;
--    Tables without any key (replicated insert-only) go in a second publication that publishes
--    only inserts and truncates, so Postgres never refuses their UPDATE and DELETE:
--    CREATE PUBLICATION cdcd_shop_inserts FOR TABLE public.audit_log WITH (publish = 'insert, truncate');

-- 4. pg_hba.conf: allow replication connections for the role, e.g.
--    host  shop  cdc  10.0.0.0/8  scram-sha-256
--    (logical replication connects to a database, so the database column names it, not "replication").

-- The replication slot (cdcd_shop) is created by cdcd on first start. If cdcd is retired, drop it,
-- or it will retain WAL forever:  SELECT pg_drop_replication_slot('cdcd_shop');
