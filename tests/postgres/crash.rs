//! End to end, crash recovery, for each sink (Iceberg; LSM with its background compaction and expiry):
//! cdcd is SIGKILLed at random moments while a workload streams, restarted each time, and at the end the
//! replica equals the source with no duplicate keys (DuckDB, pypaimon). This is the exactly-once
//! promise of DESIGN ("a change whose position is at or below its table's committed position is skipped"):
//! a kill between the table commit and the ack to Postgres must not apply a transaction twice, and a kill
//! before the commit must not lose it.
//!
//! The moments are random (the seed is printed; `CDCD_TEST_SEED=<n>` replays the schedule, the workload's
//! row choices come from Postgres's `random()` and are not replayed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{connect, exec, spawn_writer, test_env, unique, Pipeline, Rng, Settings};

const KILLS: usize = 6;

/// Three tables of different shapes: serial key with some TOASTed values, a composite text key, a uuid key.
fn create_tables(n: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {n}_a, {n}_b, {n}_c;
         CREATE TABLE {n}_a (id bigserial PRIMARY KEY, v int4, t text);
         ALTER TABLE {n}_a ALTER COLUMN t SET STORAGE EXTERNAL;
         CREATE TABLE {n}_b (k1 int4, k2 text, qty numeric(10,2), PRIMARY KEY (k1, k2));
         CREATE TABLE {n}_c (id uuid PRIMARY KEY, payload jsonb, at timestamptz);
         INSERT INTO {n}_a (v, t) SELECT g, 'seed ' || g FROM generate_series(1, 2000) g;
         INSERT INTO {n}_b SELECT g, 'k' || g, g / 4.0 FROM generate_series(1, 500) g;
         INSERT INTO {n}_c SELECT gen_random_uuid(), jsonb_build_object('g', g), now() FROM generate_series(1, 500) g;"
    )
}

/// One transaction of `size` changes spread over the three tables: inserts, updates (some leaving a TOASTed
/// value unchanged), deletes and primary-key changes.
fn transaction(n: &str, size: u64, rng: &mut Rng) -> String {
    let ins = size.max(1);
    let upd = size / 2 + 1;
    let del = size / 4 + 1;
    let mut sql = String::from("BEGIN;\n");
    let mut push = |s: String| {
        sql.push_str(&s);
        sql.push_str(";\n");
    };
    match rng.range(0, 3) {
        0 => {
            push(format!(
                "INSERT INTO {n}_a (v, t) SELECT g, 'w' || g FROM generate_series(1, {ins}) g"
            ));
            push(format!(
                "UPDATE {n}_a SET v = v + 1 WHERE id IN (SELECT id FROM {n}_a ORDER BY random() LIMIT {upd})"
            ));
            push(format!(
                "DELETE FROM {n}_a WHERE id IN (SELECT id FROM {n}_a ORDER BY random() LIMIT {del})"
            ));
        }
        1 => {
            push(format!(
                "INSERT INTO {n}_b SELECT (random() * 5000)::int, md5(random()::text), round((random() * 100)::numeric, 2)
                 FROM generate_series(1, {ins}) ON CONFLICT DO NOTHING"
            ));
            push(format!(
                "UPDATE {n}_b SET qty = qty + 1 WHERE (k1, k2) IN (SELECT k1, k2 FROM {n}_b ORDER BY random() LIMIT {upd})"
            ));
            push(format!(
                "DELETE FROM {n}_b WHERE (k1, k2) IN (SELECT k1, k2 FROM {n}_b ORDER BY random() LIMIT {del})"
            ));
        }
        _ => {
            push(format!(
                "INSERT INTO {n}_c SELECT gen_random_uuid(), jsonb_build_object('n', g, 's', md5(g::text)), now()
                 FROM generate_series(1, {ins}) g"
            ));
            push(format!(
                "UPDATE {n}_c SET payload = payload || '{{\"u\": 1}}', at = now()
                 WHERE id IN (SELECT id FROM {n}_c ORDER BY random() LIMIT {upd})"
            ));
            push(format!(
                "DELETE FROM {n}_c WHERE id IN (SELECT id FROM {n}_c ORDER BY random() LIMIT {del})"
            ));
        }
    }
    match rng.range(0, 6) {
        0 => push(format!(
            "UPDATE {n}_a SET id = nextval('{n}_a_id_seq') WHERE id IN (SELECT id FROM {n}_a ORDER BY random() LIMIT 2)"
        )),
        1 => push(format!(
            "UPDATE {n}_b SET k2 = k2 || 'x' WHERE (k1, k2) IN (SELECT k1, k2 FROM {n}_b ORDER BY random() LIMIT 2)"
        )),
        2 => push(format!(
            "INSERT INTO {n}_a (v, t) VALUES (0, (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400)))"
        )),
        3 => push(format!(
            // rows whose t is TOASTed (length > 10,000): the update sends t as unchanged
            "UPDATE {n}_a SET v = v + 1000 WHERE id IN (SELECT id FROM {n}_a WHERE length(t) > 10000 ORDER BY random() LIMIT 2)"
        )),
        _ => {}
    }
    sql.push_str("COMMIT;");
    sql
}

/// Transaction sizes: mostly small, sometimes medium, rarely thousands of rows.
fn size(rng: &mut Rng) -> u64 {
    match rng.range(0, 100) {
        0..=39 => 1,
        40..=79 => rng.range(2, 50),
        80..=94 => rng.range(50, 500),
        _ => rng.range(2000, 5000),
    }
}

/// The sink a crash test writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SinkKind {
    /// Iceberg, in the suite's delete mode (`CDCD_TEST_DELETE_MODE`).
    Iceberg,
    /// LSM (Apache Paimon), 2 buckets; the background compactor merges sorted runs and expiry
    /// deletes old snapshots while the kills land.
    Lsm,
    /// Iceberg with a maintenance cycle every 200 ms and a 1 MB target file size: data-file
    /// compactions (issue 19) run, and are killed, between the streaming commits.
    IcebergCompacting,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_at_random_moments_iceberg() {
    kill_dash_nine_at_random_moments(SinkKind::Iceberg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_at_random_moments_iceberg_compacting() {
    kill_dash_nine_at_random_moments(SinkKind::IcebergCompacting).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_at_random_moments_lsm() {
    kill_dash_nine_at_random_moments(SinkKind::Lsm).await;
}

async fn kill_dash_nine_at_random_moments(sink: SinkKind) {
    let test = format!("kill_dash_nine_at_random_moments_{sink:?}");
    let env = ground_or_skip!(test_env(&test));
    let mut rng = Rng::from_env_or_clock(&test);
    // Distinct per kind: the kinds run in parallel, and a shared slot or table would collide.
    let name = unique(match sink {
        SinkKind::Iceberg => "k9",
        SinkKind::IcebergCompacting => "ck9",
        SinkKind::Lsm => "lk9",
    });
    let tables = [
        format!("{name}_a"),
        format!("{name}_b"),
        format!("{name}_c"),
    ];
    let client = connect(&env.pg_url).await;
    exec(&client, &create_tables(&name)).await;
    let refs: Vec<&str> = tables.iter().map(String::as_str).collect();
    let mut p = match sink {
        SinkKind::Iceberg | SinkKind::IcebergCompacting => {
            Pipeline::new(&env, &name, &refs, &Settings::default())
        }
        SinkKind::Lsm => Pipeline::new_lsm(&env, &name, &refs, &Settings::default(), 2),
    };
    if sink == SinkKind::IcebergCompacting {
        p.compact_often();
    }
    p.on_cleanup(format!("DROP TABLE IF EXISTS {}", tables.join(", ")));

    p.start();
    let stop = Arc::new(AtomicBool::new(false));
    let load = spawn_writer(&env, rng.next(), stop.clone(), 30, {
        let n = name.clone();
        move |rng| transaction(&n, size(rng), rng)
    })
    .await;
    for i in 0..KILLS {
        // Some kills land during start-up and the initial snapshot, most while streaming and committing.
        let up = if i == 0 {
            rng.range(300, 1500)
        } else {
            rng.range(100, 4000)
        };
        tokio::time::sleep(Duration::from_millis(up)).await;
        p.assert_running();
        eprintln!("kill -9 #{} after {up} ms", i + 1);
        p.kill9();
        p.wait_slot_inactive(&client, Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(rng.range(0, 500))).await;
        p.start();
    }
    tokio::time::sleep(Duration::from_millis(rng.range(500, 2000))).await;
    stop.store(true, Ordering::Relaxed);
    let txs = load.await.expect("workload failed");
    eprintln!("workload: {txs} transactions");

    for t in &tables {
        p.assert_equal(t, 240).await;
    }
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "exit status after SIGTERM: {st}");

    if sink != SinkKind::Lsm {
        if sink == SinkKind::IcebergCompacting {
            let out = p.output();
            let n = out.matches("compaction committed").count();
            eprintln!("{n} compactions committed");
            assert!(n > 0, "no compaction ran:\n{out}");
        }
        return;
    }
    // Whatever the kills left (orphan files, stale hints), a full compaction reads back equal.
    let sink = p.lsm_sink();
    for t in &tables {
        let id = cdcd::changelog::TableId::new("public", t.clone());
        sink.compact(&id, true).await.unwrap();
        p.assert_equal(t, 0).await;
    }
}
