-- Exact DDL capture for cdcd (optional; run as a superuser in each captured database: only
-- superusers may create event triggers).
--
-- Why: pgoutput's Relation message says that a table changed, not how. A column renamed from b to
-- c looks exactly like b dropped and c added, so without this trigger cdcd stops at a rename
-- rather than guess. With it, every ALTER TABLE also writes a transactional logical decoding
-- message (prefix 'cdcd.ddl') into the WAL, inside the DDL's own transaction: the statement's
-- text, the altered table's oid and, for a column, its attnum. cdcd reads the rename from it and
-- keeps the column (Iceberg: the same field id under the new name). Other logical decoding
-- consumers ignore messages with a prefix they do not know. A rolled-back ALTER writes nothing.
--
-- The messages cost one small WAL record per ALTER TABLE; nothing is written for DML.
-- To remove:  DROP EVENT TRIGGER cdcd_ddl_capture; DROP FUNCTION public.cdcd_ddl_capture();

CREATE OR REPLACE FUNCTION public.cdcd_ddl_capture() RETURNS event_trigger
LANGUAGE plpgsql
AS $$
DECLARE
    cmd record;
BEGIN
    FOR cmd IN
        SELECT * FROM pg_event_trigger_ddl_commands()
        WHERE command_tag = 'ALTER TABLE' AND object_type IN ('table', 'table column')
    LOOP
        -- For a column, objid is the table's oid and objsubid the column's attnum.
        PERFORM pg_logical_emit_message(
            true,
            'cdcd.ddl',
            json_build_object(
                'relid', cmd.objid::bigint,
                'attnum', cmd.objsubid,
                'object', cmd.object_identity,
                'query', current_query()
            )::text
        );
    END LOOP;
END
$$;

DROP EVENT TRIGGER IF EXISTS cdcd_ddl_capture;
CREATE EVENT TRIGGER cdcd_ddl_capture ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE')
    EXECUTE FUNCTION public.cdcd_ddl_capture();
