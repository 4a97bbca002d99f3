//! End to end, DDL while the MariaDB initial copy runs (issue 34, parts 1 and 2).
//!
//! Part 1: an `ALTER TABLE` on a table the copy has not reached yet. MariaDB refuses to read a
//! rebuilt table at the older snapshot (error 1412, "Table definition has changed") and a column
//! an instant ALTER dropped or renamed (1054); an instant ADD COLUMN reads fine at the snapshot.
//! cdcd copies such a table again, whole, at a snapshot of its own, and stays exact.
//!
//! Part 2: columns changed (and rows updated to use them) between cdcd's read of
//! `information_schema` and the consistent snapshot. The copy must read the columns at its
//! snapshot, so cdcd checks them again inside the snapshot and begins it again when they moved.
//!
//! Both races are made certain with pause points (`CDCD_PAUSEPOINT`, `src/failpoints.rs`): the
//! DDL runs while cdcd sleeps at the named point. The replica is read back by DuckDB.

use std::time::{Duration, Instant};

use super::replication::SERVER_GLOBALS;
use crate::support::mysql::{my_connect, my_env, my_exec, MyPipeline};
use crate::support::{current_test, tune_copy, unique};

/// A table of `rows` rows with an int `v`, an int `w` and a short string.
fn small_table(t: &str, rows: u64) -> String {
    format!(
        "CREATE TABLE {t} (id INT PRIMARY KEY, v INT, w INT, s VARCHAR(10));
         INSERT INTO {t} SELECT seq, seq, seq * 2, CONCAT('s', seq) FROM seq_1_to_{rows}"
    )
}

/// Waits until cdcd's output contains `what` (panics after `timeout`, or when cdcd exits).
async fn wait_output(p: &mut MyPipeline, what: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !p.output().contains(what) {
        assert!(Instant::now() < deadline, "timed out waiting for {what:?}");
        if let Some(st) = p.wait_exit(Duration::from_millis(100)).await {
            panic!("cdcd exited ({st}) while waiting for {what:?}");
        }
    }
}

/// The ALTERs of part 1, each followed by an update that uses the new shape (and some after an
/// update in the older one), run while the copy has planned every table and not read the `z_`
/// tables yet.
const ALTERS_UNDER_THE_COPY: &str = "
    UPDATE z_rewrite SET w = w + 1 WHERE id <= 5;
    ALTER TABLE z_rewrite MODIFY v BIGINT;
    UPDATE z_rewrite SET v = v + 5000000000 WHERE id <= 10;
    UPDATE z_drop SET w = w + 1 WHERE id <= 5;
    ALTER TABLE z_drop DROP COLUMN w;
    UPDATE z_drop SET v = -v WHERE id <= 10;
    ALTER TABLE z_rename RENAME COLUMN w TO w2;
    UPDATE z_rename SET w2 = 99 WHERE id <= 10;
    ALTER TABLE z_add ADD COLUMN c INT;
    UPDATE z_add SET c = 7 WHERE id <= 10;
    UPDATE a_big SET v = -1 WHERE id % 1000 = 0";

const ALTERED: [&str; 4] = ["z_rewrite", "z_drop", "z_rename", "z_add"];

// Issue 34 part 1: a big table copied first, ALTERs of small tables queued behind it. The old
// code stopped at the first read of `z_rewrite` ("copying …: Table definition has changed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_altered_before_the_copy_reaches_it_is_copied_again() {
    let env = ground_or_skip!(my_env(
        "a_table_altered_before_the_copy_reaches_it_is_copied_again"
    ));
    let _globals = SERVER_GLOBALS.read().await;
    let name = unique("mycpalt");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE a_big (id BIGINT PRIMARY KEY, v INT, s VARCHAR(40));
         INSERT INTO a_big SELECT seq, seq % 1000, CONCAT('row ', seq) FROM seq_1_to_30000",
    )
    .await;
    for t in ALTERED {
        my_exec(&mut c, &small_table(t, 1000)).await;
    }
    // a_big is planned in chunks (read at planning, so MariaDB holds its metadata lock); the
    // small tables are one chunk each, first read when the copy reaches them.
    tune_copy(&p.config, 5000, None, None);
    p.env_vars
        .push(("CDCD_PAUSEPOINT".into(), "mysql-copy-table:1500".into()));
    p.start();
    wait_output(&mut p, "pause point", Duration::from_secs(120)).await;
    my_exec(&mut c, ALTERS_UNDER_THE_COPY).await;
    wait_output(&mut p, "initial copy finished", Duration::from_secs(180)).await;
    // Streamed after the copy, in the new shapes.
    my_exec(
        &mut c,
        "INSERT INTO z_rewrite VALUES (1001, 6000000000, 1, 'n');
         INSERT INTO z_drop VALUES (1001, 1, 'n');
         INSERT INTO z_rename VALUES (1001, 1, 2, 'n');
         INSERT INTO z_add VALUES (1001, 1, 2, 'n', 8);
         INSERT INTO a_big VALUES (40000, 1, 'n')",
    )
    .await;
    p.assert_equal("a_big", 120).await;
    for t in ALTERED {
        p.assert_equal(t, 120).await;
    }
    // The rebuilt table (1412) and the two that lost a column (1054); the instant ADD COLUMN
    // reads fine at the snapshot.
    let out = p.output();
    for t in ["z_rewrite", "z_drop", "z_rename"] {
        assert!(
            out.lines()
                .any(|l| l.contains("copied again at a new snapshot")
                    && l.contains(&format!(".{t} "))),
            "{t} was copied again:\n{out}"
        );
    }
    assert!(!out
        .lines()
        .any(|l| l.contains("copied again at a new snapshot") && l.contains(".z_add ")));
}

// Issue 34 part 2: `ADD COLUMN` + `UPDATE` between the read of the columns and the snapshot. The
// old code copied the table without the column (and its values), and the stream never replays
// the update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_changed_between_the_catalog_read_and_the_snapshot_are_copied() {
    let env = ground_or_skip!(my_env(&current_test()));
    let _globals = SERVER_GLOBALS.read().await;
    let name = unique("mycpcol");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(&mut c, &small_table("t", 100)).await;
    my_exec(&mut c, &small_table("u", 100)).await;
    p.env_vars.push((
        "CDCD_PAUSEPOINT".into(),
        "mysql-before-snapshot:3000".into(),
    ));
    p.start();
    wait_output(&mut p, "pause point", Duration::from_secs(120)).await;
    my_exec(
        &mut c,
        "ALTER TABLE t ADD COLUMN c INT;
         UPDATE t SET c = 7 WHERE id <= 10;
         ALTER TABLE u ADD COLUMN d INT DEFAULT 5;
         UPDATE u SET d = 6 WHERE id <= 10",
    )
    .await;
    wait_output(&mut p, "initial copy finished", Duration::from_secs(120)).await;
    my_exec(
        &mut c,
        "INSERT INTO t VALUES (101, 1, 2, 'n', 8);
         INSERT INTO u VALUES (101, 1, 2, 'n', 9)",
    )
    .await;
    p.assert_equal("t", 120).await;
    p.assert_equal("u", 120).await;
}

// Issue 34 part 1, with a crash: cdcd dies after the shared snapshot's tables are copied and
// before the altered tables' copies of their own. At the restart they are tables without a
// copy, resumed from the other tables' position P; an upsert window from P would replay their
// changes of the older shape (before the ALTER) over rows copied in the newer one. The schema
// history recorded their columns at P before the copy, so the restart sees that they changed
// and copies them whole at a snapshot of their own again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_an_altered_table_is_copied_again_converges() {
    let env = ground_or_skip!(my_env(
        "a_crash_before_an_altered_table_is_copied_again_converges"
    ));
    let _globals = SERVER_GLOBALS.read().await;
    let name = unique("mycpcrash");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(&mut c, &small_table("a_big", 3000)).await;
    my_exec(&mut c, &small_table("z_rewrite", 1000)).await;
    my_exec(&mut c, &small_table("z_drop", 1000)).await;
    // One connection: the pause in `a_big` holds the copy before it reaches the `z_` tables
    // (with parallel connections they would be copied before the ALTERs).
    tune_copy(&p.config, 1000, Some(1), None);
    p.env_vars
        .push(("CDCD_PAUSEPOINT".into(), "mysql-copy-table:1500".into()));
    p.env_vars
        .push(("CDCD_FAILPOINT".into(), "mysql-copy-whole".into()));
    p.start();
    wait_output(&mut p, "pause point", Duration::from_secs(120)).await;
    my_exec(
        &mut c,
        "UPDATE z_rewrite SET w = w + 1 WHERE id <= 5;
         ALTER TABLE z_rewrite MODIFY v BIGINT;
         UPDATE z_rewrite SET v = v + 5000000000 WHERE id <= 10;
         UPDATE z_drop SET w = w + 1 WHERE id <= 5;
         ALTER TABLE z_drop DROP COLUMN w;
         UPDATE z_drop SET v = -v WHERE id <= 10",
    )
    .await;
    let st = p
        .wait_exit(Duration::from_secs(120))
        .await
        .expect("cdcd did not reach the failpoint");
    assert!(!st.success(), "{st}");
    assert!(p.output().contains("failpoint mysql-copy-whole"));
    p.env_vars.retain(|(k, _)| k != "CDCD_FAILPOINT");
    my_exec(
        &mut c,
        "UPDATE z_rewrite SET v = 7 WHERE id = 20;
         UPDATE z_drop SET v = 7 WHERE id = 20;
         UPDATE a_big SET v = 7 WHERE id = 20",
    )
    .await;
    p.start();
    p.assert_equal("a_big", 120).await;
    p.assert_equal("z_rewrite", 120).await;
    p.assert_equal("z_drop", 120).await;
    let second = crate::support::start_output(&p.output(), 2);
    assert!(
        second
            .matches("copying it whole at a snapshot of its own")
            .count()
            >= 2,
        "the restart copied the altered tables whole:\n{second}"
    );
    my_exec(
        &mut c,
        "INSERT INTO z_rewrite VALUES (1001, 6000000000, 1, 'n');
         INSERT INTO z_drop VALUES (1001, 1, 'n')",
    )
    .await;
    p.assert_equal("z_rewrite", 60).await;
    p.assert_equal("z_drop", 60).await;
}

// Issue 34 part 1, the case a new snapshot cannot help: a table dropped after the snapshot,
// before the copy reached it. The stream could not follow it either (a DROP of a captured table
// stops cdcd), so cdcd stops, naming the table, the cause and the way out, once the other tables
// are copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_dropped_before_the_copy_reaches_it_stops_naming_it() {
    let env = ground_or_skip!(my_env(
        "a_table_dropped_before_the_copy_reaches_it_stops_naming_it"
    ));
    let _globals = SERVER_GLOBALS.read().await;
    let name = unique("mycpdrop");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(&mut c, &small_table("a_big", 2000)).await;
    my_exec(&mut c, &small_table("z_gone", 100)).await;
    p.env_vars
        .push(("CDCD_PAUSEPOINT".into(), "mysql-copy-table:1500".into()));
    p.start();
    wait_output(&mut p, "pause point", Duration::from_secs(120)).await;
    my_exec(&mut c, "DROP TABLE z_gone").await;
    let st = p
        .wait_exit(Duration::from_secs(120))
        .await
        .expect("cdcd did not stop");
    assert!(!st.success(), "{st}");
    let out = p.output();
    let stop = out
        .lines()
        .rfind(|l| l.contains("ERROR"))
        .unwrap_or_else(|| panic!("no error line:\n{out}"));
    assert!(
        stop.contains(".z_gone: dropped or renamed after the copy's snapshot")
            && stop.contains("Remove it from source.tables"),
        "{stop}"
    );
    p.assert_equal("a_big", 60).await;
}
