//! Issue 38: a resync does not rewrite the changelog's history; it marks itself with one `resync`
//! row (`_cdc_tx` = the resync's id, `_cdc_position` = the resynced table's `cdcd.position` the
//! rows after it go on from). Read back by DuckDB and pyiceberg: replaying the changelog onto the
//! initial copy gives the source before the resync, and reloading the table at the marker and
//! replaying the rows after it gives the source after it.

use std::time::Duration;

use crate::postgres::changelog::{replayed, streamed};
use crate::support::{exec, run_cdcd, test_env, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_is_one_marker_row_and_replay_goes_on_after_it() {
    let env = ground_or_skip!(test_env(
        "a_resync_is_one_marker_row_and_replay_goes_on_after_it"
    ));
    // Up to the resync: the changelog replays onto the copy (which the swap takes away).
    let (mut p, client, t, _) = streamed(&env, "chrs").await;

    let (ok, out) = run_cdcd(&["resync", "--table", &format!("public.{t}")], &p.config);
    assert!(ok && out.contains("requested"), "cdcd resync:\n{out}");
    wait_for(
        &mut p,
        "the resync to finish",
        Duration::from_secs(240),
        |o| o.contains("resync finished"),
    )
    .await;
    // After it: 2 inserts, an update (2 rows), a delete.
    exec(
        &client,
        &format!(
            "INSERT INTO {t} (id, v, t) VALUES (30, 30, 'a'), (31, 31, 'b');
             UPDATE {t} SET v = -1 WHERE id = 1;
             DELETE FROM {t} WHERE id = 30;"
        ),
    )
    .await;
    p.assert_equal(&t, 60).await;
    let after = replayed(
        &env.python,
        &env.pg_url,
        &format!("public.{t}"),
        &p.table_dir(&t),
        &p.table_dir(&format!("{t}_changelog")),
        "resync",
    );
    assert_eq!(
        after, "rows=5 seqs=5 ops=delete:1,insert:2,update_after:1,update_before:1",
        "reloading at the marker and replaying the rows after it gives the source"
    );
    let st = p.sigterm_and_wait(Duration::from_secs(60)).await;
    assert_eq!(st.code(), Some(0), "{st}");
    // One marker, after every row before the resync, naming the resync.
    let changelog = p.table_dir(&format!("{t}_changelog"));
    let out = p.python(MARKERS, &[&changelog.display().to_string()]);
    let markers: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("resync "))
        .collect();
    assert_eq!(markers.len(), 1, "{out}");
    let (seq, id) = markers[0].split_once(' ').unwrap();
    assert_eq!(
        seq, "24",
        "the marker follows the 23 rows before the resync: {out}"
    );
    assert!(
        p.output().contains(&format!("id={id}")) || p.output().contains(id),
        "the marker's _cdc_tx {id:?} is not the resync's id"
    );
}

/// The changelog's `resync` rows (DuckDB): `resync <_cdc_seq> <_cdc_tx>` each.
const MARKERS: &str = r#"
import os, sys
sys.path.insert(0, os.environ["LAKECHECK_DIR"])
import lakecheck as lc
lc.duck().execute("SET enable_progress_bar = false")
cols, rows = lc.read_duckdb(lc.locate_iceberg(sys.argv[1], []))
for r in (dict(zip(cols, r)) for r in rows):
    if r["_cdc_op"] == "resync":
        print("resync", r["_cdc_seq"], r["_cdc_tx"])
"#;
