//! Crashes on S3 (serial moto), for both sinks: cdcd aborts (like `kill -9`, via the named crash
//! points in `failpoints.rs`) in the middle of a multipart upload, just before a commit's
//! create-if-absent put (Iceberg `v<N>.metadata.json`, Paimon `snapshot-N`) and just after it, and
//! is then killed with SIGKILL while streaming. Each time it is restarted (the lease of the dead
//! daemon expires after `lease_ttl_ms`). At the end: the table equals the source (DuckDB; Paimon:
//! pypaimon), no snapshot references a missing file, `cdcd cleanup` deletes the orphans the
//! crashes left, and the table still reads back equal afterwards.
//!
//! The crash points are set in the environment of each daemon the test starts, never the test
//! process's own.

use std::time::Duration;

use crate::support::s3::{moto, S3Pipeline, SinkKind};
use crate::support::{exec, fresh_table, test_env, unique};

/// Starts cdcd with `failpoint` and waits until it aborts there.
async fn crash_at(s: &mut S3Pipeline, failpoint: &str, client: &tokio_postgres::Client, n: &str) {
    // The daemon's own environment: tests share this process, so set_var would arm other tests.
    s.p.env_vars
        .push(("CDCD_FAILPOINT".into(), failpoint.into()));
    s.p.start();
    s.p.env_vars.retain(|(k, _)| k != "CDCD_FAILPOINT");
    for round in 0..60 {
        let base = 100_000 + round * 10;
        exec(
            client,
            &format!("INSERT INTO {n} SELECT g, g, md5(g::text) FROM generate_series({base} + 0, {base} + 9) g ON CONFLICT DO NOTHING"),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if s.p.output().contains(&format!(
            "failpoint {}",
            failpoint.split(':').next().unwrap_or("")
        )) {
            // Give the abort a moment, then reap.
            tokio::time::sleep(Duration::from_millis(300)).await;
            s.p.kill9();
            return;
        }
    }
    panic!(
        "cdcd never reached failpoint {failpoint}:\n{}",
        s.p.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_recovers_from_crashes_and_cleans_orphans() {
    crashes(
        "s3_recovers_from_crashes_and_cleans_orphans",
        SinkKind::Iceberg,
    )
    .await;
}

/// Issue 22: the same crashes with the LSM (Paimon) sink on S3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_lsm_recovers_from_crashes_and_cleans_orphans() {
    crashes(
        "s3_lsm_recovers_from_crashes_and_cleans_orphans",
        SinkKind::Lsm,
    )
    .await;
}

async fn crashes(test: &str, sink: SinkKind) {
    let env = ground_or_skip!(test_env(test));
    let endpoint = ground_or_skip!(moto(test, true));
    // The 3rd commit point (Iceberg: table creation is the 1st metadata create).
    let (before, after) = match sink {
        SinkKind::Iceberg => ("commit-before-create:3", "commit-after-create:3"),
        SinkKind::Lsm => (
            "lsm-commit-before-snapshot:3",
            "lsm-commit-after-snapshot:3",
        ),
    };
    let n = unique(match sink {
        SinkKind::Iceberg => "s3crash",
        SinkKind::Lsm => "s3crashl",
    });
    let client = fresh_table(&env, &n, |n| {
        format!(
            "CREATE TABLE {n} (id int8 PRIMARY KEY, v int4, t text);
             INSERT INTO {n} SELECT g, g, md5(g::text) FROM generate_series(1, 5000) g;"
        )
    })
    .await;
    let mut s = S3Pipeline::with_sink(&env, &n, &[&n], &endpoint, sink);
    // A short lease so each restart takes over from the dead daemon quickly, but not so short
    // that a loaded 2-core machine starves the renewal (2000 ms lost it at load 17).
    s.extra_pipeline = "lease_ttl_ms = 4000\n".into();
    s.write_config(&crate::support::Settings::default(), &endpoint);
    // Every plain put goes multipart: the first data file's upload is interrupted.
    s.p.env_vars
        .push(("CDCD_MULTIPART_THRESHOLD".into(), "1".into()));
    crash_at(&mut s, "multipart-after-first-part", &client, &n).await;
    s.p.env_vars
        .retain(|(k, _)| k != "CDCD_MULTIPART_THRESHOLD");
    // Data files and manifests are written, the commit is not.
    crash_at(&mut s, before, &client, &n).await;
    // The commit landed; the version hint (Paimon: `LATEST`) was not updated.
    crash_at(&mut s, after, &client, &n).await;

    s.p.start();
    tokio::time::sleep(Duration::from_secs(3)).await;
    exec(
        &client,
        &format!("UPDATE {n} SET v = v + 1 WHERE id % 3 = 0; DELETE FROM {n} WHERE id % 17 = 0;"),
    )
    .await;
    s.assert_equal(&n, 120, "duckdb").await;
    // And a plain SIGKILL while streaming.
    exec(
        &client,
        &format!("UPDATE {n} SET t = 'k' || id WHERE id % 5 = 0"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.p.kill9();
    s.p.start();
    s.assert_equal(&n, 120, "duckdb").await;
    let st = s.p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}\n{}", s.p.output());

    s.assert_no_missing_files(&n).await;
    let (code, out) = s.cleanup(&["--grace-secs", "0", "--dry-run"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("would delete s3://"),
        "the crash before a commit left no orphans?\n{out}"
    );
    let (code, out) = s.cleanup(&["--grace-secs", "0"]);
    assert_eq!(code, Some(0), "{out}");
    eprintln!("{out}");
    let (_, again) = s.cleanup(&["--grace-secs", "0", "--dry-run"]);
    assert!(again.contains(" 0 orphans"), "{again}");
    s.assert_no_missing_files(&n).await;
    s.assert_equal(&n, 5, "duckdb").await;
}
