//! Each deletion vector is its own Puffin file (docs/internals.md, "Deletion vectors"): with
//! several blobs per file, DuckDB 1.5.5's iceberg extension reads a later blob of a file as the
//! bytes of an earlier cached read of that file (its external file cache; duckdb-iceberg PR
//! #1182, after 1.5.5) and applies the wrong rows. A commit deleting from three data files, then
//! commits replacing some of those vectors while the others stay live; every entry must name
//! the one blob of its own file. The vectors here have one position each, so a reader taking a
//! neighbour's blob would read a valid vector of the wrong rows. Read back by DuckDB and
//! pyiceberg after each commit and by Spark at the end.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::{exec, fresh_table, stdout_then_stderr, test_env, unique, Pipeline, Settings};

/// Per Puffin file of the table at argv[1]'s current snapshot: its blobs (footer) and the live
/// entries naming it, each checked against the footer blob at its offset (same length and data
/// file). Prints one JSON object; exits 1 on a mismatch.
const PUFFINS: &str = r#"
import fastavro, json, os, re, sys
md = sys.argv[1] + "/metadata"
vs = sorted(int(m.group(1)) for n in os.listdir(md) if (m := re.fullmatch(r"v(\d+)\.metadata\.json", n)))
meta = json.load(open(f"{md}/v{vs[-1]}.metadata.json"))
local = lambda p: p[len("file://"):] if p.startswith("file://") else p
avro = lambda p: list(fastavro.reader(open(local(p), "rb")))
snap = next(s for s in meta["snapshots"] if s["snapshot-id"] == meta["current-snapshot-id"])
files = {}
for mf in avro(snap["manifest-list"]):
    for e in avro(mf["manifest_path"]):
        f = e["data_file"]
        if e["status"] == 2 or f["file_format"].upper() != "PUFFIN":
            continue
        raw = open(local(f["file_path"]), "rb").read()
        size = int.from_bytes(raw[-12:-8], "little")
        blobs = {b["offset"]: b for b in json.loads(raw[-12 - size:-12])["blobs"]}
        b = blobs.get(f["content_offset"])
        if b is None or b["length"] != f["content_size_in_bytes"] \
                or b["properties"]["referenced-data-file"] != f["referenced_data_file"]:
            print(json.dumps({"problem": f"{f['file_path']}: entry {f['referenced_data_file']} at "
                              f"{f['content_offset']}+{f['content_size_in_bytes']} matches no blob"}))
            sys.exit(1)
        seen = files.setdefault(f["file_path"], {"blobs": len(blobs), "live": 0})
        seen["live"] += 1
print(json.dumps(list(files.values())), flush=True)
"#;

/// [`PUFFINS`] of `p`'s `table`.
fn puffins(p: &Pipeline, table: &str) -> Vec<Value> {
    let out = Command::new(&p.env.python)
        .args(["-c", PUFFINS])
        .arg(p.table_dir(table))
        .output()
        .unwrap();
    let text = stdout_then_stderr(&out);
    assert!(out.status.success(), "Puffin files of {table}:\n{text}");
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('['))
        .unwrap_or("");
    serde_json::from_str::<Vec<Value>>(line).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Equal by DuckDB (lakecheck's default Iceberg reader) and by pyiceberg.
async fn assert_read_right(p: &mut Pipeline, table: &str) {
    p.assert_equal(table, 60).await;
    let (code, out) = p.lakecheck(table, 0, &["--reader", "pyiceberg"]).await;
    assert_eq!(code, Some(0), "pyiceberg reads otherwise:\n{out}");
}

/// `CREATE` of the test table `t`: 100 rows, the initial copy's one data file.
pub(crate) fn create(t: &str) -> String {
    format!(
        "CREATE TABLE {t} (id int8 PRIMARY KEY, v int4);
         INSERT INTO {t} SELECT g, g FROM generate_series(1, 100) g;"
    )
}

/// The changes, one commit each (the caller reads the table back between them): two more data
/// files (F1, F2 beside the copy's F0); one commit deleting a row of each, so three
/// equal-length vectors; then commits replacing some of them and leaving the others live.
pub(crate) fn changes(t: &str) -> [String; 6] {
    [
        format!("INSERT INTO {t} SELECT g, g FROM generate_series(101, 200) g"),
        format!("INSERT INTO {t} SELECT g, g FROM generate_series(201, 300) g"),
        format!("UPDATE {t} SET v = -v WHERE id IN (1, 101, 201)"),
        format!("UPDATE {t} SET v = -v WHERE id = 2"),
        format!("UPDATE {t} SET v = -v WHERE id IN (3, 102)"),
        format!("DELETE FROM {t} WHERE id IN (4, 150)"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_vector_is_its_own_puffin_file_read_right_as_vectors_are_replaced() {
    let test = "each_vector_is_its_own_puffin_file_read_right_as_vectors_are_replaced";
    let env = ground_or_skip!(test_env(test));
    if std::env::var("CDCD_TEST_DELETE_MODE").is_ok_and(|m| m == "equality") {
        return; // deletion vectors only
    }
    let t = unique("pufflayout");
    let client = fresh_table(&env, &t, create).await;
    // No compaction: it would merge the small files and drop their vectors before the layout
    // is checked.
    let settings = Settings {
        sink_extra: "[sink.table_properties]\n\"cdcd.compaction.enabled\" = \"false\"\n".into(),
        ..Settings::default()
    };
    let mut p = Pipeline::owning_tables(&env, &t, &[&t], &settings);
    p.start();
    p.assert_equal(&t, 120).await;
    for (i, sql) in changes(&t).iter().enumerate() {
        exec(&client, sql).await;
        assert_read_right(&mut p, &t).await;
        if i == 2 {
            let files = puffins(&p, &t);
            assert!(
                files.len() == 3 && files.iter().all(|f| f["blobs"] == 1 && f["live"] == 1),
                "three vectors, each in its own Puffin file: {files:?}"
            );
        }
    }
    let after = puffins(&p, &t);
    assert!(
        after.iter().all(|f| f["blobs"] == 1 && f["live"] == 1),
        "every live vector in its own Puffin file: {after:?}"
    );
    p.assert_equal_by_spark(&t).await;
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert!(st.success(), "{st}");
}
