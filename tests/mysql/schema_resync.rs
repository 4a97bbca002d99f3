//! End to end from MariaDB, `source.schema_change = "resync"` (issue 34, part 5): an
//! `ADD COLUMN … DEFAULT` the LSM (Paimon) sink cannot store resyncs that table online by itself
//! while the other table streams on; both end equal (pypaimon against pymysql). MariaDB has no
//! slot: the restart position is the tables' checkpoints, the parked table's among them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::mysql::resync::{create_table, write_until};
use crate::support::mysql::wait_for;
use crate::support::mysql::{my_connect, my_env_and_name, my_exec, MyPipeline};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_default_the_lsm_sink_cannot_store_resyncs_the_table_alone() {
    let (env, name) = ground_or_skip!(my_env_and_name("myscr"));
    let extra = "schema_change = \"resync\"";
    let mut p = MyPipeline::new(&env, &name, "initial", extra).await;
    p.use_lsm(2, "initial", extra);
    let url = env.url_for(&p.db);
    let mut c = my_connect(&url).await;
    my_exec(&mut c, &create_table("o", 2_000)).await;
    my_exec(&mut c, &create_table("t", 5_000)).await;
    p.start();
    p.assert_equal("o", 120).await;
    p.assert_equal("t", 120).await;

    let stop = Arc::new(AtomicBool::new(false));
    let wo = tokio::spawn(write_until(url.clone(), "o".into(), 2_000, stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    my_exec(&mut c, "ALTER TABLE t ADD COLUMN d INT NOT NULL DEFAULT 7").await;
    my_exec(
        &mut c,
        "UPDATE t SET d = 8, v = v + 1 WHERE id % 9 = 0; DELETE FROM t WHERE id % 13 = 0",
    )
    .await;
    wait_for(
        &mut p,
        "the resync of t to finish",
        Duration::from_secs(240),
        |o| o.contains("resync finished"),
    )
    .await;
    my_exec(&mut c, "UPDATE t SET d = 9 WHERE id % 11 = 0").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    eprintln!("{} write rounds to o", wo.await.unwrap());

    let out = p.output();
    let table_t = format!("table={}.t ", p.db);
    let started = out
        .lines()
        .position(|l| l.contains("copies the table again, online") && l.contains(&table_t))
        .unwrap_or_else(|| panic!("no log line says that t is resynced:\n{out}"));
    let finished = out
        .lines()
        .position(|l| l.contains("resync finished") && l.contains(&table_t))
        .unwrap_or_else(|| panic!("no log line says that the resync of t finished:\n{out}"));
    let table_o = format!("table={}.o ", p.db);
    assert!(
        out.lines()
            .skip(started)
            .take(finished.saturating_sub(started))
            .any(|l| l.contains(" committed") && l.contains(&table_o)),
        "o took no commit while t was resynced:\n{out}"
    );
    p.assert_equal("o", 240).await;
    p.assert_equal("t", 240).await;
    crate::postgres::resync::assert_lsm_swapped_in_one_step(&p.table_dir("t"), true);
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0));
}
