//! Issue 39: `json = "variant"` on MariaDB, whose JSON is a LONGTEXT with a `json_valid` check:
//! the column becomes an Iceberg `variant` and DuckDB reads every value back equal to the source
//! as parsed JSON, through the initial copy, the binlog stream (MINIMAL images leave the unchanged
//! JSON out: completed from the row's current value, read back from a variant file) and a kill -9.

use std::time::Duration;

use mysql_async::Conn;

use crate::support::mysql::{my_exec, MyPipeline};

/// Table `t` with every kind of JSON value in `j`.
pub(crate) const CREATE: &str = r#"CREATE TABLE t (id BIGINT PRIMARY KEY, n INT, j JSON) DEFAULT CHARSET = utf8mb4;
           INSERT INTO t VALUES
             (1, 1, '{"a": [1, 2.5, null], "b": "x", "nested": {"deep": [{"z": true}]}}'),
             (2, 2, 'null'), (3, 3, NULL), (4, 4, '[1, "2", {"3": 4}, [], {}]'),
             (5, 5, '12345678901234567890'), (6, 6, '-0.1000000000000000000001'),
             (7, 7, '"héllo ✓ \\"quoted\\" 😀"'), (8, 8, '{"ünï": "cödé", "big": 123456789012345678901234567890.5}')"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_json_as_variant_reads_back_equal() {
    let Some((mut p, mut c, types)) =
        super::geometry::opted_in("jvar", ("json", "variant"), CREATE).await
    else {
        return;
    };
    assert_eq!(types[2], "j variant");
    stream_and_kill(&mut p, &mut c).await;
    p.stop(Duration::from_secs(60)).await;
}

/// Changes to `t` ([`CREATE`]) with MINIMAL images (an update that leaves `j` out), checked
/// equal, then a kill -9 while one streams and changes while cdcd is down, checked equal.
pub(crate) async fn stream_and_kill(p: &mut MyPipeline, c: &mut Conn) {
    my_exec(c, "SET SESSION binlog_row_image = 'MINIMAL'").await;
    my_exec(
        c,
        r#"UPDATE t SET n = n + 10 WHERE id IN (1, 8);
           INSERT INTO t VALUES (9, 9, '{"k": [1, {"m": null}]}'), (10, 10, 'true');
           UPDATE t SET j = '{"changed": 1.50}' WHERE id = 4;
           DELETE FROM t WHERE id = 2"#,
    )
    .await;
    p.assert_equal("t", 120).await;
    my_exec(c, "INSERT INTO t VALUES (11, 11, '[11]')").await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    p.kill9();
    my_exec(
        c,
        "UPDATE t SET n = n + 1 WHERE id = 5; INSERT INTO t VALUES (12, 12, '{\"after\": \"kill\"}')",
    )
    .await;
    p.start();
    p.assert_equal("t", 120).await;
}
