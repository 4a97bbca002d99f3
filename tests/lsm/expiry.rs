//! Snapshot expiry of the LSM (Apache Paimon) sink under `kill -9` (issue 19: "kill -9 during
//! expiry"; "leftovers are removed by the next cycle"). The sink expires in the writer, every 10
//! snapshots; a crash at each of its crash points (`src/failpoints.rs`: the hint moved, half of
//! the files deleted, half of the snapshot files deleted) must leave a table pypaimon reads, and
//! the restarted daemon's next expiry must remove what the interrupted one left: the snapshot
//! files below `EARLIEST` and every file only they name.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{current_test, exec, fresh_table, test_env, unique, Pipeline, Settings};

/// What a Paimon table directory holds, as JSON: the `EARLIEST` hint, the snapshot files and
/// those below the hint, `doomed` (files on disk that only snapshots below the hint name: what
/// the next expiry must delete), and `missing` (files the snapshots from the hint on need, not
/// on disk).
const INSPECT: &str = r#"
import json, os, sys
from fastavro import reader
tbl = sys.argv[1]
sd = os.path.join(tbl, "snapshot")
ids = sorted(int(n[len("snapshot-"):]) for n in os.listdir(sd) if n.startswith("snapshot-"))
hp = os.path.join(sd, "EARLIEST")
hint = int(open(hp).read().strip()) if os.path.exists(hp) else ids[0]
def avro(name):
    p = os.path.join(tbl, "manifest", name)
    if not os.path.exists(p):
        return None
    with open(p, "rb") as f:
        return list(reader(f))
def names(i, live_only):
    s = json.load(open(os.path.join(sd, "snapshot-%d" % i)))
    meta, files = set(), {}
    for key in ("baseManifestList", "deltaManifestList"):
        lst = s.get(key)
        if not lst:
            continue
        meta.add("manifest/" + lst)
        for m in avro(lst) or []:
            meta.add("manifest/" + m["_FILE_NAME"])
            for e in avro(m["_FILE_NAME"]) or []:
                f = "bucket-%d/%s" % (e["_BUCKET"], e["_FILE"]["_FILE_NAME"])
                if e["_KIND"] == 0:
                    files[f] = True
                elif live_only:
                    files.pop(f, None)
                else:
                    files[f] = True
    return meta | set(files)
retained, below = set(), set()
for i in ids:
    if i >= hint:
        retained |= names(i, True)
    else:
        below |= names(i, False)
exists = lambda f: os.path.exists(os.path.join(tbl, f))
print(json.dumps({
    "hint": hint,
    "snapshots": ids,
    "below_hint": [i for i in ids if i < hint],
    "doomed": sorted(f for f in below - retained if exists(f)),
    "missing": sorted(f for f in retained if not exists(f)),
    "data_files": sum(1 for f in retained if f.startswith("bucket-")),
}))
"#;

fn inspect(p: &Pipeline, table: &str) -> Value {
    let dir = p.table_dir(table).display().to_string();
    let out = p.python(INSPECT, &[&dir]);
    serde_json::from_str(out.lines().last().unwrap_or("")).unwrap()
}

fn list(v: &Value, key: &str) -> BTreeSet<String> {
    v[key]
        .as_array()
        .map(|a| a.iter().map(|x| x.to_string()).collect())
        .unwrap_or_default()
}

/// `n` transactions of a few updates each, apart enough to commit one by one.
async fn transactions(client: &tokio_postgres::Client, t: &str, from: i32, n: i32) {
    for k in from..from + n {
        exec(
            client,
            &format!(
                "BEGIN;
                 UPDATE {t} SET v = v + 1 WHERE id % 7 = {m};
                 INSERT INTO {t} VALUES ({id}, 0) ON CONFLICT (id) DO UPDATE SET v = -1;
                 DELETE FROM {t} WHERE id = {gone};
                 COMMIT;",
                m = k % 7,
                id = 1000 + k,
                gone = 1000 + k - 3,
            ),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_lsm_expiry_ends_equal_and_the_next_expiry_removes_leftovers() {
    let env = ground_or_skip!(test_env(&current_test()));
    let points = [
        "lsm-expire-after-hint",
        "lsm-expire-during-delete",
        "lsm-expire-during-snapshots",
    ];
    for (i, point) in points.iter().enumerate() {
        let name = unique(&format!("lexp{i}"));
        let t = format!("{name}_t");
        let client = fresh_table(&env, &t, |t| {
            format!(
                "CREATE TABLE {t} (id int8 PRIMARY KEY, v int8);
                 INSERT INTO {t} SELECT g, 0 FROM generate_series(1, 200) g;"
            )
        })
        .await;
        // Two snapshots kept and a compaction at every second run: each expiry removes
        // snapshots whose data files compactions replaced, so it deletes data files too.
        let settings = Settings {
            commit_interval_ms: 50,
            sink_extra: "snapshots_retained = 2\ncompaction_trigger = 2\n".into(),
            ..Settings::default()
        };
        let mut p = Pipeline::new_lsm(&env, &name, &[&t], &settings, 1);
        p.on_cleanup(format!("DROP TABLE IF EXISTS {t}"));
        p.env_vars = vec![("CDCD_FAILPOINT".into(), point.to_string())];
        p.start();
        p.wait_slot_active(&client, Duration::from_secs(120)).await;
        // The first expiry (at snapshot 10 or later) aborts at the crash point.
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut k = 0;
        let st = loop {
            if let Some(st) = p.try_exit() {
                break st;
            }
            assert!(Instant::now() < deadline, "{point}: no expiry crashed");
            transactions(&client, &t, k, 2).await;
            k += 2;
        };
        assert!(!st.success(), "{point}: cdcd should have aborted: {st}");
        assert!(
            p.output().contains(&format!("failpoint {point}")),
            "{}",
            p.output()
        );
        let crashed = inspect(&p, &t);
        assert_eq!(
            list(&crashed, "missing"),
            BTreeSet::new(),
            "{point}: {crashed}"
        );
        assert!(
            !list(&crashed, "below_hint").is_empty(),
            "{point}: the crash left no snapshot below EARLIEST: {crashed}"
        );
        if *point != "lsm-expire-during-snapshots" {
            assert!(
                !list(&crashed, "doomed").is_empty(),
                "{point}: the crash left no file to delete: {crashed}"
            );
        }

        // Restarted: the first expiry finishes the interrupted one.
        p.env_vars.clear();
        p.start();
        p.wait_slot_active(&client, Duration::from_secs(120)).await;
        transactions(&client, &t, k, 12).await;
        p.assert_equal(&t, 60).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        let doomed = list(&crashed, "doomed");
        loop {
            let v = inspect(&p, &t);
            let still: BTreeSet<_> = list(&v, "doomed")
                .union(&list(&v, "below_hint"))
                .cloned()
                .collect();
            let left: BTreeSet<_> = doomed
                .iter()
                .filter(|f| {
                    let f = f.trim_matches('"');
                    p.table_dir(&t).join(f).exists()
                })
                .cloned()
                .collect();
            if still.is_empty() && left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{point}: leftovers remain: {v}; of the crash's: {left:?}"
            );
            p.assert_running();
            transactions(&client, &t, k + 100, 1).await;
            k += 1;
        }
        assert!(
            p.output()
                .contains("finishing an interrupted snapshot expiry"),
            "{point}:\n{}",
            p.output()
        );
        let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
        assert_eq!(st.code(), Some(0), "{st}");
        let after = inspect(&p, &t);
        assert_eq!(list(&after, "missing"), BTreeSet::new(), "{point}: {after}");
        p.assert_equal(&t, 10).await;
    }
}
