//! End to end, MariaDB 10.11 → cdcd → the LSM sink (Apache Paimon primary-key tables), read back
//! by pypaimon: the binlog source's partial rows (MINIMAL and NOBLOB images) are completed before
//! they reach Paimon's `deduplicate` engine, so the replica holds whole rows, on a local warehouse
//! and on S3 (moto; pypaimon reads it from S3, issue 22); and kill -9 in the middle of a workload
//! loses and duplicates nothing.
//!
//! Needs the test bed (`scripts/testbed.sh`, components `mariadb` and `python`; `moto` for S3);
//! without `CDCD_TEST_MYSQL` (or `CDCD_TEST_S3`) each test prints a note and passes.

use crate::support::mysql::{
    my_connect, my_env, my_env_and_name, my_exec, writes_through_kills, MyPipeline,
};
use crate::support::unique;

case_tests!(row_images:
    row_images_replicate_into_paimon(false),
    /// The same into an S3 warehouse (moto), read back by pypaimon from S3.
    row_images_replicate_into_paimon_on_s3(true),
);

async fn row_images(test: &str, on_s3: bool) {
    let env = ground_or_skip!(my_env(test));
    let endpoint = match on_s3 {
        true => match crate::support::s3::moto(test, false) {
            Some(e) => Some(e),
            None => return,
        },
        false => None,
    };
    let name = unique(if on_s3 { "mylsms3" } else { "mylsm" });
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    p.use_lsm(2, "initial", "");
    if let Some(endpoint) = &endpoint {
        p.use_s3(endpoint, "initial", "");
    }
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE item (id BIGINT PRIMARY KEY, n INT, price DECIMAL(10,2), note VARCHAR(40),
           body TEXT, doc JSON, at DATETIME(3), flag ENUM('a','b')) DEFAULT CHARSET = utf8mb4",
    )
    .await;
    my_exec(
        &mut c,
        "INSERT INTO item SELECT seq, seq * 3, seq / 4, CONCAT('n', seq), REPEAT('b', seq),
           JSON_OBJECT('k', seq), TIMESTAMP('2024-01-01') + INTERVAL seq MINUTE, IF(seq % 2 = 0, 'a', 'b')
         FROM seq_1_to_300",
    )
    .await;
    p.start();
    p.assert_equal("item", 120).await;
    for image in ["MINIMAL", "NOBLOB", "FULL"] {
        my_exec(&mut c, &format!("SET SESSION binlog_row_image = '{image}'")).await;
        my_exec(
            &mut c,
            "UPDATE item SET n = n + 1 WHERE id % 7 = 0;
             UPDATE item SET note = NULL, body = CONCAT(body, 'x') WHERE id % 11 = 0;
             UPDATE item SET id = id + 100000 WHERE id % 13 = 0 AND id < 1000;
             DELETE FROM item WHERE id % 17 = 0;
             INSERT INTO item (id, n, note) VALUES (500000 + (SELECT COUNT(*) FROM item), 1, 'named only')",
        )
        .await;
    }
    p.assert_equal("item", 120).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paimon_replica_survives_kill9() {
    let (env, name) = ground_or_skip!(my_env_and_name("mylsmk"));
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    p.use_lsm(2, "initial", "");
    let mut c = my_connect(&env.url_for(&p.db)).await;
    writes_through_kills(&mut p, &mut c, "paimon_replica_survives_kill9", 25).await;
    p.start();
    p.assert_equal("acct", 120).await;
}

/// `RENAME COLUMN` and `CHANGE old new` into Paimon (issue 20): `schema-N` keeps the field id
/// under the new name; updates with MINIMAL row images after the rename are completed from
/// files written before it (cdcd reads the column there under its older name); a rename made
/// while cdcd is down is replayed from the schema history. Read back by pypaimon (by field id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_columns_replicate_into_paimon() {
    let (env, name) = ground_or_skip!(my_env_and_name("mylsmrn"));
    let mut p = MyPipeline::new(&env, &name, "initial", "").await;
    p.use_lsm(2, "initial", "");
    let mut c = my_connect(&env.url_for(&p.db)).await;
    my_exec(
        &mut c,
        "CREATE TABLE item (id BIGINT PRIMARY KEY, n INT, note VARCHAR(40)) DEFAULT CHARSET = utf8mb4;
         INSERT INTO item SELECT seq, seq, CONCAT('n', seq) FROM seq_1_to_200",
    )
    .await;
    p.start();
    p.assert_equal("item", 120).await;
    my_exec(
        &mut c,
        "ALTER TABLE item RENAME COLUMN note TO label;
         SET SESSION binlog_row_image = 'MINIMAL';
         UPDATE item SET n = -n WHERE id % 7 = 0;
         SET SESSION binlog_row_image = 'FULL';
         ALTER TABLE item CHANGE COLUMN n amount BIGINT;
         INSERT INTO item VALUES (1000, 1000, 'after');
         SET SESSION binlog_row_image = 'MINIMAL';
         UPDATE item SET label = CONCAT(label, '!') WHERE id % 11 = 0;
         SET SESSION binlog_row_image = 'FULL'",
    )
    .await;
    p.assert_equal("item", 120).await;
    p.kill9();
    my_exec(
        &mut c,
        "ALTER TABLE item RENAME COLUMN label TO title;
         SET SESSION binlog_row_image = 'MINIMAL';
         UPDATE item SET amount = 0 WHERE id % 13 = 0;
         SET SESSION binlog_row_image = 'FULL'",
    )
    .await;
    p.start();
    p.assert_equal("item", 120).await;
}
