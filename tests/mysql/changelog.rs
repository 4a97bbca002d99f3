//! Issue 38 on MariaDB: the Iceberg changelog table of a table whose updates arrive as MINIMAL row
//! images (the before image holds the key only, the after image the changed columns): replayed
//! in `_cdc_seq` order onto the initial copy it gives the source table, each change once, every
//! row naming its transaction by GTID.

use std::time::Duration;

use crate::postgres::changelog::{replayed, ROWS};
use crate::support::current_metadata;
use crate::support::mysql::{my_connect, my_env, my_exec, MyPipeline};
use crate::support::{append_table_settings, unique};

#[tokio::test]
async fn minimal_images_replay_to_the_source() {
    let env = ground_or_skip!(my_env("minimal_images_replay_to_the_source"));
    let name = unique("mychl");
    let p = MyPipeline::new(&env, &name, "initial", "").await;
    append_table_settings(&p.config, &format!("{name}.t"), "changelog = true\n");
    let mut p = p;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE t (id INT PRIMARY KEY, v INT, body TEXT);
         INSERT INTO t SELECT seq, seq, REPEAT(MD5(seq), 40) FROM seq_1_to_20",
    )
    .await;
    p.start();
    p.assert_equal("t", 120).await;
    let copy = current_metadata(&p.table_dir("t"))["current-snapshot-id"].to_string();
    my_exec(
        &mut c,
        "SET SESSION binlog_row_image = 'MINIMAL';
         INSERT INTO t SELECT seq, seq, CONCAT('new ', seq) FROM seq_21_to_25;
         UPDATE t SET v = v + 100 WHERE id BETWEEN 1 AND 5;
         UPDATE t SET id = 106, v = -6 WHERE id = 6;
         DELETE FROM t WHERE id IN (7, 8);
         START TRANSACTION;
         INSERT INTO t VALUES (26, 1, 'x');
         UPDATE t SET v = 2 WHERE id = 26;
         DELETE FROM t WHERE id = 26;
         COMMIT",
    )
    .await;
    p.assert_equal("t", 120).await;
    let out = replayed(
        &env.python,
        &env.url_for(&p.db),
        &format!("{name}.t"),
        &p.table_dir("t"),
        &p.table_dir("t_changelog"),
        &copy,
    );
    assert_eq!(out, ROWS);
    p.stop(Duration::from_secs(60)).await;
}
