//! End to end, Iceberg maintenance (issue 19): snapshot expiry and the metadata log follow the
//! table's own properties, files only expired snapshots reached are deleted and no other, a
//! property another engine changes applies, and `kill -9` during an expiry ends readable and
//! equal, its leftovers removed by the next cycle.
//!
//! The table is read back by pyiceberg (every retained snapshot at its id, and the files every
//! snapshot reaches: manifest lists, manifests, data files, deletion vectors) and by DuckDB and
//! pyiceberg through lakecheck; none of it shares code with cdcd.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{
    cdcd_bin, connect, current_test, exec, fresh_table, log_field, test_env, test_env_and_name,
    unique, Pipeline, Settings, TestEnv,
};

/// Reads a table directory with pyiceberg: the newest metadata's snapshots (oldest first), rows
/// at each snapshot, the files they reach that are missing, and the files on disk nothing
/// reaches (besides `v<N>.metadata.json` and the hint).
const INSPECT: &str = r#"
import json, os, re, sys
from pyiceberg.table import StaticTable
d = sys.argv[1]
md = d + "/metadata"
vs = sorted(int(m.group(1)) for n in os.listdir(md) if (m := re.fullmatch(r"v(\d+)\.metadata\.json", n)))
path = f"{md}/v{vs[-1]}.metadata.json"
m = json.load(open(path))
t = StaticTable.from_metadata(path)
io = t.io
reach, rows = set(), {}
for s in t.metadata.snapshots:
    reach.add(s.manifest_list)
    for mf in s.manifests(io):
        reach.add(mf.manifest_path)
        for e in mf.fetch_manifest_entry(io, discard_deleted=False):
            reach.add(e.data_file.file_path)
    try:
        rows[str(s.snapshot_id)] = t.scan(snapshot_id=s.snapshot_id).to_arrow().num_rows
    except Exception:
        # pyiceberg refuses equality deletes (format v2, delete_mode = "equality"): DuckDB reads
        # that snapshot instead.
        sys.path.insert(0, os.environ["LAKECHECK_DIR"])
        import lakecheck
        q = "select count(*) from iceberg_scan('%s', snapshot_from_id=%d)" % (path, s.snapshot_id)
        rows[str(s.snapshot_id)] = lakecheck.duck().execute(q).fetchone()[0]
reach = {p[len("file://"):] if p.startswith("file://") else p for p in reach}
disk = {os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs}
meta = {p for p in disk if re.search(r"/metadata/(v\d+\.metadata\.json|version-hint\.text)$", p)}
print(json.dumps({
    "versions": vs,
    "current": m.get("current-snapshot-id"),
    "snapshots": [s["snapshot-id"] for s in sorted(m.get("snapshots", []), key=lambda s: (s["timestamp-ms"], s["sequence-number"]))],
    "metadata_log": len(m.get("metadata-log", [])),
    "rows": rows,
    "missing": sorted(reach - disk),
    "unreachable": sorted(disk - reach - meta),
    "properties": m.get("properties", {}),
}))
"#;

/// Writes `v<N+1>.metadata.json` with `props` set, as an engine's `ALTER TABLE … SET
/// TBLPROPERTIES` does on a Hadoop-style table (create the next version, then the hint).
const SET_PROPERTIES: &str = r#"
import json, os, re, sys, time
d, props = sys.argv[1], json.loads(sys.argv[2])
md = d + "/metadata"
n = max(int(m.group(1)) for x in os.listdir(md) if (m := re.fullmatch(r"v(\d+)\.metadata\.json", x)))
prev = f"{md}/v{n}.metadata.json"
m = json.load(open(prev))
m.setdefault("metadata-log", []).append({"metadata-file": "file://" + prev, "timestamp-ms": m["last-updated-ms"]})
m["properties"].update(props)
m["last-updated-ms"] = int(time.time() * 1000)
fd = os.open(f"{md}/v{n + 1}.metadata.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
os.write(fd, json.dumps(m).encode()); os.close(fd)
open(f"{md}/version-hint.text", "w").write(str(n + 1))
"#;

fn inspect(p: &Pipeline, table: &str) -> Value {
    let dir = p.table_dir(table).display().to_string();
    // The last line: DuckDB may print a note first.
    let out = p.python(INSPECT, &[&dir]);
    serde_json::from_str(out.lines().last().unwrap_or("")).unwrap()
}

fn ids(v: &Value) -> Vec<i64> {
    v["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_i64().unwrap())
        .collect()
}

fn assert_consistent(v: &Value, what: &str) {
    assert_eq!(
        v["missing"],
        Value::Array(vec![]),
        "{what}: a retained snapshot reaches a missing file: {v}"
    );
    assert_eq!(
        v["unreachable"],
        Value::Array(vec![]),
        "{what}: files no snapshot reaches are left: {v}"
    );
}

/// Appends `[sink.table_properties]` to the pipeline's config (the `[sink]` table is the last).
fn set_table_properties(p: &Pipeline, props: &[(&str, &str)]) {
    let mut text = std::fs::read_to_string(&p.config).unwrap();
    text.push_str("\n[sink.table_properties]\n");
    for (k, v) in props {
        text.push_str(&format!("{k:?} = {v:?}\n"));
    }
    std::fs::write(&p.config, text).unwrap();
}

fn create_table(t: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id int PRIMARY KEY, v int, s text);
         INSERT INTO {t} SELECT g, g, 'seed ' || g FROM generate_series(1, 200) g;"
    )
}

/// `n` transactions, each committed on its own (they are spaced past the commit interval):
/// inserts, updates and deletes, so snapshots carry deletion vectors and rewritten manifests.
async fn commits(client: &tokio_postgres::Client, t: &str, from: i32, n: i32) {
    for i in from..from + n {
        exec(
            client,
            &format!(
                "BEGIN;
                 INSERT INTO {t} VALUES ({k}, {i}, 'new {i}');
                 UPDATE {t} SET v = v + 1 WHERE id % 7 = {m};
                 DELETE FROM {t} WHERE id = {d};
                 COMMIT;",
                k = 1000 + i,
                m = i % 7,
                d = 3 * i + 1,
            ),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(450)).await;
    }
}

async fn equal_by_both_readers(p: &mut Pipeline, t: &str) {
    p.assert_equal(t, 60).await;
    if std::env::var("CDCD_TEST_DELETE_MODE").as_deref() == Ok("equality") {
        return; // pyiceberg refuses equality deletes; DuckDB read it above
    }
    let (code, out) = p.lakecheck(t, 30, &["--reader", "pyiceberg"]).await;
    assert_eq!(code, Some(0), "pyiceberg: {out}");
}

/// Runs `cdcd maintain` on `p`'s config with `extra` arguments.
pub(crate) fn maintain(p: &Pipeline, extra: &[&str]) -> std::process::Output {
    Command::new(cdcd_bin())
        .args(["maintain", "--config"])
        .arg(&p.config)
        .args(extra)
        .envs(p.env_vars.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_keeps_exactly_what_the_properties_say() {
    let (env, name) = ground_or_skip!(test_env_and_name("mexp"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    set_table_properties(
        &p,
        &[
            ("history.expire.min-snapshots-to-keep", "3"),
            ("history.expire.max-snapshot-age-ms", "1"),
            ("cdcd.expiry.delete-delay-ms", "0"),
            // Expiry alone: a compaction would add a snapshot (compaction tests below).
            ("cdcd.compaction.enabled", "false"),
        ],
    );
    // The daemon does not maintain here: `cdcd maintain` does, once, after it stopped.
    p.env_vars
        .push(("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "0".into()));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    commits(&client, &t, 0, 8).await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");

    let before = inspect(&p, &t);
    assert_consistent(&before, "before expiry");
    assert_eq!(
        before["properties"]["history.expire.min-snapshots-to-keep"],
        "3"
    );
    assert_eq!(
        before["properties"]["write.metadata.delete-after-commit.enabled"],
        "true"
    );
    let all = ids(&before);
    assert!(all.len() >= 9, "expected a snapshot per commit: {before}");

    // With no daemon holding the pipeline's lease, `cdcd maintain` runs one cycle and exits 0.
    let out = maintain(&p, &["--table", &format!("public.{t}")]);
    let text = crate::support::stdout_then_stderr(&out);
    assert!(out.status.success(), "cdcd maintain: {text}");
    assert!(
        text.contains(&format!("expired {} snapshots", all.len() - 3)),
        "{text}"
    );

    let after = inspect(&p, &t);
    assert_consistent(&after, "after expiry");
    assert_eq!(
        ids(&after),
        all[all.len() - 3..].to_vec(),
        "the newest three remain: {after}"
    );
    assert_eq!(after["current"], before["current"]);
    for id in ids(&after) {
        assert_eq!(
            after["rows"][id.to_string()],
            before["rows"][id.to_string()],
            "snapshot {id} reads the same rows as before expiry"
        );
    }
    // Nothing more to expire: a second cycle changes nothing.
    let versions = after["versions"].as_array().unwrap().len();
    let out = maintain(&p, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = inspect(&p, &t);
    assert_eq!(ids(&again), ids(&after));
    assert_eq!(again["versions"].as_array().unwrap().len(), versions);

    // The checkpoint survived: a restart resumes and streams on.
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    commits(&client, &t, 100, 2).await;
    equal_by_both_readers(&mut p, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn properties_set_by_another_engine_bound_snapshots_and_metadata_log() {
    let (env, name) = ground_or_skip!(test_env_and_name("mprop"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    p.env_vars
        .push(("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "300".into()));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    commits(&client, &t, 0, 6).await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    // cdcd's defaults keep a minute of snapshots: nothing expired yet.
    let before = inspect(&p, &t);
    let kept = ids(&before).len();
    assert!(kept >= 7, "{before}");

    // Another engine sets the properties; the daemon's next cycles follow them.
    let dir = p.table_dir(&t).display().to_string();
    let props = r#"{"history.expire.max-snapshot-age-ms": "1", "history.expire.min-snapshots-to-keep": "2", "write.metadata.previous-versions-max": "3", "cdcd.expiry.delete-delay-ms": "0"}"#;
    p.python(SET_PROPERTIES, &[&dir, props]);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    // The daemon holds the lease and maintains its tables itself: `cdcd maintain` refuses.
    let out = maintain(&p, &[]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && text.contains("already running"),
        "{text}"
    );
    commits(&client, &t, 100, 6).await;
    p.assert_equal(&t, 60).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let settled = loop {
        let v = inspect(&p, &t);
        let done = ids(&v).len() == 2 && v["versions"].as_array().unwrap().len() <= 4;
        if done || Instant::now() > deadline {
            break v;
        }
        p.assert_running();
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        ids(&settled).len(),
        2,
        "min-snapshots-to-keep = 2 with a 1 ms age: {settled}"
    );
    assert!(
        settled["metadata_log"].as_u64().unwrap() <= 3,
        "previous-versions-max = 3: {settled}"
    );
    // The current version and at most the three the log names.
    assert!(
        settled["versions"].as_array().unwrap().len() <= 4,
        "old metadata files deleted: {settled}"
    );
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let end = inspect(&p, &t);
    assert_consistent(&end, "after the daemon's cycles");
    equal_by_both_readers(&mut p, &t).await;
    let out = p.output();
    assert!(
        out.contains("maintenance cycle"),
        "a log line per cycle:\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_expiry_ends_equal_and_the_next_cycle_removes_leftovers() {
    let env = ground_or_skip!(test_env(&current_test()));
    for (i, point) in ["expire-after-commit", "expire-during-delete"]
        .iter()
        .enumerate()
    {
        let name = unique(&format!("mkill{i}"));
        let t = format!("{name}_t");
        let client = connect(&env.pg_url).await;
        exec(&client, &create_table(&t)).await;
        let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
        set_table_properties(
            &p,
            &[
                ("history.expire.min-snapshots-to-keep", "2"),
                ("history.expire.max-snapshot-age-ms", "1"),
                ("cdcd.expiry.delete-delay-ms", "0"),
                ("cdcd.compaction.enabled", "false"),
            ],
        );
        // Two commits first, without maintenance (nothing to expire past two snapshots).
        p.env_vars
            .push(("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "0".into()));
        p.start();
        p.wait_slot_active(&client, Duration::from_secs(120)).await;
        // A history of snapshots with deletes, rewritten manifests and vectors to expire.
        for k in 0..3 {
            commits(&client, &t, k * 100, 12).await;
        }
        p.assert_equal(&t, 60).await;
        let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
        assert_eq!(st.code(), Some(0), "{st}");
        let before = inspect(&p, &t);

        // The first cycle aborts at the crash point.
        p.env_vars = vec![
            ("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "300".into()),
            ("CDCD_FAILPOINT".into(), point.to_string()),
        ];
        p.start();
        p.assert_aborts_at(Duration::from_secs(60), point).await;
        let crashed = inspect(&p, &t);
        assert_eq!(
            crashed["missing"],
            Value::Array(vec![]),
            "{point}: {crashed}"
        );
        assert_eq!(
            ids(&crashed).len(),
            2,
            "{point}: the expiry committed: {crashed}"
        );
        assert!(
            !crashed["unreachable"].as_array().unwrap().is_empty(),
            "{point}: the crash left files behind: {crashed}"
        );
        for id in ids(&crashed) {
            assert_eq!(
                crashed["rows"][id.to_string()],
                before["rows"][id.to_string()]
            );
        }
        equal_by_both_readers(&mut p, &t).await;

        // Restarted: the next cycle finishes the interrupted expiry.
        p.env_vars = vec![("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "300".into())];
        p.start();
        p.wait_slot_active(&client, Duration::from_secs(120)).await;
        commits(&client, &t, 900, 2).await;
        p.assert_equal(&t, 60).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = inspect(&p, &t);
            if v["unreachable"].as_array().unwrap().is_empty() && ids(&v).len() == 2 {
                break;
            }
            assert!(Instant::now() < deadline, "{point}: leftovers remain: {v}");
            p.assert_running();
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
        assert_eq!(st.code(), Some(0), "{st}");
        assert_consistent(&inspect(&p, &t), point);
        equal_by_both_readers(&mut p, &t).await;
        // After the commit the journal leads back to the expired snapshots; during the
        // deletions the record of pending deletions names what is left.
        if *point == "expire-after-commit" {
            assert!(
                p.output().contains("finished an interrupted expiry"),
                "{point}:\n{}",
                p.output()
            );
        }
    }
}

/// Plans a scan of the table's current snapshot with pyiceberg (and reads it then), waits until
/// that snapshot has left the newest metadata (expired), then reads the planned files: what a
/// long query does when its snapshot expires under it. Prints the snapshot, the rows read at
/// planning and late (sorted ids), and the files the plan named.
const PLAN_THEN_READ_LATE: &str = r#"
import json, os, re, sys, time
from pyiceberg.table import StaticTable
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.expressions import AlwaysTrue
md = sys.argv[1] + "/metadata"
def newest():
    n = max(int(m.group(1)) for x in os.listdir(md) if (m := re.fullmatch(r"v(\d+)\.metadata\.json", x)))
    return f"{md}/v{n}.metadata.json"
t = StaticTable.from_metadata(newest())
snap = t.current_snapshot().snapshot_id
tasks = list(t.scan().plan_files())
files = sorted({x.file.file_path for x in tasks} | {d.file_path for x in tasks for d in x.delete_files})
then = sorted(ArrowScan(t.metadata, t.io, t.schema(), AlwaysTrue()).to_table(tasks).column("id").to_pylist())
print("planned", flush=True)
deadline = time.time() + 90
while True:
    try:
        cur = json.load(open(newest()))
    except (OSError, ValueError):
        continue
    if all(s["snapshot-id"] != snap for s in cur.get("snapshots", [])):
        break
    if time.time() > deadline:
        sys.exit("the planned snapshot never expired")
    time.sleep(0.2)
time.sleep(2)  # past the cycle that expired it (every 300 ms), which deletes with a zero delay
late = sorted(ArrowScan(t.metadata, t.io, t.schema(), AlwaysTrue()).to_table(tasks).column("id").to_pylist())
print(json.dumps({"snapshot": snap, "then": then, "late": late, "files": files}))
"#;

/// The paused reader that wakes up late: a scan planned on a snapshot still reads it whole after
/// expiry removed the snapshot from the metadata (its files wait `cdcd.expiry.delete-delay-ms`),
/// a `kill -9` after that expiry loses the record of what waits for deletion nowhere, and once
/// the delay passed the restarted daemon deletes the files no snapshot reaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_scan_outlives_its_expired_snapshot_by_the_delete_delay() {
    if std::env::var("CDCD_TEST_DELETE_MODE").as_deref() == Ok("equality") {
        return; // pyiceberg refuses equality deletes; the unit tests cover both modes
    }
    let (env, name) = ground_or_skip!(test_env_and_name("mdelay"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    const DELAY_MS: u64 = 15_000;
    set_table_properties(
        &p,
        &[
            ("history.expire.min-snapshots-to-keep", "1"),
            ("history.expire.max-snapshot-age-ms", "1"),
            ("cdcd.expiry.delete-delay-ms", &DELAY_MS.to_string()),
            ("cdcd.compaction.enabled", "false"),
        ],
    );
    p.env_vars
        .push(("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "300".into()));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    commits(&client, &t, 0, 4).await;
    p.assert_equal(&t, 60).await;

    let mut reader = Command::new(&env.python)
        .arg("-c")
        .arg(PLAN_THEN_READ_LATE)
        .arg(p.table_dir(&t))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(reader.stdout.take().unwrap());
    let planned = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut lines, &mut line).unwrap();
        (line, lines)
    })
    .await
    .unwrap();
    assert_eq!(planned.0.trim(), "planned");
    // Updates and deletes of the planned rows: their vectors are replaced, so the planned
    // snapshot's vectors are reached by it alone once it expires.
    let expired_at = Instant::now();
    commits(&client, &t, 10, 3).await;
    let (status, rest) = tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        let mut lines = planned.1;
        std::io::Read::read_to_string(&mut lines, &mut rest).unwrap();
        (reader.wait().unwrap(), rest)
    })
    .await
    .unwrap();
    assert!(status.success(), "the late read failed: {rest}");
    let read: Value = serde_json::from_str(rest.trim()).unwrap();
    assert_eq!(read["late"], read["then"], "the late read differs: {read}");
    assert!(
        expired_at.elapsed() < Duration::from_millis(DELAY_MS),
        "the test was too slow to prove anything: {:?}",
        expired_at.elapsed()
    );

    // The files wait for the delay through a kill -9; the restarted daemon deletes them.
    let waiting = inspect(&p, &t);
    let unreachable = waiting["unreachable"].as_array().unwrap().clone();
    assert!(
        !unreachable.is_empty(),
        "the expiry doomed nothing: {waiting}"
    );
    p.kill9();
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    let deadline = Instant::now() + Duration::from_millis(DELAY_MS) + Duration::from_secs(60);
    let done = loop {
        let v = inspect(&p, &t);
        if v["unreachable"].as_array().unwrap().is_empty() {
            break v;
        }
        assert!(Instant::now() < deadline, "files wait past the delay: {v}");
        p.assert_running();
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_consistent(&done, "after the delay");
    let planned_files: Vec<&str> = read["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let gone = planned_files
        .iter()
        .filter(|f| !std::path::Path::new(f.trim_start_matches("file://")).exists())
        .count();
    assert!(gone > 0, "none of the planned files was deleted: {read}");
    equal_by_both_readers(&mut p, &t).await;
}

/// The current snapshot's manifests read by pyiceberg (count, by content) and how many
/// snapshots merged manifests (`manifests-created` in their summary).
const MANIFESTS: &str = r#"
import json, os, re, sys
from pyiceberg.table import StaticTable
md = sys.argv[1] + "/metadata"
n = max(int(m.group(1)) for x in os.listdir(md) if (m := re.fullmatch(r"v(\d+)\.metadata\.json", x)))
path = f"{md}/v{n}.metadata.json"
t = StaticTable.from_metadata(path)
ms = t.current_snapshot().manifests(t.io)
snaps = json.load(open(path)).get("snapshots", [])
print(json.dumps({
    "manifests": len(ms),
    "data": sum(1 for m in ms if int(m.content) == 0),
    "deletes": sum(1 for m in ms if int(m.content) == 1),
    "existing_files": sum(m.existing_files_count or 0 for m in ms),
    "merges": sum(1 for s in snaps if "manifests-created" in s.get("summary", {})),
}))
"#;

fn manifests(p: &Pipeline, table: &str) -> Value {
    let dir = p.table_dir(table).display().to_string();
    let out = p.python(MANIFESTS, &[&dir]);
    serde_json::from_str(out.lines().last().unwrap_or("")).unwrap()
}

fn cleanup(p: &Pipeline) -> String {
    let out = Command::new(cdcd_bin())
        .args(["cleanup", "--grace-secs", "0", "--config"])
        .arg(&p.config)
        .envs(p.env_vars.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let text = crate::support::stdout_then_stderr(&out);
    assert!(out.status.success(), "cdcd cleanup: {text}");
    text
}

/// Issue 19, manifest merging: 45 small commits (inserts, and updates and deletes of the same
/// rows) with `commit.manifest.min-count-to-merge = 5`; the current snapshot's manifest list
/// stays bounded instead of growing by one or two manifests per commit, and both readers see
/// the source's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_merging_keeps_the_manifest_list_bounded() {
    let (env, name) = ground_or_skip!(test_env_and_name("mmerge"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    set_table_properties(&p, &[("commit.manifest.min-count-to-merge", "5")]);
    p.env_vars
        .push(("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "0".into()));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    commits(&client, &t, 0, 45).await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let v = inspect(&p, &t);
    assert_consistent(&v, "after merging commits");
    let snapshots = ids(&v).len();
    let m = manifests(&p, &t);
    eprintln!("{snapshots} snapshots; current manifest list: {m}");
    assert!(snapshots >= 40, "a snapshot per commit: {v}");
    // Per kind: the commit's own manifest, at most 4 waiting for the 5th, one merged.
    assert!(m["manifests"].as_u64().unwrap() <= 12, "{m}");
    assert!(m["merges"].as_u64().unwrap() >= 5, "{m}");
    assert!(m["existing_files"].as_u64().unwrap() > 0, "{m}");
    equal_by_both_readers(&mut p, &t).await;
}

/// Issue 19: `kill -9` in a commit that has written a merged manifest but not its manifest list
/// or metadata. The table stays readable (the commit did not happen), the merged manifest is an
/// orphan that `cdcd cleanup` removes, and a restart replays the lost commit and ends equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_a_merging_commit_ends_equal() {
    let (env, name) = ground_or_skip!(test_env_and_name("mmkill"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    set_table_properties(&p, &[("commit.manifest.min-count-to-merge", "3")]);
    p.env_vars = vec![
        ("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "0".into()),
        ("CDCD_FAILPOINT".into(), "commit-after-merge".into()),
    ];
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    commits(&client, &t, 0, 8).await;
    p.assert_aborts_at(Duration::from_secs(60), "commit-after-merge")
        .await;
    let crashed = inspect(&p, &t);
    assert_eq!(crashed["missing"], Value::Array(vec![]), "{crashed}");
    let orphans = crashed["unreachable"].as_array().unwrap();
    assert!(
        orphans
            .iter()
            .any(|f| f.as_str().unwrap().ends_with("-g0.avro")),
        "the merged manifest is left behind: {crashed}"
    );
    // The daemon is down: cleanup with no grace removes the crashed commit's files.
    cleanup(&p);
    let cleaned = inspect(&p, &t);
    assert_consistent(&cleaned, "after cdcd cleanup");

    p.env_vars = vec![("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "0".into())];
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    commits(&client, &t, 100, 4).await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    assert_consistent(&inspect(&p, &t), "after the restart");
    assert!(manifests(&p, &t)["merges"].as_u64().unwrap() >= 1);
    equal_by_both_readers(&mut p, &t).await;
}

/// The current snapshot's summary (operation, totals) and how many snapshots are `replace`s.
const CURRENT: &str = r#"
import json, os, re, sys
md = sys.argv[1] + "/metadata"
n = max(int(m.group(1)) for x in os.listdir(md) if (m := re.fullmatch(r"v(\d+)\.metadata\.json", x)))
m = json.load(open(f"{md}/v{n}.metadata.json"))
snaps = {s["snapshot-id"]: s for s in m.get("snapshots", [])}
cur = snaps.get(m.get("current-snapshot-id"), {}).get("summary", {})
print(json.dumps({
    "summary": cur,
    "replaces": sum(1 for s in snaps.values() if s.get("summary", {}).get("operation") == "replace"),
}))
"#;

fn current(p: &Pipeline, table: &str) -> Value {
    let dir = p.table_dir(table).display().to_string();
    let out = p.python(CURRENT, &[&dir]);
    serde_json::from_str(out.lines().last().unwrap_or("")).unwrap()
}

fn total(v: &Value, key: &str) -> u64 {
    v["summary"][key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Compaction makes work quickly: every file is small at a 1 MB target, three make a rewrite.
const COMPACTING: [(&str, &str); 2] = [
    ("write.target-file-size-bytes", "1000000"),
    ("cdcd.compaction.min-input-files", "3"),
];

/// A started pipeline (config `sink_extra` of its table's name) on a new [`create_table`] table
/// with the [`COMPACTING`] properties, compacting every 300 ms; with its source client and table.
async fn compacting_every_300_ms(
    tag: &str,
    sink_extra: impl Fn(&str) -> String,
) -> Option<(Pipeline, tokio_postgres::Client, String)> {
    let (env, name) = test_env_and_name(tag)?;
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let settings = Settings {
        sink_extra: sink_extra(&t),
        ..Settings::default()
    };
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &settings);
    set_table_properties(&p, &COMPACTING);
    p.env_vars
        .push(("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "300".into()));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    Some((p, client, t))
}

/// Issue 19, data-file compaction: the daemon compacts every 300 ms while 30 transactions
/// update and delete rows of the same table (the seed rows, which compaction moves, among
/// them); the lake ends equal to the source by DuckDB and pyiceberg, and the current snapshot
/// holds a handful of data files instead of one per commit. With
/// `CDCD_TEST_DELETE_MODE=equality` (format v2) the rewrites apply the equality and position
/// deletes and drop those that no longer apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_racing_streaming_updates_and_deletes_ends_equal() {
    let (mut p, client, t) =
        ground_or_skip!(compacting_every_300_ms("mcomp", |_| String::new()).await);
    commits(&client, &t, 0, 30).await;
    p.assert_equal(&t, 60).await;
    // Updates and deletes of rows every compaction so far has moved.
    exec(
        &client,
        &format!("UPDATE {t} SET s = 'moved' WHERE id <= 100; DELETE FROM {t} WHERE id % 5 = 0;"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let v = inspect(&p, &t);
    assert_eq!(v["missing"], Value::Array(vec![]), "{v}");
    equal_by_both_readers(&mut p, &t).await;
    let c = current(&p, &t);
    eprintln!("current snapshot after compaction: {c}");
    assert!(c["replaces"].as_u64().unwrap() >= 3, "compactions ran: {c}");
    assert!(
        total(&c, "total-data-files") <= 8,
        "a few data files instead of one per commit: {c}"
    );
    let out = p.output();
    assert!(
        out.contains("compaction committed"),
        "a log line per compaction:\n{out}"
    );
}

/// Issue 19, compaction beside replication: a compaction rewrites without the table's lock,
/// here paused 1.5 s between its rewrite and its commit (`CDCD_PAUSEPOINT`), while transactions
/// update and delete the rows it rewrites. Streaming commits land during the pause, the deletes
/// they commit meanwhile are carried over into the compaction's outputs (v3: vectors its log
/// line counts; v2: its outputs keep the starting sequence number, so the equality deletes
/// committed meanwhile apply to them), and the lake ends equal to the source by DuckDB and
/// pyiceberg. Then `kill -9` during a pause: the restart ends equal too, also read by Spark
/// (Iceberg-Java: the reference implementation reads cdcd's vectors or equality deletes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_compaction_lets_commits_through_and_carries_their_deletes() {
    let env = ground_or_skip!(test_env(&current_test()));
    let v2 = std::env::var("CDCD_TEST_DELETE_MODE").as_deref() == Ok("equality");
    let name = unique("mcpause");
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    set_table_properties(&p, &COMPACTING);
    let paused = vec![
        ("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "300".into()),
        ("CDCD_PAUSEPOINT".into(), "compact-rewritten:1500".into()),
    ];
    p.env_vars = paused.clone();
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    let writes = |from: i32| {
        format!(
            "UPDATE {t} SET s = 'moved {from}' WHERE id % 3 = {m}; DELETE FROM {t} WHERE id % 11 = {d};",
            m = from % 3,
            d = from % 11,
        )
    };
    commits(&client, &t, 0, 12).await;
    for round in 0..6 {
        exec(&client, &writes(round)).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    p.assert_equal(&t, 60).await;
    let out = p.output();
    let carried: u64 = out
        .lines()
        .filter(|l| l.contains("compaction committed"))
        .filter_map(|l| log_field(l, "deletes_carried"))
        .sum();
    assert!(
        out.contains("pause point"),
        "the pause point was reached:\n{out}"
    );
    if !v2 {
        assert!(
            carried > 0,
            "deletes committed during a paused rewrite were carried over:\n{out}"
        );
    }
    let committed = out.matches("compaction committed").count();
    let stale = out.matches("compaction went stale").count();
    eprintln!("compactions: {committed} committed, {stale} stale; deletes carried over: {carried}");
    assert!(committed > 0, "paused compactions committed:\n{out}");

    // kill -9 while a compaction is paused with its outputs written; the restart ends equal.
    let before = p.output().matches("pause point").count();
    let paused = |p: &Pipeline| p.output().matches("pause point").count() > before;
    let mut round = 7;
    while !paused(&p) && round < 60 {
        exec(&client, &writes(round)).await;
        commits(&client, &t, 200 + round, 1).await;
        round += 1;
    }
    assert!(paused(&p), "another compaction paused:\n{}", p.output());
    exec(&client, &writes(round)).await;
    p.kill9();
    let crashed = inspect(&p, &t);
    assert_eq!(crashed["missing"], Value::Array(vec![]), "{crashed}");
    p.env_vars = vec![("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "300".into())];
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(&client, &writes(9)).await;
    commits(&client, &t, 100, 3).await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    equal_by_both_readers(&mut p, &t).await;
    p.assert_equal_by_spark(&t).await;
    let v = inspect(&p, &t);
    assert_eq!(v["missing"], Value::Array(vec![]), "{v}");
}

/// Issue 19, a stop in the middle of a compaction: SIGTERM while a compaction is paused 3 s
/// between its rewrite and its commit. The daemon lets the cycle end before it exits (it waits up
/// to 10 s for it), so the compaction commits (or finds itself stale and deletes its outputs):
/// no file is left that no snapshot reaches, and the lake is equal by both readers. Before,
/// the stop dropped the cycle where it was and its outputs waited for `cdcd cleanup`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_lets_a_running_compaction_end() {
    let (env, name) = ground_or_skip!(test_env_and_name("mcstop"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    set_table_properties(&p, &COMPACTING);
    p.env_vars = vec![
        ("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "300".into()),
        ("CDCD_PAUSEPOINT".into(), "compact-rewritten:3000".into()),
    ];
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    let mut round = 0;
    while !p.output().contains("pause point") && round < 60 {
        commits(&client, &t, round, 1).await;
        round += 1;
    }
    assert!(
        p.output().contains("pause point"),
        "a compaction paused:\n{}",
        p.output()
    );
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let out = p.output();
    let after_stop = out.split_once("SIGTERM").map(|(_, a)| a).unwrap_or("");
    assert!(
        after_stop.contains("compaction committed") || after_stop.contains("compaction went stale"),
        "the paused compaction ended after the stop:\n{out}"
    );
    let v = inspect(&p, &t);
    assert_consistent(&v, "after a stop during a compaction");
    equal_by_both_readers(&mut p, &t).await;
}

/// Issue 19, scans stay short between cycles: with the daemon's default interval (60 s) a table
/// whose commits leave `cdcd.compaction.trigger-small-files` small files gets its compaction
/// at once; the test ends long before the first scheduled cycle, the current snapshot holds a
/// few data files, and the lake is equal by both readers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_ask_for_a_compaction_before_the_interval() {
    let (env, name) = ground_or_skip!(test_env_and_name("mctrig"));
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    set_table_properties(
        &p,
        &[
            COMPACTING[0],
            COMPACTING[1],
            ("cdcd.compaction.trigger-small-files", "4"),
        ],
    );
    p.env_vars
        .push(("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "60000".into()));
    let began = Instant::now();
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    commits(&client, &t, 0, 12).await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    assert!(
        began.elapsed() < Duration::from_secs(55),
        "before the first interval"
    );
    let out = p.output();
    assert!(
        out.contains("compaction committed"),
        "a commit asked for a compaction:\n{out}"
    );
    let c = current(&p, &t);
    assert!(c["replaces"].as_u64().unwrap() >= 1, "{c}");
    assert!(total(&c, "total-data-files") <= 6, "{c}");
    equal_by_both_readers(&mut p, &t).await;
}

/// Issue 19, Jepsen-style: a writer keeps inserting, updating and deleting rows while the daemon
/// compacts every 200 ms, each compaction paused a random 100–800 ms between its rewrite and its
/// commit (so streaming commits land inside it), and cdcd is killed (`kill -9`) after a random
/// 0.5–3 s, six times: in a rewrite, in a pause, in a commit, in plain streaming. A last start
/// catches up; the lake ends equal to the source by DuckDB and pyiceberg with no file missing.
/// The seed is printed (CDCD_TEST_SEED repeats a run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_at_random_moments_of_compaction() {
    random_kills_during_compaction(
        "kill_dash_nine_at_random_moments_of_compaction",
        "mcrand",
        &[""],
    )
    .await;
}

/// Issue 36: the same on a partitioned table, `truncate(20, v)` and `bucket(2, id)`: the
/// writer's `v = v + 1` moves rows across partitions while compactions rewrite each partition
/// on its own and are killed. Besides equality, every data file's rows lie in the partition its
/// entry names and every vector sits in its data file's partition (the pyiceberg layout check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_at_random_moments_of_partitioned_compaction() {
    let (p, t) = ground_or_skip!(
        random_kills_during_compaction(
            "kill_dash_nine_at_random_moments_of_partitioned_compaction",
            "mcpart",
            &["partition_by = [\"truncate(20, v)\", \"bucket(2, id)\"]\n"],
        )
        .await
    );
    let layout = super::partitioned::layout_of(&p.env.python, &p.table_dir(&t));
    eprintln!("layout: {layout}");
    assert!(layout["partitions"].as_u64().unwrap() > 10, "{layout}");
    assert!(layout["cdcd_replaces"].as_u64().unwrap() >= 1, "{layout}");
}

/// Issue 36: the same while compactions rewrite the files of an older spec into the current
/// one (cdcd's `partition_by` changed from `bucket(2, id)` to `truncate(20, v)` + `bucket(3,
/// id)`, sorted by `v`): the rows of one old file split over several partitions, and the deletes
/// the writer commits into them meanwhile are carried to where each row landed. A last `cdcd
/// maintain` leaves no data file of the old spec, every file sorted, and the lake equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_at_random_moments_of_compaction_into_a_new_spec() {
    let (mut p, t) = ground_or_skip!(
        random_kills_during_compaction(
            "kill_dash_nine_at_random_moments_of_compaction_into_a_new_spec",
            "mcrespec",
            &[
                "partition_by = [\"bucket(2, id)\"]\n",
                "partition_by = [\"truncate(20, v)\", \"bucket(3, id)\"]\nsort_by = [\"v\"]\n",
            ],
        )
        .await
    );
    let seen = super::partitioned::layout_of(&p.env.python, &p.table_dir(&t));
    eprintln!("layout after the kills: {seen}");
    let out = maintain(&p, &["--table", &format!("public.{t}")]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cdcd maintain:\n{text}");
    let seen = super::partitioned::layout_of(&p.env.python, &p.table_dir(&t));
    eprintln!("layout after cdcd maintain: {seen}");
    assert_eq!(seen["old_spec_files"], 0, "{seen}");
    assert_eq!(seen["unsorted_files"], 0, "{seen}");
    assert!(seen["partitions"].as_u64().unwrap() > 10, "{seen}");
    equal_after_evolution(&mut p, &t, 0).await;
    p.assert_equal_by_spark(&t).await;
}

/// Equal to the source on a table whose spec evolved, waiting up to `wait_secs`: by pyiceberg, or
/// by Spark under `CDCD_TEST_DELETE_MODE=equality` (pyiceberg reads no equality deletes; DuckDB
/// 1.5.5 misreads a table whose spec evolved).
async fn equal_after_evolution(p: &mut Pipeline, t: &str, wait_secs: u32) {
    let reader = match std::env::var("CDCD_TEST_DELETE_MODE").as_deref() {
        Ok("equality") => "spark",
        _ => "pyiceberg",
    };
    let (code, out) = p.lakecheck(t, wait_secs, &["--reader", reader]).await;
    assert_eq!(code, Some(0), "{reader}: {out}");
}

/// Issue 36: on a table with a sort order (`sort_by = ["v"]`), compaction writes its outputs in
/// that order and says so (the data file's `sort_order_id`), as streaming commits do: every live
/// data file is of the sort order and sorted by `v` (pyarrow reads each), and the lake is equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_writes_its_outputs_in_the_sort_order() {
    let sorted = |t: &str| format!("[sink.tables.\"public.{t}\"]\nsort_by = [\"v\"]\n");
    let (mut p, client, t) = ground_or_skip!(compacting_every_300_ms("msort", sorted).await);
    commits(&client, &t, 0, 12).await;
    p.assert_equal(&t, 60).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let seen = super::partitioned::layout_of(&p.env.python, &p.table_dir(&t));
    eprintln!("layout: {seen}");
    assert!(seen["cdcd_replaces"].as_u64().unwrap() >= 1, "{seen}");
    assert_eq!(seen["unsorted_files"], 0, "{seen}");
    assert!(seen["sorted_files"].as_u64().unwrap() >= 1, "{seen}");
    equal_by_both_readers(&mut p, &t).await;
}

/// Kills cdcd at random moments of compaction (see the test above) on a table whose
/// `[sink.tables]` section holds `sections[0]`; returns the stopped pipeline and its table. With
/// a second section, cdcd first copies and streams a few commits under the first, then starts
/// under the second (its spec evolves at start), so the kills land in compactions that rewrite
/// the first spec's files into the second; the lake is then read by pyiceberg and Spark (DuckDB
/// 1.5.5 misreads a table whose spec evolved).
async fn random_kills_during_compaction(
    test: &str,
    tag: &str,
    sections: &[&str],
) -> Option<(Pipeline, String)> {
    let env = test_env(test)?;
    let mut rng = crate::support::Rng::from_env_or_clock(test);
    let name = unique(tag);
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let section = |keys: &str| match keys {
        "" => String::new(),
        keys => format!("[sink.tables.\"public.{t}\"]\n{keys}"),
    };
    let first = section(sections.first().copied().unwrap_or(""));
    let settings = Settings {
        sink_extra: first.clone(),
        ..Settings::default()
    };
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &settings);
    set_table_properties(&p, &COMPACTING);
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    let evolved = sections.get(1).map(|next| section(next));
    if let Some(next) = &evolved {
        commits(&client, &t, 0, 8).await;
        p.assert_equal(&t, 60).await;
        p.sigterm_and_wait(Duration::from_secs(60)).await;
        let text = std::fs::read_to_string(&p.config).unwrap();
        assert!(text.contains(&first), "{text}");
        std::fs::write(&p.config, text.replacen(&first, next, 1)).unwrap();
        p.start();
        p.wait_slot_active(&client, Duration::from_secs(120)).await;
    }
    let (stop, writer) = changing_writer(&env, &t).await;
    kill_while_compacting(&mut p, &client, &t, &mut rng, 6, (500, 3_000)).await;
    p.env_vars = vec![("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "200".into())];
    p.start();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.await.unwrap();
    eprintln!("{written} write transactions");
    if evolved.is_some() {
        equal_after_evolution(&mut p, &t, 120).await;
    } else {
        p.assert_equal(&t, 120).await;
    }
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    if evolved.is_some() {
        equal_after_evolution(&mut p, &t, 0).await;
        p.assert_equal_by_spark(&t).await;
    } else {
        equal_by_both_readers(&mut p, &t).await;
    }
    let out = p.output();
    let committed = out.matches("compaction committed").count();
    eprintln!("{committed} compactions committed");
    assert!(committed > 0, "compactions ran:\n{out}");
    Some((p, t))
}

/// Issue 19: `kill -9` during a compaction, after its files and manifest list are written but
/// before its commit, and right after its commit (the primary-key index not yet told). Both end
/// readable and equal; the restarted daemon updates and deletes moved rows correctly (its index
/// caught up from the table after the second), and `cdcd cleanup` removes the first's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_compaction_ends_equal() {
    let env = ground_or_skip!(test_env("kill9_during_compaction_ends_equal"));
    for (i, point) in ["compact-before-commit", "compact-after-commit"]
        .iter()
        .enumerate()
    {
        let name = unique(&format!("mckill{i}"));
        let t = format!("{name}_t");
        let client = connect(&env.pg_url).await;
        exec(&client, &create_table(&t)).await;
        let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
        set_table_properties(&p, &COMPACTING);
        p.env_vars
            .push(("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "0".into()));
        p.start();
        p.wait_slot_active(&client, Duration::from_secs(120)).await;
        commits(&client, &t, 0, 8).await;
        p.assert_equal(&t, 60).await;
        let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
        assert_eq!(st.code(), Some(0), "{st}");
        let before = inspect(&p, &t);

        p.env_vars = vec![
            ("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "300".into()),
            ("CDCD_FAILPOINT".into(), point.to_string()),
        ];
        p.start();
        p.assert_aborts_at(Duration::from_secs(60), point).await;
        let crashed = inspect(&p, &t);
        assert_eq!(
            crashed["missing"],
            Value::Array(vec![]),
            "{point}: {crashed}"
        );
        let committed = crashed["current"] != before["current"];
        assert_eq!(
            committed,
            *point == "compact-after-commit",
            "{point}: {crashed}"
        );
        if !committed {
            assert!(
                !crashed["unreachable"].as_array().unwrap().is_empty(),
                "{point}: the rewritten files are left behind: {crashed}"
            );
        }
        equal_by_both_readers(&mut p, &t).await;

        // Restarted: moved rows are updated and deleted, and compaction goes on.
        p.env_vars = vec![("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "300".into())];
        p.start();
        p.wait_slot_active(&client, Duration::from_secs(120)).await;
        commits(&client, &t, 900, 4).await;
        exec(
            &client,
            &format!(
                "UPDATE {t} SET s = 'after' WHERE id <= 60; DELETE FROM {t} WHERE id % 9 = 0;"
            ),
        )
        .await;
        p.assert_equal(&t, 60).await;
        let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
        assert_eq!(st.code(), Some(0), "{st}");
        equal_by_both_readers(&mut p, &t).await;
        assert!(current(&p, &t)["replaces"].as_u64().unwrap() >= 1);
        // The daemon is down: cleanup with no grace removes a crashed compaction's files.
        cleanup(&p);
        let cleaned = inspect(&p, &t);
        assert_eq!(
            cleaned["missing"],
            Value::Array(vec![]),
            "{point}: {cleaned}"
        );
        assert_eq!(
            cleaned["unreachable"],
            Value::Array(vec![]),
            "{point}: {cleaned}"
        );
        equal_by_both_readers(&mut p, &t).await;
    }
}

/// Issue 19: compaction of files written under older schemas. Rows written before `ADD COLUMN`
/// and before widening `int4 → int8`, `float4 → float8`, `numeric(8,2) → numeric(12,2)` are
/// rewritten into files of the current schema (the added column NULL, or its constant default on
/// v3; the widened ones cast) by `cdcd maintain`; both readers see the source, and the daemon
/// streams on over the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_rewrites_files_of_older_schemas() {
    let (env, t) = ground_or_skip!(test_env_and_name("mcsev"));
    let client = fresh_table(&env, &t, |t| {
        format!(
            "CREATE TABLE {t} (id int4 PRIMARY KEY, x int4, f float4, n numeric(8,2));
             INSERT INTO {t} SELECT g, g, g / 4.0, g / 3.0 FROM generate_series(1, 100) g;"
        )
    })
    .await;
    let mut p = Pipeline::owning_tables(&env, &t, &[&t], &Settings::default());
    set_table_properties(&p, &COMPACTING);
    p.env_vars
        .push(("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "0".into()));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    for sql in [
        format!("UPDATE {t} SET x = -x WHERE id <= 10; DELETE FROM {t} WHERE id = 11;"),
        format!("ALTER TABLE {t} ADD COLUMN c text"),
        format!("INSERT INTO {t} VALUES (1001, 1, 1.5, 1.25, 'c'); UPDATE {t} SET c = 'set' WHERE id BETWEEN 20 AND 25;"),
        format!("ALTER TABLE {t} ALTER COLUMN x TYPE bigint, ALTER COLUMN f TYPE float8, ALTER COLUMN n TYPE numeric(12,2)"),
        format!("INSERT INTO {t} VALUES (1002, 5000000000, 1e300, 1234567890.12, 'w'); DELETE FROM {t} WHERE id = 30;"),
        format!("UPDATE {t} SET x = x * 10000000 WHERE id BETWEEN 40 AND 45;"),
    ] {
        exec(&client, &sql).await;
        tokio::time::sleep(Duration::from_millis(450)).await;
    }
    // v3 only (a v2 table cannot store a default and stops): a column added with a constant
    // default, which the rows of every earlier file read (issue 20), and the rewrite must keep.
    if std::env::var("CDCD_TEST_DELETE_MODE").as_deref() != Ok("equality") {
        exec(
            &client,
            &format!("ALTER TABLE {t} ADD COLUMN k int4 DEFAULT 5"),
        )
        .await;
        exec(
            &client,
            &format!(
                "INSERT INTO {t} (id, k) VALUES (1003, 6); UPDATE {t} SET k = 7 WHERE id = 50;"
            ),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(450)).await;
    }
    equal_by_both_readers(&mut p, &t).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");

    let out = maintain(&p, &["--table", &format!("public.{t}")]);
    let text = crate::support::stdout_then_stderr(&out);
    assert!(out.status.success(), "cdcd maintain: {text}");
    assert!(!text.contains("rewrote 0 data files"), "{text}");
    let c = current(&p, &t);
    assert_eq!(c["summary"]["operation"], "replace", "{c}");
    assert_eq!(total(&c, "total-data-files"), 1, "{c}");
    equal_by_both_readers(&mut p, &t).await;

    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    exec(
        &client,
        &format!(
            "UPDATE {t} SET c = 'after', x = 7 WHERE id <= 50; DELETE FROM {t} WHERE id % 4 = 0;"
        ),
    )
    .await;
    equal_by_both_readers(&mut p, &t).await;
    p.assert_running();
}

/// Issue 19, format v2, Jepsen-style: compaction leaves every file past 75% of a 1.6 KB target in
/// place (the seed file among them), so the equality deletes of the streamed updates and deletes
/// of its rows can leave only as position deletes (`compaction/convert.rs`). A writer keeps
/// changing those rows while the daemon compacts every 200 ms, each compaction paused a random
/// 100–800 ms between its work and its commit, and cdcd is killed at four random moments. The
/// lake ends equal by DuckDB; a last cycle leaves no equality delete, and then pyiceberg (which
/// refuses tables with equality deletes) reads it equal too. The seed is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equality_deletes_of_large_files_become_positions_through_kills() {
    let test = "equality_deletes_of_large_files_become_positions_through_kills";
    let env = ground_or_skip!(test_env(test));
    let mut rng = crate::support::Rng::from_env_or_clock(test);
    let name = unique("mcconv");
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(&client, &create_table(&t)).await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    p.force_equality();
    set_table_properties(
        &p,
        &[
            ("write.target-file-size-bytes", "1600"),
            ("cdcd.compaction.min-input-files", "3"),
        ],
    );
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    let (stop, writer) = changing_writer(&env, &t).await;
    kill_while_compacting(&mut p, &client, &t, &mut rng, 4, (800, 3_000)).await;
    p.env_vars = vec![("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "200".into())];
    p.start();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.await.unwrap();
    eprintln!("{written} write transactions");
    p.assert_equal(&t, 120).await;
    // The source is quiet: the next cycles convert what the last commits left.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = current(&p, &t);
        if total(&c, "total-equality-deletes") == 0 && total(&c, "total-data-files") > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "equality deletes remain: {c}");
        p.assert_running();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let out = p.output();
    let converted: u64 = out
        .lines()
        .filter_map(|l| l.split("positions_converted=").nth(1))
        .filter_map(|v| {
            v.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(converted > 0, "no compaction converted a position:\n{out}");
    let c = current(&p, &t);
    assert!(total(&c, "total-position-deletes") > 0, "{c}");
    p.assert_equal(&t, 10).await;
    let (code, out) = p.lakecheck(&t, 30, &["--reader", "pyiceberg"]).await;
    assert_eq!(code, Some(0), "pyiceberg: {out}");
}

type Stop = std::sync::Arc<std::sync::atomic::AtomicBool>;

/// A writer that inserts, updates (the seed rows among them) and deletes rows of `t` every 80 ms
/// until stopped; its task returns how many transactions it committed.
async fn changing_writer(env: &TestEnv, t: &str) -> (Stop, tokio::task::JoinHandle<i64>) {
    let stop: Stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (client, t, flag) = (connect(&env.pg_url).await, t.to_owned(), stop.clone());
    let task = tokio::spawn(async move {
        let mut i = 0i64;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            let sql = format!(
                "BEGIN;
                 INSERT INTO {t} VALUES ({k}, {i}, 'w {i}');
                 UPDATE {t} SET v = v + 1 WHERE id % 7 = {m};
                 UPDATE {t} SET s = 'u {i}' WHERE id % 11 = {n};
                 DELETE FROM {t} WHERE id = {d} OR id = {k2};
                 COMMIT;",
                k = 100_000 + i,
                m = i % 7,
                n = i % 11,
                d = (i * 37) % 200 + 1,
                k2 = 100_000 + i / 2,
            );
            if client.batch_execute(&sql).await.is_err() {
                break;
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(80)).await;
        }
        i
    });
    (stop, task)
}

/// `rounds` times: cdcd runs with a cycle every 200 ms, each compaction paused a random
/// 100–800 ms between its work and its commit, and is killed (`kill -9`) after a random time in
/// `wait_ms`; each crash must leave every file the table references on disk. The first round
/// uses the running process.
async fn kill_while_compacting(
    p: &mut Pipeline,
    client: &tokio_postgres::Client,
    t: &str,
    rng: &mut crate::support::Rng,
    rounds: u32,
    wait_ms: (u64, u64),
) {
    for round in 0..rounds {
        let pause = rng.range(100, 800);
        p.env_vars = vec![
            ("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "200".into()),
            (
                "CDCD_PAUSEPOINT".into(),
                format!("compact-rewritten:{pause}"),
            ),
        ];
        if round > 0 {
            p.start();
        }
        let wait = rng.range(wait_ms.0, wait_ms.1);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        p.assert_running();
        eprintln!("round {round}: compactions paused {pause} ms, kill -9 after {wait} ms");
        p.kill9();
        p.wait_slot_inactive(client, Duration::from_secs(30)).await;
        let crashed = inspect(p, t);
        assert_eq!(
            crashed["missing"],
            Value::Array(vec![]),
            "round {round}: {crashed}"
        );
    }
}

/// A started pipeline that copied a new table of 400k rows in ~80 commits of 5,000 rows, with the
/// [`COMPACTING`] properties and maintenance every `maintenance_ms` (0: none); with its source
/// client and table.
async fn copied_in_80_commits(
    tag: &str,
    maintenance_ms: u64,
) -> Option<(Pipeline, tokio_postgres::Client, String)> {
    let (env, name) = test_env_and_name(tag)?;
    let t = format!("{name}_t");
    let client = connect(&env.pg_url).await;
    exec(
        &client,
        &format!(
            "DROP TABLE IF EXISTS {t};
             CREATE TABLE {t} (id int PRIMARY KEY, v int, s text);
             INSERT INTO {t} SELECT g, g, 'seed ' || g FROM generate_series(1, 400000) g;"
        ),
    )
    .await;
    let mut p = Pipeline::owning_tables(&env, &name, &[&t], &Settings::default());
    crate::support::tune_copy(&p.config, 5000, Some(1), Some(5000));
    set_table_properties(&p, &COMPACTING);
    p.env_vars.push((
        "CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(),
        maintenance_ms.to_string(),
    ));
    p.start();
    p.wait_slot_active(&client, Duration::from_secs(120)).await;
    p.assert_equal(&t, 120).await;
    Some((p, client, t))
}

/// Issue 37: a table is not compacted while its initial copy is under way (each copy commit adds
/// a file, and compacting them meanwhile rewrote the same rows again and again), though
/// maintenance runs every 100 ms here and three small files are enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_is_not_compacted_during_its_copy() {
    let (mut p, _client, t) = ground_or_skip!(copied_in_80_commits("mcopy", 100).await);
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let out = p.output();
    let copy_commits = out.matches("position=0/0").count();
    assert!(
        copy_commits >= 10,
        "the copy was {copy_commits} commits:\n{out}"
    );
    let finished = out
        .find("initial copy finished")
        .unwrap_or_else(|| panic!("the copy did not finish:\n{out}"));
    let first_compaction = out.find("compaction committed").unwrap_or(usize::MAX);
    assert!(
        first_compaction > finished,
        "a compaction committed during the copy:\n{out}"
    );
    p.assert_equal(&t, 0).await;
}

/// Issue 37: a copied table that then changes a little still has its copy's files merged. Its two
/// one-row commits are its smallest files: they once made the smallest size tier alone, too few
/// to rewrite, and closed it to the copy's files, which then waited for streaming files of their
/// size (42 files were left; 120 became 211 under the 100M-row bench's TPC-B). The copy and the
/// two commits run without maintenance, so the first cycle sees them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_table_with_few_changes_still_has_its_copy_merged() {
    let (mut p, client, t) = ground_or_skip!(copied_in_80_commits("mfew", 0).await);
    for id in [0, -1] {
        exec(
            &client,
            &format!("INSERT INTO {t} VALUES ({id}, 0, 'after')"),
        )
        .await;
        p.assert_equal(&t, 60).await;
    }
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    let copied = total(&current(&p, &t), "total-data-files");
    assert!(copied >= 20, "the copy and two commits made {copied} files");
    p.env_vars = vec![("CDCD_SINK__MAINTENANCE_INTERVAL_MS".into(), "100".into())];
    p.start();
    // ~2.5 MB of Parquet: a handful of 1 MB outputs once merged.
    let mut files = copied;
    crate::support::s3::wait_until(Duration::from_secs(60), || {
        files = total(&current(&p, &t), "total-data-files");
        files <= 8
    })
    .await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    assert!(
        files <= 8,
        "{copied} files after the copy, still {files} a minute later:\n{}",
        p.output()
    );
    equal_by_both_readers(&mut p, &t).await;
}
