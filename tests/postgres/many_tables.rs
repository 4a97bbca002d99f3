//! Many tables (issue 37): 30 tables written by transactions that span several of them, while
//! cdcd commits each table on its own clock and the tables of a round concurrently. Faults land
//! in those rounds: one table's commits fail (its metadata directory made immutable) while the
//! others' commits of the same round run on, then cdcd is restarted; kill -9 at random moments;
//! crash points hit in the middle of a concurrent round (after the n-th metadata create, with
//! other tables' commits in flight). At the end every table equals the source by DuckDB, with no
//! key lost or duplicated: each table's checkpoint matched its rows at every restart. A second
//! test holds every round on its background task (a pause point) while cdcd reads on beside it,
//! and kills cdcd mid-round and right after a transaction read beside a round.
//!
//! The moments are random (the seed is printed; `CDCD_TEST_SEED=<n>` replays the schedule).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;

use crate::support::{
    connect, exec, spawn_writer, test_env, unique, Pipeline, Rng, Settings, TestEnv,
};

const TABLES: u64 = 30;

fn table(n: &str, i: u64) -> String {
    format!("{n}_{i}")
}

/// Marks `dir` immutable (`chattr +i`: even root cannot create files in it) until dropped, so
/// every commit of the table whose metadata lives there fails.
struct Immutable(PathBuf);

impl Immutable {
    fn set(dir: &Path) -> Immutable {
        let st = Command::new("chattr").arg("+i").arg(dir).status();
        assert!(
            st.as_ref().is_ok_and(|s| s.success()),
            "chattr +i {} failed ({st:?}): this test needs chattr (e2fsprogs) and root on a file system with the immutable attribute",
            dir.display()
        );
        Immutable(dir.to_owned())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

/// One transaction of 1 to 4 statements, each on a random table: an insert, an update or a
/// delete of a random row.
fn transaction(n: &str, rng: &mut Rng) -> String {
    let mut sql = String::from("BEGIN;\n");
    for _ in 0..rng.range(1, 5) {
        let t = table(n, rng.range(0, TABLES));
        let stmt = match rng.range(0, 4) {
            0 | 1 => format!("INSERT INTO {t} (v, s) VALUES ({}, md5(random()::text))", rng.range(0, 1000)),
            2 => format!(
                "UPDATE {t} SET v = v + 1, s = s || 'u' WHERE id IN (SELECT id FROM {t} ORDER BY random() LIMIT 2)"
            ),
            _ => format!("DELETE FROM {t} WHERE id IN (SELECT id FROM {t} ORDER BY random() LIMIT 1)"),
        };
        sql.push_str(&stmt);
        sql.push_str(";\n");
    }
    sql.push_str("COMMIT;");
    sql
}

/// `TABLES` source tables of 40 rows named after `name`, and a pipeline over them (not started)
/// committing every 300 ms.
async fn tables_and_pipeline(env: &TestEnv, name: &str) -> (Client, Vec<String>, Pipeline) {
    let tables: Vec<String> = (0..TABLES).map(|i| table(name, i)).collect();
    let client = connect(&env.pg_url).await;
    let mut ddl = format!("DROP TABLE IF EXISTS {};\n", tables.join(", "));
    for t in &tables {
        ddl.push_str(&format!(
            "CREATE TABLE {t} (id bigserial PRIMARY KEY, v int4, s text);
             INSERT INTO {t} (v, s) SELECT g, 'seed ' || g FROM generate_series(1, 40) g;\n"
        ));
    }
    exec(&client, &ddl).await;
    let refs: Vec<&str> = tables.iter().map(String::as_str).collect();
    let settings = Settings {
        commit_interval_ms: 300,
        ..Settings::default()
    };
    let mut p = Pipeline::new(env, name, &refs, &settings);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {}", tables.join(", ")));
    (client, tables, p)
}

/// Starts cdcd and a writer of [`transaction`]s over the tables, until the flag is set.
async fn start_writing(
    p: &mut Pipeline,
    env: &TestEnv,
    seed: u64,
    name: &str,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<u64>) {
    p.start();
    let stop = Arc::new(AtomicBool::new(false));
    let name = name.to_owned();
    let load = spawn_writer(env, seed, stop.clone(), 10, move |rng| {
        transaction(&name, rng)
    })
    .await;
    (stop, load)
}

/// kill -9, then a run with the crash point `point` armed at its `hit`-th pass, which must
/// reach it; then cdcd is started again.
async fn crash_at(p: &mut Pipeline, client: &Client, point: &str, hit: u64) {
    eprintln!("crash point {point}:{hit}");
    p.kill9();
    p.wait_slot_inactive(client, Duration::from_secs(30)).await;
    p.env_vars
        .push(("CDCD_FAILPOINT".into(), format!("{point}:{hit}")));
    p.start();
    let st = p.wait_exit(Duration::from_secs(120)).await;
    p.env_vars.retain(|(k, _)| k != "CDCD_FAILPOINT");
    assert!(
        p.output().contains(&format!("failpoint {point}")),
        "cdcd exited ({st}) without reaching {point}:{hit}"
    );
    p.wait_slot_inactive(client, Duration::from_secs(30)).await;
    p.start();
}

/// Stops the writer, then checks every table equal to the source by DuckDB and a clean stop.
async fn stop_and_check(
    p: &mut Pipeline,
    tables: &[String],
    stop: &AtomicBool,
    load: tokio::task::JoinHandle<u64>,
) {
    stop.store(true, Ordering::Relaxed);
    let txs = load.await.expect("workload failed");
    eprintln!("workload: {txs} transactions over {TABLES} tables");
    for (i, t) in tables.iter().enumerate() {
        p.assert_equal(t, if i == 0 { 240 } else { 60 }).await;
    }
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "exit status after SIGTERM: {st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tables_survive_a_failing_table_and_crashes_in_concurrent_rounds() {
    let test = "many_tables_survive_a_failing_table_and_crashes_in_concurrent_rounds";
    let env = ground_or_skip!(test_env(test));
    let mut rng = Rng::from_env_or_clock(test);
    let name = unique("mt");
    let (client, tables, mut p) = tables_and_pipeline(&env, &name).await;
    let (stop, load) = start_writing(&mut p, &env, rng.next(), &name).await;

    // 1. One table's commits fail while the others keep committing: cdcd stops with the error,
    // and what landed in the other tables' commits of that round stays landed.
    let failing = &tables[7];
    let other = &tables[8];
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while p.metadata_versions(failing) < 3 || p.metadata_versions(other) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the tables were not committed within 120 s:\n{}",
            p.output()
        );
        p.assert_running();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let frozen = Immutable::set(&p.table_dir(failing).join("metadata"));
    let st = p.wait_exit(Duration::from_secs(60)).await;
    assert!(!st.success(), "cdcd went on past a failing commit: {st}");
    drop(frozen);
    let out = p.output();
    assert!(
        out.contains(&format!("{failing}/")),
        "the error does not name the failing table's files:\n{out}"
    );
    eprintln!("a failing commit of {failing} stopped cdcd: {st}");
    p.start();

    // 2. kill -9 at random moments, and crash points in the middle of concurrent rounds: after
    // the n-th metadata create (that commit landed, others of its round are in flight) and before
    // it (that commit did not happen).
    for round in 0..4 {
        tokio::time::sleep(Duration::from_millis(rng.range(500, 3000))).await;
        p.assert_running();
        match round {
            0 | 2 => {
                eprintln!("kill -9 #{round}");
                p.kill9();
                p.wait_slot_inactive(&client, Duration::from_secs(30)).await;
                p.start();
            }
            _ => {
                let point = if round == 1 {
                    "commit-after-create"
                } else {
                    "commit-before-create"
                };
                // Past the start's table loads: this run's n-th commit, mid-stream.
                crash_at(&mut p, &client, point, rng.range(20, 60)).await;
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(rng.range(500, 1500))).await;
    stop_and_check(&mut p, &tables, &stop, load).await;
}

// A round commits in the background while cdcd reads on: each round is held on its task for
// 700 ms before its commits start (pause point `round-in-flight`), so at almost any moment a
// round is in flight and transactions for its tables are read into fresh buffers beside it.
// kill -9 at random moments then lands mid-round, and the crash point `round-read-beside` aborts
// right after the n-th transaction read beside a round. Every table equals the source at the end:
// what was in flight or buffered beside it is read again from each table's checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_while_a_round_commits_beside_the_reading_lose_nothing() {
    let test = "kills_while_a_round_commits_beside_the_reading_lose_nothing";
    let env = ground_or_skip!(test_env(test));
    let mut rng = Rng::from_env_or_clock(test);
    let name = unique("mtr");
    let (client, tables, mut p) = tables_and_pipeline(&env, &name).await;
    p.env_vars
        .push(("CDCD_PAUSEPOINT".into(), "round-in-flight:700".into()));
    let (stop, load) = start_writing(&mut p, &env, rng.next(), &name).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !p.output().contains("round-in-flight") {
        assert!(
            std::time::Instant::now() < deadline,
            "no round went to the background within 120 s:\n{}",
            p.output()
        );
        p.assert_running();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for round in 0..6 {
        tokio::time::sleep(Duration::from_millis(rng.range(300, 2500))).await;
        p.assert_running();
        if round % 2 == 0 {
            eprintln!("kill -9 #{round}");
            p.kill9();
            p.wait_slot_inactive(&client, Duration::from_secs(30)).await;
            p.start();
        } else {
            crash_at(&mut p, &client, "round-read-beside", rng.range(1, 30)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(rng.range(500, 1500))).await;
    stop_and_check(&mut p, &tables, &stop, load).await;
}
