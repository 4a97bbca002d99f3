//! The Paimon changelog (issue 38, `changelog = true` on an LSM table: `changelog-producer =
//! input`), read by pypaimon 2.1: its stream read (`new_stream_read_builder()
//! .with_include_row_kind()`, snapshot by snapshot from the earliest) and an
//! `incremental-between-timestamp` read must return exactly the source's changes: `+I`, `-U`/`+U`
//! pairs with whole before and after images (also where Postgres leaves a TOASTed value out of
//! an update without `REPLICA IDENTITY FULL`), `-D` of the old key and `+I` of the new one for a
//! key change, `-D` with the whole deleted row. Also: after expiry the retained snapshots'
//! changelog still reads, and kill -9 at the commit's crash points leaves no gap and no duplicate.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::support::mysql::{my_connect, my_env_and_name, my_exec, MyPipeline};
use crate::support::{
    append_table_settings, connect, exec, fresh_table, output_ok, run_cdcd, test_env_and_name,
    Pipeline, Settings, NAMESPACE,
};

/// Reads a table's changelog with pypaimon as JSON lines `[kind, row]`, each row a JSON object:
/// `stream` walks snapshots from the earliest with the stream read's follow-up scanner and
/// changelog plans; `incremental` reads `incremental-between-timestamp` from 0 to now.
pub const READ_CHANGELOG: &str = r#"
import json, sys, time
from pypaimon import CatalogFactory
from pypaimon.read.streaming_table_scan import AsyncStreamingTableScan
wh, name, mode = sys.argv[1:4]
cat = CatalogFactory.create({"warehouse": wh})
t = cat.get_table(name)
assert str(t.options.changelog_producer().value) == "input", t.options.changelog_producer()
def emit(table):
    if table is None:
        return
    for r in table.to_pylist():
        kind = r.pop("_row_kind")
        print(json.dumps([kind, r], default=str, sort_keys=True))
if mode == "stream":
    rb = t.new_stream_read_builder().with_include_row_kind()
    scan = rb.new_streaming_scan()
    sm = t.snapshot_manager()
    read = rb.new_read()
    first = sm.try_get_earliest_snapshot().id
    for sid in range(first, sm.get_latest_snapshot().id + 1):
        s = sm.get_snapshot_by_id(sid)
        if scan.follow_up_scanner.should_scan(s):
            emit(read.to_arrow(scan._create_follow_up_plan(s).splits()))
else:
    t2 = t.copy({"incremental-between-timestamp": "0,%d" % (int(time.time() * 1000) + 60000)})
    splits = t2.new_read_builder().new_scan().plan().splits()
    emit(t2.new_stream_read_builder().with_include_row_kind().new_read().to_arrow(splits))
"#;

/// One changelog row: its kind and its row as text columns.
pub type Entry = (String, BTreeMap<String, String>);

/// The changelog of `table` as pypaimon reads it (`mode`: `stream` or `incremental`).
pub fn read_changelog(p: &Pipeline, table: &str, mode: &str) -> Vec<Entry> {
    read_changelog_in(&p.env.python, &p.warehouse, table, mode)
}

/// [`read_changelog`] of table `shop.<table>` in `warehouse`, with the test bed's `python`.
pub fn read_changelog_in(
    python: &str,
    warehouse: &std::path::Path,
    table: &str,
    mode: &str,
) -> Vec<Entry> {
    let out = output_ok(
        std::process::Command::new(python)
            .arg("-c")
            .arg(READ_CHANGELOG)
            .arg(warehouse.display().to_string())
            .arg(format!("{NAMESPACE}.{table}"))
            .arg(mode),
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('['))
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let kind = v[0].as_str().unwrap().to_owned();
            let row = v[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| {
                    let text = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    (k.clone(), text)
                })
                .collect();
            (kind, row)
        })
        .collect()
}

/// Per key (column `key`), its changelog rows in the order read.
pub fn per_key(entries: &[Entry], key: &str) -> BTreeMap<String, Vec<Entry>> {
    let mut out: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
    for e in entries {
        out.entry(e.1.get(key).cloned().unwrap_or_default())
            .or_default()
            .push(e.clone());
    }
    out
}

/// A row of the test table `(id, v, big)` as the changelog reads it.
fn row(id: i64, v: i64, big: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("id".to_owned(), id.to_string()),
        ("v".to_owned(), v.to_string()),
        ("big".to_owned(), big.to_owned()),
    ])
}

fn e(kind: &str, id: i64, v: i64, big: &str) -> Entry {
    (kind.to_owned(), row(id, v, big))
}

/// A value Postgres TOASTs out of line (incompressible hex, > 2 kB), made the same in SQL.
fn big(id: i64) -> String {
    format!("(SELECT string_agg(md5(g::text || '-{id}'), '') FROM generate_series(1, 100) g)")
}

fn changelog_settings(p: &Pipeline, table: &str) {
    append_table_settings(&p.config, &format!("public.{table}"), "changelog = true\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_changes_read_back_as_paimon_changelog() {
    let (env, name) = ground_or_skip!(test_env_and_name("lchl"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {t};
             CREATE TABLE {t} (id int8 PRIMARY KEY, v int8, big text);
             ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL;
             INSERT INTO {t} SELECT g, g, NULL FROM generate_series(1, 5) g;
             UPDATE {t} SET big = {b1} WHERE id = 1;
             UPDATE {t} SET big = {b2} WHERE id = 2;",
            b1 = big(1),
            b2 = big(2),
        ),
    )
    .await;
    let text = |sql: String| {
        let client = &client;
        async move {
            let row = client.query_one(sql.as_str(), &[]).await.unwrap();
            row.get::<_, String>(0)
        }
    };
    let b1 = text(format!("SELECT big FROM {t} WHERE id = 1")).await;
    let b2 = text(format!("SELECT big FROM {t} WHERE id = 2")).await;
    let settings = Settings {
        commit_interval_ms: 100,
        ..Settings::default()
    };
    let mut p = Pipeline::new_lsm(&env, &name, &[&t], &settings, 2);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    changelog_settings(&p, &t);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    p.assert_equal(&t, 60).await;
    let steps = [
        format!("INSERT INTO {t} VALUES (6, 6, 'six')"),
        // The TOASTed value is left out (unchanged) without REPLICA IDENTITY FULL.
        format!("UPDATE {t} SET v = v + 10 WHERE id = 1"),
        format!("UPDATE {t} SET id = 20 WHERE id = 2"),
        format!("DELETE FROM {t} WHERE id = 3"),
        format!(
            "BEGIN; UPDATE {t} SET v = 40 WHERE id = 4; UPDATE {t} SET v = 41 WHERE id = 4; COMMIT"
        ),
        format!(
            "BEGIN; INSERT INTO {t} VALUES (7, 7, 'seven'); DELETE FROM {t} WHERE id = 7; COMMIT"
        ),
        format!("UPDATE {t} SET big = 'small' WHERE id = 5"),
    ];
    for sql in &steps {
        exec(&client, sql).await;
    }
    p.assert_equal(&t, 60).await;
    // In a later commit: the before image comes from the table, not from this commit.
    exec(&client, &format!("UPDATE {t} SET v = 100 WHERE id = 1")).await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");

    let null = "null";
    let expected: BTreeMap<String, Vec<Entry>> = per_key(
        &[
            e("+I", 1, 1, &b1),
            e("-U", 1, 1, &b1),
            e("+U", 1, 11, &b1),
            e("-U", 1, 11, &b1),
            e("+U", 1, 100, &b1),
            e("+I", 2, 2, &b2),
            e("-D", 2, 2, &b2),
            e("+I", 20, 2, &b2),
            e("+I", 3, 3, null),
            e("-D", 3, 3, null),
            e("+I", 4, 4, null),
            e("-U", 4, 4, null),
            e("+U", 4, 40, null),
            e("-U", 4, 40, null),
            e("+U", 4, 41, null),
            e("+I", 5, 5, null),
            e("-U", 5, 5, null),
            e("+U", 5, 5, "small"),
            e("+I", 6, 6, "six"),
            e("+I", 7, 7, "seven"),
            e("-D", 7, 7, "seven"),
        ],
        "id",
    );
    let streamed = per_key(&read_changelog(&p, &t, "stream"), "id");
    assert_eq!(streamed, expected, "stream read");
    // One plan over many snapshots: a key's rows from different snapshots need not come in
    // order, so only the multiset is compared.
    let sorted = |m: BTreeMap<String, Vec<Entry>>| -> BTreeMap<String, Vec<Entry>> {
        m.into_iter()
            .map(|(k, mut v)| {
                v.sort();
                (k, v)
            })
            .collect()
    };
    let incremental = per_key(&read_changelog(&p, &t, "incremental"), "id");
    assert_eq!(sorted(incremental), sorted(expected), "incremental read");
}

/// Replays `entries` key by key: `+I` only onto no row, `-U` and `-D` only of the row as it is,
/// `+U` only after a `-U`; a gap or a duplicate breaks one of these. With `from_start` false
/// (the oldest changes expired) a key's first entry may be a `-U` or `-D` of a row not seen.
/// Returns the rows left, by key.
pub fn replay(
    entries: &BTreeMap<String, Vec<Entry>>,
    from_start: bool,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (key, list) in entries {
        let mut row: Option<&BTreeMap<String, String>> = None;
        let mut before = false;
        for (i, (kind, r)) in list.iter().enumerate() {
            let unseen = !from_start && i == 0;
            match kind.as_str() {
                "+I" => {
                    assert!(row.is_none(), "key {key}: +I onto a row: {list:?}");
                    row = Some(r);
                }
                "-U" | "-D" => {
                    assert!(
                        unseen || row == Some(r),
                        "key {key}: {kind} of {r:?} while the row is {row:?}: {list:?}"
                    );
                    before = kind == "-U";
                    row = if before { Some(r) } else { None };
                }
                "+U" => {
                    assert!(before, "key {key}: +U without -U: {list:?}");
                    before = false;
                    row = Some(r);
                }
                other => panic!("key {key}: row kind {other}"),
            }
            if kind != "-U" {
                assert!(
                    !before || kind == "+U",
                    "key {key}: -U without +U: {list:?}"
                );
            }
        }
        if let Some(r) = row {
            out.insert(key.clone(), r.clone());
        }
    }
    out
}

/// The source table `(id, v, big)`'s rows as the changelog reads them, by id.
pub(crate) async fn source_rows(
    client: &tokio_postgres::Client,
    t: &str,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let rows = client
        .query(&format!("SELECT id, v, big FROM {t}"), &[])
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            let id: i64 = r.get(0);
            let v: Option<i64> = r.get(1);
            let big: Option<String> = r.get(2);
            let row = BTreeMap::from([
                ("id".to_owned(), id.to_string()),
                (
                    "v".to_owned(),
                    v.map_or("null".to_owned(), |v| v.to_string()),
                ),
                ("big".to_owned(), big.unwrap_or_else(|| "null".to_owned())),
            ]);
            (id.to_string(), row)
        })
        .collect()
}

/// Transaction `k` of the workload: updates (some leaving the TOASTed `big` unchanged), an
/// insert, a key change, a delete.
pub(crate) fn transaction(t: &str, k: i64) -> String {
    format!(
        "BEGIN;
         UPDATE {t} SET v = v + 1 WHERE id % 5 = {m};
         UPDATE {t} SET big = 'b{k}' WHERE id = {small};
         INSERT INTO {t} VALUES ({new}, {k}, NULL);
         UPDATE {t} SET id = id + 100000 WHERE id = {moved};
         DELETE FROM {t} WHERE id = {gone};
         COMMIT;",
        m = k % 5,
        small = 40 + k % 10,
        new = 1000 + k,
        moved = 1 + k,
        gone = 1000 + k - 2,
    )
}

/// A table of 60 rows, 20 with a TOASTed `big`.
async fn workload_table(client: &tokio_postgres::Client, t: &str) {
    exec(
        client,
        &format!(
            "DROP TABLE IF EXISTS {t};
             CREATE TABLE {t} (id int8 PRIMARY KEY, v int8, big text);
             ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL;
             INSERT INTO {t} SELECT g, g, CASE WHEN g <= 20 THEN
               (SELECT string_agg(md5(h::text || '-' || g), '') FROM generate_series(1, 100) h) END
             FROM generate_series(1, 60) g;"
        ),
    )
    .await;
}

/// A pipeline `name` (not started) of the [`workload_table`] `t` into Paimon with its changelog
/// on, committing every `commit_interval_ms`; and a connection to Postgres.
pub(crate) async fn workload_pipeline(
    env: &crate::support::TestEnv,
    name: &str,
    t: &str,
    commit_interval_ms: u64,
) -> (Pipeline, tokio_postgres::Client) {
    let client = connect(&env.pg_url).await;
    workload_table(&client, t).await;
    let settings = Settings {
        commit_interval_ms,
        ..Settings::default()
    };
    let mut p = Pipeline::new_lsm(env, name, &[t], &settings, 2);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    changelog_settings(&p, t);
    (p, client)
}

/// kill -9 at the commit's crash points (the snapshot not yet written; written, `LATEST` not):
/// the changelog the restarted daemon goes on with has no gap and no duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paimon_changelog_has_no_gap_and_no_duplicate_through_kill9() {
    let (env, name) = ground_or_skip!(test_env_and_name("lchlk"));
    let t = format!("{name}_t");
    let (mut p, client) = workload_pipeline(&env, &name, &t, 100).await;
    let mut k = 0;
    for point in [
        "lsm-commit-before-snapshot:3",
        "lsm-commit-after-snapshot:3",
    ] {
        p.env_vars = vec![("CDCD_FAILPOINT".into(), point.into())];
        p.start();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let st = loop {
            if let Some(st) = p.try_exit() {
                break st;
            }
            assert!(std::time::Instant::now() < deadline, "{point}: no crash");
            exec(&client, &transaction(&t, k)).await;
            k += 1;
            tokio::time::sleep(Duration::from_millis(150)).await;
        };
        assert!(!st.success(), "{point}: {st}");
        assert!(
            p.output().contains("failpoint lsm-commit"),
            "{}",
            p.output()
        );
    }
    p.env_vars.clear();
    p.start();
    for _ in 0..5 {
        exec(&client, &transaction(&t, k)).await;
        k += 1;
    }
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let source = source_rows(&client, &t).await;
    let streamed = per_key(&read_changelog(&p, &t, "stream"), "id");
    assert_eq!(replay(&streamed, true), source, "stream read replayed");
    let incremental = per_key(&read_changelog(&p, &t, "incremental"), "id");
    let sorted = |m: &BTreeMap<String, Vec<Entry>>| -> Vec<Entry> {
        let mut all: Vec<Entry> = m.values().flatten().cloned().collect();
        all.sort();
        all
    };
    assert_eq!(sorted(&incremental), sorted(&streamed), "incremental read");
}

/// Snapshots expire with their changelog files (3 kept): what the retained snapshots list still
/// reads, every file they name is there, and it replays onto the source's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_paimon_changelog_reads_after_expiry() {
    let (env, name) = ground_or_skip!(test_env_and_name("lchle"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    workload_table(&client, &t).await;
    let settings = Settings {
        commit_interval_ms: 50,
        ..Settings::default()
    };
    let mut p = Pipeline::new_lsm(&env, &name, &[&t], &settings, 2);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    let text = std::fs::read_to_string(&p.config)
        .unwrap()
        .replace("snapshots_retained = 10", "snapshots_retained = 3");
    std::fs::write(&p.config, text).unwrap();
    changelog_settings(&p, &t);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    let earliest_file = p.table_dir(&t).join("snapshot/EARLIEST");
    let earliest = || {
        std::fs::read_to_string(&earliest_file)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .unwrap_or(1)
    };
    // Expiry is tried every 10 snapshots; how many snapshots 30 transactions make depends on how
    // many a loaded machine coalesces into one commit, so transactions go on until one expired.
    let mut k = 0;
    while k < 30 || (earliest() <= 1 && k < 300) {
        exec(&client, &transaction(&t, k)).await;
        tokio::time::sleep(Duration::from_millis(120)).await;
        k += 1;
    }
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let earliest = earliest();
    assert!(
        earliest > 1,
        "no expiry after {k} transactions: EARLIEST is {earliest}"
    );
    // `cdcd cleanup` counts the retained snapshots' changelog files as theirs, not as orphans.
    let (ok, out) = run_cdcd(&["cleanup", "--grace-secs", "0"], &p.config);
    assert!(ok, "{out}");
    let files = p.python(
        r#"
import json, os, sys
from fastavro import reader
tbl = sys.argv[1]
sd = os.path.join(tbl, "snapshot")
ids = sorted(int(n[9:]) for n in os.listdir(sd) if n.startswith("snapshot-"))
missing, changelog = [], 0
for i in ids:
    s = json.load(open(os.path.join(sd, "snapshot-%d" % i)))
    lst = s.get("changelogManifestList")
    if not lst:
        continue
    for m in reader(open(os.path.join(tbl, "manifest", lst), "rb")):
        for e in reader(open(os.path.join(tbl, "manifest", m["_FILE_NAME"]), "rb")):
            f = "bucket-%d/%s" % (e["_BUCKET"], e["_FILE"]["_FILE_NAME"])
            changelog += 1
            if not os.path.exists(os.path.join(tbl, f)):
                missing.append(f)
gone = [n for b in os.listdir(tbl) if b.startswith("bucket-")
        for n in os.listdir(os.path.join(tbl, b)) if n.startswith("changelog-")]
print(json.dumps({"ids": ids, "missing": missing, "listed": changelog, "on_disk": len(gone)}))
"#,
        &[&p.table_dir(&t).display().to_string()],
    );
    let v: Value = serde_json::from_str(files.lines().last().unwrap_or("")).unwrap();
    assert_eq!(v["missing"], Value::Array(Vec::new()), "{v}");
    assert!(v["listed"].as_u64().unwrap_or(0) > 0, "{v}");
    // The expired snapshots' changelog files went with them.
    assert_eq!(v["listed"], v["on_disk"], "{v}");
    let source = source_rows(&client, &t).await;
    let streamed = per_key(&read_changelog(&p, &t, "stream"), "id");
    let replayed = replay(&streamed, false);
    for (key, r) in &replayed {
        assert_eq!(source.get(key), Some(r), "key {key}");
    }
}

/// MariaDB's partial row images (`binlog_row_image = MINIMAL`: an update logs the changed columns
/// and the key, a delete the key; NOBLOB leaves unchanged TEXT out) become whole changelog
/// images, completed from the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_minimal_images_read_back_as_whole_paimon_changelog_rows() {
    let (env, name) = ground_or_skip!(my_env_and_name("mylchl"));
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    p.use_lsm(2, "initial", "");
    append_table_settings(&p.config, &format!("{}.item", p.db), "changelog = true\n");
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE item (id BIGINT PRIMARY KEY, n INT, note VARCHAR(40), body TEXT);
         INSERT INTO item VALUES (1, 1, 'one', 'b1'), (2, 2, 'two', 'b2'), (3, 3, 'three', 'b3');",
    )
    .await;
    p.start();
    p.assert_equal("item", 120).await;
    my_exec(
        &mut c,
        "SET SESSION binlog_row_image = 'MINIMAL';
         UPDATE item SET n = 10 WHERE id = 1;
         UPDATE item SET id = 20 WHERE id = 2;
         DELETE FROM item WHERE id = 3;
         INSERT INTO item VALUES (4, 4, 'four', 'b4');
         SET SESSION binlog_row_image = 'NOBLOB';
         UPDATE item SET note = NULL WHERE id = 4;
         SET SESSION binlog_row_image = 'FULL';",
    )
    .await;
    p.assert_equal("item", 120).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let r = |kind: &str, id: i64, n: i64, note: &str, body: &str| -> Entry {
        let row = BTreeMap::from([
            ("id".to_owned(), id.to_string()),
            ("n".to_owned(), n.to_string()),
            ("note".to_owned(), note.to_owned()),
            ("body".to_owned(), body.to_owned()),
        ]);
        (kind.to_owned(), row)
    };
    let expected = per_key(
        &[
            r("+I", 1, 1, "one", "b1"),
            r("-U", 1, 1, "one", "b1"),
            r("+U", 1, 10, "one", "b1"),
            r("+I", 2, 2, "two", "b2"),
            r("-D", 2, 2, "two", "b2"),
            r("+I", 20, 2, "two", "b2"),
            r("+I", 3, 3, "three", "b3"),
            r("-D", 3, 3, "three", "b3"),
            r("+I", 4, 4, "four", "b4"),
            r("-U", 4, 4, "four", "b4"),
            r("+U", 4, 4, "null", "b4"),
        ],
        "id",
    );
    let streamed = read_changelog_in(&env.python, &p.warehouse, "item", "stream");
    assert_eq!(per_key(&streamed, "id"), expected, "stream read");
}

/// `changelog = true` turned on for a table cdcd already writes: a schema of its own sets
/// `changelog-producer = input`, and the changes from then on read back as the changelog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changelog_turned_on_for_an_existing_table() {
    let (env, name) = ground_or_skip!(test_env_and_name("lchlon"));
    let t = format!("{name}_t");
    let client = fresh_table(&env, &t, |t| {
        format!(
            "CREATE TABLE {t} (id int8 PRIMARY KEY, v int8, big text);
             INSERT INTO {t} VALUES (1, 1, 'one'), (2, 2, 'two');"
        )
    })
    .await;
    let settings = Settings {
        commit_interval_ms: 100,
        ..Settings::default()
    };
    let mut p = Pipeline::new_lsm(&env, &name, &[&t], &settings, 2);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(&client, &format!("UPDATE {t} SET v = 5 WHERE id = 2")).await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");

    changelog_settings(&p, &t);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(
        &client,
        &format!("UPDATE {t} SET v = 10 WHERE id = 1; DELETE FROM {t} WHERE id = 2"),
    )
    .await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let expected = per_key(
        &[
            e("-U", 1, 1, "one"),
            e("+U", 1, 10, "one"),
            e("-D", 2, 5, "two"),
        ],
        "id",
    );
    assert_eq!(
        per_key(&read_changelog(&p, &t, "stream"), "id"),
        expected,
        "stream read"
    );
}

/// A partitioned table's changelog: each row in the partition its values name; an update that
/// moves a row to another partition is `-D` in the old one and `+I` in the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_paimon_changelog_moves_rows_as_delete_and_insert() {
    let (env, name) = ground_or_skip!(test_env_and_name("lchlp"));
    let t = format!("{name}_t");
    let client = fresh_table(&env, &t, |t| {
        format!(
            "CREATE TABLE {t} (id int8 PRIMARY KEY, region text, v int8);
             INSERT INTO {t} VALUES (1, 'eu', 1), (2, 'us', 2);"
        )
    })
    .await;
    let settings = Settings {
        commit_interval_ms: 100,
        ..Settings::default()
    };
    let mut p = Pipeline::new_lsm(&env, &name, &[&t], &settings, 2);
    p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
    append_table_settings(
        &p.config,
        &format!("public.{t}"),
        "partition_by = [\"region\"]\nchangelog = true\n",
    );
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(
        &client,
        &format!(
            "UPDATE {t} SET v = 10 WHERE id = 1;
             UPDATE {t} SET region = 'us' WHERE id = 1;
             DELETE FROM {t} WHERE id = 2;"
        ),
    )
    .await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let r = |kind: &str, id: i64, region: &str, v: i64| -> Entry {
        let row = BTreeMap::from([
            ("id".to_owned(), id.to_string()),
            ("region".to_owned(), region.to_owned()),
            ("v".to_owned(), v.to_string()),
        ]);
        (kind.to_owned(), row)
    };
    let mut expected = vec![
        r("+I", 1, "eu", 1),
        r("-U", 1, "eu", 1),
        r("+U", 1, "eu", 10),
        r("-D", 1, "eu", 10),
        r("+I", 1, "us", 10),
        r("+I", 2, "us", 2),
        r("-D", 2, "us", 2),
    ];
    expected.sort();
    // Partitions are read in no order relative to each other: compared as a multiset.
    let mut streamed = read_changelog(&p, &t, "stream");
    streamed.sort();
    assert_eq!(streamed, expected, "stream read");
}
