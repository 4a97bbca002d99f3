//! End to end, `cdcd resync` from MariaDB (issue 20): a table copied again online into a new
//! lineage beside the live one while both it and another table are written in MINIMAL and FULL
//! images, `kill -9` in the middle of the resync's copy, and the swap: the table ends equal to
//! the source (lakecheck: DuckDB against pymysql), the other table and the live table itself kept
//! streaming during the copy, every metadata version of the live table is either the old lineage
//! or the complete new one, and the swap never took the table back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::postgres::resync::{assert_swap_never_went_back, assert_swapped_in_one_step};
use crate::support::mysql::wait_for;
use crate::support::mysql::{my_connect, my_env, my_env_and_name, my_exec, MyPipeline};
use crate::support::{run_cdcd, tune_copy, unique};

/// `rows` rows; `b` is a BLOB (MINIMAL images leave it out when unchanged).
pub(crate) fn create_table(t: &str, rows: u64) -> String {
    format!(
        "CREATE TABLE {t} (id BIGINT PRIMARY KEY, v INT, s VARCHAR(40), b BLOB);
         INSERT INTO {t} SELECT seq, seq % 1000, CONCAT('row ', seq), REPEAT('b', seq % 50)
           FROM seq_1_to_{rows}"
    )
}

/// One round of inserts, partial updates, deletes (MINIMAL session) and a key change (FULL).
fn writes(t: &str, round: u64, rows: u64) -> (String, String) {
    let at = |k: u64| (round * 7919 + k * 104_729) % rows + 1;
    let mut minimal = String::from("BEGIN;\n");
    minimal += &format!(
        "INSERT INTO {t} SELECT {base} + seq, seq, 'new', 'nb' FROM seq_1_to_10;\n",
        base = 10_000_000 + round * 100
    );
    for k in 0..6 {
        let id = at(k);
        match k % 3 {
            0 => minimal += &format!("UPDATE {t} SET v = v + 1 WHERE id = {id};\n"),
            1 => minimal += &format!("DELETE FROM {t} WHERE id = {id};\n"),
            _ => minimal += &format!("UPDATE {t} SET s = 'upd' WHERE id = {id};\n"),
        }
    }
    minimal += "COMMIT;";
    let id = at(9);
    let full = format!("UPDATE {t} SET id = id + 20000000 WHERE id = {id} AND id < 20000000");
    (minimal, full)
}

pub(crate) async fn write_until(url: String, t: String, rows: u64, stop: Arc<AtomicBool>) -> u64 {
    let mut minimal = my_connect(&url).await;
    my_exec(&mut minimal, "SET SESSION binlog_row_image = 'MINIMAL'").await;
    let mut full = my_connect(&url).await;
    my_exec(&mut full, "SET SESSION binlog_row_image = 'FULL'").await;
    let mut round = 0;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let (m, f) = writes(&t, round, rows);
        my_exec(&mut minimal, &m).await;
        my_exec(&mut full, &f).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    round
}

/// Copy tuning: chunks of `chunk_rows`, a commit per chunk (a copy is many commits).
fn tune(p: &MyPipeline, chunk_rows: u64) {
    tune_copy(&p.config, chunk_rows, None, Some(chunk_rows));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_table_is_resynced_online_through_a_kill() {
    let (env, name) = ground_or_skip!(my_env_and_name("myrsync"));
    let rows = 150_000;
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    let hash = name
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    p.server_id = 200_000 + hash % 1_000_000;
    p.write_config("initial", "");
    tune(&p, 5000);
    let url = env.url_for(&p.db);
    let mut c = my_connect(&url).await;
    my_exec(&mut c, &create_table("o", 2_000)).await;
    my_exec(&mut c, &create_table("t", rows)).await;
    p.start();
    p.assert_equal("o", 120).await;
    p.assert_equal("t", 240).await;

    let stop = Arc::new(AtomicBool::new(false));
    let wt = tokio::spawn(write_until(url.clone(), "t".into(), rows, stop.clone()));
    let wo = tokio::spawn(write_until(url.clone(), "o".into(), 2_000, stop.clone()));
    let (ok, out) = run_cdcd(&["resync", "--table", &format!("{}.t", p.db)], &p.config);
    assert!(ok && out.contains("requested"), "{out}");
    let copy_commits = |o: &str| {
        o.split("resync under way").nth(1).map_or(0, |after| {
            after
                .lines()
                // The copy's commits, at the incomplete position (`:0`); the live table's
                // streaming commits go on beside them.
                .filter(|l| {
                    l.contains("committed") && l.contains(".t ") && l.contains("position=:0 ")
                })
                .count()
        })
    };
    // The live table streams on beside the copy: its own commits, at real positions.
    let live_commits = |o: &str| {
        o.split("resync under way").nth(1).map_or(0, |after| {
            after
                .lines()
                .filter(|l| {
                    l.contains("committed") && l.contains(".t ") && !l.contains("position=:0 ")
                })
                .count()
        })
    };
    wait_for(
        &mut p,
        "two commits of the resync's copy and one of the live table beside them",
        Duration::from_secs(240),
        |o| copy_commits(o) >= 2 && live_commits(o) >= 1,
    )
    .await;
    assert!(
        !p.output().contains("resync finished"),
        "the resync ended before the kill; make the table bigger"
    );
    eprintln!("kill -9 in the middle of the resync");
    p.kill9();
    tokio::time::sleep(Duration::from_millis(500)).await;
    p.start();
    wait_for(
        &mut p,
        "the resumed resync",
        Duration::from_secs(300),
        |o| crate::support::start_output(o, 2).contains("resync finished"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    let rounds = (wt.await.unwrap(), wo.await.unwrap());
    eprintln!("{rounds:?} write rounds to t and o");
    let out = crate::support::start_output(&p.output(), 2);
    assert!(
        out.contains("while the pipeline streams on"),
        "the restart did not copy the table again online:\n{out}"
    );
    p.assert_equal("o", 240).await;
    p.assert_equal("t", 240).await;
    assert_swapped_in_one_step(&p.table_dir("t"));
    assert_swap_never_went_back(&p.table_dir("t"));
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}

// Crashes around an online resync's end from MariaDB, where nothing on the server holds the
// stream (no slot; the restart position is the meet of the tables' checkpoints, the lineage's
// among them, raised by `progress.json` only where its claim holds): right after the copy job
// completed, and right after the lineage's commit that replaces the live table. Each restart
// finishes the resync while both tables take writes; both end equal and the swap never goes
// back. (The Postgres twin is the one that lost rows before the restart held its
// acknowledgements: there the slot is the position.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_around_a_mariadb_online_resyncs_end_recover_equal() {
    let env = ground_or_skip!(my_env(
        "crashes_around_a_mariadb_online_resyncs_end_recover_equal"
    ));
    crashes_around_a_mariadb_online_resyncs_end(&env, None).await;
}

// The same into the LSM (Paimon) sink, with the crash between the swap's schemas and copies
// and its `OVERWRITE` snapshot besides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_around_a_mariadb_online_lsm_resyncs_end_recover_equal() {
    let env = ground_or_skip!(my_env(
        "crashes_around_a_mariadb_online_lsm_resyncs_end_recover_equal"
    ));
    crashes_around_a_mariadb_online_resyncs_end(&env, Some(2)).await;
}

async fn crashes_around_a_mariadb_online_resyncs_end(
    env: &crate::support::mysql::MyEnv,
    lsm: Option<u32>,
) {
    let mut points = vec!["resync-copied", "resync-before-swap"];
    if lsm.is_some() {
        points.push("lsm-swap-before-snapshot");
    }
    for (i, point) in points.into_iter().enumerate() {
        let prefix = if lsm.is_some() {
            "myrsynlx"
        } else {
            "myrsyncx"
        };
        let name = unique(&format!("{prefix}{i}"));
        let rows = 20_000;
        let mut p = MyPipeline::new(env, &name, "initial", "").await;
        if let Some(buckets) = lsm {
            p.use_lsm(buckets, "initial", "");
        }
        tune(&p, 4000);
        let url = env.url_for(&p.db);
        let mut c = my_connect(&url).await;
        my_exec(&mut c, &create_table("o", 2_000)).await;
        my_exec(&mut c, &create_table("t", rows)).await;
        p.env_vars.push(("CDCD_FAILPOINT".into(), point.to_owned()));
        p.start();
        p.assert_equal("o", 120).await;
        p.assert_equal("t", 240).await;
        let stop = Arc::new(AtomicBool::new(false));
        let wt = tokio::spawn(write_until(url.clone(), "t".into(), rows, stop.clone()));
        let wo = tokio::spawn(write_until(url.clone(), "o".into(), 2_000, stop.clone()));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (ok, out) = run_cdcd(&["resync", "--table", &format!("{}.t", p.db)], &p.config);
        assert!(ok && out.contains("requested"), "{out}");
        let status = p.wait_exit(Duration::from_secs(180)).await;
        let status = status.unwrap_or_else(|| panic!("{point}: cdcd did not abort"));
        assert!(!status.success(), "{point}: cdcd must abort, got {status}");
        assert!(
            p.output().contains(&format!("failpoint {point}")),
            "{point}: aborted elsewhere:\n{}",
            p.output()
        );
        p.env_vars.clear();
        p.start();
        wait_for(
            &mut p,
            "the resync to finish after the crash",
            Duration::from_secs(240),
            |o| crate::support::start_output(o, 2).contains("resync finished"),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        stop.store(true, Ordering::Relaxed);
        let rounds = (wt.await.unwrap(), wo.await.unwrap());
        eprintln!("{point}: {rounds:?} write rounds to t and o");
        p.assert_equal("o", 240).await;
        p.assert_equal("t", 240).await;
        match lsm {
            Some(_) => {
                crate::postgres::resync::assert_lsm_swapped_in_one_step(&p.table_dir("t"), true);
            }
            None => {
                assert_swapped_in_one_step(&p.table_dir("t"));
                assert_swap_never_went_back(&p.table_dir("t"));
            }
        }
        let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
        assert_eq!(st.code(), Some(0));
    }
}

// `kill -9` at random moments of online resyncs from MariaDB (the slot-less restart): while both
// tables take MINIMAL and FULL writes, cdcd is started, a resync of `t` is requested whenever
// none is pending, and cdcd is killed after a random 0.3–3.5 s. A last start finishes whatever
// is pending; both tables end equal and no request is left. `CDCD_TEST_SEED` repeats a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_at_random_moments_of_mariadb_online_resyncs() {
    let test = "kill_dash_nine_at_random_moments_of_mariadb_online_resyncs";
    let env = ground_or_skip!(my_env(test));
    let mut rng = crate::support::Rng::from_env_or_clock(test);
    let name = unique("myrsyncr");
    let rows = 40_000;
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    tune(&p, 5_000);
    let url = env.url_for(&p.db);
    let mut c = my_connect(&url).await;
    my_exec(&mut c, &create_table("o", 2_000)).await;
    my_exec(&mut c, &create_table("t", rows)).await;
    p.start();
    p.assert_equal("o", 120).await;
    p.assert_equal("t", 240).await;
    let stop = Arc::new(AtomicBool::new(false));
    let wt = tokio::spawn(write_until(url.clone(), "t".into(), rows, stop.clone()));
    let wo = tokio::spawn(write_until(url.clone(), "o".into(), 2_000, stop.clone()));
    let requests = p.warehouse.join("_cdcd").join(&p.name).join("resync");
    let pending = || std::fs::read_dir(&requests).map_or(0, |rd| rd.count());
    let mut requested = 0;
    for round in 0..6 {
        if round > 0 {
            p.start();
        }
        if pending() == 0 {
            let (ok, out) = run_cdcd(&["resync", "--table", &format!("{}.t", p.db)], &p.config);
            assert!(ok && out.contains("requested"), "{out}");
            requested += 1;
        }
        let wait = rng.range(300, 3_500);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        assert!(
            p.wait_exit(Duration::from_millis(1)).await.is_none(),
            "round {round}: cdcd exited on its own:\n{}",
            p.output()
        );
        eprintln!("round {round}: kill -9 after {wait} ms");
        p.kill9();
    }
    p.start();
    let deadline = Instant::now() + Duration::from_secs(240);
    while pending() > 0 {
        assert!(Instant::now() < deadline, "a resync is still pending");
        assert!(
            p.wait_exit(Duration::from_millis(200)).await.is_none(),
            "cdcd exited on its own:\n{}",
            p.output()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = (wt.await.unwrap(), wo.await.unwrap());
    eprintln!("{requested} resyncs requested; {rounds:?} write rounds to t and o");
    p.assert_equal("o", 240).await;
    p.assert_equal("t", 240).await;
    assert_swapped_in_one_step(&p.table_dir("t"));
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}
