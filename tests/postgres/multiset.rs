//! End to end, keyless Postgres tables under `REPLICA IDENTITY FULL` as multisets (issue 23):
//! every UPDATE and DELETE carries the whole old row, and cdcd applies it to exactly one replica
//! row equal to it (a deletion vector, or a v2 position delete with `CDCD_TEST_DELETE_MODE =
//! equality`; never an equality delete, which would remove every duplicate). Duplicates stay
//! duplicates. The lake must equal the source as a multiset (lakecheck compares whole rows when
//! there is no key), read by DuckDB and pyiceberg, through single-duplicate updates and deletes
//! (`WHERE ctid = …`), updates of every duplicate at once, NULLs, an unchanged TOASTed column,
//! a transaction mixing it with a keyed table, and a kill -9 while both are written. On the lsm
//! sink such a table is refused at start (Paimon cannot apply a delete of one of several equal
//! rows).

use std::time::Duration;

use crate::support::table_files::{assert_no_equality_deletes, assert_no_identifier_fields};
use crate::support::{
    connect, exec, fresh_table, run_cdcd, test_env, test_env_and_name, unique, Pipeline, Settings,
};

/// One single-duplicate update, one single-duplicate delete, one insert of a duplicate, and a
/// keyed row written beside them, in one transaction (round `i`).
fn round(m: &str, k: &str, i: u32) -> String {
    let g = i % 4;
    format!(
        "BEGIN;
         UPDATE {m} SET note = 'r{i}' WHERE ctid = (SELECT ctid FROM {m} WHERE g = {g} LIMIT 1);
         DELETE FROM {m} WHERE ctid = (SELECT ctid FROM {m} WHERE g = {} LIMIT 1);
         INSERT INTO {m} (g, note) VALUES ({g}, 'a'), ({g}, 'a');
         INSERT INTO {k} VALUES ({}, 'r{i}') ON CONFLICT (id) DO UPDATE SET v = excluded.v;
         COMMIT;",
        (g + 1) % 4,
        1000 + i % 50
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_identity_full_keyless_table_is_a_multiset() {
    let (env, name) = ground_or_skip!(test_env_and_name("multiset"));
    let (m, k) = (format!("{name}_m"), format!("{name}_k"));
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {m}, {k};
             CREATE TABLE {m} (g int4, note text, big text);
             ALTER TABLE {m} REPLICA IDENTITY FULL;
             ALTER TABLE {m} ALTER COLUMN big SET STORAGE EXTERNAL;
             CREATE TABLE {k} (id int4 PRIMARY KEY, v text);
             INSERT INTO {m} (g, note) VALUES (1, 'a'), (1, 'a'), (1, 'a'), (2, 'b'), (2, 'b'),
                 (3, NULL), (3, NULL), (0, 'a');
             INSERT INTO {m} (g, note, big) VALUES (9, 'toast', repeat('t', 20000));
             INSERT INTO {k} SELECT g, 'k' FROM generate_series(1, 20) g;"
        ),
    )
    .await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&m, &k], &Settings::default());

    let (ok, out) = run_cdcd(&["check"], &p.config);
    assert!(ok, "cdcd check:\n{out}");
    let line = format!("table public.{m}: no key: full row identity (multiset)");
    assert!(out.contains(&line), "cdcd check lacks {line:?}:\n{out}");

    p.start();
    p.assert_equal(&m, 180).await;
    let (ok, out) = run_cdcd(&["status", "--json"], &p.config);
    assert!(ok, "cdcd status:\n{out}");
    assert!(out.contains("\"key_origin\": \"full_row\""), "{out}");

    // Single duplicates, by ctid.
    exec(
        &client,
        &format!(
            "UPDATE {m} SET note = 'c' WHERE ctid = (SELECT ctid FROM {m} WHERE g = 1 LIMIT 1);
             DELETE FROM {m} WHERE ctid = (SELECT ctid FROM {m} WHERE g = 2 LIMIT 1);"
        ),
    )
    .await;
    p.assert_equal(&m, 120).await;
    // Every duplicate at once (NULLs included), an update back to an existing duplicate, and
    // an update leaving the TOASTed column unchanged (sent as 'u' in the new row).
    exec(
        &client,
        &format!(
            "UPDATE {m} SET note = 'z' WHERE g = 3;
             UPDATE {m} SET note = 'a' WHERE note = 'c';
             UPDATE {m} SET g = 10 WHERE note = 'toast';"
        ),
    )
    .await;
    p.assert_equal(&m, 120).await;
    // A transaction mixing it with the keyed table; a row inserted and deleted in it.
    exec(
        &client,
        &format!(
            "BEGIN;
             DELETE FROM {m} WHERE ctid = (SELECT ctid FROM {m} WHERE g = 1 LIMIT 1);
             UPDATE {k} SET v = 'tx' WHERE id <= 5;
             INSERT INTO {m} (g, note) VALUES (4, 'd'), (4, 'd');
             DELETE FROM {m} WHERE ctid = (SELECT ctid FROM {m} WHERE g = 4 LIMIT 1);
             DELETE FROM {k} WHERE id = 6;
             UPDATE {m} SET note = 'e' WHERE ctid = (SELECT ctid FROM {m} WHERE g = 3 LIMIT 1);
             COMMIT;"
        ),
    )
    .await;
    p.assert_equal(&m, 120).await;
    p.assert_equal(&k, 60).await;
    let equality = std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality");
    // pyiceberg reads no equality deletes; none is written here, but the suite's equality pass
    // reads with DuckDB only, as the other tests do.
    if !equality {
        let (code, out) = p.lakecheck(&m, 60, &["--reader", "pyiceberg"]).await;
        assert_eq!(code, Some(0), "pyiceberg {m}:\n{out}");
    }
    assert_no_equality_deletes_or_identifiers(&p, &m);

    // A column added inside a transaction between deletes: the rows before it are evolved with
    // the new column NULL, as the older files read, so the deletes still find their copies.
    exec(
        &client,
        &format!(
            "BEGIN;
             DELETE FROM {m} WHERE ctid = (SELECT ctid FROM {m} WHERE g = 1 LIMIT 1);
             ALTER TABLE {m} ADD COLUMN extra int4;
             DELETE FROM {m} WHERE ctid = (SELECT ctid FROM {m} WHERE g = 3 LIMIT 1);
             INSERT INTO {m} (g, note, extra) VALUES (1, 'a', 7), (1, 'a', 7);
             COMMIT;
             UPDATE {m} SET extra = 8 WHERE ctid = (SELECT ctid FROM {m} WHERE extra = 7 LIMIT 1);"
        ),
    )
    .await;
    p.assert_equal(&m, 120).await;

    // A column added with a constant default (v3: the field's initial-default): deleting and
    // updating one copy of a row written before it compares the default, which the old image
    // carries, with what the older file reads (the default, not NULL).
    if std::env::var("CDCD_TEST_DELETE_MODE").map_or(true, |m| m != "equality") {
        exec(
            &client,
            &format!(
                "ALTER TABLE {m} ADD COLUMN flag text DEFAULT 'dflt';
                 DELETE FROM {m} WHERE ctid = (SELECT ctid FROM {m} WHERE g = 2 LIMIT 1);
                 UPDATE {m} SET flag = 'set' WHERE ctid = (SELECT ctid FROM {m} WHERE g = 4 LIMIT 1);"
            ),
        )
        .await;
        p.assert_equal(&m, 120).await;
    }

    // kill -9 while both tables are written, more writes while cdcd is down: the restart
    // resumes from the checkpoint in the snapshot, neither losing nor doubling a delete.
    let url = env.pg_url.clone();
    let (mm, kk) = (m.clone(), k.clone());
    let writer = tokio::spawn(async move {
        let c = connect(&url).await;
        for i in 0..60 {
            exec(&c, &round(&mm, &kk, i)).await;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(900)).await;
    p.kill9();
    writer.await.unwrap();
    for i in 60..70 {
        exec(&client, &round(&m, &k, i)).await;
    }
    p.start();
    p.assert_equal(&m, 180).await;
    p.assert_equal(&k, 60).await;
    if !equality {
        let (code, out) = p.lakecheck(&m, 60, &["--reader", "pyiceberg"]).await;
        assert_eq!(code, Some(0), "pyiceberg {m} after kill -9:\n{out}");
    }
    // TRUNCATE, then duplicates again.
    exec(
        &client,
        &format!(
            "TRUNCATE {m}; INSERT INTO {m} (g, note) VALUES (5, 'f'), (5, 'f');
             DELETE FROM {m} WHERE ctid = (SELECT ctid FROM {m} LIMIT 1);"
        ),
    )
    .await;
    p.assert_equal(&m, 120).await;
    assert_no_equality_deletes_or_identifiers(&p, &m);
    p.assert_running();
}

/// The table's metadata declares no identifier fields, and no equality delete file was ever
/// written to it (one would remove every duplicate).
fn assert_no_equality_deletes_or_identifiers(p: &Pipeline, table: &str) {
    assert_no_identifier_fields(&p.table_dir(table));
    assert_no_equality_deletes(&p.table_dir(table));
}

/// The lsm sink cannot store a multiset with row-level deletes: the table is refused by `cdcd
/// check` and at start, naming it and the fix, before anything is replicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_identity_full_keyless_table_is_refused_on_lsm() {
    let env = ground_or_skip!(test_env(
        "replica_identity_full_keyless_table_is_refused_on_lsm"
    ));
    if std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality") {
        return;
    }
    let name = unique("multisetl");
    let m = format!("{name}_m");
    let _client = fresh_table(&env, &m, |m| {
        format!(
            "CREATE TABLE {m} (g int4, note text);
             ALTER TABLE {m} REPLICA IDENTITY FULL;
             INSERT INTO {m} VALUES (1, 'a'), (1, 'a');"
        )
    })
    .await;
    let mut p = Pipeline::new_lsm(&env, &name, &[&m], &Settings::default(), 2);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {m}"));
    let (ok, out) = run_cdcd(&["check"], &p.config);
    assert!(
        !ok && out.contains(&format!("public.{m}")) && out.contains("source.key_columns"),
        "cdcd check passed a multiset on lsm:\n{out}"
    );
    p.start();
    let out = p
        .assert_stops(Duration::from_secs(120), "cdcd accepted a multiset on lsm")
        .await;
    assert!(
        out.contains(&format!("public.{m}"))
            && out.contains("REPLICA IDENTITY FULL")
            && out.contains("source.key_columns"),
        "{out}"
    );
}

/// Updates and deletes of single duplicates while the table is being copied: the copy reads the
/// slot's exported snapshot and the stream starts at its consistent point, so every change made
/// during the copy is streamed after the copied rows and applied to one equal row of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_identity_full_changes_during_the_copy() {
    let (env, name) = ground_or_skip!(test_env_and_name("multisetc"));
    let m = format!("{name}_m");
    let _client = fresh_table(&env, &m, |m| {
        format!(
            "CREATE TABLE {m} (g int8, note text);
             ALTER TABLE {m} REPLICA IDENTITY FULL;
             INSERT INTO {m} SELECT g % 500, repeat('x', 40) FROM generate_series(1, 300000) g;"
        )
    })
    .await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&m], &Settings::default());
    p.start();
    let url = env.pg_url.clone();
    let mm = m.clone();
    let writer = tokio::spawn(async move {
        let c = connect(&url).await;
        for i in 0..40 {
            exec(
                &c,
                &format!(
                    "UPDATE {mm} SET note = 'u{i}' WHERE ctid = (SELECT ctid FROM {mm} WHERE g = {0} LIMIT 1);
                     DELETE FROM {mm} WHERE ctid = (SELECT ctid FROM {mm} WHERE g = {1} LIMIT 1);
                     UPDATE {mm} SET note = 'all{i}' WHERE g = {2};",
                    i % 7,
                    i % 11,
                    100 + i
                ),
            )
            .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    writer.await.unwrap();
    p.assert_equal(&m, 240).await;
    p.assert_running();
    // The cost of locating deleted copies by scanning the table (docs/guarantees.md): shown.
    for line in p.output().lines().filter(|l| l.contains("committed table")) {
        eprintln!("{line}");
    }
}

/// A keyless table replicated insert-only (REPLICA IDENTITY DEFAULT, in the inserts-only
/// publication) whose identity becomes FULL: its updates until then were never published, so the
/// next start refuses to continue it as a multiset, naming the table and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_changed_to_full_while_replicated_is_refused() {
    let (env, name) = ground_or_skip!(test_env_and_name("multiseti"));
    let m = format!("{name}_m");
    let client = fresh_table(&env, &m, |m| {
        format!(
            "CREATE TABLE {m} (g int4, note text);
             INSERT INTO {m} VALUES (1, 'a'), (1, 'a');"
        )
    })
    .await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&m], &Settings::default());
    p.start();
    p.assert_equal(&m, 120).await;
    p.sigterm_and_wait(Duration::from_secs(60)).await;
    exec(
        &client,
        &format!("ALTER TABLE {m} REPLICA IDENTITY FULL; UPDATE {m} SET note = 'b'"),
    )
    .await;
    p.start();
    let out = p
        .assert_stops(
            Duration::from_secs(120),
            "cdcd continued a table that missed updates",
        )
        .await;
    assert!(
        out.contains(&format!("public.{m}")) && out.contains("was replicated insert-only"),
        "{out}"
    );
}
