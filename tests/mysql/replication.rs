//! End to end, MariaDB 10.11 → cdcd → Iceberg: every mapped type, FULL / MINIMAL / NOBLOB row
//! images, inserts, updates, deletes, primary-key changes, multi-table transactions, the initial
//! snapshot, resume after kill -9, DDL handling and `cdcd check`; on a private server, restarts
//! after the binlogs are purged or reset.
//!
//! The oracle is `tests/support/lakecheck.py --source mysql://…` (DuckDB reading the lake, pymysql
//! reading the source). Needs the test bed (`scripts/testbed.sh`, component `mariadb`); without
//! `CDCD_TEST_MYSQL` each test prints a note and passes.

use std::time::Duration;

use crate::support::mysql::{
    my_connect, my_env, my_exec, writes_through_kills, MyPipeline, PrivateMaria,
};
use crate::support::unique;

/// `check_names_statement_binlog_format` flips a server-global setting: the other tests of this
/// binary hold the read side so no cdcd of theirs starts while it is flipped.
pub(super) static SERVER_GLOBALS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn create_types(t: &str) -> String {
    format!(
        "CREATE TABLE {t} (
           id BIGINT PRIMARY KEY,
           ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
           mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
           d DECIMAL(12,3), f FLOAT, db DOUBLE, bt BIT(10),
           dt DATE, tm TIME(3), dtm DATETIME(6), ts TIMESTAMP(6) NULL, yr YEAR,
           c CHAR(5), vc VARCHAR(50), tx TEXT, l1 VARCHAR(20) CHARACTER SET latin1,
           bn BINARY(4), vb VARBINARY(20), bl BLOB,
           j JSON, e ENUM('sad','ok','happy'), st SET('a','b','c'), g GEOMETRY
         ) DEFAULT CHARSET = utf8mb4"
    )
}

fn edge_rows(t: &str) -> String {
    format!(
        r#"INSERT INTO {t} VALUES
 (1, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295, -9223372036854775808,
  18446744073709551615, -123456789.123, 1.5, 3.141592653589793, b'1010101010',
  '1999-12-31', '23:59:59.999', '2024-02-29 12:34:56.789012', '2038-01-19 03:14:07.499999', 2155,
  'ab', 'héllo ✓ "q" \\ back', 'long text ünï 😀', 'café', 'ab', x'00ff10', x'deadbeef',
  '{{"a": [1, 2.5, null], "b": "x"}}', 'happy', 'a,c', ST_GeomFromText('POLYGON((0 0,1 0,1 1,0 0))')),
 (2, 127, 0, 32767, 0, 8388607, 0, 2147483647, 0, 9223372036854775807, 0, 0.001, -0.0, -1e300,
  b'0', '1000-01-01', '00:00:00', '1000-01-01 00:00:00', '1970-01-01 00:00:01', 1901,
  '', '', '', '', x'', x'', x'', '[]', 'sad', '', ST_GeomFromText('POINT(1.5 -2)')),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
 INSERT INTO {t} (id, i, vc, tx, j, e, st, dtm, ts)
 SELECT 100 + seq, seq * 7, CONCAT('vc', seq), REPEAT('x', seq), JSON_OBJECT('g', seq),
        ELT(1 + seq % 3, 'sad', 'ok', 'happy'), IF(seq % 2 = 0, 'b', 'a,b,c'),
        TIMESTAMP('2020-01-01') + INTERVAL seq HOUR, TIMESTAMP('2021-01-01') + INTERVAL seq SECOND
 FROM seq_1_to_100"#
    )
}

/// The same kinds of change, to run under each row image.
fn changes(t: &str, o: &str, base: i64) -> String {
    format!(
        "UPDATE {t} SET ti = 0, vc = 'upd' WHERE id IN (1, 2);
         UPDATE {t} SET g = ST_GeomFromText('LINESTRING(0 0,3 4)') WHERE id = 2;
         UPDATE {t} SET tx = NULL, j = NULL, e = NULL WHERE id = 1;
         UPDATE {t} SET d = d * 2 WHERE id BETWEEN 100 AND 149;
         DELETE FROM {t} WHERE id IN (150, 151);
         INSERT INTO {t} (id, vc) VALUES ({n1}, 'new');
         UPDATE {t} SET id = {n2} WHERE id = {n1};
         BEGIN;
           INSERT INTO {o} VALUES ({n1}, 'o1'), ({n3}, 'o2');
           UPDATE {t} SET vc = 'two-table' WHERE id = 3;
           DELETE FROM {o} WHERE id = {n3};
           UPDATE {o} SET id = {n4} WHERE id = {n1};
         COMMIT",
        n1 = base + 1,
        n2 = base + 2,
        n3 = base + 3,
        n4 = base + 4,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_and_row_image_replicates() {
    let env = ground_or_skip!(my_env("every_type_and_row_image_replicates"));
    let _globals = SERVER_GLOBALS.read().await;
    let name = unique("myev");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(&mut c, &create_types("types")).await;
    my_exec(
        &mut c,
        "CREATE TABLE other (id INT PRIMARY KEY, v VARCHAR(20))",
    )
    .await;
    // Rows before cdcd starts come through the initial snapshot.
    my_exec(&mut c, &edge_rows("types")).await;
    p.start();
    p.assert_equal("types", 120).await;

    my_exec(&mut c, &changes("types", "other", 1000)).await;
    my_exec(&mut c, "SET SESSION binlog_row_image = 'MINIMAL'").await;
    my_exec(&mut c, &changes("types", "other", 2000)).await;
    my_exec(
        &mut c,
        "INSERT INTO types (id, vc) VALUES (3000, 'minimal insert')",
    )
    .await;
    my_exec(&mut c, "SET SESSION binlog_row_image = 'NOBLOB'").await;
    my_exec(&mut c, &changes("types", "other", 4000)).await;
    my_exec(&mut c, "UPDATE types SET i = 5 WHERE id = 1").await;
    my_exec(&mut c, "SET SESSION binlog_row_image = 'FULL'").await;
    p.assert_equal("types", 120).await;
    p.assert_equal("other", 60).await;
    let pos = p.position("types");
    assert!(
        pos.contains("cdcd.position=0-1-"),
        "MariaDB GTID position: {pos}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_exactly_after_kill9() {
    let env = ground_or_skip!(my_env("resumes_exactly_after_kill9"));
    let _globals = SERVER_GLOBALS.read().await;
    let name = unique("mykill");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    writes_through_kills(&mut p, &mut c, "resumes_exactly_after_kill9", 20).await;
    p.start();
    p.assert_equal("acct", 120).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_replicates_and_alter_stops_with_the_statement() {
    let env = ground_or_skip!(my_env(
        "truncate_replicates_and_alter_stops_with_the_statement"
    ));
    let _globals = SERVER_GLOBALS.read().await;
    let name = unique("myddl");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(&mut c, "CREATE TABLE t (id INT PRIMARY KEY, v INT)").await;
    my_exec(&mut c, "INSERT INTO t VALUES (1, 1), (2, 2)").await;
    p.start();
    p.assert_equal("t", 60).await;
    my_exec(&mut c, "TRUNCATE TABLE t").await;
    my_exec(&mut c, "INSERT INTO t VALUES (3, 3)").await;
    p.assert_equal("t", 60).await;
    my_exec(&mut c, "ALTER TABLE t ADD COLUMN w INT NOT NULL").await;
    let out = p
        .assert_stops(Duration::from_secs(30), "cdcd must stop")
        .await;
    assert!(
        out.contains("ALTER TABLE t ADD COLUMN w INT NOT NULL"),
        "error names the statement:\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_statement_binlog_format() {
    let env = ground_or_skip!(my_env("check_names_statement_binlog_format"));
    let _globals = SERVER_GLOBALS.write().await;
    let name = unique("mychk");
    let p = MyPipeline::new(&env, &name, "never", "").await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(&mut c, "CREATE TABLE t (id INT PRIMARY KEY)").await;
    let (code, out) = p.check();
    assert_eq!(code, Some(0), "a ready server passes:\n{out}");
    // Global, so cdcd's new session sees it; restored at once (only new sessions pick it up).
    my_exec(&mut c, "SET GLOBAL binlog_format = 'STATEMENT'").await;
    let (code, out) = p.check();
    my_exec(&mut c, "SET GLOBAL binlog_format = 'ROW'").await;
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains("global binlog_format is STATEMENT, not ROW")
            && out.contains("SET GLOBAL binlog_format = 'ROW'"),
        "{out}"
    );
}

/// The output of cdcd's `n`th start (1-based) and after.
fn output_from_start(p: &MyPipeline, n: u32) -> String {
    let out = p.output();
    let marker = format!("===== cdcd start #{n} =====");
    out.split_once(&marker)
        .map(|(_, rest)| rest.to_owned())
        .unwrap_or_default()
}

/// Issue 17 part 2: a table nobody writes must not pin the restart point. Its checkpoint stays at
/// the initial copy while the other table moves on; once the binlogs holding that checkpoint are
/// purged, cdcd still resumes (from the pipeline's stored progress), copies nothing again, and
/// both tables stay equal to the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_table_does_not_pin_the_restart_after_binlogs_are_purged() {
    let test = "idle_table_does_not_pin_the_restart_after_binlogs_are_purged";
    let mut server = ground_or_skip!(PrivateMaria::start(test).await);
    let name = unique("myidle");
    let mut p = MyPipeline::new(&server.env, &name, "initial", "").await;
    let mut c = my_connect(&server.env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE busy (id INT PRIMARY KEY, v VARCHAR(20));
         CREATE TABLE idle (id INT PRIMARY KEY, v VARCHAR(20));
         INSERT INTO busy VALUES (1, 'b1');
         INSERT INTO idle VALUES (1, 'i1'), (2, 'i2')",
    )
    .await;
    p.start();
    p.assert_equal("busy", 120).await;
    p.assert_equal("idle", 60).await;
    let idle_at = p.position("idle");
    for i in 2..=30 {
        my_exec(&mut c, &format!("INSERT INTO busy VALUES ({i}, 'b{i}')")).await;
    }
    my_exec(&mut c, "UPDATE busy SET v = 'changed' WHERE id <= 10").await;
    my_exec(&mut c, "FLUSH BINARY LOGS").await;
    p.assert_equal("busy", 60).await;
    p.stop(Duration::from_secs(30)).await;
    assert_eq!(p.position("idle"), idle_at, "nobody wrote the idle table");
    let before = server.binlogs();
    // PURGE … BEFORE compares file times at one-second resolution.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server
        .root_sql("PURGE BINARY LOGS BEFORE NOW()")
        .unwrap_or_else(|e| panic!("PURGE BINARY LOGS: {e}"));
    let after = server.binlogs();
    assert!(
        before.len() > 1 && after.len() == 1 && !after.contains(&before[0]),
        "only the binlog opened by FLUSH is left: {before:?} -> {after:?}"
    );

    p.start();
    my_exec(
        &mut c,
        "INSERT INTO busy VALUES (100, 'after');
         UPDATE idle SET v = 'woke' WHERE id = 1;
         INSERT INTO idle VALUES (3, 'i3')",
    )
    .await;
    p.assert_equal("busy", 120).await;
    p.assert_equal("idle", 60).await;
    let second = output_from_start(&p, 2);
    assert!(
        !second.contains("initial copy") && !second.contains("copying a table"),
        "nothing is copied again:\n{second}"
    );
    assert!(
        p.warehouse
            .join("_cdcd")
            .join(&p.name)
            .join("progress.json")
            .exists(),
        "the pipeline progress lives under <warehouse>/_cdcd/<pipeline>/"
    );
}

/// Issue 17 part 4: a copy taken on a fresh binlog (`RESET MASTER`: an empty GTID state) commits a
/// checkpoint that the next start reads back; streaming resumes from the empty state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_of_an_empty_gtid_state_reads_back() {
    let test = "checkpoint_of_an_empty_gtid_state_reads_back";
    let mut server = ground_or_skip!(PrivateMaria::start(test).await);
    let name = unique("myreset");
    let mut p = MyPipeline::new(&server.env, &name, "initial", "").await;
    let mut c = my_connect(&server.env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20));
         INSERT INTO t VALUES (1, 'a'), (2, 'b')",
    )
    .await;
    server
        .root_sql("RESET MASTER")
        .unwrap_or_else(|e| panic!("RESET MASTER: {e}"));
    let gtid = server.root_sql("SELECT @@GLOBAL.gtid_binlog_pos").unwrap();
    assert_eq!(gtid.trim(), "", "RESET MASTER empties the GTID state");
    p.start();
    p.assert_equal("t", 120).await;
    p.stop(Duration::from_secs(30)).await;
    let at = p.position("t");
    assert!(
        at.contains("cdcd.position=empty-gtid-list"),
        "the empty state has its own text: {at}"
    );
    p.start();
    my_exec(
        &mut c,
        "INSERT INTO t VALUES (3, 'c'); UPDATE t SET v = 'z' WHERE id = 1; DELETE FROM t WHERE id = 2",
    )
    .await;
    p.assert_equal("t", 120).await;
    let second = output_from_start(&p, 2);
    assert!(
        !second.contains("initial copy"),
        "the checkpoint was read back, nothing copied again:\n{second}"
    );
}
