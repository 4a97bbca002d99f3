//! Issue 38 on MariaDB: `deletes = "soft"` with `binlog_row_image = MINIMAL` (a delete's image
//! is the key only, an update's after image only the changed columns), so each flagged row's
//! values come from the lake's row; a key inserted again is live again; a key change flags the
//! old key. `row_metadata`: each row's `_cdc_position` holds the GTID of the transaction that
//! last wrote it and `_cdc_commit_ts` its time (the binlog's, in seconds). Read back by DuckDB and
//! pyiceberg.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use mysql_async::prelude::Queryable;

use crate::support::mysql::{my_connect, my_env, my_exec, MyPipeline};
use crate::support::{append_table_settings, unique, LAKECHECK};

/// lakecheck on `<db>.<table>` with `extra` arguments: exit code and output.
fn lakecheck(p: &MyPipeline, table: &str, extra: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(&p.env.python)
        .arg(LAKECHECK)
        .args(["--source", &p.env.url_for(&p.db)])
        .args(["--source-table", &format!("{}.{table}", p.db)])
        .arg("--iceberg")
        .arg(p.table_dir(table))
        .args(extra)
        .output()
        .unwrap();
    (out.status.code(), crate::support::stderr_then_stdout(&out))
}

/// The lake rows of `table` by `id` (`reader`: duckdb | pyiceberg).
fn rows(p: &MyPipeline, table: &str, reader: &str) -> BTreeMap<i64, serde_json::Value> {
    let (_, out) = lakecheck(p, table, &["--reader", reader, "--dump"]);
    let mut rows = BTreeMap::new();
    for line in out.lines().filter(|l| l.starts_with('{')) {
        let r: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let id = r["id"].as_i64().unwrap();
        assert!(
            rows.insert(id, r).is_none(),
            "{reader}: id {id} twice:\n{out}"
        );
    }
    rows
}

/// Creates `t` (ids 1 to 30, a 100-byte `body`), checks the config, starts cdcd and waits for the
/// copy; returns a connection whose session writes `binlog_row_image = MINIMAL`.
pub async fn start_on_thirty_rows(p: &mut MyPipeline) -> mysql_async::Conn {
    let mut c = my_connect(&p.env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, name VARCHAR(20), n INT, body TEXT);
         INSERT INTO t SELECT seq, CONCAT('n', seq), seq, REPEAT('b', 100) FROM seq_1_to_30",
    )
    .await;
    let (code, out) = p.check();
    assert_eq!(code, Some(0), "cdcd check:\n{out}");
    p.start();
    p.assert_equal("t", 120).await;
    my_exec(&mut c, "SET SESSION binlog_row_image = 'MINIMAL'").await;
    c
}

/// Soft-deletes 2, then moves 1 onto 2 (a commit of its own) and, in one transaction,
/// soft-deletes 4 and moves 3 onto it; `live` compares the table's live rows with the source
/// (lakecheck `--live`) after each step.
pub async fn move_keys_onto_soft_deleted_ones(
    c: &mut mysql_async::Conn,
    live: impl Fn() -> (Option<i32>, String),
) {
    my_exec(c, "DELETE FROM t WHERE id = 2").await;
    let (code, out) = live();
    assert_eq!(code, Some(0), "lakecheck --live:\n{out}");
    my_exec(c, "UPDATE t SET id = 2 WHERE id = 1").await;
    my_exec(
        c,
        "BEGIN; DELETE FROM t WHERE id = 4; UPDATE t SET id = 4 WHERE id = 3; COMMIT",
    )
    .await;
    let (code, out) = live();
    assert_eq!(code, Some(0), "lakecheck --live:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_soft_deletes_keep_flagged_rows_with_their_values() {
    let env = ground_or_skip!(my_env(
        "mysql_soft_deletes_keep_flagged_rows_with_their_values"
    ));
    let name = unique("mysoft");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    append_table_settings(
        &p.config,
        &format!("{name}.t"),
        "deletes = \"soft\"\nrow_metadata = true\n",
    );
    let mut c = start_on_thirty_rows(&mut p).await;
    // Per transaction: the ids it writes, its GTID, and the wall clock around it.
    let mut txs: Vec<(Vec<i64>, String, i64, i64)> = Vec::new();
    for (ids, sql) in [
        (vec![5], "UPDATE t SET n = 55 WHERE id = 5"),
        (vec![2, 5], "DELETE FROM t WHERE id IN (2, 5)"),
        (vec![3], "DELETE FROM t WHERE id = 3"),
        (vec![3], "INSERT INTO t VALUES (3, 'again', 3, NULL)"),
        (vec![4, 104], "UPDATE t SET id = 104 WHERE id = 4"),
        (vec![1], "UPDATE t SET name = 'u1' WHERE id = 1"),
    ] {
        let before = chrono::Utc::now().timestamp();
        my_exec(&mut c, sql).await;
        let after = chrono::Utc::now().timestamp();
        let gtid: Option<String> = c.query_first("SELECT @@last_gtid").await.unwrap();
        txs.push((ids, gtid.unwrap_or_default(), before, after));
    }
    let mut last: BTreeMap<i64, (String, i64, i64)> = BTreeMap::new();
    for (ids, gtid, before, after) in &txs {
        for id in ids {
            last.insert(*id, (gtid.clone(), *before, *after));
        }
    }

    for reader in ["duckdb", "pyiceberg"] {
        let (code, out) = lakecheck(&p, "t", &["--reader", reader, "--live", "--wait", "120"]);
        assert_eq!(code, Some(0), "lakecheck --live ({reader}):\n{out}");
        let all = rows(&p, "t", reader);
        assert_eq!(all.len(), 31, "{reader}: 30 keys and 104");
        for (id, deleted) in [
            (1, false),
            (2, true),
            (3, false),
            (4, true),
            (5, true),
            (6, false),
            (104, false),
        ] {
            assert_eq!(all[&id]["_cdc_deleted"], deleted, "{reader}: {}", all[&id]);
        }
        assert_eq!(
            all[&5]["n"], 55,
            "{reader}: a key-only delete keeps the row's values"
        );
        assert_eq!(
            all[&5]["body"].as_str().map(str::len),
            Some(100),
            "{reader}"
        );
        assert_eq!(all[&2]["name"], "n2", "{reader}");
        assert_eq!(all[&4]["name"], "n4", "{reader}");
        assert_eq!(
            all[&104]["name"], "n4",
            "{reader}: completed from the old key's row"
        );
        assert_eq!(all[&3]["name"], "again", "{reader}");
        for (id, (gtid, before, after)) in &last {
            let r = &all[id];
            let position = r["_cdc_position"].as_str().unwrap_or_default();
            assert!(
                !gtid.is_empty() && position.split(',').any(|g| g == gtid),
                "{reader}: id {id}: position {position:?} lacks its transaction's GTID {gtid}"
            );
            let ts = r["_cdc_commit_ts"]
                .as_str()
                .unwrap_or_else(|| panic!("{reader}: {r}"));
            let secs = chrono::DateTime::parse_from_str(ts, "%Y-%m-%d %H:%M:%S%.f%#z")
                .unwrap_or_else(|e| panic!("{e}: {ts}"))
                .timestamp();
            assert!(
                (*before..=*after).contains(&secs),
                "{reader}: id {id}: commit time {ts} outside its transaction's [{before}, {after}]"
            );
        }
    }
    p.stop(Duration::from_secs(60)).await;
}

/// Soft deletes with `changelog = true`: a key change onto a key that holds a flagged row
/// replaces that row, so the changelog (read by DuckDB) has `update_before` of the flagged row
/// and `update_after` of the new one, and the old key, whose row stays flagged, has nothing
/// after its own soft delete: replayed key by key in `_cdc_seq` order it gives the table's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_change_onto_a_soft_deleted_key_is_an_update_in_the_changelog() {
    let env = ground_or_skip!(my_env(
        "a_key_change_onto_a_soft_deleted_key_is_an_update_in_the_changelog"
    ));
    let name = unique("mysoftchl");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    append_table_settings(
        &p.config,
        &format!("{name}.t"),
        "deletes = \"soft\"\nchangelog = true\n",
    );
    let mut c = start_on_thirty_rows(&mut p).await;
    move_keys_onto_soft_deleted_ones(&mut c, || lakecheck(&p, "t", &["--live", "--wait", "120"]))
        .await;
    p.stop(Duration::from_secs(60)).await;
    let out = Command::new(&p.env.python)
        .arg(LAKECHECK)
        .arg("--iceberg")
        .arg(p.table_dir("t_changelog"))
        .arg("--dump")
        .output()
        .unwrap();
    let text = crate::support::stderr_then_stdout(&out);
    let mut log: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    log.sort_by_key(|r| r["_cdc_seq"].as_i64());
    let of_key = |id: i64| -> Vec<String> {
        log.iter()
            .filter(|r| r["id"] == id)
            .map(|r| format!("{} {} {}", r["_cdc_op"], r["_cdc_deleted"], r["name"]))
            .map(|s| s.replace('"', ""))
            .collect()
    };
    let flag =
        |name: &str| ["update_before false", "update_after true"].map(|s| format!("{s} {name}"));
    assert_eq!(
        of_key(1),
        flag("n1"),
        "the old key: its soft delete only\n{text}"
    );
    assert_eq!(
        of_key(3),
        flag("n3"),
        "the old key: its soft delete only\n{text}"
    );
    for (id, from) in [(2, "n1"), (4, "n3")] {
        let mut want = flag(&format!("n{id}")).to_vec();
        want.push(format!("update_before true n{id}"));
        want.push(format!("update_after false {from}"));
        assert_eq!(of_key(id), want, "the key moved onto\n{text}");
    }
    let table = rows(&p, "t", "duckdb");
    assert_eq!(table[&1]["_cdc_deleted"], true);
    assert_eq!(table[&2]["name"], "n1");
    assert_eq!(table[&4]["name"], "n3");
}
