//! End to end, the initial copy (issue 7): parallel key-range chunks in binary COPY while the source
//! is written to, a kill -9 in the middle of the copy that resumes from the committed chunks (not
//! from zero), and a table added to `tables` later that is copied alone while the slot stays.
//!
//! The writes hit every kind of change the convergence argument in
//! `src/sources/postgres/snapshot/mod.rs` covers: inserts, updates, deletes, primary-key changes that
//! move a row to another chunk, and updates that leave a TOASTed value unchanged (absent).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::wait_for;
use crate::support::{
    add_config_lines, connect, exec, test_env_and_name, tune_copy, Pipeline, Settings,
};
use tokio_postgres::Client;

/// A table of `rows` rows; every 100th row holds a TOASTed `t` (stored out of line).
fn create_table(t: &str, rows: u64) -> String {
    format!(
        "DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id int8 PRIMARY KEY, v int4, d date, n numeric(12,2), t text);
         ALTER TABLE {t} ALTER COLUMN t SET STORAGE EXTERNAL;
         INSERT INTO {t} SELECT g, g % 1000, DATE '2020-01-01' + (g % 3000)::int, g / 7.0,
             CASE WHEN g % 100 = 0 THEN repeat(md5(g::text), 300) ELSE 'row ' || g END
           FROM generate_series(1, {rows}) g;
         ANALYZE {t};"
    )
}

/// One transaction of assorted changes spread over the key space.
fn writes(t: &str, round: u64, rows: u64) -> String {
    let at = |k: u64| (round * 7919 + k * 104_729) % rows + 1;
    let mut sql = String::from("BEGIN;\n");
    // Inserts far above the copied keys, and into gaps left by key changes.
    sql += &format!(
        "INSERT INTO {t} SELECT {base} + g, g, DATE '2024-01-01', 1.5, 'new' FROM generate_series(1, 20) g;\n",
        base = 10_000_000 + round * 100
    );
    for k in 0..10 {
        let id = at(k);
        if id % 100 == 0 {
            // TOASTed row: only its small columns change, so `t` arrives absent.
            sql += &format!("UPDATE {t} SET v = v + 1 WHERE id = {id};\n");
        } else {
            match k % 4 {
                0 => sql += &format!("UPDATE {t} SET v = v + 1, t = t || 'u' WHERE id = {id};\n"),
                1 => sql += &format!("DELETE FROM {t} WHERE id = {id};\n"),
                // A key change to the far end of the key space (another chunk).
                2 => sql += &format!("UPDATE {t} SET id = id + 20000000 WHERE id = {id};\n"),
                _ => sql += &format!("UPDATE {t} SET n = n + 1 WHERE id = {id};\n"),
            }
        }
    }
    sql += "COMMIT;";
    sql
}

/// Write transactions numbered from `first` (each number once per table: its inserts use it).
async fn write_until(
    client: Client,
    t: String,
    rows: u64,
    first: u64,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut round = first - 1;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        exec(&client, &writes(&t, round, rows)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    round
}

/// Copy tuning: chunks of `chunk_rows`, `parallelism` connections, a commit every 5 chunks.
pub(super) fn tune(p: &Pipeline, chunk_rows: u64, parallelism: usize) {
    tune_copy(
        &p.config,
        chunk_rows,
        Some(parallelism),
        Some(chunk_rows * 5),
    );
}

/// The output of the `n`-th start (1-based).
fn start_output(p: &Pipeline, n: u32) -> String {
    crate::support::start_output(&p.output(), n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_during_a_parallel_copy_converge() {
    let (env, name) = ground_or_skip!(test_env_and_name("snapw"));
    let t = format!("{name}_t");
    let rows = 100_000;
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t, rows)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    tune(&p, 10_000, 3);

    p.start();
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(write_until(
        connect(&env.pg_url).await,
        t.clone(),
        rows,
        1,
        stop.clone(),
    ));
    wait_for(
        &mut p,
        "the copy to finish",
        Duration::from_secs(240),
        |o| o.contains("initial copy finished"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let rounds = load.await.unwrap();
    eprintln!("{rounds} write transactions during and after the copy");
    let out = start_output(&p, 1);
    let planned = out
        .lines()
        .find(|l| l.contains("planned initial copy"))
        .expect("a plan line");
    assert!(
        crate::support::log_field(planned, "chunks").unwrap() >= 5,
        "{planned}"
    );
    assert!(planned.contains("binary=true"), "{planned}");
    p.assert_equal(&t, 240).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_mid_copy_resumes_from_the_committed_chunks() {
    kill_mid_copy_resumes("snapk", "", |_| {}).await;
}

/// Issue 36: the copy of a table partitioned by `month(d)` (99 months, every copy chunk touching
/// all of them: `d` cycles with the key), committed by bytes under a small memory budget (2 MiB
/// of rows a commit), killed between its commits, resumes to an exact replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_mid_a_partitioned_copy_resumes_from_the_committed_chunks() {
    kill_mid_copy_resumes(
        "snapkp",
        "[sink.tables.\"public.*\"]\npartition_by = [\"month(d)\"]\n",
        |p| add_config_lines(&p.config, "[pipeline]", "memory_budget = \"16MiB\"\n"),
    )
    .await;
}

/// A copy of a 400,000-row table (`sink_extra`, then `configure`d), written to throughout,
/// killed with -9 after two copy commits: the restart resumes the slot's copy from the chunks
/// not committed, and the table reads back equal to the source.
async fn kill_mid_copy_resumes(tag: &str, sink_extra: &str, configure: impl Fn(&Pipeline)) {
    let (env, name) = ground_or_skip!(test_env_and_name(tag));
    let t = format!("{name}_t");
    let rows = 400_000;
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t, rows)).await;
    let settings = Settings {
        sink_extra: sink_extra.to_owned(),
        ..Settings::default()
    };
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &settings);
    tune(&p, 10_000, 2);
    configure(&p);

    p.start();
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(write_until(
        connect(&env.pg_url).await,
        t.clone(),
        rows,
        1,
        stop.clone(),
    ));
    // Two commits of copied rows (position 0/0) are in: some chunks are done.
    wait_for(&mut p, "two copy commits", Duration::from_secs(240), |o| {
        o.matches("position=0/0").count() >= 2
    })
    .await;
    assert!(
        !p.output().contains("initial copy finished"),
        "the copy ended before the kill; make the table bigger"
    );
    eprintln!("kill -9 in the middle of the copy");
    p.kill9();
    p.wait_slot_inactive(&client, Duration::from_secs(30)).await;
    // Changes while cdcd is down land in done and in pending chunks alike.
    tokio::time::sleep(Duration::from_millis(500)).await;
    p.start();
    wait_for(
        &mut p,
        "the resumed copy to finish",
        Duration::from_secs(240),
        |o| o.contains("initial copy finished"),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let rounds = load.await.unwrap();
    eprintln!("{rounds} write transactions");

    let out = start_output(&p, 2);
    assert!(
        out.contains("resuming an interrupted initial copy"),
        "second start did not resume:\n{out}"
    );
    assert!(
        !out.contains("created replication slot"),
        "the slot was recreated:\n{out}"
    );
    let planned = out
        .lines()
        .find(|l| l.contains("planned initial copy"))
        .expect("a plan line");
    let (chunks, to_copy) = (
        crate::support::log_field(planned, "chunks").unwrap(),
        crate::support::log_field(planned, "to_copy").unwrap(),
    );
    eprintln!("resumed: {to_copy} of {chunks} chunks copied again");
    assert!(to_copy < chunks, "restarted from zero: {planned}");
    p.assert_equal(&t, 240).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_added_later_is_copied_alone() {
    let (env, name) = ground_or_skip!(test_env_and_name("snapa"));
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&a, 5_000)).await;
    exec(&client, &create_table(&b, 30_000)).await;
    let mut p = Pipeline::new(&env, &name, &[&a], &Settings::default());
    p.on_cleanup(format!("DROP TABLE IF EXISTS {a}, {b}"));
    tune(&p, 5_000, 2);
    p.start();
    p.assert_equal(&a, 120).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));

    // While cdcd is down, both tables change; then `b` joins the pipeline. The publication must
    // publish it: cdcd prints the statement, as an operator would run it.
    exec(&client, &writes(&a, 1, 5_000)).await;
    exec(&client, &writes(&b, 1, 30_000)).await;
    exec(
        &client,
        &format!("ALTER PUBLICATION {} ADD TABLE {b}", p.publication),
    )
    .await;
    p.tables.push(format!("public.{b}"));
    p.write_config(&Settings::default());
    tune(&p, 5_000, 2);
    p.start();
    let stop = Arc::new(AtomicBool::new(false));
    let wa = tokio::spawn(write_until(
        connect(&env.pg_url).await,
        a.clone(),
        5_000,
        2,
        stop.clone(),
    ));
    let wb = tokio::spawn(write_until(
        connect(&env.pg_url).await,
        b.clone(),
        30_000,
        2,
        stop.clone(),
    ));
    wait_for(&mut p, "the copy of b", Duration::from_secs(240), |o| {
        o.contains("initial copy finished")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    wa.await.unwrap();
    wb.await.unwrap();

    let out = start_output(&p, 2);
    assert!(
        !out.contains("created replication slot"),
        "the slot was recreated:\n{out}"
    );
    let plans: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("planned initial copy"))
        .collect();
    assert_eq!(plans.len(), 1, "only b is copied: {plans:?}");
    assert!(plans[0].contains(&b), "{plans:?}");
    p.assert_equal(&a, 240).await;
    p.assert_equal(&b, 240).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}

/// The upsert-window gap: a table joins the pipeline after an update that left its TOASTed `t`
/// unchanged (absent) and a delete of the same row, both after the other table's position. The
/// table is copied at a new snapshot (without that row) and the stream replays the update inside
/// the window, where the row is in no chunk: the sink drops it. Before, the Iceberg sink stopped
/// with "cannot complete a partial update: row not in table".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_update_of_a_row_deleted_inside_the_window_is_dropped() {
    let (env, name) = ground_or_skip!(test_env_and_name("snapg"));
    let (a, b) = (format!("{name}_a"), format!("{name}_b"));
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&a, 1_000)).await;
    exec(&client, &create_table(&b, 2_000)).await;
    let mut p = Pipeline::new(&env, &name, &[&a], &Settings::default());
    p.on_cleanup(format!("DROP TABLE IF EXISTS {a}, {b}"));
    p.start();
    p.assert_equal(&a, 120).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));

    // Published first, so the stream carries b's changes from the pipeline's position on.
    exec(
        &client,
        &format!("ALTER PUBLICATION {} ADD TABLE {b}", p.publication),
    )
    .await;
    exec(
        &client,
        &format!(
            "UPDATE {a} SET v = v + 1 WHERE id = 7;
             UPDATE {b} SET v = v + 1 WHERE id = 100;
             DELETE FROM {b} WHERE id = 100;
             BEGIN; UPDATE {b} SET n = n + 1 WHERE id = 200; DELETE FROM {b} WHERE id = 200; COMMIT;
             UPDATE {b} SET v = v + 1 WHERE id = 300;
             UPDATE {a} SET v = v + 1 WHERE id = 8;"
        ),
    )
    .await;
    p.tables.push(format!("public.{b}"));
    p.write_config(&Settings::default());
    p.start();
    p.assert_equal(&b, 120).await;
    p.assert_equal(&a, 120).await;
    let out = start_output(&p, 2);
    assert!(
        out.contains("planned initial copy") && out.contains(&b),
        "b was not copied:\n{out}"
    );
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}
