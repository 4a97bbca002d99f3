//! End to end, tables without a primary key that still have a key (issue 23): one keyed by its
//! `REPLICA IDENTITY USING INDEX` index, one by `source.key_columns` with REPLICA IDENTITY FULL.
//! Both are copied, then receive updates that change the key, updates that leave it, deletes, and a
//! delete + reinsert of one key in one transaction; the lake must equal the source as read by
//! DuckDB (Iceberg, both delete modes through `CDCD_TEST_DELETE_MODE`), pyiceberg (deletion
//! vectors; it reads no equality deletes) and pypaimon (Paimon).
//! A kill -9 with key changes in flight and more made while cdcd is down resumes exactly.
//! `cdcd check` and `cdcd status --json` must show each key and where it came from, and an
//! override on a table without FULL must be refused with the ALTER TABLE to run.

use std::time::Duration;

use crate::support::{
    connect, exec, run_cdcd, status_row, test_env, unique, Pipeline, Settings, TestEnv,
};

/// The two tables, with rows for the initial copy.
fn create(ix: &str, ov: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {ix}, {ov};
         CREATE TABLE {ix} (v text, u int4 NOT NULL, w text NOT NULL, n int8);
         CREATE UNIQUE INDEX {ix}_uq ON {ix} (w, u);
         ALTER TABLE {ix} REPLICA IDENTITY USING INDEX {ix}_uq;
         CREATE TABLE {ov} (tenant int4 NOT NULL, event int8 NOT NULL, note text, big text);
         ALTER TABLE {ov} REPLICA IDENTITY FULL;
         ALTER TABLE {ov} ALTER COLUMN big SET STORAGE EXTERNAL;
         INSERT INTO {ix} SELECT 'v' || g, g, 'w' || (g % 7), g * 10 FROM generate_series(1, 3000) g;
         INSERT INTO {ov} SELECT g % 5, g, CASE WHEN g % 3 = 0 THEN NULL ELSE 'n' || g END, NULL
           FROM generate_series(1, 3000) g;"
    )
}

/// Every kind of change, keys changing included.
fn change(ix: &str, ov: &str) -> String {
    format!(
        "UPDATE {ix} SET v = 'changed' WHERE u % 10 = 0;
         UPDATE {ix} SET u = u + 100000 WHERE u % 13 = 0;
         UPDATE {ix} SET w = 'moved', n = NULL WHERE u % 17 = 0;
         DELETE FROM {ix} WHERE u % 19 = 0;
         INSERT INTO {ix} SELECT 'new', g, 'w' || g, NULL FROM generate_series(5001, 5100) g;
         BEGIN;
           DELETE FROM {ix} WHERE u = 5001;
           INSERT INTO {ix} VALUES ('again', 5001, 'w5001', 1);
           UPDATE {ix} SET u = 5002, w = 'w5002x' WHERE u = 5002;
         COMMIT;
         UPDATE {ov} SET note = 'changed' WHERE event % 10 = 0;
         UPDATE {ov} SET event = event + 100000 WHERE event % 13 = 0;
         UPDATE {ov} SET tenant = 99 WHERE event % 17 = 0;
         DELETE FROM {ov} WHERE event % 19 = 0;
         -- a TOASTed value: FULL's old row carries it whole, the new row may leave it unchanged
         UPDATE {ov} SET big = (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 300) i)
           WHERE event = 1;
         UPDATE {ov} SET note = 'after toast' WHERE event = 1;
         UPDATE {ov} SET event = 7000001 WHERE event = 1;
         BEGIN;
           DELETE FROM {ov} WHERE event = 2;
           INSERT INTO {ov} VALUES (2, 2, 'reinserted', NULL);
         COMMIT;"
    )
}

async fn keys_replicate(env: TestEnv, lsm: bool) {
    let name = unique(if lsm { "keysl" } else { "keysi" });
    let (ix, ov) = (format!("{name}_ix"), format!("{name}_ov"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create(&ix, &ov)).await;
    let settings = Settings {
        // Small chunks: the copy splits the index key and the user's key into ranges too.
        source_extra: format!(
            "key_columns = {{ \"public.{ov}\" = [\"tenant\", \"event\"] }}\nsnapshot_chunk_rows = 500"
        ),
        ..Settings::default()
    };
    let mut p = if lsm {
        Pipeline::new_lsm(&env, &name, &[&ix, &ov], &settings, 2)
    } else {
        Pipeline::new(&env, &name, &[&ix, &ov], &settings)
    };
    p.on_cleanup(format!("DROP TABLE IF EXISTS {ix}, {ov}"));

    let (ok, out) = run_cdcd(&["check"], &p.config);
    assert!(ok, "cdcd check:\n{out}");
    for line in [
        format!("table public.{ix}: key (w, u) from replica identity index {ix}_uq"),
        format!("table public.{ov}: key (tenant, event) from source.key_columns"),
    ] {
        assert!(out.contains(&line), "cdcd check lacks {line:?}:\n{out}");
    }

    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(&client, &change(&ix, &ov)).await;
    p.assert_equal(&ix, 120).await;
    p.assert_equal(&ov, 120).await;
    // The user's key, not the whole row, is what identifies rows in the lake too.
    let (code, out) = p.lakecheck(&ov, 30, &["--key", "tenant,event"]).await;
    assert_eq!(code, Some(0), "lakecheck --key tenant,event:\n{out}");
    // pyiceberg refuses equality deletes (the suite's `CDCD_TEST_DELETE_MODE=equality` pass).
    let equality = std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality");
    if !lsm && !equality {
        for t in [&ix, &ov] {
            let (code, out) = p.lakecheck(t, 30, &["--reader", "pyiceberg"]).await;
            assert_eq!(code, Some(0), "lakecheck --reader pyiceberg {t}:\n{out}");
        }
    }

    // kill -9 with key changes in flight, more while it is down: the restart resumes exactly.
    exec(
        &client,
        &format!(
            "UPDATE {ix} SET u = u + 200000 WHERE u % 23 = 0;
             UPDATE {ov} SET event = event + 200000 WHERE event % 23 = 0;"
        ),
    )
    .await;
    p.kill9();
    exec(
        &client,
        &format!(
            "UPDATE {ix} SET w = 'down' WHERE u % 29 = 0;
             DELETE FROM {ov} WHERE event % 29 = 0;
             UPDATE {ov} SET tenant = tenant + 10 WHERE event % 31 = 0;"
        ),
    )
    .await;
    p.start();
    p.assert_equal(&ix, 120).await;
    p.assert_equal(&ov, 120).await;

    let (ok, out) = run_cdcd(&["status", "--json"], &p.config);
    assert!(ok, "cdcd status --json:\n{out}");
    let row = |t: &str| status_row(&out, t);
    assert_eq!(row(&ix)["key"], serde_json::json!(["w", "u"]));
    assert_eq!(row(&ix)["key_origin"], "replica_identity_index");
    assert_eq!(row(&ix)["key_index"], format!("{ix}_uq"));
    assert_eq!(row(&ov)["key"], serde_json::json!(["tenant", "event"]));
    assert_eq!(row(&ov)["key_origin"], "key_columns");
    p.assert_running();

    // Without FULL the override's rows cannot be found in updates and deletes (and Postgres
    // would refuse them): check names the statement, and a restart refuses to run.
    p.sigterm_and_wait(Duration::from_secs(60)).await;
    exec(
        &client,
        &format!("ALTER TABLE {ov} REPLICA IDENTITY DEFAULT"),
    )
    .await;
    let (ok, out) = run_cdcd(&["check"], &p.config);
    assert!(
        !ok,
        "check passed an override without REPLICA IDENTITY FULL:\n{out}"
    );
    assert!(
        out.contains(&format!(
            "run ALTER TABLE \"public\".\"{ov}\" REPLICA IDENTITY FULL"
        )),
        "{out}"
    );
    p.start();
    p.assert_stops(
        Duration::from_secs(60),
        "cdcd ran with an unusable key_columns entry",
    )
    .await;
    assert!(
        p.output().contains("REPLICA IDENTITY FULL"),
        "{}",
        p.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_index_and_key_columns_keys_iceberg() {
    let env = ground_or_skip!(test_env("identity_index_and_key_columns_keys_iceberg"));
    keys_replicate(env, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_index_and_key_columns_keys_lsm() {
    let env = ground_or_skip!(test_env("identity_index_and_key_columns_keys_lsm"));
    keys_replicate(env, true).await;
}
