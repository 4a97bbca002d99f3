//! Issue 22: the LSM (Apache Paimon) sink on S3 (moto), from Postgres: the initial copy, then
//! inserts, updates, deletes and key changes in many small commits, so the background compactor
//! publishes `COMPACT` snapshots and expiry drops old ones, all on the object store; pypaimon reads
//! the table from S3 equal to the source while cdcd streams and after it stopped, and
//! `cdcd cleanup` finds no orphan in the healthy warehouse. (MariaDB into LSM on S3:
//! `tests/mysql/lsm.rs`; crashes and faults: `crash.rs`, `faults.rs`.)

use std::time::Duration;

use crate::support::s3::{moto_test_env, S3Pipeline, SinkKind};
use crate::support::{exec, fresh_table};
use object_store::path::Path;
use object_store::ObjectStoreExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_lsm_warehouse_reads_back_equal() {
    let (env, endpoint, n) = ground_or_skip!(moto_test_env(false, "s3lsm"));
    let client = fresh_table(&env, &n, |n| {
        format!(
            "CREATE TABLE {n} (id int8 PRIMARY KEY, name text, qty numeric(10,2), at timestamptz,
                               ok bool, raw bytea, doc jsonb);
             ALTER TABLE {n} ALTER COLUMN name SET STORAGE EXTERNAL;
             INSERT INTO {n} SELECT g, 'n' || g, g / 3.0, timestamptz '2024-01-01 00:00+00' + g * interval '1 s',
                                    g % 2 = 0, decode(md5(g::text), 'hex'), jsonb_build_object('g', g)
             FROM generate_series(1, 3000) g;
             UPDATE {n} SET name = repeat(md5(id::text), 100) WHERE id % 500 = 0;"
        )
    })
    .await;
    let mut s = S3Pipeline::with_sink(&env, &n, &[&n], &endpoint, SinkKind::Lsm);
    s.p.start();
    s.p.wait_slot_active(&client, Duration::from_secs(60)).await;
    s.assert_equal(&n, 120, "pypaimon").await;
    exec(
        &client,
        &format!(
            "UPDATE {n} SET qty = qty + 1 WHERE id % 7 = 0;
             UPDATE {n} SET qty = NULL, doc = NULL WHERE id % 500 = 0;
             DELETE FROM {n} WHERE id % 11 = 0;
             UPDATE {n} SET id = id + 100000 WHERE id % 13 = 0 AND id < 200;
             INSERT INTO {n} SELECT g, 'late' || g, 1, now(), true, NULL, NULL FROM generate_series(3001, 3500) g;"
        ),
    )
    .await;
    // Many small commits: level-0 runs pile up (compaction_trigger = 3), the compactor merges
    // them, and after more than 10 snapshots expiry deletes the oldest.
    for i in 0..30 {
        exec(
            &client,
            &format!("UPDATE {n} SET qty = coalesce(qty, 0) + 1 WHERE id % 30 = {i}"),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    s.assert_equal(&n, 120, "pypaimon").await;
    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}\n{}", s.p.output());
    s.assert_equal(&n, 5, "pypaimon").await;

    // Read the snapshots on S3: compactions and expiry ran there, and the hints are in place.
    let wh = s.warehouse();
    let listed = s.list(&n, "snapshot").await;
    let ids: Vec<i64> = listed
        .iter()
        .filter_map(|p| p.rsplit_once("/snapshot-")?.1.parse().ok())
        .collect();
    let mut kinds = Vec::new();
    for p in listed.iter().filter(|p| p.contains("/snapshot-")) {
        let body = wh.store().get(&Path::from(p.as_str())).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body.bytes().await.unwrap()).unwrap();
        kinds.push(v["commitKind"].as_str().unwrap_or("").to_owned());
    }
    assert!(
        kinds.iter().any(|k| k == "COMPACT"),
        "no COMPACT snapshot among {kinds:?}"
    );
    let newest = ids.iter().max().copied().unwrap_or(0);
    let oldest = ids.iter().min().copied().unwrap_or(0);
    assert!(oldest > 1, "expiry removed no snapshot: {ids:?}");
    let hint = |name: &str| {
        let path = Path::from(format!(
            "{}/snapshot/{name}",
            wh.path(&s.table_url(&n)).unwrap()
        ));
        let wh = wh.clone();
        async move {
            let got = wh.store().get(&path).await.unwrap().bytes().await.unwrap();
            String::from_utf8_lossy(&got).trim().parse::<i64>().unwrap()
        }
    };
    assert_eq!(hint("LATEST").await, newest, "{ids:?}");
    assert_eq!(hint("EARLIEST").await, oldest, "{ids:?}");
    s.assert_no_missing_files(&n).await;

    let (code, out) = s.cleanup(&["--grace-secs", "0"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(" 0 orphans"), "{out}");
    s.assert_equal(&n, 5, "pypaimon").await;
}

/// `cdcd resync` of a Paimon table on S3 (moto): the lineage is written beside the live table
/// on the object store, its files reach the live table's buckets by server-side copy, and one
/// `OVERWRITE` snapshot swaps them in; pypaimon reads the repaired table from S3 equal to the
/// source, every file a snapshot names exists, and `cdcd cleanup` then removes the replaced
/// files without touching a live one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_lsm_resync_swaps_on_the_object_store() {
    let (env, endpoint, n) = ground_or_skip!(moto_test_env(false, "s3lsmrs"));
    let client = fresh_table(&env, &n, |n| {
        format!(
            "CREATE TABLE {n} (id int8 PRIMARY KEY, v int4, n numeric(12,2), t text);
             INSERT INTO {n} SELECT g, g % 1000, g / 7.0, 'row ' || g FROM generate_series(1, 5000) g;"
        )
    })
    .await;
    let mut s = S3Pipeline::with_sink(&env, &n, &[&n], &endpoint, SinkKind::Lsm);
    s.p.start();
    s.assert_equal(&n, 120, "pypaimon").await;
    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}\n{}", s.p.output());
    crate::postgres::resync::damage(&client, &s.p, &n).await;
    s.p.start();
    exec(
        &client,
        &format!("UPDATE {n} SET v = v + 1 WHERE id % 3 = 0"),
    )
    .await;
    let (ok, out) =
        crate::support::run_cdcd(&["resync", "--table", &format!("public.{n}")], &s.p.config);
    assert!(ok && out.contains("requested"), "{out}");
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    while !crate::support::start_output(&s.p.output(), 2).contains("resync finished") {
        assert!(
            std::time::Instant::now() < deadline,
            "the resync did not finish"
        );
        s.p.assert_running();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    exec(&client, &format!("DELETE FROM {n} WHERE id % 17 = 0")).await;
    s.assert_equal(&n, 120, "pypaimon").await;
    let wh = s.warehouse();
    let mut kinds = Vec::new();
    for p in s
        .list(&n, "snapshot")
        .await
        .iter()
        .filter(|p| p.contains("/snapshot-"))
    {
        let body = wh.store().get(&Path::from(p.as_str())).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body.bytes().await.unwrap()).unwrap();
        if v["properties"]["cdcd.resync-id"].is_string() {
            kinds.push(v["commitKind"].as_str().unwrap_or("").to_owned());
        }
    }
    assert!(
        kinds.iter().any(|k| k == "OVERWRITE"),
        "no swap snapshot among {kinds:?}"
    );
    s.assert_no_missing_files(&n).await;
    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}\n{}", s.p.output());
    let (code, out) = s.cleanup(&["--grace-secs", "0"]);
    assert_eq!(code, Some(0), "{out}");
    s.assert_no_missing_files(&n).await;
    s.assert_equal(&n, 5, "pypaimon").await;
}
