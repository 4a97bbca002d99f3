//! End to end, DDL while the Postgres copy runs (issue 34, parts 1 and 2): a migration that lands
//! after a copy's snapshot was taken and before the copy reached (and locked) the table, and one
//! that lands between the copy's plan and its snapshot. Each copy path is driven: the fresh copy,
//! a table added later (copied at a new snapshot beside the slot), a keyless table added later
//! (copied exactly at a temporary slot) and a resync's copy job (with a temporary slot of a
//! killed predecessor lingering).
//!
//! What goes wrong without the shape check (`src/sources/postgres/copy.rs`): a table-rewriting
//! `ALTER` gives the table a new heap whose rows the older snapshot cannot see, so `COPY` at the
//! snapshot returns no rows and no error, and the stream never sees the rewrite: the lake table
//! ends empty. A column added and filled between a plan read before the snapshot and the
//! snapshot is copied as NULL. The windows are widened with pause points (`CDCD_PAUSEPOINT`):
//! `copy-planned` (the copy is planned; no table locked yet) and `copy-chunk-copied` (a worker
//! finished a chunk of the big table; the table queued behind it is not locked).

use std::time::{Duration, Instant};

use super::snapshot::tune;
use crate::support::{connect, exec, run_cdcd, test_env_and_name, Pipeline, Settings};
use tokio_postgres::Client;

/// A keyed table of `rows` rows with a column a rewrite widens (`v int4`), a `float4` and a
/// `json` column (both rewritten by their own widening), and a column that stays.
fn create_table(t: &str, rows: u64) -> String {
    format!(
        "DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id int8 PRIMARY KEY, v int4, f float4, j json, s text);
         INSERT INTO {t} SELECT g, g % 1000, g / 4.0, json_build_object('g', g), 'row ' || g
           FROM generate_series(1, {rows}) g;
         ANALYZE {t};"
    )
}

/// The migrations of the issue: every rewriting type change it names, on `t`.
fn rewrite(t: &str) -> String {
    format!(
        "ALTER TABLE {t} ALTER COLUMN v TYPE bigint;
         ALTER TABLE {t} ALTER COLUMN f TYPE float8;
         ALTER TABLE {t} ALTER COLUMN j TYPE jsonb;"
    )
}

/// A column added and filled for some rows: the values exist only in the table, never in a
/// change the stream replays if the DDL is older than the copy's snapshot.
fn add_and_fill(t: &str) -> String {
    format!("ALTER TABLE {t} ADD COLUMN c int; UPDATE {t} SET c = 7 WHERE id <= 10;")
}

/// Waits until the output of the current run (since start `n`) satisfies `ready`.
async fn wait_for(
    p: &mut Pipeline,
    n: u32,
    what: &str,
    timeout: Duration,
    ready: impl Fn(&str) -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !ready(&crate::support::start_output(&p.output(), n)) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        p.assert_running();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The row count of `t` in the source, for the messages.
async fn count(client: &Client, t: &str) -> i64 {
    client
        .query_one(&format!("SELECT count(*) FROM {t}"), &[])
        .await
        .unwrap()
        .get(0)
}

/// The copy found `t` changed after its snapshot and copied it again.
fn assert_recopied(out: &str, what: &str) {
    assert!(
        out.contains("changed after the copy's snapshot was taken"),
        "{what}: no table was found changed; the DDL missed the window and the test proves nothing:\n{out}"
    );
}

/// Fresh copy: while the big table's chunks are copied one by one (one worker), the table queued
/// behind it is rewritten. Before: the lake's copy of it was empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_during_the_fresh_copy_of_another_table_loses_nothing() {
    let (env, name) = ground_or_skip!(test_env_and_name("cddl1"));
    let (a, z) = (format!("{name}_a"), format!("{name}_z"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&a, 20_000)).await;
    exec(&client, &create_table(&z, 1_000)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&a, &z], &Settings::default());
    tune(&p, 5_000, 1);
    p.env_vars
        .push(("CDCD_PAUSEPOINT".into(), "copy-chunk-copied:1500".into()));
    p.start();
    wait_for(
        &mut p,
        1,
        "the first chunk of a",
        Duration::from_secs(120),
        |o| o.contains("pause point"),
    )
    .await;
    exec(&client, &rewrite(&z)).await;
    wait_for(&mut p, 1, "the copy", Duration::from_secs(240), |o| {
        o.contains("initial copy finished") && o.contains("replication started")
    })
    .await;
    exec(&client, &format!("UPDATE {z} SET s = 'after' WHERE id = 5")).await;
    assert_eq!(count(&client, &z).await, 1_000);
    p.assert_equal(&a, 240).await;
    p.assert_equal(&z, 240).await;
    assert_recopied(&p.output(), "rewrite during the copy");
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}

/// Fresh copy: between the plan and the copy, one table gains a filled column and another is
/// rewritten. Before: the plan was read before the snapshot, so the column's values were copied
/// as NULL (the UPDATE was in the snapshot, not in the stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_between_the_fresh_copys_plan_and_its_rows_loses_nothing() {
    let (env, name) = ground_or_skip!(test_env_and_name("cddl2"));
    let (x, z) = (format!("{name}_x"), format!("{name}_z"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&x, 1_000)).await;
    exec(&client, &create_table(&z, 1_000)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&x, &z], &Settings::default());
    p.env_vars
        .push(("CDCD_PAUSEPOINT".into(), "copy-planned:3000".into()));
    p.start();
    wait_for(&mut p, 1, "the plan", Duration::from_secs(120), |o| {
        o.contains("pause point")
    })
    .await;
    exec(&client, &add_and_fill(&x)).await;
    exec(&client, &rewrite(&z)).await;
    wait_for(&mut p, 1, "the copy", Duration::from_secs(240), |o| {
        o.contains("replication started")
    })
    .await;
    p.assert_equal(&x, 240).await;
    p.assert_equal(&z, 240).await;
    assert_recopied(&p.output(), "DDL after the plan");
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}

/// A keyed and a keyless table join a running pipeline (copied at a new snapshot beside the
/// slot, and exactly at a temporary slot's); both change shape between their plan and their rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_during_the_copy_of_added_tables_loses_nothing() {
    let (env, name) = ground_or_skip!(test_env_and_name("cddl3"));
    let (a, b, k) = (
        format!("{name}_a"),
        format!("{name}_b"),
        format!("{name}_k"),
    );
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&a, 1_000)).await;
    exec(&client, &create_table(&b, 2_000)).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {k};
             CREATE TABLE {k} (v int4, f float4, s text);
             ALTER TABLE {k} REPLICA IDENTITY FULL;
             INSERT INTO {k} SELECT g % 100, g / 4.0, 'row ' || g FROM generate_series(1, 1000) g;"
        ),
    )
    .await;
    let mut p = Pipeline::new(&env, &name, &[&a], &Settings::default());
    p.on_cleanup(format!("DROP TABLE IF EXISTS {a}, {b}, {k}"));
    p.start();
    p.assert_equal(&a, 120).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));

    for t in [&b, &k] {
        exec(
            &client,
            &format!("ALTER PUBLICATION {} ADD TABLE {t}", p.publication),
        )
        .await;
        p.tables.push(format!("public.{t}"));
    }
    p.write_config(&Settings::default());
    p.env_vars
        .push(("CDCD_PAUSEPOINT".into(), "copy-planned:3000".into()));
    p.start();
    // The keyless table is copied first (exactly), then the keyed one at a new snapshot.
    wait_for(
        &mut p,
        2,
        "the keyless table's plan",
        Duration::from_secs(120),
        |o| o.contains("pause point"),
    )
    .await;
    exec(
        &client,
        &format!(
            "ALTER TABLE {k} ALTER COLUMN v TYPE bigint; ALTER TABLE {k} ADD COLUMN c int; UPDATE {k} SET c = 7 WHERE v < 10;"
        ),
    )
    .await;
    wait_for(
        &mut p,
        2,
        "the keyed table's plan",
        Duration::from_secs(120),
        |o| o.matches("pause point").count() >= 3,
    )
    .await;
    exec(&client, &add_and_fill(&b)).await;
    exec(&client, &rewrite(&b)).await;
    wait_for(&mut p, 2, "the copies", Duration::from_secs(240), |o| {
        o.contains("replication started")
    })
    .await;
    p.assert_equal(&a, 240).await;
    p.assert_equal(&b, 240).await;
    p.assert_equal(&k, 240).await;
    let out = crate::support::start_output(&p.output(), 2);
    assert_recopied(&out, "DDL during the added tables' copies");
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}

/// A resync's copy job waits for the temporary slot of a killed predecessor to go; DDL lands
/// meanwhile. Before: the job planned the table before that wait, so the column added and
/// filled during it was copied as NULL and the swap replaced the live table with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_while_a_resync_waits_for_a_lingering_slot_loses_nothing() {
    let (env, name) = ground_or_skip!(test_env_and_name("cddl4"));
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&a, 1_000)).await;
    exec(&client, &create_table(&b, 2_000)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&a, &b], &Settings::default());
    p.start();
    p.assert_equal(&a, 120).await;
    p.assert_equal(&b, 120).await;

    // The predecessor's temporary slot, held by a session that ends when this test says.
    let holder = connect(&env.pg_url).await;
    let lingering = format!("{}_resync", p.slot);
    exec(
        &holder,
        &format!("SELECT pg_create_logical_replication_slot('{lingering}', 'pgoutput', true)"),
    )
    .await;
    let (ok, out) = run_cdcd(&["resync", "--table", &format!("public.{b}")], &p.config);
    assert!(ok, "cdcd resync failed:\n{out}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    exec(&client, &add_and_fill(&b)).await;
    exec(&client, &rewrite(&b)).await;
    exec(
        &client,
        &format!("UPDATE {a} SET s = 'during' WHERE id <= 5"),
    )
    .await;
    drop(holder);
    wait_for(&mut p, 1, "the resync", Duration::from_secs(240), |o| {
        o.contains("resync finished")
    })
    .await;
    exec(&client, &format!("UPDATE {b} SET s = 'after' WHERE id = 3")).await;
    p.assert_equal(&a, 240).await;
    p.assert_equal(&b, 240).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}
