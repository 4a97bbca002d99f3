//! End to end, MariaDB tables without a key under the (default) FULL row image as multisets
//! (issue 23): each update and delete rows event carries the whole before image, and cdcd
//! applies it to exactly one replica row equal to it — `DELETE … LIMIT 1` and `UPDATE … LIMIT 1`
//! of one of several duplicates, updates of every duplicate at once, a transaction mixing it
//! with a keyed table, a kill -9 while both are written, an ALTER TABLE ADD COLUMN between
//! deletes — in both Iceberg delete modes (deletion vectors; v2 position deletes, never equality
//! deletes), read back by DuckDB. MariaDB
//! logs whole images for a table without a primary key under MINIMAL and NOBLOB too, so those
//! sessions stay exact; an image that does leave a column out (MySQL 8's MINIMAL after image)
//! stops the assembler (unit test `keyless_updates_and_deletes_are_whole_row_changes`).

use std::time::Duration;

use crate::support::mysql::{my_connect, my_env, my_exec, MyEnv, MyPipeline};
use crate::support::table_files::assert_no_equality_deletes;
use crate::support::unique;

/// A round of single-duplicate changes and keyed writes in one transaction.
fn round(i: u32) -> String {
    let g = i % 4;
    format!(
        "START TRANSACTION;
         UPDATE bag SET note = 'r{i}' WHERE g = {g} LIMIT 1;
         DELETE FROM bag WHERE g = {} LIMIT 1;
         INSERT INTO bag VALUES ({g}, 'a', NULL), ({g}, 'a', NULL);
         INSERT INTO kv VALUES ({}, 'r{i}') ON DUPLICATE KEY UPDATE v = VALUES(v);
         COMMIT",
        (g + 1) % 4,
        1000 + i % 50
    )
}

async fn multiset(env: MyEnv, equality: bool) {
    let name = unique(if equality { "mymultie" } else { "mymulti" });
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    if equality {
        let text = std::fs::read_to_string(&p.config).unwrap();
        let text = text.replacen(
            "kind = \"iceberg\"",
            "kind = \"iceberg\"\ndelete_mode = \"equality\"",
            1,
        );
        std::fs::write(&p.config, text).unwrap();
    }
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE bag (g INT, note VARCHAR(20), body TEXT);
         CREATE TABLE kv (id INT PRIMARY KEY, v VARCHAR(20));
         INSERT INTO bag VALUES (1, 'a', NULL), (1, 'a', NULL), (1, 'a', NULL), (2, 'b', 'x'),
             (2, 'b', 'x'), (3, NULL, NULL), (3, NULL, NULL), (0, 'a', NULL);
         INSERT INTO kv SELECT seq, 'k' FROM seq_1_to_20",
    )
    .await;
    let (code, out) = p.check();
    assert_eq!(code, Some(0), "cdcd check:\n{out}");
    let line = format!("table {name}.bag: no key: full row identity (multiset)");
    assert!(out.contains(&line), "cdcd check lacks {line:?}:\n{out}");

    p.start();
    p.assert_equal("bag", 120).await;
    my_exec(
        &mut c,
        "UPDATE bag SET note = 'c' WHERE g = 1 LIMIT 1;
         DELETE FROM bag WHERE g = 2 LIMIT 1",
    )
    .await;
    p.assert_equal("bag", 120).await;
    my_exec(
        &mut c,
        "UPDATE bag SET note = 'z' WHERE g = 3;
         UPDATE bag SET note = 'a' WHERE note = 'c';
         START TRANSACTION;
         DELETE FROM bag WHERE g = 1 LIMIT 1;
         UPDATE kv SET v = 'tx' WHERE id <= 5;
         INSERT INTO bag VALUES (4, 'd', NULL), (4, 'd', NULL);
         DELETE FROM bag WHERE g = 4 LIMIT 1;
         DELETE FROM kv WHERE id = 6;
         COMMIT",
    )
    .await;
    p.assert_equal("bag", 120).await;
    p.assert_equal("kv", 60).await;

    // kill -9 while both tables are written, more writes while cdcd is down.
    let url = env.url_for(&p.db);
    let writer = tokio::spawn(async move {
        let mut c = my_connect(&url).await;
        for i in 0..60 {
            my_exec(&mut c, &round(i)).await;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(900)).await;
    p.kill9();
    writer.await.unwrap();
    for i in 60..70 {
        my_exec(&mut c, &round(i)).await;
    }
    p.start();
    p.assert_equal("bag", 120).await;
    p.assert_equal("kv", 60).await;

    // A column added while streaming (MariaDB ALTER TABLE, applied to the lake): the rows
    // written before it read NULL there, and so do the before images of their deletes.
    my_exec(
        &mut c,
        "ALTER TABLE bag ADD COLUMN extra INT;
         DELETE FROM bag WHERE g = 1 LIMIT 1;
         UPDATE bag SET extra = 5 WHERE g = 2 LIMIT 1;
         INSERT INTO bag VALUES (2, 'b', 'x', 5);
         DELETE FROM bag WHERE extra = 5 LIMIT 1",
    )
    .await;
    p.assert_equal("bag", 120).await;

    // MINIMAL and NOBLOB sessions: MariaDB 10.11 still logs both images whole for a table
    // without a primary key (checked with mariadb-binlog), so the changes stay exact. (MySQL 8
    // leaves unchanged columns out of a MINIMAL after image; the assembler then stops naming the
    // table and binlog_row_image, `keyless_updates_and_deletes_are_whole_row_changes`.)
    my_exec(
        &mut c,
        "SET SESSION binlog_row_image = 'MINIMAL';
         UPDATE bag SET note = 'm' WHERE g = 0 LIMIT 1;
         DELETE FROM bag WHERE g = 2 LIMIT 1;
         SET SESSION binlog_row_image = 'NOBLOB';
         UPDATE bag SET note = 'n' WHERE g = 0 LIMIT 1",
    )
    .await;
    p.assert_equal("bag", 120).await;
    assert_no_equality_deletes(&p.table_dir("bag"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_keyless_full_image_is_a_multiset() {
    if let Some(env) = my_env("mysql_keyless_full_image_is_a_multiset") {
        multiset(env, false).await;
    }
}

/// The same in the equality delete mode (format v2): the copies are removed by position deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_keyless_full_image_is_a_multiset_v2() {
    if let Some(env) = my_env("mysql_keyless_full_image_is_a_multiset_v2") {
        multiset(env, true).await;
    }
}
