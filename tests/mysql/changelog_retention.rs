//! Issue 38: `changelog_retention` on the Iceberg changelog table. MariaDB's `SET timestamp` dates
//! some transactions in 2020 (the binlog carries that commit time), so the changelog has an old
//! day partition; `cdcd maintain` drops it whole (a `delete` snapshot, no delete file), read back
//! by DuckDB; `_cdc_seq` then goes on above every value it gave before, through a kill -9.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::mysql::{my_connect, my_env, my_exec, MyPipeline};
use crate::support::{
    append_table_settings, current_metadata, output_ok, run_cdcd, unique, LAKECHECK,
};

/// The changelog's rows as read by DuckDB: one line `<seq> <day of _cdc_commit_ts> <op> <id>`
/// each, in `_cdc_seq` order.
const ROWS: &str = r#"
import os, sys
sys.path.insert(0, os.environ["LAKECHECK_DIR"])
import lakecheck as lc
lc.duck().execute("SET enable_progress_bar = false")
cols, rows = lc.read_duckdb(lc.locate_iceberg(sys.argv[1], []))
for r in sorted((dict(zip(cols, r)) for r in rows), key=lambda r: r["_cdc_seq"]):
    print("row", r["_cdc_seq"], r["_cdc_commit_ts"].strftime("%Y-%m-%d"), r["_cdc_op"], r["id"])
"#;

/// A changelog row: `_cdc_seq`, the day of `_cdc_commit_ts`, `_cdc_op`, the row's id.
type Row = (i64, String, String, i64);

fn changelog_rows(python: &str, changelog: &Path) -> Vec<Row> {
    let lakecheck_dir = Path::new(LAKECHECK).parent().unwrap().to_path_buf();
    let out = output_ok(
        Command::new(python)
            .env("LAKECHECK_DIR", lakecheck_dir)
            .arg("-c")
            .arg(ROWS)
            .arg(changelog),
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("row "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].parse().unwrap(),
                f[1].to_owned(),
                f[2].to_owned(),
                f[3].parse().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn retention_drops_old_days_whole_and_seq_never_repeats() {
    let env = ground_or_skip!(my_env(
        "retention_drops_old_days_whole_and_seq_never_repeats"
    ));
    let name = unique("mychr");
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    append_table_settings(
        &p.config,
        &format!("{name}.t"),
        "changelog = true\nchangelog_retention = \"30d\"\n",
    );
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE t (id INT PRIMARY KEY, v INT);
         INSERT INTO t SELECT seq, seq FROM seq_1_to_5",
    )
    .await;
    p.start();
    p.assert_equal("t", 120).await;
    // Two transactions committed "in 2020" (5 changelog rows), then two today (3 rows).
    my_exec(
        &mut c,
        "SET timestamp = UNIX_TIMESTAMP('2020-01-01 12:00:00');
         INSERT INTO t SELECT seq, seq FROM seq_6_to_8;
         UPDATE t SET v = v + 1 WHERE id = 1;
         SET timestamp = DEFAULT;
         INSERT INTO t SELECT seq, seq FROM seq_9_to_10;
         DELETE FROM t WHERE id = 2",
    )
    .await;
    p.assert_equal("t", 120).await;
    let changelog = p.table_dir("t_changelog");
    let before = changelog_rows(&env.python, &changelog);
    let old: Vec<&Row> = before.iter().filter(|r| r.1 == "2020-01-01").collect();
    assert_eq!(old.len(), 5, "{before:?}");
    assert_eq!(before.len(), 8, "{before:?}");
    let max_before = before.iter().map(|r| r.0).max().unwrap();
    p.stop(Duration::from_secs(60)).await;
    let (_, out) = p.check();
    assert!(
        out.contains(&format!("changelog {name}.t_changelog (retention 30d)")),
        "cdcd check does not show the retention:\n{out}"
    );

    let (ok, out) = run_cdcd(&["maintain", "--table", &format!("{name}.t")], &p.config);
    assert!(ok, "cdcd maintain:\n{out}");
    let meta = current_metadata(&changelog);
    let snapshots = meta["snapshots"].as_array().unwrap();
    assert!(
        snapshots.iter().any(
            |s| s["summary"]["operation"] == "delete" && s["summary"]["deleted-records"] == "5"
        ),
        "no delete snapshot of the 5 old rows: {snapshots:#?}"
    );
    let current = meta["current-snapshot-id"].as_i64().unwrap();
    let current = snapshots
        .iter()
        .find(|s| s["snapshot-id"].as_i64() == Some(current))
        .unwrap();
    assert_eq!(
        current["summary"]["total-delete-files"], "0",
        "{current:#?}"
    );
    let kept = changelog_rows(&env.python, &changelog);
    let today: Vec<Row> = before
        .iter()
        .filter(|r| r.1 != "2020-01-01")
        .cloned()
        .collect();
    assert_eq!(kept, today, "only the old day is dropped");

    // The changelog goes on above every seq it gave, through a kill -9 and a restart.
    p.start();
    my_exec(
        &mut c,
        "INSERT INTO t VALUES (11, 11); UPDATE t SET v = 0 WHERE id = 3",
    )
    .await;
    p.assert_equal("t", 120).await;
    my_exec(&mut c, "INSERT INTO t VALUES (12, 12)").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.kill9();
    p.start();
    my_exec(&mut c, "DELETE FROM t WHERE id = 11").await;
    p.assert_equal("t", 120).await;
    p.stop(Duration::from_secs(60)).await;
    let after = changelog_rows(&env.python, &changelog);
    let new: Vec<&Row> = after.iter().filter(|r| !today.contains(r)).collect();
    // insert 11, update 3 (2 rows), insert 12, delete 11.
    assert_eq!(new.len(), 5, "{after:?}");
    for r in &new {
        assert!(
            r.0 > max_before,
            "seq {} repeats a value given before the retention drop (up to {max_before}): {after:?}",
            r.0
        );
    }
    let seqs: Vec<i64> = new.iter().map(|r| r.0).collect();
    let want: Vec<i64> = (max_before + 1..=max_before + 5).collect();
    assert_eq!(seqs, want, "no gap, no repeat: {after:?}");
}
