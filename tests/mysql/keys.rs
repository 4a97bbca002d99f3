//! End to end, a MariaDB table without a primary key keyed by `source.key_columns` (issue 23):
//! copied, then updated (the key too) and deleted, and equal to the source as read by DuckDB
//! (Iceberg) and pypaimon (Paimon); `cdcd check` shows the key and where it came from, and a
//! `key_columns` entry naming a nullable column is refused. A MINIMAL before image that leaves
//! the key out (MariaDB logs only a unique NOT NULL index's columns then) stops cdcd instead of
//! guessing the row.

use crate::support::mysql::{my_connect, my_env, my_env_and_name, my_exec, MyEnv, MyPipeline};
use crate::support::unique;

async fn key_columns_replicate(env: MyEnv, lsm: bool) {
    let name = unique(if lsm { "mykeysl" } else { "mykeysi" });
    // Small chunks: the copy walks the user's key in ranges.
    let extra = format!(
        "key_columns = {{ \"{name}.ev\" = [\"tenant\", \"event\"] }}\nsnapshot_chunk_rows = 300"
    );
    let mut p = MyPipeline::new(&env, &name, "initial", &extra).await;
    if lsm {
        p.use_lsm(2, "initial", &extra);
    }
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE ev (note VARCHAR(40), tenant INT NOT NULL, event BIGINT NOT NULL, body TEXT);
         INSERT INTO ev SELECT IF(seq % 3 = 0, NULL, CONCAT('n', seq)), seq % 5, seq, REPEAT('b', seq % 50)
           FROM seq_1_to_2000",
    )
    .await;
    let (code, out) = p.check();
    assert_eq!(code, Some(0), "cdcd check:\n{out}");
    let line = format!("table {name}.ev: key (tenant, event) from source.key_columns");
    assert!(out.contains(&line), "cdcd check lacks {line:?}:\n{out}");

    p.start();
    p.assert_equal("ev", 120).await;
    my_exec(
        &mut c,
        "UPDATE ev SET note = 'changed' WHERE event % 10 = 0;
         UPDATE ev SET event = event + 100000 WHERE event % 13 = 0;
         UPDATE ev SET tenant = 99, body = NULL WHERE event % 17 = 0;
         DELETE FROM ev WHERE event % 19 = 0;
         START TRANSACTION;
         DELETE FROM ev WHERE event = 2;
         INSERT INTO ev VALUES ('reinserted', 2, 2, 'x');
         UPDATE ev SET event = 9000001 WHERE event = 1;
         COMMIT",
    )
    .await;
    p.assert_equal("ev", 120).await;
    p.stop(std::time::Duration::from_secs(60)).await;

    // A nullable key column cannot identify a row.
    p.write_config(
        "initial",
        &format!("key_columns = {{ \"{name}.ev\" = [\"tenant\", \"note\"] }}"),
    );
    let (code, out) = p.check();
    assert_ne!(code, Some(0), "check passed a nullable key column:\n{out}");
    assert!(
        out.contains("column note") && out.contains("NOT NULL"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_key_columns_iceberg() {
    let env = ground_or_skip!(my_env("mysql_key_columns_iceberg"));
    key_columns_replicate(env, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_key_columns_lsm() {
    let env = ground_or_skip!(my_env("mysql_key_columns_lsm"));
    key_columns_replicate(env, true).await;
}

/// MariaDB's MINIMAL image of a table without a primary key but with a unique NOT NULL index logs
/// only that index's columns in the before image (checked with mariadb-binlog), so rows keyed by
/// other `key_columns` cannot be found: cdcd must stop, naming the column and the setting, and
/// must not commit the update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_minimal_image_without_the_key_stops() {
    let (env, name) = ground_or_skip!(my_env_and_name("mykeysm"));
    let extra = format!("key_columns = {{ \"{name}.ev\" = [\"tenant\", \"event\"] }}");
    let mut p = MyPipeline::new(&env, &name, "initial", &extra).await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE ev (tenant INT NOT NULL, event INT NOT NULL, u INT NOT NULL, note TEXT, UNIQUE KEY (u));
         INSERT INTO ev SELECT seq % 3, seq, seq, 'a' FROM seq_1_to_100",
    )
    .await;
    p.start();
    p.assert_equal("ev", 120).await;
    let before = p.position("ev");
    my_exec(
        &mut c,
        "SET SESSION binlog_row_image = 'MINIMAL'; UPDATE ev SET note = 'b' WHERE u = 7",
    )
    .await;
    let status = p
        .wait_exit(std::time::Duration::from_secs(60))
        .await
        .unwrap_or_else(|| {
            panic!(
                "cdcd went on after a before image without its key:\n{}",
                p.output()
            )
        });
    assert!(!status.success(), "cdcd exited 0:\n{}", p.output());
    let out = p.output();
    assert!(
        out.contains("leaves out key column tenant") && out.contains("binlog_row_image = 'FULL'"),
        "{out}"
    );
    assert_eq!(p.position("ev"), before, "the update was committed");
}

/// A MariaDB table with no key at all (issue 23) is an append table: its copied and streamed
/// rows, duplicates included, equal the source as a multiset (DuckDB), a TRUNCATE empties it;
/// an UPDATE is applied to one equal row on Iceberg, and stops cdcd naming the table on the lsm
/// sink, which cannot apply it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_keyless_table_is_insert_only_iceberg() {
    if let Some(env) = my_env("mysql_keyless_table_is_insert_only_iceberg") {
        keyless_insert_only(env, false).await;
    }
}

/// The same on the `lsm` sink: a Paimon append table, read back by pypaimon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_keyless_table_is_insert_only_lsm() {
    if let Some(env) = my_env("mysql_keyless_table_is_insert_only_lsm") {
        keyless_insert_only(env, true).await;
    }
}

async fn keyless_insert_only(env: MyEnv, lsm: bool) {
    let name = unique(if lsm { "mykeylessl" } else { "mykeyless" });
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    if lsm {
        p.use_lsm(2, "initial", "");
    }
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE log (tid INT, delta INT, note VARCHAR(20));
         INSERT INTO log SELECT seq % 10, seq % 3, 'copied' FROM seq_1_to_2000",
    )
    .await;
    let (code, out) = p.check();
    assert_eq!(code, Some(0), "cdcd check:\n{out}");
    let line = format!("table {name}.log: no key");
    assert!(out.contains(&line), "cdcd check lacks {line:?}:\n{out}");

    p.start();
    p.assert_equal("log", 120).await;
    my_exec(
        &mut c,
        "INSERT INTO log SELECT seq % 10, seq % 3, 'streamed' FROM seq_1_to_500;
         INSERT INTO log VALUES (1, 1, 'twice'), (1, 1, 'twice')",
    )
    .await;
    p.assert_equal("log", 120).await;
    my_exec(
        &mut c,
        "TRUNCATE log; INSERT INTO log VALUES (2, 2, 'after'), (2, 2, 'after')",
    )
    .await;
    p.assert_equal("log", 120).await;

    my_exec(&mut c, "UPDATE log SET note = 'x' LIMIT 1").await;
    if !lsm {
        // Iceberg applies it to one of the equal rows (a multiset, tests/mysql/multiset.rs).
        p.assert_equal("log", 120).await;
        return;
    }
    let status = p.wait_exit(std::time::Duration::from_secs(60)).await;
    assert!(
        status.is_some_and(|s| !s.success()),
        "cdcd kept running after an UPDATE of a keyless table"
    );
    let out = p.output();
    assert!(
        out.contains(&format!("{name}.log")) && out.contains("insert-only"),
        "{out}"
    );
}
