//! End to end, an online `cdcd resync` of a partitioned table (issues 20 and 36). The lineage is
//! a table of its own until the swap carries its manifests into the live table; each manifest
//! names its partition spec by id (manifest list `partition_spec_id`, manifest header
//! `partition-spec-id`), so the live table must hold the lineage's spec under that id, or readers
//! take each file's partition tuple for another spec's. Two live tables whose spec 0 is not what
//! a fresh table of their config gets: (a) one created unpartitioned and evolved to
//! `bucket(4, id)` by `[sink.tables]` (spec 0 unpartitioned, spec 1 the default); (b) one Spark
//! created `PARTITIONED BY (days(created_at))` with no `[sink.tables]` entry. Each is resynced
//! while its rows stream, then takes more updates, key changes and deletes.
//!
//! Oracles: Spark (Iceberg-Java) and pyiceberg read the rows (pyiceberg only without equality
//! deletes); partitioned.rs's pyiceberg layout check reads each data file's partition tuple as
//! its manifest wrote it and checks it has its spec's fields and holds the file's rows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::partitioned::{change, created_partitioned_by_spark, equal, layout_of, moving};
use super::resync::assert_swapped;
use crate::support::{
    connect, exec, run_cdcd, spark, test_env, unique, wait_for, Pipeline, Settings,
};

/// 300 rows over ten days of `created_at`; no TOASTed values, so the key changes streamed during
/// the resync's upsert window are exact (docs/exactly-once.md, section 5).
fn create(t: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id int8 PRIMARY KEY, created_at timestamptz NOT NULL, n int4, big text);
         INSERT INTO {t} SELECT g, timestamptz '2024-01-01 00:00+00' + (g % 10) * interval '1 day' + g * interval '1 minute', g, 'small ' || g
         FROM generate_series(1, 300) g;"
    )
}

/// Streams [`moving`] rounds from `first` on `t` until `stop`; returns the next round.
async fn stream(pg_url: String, t: String, first: i64, stop: Arc<AtomicBool>) -> i64 {
    let client = connect(&pg_url).await;
    let mut round = first;
    while !stop.load(Ordering::Relaxed) {
        exec(&client, &moving(&t, round)).await;
        round += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    round
}

/// `cdcd resync` of `t` while its rows stream, then more changes: every reader equals the source
/// and every data file's partition tuple is its spec's. Returns the layout.
async fn resync_while_streaming(
    p: &mut Pipeline,
    client: &tokio_postgres::Client,
    t: &str,
    equality: bool,
) -> serde_json::Value {
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(stream(p.env.pg_url.clone(), t.to_owned(), 10, stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (ok, out) = run_cdcd(&["resync", "--table", &format!("public.{t}")], &p.config);
    assert!(ok && out.contains("requested"), "cdcd resync:\n{out}");
    wait_for(p, "the resync to finish", Duration::from_secs(240), |o| {
        o.contains("resync finished")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    let next = writer.await.unwrap();
    assert_swapped(p, t, true);
    for round in next..next + 2 {
        let lsn = change(client, t, &moving(t, round), -round).await;
        equal(p, t, equality, lsn).await;
    }
    let seen = layout_of(&p.env.python, &p.table_dir(t));
    eprintln!("layout after the resync: {seen}");
    seen
}

/// (a): spec 0 unpartitioned, spec 1 `bucket(4, id)` by config; the resync's files keep spec 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_of_a_table_whose_spec_evolved_keeps_the_spec() {
    let test = "a_resync_of_a_table_whose_spec_evolved_keeps_the_spec";
    let env = ground_or_skip!(test_env(test));
    let name = unique("rsps");
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create(&t)).await;
    let mut settings = Settings {
        sink_extra: "maintenance_interval_ms = 0\n".into(),
        ..Settings::default()
    };
    let mut p = Pipeline::new(&env, &name, &[t.as_str()], &settings);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    p.assert_equal(&t, 90).await;
    p.sigterm_and_wait(Duration::from_secs(60)).await;

    settings.sink_extra +=
        &format!("[sink.tables.\"public.{t}\"]\npartition_by = [\"bucket(4, id)\"]\n");
    p.write_config(&settings);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(60)).await;
    let equality = std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality");
    let lsn = change(&client, &t, &moving(&t, 1), -1).await;
    equal(&mut p, &t, equality, lsn).await;
    let before = layout_of(&p.env.python, &p.table_dir(&t));
    assert_eq!(
        before["default_spec"], 1,
        "the spec did not evolve: {before}"
    );

    let seen = resync_while_streaming(&mut p, &client, &t, equality).await;
    assert_eq!(seen["default_spec"], 1, "{seen}");
    assert!(
        seen["partitions"].as_u64().unwrap_or(0) >= 4,
        "the resynced table is not split by bucket(4, id): {seen}"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}

/// (b): a table Spark created `PARTITIONED BY (days(created_at))` (its spec 0), nothing
/// configured; the resync's files keep Spark's spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_of_a_table_spark_partitioned_keeps_the_spec() {
    let test = "a_resync_of_a_table_spark_partitioned_keeps_the_spec";
    let env = ground_or_skip!(test_env(test));
    let spark = ground_or_skip!(spark(test));
    let (mut p, client, t) =
        created_partitioned_by_spark(&env, &spark, &unique("rssp"), create, "days(created_at)")
            .await;
    let lsn = change(&client, &t, &moving(&t, 1), -1).await;
    equal(&mut p, &t, true, lsn).await;
    let before = layout_of(&p.env.python, &p.table_dir(&t));
    assert_eq!(before["default_spec"], 0, "{before}");

    let seen = resync_while_streaming(&mut p, &client, &t, true).await;
    assert!(
        seen["partitions"].as_u64().unwrap_or(0) >= 10,
        "the resynced table is not split by days(created_at): {seen}"
    );
    p.sigterm_and_wait(Duration::from_secs(60)).await;
}
