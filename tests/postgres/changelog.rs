//! Issue 38: the Iceberg changelog table. A table with `changelog = true` gets the append-only
//! table `<table>_changelog`; read back by DuckDB, its rows replayed in `_cdc_seq` order onto the
//! initial copy give the source table exactly (inserts, updates leaving a TOASTed value unchanged
//! without REPLICA IDENTITY FULL, key changes, deletes, several changes of one key in one
//! transaction), every change is there once, and a kill -9 between the changelog's commit and its
//! table's (`changelog-before-table`) leaves no gap and no duplicate.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::{
    connect, current_metadata, exec, output_ok, run_cdcd, test_env, unique, Pipeline, Settings,
    LAKECHECK,
};

/// Replays the changelog (DuckDB) onto the table as of the initial copy's snapshot (pyiceberg),
/// compares with the source (Postgres or MySQL), and prints `rows=<n> seqs=<distinct>
/// ops=<op:count,…>`, then the differences. With `resync` for the copy's snapshot: from the
/// changelog's last `resync` row, as a consumer reloads there: the table as of the snapshot whose
/// `cdcd.position` is the marker's `_cdc_position`, then the rows after the marker. With `copied`:
/// onto the table's first snapshot with its initial copy complete (a copy that ran while the
/// source was written: the changes it may hold again replay idempotently, complete images). With
/// `empty`: onto no rows (a table copied empty, its snapshots since expired). A change there twice
/// (the same `_cdc_tx`, `_cdc_op` and key) is a difference.
const REPLAY: &str = r#"
import os, sys, json
sys.path.insert(0, os.environ["LAKECHECK_DIR"])
import lakecheck as lc
from pyiceberg.table import StaticTable
pg, source, table_dir, changelog_dir, copy_snapshot = sys.argv[1:6]
names, kinds, pk, src = lc.read_source(pg, source)
notes = []
meta = lc.locate_iceberg(table_dir, notes)
t = StaticTable.from_metadata(meta)
lc.duck().execute("SET enable_progress_bar = false")   # it prints to stdout on a slow read
ccols, crows = lc.read_duckdb(lc.locate_iceberg(changelog_dir, notes))
crows = sorted((dict(zip(ccols, r)) for r in crows), key=lambda r: r["_cdc_seq"])
if copy_snapshot == "resync":
    m = [r for r in crows if r["_cdc_op"] == "resync"][-1]
    copy_snapshot = next(s.snapshot_id for s in t.metadata.snapshots
                         if s.summary and s.summary.get("cdcd.position") == m["_cdc_position"])
    crows = [r for r in crows if r["_cdc_seq"] > m["_cdc_seq"]]
if copy_snapshot == "copied":
    copy_snapshot = next(s.snapshot_id for s in sorted(t.metadata.snapshots, key=lambda s: s.sequence_number)
                         if s.summary and s.summary.get("cdcd.position") and not s.summary.get("cdcd.snapshot"))
if copy_snapshot == "empty":
    cols, rows = [], []
else:
    cols, rows = lc.arrow_rows(t.scan(snapshot_id=int(copy_snapshot)).to_arrow())
key = lambda r: tuple(lc.norm(r[c], kinds[names.index(c)]) for c in pk)
state = {}
for r in rows:
    r = dict(zip(cols, r))
    state[key(r)] = r
ops = {}
for r in crows:
    op = r["_cdc_op"]
    ops[op] = ops.get(op, 0) + 1
    assert r["_cdc_position"] and r["_cdc_tx"] and r["_cdc_commit_ts"] is not None, r
    if op in ("insert", "update_after"):
        state[key(r)] = r
    elif op in ("update_before", "delete"):
        state.pop(key(r), None)
    elif op == "truncate":
        state.clear()
want = {key(dict(zip(names, r))): dict(zip(names, r)) for r in src}
bad = []
seen = set()
for r in crows:
    change = (r["_cdc_tx"], r["_cdc_op"], key(r))
    if change in seen:
        bad.append(f"twice: {change}")
    seen.add(change)
for k in set(want) | set(state):
    a, b = want.get(k), state.get(k)
    if a is None or b is None:
        bad.append(f"key {k}: source {a is not None}, replay {b is not None}")
        continue
    for c, kind in zip(names, kinds):
        # A column added after the copy: the copy's rows lack it (NULL).
        if lc.norm(a[c], kind) != lc.norm(b.get(c), kind):
            bad.append(f"key {k} column {c}: source {lc.show(a[c])}, replay {lc.show(b[c])}")
seqs = len({r["_cdc_seq"] for r in crows})
print(f"rows={len(crows)} seqs={seqs} ops=" + ",".join(f"{k}:{v}" for k, v in sorted(ops.items())))
print("\n".join(bad[:20]))
"#;

/// The workload after the copy, one transaction per statement list: 23 changelog rows.
pub(crate) fn workload(t: &str) -> Vec<String> {
    vec![
        // 5 inserts.
        format!(
            "INSERT INTO {t} (id, v, t) SELECT g, g, 'new ' || g FROM generate_series(21, 25) g"
        ),
        // 5 updates leaving the TOASTed t unchanged (pgoutput sends it as unchanged): 10 rows.
        format!("UPDATE {t} SET v = v + 100 WHERE id BETWEEN 1 AND 5"),
        // A key change: 2 rows.
        format!("UPDATE {t} SET id = 106, v = -6 WHERE id = 6"),
        // 2 deletes.
        format!("DELETE FROM {t} WHERE id IN (7, 8)"),
        // One key three times in one transaction: insert, update, delete: 4 rows.
        format!(
            "BEGIN; INSERT INTO {t} VALUES (26, 1, 'x'); UPDATE {t} SET v = 2 WHERE id = 26; \
             DELETE FROM {t} WHERE id = 26; COMMIT;"
        ),
    ]
}

/// What [`REPLAY`] prints for [`workload`]'s changes, each once and replayed to the source.
pub(crate) const ROWS: &str =
    "rows=23 seqs=23 ops=delete:3,insert:6,update_after:7,update_before:7";

async fn replay(p: &Pipeline, t: &str, copy_snapshot: &str) -> String {
    let source = format!("public.{t}");
    replayed(
        &p.env.python,
        &p.env.pg_url,
        &source,
        &p.table_dir(t),
        &p.table_dir(&format!("{t}_changelog")),
        copy_snapshot,
    )
}

/// [`REPLAY`] on source table `source` at `url`, the lake table in `table` and its changelog in
/// `changelog`, the initial copy being snapshot `copy_snapshot`.
pub(crate) fn replayed(
    python: &str,
    url: &str,
    source: &str,
    table: &Path,
    changelog: &Path,
    copy_snapshot: &str,
) -> String {
    let lakecheck_dir = Path::new(LAKECHECK)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let out = output_ok(
        Command::new(python)
            .env("LAKECHECK_DIR", lakecheck_dir)
            .arg("-c")
            .arg(REPLAY)
            .args([url, source])
            .arg(table)
            .arg(changelog)
            .arg(copy_snapshot),
    );
    // From the result on: a slow DuckDB scan may print a progress bar before it.
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("rows="))
        .collect();
    lines.join("\n").trim().to_owned()
}

fn section(t: &str) -> String {
    format!("[sink.tables.\"public.{t}\"]\nchangelog = true\n")
}

/// Creates the table (a TOASTed `t`, REPLICA IDENTITY DEFAULT), copies it, and returns the
/// snapshot id of the copy.
async fn copied(p: &mut Pipeline, client: &tokio_postgres::Client, t: &str) -> String {
    exec(
        client,
        &format!(
            "DROP TABLE IF EXISTS {t};
             CREATE TABLE {t} (id int PRIMARY KEY, v int, t text);
             ALTER TABLE {t} ALTER COLUMN t SET STORAGE EXTERNAL;
             INSERT INTO {t} SELECT g, g, repeat(md5(g::text), 400) FROM generate_series(1, 20) g;"
        ),
    )
    .await;
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    p.start();
    p.wait_slot_active(client, Duration::from_secs(120)).await;
    p.assert_equal(t, 60).await;
    let meta = current_metadata(&p.table_dir(t));
    meta["current-snapshot-id"].to_string()
}

/// A table `<tag>_…` with the changelog on, copied, then [`workload`] streamed and its changelog
/// replayed to the source: the pipeline (running), a connection, the table, the copy's snapshot.
pub(crate) async fn streamed(
    env: &crate::support::TestEnv,
    tag: &str,
) -> (Pipeline, tokio_postgres::Client, String, String) {
    let t = unique(tag);
    let settings = Settings {
        sink_extra: section(&t),
        ..Settings::default()
    };
    let mut p = Pipeline::new(env, &t, &[&t], &settings);
    let client = connect(&env.pg_url).await;
    let copy = copied(&mut p, &client, &t).await;
    for sql in workload(&t) {
        exec(&client, &sql).await;
    }
    p.assert_equal(&t, 60).await;
    assert_eq!(replay(&p, &t, &copy).await, ROWS);
    (p, client, t, copy)
}

#[tokio::test]
async fn replaying_the_changelog_onto_the_copy_gives_the_source() {
    let env = ground_or_skip!(test_env(
        "replaying_the_changelog_onto_the_copy_gives_the_source"
    ));
    let (mut p, client, t, copy) = streamed(&env, "chl").await;
    // The changelog evolves with its table: a column added mid-stream, then set.
    exec(
        &client,
        &format!("ALTER TABLE {t} ADD COLUMN w int; UPDATE {t} SET w = 7 WHERE id = 1;"),
    )
    .await;
    p.assert_equal(&t, 60).await;
    assert_eq!(
        replay(&p, &t, &copy).await,
        "rows=25 seqs=25 ops=delete:3,insert:6,update_after:8,update_before:8"
    );
    // The changelog is partitioned by day of the commit time.
    let meta = current_metadata(&p.table_dir(&format!("{t}_changelog")));
    let spec = meta["partition-specs"].to_string();
    assert!(spec.contains("\"day\""), "{spec}");
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    // `cdcd check` names the changelog with the table's layout.
    let (ok, out) = run_cdcd(&["check"], &p.config);
    let line = format!("changelog public.{t}_changelog");
    assert!(
        ok && out.contains(&line),
        "cdcd check lacks {line:?}:\n{out}"
    );
}

/// A kill between the changelog's commit and its table's: the restart replays the table's
/// changes, and the changelog takes only those it does not hold.
#[tokio::test]
async fn a_kill_between_the_changelog_and_its_table_leaves_no_gap_and_no_duplicate() {
    let env = ground_or_skip!(test_env(
        "a_kill_between_the_changelog_and_its_table_leaves_no_gap_and_no_duplicate"
    ));
    let t = unique("chk");
    let settings = Settings {
        sink_extra: section(&t),
        ..Settings::default()
    };
    let mut p = Pipeline::new(&env, &t, &[&t], &settings);
    let client = connect(&env.pg_url).await;
    let copy = copied(&mut p, &client, &t).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    // The first streamed commit dies once its changelog is durable.
    p.env_vars = vec![("CDCD_FAILPOINT".into(), "changelog-before-table".into())];
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    for sql in workload(&t) {
        exec(&client, &sql).await;
    }
    p.assert_aborts_at(Duration::from_secs(60), "changelog-before-table")
        .await;
    p.env_vars.clear();
    p.wait_slot_inactive(&client, Duration::from_secs(30)).await;
    p.start();
    p.assert_equal(&t, 60).await;
    assert_eq!(replay(&p, &t, &copy).await, ROWS);
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
}
