//! Issue 38: `row_metadata = true` on the LSM (Paimon) sink: every row carries `_cdc_commit_ts`
//! and `_cdc_position` of the change that last wrote it, read back by pypaimon. MariaDB's `SET
//! timestamp` dates one update in 2020, so the commit time read back is the source's, not
//! cdcd's; a row of the initial copy carries the copy's position and no commit time. Removing
//! the setting drops the two columns, as on Iceberg.

use std::time::Duration;

use crate::support::mysql::{my_connect, my_env_and_name, my_exec, MyPipeline};
use crate::support::{append_table_settings, output_ok, NAMESPACE};

/// The table's rows (pypaimon): `row <id> <_cdc_commit_ts or None> <_cdc_position>` each.
const ROWS: &str = r#"
import sys
from pypaimon import CatalogFactory
t = CatalogFactory.create({"warehouse": sys.argv[1]}).get_table(sys.argv[2])
rb = t.new_read_builder()
for r in sorted(rb.new_read().to_arrow(rb.new_scan().plan().splits()).to_pylist(), key=lambda r: r["id"]):
    ts = r["_cdc_commit_ts"]
    print("row", r["id"], ts.strftime("%Y-%m-%dT%H:%M:%S") if ts else None, r["_cdc_position"])
"#;

/// The table's column names as pypaimon reads them, on one line.
const COLUMNS: &str = r#"
import sys
from pypaimon import CatalogFactory
t = CatalogFactory.create({"warehouse": sys.argv[1]}).get_table(sys.argv[2])
rb = t.new_read_builder()
print(" ".join(rb.new_read().to_arrow(rb.new_scan().plan().splits()).column_names))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_metadata_reads_back_from_paimon() {
    let (env, name) = ground_or_skip!(my_env_and_name("mylrm"));
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    p.use_lsm(2, "initial", "");
    append_table_settings(
        &p.config,
        &format!("{}.item", p.db),
        "row_metadata = true\n",
    );
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE item (id BIGINT PRIMARY KEY, n INT, note VARCHAR(40));
         INSERT INTO item VALUES (1, 1, 'one'), (2, 2, 'two'), (3, 3, 'three');",
    )
    .await;
    p.start();
    p.assert_equal("item", 120).await;
    my_exec(
        &mut c,
        "SET timestamp = UNIX_TIMESTAMP('2020-01-01 12:00:00');
         UPDATE item SET n = 10 WHERE id = 1;
         SET timestamp = DEFAULT;
         SET SESSION binlog_row_image = 'MINIMAL';
         UPDATE item SET note = 'zwei' WHERE id = 2;
         SET SESSION binlog_row_image = 'FULL';
         INSERT INTO item VALUES (4, 4, 'four');
         DELETE FROM item WHERE id = 3;",
    )
    .await;
    p.assert_equal("item", 120).await;
    p.stop(Duration::from_secs(60)).await;
    let out = output_ok(
        std::process::Command::new(&env.python)
            .args(["-c", ROWS])
            .arg(&p.warehouse)
            .arg(format!("{NAMESPACE}.item")),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter_map(|l| l.strip_prefix("row "))
        .map(|l| l.split(' ').collect())
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    let (one, two, four) = (&rows[0], &rows[1], &rows[2]);
    assert_eq!(one[0..2], ["1", "2020-01-01T12:00:00"], "{text}");
    assert!(two[1].starts_with("20") && two[1] != one[1], "{text}");
    assert_eq!(four[0], "4", "{text}");
    for r in &rows {
        assert!(
            r[2].contains('-') && r[2] != "None",
            "a row without its GTID position: {text}"
        );
    }
    // Each row's position is its own change's: three transactions, three positions.
    assert!(one[2] != two[2] && two[2] != four[2], "{text}");

    // The setting removed from the table's section: its two columns are dropped at the next
    // commit, as on Iceberg (docs/table-settings.md), and the rows stay the source's.
    let config = std::fs::read_to_string(&p.config).unwrap();
    assert!(config.contains("row_metadata = true\n"), "{config}");
    std::fs::write(&p.config, config.replace("row_metadata = true\n", "")).unwrap();
    p.start();
    my_exec(
        &mut c,
        "UPDATE item SET n = 11 WHERE id = 1; INSERT INTO item VALUES (5, 5, 'five');",
    )
    .await;
    p.assert_equal("item", 120).await;
    let out = output_ok(
        std::process::Command::new(&env.python)
            .args(["-c", COLUMNS])
            .arg(&p.warehouse)
            .arg(format!("{NAMESPACE}.item")),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim(), "id n note", "{text}\ncdcd:\n{}", p.output());
}
