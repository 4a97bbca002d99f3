//! MariaDB → Iceberg with data-file compaction in the daemon (issue 19): a binlog stream of
//! updates and deletes while the maintenance cycle compacts every 300 ms; the lake ends equal to
//! the source (DuckDB through lakecheck) and the current snapshot holds a handful of data files.

use std::process::Command;
use std::time::Duration;

use crate::support::mysql::{my_connect, my_env_and_name, my_exec, MyPipeline};
use crate::support::output_ok;

/// The current snapshot's summary of the table at `dir`, read with Python's json alone.
const SUMMARY: &str = r#"
import json, os, re, sys
md = sys.argv[1] + "/metadata"
n = max(int(m.group(1)) for x in os.listdir(md) if (m := re.fullmatch(r"v(\d+)\.metadata\.json", x)))
m = json.load(open(f"{md}/v{n}.metadata.json"))
snaps = {s["snapshot-id"]: s for s in m.get("snapshots", [])}
print(json.dumps({
    "summary": snaps.get(m.get("current-snapshot-id"), {}).get("summary", {}),
    "replaces": sum(1 for s in snaps.values() if s.get("summary", {}).get("operation") == "replace"),
}))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_compaction_racing_the_binlog_ends_equal() {
    let (env, name) = ground_or_skip!(my_env_and_name("mycomp"));
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    // `[sink]` is the config's last table: the interval joins it, the properties follow.
    let mut config = std::fs::read_to_string(&p.config).unwrap();
    config.push_str(
        "maintenance_interval_ms = 300\n\n[sink.table_properties]\n\
         \"write.target-file-size-bytes\" = \"1000000\"\n\
         \"cdcd.compaction.min-input-files\" = \"3\"\n",
    );
    std::fs::write(&p.config, config).unwrap();
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE t (id INT PRIMARY KEY, v INT, s VARCHAR(40));
         INSERT INTO t SELECT seq, seq, CONCAT('seed ', seq) FROM seq_1_to_300",
    )
    .await;
    p.start();
    p.assert_equal("t", 120).await;
    for i in 0..20 {
        my_exec(
            &mut c,
            &format!(
                "START TRANSACTION;
                 INSERT INTO t VALUES ({k}, {i}, 'new');
                 UPDATE t SET v = v + 1 WHERE id % 7 = {m};
                 DELETE FROM t WHERE id = {d};
                 COMMIT",
                k = 1000 + i,
                m = i % 7,
                d = 3 * i + 1,
            ),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(450)).await;
    }
    my_exec(
        &mut c,
        "UPDATE t SET s = 'moved' WHERE id <= 150; DELETE FROM t WHERE id % 5 = 0",
    )
    .await;
    p.assert_equal("t", 120).await;
    p.stop(Duration::from_secs(60)).await;
    p.assert_equal("t", 30).await;
    let dir = p.table_dir("t").display().to_string();
    let out = output_ok(Command::new(&env.python).arg("-c").arg(SUMMARY).arg(&dir));
    let v: serde_json::Value = serde_json::from_slice(out.stdout.trim_ascii()).unwrap_or_default();
    eprintln!("current snapshot: {v}");
    assert!(
        v["replaces"].as_u64().unwrap_or(0) >= 2,
        "compactions ran: {v}"
    );
    let files: u64 = v["summary"]["total-data-files"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(files <= 8, "a few data files, not one per transaction: {v}");
    assert!(
        p.output().contains("compaction committed"),
        "{}",
        p.output()
    );
}
