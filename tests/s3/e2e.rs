//! End to end on S3 (moto): cdcd replicates into `s3://<bucket>/wh`, and DuckDB (httpfs + iceberg)
//! and pyiceberg read the tables back equal to the source. Also: the lease object exists while cdcd
//! runs, a second cdcd with `standby = false` refuses with a clear message, and `cdcd cleanup` finds
//! nothing to delete in a healthy warehouse.

use std::time::Duration;

use crate::support::s3::{moto_test_env, S3Pipeline};
use crate::support::{exec, fresh_table};
use object_store::ObjectStoreExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_warehouse_reads_back_equal() {
    let (env, endpoint, n) = ground_or_skip!(moto_test_env(false, "s3e2e"));
    let client = fresh_table(&env, &n, |n| {
        format!(
            "CREATE TABLE {n} (id int8 PRIMARY KEY, name text, qty numeric(10,2), at timestamptz);
             INSERT INTO {n} SELECT g, 'n' || g, g / 3.0, now() FROM generate_series(1, 3000) g;"
        )
    })
    .await;
    let mut s = S3Pipeline::new(&env, &n, &[&n], &endpoint);
    // Deletion vectors: pyiceberg refuses equality deletes, and both readers must read this table.
    let cfg = std::fs::read_to_string(&s.p.config).unwrap();
    let cfg = cfg.replace(
        "delete_mode = \"equality\"",
        "delete_mode = \"deletion-vectors\"",
    );
    std::fs::write(&s.p.config, cfg).unwrap();
    s.p.start();
    s.p.wait_slot_active(&client, Duration::from_secs(60)).await;
    exec(
        &client,
        &format!(
            "UPDATE {n} SET qty = qty + 1 WHERE id % 7 = 0;
             DELETE FROM {n} WHERE id % 11 = 0;
             INSERT INTO {n} SELECT g, 'late' || g, 1, now() FROM generate_series(3001, 3500) g;"
        ),
    )
    .await;
    s.assert_equal(&n, 90, "duckdb").await;

    // The lease is under <warehouse>/_cdcd/<pipeline>/ while cdcd runs.
    let wh = s.warehouse();
    let lease = wh.path(&wh.location(&["_cdcd", &n, "lease.json"])).unwrap();
    let body = wh.store().get(&lease).await.unwrap().bytes().await.unwrap();
    let text = String::from_utf8_lossy(&body).to_string();
    assert!(
        text.contains("\"holder\"") && text.contains("\"released\":false"),
        "{text}"
    );

    // A second daemon on the same pipeline that may not wait refuses, naming the holder.
    let mut second_cfg = std::fs::read_to_string(&s.p.config).unwrap();
    second_cfg = second_cfg.replacen("[pipeline]\n", "[pipeline]\nstandby = false\n", 1);
    let second_path = s.p.config.with_file_name("second.toml");
    std::fs::write(&second_path, second_cfg).unwrap();
    let out = std::process::Command::new(crate::support::cdcd_bin())
        .arg("--config")
        .arg(&second_path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "second cdcd ran: {err}");
    assert!(
        err.contains("already running") && err.contains("lease"),
        "{err}"
    );
    assert!(!err.contains("secret_access_key = "), "{err}");

    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}\n{}", s.p.output());
    s.assert_equal(&n, 5, "pyiceberg").await;
    s.assert_equal(&n, 5, "duckdb").await;
    let body = wh.store().get(&lease).await.unwrap().bytes().await.unwrap();
    assert!(String::from_utf8_lossy(&body).contains("\"released\":true"));

    let (code, out) = s.cleanup(&["--grace-secs", "0"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(" 0 orphans"), "{out}");
}

/// On S3: a commit's deletion vectors, each in its own Puffin file, and later commits replacing
/// some of them while the others stay live (`postgres/puffin_layout.rs`); DuckDB (httpfs,
/// through its external file cache) and pyiceberg read every state right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_replaced_vectors_are_read_right() {
    let (env, endpoint, n) = ground_or_skip!(moto_test_env(false, "s3puffin"));
    if std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality") {
        return; // deletion vectors only
    }
    let client = fresh_table(&env, &n, crate::postgres::puffin_layout::create).await;
    let mut s = S3Pipeline::new(&env, &n, &[&n], &endpoint);
    s.p.start();
    s.assert_equal(&n, 120, "duckdb").await;
    for sql in crate::postgres::puffin_layout::changes(&n) {
        exec(&client, &sql).await;
        s.assert_equal(&n, 60, "duckdb").await;
        s.assert_equal(&n, 5, "pyiceberg").await;
    }
    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}\n{}", s.p.output());
}
