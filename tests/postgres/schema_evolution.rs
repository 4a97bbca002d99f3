//! End to end, schema evolution into Iceberg (issue 20, first stage): `ADD COLUMN` (nullable, no
//! default) and type widening (int4 → int8, float4 → float8, numeric precision up), alone and inside
//! a transaction between DML, keep replicating. Each applied change is a new Iceberg schema (kept
//! columns keep their field ids, added ones get new ids) committed with the first rows under it.
//! Old rows read NULL in an added column, new rows their values; a TOAST-unchanged value after the
//! change is completed from a file written before it; `kill -9` right after the schema commit
//! resumes under the new schema. Read back by DuckDB and pyiceberg (`tests/support/lakecheck.py`);
//! with `CDCD_TEST_DELETE_MODE=equality` (format v2) by DuckDB only, pyiceberg refusing equality
//! deletes.

use std::time::Duration;

use tokio_postgres::Client;

use crate::support::{
    connect, current_fields, current_metadata, current_test, exec, fresh_table, run_cdcd,
    schema_fields, start_output, test_env, test_env_and_name, unique, Pipeline, Settings, TestEnv,
    NAMESPACE,
};

/// Equal by DuckDB, and by pyiceberg where it can read the table: it refuses equality deletes
/// (the format v2 pass, `CDCD_TEST_DELETE_MODE=equality`).
async fn assert_equal_both(p: &mut Pipeline, table: &str) {
    p.assert_equal(table, 60).await;
    if std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality") {
        return;
    }
    let (code, out) = p.lakecheck(table, 30, &["--reader", "pyiceberg"]).await;
    assert_eq!(code, Some(0), "pyiceberg: {table} differs:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_column_and_widening_keep_replicating_iceberg() {
    let (env, a) = ground_or_skip!(test_env_and_name("sev"));
    let client = fresh_table(&env, &a, |a| {
        format!(
            "CREATE TABLE {a} (id int4 PRIMARY KEY, x int4, f float4, n numeric(8,2), big text);
             ALTER TABLE {a} ALTER COLUMN big SET STORAGE EXTERNAL;
             INSERT INTO {a} SELECT g, g, g / 4.0, g / 3.0, repeat(md5(g::text), 100)
               FROM generate_series(1, 200) g;"
        )
    })
    .await;
    let mut p = Pipeline::owning_tables(&env, &a, &[&a], &Settings::default());
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(
        &client,
        &format!(
            "UPDATE {a} SET x = -x WHERE id <= 20; DELETE FROM {a} WHERE id BETWEEN 21 AND 30;"
        ),
    )
    .await;
    assert_equal_both(&mut p, &a).await;
    let before = current_fields(&current_metadata(&p.table_dir(&a)));

    // ADD COLUMN alone, then inserts, updates and deletes under the new schema. The update of
    // `x` leaves `big` unchanged: pgoutput sends it as unchanged-TOAST, completed from a file
    // written before the column existed.
    exec(&client, &format!("ALTER TABLE {a} ADD COLUMN c text")).await;
    exec(
        &client,
        &format!(
            "INSERT INTO {a} VALUES (1001, 1, 1.5, 1.25, 'new', 'c-1001');
             UPDATE {a} SET x = x + 1000 WHERE id BETWEEN 31 AND 40;
             UPDATE {a} SET c = 'set-' || id WHERE id BETWEEN 41 AND 45;
             DELETE FROM {a} WHERE id BETWEEN 46 AND 50;"
        ),
    )
    .await;
    assert_equal_both(&mut p, &a).await;
    let meta = current_metadata(&p.table_dir(&a));
    let fields = current_fields(&meta);
    assert_eq!(
        &fields[..before.len()],
        &before[..],
        "kept columns keep their ids and types"
    );
    assert_eq!(fields[5].0, "c");
    assert_eq!(fields[5].1, 6, "the added column gets the next field id");
    assert!(meta["last-column-id"].as_i64().unwrap() >= 6);

    // Right after the schema commit: a restart reads the new schema back and continues.
    p.kill9();
    p.start();
    exec(
        &client,
        &format!("INSERT INTO {a} VALUES (1002, 2, 2.5, 2.25, 'after', 'c-1002'); UPDATE {a} SET c = 'again' WHERE id = 1001;"),
    )
    .await;
    assert_equal_both(&mut p, &a).await;

    // Widening inside a transaction, between DML: the rows before the ALTER are rewritten to the
    // new types and the transaction lands in one commit.
    exec(
        &client,
        &format!(
            "BEGIN; INSERT INTO {a} (id, x, c) VALUES (1003, 3, 'pre'); UPDATE {a} SET x = 7 WHERE id = 60;
             DELETE FROM {a} WHERE id = 61;
             ALTER TABLE {a} ALTER COLUMN x TYPE bigint, ALTER COLUMN f TYPE float8,
               ALTER COLUMN n TYPE numeric(12,2);
             INSERT INTO {a} (id, x, f, n) VALUES (1004, 5000000000, 1e300, 1234567890.12);
             UPDATE {a} SET x = x * 10000000 WHERE id BETWEEN 62 AND 64; DELETE FROM {a} WHERE id = 65;
             COMMIT;"
        ),
    )
    .await;
    assert_equal_both(&mut p, &a).await;
    let fields = current_fields(&current_metadata(&p.table_dir(&a)));
    let x = fields.iter().find(|f| f.0 == "x").unwrap();
    assert_eq!((x.1, x.2.as_str()), (2, "long"), "x keeps its id as a long");
    let f = fields.iter().find(|f| f.0 == "f").unwrap();
    assert_eq!((f.1, f.2.as_str()), (3, "double"));
    let n = fields.iter().find(|f| f.0 == "n").unwrap();
    assert_eq!((n.1, n.2.as_str()), (4, "decimal(12, 2)"));

    // ADD COLUMN inside a transaction between DML, then a crash right after its commit.
    exec(
        &client,
        &format!(
            "BEGIN; UPDATE {a} SET c = 'tx-before' WHERE id BETWEEN 70 AND 72; DELETE FROM {a} WHERE id = 73;
             ALTER TABLE {a} ADD COLUMN d numeric(10,2);
             INSERT INTO {a} (id, d) VALUES (1005, 9.99); UPDATE {a} SET d = id WHERE id BETWEEN 74 AND 76;
             UPDATE {a} SET x = 0 WHERE id = 77;
             COMMIT;"
        ),
    )
    .await;
    assert_equal_both(&mut p, &a).await;
    let meta = current_metadata(&p.table_dir(&a));
    let fields = current_fields(&meta);
    assert_eq!(
        (fields[6].0.as_str(), fields[6].1),
        ("d", 7),
        "never a reused id"
    );
    assert_eq!(
        meta["schemas"].as_array().unwrap().len(),
        4,
        "one schema per applied change: {}",
        meta["schemas"]
    );
    p.kill9();
    p.start();
    exec(
        &client,
        &format!("UPDATE {a} SET d = 1.5, x = 1 WHERE id <= 5; DELETE FROM {a} WHERE id = 1004; INSERT INTO {a} (id, d) VALUES (1006, 2.5);"),
    )
    .await;
    assert_equal_both(&mut p, &a).await;
    p.assert_running();
}

/// A change the formats cannot express (int → text) still stops cdcd, before the transaction, with
/// a message naming the table; the replica keeps everything before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowing_type_change_still_stops() {
    let (env, a) = ground_or_skip!(test_env_and_name("sevx"));
    let client = fresh_table(&env, &a, |a| {
        format!(
            "CREATE TABLE {a} (id int4 PRIMARY KEY, x int8);
             INSERT INTO {a} SELECT g, g FROM generate_series(1, 50) g;"
        )
    })
    .await;
    let mut p = Pipeline::owning_tables(&env, &a, &[&a], &Settings::default());
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    assert_equal_both(&mut p, &a).await;
    exec(
        &client,
        &format!("ALTER TABLE {a} ALTER COLUMN x TYPE int4; INSERT INTO {a} VALUES (51, 51);"),
    )
    .await;
    let out = p
        .assert_stops(Duration::from_secs(60), "cdcd must stop")
        .await;
    assert!(
        out.contains(&format!("public.{a}")) && out.contains("column x changed type"),
        "the stop names the table and the column:\n{out}"
    );
}

/// `ADD COLUMN … DEFAULT` with a constant: the source's existing rows hold the default (Postgres
/// stores it once, `attmissingval`), which no replication message carries. Into a v3 Iceberg table
/// cdcd stores it as the new field's `initial-default`, so DuckDB and pyiceberg read it for every
/// older row; rows of the same transaction before the ALTER take it too. Format v2 (equality
/// mode) has no initial default and the LSM sink neither: they stop, naming the table, the column
/// and the fix. The same after a restart, when the added column is the first thing cdcd sees of
/// the table. A volatile default (`now()`) rewrites the table with values nobody streams: that
/// stops everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_column_with_a_constant_default_reads_it_in_older_rows() {
    let env = ground_or_skip!(test_env(
        "add_column_with_a_constant_default_reads_it_in_older_rows"
    ));
    let v2 = std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality");
    let a = unique("sevd");
    let client = fresh_table(&env, &a, |a| {
        format!(
            "CREATE TABLE {a} (id int4 PRIMARY KEY, x int4 DEFAULT 7);
             INSERT INTO {a} SELECT g, g FROM generate_series(1, 50) g;"
        )
    })
    .await;
    let mut p = Pipeline::owning_tables(&env, &a, &[&a], &Settings::default());
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    // A column created with a default is no added column: this replicates.
    exec(&client, &format!("INSERT INTO {a} (id) VALUES (51)")).await;
    assert_equal_both(&mut p, &a).await;
    exec(
        &client,
        &format!(
            "BEGIN; INSERT INTO {a} VALUES (52, 52); UPDATE {a} SET x = -1 WHERE id = 3;
             ALTER TABLE {a} ADD COLUMN c text NOT NULL DEFAULT 'it''s', ADD COLUMN n numeric(6,2) DEFAULT 1.5,
               ADD COLUMN d date DEFAULT '2024-02-29', ADD COLUMN b boolean DEFAULT true;
             INSERT INTO {a} (id, x, c) VALUES (53, 53, 'x'); UPDATE {a} SET n = 2.25 WHERE id = 4; COMMIT;"
        ),
    )
    .await;
    if v2 {
        let out = p
            .assert_stops(Duration::from_secs(60), "cdcd must stop")
            .await;
        assert!(
            out.contains(&format!("public.{a}"))
                && out.contains("format v2 tables cannot store one"),
            "the stop names the table and why:\n{out}"
        );
        return;
    }
    assert_equal_both(&mut p, &a).await;
    let meta = current_metadata(&p.table_dir(&a));
    // The current schema (the list's order is not the ids').
    let schema = meta["schemas"]
        .as_array()
        .and_then(|s| {
            s.iter()
                .find(|s| s["schema-id"] == meta["current-schema-id"])
        })
        .cloned()
        .unwrap_or_default();
    let c = schema["fields"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == "c"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(c["initial-default"], "it's", "{schema}");
    // After a restart, more rows; the default stays with the field.
    p.kill9();
    p.start();
    exec(
        &client,
        &format!("INSERT INTO {a} (id) VALUES (54); DELETE FROM {a} WHERE id = 5;"),
    )
    .await;
    assert_equal_both(&mut p, &a).await;

    // Added while cdcd is down, and first seen after the restart, with no earlier shape of the
    // table in that session to compare with: the catalog still tells the default.
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    exec(
        &client,
        &format!("ALTER TABLE {a} ADD COLUMN e int8 DEFAULT 42; INSERT INTO {a} (id) VALUES (56);"),
    )
    .await;
    p.start();
    exec(&client, &format!("UPDATE {a} SET e = 1 WHERE id = 6;")).await;
    assert_equal_both(&mut p, &a).await;

    // A volatile default gives each existing row its own value: cdcd stops before the change.
    exec(
        &client,
        &format!("ALTER TABLE {a} ADD COLUMN t timestamptz DEFAULT clock_timestamp(); INSERT INTO {a} (id) VALUES (55);"),
    )
    .await;
    let out = p
        .assert_stops(Duration::from_secs(60), "cdcd must stop")
        .await;
    assert!(
        out.contains(&format!("public.{a}"))
            && out.contains("column(s) t added with a volatile DEFAULT"),
        "the stop names the table and the column:\n{out}"
    );
}

/// Without the DDL trigger, `DROP COLUMN b` then `ADD COLUMN b` of the same type with no change
/// between is invisible in pgoutput's Relation messages when `b` is the last column: the lake
/// would keep the dropped column's values where the source now holds NULL. cdcd reads the
/// columns' numbers (`attnum`) from the catalog at each Relation message and stops, naming the
/// table and the column; `cdcd resync` is the way out. The same change made while cdcd is
/// stopped stops it at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_dropped_and_added_again_stops_and_resync_recovers() {
    let (env, a) = ground_or_skip!(test_env_and_name("sreadd"));
    let client = fresh_table(&env, &a, |a| {
        format!(
            "CREATE TABLE {a} (id int4 PRIMARY KEY, x int4, b int4);
             INSERT INTO {a} SELECT g, g, g FROM generate_series(1, 50) g;"
        )
    })
    .await;
    let mut p = Pipeline::owning_tables(&env, &a, &[&a], &Settings::default());
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(&client, &format!("UPDATE {a} SET x = -x WHERE id <= 5")).await;
    p.assert_equal(&a, 60).await;
    let readd = format!("ALTER TABLE {a} DROP COLUMN b; ALTER TABLE {a} ADD COLUMN b int4;");
    exec(
        &client,
        &format!("{readd} UPDATE {a} SET x = 0 WHERE id = 7;"),
    )
    .await;
    let stopped = |out: String, when: &str| {
        assert!(
            out.contains(&format!("public.{a}"))
                && out.contains("column b was dropped and added again"),
            "{when}: the stop names the table and the column:\n{out}"
        );
    };
    p.assert_stops(Duration::from_secs(60), "cdcd must stop")
        .await;
    stopped(p.output(), "running");

    let (ok, out) = run_cdcd(&["resync", "--table", &format!("public.{a}")], &p.config);
    assert!(ok, "{out}");
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(&client, &format!("UPDATE {a} SET b = 1 WHERE id = 3")).await;
    assert_equal_both(&mut p, &a).await;

    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    exec(&client, &readd).await;
    p.start();
    p.assert_stops(Duration::from_secs(60), "cdcd must stop at start")
        .await;
    // The third start's output only: the first stop said the same.
    stopped(start_output(&p.output(), 3), "at start");
}

case_tests!(drop_column_case:
    /// `DROP COLUMN` (metadata only: the column leaves the current schema, old files keep it) into
    /// Iceberg and Paimon, inside a transaction between DML too; a change that drops one column
    /// while adding another (a rename looks exactly like that to pgoutput) stops rather than guess,
    /// and so does re-adding a dropped name.
    drop_column_applies_and_a_rename_stops_iceberg(false),
    drop_column_applies_and_a_rename_stops_lsm(true),
);

async fn drop_column_case(test: &str, lsm: bool) {
    let env = ground_or_skip!(test_env(test));
    if lsm && std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality") {
        return;
    }
    let a = unique(if lsm { "sdropl" } else { "sdrop" });
    let client = fresh_table(&env, &a, |a| {
        format!(
            "CREATE TABLE {a} (id int4 PRIMARY KEY, x int4, gone text, y text, z int4);
             INSERT INTO {a} SELECT g, g, 'g' || g, 'y' || g, g FROM generate_series(1, 100) g;"
        )
    })
    .await;
    let mut p = if lsm {
        Pipeline::new_lsm(&env, &a, &[&a], &Settings::default(), 2)
    } else {
        Pipeline::new(&env, &a, &[&a], &Settings::default())
    };
    p.on_cleanup(format!("DROP TABLE IF EXISTS {a}"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(&client, &format!("UPDATE {a} SET x = -x WHERE id <= 10")).await;
    p.assert_equal(&a, 60).await;
    exec(
        &client,
        &format!(
            "BEGIN; UPDATE {a} SET gone = 'last' WHERE id = 11; DELETE FROM {a} WHERE id = 12;
             ALTER TABLE {a} DROP COLUMN gone;
             INSERT INTO {a} (id, x, y) VALUES (101, 101, 'new'); UPDATE {a} SET y = 'up' WHERE id = 13;
             COMMIT;"
        ),
    )
    .await;
    p.assert_equal(&a, 60).await;
    if !lsm {
        assert_equal_both(&mut p, &a).await;
        let fields: Vec<String> = current_fields(&current_metadata(&p.table_dir(&a)))
            .into_iter()
            .map(|f| f.0)
            .collect();
        assert_eq!(fields, ["id", "x", "y", "z"]);
    }
    p.kill9();
    p.start();
    exec(
        &client,
        &format!("DELETE FROM {a} WHERE id = 14; UPDATE {a} SET z = 0 WHERE id = 15;"),
    )
    .await;
    p.assert_equal(&a, 60).await;
    // The last column renamed: pgoutput shows `z` gone and `w` new at its place.
    exec(
        &client,
        &format!("ALTER TABLE {a} RENAME COLUMN z TO w; UPDATE {a} SET w = 1 WHERE id = 16;"),
    )
    .await;
    let out = p
        .assert_stops(Duration::from_secs(60), "cdcd must stop")
        .await;
    assert!(
        out.contains(&format!("public.{a}")),
        "the stop names the table:\n{out}"
    );
}

/// The LSM (Paimon) sink evolves too: `ADD COLUMN` and widenings write `schema/schema-N` (new
/// field ids, kept ones unchanged) before the commit that first writes under it, old data files
/// are read by name (compaction and lookups merge files of all schemas), and pypaimon reads the
/// table equal to the source. A crash right after a schema file is written (before any snapshot
/// uses it) restarts into a table whose newest schema no snapshot has used yet: the replayed
/// transaction commits under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_column_and_widening_keep_replicating_lsm() {
    let (env, a) = ground_or_skip!(test_env_and_name("sevl"));
    let client = fresh_table(&env, &a, |a| {
        format!(
            "CREATE TABLE {a} (id int4 PRIMARY KEY, x int4, f float4, n numeric(8,2));
             INSERT INTO {a} SELECT g, g, g / 4.0, g / 3.0 FROM generate_series(1, 200) g;"
        )
    })
    .await;
    let mut p = Pipeline::new_lsm(&env, &a, &[&a], &Settings::default(), 2);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {a}"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    for k in 0..3 {
        exec(
            &client,
            &format!("UPDATE {a} SET x = x + 1 WHERE id % 7 = {k}"),
        )
        .await;
    }
    p.assert_equal(&a, 60).await;
    let schema_dir = p
        .warehouse
        .join(format!("{NAMESPACE}.db"))
        .join(&a)
        .join("schema");

    // ADD COLUMN inside a transaction between DML, then rows under the new schema.
    exec(&client, &format!("UPDATE {a} SET x = 0 WHERE id = 20")).await;
    exec(
        &client,
        &format!(
            "BEGIN; INSERT INTO {a} VALUES (201, 201); UPDATE {a} SET x = -1 WHERE id = 21;
             ALTER TABLE {a} ADD COLUMN c text;
             INSERT INTO {a} VALUES (202, 202, 1.5, 2.5, 'c'); UPDATE {a} SET c = 'set-' || id WHERE id BETWEEN 30 AND 40;
             DELETE FROM {a} WHERE id BETWEEN 41 AND 45; COMMIT;"
        ),
    )
    .await;
    p.assert_equal(&a, 60).await;
    assert!(schema_dir.join("schema-1").exists(), "schema-1 written");

    // Widening, with a crash right after its schema file is written: the restart replays the
    // ALTER's transaction into a table that already has the wider schema.
    p.kill9();
    exec(
        &client,
        &format!("UPDATE {a} SET x = 5 WHERE id BETWEEN 50 AND 55"),
    )
    .await;
    exec(
        &client,
        &format!(
            "BEGIN; ALTER TABLE {a} ALTER COLUMN x TYPE bigint, ALTER COLUMN f TYPE float8,
               ALTER COLUMN n TYPE numeric(12,2);
             INSERT INTO {a} (id, x, f, n) VALUES (203, 5000000000, 1e300, 1234567890.12);
             UPDATE {a} SET x = x * 10000000 WHERE id BETWEEN 62 AND 64; COMMIT;"
        ),
    )
    .await;
    p.env_vars = vec![("CDCD_FAILPOINT".into(), "lsm-schema-written".into())];
    p.start();
    p.assert_aborts_at(Duration::from_secs(60), "lsm-schema-written")
        .await;
    assert!(schema_dir.join("schema-2").exists(), "schema-2 written");
    p.env_vars.clear();
    p.start();
    p.assert_equal(&a, 60).await;

    // Many more commits: compaction merges files of all three schemas.
    for k in 0..8 {
        exec(
            &client,
            &format!("UPDATE {a} SET c = 'k{k}', x = x + {k} WHERE id % 8 = {k}; DELETE FROM {a} WHERE id = {}", 100 + k),
        )
        .await;
    }
    p.assert_equal(&a, 60).await;
    p.kill9();
    p.start();
    exec(
        &client,
        &format!("INSERT INTO {a} (id, c) VALUES (204, 'last')"),
    )
    .await;
    p.assert_equal(&a, 60).await;
    p.assert_running();
}

case_tests!(rename_case:
    /// With the DDL trigger of `migrations/postgres/002_ddl_capture.sql` installed, `RENAME COLUMN`
    /// replicates exactly into Iceberg: the field keeps its id under the new name. Covered: a
    /// rename followed by updates that leave a TOAST value unchanged (cdcd completes them from a
    /// file written before the rename, found by field id), a rename inside a transaction between
    /// its DML, the last column renamed (without the trigger exactly the shape that stops), a
    /// rename made while cdcd is down (replayed from the slot), two renames of one column before
    /// its next change, and a restart after the slot moved past a rename (kept in the source's
    /// state); a column dropped and another added under its name stops cdcd. Read back by DuckDB
    /// and pyiceberg. In its own database: the trigger is database-wide, and the other tests expect
    /// a rename to stop.
    rename_column_with_the_ddl_trigger_iceberg(false),
    /// The same into the LSM (Paimon) sink: `schema-N` keeps the field id under the new name, and
    /// cdcd's own lookups read files written before the rename under the older name.
    rename_column_with_the_ddl_trigger_lsm(true),
);

/// `(name, field id)` of the table's current schema: Iceberg's metadata, or Paimon's newest
/// `schema/schema-N`.
fn field_ids(p: &Pipeline, table: &str, lsm: bool) -> Vec<(String, i64)> {
    let fields = if lsm {
        paimon_fields(p, table)
    } else {
        current_fields(&current_metadata(&p.table_dir(table)))
    };
    fields.into_iter().map(|f| (f.0, f.1)).collect()
}

/// `(name, id, type)` of the fields in Paimon's newest `schema/schema-N`.
fn paimon_fields(p: &Pipeline, table: &str) -> Vec<(String, i64, String)> {
    let dir = p
        .warehouse
        .join(format!("{NAMESPACE}.db"))
        .join(table)
        .join("schema");
    let newest = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_prefix("schema-")?.parse::<u64>().ok()
        })
        .max()
        .unwrap();
    let schema: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("schema-{newest}"))).unwrap())
            .unwrap();
    schema_fields(&schema)
}

async fn rename_case(test: &str, lsm: bool) {
    let env = ground_or_skip!(test_env(test));
    if lsm && std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality") {
        return;
    }
    let database = unique(if lsm { "srenamel_db" } else { "srename_db" });
    let admin = connect(&env.pg_url).await;
    exec(
        &admin,
        &format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
    )
    .await;
    exec(&admin, &format!("CREATE DATABASE {database}")).await;
    let (server, _) = env.pg_url.rsplit_once('/').unwrap();
    let env = crate::support::TestEnv {
        pg_url: format!("{server}/{database}"),
        python: env.python.clone(),
    };
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        include_str!("../../migrations/postgres/002_ddl_capture.sql"),
    )
    .await;
    let a = unique(if lsm { "srenamel" } else { "srename" });
    exec(
        &client,
        &format!(
            "CREATE TABLE {a} (id int4 PRIMARY KEY, x int4, b text, big text, c int4);
             ALTER TABLE {a} ALTER COLUMN big SET STORAGE EXTERNAL;
             INSERT INTO {a} SELECT g, g, 'b' || g, repeat(md5(g::text), 200), g
               FROM generate_series(1, 100) g;"
        ),
    )
    .await;
    let mut p = if lsm {
        Pipeline::new_lsm(&env, &a, &[&a], &Settings::default(), 2)
    } else {
        Pipeline::new(&env, &a, &[&a], &Settings::default())
    };
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(&client, &format!("UPDATE {a} SET x = -x WHERE id <= 5")).await;
    equal(&mut p, &a, lsm).await;

    // The TOAST column renamed, then updates that leave it unchanged: pgoutput sends it as
    // unchanged, cdcd reads it from a file that still calls it `big`.
    exec(
        &client,
        &format!(
            "ALTER TABLE {a} RENAME COLUMN big TO huge;
             UPDATE {a} SET x = 1000 + id WHERE id BETWEEN 6 AND 15;"
        ),
    )
    .await;
    equal(&mut p, &a, lsm).await;

    // Inside one transaction, between its DML; and the last column renamed.
    exec(
        &client,
        &format!(
            "BEGIN;
             UPDATE {a} SET b = 'before' WHERE id = 16;
             ALTER TABLE {a} RENAME COLUMN b TO bb;
             UPDATE {a} SET bb = 'after' WHERE id = 17;
             INSERT INTO {a} (id, x, bb, huge, c) VALUES (101, 101, 'new', 'small', 101);
             COMMIT;
             ALTER TABLE {a} RENAME c TO w;
             UPDATE {a} SET w = -w WHERE id BETWEEN 18 AND 20;"
        ),
    )
    .await;
    equal(&mut p, &a, lsm).await;

    // While cdcd is down: two renames of one column, then changes; the restart replays the
    // trigger's messages from the slot.
    p.kill9();
    exec(
        &client,
        &format!(
            "ALTER TABLE {a} RENAME COLUMN x TO x1;
             ALTER TABLE {a} RENAME COLUMN x1 TO x2;
             UPDATE {a} SET x2 = 0 WHERE id BETWEEN 21 AND 25;
             DELETE FROM {a} WHERE id = 26;"
        ),
    )
    .await;
    p.start();
    equal(&mut p, &a, lsm).await;
    let fields = field_ids(&p, &a, lsm);
    // Iceberg's ids start at 1, Paimon's at 0.
    let first = i64::from(!lsm);
    let expected: Vec<(String, i64)> = ["id", "x2", "bb", "huge", "w"]
        .into_iter()
        .zip(first..)
        .map(|(n, i)| (n.to_owned(), i))
        .collect();
    assert_eq!(fields, expected, "renamed columns keep their field ids");

    // A rename, then a restart after the slot moved past the trigger's message (the DDL's
    // transaction has no rows, so cdcd acknowledges it): the rename was saved with the source's
    // state, and the table's next change still renames the lake's column.
    exec(&client, &format!("ALTER TABLE {a} RENAME COLUMN w TO w2")).await;
    let ddl_end: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let past: bool = client
            .query_one(
                "SELECT confirmed_flush_lsn >= $1::text::pg_lsn FROM pg_replication_slots WHERE slot_name = $2",
                &[&ddl_end, &p.slot],
            )
            .await
            .unwrap()
            .get(0);
        if past {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the slot never moved past the rename"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    p.kill9();
    exec(
        &client,
        &format!("UPDATE {a} SET w2 = 7 WHERE id BETWEEN 27 AND 30"),
    )
    .await;
    p.start();
    equal(&mut p, &a, lsm).await;
    let fields = field_ids(&p, &a, lsm);
    assert!(
        fields.iter().any(|f| f.0 == "w2" && f.1 == 4 + first),
        "renamed after the restart, same field id: {fields:?}"
    );

    // A column dropped and another added under its name, with no change between: the lake still
    // holds the dropped one, so cdcd stops rather than take the new one for it.
    exec(
        &client,
        &format!(
            "ALTER TABLE {a} DROP COLUMN bb; ALTER TABLE {a} ADD COLUMN bb text;
             UPDATE {a} SET bb = 'new' WHERE id = 31;"
        ),
    )
    .await;
    let out = p
        .assert_stops(Duration::from_secs(60), "cdcd must stop")
        .await;
    // Said by the trigger's DROP message, or by the column's new number (whichever is read
    // first: the catalog's, at the Relation message).
    assert!(
        out.contains("column bb takes the name of a column dropped earlier")
            || out.contains("column bb was dropped and added again"),
        "the stop names the column:\n{out}"
    );
    drop(p);
    drop(client);
    exec(
        &admin,
        &format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
    )
    .await;
}

/// Equal by DuckDB and pyiceberg (Iceberg), or by pypaimon (LSM).
async fn equal(p: &mut Pipeline, table: &str, lsm: bool) {
    if lsm {
        p.assert_equal(table, 60).await;
    } else {
        assert_equal_both(p, table).await;
    }
}

/// `source.schema_change = "stop"`: an `ADD COLUMN` stops cdcd before the first transaction that
/// needs it, naming the table, the change and the setting; the lake keeps the rows before it,
/// under its old schema. Changes that leave the lake's schema alone (`varchar(10)` →
/// `varchar(20)`) go on. Iceberg and Paimon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_change_stop_keeps_the_lake_schema() {
    let env = ground_or_skip!(test_env("schema_change_stop_keeps_the_lake_schema"));
    for lsm in [false, true] {
        if lsm && std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality") {
            continue;
        }
        let a = unique(if lsm { "sstopl" } else { "sstop" });
        // Per table: `a` stops, every other table (`free`) evolves.
        let free = format!("{a}_free");
        let client = connect(&env.pg_url).await;
        exec(
            &client,
            &format!(
                "DROP TABLE IF EXISTS {a}, {free};
                 CREATE TABLE {a} (id int4 PRIMARY KEY, v varchar(10));
                 INSERT INTO {a} SELECT g, 'v' || g FROM generate_series(1, 50) g;
                 CREATE TABLE {free} (id int4 PRIMARY KEY, v varchar(10));
                 INSERT INTO {free} SELECT g, 'v' || g FROM generate_series(1, 50) g;"
            ),
        )
        .await;
        let settings = Settings {
            source_extra: format!(
                "schema_change = {{ \"public.{a}\" = \"stop\", \"*\" = \"evolve\" }}"
            ),
            ..Settings::default()
        };
        let mut p = if lsm {
            Pipeline::new_lsm(&env, &a, &[&a, &free], &settings, 2)
        } else {
            Pipeline::new(&env, &a, &[&a, &free], &settings)
        };
        p.on_cleanup(format!("DROP TABLE IF EXISTS {a}, {free}"));
        p.start();
        p.wait_slot_active(&client, Duration::from_secs(120)).await;
        exec(
            &client,
            &format!(
                "ALTER TABLE {a} ALTER COLUMN v TYPE varchar(20);
                 UPDATE {a} SET v = 'longer value' WHERE id = 1;"
            ),
        )
        .await;
        p.assert_equal(&a, 60).await;
        // The other table's schema follows its source.
        exec(
            &client,
            &format!(
                "ALTER TABLE {free} ADD COLUMN w int4; INSERT INTO {free} VALUES (51, 'new', 51);"
            ),
        )
        .await;
        p.assert_equal(&free, 60).await;
        exec(
            &client,
            &format!("ALTER TABLE {a} ADD COLUMN w int4; INSERT INTO {a} VALUES (51, 'new', 51);"),
        )
        .await;
        let out = p
            .assert_stops(Duration::from_secs(60), "cdcd must stop")
            .await;
        assert!(
            out.contains(&format!("public.{a}"))
                && (lsm || out.contains("column w added"))
                && out.contains("source.schema_change = \"stop\" (for this table)"),
            "the stop names the table, the change and the setting:\n{out}"
        );
        if !lsm {
            let fields: Vec<String> = current_fields(&current_metadata(&p.table_dir(&a)))
                .into_iter()
                .map(|f| f.0)
                .collect();
            assert_eq!(fields, ["id", "v"], "the lake's schema is unchanged");
            let fields: Vec<String> = current_fields(&current_metadata(&p.table_dir(&free)))
                .into_iter()
                .map(|f| f.0)
                .collect();
            assert_eq!(fields, ["id", "v", "w"], "the other table evolved");
        }
    }
}

/// A pipeline over `tables` (created by the caller) whose walsender streams every transaction
/// past 64 kB while it is still open (pgoutput v2): cdcd connects as a role with
/// `logical_decoding_work_mem = 64kB` (the walsender takes the role's settings), and
/// [`fill`](Streamed::fill) inserts enough into an uncaptured table to pass that.
struct Streamed {
    p: Pipeline,
    filler: String,
}

impl Streamed {
    /// `before`: SQL run once the pipeline is set up, before cdcd starts.
    async fn start(
        env: &TestEnv,
        client: &Client,
        name: &str,
        tables: &[&str],
        before: &str,
    ) -> Streamed {
        let (filler, role) = (format!("{name}_f"), format!("{name}_r"));
        exec(
            client,
            &format!(
                "DROP TABLE IF EXISTS {filler}; CREATE TABLE {filler} (id int4, t text);
                 DROP ROLE IF EXISTS {role}; CREATE ROLE {role} SUPERUSER LOGIN REPLICATION;
                 ALTER ROLE {role} SET logical_decoding_work_mem = '64kB';"
            ),
        )
        .await;
        let settings = Settings {
            url: Some(crate::postgres::ddl::role_url(&env.pg_url, &role)),
            ..Settings::default()
        };
        let mut p = Pipeline::new(env, name, tables, &settings);
        p.on_cleanup(format!(
            "DROP TABLE IF EXISTS {}, {filler}; DROP ROLE IF EXISTS {role}",
            tables.join(", ")
        ));
        if !before.is_empty() {
            exec(client, before).await;
        }
        p.start();
        p.wait_slot_active(client, Duration::from_secs(120)).await;
        Streamed { p, filler }
    }

    /// SQL that makes the transaction it is in larger than the walsender's decoding memory.
    ///
    /// A transaction that makes cdcd stop runs it twice: before the change, so whole blocks are
    /// streamed (and counted in `pg_stat_replication_slots`) before cdcd sees the change, and
    /// after it, so the change comes in a block of its own before the commit. The walsender
    /// counts a block once it has sent it all; one cut off by cdcd's exit is never counted.
    fn fill(&self) -> String {
        format!(
            "INSERT INTO {} SELECT g, repeat('f', 100) FROM generate_series(1, 5000) g;",
            self.filler
        )
    }
}

/// The same change inside a transaction big enough to be streamed (pgoutput v2) while it is still
/// open: its Relation message reaches cdcd before the transaction commits, when the catalog still
/// shows the old column numbers. cdcd checks them once the transaction has committed and is
/// visible, so it stops before applying it, as it does for an ordinary transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_readded_inside_a_streamed_transaction_stops() {
    let (env, a) = ground_or_skip!(test_env_and_name("sreadds"));
    let client = fresh_table(&env, &a, |a| {
        format!(
            "CREATE TABLE {a} (id int4 PRIMARY KEY, x int4, b int4);
             INSERT INTO {a} SELECT g, g, g FROM generate_series(1, 50) g;"
        )
    })
    .await;
    let mut bed = Streamed::start(&env, &client, &a, &[&a], "").await;
    let fill = bed.fill();
    let p = &mut bed.p;
    exec(&client, &format!("UPDATE {a} SET x = -x WHERE id <= 5")).await;
    p.assert_equal(&a, 60).await;
    exec(
        &client,
        &format!(
            "BEGIN;
             {fill}
             ALTER TABLE {a} DROP COLUMN b; ALTER TABLE {a} ADD COLUMN b int4;
             UPDATE {a} SET x = 0 WHERE id = 7;
             {fill}
             SELECT pg_sleep(2);
             COMMIT;"
        ),
    )
    .await;
    let out = p
        .assert_stops(Duration::from_secs(60), "cdcd must stop")
        .await;
    assert!(
        out.contains(&format!("public.{a}"))
            && out.contains("column b was dropped and added again"),
        "the stop names the table and the column:\n{out}"
    );
    crate::postgres::ddl::assert_streamed(&client, &p.slot).await;
}

/// `ADD COLUMN … DEFAULT` inside a transaction that is streamed (pgoutput v2) and stays open
/// for 12 s after it (in `b` between two changes of the table, so two Relation messages): what older rows read is taken from the catalog once the transaction has
/// committed (before, the catalog does not show the column yet), so the column replicates with
/// older rows reading 7 instead of cdcd giving up on a column it cannot find.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_added_inside_a_long_streamed_transaction_replicates() {
    let env = ground_or_skip!(test_env(
        "a_default_added_inside_a_long_streamed_transaction_replicates"
    ));
    if std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality") {
        return; // v2 tables stop on a DEFAULT (README)
    }
    let a = unique("sdefs");
    let b = format!("{a}_b");
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {a}, {b};
             CREATE TABLE {a} (id int4 PRIMARY KEY, x int4);
             INSERT INTO {a} SELECT g, g FROM generate_series(1, 50) g;
             CREATE TABLE {b} (id int4 PRIMARY KEY, x int4);
             INSERT INTO {b} SELECT g, g FROM generate_series(1, 50) g;"
        ),
    )
    .await;
    let mut bed = Streamed::start(&env, &client, &a, &[&a, &b], "").await;
    let fill = bed.fill();
    let p = &mut bed.p;
    // `b` has a change before the transaction (its columns are known: the added column is read
    // as added); `a` has none (its first Relation is the transaction's: read as stored).
    exec(&client, &format!("UPDATE {b} SET x = -x WHERE id = 1")).await;
    p.assert_equal(&a, 60).await;
    p.assert_equal(&b, 60).await;
    exec(
        &client,
        &format!(
            "BEGIN;
             ALTER TABLE {a} ADD COLUMN c int4 DEFAULT 7;
             UPDATE {a} SET x = 0, c = 1 WHERE id = 7;
             UPDATE {b} SET x = 0 WHERE id = 9;
             ALTER TABLE {b} ADD COLUMN c int4 DEFAULT 8;
             UPDATE {b} SET x = 1 WHERE id = 9;
             {fill}
             SELECT pg_sleep(12);
             COMMIT;"
        ),
    )
    .await;
    exec(&client, &format!("UPDATE {a} SET x = -x WHERE id <= 3")).await;
    p.assert_equal(&a, 60).await;
    p.assert_equal(&b, 60).await;
    crate::postgres::ddl::assert_streamed(&client, &p.slot).await;
    p.assert_running();
}

/// A column added with a constant default while cdcd is stopped; after the start, the table's
/// first Relation message comes inside a streamed transaction (pgoutput v2) that stays open while
/// another transaction on the table commits. That one is applied first, under the shape the
/// streamed one announced, so the stored default must already be in it: older rows read 7 in the
/// lake, not NULL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_default_reaches_a_transaction_committed_inside_a_streamed_one() {
    let env = ground_or_skip!(test_env(&current_test()));
    if std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality") {
        return; // v2 tables stop on a DEFAULT (README)
    }
    let a = unique("sdefc");
    let client = fresh_table(&env, &a, |a| {
        format!(
            "CREATE TABLE {a} (id int4 PRIMARY KEY, x int4);
             INSERT INTO {a} SELECT g, g FROM generate_series(1, 50) g;"
        )
    })
    .await;
    let mut bed = Streamed::start(&env, &client, &a, &[&a], "").await;
    let fill = bed.fill();
    let p = &mut bed.p;
    p.assert_equal(&a, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    exec(
        &client,
        &format!("ALTER TABLE {a} ADD COLUMN c int4 DEFAULT 7"),
    )
    .await;
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    let url = env.pg_url.clone();
    let streamed_tx = format!(
        "BEGIN;
         UPDATE {a} SET x = 0 WHERE id = 7;
         {fill}
         SELECT pg_sleep(4);
         COMMIT;"
    );
    let open = tokio::spawn(async move {
        let c = connect(&url).await;
        exec(&c, &streamed_tx).await;
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    exec(&client, &format!("UPDATE {a} SET x = -x WHERE id <= 3")).await;
    open.await.unwrap();
    p.assert_equal(&a, 60).await;
    crate::postgres::ddl::assert_streamed(&client, &p.slot).await;
    p.assert_running();
}

/// With a publication of all tables (`FOR ALL TABLES`, which cdcd accepts), one streamed
/// transaction renames the captured table away and creates another under its name, with rows.
/// Its Relation message comes while the transaction is open, when the catalog still shows the
/// captured table under the name: cdcd must not take the new table for an older one of that
/// name and skip its rows. It stops, naming the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_taking_the_name_inside_a_streamed_transaction_stops() {
    let (env, a) = ground_or_skip!(test_env_and_name("sswap"));
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {a}, {a}_old;
             CREATE TABLE {a} (id int4 PRIMARY KEY, x int4);
             INSERT INTO {a} SELECT g, g FROM generate_series(1, 50) g;"
        ),
    )
    .await;
    let mut bed = Streamed::start(
        &env,
        &client,
        &a,
        &[&a],
        &format!("CREATE PUBLICATION cdcd_{a} FOR ALL TABLES"),
    )
    .await;
    let fill = bed.fill();
    let p = &mut bed.p;
    p.on_cleanup(format!("DROP TABLE IF EXISTS {a}_old"));
    exec(&client, &format!("UPDATE {a} SET x = -x WHERE id <= 5")).await;
    p.assert_equal(&a, 60).await;
    exec(
        &client,
        &format!(
            "BEGIN;
             {fill}
             ALTER TABLE {a} RENAME TO {a}_old;
             CREATE TABLE {a} (id int4 PRIMARY KEY, x int4);
             INSERT INTO {a} SELECT g, 1000 + g FROM generate_series(1, 10) g;
             {fill}
             SELECT pg_sleep(2);
             COMMIT;"
        ),
    )
    .await;
    let out = p
        .assert_stops(Duration::from_secs(60), "cdcd must stop")
        .await;
    assert!(
        out.contains(&format!("public.{a}")) && out.contains("created again"),
        "the stop names the table:\n{out}"
    );
    crate::postgres::ddl::assert_streamed(&client, &p.slot).await;
}
