//! `ALTER TABLE` on MariaDB while cdcd streams into Iceberg (issue 20): added columns and widened
//! types evolve the lake's table; a DDL made while cdcd is down is replayed onto the columns the
//! schema history records at the restart position (information_schema already shows the newer
//! table); columns added with a constant default read it in older rows (Iceberg v3
//! initial-default); a dropped column leaves the schema; a renamed column keeps its field id and
//! values; a change the lake cannot follow stops cdcd naming the statement. Read back by DuckDB.

use std::time::Duration;

use super::replication::SERVER_GLOBALS;
use crate::support::mysql::{my_connect, my_env, my_exec, MyPipeline};
use crate::support::{current_fields, current_metadata, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alter_table_evolves_the_lake_and_restarts_replay_it_exactly() {
    let test = "alter_table_evolves_the_lake_and_restarts_replay_it_exactly";
    let env = ground_or_skip!(my_env(test));
    let _globals = SERVER_GLOBALS.read().await;
    let name = unique("myalter");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE t (id INT PRIMARY KEY, v INT, s VARCHAR(10)) DEFAULT CHARSET = utf8mb4;
         CREATE TABLE quiet (id INT PRIMARY KEY, v SMALLINT);
         INSERT INTO t VALUES (1, 1, 'a'), (2, 2, 'b');
         INSERT INTO quiet VALUES (1, 1)",
    )
    .await;
    p.start();
    p.assert_equal("t", 60).await;
    p.assert_equal("quiet", 60).await;

    // While streaming: an added column, rows using it, then widenings in one statement.
    my_exec(
        &mut c,
        "ALTER TABLE t ADD COLUMN w INT NULL, ADD INDEX v_ix (v);
         INSERT INTO t VALUES (3, 3, 'c', 30);
         UPDATE t SET w = 7 WHERE id = 1;
         ALTER TABLE t MODIFY v BIGINT, MODIFY s VARCHAR(200);
         INSERT INTO t VALUES (4, 5000000000, 'a string longer than ten', NULL);
         UPDATE t SET v = 6000000000 WHERE id = 2",
    )
    .await;
    p.assert_equal("t", 60).await;

    // While cdcd is down: DDL and rows on both tables. information_schema now shows the newest
    // shape; the restart re-reads from before the DDL and must decode the older rows with the
    // columns in force there.
    p.kill9();
    my_exec(
        &mut c,
        "INSERT INTO quiet VALUES (2, 2);
         INSERT INTO t VALUES (5, 5, 'before x', 50);
         ALTER TABLE quiet MODIFY v INT;
         ALTER TABLE t ADD COLUMN x VARCHAR(20);
         INSERT INTO quiet VALUES (3, 100000);
         INSERT INTO t VALUES (6, 6, 'after x', 60, 'x6');
         UPDATE t SET x = 'x1' WHERE id = 1",
    )
    .await;
    p.start();
    p.assert_equal("t", 60).await;
    p.assert_equal("quiet", 60).await;
    let out = p.output();
    assert!(
        out.contains("a DDL after the start position is replayed"),
        "the restart decoded with the recorded columns:\n{out}"
    );

    // A restart in the middle again, after the DDL was applied and recorded: nothing changes.
    p.kill9();
    p.start();
    my_exec(&mut c, "INSERT INTO t VALUES (7, 7, 'g', 70, 'x7')").await;
    p.assert_equal("t", 60).await;

    // Added with constant defaults: the source fills the existing rows, the lake stores the
    // defaults as the new fields' initial-default (DuckDB reads them for the older rows).
    my_exec(
        &mut c,
        "ALTER TABLE t ADD COLUMN k INT NOT NULL DEFAULT 5, ADD COLUMN ks VARCHAR(10) DEFAULT 'd''k';
         INSERT INTO t (id, v, s, k) VALUES (8, 8, 'h', 80);
         UPDATE t SET ks = 'set' WHERE id = 2",
    )
    .await;
    p.assert_equal("t", 60).await;
    p.kill9();
    p.start();
    my_exec(&mut c, "INSERT INTO t (id) VALUES (9)").await;
    p.assert_equal("t", 60).await;

    // DROP COLUMN: metadata only, the column leaves the lake's schema.
    my_exec(
        &mut c,
        "ALTER TABLE t DROP COLUMN w;
         INSERT INTO t (id, v) VALUES (10, 10);
         UPDATE t SET v = 11 WHERE id = 1",
    )
    .await;
    p.assert_equal("t", 60).await;

    // RENAME COLUMN and CHANGE old new: the lake's column keeps its field id and its values
    // under the new name (DuckDB reads older files by field id); rows before and after the
    // rename, and an update of an older row, which cdcd completes from the older file.
    my_exec(
        &mut c,
        "ALTER TABLE t RENAME COLUMN x TO y;
         UPDATE t SET y = 'y1' WHERE id = 1;
         INSERT INTO t (id, y) VALUES (11, 'y11');
         ALTER TABLE t CHANGE COLUMN v vv BIGINT;
         INSERT INTO t (id, vv) VALUES (12, 12);
         UPDATE t SET vv = 13 WHERE id = 6",
    )
    .await;
    p.assert_equal("t", 60).await;
    // A rename made while cdcd is down, and one in the same statement as an added column: the
    // restart replays them onto the recorded columns.
    p.kill9();
    my_exec(
        &mut c,
        "INSERT INTO t (id, s) VALUES (13, 'before s2');
         ALTER TABLE t RENAME COLUMN s TO s2, ADD COLUMN z INT;
         INSERT INTO t (id, s2, z) VALUES (14, 'after s2', 14);
         UPDATE t SET s2 = 'renamed' WHERE id = 2",
    )
    .await;
    p.start();
    p.assert_equal("t", 60).await;
    let fields = current_fields(&current_metadata(&p.table_dir("t")));
    let id_of = |name: &str| fields.iter().find(|f| f.0 == name).map(|f| f.1);
    assert_eq!(
        (id_of("vv"), id_of("s2")),
        (Some(2), Some(3)),
        "renamed columns keep their field ids: {fields:?}"
    );

    // What the lake cannot express stops cdcd, naming the statement.
    my_exec(&mut c, "ALTER TABLE t MODIFY vv VARCHAR(30)").await;
    let out = p
        .assert_stops(Duration::from_secs(30), "cdcd must stop")
        .await;
    assert!(
        out.contains("ALTER TABLE t MODIFY vv VARCHAR(30)") && out.contains("cannot follow"),
        "error names the statement and why:\n{out}"
    );
}
