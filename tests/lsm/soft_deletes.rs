//! Issue 38: `deletes = "soft"` on the LSM (Paimon) sink, from MariaDB with `binlog_row_image =
//! MINIMAL` (a delete's image is the key only, an update's after image only the changed
//! columns): a deleted row stays with `_cdc_deleted = true` and its last values, a key inserted
//! again is live again, a key change leaves the old key's row flagged and completes the new key
//! from it; and through kill -9 at random moments every key ever inserted is in the table, the
//! live ones equal to the source; removing the setting from the table is refused. Read back by
//! pypaimon (`lakecheck.py --paimon`).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use crate::lsm::changelog::{per_key, read_changelog_in, replay};
use crate::mysql::soft_deletes::{move_keys_onto_soft_deleted_ones, start_on_thirty_rows};
use crate::support::mysql::{create_acct, kill_rounds, my_connect, my_env, my_exec, MyPipeline};
use crate::support::{unique, LAKECHECK, NAMESPACE};

/// lakecheck (pypaimon) on `<db>.<table>` with `extra` arguments: exit code and output.
fn lakecheck(p: &MyPipeline, table: &str, extra: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(&p.env.python)
        .arg(LAKECHECK)
        .args(["--source", &p.env.url_for(&p.db)])
        .args(["--source-table", &format!("{}.{table}", p.db)])
        .arg("--paimon")
        .arg(&p.warehouse)
        .args(["--paimon-table", &format!("{NAMESPACE}.{table}")])
        .args(extra)
        .output()
        .unwrap();
    (out.status.code(), crate::support::stderr_then_stdout(&out))
}

/// The Paimon rows of `table` by `id`; a key twice fails.
fn rows(p: &MyPipeline, table: &str) -> BTreeMap<i64, serde_json::Value> {
    let (_, out) = lakecheck(p, table, &["--dump"]);
    let mut rows = BTreeMap::new();
    for line in out.lines().filter(|l| l.starts_with('{')) {
        let r: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let id = r["id"].as_i64().unwrap_or_else(|| panic!("no id: {line}"));
        assert!(rows.insert(id, r).is_none(), "id {id} twice:\n{out}");
    }
    rows
}

/// The ids of the rows flagged deleted.
fn flagged(rows: &BTreeMap<i64, serde_json::Value>) -> Vec<i64> {
    rows.iter()
        .filter(|(_, r)| r["_cdc_deleted"] == true)
        .map(|(id, _)| *id)
        .collect()
}

/// A pipeline on the LSM sink (2 buckets) whose table `table` has `deletes = "soft"`.
async fn soft_pipeline(env: &crate::support::mysql::MyEnv, name: &str, table: &str) -> MyPipeline {
    let mut p = MyPipeline::new(env, name, "initial", "").await;
    p.use_lsm(2, "initial", "");
    let mut text = std::fs::read_to_string(&p.config).unwrap();
    text.push_str(&format!(
        "\n[sink.tables.\"{name}.{table}\"]\ndeletes = \"soft\"\n"
    ));
    std::fs::write(&p.config, text).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paimon_soft_deletes_keep_flagged_rows_with_their_values() {
    let env = ground_or_skip!(my_env(
        "paimon_soft_deletes_keep_flagged_rows_with_their_values"
    ));
    let name = unique("mylsoft");
    let mut p = soft_pipeline(&env, &name, "t").await;
    let mut c = start_on_thirty_rows(&mut p).await;
    for sql in [
        "UPDATE t SET n = 55 WHERE id = 5",
        "DELETE FROM t WHERE id IN (2, 5)",
        "DELETE FROM t WHERE id = 3",
        "INSERT INTO t VALUES (3, 'again', 3, NULL)",
        "UPDATE t SET id = 104 WHERE id = 4",
        "UPDATE t SET name = 'u1' WHERE id = 1",
        // In one transaction, so one commit: a key changed, deleted and changed back.
        "BEGIN; UPDATE t SET id = 107 WHERE id = 7; DELETE FROM t WHERE id = 8;
         UPDATE t SET id = 8 WHERE id = 107; COMMIT",
    ] {
        my_exec(&mut c, sql).await;
    }
    let (code, out) = lakecheck(&p, "t", &["--live", "--wait", "120"]);
    assert_eq!(
        code,
        Some(0),
        "lakecheck --live:\n{out}\ncdcd:\n{}",
        p.output()
    );
    let all = rows(&p, "t");
    assert_eq!(all.len(), 32, "30 keys, 104 and 107: {all:?}");
    assert_eq!(flagged(&all), [2, 4, 5, 7, 107], "{all:?}");
    assert!(all
        .values()
        .all(|r| r["_cdc_deleted"] == true || r["_cdc_deleted"] == false));
    assert_eq!(all[&5]["n"], 55, "a key-only delete keeps the row's values");
    assert_eq!(all[&5]["body"].as_str().map(str::len), Some(100));
    assert_eq!(all[&2]["name"], "n2");
    assert_eq!(all[&4]["name"], "n4", "the old key keeps its values");
    assert_eq!(all[&104]["name"], "n4", "completed from the old key's row");
    assert_eq!(all[&104]["body"].as_str().map(str::len), Some(100));
    assert_eq!(all[&3]["name"], "again");
    assert_eq!(
        all[&8]["name"], "n7",
        "the key moved back carries 7's values"
    );
    assert_eq!(all[&107]["name"], "n7");
    let (code, out) = p.check();
    assert!(
        out.contains(&format!("table {name}.t: deletes soft (adds _cdc_deleted)")),
        "cdcd check ({code:?}) shows the setting:\n{out}"
    );
    p.stop(Duration::from_secs(60)).await;

    // Without the setting the flagged rows would read as live: refused, saying so.
    let text = std::fs::read_to_string(&p.config).unwrap();
    let section = format!("\n[sink.tables.\"{name}.t\"]\ndeletes = \"soft\"\n");
    assert!(text.contains(&section), "{text}");
    std::fs::write(&p.config, text.replace(&section, "\n")).unwrap();
    p.start();
    my_exec(&mut c, "DELETE FROM t WHERE id = 6").await;
    let status = p.wait_exit(Duration::from_secs(120)).await;
    assert!(
        status.is_some_and(|s| !s.success()),
        "cdcd dropped _cdc_deleted:\n{}",
        p.output()
    );
    assert!(
        p.output().contains("no longer ask for") && p.output().contains("resync"),
        "{}",
        p.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_at_random_moments_keeps_every_soft_deleted_paimon_row() {
    let test = "kill9_at_random_moments_keeps_every_soft_deleted_paimon_row";
    let env = ground_or_skip!(my_env(test));
    let name = unique("mylsoftk");
    let mut p = soft_pipeline(&env, &name, "acct").await;
    let mut c = my_connect(&env.url_for(&p.db)).await;
    create_acct(&mut c).await;
    // The copy first: a row the writer inserted and deleted before it is in no change cdcd reads.
    p.start();
    p.assert_equal("acct", 120).await;
    p.kill9();
    kill_rounds(&mut p, &mut c, test, 60).await;
    p.start();
    let (code, out) = lakecheck(&p, "acct", &["--live", "--wait", "120"]);
    assert_eq!(
        code,
        Some(0),
        "lakecheck --live:\n{out}\ncdcd:\n{}",
        p.output()
    );
    p.stop(Duration::from_secs(60)).await;
    let all = rows(&p, "acct");
    let flagged = flagged(&all);
    // The writer inserts ids 1, 2, 3, … and never again after a delete: every one stays.
    let max = all.keys().max().copied().unwrap_or(0);
    assert_eq!(
        all.keys().copied().collect::<Vec<_>>(),
        (1..=max).collect::<Vec<_>>(),
        "an inserted key is missing; cdcd:\n{}",
        p.output()
    );
    assert!(!flagged.is_empty(), "no delete to prove anything");
    eprintln!(
        "paimon soft deletes after kill -9s: {} rows, {} flagged",
        all.len(),
        flagged.len()
    );
}

/// Soft deletes with `changelog = true`: a key change onto a key that holds a flagged row
/// replaces that row in the table, so the changelog says `-U` of the flagged row and `+U` of the
/// new one (not `+I` onto a row), and the old key's row stays, flagged. Replaying the changelog
/// (pypaimon's stream read) key by key gives the table's rows, flagged ones included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_change_onto_a_soft_deleted_key_is_an_update_in_the_changelog() {
    let env = ground_or_skip!(my_env(
        "a_key_change_onto_a_soft_deleted_key_is_an_update_in_the_changelog"
    ));
    let name = unique("mylsoftchl");
    let mut p = soft_pipeline(&env, &name, "t").await;
    let mut text = std::fs::read_to_string(&p.config).unwrap();
    text.push_str("changelog = true\n");
    std::fs::write(&p.config, text).unwrap();
    let mut c = start_on_thirty_rows(&mut p).await;
    move_keys_onto_soft_deleted_ones(&mut c, || lakecheck(&p, "t", &["--live", "--wait", "120"]))
        .await;
    p.stop(Duration::from_secs(60)).await;
    let table = rows(&p, "t");
    assert_eq!(flagged(&table), [1, 3], "{table:?}");
    let streamed = read_changelog_in(&env.python, &p.warehouse, "t", "stream");
    let replayed = replay(&per_key(&streamed, "id"), true);
    assert_eq!(replayed.len(), table.len(), "{replayed:?}");
    for (id, row) in &table {
        let r = &replayed[&id.to_string()];
        assert_eq!(
            r["_cdc_deleted"],
            row["_cdc_deleted"].to_string(),
            "{id}: {r:?}"
        );
        assert_eq!(
            r["name"],
            row["name"].as_str().unwrap_or("null"),
            "{id}: {r:?}"
        );
    }
    assert_eq!(replayed["2"]["name"], "n1", "{replayed:?}");
}
