//! End to end, a DDL inside a transaction (issue 17): Postgres sends a new Relation message between the
//! transaction's changes of the altered table. Every row of such a transaction reaches the replica, for
//! changes that keep the lake's column types (varchar widening, varchar → text, json → jsonb, two DDLs in one
//! transaction, a DDL between the changes of two tables, a streamed transaction), also across a `kill -9`
//! after the commit; a change no lake type can follow (int → text) stops cdcd before the transaction, with
//! everything before it committed and nothing of it, again after a restart.
//!
//! Read back by DuckDB through `tests/support/lakecheck.py` (Iceberg) and pypaimon (LSM).

use std::process::Stdio;
use std::time::Duration;

use crate::support::{
    connect, exec, run_cdcd, test_env, test_env_and_name, unique, Pipeline, Settings, LAKECHECK,
    NAMESPACE,
};

fn create_tables(a: &str, b: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {a}, {b};
         CREATE TABLE {a} (id int4 PRIMARY KEY, v varchar(10), w varchar(5), j json, n int4);
         CREATE TABLE {b} (id int4 PRIMARY KEY, v text);
         INSERT INTO {a} SELECT g, 'a' || g, 'w', json_build_object('g', g), g FROM generate_series(1, 100) g;
         INSERT INTO {b} SELECT g, 'b' || g FROM generate_series(1, 100) g;"
    )
}

/// Transactions with DDL in the middle whose column types map to the same lake types.
fn ddl_transactions(a: &str, b: &str) -> Vec<String> {
    vec![
        // The reproduction from the issue: widening, then changes of both tables.
        format!(
            "BEGIN; INSERT INTO {a} VALUES (1001, 'one');
             ALTER TABLE {a} ALTER COLUMN v TYPE varchar(200);
             INSERT INTO {a} VALUES (1002, 'two'); INSERT INTO {b} VALUES (1001, 'b1');
             INSERT INTO {a} VALUES (1003, 'three'); COMMIT;"
        ),
        // varchar → text, with updates and deletes on both sides of it.
        format!(
            "BEGIN; UPDATE {a} SET v = 'before' WHERE id <= 10; DELETE FROM {a} WHERE id = 11;
             UPDATE {b} SET v = 'b-before' WHERE id <= 5;
             ALTER TABLE {a} ALTER COLUMN v TYPE text;
             UPDATE {a} SET v = repeat('long', 100) WHERE id BETWEEN 5 AND 15; DELETE FROM {a} WHERE id = 12;
             INSERT INTO {a} VALUES (1004, 'four'); UPDATE {b} SET v = 'b-after' WHERE id <= 3; COMMIT;"
        ),
        // json → jsonb.
        format!(
            "BEGIN; UPDATE {a} SET j = '{{\"k\": 1}}' WHERE id = 20;
             ALTER TABLE {a} ALTER COLUMN j TYPE jsonb;
             UPDATE {a} SET j = '{{\"k\": 2}}' WHERE id = 21; INSERT INTO {a} (id, j) VALUES (1005, '[1]'); COMMIT;"
        ),
        // Two DDLs in one transaction, with a change of the other table between them.
        format!(
            "BEGIN; INSERT INTO {a} (id, w) VALUES (1006, 'abc');
             ALTER TABLE {a} ALTER COLUMN w TYPE varchar(10);
             INSERT INTO {a} (id, w) VALUES (1007, 'abcdefgh'); INSERT INTO {b} VALUES (1002, 'b2');
             ALTER TABLE {a} ALTER COLUMN w TYPE varchar(20);
             INSERT INTO {a} (id, w) VALUES (1008, 'abcdefghijklmno'); DELETE FROM {b} WHERE id = 50;
             UPDATE {a} SET w = 'x' WHERE id = 1006; COMMIT;"
        ),
        // A DDL on one table between the changes of two tables, and the other table altered too.
        format!(
            "BEGIN; INSERT INTO {b} VALUES (1003, 'b3'); INSERT INTO {a} VALUES (1009, 'nine');
             ALTER TABLE {b} ALTER COLUMN v TYPE varchar(300);
             INSERT INTO {b} VALUES (1004, 'b4'); INSERT INTO {a} VALUES (1010, 'ten');
             UPDATE {b} SET v = 'b-last' WHERE id = 1003; COMMIT;"
        ),
    ]
}

async fn ddl_inside_transactions_loses_no_rows(lsm: bool) {
    let (env, name) = ground_or_skip!(test_env_and_name(if lsm { "ddll" } else { "ddl" }));
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_tables(&a, &b)).await;
    let settings = Settings::default();
    let mut p = if lsm {
        Pipeline::new_lsm(&env, &name, &[&a, &b], &settings, 2)
    } else {
        Pipeline::new(&env, &name, &[&a, &b], &settings)
    };
    p.on_cleanup(format!("DROP TABLE IF EXISTS {a}, {b}"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    p.assert_equal(&a, 120).await;
    p.assert_equal(&b, 60).await;

    for (i, sql) in ddl_transactions(&a, &b).iter().enumerate() {
        exec(&client, sql).await;
        p.assert_equal(&a, 60).await;
        p.assert_equal(&b, 60).await;
        if i == 0 {
            // Right after the commits of the first DDL transaction: nothing of it may be lost on a restart.
            p.kill9();
            p.start();
        }
    }
    // Later changes after all the DDL, then a kill -9 and a restart that must resume cleanly.
    exec(
        &client,
        &format!(
            "UPDATE {a} SET v = 'end', w = 'end' WHERE id % 7 = 0; DELETE FROM {b} WHERE id % 9 = 0;"
        ),
    )
    .await;
    p.assert_equal(&a, 60).await;
    p.kill9();
    p.start();
    exec(
        &client,
        &format!("INSERT INTO {b} VALUES (2000, 'after restart')"),
    )
    .await;
    p.assert_equal(&a, 60).await;
    p.assert_equal(&b, 60).await;
    p.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_inside_transactions_loses_no_rows_iceberg() {
    ddl_inside_transactions_loses_no_rows(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_inside_transactions_loses_no_rows_lsm() {
    ddl_inside_transactions_loses_no_rows(true).await;
}

/// A transaction larger than `logical_decoding_work_mem` is streamed (pgoutput v2): its Relation message
/// after the DDL arrives between stream blocks, and the whole transaction still lands in one commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_inside_a_streamed_transaction_loses_no_rows() {
    let (env, name) = ground_or_skip!(test_env_and_name("ddls"));
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let role = format!("{name}_r");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_tables(&a, &b)).await;
    // The walsender takes the role's settings: a tiny decoding memory makes this transaction stream.
    exec(
        &client,
        &format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} SUPERUSER LOGIN REPLICATION;
             ALTER ROLE {role} SET logical_decoding_work_mem = '64kB';"
        ),
    )
    .await;
    let url = role_url(&env.pg_url, &role);
    let settings = Settings {
        url: Some(url),
        ..Settings::default()
    };
    let mut p = Pipeline::new(&env, &name, &[&a, &b], &settings);
    p.on_cleanup(format!(
        "DROP TABLE IF EXISTS {a}, {b}; DROP ROLE IF EXISTS {role}"
    ));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    p.assert_equal(&a, 120).await;
    exec(
        &client,
        &format!(
            "BEGIN;
             INSERT INTO {a} (id, v) SELECT g, 'x' FROM generate_series(2000, 5999) g;
             UPDATE {a} SET w = 'pre' WHERE id <= 50;
             INSERT INTO {b} SELECT g, repeat('b', 100) FROM generate_series(2000, 3999) g;
             ALTER TABLE {a} ALTER COLUMN v TYPE varchar(300);
             INSERT INTO {a} (id, v) SELECT g, repeat('y', 250) FROM generate_series(6000, 7999) g;
             INSERT INTO {b} VALUES (1001, 'between');
             INSERT INTO {a} (id, v) SELECT g, repeat('z', 250) FROM generate_series(8000, 9999) g;
             UPDATE {a} SET v = 'post' WHERE id BETWEEN 2000 AND 2500;
             DELETE FROM {a} WHERE id BETWEEN 9000 AND 9100;
             INSERT INTO {b} SELECT g, 'late' FROM generate_series(4000, 4999) g;
             COMMIT;"
        ),
    )
    .await;
    p.assert_equal(&a, 90).await;
    p.assert_equal(&b, 60).await;
    assert_streamed(&client, &p.slot).await;
    p.assert_running();
}

/// Fails unless the walsender of `slot` has streamed a transaction (pgoutput v2).
pub(crate) async fn assert_streamed(client: &tokio_postgres::Client, slot: &str) {
    let streamed: i64 = client
        .query_one(
            "SELECT coalesce(sum(stream_txns), 0)::int8 FROM pg_stat_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        streamed > 0,
        "the transaction was not streamed (stream_txns = 0)"
    );
}

/// `postgres://user@host…` with the user replaced by `role`.
pub(crate) fn role_url(url: &str, role: &str) -> String {
    let rest = url
        .split_once("://")
        .map(|(_, r)| r)
        .unwrap_or(url)
        .split_once('@')
        .map(|(_, host)| host)
        .unwrap_or(url);
    format!("postgres://{role}@{rest}")
}

/// A column type change inside a transaction that the lake cannot express (int4 → text; a widening such
/// as int4 → int8 is applied, `schema_evolution.rs`): cdcd
/// stops before the transaction, says so, and has committed exactly the transactions before it. Restarted,
/// it stops at the same place again: the transaction is never skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_change_inside_a_transaction_stops_before_it() {
    let (env, name) = ground_or_skip!(test_env_and_name("ddlx"));
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_tables(&a, &b)).await;
    let mut p = Pipeline::new(&env, &name, &[&a, &b], &Settings::default());
    p.on_cleanup(format!(
        "DROP TABLE IF EXISTS {a}, {b}, {a}_before, {b}_before"
    ));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(
        &client,
        &format!("UPDATE {a} SET v = 'kept' WHERE id <= 10; INSERT INTO {b} VALUES (500, 'kept');"),
    )
    .await;
    p.assert_equal(&a, 60).await;
    p.assert_equal(&b, 60).await;
    // What the replica must hold once cdcd stopped: the tables as they are before the transaction.
    exec(
        &client,
        &format!(
            "CREATE TABLE {a}_before AS SELECT * FROM {a}; ALTER TABLE {a}_before ADD PRIMARY KEY (id);
             CREATE TABLE {b}_before AS SELECT * FROM {b}; ALTER TABLE {b}_before ADD PRIMARY KEY (id);"
        ),
    )
    .await;
    exec(
        &client,
        &format!(
            "BEGIN; INSERT INTO {a} VALUES (1001, 'one'); INSERT INTO {b} VALUES (1001, 'b1');
             ALTER TABLE {a} ALTER COLUMN n TYPE text;
             INSERT INTO {a} VALUES (1002, 'two', 'w', '{{}}', 'five'); COMMIT;"
        ),
    )
    .await;
    for start in 1..=2 {
        let out = p
            .assert_stops(Duration::from_secs(60), "cdcd must stop")
            .await;
        let stops = out.matches("changed inside the transaction").count();
        assert!(
            stops >= start,
            "start {start}: cdcd must say the schema changed inside the transaction:\n{out}"
        );
        assert!(
            out.contains(&format!("public.{a}")),
            "the message names the table:\n{out}"
        );
        for t in [&a, &b] {
            let (code, text) = lakecheck_against(&p, &format!("{t}_before"), t).await;
            assert_eq!(
                code,
                Some(0),
                "{t} must hold exactly the transactions before the DDL one:\n{text}"
            );
        }
        if start == 1 {
            p.start();
        }
    }
}

/// `ALTER TABLE … RENAME TO` and `DROP TABLE` + `CREATE TABLE` of a captured table while cdcd
/// streams: pgoutput sends neither, only Relation messages naming the new name (same oid) or the
/// old name (new oid) before the next change. Both stop cdcd before that change, naming the
/// table and what happened, with everything before committed; never a change skipped or mixed
/// into the old table's rows. The way out the recreated case names, `cdcd resync`, gets past it:
/// the replayed changes of the old table (another oid under the name) are skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_or_recreated_table_stops_cdcd() {
    let env = ground_or_skip!(test_env("a_renamed_or_recreated_table_stops_cdcd"));
    for recreate in [false, true] {
        let name = unique(if recreate { "ddlre" } else { "ddlrn" });
        let (a, b) = (format!("{name}_a"), format!("{name}_b"));
        let client = connect(&env.pg_url).await;
        exec(&client, &create_tables(&a, &b)).await;
        let mut p = Pipeline::new(&env, &name, &[&a, &b], &Settings::default());
        p.on_cleanup(format!(
            "DROP TABLE IF EXISTS {a}, {b}, {a}_renamed, {a}_before"
        ));
        p.start();
        p.wait_slot_active(&client, Duration::from_secs(120)).await;
        exec(
            &client,
            &format!("UPDATE {a} SET v = 'kept' WHERE id <= 10"),
        )
        .await;
        p.assert_equal(&a, 60).await;
        exec(
            &client,
            &format!(
                "CREATE TABLE {a}_before AS SELECT * FROM {a}; ALTER TABLE {a}_before ADD PRIMARY KEY (id);"
            ),
        )
        .await;
        let change = if recreate {
            // Two transactions: changes a transaction makes before it adds the new table to the
            // publication are not published (Postgres decides per change, with the catalog of
            // the time), and may never reach cdcd; the start check catches that case.
            exec(
                &client,
                &format!(
                    "DROP TABLE {a}; CREATE TABLE {a} (LIKE {a}_before INCLUDING ALL);
                     ALTER PUBLICATION {publication} ADD TABLE {a};",
                    publication = p.publication
                ),
            )
            .await;
            format!(
                "INSERT INTO {a} SELECT * FROM {a}_before WHERE id > 50;
                 UPDATE {a} SET v = 'new table' WHERE id = 60;"
            )
        } else {
            format!("ALTER TABLE {a} RENAME TO {a}_renamed; UPDATE {a}_renamed SET v = 'gone' WHERE id = 11;")
        };
        exec(&client, &change).await;
        let out = p
            .assert_stops(Duration::from_secs(60), "cdcd must stop")
            .await;
        let wanted = if recreate {
            "dropped and created again"
        } else {
            "renamed to"
        };
        assert!(
            out.contains(wanted) && out.contains(&format!("public.{a}")),
            "the stop names the table and what happened:\n{out}"
        );
        let (code, text) = lakecheck_against(&p, &format!("{a}_before"), &a).await;
        assert_eq!(code, Some(0), "{a} holds exactly the rows before:\n{text}");
        if recreate {
            // The way out the stop names: a resync copies the new table, and the replay of the
            // old table's changes (another oid under the name) is skipped, not a stop again.
            let (ok, out) = run_cdcd(&["resync", "--table", &format!("public.{a}")], &p.config);
            assert!(ok, "{out}");
            p.start();
            exec(
                &client,
                &format!("UPDATE {a} SET v = 'resynced' WHERE id = 70"),
            )
            .await;
            p.assert_equal(&a, 120).await;
            p.assert_equal(&b, 60).await;
        }
    }
}

/// A captured table renamed away and a new table created under its name, published, written:
/// only the new table's Relation messages arrive (the captured oid still exists, under another
/// name). They are never taken for an older table of the name and skipped: cdcd stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_taking_a_captured_tables_name_stops_cdcd() {
    let (env, name) = ground_or_skip!(test_env_and_name("ddltk"));
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_tables(&a, &b)).await;
    let mut p = Pipeline::new(&env, &name, &[&a, &b], &Settings::default());
    p.on_cleanup(format!("DROP TABLE IF EXISTS {a}, {b}, {a}_old"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(
        &client,
        &format!("UPDATE {b} SET v = 'kept' WHERE id <= 10"),
    )
    .await;
    p.assert_equal(&b, 60).await;
    exec(
        &client,
        &format!(
            "ALTER TABLE {a} RENAME TO {a}_old; CREATE TABLE {a} (LIKE {a}_old INCLUDING ALL);
             ALTER PUBLICATION {publication} ADD TABLE {a};",
            publication = p.publication
        ),
    )
    .await;
    exec(&client, &format!("INSERT INTO {a} VALUES (1, 'new')")).await;
    let out = p
        .assert_stops(Duration::from_secs(60), "cdcd must stop")
        .await;
    assert!(
        out.contains("dropped and created again") && out.contains(&format!("public.{a}")),
        "the stop names the table:\n{out}"
    );
}

/// lakecheck of source table `public.<source>` against the lake table `<lake>`.
async fn lakecheck_against(p: &Pipeline, source: &str, lake: &str) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(&p.env.python)
        .arg(LAKECHECK)
        .args(["--source", &p.env.pg_url])
        .args(["--source-table", &format!("public.{source}")])
        .arg("--iceberg")
        .arg(p.warehouse.join(NAMESPACE).join(lake))
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {LAKECHECK}: {e}"));
    let text = crate::support::stderr_then_stdout(&out);
    (out.status.code(), text)
}
